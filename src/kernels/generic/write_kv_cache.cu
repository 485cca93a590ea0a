// write_kv_cache: scatter new tokens (kv_c [T, 512] | k_pe [T, 64]) into a paged latent cache
// at slot_mapping[t], in one of three formats: bf16 copy, fp8 per-tensor (fp8(x * inverse),
// inverse = 1 / scale rounded once on the host), or the 656-byte ds_mla layout (per 128
// latent values s = max(amax / 448, FLT_MIN), fp8(x * (1 / s)), scales as float32, rope as
// bf16). Conversions are single hardware instructions (convert.cuh).
// Tiling: 256-thread blocks. bf16: one warp per token, the 72 16-byte chunks of its row go
// 3 to lanes 0..7, 2 to the others. fp8: one warp per 4 tokens, 288 pieces of 8 values, 9 per
// lane. ds_mla: one warp per token, lane l quantises latent values [16 l, 16 l + 16) (each
// 128-group is 8 lanes), lanes 0..7 also take 8 rope values.
// Pipeline: every lane issues all its loads before converting and storing (bf16 48, fp8 144,
// ds_mla 48 bytes per lane in flight); the ds_mla group amax is a 3-step xor shuffle within
// the 8 lanes of the group, no shared memory. The slot index loads alongside the data and is
// tested only before the stores, so its latency is hidden.
// Limits: rows whose address is not 16-byte aligned take a byte-access fallback (correct,
// slower); slot < 0 skips the token without touching the cache; slots are trusted on the
// device (the CPU path checks them).
#include <cfloat>

#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/convert.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kTokensPerBlock = kThreads / kWarpSize;

struct WriteArgs {
  const uint8_t* kv_c;
  int64_t kv_c_row_bytes;
  const uint8_t* k_pe;
  int64_t k_pe_row_bytes;
  const void* slots;
  int64_t slot_stride;
  bool slots_int64;
  uint8_t* cache;
  int64_t page_bytes;
  int64_t token_bytes;
  int page_shift;  // log2(page_size)
  int64_t tokens;
  float inverse_scale;  // fp8 per-tensor format: 1 / scale, rounded once on the host
};

// The cache row of this warp's token, or null when the token is skipped (or past the end).
__device__ __forceinline__ uint8_t* token_row(const WriteArgs& args, int64_t token) {
  if (token >= args.tokens) return nullptr;
  int64_t slot = args.slots_int64
                     ? static_cast<const int64_t*>(args.slots)[token * args.slot_stride]
                     : static_cast<const int32_t*>(args.slots)[token * args.slot_stride];
  if (slot < 0) return nullptr;
  int64_t page = slot >> args.page_shift;
  int64_t offset = slot & ((int64_t(1) << args.page_shift) - 1);
  return args.cache + page * args.page_bytes + offset * args.token_bytes;
}

__device__ __forceinline__ int64_t warp_token() {
  return int64_t(blockIdx.x) * kTokensPerBlock + threadIdx.x / kWarpSize;
}

// 576 bf16 = 72 chunks: chunks 0..63 come from kv_c, 64..71 from k_pe.
__global__ void __launch_bounds__(kThreads) write_bf16_kernel(WriteArgs args) {
  const int64_t token = warp_token();
  if (token >= args.tokens) return;
  // Issued now, tested only before the stores: the slot's latency overlaps the data loads.
  uint8_t* row = token_row(args, token);
  const int lane = threadIdx.x % kWarpSize;
  constexpr int kChunks = kHeadDim * 2 / kChunkBytes;
  constexpr int kLatentChunks = kLatentDim * 2 / kChunkBytes;
  const uint8_t* kv_c = args.kv_c + token * args.kv_c_row_bytes;
  const uint8_t* k_pe = args.k_pe + token * args.k_pe_row_bytes;
  uint4 data[3];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    int chunk = lane + k * kWarpSize;
    if (chunk < kLatentChunks) {
      data[k] = load_chunk(kv_c + chunk * kChunkBytes);
    } else if (chunk < kChunks) {
      data[k] = load_chunk(k_pe + (chunk - kLatentChunks) * kChunkBytes);
    }
  }
  if (row == nullptr) return;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    int chunk = lane + k * kWarpSize;
    if (chunk < kChunks) store_chunk(row + chunk * kChunkBytes, data[k]);
  }
}

// fp8: a warp quantises 4 consecutive tokens, 72 pieces of 8 values each (16 input bytes, 8
// output bytes): 288 pieces, 9 per lane, so every lane does the same work. Pieces 0..63 of a
// token come from kv_c, 64..71 from k_pe.
constexpr int kFp8TokensPerWarp = 4;
constexpr int kFp8TokensPerBlock = kTokensPerBlock * kFp8TokensPerWarp;
constexpr int kPieceValues = 8;
constexpr int kPiecesPerToken = kHeadDim / kPieceValues;                           // 72
constexpr int kPiecesPerLane = kFp8TokensPerWarp * kPiecesPerToken / kWarpSize;    // 9
static_assert(kFp8TokensPerWarp * kPiecesPerToken % kWarpSize == 0, "pieces split evenly");

template <bool kFp16>
__global__ void __launch_bounds__(kThreads) write_fp8_kernel(WriteArgs args) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first_token = warp_token() * kFp8TokensPerWarp;
  // Data loads first (they need only the token count), slots after: the latencies overlap.
  uint4 data[kPiecesPerLane];
#pragma unroll
  for (int k = 0; k < kPiecesPerLane; ++k) {
    const int piece = lane + k * kWarpSize;
    const int64_t token = first_token + piece / kPiecesPerToken;  // compile-time divisor
    const int column = (piece % kPiecesPerToken) * kPieceValues;
    if (token >= args.tokens) continue;
    data[k] = column < kLatentDim
                  ? load_chunk(args.kv_c + token * args.kv_c_row_bytes + column * 2)
                  : load_chunk(args.k_pe + token * args.k_pe_row_bytes + (column - kLatentDim) * 2);
  }
  uint8_t* rows[kFp8TokensPerWarp];
#pragma unroll
  for (int i = 0; i < kFp8TokensPerWarp; ++i) rows[i] = token_row(args, first_token + i);
#pragma unroll
  for (int k = 0; k < kPiecesPerLane; ++k) {
    const int piece = lane + k * kWarpSize;
    const int token_in_warp = piece / kPiecesPerToken;
    const int column = (piece % kPiecesPerToken) * kPieceValues;
    // A select chain, not rows[token_in_warp]: a runtime index would put rows in local memory.
    uint8_t* row = token_in_warp == 0 ? rows[0] : token_in_warp == 1 ? rows[1]
                 : token_in_warp == 2 ? rows[2] : rows[3];
    if (row != nullptr) store_half_chunk(row + column, quantize_8<kFp16>(data[k], args.inverse_scale));
  }
}

// ds_mla: lane l quantises latent values [16 l, 16 l + 16) of group l / 8; lanes 0..7 copy
// (or round to bf16) 8 rope values each.
template <bool kFp16>
__global__ void __launch_bounds__(kThreads) write_ds_mla_kernel(WriteArgs args) {
  const int64_t token = warp_token();
  if (token >= args.tokens) return;  // whole warps: the shuffles below see every lane
  // Issued now, tested only before the stores: the slot's latency overlaps the data loads.
  uint8_t* row = token_row(args, token);
  const int lane = threadIdx.x % kWarpSize;
  constexpr int kRopeChunks = kRopeDim * 2 / kChunkBytes;  // 8
  constexpr int kLanesPerGroup = kDsMlaGroupSize / 16;     // 8
  const uint8_t* latent = args.kv_c + token * args.kv_c_row_bytes + lane * 2 * kChunkBytes;
  uint4 low = load_chunk(latent);
  uint4 high = load_chunk(latent + kChunkBytes);
  uint4 rope;
  if (lane < kRopeChunks) rope = load_chunk(args.k_pe + token * args.k_pe_row_bytes + lane * kChunkBytes);

  float values[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    values[i] = half_to_float<kFp16>(chunk_half(low, i));
    values[8 + i] = half_to_float<kFp16>(chunk_half(high, i));
  }
  // fmaxf drops NaN operands, so the group maximum does not depend on the reduction order.
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(values[i]));
#pragma unroll
  for (int step = 1; step < kLanesPerGroup; step *= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, step));
  }
  const float scale = fmaxf(__fdiv_rn(amax, kFp8E4M3Max), FLT_MIN);
  const float inverse_scale = __frcp_rn(scale);  // IEEE-rounded, as the host's 1.0f / scale
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    words[w] = fp8x2_from_floats(__fmul_rn(values[4 * w], inverse_scale),
                                 __fmul_rn(values[4 * w + 1], inverse_scale)) |
               fp8x2_from_floats(__fmul_rn(values[4 * w + 2], inverse_scale),
                                 __fmul_rn(values[4 * w + 3], inverse_scale)) << 16;
  }
  if (row == nullptr) return;  // uniform per warp
  store_chunk(row + lane * kChunkBytes, make_uint4(words[0], words[1], words[2], words[3]));
  if (lane % kLanesPerGroup == 0) store_float(row + kDsMlaScaleOffset + 4 * (lane / kLanesPerGroup), scale);
  if (lane < kRopeChunks) {
    if (kFp16) {
      uint32_t pairs[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        pairs[w] = bf16x2_from_floats(fp16_to_float_device(chunk_half(rope, 2 * w)),
                                      fp16_to_float_device(chunk_half(rope, 2 * w + 1)));
      }
      rope = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
    store_chunk(row + kDsMlaRopeOffset + lane * kChunkBytes, rope);
  }
}

}  // namespace

void write_kv_cache(const WriteKvCacheParams& params) {
  const int64_t tokens = params.kv_c.size(0);
  if (tokens == 0) return;
  const TensorView& cache = params.kv_cache;
  const size_t cache_element = dtype_size(cache.dtype);
  WriteArgs args;
  args.kv_c = params.kv_c.ptr<const uint8_t>();
  args.kv_c_row_bytes = params.kv_c.stride(0) * 2;
  args.k_pe = params.k_pe.ptr<const uint8_t>();
  args.k_pe_row_bytes = params.k_pe.stride(0) * 2;
  args.slots = params.slot_mapping.data;
  args.slot_stride = params.slot_mapping.stride(0);
  args.slots_int64 = params.slot_mapping.dtype == DType::kInt64;
  args.cache = cache.ptr<uint8_t>();
  args.page_bytes = cache.stride(0) * int64_t(cache_element);
  args.token_bytes = cache.stride(1) * int64_t(cache_element);
  args.page_shift = log2_of(cache.size(1));
  args.tokens = tokens;
  args.inverse_scale = 1.0f / params.scale;

  const bool fp16_input = params.kv_c.dtype == DType::kFloat16;
  const unsigned blocks = blocks_for(tokens, kTokensPerBlock);
  const unsigned fp8_blocks = blocks_for(tokens, kFp8TokensPerBlock);
  cudaStream_t stream = as_cuda_stream(params.stream);
  if (cache.dtype == DType::kBFloat16) {
    write_bf16_kernel<<<blocks, kThreads, 0, stream>>>(args);
  } else if (cache.size(2) == kHeadDim) {
    if (fp16_input) write_fp8_kernel<true><<<fp8_blocks, kThreads, 0, stream>>>(args);
    else write_fp8_kernel<false><<<fp8_blocks, kThreads, 0, stream>>>(args);
  } else {
    if (fp16_input) write_ds_mla_kernel<true><<<blocks, kThreads, 0, stream>>>(args);
    else write_ds_mla_kernel<false><<<blocks, kThreads, 0, stream>>>(args);
  }
  check_launch("write_kv_cache");
}

}  // namespace openmla::kernels
