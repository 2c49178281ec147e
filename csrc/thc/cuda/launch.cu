// byteps-thc CUDA: the host side. Checks arguments, plans the passes of one call and dispatches
// on dtype, lane width and tile size, all in this one place; the kernel families only define
// kernels (tile.cuh, rotate.cu, encode.cu, decode.cu, hadamard.cu, norm.cu, aggregate.cu).
//
// Plan of a rotation block of 2^L coordinates:
//   L <= 14: one kernel; a tile of 2^12 (L <= 12) or 2^14 floats holds whole blocks.
//   L >= 15: a row pass for the low 12 (or 14) bits, then column passes of at most 11 bits each,
//            through a workspace of one chunk (max(2^22, B) floats), chunk by chunk.
// The encode and the norm with error feedback run the same passes; the rotated state r is added
// in the last one (and rewritten there by the encode).
// With block_scale every kernel reads the M_k of its tile's blocks (tile.cuh, "Scales"), the
// encode and decode start with a check of all of them, and the norm without error feedback is
// the tile kernel without a transform (a sum of grad^2 per block).
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels.cuh"
#include "tile.cuh"

namespace thc {
namespace cuda {

using detail::Dst;
using detail::PackedSums;
using detail::Src;
using detail::TileParams;

namespace {

std::string Fail(const char* what, cudaError_t err) {
  return std::string("thc.cuda: ") + what + ": " + cudaGetErrorString(err);
}

int Log2(uint64_t v) {
  int l = 0;
  while ((uint64_t{1} << l) < v) ++l;
  return l;
}

struct Pass {
  int lt, log_c, lo, tb, te;
  uint32_t tiles;
};

struct Plan {
  int n = 0;
  Pass pass[34];
};

Plan MakePlan(const Code& code, const Geometry& g) {
  Plan plan;
  const int L = g.log_block;
  const int fused = code.fused_max_log;
  const int colmax = code.column_max_bits;
  if (L <= fused) {
    const int lt = L <= detail::kSmallTile ? detail::kSmallTile : detail::kLargeTile;
    const uint64_t tile = uint64_t{1} << lt;
    plan.pass[plan.n++] =
        Pass{lt, lt, lt, 0, L, static_cast<uint32_t>((g.padded + tile - 1) / tile)};
    return plan;
  }
  const int row = (L <= detail::kLargeTile || L - detail::kSmallTile <= colmax)
                      ? detail::kSmallTile
                      : detail::kLargeTile;
  plan.pass[plan.n++] = Pass{row, row, row, 0, row, static_cast<uint32_t>(g.padded >> row)};
  const int rem = L - row;
  const int np = (rem + colmax - 1) / colmax;
  int lo = row;
  for (int k = 0; k < np; ++k) {
    const int rb = rem / np + (k < rem % np ? 1 : 0);
    const int lt = rb <= 9 ? detail::kSmallTile : detail::kLargeTile;
    plan.pass[plan.n++] = Pass{lt, lt - rb, lo, lt - rb, lt, static_cast<uint32_t>(g.padded >> lt)};
    lo += rb;
  }
  return plan;
}

void SetPass(TileParams* p, const Pass& s) {
  p->log_c = s.log_c;
  p->lo = s.lo;
  p->tb = s.tb;
  p->te = s.te;
  p->num_tiles = s.tiles;
}

template <Src S, Dst D, typename T>
cudaError_t Tile(const Pass& s, TileParams* p, cudaStream_t stream) {
  SetPass(p, s);
  return s.lt == detail::kSmallTile ? detail::LaunchTile<detail::kSmallTile, S, D, T>(*p, stream)
                                    : detail::LaunchTile<detail::kLargeTile, S, D, T>(*p, stream);
}

// Fills the fields every kernel of a call shares.
void BaseParams(const Code& code, const Geometry& g, TileParams* p) {
  p->d = g.d;
  p->padded = g.padded;
  p->payload_bytes = g.payload_bytes;
  p->bits = code.bits;
  p->levels = 1 << code.bits;
  p->granularity = code.granularity;
  p->clip = code.clip;
  // block_scale: each block is a partition of its own (d_pad = B) with its own M_k
  p->sqrt_padded = std::sqrt(static_cast<double>(code.block_scale ? g.block : g.padded));
  p->sqrt_block = std::sqrt(static_cast<double>(g.block));
  p->scale_log = code.block_scale ? g.log_block : 63;
  p->sign_key = detail::SignKey(code.seed);
  const int K = 1 << code.bits;
  for (int i = 0; i < 256; ++i) {
    p->table[i] = i < K ? code.table[i] : code.granularity;
    p->inv_gap[i] =
        i < K - 1 ? static_cast<float>(1.0 / static_cast<double>(code.table[i + 1] - code.table[i]))
                  : 0.f;
  }
}

// The transform passes between the first and the last: workspace -> workspace.
cudaError_t MiddlePasses(const Plan& plan, TileParams* p, float* ws, cudaStream_t stream) {
  p->first = false;
  p->src = ws;
  p->scratch = ws;
  for (int k = 1; k + 1 < plan.n; ++k) {
    const cudaError_t err = Tile<Src::kScratch, Dst::kScratch, float>(plan.pass[k], p, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The multi-pass path runs chunk by chunk (whole blocks, 2^chunk_log floats or one block): the
// workspace of one chunk is rewritten by each pass while it still sits in L2.
uint64_t ChunkLen(const Code& code, const Geometry& g) {
  const uint64_t c = uint64_t{1} << code.chunk_log;
  const uint64_t len = g.block > c ? g.block : c;
  return len < g.padded ? len : g.padded;
}

// fn(off, plan) for each chunk of g, from coordinate off, with p's chunk fields (j_base, padded,
// d) set and p->first true; the first error ends it.
template <typename F>
cudaError_t ForEachChunk(const Code& code, const Geometry& g, TileParams* p, F fn) {
  const uint64_t chunk = ChunkLen(code, g);
  for (uint64_t off = 0; off < g.padded; off += chunk) {
    Geometry gc = g;
    gc.padded = chunk < g.padded - off ? chunk : g.padded - off;
    p->j_base = off;
    p->padded = gc.padded;
    p->d = g.d - off < gc.padded ? g.d - off : gc.padded;
    p->first = true;
    const cudaError_t err = fn(off, MakePlan(code, gc));
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// Every pass of one chunk: source S -> workspace, the middle passes, workspace -> destination D.
template <Src S, Dst D, typename T>
cudaError_t ChunkPasses(const Plan& plan, TileParams* p, float* ws, cudaStream_t stream) {
  p->scratch = ws;
  cudaError_t err = Tile<S, Dst::kScratch, T>(plan.pass[0], p, stream);
  if (err == cudaSuccess) err = MiddlePasses(plan, p, ws, stream);
  if (err == cudaSuccess) err = Tile<Src::kScratch, D, float>(plan.pass[plan.n - 1], p, stream);
  return err;
}

template <typename P>
P* Advance(P* ptr, uint64_t bytes) {
  using Byte = typename std::conditional<std::is_const<P>::value, const char, char>::type;
  return ptr ? reinterpret_cast<P*>(reinterpret_cast<Byte*>(ptr) + bytes) : nullptr;
}

// The passes of y = Hu(sign * grad) (+ r) into destination D: the payload and the new state
// (Dst::kQuant), or the norm's sum of squares (Dst::kNorm). p has the shared fields and
// res_in/res_out of the whole tensor; chunks advance them.
template <Dst D, typename T>
cudaError_t RotateT(const Code& code, const Geometry& g, TileParams* p, const void* grad,
                    uint8_t* payload, float* workspace, cudaStream_t stream) {
  p->first = true;
  if (g.log_block <= code.fused_max_log) {
    const Plan plan = MakePlan(code, g);
    p->src = grad;
    p->payload = payload;
    return Tile<Src::kGrad, D, T>(plan.pass[0], p, stream);
  }
  const float* res_in = p->res_in;
  float* res_out = p->res_out;
  return ForEachChunk(code, g, p, [&](uint64_t off, const Plan& plan) {
    p->payload_bytes = p->padded * code.bits / 8;  // a multiple of 2^15 coordinates
    p->src = Advance(grad, off * sizeof(T));
    p->res_in = res_in ? res_in + off : nullptr;
    p->res_out = res_out ? res_out + off : nullptr;
    p->payload = payload ? payload + off * code.bits / 8 : nullptr;
    return ChunkPasses<Src::kGrad, D, T>(plan, p, workspace, stream);
  });
}

template <Dst D>
cudaError_t RotateDispatch(const Code& code, const Geometry& g, TileParams* p, DType dtype,
                           const void* grad, uint8_t* payload, float* workspace,
                           cudaStream_t stream) {
  switch (dtype) {
    case kFloat16: return RotateT<D, __half>(code, g, p, grad, payload, workspace, stream);
    case kBFloat16: return RotateT<D, __nv_bfloat16>(code, g, p, grad, payload, workspace, stream);
    default: return RotateT<D, float>(code, g, p, grad, payload, workspace, stream);
  }
}

template <typename L>
cudaError_t DecodeT(const Code& code, const Geometry& g, TileParams* p, const DecodeArgs& a,
                    cudaStream_t stream) {
  p->out_dtype = a.out_dtype;
  if (g.log_block <= code.fused_max_log) {
    const Plan plan = MakePlan(code, g);
    p->first = true;
    p->zero_at_m0 = true;
    p->src = a.sums;
    p->out = a.out;
    p->out_cast = a.out_cast;
    return Tile<Src::kSums, Dst::kOut, L>(plan.pass[0], p, stream);
  }
  const uint64_t cast_size = a.out_dtype == kFloat32 ? 4 : 2;
  return ForEachChunk(code, g, p, [&](uint64_t off, const Plan& plan) {
    p->zero_at_m0 = true;
    // a chunk starts at a multiple of 8 coordinates: a whole byte of the packed stream too
    p->src = Advance(a.sums,
                     std::is_same<L, PackedSums>::value ? off * a.sum_bits / 8 : off * sizeof(L));
    p->out = a.out ? a.out + off : nullptr;
    p->out_cast = Advance(a.out_cast, off * cast_size);
    return ChunkPasses<Src::kSums, Dst::kOut, L>(plan, p, a.workspace, stream);
  });
}

// block_scale without error feedback: sum_{j<d} grad_j^2 of each block, the tile kernel without
// a transform (row tiles of 2^12 over d_pad, no workspace, no chunks).
template <typename T>
cudaError_t BlockSquaresT(const Geometry& g, TileParams* p, const void* grad, cudaStream_t stream) {
  const uint64_t tile = uint64_t{1} << detail::kSmallTile;
  const Pass pass{detail::kSmallTile,
                  detail::kSmallTile,
                  detail::kSmallTile,
                  0,
                  0,
                  static_cast<uint32_t>((g.padded + tile - 1) / tile)};
  p->first = true;
  p->src = grad;
  return Tile<Src::kGrad, Dst::kNorm, T>(pass, p, stream);
}

cudaError_t BlockSquares(const Geometry& g, TileParams* p, DType dtype, const void* grad,
                         cudaStream_t stream) {
  switch (dtype) {
    case kFloat16: return BlockSquaresT<__half>(g, p, grad, stream);
    case kBFloat16: return BlockSquaresT<__nv_bfloat16>(g, p, grad, stream);
    default: return BlockSquaresT<float>(g, p, grad, stream);
  }
}

// The length of a call's norms (`what`, `count` of them): with block_scale one per rotation
// block, on the device; without, one (count 0 or 1).
std::string CheckCount(const Code& code, const Geometry& g, uint64_t count, const void* dev,
                       const char* what) {
  if (!code.block_scale) {
    if (count > 1)
      return std::string("thc.cuda: ") + what + " of " + std::to_string(count) +
             " values, but block_scale is off (one max norm a partition)";
    return "";
  }
  const std::string blocks = "d=" + std::to_string(g.d) + " in rotation blocks of " +
                             std::to_string(g.block) + " has " + std::to_string(g.blocks) +
                             " blocks";
  if (!dev)
    return std::string("thc.cuda: block_scale: ") + what + " must be a device array of one per " +
           "rotation block (" + blocks + ")";
  if (count != g.blocks)
    return std::string("thc.cuda: block_scale: ") + what + " of " + std::to_string(count) +
           " values, but " + blocks + " (one each)";
  return "";
}

std::string CheckSizes(const Code& code, uint64_t d, Geometry* g) {
  const std::string bad = ValidateCode(code);
  if (!bad.empty()) return bad;
  if (d < 1) return "thc.cuda: a partition needs at least one element (d=0)";
  *g = MakeGeometry(code, d);
  if (g->padded > (uint64_t{1} << 32))
    return "thc.cuda: d=" + std::to_string(d) + " pads to more than 2^32 coordinates";
  return "";
}

}  // namespace

std::string ValidateCode(const Code& code) {
  if (code.bits < 1 || code.bits > 8)
    return "thc.cuda: bits=" + std::to_string(code.bits) + " must be in 1..8";
  const uint32_t K = 1u << code.bits;
  if (code.granularity < K - 1 || code.granularity > (1u << 24) - 1)
    return "thc.cuda: granularity=" + std::to_string(code.granularity) +
           " must be in [2^bits - 1, 2^24 - 1]";
  if (!(code.clip > 0) || !std::isfinite(code.clip))
    return "thc.cuda: clip=" + std::to_string(code.clip) + " must be finite and > 0";
  if (code.rotation_block & (code.rotation_block - 1))
    return "thc.cuda: rotation_block=" + std::to_string(code.rotation_block) +
           " must be 0 or a power of two";
  if (code.block_scale && code.rotation_block && code.rotation_block < kMinScaleBlock)
    return "thc.cuda: block_scale needs rotation blocks of at least " +
           std::to_string(kMinScaleBlock) +
           " coordinates, got rotation_block=" + std::to_string(code.rotation_block);
  if (code.fused_max_log != detail::kSmallTile && code.fused_max_log != detail::kLargeTile)
    return "thc.cuda: fused_max_log must be 12 or 14";
  if (code.chunk_log < 15 || code.chunk_log > 32) return "thc.cuda: chunk_log must be in 15..32";
  if (code.column_max_bits < 1 || code.column_max_bits > 11)
    return "thc.cuda: column_max_bits must be in 1..11";
  if (code.table[0] != 0 || code.table[K - 1] != code.granularity)
    return "thc.cuda: table must start at 0 and end at granularity";
  for (uint32_t i = 0; i + 1 < K; ++i) {
    if (code.table[i + 1] <= code.table[i]) return "thc.cuda: table must be strictly increasing";
  }
  return "";
}

Geometry MakeGeometry(const Code& code, uint64_t d) {
  Geometry g;
  g.d = d;
  uint64_t whole = 1;
  while (whole < d) whole <<= 1;
  g.block = code.rotation_block && code.rotation_block < whole ? code.rotation_block : whole;
  g.padded = (d + g.block - 1) / g.block * g.block;
  g.payload_bytes = (g.padded * static_cast<uint64_t>(code.bits) + 7) / 8;
  g.blocks = g.padded / g.block;
  g.log_block = Log2(g.block);
  return g;
}

int SumBits(const Code& code, uint32_t num_workers) {
  uint64_t top = static_cast<uint64_t>(num_workers) * code.granularity;
  int bits = 0;
  for (; top; top >>= 1) ++bits;
  return bits <= 32 ? bits : 0;
}

int LaneBits(const Code& code, uint32_t num_workers) {
  const uint64_t top = static_cast<uint64_t>(num_workers) * code.granularity;
  if (top <= 0xFFu) return 8;
  if (top <= 0xFFFFu) return 16;
  if (top <= 0xFFFFFFFFu) return 32;
  return 0;
}

uint64_t WorkspaceFloats(const Code& code, uint64_t d) {
  const Geometry g = MakeGeometry(code, d < 1 ? 1 : d);
  return g.log_block <= code.fused_max_log ? 0 : ChunkLen(code, g);
}

// The workspace check shared by the launchers that may run several passes.
static std::string CheckWorkspace(const Code& code, const Geometry& g, const float* ws,
                                  const char* what) {
  const Plan plan = MakePlan(code, g);
  if (plan.n > 1 && (reinterpret_cast<uintptr_t>(ws) & 15))
    return "thc.cuda: the workspace must be 16-byte aligned";
  if (plan.n > 1 && !ws)
    return std::string("thc.cuda: ") + what + " of a block of 2^" + std::to_string(g.log_block) +
           " needs a workspace of " + std::to_string(WorkspaceFloats(code, g.d)) + " floats";
  return "";
}

std::string LaunchNorm(const Code& code, const NormArgs& a, cudaStream_t stream) {
  if (!a.grad || !a.norm || !a.status) return "thc.cuda: norm needs grad, norm and status";
  if (a.d < 1) return "thc.cuda: a partition needs at least one element (d=0)";
  if (a.dtype != kFloat32 && a.dtype != kFloat16 && a.dtype != kBFloat16)
    return "thc.cuda: unknown dtype " + std::to_string(a.dtype);
  if (!a.residual && !code.block_scale) {
    if (a.norm_count > 1) return CheckCount(code, Geometry{}, a.norm_count, a.norm, "norm");
    const cudaError_t err = detail::LaunchNormKernels(a, stream);
    return err == cudaSuccess ? "" : Fail("norm launch", err);
  }
  // With error feedback: sqrt(sum_j y_j^2 / B), y = Hu(sign * grad) + r; with block_scale the
  // sums block by block (without error feedback of grad_j^2, and no division).
  Geometry g;
  std::string bad = CheckSizes(code, a.d, &g);
  if (bad.empty()) bad = CheckCount(code, g, a.norm_count, a.norm, "norm");
  if (bad.empty() && a.residual) bad = CheckWorkspace(code, g, a.workspace, "norm");
  if (!bad.empty()) return bad;
  TileParams p;
  BaseParams(code, g, &p);
  p.max_norm = 1.0;  // M plays no part here (the kernels only read it)
  p.status_out = a.status;
  p.res_in = a.residual;
  p.norm_acc = a.norm;
  const uint64_t count = code.block_scale ? g.blocks : 1;
  cudaError_t err = detail::NormBegin(a.norm, count, a.status, stream);
  if (err == cudaSuccess && a.residual)
    err = RotateDispatch<Dst::kNorm>(code, g, &p, a.dtype, a.grad, nullptr, a.workspace, stream);
  else if (err == cudaSuccess) err = BlockSquares(g, &p, a.dtype, a.grad, stream);
  const double divisor = a.residual ? static_cast<double>(g.block) : 1.0;
  if (err == cudaSuccess) err = detail::NormEnd(a.norm, count, divisor, stream);
  return err == cudaSuccess ? "" : Fail("norm launch", err);
}

std::string LaunchEncode(const Code& code, const EncodeArgs& a, cudaStream_t stream) {
  Geometry g;
  std::string bad = CheckSizes(code, a.d, &g);
  if (!bad.empty()) return bad;
  if (!a.grad || !a.payload) return "thc.cuda: encode needs grad and payload";
  if (a.rank >= (1u << 24)) return "thc.cuda: rank=" + std::to_string(a.rank) + " must be < 2^24";
  if (a.step >= (uint64_t{1} << 40)) return "thc.cuda: step must be < 2^40";
  if (a.dtype != kFloat32 && a.dtype != kFloat16 && a.dtype != kBFloat16)
    return "thc.cuda: unknown dtype " + std::to_string(a.dtype);
  bad = CheckWorkspace(code, g, a.workspace, "encode");
  if (bad.empty()) bad = CheckCount(code, g, a.max_norm_count, a.max_norm_dev, "max_norm");
  if (!bad.empty()) return bad;
  TileParams p;
  BaseParams(code, g, &p);
  p.round_key = detail::RoundKey(code.seed, a.rank, a.step);
  p.max_norm_dev = a.max_norm_dev;
  p.max_norm = a.max_norm;
  p.status = a.status;
  p.status_out = a.status_out;
  p.res_in = a.residual;
  p.res_out = a.residual;
  cudaError_t err = cudaSuccess;
  if (code.block_scale)
    err = detail::LaunchScaleCheck<Src::kGrad, Dst::kQuant>(p, g.blocks, stream);
  if (err == cudaSuccess)
    err = RotateDispatch<Dst::kQuant>(code, g, &p, a.dtype, a.grad, a.payload, a.workspace, stream);
  return err == cudaSuccess ? "" : Fail("encode launch", err);
}

std::string LaunchAggregate(const Code& code, const AggregateArgs& a, cudaStream_t stream) {
  Geometry g;
  std::string bad = CheckSizes(code, a.d, &g);
  if (!bad.empty()) return bad;
  if (a.lane_bits != 8 && a.lane_bits != 16 && a.lane_bits != 32)
    return "thc.cuda: lane_bits=" + std::to_string(a.lane_bits) + " must be 8, 16 or 32";
  if (!a.sums || (a.count > 0 && !a.payloads)) return "thc.cuda: aggregate needs payloads and sums";
  if (a.count > 1 && a.stride < g.payload_bytes)
    return "thc.cuda: payload stride " + std::to_string(a.stride) + " < payload bytes " +
           std::to_string(g.payload_bytes);
  const cudaError_t err = detail::LaunchAggregateKernel(code, a, g.padded, stream);
  return err == cudaSuccess ? "" : Fail("aggregate launch", err);
}

std::string LaunchDecode(const Code& code, const DecodeArgs& a, cudaStream_t stream) {
  Geometry g;
  std::string bad = CheckSizes(code, a.d, &g);
  if (!bad.empty()) return bad;
  if (!a.sums || (!a.out && !a.out_cast)) return "thc.cuda: decode needs sums and an output";
  if (a.num_workers < 1) return "thc.cuda: num_workers must be >= 1";
  const int lanes = LaneBits(code, a.num_workers);
  if (lanes == 0) return "thc.cuda: num_workers * granularity does not fit 32 bits";
  if (a.sum_bits != 0 && a.sum_bits != SumBits(code, a.num_workers))
    return "thc.cuda: sum_bits=" + std::to_string(a.sum_bits) + " but " +
           std::to_string(a.num_workers) + " workers' sums need " +
           std::to_string(SumBits(code, a.num_workers));
  if (a.sum_bits == 0 && a.lane_bits != lanes)
    return "thc.cuda: lane_bits=" + std::to_string(a.lane_bits) + " but " +
           std::to_string(a.num_workers) + " workers need " + std::to_string(lanes);
  if (a.out_cast && a.out_dtype != kFloat32 && a.out_dtype != kFloat16 && a.out_dtype != kBFloat16)
    return "thc.cuda: unknown out_dtype " + std::to_string(a.out_dtype);
  bad = CheckWorkspace(code, g, a.workspace, "decode");
  if (bad.empty()) bad = CheckCount(code, g, a.max_norm_count, a.max_norm_dev, "max_norm");
  if (!bad.empty()) return bad;
  TileParams p;
  BaseParams(code, g, &p);
  p.num_workers = a.num_workers;
  p.max_norm_dev = a.max_norm_dev;
  p.max_norm = a.max_norm;
  p.status = a.status;
  p.status_out = a.status_out;
  p.sum_bits = a.sum_bits;
  cudaError_t err = cudaSuccess;
  if (code.block_scale) {
    err = detail::LaunchScaleCheck<Src::kSums, Dst::kOut>(p, g.blocks, stream);
    if (err != cudaSuccess) return Fail("decode launch", err);
  }
  switch (a.sum_bits ? 0 : a.lane_bits) {
    case 0: err = DecodeT<PackedSums>(code, g, &p, a, stream); break;
    case 8: err = DecodeT<uint8_t>(code, g, &p, a, stream); break;
    case 16: err = DecodeT<uint16_t>(code, g, &p, a, stream); break;
    default: err = DecodeT<uint32_t>(code, g, &p, a, stream); break;
  }
  return err == cudaSuccess ? "" : Fail("decode launch", err);
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

std::string DeviceName(int dev) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

}  // namespace cuda
}  // namespace thc
