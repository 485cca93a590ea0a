// Dense MLA decode, combine step: merges the per-split partial outputs of each query row.
//
// What: for row (b, m), with split LSEs l_i (base 2) and outputs O_i (fp32, each normalised
// over its own keys): L = log2(sum_i 2^l_i), out = sum_i 2^(l_i - L) O_i, written as bf16 with
// the LSE in the requested base. Splits with l_i = -inf (no keys) are never read; a row whose
// splits are all empty gets output 0 and LSE -inf; a NaN in any split makes the row NaN.
// Tiling: one 128-thread block per row; each thread owns 4 of the 512 value columns (one
// 16-byte load per split), the split weights are computed redundantly by every thread from
// the (L1-broadcast) LSEs, which costs far less than the row's loads. Splits are read in
// batches of 8 with all loads in flight together.
// Limits: splits <= kMaxDecodeSplits; value dim 512.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "openmla/numerics.h"

namespace openmla::kernels::sm90 {

constexpr int kCombineThreads = kLatentDim / 4;

struct CombineArgs {
  const float* partial_out;  // [split][batch][rows][512]
  const float* partial_lse;  // [split][batch][rows], base 2
  int splits, batch, rows, heads;
  uint16_t* out;
  int64_t out_batch, out_token, out_head;
  float* lse;  // null when not requested
  int64_t lse_batch, lse_token, lse_head;
  bool lse_base2;
};

// Splits are read kSplitBatch at a time, all loads of a batch issued before any is used: with
// one row per block and up to kMaxDecodeSplits splits, a loop that waits on each load in turn
// was bound by memory latency (tens of microseconds for one request).
constexpr int kSplitBatch = 8;

__global__ void __launch_bounds__(kCombineThreads) dense_decode_combine_kernel(CombineArgs args) {
  const int batch_index = blockIdx.x / args.rows, m = blockIdx.x % args.rows;
  const int64_t split_stride = int64_t(args.batch) * args.rows;
  const int64_t row = int64_t(batch_index) * args.rows + m;
  float max_lse = -INFINITY;
  for (int first = 0; first < args.splits; first += kSplitBatch) {
    float lses[kSplitBatch];
#pragma unroll
    for (int i = 0; i < kSplitBatch; ++i) {
      lses[i] = first + i < args.splits ? args.partial_lse[(first + i) * split_stride + row] : -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < kSplitBatch; ++i) {
      // NaN stays NaN (fmaxf alone would drop it and turn a NaN row into an empty one), so
      // the output and LSE are NaN, as with one split and in the CPU reference.
      max_lse = isnan(lses[i]) || isnan(max_lse) ? NAN : fmaxf(max_lse, lses[i]);
    }
  }
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float weight_sum = 0.0f;
  if (max_lse != -INFINITY) {
    for (int first = 0; first < args.splits; first += kSplitBatch) {
      float weights[kSplitBatch];
      float4 parts[kSplitBatch];
#pragma unroll
      for (int i = 0; i < kSplitBatch; ++i) {
        const float split_lse =
            first + i < args.splits ? args.partial_lse[(first + i) * split_stride + row] : -INFINITY;
        // A split without keys has LSE -inf and an unwritten output: weight 0, never read.
        weights[i] = split_lse == -INFINITY ? 0.0f : exp2f(split_lse - max_lse);
        parts[i] = weights[i] > 0.0f ? reinterpret_cast<const float4*>(
                                           args.partial_out + ((first + i) * split_stride + row) * kLatentDim)[threadIdx.x]
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int i = 0; i < kSplitBatch; ++i) {
        sum.x += weights[i] * parts[i].x;
        sum.y += weights[i] * parts[i].y;
        sum.z += weights[i] * parts[i].z;
        sum.w += weights[i] * parts[i].w;
        weight_sum += weights[i];
      }
    }
  }
  const float inverse = weight_sum == 0.0f ? 0.0f : 1.0f / weight_sum;
  const int token = m / args.heads, head = m % args.heads;
  uint16_t* out = args.out + batch_index * args.out_batch + token * args.out_token + head * args.out_head;
  __nv_bfloat162 low = __floats2bfloat162_rn(sum.x * inverse, sum.y * inverse);
  __nv_bfloat162 high = __floats2bfloat162_rn(sum.z * inverse, sum.w * inverse);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&low);
  packed.y = *reinterpret_cast<uint32_t*>(&high);
  *reinterpret_cast<uint2*>(out + 4 * threadIdx.x) = packed;
  if (args.lse != nullptr && threadIdx.x == 0) {
    const float lse2 = weight_sum == 0.0f ? -INFINITY : max_lse + log2f(weight_sum);
    args.lse[batch_index * args.lse_batch + token * args.lse_token + head * args.lse_head] =
        args.lse_base2 ? lse2 : lse2 * 0.6931471805599453f;
  }
}

}  // namespace openmla::kernels::sm90
