// Dense MLA decode, split-KV kernel for narrow tiles: at most 16 query rows (Sq * Hq <= 16, the
// tensor-parallel shards and the latency cases D4 / D5).
//
// Why a second kernel: with 16 rows the 64-row kernel leaves 6 of its 8 warps idle and the
// other two run S = Q K^T as one 36-deep chain of dependent mma per tile, so it is bound by
// one warp's latency, not by memory. Here all 8 warps share every tile:
// Tiling: S is split over the warps by key slice (warp % 4: 8 of the tile's 32 keys) and by
// depth (warp / 4: 288 of the 576 dims), partial scores meet in shared memory; warp 0 runs the
// online softmax (lane = one row, one half of the keys) and writes P as 16-bit values; then
// every warp computes O += P V for its own 64 of the 512 value columns (32 fp32 registers).
// Pipeline: as in split_kernel.cuh (Q once; kStages cp.async stages of 32 keys; FP8 widened in
// shared memory), plus two barriers per tile between the S, softmax and PV phases.
// Limits: rows <= 16 (one tile per request and split); shared memory ~170 KB (1 CTA per SM).
#pragma once

#include "kernels/sm90/dense_decode/split_kernel.cuh"

namespace openmla::kernels::sm90 {

constexpr int kNarrowRows = 16;
constexpr int kNarrowColumns = kLatentDim / (kThreads / 32);  // 64 value columns per warp
constexpr int kScoreStride = kKeysPerTile + 4;                // floats

template <bool kFp8Cache, int kStages>
constexpr int narrow_shared_bytes() {
  const int q_bytes = kNarrowRows * kRowStride * 2;
  const int tile_bytes = kKeysPerTile * kRowStride * 2;
  const int kv_bytes = kFp8Cache ? kStages * kKeysPerTile * kHeadDim + tile_bytes : kStages * tile_bytes;
  const int softmax_bytes = 2 * kNarrowRows * kScoreStride * 4 + kNarrowRows * kProbabilityStride * 2 +
                            3 * kNarrowRows * 4;
  return q_bytes + kv_bytes + softmax_bytes;
}

template <bool kHalf, bool kFp8Q, bool kFp8Cache, int kStages>
__global__ void __launch_bounds__(kThreads, 1) dense_decode_narrow_kernel(SplitArgs args) {
  extern __shared__ __align__(128) uint8_t shared[];
  constexpr int kStageBytes = kFp8Cache ? kKeysPerTile * kHeadDim : kKeysPerTile * kRowStride * 2;
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(shared);
  uint8_t* stages = shared + kNarrowRows * kRowStride * 2;
  uint8_t* after_stages = stages + kStages * kStageBytes;
  uint16_t* widened = reinterpret_cast<uint16_t*>(after_stages);  // fp8 only
  float* scores = reinterpret_cast<float*>(after_stages + (kFp8Cache ? kKeysPerTile * kRowStride * 2 : 0));
  uint16_t* probabilities = reinterpret_cast<uint16_t*>(scores + 2 * kNarrowRows * kScoreStride);
  float* row_rescale = reinterpret_cast<float*>(probabilities + kNarrowRows * kProbabilityStride);
  float* row_sum = row_rescale + kNarrowRows;
  float* row_max = row_sum + kNarrowRows;

  const int split = blockIdx.y, batch_index = blockIdx.z;
  const int rows_here = args.rows;  // <= 16: the whole request is one tile
  const KeyRange range = split_key_range(args, batch_index, split, 0, rows_here);
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, 0, rows_here)) return;

  load_query_tile<kHalf, kFp8Q, kNarrowRows>(args, batch_index, 0, rows_here, q_tile);
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < range.tiles) {
      load_kv_tile<kFp8Cache>(args, table_row, range.begin + stage * kKeysPerTile, range.end,
                              stages + stage * kStageBytes);
    }
    commit_async_copies();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, pair = lane % 4;
  const int key_slice = warp % 4, depth_half = warp / 4;
  // Softmax role (warp 0): row lane / 2, keys 16 (lane % 2) .. +16.
  const int softmax_row = lane / 2, softmax_keys = (lane % 2) * 16;
  const int softmax_visible = row_visible_end(args, range, 0, softmax_row, rows_here);
  float running_max = -INFINITY, running_sum = 0.0f;

  float output[kNarrowColumns / 8][4];
#pragma unroll
  for (int n = 0; n < kNarrowColumns / 8; ++n) output[n][0] = output[n][1] = output[n][2] = output[n][3] = 0.0f;

  for (int tile = 0; tile < range.tiles; ++tile) {
    const uint16_t* keys = next_key_tile<kHalf, kFp8Cache, kStages>(args, table_row, range, tile, stages, widened);

    // Partial S over this warp's 8 keys and 288 dims: two accumulators halve the mma chain.
    float partial[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int step = 0; step < kHeadDim / 32 / 2; ++step) {
      const int k = depth_half * (kHeadDim / 32) + 2 * step;  // first of two 16-deep k steps
      uint32_t a0[4], a1[4], b[4];
      const uint16_t* q_row = q_tile + ((lane % 8) + ((lane / 8) % 2) * 8) * kRowStride + (lane / 16) * 8;
      load_matrix_x4(a0, q_row + k * 16);
      load_matrix_x4(a1, q_row + (k + 1) * 16);
      load_matrix_x4(b, keys + (key_slice * 8 + (lane % 8)) * kRowStride + k * 16 + (lane / 8) * 8);
      mma_16x8x16<kHalf>(partial[0], a0, b[0], b[1]);
      mma_16x8x16<kHalf>(partial[1], a1, b[2], b[3]);
    }
    float* score_rows = scores + depth_half * kNarrowRows * kScoreStride + key_slice * 8 + 2 * pair;
    *reinterpret_cast<float2*>(score_rows + group * kScoreStride) =
        make_float2(partial[0][0] + partial[1][0], partial[0][1] + partial[1][1]);
    *reinterpret_cast<float2*>(score_rows + (group + 8) * kScoreStride) =
        make_float2(partial[0][2] + partial[1][2], partial[0][3] + partial[1][3]);
    __syncthreads();

    if (warp == 0) {
      const int first_key = range.begin + tile * kKeysPerTile + softmax_keys;
      const float* depth0 = scores + softmax_row * kScoreStride + softmax_keys;
      const float* depth1 = depth0 + kNarrowRows * kScoreStride;
      float values[16];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        values[j] = first_key + j < softmax_visible ? (depth0[j] + depth1[j]) * args.logit_scale_log2 : -INFINITY;
        tile_max = fmaxf(tile_max, values[j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float new_max = fmaxf(running_max, tile_max);
      const float reference = new_max == -INFINITY ? 0.0f : new_max;  // keeps exp2 at 0, not NaN
      const float rescale = exp2f(running_max - reference);
      running_max = new_max;
      float tile_sum = 0.0f;
      uint32_t packed[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float first = exp2f(values[2 * j] - reference), second = exp2f(values[2 * j + 1] - reference);
        tile_sum += first + second;
        packed[j] = pack_two<kHalf>(first, second);
      }
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
      running_sum = running_sum * rescale + tile_sum;
      uint4* destination = reinterpret_cast<uint4*>(probabilities + softmax_row * kProbabilityStride + softmax_keys);
      destination[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      destination[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
      if (lane % 2 == 0) row_rescale[softmax_row] = rescale;
    }
    __syncthreads();

    const float rescale_low = row_rescale[group], rescale_high = row_rescale[group + 8];
#pragma unroll
    for (int n = 0; n < kNarrowColumns / 8; ++n) {
      output[n][0] *= rescale_low;
      output[n][1] *= rescale_low;
      output[n][2] *= rescale_high;
      output[n][3] *= rescale_high;
    }
#pragma unroll
    for (int k = 0; k < kKeysPerTile / 16; ++k) {
      uint32_t a[4];
      load_matrix_x4(a, probabilities + ((lane % 8) + ((lane / 8) % 2) * 8) * kProbabilityStride + k * 16 +
                            (lane / 16) * 8);
#pragma unroll
      for (int n2 = 0; n2 < kNarrowColumns / 16; ++n2) {
        uint32_t b[4];
        load_matrix_x4_transposed(b, keys + (k * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kRowStride +
                                         warp * kNarrowColumns + n2 * 16 + (lane / 16) * 8);
        mma_16x8x16<kHalf>(output[2 * n2], a, b[0], b[1]);
        mma_16x8x16<kHalf>(output[2 * n2 + 1], a, b[2], b[3]);
      }
    }
  }
  wait_async_copies<0>();  // nothing may be in flight into shared memory at exit

  if (warp == 0 && lane % 2 == 0) {
    row_sum[softmax_row] = running_sum;
    row_max[softmax_row] = running_max;
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = group + 8 * half;
    if (row >= rows_here) continue;
    const float sum = row_sum[row];
    const bool empty = sum == 0.0f;
    const float normalizer = empty ? 0.0f : args.value_scale / sum;
#pragma unroll
    for (int n = 0; n < kNarrowColumns / 8; ++n) {
      store_value_pair(args, split, batch_index, row, warp * kNarrowColumns + n * 8 + 2 * pair,
                       output[n][2 * half] * normalizer, output[n][2 * half + 1] * normalizer, empty);
    }
    if (warp == 0 && pair == 0) store_row_lse(args, split, batch_index, row, empty ? -INFINITY : row_max[row] + log2f(sum));
  }
}

}  // namespace openmla::kernels::sm90
