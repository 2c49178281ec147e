// byteps-thc: early departures (see include/ps/internal/departure.h).
#include "ps/internal/departure.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>

#include "ps/internal/env.h"
#include "ps/internal/liveness.h"
#include "ps/internal/postoffice.h"
#include "ps/internal/van.h"

namespace ps {
namespace departure {
namespace {

struct State {
  std::mutex mu;
  std::unordered_map<uint64_t, std::unordered_map<int, uint64_t>> pushes;  // key -> sender -> n
  std::map<int, Node> departed;                                            // id -> node
  bool reported = false;
  std::atomic<bool> departing{false};  // a worker: in Finalize
};

// The body of a finalizing worker's last BARRIER request (ps-lite's barriers carry none), and the
// start of the body of a node's DEPARTED to the scheduler before the cluster formed.
constexpr const char* kDepartingTag = "byteps-thc: departing";
constexpr const char* kEarlyTag = "byteps-thc: left before the cluster formed: ";

State& G() {
  static State* s = new State;  // never destroyed: ps-lite's threads may outlive static teardown
  return *s;
}

bool Off() {
  static const bool off = [] {
    const char* v = Environment::Get()->find("BYTEPS_ENABLE_ASYNC");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return off;
}

uint64_t Count(const std::unordered_map<int, uint64_t>& of_key, int id) {
  auto it = of_key.find(id);
  return it == of_key.end() ? 0 : it->second;
}

// Under g.mu: `ahead` pushed `key` `n` times, more than the `left` departed worker's `n_left`.
void Report(State& g, const Node& left, int ahead, uint64_t key, uint64_t n, uint64_t n_left) {
  if (g.reported) return;
  g.reported = true;
  std::ostringstream os;
  os << "ps-lite: " << DescribeNode(left)
     << " left the cluster early: it shut down (bps.shutdown(), or its script ended) after "
     << "pushing key " << key << " " << n_left << " times, and " << DescribeNodeId(ahead)
     << " has pushed it " << n << " times, a round the departed worker will never join (its "
     << "output says why it ended)";
  LOG(WARNING) << os.str() << "; asking the scheduler to end the cluster";
  Message m;
  m.meta.recver = kScheduler;
  m.meta.control.cmd = Control::DEAD_NODE;
  m.meta.control.node.push_back(left);
  m.meta.body = os.str();
  m.meta.timestamp = Postoffice::Get()->van()->GetTimestamp();
  try {  // Van::Send throws where ZeroMQ refuses: this server's caller must not see it
    Postoffice::Get()->van()->Send(m);
  } catch (const std::exception& e) {
    LOG(WARNING) << "ps-lite: could not tell the scheduler: " << e.what();
  }
}

// A node that leaves before the cluster formed: tells the scheduler (once its own registration
// is out: ps-lite's start runs in another thread), and exits.
[[noreturn]] void LeaveBeforeFormed(Van* van) {
  std::string me = liveness::DescribeSelf();
  for (int i = 0; me.empty() && i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    me = liveness::DescribeSelf();
  }
  LOG(ERROR) << "ps-lite: this " << (me.empty() ? std::string("node") : me)
             << " leaves before the cluster formed: its script ended (or raised) while ps-lite "
             << "still waited for the other nodes. Telling the scheduler, which ends the "
             << "cluster; exiting with status " << kStartupExitStatus;
  if (!me.empty()) {
    Message m;
    m.meta.recver = kScheduler;
    m.meta.control.cmd = Control::DEPARTED;
    m.meta.body = kEarlyTag + me;
    m.meta.timestamp = van->GetTimestamp();
    try {
      van->Send(m);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // ZeroMQ's I/O thread sends
    } catch (const std::exception& e) {
      LOG(ERROR) << "ps-lite: could not tell the scheduler: " << e.what();
    }
  }
  std::cerr << std::flush;
  std::fflush(stderr);
  _exit(kStartupExitStatus);  // ps-lite's start is still waiting in another thread
}

}  // namespace

void Finalizing(Van* van, bool do_barrier) {
  Postoffice* po = Postoffice::Get();
  if (!po->is_scheduler() && !van->IsReady()) LeaveBeforeFormed(van);
  if (do_barrier && po->is_worker() && !Off()) G().departing = true;
}

void TagBarrier(Message* req) {
  if (G().departing &&
      req->meta.control.barrier_group == kWorkerGroup + kServerGroup + kScheduler) {
    req->meta.body = kDepartingTag;
  }
}

void OnBarrier(const Message& msg) {
  if (Off() || !msg.meta.request || msg.meta.body != kDepartingTag || ClusterFailed()) return;
  Node left;
  if (!LookupNode(msg.meta.sender, &left)) {
    left.id = msg.meta.sender;
    left.role = Node::WORKER;
  }
  Van* van = Postoffice::Get()->van();
  for (int id : Postoffice::Get()->GetNodeIDs(kServerGroup)) {
    Message m;
    m.meta.recver = id;
    m.meta.control.cmd = Control::DEPARTED;
    m.meta.control.node.push_back(left);
    m.meta.timestamp = van->GetTimestamp();
    try {  // Van::Send throws where ZeroMQ refuses (a server already gone): not the scheduler's end
      van->Send(m);
    } catch (const std::exception& e) {
      LOG(WARNING) << "ps-lite: could not tell server " << id << " that " << DescribeNode(left)
                   << " left: " << e.what();
    }
  }
}

void OnDeparted(const Message& msg) {
  if (Postoffice::Get()->is_scheduler()) {
    const std::string& body = msg.meta.body;
    if (body.compare(0, std::strlen(kEarlyTag), kEarlyTag) != 0) return;
    LOG(ERROR) << "ps-lite: " << body.substr(std::strlen(kEarlyTag))
               << " left before the cluster formed (its script ended or raised: its output says "
               << "why), so the cluster cannot form; the other nodes end at their "
               << "BYTEPS_THC_STARTUP_TIMEOUT. Start the whole cluster again; exiting with status "
               << kStartupExitStatus;
    std::cerr << std::flush;
    std::fflush(stderr);
    _exit(kStartupExitStatus);
  }
  if (Off() || msg.meta.control.node.empty()) return;
  const Node& left = msg.meta.control.node[0];
  State& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  g.departed[left.id] = left;
  for (const auto& kv : g.pushes) {  // a worker already ahead of the departed one
    const uint64_t n_left = Count(kv.second, left.id);
    for (const auto& sn : kv.second) {
      if (sn.first != left.id && sn.second > n_left) {
        Report(g, left, sn.first, kv.first, sn.second, n_left);
        return;
      }
    }
  }
}

void OnPush(uint64_t key, int sender) {
  if (Off()) return;
  State& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  auto& of_key = g.pushes[key];
  const uint64_t n = ++of_key[sender];
  for (const auto& d : g.departed) {
    if (d.first == sender) continue;
    const uint64_t n_left = Count(of_key, d.first);
    if (n > n_left) {
      Report(g, d.second, sender, key, n, n_left);
      return;
    }
  }
}

}  // namespace departure
}  // namespace ps
