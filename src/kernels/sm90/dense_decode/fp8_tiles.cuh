// Dense MLA decode with an FP8 cache: the e4m3 query lines of the products that run on e4m3
// wgmma (twice the 16-bit rate) straight from the raw key tile, which wgmma takes K-major only,
// as stored: S^T = K Q^T of the narrow kernel (narrow_kernel.cuh; an fp8 q as it is, a bf16 q
// split into two e4m3 parts) and S = Q K^T of the 64-row kernel with an fp8 q
// (alternating_kernel.cuh, kRawKeys). Q is 9 blocks of [lines][64 bytes] with the 64-byte
// swizzle (raw_fp8_offset). The output products stay 16-bit (fp8_fragments.cuh). (Until session
// 23 the 64-row kernel ran its output product on e4m3 wgmma too, with P stored as 2^8 p in e4m3:
// the output's accumulation on FP8 tensor cores keeps ~13 bits a step and drifted by 11-41% over
// long splits of values that share a component;
// docs/experiments/2026-11-27-fp8-qkv-e4m3-products.patch.)
#pragma once

#include <cuda_fp8.h>

#include "kernels/sm90/dense_decode/fp8_fragments.cuh"

namespace openmla::kernels::sm90 {

// The largest |x| over two bf16x2 words and `running`, per 16-bit half, as bits: |x|'s bits order
// as |x| does, with inf and NaN (0x7f80 and up) above every finite value, so one unsigned 16x2
// maximum of three (a DPX instruction) does what a float max, a finiteness test and a select per
// value did.
__device__ __forceinline__ uint32_t largest_magnitude_bits(uint32_t first, uint32_t second, uint32_t running) {
  return __vimax3_u16x2(first & 0x7fff7fffu, second & 0x7fff7fffu, running);
}

// A bf16x2 word times `down` (a power of 2 that brings the row into e4m3's range; bf16x2, so the
// product is one exact instruction) as e4m3 high parts and the e4m3 rounding of what they leave,
// first value in the low byte: high + low keeps ~8 significant bits (bf16's), and S = K (high +
// low) takes two e4m3 products where one 16-bit product would need every key fragment widened.
// The remainder is taken in f16x2, which holds the scaled value exactly down to 2^-14 (below it,
// the low part's e4m3 resolution, 2^-9, drops it anyway). Finite rows only: a row with an inf or
// NaN is made NaN by its row factor (load_e4m3_query_rows).
__device__ __forceinline__ void split_into_e4m3x2(uint32_t word, uint32_t down, uint16_t& high, uint16_t& low) {
  uint32_t scaled;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(scaled) : "r"(word), "r"(down));
  const __half2 exact = __floats2half2_rn(__uint_as_float(scaled << 16), __uint_as_float(scaled & 0xffff0000u));
  high = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(exact), __NV_SATFINITE, __NV_E4M3);
  const __half2 rest = __hsub2(exact, __half2(__nv_cvt_fp8x2_to_halfraw2(high, __NV_E4M3)));
  low = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(rest), __NV_SATFINITE, __NV_E4M3);
}

// The tile's query rows as the e4m3 operand of S (the 64-row kernel, fp8 q: 64 lines) or S^T
// (the narrow kernel: kRows = 16 / 32 lines, 2 kRows when split): 9 blocks of [lines][64 bytes], 64-byte swizzled (raw_fp8_offset), by
// kThreads threads, which then meet at named barrier `barrier`; rows past rows_here are zeros.
// kThreads / kRows consecutive threads share a row (QueryRowThreads: its loads are contiguous,
// its maximum a few shuffles).
// - fp8 q (kSplit false): copied as it is, kRows lines.
// - bf16 q (kSplit true): 2 kRows lines, line r the high e4m3 parts of row r and line kRows + r
//   the low ones (split_into_e4m3x2), after scaling the row by 2^-s so that its largest |q| lies
//   in [128, 256) (per row: a tiny row beside a huge one keeps its precision); row_factors[r] =
//   2^s, which its logits must be multiplied by. A row with an inf or NaN gets factor NaN: its
//   logits are NaN, as the 16-bit math makes them.
// In two steps where the loads can start before the rows are needed (E4m3QueryRows: load, then
// store by the same threads); load_e4m3_query_rows does both.
template <int kRows, int kThreads, bool kSplit>
struct E4m3QueryRows {
  // 8-dim units where a row's threads share them evenly, else 4-dim ones (16 threads a row: the
  // narrow FP8 kernel's 16 rows split by both score warpgroups).
  static constexpr int kUnitDims = (kHeadDim / 8) % (kThreads / kRows) == 0 ? 8 : 4;
  using Rows = QueryRowThreads<kRows, kThreads, kUnitDims>;
  static constexpr int kUnits = Rows::kUnits, kLines = kSplit ? 2 * kRows : kRows;
  static constexpr int kWords = kSplit ? kUnitDims / 2 : kUnitDims / 4;  // 32-bit words a unit
  using Unit = std::conditional_t<kWords == 4, uint4, std::conditional_t<kWords == 2, uint2, uint32_t>>;
  static_assert(sizeof(Unit) == 4 * kWords, "a unit's words");
  Rows rows;
  Unit values[kUnits];

  __device__ __forceinline__ E4m3QueryRows(const SplitArgs& args, int batch_index, int first_row, int rows_here)
      : rows(args, batch_index, first_row, rows_here, threadIdx.x % kThreads) {}
  __device__ __forceinline__ void load(const SplitArgs& args) {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      values[j] = Unit{};
      if (rows.present) {
        values[j] = *reinterpret_cast<const Unit*>(args.q + (kSplit ? 2 : 1) * (rows.row_offset + rows.dim_of(j)));
      }
    }
  }
  __device__ __forceinline__ void store(uint8_t* query, float* row_factors, int barrier) const {
    if constexpr (!kSplit) {
#pragma unroll
      for (int j = 0; j < kUnits; ++j) {
        *reinterpret_cast<Unit*>(query + raw_fp8_offset<kLines>(rows.row, rows.dim_of(j))) = values[j];
      }
    } else {
      uint32_t words[kUnits][kWords];
#pragma unroll
      for (int j = 0; j < kUnits; ++j) memcpy(words[j], &values[j], sizeof(Unit));
      uint32_t largest = 0;  // per 16-bit half (largest_magnitude_bits)
#pragma unroll
      for (int j = 0; j < kUnits; ++j) {
#pragma unroll
        for (int w = 0; w < kWords; w += 2) largest = largest_magnitude_bits(words[j][w], words[j][w + 1], largest);
      }
      largest = max(largest & 0xffffu, largest >> 16);
#pragma unroll
      for (int mask = 1; mask < Rows::kThreadsPerRow; mask *= 2) {
        largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, mask));
      }
      const bool finite = largest < 0x7f80u;
      const int shift = finite && largest > 0 ? max(-126, ilogbf(__uint_as_float(largest << 16)) - 7) : 0;
      const uint32_t down = ((127 - shift) << 7) * 0x10001u;  // 2^-shift in both bf16 halves, exact
      if (rows.lead == 0) row_factors[rows.row] = finite ? __int_as_float((127 + shift) << 23) : NAN;
#pragma unroll
      for (int j = 0; j < kUnits; ++j) {
        uint16_t high[kWords], low[kWords];
#pragma unroll
        for (int w = 0; w < kWords; ++w) split_into_e4m3x2(words[j][w], down, high[w], low[w]);
        uint32_t high_bytes[kWords / 2], low_bytes[kWords / 2];  // 4 e4m3 values a word
#pragma unroll
        for (int w = 0; w < kWords / 2; ++w) {
          high_bytes[w] = high[2 * w] | uint32_t(high[2 * w + 1]) << 16;
          low_bytes[w] = low[2 * w] | uint32_t(low[2 * w + 1]) << 16;
        }
        uint8_t* high_line = query + raw_fp8_offset<kLines>(rows.row, rows.dim_of(j));
        uint8_t* low_line = query + raw_fp8_offset<kLines>(kRows + rows.row, rows.dim_of(j));
        if constexpr (kWords == 4) {
          *reinterpret_cast<uint2*>(high_line) = make_uint2(high_bytes[0], high_bytes[1]);
          *reinterpret_cast<uint2*>(low_line) = make_uint2(low_bytes[0], low_bytes[1]);
        } else {
          *reinterpret_cast<uint32_t*>(high_line) = high_bytes[0];
          *reinterpret_cast<uint32_t*>(low_line) = low_bytes[0];
        }
      }
    }
    fence_shared_for_async_proxy();
    sync_named(barrier, kThreads);
  }
};
template <int kRows, int kThreads, bool kSplit>
__device__ __forceinline__ void load_e4m3_query_rows(const SplitArgs& args, int batch_index, int first_row,
                                                     int rows_here, uint8_t* query, float* row_factors, int barrier) {
  E4m3QueryRows<kRows, kThreads, kSplit> rows(args, batch_index, first_row, rows_here);
  rows.load(args);
  rows.store(query, row_factors, barrier);
}

}  // namespace openmla::kernels::sm90
