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
#include <thread>

#include "ps/internal/env.h"
#include "ps/internal/liveness.h"

namespace ps {
namespace cluster_key {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kKeyBytes = 32;  // crypto_box_PUBLICKEYBYTES == crypto_box_SECRETKEYBYTES
constexpr auto kRefusalLogEvery = std::chrono::seconds(60);
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
  std::map<std::string, Clock::time_point> logged;  // the handler's: host -> last refusal line
  std::map<std::string, int> suppressed;
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

// The handler refused a client from `host`: logged once per host a minute, with how many were not.
void LogRefused(const std::string& host) {
  State& g = G();
  const auto now = Clock::now();
  auto it = g.logged.find(host);
  if (it != g.logged.end() && now - it->second < kRefusalLogEvery) {
    ++g.suppressed[host];
    return;
  }
  const int more = g.suppressed[host];
  g.suppressed[host] = 0;
  g.logged[host] = now;
  LOG(WARNING) << "ps-lite: refused a connection from " << host
               << ": its CURVE key is not the cluster key"
               << (more ? "; " + std::to_string(more) + " more from there since then"
                        : std::string());
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
  if (!admit) LogRefused(frames.size() > 3 ? frames[3] : std::string("?"));  // the peer's IP
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

}  // namespace

void Start(void* context) {
  State& g = G();
  if (g.context) return;
  g.context = context;
  const char* path = Environment::Get()->find("BYTEPS_THC_CLUSTER_KEY");
  if (path && *path) {
    g.path = path;
    LoadKey();  // first: a bad key file is the user's to fix whatever the build
    if (!zmq_has("curve")) {
      BadKeyFile("this build's ZeroMQ has no CURVE security (it needs libsodium)");
    }
    g.enabled = true;
    g.zap = zmq_socket(context, ZMQ_REP);
    if (!g.zap || zmq_bind(g.zap, kZapEndpoint) != 0) {
      BadKeyFile(std::string("cannot start the ZAP handler: ") + zmq_strerror(zmq_errno()));
    }
    g.thread.reset(new std::thread(Answer));
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
