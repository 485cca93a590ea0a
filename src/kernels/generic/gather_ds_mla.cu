// gather_ds_mla_cache: read each request's tokens from a paged FP8 ds_mla cache (656 bytes per
// token: 512 fp8 | 4 float32 group scales | 64 bf16 rope) and write them as contiguous BF16
// rows [T, 576]: latent = bf16(fp8 * group scale), rope copied.
// Tiling: one warp per output row, 8 rows per 256-thread block. The row's request comes from
// a binary search of cu_seq_lens (device-resident, so the host cannot tile per request); lane
// l dequantises latent bytes [16 l, 16 l + 16) (one 16-byte load, two 16-byte stores) and
// lanes 0..7 copy 16 rope bytes each.
// Pipeline: the latent, scale and rope loads of a lane are issued together before any store;
// occupancy (64 warps per SM) supplies the memory-level parallelism.
// Limits: rows of out at or past cu_seq_lens[B] are not written; block-table entries and
// lengths are trusted on the device (the CPU path checks them); unaligned rows take the
// byte-access fallback.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;

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

__global__ void __launch_bounds__(kThreads) gather_ds_mla_kernel(GatherArgs args) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= args.rows) return;
  if (row >= args.cu_seq_lens[args.batch * args.cu_seq_lens_stride]) return;
  // The request b with cu_seq_lens[b] <= row < cu_seq_lens[b + 1] (empty requests skipped).
  int64_t low = 0, high = args.batch - 1;
  while (low < high) {
    int64_t middle = (low + high + 1) / 2;
    if (args.cu_seq_lens[middle * args.cu_seq_lens_stride] <= row) low = middle;
    else high = middle - 1;
  }
  const int64_t request = low;
  const int64_t position = row - args.cu_seq_lens[request * args.cu_seq_lens_stride];
  const int64_t page =
      args.block_table[request * args.block_table_row + (position >> args.page_shift)];
  const uint8_t* token = args.cache + page * args.page_bytes +
                         (position & ((int64_t(1) << args.page_shift) - 1)) * args.token_bytes;

  const int lane = threadIdx.x % kWarpSize;
  constexpr int kLanesPerGroup = kDsMlaGroupSize / 16;     // 8
  constexpr int kRopeChunks = kRopeDim * 2 / kChunkBytes;  // 8
  uint4 quantized = load_chunk(token + lane * kChunkBytes);
  float scale = load_float(token + kDsMlaScaleOffset + 4 * (lane / kLanesPerGroup));
  uint4 rope;
  if (lane < kRopeChunks) rope = load_chunk(token + kDsMlaRopeOffset + lane * kChunkBytes);

  uint16_t* out = args.out + row * args.out_row;
  uint16_t halves[2][8];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    halves[i / 8][i % 8] = float_to_bf16(fp8_e4m3_to_float(chunk_byte(quantized, i)) * scale);
  }
  store_chunk(out + lane * 16, pack_halves(halves[0]));
  store_chunk(out + lane * 16 + 8, pack_halves(halves[1]));
  if (lane < kRopeChunks) store_chunk(out + kLatentDim + lane * 8, rope);
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
