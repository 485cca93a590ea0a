// gather_ds_mla_cache: read each request's tokens from a paged FP8 ds_mla cache (656 bytes per
// token: 512 fp8 | 4 float32 group scales | 64 bf16 rope) and write them as contiguous BF16
// rows [T, 576]: latent = bf16(fp8 * group scale), rope copied. Conversions are hardware
// instructions (convert.cuh).
// Tiling: one warp per 8 consecutive output rows, 8 warps (64 rows) per 256-thread block.
// Lanes 0..7 find the request of one row each (binary search of cu_seq_lens, device-resident,
// so the host cannot tile per request) and the token's cache address.
// Pipeline (staged kernel, the usual path): the warp copies its 8 tokens (8 x 656 bytes) into
// shared memory with 16-byte cp.async, waits once, then lane l dequantises latent values
// [8 l, 8 l + 8) and [256 + 8 l, 256 + 8 l + 8) of each row from shared memory and writes
// 16-byte stores (512 contiguous bytes per warp instruction). The copies hold no registers,
// so ~40 warps per SM each keep 5 KiB in flight: that, not the arithmetic, is what a gather
// from scattered pages needs to reach the copy rate (a register-staged version with 3 blocks
// per SM reached 79%).
// Limits: the staged kernel needs a 16-byte-aligned cache (base, page and token strides);
// other views take the register kernel with byte-access fallbacks. Rows of out at or past
// cu_seq_lens[B] are not written; block-table entries and lengths are trusted on the device
// (the CPU path checks them).
#include "kernels/async_copy.cuh"
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/convert.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerWarp = 8;
constexpr int kRowsPerBlock = kThreads / kWarpSize * kRowsPerWarp;

struct GatherArgs {
  const uint8_t* cache;
  int64_t page_bytes;
  int64_t token_bytes;
  int page_shift;  // log2(page_size)
  const int32_t* block_table;
  int64_t block_table_row;
  const int32_t* cu_seq_lens;
  int64_t cu_seq_lens_stride;
  int64_t batch;
  uint16_t* out;
  int64_t out_row;
  int64_t rows;
};

// The cache address of output row `row`, or null when the row is past the written rows.
__device__ __forceinline__ const uint8_t* row_token(const GatherArgs& args, int64_t row) {
  if (row >= args.rows || row >= args.cu_seq_lens[args.batch * args.cu_seq_lens_stride]) {
    return nullptr;
  }
  // The request b with cu_seq_lens[b] <= row < cu_seq_lens[b + 1] (empty requests skipped).
  int64_t low = 0, high = args.batch - 1;
  while (low < high) {
    int64_t middle = (low + high + 1) / 2;
    if (args.cu_seq_lens[middle * args.cu_seq_lens_stride] <= row) low = middle;
    else high = middle - 1;
  }
  const int64_t position = row - args.cu_seq_lens[low * args.cu_seq_lens_stride];
  const int64_t page = args.block_table[low * args.block_table_row + (position >> args.page_shift)];
  return args.cache + page * args.page_bytes +
         (position & ((int64_t(1) << args.page_shift) - 1)) * args.token_bytes;
}

// 8 fp8 values (one 8-byte word pair) times their group scale, as 8 bf16 (16 bytes).
__device__ __forceinline__ uint4 dequantize_8(uint2 quantized, float scale) {
  uint32_t pairs[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t word = w < 2 ? quantized.x : quantized.y;
    const float2 values = floats_from_fp8x2(word >> (16 * (w % 2)));
    pairs[w] = bf16x2_from_floats(__fmul_rn(values.x, scale), __fmul_rn(values.y, scale));
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

__global__ void __launch_bounds__(kThreads) gather_ds_mla_kernel(GatherArgs args) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first_row =
      (int64_t(blockIdx.x) * (kThreads / kWarpSize) + threadIdx.x / kWarpSize) * kRowsPerWarp;
  const uint8_t* own_token = lane < kRowsPerWarp ? row_token(args, first_row + lane) : nullptr;
  const uint8_t* tokens[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    tokens[r] = reinterpret_cast<const uint8_t*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(own_token), r));
  }

  // Latent halves: values [8 lane, 8 lane + 8) and [256 + 8 lane, ...); group = value / 128.
  constexpr int kHalf = kLatentDim / 2;
  const int group_low = (8 * lane) / kDsMlaGroupSize;
  const int group_high = (kHalf + 8 * lane) / kDsMlaGroupSize;
  constexpr int kRopeChunks = kRopeDim * 2 / kChunkBytes;  // 8 per row
  static_assert(kRowsPerWarp * kRopeChunks == 2 * kWarpSize, "two rope chunks per lane");

  uint2 low[kRowsPerWarp], high[kRowsPerWarp];
  float scale_low[kRowsPerWarp], scale_high[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (tokens[r] == nullptr) continue;
    low[r] = load_half_chunk(tokens[r] + 8 * lane);
    high[r] = load_half_chunk(tokens[r] + kHalf + 8 * lane);
    scale_low[r] = load_float(tokens[r] + kDsMlaScaleOffset + 4 * group_low);
    scale_high[r] = load_float(tokens[r] + kDsMlaScaleOffset + 4 * group_high);
  }
  // Rope chunk c of the warp's 64 (row c / 8, chunk c % 8): lane takes c = lane and lane + 32.
  uint4 rope[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int chunk = lane + k * kWarpSize;
    const uint8_t* token = tokens[0];
#pragma unroll
    for (int r = 1; r < kRowsPerWarp; ++r) token = (chunk / kRopeChunks == r) ? tokens[r] : token;
    if (token != nullptr) rope[k] = load_chunk(token + kDsMlaRopeOffset + (chunk % kRopeChunks) * kChunkBytes);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (tokens[r] == nullptr) continue;
    uint16_t* out = args.out + (first_row + r) * args.out_row;
    store_chunk(out + 8 * lane, dequantize_8(low[r], scale_low[r]));
    store_chunk(out + kHalf + 8 * lane, dequantize_8(high[r], scale_high[r]));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int chunk = lane + k * kWarpSize;
    const int row = chunk / kRopeChunks;
    const uint8_t* token = tokens[0];
#pragma unroll
    for (int r = 1; r < kRowsPerWarp; ++r) token = (row == r) ? tokens[r] : token;
    if (token != nullptr) {
      store_chunk(args.out + (first_row + row) * args.out_row + kLatentDim + (chunk % kRopeChunks) * 8,
                  rope[k]);
    }
  }
}


constexpr int kPiecesPerToken = kDsMlaBytesPerToken / kChunkBytes;  // 41
static_assert(kDsMlaBytesPerToken % kChunkBytes == 0, "tokens are whole 16-byte pieces");

__global__ void __launch_bounds__(kThreads) gather_ds_mla_staged_kernel(GatherArgs args) {
  __shared__ __align__(16) uint8_t staged[kThreads / kWarpSize][kRowsPerWarp][kDsMlaBytesPerToken];
  __shared__ const uint8_t* warp_tokens[kThreads / kWarpSize][kRowsPerWarp];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t first_row = (int64_t(blockIdx.x) * (kThreads / kWarpSize) + warp) * kRowsPerWarp;
  if (lane < kRowsPerWarp) warp_tokens[warp][lane] = row_token(args, first_row + lane);
  __syncwarp();

  for (int piece = lane; piece < kRowsPerWarp * kPiecesPerToken; piece += kWarpSize) {
    const int row = piece / kPiecesPerToken, offset = (piece % kPiecesPerToken) * kChunkBytes;
    const uint8_t* token = warp_tokens[warp][row];
    if (token != nullptr) copy_async_16(&staged[warp][row][offset], token + offset);
  }
  commit_async_copies();
  wait_async_copies<0>();
  __syncwarp();

  constexpr int kHalf = kLatentDim / 2;
  const int group_low = (8 * lane) / kDsMlaGroupSize;
  const int group_high = (kHalf + 8 * lane) / kDsMlaGroupSize;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (warp_tokens[warp][r] == nullptr) continue;  // uniform across the warp
    const uint8_t* token = staged[warp][r];
    const float* scales = reinterpret_cast<const float*>(token + kDsMlaScaleOffset);
    uint16_t* out = args.out + (first_row + r) * args.out_row;
    store_chunk(out + 8 * lane,
                dequantize_8(*reinterpret_cast<const uint2*>(token + 8 * lane), scales[group_low]));
    store_chunk(out + kHalf + 8 * lane, dequantize_8(*reinterpret_cast<const uint2*>(token + kHalf + 8 * lane),
                                                     scales[group_high]));
  }
  constexpr int kRopeChunks = kRopeDim * 2 / kChunkBytes;  // 8 per row
#pragma unroll
  for (int k = 0; k < kRowsPerWarp * kRopeChunks / kWarpSize; ++k) {
    const int chunk = lane + k * kWarpSize;
    const int row = chunk / kRopeChunks, piece = chunk % kRopeChunks;
    if (warp_tokens[warp][row] == nullptr) continue;
    store_chunk(args.out + (first_row + row) * args.out_row + kLatentDim + piece * 8,
                *reinterpret_cast<const uint4*>(&staged[warp][row][kDsMlaRopeOffset + piece * kChunkBytes]));
  }
}

}  // namespace

void gather_ds_mla_cache(const GatherDsMlaCacheParams& params) {
  const int64_t rows = params.out.size(0);
  const int64_t batch = params.block_table.size(0);
  if (rows == 0 || batch == 0) return;
  GatherArgs args;
  args.cache = params.kv_cache.ptr<const uint8_t>();
  args.page_bytes = params.kv_cache.stride(0);  // 1-byte elements
  args.token_bytes = params.kv_cache.stride(1);
  args.page_shift = log2_of(params.kv_cache.size(1));
  args.block_table = params.block_table.ptr<const int32_t>();
  args.block_table_row = params.block_table.stride(0);
  args.cu_seq_lens = params.cu_seq_lens.ptr<const int32_t>();
  args.cu_seq_lens_stride = params.cu_seq_lens.stride(0);
  args.batch = batch;
  args.out = params.out.ptr<uint16_t>();
  args.out_row = params.out.stride(0);
  args.rows = rows;
  const bool aligned = reinterpret_cast<uintptr_t>(args.cache) % kChunkBytes == 0 &&
                       args.page_bytes % kChunkBytes == 0 && args.token_bytes % kChunkBytes == 0;
  const unsigned blocks = blocks_for(rows, kRowsPerBlock);
  if (aligned) {
    gather_ds_mla_staged_kernel<<<blocks, kThreads, 0, as_cuda_stream(params.stream)>>>(args);
  } else {
    gather_ds_mla_kernel<<<blocks, kThreads, 0, as_cuda_stream(params.stream)>>>(args);
  }
  check_launch("gather_ds_mla_cache");
}

}  // namespace openmla::kernels
