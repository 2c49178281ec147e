// byteps-thc: the cluster key (see include/ps/internal/cluster_key.h).
#include "ps/internal/cluster_key.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "ps/internal/env.h"
#include "ps/internal/liveness.h"
#include "ps/internal/postoffice.h"
#include "ps/internal/van.h"

namespace ps {
namespace cluster_key {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kKeyBytes = 32;  // crypto_box_PUBLICKEYBYTES == crypto_box_SECRETKEYBYTES
constexpr auto kRefusalLogEvery = std::chrono::seconds(60);
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // ZeroMQ's fixed ZAP address

// One monitored socket: its monitor's PAIR end and what its events mean.
struct Watched {
  void* pair = nullptr;
  bool receiver = false;
  Node peer;  // a sender's peer
  // a sender: when it last connected
  Clock::time_point connected;
  bool is_connected = false;
  // a receiver: fd -> (when accepted, the peer's address)
  std::map<int, std::pair<Clock::time_point, std::string>> accepted;
};

struct State {
  std::string path;
  uint8_t secret[kKeyBytes] = {};
  uint8_t pub[kKeyBytes] = {};
  bool enabled = false;
  void* context = nullptr;
  void* zap = nullptr;  // REP, owned by the watcher thread once it runs
  std::mutex mu;        // guards `pending` and `next_monitor`
  std::vector<std::unique_ptr<Watched>> pending;
  int next_monitor = 0;
  std::atomic<bool> stop{false};
  std::unique_ptr<std::thread> thread;
  // the watcher's: the cluster formed once (its van was ready); per host, the ZAP handler's
  // admissions of connections still open, and the refusal log's rate limit
  bool formed = false;
  std::map<std::string, int> admitted;
  std::map<std::string, Clock::time_point> logged;  // host -> last log
  std::map<std::string, int> suppressed;
};

State& G() {
  static State* s = new State;  // never destroyed: the watcher may outlive static teardown
  return *s;
}

[[noreturn]] void BadKeyFile(const std::string& why) {
  LOG(ERROR) << "ps-lite: BYTEPS_THC_CLUSTER_KEY=" << G().path << ": " << why
             << "; exiting with status " << kStartupExitStatus;
  std::cerr << std::flush;
  std::fflush(stderr);
  _exit(kStartupExitStatus);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void LoadKey() {
  State& g = G();
  struct stat st;
  if (stat(g.path.c_str(), &st) != 0) {
    BadKeyFile(std::string("cannot read it (") + std::strerror(errno) +
               "); make one with `bpslaunch --new-cluster-key FILE` and give every node a copy");
  }
  if (!S_ISREG(st.st_mode)) BadKeyFile("not a regular file");
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    BadKeyFile(std::string("mode ") + mode + " lets others read or change the key; `chmod 600 " +
               g.path + "` and try again");
  }
  std::ifstream in(g.path);
  std::string line, hex;
  int lines = 0;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    hex = line.substr(b, e - b + 1);
    ++lines;
  }
  if (lines != 1 || hex.size() != 2 * kKeyBytes) {
    BadKeyFile("not a cluster key file (one line of " + std::to_string(2 * kKeyBytes) +
               " hex digits is expected); make one with `bpslaunch --new-cluster-key FILE`");
  }
  for (int i = 0; i < kKeyBytes; ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) BadKeyFile("the key line holds a character that is not a hex digit");
    g.secret[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  if (sodium_init() < 0) BadKeyFile("libsodium failed to initialise");
  if (crypto_scalarmult_base(g.pub, g.secret) != 0) BadKeyFile("not a usable Curve25519 key");
}

// "10.0.0.2:41234" for a TCP peer, "a local (ipc) peer" otherwise.
std::string PeerAddress(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "a local (ipc) peer";
}

std::string KeyInForce() {
  return G().enabled ? "this node uses the cluster key BYTEPS_THC_CLUSTER_KEY=" + G().path
                     : "this node has no cluster key (BYTEPS_THC_CLUSTER_KEY is unset)";
}

std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

// The receiver refused `address`: logged once per host a minute, with how many were not.
void LogRefused(const std::string& address) {
  State& g = G();
  const std::string host = HostOf(address);
  const auto now = Clock::now();
  auto it = g.logged.find(host);
  if (it != g.logged.end() && now - it->second < kRefusalLogEvery) {
    ++g.suppressed[host];
    return;
  }
  const int more = g.suppressed[host];
  g.suppressed[host] = 0;
  g.logged[host] = now;
  LOG(WARNING) << "ps-lite: refused a connection from " << address
               << ": it did not complete the CURVE handshake with the cluster key (a node "
               << "without BYTEPS_THC_CLUSTER_KEY, with another key, or not a ps-lite node)"
               << (more ? "; " + std::to_string(more) + " more from " + host + " since then"
                        : std::string());
}

void OnEvent(Watched* w, uint16_t event, int32_t value, const std::string& endpoint) {
  const auto now = Clock::now();
  const auto quick = [&](Clock::time_point since) {
    return std::chrono::duration<double>(now - since).count() < kHandshakeSeconds;
  };
  if (w->receiver) {
    if (event == ZMQ_EVENT_ACCEPTED) {
      w->accepted[value] = {now, PeerAddress(value)};
    } else if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_CLOSED) {
      auto it = w->accepted.find(value);
      if (it == w->accepted.end()) return;
      // A connection that the ZAP handler admitted was no refusal, however short (a node that
      // connects again closes its first socket). Admissions carry the host only: while every
      // open connection of that host was admitted, this one was.
      const std::string host = HostOf(it->second.second);
      int open = 0;
      for (const auto& a : w->accepted) open += HostOf(a.second.second) == host;
      int& admitted = G().admitted[host];
      if (admitted >= open) {
        --admitted;
      } else if (quick(it->second.first)) {
        LogRefused(it->second.second);
      }
      w->accepted.erase(it);
    }
    return;
  }
  if (event == ZMQ_EVENT_CONNECTED) {
    w->connected = now;
    w->is_connected = true;
  } else if (event == ZMQ_EVENT_DISCONNECTED && w->is_connected) {
    w->is_connected = false;
    // Refusals come at registration: every node that registered holds the scheduler's key, so
    // the same key as every other node. Later quick closes are peers' teardown.
    Van* van = Postoffice::Get()->van();
    const bool formed = G().formed || (van && van->IsReady());
    if (quick(w->connected) && !formed && !ClusterFailed()) {
      std::ostringstream os;
      os << "ps-lite: " << DescribeNode(w->peer) << " at " << endpoint
         << " closed this node's connection during the ZeroMQ handshake (within "
         << kHandshakeSeconds << " s of connecting): it refuses this node's cluster key ("
         << KeyInForce()
         << "). Give every node of the cluster the same key file (bpslaunch --cluster-key FILE, "
         << "or BYTEPS_THC_CLUSTER_KEY=FILE), or none to every node";
      liveness::ReportRefusal(w->peer, os.str());
    }
  }
}

// Reads one monitor event: a 6-byte frame (uint16 event, int32 value) and the endpoint.
bool ReadEvent(void* pair, uint16_t* event, int32_t* value, std::string* endpoint) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, pair, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&msg);
    return false;
  }
  const bool ok = zmq_msg_size(&msg) >= 6;
  if (ok) {
    const auto* d = static_cast<const uint8_t*>(zmq_msg_data(&msg));
    std::memcpy(event, d, sizeof(*event));
    std::memcpy(value, d + 2, sizeof(*value));
  }
  const bool more = zmq_msg_more(&msg);
  zmq_msg_close(&msg);
  endpoint->clear();
  if (more) {
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, pair, 0) >= 0) {
      endpoint->assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    }
    zmq_msg_close(&msg);
  }
  return ok;
}

// One ZAP request (ZeroMQ RFC 27): admit CURVE clients that hold the cluster's key pair.
void AnswerZap(void* zap) {
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, zap, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      if (frames.empty()) return;
      break;  // a REP socket hands over whole requests: cannot end mid-way
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
    if (!more) break;
  }
  // version, request id, domain, address, identity, mechanism, credentials...
  const bool admit = frames.size() >= 7 && frames[5] == "CURVE" &&
                     frames[6].size() == static_cast<size_t>(kKeyBytes) &&
                     sodium_memcmp(frames[6].data(), G().pub, kKeyBytes) == 0;
  if (admit) ++G().admitted[frames[3]];  // the address frame: the peer's IP
  const std::string id = frames.size() > 1 ? frames[1] : std::string();
  const std::string reply[6] = {
      "1.0", id, admit ? "200" : "400", admit ? "OK" : "not the cluster key", "", ""};
  for (int i = 0; i < 6; ++i) {
    zmq_send(zap, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }
}

void Watch() {
  State& g = G();
  std::vector<std::unique_ptr<Watched>> watched;
  std::vector<zmq_pollitem_t> items;
  while (!g.stop.load()) {
    Van* van = Postoffice::Get()->van();
    if (van && van->IsReady()) g.formed = true;
    {
      std::lock_guard<std::mutex> lk(g.mu);
      for (auto& w : g.pending) watched.push_back(std::move(w));
      g.pending.clear();
    }
    items.clear();
    if (g.zap) items.push_back({g.zap, 0, ZMQ_POLLIN, 0});
    for (auto& w : watched) items.push_back({w->pair, 0, ZMQ_POLLIN, 0});
    if (zmq_poll(items.data(), static_cast<int>(items.size()), 100) <= 0) continue;
    size_t i = 0;
    if (g.zap && (items[i++].revents & ZMQ_POLLIN)) AnswerZap(g.zap);
    for (size_t k = 0; k < watched.size(); ++k, ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      uint16_t event = 0;
      int32_t value = 0;
      std::string endpoint;
      while (ReadEvent(watched[k]->pair, &event, &value, &endpoint)) {
        OnEvent(watched[k].get(), event, value, endpoint);
      }
    }
  }
  for (auto& w : watched) {
    int linger = 0;
    zmq_setsockopt(w->pair, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(w->pair);
  }
}

// Monitors `socket`'s events into a PAIR that the watcher reads.
void Monitor(void* socket, std::unique_ptr<Watched> w) {
  State& g = G();
  std::string endpoint;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    endpoint = "inproc://byteps-thc-monitor-" + std::to_string(g.next_monitor++);
  }
  if (zmq_socket_monitor(socket, endpoint.c_str(), ZMQ_EVENT_ALL) != 0) {
    LOG(WARNING) << "ps-lite: cannot watch a socket's handshakes: " << zmq_strerror(zmq_errno());
    return;
  }
  w->pair = zmq_socket(g.context, ZMQ_PAIR);
  if (!w->pair || zmq_connect(w->pair, endpoint.c_str()) != 0) {
    LOG(WARNING) << "ps-lite: cannot watch a socket's handshakes: " << zmq_strerror(zmq_errno());
    if (w->pair) zmq_close(w->pair);
    return;
  }
  std::lock_guard<std::mutex> lk(g.mu);  // hands the PAIR to the watcher (a full fence)
  g.pending.push_back(std::move(w));
}

}  // namespace

void Start(void* context) {
  State& g = G();
  if (g.context) return;
  g.context = context;
  g.formed = false;
  const char* path = Environment::Get()->find("BYTEPS_THC_CLUSTER_KEY");
  if (path && *path) {
    g.path = path;
    if (!zmq_has("curve")) {
      BadKeyFile("this build's ZeroMQ has no CURVE security (it needs libsodium)");
    }
    LoadKey();
    g.enabled = true;
    g.zap = zmq_socket(context, ZMQ_REP);
    if (!g.zap || zmq_bind(g.zap, kZapEndpoint) != 0) {
      BadKeyFile(std::string("cannot start the ZAP handler: ") + zmq_strerror(zmq_errno()));
    }
  }
  g.thread.reset(new std::thread(Watch));
}

bool Enabled() { return G().enabled; }

void Receiver(void* socket) {
  State& g = G();
  if (!g.enabled) return;
  const int one = 1;
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof(one)), 0);
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, g.secret, kKeyBytes), 0);
  std::unique_ptr<Watched> w(new Watched);
  w->receiver = true;
  Monitor(socket, std::move(w));
}

void Sender(void* socket, const Node& peer) {
  State& g = G();
  if (g.enabled) {
    CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, g.pub, kKeyBytes), 0);
    CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, g.pub, kKeyBytes), 0);
    CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, g.secret, kKeyBytes), 0);
  }
  std::unique_ptr<Watched> w(new Watched);
  w->peer = peer;
  Monitor(socket, std::move(w));
}

void Stop() {
  State& g = G();
  if (!g.context) return;
  g.stop = true;
  if (g.thread) g.thread->join();
  g.thread.reset();
  {
    std::lock_guard<std::mutex> lk(g.mu);
    for (auto& w : g.pending) zmq_close(w->pair);
    g.pending.clear();
  }
  if (g.zap) {
    int linger = 0;
    zmq_setsockopt(g.zap, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(g.zap);
    g.zap = nullptr;
  }
  g.context = nullptr;
  g.stop = false;
}

}  // namespace cluster_key
}  // namespace ps
