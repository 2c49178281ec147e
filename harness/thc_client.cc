// byteps-thc test client: a real ps-lite worker that talks to the real BytePS server the way a
// BytePS worker does (same keys, commands and payloads), driven line by line on stdin so that
// tests/cluster/test_thc_server.py and benchmarks/bench_server.py can script it.
//
// Start it with the usual DMLC_* environment (DMLC_ROLE=worker). Commands (one per line), each
// answered with one line "ok ..." or "err ...":
//   hello                                  -> ok <rank> <num_workers> <node id>
//   push <key> <cmd> <path>                -> ok <bytes>      (blocking push of a file's bytes)
//   rawpush <key> <cmd> <lens> <path>      -> ok <bytes>      (the same, but the ps-lite length
//        field says <lens> whatever the file holds: what a broken or hostile worker can send)
//   pull <key> <cmd> <capacity> <path>     -> ok <bytes>      (blocking pull, written to path)
//   fp <key> <d> <serialised kwargs...>    -> ok <fingerprint> <payload_bytes> <padded>
//   loop <rounds> <manifest>               -> ok <seconds> <bytes pushed> <bytes pulled>
//        manifest lines: <key> <push_cmd> <pull_cmd> <capacity> <payload path>; every round
//        pushes every payload asynchronously and pulls each key once its push is acknowledged.
//   quit                                   -> ok   (then ps::Finalize)
// Keys are BytePS keys (declared_key << 16 | partition); all go to server 0, so tests use one
// server. <cmd> is BytePS's command (request type paired with dtype; see thc_wire.h).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "byteps/common/compressor/impl/thc_wire.h"
#include "ps/ps.h"

namespace tw = byteps::common::compressor::thcwire;

namespace {

ps::KVWorker<char>* kv = nullptr;

ps::Key PsKey(uint64_t key) { return ps::Postoffice::Get()->GetServerKeyRanges()[0].begin() + key; }

bool ReadFile(const std::string& path, std::vector<char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

// Minimal kwargs parser for the client only: BytePS's own "N k v k v ..." serialisation.
tw::Kwargs ParseSerialised(std::istream& is) {
  tw::Kwargs kwargs;
  size_t n = 0;
  is >> n;
  for (size_t i = 0; i < n; ++i) {
    std::string k, v;
    is >> k >> v;
    kwargs[k] = v;
  }
  return kwargs;
}

// The slicer of every request: forwards it whole to server 0. That is what ps-lite's default
// slicer does with one key of server 0 (every request here: PsKey), except that the default one
// cuts the values by the length field, and a rawpush's length field may disagree with them.
void Slice(const ps::KVPairs<char>& send, const std::vector<ps::Range>& ranges,
           ps::KVWorker<char>::SlicedKVs* sliced) {
  sliced->assign(ranges.size(), {false, ps::KVPairs<char>()});
  (*sliced)[0] = {true, send};
}

std::string Push(uint64_t key, int cmd, std::vector<char>& data, const int* lens_field = nullptr) {
  ps::SArray<ps::Key> keys(1, PsKey(key));
  ps::SArray<char> vals(data.data(), data.size(), false);
  ps::SArray<int> lens(1, lens_field ? *lens_field : static_cast<int>(data.size()));
  kv->Wait(kv->ZPush(keys, vals, lens, cmd));
  return "ok " + std::to_string(data.size());
}

std::string Pull(uint64_t key, int cmd, size_t capacity, const std::string& path) {
  std::vector<char> buf(capacity);
  ps::SArray<ps::Key> keys(1, PsKey(key));
  ps::SArray<char> vals(buf.data(), buf.size(), false);
  ps::SArray<int> lens;
  kv->Wait(kv->ZPull(keys, &vals, &lens, cmd));
  size_t got = lens.empty() ? 0 : static_cast<size_t>(lens[0]);
  std::ofstream f(path, std::ios::binary);
  f.write(buf.data(), got);
  if (!f) return "err cannot write " + path;
  return "ok " + std::to_string(got);
}

std::string Fp(std::istream& is) {
  uint64_t key = 0;
  size_t d = 0;
  is >> key >> d;
  tw::ThcSettings s;
  std::string err = tw::ParseThcKwargs(ParseSerialised(is), &s);
  if (!err.empty()) return "err " + err;
  thc::Config cfg = tw::PartitionConfig(s.config, key);
  thc::Geometry geo = thc::MakeGeometry(cfg, d);
  return "ok " + std::to_string(tw::Fingerprint(cfg, d)) + " " + std::to_string(geo.payload_bytes) +
         " " + std::to_string(geo.padded);
}

struct Item {
  uint64_t key;
  int push_cmd, pull_cmd;
  std::vector<char> payload, reply;
  ps::SArray<ps::Key> keys;
  ps::SArray<int> push_lens, pull_lens;
  uint64_t pulled_bytes = 0;
};

std::string Loop(std::istream& is) {
  int rounds = 0;
  std::string manifest;
  is >> rounds >> manifest;
  std::ifstream mf(manifest);
  if (!mf) return "err cannot read " + manifest;
  std::vector<Item> items;
  std::string line;
  while (std::getline(mf, line)) {
    std::istringstream ls(line);
    Item it;
    size_t cap = 0;
    std::string path;
    if (!(ls >> it.key >> it.push_cmd >> it.pull_cmd >> cap >> path)) continue;
    if (!ReadFile(path, &it.payload)) return "err cannot read " + path;
    it.reply.resize(cap);
    it.keys = ps::SArray<ps::Key>(1, PsKey(it.key));
    it.push_lens = ps::SArray<int>(1, static_cast<int>(it.payload.size()));
    items.push_back(std::move(it));
  }
  std::mutex mu;
  std::condition_variable cv;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r) {
    size_t done = 0;
    for (auto& it : items) {
      Item* p = &it;
      ps::SArray<char> vals(p->payload.data(), p->payload.size(), false);
      kv->ZPush(p->keys, vals, p->push_lens, p->push_cmd, [p, &mu, &cv, &done]() {
        // Pull from a plain thread, not from inside ps-lite's callback.
        std::thread([p, &mu, &cv, &done]() {
          auto reply = new ps::SArray<char>(p->reply.data(), p->reply.size(), false);
          p->pull_lens = ps::SArray<int>();
          int ts = kv->ZPull(p->keys, reply, &p->pull_lens, p->pull_cmd);
          kv->Wait(ts);
          delete reply;
          std::lock_guard<std::mutex> lock(mu);
          p->pulled_bytes += p->pull_lens.empty() ? 0 : p->pull_lens[0];
          ++done;
          cv.notify_all();
        }).detach();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&]() { return done == items.size(); });
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t up = 0, down = 0;
  for (auto& it : items) {
    up += it.payload.size() * static_cast<uint64_t>(rounds);
    down += it.pulled_bytes;
  }
  return "ok " + std::to_string(secs) + " " + std::to_string(up) + " " + std::to_string(down);
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  kv = new ps::KVWorker<char>(0, 0);
  kv->set_slicer(Slice);
  ps::StartAsync(0, "thc_client\0");
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream is(line);
    std::string op;
    is >> op;
    std::string out;
    if (op == "hello") {
      out = "ok " + std::to_string(ps::MyRank()) + " " + std::to_string(ps::NumWorkers()) + " " +
            std::to_string(ps::Postoffice::Get()->van()->my_node().id);
    } else if (op == "push") {
      uint64_t key;
      int cmd;
      std::string path;
      std::vector<char> data;
      is >> key >> cmd >> path;
      out = ReadFile(path, &data) ? Push(key, cmd, data) : "err cannot read " + path;
    } else if (op == "rawpush") {
      uint64_t key;
      int cmd, lens;
      std::string path;
      std::vector<char> data;
      is >> key >> cmd >> lens >> path;
      out = ReadFile(path, &data) ? Push(key, cmd, data, &lens) : "err cannot read " + path;
    } else if (op == "pull") {
      uint64_t key;
      int cmd;
      size_t cap;
      std::string path;
      is >> key >> cmd >> cap >> path;
      out = Pull(key, cmd, cap, path);
    } else if (op == "fp") {
      out = Fp(is);
    } else if (op == "loop") {
      out = Loop(is);
    } else if (op == "quit") {
      std::cout << "ok" << std::endl;
      break;
    } else {
      out = "err unknown command '" + op + "'";
    }
    std::cout << out << std::endl;
  }
  ps::Finalize(0, true);
  delete kv;
  return 0;
}
