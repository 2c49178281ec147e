// byteps-thc: dead-node detection for ps-lite (see include/ps/internal/liveness.h).
#include "ps/internal/liveness.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "ps/internal/env.h"
#include "ps/internal/postoffice.h"
#include "ps/internal/van.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// How long the scheduler waits after sending its DEAD_NODE notices before it fails itself: the
// notices leave through ZMQ's I/O thread, which _exit would cut short.
constexpr int kNoticeFlushMs = 1000;

struct State {
  std::mutex mu;  // guards everything below but `failed`
  std::condition_variable cv;
  bool stop = false;
  std::unique_ptr<std::thread> thread;
  std::map<int, Node> nodes;  // id -> node, from ADD_NODE
  // id -> the last heartbeat (a worker or server: the scheduler's answers). The scheduler enters
  // every worker and server when the node list is complete (RecordNodes), so that a node which
  // dies before its first heartbeat arrives is watched as well.
  std::map<int, Clock::time_point> last_heard;
  std::set<int> heard;  // the scheduler: ids that have sent at least one heartbeat
  std::set<int> dead;   // ids reported dead
  DeadNodeHandler handler;
  std::string failure;
  std::atomic<bool> failed{false};
  std::atomic<bool> reported{false};  // Fail logged `failure` and ran the handler
  // the startup timeout's report
  Node self;  // a worker or server: itself, as it registered
  bool has_self = false;
  std::vector<Node> registered;  // the scheduler: the nodes registered so far
};

State& G() {
  static State* s = new State;  // never destroyed: ps-lite's threads may outlive static teardown
  return *s;
}

// `name` in seconds, `unset` where it is unset; `off`: what 0 means, for the warning about a
// bad value (which reads as 0)
int EnvSeconds(const char* name, const char* off = "dead-node detection off", int unset = 0) {
  const char* v = Environment::Get()->find(name);
  if (!v || !*v) return unset;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 86400) {
    LOG(WARNING) << name << "=" << v << " is not a number of seconds in [0, 86400]; using 0 "
                 << "(" << off << ")";
    return 0;
  }
  return static_cast<int>(n);
}

// A worker or server whose PS_HEARTBEAT_INTERVAL / PS_HEARTBEAT_TIMEOUT are unset (started
// without bpslaunch, e.g. `python train.py` with the DMLC_* variables) heartbeats every
// kDefaultInterval s and fails by itself after kDefaultTimeout s without the scheduler's
// answer: a scheduler that watches (bpslaunch's) must not declare it dead, and its own
// scheduler's death must not leave it waiting. kDefaultTimeout is BYTEPS_THC_DEAD_NODE_TIMEOUT's
// default (byteps_thc/env.py); an explicit 0 still turns either off (bpslaunch sets both).
constexpr int kDefaultInterval = 2;
constexpr int kDefaultTimeout = 30;

// EnvSeconds, or `dflt` for a worker or server where `name` is unset (the scheduler: 0).
int NodeSeconds(const char* name, int dflt) {
  return EnvSeconds(name, "dead-node detection off", Postoffice::Get()->is_scheduler() ? 0 : dflt);
}

// ps-lite's ids: the scheduler 1, server rank r 8 + 2r, worker rank r 9 + 2r.
bool IsWorkerId(int id) { return id >= 8 && id % 2 == 1; }

const char* RoleName(Node::Role r) {
  switch (r) {
    case Node::SERVER: return "server";
    case Node::WORKER: return "worker";
    default: return "scheduler";
  }
}

// Runs the handler, or logs and ends the process; once per process.
void Fail(const Node& dead, const std::string& why) {
  State& g = G();
  DeadNodeHandler handler;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (g.failed.load()) return;
    g.failure = why;
    g.failed = true;
    handler = g.handler;
  }
  LOG(ERROR) << why;
  if (handler) {
    handler(dead, why);
    g.reported = true;
    return;
  }
  std::cerr << "ps-lite: exiting with status " << kDeadNodeExitStatus << std::endl;
  std::fflush(stderr);
  _exit(kDeadNodeExitStatus);
}

Node SchedulerNode() {
  Node n;
  if (LookupNode(kScheduler, &n)) return n;
  n.id = kScheduler;
  n.role = Node::SCHEDULER;
  const char* uri = Environment::Get()->find("DMLC_PS_ROOT_URI");
  const char* port = Environment::Get()->find("DMLC_PS_ROOT_PORT");
  n.hostname = uri ? uri : "?";
  n.port = port ? std::atoi(port) : 0;
  return n;
}

// The scheduler: tell every other live node that `dead` is gone, then fail.
void Announce(Van* van, const Node& dead, const std::string& why) {
  std::vector<int> to;
  {
    std::lock_guard<std::mutex> lk(G().mu);
    for (const auto& kv : G().nodes) {
      if (kv.second.role != Node::SCHEDULER && !G().dead.count(kv.first)) to.push_back(kv.first);
    }
  }
  for (int id : to) {
    Message m;
    m.meta.recver = id;
    m.meta.control.cmd = Control::DEAD_NODE;
    m.meta.control.node.push_back(dead);
    m.meta.body = why;
    m.meta.timestamp = van->GetTimestamp();
    if (van->SendMsg(m) < 0) LOG(WARNING) << "could not tell " << DescribeNodeId(id) << ": " << why;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(kNoticeFlushMs));
  Fail(dead, why + "; the scheduler told the " + std::to_string(to.size()) + " other nodes");
}

struct Silence {
  Node node;
  double seconds;  // since the last heartbeat, or since the node list was complete
  bool heard;      // whether any heartbeat came from it
};

// One look at the clock: the dead nodes, each reported once.
void Check(Van* van, bool scheduler, int timeout, Clock::time_point start) {
  State& g = G();
  const auto now = Clock::now();
  const auto limit = std::chrono::seconds(timeout);
  std::vector<Silence> found;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (scheduler) {
      for (const auto& kv : g.last_heard) {
        if (now - kv.second <= limit || g.dead.count(kv.first)) continue;
        g.dead.insert(kv.first);
        Node n;
        auto it = g.nodes.find(kv.first);
        if (it != g.nodes.end()) {
          n = it->second;
        } else {
          n.id = kv.first;
          n.role = IsWorkerId(kv.first) ? Node::WORKER : Node::SERVER;
        }
        found.push_back({n, std::chrono::duration<double>(now - kv.second).count(),
                         g.heard.count(kv.first) > 0});
      }
    } else {
      auto it = g.last_heard.find(kScheduler);
      const auto last = (it == g.last_heard.end() || it->second < start) ? start : it->second;
      if (now - last > limit) {
        // the scheduler's node is looked up below: LookupNode takes g.mu
        found.push_back(
            {Node(), std::chrono::duration<double>(now - last).count(), it != g.last_heard.end()});
      }
    }
  }
  for (auto& f : found) {
    std::ostringstream os;
    os.precision(3);
    if (!scheduler) {
      f.node = SchedulerNode();
      os << "ps-lite: lost the " << DescribeNode(f.node) << ": no answer to heartbeats for "
         << f.seconds << " s (PS_HEARTBEAT_TIMEOUT=" << timeout << ")";
      Fail(f.node, os.str());
      continue;
    }
    os << "ps-lite: " << DescribeNode(f.node) << " is gone: no heartbeat ";
    if (f.heard) {
      os << "for " << f.seconds << " s (PS_HEARTBEAT_TIMEOUT=" << timeout << ")";
    } else {
      os << "in the " << f.seconds
         << " s since the cluster formed (PS_HEARTBEAT_TIMEOUT=" << timeout
         << "; a node sends one every PS_HEARTBEAT_INTERVAL s, " << kDefaultInterval
         << " where unset; PS_HEARTBEAT_INTERVAL=0 turns them off)";
    }
    Announce(van, f.node, os.str());
  }
}

void Run(Van* van, int interval, int timeout) {
  State& g = G();
  const bool scheduler = Postoffice::Get()->is_scheduler();
  const Node me = van->my_node();  // ready now (Start runs once the van is)
  const auto start = Clock::now();
  auto next_beat = start;
  std::unique_lock<std::mutex> lk(g.mu);
  while (!g.stop) {
    if (!scheduler && interval > 0 && Clock::now() >= next_beat) {
      lk.unlock();
      Message msg;
      msg.meta.recver = kScheduler;
      msg.meta.control.cmd = Control::HEARTBEAT;
      msg.meta.control.node.push_back(me);
      msg.meta.timestamp = van->GetTimestamp();
      van->Send(msg);
      lk.lock();
      next_beat = Clock::now() + std::chrono::seconds(interval);
    }
    if (timeout > 0 && (scheduler || interval > 0) && !g.failed.load()) {
      lk.unlock();
      Check(van, scheduler, timeout, start);
      lk.lock();
    }
    // one look a second is enough: timeouts are whole seconds
    g.cv.wait_for(lk, std::chrono::seconds(1), [&g] { return g.stop; });
  }
}

// "worker 1 at 10.0.0.2:9000": a node before the scheduler gave it an id
std::string DescribeJoining(const Node& n) {
  std::ostringstream os;
  os << RoleName(n.role);
  if (n.role == Node::WORKER && n.aux_id >= 0) os << " " << n.aux_id;
  os << " at " << n.hostname << ":" << n.port;
  return os.str();
}

std::string Plural(size_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// The cluster did not form within `timeout` seconds: says what this node waited for, and exits.
[[noreturn]] void StartupFailed(int timeout) {
  const size_t want_w = static_cast<size_t>(Postoffice::Get()->num_workers());
  const size_t want_s = static_cast<size_t>(Postoffice::Get()->num_servers());
  const Node sched = SchedulerNode();
  std::ostringstream os;
  os << "ps-lite: the cluster did not form within BYTEPS_THC_STARTUP_TIMEOUT=" << timeout << " s: ";
  {
    std::lock_guard<std::mutex> lk(G().mu);
    if (Postoffice::Get()->is_scheduler()) {
      size_t got_w = 0, got_s = 0;
      std::set<int> worker_ids;
      std::string who;
      for (const auto& n : G().registered) {
        if (n.role == Node::WORKER) {
          ++got_w;
          if (n.aux_id >= 0) worker_ids.insert(n.aux_id);
        } else if (n.role == Node::SERVER) {
          ++got_s;
        } else {
          continue;
        }
        who += (who.empty() ? "" : ", ") + DescribeJoining(n);
      }
      os << got_w << " of " << Plural(want_w, "worker") << " and " << got_s << " of "
         << Plural(want_s, "server") << " registered with this scheduler (" << sched.hostname << ":"
         << sched.port << ")" << (who.empty() ? "" : ": " + who) << "; missing: ";
      std::string missing;
      if (got_w < want_w) {
        missing = Plural(want_w - got_w, "worker");
        // by DMLC_WORKER_ID, where every worker that registered announced one
        if (worker_ids.size() == got_w) {
          std::string ids;
          for (size_t i = 0; i < want_w; ++i) {
            if (!worker_ids.count(static_cast<int>(i))) {
              ids += (ids.empty() ? "" : ", ") + std::to_string(i);
            }
          }
          if (!ids.empty()) missing += " (DMLC_WORKER_ID " + ids + ")";
        }
      }
      if (got_s < want_s) {
        missing += (missing.empty() ? "" : " and ") + Plural(want_s - got_s, "server");
      }
      os << (missing.empty() ? std::string("none (more nodes registered than expected)") : missing)
         << ". Start the missing nodes";
    } else {
      os << "this " << (G().has_self ? DescribeJoining(G().self) : std::string("node"))
         << " registered with the scheduler at " << sched.hostname << ":" << sched.port
         << ", which never announced the complete cluster of " << Plural(want_w, "worker")
         << " and " << Plural(want_s, "server")
         << ": a node is missing, or the scheduler is not running or not reachable (its log "
         << "names the missing nodes). Start the missing nodes or the scheduler";
    }
  }
  os << ", and check that every node has the same DMLC_NUM_WORKER, DMLC_NUM_SERVER, "
     << "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT, and the same cluster key file or none "
     << "(BYTEPS_THC_CLUSTER_KEY: a node without the scheduler's key cannot register); exiting "
     << "with status " << kStartupExitStatus;
  LOG(ERROR) << os.str();
  std::cerr << std::flush;
  std::fflush(stderr);
  // _exit: the receiver thread and the caller's threads are still running
  _exit(kStartupExitStatus);
}

}  // namespace

void SetDeadNodeHandler(DeadNodeHandler handler) {
  std::lock_guard<std::mutex> lk(G().mu);
  G().handler = std::move(handler);
}

bool ClusterFailed() { return G().failed.load(); }

std::string ClusterFailure() {
  std::lock_guard<std::mutex> lk(G().mu);
  return G().failure;
}

void ReportOversizedPull(uint64_t first_key, size_t buffer_bytes, size_t reply_bytes) {
  // the server that holds the key, by the key ranges every worker shares
  Node server;
  const auto& ranges = Postoffice::Get()->GetServerKeyRanges();
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (first_key >= ranges[r].begin() && first_key < ranges[r].end()) {
      const int id = Postoffice::ServerRankToID(static_cast<int>(r));
      if (!LookupNode(id, &server)) {
        server.id = id;
        server.role = Node::SERVER;
      }
      break;
    }
  }
  std::ostringstream os;
  os << "ps-lite: " << (server.id == Node::kEmpty ? std::string("a server") : DescribeNode(server))
     << " answered the pull of key " << first_key << " with " << reply_bytes
     << " bytes, more than the " << buffer_bytes << " bytes this worker expects: the server and "
     << "this worker disagree on the size of that tensor (run the same byteps-thc build and the "
     << "same model on every node)";
  Fail(server, os.str());
}

int DeadNodeTimeout() { return NodeSeconds("PS_HEARTBEAT_TIMEOUT", kDefaultTimeout); }

bool LookupNode(int id, Node* node) {
  std::lock_guard<std::mutex> lk(G().mu);
  auto it = G().nodes.find(id);
  if (it == G().nodes.end()) return false;
  *node = it->second;
  return true;
}

std::string DescribeNode(const Node& n) {
  std::ostringstream os;
  os << RoleName(n.role);
  if (n.role == Node::WORKER && n.aux_id >= 0) {
    os << " " << n.aux_id;
  } else if (n.role != Node::SCHEDULER && n.id != Node::kEmpty) {
    os << " rank " << Postoffice::IDtoRank(n.id);
  }
  os << " (ps-lite node " << n.id;
  if (!n.hostname.empty()) os << ", " << n.hostname << ":" << n.port;
  os << ")";
  return os.str();
}

std::string DescribeNodeId(int id) {
  Node n;
  if (LookupNode(id, &n)) return DescribeNode(n);
  n.id = id;
  n.role = id == kScheduler ? Node::SCHEDULER : (IsWorkerId(id) ? Node::WORKER : Node::SERVER);
  return DescribeNode(n);
}

namespace liveness {

int MyWorkerId() {
  const char* role = Environment::Get()->find("DMLC_ROLE");
  const char* id = Environment::Get()->find("DMLC_WORKER_ID");
  if (!role || std::string(role) != "worker" || !id || !*id) return -1;
  return std::atoi(id);
}

void RecordNodes(const std::vector<Node>& nodes) {
  const bool scheduler = Postoffice::Get()->is_scheduler();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(G().mu);
  for (const auto& n : nodes) {
    if (n.id == Node::kEmpty) continue;
    G().nodes[n.id] = n;
    // the clock of a node starts when the scheduler announces the complete node list (the node
    // starts its heartbeats on receiving it); a heartbeat that came first is kept
    if (scheduler && n.role != Node::SCHEDULER) G().last_heard.emplace(n.id, now);
  }
}

void Start(Van* van) {
  State& g = G();
  const int interval = NodeSeconds("PS_HEARTBEAT_INTERVAL", kDefaultInterval);
  const int timeout = DeadNodeTimeout();
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.thread) return;
  g.stop = false;
  // last_heard is not reset here: the receiver thread has filled it (RecordNodes, and heartbeats
  // that arrived while this thread still waited for the van), and Stop() empties it
  if (interval <= 0 && timeout <= 0) return;
  if (interval <= 0 && !Postoffice::Get()->is_scheduler()) {
    LOG(WARNING) << "PS_HEARTBEAT_TIMEOUT=" << timeout << " without PS_HEARTBEAT_INTERVAL: this "
                 << "node sends no heartbeats, and a scheduler with PS_HEARTBEAT_TIMEOUT set "
                 << "declares it dead";
  }
  if (timeout > 0 && interval > 0 && interval * 2 > timeout) {
    LOG(WARNING) << "PS_HEARTBEAT_INTERVAL=" << interval << " is more than half of "
                 << "PS_HEARTBEAT_TIMEOUT=" << timeout << ": one late heartbeat declares a "
                 << "live node dead";
  }
  g.thread.reset(new std::thread(Run, van, interval, timeout));
}

void Stop() {
  State& g = G();
  std::unique_ptr<std::thread> t;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    g.stop = true;
    t = std::move(g.thread);
    g.last_heard.clear();
    g.heard.clear();
    g.dead.clear();
  }
  g.cv.notify_all();
  if (t && t->get_id() != std::this_thread::get_id()) t->join();
  if (t && t->joinable()) t->detach();
}

void OnHeartbeat(int sender_id) {
  std::lock_guard<std::mutex> lk(G().mu);
  G().last_heard[sender_id] = Clock::now();
  G().heard.insert(sender_id);
}

void OnDeadNodeNotice(const Message& msg) {
  Node dead;
  if (!msg.meta.control.node.empty()) dead = msg.meta.control.node[0];
  if (Postoffice::Get()->is_scheduler()) {  // a server found `dead` gone (departure.h): tell all
    Announce(Postoffice::Get()->van(), dead, msg.meta.body);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(G().mu);
    G().dead.insert(dead.id);
  }
  Fail(dead, msg.meta.body + " (told by the scheduler)");
}

void RecordSelf(const Node& me) {
  std::lock_guard<std::mutex> lk(G().mu);
  G().self = me;
  G().has_self = true;
}

std::string DescribeSelf() {
  std::lock_guard<std::mutex> lk(G().mu);
  return G().has_self ? DescribeJoining(G().self) : std::string();
}

void RecordRegistered(const std::vector<Node>& nodes) {
  std::lock_guard<std::mutex> lk(G().mu);
  G().registered = nodes;
}

void WaitUntilReady(const std::atomic<bool>& ready) {
  // Unset: bpslaunch's default, so that a node started without bpslaunch (`python train.py`
  // with the DMLC_* variables, as upstream's tests do) never waits without a word either
  const int timeout =
      EnvSeconds("BYTEPS_THC_STARTUP_TIMEOUT", "wait for the cluster to form without a limit",
                 kDefaultStartupTimeout);
  const auto deadline = Clock::now() + std::chrono::seconds(timeout);
  while (!ready.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ready.load()) break;
    // this node failed (a handler kept the process) before the cluster formed: it cannot form
    // with this node, and nothing of it has started
    if (G().reported.load()) {  // not just `failed`: the message must be out first
      std::cerr << "ps-lite: exiting with status " << kStartupExitStatus << std::endl;
      std::fflush(stderr);
      _exit(kStartupExitStatus);
    }
    if (timeout > 0 && Clock::now() > deadline) StartupFailed(timeout);
  }
}

}  // namespace liveness
}  // namespace ps
