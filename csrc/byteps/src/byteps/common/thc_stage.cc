// byteps-thc: THC's worker-side stages (see thc_stage.h). Worker library only, and only with
// patch 0040 (which declares the THC_NORM queue and defines BYTEPS_THC_NORM_STAGE).
#include "common.h"
#if !defined(BYTEPS_BUILDING_SERVER) && defined(BYTEPS_THC_NORM_STAGE)
#include "thc_stage.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>

#include "compressor/compressor.h"
#include "compressor/impl/lhc_wire.h"
#include "compressor/impl/max_round.h"
#include "compressor/impl/thc_compressor.h"
#include "compressor/impl/thc_device.h"
#include "compressor/impl/thc_wire.h"
#include "cpu_only.h"
#include "failure.h"
#include "global.h"
#include "idle.h"
#include "lhc_stage.h"
#include "logging.h"
#include "nonfinite.h"
#include "thc_trace.h"

namespace byteps {
namespace common {

void FinishOrProceed(std::shared_ptr<TensorTableEntry> task);  // core_loops.cc

namespace {

namespace tw = compressor::thcwire;

// THC's and LHC's compressors (max_round.h): the partitions that take the max round.
compressor::MaxRound* AsThc(const std::shared_ptr<TensorTableEntry>& task) {
  return dynamic_cast<compressor::MaxRound*>(task->compressor.get());
}

// The one rule for dropping the host copies, at enqueue time (ThcAddStages) and in the stages.
bool ZeroCopy(bool thc, const void* input, const void* output) {
  return kCpuOnly && thc && input && output;
}

bool ZeroCopy(const std::shared_ptr<TensorTableEntry>& task) {
  return ZeroCopy(AsThc(task) != nullptr, task->tensor.get(), task->output.get());
}

namespace td = compressor::thcdevice;

// BYTEPS_THC_DEVICE_STAGES, read once; a bad value fails every THC push_pull with its message.
td::Stages DeviceStages(std::string* error = nullptr) {
  static std::string err;
  static const td::Stages stages = td::DeviceStages(&err);
  if (error) *error = err;
  return stages;
}

// Whether the root GPU holds a partition's whole local sum after BytePS's REDUCE, the device
// plan's condition on a CUDA worker: one GPU per worker machine, or several whose NCCL reduce
// puts every partition of the tensor on the root's GPU (BYTEPS_REDUCE_ROOTS naming the root's
// NCCL rank; BytePS's default reduce-scatter leaves each GPU a slice, so that the partition is
// summed on the host and THC runs there, as LogHostPlan says). Not across PCIe switches.
bool RootHoldsSum(uint64_t key) {
  if (BytePSGlobal::IsCrossPcieSwitch()) return false;
  if (BytePSGlobal::GetLocalSize() == 1) return true;
  return BytePSGlobal::IsUsingReduce() &&
         BytePSGlobal::GetReduceRootByKey(key) == BytePSGlobal::GetNccl()->GetRank(key, REDUCE);
}

bool RootHoldsSum(const BPSContext& context) {
  for (uint64_t key : context.key_list) {
    if (!RootHoldsSum(key)) return false;
  }
  return !context.key_list.empty();
}

// The one rule for the device plan (thc_device.h), at enqueue time and in the stages: a THC
// partition of a GPU tensor on a CUDA worker whose root GPU holds its sum (RootHoldsSum;
// BYTEPS_THC_DEVICE_STAGES unset or "auto"), or, with "emulated", one that the CPU plan would
// take without copies (the input and output tensors are then the "device" memory the codec
// reads and writes). `sum_on_root` is RootHoldsSum of the tensor or the partition.
bool DevicePlan(bool thc, const void* input, const void* output, int device, bool sum_on_root) {
  if (!thc || !input || !output) return false;
  switch (DeviceStages()) {
    case td::Stages::kEmulated: return ZeroCopy(thc, input, output);
    case td::Stages::kAuto: return !kCpuOnly && device != CPU_DEVICE_ID && sum_on_root;
    default: return false;
  }
}

bool DevicePlan(const std::shared_ptr<TensorTableEntry>& task) {
  return DevicePlan(dynamic_cast<compressor::ThcCompressor*>(task->compressor.get()) != nullptr,
                    task->tensor.get(), task->output.get(), task->device, RootHoldsSum(task->key));
}

// The root's COPYH2D tells the machine's other GPUs that their own COPYH2D may run (upstream's
// signal; their copy is empty when the root reduced the whole partition, and the BROADCAST after
// it gives them the decoded result). Also when a skipped step takes COPYH2D out.
void NotifyNonRootCopies(const std::shared_ptr<TensorTableEntry>& task) {
  if (BytePSGlobal::GetLocalSize() <= 1) return;
  BytePSCommMsg msg = {BytePSGlobal::GetLocalRank(), DO_COPYH2D, task->key};
  BytePSGlobal::GetBasicComm()->broadcastSignal(&msg, sizeof(BytePSCommMsg));
}

// The partition's device on the device plan: the CUDA GPU of its tensor, else the emulated one.
// nullptr with *error set when none can be made.
std::unique_ptr<td::Device> PlanDevice(const std::shared_ptr<TensorTableEntry>& task,
                                       const compressor::ThcCompressor& thc, std::string* error) {
  if (task->device == CPU_DEVICE_ID) return td::MakeHostDevice(/*host_memory=*/false);
  const size_t d = task->len / compressor::MaxRoundCompressor::ElementBytes(task->tensor->dtype());
  return td::MakeCudaDevice(compressor::thcwire::PartitionConfig(thc.settings().config, task->key),
                            d, task->tensor->dtype(), task->device,
                            BytePSGlobal::GetCopyDevice2HostStream(),
                            BytePSGlobal::GetCopyHost2DeviceStream(), error);
}

// Once, on rank 0, for the first THC partition of a GPU tensor that THC encodes on the host
// because the device plan does not apply.
void LogHostPlan(const std::shared_ptr<TensorTableEntry>& task) {
  static std::atomic<bool> logged{false};
  if (kCpuOnly || task->device == CPU_DEVICE_ID || BytePSGlobal::GetRank() != 0 ||
      DevicePlan(task) || logged.exchange(true))
    return;
  std::ostringstream os;
  os << "byteps-thc: THC encodes GPU tensors on the host (tensor '" << task->tensor_name
     << "' copied whole to the host and back): ";
  if (DeviceStages() == td::Stages::kOff) {
    os << "BYTEPS_THC_DEVICE_STAGES=off";
  } else if (BytePSGlobal::IsCrossPcieSwitch()) {
    os << "its GPUs are across PCIe switches (BYTEPS_PCIE_SWITCH_SIZE), whose sum BytePS takes on "
          "the host";
  } else {
    os << BytePSGlobal::GetLocalSize() << " GPUs per machine, and BytePS's NCCL reduce leaves "
       << "the root GPU a slice of each partition; BYTEPS_REDUCE_ROOTS="
       << BytePSGlobal::GetNccl()->GetRank(task->key, REDUCE)
       << " reduces every partition onto the root GPU, which then encodes it";
  }
  std::cerr << os.str() << "\n" << std::flush;
}

// A THC partition bound to a device whose memory is not the host's (the plan's copies are its),
// or nullptr.
compressor::ThcCompressor* WithCopies(const std::shared_ptr<TensorTableEntry>& task) {
  auto* thc = dynamic_cast<compressor::ThcCompressor*>(task->compressor.get());
  return thc && thc->copies() ? thc : nullptr;
}

// Once, on rank 0, for the first partition bound on a device: the plan, its stages in order and
// what each copy carries.
void LogDevicePlan(const std::shared_ptr<TensorTableEntry>& task, compressor::ThcCompressor* thc) {
  static std::atomic<bool> logged{false};
  if (BytePSGlobal::GetRank() != 0 || logged.exchange(true)) return;
  const uint32_t n = static_cast<uint32_t>(BytePSGlobal::GetNumWorker());
  std::ostringstream os;
  os << "byteps-thc: THC device stages (" << thc->device_name() << "), tensor '"
     << task->tensor_name << "' key " << task->key << " ("
     << task->len / compressor::MaxRoundCompressor::ElementBytes(task->tensor->dtype())
     << " values): THC_NORM (norm on the device, " << sizeof(double)
     << " bytes to the host) -> COMPRESS (encode on the device) -> "
     << "COPYD2H " << thc->payload_bytes() << " bytes (the payload) -> PUSH -> PULL -> "
     << "COPYH2D " << thc->sums_bytes(n) << " bytes (the packed sums of " << n
     << " workers) -> DECOMPRESS (decode on the device); the gradient stays on the "
     << "device\n";
  std::cerr << os.str() << std::flush;  // one write: the line is not torn by other threads' logs
}

// A tensor's bytes at a partition's offset. The framework's tensors are writable (BytePS's COPYH2D
// writes the output through the same const data()).
char* TensorAt(const std::shared_ptr<Tensor>& t, size_t offset) {
  return const_cast<char*>(static_cast<const char*>(t->data())) + offset;
}

// "THC: tensor 'NAME' (key K, bytes A..B, rank R)": where a message is about.
std::string Where(const std::shared_ptr<TensorTableEntry>& task) {
  std::ostringstream os;
  auto* thc = AsThc(task);
  os << (thc ? thc->codec_name() : "THC") << ": tensor '" << task->tensor_name << "' (key "
     << task->key << ", bytes " << task->offset << ".." << task->offset + task->len << ", rank "
     << BytePSGlobal::GetRank() << ")";
  return os.str();
}

std::string NonFiniteAdvice() {
  return "A non-finite gradient under BYTEPS_THC_NONFINITE=error: lower the learning rate, use "
         "loss scaling that skips such steps, or clip gradients; BYTEPS_THC_NONFINITE=propagate "
         "passes it on as uncompressed BytePS does (every worker's result is NaN/inf).";
}

// What to do about a failure the server reported.
std::string Advice(const std::string& server_error) {
  if (server_error.find("registration refused") != std::string::npos ||
      server_error.find("mismatch") != std::string::npos) {
    return ". Give every worker the same THC or LHC settings (bpslaunch --thc-* / --lhc-*, "
           "BYTEPS_THC_* / BYTEPS_LHC_*, BYTEPS_THC_NONFINITE) and the same tensor partitioning "
           "(BYTEPS_PARTITION_BYTES).";
  }
  if (server_error.find("finite") != std::string::npos) return ". " + NonFiniteAdvice();
  return ". The server's log names the key and the sender; the cluster's rounds of this key are "
         "no longer in step, so restart from a checkpoint.";
}

// The agreed norm is NaN or +inf: every worker skips the encode, the push and the pull of this
// partition (they all see the same norm, so the server's data rounds stay in step), and its output
// is NaN (+inf when only infs were seen), as an uncompressed sum would be. Encode() never ran, so
// the residual and the step counter are those of a run without this step.
void SkipNonFiniteStep(std::shared_ptr<TensorTableEntry> task, compressor::MaxRound* thc,
                       double max_norm, const std::string& local) {
  const bool nan = IsNaN(max_norm);
  char* out = static_cast<char*>(task->cpubuff) + task->offset;
  ThcDecompressTarget(task, &out);
  thc->FillNonFinite(out, nan);
  uint64_t count = thc->CountNonfiniteSkip();
  // once per key, then at 10, 100, ... skips: a run with dynamic loss scaling has a few
  if (count == 1 || count == 10 || count == 100 || count % 1000 == 0) {
    BPS_LOG(WARNING) << Where(task) << ": the agreed norm is " << (nan ? "NaN" : "+inf")
                     << (local.empty() ? "" : " (this worker's gradient has " + local + ")")
                     << ": every worker skips this step of the key and its result is "
                     << (nan ? "NaN" : "+inf")
                     << "; its error-feedback state is unchanged. Skipped steps of this key: "
                     << count << ".";
  }
  auto& q = task->queue_list;
  std::vector<QueueType> skipped{COMPRESS, PUSH, PULL, DECOMPRESS};
  if (WithCopies(task)) {  // the payload's and the sums' copies
    skipped.insert(skipped.end(), {COPYD2H, COPYH2D});
    NotifyNonRootCopies(task);
  }
  for (QueueType stage : skipped) {
    q.erase(std::remove(q.begin() + 1, q.end(), stage), q.end());
  }
  FinishOrProceed(task);
}

// Step 3 of the round: the max came back. `local` is this worker's own failure ("" if none),
// `nonfinite` what its gradient had ("" if finite).
void FinishNormRound(std::shared_ptr<TensorTableEntry> task, compressor::MaxRound* thc,
                     size_t bytes, const std::string& local, const std::string& nonfinite) {
  double max_norm = 0;
  std::string err = thc->ParseNormReply(bytes, &max_norm);
  // A failed norm round failed for every worker (the server answers all with one reply), so all
  // of them skip the rest of this partition consistently.
  if (!local.empty()) {
    FailPartition(task, local);
    return;
  }
  if (!err.empty()) {
    FailPartition(task, std::string(thc->codec_name()) + ": the " +
                            (std::string(thc->codec_name()) == "LHC" ? "max" : "norm") +
                            " round of tensor '" + task->tensor_name + "' (key " +
                            std::to_string(task->key) + ") failed on rank " +
                            std::to_string(BytePSGlobal::GetRank()) + ": " + err + Advice(err));
    return;
  }
  if (!IsFinite(max_norm)) {
    if (thc->nonfinite_error()) {  // the server fails such rounds; a reply says it did not
      FailPartition(task, Where(task) + ": the agreed norm is not finite. " + NonFiniteAdvice());
    } else {
      SkipNonFiniteStep(task, thc, max_norm, nonfinite);
    }
    return;
  }
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
void PullMaxNorm(std::shared_ptr<TensorTableEntry> task, compressor::MaxRound* thc,
                 ps::SArray<ps::Key> keys, int cmd, std::string local, std::string nonfinite) {
  auto reply = new ps::SArray<char>(thc->norm_reply(), thc->norm_reply_capacity(), false);
  auto reply_lens = new ps::SArray<int>();
  BytePSGlobal::GetPS()->ZPull(
      keys, reply, reply_lens, cmd, [task, thc, reply, reply_lens, local, nonfinite]() {
        size_t bytes = reply_lens->empty() ? 0 : static_cast<size_t>((*reply_lens)[0]);
        delete reply;
        delete reply_lens;
        TraceBytes(task, THC_NORM, sizeof(tw::NormPush) + bytes);
        FinishNormRound(task, thc, bytes, local, nonfinite);
      });
}

// Steps 1-2a: local norm, push it. The norm is pushed even when this worker failed, so that the
// round completes for the others: a NaN under the fingerprint 0 (unbound) fails it at the server,
// a non-finite norm propagates (or, in error mode, fails the round naming this sender).
void StartNormRound(std::shared_ptr<TensorTableEntry> task) {
  auto* thc = AsThc(task);
  if (!thc) {  // ThcAddStages adds THC_NORM only for THC tensors
    FailPartition(task, Where(task) + ": the THC_NORM stage got a tensor without the THC "
                                      "compressor (a byteps-thc bug; please report it)");
    return;
  }
  std::string local, nonfinite;
  double norm = std::numeric_limits<double>::quiet_NaN();
  auto* thc_codec = dynamic_cast<compressor::ThcCompressor*>(thc);  // LHC has no device plan
  const bool on_device = thc_codec && DevicePlan(task);
  std::string err;
  if (thc_codec) DeviceStages(&err);  // a bad BYTEPS_THC_DEVICE_STAGES
  if (!err.empty()) {
    local = Where(task) + ": " + err + ".";
  } else {
    if (on_device && !thc->bound()) {
      auto device = PlanDevice(task, *thc_codec, &err);
      if (device) thc_codec->UseDevice(std::move(device));
    }
    if (err.empty()) {
      err = thc->Bind(task->key, task->len, static_cast<uint32_t>(BytePSGlobal::GetRank()),
                      task->tensor_name);
    }
    if (!err.empty()) {
      local = Where(task) + ": " + err +
              ". Declare it with valid THC settings (byteps_thc.ThcConfig checks them).";
    }
  }
  if (local.empty()) {
    if (on_device) LogDevicePlan(task, thc_codec);
    if (thc_codec && !on_device) LogHostPlan(task);
    char* data = static_cast<char*>(task->cpubuff) + task->offset;
    ThcCompressSource(task, &data);
    compressor::tensor_t grad(data, task->len, task->tensor->dtype());
    err = thc->LocalNorm(grad, &norm, &nonfinite);
    if (!err.empty()) {
      local = Where(task) + ": the local norm failed: " + err;
      norm = std::numeric_limits<double>::quiet_NaN();
    } else if (!nonfinite.empty() && thc->nonfinite_error()) {
      local = Where(task) + ": this worker's gradient has " + nonfinite +
              " (non-finite gradient). " + NonFiniteAdvice();
    }
  }
  *thc->norm_push() = tw::NormPush{thc->bound() ? thc->fingerprint() : 0, norm};

  auto ps = BytePSGlobal::GetPS();
  // The partition's own server and key; BytePS's PSKV is not touched (its lens change per stage).
  ps::SArray<ps::Key> keys = BytePSGlobal::EncodeDefaultKey(task->key, 0).keys;
  ps::SArray<int> lens(1, static_cast<int>(sizeof(tw::NormPush)));
  ps::SArray<char> vals(reinterpret_cast<char*>(thc->norm_push()), sizeof(tw::NormPush), false);
  const int cmd = tw::CommandType(tw::kThcNormRequest, BYTEPS_FLOAT64);
  ps->ZPush(keys, vals, lens, cmd, [task, thc, keys, cmd, local, nonfinite]() {
    // Not from inside ps-lite's callback: issue the pull from the pool, like the PULL stage.
    OnPool([task, thc, keys, cmd, local, nonfinite]() {
      PullMaxNorm(task, thc, keys, cmd, local, nonfinite);
    });
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
  return dynamic_cast<compressor::MaxRound*>(context.compressor_list[0].get()) != nullptr;
}

bool PullYieldsMean(const BPSContext& context) {
  return BytePSGlobal::IsDistributed() &&
         (tw::IsThcKwargs(context.kwargs) || compressor::lhcwire::IsLhcKwargs(context.kwargs));
}

PullScale PushPullScale(const BPSContext& context, bool average) {
  // pulled = sum / m; the caller wants sum / size (average) or the sum. Every worker machine
  // holds the same number of ranks, so m divides size: one of the two factors is 1.
  const int m = PullYieldsMean(context) ? BytePSGlobal::GetNumWorker() : 1;
  const int want = average ? BytePSGlobal::GetSize() : 1;
  const int g = std::gcd(m, want);
  PullScale s;
  s.multiply = m / g;
  s.divide = want / g;
  return s;
}

void ThcAddStages(const BPSContext& context, const Tensor* input, const Tensor* output, int device,
                  std::vector<QueueType>* queue_list) {
  if (!ThcUsesNormRound(context)) return;
  auto it = std::find(queue_list->begin(), queue_list->end(), COMPRESS);
  if (it != queue_list->end()) queue_list->insert(it, THC_NORM);
  // The device plan: the codec on the device, the copies carry its payload and sums.
  const bool thc = !context.compressor_list.empty() &&
                   dynamic_cast<compressor::ThcCompressor*>(context.compressor_list[0].get());
  const bool device_plan = DevicePlan(thc, input, output, device, RootHoldsSum(context));
  if (ZeroCopy(true, input, output) || device_plan) {
    for (QueueType copy : {COPYD2H, COPYH2D}) {
      queue_list->erase(std::remove(queue_list->begin(), queue_list->end(), copy),
                        queue_list->end());
    }
  }
  if (!device_plan) return;
  auto at = std::find(queue_list->begin(), queue_list->end(), COMPRESS);
  if (at != queue_list->end()) queue_list->insert(at + 1, COPYD2H);
  at = std::find(queue_list->begin(), queue_list->end(), DECOMPRESS);
  if (at != queue_list->end()) queue_list->insert(at, COPYH2D);
}

bool ThcCopyStage(const std::shared_ptr<TensorTableEntry>& task, QueueType stage) {
  auto* thc = WithCopies(task);
  if (!thc) return false;
  compressor::ThcCompressor::Copy c;
  if (stage == COPYD2H) {
    c = thc->PayloadCopy();
    if (c.bytes) {
      CopyToHost(c.dst, c.src, c.bytes, BytePSGlobal::GetCopyDevice2HostStream());
      std::string err = thc->AfterPayloadCopy();
      if (!err.empty()) {  // push the header alone: the server fails the round for every worker
        if (task->compressed) task->compressed->size = sizeof(tw::PushHeader);
        RecordFailure(task, Where(task) + ": " + err + ".");
      }
    }
  } else {
    NotifyNonRootCopies(task);
    c = thc->SumsCopy(BytePSGlobal::EncodeDefaultKey(task->key, 0).lens[0]);
    if (c.bytes) CopyToDevice(c.dst, c.src, c.bytes, BytePSGlobal::GetCopyHost2DeviceStream());
  }
  TraceBytes(task, stage, c.bytes);
  FinishOrProceed(task);
  return true;
}

void ThcCompressSource(const std::shared_ptr<TensorTableEntry>& task, char** data) {
  if (ZeroCopy(task)) {
    *data = TensorAt(task->tensor, task->offset);
  } else if (WithCopies(task) && task->device != CPU_DEVICE_ID) {
    // where BytePS's COPYD2H reads: after an NCCL reduce of several GPUs its output
    *data = TensorAt(BytePSGlobal::GetNccl()->GetSize() > 1 ? task->output : task->tensor,
                     task->offset);
  }
}

void ThcDecompressTarget(const std::shared_ptr<TensorTableEntry>& task, char** data) {
  if (ZeroCopy(task) || (WithCopies(task) && task->device != CPU_DEVICE_ID))
    *data = TensorAt(task->output, task->offset);
}

void ThcNormLoop() {
  while (RunThcNormLoopOnce() && !BytePSGlobal::ShouldShutdown()) {
  }
  BytePSGlobal::ReportThreadFinish();
}

bool ThcAfterCompress(const std::shared_ptr<TensorTableEntry>& task) {
  auto* thc = AsThc(task);
  if (!thc) return false;
  std::string err = thc->TakeError();
  if (!err.empty()) RecordFailure(task, Where(task) + ": " + err + ".");
  return true;
}

bool ThcAfterDecompress(std::shared_ptr<TensorTableEntry> task) {
  auto* thc = AsThc(task);
  if (!thc) return false;
  std::string err = thc->TakeError();
  if (err.empty()) return LhcStartFallback(task);  // LHC's exact fallback round, when pending
  std::string why = Where(task) + ": " + err + Advice(err);
  FailPartition(std::move(task), why);
  return true;
}

bool ThcPullTarget(const std::shared_ptr<TensorTableEntry>& task, char** data, size_t* capacity) {
  auto* thc = AsThc(task);
  if (!thc || !thc->bound()) return false;
  *data = thc->receive_buffer();
  *capacity = thc->receive_capacity();
  return true;
}

}  // namespace common
}  // namespace byteps

#endif  // !BYTEPS_BUILDING_SERVER && BYTEPS_THC_NORM_STAGE
