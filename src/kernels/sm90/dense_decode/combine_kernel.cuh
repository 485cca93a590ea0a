// Dense MLA decode, combine step: merges the per-split partial outputs of each query row
// (the arguments are the attention kernel's SplitArgs). Two kernels, for the two kinds of plan:
//
// What (both): for row (b, m), with split LSEs l_i (base 2) and outputs O_i (fp32, each
// normalised over its own keys): L = log2(sum_i 2^l_i), out = sum_i 2^(l_i - L) O_i, written as
// bf16 with the LSE in the requested base. Splits with l_i = -inf (no keys) are never read; a
// row whose splits are all empty gets output 0 and LSE -inf; a NaN in any split makes the row NaN.
//
// dense_decode_combine_kernel (uniform plans with few rows, up to 128 splits, latency-bound;
// a full and a lean form by split count, below): a 128-thread block per (row, eighth of the
// 512 value columns). Every split's LSE is read at once (one per thread) and the weights
// 2^(l_i - max) go to shared memory; then 8 groups of 16 threads each take every 8th split, a
// thread owning 4 columns, with all of its (up to 16) 16-byte loads in flight together, and the
// groups' sums are added in shared memory. A block's time is then about two memory latencies,
// whatever the split count. (Eighths rather than quarters, session 49: D4 B4 PDL, whose 64 rows
// then take the lean form, -2.7% bf16 and -5.5..6% FP8 on an H100, the other D4 / D5 cases
// within 1.7%.)
//
// dense_decode_combine_rows_kernel (balanced plans: up to B x Sq x Hq rows, at most
// kBalancedSplits splits, only for requests that used more than one; and uniform plans with
// at least kCombineRowsMinRows rows and at most 32 splits): a warp per row, a lane owning 16
// columns, the loads of 4 splits in flight at a time; 8 rows per block, so that a batch of 32K
// rows is 4K short blocks rather than 128K (a block per row quarter took longer to schedule
// than to run: 40-90 us of D1 Hq128 B4's whole op on an H200, session 11).
//
// The lean form and the warp-per-row kernel drop the partial lines they have read from L2
// (discard_partial_line); the full form does not (its plans are latency-bound).
// PDL: each kernel lets the next grid in the stream start at its entry, before its own wait for
// the split kernel (the next call's split kernel then prefetches its first key tiles meanwhile:
// key_tiles.cuh start_split_cta); the next grid still waits for this one before using its output.
//
// Limits: splits <= kMaxDecodeSplits; value dim 512.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"
#include "openmla/numerics.h"
#include "plan/decode_plan.h"

namespace openmla::kernels::sm90 {

constexpr int kCombineColumnBlocks = 8;                                    // blocks per row
constexpr int kCombineColumnThreads = kLatentDim / kCombineColumnBlocks / 4;  // 4 columns each
constexpr int kCombineGroups = 8;
constexpr int kCombineThreads = kCombineColumnThreads * kCombineGroups;
static_assert(kCombineThreads >= kMaxDecodeSplits, "one LSE per thread");

// Order-preserving map of floats to ints (for an integer atomicMax), and back.
__device__ __forceinline__ int float_order_key(float value) {
  const int bits = __float_as_int(value);
  return bits >= 0 ? bits : bits ^ 0x7fffffff;
}
__device__ __forceinline__ float float_from_order_key(int key) {
  return __int_as_float(key >= 0 ? key : key ^ 0x7fffffff);
}

// sum += weight x part, per component (a split's partial output quad into the merged row).
__device__ __forceinline__ void add_weighted(float4& sum, float weight, const float4& part) {
  sum.x += weight * part.x;
  sum.y += weight * part.y;
  sum.z += weight * part.z;
  sum.w += weight * part.w;
}

// The merged row's LSE (base 2) from the largest split LSE and the sum of the weights
// 2^(l_i - max): NaN if any split was NaN, -inf if no split had a key. (The weights, their sum's
// reciprocal and its log2 in one MUFU instruction each, split_common.cuh: the sum is in [1,
// splits], and the accurate forms' range checks and slow-path call were cold code that each
// block runs once.)
__device__ __forceinline__ float merged_lse2(bool has_nan, float max_lse, float weight_sum) {
  return has_nan ? NAN : weight_sum == 0.0f ? -INFINITY : max_lse + fast_log2(weight_sum);
}
__device__ __forceinline__ float merged_weight(float split_lse, float max_lse) { return fast_exp2(split_lse - max_lse); }
__device__ __forceinline__ float merged_inverse(float weight_sum) {
  return weight_sum == 0.0f ? 0.0f : fast_reciprocal(weight_sum);
}

// kMaxSplits: the plan's splits at most; each group keeps kMaxSplits / 8 loads in flight. The
// full form (kMaxDecodeSplits) takes 104 registers (the launch bound of 1 block lets ptxas keep
// all 16 loads in flight: with the default bound it issued each predicated load after the sums
// of the previous one, a round trip per split). The lean form (kCombineFewSplits: 56 registers,
// 8 blocks an SM, 5 loads in flight) takes plans of few splits with more than 2 blocks an SM:
// D1 Hq16 B4 (33 splits) ran the full form in 4 waves (quarters: 10 us on an H100) and is
// 3.5-6.3% faster lean (H200); D4 B4 (33 splits, 512 blocks) is 2.7-6% faster lean than in the
// full form, which fits those blocks in one wave too (H100, session 49). With quarters, D4 B4's
// 256 blocks lean were slower for FP8 (+3..5%: H100 and H200), so the threshold stays at 2.
constexpr int kCombineFewSplits = 40;
constexpr int kCombineLeanAboveBlocksPerSm = 2;
template <int kMaxSplits>
__global__ void __launch_bounds__(kCombineThreads, kMaxSplits <= kCombineFewSplits ? 8 : 1)
    dense_decode_combine_kernel(SplitArgs args) {
  static_assert(kMaxSplits <= kCombineThreads && kMaxSplits % kCombineGroups == 0, "one LSE per thread");
  __shared__ float weights[kMaxSplits];  // 2^(l_i - max), 0 for an empty split
  __shared__ int max_key, has_nan;
  __shared__ float warp_weight_sums[kCombineThreads / 32];
  __shared__ float4 group_sums[kCombineGroups - 1][kCombineColumnThreads];
  allow_next_grid();  // (see start_split_cta: the next call's split kernel prefetches meanwhile)
  wait_for_previous_grid();  // PDL: the split kernel's partial results are complete and visible

  // Grid (rows x 8, batch): the request from blockIdx.y, so that no division by args.rows (~25
  // instructions, run once and cold) stands between the wait and the LSE load.
  const int batch_index = int(blockIdx.y), m = int(blockIdx.x) / kCombineColumnBlocks;
  const int first_column = (blockIdx.x % kCombineColumnBlocks) * (kLatentDim / kCombineColumnBlocks);
  // partial_row_index, with the per-split stride taken once for the unrolled loads below
  const int64_t split_stride = partial_rows_per_split(args), row = partial_row_index(args, 0, batch_index, m);
  const int thread = threadIdx.x;
  const float split_lse = thread < args.splits ? args.partial_lse[thread * split_stride + row] : -INFINITY;
  if (thread == 0) {
    max_key = float_order_key(-INFINITY);
    has_nan = 0;
  }
  __syncthreads();
  // NaN poisons the row (output and LSE NaN, as with one split and in the CPU reference).
  if (isnan(split_lse)) {
    has_nan = 1;
  } else if (split_lse != -INFINITY) {
    atomicMax(&max_key, float_order_key(split_lse));
  }
  __syncthreads();
  const float max_lse = has_nan ? NAN : float_from_order_key(max_key);
  // A split without keys has LSE -inf and an unwritten output: weight 0, never read.
  const float weight =
      thread < args.splits && split_lse != -INFINITY && !has_nan ? merged_weight(split_lse, max_lse) : 0.0f;
  if (thread < args.splits) weights[thread] = weight;
  // The weights' sum as a fixed tree (the same result every run); a serial loop over the 128
  // shared-memory values was a chain of 128 dependent loads.
  float weight_sum = weight;
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, mask);
  if (thread % 32 == 0) warp_weight_sums[thread / 32] = weight_sum;
  __syncthreads();
  weight_sum = 0.0f;
#pragma unroll
  for (int warp = 0; warp < kCombineThreads / 32; ++warp) weight_sum += warp_weight_sums[warp];

  // Group g sums splits g, g + 4, ...: a fixed order, so the result is the same every run.
  const int group = thread / kCombineColumnThreads, column_thread = thread % kCombineColumnThreads;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // All of a group's loads in flight at once (empty splits issue none: their output was never
  // written, and weight 0 would not cancel a NaN in it). The group's weights come to registers
  // first: read next to each load, every load waited for its shared-memory read and issued
  // ~100 cycles after the previous one (D4 B1: 3400 cycles from the weights to the sums,
  // per-block clock64, perf log session 16); and the loads step from one pointer (the 64-bit
  // index chain per load was most of the kernel's code, which every block runs once, cold).
  constexpr int kInFlight = kMaxSplits / kCombineGroups;
  float group_weights[kInFlight];
#pragma unroll
  for (int i = 0; i < kInFlight; ++i) {
    const int split = group + kCombineGroups * i;
    group_weights[i] = split < args.splits ? weights[split] : 0.0f;
  }
  const float4* first_part = reinterpret_cast<const float4*>(args.partial_out + (group * split_stride + row) * kLatentDim +
                                                             first_column) + column_thread;
  const int64_t part_step = kCombineGroups * split_stride * (kLatentDim / 4);  // in float4
  float4 parts[kInFlight];
  const float4* part = first_part;
#pragma unroll
  for (int i = 0; i < kInFlight; ++i) {
    parts[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (group_weights[i] > 0.0f) parts[i] = *part;
    part += part_step;
  }
#pragma unroll
  for (int i = 0; i < kInFlight; ++i) add_weighted(sum, group_weights[i], parts[i]);
  if (group > 0) group_sums[group - 1][column_thread] = sum;
  __syncthreads();  // (every thread's partial loads are consumed)
  // The lean form only: the full form serves latency-bound plans (D4 / D5), whose blocks the
  // discards kept from ending (D4 B1 +8-12%, H100).
  constexpr bool kDiscard = kMaxSplits <= kCombineFewSplits;
  if (kDiscard && args.discard_read_partials && column_thread % 8 == 0) {  // 8 threads' quads: a line
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      if (group_weights[i] > 0.0f) discard_partial_line(reinterpret_cast<const float*>(first_part + i * part_step));
    }
  }
  if (group > 0) return;
#pragma unroll
  for (int other = 0; other < kCombineGroups - 1; ++other) {
    const float4 part = group_sums[other][column_thread];
    sum.x += part.x;
    sum.y += part.y;
    sum.z += part.z;
    sum.w += part.w;
  }
  if (has_nan) sum = make_float4(NAN, NAN, NAN, NAN);
  const float inverse = merged_inverse(weight_sum);
  store_bf16_quad(output_row(args, batch_index, m) + first_column + 4 * column_thread,
                  make_float4(sum.x * inverse, sum.y * inverse, sum.z * inverse, sum.w * inverse));
  if (column_thread == 0 && first_column == 0) {
    store_final_lse(args, batch_index, m, merged_lse2(has_nan, max_lse, weight_sum));
  }
}

constexpr int kCombineRowsPerBlock = 8;  // one warp each
constexpr int kCombineRowColumns = kLatentDim / 32;  // per lane
constexpr int kCombineRowsMaxSplits = 32;           // one split LSE per lane
constexpr int kCombineRowsSplitChunk = 4;           // splits whose loads are in flight together
static_assert(kBalancedSplits <= kCombineRowsMaxSplits, "one split LSE per lane");
// Uniform plans use the warp-per-row kernel from this many rows (B x Sq x Hq) on, if their split
// count allows it: below it the block per row eighth has more parallelism for the few rows
// (D4 / D5: 16-64 rows, up to 128 splits); above it that kernel's thousands of short blocks
// cost more to schedule than to run (D1 Hq128 B4: 2048 rows x 4 splits, 8192 blocks).
constexpr int64_t kCombineRowsMinRows = 512;

// kMaxSplits: kBalancedSplits (balanced plans: the request's split count from split_counts)
// or kCombineRowsMaxSplits (uniform plans: args.splits for every row).
template <int kMaxSplits>
__global__ void __launch_bounds__(32 * kCombineRowsPerBlock) dense_decode_combine_rows_kernel(SplitArgs args) {
  static_assert(kMaxSplits <= kCombineRowsMaxSplits, "one split LSE per lane");
  allow_next_grid();
  wait_for_previous_grid();  // PDL: the split kernel's partial results and counts are visible
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kCombineRowsPerBlock + threadIdx.x / 32;  // (b, m)
  if (row >= int64_t(args.batch) * args.rows) return;
  const int batch_index = int(row / args.rows), m = int(row % args.rows);
  const int splits = args.balanced ? args.split_counts[batch_index] : args.splits;
  if (splits <= 1) return;  // the attention kernel wrote this request's output and LSE itself

  const float split_lse = lane < splits ? args.partial_lse[partial_row_index(args, lane, batch_index, m)] : -INFINITY;
  // NaN poisons the row (output and LSE NaN, as with one split and in the CPU reference).
  const bool has_nan = __any_sync(0xffffffffu, isnan(split_lse));
  float max_lse = isnan(split_lse) ? -INFINITY : split_lse;
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, mask));
  // Empty splits (LSE -inf) have weight 0 and an unwritten output: never read.
  const float own_weight = split_lse != -INFINITY && !has_nan ? merged_weight(split_lse, max_lse) : 0.0f;
  const float* first_split = partial_output_row(args, 0, batch_index, m) + lane * kCombineRowColumns;
  const int64_t split_floats = partial_rows_per_split(args) * kLatentDim;
  // Splits in chunks, each chunk's loads in flight at once; summed in split order, so the
  // result is the same every run.
  constexpr int kChunk = kMaxSplits < kCombineRowsSplitChunk ? kMaxSplits : kCombineRowsSplitChunk;
  float4 sums[kCombineRowColumns / 4];
#pragma unroll
  for (int quad = 0; quad < kCombineRowColumns / 4; ++quad) sums[quad] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float weight_sum = 0.0f;
#pragma unroll 1
  for (int first = 0; first < splits; first += kChunk) {
    float weights[kChunk];
    float4 parts[kChunk][kCombineRowColumns / 4];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      weights[j] = __shfl_sync(0xffffffffu, own_weight, first + j);  // 0 past `splits`
      const float4* partial = reinterpret_cast<const float4*>(first_split + (first + j) * split_floats);
#pragma unroll
      for (int quad = 0; quad < kCombineRowColumns / 4; ++quad) {
        parts[j][quad] = weights[j] > 0.0f ? partial[quad] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      weight_sum += weights[j];
#pragma unroll
      for (int quad = 0; quad < kCombineRowColumns / 4; ++quad) add_weighted(sums[quad], weights[j], parts[j][quad]);
    }
  }
  if (args.discard_read_partials) {
    __syncwarp();  // (both lanes of each line have their values)
#pragma unroll 1
    for (int split = 0; split < splits; ++split) {
      const float weight = __shfl_sync(0xffffffffu, own_weight, split);
      if (lane % 2 == 0 && weight > 0.0f) discard_partial_line(first_split + split * split_floats);
    }
  }
  const float inverse = merged_inverse(weight_sum);
  uint16_t* out = output_row(args, batch_index, m) + lane * kCombineRowColumns;
#pragma unroll
  for (int quad = 0; quad < kCombineRowColumns / 4; ++quad) {
    float4 sum = has_nan ? make_float4(NAN, NAN, NAN, NAN) : sums[quad];
    store_bf16_quad(out + 4 * quad, make_float4(sum.x * inverse, sum.y * inverse, sum.z * inverse, sum.w * inverse));
  }
  if (lane == 0) {
    store_final_lse(args, batch_index, m, merged_lse2(has_nan, max_lse, weight_sum));
  }
}

}  // namespace openmla::kernels::sm90
