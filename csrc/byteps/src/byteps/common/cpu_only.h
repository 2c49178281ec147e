// byteps-thc: the worker's device layer, so that one BytePS tree builds two workers.
//
// CUDA build (upstream's worker): every function below is the CUDA call that upstream made at
// that place, with the same arguments, flags and checks; nothing else changes.
// CPU-only build (BYTEPS_CPU_ONLY, `BYTEPS_THC_CPU_ONLY=1`): no CUDA, NCCL or libnuma, and one
// worker process per machine. Then a copy stage is a memcpy on the stage's own thread, there is
// no device to select and no host memory to pin, and the NCCL manager is a one-rank stand-in
// whose answers keep BytePS's pipeline on its single-GPU path (COPYD2H -> PUSH -> PULL -> COPYH2D).
//
// Patch 0003 calls these in place of upstream's CUDA calls, a line a call site. Code that a
// CPU-only worker never runs and cannot compile (the NCCL stages, the NUMA placement of
// cross-PCIe-switch buffers) stays in upstream's files under `#ifndef BYTEPS_CPU_ONLY`.
#ifndef BYTEPS_THC_CPU_ONLY_H
#define BYTEPS_THC_CPU_ONLY_H

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>

#ifndef BYTEPS_CPU_ONLY
#include <cuda_runtime.h>
#include <numa.h>
#endif

#include "common.h"
#include "communicator.h"
#include "logging.h"

namespace byteps {
namespace common {

#ifdef BYTEPS_CPU_ONLY

constexpr bool kCpuOnly = true;

// The copy stages' streams: none (a copy runs on the stage's thread and is done when it returns).
struct CopyStream;

inline void SelectDevice(int /*local_rank*/) {}
inline CopyStream* NewCopyStream() { return nullptr; }
inline void DestroyCopyStream(CopyStream* /*stream*/) {}

inline void CopyToHost(void* dst, const void* src, size_t len, CopyStream* = nullptr) {
  std::memcpy(dst, src, len);
}
inline void CopyToDevice(void* dst, const void* src, size_t len, CopyStream* = nullptr) {
  std::memcpy(dst, src, len);
}

inline void RegisterHostMemory(void* /*ptr*/, size_t /*len*/) {}
inline void UnregisterHostMemory(void* /*ptr*/) {}
// Not called (`device == CPU_DEVICE_ID && !kCpuOnly` at its call sites): the copy stages of a
// CPU-only worker read the input tensor and write the output tensor themselves, not a mapping.
inline const char* MapHostMemory(void* /*ptr*/, size_t /*len*/, void** /*device_ptr*/) {
  return nullptr;
}

// The NCCL stand-in: one rank per machine, so every partition is this rank's, the root is this
// rank, and no NCCL stage is ever queued. Only what the pipeline outside the NCCL stages asks.
class NcclManager {
 public:
  explicit NcclManager(std::shared_ptr<BytePSComm> comm) : _signal_comm(comm) {
    BPS_CHECK_EQ(comm->getLocalSize(), 1)
        << "this BytePS is built CPU-only: one worker process per machine (BYTEPS_LOCAL_SIZE=1)";
  }
  int GetGroupSize() { return 1; }
  int GetSize() { return 1; }
  int GetRoot(uint64_t /*key*/, QueueType /*op*/) { return 0; }
  int GetRank(uint64_t /*key*/, QueueType /*op*/) { return 0; }
  bool IsSignalRoot() { return true; }
  std::shared_ptr<BytePSComm> GetSignalComm() { return _signal_comm; }

 private:
  std::shared_ptr<BytePSComm> _signal_comm;
};

#else  // CUDA build: upstream's calls

constexpr bool kCpuOnly = false;

using CopyStream = cudaStream_t;

inline void SelectDevice(int local_rank) { CUDA_CALL(cudaSetDevice(local_rank)); }

inline CopyStream* NewCopyStream() {
  auto stream = (cudaStream_t*)malloc(sizeof(cudaStream_t) * 1);
  CUDA_CALL(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  CUDA_CALL(cudaStreamSynchronize(*stream));
  return stream;
}
inline void DestroyCopyStream(CopyStream* stream) { CUDA_CALL(cudaStreamDestroy(*stream)); }

// On `stream`, waiting for the copy; without a stream, cudaMemcpy (unchecked, as upstream's
// sampled-tensor log reads its four floats).
inline void CopyToHost(void* dst, const void* src, size_t len, CopyStream* stream = nullptr) {
  if (!stream) {
    cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost);
    return;
  }
  CUDA_CALL(cudaMemcpyAsync(dst, src, len, (cudaMemcpyKind)cudaMemcpyDeviceToHost,
                            (cudaStream_t)*stream));
  CUDA_CALL(cudaStreamSynchronize(*stream));
}
inline void CopyToDevice(void* dst, const void* src, size_t len, CopyStream* stream) {
  CUDA_CALL(cudaMemcpyAsync(dst, src, len, (cudaMemcpyKind)cudaMemcpyHostToDevice,
                            (cudaStream_t)*stream));
  CUDA_CALL(cudaStreamSynchronize(*stream));
}

inline void RegisterHostMemory(void* ptr, size_t len) {
  CUDA_CALL(cudaHostRegister(ptr, len, cudaHostRegisterDefault));
}
inline void UnregisterHostMemory(void* ptr) { CUDA_CALL(cudaHostUnregister(ptr)); }
// Pins a CPU tensor and maps it for the GPU (the copy stages reach it at *device_ptr). Returns
// cudaHostRegister's error text (memory registered before is one), or nullptr.
inline const char* MapHostMemory(void* ptr, size_t len, void** device_ptr) {
  cudaError_t e = cudaHostRegister(ptr, len, cudaHostRegisterMapped);
  CUDA_CALL(cudaHostGetDevicePointer(device_ptr, ptr, 0));
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

#endif  // BYTEPS_CPU_ONLY

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_THC_CPU_ONLY_H
