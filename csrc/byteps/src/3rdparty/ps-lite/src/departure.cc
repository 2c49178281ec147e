// byteps-thc: early departures (see include/ps/internal/departure.h).
#include "ps/internal/departure.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
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
};

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
  if (Postoffice::Get()->van()->Send(m) < 0) LOG(WARNING) << "could not tell the scheduler";
}

}  // namespace

void Departing() {
  if (Off() || ClusterFailed()) return;
  Van* van = Postoffice::Get()->van();
  const Node me = van->my_node();
  for (int id : Postoffice::Get()->GetNodeIDs(kServerGroup)) {
    Message m;
    m.meta.recver = id;
    m.meta.control.cmd = Control::DEPARTED;
    m.meta.control.node.push_back(me);
    m.meta.timestamp = van->GetTimestamp();
    van->Send(m);
  }
}

void OnDeparted(const Message& msg) {
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
