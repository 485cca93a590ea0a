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

// The tile's query rows as the e4m3 operand of S (the 64-row kernel, fp8 q: 64 lines) or S^T
// (the narrow kernel: kRows = 16 / 32 lines, 2 kRows when split): 9 blocks of [lines][64 bytes], 64-byte swizzled (raw_fp8_offset), by
// kThreads threads, which then meet at named barrier `barrier`; rows past rows_here are zeros.
// kThreads / kRows consecutive threads share a row (QueryRowThreads: its loads are contiguous,
// its maximum a few shuffles).
// - fp8 q (kSplit false): copied as it is, kRows lines.
// - bf16 q (kSplit true): 2 kRows lines, line r the high e4m3 parts of row r and line kRows + r
//   the low ones (split_into_e4m3x4), after scaling the row by 2^-s so that its largest finite
//   |q| lies in [128, 256) (per row: a tiny row beside a huge one keeps its precision);
//   row_factors[r] = 2^s, which its logits must be multiplied by.
template <int kRows, int kThreads, bool kSplit>
__device__ __forceinline__ void load_e4m3_query_rows(const SplitArgs& args, int batch_index, int first_row,
                                                     int rows_here, uint8_t* query, float* row_factors, int barrier) {
  using Rows = QueryRowThreads<kRows, kThreads>;
  constexpr int kThreadsPerRow = Rows::kThreadsPerRow, kUnits = Rows::kUnits;
  constexpr int kLines = kSplit ? 2 * kRows : kRows;
  const Rows rows(args, batch_index, first_row, rows_here, threadIdx.x % kThreads);
  if constexpr (!kSplit) {
    uint2 bytes[kUnits];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      bytes[j] = rows.present ? *reinterpret_cast<const uint2*>(args.q + rows.row_offset + rows.dim_of(j))
                              : make_uint2(0, 0);
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(rows.row, rows.dim_of(j))) = bytes[j];
    }
  } else {
    uint4 values[kUnits];
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      values[j] = rows.present ? *reinterpret_cast<const uint4*>(args.q + 2 * (rows.row_offset + rows.dim_of(j)))
                               : make_uint4(0, 0, 0, 0);
      raise_to_largest_finite_bf16(largest, values[j]);
    }
#pragma unroll
    for (int mask = 1; mask < kThreadsPerRow; mask *= 2) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, mask));
    const int shift = largest > 0.0f ? max(-126, ilogbf(largest) - 7) : 0;
    const float down = __int_as_float((127 - shift) << 23);  // 2^-shift, exact
    if (rows.lead == 0) row_factors[rows.row] = __int_as_float((127 + shift) << 23);
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
      const int dim = rows.dim_of(j);
      *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(rows.row, dim)) = make_uint2(high[0], high[1]);
      *reinterpret_cast<uint2*>(query + raw_fp8_offset<kLines>(kRows + rows.row, dim)) = make_uint2(low[0], low[1]);
    }
  }
  fence_shared_for_async_proxy();
  sync_named(barrier, kThreads);
}

}  // namespace openmla::kernels::sm90
