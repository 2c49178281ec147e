// byteps-thc: dead-node detection for ps-lite (patch 0017 hooks it into the van).
//
// Every worker and server sends a heartbeat to the scheduler each PS_HEARTBEAT_INTERVAL seconds
// and the scheduler answers each one. A node is dead when nothing was heard from it for
// PS_HEARTBEAT_TIMEOUT seconds:
// - the scheduler watches every worker and server from the moment it sends out the complete node
//   list (ADD_NODE), before any heartbeat: a node that dies before its first heartbeat arrives
//   is declared dead too, and so is one whose heartbeats are off (PS_HEARTBEAT_INTERVAL=0) while
//   the scheduler's PS_HEARTBEAT_TIMEOUT is set (the message says so); it tells every survivor
//   with a DEAD_NODE control message that names the dead node, then fails itself;
// - a worker or server watches the scheduler's answers and fails itself when they stop.
// Failing runs the handler (SetDeadNodeHandler) once per process. Either variable at 0 turns
// detection off, as upstream. Unset, the scheduler's are 0 (it watches only when told to:
// bpslaunch sets both on every node), a worker's or server's 2 and 30 s, so that a node started
// without bpslaunch heartbeats to a scheduler that watches and fails when its scheduler is gone.
//
// Before all that, the cluster must form: every node registers with the scheduler, which sends
// out the node list once DMLC_NUM_WORKER workers and DMLC_NUM_SERVER servers have. A node that
// is never started, or a scheduler that dies first, used to leave the others waiting forever.
// With BYTEPS_THC_STARTUP_TIMEOUT=N (seconds; kDefaultStartupTimeout where unset, bpslaunch's
// default too; 0 waits forever, as upstream) a node that waited N seconds logs what it waited for
// and exits with status kStartupExitStatus: the scheduler names the nodes that registered and
// how many of each role are missing, a worker or server names itself and the scheduler it
// registered with.
#ifndef PS_INTERNAL_LIVENESS_H_
#define PS_INTERNAL_LIVENESS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ps/internal/message.h"

namespace ps {
class Van;

// Called at most once per process, on a thread of ps-lite's (the receiver or the liveness
// thread), when this node learns that a peer is gone: `dead` is that node and `why` names it
// (role, worker id or rank, ps-lite id, address) and says how it was found. Without a handler
// ps-lite logs `why` and ends the process with status kDeadNodeExitStatus; _exit, since other
// threads may be blocked on the dead peer and destructors could wait for them forever. A handler
// that returns keeps the process running with ClusterFailed() true; barriers then return at once
// (Finalize included), so a process can still shut down.
using DeadNodeHandler = std::function<void(const Node& dead, const std::string& why)>;
void SetDeadNodeHandler(DeadNodeHandler handler);
constexpr int kDeadNodeExitStatus = 1;
constexpr int kStartupExitStatus = 1;
constexpr int kDefaultStartupTimeout = 300;  // seconds; byteps_thc/env.py STARTUP_TIMEOUT too

// Whether this process has learnt of a dead node, and the message it was told.
bool ClusterFailed();
std::string ClusterFailure();

// A pull reply that does not fit the worker's buffer (patch 0021, KVWorker::Pull_): the server
// and this worker disagree on the size of the tensor of `first_key`. Fails this process as a dead
// node does (the handler, naming that server), instead of the CHECK that aborted it.
void ReportOversizedPull(uint64_t first_key, size_t buffer_bytes, size_t reply_bytes);

// PS_HEARTBEAT_TIMEOUT in seconds, its default where unset (0: detection off).
int DeadNodeTimeout();

// The node with ps-lite id `id` as the scheduler announced it; false while unknown.
bool LookupNode(int id, Node* node);
// "worker 1 (ps-lite node 11, 10.0.0.2:9000)": a worker by its DMLC_WORKER_ID where it announced
// one (Node::aux_id), else by its ps-lite rank; a server by its rank.
std::string DescribeNode(const Node& node);
std::string DescribeNodeId(int id);

namespace liveness {
// The hooks of patch 0017.
int MyWorkerId();                                  // DMLC_WORKER_ID of a worker, else -1
void RecordNodes(const std::vector<Node>& nodes);  // the node list of every ADD_NODE
void Start(Van* van);                              // once the van is ready
void Stop();                                       // before the van stops
void OnHeartbeat(int sender_id);                   // a HEARTBEAT (or its answer) arrived
void OnDeadNodeNotice(const Message& msg);         // a DEAD_NODE from the scheduler
// The startup timeout (patch 0031)
void RecordSelf(const Node& me);  // a worker or server, as it registers
std::string DescribeSelf();       // "worker 0 at HOST:PORT" once RecordSelf ran, else empty
void RecordRegistered(const std::vector<Node>& nodes);  // the scheduler: the nodes so far
void WaitUntilReady(const std::atomic<bool>& ready);    // Van::Start: until the cluster formed
}  // namespace liveness
}  // namespace ps

#endif  // PS_INTERNAL_LIVENESS_H_
