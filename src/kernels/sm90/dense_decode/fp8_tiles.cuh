// Dense MLA decode with an FP8 cache: the e4m3 operands of the products that run on e4m3 wgmma
// (twice the 16-bit rate), straight from the raw key tile: both products of the alternating
// kernel with fp8 q (alternating_kernel.cuh, kFp8Math), where no 16-bit copy of a key tile is
// ever made, and S^T of the narrow kernel (narrow_kernel.cuh; a bf16 q there is split into two
// e4m3 parts, load_e4m3_query_rows).
//
// wgmma takes 8-bit operands K-major only. S = Q K^T is K-major as stored: Q (64 rows) is 9
// blocks of [64 lines][64 bytes] with the 64-byte swizzle (raw_fp8_offset), the raw key tile (as
// the TMA lands it) 5 blocks of [64 lines][128 bytes] with the 128-byte swizzle (wide_raw_offset;
// the narrow kernel's are 64-byte blocks like Q). O += P V needs V^T, [dim][key]: the producer warpgroup transposes
// the tile's first 512 dims into a value tile of [512 lines][64 bytes] (same swizzle), with
// ldmatrix.trans (16 keys x 32 dims per warp and instruction), byte permutes and stmatrix.
//
// P goes from the S accumulators to the m64k32 e4m3 A fragment without moving between threads:
// the fragment's k columns 4 t .. 4 t + 3 of a thread (t = lane % 4) hold the keys its
// accumulators hold, 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t (per 16 keys). The value tile's columns
// follow that order (value_key_of_column), and so does P in shared memory. P is stored as 256 p
// (p <= 1 after the running maximum is subtracted): e4m3 has 3 mantissa bits from 2^-6 up and
// subnormals down to 2^-9, and the factor moves probabilities down to 2^-17 out of the flush to
// zero. The row sums add the
// unrounded 256 p, so the output's normaliser cancels the factor and the LSE subtracts log2 256.
//
// Bank conflicts: ldmatrix reads 8 keys x 16 bytes per matrix, which the 128-byte swizzle spreads
// over all banks; stmatrix writes 8 dim lines per matrix, and a matrix takes the dims 2 r + 0/1
// with r = 0..7 alternating between even and odd dims at r = 4, so that its 8 lines have 8
// distinct (line % 8) and the swizzle spreads them too.
#pragma once

#include <cuda_fp8.h>

#include "kernels/sm90/dense_decode/fp8_fragments.cuh"

namespace openmla::kernels::sm90 {

constexpr int kValueTileBytes = kLatentDim * kTileKeys;  // 32 KB: V^T, 512 dim lines x 64 keys
constexpr float kProbabilityLog2Scale = 8.0f;            // P is stored as 2^8 p

// The key (0..63) that column `column` of the value tile (and of P's A fragments) holds.
__host__ __device__ constexpr int value_key_of_column(int column) {
  const int x = column % 16;
  return (column & ~15) + 8 * ((x % 4) / 2) + 2 * (x / 4) + x % 2;
}

// Four floats -> four e4m3 (rounded to nearest, saturated), first in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return low | (high << 16);
}

// The S accumulator that byte `byte` of register r of k step `step` of P's A fragment holds:
// row 16 w + lane / 4 + 8 (r % 2), key accumulator_column(lane, i) (tests/cpp/wgmma_gpu_test.cu
// checks that this is value_key_of_column of the byte's fragment column).
__host__ __device__ constexpr int probability_accumulator(int step, int r, int byte) {
  return 16 * step + 8 * (r / 2) + 2 * (r % 2) + byte % 2 + 4 * (byte / 2);
}
// The m64k32 e4m3 A fragments of P for the tile's two k steps from the thread's 32 S
// accumulators (already 2^8 p).
__device__ __forceinline__ void pack_probability_fragments(const float (&probabilities)[32],
                                                           uint32_t (&fragments)[2][4]) {
#pragma unroll
  for (int step = 0; step < 2; ++step) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      fragments[step][r] = pack_e4m3x4(
          probabilities[probability_accumulator(step, r, 0)], probabilities[probability_accumulator(step, r, 1)],
          probabilities[probability_accumulator(step, r, 2)], probabilities[probability_accumulator(step, r, 3)]);
    }
  }
}

// Four floats (already scaled into e4m3's range) as e4m3 high parts and the e4m3 rounding of what
// they leave, first value in the low byte: high + low keeps ~8 significant bits (bf16's), and
// S = K (high + low) takes two e4m3 products where one 16-bit product would need every key
// fragment widened. An inf becomes NaN (the row's logits are NaN, as with the 16-bit math).
__device__ __forceinline__ void split_into_e4m3x4(const float (&values)[4], uint32_t& high, uint32_t& low) {
  high = low = 0;
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    float first = values[2 * pair], second = values[2 * pair + 1];
    first = fabsf(first) <= FLT_MAX ? first : NAN;  // satfinite would make inf 448
    second = fabsf(second) <= FLT_MAX ? second : NAN;
    const __nv_fp8x2_storage_t top = __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3);
    const float2 rounded = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(top, __NV_E4M3)));
    const __nv_fp8x2_storage_t rest = __nv_cvt_float2_to_fp8x2(
        make_float2(first - rounded.x, second - rounded.y), __NV_SATFINITE, __NV_E4M3);
    high |= uint32_t(top) << (16 * pair);
    low |= uint32_t(rest) << (16 * pair);
  }
}

// The tile's query rows as the e4m3 operand of S (the alternating kernel, fp8 q: 64 lines) or S^T
// (the narrow kernel: kRows = 16 / 32 lines, 2 kRows when split): 9 blocks of [lines][64
// bytes], 64-byte swizzled (raw_fp8_offset), by kThreads threads, which then meet at named
// barrier `barrier`; rows past rows_here are zeros. kThreads / kRows consecutive threads share
// a row (its loads are contiguous, its maximum a few shuffles).
// - fp8 q (kSplit false): copied as it is, kRows lines.
// - bf16 q (kSplit true): 2 kRows lines, line r the high e4m3 parts of row r and line kRows + r
//   the low ones (split_into_e4m3x4), after scaling the row by 2^-s so that its largest finite
//   |q| lies in [128, 256) (per row: a tiny row beside a huge one keeps its precision);
//   row_factors[r] = 2^s, which its logits must be multiplied by.
template <int kRows, int kThreads, bool kSplit>
__device__ __forceinline__ void load_e4m3_query_rows(const SplitArgs& args, int batch_index, int first_row,
                                                     int rows_here, uint8_t* query, float* row_factors, int barrier) {
  constexpr int kThreadsPerRow = kThreads / kRows, kUnits = kHeadDim / 8 / kThreadsPerRow;  // 8-dim units
  static_assert(kThreadsPerRow * kRows == kThreads && kUnits * kThreadsPerRow * 8 == kHeadDim, "whole units");
  constexpr int kLines = kSplit ? 2 * kRows : kRows;
  const int thread = threadIdx.x % kThreads, row = thread / kThreadsPerRow, lead = thread % kThreadsPerRow;
  const bool present = row < rows_here;
  const int64_t row_offset = present ? query_row_offset(args, batch_index, first_row + row) : 0;
  auto dim_of = [&](int j) { return 8 * (lead + kThreadsPerRow * j); };
  if constexpr (!kSplit) {
    uint2 bytes[kUnits];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      bytes[j] = present ? *reinterpret_cast<const uint2*>(args.q + row_offset + dim_of(j)) : make_uint2(0, 0);
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j) *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(row, dim_of(j))) = bytes[j];
  } else {
    uint4 values[kUnits];
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      values[j] = present ? *reinterpret_cast<const uint4*>(args.q + 2 * (row_offset + dim_of(j))) : make_uint4(0, 0, 0, 0);
      raise_to_largest_finite_bf16(largest, values[j]);
    }
#pragma unroll
    for (int mask = 1; mask < kThreadsPerRow; mask *= 2) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, mask));
    const int shift = largest > 0.0f ? max(-126, ilogbf(largest) - 7) : 0;
    const float down = __int_as_float((127 - shift) << 23);  // 2^-shift, exact
    if (lead == 0) row_factors[row] = __int_as_float((127 + shift) << 23);
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const uint32_t words[4] = {values[j].x, values[j].y, values[j].z, values[j].w};
      uint32_t high[2], low[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float scaled[4] = {__uint_as_float(words[2 * half] << 16) * down,
                                 __uint_as_float(words[2 * half] & 0xffff0000u) * down,
                                 __uint_as_float(words[2 * half + 1] << 16) * down,
                                 __uint_as_float(words[2 * half + 1] & 0xffff0000u) * down};
        split_into_e4m3x4(scaled, high[half], low[half]);
      }
      *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(row, dim_of(j))) = make_uint2(high[0], high[1]);
      *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(kRows + row, dim_of(j))) = make_uint2(low[0], low[1]);
    }
  }
  fence_shared_for_async_proxy();
  sync_named(barrier, kThreads);
}

// Four 8 x 8 matrices of 16-bit values, transposed; lane l gives the address of row l % 8 of
// matrix l / 8 (see ValueTransposer for what each lane receives).
__device__ __forceinline__ void load_transposed_matrices_x4(const uint8_t* row, uint32_t (&values)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(values[0]), "=r"(values[1]), "=r"(values[2]), "=r"(values[3])
               : "r"(shared_address(row))
               : "memory");
}
// Four 8 x 8 matrices of 16-bit values stored; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void store_matrices_x4(uint8_t* row, const uint32_t (&values)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(shared_address(row)),
               "r"(values[0]), "r"(values[1]), "r"(values[2]), "r"(values[3])
               : "memory");
}

// One warp's share of a value tile: warp w of the producer warpgroup transposes keys 16 w ..
// 16 w + 15 of every dim, 32 dims per step. ldmatrix.trans on the tile viewed as 16-bit pairs
// gives lane (g = lane / 4, t = lane % 4), per matrix, dims 2 g and 2 g + 1 of keys 2 t and
// 2 t + 1 (matrices 0, 2: keys + 0..7 of dims + 0..15 / + 16..31; 1, 3: keys + 8..15); two byte
// permutes make the words (one dim, keys 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t), i.e. value-tile
// columns 4 t .. 4 t + 3 of the key group, and stmatrix stores them as rows = dims.
// (Spreading each key group's steps over all four warps instead, with each step's load issued
// before the previous step's store, made the FP8 D1 Hq128 cases 25-30% slower: perf log.)
struct ValueTransposer {
  int load[4];  // ldmatrix row offsets for the 32-dim steps s % 4 = 0..3 of a 128-dim block (wide_raw_offset)
  int store;    // stmatrix row offset (+ 2048 per 32 dims)
  uint32_t first_selector, second_selector;  // the words for stmatrix matrices A (0, 2) and B (1, 3)

  __device__ __forceinline__ ValueTransposer(int warp, int lane) {
    const int matrix = lane / 8, key = 16 * warp + lane % 8 + 8 * (matrix % 2);
#pragma unroll
    for (int quarter = 0; quarter < 4; ++quarter) load[quarter] = wide_raw_offset(key, 32 * quarter + 16 * (matrix / 2));
    const int r = lane % 8;  // row r of stmatrix matrix `matrix`: dim 2 r + (r / 4 for A, 1 - r / 4 for B)
    const int dim = 16 * (matrix / 2) + 2 * r + ((r / 4) ^ (matrix % 2));
    store = dim * 64 + ((warp ^ ((dim / 2) % 4)) * 16);
    const bool odd_first = (lane / 4) / 4 == 1;  // this lane's row g of A is dim 2 g + 1
    first_selector = odd_first ? 0x7531u : 0x6420u;
    second_selector = odd_first ? 0x6420u : 0x7531u;
  }

  // The loads of kBatch steps are issued before their stores: under the consumers' wgmma
  // traffic an ldmatrix takes hundreds of cycles, and one step at a time (load, permute, store)
  // left the consumers waiting for value tiles (ncu, FP8 D1 Hq128 B16: a fifth of all samples).
  template <bool kMask>
  __device__ __forceinline__ void run_steps(const uint8_t* raw, uint8_t* values, uint32_t mask_low,
                                            uint32_t mask_high) const {
    constexpr int kSteps = kLatentDim / 32, kBatch = 8;
    static_assert(kSteps % kBatch == 0 && kBatch % 4 == 0, "whole batches of whole 128-dim blocks");
#pragma unroll 1
    for (int first = 0; first < kSteps; first += kBatch) {
      uint32_t pairs[kBatch][4];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int step = first + j;  // step % 4 == j % 4: kBatch is a multiple of 4
        load_transposed_matrices_x4(raw + (step / 4) * kWideRawBlockBytes + load[j % 4], pairs[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if constexpr (kMask) {
          pairs[j][0] &= mask_low;
          pairs[j][1] &= mask_high;
          pairs[j][2] &= mask_low;
          pairs[j][3] &= mask_high;
        }
        uint32_t words[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          words[2 * half] = __byte_perm(pairs[j][2 * half], pairs[j][2 * half + 1], first_selector);
          words[2 * half + 1] = __byte_perm(pairs[j][2 * half], pairs[j][2 * half + 1], second_selector);
        }
        store_matrices_x4(values + (first + j) * 2048 + store, words);
      }
    }
  }

  // Value tile of the raw tile; keys at or past `valid` (0..64) become zeros (unused slots and
  // stale lines may hold NaN, and P V multiplies them by P = 0).
  __device__ __forceinline__ void run(const uint8_t* raw, uint8_t* values, int valid, int warp, int lane) const {
    if (valid >= kTileKeys) {
      run_steps<false>(raw, values, 0, 0);
    } else {
      const int first = 16 * warp + 2 * (lane % 4);
      auto mask_of = [&](int key) {
        return (key < valid ? 0x0000ffffu : 0u) | (key + 1 < valid ? 0xffff0000u : 0u);
      };
      run_steps<true>(raw, values, mask_of(first), mask_of(first + 8));
    }
  }
};

// The alternating kernel's producer warpgroup with fp8 q and cache (`thread` 0..127): each
// landed raw tile (raw stage tile % 2) is transposed into value tile tile % kFp8ValueTiles
// (values_full: 128 arrivals) once both warpgroups' O += P V of the tile kFp8ValueTiles before
// has released it (values_empty). A raw stage is free again when its owner's S and the
// transposition have read it (raw_empty: 256 arrivals). S needs only the raw tile, so the next
// tiles' S can start while the value tiles are still held. Thread 0 also issues the loads:
// after transposing tile t it waits for S of tile t and issues tile t + 2.
// Measured alternatives (FP8 D1 Hq128, H100, perf log session 9): two value tiles instead of
// three, 0-8% slower; three raw stages with two value tiles, 5-10% slower; refilling a stage
// sooner, by thread 0 polling the stages instead of blocking (1.8-1.9x slower) or by the owner
// warpgroup right after its S (11-16% slower).
constexpr int kFp8RawStages = 2, kFp8ValueTiles = 3;
__device__ __forceinline__ void load_and_transpose_value_tiles(const CUtensorMap* cache_map, const SplitArgs& args,
                                                               const int32_t* table_row, const KeyRange& range,
                                                               uint8_t* raw_stages, uint8_t* value_tiles,
                                                               uint64_t* landed, uint64_t* raw_empty,
                                                               uint64_t* values_full, uint64_t* values_empty,
                                                               int thread) {
  static_assert(kFp8RawStages == 2, "tile t + 2 refills tile t's stage");
  KeyTileLoader<true, kWideRawBlockBytes, kWideRawStageBytes, kWideRawBoxDims> loader(cache_map, args, table_row,
                                                                                     range, raw_stages);
  const int warp = thread / 32, lane = thread % 32;
  const ValueTransposer transposer(warp, lane);
  if (thread == 0) {
    loader.read_pages(0);
    loader.issue(0, 0, &landed[0]);
    if (range.tiles > 1) loader.read_pages(1);
  }
  for (int tile = 0; tile < range.tiles; ++tile) {
    const int raw_stage = tile % kFp8RawStages, value_stage = tile % kFp8ValueTiles;
    mbarrier_wait(&landed[raw_stage], (tile / kFp8RawStages) % 2);
    // Tile 1 only once tile 0 has landed (see produce_key_tiles).
    if (thread == 0 && tile == 0 && range.tiles > 1) {
      loader.issue(1, 1, &landed[1]);
      if (range.tiles > 2) loader.read_pages(2);
    }
    if (tile >= kFp8ValueTiles) mbarrier_wait(&values_empty[value_stage], (tile / kFp8ValueTiles - 1) % 2);
    __syncwarp();  // ldmatrix / stmatrix: whole warps
    transposer.run(raw_stages + raw_stage * kWideRawStageBytes, value_tiles + value_stage * kValueTileBytes,
                   range.length - (range.begin + tile * kTileKeys), warp, lane);
    fence_shared_for_async_proxy();  // the consumers' wgmma reads the value tile
    mbarrier_arrive(&values_full[value_stage]);
    mbarrier_arrive(&raw_empty[raw_stage]);
    const int next = tile + 2;
    if (thread == 0 && next < range.tiles) {
      const int stage = next % kFp8RawStages;
      mbarrier_wait(&raw_empty[stage], (next / kFp8RawStages - 1) % 2);  // held tile next - 2
      loader.issue(next, stage, &landed[stage]);
      if (next + 1 < range.tiles) loader.read_pages(next + 1);
    }
  }
}

}  // namespace openmla::kernels::sm90
