// gather_ds_mla_cache: read each request's tokens from a paged FP8 ds_mla cache (656 bytes per
// token: 512 fp8 | 4 float32 group scales | 64 bf16 rope) and write them as contiguous BF16
// rows [T, 576]: latent = bf16(fp8 * group scale), rope copied. Conversions are hardware
// instructions (convert.cuh).
// Tiling: one warp per 4 consecutive output rows, 8 warps (32 rows) per 256-thread block.
// Lanes 0..3 find the request of one row each (binary search of cu_seq_lens, device-resident,
// so the host cannot tile per request) and the token's cache address, then share the four
// addresses by shuffle. Lane l dequantises latent bytes [16 l, 16 l + 16) of all four rows
// and copies rope chunk l % 8 of row l / 8 (4 rows x 8 chunks = 32 lanes).
// Pipeline: the four rows' searches run in parallel lanes, then every lane issues all its
// loads (four 16-byte latent chunks, four scales, one rope chunk) before any conversion or
// store: 84 bytes per lane, ~170 KiB per SM in flight.
// Limits: rows of out at or past cu_seq_lens[B] are not written; block-table entries and
// lengths are trusted on the device (the CPU path checks them); unaligned rows take the
// byte-access fallback.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/convert.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerWarp = 4;
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

  constexpr int kLanesPerGroup = kDsMlaGroupSize / 16;     // 8
  constexpr int kRopeChunks = kRopeDim * 2 / kChunkBytes;  // 8
  static_assert(kRowsPerWarp * kRopeChunks == kWarpSize, "one rope chunk per lane");
  const int rope_row = lane / kRopeChunks, rope_chunk = lane % kRopeChunks;
  // A select chain, not tokens[rope_row]: a runtime index would put tokens in local memory.
  const uint8_t* rope_token = rope_row == 0 ? tokens[0] : rope_row == 1 ? tokens[1]
                            : rope_row == 2 ? tokens[2] : tokens[3];
  uint4 quantized[kRowsPerWarp];
  float scales[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (tokens[r] == nullptr) continue;
    quantized[r] = load_chunk(tokens[r] + lane * kChunkBytes);
    scales[r] = load_float(tokens[r] + kDsMlaScaleOffset + 4 * (lane / kLanesPerGroup));
  }
  uint4 rope;
  if (rope_token != nullptr) rope = load_chunk(rope_token + kDsMlaRopeOffset + rope_chunk * kChunkBytes);

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (tokens[r] == nullptr) continue;
    uint32_t pairs[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const float2 values = floats_from_fp8x2(chunk_word(quantized[r], w / 2) >> (16 * (w % 2)));
      pairs[w] = bf16x2_from_floats(__fmul_rn(values.x, scales[r]), __fmul_rn(values.y, scales[r]));
    }
    uint16_t* out = args.out + (first_row + r) * args.out_row + lane * 16;
    store_chunk(out, make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]));
    store_chunk(out + 8, make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]));
  }
  if (rope_token != nullptr) {
    store_chunk(args.out + (first_row + rope_row) * args.out_row + kLatentDim + rope_chunk * 8, rope);
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
  gather_ds_mla_kernel<<<blocks_for(rows, kRowsPerBlock), kThreads, 0,
                         as_cuda_stream(params.stream)>>>(args);
  check_launch("gather_ds_mla_cache");
}

}  // namespace openmla::kernels
