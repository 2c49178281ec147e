// byteps-thc: LHC's exact fallback round on the worker (see lhc_stage.h). Worker library only,
// and only with patch 0040 (the THC_NORM stage, whose hooks call this one).
#include "common.h"
#if !defined(BYTEPS_BUILDING_SERVER) && defined(BYTEPS_THC_NORM_STAGE)
#include "lhc_stage.h"

#include <sstream>
#include <string>

#include "compressor/compressor.h"
#include "compressor/impl/lhc_compressor.h"
#include "compressor/impl/lhc_wire.h"
#include "failure.h"
#include "global.h"
#include "logging.h"

namespace byteps {
namespace common {

void FinishOrProceed(std::shared_ptr<TensorTableEntry> task);  // core_loops.cc

namespace {

namespace lw = compressor::lhcwire;
namespace tw = compressor::thcwire;

std::string Where(const std::shared_ptr<TensorTableEntry>& task) {
  std::ostringstream os;
  os << "LHC: tensor '" << task->tensor_name << "' (key " << task->key << ", bytes " << task->offset
     << ".." << task->offset + task->len << ", rank " << BytePSGlobal::GetRank() << ")";
  return os.str();
}

void PullFallback(std::shared_ptr<TensorTableEntry> task, compressor::LhcCompressor* lhc,
                  ps::SArray<ps::Key> keys, int cmd) {
  auto reply = new ps::SArray<char>(lhc->fallback_reply(), lhc->fallback_reply_capacity(), false);
  auto reply_lens = new ps::SArray<int>();
  BytePSGlobal::GetPS()->ZPull(keys, reply, reply_lens, cmd, [task, lhc, reply, reply_lens]() {
    size_t bytes = reply_lens->empty() ? 0 : static_cast<size_t>((*reply_lens)[0]);
    delete reply;
    delete reply_lens;
    std::string err = lhc->CompleteFallback(bytes);
    if (!err.empty()) {
      FailPartition(task, Where(task) + ": the exact fallback round failed: " + err +
                              ". The server's log names the key and the sender.");
      return;
    }
    FinishOrProceed(task);
  });
}

}  // namespace

bool LhcStartFallback(const std::shared_ptr<TensorTableEntry>& task) {
  auto* lhc = dynamic_cast<compressor::LhcCompressor*>(task->compressor.get());
  if (!lhc || !lhc->fallback_pending()) return false;
  auto ps = BytePSGlobal::GetPS();
  // The partition's own server and key, as the max round (thc_stage.cc).
  ps::SArray<ps::Key> keys = BytePSGlobal::EncodeDefaultKey(task->key, 0).keys;
  ps::SArray<int> lens(1, static_cast<int>(lhc->fallback_push_bytes()));
  ps::SArray<char> vals(lhc->fallback_push(), lhc->fallback_push_bytes(), false);
  const int cmd = tw::CommandType(lw::kLhcFallbackRequest, BYTEPS_FLOAT64);
  std::shared_ptr<TensorTableEntry> t = task;
  ps->ZPush(keys, vals, lens, cmd, [t, lhc, keys, cmd]() {
    // Not from inside ps-lite's callback: the pull is issued from the pool.
    auto& pool = BytePSGlobal::GetThreadPool();
    if (pool) {
      pool->enqueue([t, lhc, keys, cmd]() { PullFallback(t, lhc, keys, cmd); });
    } else {
      PullFallback(t, lhc, keys, cmd);
    }
  });
  return true;
}

}  // namespace common
}  // namespace byteps

#endif  // !BYTEPS_BUILDING_SERVER && BYTEPS_THC_NORM_STAGE
