// byteps-thc: a worker that leaves early ends the cluster at once (patch 0023 hooks it in).
//
// A worker that finalizes (bps.shutdown(), which BytePS also runs when the script ends, an
// exception included) waits in ps-lite's final barrier for the others, heartbeating all along,
// so the dead-node detection never fires; a worker still training waits for its pushes forever.
// So a finalizing worker's final BARRIER request says so (its body), the scheduler tells every
// server (a DEPARTED control message), and each server counts every worker's pushes of each key.
// The worker itself sends nothing more: its sockets are shared by its receive threads (upstream's
// ZeroMQ van), and an extra send at shutdown made ZeroMQ 4.1 abort there (signaler.cpp). In synchronous training every worker pushes every
// key equally often (BytePS's init and registration pushes included), so once a worker left
// after c pushes of key k, another worker's push of k beyond c is a round the first will never
// join: the server asks the scheduler (a DEAD_NODE message) to end the cluster, naming both, and
// every node's waits fail as for a dead node. A worker that leaves after the last step, as the
// others do, is never reported. Off under BYTEPS_ENABLE_ASYNC=1, whose workers push unequally.
#ifndef PS_INTERNAL_DEPARTURE_H_
#define PS_INTERNAL_DEPARTURE_H_

#include <cstdint>

#include "ps/internal/message.h"

namespace ps {
class Van;
}

namespace ps {
namespace departure {

// Postoffice::Finalize, first. A worker that finalizes: its final BARRIER request will say so.
// A worker or server that registered but whose cluster never formed (its script ended or raised
// while ps-lite still waited for the other nodes) cannot take part in that barrier (upstream
// aborted there): it tells the scheduler, which ends at once naming it, and exits with
// kStartupExitStatus and a message.
void Finalizing(Van* van, bool do_barrier);
// Postoffice::Barrier, on the request it is about to send: the tag of a departing worker.
void TagBarrier(Message* req);
// The scheduler, on every BARRIER request: a departing worker's makes DEPARTED to every server.
void OnBarrier(const Message& msg);
// A server: a worker's DEPARTED arrived from the scheduler. The scheduler: a node's own DEPARTED,
// before the cluster formed.
void OnDeparted(const Message& msg);
// A server: a push request of `key` from node `sender` arrived (KVServer::Process).
void OnPush(uint64_t key, int sender);

}  // namespace departure
}  // namespace ps

#endif  // PS_INTERNAL_DEPARTURE_H_
