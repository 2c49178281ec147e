// byteps-thc: the server's protocol for homomorphic keys (THC's and LHC's).
//
// A key registered with compressor_type=thc or =lhc is never decompressed, no float of it is
// touched and nothing is recompressed: its codec (codec_key.h; thc_key.cc, lhc_key.cc) checks
// each push and adds it to integer sums, and the n-th push of a round publishes them. This file
// is what every such key shares, and what a codec cannot change:
//
// Registration: every worker registers the key once (BytePS's compressor registration); the
// first creates the key's codec from its kwargs, each one is handed to it, and all are answered
// once every worker has registered. A refusal fails every round of the key.
//
// Rounds: three kinds, each counted on its own: the data round, the max round (request type
// thcwire::kThcNormRequest: one double per worker reduced by max; NaN if one is NaN, else +inf if
// one is +inf: the workers then skip that step, BYTEPS_THC_NONFINITE=propagate; =error fails the
// round) and a codec's fallback round (LHC's). A worker pushes round r, then pulls round r, then
// (next step) pushes round r+1. A pull is answered as soon as the round its sender last pushed
// into is complete; pushes of round r+1 accumulate while slow workers still pull round r, whose
// result lives in its own published buffer (held by ps-lite until sent), so no pull can see a
// half-summed round.
//
// Errors: a push that does not fit is logged with the key and the sender, still counts for its
// round (so nobody waits forever), and marks the round failed: every pull of it gets a response
// whose header carries the status and the message, and the worker fails with it. Registration
// errors (invalid or overflow-prone configuration, workers that disagree) fail every round of the
// key. Other keys are unaffected; the server never aborts on a worker's input.
#include "thc_server.h"
#include "codec_key.h"
#include "thc_stall.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/compressor/impl/thc_wire.h"
#include "../common/compressor/kwargs_check.h"
#include "../common/logging.h"  // before utils.h, which uses BPS_LOG
#include "../common/nonfinite.h"

#include "../common/compressor/utils.h"

namespace byteps {
namespace server {
namespace {

namespace tw = common::compressor::thcwire;

// One kind of round (data, max or fallback) of one key.
struct Round {
  uint64_t completed = 0;                       // rounds completed so far
  std::unordered_map<int, uint64_t> pushed_in;  // sender -> 1-based round it last pushed into
  std::set<int> senders;                        // senders of the current round
  std::string error;                            // first error of the current round
  std::vector<ps::KVMeta> pending;              // pulls waiting for the current round
  ps::SArray<char> published;                   // header + result of the last completed round
};

struct Key {
  std::vector<ps::KVMeta> waiting;  // registration requests, answered once all workers sent one
  std::string fatal;                // non-empty: every round of this key fails with it
  // The key's codec, from its first registration. None: that registration's kwargs named no
  // compressor BytePS has (kwargs_check.h); the key is refused (fatal), answered as the codecs'
  // are, and every round of it fails with the refusal.
  std::unique_ptr<CodecKey> codec;
  Round data, norm, fallback;
  double norm_max = 0.0;    // the round's max: NaN if a NaN was pushed, else +inf if an inf was
  double agreed_max = 0.0;  // the max of the last completed max round (LHC's scale)
};

// The name a key's messages give it: its codec's, "BytePS" for a refused key.
std::string Name(const Key& k, uint64_t key) {
  return std::string(k.codec ? k.codec->name() : "BytePS") + " key " + std::to_string(key);
}

std::mutex thc_mu_;
std::unordered_map<uint64_t, std::unique_ptr<Key>> thc_keys_;

// A pull reply: the header, then room for `bytes` of payload (*payload), not zero-filled.
ps::SArray<char> Reply(int32_t status, uint32_t lane_bits, uint32_t n, uint64_t round, size_t bytes,
                       char** payload) {
  tw::PullHeader h;
  h.magic = tw::kPullMagic;
  h.status = status;
  h.lane_bits = lane_bits;
  h.num_workers = n;
  h.round = round;
  h.payload_bytes = bytes;
  ps::SArray<char> out(new char[sizeof(h) + bytes], sizeof(h) + bytes, true);
  std::memcpy(out.data(), &h, sizeof(h));
  *payload = out.data() + sizeof(h);
  return out;
}

// A failed round's reply: status 1 and the message.
ps::SArray<char> MakeError(const std::string& message, uint64_t round) {
  std::string m = message.substr(0, tw::kMaxErrorBytes);
  char* payload = nullptr;
  ps::SArray<char> out = Reply(1, 0, 0, round, m.size(), &payload);
  if (!m.empty()) std::memcpy(payload, m.data(), m.size());
  return out;
}

void Respond(const ps::KVMeta& req, const ps::KVPairs<char>& req_data, const ps::SArray<char>& vals,
             ps::KVServer<char>* server) {
  ps::KVPairs<char> res;
  res.keys = req_data.keys;
  res.vals = vals;
  res.lens = {static_cast<int>(vals.size())};
  server->Response(req, res);
}

// Records one push of `sender` into `round`; false (with the round failed) on a second push of
// the same sender in one round.
bool Enter(Round* round, const std::string& name, int sender) {
  if (round->senders.count(sender)) {
    std::string msg = name + ": push from node " + std::to_string(sender) +
                      " arrived twice in round " + std::to_string(round->completed + 1) +
                      " (pull before pushing again)";
    LOG(ERROR) << msg;
    if (round->error.empty()) round->error = msg;
    return false;
  }
  round->senders.insert(sender);
  round->pushed_in[sender] = round->completed + 1;
  return true;
}

void Fail(Round* round, const std::string& msg, bool log = true) {
  if (log) LOG(ERROR) << msg;
  if (round->error.empty()) round->error = msg;
}

// The n-th push of a round: publish and answer the pulls that wait for it.
void Complete(Round* round, ps::SArray<char> result, ps::KVServer<char>* server,
              const ps::KVPairs<char>& req_data) {
  round->completed += 1;
  round->published = result;
  round->senders.clear();
  round->error.clear();
  for (const auto& req : round->pending) Respond(req, req_data, round->published, server);
  round->pending.clear();
}

// After each push: the round's n-th push publishes `result()` (its failure instead, if a push
// failed it) and `reset()` clears the sums for the next round.
template <typename Result, typename Reset>
void MaybeComplete(Round* round, Result result, Reset reset, ps::KVServer<char>* server,
                   const ps::KVPairs<char>& req_data) {
  if (round->senders.size() < static_cast<size_t>(ps::NumWorkers())) return;
  const uint64_t r = round->completed + 1;
  ps::SArray<char> reply = round->error.empty() ? result(r) : MakeError(round->error, r);
  reset();
  Complete(round, reply, server, req_data);
}

void Pull(Round* round, const std::string& name, const ps::KVMeta& req,
          const ps::KVPairs<char>& req_data, ps::KVServer<char>* server) {
  auto it = round->pushed_in.find(req.sender);
  if (it == round->pushed_in.end()) {
    std::string msg = name + ": pull from node " + std::to_string(req.sender) + " before any push";
    LOG(ERROR) << msg;
    Respond(req, req_data, MakeError(msg, round->completed), server);
    return;
  }
  if (round->completed >= it->second) {
    Respond(req, req_data, round->published, server);
  } else {
    round->pending.push_back(req);
  }
}

// A registration's kwargs, BytePS's "N k1 v1 k2 v2 ..." (compressor::Serialize). Not BytePS's
// compressor::Deserialize: that one loops N times whatever the text holds, so a broken worker's
// N = 2^64-1 would spin forever under the server's lock. Here N must be a plain decimal count of
// the pairs that follow; otherwise `err` says so (the pairs that are there are still returned, so
// that the caller can tell a codec's registration from another).
tw::Kwargs ParseRegistration(const std::string& content, std::string* err) {
  std::istringstream is(content);
  std::string count;
  std::vector<std::string> words;
  is >> count;
  for (std::string w; is >> w;) words.push_back(w);
  tw::Kwargs kwargs;
  for (size_t i = 0; i + 1 < words.size(); i += 2) kwargs[words[i]] = words[i + 1];
  const bool digits = !count.empty() && count.size() <= 19 &&
                      count.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || words.size() % 2 || std::stoull(count) != words.size() / 2) {
    *err = "malformed compressor kwargs: the text begins with '" + count.substr(0, 24) +
           "' (the number of key/value pairs) and holds " + std::to_string(words.size()) +
           " words after it; a worker sends them as BytePS's compressor::Serialize writes them";
  }
  return kwargs;
}

// The codec a first registration names: THC's or LHC's key, nullptr for neither.
std::unique_ptr<CodecKey> NewCodecKey(const tw::Kwargs& kwargs) {
  for (auto make : {NewThcKey, NewLhcKey}) {
    if (auto codec = make(kwargs)) return codec;
  }
  return nullptr;
}

// Every registration of a key ends here: `refusal` (non-empty) is logged and fails every round
// of the key (the first one wins); the registrations are answered, as BytePS's are, once every
// worker has sent one.
void FinishRegistration(Key* k, const std::string& refusal, const ps::KVMeta& req,
                        ps::KVServer<char>* server) {
  if (!refusal.empty()) {
    LOG(ERROR) << refusal;
    if (k->fatal.empty()) k->fatal = refusal;
  }
  k->waiting.push_back(req);
  if (k->waiting.size() < static_cast<size_t>(ps::NumWorkers())) return;
  for (const auto& r : k->waiting) server->Response(r, ps::KVPairs<char>());
  k->waiting.clear();
}

// One worker's registration of a key that has a codec: the codec takes it or says why not.
void Register(Key* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server, size_t stored_len, int stored_dtype) {
  std::string err;
  auto kwargs = ParseRegistration(std::string(req_data.vals.data(), req_data.vals.size()), &err);
  if (err.empty()) {
    err = k->codec->Register(kwargs, key, req.sender, stored_len, stored_dtype,
                             static_cast<uint32_t>(ps::NumWorkers()));
  }
  FinishRegistration(k, err.empty() ? "" : Name(*k, key) + ": registration refused: " + err, req,
                     server);
}

// The data round: each push checked and added by the codec, the n-th publishes its sums.
void DataPush(Key* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server) {
  Round* round = &k->data;
  CodecKey* codec = k->codec.get();
  if (Enter(round, Name(*k, key), req.sender)) {
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);  // logged at registration
    } else if (!codec->configured()) {
      Fail(round, Name(*k, key) + ": push from node " + std::to_string(req.sender) +
                      " before the key's registration");
    } else {
      std::string err =
          codec->Add(key, req.sender, req_data.vals.data(), req_data.vals.size(), k->agreed_max);
      if (!err.empty()) Fail(round, err);
    }
  }
  server->Response(req, ps::KVPairs<char>());
  MaybeComplete(
      round, [codec](uint64_t r) { return codec->Publish(r); },
      [codec] {
        if (codec) codec->Reset();
      },
      server, req_data);
}

// A codec's exact fallback round (LHC's: the workers' int32 values at the unresolved indices,
// lhc_wire.h); the rounds and pulls as the data round's.
void FallbackPush(Key* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
                  ps::KVServer<char>* server) {
  Round* round = &k->fallback;
  CodecKey* codec = k->codec.get();
  const bool first = round->senders.empty();
  if (Enter(round, Name(*k, key), req.sender)) {
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);
    } else {
      std::string err =
          codec->FallbackAdd(key, req.sender, req_data.vals.data(), req_data.vals.size(), first);
      if (!err.empty()) Fail(round, err);
    }
  }
  server->Response(req, ps::KVPairs<char>());
  MaybeComplete(
      round, [codec](uint64_t r) { return codec->FallbackPublish(r); },
      [codec] { codec->FallbackReset(); }, server, req_data);
}

// The max round: one double per worker (THC's norm, LHC's max |v|), reduced by max.
void NormPush(Key* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server) {
  Round* round = &k->norm;
  const int sender = req.sender;
  const std::string name = Name(*k, key);
  if (round->senders.empty()) k->norm_max = 0.0;
  if (Enter(round, name, sender)) {
    tw::NormPush np;
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);  // logged at registration
    } else if (req_data.vals.size() != sizeof(np)) {
      Fail(round, name + ": norm push from node " + std::to_string(sender) + " has " +
                      std::to_string(req_data.vals.size()) + " bytes, expected 16");
    } else {
      std::memcpy(&np, req_data.vals.data(), sizeof(np));
      const CodecKey& codec = *k->codec;
      if (np.fingerprint != codec.fingerprint()) {
        std::ostringstream os;
        os << name << ": norm push from node " << sender << ": " << codec.name()
           << " configuration mismatch (fingerprint 0x" << std::hex << np.fingerprint
           << ", registered 0x" << codec.fingerprint() << std::dec << ": " << codec.description()
           << ")";
        Fail(round, os.str());
      } else if (np.norm < 0 || (!common::IsFinite(np.norm) && codec.nonfinite_error())) {
        std::ostringstream os;
        os << name << ": norm push from node " << sender << " is " << np.norm
           << (np.norm < 0
                   ? " (must be >= 0)"
                   : " (a non-finite gradient; BYTEPS_THC_NONFINITE=error: must be finite)");
        Fail(round, os.str());
      } else if (!common::IsFinite(np.norm)) {
        // as an uncompressed sum would: NaN wins over inf, inf over any finite norm
        if (common::IsFinite(k->norm_max) || common::IsNaN(np.norm)) k->norm_max = np.norm;
      } else if (np.norm > k->norm_max) {
        k->norm_max = np.norm;
      }
    }
  }
  server->Response(req, ps::KVPairs<char>());
  MaybeComplete(
      round,
      [k](uint64_t r) {
        k->agreed_max = k->norm_max;
        char* payload = nullptr;
        ps::SArray<char> out =
            NewReply(64, static_cast<uint32_t>(ps::NumWorkers()), r, sizeof(double), &payload);
        std::memcpy(payload, &k->norm_max, sizeof(double));
        return out;
      },
      [] {}, server, req_data);
}

using PushHandler = void (*)(Key*, uint64_t, const ps::KVMeta&, const ps::KVPairs<char>&,
                             ps::KVServer<char>*);

// One request of a round of `key` (`kind`: "data", "norm" or "fallback"): a push goes to `push`,
// a pull waits for the round. Without a `round` (a key not registered as `codec`) the request
// is answered with an error instead (a push acknowledged, a pull given the message), never left
// to BytePS's code, which would abort on it.
void RoundRequest(Key* k, Round* round, PushHandler push, const char* codec, const char* kind,
                  uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
                  ps::KVServer<char>* server) {
  if (!round) {
    std::string msg = std::string(codec) + " key " + std::to_string(key) + ": " + kind +
                      " round from node " + std::to_string(req.sender) +
                      " for a key not registered as " + codec;
    LOG(ERROR) << msg;
    if (req.push) {
      server->Response(req, ps::KVPairs<char>());
    } else {
      Respond(req, req_data, MakeError(msg, 0), server);
    }
    return;
  }
  if (req.push) {
    push(k, key, req, req_data, server);
  } else {
    Pull(round, Name(*k, key), req, req_data, server);
  }
}

// ---- the stall inspector (thc_stall.h): its own thread, under thc_mu_ like every handler ----
struct StallWatches {
  ps::Key raw_key = 0;  // the key as the workers send it (responses carry it back)
  StallWatch data, norm, fallback;
};
ps::KVServer<char>* stall_server_ = nullptr;
std::unordered_map<uint64_t, StallWatches> stall_watches_;
StallSettings stall_settings_;

void InspectRound(uint64_t key, const char* kind, Key* k, Round* round, StallWatch* watch,
                  ps::Key raw_key, double now) {
  double waited = 0;
  StallWatch::Action act =
      watch->Look(round->completed + 1, !round->senders.empty(), now, stall_settings_, &waited);
  if (act == StallWatch::kNone) return;
  std::ostringstream os;
  os << Name(*k, key) << ", " << kind << " round " << round->completed + 1 << ": waited "
     << static_cast<int64_t>(waited) << " s for the push of "
     << DescribeWorkers(MissingWorkers(round->senders))
     << " (pushed: " << DescribeWorkers(round->senders) << ")";
  if (act == StallWatch::kWarn) {
    os << "; BYTEPS_THC_STALL_WARN=" << stall_settings_.warn_s
       << ", BYTEPS_THC_STALL_TIMEOUT=" << stall_settings_.timeout_s << " (0 = never fail)";
    LOG(WARNING) << os.str();
    return;
  }
  os << ": the round failed after BYTEPS_THC_STALL_TIMEOUT=" << stall_settings_.timeout_s
     << " s; the server exits, which ends the cluster; find out why those workers stopped "
     << "(their own logs say what they wait for)";
  const std::string msg = os.str();
  LOG(ERROR) << msg;
  if (k->fatal.empty()) k->fatal = msg;
  Fail(round, msg, false);
  ps::KVPairs<char> req_data;
  req_data.keys = ps::SArray<ps::Key>(1, raw_key);
  for (const auto& req : round->pending) {
    Respond(req, req_data, MakeError(msg, round->completed + 1), stall_server_);
  }
  round->pending.clear();
  EndAfterStall(msg);
}

void InspectStalls() {
  std::lock_guard<std::mutex> lock(thc_mu_);
  const double now = StallNow();
  for (auto& kv : stall_watches_) {
    auto it = thc_keys_.find(kv.first);
    if (it == thc_keys_.end()) continue;
    Key* k = it->second.get();
    InspectRound(kv.first, "data", k, &k->data, &kv.second.data, kv.second.raw_key, now);
    InspectRound(kv.first, "norm", k, &k->norm, &kv.second.norm, kv.second.raw_key, now);
    if (k->codec && k->codec->has_fallback()) {
      InspectRound(kv.first, "fallback", k, &k->fallback, &kv.second.fallback, kv.second.raw_key,
                   now);
    }
  }
}

// A registration: its key is watched from now on; the first one starts the inspector.
void WatchForStalls(uint64_t key, const ps::KVPairs<char>& req_data, ps::KVServer<char>* server) {
  if (req_data.keys.empty()) return;
  if (stall_watches_.empty()) {
    stall_settings_ = StallSettingsFromEnv();
    if (stall_settings_.warn_s > 0 || stall_settings_.timeout_s > 0) {
      StartStallInspector(InspectStalls);
    }
  }
  stall_server_ = server;
  stall_watches_[key].raw_key = req_data.keys[0];
}

}  // namespace

ps::SArray<char> NewReply(uint32_t lane_bits, uint32_t num_workers, uint64_t round, size_t bytes,
                          char** payload) {
  return Reply(0, lane_bits, num_workers, round, bytes, payload);
}

bool ThcHandleRequest(int request_type, uint64_t key, const ps::KVMeta& req_meta,
                      const ps::KVPairs<char>& req_data, ps::KVServer<char>* server,
                      size_t stored_len, int stored_dtype) {
  constexpr int kDefault = 0, kCompressed = 2, kFallback = 4;  // lhcwire::kLhcFallbackRequest
  std::lock_guard<std::mutex> lock(thc_mu_);
  auto it = thc_keys_.find(key);
  Key* k = it == thc_keys_.end() ? nullptr : it->second.get();

  if (request_type == kCompressed) {
    std::string refusal;  // why a registration names no compressor
    if (!k || !k->codec) {
      std::string content(req_data.vals.data(), req_data.vals.size());
      std::string malformed;  // the codec's Register refuses it again, with this message
      auto kwargs = ParseRegistration(content, &malformed);
      std::unique_ptr<CodecKey> codec = NewCodecKey(kwargs);
      if (!codec) {
        refusal = malformed.empty() ? common::CheckCompressorKwargs(kwargs) : malformed;
      }
      if (!k && !codec && refusal.empty()) return false;  // BytePS's own compressors
      if (!k) {
        k = (thc_keys_[key] = std::unique_ptr<Key>(new Key)).get();
        k->codec = std::move(codec);
      }
    }
    if (!k->codec) {
      // upstream's registration would abort the server here (a null compressor's CHECK, or the
      // registry's FATAL on an unknown name)
      if (refusal.empty()) {
        refusal = "another worker registered this key with kwargs that name no compressor";
      }
      FinishRegistration(k,
                         "BytePS key " + std::to_string(key) + ": registration from node " +
                             std::to_string(req_meta.sender) + " refused: " + refusal,
                         req_meta, server);
    } else {
      Register(k, key, req_meta, req_data, server, stored_len, stored_dtype);
    }
    WatchForStalls(key, req_data, server);
    return true;
  }
  if (request_type == tw::kThcNormRequest) {
    RoundRequest(k, k ? &k->norm : nullptr, NormPush, "THC", "norm", key, req_meta, req_data,
                 server);
    return true;
  }
  if (request_type == kFallback) {
    const bool has = k && k->codec && k->codec->has_fallback();
    RoundRequest(k, has ? &k->fallback : nullptr, FallbackPush, "LHC", "fallback", key, req_meta,
                 req_data, server);
    return true;
  }
  if (request_type != kDefault || !k) return false;
  RoundRequest(k, &k->data, DataPush, "THC", "data", key, req_meta, req_data, server);
  return true;
}

}  // namespace server
}  // namespace byteps
