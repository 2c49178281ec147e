// byteps-thc codec core: what the drivers (encoder.cc, aggregator.cc, decoder.cc) and the kernel
// files share. Not part of the public interface.
//
// Kernel families, one per file, each built three times (portable, AVX2, AVX-512) from one
// implementation header compiled with different -m flags into its own namespace:
//   hadamard   (hadamard_impl.h)    blockwise unnormalised Walsh-Hadamard transform
//   quantize   (quantize_impl.h)    encode pointwise work: load+sign, scale/round, pack, norm;
//                                   the fused encode of a chunk (EncodeChunk)
//   dequantize (dequantize_impl.h)  decode pointwise work: sums->float, scale+sign; the fused
//                                   decode of a chunk (DecodeChunk)
// The transform's building blocks (transform.h) are shared by the first three.
//   aggregate  (aggregate_impl.h)   unpack, table lookup, integer add
// The ISA is chosen in one place, dispatch.cc, which hands the drivers a table of function
// pointers (Kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace thc {
namespace detail {

// A zero-initialised array on a 64-byte (cache line, one AVX-512 vector) boundary: the kernels'
// vector loads and stores never straddle two lines. Not copyable; resize() discards contents.
template <class T>
class AlignedArray {
 public:
  AlignedArray() = default;
  explicit AlignedArray(size_t n) { resize(n); }
  ~AlignedArray() { std::free(p_); }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  void resize(size_t n) {
    std::free(p_);
    p_ = nullptr;
    n_ = n;
    if (n == 0) return;
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    std::memset(static_cast<void*>(p_), 0, bytes);
  }
  void swap(AlignedArray& o) noexcept {
    T* p = p_;
    p_ = o.p_;
    o.p_ = p;
    size_t n = n_;
    n_ = o.n_;
    o.n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A run of equal rotation blocks of a tiled partition: coordinates [start, end), blocks of
// `block`. A partition is one run, or two when its last block is smaller (Geometry::tail_block).
struct Run {
  size_t start, end, block;
};
inline int Runs(size_t padded, size_t block, size_t tail_block, Run out[2]) {
  int n = 0;
  const size_t main = padded - tail_block;
  if (main) out[n++] = Run{0, main, block};
  if (tail_block) out[n++] = Run{main, padded, tail_block};
  return n;
}

// Everything the quantize kernel needs; filled once per Encode call by the encoder.
struct QuantParams {
  float c1 = 0, c0 = 0;  // t = y * c1 + c0
  float gmax = 0;        // g as a float (the clip)
  float k1 = 0, k0 = 0;  // error feedback: e = y - (TBL[q] * k1 + k0)
  bool ef = false;       // write e over y
  uint32_t round_key = 0;
  int levels = 0;                // K = 2^bits
  const int32_t* lvl = nullptr;  // lvl[k], k = 0..g: largest i with TBL[i] <= k, capped at K-2;
                                 // nullptr when g is large (binary search over tbl instead)
  const int32_t* tbl = nullptr;  // TBL[0..K) as integers
  const float* tblf = nullptr;   // float(TBL[i])
  const float* ig = nullptr;     // 1 / (TBL[i+1] - TBL[i]), i = 0..K-2 (entry K-1 is 0)
  // Derived tables the vector kernels use instead (same bits, fewer operations):
  const float* ig24 = nullptr;  // ig[i] * 2^24 (exact): u < p  <=>  float(h >> 8) < p * 2^24
  const float* efr = nullptr;   // float(TBL[i]) * k1 + k0 (binary32, in that order), per level
  // Error feedback: what proves the new residual finite without looking at it (EncodeChunk).
  double res_bound = 0;   // a bound on |r| of the residual in (HUGE_VAL: unknown)
  double efr_absmax = 0;  // max |efr[i]| (HUGE_VAL if one is not finite)
};

// What encode_chunk returns.
enum ChunkStatus : int {
  kChunkOk = 0,
  kChunkNonFinite = 1,  // some grad is NaN/Inf
  kChunkOverflow = 2,   // some y (transform + residual) or new residual is NaN/Inf
};

// One instruction set's kernels. All pointers are plain functions without state.
struct Kernels {
  const char* name;
  // hadamard: in-place Hu on each block of `block` floats in x[0, n); n a multiple of block.
  void (*fwht)(float* x, size_t n, size_t block);
  // quantize: idx[i] = table index of y[i] (element j0+i); with p.ef, y[i] becomes the error e,
  // and the result is max |e| as float bits (unsigned order; >= 0x7F800000: some e is NaN/Inf);
  // 0 without p.ef.
  uint32_t (*quantize)(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx);
  // LSB-first b-bit stream of idx[0, n) into ceil(n*bits/8) bytes (unused high bits zero).
  void (*pack)(const uint8_t* idx, size_t n, int bits, uint8_t* out);
  // sum of x[i]^2 (binary32 runs summed in binary64); false if any x[i] is not finite.
  bool (*sum_squares)(const float* x, size_t n, double* out);
  // dequantize: v[i] = float(S_i) * m1 + m0, i < n, S_i the i-th sum of the stream of `bytes`
  // bytes at sums, sum_bits (1..32) each, LSB first (8/16/32: lanes; dequantize_impl.h).
  void (*load_sums)(const uint8_t* sums, int sum_bits, size_t bytes, size_t n, float m1, float m0,
                    float* v);
  // out[i] = sign_{j0+i} * (w[i] * scale), i < n; j0 a multiple of 32.
  void (*scale_signed)(const float* w, size_t n, uint64_t j0, uint32_t sign_key, float scale,
                       float* out);
  // The whole encode (steps 1-7) of one chunk of n elements (whole blocks; elements
  // j0 .. j0+n-1, j0 a multiple of 32; nvalid of them real, the rest padding): grad, res (the
  // rotated residual r, n floats; null: no error feedback), payload and res_out (the new r, n
  // floats; null iff res is null; p.ef says the same) start at the chunk; work holds n floats,
  // idx n bytes. A ChunkStatus; on an error nothing of res_out is promised. With error feedback
  // *res_bound_out gets a bound on |the new residual| of the chunk (finite when kChunkOk).
  int (*encode_chunk)(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                      size_t block, uint32_t sign_key, const QuantParams& p, float* work,
                      uint8_t* idx, uint8_t* payload, float* res_out, double* res_bound_out,
                      int threads);
  // Encode steps 1-2 of one chunk (the norm's half of a step with error feedback):
  // y = Hu(sign * grad) + res (n floats each, starting at the chunk); *sumsq = sum of y^2 in
  // binary64. A ChunkStatus.
  int (*rotate_chunk)(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                      size_t block, uint32_t sign_key, float* y, double* sumsq, int threads);
  // The whole decode of one chunk: sums (a stream as load_sums', `bytes` of it readable) and
  // out start at the chunk; out gets nvalid floats; work holds n floats.
  // encode_chunk, rotate_chunk and decode_chunk take `threads`: a chunk that is one block
  // larger than the transform's leaf runs its transform on that many threads (RunTasks; the
  // same operations on every element, so the same bits); 1, and other chunks, on the caller's.
  void (*decode_chunk)(const uint8_t* sums, int sum_bits, size_t bytes, size_t nvalid, size_t n,
                       uint64_t j0, size_t block, uint32_t sign_key, float m1, float m0,
                       float* work, float* out, int threads);
  // aggregate: sums[i] += tbl[index i of the b-bit stream], i < n; lanes of lane_bits.
  void (*add_indices)(const uint8_t* payload, size_t n, int bits, const uint32_t* tbl,
                      int lane_bits, void* sums);
};

// The kernels of the active instruction set (dispatch.cc).
const Kernels& ActiveKernels();

// fn(ctx, i) for every i < tasks on up to `threads` threads (parallel.cc: parallel.h's
// ParallelTasks). The kernels reach threads only through this function, so that no inline code
// of the standard library's threads is compiled with a kernel file's ISA flags (the linker keeps
// one copy of each inline function, and that copy could then need an ISA the CPU lacks).
void RunTasks(int threads, size_t tasks, void (*fn)(void* ctx, size_t i), void* ctx);

// Per-ISA entry points, defined in the kernel files; dispatch.cc gathers them.
#define THC_DECLARE_ISA_KERNELS(ns)                                                               \
  namespace ns {                                                                                  \
  void Fwht(float* x, size_t n, size_t block);                                                    \
  uint32_t Quantize(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx);         \
  void Pack(const uint8_t* idx, size_t n, int bits, uint8_t* out);                                \
  bool SumSquares(const float* x, size_t n, double* out);                                         \
  void LoadSums(const uint8_t* sums, int sum_bits, size_t bytes, size_t n, float m1, float m0,    \
                float* v);                                                                        \
  void ScaleSigned(const float* w, size_t n, uint64_t j0, uint32_t sign_key, float scale,         \
                   float* out);                                                                   \
  void AddIndices(const uint8_t* payload, size_t n, int bits, const uint32_t* tbl, int lane_bits, \
                  void* sums);                                                                    \
  int EncodeChunk(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,      \
                  size_t block, uint32_t sign_key, const QuantParams& p, float* work,             \
                  uint8_t* idx, uint8_t* payload, float* res_out, double* res_bound_out,          \
                  int threads);                                                                   \
  int RotateChunk(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,      \
                  size_t block, uint32_t sign_key, float* y, double* sumsq, int threads);         \
  void DecodeChunk(const uint8_t* sums, int sum_bits, size_t bytes, size_t nvalid, size_t n,      \
                   uint64_t j0, size_t block, uint32_t sign_key, float m1, float m0, float* work, \
                   float* out, int threads);                                                      \
  }

THC_DECLARE_ISA_KERNELS(portable)
#if defined(__x86_64__) || defined(_M_X64)
#define THC_HAVE_X86 1
THC_DECLARE_ISA_KERNELS(avx2)
THC_DECLARE_ISA_KERNELS(avx512)
#endif

// Elements per chunk the drivers hand to the kernels when blocks are small (a multiple of 32
// and of every block it covers; sized for L1/L2).
#ifndef THC_CHUNK
#define THC_CHUNK 2048
#endif
constexpr size_t kChunk = THC_CHUNK;

}  // namespace detail
}  // namespace thc
