// Dense MLA decode, split-KV attention kernel (first Hopper version: mma.sync tensor cores,
// cp.async pipeline).
//
// What: for one request b, one tile of 64 query rows and one KV split, the softmax attention
// of the rows over the split's keys: S = Q K^T (576 dims), P = softmax(S), O = P V (V = the
// first 512 dims of the same cache rows). Query rows are the request's Sq tokens x Hq heads
// folded into the M dimension (row m = s * Hq + h), so small head counts still fill 16-row
// tensor-core tiles when Sq > 1.
// Tiling: 256 threads = 8 warps. Warp w owns query rows 16 (w % 4) .. +16 and value columns
// 256 (w / 4) .. +256 (half of the 16 x 512 fp32 output: 128 registers per thread). The two
// warps of a row group split S by keys (16 of the tile's 32 each, 576 deep), trade row maxima
// through shared memory so that both rescale alike, and write their halves of P there, which
// both read back whole for O += P V (a named barrier per pair, not the whole CTA). Warps whose
// 16 rows are all past the tile's last row skip the math (uniform per pair) but still load.
// Pipeline: Q (64 x 576) is loaded once into shared memory; KV tiles of 32 tokens stream
// through kStages shared-memory stages with 16-byte cp.async, page by page through the block
// table, so tile t + kStages - 1 is in flight while tile t is computed. FP8 caches land raw and
// are widened to the 16-bit compute type (exact) in one more shared-memory pass.
// Softmax: online, in base 2 (logits scaled by softmax_scale * descales * log2 e), with the
// -inf guards that keep a row without keys at output 0 and LSE -inf.
// Epilogue: one split writes the 16-bit output and LSE directly; several splits write fp32
// partial outputs and base-2 LSEs to the workspace for the combine kernel.
// Limits: head dim 576 / value dim 512 fixed; Sq * Hq rows are tiled by 64; each row's rows of
// shared memory are padded by 16 bytes so that ldmatrix's 8 row addresses hit distinct banks.
#pragma once

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "kernels/sm90/dense_decode/tensor_core.cuh"
#include "openmla/numerics.h"

namespace openmla::kernels::sm90 {

constexpr int kThreads = 256;
constexpr int kRowsPerTile = 64;    // query rows per CTA (4 row groups of 16)
constexpr int kKeysPerTile = 32;    // KV tokens per pipeline stage
constexpr int kValueHalf = kLatentDim / 2;  // value columns per warp
constexpr int kRowStride = kHeadDim + 8;    // 16-bit elements per shared row (+16 bytes: banks)
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMinKeysPerSplit = 128;
constexpr int kProbabilityStride = kKeysPerTile + 8;  // 16-bit P rows of 80 bytes: ldmatrix conflict-free

struct SplitArgs {
  const uint8_t* q;  // element strides below are in q's own element size
  int64_t q_batch, q_token, q_head;
  const uint8_t* cache;
  int64_t cache_page_bytes, cache_token_bytes;
  const int32_t* block_table;
  int64_t block_table_row;
  const int32_t* seq_lens;
  int64_t seq_lens_stride;
  int page_shift;
  int query_tokens, heads, rows;  // rows = query_tokens * heads
  int splits;
  bool causal;
  float logit_scale_log2;  // softmax_scale * q_descale * kv_scale * log2(e)
  float value_scale;       // kv_scale for an fp8 cache, else 1
  // Direct output (splits == 1).
  uint16_t* out;
  int64_t out_batch, out_token, out_head;
  float* lse;  // null when not requested
  int64_t lse_batch, lse_token, lse_head;
  bool lse_base2;
  // Split outputs (splits > 1): [split][batch][rows][512] and [split][batch][rows], base 2.
  float* partial_out;
  float* partial_lse;
  int batch;
};

template <bool kFp8Cache>
constexpr int cache_bytes_per_token() {
  return kFp8Cache ? kHeadDim : 2 * kHeadDim;
}

template <bool kFp8Cache, int kStages>
constexpr int shared_bytes() {
  const int q_bytes = kRowsPerTile * kRowStride * 2;
  const int tile_bytes = kKeysPerTile * kRowStride * 2;
  // The two warps of a row group trade row maxima, P and row sums through shared memory.
  const int exchange_bytes = 2 * kRowsPerTile * 4 + kRowsPerTile * kProbabilityStride * 2 + 2 * kRowsPerTile * 4;
  // FP8: raw stages of 32 x 576 bytes, plus one widened 16-bit tile for the math.
  return (kFp8Cache ? q_bytes + kStages * kKeysPerTile * kHeadDim + tile_bytes : q_bytes + kStages * tile_bytes) +
         exchange_bytes;
}

// Issues the cp.async copies of KV tile `first_key .. +32` (keys >= key_end are zero-filled,
// so that masked keys multiply finite zeros, never stale NaN) into `stage`.
template <bool kFp8Cache>
__device__ __forceinline__ void load_kv_tile(const SplitArgs& args, const int32_t* table_row,
                                             int first_key, int key_end, uint8_t* stage) {
  constexpr int kTokenBytes = cache_bytes_per_token<kFp8Cache>();
  constexpr int kPieces = kTokenBytes / 16;                   // 72 (16-bit) or 36 (fp8)
  constexpr int kThreadsPerToken = kThreads / kKeysPerTile;   // 8
  constexpr int kStageRowBytes = kFp8Cache ? kHeadDim : kRowStride * 2;
  const int token_in_tile = threadIdx.x / kThreadsPerToken;
  const int key = first_key + token_in_tile;
  uint8_t* destination = stage + token_in_tile * kStageRowBytes;
  if (key < key_end) {
    const int32_t page = table_row[key >> args.page_shift];
    const uint8_t* source = args.cache + int64_t(page) * args.cache_page_bytes +
                            int64_t(key & ((1 << args.page_shift) - 1)) * args.cache_token_bytes;
#pragma unroll
    for (int piece = threadIdx.x % kThreadsPerToken; piece < kPieces; piece += kThreadsPerToken) {
      copy_async_16(destination + piece * 16, source + piece * 16);
    }
  } else {
#pragma unroll
    for (int piece = threadIdx.x % kThreadsPerToken; piece < kPieces; piece += kThreadsPerToken) {
      *reinterpret_cast<uint4*>(destination + piece * 16) = make_uint4(0, 0, 0, 0);
    }
  }
}

// 8 FP8 E4M3 values -> 8 16-bit values (exact: every e4m3 value is a bf16 and an fp16 value).
template <bool kHalf>
__device__ __forceinline__ uint4 widen_fp8x8(uint2 bytes) {
  uint32_t packed[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t word = w < 2 ? bytes.x : bytes.y;
    const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> (16 * (w % 2))), __NV_E4M3);
    const float2 values = __half22float2(*reinterpret_cast<const __half2*>(&pair));
    packed[w] = pack_two<kHalf>(values.x, values.y);
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// FP8 -> 16-bit widening of one raw stage into the math tile (exact: e4m3 fits bf16 and fp16).
template <bool kHalf>
__device__ __forceinline__ void widen_fp8_tile(const uint8_t* raw, uint16_t* tile) {
  constexpr int kUnits = kKeysPerTile * kHeadDim / 8;  // 8 values per unit
  for (int unit = threadIdx.x; unit < kUnits; unit += kThreads) {
    const int token = unit / (kHeadDim / 8), column = (unit % (kHeadDim / 8)) * 8;
    *reinterpret_cast<uint4*>(tile + token * kRowStride + column) =
        widen_fp8x8<kHalf>(*reinterpret_cast<const uint2*>(raw + token * kHeadDim + column));
  }
}

// Q rows of this tile into shared memory as 16-bit values (fp8 q widened exactly; rows past
// the tile's end are zeros).
template <bool kHalf, bool kFp8Q, int kTileRows>
__device__ __forceinline__ void load_query_tile(const SplitArgs& args, int batch_index, int first_row,
                                                int rows_here, uint16_t* q_tile) {
  constexpr int kUnits = kTileRows * kHeadDim / 8;
  for (int unit = threadIdx.x; unit < kUnits; unit += kThreads) {
    const int row = unit / (kHeadDim / 8), column = (unit % (kHeadDim / 8)) * 8;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (row < rows_here) {
      const int m = first_row + row;
      const int64_t offset = batch_index * args.q_batch + (m / args.heads) * args.q_token +
                             (m % args.heads) * args.q_head + column;
      if constexpr (kFp8Q) {
        packed = widen_fp8x8<kHalf>(*reinterpret_cast<const uint2*>(args.q + offset));
      } else {
        packed = *reinterpret_cast<const uint4*>(args.q + 2 * offset);
      }
    }
    *reinterpret_cast<uint4*>(q_tile + row * kRowStride + column) = packed;
  }
}

// The tile's key range for this split: keys [begin, end) of the request, cut into `splits`
// chunks of whole key tiles (kTileKeys), and limited (causal) to what the tile's last row can see.
struct KeyRange {
  int length, begin, end, tiles;
};
template <int kTileKeys = kKeysPerTile>
__device__ __forceinline__ KeyRange split_key_range(const SplitArgs& args, int batch_index, int split,
                                                    int first_row, int rows_here) {
  KeyRange range;
  range.length = args.seq_lens[batch_index * args.seq_lens_stride];
  const int last_token = (first_row + rows_here - 1) / args.heads;
  const int visible_max = args.causal ? min(range.length, range.length - args.query_tokens + last_token + 1)
                                      : range.length;
  // At least kMinKeysPerSplit keys per split: a CTA's fixed cost (Q load, pipeline fill) is
  // worth a few tiles; short requests then leave the last splits empty (they exit at once).
  const int per_split =
      (max((range.length + args.splits - 1) / args.splits, kMinKeysPerSplit) + kTileKeys - 1) / kTileKeys * kTileKeys;
  range.begin = split * per_split;
  range.end = min(visible_max, range.begin + per_split);
  range.tiles = range.end > range.begin ? (range.end - range.begin + kTileKeys - 1) / kTileKeys : 0;
  return range;
}

// Keys query row `row` (tile-local) may attend to: [.., visible) within the split's range.
__device__ __forceinline__ int row_visible_end(const SplitArgs& args, const KeyRange& range, int first_row,
                                               int row, int rows_here) {
  if (row >= rows_here) return 0;
  const int token = (first_row + row) / args.heads;
  return args.causal ? min(range.end, range.length - args.query_tokens + token + 1) : range.end;
}

// Two consecutive output values (already normalised) of row m at `column`: bf16 into out when
// there is one split, fp32 into the split's partial row otherwise (skipped for an empty row:
// the combine step never reads the output of a split whose LSE is -inf).
__device__ __forceinline__ void store_value_pair(const SplitArgs& args, int split, int batch_index, int m,
                                                 int column, float first, float second, bool empty) {
  if (args.splits == 1) {
    uint16_t* out = args.out + batch_index * args.out_batch + (m / args.heads) * args.out_token +
                    (m % args.heads) * args.out_head + column;
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(first, second);
  } else if (!empty) {
    const int64_t partial_row = (int64_t(split) * args.batch + batch_index) * args.rows + m;
    *reinterpret_cast<float2*>(args.partial_out + partial_row * kLatentDim + column) = make_float2(first, second);
  }
}

// The row's LSE (base 2 in): into lse in the requested base, or the split's partial LSE.
__device__ __forceinline__ void store_row_lse(const SplitArgs& args, int split, int batch_index, int m,
                                              float lse2) {
  if (args.splits == 1) {
    if (args.lse != nullptr) {
      args.lse[batch_index * args.lse_batch + (m / args.heads) * args.lse_token + (m % args.heads) * args.lse_head] =
          args.lse_base2 ? lse2 : lse2 / kLog2e;
    }
  } else {
    args.partial_lse[(int64_t(split) * args.batch + batch_index) * args.rows + m] = lse2;
  }
}

// The pipeline step every tile begins with: wait until tile `tile` has landed (at most
// kStages - 2 newer copy groups pending), barrier (every warp is done with the stage refilled
// next, and with the previous tile's shared buffers), issue the copies of tile
// tile + kStages - 1, and for FP8 widen the landed tile (one more barrier). Returns the
// 16-bit key tile to compute on. Called by every thread of the CTA.
template <bool kHalf, bool kFp8Cache, int kStages>
__device__ __forceinline__ const uint16_t* next_key_tile(const SplitArgs& args, const int32_t* table_row,
                                                        const KeyRange& range, int tile, uint8_t* stages,
                                                        uint16_t* widened) {
  constexpr int kStageBytes = kFp8Cache ? kKeysPerTile * kHeadDim : kKeysPerTile * kRowStride * 2;
  wait_async_copies<kStages - 2>();
  __syncthreads();
  const int refill = tile + kStages - 1;
  if (refill < range.tiles) {
    load_kv_tile<kFp8Cache>(args, table_row, range.begin + refill * kKeysPerTile, range.end,
                            stages + (refill % kStages) * kStageBytes);
  }
  commit_async_copies();  // one group per tile, empty or not, so the wait count above holds
  if constexpr (kFp8Cache) {
    widen_fp8_tile<kHalf>(stages + (tile % kStages) * kStageBytes, widened);
    __syncthreads();
    return widened;
  } else {
    return reinterpret_cast<const uint16_t*>(stages + (tile % kStages) * kStageBytes);
  }
}

// A split without keys for any row of the tile: LSE -inf and (one split) output 0 for its rows,
// without loading anything. Returns true when the CTA is done.
__device__ __forceinline__ bool finish_empty_split(const SplitArgs& args, const KeyRange& range, int split,
                                                   int batch_index, int first_row, int rows_here) {
  if (range.tiles > 0) return false;
  for (int index = threadIdx.x; index < rows_here * (kLatentDim / 2); index += blockDim.x) {
    const int row = index / (kLatentDim / 2), column = 2 * (index % (kLatentDim / 2));
    store_value_pair(args, split, batch_index, first_row + row, column, 0.0f, 0.0f, true);
  }
  for (int row = threadIdx.x; row < rows_here; row += blockDim.x) {
    store_row_lse(args, split, batch_index, first_row + row, -INFINITY);
  }
  return true;
}

template <bool kHalf, bool kFp8Q, bool kFp8Cache, int kStages>
__global__ void __launch_bounds__(kThreads, 1) dense_decode_split_kernel(SplitArgs args) {
  extern __shared__ __align__(128) uint8_t shared[];
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(shared);
  uint8_t* stages = shared + kRowsPerTile * kRowStride * 2;
  constexpr int kStageBytes = kFp8Cache ? kKeysPerTile * kHeadDim : kKeysPerTile * kRowStride * 2;
  uint16_t* widened = reinterpret_cast<uint16_t*>(stages + kStages * kStageBytes);  // fp8 only
  float* max_exchange = reinterpret_cast<float*>(stages + kStages * kStageBytes +
                                                 (kFp8Cache ? kKeysPerTile * kRowStride * 2 : 0));  // [2][64]
  uint16_t* probabilities = reinterpret_cast<uint16_t*>(max_exchange + 2 * kRowsPerTile);  // [64][stride]
  float* sum_exchange = reinterpret_cast<float*>(probabilities + kRowsPerTile * kProbabilityStride);  // [2][64]

  const int tile_index = blockIdx.x, split = blockIdx.y, batch_index = blockIdx.z;
  const int first_row = tile_index * kRowsPerTile;
  const int rows_here = min(kRowsPerTile, args.rows - first_row);
  const KeyRange range = split_key_range(args, batch_index, split, first_row, rows_here);
  const int key_begin = range.begin, key_end = range.end, tiles = range.tiles;
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, first_row, rows_here)) return;

  // Prologue: Q, then the first kStages - 1 KV tiles (one commit group each, empty or not).
  load_query_tile<kHalf, kFp8Q, kRowsPerTile>(args, batch_index, first_row, rows_here, q_tile);
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < tiles) {
      load_kv_tile<kFp8Cache>(args, table_row, key_begin + stage * kKeysPerTile, key_end,
                              stages + stage * kStageBytes);
    }
    commit_async_copies();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_group = warp % 4, value_half = warp / 4;
  const int group = lane / 4, pair = lane % 4;
  const bool warp_has_rows = row_group * 16 < rows_here;
  // The two query rows this lane accumulates (C fragment rows group and group + 8).
  int visible[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    visible[half] = row_visible_end(args, range, first_row, row_group * 16 + group + 8 * half, rows_here);
  }

  float output[kValueHalf / 8][4];
#pragma unroll
  for (int n = 0; n < kValueHalf / 8; ++n) output[n][0] = output[n][1] = output[n][2] = output[n][3] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < tiles; ++tile) {
    const uint16_t* keys = next_key_tile<kHalf, kFp8Cache, kStages>(args, table_row, range, tile, stages, widened);

    if (warp_has_rows) {
      // S = Q K^T for this warp's 16 rows and its 16 of the tile's 32 keys (2 n-slices of 8).
      float scores[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = 0.0f;
#pragma unroll 4
      for (int k = 0; k < kHeadDim / 16; ++k) {
        uint32_t a[4], b[4];
        load_matrix_x4(a, q_tile + (row_group * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kRowStride +
                              k * 16 + (lane / 16) * 8);
        load_matrix_x4(b, keys + (value_half * 16 + (lane % 8) + (lane / 16) * 8) * kRowStride + k * 16 +
                              ((lane / 8) % 2) * 8);
        mma_16x8x16<kHalf>(scores[0], a, b[0], b[1]);
        mma_16x8x16<kHalf>(scores[1], a, b[2], b[3]);
      }
      // Online softmax in base 2 over the two rows this lane holds; the row maximum covers the
      // partner warp's keys too, so both warps rescale by the same factor.
      const int barrier = 1 + row_group, first_key = key_begin + tile * kKeysPerTile + value_half * 16;
      float tile_max[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        tile_max[half] = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& score = scores[n][2 * half + e];
            score = first_key + n * 8 + 2 * pair + e < visible[half] ? score * args.logit_scale_log2 : -INFINITY;
            tile_max[half] = fmaxf(tile_max[half], score);
          }
        }
        tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 1));
        tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 2));
        if (pair == 0) max_exchange[value_half * kRowsPerTile + row_group * 16 + group + 8 * half] = tile_max[half];
      }
      sync_named(barrier, 64);
      float rescale[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_group * 16 + group + 8 * half;
        const float new_max =
            fmaxf(running_max[half], fmaxf(tile_max[half], max_exchange[(1 - value_half) * kRowsPerTile + row]));
        // A row that has seen no key yet keeps max -inf; subtracting 0 then keeps exp2 at 0.
        const float reference = new_max == -INFINITY ? 0.0f : new_max;
        rescale[half] = exp2f(running_max[half] - reference);
        running_max[half] = new_max;
        float tile_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float first = exp2f(scores[n][2 * half] - reference);
          const float second = exp2f(scores[n][2 * half + 1] - reference);
          tile_sum += first + second;
          *reinterpret_cast<uint32_t*>(probabilities + row * kProbabilityStride + value_half * 16 + n * 8 +
                                       2 * pair) = pack_two<kHalf>(first, second);
        }
        running_sum[half] = running_sum[half] * rescale[half] + tile_sum;  // over this warp's keys
      }
      sync_named(barrier, 64);
#pragma unroll
      for (int n = 0; n < kValueHalf / 8; ++n) {
        output[n][0] *= rescale[0];
        output[n][1] *= rescale[0];
        output[n][2] *= rescale[1];
        output[n][3] *= rescale[1];
      }
      // O += P V over all 32 keys: P (both warps' halves) from shared memory, 16 keys per k step.
#pragma unroll
      for (int k = 0; k < kKeysPerTile / 16; ++k) {
        uint32_t a[4];
        load_matrix_x4(a, probabilities + (row_group * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kProbabilityStride +
                              k * 16 + (lane / 16) * 8);
#pragma unroll
        for (int n2 = 0; n2 < kValueHalf / 16; ++n2) {
          uint32_t b[4];
          load_matrix_x4_transposed(
              b, keys + (k * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kRowStride + value_half * kValueHalf +
                     n2 * 16 + (lane / 16) * 8);
          mma_16x8x16<kHalf>(output[2 * n2], a, b[0], b[1]);
          mma_16x8x16<kHalf>(output[2 * n2 + 1], a, b[2], b[3]);
        }
      }
    }
  }
  wait_async_copies<0>();  // nothing may be in flight into shared memory at exit

  if (!warp_has_rows) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    running_sum[half] += __shfl_xor_sync(0xffffffffu, running_sum[half], 1);
    running_sum[half] += __shfl_xor_sync(0xffffffffu, running_sum[half], 2);
    if (pair == 0) sum_exchange[value_half * kRowsPerTile + row_group * 16 + group + 8 * half] = running_sum[half];
  }
  sync_named(1 + row_group, 64);  // each warp summed only its own keys: add the partner's
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_group * 16 + group + 8 * half;
    running_sum[half] += sum_exchange[(1 - value_half) * kRowsPerTile + row];
    if (row >= rows_here) continue;
    const int m = first_row + row;
    const bool empty = running_sum[half] == 0.0f;
    const float normalizer = empty ? 0.0f : args.value_scale / running_sum[half];
    const float lse2 = empty ? -INFINITY : running_max[half] + log2f(running_sum[half]);
#pragma unroll
    for (int n = 0; n < kValueHalf / 8; ++n) {
      store_value_pair(args, split, batch_index, m, value_half * kValueHalf + n * 8 + 2 * pair,
                       output[n][2 * half] * normalizer, output[n][2 * half + 1] * normalizer, empty);
    }
    if (value_half == 0 && pair == 0) store_row_lse(args, split, batch_index, m, lse2);
  }
}

}  // namespace openmla::kernels::sm90
