// Dense MLA decode with an FP8 cache: the e4m3 operands of the products that run on e4m3 wgmma
// (twice the 16-bit rate), straight from the raw key tile: both products of the alternating
// kernel with fp8 q (alternating_kernel.cuh, kFp8Math), where no 16-bit copy of a key tile is
// ever made, and S^T of the narrow kernel (narrow_kernel.cuh; a bf16 q there is split into two
// e4m3 parts, load_e4m3_query_rows).
//
// wgmma takes 8-bit operands K-major only. S = Q K^T is K-major as stored: Q (64 rows) is 9
// blocks of [64 lines][64 bytes] with the 64-byte swizzle (raw_fp8_offset), the raw key tile (as
// the TMA lands it) 5 blocks of [64 lines][128 bytes] with the 128-byte swizzle (wide_raw_offset;
// the narrow kernel's are 64-byte blocks like Q). The output product runs transposed, O^T = V^T
// P^T, so that V^T is the A operand, which wgmma takes from registers: each consumer warpgroup
// builds its V^T fragments from the raw tile (TransposedValueFragments) and P^T is P as stored.
//
// P goes from the S accumulators to e4m3 without moving between threads: a thread's
// accumulators hold keys 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t (per 16; t = lane % 4), which its m64k32
// e4m3 fragment columns 4 t .. 4 t + 3 are (value_key_of_column); the softmax stores them as they
// are (stmatrix), so P in shared memory, and the V^T fragments, take the keys in that order. P is
// stored as 256 p (p <= 2^0.75 after the lagging reference is subtracted: alternating_kernel.cuh
// kE4m3ReferenceSlackLog2): e4m3 has 3 mantissa bits from 2^-6 up and subnormals down to 2^-9,
// and the factor moves probabilities down to 2^-17 out of the flush to zero. The row sums add the
// unrounded 256 p, so the output's normaliser cancels the factor and the LSE subtracts log2 256.
#pragma once

#include <cuda_fp8.h>

#include "kernels/sm90/dense_decode/fp8_fragments.cuh"

namespace openmla::kernels::sm90 {

constexpr float kProbabilityLog2Scale = 8.0f;  // P is stored as 2^8 p

// The key (0..63) that column `column` of P (and of the V^T fragments) holds.
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
// matrix l / 8, and receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of each.
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

// The alternating kernel with fp8 q computes O^T = V^T P^T: each consumer warpgroup owns 256 of
// the 512 value dims as 4 M tiles of 64 (wgmma m64n64k32, N = the 64 query rows, B = P^T, which
// is P as the softmax stores it: [row][key], K-major). The V^T A fragments come from the raw
// tile into registers: a transposed copy of V in shared memory (a producer warpgroup's
// ldmatrix.trans, permutes and stmatrix into value tiles, then wgmma reading them) put 64 KB of
// shared-memory traffic and a producer's latency into every tile (perf log, session 22).
constexpr int kFp8RawStages = 4;   // raw tiles in flight (a stage is free once its V fragments are loaded)
constexpr int kOutputTilesPerWarpgroup = 4;  // O^T's M tiles of 64 dims per warpgroup

// A thread's V^T A fragments (m64k32 e4m3: register r holds M row 16 w + g + 8 (r % 2), k
// columns 16 (r / 2) + 4 q .. + 3, g = lane / 4, q = lane % 4). ldmatrix.trans on the raw tile
// viewed as 16-bit dim pairs, with lane l addressing key line 32 s + l (matrix j: keys 8 j ..
// 8 j + 7) at the warp's 16 dims, gives per matrix keys 8 j + 2 q, + 1 of dims 2 g, 2 g + 1; two
// byte permutes of matrices (0, 1) and (2, 3) make the words (one dim; keys 2 q, 2 q + 1, 8 + 2 q,
// 9 + 2 q): k columns 4 q .. 4 q + 3 in value_key_of_column's order, which P shares. The 128-byte
// swizzle puts a matrix's 8 key lines (l % 8 distinct) on 8 distinct chunks: no bank conflicts.
struct TransposedValueFragments {
  int offset[2];  // key line `lane`, M tiles 0 / 1 (tiles 2, 3: + 8 KB; k step s: + 32 s lines)

  __device__ __forceinline__ TransposedValueFragments(int warpgroup, int warp, int lane) {
#pragma unroll
    for (int m = 0; m < 2; ++m) offset[m] = wide_raw_offset(lane, transposed_value_dim(warpgroup, m, 16 * warp));
  }

  // The ldmatrix.trans results of k step `step` (keys 32 step ..) for the 4 M tiles; `arrange`
  // makes them fragments. Split so that a consumer issues the loads early and permutes them
  // only when its product is due (the permutes would wait for the loads).
  __device__ __forceinline__ void load(const uint8_t* raw, int step, uint32_t (&fragments)[kOutputTilesPerWarpgroup][4]) const {
    static_assert(transposed_value_dim(0, 2, 0) - transposed_value_dim(0, 0, 0) == kWideRawBoxDims,
                  "tiles 2, 3 are tiles 0, 1 one raw block on");
#pragma unroll
    for (int m = 0; m < kOutputTilesPerWarpgroup; ++m) {
      load_transposed_matrices_x4(raw + offset[m % 2] + (m / 2) * kWideRawBlockBytes + step * 32 * 128, fragments[m]);
    }
  }
  // Keys at or past `valid` become zeros (unused slots may hold NaN, which P = 0 would not cancel).
  __device__ __forceinline__ static void arrange(int step, int valid, int lane,
                                                 uint32_t (&fragments)[kOutputTilesPerWarpgroup][4]) {
#pragma unroll
    for (int m = 0; m < kOutputTilesPerWarpgroup; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t low = fragments[m][2 * half], high = fragments[m][2 * half + 1];  // matrices 2 half, + 1
        fragments[m][2 * half] = __byte_perm(low, high, 0x6420);      // dim 2 g
        fragments[m][2 * half + 1] = __byte_perm(low, high, 0x7531);  // dim 2 g + 1
      }
    }
    if (valid < kTileKeys) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t mask = 0;
#pragma unroll
        for (int byte = 0; byte < 4; ++byte) {
          const int key = 32 * step + 16 * half + value_key_of_column(4 * (lane % 4) + byte);
          mask |= key < valid ? 0xffu << (8 * byte) : 0u;
        }
#pragma unroll
        for (int m = 0; m < kOutputTilesPerWarpgroup; ++m) {
          fragments[m][2 * half] &= mask;
          fragments[m][2 * half + 1] &= mask;
        }
      }
    }
  }
};

}  // namespace openmla::kernels::sm90
