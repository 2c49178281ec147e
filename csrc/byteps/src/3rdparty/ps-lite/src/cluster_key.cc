// byteps-thc: the cluster key (see include/ps/internal/cluster_key.h).
#include "ps/internal/cluster_key.h"

#include <sodium.h>
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
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/internal/env.h"
#include "ps/internal/liveness.h"

namespace ps {
namespace cluster_key {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kKeyBytes = 32;  // crypto_box_PUBLICKEYBYTES == crypto_box_SECRETKEYBYTES
constexpr auto kRefusalLogEvery = std::chrono::seconds(60);
constexpr size_t kRefusalsTracked = 4096;  // (address, kind of cause) pairs with lines
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // ZeroMQ's fixed ZAP address

struct State {
  std::string path;
  uint8_t secret[kKeyBytes] = {};
  uint8_t pub[kKeyBytes] = {};
  bool enabled = false;
  void* context = nullptr;
  void* zap = nullptr;  // REP, owned by the handler's thread once it runs
  std::atomic<bool> stop{false};
  std::unique_ptr<std::thread> thread;
  std::string role;                    // DMLC_ROLE, for the refusal lines
  std::unique_ptr<std::thread> probe;  // a worker's or server's handshake check (Probe)
  std::atomic<bool> probe_stop{false};
};

State& G() {
  static State* s = new State;  // never destroyed: the ZAP thread may outlive static teardown
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

// The connections this node refused in the handshake, as ZeroMQ reports them (our patch of it,
// zmq_thc_set_refusal_hook): on its I/O threads, several at once, while ps-lite runs and while it
// stops. Each (address, kind of cause) gets a line at most once every kRefusalLogEvery, with the
// count of those it did not log; all are counted for the summary of Stop. Never destroyed, as
// State.
struct Refusals {
  struct Seen {
    Clock::time_point logged;
    uint64_t unlogged = 0;
  };
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, Seen> seen;  // at most kRefusalsTracked
  std::map<int, uint64_t> by_cause;
  std::set<std::string> addresses;  // at most kRefusalsTracked
  uint64_t total = 0;
  std::string where;  // "the scheduler at 10.0.0.1:9000", from the last report
};

Refusals& R() {
  static Refusals* r = new Refusals;
  return *r;
}

// A cause of ZeroMQ's (ZMQ_THC_REFUSED_* of zmq.h) as a refusal line names it: its kind, then
// what the node saw.
const char* RefusalCause(int cause) {
  switch (cause) {
    case ZMQ_THC_REFUSED_NOT_ZMTP:
      return "not a ZeroMQ peer (its first bytes are no ZMTP 3.0 greeting)";
    case ZMQ_THC_REFUSED_NULL: return "no cluster key (a ZeroMQ peer without CURVE security)";
    case ZMQ_THC_REFUSED_MECHANISM:
      return "no cluster key (a ZeroMQ peer with another security mechanism than CURVE)";
    case ZMQ_THC_REFUSED_LEFT:  // a CURVE peer, with any key, goes on to its HELLO there
      return "no cluster key (a ZeroMQ peer that closed the connection on reading CURVE in this "
             "node's greeting)";
    case ZMQ_THC_REFUSED_HANDSHAKE:
      return "another key (its CURVE handshake does not open with the cluster key)";
    case ZMQ_THC_REFUSED_DENIED:
      return "another key (its long-term CURVE key is not the cluster key)";
    default: return "its handshake failed";
  }
}

// The short form of a cause, what the operator fixes: the lines' rate limit and the summary
// count by it.
const char* RefusalKind(int cause) {
  switch (cause) {
    case ZMQ_THC_REFUSED_NOT_ZMTP: return "not a ZeroMQ peer";
    case ZMQ_THC_REFUSED_NULL:
    case ZMQ_THC_REFUSED_MECHANISM:
    case ZMQ_THC_REFUSED_LEFT: return "no cluster key";
    case ZMQ_THC_REFUSED_HANDSHAKE:
    case ZMQ_THC_REFUSED_DENIED: return "another key";
    default: return "a failed handshake";
  }
}

std::string Endpoint(const char* endpoint) {
  std::string e = endpoint ? endpoint : "";
  return e.compare(0, 6, "tcp://") == 0 ? e.substr(6) : e;
}

std::string PeerAddress(const char* peer) {
  const std::string a = peer ? peer : "";
  if (a.empty()) return "an unknown address";
  return a[0] == ':' ? "a local process (uid:gid:pid " + a.substr(1) + ")" : a;
}

std::string Plural(uint64_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// ZeroMQ's refusal hook: one line per (address, kind) a minute at most. It must not throw
// into ZeroMQ, and never aborts: a failure to log is dropped.
void OnRefused(const char* endpoint, const char* peer, int cause) {
  try {
    Refusals& r = R();
    const std::string address = PeerAddress(peer);
    const auto now = Clock::now();
    std::ostringstream line;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.where = "the " + (G().role.empty() ? std::string("node") : G().role) + " at " +
                Endpoint(endpoint);
      ++r.total;
      ++r.by_cause[cause];
      if (r.addresses.size() < kRefusalsTracked) r.addresses.insert(address);
      const auto key = std::make_pair(address, std::string(RefusalKind(cause)));
      auto it = r.seen.find(key);
      if (it == r.seen.end()) {
        if (r.seen.size() >= kRefusalsTracked) return;  // counted for the summary only
        it = r.seen.emplace(key, Refusals::Seen()).first;
      } else if (now - it->second.logged < kRefusalLogEvery) {
        ++it->second.unlogged;
        return;
      }
      line << "ps-lite: " << r.where << " refused a connection from " << address << ": "
           << RefusalCause(cause);
      if (it->second.unlogged) {
        line << "; " << it->second.unlogged << " more like it from there since the last such line";
      }
      line << "; " << r.total << " refused so far (one line per address and cause a minute"
           << (r.seen.size() >= kRefusalsTracked ? "; no more addresses get a line" : "") << ")";
      it->second.logged = now;
      it->second.unlogged = 0;
    }
    LOG(WARNING) << line.str();
  } catch (...) {
  }
}

// How many connections this node refused while it ran, by kind: once, as it stops.
void LogRefusalSummary() {
  Refusals& r = R();
  std::ostringstream line;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.total) return;
    std::map<std::string, uint64_t> kinds;
    for (const auto& c : r.by_cause) kinds[RefusalKind(c.first)] += c.second;
    line << "ps-lite: " << r.where << " refused " << Plural(r.total, "connection")
         << " in the handshake while it ran:";
    const char* sep = " ";
    for (const auto& k : kinds) {
      line << sep << k.second << " " << k.first;
      sep = ", ";
    }
    line << "; from " << Plural(r.addresses.size(), "address")
         << (r.addresses.size() >= kRefusalsTracked ? " or more" : "") << " (";
    int shown = 0;
    for (const auto& a : r.addresses) {
      if (shown == 8) {
        line << ", ...";
        break;
      }
      line << (shown++ ? ", " : "") << a;
    }
    line << ")";
    r.seen.clear();
    r.by_cause.clear();
    r.addresses.clear();
    r.total = 0;
  }
  LOG(WARNING) << line.str();
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
  // A refused client is logged by OnRefused, as ZeroMQ drops its connection.
  const bool admit = frames.size() >= 7 && frames[5] == "CURVE" &&
                     frames[6].size() == static_cast<size_t>(kKeyBytes) &&
                     sodium_memcmp(frames[6].data(), G().pub, kKeyBytes) == 0;
  const std::string id = frames.size() > 1 ? frames[1] : std::string();
  const std::string reply[6] = {
      "1.0", id, admit ? "200" : "400", admit ? "OK" : "not the cluster key", "", ""};
  for (int i = 0; i < 6; ++i) {
    zmq_send(zap, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }
}

// The ZAP handler's thread: answers requests until Stop().
void Answer() {
  State& g = G();
  while (!g.stop.load()) {
    zmq_pollitem_t item = {g.zap, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) > 0 && (item.revents & ZMQ_POLLIN)) AnswerZap(g.zap);
  }
}

// One event of a socket monitor (ZeroMQ 4.1: a 6-byte frame of event and value, then the
// endpoint); 0 when none came within `ms`.
int NextEvent(void* monitor, int ms) {
  zmq_pollitem_t item = {monitor, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, ms) <= 0) return 0;
  int event = 0;
  for (bool first = true;; first = false) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, monitor, 0) < 0) {
      zmq_msg_close(&msg);
      return event;
    }
    if (first && zmq_msg_size(&msg) >= 2) {
      uint16_t e;
      std::memcpy(&e, zmq_msg_data(&msg), sizeof(e));
      event = e;
    }
    const bool more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
    if (!more) return event;
  }
}

// A worker or server checks once, beside ps-lite's own start, that the scheduler completes a
// handshake with this node's mechanism (CURVE with the key, NULL without): ZeroMQ 4.1 tells a
// refused client nothing but a closed connection, and ps-lite's own sockets would retry until the
// startup timeout. The check is a DEALER of its own context (one socket, its monitor, both closed
// by this thread alone), which connects and sends nothing. A handshake that fails closes the
// connection at once; one that succeeds leaves it open. Another key: the scheduler closes it, and
// ZeroMQ reconnects (an event within reconnect_ivl). Another mechanism (a key on one side only):
// both ends see the mismatch in the greeting, and ZeroMQ gives up without a reconnect, so no event
// follows. So a refusal (the node exits saying so) is kStrikes connections in a row closed within
// kQuiet of opening, or one so closed and then kSilent without an event; a connection that stays
// open kQuiet ends the check.
void Probe(std::string endpoint) {
  constexpr int kStrikes = 3;
  constexpr auto kQuiet = std::chrono::seconds(2);
  constexpr auto kSilent = std::chrono::milliseconds(1500);  // >> reconnect_ivl's 100-200 ms
  constexpr auto kGiveUp = std::chrono::minutes(10);  // the startup timeout is ps-lite's to keep
  State& g = G();
  void* ctx = zmq_ctx_new();
  if (!ctx) return;
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  void* monitor = nullptr;
  const int linger = 0, ivl = 100;
  const std::string inproc = "inproc://byteps-thc-cluster-key-probe";
  bool ok = dealer && zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger)) == 0 &&
            zmq_setsockopt(dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl)) == 0;
  if (ok) Sender(dealer);  // this node's mechanism (cluster_key.h), as ps-lite's senders have it
  ok = ok && zmq_socket_monitor(dealer, inproc.c_str(), ZMQ_EVENT_ALL) == 0;
  if (ok) {
    monitor = zmq_socket(ctx, ZMQ_PAIR);
    ok = monitor && zmq_setsockopt(monitor, ZMQ_LINGER, &linger, sizeof(linger)) == 0 &&
         zmq_connect(monitor, inproc.c_str()) == 0 && zmq_connect(dealer, endpoint.c_str()) == 0;
  }
  int strikes = 0;
  bool open = false, closed_at_once = false;
  Clock::time_point opened, closed;
  const auto give_up = Clock::now() + kGiveUp;
  while (ok && !g.probe_stop.load() && Clock::now() < give_up) {
    const int event = NextEvent(monitor, 100);
    const auto now = Clock::now();
    if (event == ZMQ_EVENT_CONNECTED || event == ZMQ_EVENT_CONNECT_DELAYED ||
        event == ZMQ_EVENT_CONNECT_RETRIED) {
      closed_at_once = false;  // ZeroMQ reconnects
    }
    if (event == ZMQ_EVENT_CONNECTED) {
      open = true;
      opened = now;
    } else if ((event == ZMQ_EVENT_DISCONNECTED && open) ||
               (!event && closed_at_once && now - closed >= kSilent)) {
      if (event) {  // closed
        open = false;
        strikes = now - opened < kQuiet ? strikes + 1 : 0;
        closed_at_once = strikes > 0;
        closed = now;
      }
      if (strikes >= kStrikes || (!event && closed_at_once)) {
        const std::string where = "ps-lite: the scheduler at " + endpoint.substr(6);
        const std::string how = event ? std::to_string(kStrikes) + " times in a row"
                                      : std::string("(the two ends use different mechanisms)");
        if (g.enabled) {
          LOG(ERROR) << where
                     << " refused this node's cluster key (BYTEPS_THC_CLUSTER_KEY=" << g.path
                     << "): it closed the connection in the CURVE handshake " << how
                     << ", so it has another key or none. Give every node of the cluster the same "
                     << "key file (or none at all); exiting with status " << kStartupExitStatus;
        } else {
          LOG(ERROR) << where << " refused this node, which has no cluster key: it closed the "
                     << "connection in the handshake " << how << ", so it asks for a key "
                     << "(BYTEPS_THC_CLUSTER_KEY). Give every node of the cluster the same key "
                     << "file (bpslaunch --cluster-key FILE); exiting with status "
                     << kStartupExitStatus;
        }
        std::cerr << std::flush;
        std::fflush(stderr);
        _exit(kStartupExitStatus);  // ps-lite's threads are still starting
      }
    } else if (open && now - opened >= kQuiet) {
      break;  // the handshake held: the scheduler takes this node's key, or its lack of one
    }
  }
  if (dealer) zmq_socket_monitor(dealer, nullptr, 0);
  if (monitor) zmq_close(monitor);
  if (dealer) zmq_close(dealer);
  zmq_ctx_term(ctx);
}

}  // namespace

void Start(void* context) {
  State& g = G();
  if (g.context) return;
  g.context = context;
  Environment* env = Environment::Get();
  const char* role = env->find("DMLC_ROLE");
  const char* path = env->find("BYTEPS_THC_CLUSTER_KEY");
  if (path && *path) {
    g.path = path;
    LoadKey();  // first: a bad key file is the user's to fix whatever the build
    if (!zmq_has("curve")) {
      BadKeyFile("this build's ZeroMQ has no CURVE security (it needs libsodium)");
    }
    g.enabled = true;
    g.role = role ? role : "";
    // Before the van's sockets exist (the hook's contract, zmq.h). Only a keyed node has CURVE
    // servers; an unkeyed one has no hook, and ZeroMQ drops a peer there as it always did.
    zmq_thc_set_refusal_hook(OnRefused);
    g.zap = zmq_socket(context, ZMQ_REP);
    if (!g.zap || zmq_bind(g.zap, kZapEndpoint) != 0) {
      BadKeyFile(std::string("cannot start the ZAP handler: ") + zmq_strerror(zmq_errno()));
    }
    g.thread.reset(new std::thread(Answer));
  }
  const char* uri = env->find("DMLC_PS_ROOT_URI");
  const char* port = env->find("DMLC_PS_ROOT_PORT");
  const char* local = env->find("DMLC_LOCAL");  // the van's ipc:// addresses
  if (role && std::strcmp(role, "scheduler") != 0 && uri && port) {
    const bool ipc = local && *local && std::strcmp(local, "0") != 0;
    g.probe.reset(new std::thread(
        Probe, ipc ? std::string("ipc:///tmp/") + port : std::string("tcp://") + uri + ":" + port));
  }
}

void Receiver(void* socket) {
  State& g = G();
  if (!g.enabled) return;
  const int one = 1;
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof(one)), 0);
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, g.secret, kKeyBytes), 0);
}

void Sender(void* socket) {
  State& g = G();
  if (!g.enabled) return;
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, g.pub, kKeyBytes), 0);
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, g.pub, kKeyBytes), 0);
  CHECK_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, g.secret, kKeyBytes), 0);
}

void Stop() {
  State& g = G();
  if (!g.context) return;
  LogRefusalSummary();
  g.probe_stop = true;
  if (g.probe) g.probe->join();
  g.probe.reset();
  g.probe_stop = false;
  g.stop = true;
  if (g.thread) g.thread->join();
  g.thread.reset();
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
