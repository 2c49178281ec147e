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
  std::map<int, Node> nodes;                    // id -> node, from ADD_NODE
  std::map<int, Clock::time_point> last_heard;  // id -> last heartbeat (scheduler: its answers)
  std::set<int> dead;                           // ids reported dead
  DeadNodeHandler handler;
  std::string failure;
  std::atomic<bool> failed{false};
};

State& G() {
  static State* s = new State;  // never destroyed: ps-lite's threads may outlive static teardown
  return *s;
}

int EnvSeconds(const char* name) {
  const char* v = Environment::Get()->find(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 86400) {
    LOG(WARNING) << name << "=" << v << " is not a number of seconds in [0, 86400]; using 0 "
                 << "(dead-node detection off)";
    return 0;
  }
  return static_cast<int>(n);
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

// One look at the clock: the dead nodes, each reported once.
void Check(Van* van, bool scheduler, int timeout, Clock::time_point start) {
  State& g = G();
  const auto now = Clock::now();
  const auto limit = std::chrono::seconds(timeout);
  std::vector<std::pair<Node, double>> found;
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
        found.emplace_back(n, std::chrono::duration<double>(now - kv.second).count());
      }
    } else {
      auto it = g.last_heard.find(kScheduler);
      const auto last = (it == g.last_heard.end() || it->second < start) ? start : it->second;
      if (now - last > limit) {
        found.emplace_back(Node(), std::chrono::duration<double>(now - last).count());
      }
    }
  }
  for (auto& f : found) {
    std::ostringstream os;
    os.precision(3);
    if (scheduler) {
      os << "ps-lite: " << DescribeNode(f.first) << " is gone: no heartbeat for " << f.second
         << " s (PS_HEARTBEAT_TIMEOUT=" << timeout << ")";
      Announce(van, f.first, os.str());
    } else {
      Node s = SchedulerNode();
      os << "ps-lite: lost the " << DescribeNode(s) << ": no answer to heartbeats for " << f.second
         << " s (PS_HEARTBEAT_TIMEOUT=" << timeout << ")";
      Fail(s, os.str());
    }
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

int DeadNodeTimeout() { return EnvSeconds("PS_HEARTBEAT_TIMEOUT"); }

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
  std::lock_guard<std::mutex> lk(G().mu);
  for (const auto& n : nodes) {
    if (n.id != Node::kEmpty) G().nodes[n.id] = n;
  }
}

void Start(Van* van) {
  State& g = G();
  const int interval = EnvSeconds("PS_HEARTBEAT_INTERVAL");
  const int timeout = EnvSeconds("PS_HEARTBEAT_TIMEOUT");
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.thread) return;
  g.stop = false;
  g.last_heard.clear();
  g.dead.clear();
  if (interval <= 0 && timeout <= 0) return;
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
  }
  g.cv.notify_all();
  if (t && t->get_id() != std::this_thread::get_id()) t->join();
  if (t && t->joinable()) t->detach();
}

void OnHeartbeat(int sender_id) {
  std::lock_guard<std::mutex> lk(G().mu);
  G().last_heard[sender_id] = Clock::now();
}

void OnDeadNodeNotice(const Message& msg) {
  Node dead;
  if (!msg.meta.control.node.empty()) dead = msg.meta.control.node[0];
  {
    std::lock_guard<std::mutex> lk(G().mu);
    G().dead.insert(dead.id);
  }
  Fail(dead, msg.meta.body + " (told by the scheduler)");
}

}  // namespace liveness
}  // namespace ps
