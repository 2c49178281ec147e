// byteps-thc: THC's worker-side stages (see thc_stage.h). Worker library only, and only with
// patch 0040 (which declares the THC_NORM queue and defines BYTEPS_THC_NORM_STAGE).
#include "common.h"
#if !defined(BYTEPS_BUILDING_SERVER) && defined(BYTEPS_THC_NORM_STAGE)
#include "thc_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "compressor/impl/thc_compressor.h"
#include "compressor/impl/thc_wire.h"
#include "cpu_only.h"
#include "global.h"
#include "idle.h"
#include "logging.h"

namespace byteps {
namespace common {

void FinishOrProceed(std::shared_ptr<TensorTableEntry> task);  // core_loops.cc

namespace {

namespace tw = compressor::thcwire;

compressor::ThcCompressor* AsThc(const std::shared_ptr<TensorTableEntry>& task) {
  return dynamic_cast<compressor::ThcCompressor*>(task->compressor.get());
}

// The one rule for dropping the host copies, at enqueue time (ThcAddStages) and in the stages.
bool ZeroCopy(bool thc, const void* input, const void* output) {
  return kCpuOnly && thc && input && output;
}

bool ZeroCopy(const std::shared_ptr<TensorTableEntry>& task) {
  return ZeroCopy(AsThc(task) != nullptr, task->tensor.get(), task->output.get());
}

// A tensor's bytes at a partition's offset. The framework's tensors are writable (BytePS's COPYH2D
// writes the output through the same const data()).
char* TensorAt(const std::shared_ptr<Tensor>& t, size_t offset) {
  return const_cast<char*>(static_cast<const char*>(t->data())) + offset;
}

// Step 3 of the round: the max came back.
void FinishNormRound(std::shared_ptr<TensorTableEntry> task, compressor::ThcCompressor* thc,
                     size_t bytes) {
  double max_norm = 0;
  std::string err = thc->ParseNormReply(bytes, &max_norm);
  BPS_CHECK(err.empty()) << "THC: the norm round of tensor '" << task->tensor_name
                         << "' (key " << task->key << ") failed: " << err;
  thc->set_max_norm(max_norm);
  BPS_LOG(TRACE) << "THC_NORM " << task->tensor_name << " key=" << task->key
                 << " max_norm=" << max_norm;
  FinishOrProceed(task);
}

template <typename F>
void OnPool(F&& job) {
  auto& pool = BytePSGlobal::GetThreadPool();
  if (pool) {
    pool->enqueue(std::forward<F>(job));
  } else {
    job();
  }
}

// Step 2b: pull the max over workers.
void PullMaxNorm(std::shared_ptr<TensorTableEntry> task, compressor::ThcCompressor* thc,
                 ps::SArray<ps::Key> keys, int cmd) {
  auto reply = new ps::SArray<char>(thc->norm_reply(), thc->norm_reply_capacity(), false);
  auto reply_lens = new ps::SArray<int>();
  BytePSGlobal::GetPS()->ZPull(keys, reply, reply_lens, cmd, [task, thc, reply, reply_lens]() {
    size_t bytes = reply_lens->empty() ? 0 : static_cast<size_t>((*reply_lens)[0]);
    delete reply;
    delete reply_lens;
    FinishNormRound(task, thc, bytes);
  });
}

// Steps 1-2a: local norm, push it.
void StartNormRound(std::shared_ptr<TensorTableEntry> task) {
  auto* thc = AsThc(task);
  BPS_CHECK(thc) << "THC_NORM stage on a tensor without the THC compressor: "
                 << task->tensor_name;
  std::string err = thc->Bind(task->key, task->len,
                              static_cast<uint32_t>(BytePSGlobal::GetRank()), task->tensor_name);
  BPS_CHECK(err.empty()) << "THC: tensor '" << task->tensor_name << "': " << err;

  char* data = static_cast<char*>(task->cpubuff) + task->offset;
  ThcCompressSource(task, &data);
  compressor::tensor_t grad(data, task->len, task->tensor->dtype());
  double norm = 0;
  err = thc->LocalNorm(grad, &norm);
  if (!err.empty()) {
    BPS_LOG(FATAL) << "THC: tensor '" << task->tensor_name << "' (key " << task->key
                   << ", bytes " << task->offset << ".." << task->offset + task->len
                   << ") on this worker (rank " << BytePSGlobal::GetRank() << "): " << err
                   << ". THC cannot encode it: lower the learning rate, use loss scaling with a "
                   << "finite check, or clip gradients.";
  }
  *thc->norm_push() = tw::NormPush{thc->fingerprint(), norm};

  auto ps = BytePSGlobal::GetPS();
  // The partition's own server and key; BytePS's PSKV is not touched (its lens change per stage).
  ps::SArray<ps::Key> keys = BytePSGlobal::EncodeDefaultKey(task->key, 0).keys;
  ps::SArray<int> lens(1, static_cast<int>(sizeof(tw::NormPush)));
  ps::SArray<char> vals(reinterpret_cast<char*>(thc->norm_push()), sizeof(tw::NormPush), false);
  const int cmd = tw::CommandType(tw::kThcNormRequest, BYTEPS_FLOAT64);
  ps->ZPush(keys, vals, lens, cmd, [task, thc, keys, cmd]() {
    // Not from inside ps-lite's callback: issue the pull from the pool, like the PULL stage.
    OnPool([task, thc, keys, cmd]() { PullMaxNorm(task, thc, keys, cmd); });
  });
}

bool RunThcNormLoopOnce() {
  auto q = BytePSGlobal::GetScheduledQueue(THC_NORM);
  auto task = q->getTask();
  if (!task) {
    IdleWait(q);
    return true;
  }
  // THC_NORM shares the push ready-table with COMPRESS (all local devices copied their part);
  // restore it for COMPRESS, as COMPRESS does for PUSH.
  BytePSGlobal::GetScheduledQueue(COMPRESS)->reset(task->key, BytePSGlobal::GetLocalSize() - 1);
  OnPool([task]() { StartNormRound(task); });
  return true;
}

}  // namespace

bool ThcUsesNormRound(const BPSContext& context) {
  if (context.compressor_list.empty()) return false;
  return dynamic_cast<compressor::ThcCompressor*>(context.compressor_list[0].get()) != nullptr;
}

void ThcAddStages(const BPSContext& context, const Tensor* input, const Tensor* output,
                  std::vector<QueueType>* queue_list) {
  if (!ThcUsesNormRound(context)) return;
  auto it = std::find(queue_list->begin(), queue_list->end(), COMPRESS);
  if (it != queue_list->end()) queue_list->insert(it, THC_NORM);
  if (ZeroCopy(true, input, output)) {
    for (QueueType copy : {COPYD2H, COPYH2D}) {
      queue_list->erase(std::remove(queue_list->begin(), queue_list->end(), copy),
                        queue_list->end());
    }
  }
}

void ThcCompressSource(const std::shared_ptr<TensorTableEntry>& task, char** data) {
  if (ZeroCopy(task)) *data = TensorAt(task->tensor, task->offset);
}

void ThcDecompressTarget(const std::shared_ptr<TensorTableEntry>& task, char** data) {
  if (ZeroCopy(task)) *data = TensorAt(task->output, task->offset);
}

void ThcNormLoop() {
  while (RunThcNormLoopOnce() && !BytePSGlobal::ShouldShutdown()) {
  }
  BytePSGlobal::ReportThreadFinish();
}

bool ThcPullTarget(const std::shared_ptr<TensorTableEntry>& task, char** data,
                   size_t* capacity) {
  auto* thc = AsThc(task);
  if (!thc || !thc->bound()) return false;
  *data = thc->receive_buffer();
  *capacity = thc->receive_capacity();
  return true;
}

}  // namespace common
}  // namespace byteps

#endif  // !BYTEPS_BUILDING_SERVER && BYTEPS_THC_NORM_STAGE
