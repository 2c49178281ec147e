// byteps-thc: the server's homomorphic THC path.
//
// For a key registered with compressor_type=thc the server never decompresses, never touches a
// float and never recompresses. Per round it does what docs/ALGORITHM.md "Aggregate" says and
// nothing else: each push is checked (magic, configuration fingerprint, length) and handed to
// thc::Aggregator (unpack, table lookup, integer add into lanes sized for n*g); the n-th push
// publishes the sums packed in thc::SumBits = ceil(log2(n*g + 1)) bits each (docs/ALGORITHM.md
// "Publish"), and every pull of that round returns them as they are. The norm round is
// the same with one double per worker reduced by max (NaN if one is NaN, else +inf if one is +inf:
// the workers then skip that step, BYTEPS_THC_NONFINITE=propagate; =error fails the round).
//
// Rounds: a worker pushes round r, then pulls round r, then (next step) pushes round r+1. A pull
// is answered as soon as the round its sender last pushed into is complete; pushes of round r+1
// accumulate in the aggregator while slow workers still pull round r, whose result lives in its
// own published buffer (held by ps-lite until sent), so no pull can see a half-summed round.
//
// Errors: a push that does not fit is logged with the key and the sender, still counts for its
// round (so nobody waits forever), and marks the round failed: every pull of it gets a response
// whose header carries the status and the message, and the worker fails with it. Registration
// errors (invalid or overflow-prone configuration, workers that disagree) fail every round of the
// key. Other keys are unaffected; the server never aborts on a worker's input.
#include "thc_server.h"
#include "lhc_server.h"
#include "thc_stall.h"

#include <cmath>
#include <cstring>
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

#include "../common/compressor/utils.h"

namespace byteps {
namespace server {
namespace {

namespace tw = common::compressor::thcwire;

// One kind of round (data or norm) of one key.
struct Round {
  uint64_t completed = 0;                       // rounds completed so far
  std::unordered_map<int, uint64_t> pushed_in;  // sender -> 1-based round it last pushed into
  std::set<int> senders;                        // senders of the current round
  std::string error;                            // first error of the current round
  std::vector<ps::KVMeta> pending;              // pulls waiting for the current round
  ps::SArray<char> published;                   // header + result of the last completed round
};

struct ThcKey {
  // registration
  std::vector<ps::KVMeta> waiting;  // registration requests, answered once all workers sent one
  bool configured = false;
  std::string fatal;  // non-empty: every round of this key fails with it
  thc::Config cfg;    // the partition's configuration (seed mixed with the key)
  std::string description;
  size_t d = 0;
  uint64_t fingerprint = 0;
  uint32_t num_workers = 0;
  int lane_bits = 0;             // the aggregator's lanes
  int sum_bits = 0;              // one published sum
  bool nonfinite_error = false;  // thc_nonfinite=error: a non-finite norm fails the round
  std::unique_ptr<thc::Aggregator> agg;
  // LHC (lhc_server.h): a key whose first registration said compressor_type=lhc takes LHC's
  // registration and data push; the rounds, the pulls and the max round are the same.
  bool is_lhc = false;
  // A registration whose kwargs name no compressor BytePS has (kwargs_check.h): the key is
  // refused (fatal), answered as THC's are, and every round of it fails with the refusal.
  bool refused = false;
  std::shared_ptr<LhcKey> lhc;
  // rounds
  Round data, norm, fallback;  // fallback: LHC's exact fallback round
  double norm_max = 0.0;       // the round's max: NaN if a NaN was pushed, else +inf if an inf was
  double agreed_max = 0.0;     // the max of the last completed max round (LHC's scale)
};

std::mutex thc_mu_;
std::unordered_map<uint64_t, std::unique_ptr<ThcKey>> thc_keys_;

int ElementBytes(int dtype) {
  switch (dtype) {
    case 0: return 4;  // BYTEPS_FLOAT32
    case 1: return 8;  // BYTEPS_FLOAT64
    case 2: return 2;  // BYTEPS_FLOAT16
    default: return 0;
  }
}

ps::SArray<char> MakeResponse(int32_t status, uint32_t lane_bits, uint32_t n, uint64_t round,
                              const void* payload, size_t bytes) {
  tw::PullHeader h;
  h.magic = tw::kPullMagic;
  h.status = status;
  h.lane_bits = lane_bits;
  h.num_workers = n;
  h.round = round;
  h.payload_bytes = bytes;
  // Owned by the SArray (and by ps-lite until sent); not zero-filled, every byte is written.
  ps::SArray<char> out(new char[sizeof(h) + bytes], sizeof(h) + bytes, true);
  std::memcpy(out.data(), &h, sizeof(h));
  if (bytes) std::memcpy(out.data() + sizeof(h), payload, bytes);
  return out;
}

// The data round's reply: the header, then the aggregator's lanes packed straight into the
// message (one pass over the sums).
ps::SArray<char> MakePublished(const ThcKey& k, uint64_t round) {
  const size_t n = k.agg->geometry().padded;
  const size_t bytes = thc::PackedSumsBytes(n, k.sum_bits);
  tw::PullHeader h;
  h.magic = tw::kPullMagic;
  h.status = 0;
  h.lane_bits = static_cast<uint32_t>(k.sum_bits);
  h.num_workers = k.num_workers;
  h.round = round;
  h.payload_bytes = bytes;
  ps::SArray<char> out(new char[sizeof(h) + bytes], sizeof(h) + bytes, true);
  std::memcpy(out.data(), &h, sizeof(h));
  thc::PackSums(k.agg->sums(), k.lane_bits, n, k.sum_bits,
                reinterpret_cast<uint8_t*>(out.data() + sizeof(h)));
  return out;
}

ps::SArray<char> MakeError(const std::string& message, uint64_t round) {
  std::string m = message.substr(0, tw::kMaxErrorBytes);
  return MakeResponse(1, 0, 0, round, m.data(), m.size());
}

void Respond(const ps::KVMeta& req, const ps::KVPairs<char>& req_data, const ps::SArray<char>& vals,
             ps::KVServer<char>* server) {
  ps::KVPairs<char> res;
  res.keys = req_data.keys;
  res.vals = vals;
  res.lens = {static_cast<int>(vals.size())};
  server->Response(req, res);
}

std::string Where(uint64_t key, int sender) {
  std::ostringstream os;
  os << "THC key " << key << ": push from node " << sender;
  return os.str();
}

// Records one push of `sender` into `round`; false (with the round failed) on a second push of
// the same sender in one round.
bool Enter(Round* round, uint64_t key, int sender) {
  if (round->senders.count(sender)) {
    std::string msg = Where(key, sender) + " arrived twice in round " +
                      std::to_string(round->completed + 1) + " (pull before pushing again)";
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

void Pull(Round* round, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
          ps::KVServer<char>* server) {
  auto it = round->pushed_in.find(req.sender);
  if (it == round->pushed_in.end()) {
    std::string msg = "THC key " + std::to_string(key) + ": pull from node " +
                      std::to_string(req.sender) + " before any push";
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
// that the caller can tell a THC registration from another).
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

// Every registration of a key ends here: `refusal` (non-empty) is logged and fails every round
// of the key (the first one wins); the registrations are answered, as BytePS's are, once every
// worker has sent one.
void FinishRegistration(ThcKey* k, const std::string& refusal, const ps::KVMeta& req,
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

void Register(ThcKey* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server, size_t stored_len, int stored_dtype) {
  std::string content(req_data.vals.data(), req_data.vals.size());
  std::string err;
  auto kwargs = ParseRegistration(content, &err);
  tw::ThcSettings settings;
  if (!err.empty()) {
    // malformed: refused as it is
  } else if (!tw::IsThcKwargs(kwargs)) {
    err = "compressor_type=" + (kwargs.count("compressor_type") ? kwargs["compressor_type"] : "") +
          " but other workers declared THC";
  } else {
    err = tw::ParseThcKwargs(kwargs, &settings);
  }
  size_t elem = ElementBytes(stored_dtype);
  if (err.empty() && (!stored_len || !elem || stored_len % elem)) {
    err = "no initial push of a float tensor before the registration (len=" +
          std::to_string(stored_len) + ", dtype=" + std::to_string(stored_dtype) + ")";
  }
  if (err.empty()) {
    thc::Config cfg = tw::PartitionConfig(settings.config, key);
    size_t d = stored_len / elem;
    uint64_t fp = tw::Fingerprint(cfg, d);
    if (!k->configured) {
      k->configured = true;
      k->cfg = cfg;
      k->d = d;
      k->fingerprint = fp;
      // As declared (the seed before mixing with the key), which is what users set.
      k->description = tw::Describe(settings.config) + " d=" + std::to_string(d);
      k->nonfinite_error = settings.nonfinite_error;
      k->num_workers = static_cast<uint32_t>(ps::NumWorkers());
      k->lane_bits = thc::LaneBits(cfg, k->num_workers);
      k->sum_bits = thc::SumBits(cfg, k->num_workers);
      if (k->lane_bits == 0) {
        err = "overflow-prone configuration: " + std::to_string(k->num_workers) +
              " workers x granularity " + std::to_string(cfg.granularity) +
              " does not fit a 32-bit lane; lower thc_granularity";
      } else {
        k->agg.reset(new thc::Aggregator(cfg, d, k->num_workers));
        LOG(INFO) << "THC key " << key << " registered: " << k->description << ", "
                  << k->num_workers << " workers, " << k->lane_bits << "-bit lanes, " << k->sum_bits
                  << "-bit sums on the wire";
      }
    } else if (fp != k->fingerprint) {
      err = "THC settings differ between workers: node " + std::to_string(req.sender) +
            " declared " + tw::Describe(settings.config) + " d=" + std::to_string(d) +
            ", but the key was registered with " + k->description;
    } else if (settings.nonfinite_error != k->nonfinite_error) {
      err = std::string("BYTEPS_THC_NONFINITE differs between workers: node ") +
            std::to_string(req.sender) +
            " declared thc_nonfinite=" + tw::NonfiniteName(settings.nonfinite_error) +
            ", but the key was registered with " + tw::NonfiniteName(k->nonfinite_error);
    }
  }
  FinishRegistration(
      k, err.empty() ? "" : "THC key " + std::to_string(key) + ": registration refused: " + err,
      req, server);
}

// LHC's registration (lhc_server.cc does the settings): the same answer-when-all-registered and
// the same refusal (every round of the key fails with it) as THC's.
void RegisterLhc(ThcKey* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
                 ps::KVServer<char>* server, size_t stored_len, int stored_dtype) {
  std::string err;
  auto kwargs = ParseRegistration(std::string(req_data.vals.data(), req_data.vals.size()), &err);
  if (err.empty() && !LhcIsRegistration(kwargs)) {
    err = "compressor_type=" + (kwargs.count("compressor_type") ? kwargs["compressor_type"] : "") +
          " but other workers declared LHC";
  }
  if (err.empty() && (stored_dtype != 0 || !stored_len || stored_len % 4)) {
    err = "no initial push of a float32 tensor before the registration (len=" +
          std::to_string(stored_len) + ", dtype=" + std::to_string(stored_dtype) + ")";
  }
  if (err.empty()) {
    err = LhcRegister(kwargs, key, req.sender, stored_len / 4,
                      static_cast<uint32_t>(ps::NumWorkers()), &k->lhc, &k->fingerprint,
                      &k->description, &k->nonfinite_error);
    if (err.empty() && !k->configured) {
      k->configured = true;
      k->d = stored_len / 4;
      k->num_workers = static_cast<uint32_t>(ps::NumWorkers());
      LOG(INFO) << "LHC key " << key << " registered: " << k->description << ", " << k->num_workers
                << " workers";
    }
  }
  FinishRegistration(
      k, err.empty() ? "" : "LHC key " + std::to_string(key) + ": registration refused: " + err,
      req, server);
}

void DataPush(ThcKey* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server) {
  Round* round = &k->data;
  const int sender = req.sender;
  if (Enter(round, key, sender)) {
    const char* p = req_data.vals.data();
    size_t len = req_data.vals.size();
    tw::PushHeader h;
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);  // logged at registration
    } else if (k->lhc) {
      std::string lhc_err = LhcAdd(k->lhc.get(), key, sender, p, len, k->agreed_max);
      if (!lhc_err.empty()) Fail(round, lhc_err);
    } else if (len < sizeof(h)) {
      Fail(round, Where(key, sender) + ": " + std::to_string(len) +
                      " bytes is shorter than the 16-byte THC header");
    } else {
      std::memcpy(&h, p, sizeof(h));
      size_t expect = sizeof(h) + k->agg->geometry().payload_bytes;
      std::ostringstream os;
      if (h.magic != tw::kPushMagic || h.version != tw::kWireVersion) {
        os << Where(key, sender) << ": not a THC payload (magic 0x" << std::hex << h.magic
           << std::dec << ", version " << h.version << ")";
      } else if (h.fingerprint != k->fingerprint) {
        os << Where(key, sender) << ": THC configuration mismatch (fingerprint 0x" << std::hex
           << h.fingerprint << ", the key was registered with 0x" << k->fingerprint << std::dec
           << ": " << k->description << "); every worker must use the same THC settings";
      } else if (len == sizeof(h) && expect > sizeof(h)) {
        os << Where(key, sender) << ": that worker could not encode this round (its log and its "
           << "exception say why)";
      } else if (len != expect) {
        os << Where(key, sender) << ": wrong payload length " << len << " bytes, expected "
           << expect << " (16-byte header + " << k->agg->geometry().payload_bytes << " bytes of "
           << k->cfg.bits << "-bit indices for d=" << k->d << ")";
      } else {
        std::string agg_err;
        if (k->agg->Add(reinterpret_cast<const uint8_t*>(p + sizeof(h)), len - sizeof(h),
                        &agg_err) != thc::Status::kOk) {
          os << Where(key, sender) << ": " << agg_err;
        }
      }
      if (!os.str().empty()) Fail(round, os.str());
    }
  }
  server->Response(req, ps::KVPairs<char>());
  if (round->senders.size() < static_cast<size_t>(ps::NumWorkers())) return;
  ps::SArray<char> result;
  if (round->error.empty() && k->lhc) {
    size_t bytes = 0;
    const char* sums = LhcResult(k->lhc.get(), &bytes);
    result = MakeResponse(0, 32, k->num_workers, round->completed + 1, sums, bytes);
  } else if (round->error.empty()) {
    result = MakePublished(*k, round->completed + 1);
  } else {
    result = MakeError(round->error, round->completed + 1);
  }
  if (k->agg) k->agg->Reset();
  if (k->lhc) LhcReset(k->lhc.get());
  Complete(round, result, server, req_data);
}

// LHC's exact fallback round (lhc_wire.h): the workers' int32 values at the unresolved indices,
// added (lhc_server.cc); the rounds and pulls as the data round's.
void FallbackPush(ThcKey* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
                  ps::KVServer<char>* server) {
  Round* round = &k->fallback;
  const int sender = req.sender;
  const bool first = round->senders.empty();
  if (Enter(round, key, sender)) {
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);
    } else {
      std::string err = LhcFallbackAdd(k->lhc.get(), key, sender, req_data.vals.data(),
                                       req_data.vals.size(), first);
      if (!err.empty()) Fail(round, err);
    }
  }
  server->Response(req, ps::KVPairs<char>());
  if (round->senders.size() < static_cast<size_t>(ps::NumWorkers())) return;
  ps::SArray<char> result;
  if (round->error.empty()) {
    size_t bytes = 0;
    const char* sums = LhcFallbackResult(k->lhc.get(), &bytes);
    result = MakeResponse(0, 32, k->num_workers, round->completed + 1, sums, bytes);
  } else {
    result = MakeError(round->error, round->completed + 1);
  }
  if (k->lhc) LhcFallbackReset(k->lhc.get());
  Complete(round, result, server, req_data);
}

void NormPush(ThcKey* k, uint64_t key, const ps::KVMeta& req, const ps::KVPairs<char>& req_data,
              ps::KVServer<char>* server) {
  Round* round = &k->norm;
  const int sender = req.sender;
  if (round->senders.empty()) k->norm_max = 0.0;
  if (Enter(round, key, sender)) {
    tw::NormPush np;
    if (!k->fatal.empty()) {
      Fail(round, k->fatal, false);  // logged at registration
    } else if (req_data.vals.size() != sizeof(np)) {
      Fail(round, "THC key " + std::to_string(key) + ": norm push from node " +
                      std::to_string(sender) + " has " + std::to_string(req_data.vals.size()) +
                      " bytes, expected 16");
    } else {
      std::memcpy(&np, req_data.vals.data(), sizeof(np));
      if (np.fingerprint != k->fingerprint) {
        std::ostringstream os;
        os << "THC key " << key << ": norm push from node " << sender
           << ": THC configuration mismatch (fingerprint 0x" << std::hex << np.fingerprint
           << ", registered 0x" << k->fingerprint << std::dec << ": " << k->description << ")";
        Fail(round, os.str());
      } else if (np.norm < 0 || (!tw::IsFinite(np.norm) && k->nonfinite_error)) {
        std::ostringstream os;
        os << "THC key " << key << ": norm push from node " << sender << " is " << np.norm
           << (np.norm < 0
                   ? " (must be >= 0)"
                   : " (a non-finite gradient; BYTEPS_THC_NONFINITE=error: must be finite)");
        Fail(round, os.str());
      } else if (!tw::IsFinite(np.norm)) {
        // as an uncompressed sum would: NaN wins over inf, inf over any finite norm
        if (tw::IsFinite(k->norm_max) || tw::IsNaN(np.norm)) k->norm_max = np.norm;
      } else if (np.norm > k->norm_max) {
        k->norm_max = np.norm;
      }
    }
  }
  server->Response(req, ps::KVPairs<char>());
  if (round->senders.size() < static_cast<size_t>(ps::NumWorkers())) return;
  if (round->error.empty()) k->agreed_max = k->norm_max;
  ps::SArray<char> result = round->error.empty()
                                ? MakeResponse(0, 64, static_cast<uint32_t>(ps::NumWorkers()),
                                               round->completed + 1, &k->norm_max, sizeof(double))
                                : MakeError(round->error, round->completed + 1);
  Complete(round, result, server, req_data);
}

using PushHandler = void (*)(ThcKey*, uint64_t, const ps::KVMeta&, const ps::KVPairs<char>&,
                             ps::KVServer<char>*);

// One request of a round of `key` (`kind`: "data", "norm" or "fallback"): a push goes to `push`,
// a pull waits for the round. Without a `round` (a key not registered as `codec`) the request
// is answered with an error instead (a push acknowledged, a pull given the message), never left
// to BytePS's code, which would abort on it.
void RoundRequest(ThcKey* k, Round* round, PushHandler push, const char* codec, const char* kind,
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
    Pull(round, key, req, req_data, server);
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

void InspectRound(uint64_t key, const char* kind, ThcKey* k, Round* round, StallWatch* watch,
                  ps::Key raw_key, double now) {
  double waited = 0;
  StallWatch::Action act =
      watch->Look(round->completed + 1, !round->senders.empty(), now, stall_settings_, &waited);
  if (act == StallWatch::kNone) return;
  std::ostringstream os;
  os << (k->is_lhc ? "LHC key " : "THC key ") << key << ", " << kind << " round "
     << round->completed + 1 << ": waited " << static_cast<int64_t>(waited) << " s for the push of "
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
    ThcKey* k = it->second.get();
    InspectRound(kv.first, "data", k, &k->data, &kv.second.data, kv.second.raw_key, now);
    InspectRound(kv.first, "norm", k, &k->norm, &kv.second.norm, kv.second.raw_key, now);
    if (k->lhc) {
      InspectRound(kv.first, "fallback", k, &k->fallback, &kv.second.fallback, kv.second.raw_key,
                   now);
    }
  }
}

// A THC registration: its key is watched from now on; the first one starts the inspector.
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

bool ThcHandleRequest(int request_type, uint64_t key, const ps::KVMeta& req_meta,
                      const ps::KVPairs<char>& req_data, ps::KVServer<char>* server,
                      size_t stored_len, int stored_dtype) {
  constexpr int kDefault = 0, kCompressed = 2, kLhcFallback = 4;  // lhcwire::kLhcFallbackRequest
  std::lock_guard<std::mutex> lock(thc_mu_);
  auto it = thc_keys_.find(key);
  ThcKey* k = it == thc_keys_.end() ? nullptr : it->second.get();

  if (request_type == kCompressed) {
    std::string refusal;  // why a registration names no compressor
    if (!k || k->refused) {
      std::string content(req_data.vals.data(), req_data.vals.size());
      std::string malformed;  // Register refuses it again, with this message
      auto kwargs = ParseRegistration(content, &malformed);
      const bool lhc = LhcIsRegistration(kwargs);
      const bool thc = tw::IsThcKwargs(kwargs);
      if (!thc && !lhc) {
        refusal = malformed.empty() ? common::CheckCompressorKwargs(kwargs) : malformed;
      }
      if (!k && !thc && !lhc && refusal.empty()) return false;  // BytePS's own compressors
      if (!k) {
        k = (thc_keys_[key] = std::unique_ptr<ThcKey>(new ThcKey)).get();
        k->is_lhc = lhc;
        k->refused = !refusal.empty();
      }
    }
    if (k->refused) {
      // upstream's registration would abort the server here (a null compressor's CHECK, or the
      // registry's FATAL on an unknown name)
      if (refusal.empty()) {
        refusal = "another worker registered this key with kwargs that name no compressor";
      }
      FinishRegistration(k,
                         "BytePS key " + std::to_string(key) + ": registration from node " +
                             std::to_string(req_meta.sender) + " refused: " + refusal,
                         req_meta, server);
    } else if (k->is_lhc) {
      RegisterLhc(k, key, req_meta, req_data, server, stored_len, stored_dtype);
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
  if (request_type == kLhcFallback) {
    RoundRequest(k, k && k->lhc ? &k->fallback : nullptr, FallbackPush, "LHC", "fallback", key,
                 req_meta, req_data, server);
    return true;
  }
  if (request_type != kDefault || !k) return false;
  RoundRequest(k, &k->data, DataPush, "THC", "data", key, req_meta, req_data, server);
  return true;
}

}  // namespace server
}  // namespace byteps
