// write_kv_cache: scatter new tokens (kv_c [T, 512] | k_pe [T, 64]) into a paged latent cache
// at slot_mapping[t], in one of three formats: bf16 copy, fp8 per-tensor (fp8(x / scale)), or
// the 656-byte ds_mla layout (per 128 latent values s = max(amax / 448, FLT_MIN), fp8(x / s),
// scales as float32, rope as bf16).
// Tiling: one warp per token, 8 tokens per 256-thread block; each lane owns 16-byte chunks of
// the token's cache row (bf16: 72 chunks, lanes take 3; fp8: 36 chunks of 16 values; ds_mla:
// lane l quantises latent values [16 l, 16 l + 16), so each 128-group is 8 lanes).
// Pipeline: every lane issues all its 16-byte loads before converting and storing, so each
// warp keeps up to 96 bytes per lane in flight; the ds_mla group amax is a 3-step xor shuffle
// within the 8 lanes of the group, no shared memory.
// Limits: rows whose address is not 16-byte aligned take a byte-access fallback (correct,
// slower); slot < 0 skips the token without touching the cache; slots are trusted on the
// device (the CPU path checks them).
#include <cfloat>

#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/vector_access.cuh"

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
  float scale;
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
  uint8_t* row = token_row(args, token);
  if (row == nullptr) return;
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
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    int chunk = lane + k * kWarpSize;
    if (chunk < kChunks) store_chunk(row + chunk * kChunkBytes, data[k]);
  }
}

// 576 fp8 = 36 chunks of 16 values: chunks 0..31 from kv_c, 32..35 from k_pe.
template <bool kFp16>
__global__ void __launch_bounds__(kThreads) write_fp8_kernel(WriteArgs args) {
  const int64_t token = warp_token();
  uint8_t* row = token_row(args, token);
  if (row == nullptr) return;
  const int lane = threadIdx.x % kWarpSize;
  constexpr int kInputChunkBytes = 2 * kChunkBytes;  // 16 halves per 16 fp8 bytes
  const uint8_t* latent = args.kv_c + token * args.kv_c_row_bytes + lane * kInputChunkBytes;
  uint4 latent_low = load_chunk(latent);
  uint4 latent_high = load_chunk(latent + kChunkBytes);
  constexpr int kRopeChunks = kRopeDim / 16;
  uint4 rope_low, rope_high;
  if (lane < kRopeChunks) {
    const uint8_t* rope = args.k_pe + token * args.k_pe_row_bytes + lane * kInputChunkBytes;
    rope_low = load_chunk(rope);
    rope_high = load_chunk(rope + kChunkBytes);
  }
  store_chunk(row + lane * kChunkBytes, quantize_16<kFp16>(latent_low, latent_high, args.scale));
  if (lane < kRopeChunks) {
    store_chunk(row + kLatentDim + lane * kChunkBytes,
                quantize_16<kFp16>(rope_low, rope_high, args.scale));
  }
}

// ds_mla: lane l quantises latent values [16 l, 16 l + 16) of group l / 8; lanes 0..7 copy
// (or round to bf16) 8 rope values each.
template <bool kFp16>
__global__ void __launch_bounds__(kThreads) write_ds_mla_kernel(WriteArgs args) {
  const int64_t token = warp_token();
  uint8_t* row = token_row(args, token);
  if (row == nullptr) return;
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
  const float scale = fmaxf(amax / kFp8E4M3Max, FLT_MIN);
  uint8_t bytes[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) bytes[i] = float_to_fp8_e4m3(values[i] / scale);
  store_chunk(row + lane * kChunkBytes, pack_bytes(bytes));
  if (lane % kLanesPerGroup == 0) store_float(row + kDsMlaScaleOffset + 4 * (lane / kLanesPerGroup), scale);
  if (lane < kRopeChunks) {
    if (kFp16) {
      uint16_t halves[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) halves[i] = float_to_bf16(fp16_to_float(chunk_half(rope, i)));
      rope = pack_halves(halves);
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
  args.scale = params.scale;

  const bool fp16_input = params.kv_c.dtype == DType::kFloat16;
  const unsigned blocks = blocks_for(tokens, kTokensPerBlock);
  cudaStream_t stream = as_cuda_stream(params.stream);
  if (cache.dtype == DType::kBFloat16) {
    write_bf16_kernel<<<blocks, kThreads, 0, stream>>>(args);
  } else if (cache.size(2) == kHeadDim) {
    if (fp16_input) write_fp8_kernel<true><<<blocks, kThreads, 0, stream>>>(args);
    else write_fp8_kernel<false><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    if (fp16_input) write_ds_mla_kernel<true><<<blocks, kThreads, 0, stream>>>(args);
    else write_ds_mla_kernel<false><<<blocks, kThreads, 0, stream>>>(args);
  }
  check_launch("write_kv_cache");
}

}  // namespace openmla::kernels
