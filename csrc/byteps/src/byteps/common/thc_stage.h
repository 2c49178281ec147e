// byteps-thc: THC's worker-side stages and hooks in BytePS's pipeline.
//
// A THC partition flows COPYD2H -> THC_NORM -> COMPRESS -> PUSH -> PULL -> DECOMPRESS -> COPYH2D
// (a GPU tensor on a machine of several GPUs: upstream's NCCL reduce and broadcast around it),
// and on a CPU-only worker THC_NORM -> COMPRESS -> PUSH -> PULL -> DECOMPRESS: the codec reads the
// gradient from the input tensor and decodes into the output tensor, so the two host copies of the
// gradient (into BytePS's buffer and back) are not made (patch 0043). The device plan
// (compressor/impl/thc_device.h: a GPU tensor on a CUDA worker of one GPU per machine; on a
// CPU-only worker with BYTEPS_THC_DEVICE_STAGES=emulated) keeps the codec on the device and moves only its bytes: THC_NORM (the norm on the device) ->
// COMPRESS (the encode on the device) -> COPYD2H (the payload) -> PUSH -> PULL -> COPYH2D (the
// packed sums) -> DECOMPRESS (the decode on the device, into the output tensor).
// THC_NORM (spec §3 step 2) binds the partition to its compressor, computes the local norm of
// gradient + residual, pushes it (16 bytes) to the server under the partition's key with the
// request type thcwire::kThcNormRequest, pulls back the max over workers and hands it to the
// compressor. The stage waits for nothing but the network: its thread only dispatches, the norm
// is computed on BytePS's thread pool, and the push/pull run on ps-lite callbacks.
// A NaN/Inf gradient pushes a non-finite norm; when the agreed max is not finite, every worker
// skips COMPRESS, PUSH, PULL and DECOMPRESS of that partition and writes NaN/+inf as its result
// (BYTEPS_THC_NONFINITE=propagate), or the round fails (=error): docs/ALGORITHM.md.
#ifndef BYTEPS_THC_STAGE_H
#define BYTEPS_THC_STAGE_H

#include <memory>
#include <vector>

#include "common.h"

namespace byteps {
namespace common {

// True when the tensor's partitions are compressed with THC.
bool ThcUsesNormRound(const BPSContext& context);

// True when the tensor's pull yields the mean over the workers (DMLC_NUM_WORKER of them), false
// when it yields their sum. The mean for THC and LHC tensors: their decode's last scale carries
// the 1/n, so an average costs no pass of its own. The sum for uncompressed tensors, tensors below
// BYTEPS_MIN_COMPRESS_BYTES (InitTensor clears their kwargs) and BytePS's own compressors, and in
// a job that is not distributed (no push, no pull). Decided by the kwargs, not by the compressors:
// only the root device builds compressors, and every local rank of a machine must agree. Valid
// once InitTensor has run.
bool PullYieldsMean(const BPSContext& context);

// What a framework's push_pull does to the pulled result to give its caller what it asked for:
// the average over all byteps_size() ranks, or (average false) their sum. The result is the
// pulled one times `multiply`, divided by `divide`; both 1: nothing to do, no pass over it.
struct PullScale {
  int multiply = 1;
  int divide = 1;
  bool identity() const { return multiply == 1 && divide == 1; }
};
PullScale PushPullScale(const BPSContext& context, bool average);

// Inserts THC_NORM before COMPRESS in a THC tensor's queue list, and on a CPU-only worker
// (push_pull: input and output given) takes out COPYD2H and COPYH2D, or, on the device plan
// (compressor/impl/thc_device.h: GPU tensors on a CUDA worker with one GPU per machine, CPU
// tensors with BYTEPS_THC_DEVICE_STAGES=emulated), puts them after COMPRESS and before
// DECOMPRESS. `device` is the tensor's (CPU_DEVICE_ID or a GPU). No-op for other tensors.
void ThcAddStages(const BPSContext& context, const Tensor* input, const Tensor* output, int device,
                  std::vector<QueueType>* queue_list);

// COMPRESS (and THC_NORM): where a partition's gradient is read; DECOMPRESS: where its result
// goes. BytePS's host buffer, except for THC partitions on a CPU-only worker and on the device
// plan: the input tensor's (after a several-GPU NCCL reduce, the output's) and the output
// tensor's bytes at the partition's offset. *data is left alone otherwise.
void ThcCompressSource(const std::shared_ptr<TensorTableEntry>& task, char** data);
void ThcDecompressTarget(const std::shared_ptr<TensorTableEntry>& task, char** data);

// COPYD2H and COPYH2D of a THC partition on the GPU worker's plan: the payload up, the packed
// sums down (the reply checked first: a failed one copies nothing and DECOMPRESS reports it), on
// BytePS's copy streams; then the partition proceeds. False, with nothing done, for every other
// partition (BytePS's own copies).
bool ThcCopyStage(const std::shared_ptr<TensorTableEntry>& task, QueueType stage);

// The THC_NORM stage's thread (started with the other loops on the root device).
void ThcNormLoop();

// Failures (failure.h): a failed THC partition fails its push_pull with a message naming the
// tensor, key, rank, what happened and what to do, and never the process.
// After COMPRESS: records an encode failure; the header-only push still goes out, so the server
// fails the round for every worker instead of waiting for this one. True for THC and LHC
// partitions: they push from the compressor's own buffer, which may be larger than the partition
// (an LHC sketch sized for more nonzeros than a small partition has values), so BytePS's check
// that a payload fits its partition is for the other compressors only.
bool ThcAfterCompress(const std::shared_ptr<TensorTableEntry>& task);
// After DECOMPRESS: true when the reply was the server's error or malformed; the partition then
// failed and finished (the caller returns).
bool ThcAfterDecompress(std::shared_ptr<TensorTableEntry> task);

// PULL stage: a THC partition's reply (header + integer sums) can be larger than the
// partition's own bytes, so it goes into the compressor's receive buffer instead.
// Returns false (and changes nothing) for other partitions.
bool ThcPullTarget(const std::shared_ptr<TensorTableEntry>& task, char** data, size_t* capacity);

template <typename Len>
inline void ThcRedirectPull(const std::shared_ptr<TensorTableEntry>& task, char** data, Len* len) {
  size_t cap = 0;
  if (ThcPullTarget(task, data, &cap)) *len = static_cast<Len>(cap);
}

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_THC_STAGE_H
