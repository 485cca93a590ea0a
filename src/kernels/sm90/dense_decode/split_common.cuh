// Dense MLA decode: what every split of the attention kernel shares with the launcher and the
// combine step: the kernel arguments, the per-split key range (derived on the device from
// seq_lens, so a captured graph replays correctly with new lengths; with a balanced plan the
// number of splits a request uses is derived there too), causal visibility, the epilogue
// stores (direct bf16 output for one split, fp32 partials + base-2 LSE for several), and small
// conversions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "openmla/numerics.h"
#include "plan/decode_plan.h"

namespace openmla::kernels::sm90 {

constexpr int kRowsPerTile = 64;  // query rows per CTA (Sq x Hq folded, row m = s * Hq + h)
constexpr int kTileKeys = 64;     // keys per tile (and splits are whole tiles)
static_assert(kRowsPerTile == kDecodeRowsPerTile, "the plan's row tiles are the grid's x");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;  // base-2 LSE -> natural: one multiply everywhere
// A split gets at least one 64-key tile: below that a CTA's fixed cost (Q, pipeline fill)
// outweighs its work; short requests then leave the last splits empty (they exit at once, or
// are not launched where the caller bounds the lengths: bound_decode_splits).
constexpr int kMinKeysPerSplit = int(kDecodeMinKeysPerSplit);
static_assert(kMinKeysPerSplit == kTileKeys, "a split's least keys are one tile (bound_decode_splits)");
// How far (base 2) a tile's row maximum may pass the softmax's reference before the reference
// moves (16-bit P: p <= 2^8; alternating_kernel.cuh own_softmax, narrow_fp8_kernel.cuh).
constexpr float kReferenceSlackLog2 = 8.0f;

struct SplitArgs {
  const uint8_t* q;  // element strides below are in q's own element size
  int64_t q_batch, q_token, q_head;
  const int32_t* block_table;
  int64_t block_table_row;
  int block_table_columns;  // entries a row holds (a speculative read stays within them)
  int cache_pages;
  const int32_t* seq_lens;
  int64_t seq_lens_stride;
  int page_shift;
  int query_tokens, heads, rows;  // rows = query_tokens * heads
  int splits;     // the grid's splits per request
  bool balanced;  // plan.balanced: each request uses 1..splits of them (split_key_range)
  bool prefetch_before_wait;  // enable_pdl: a uniform plan's CTA prefetches its first tiles (start_split_cta)
  bool halve_values;  // short requests' splits in value halves (key_range_of; the 16-bit narrow kernel, 16 rows)
  int sm_count;   // the plan's SM count (a balanced plan's chunk size)
  bool causal;
  float logit_scale_log2;  // softmax_scale * q_descale * kv_scale * log2(e)
  float value_scale;       // kv_scale for an fp8 cache, else 1
  // Direct output (splits == 1).
  uint16_t* out;
  int64_t out_batch, out_token, out_head;
  float* lse;  // null when not requested
  int64_t lse_batch, lse_token, lse_head;
  bool lse_base2;
  // Split outputs (splits > 1): [split][batch][rows][512] and [split][batch][rows], base 2;
  // a balanced plan's splits used per request [batch] (for the combine step).
  float* partial_out;
  float* partial_lse;
  int32_t* split_counts;
  bool discard_read_partials;  // partial_out 128-byte aligned: the combine step drops read lines
  int batch;
};

// 2^x in one MUFU.EX2, subnormal results flushed to zero (exp2f adds a range check and two
// predicated multiplies per call for them). For the per-tile softmax, where a probability
// below 2^-126 of the row's maximum changes nothing; -inf gives 0, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

// log2(x) and 1 / x in one MUFU instruction each (lg2.approx: absolute error ~2^-22; rcp.approx:
// ~1 ulp), for the epilogue's per-row factors, whose accurate forms (range reduction, a slow
// path call for the division) were a visible part of the cold code that each CTA runs once.
__device__ __forceinline__ float fast_log2(float x) {
  float result;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}
__device__ __forceinline__ float fast_reciprocal(float x) {
  float result;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

// Barrier among `thread_count` threads (whole warps) on named barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void sync_named(int id, int thread_count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}
// sync_named that also returns whether `value` is true in any of the threads.
__device__ __forceinline__ bool sync_named_any(int id, int thread_count, bool value) {
  uint32_t result;
  asm volatile(
      "{\n.reg .pred in, out;\nsetp.ne.u32 in, %1, 0;\nbar.red.or.pred out, %2, %3, in;\nselp.u32 %0, 1, 0, out;\n}\n"
      : "=r"(result)
      : "r"(uint32_t(value)), "r"(id), "r"(thread_count)
      : "memory");
  return result != 0;
}

// Key tiles of a request of `length` keys.
__device__ __forceinline__ int key_tiles_of(int length) { return (length + kTileKeys - 1) / kTileKeys; }

// The request's split count, from the prologue (split_key_range) to the epilogue's stores, in
// shared memory (a register live across the main loop would cost the kernels, which run at
// their register limit, spills). Used only by balanced plans.
__device__ __forceinline__ int* request_split_count() {
  __shared__ int count;
  return &count;
}

// 32-bit sums of key tiles: each request counts at most 2^21 - 1 tiles (134M keys), 1024
// requests at most.
constexpr int kCountedTiles = (1 << 21) - 1;
// A balanced plan's lengths within 1/8 of their mean: the uniform plan (one split each) is
// already balanced.
__device__ __forceinline__ bool lengths_are_even(int total_tiles, int longest_tiles, int batch) {
  return 8.0f * float(longest_tiles) * float(batch) <= 9.0f * float(total_tiles);
}

// A warp's sum and maximum of its lanes' key-tile counts, in every lane.
__device__ __forceinline__ void warp_total_and_longest(int& total, int& longest) {
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    total += __shfl_xor_sync(0xffffffffu, total, mask);
    longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, mask));
  }
}

// A balanced plan's split count for a request of `tiles` key tiles (splits_of_request below),
// by one warp. Not inlined, so that the uniform plans' prologue (which D4 runs cold, once per
// CTA) stays as short as it was.
static __device__ __noinline__ int balanced_split_count(const int32_t* seq_lens, int64_t seq_lens_stride, int batch,
                                                 int tiles, int splits, int row_tiles, int sm_count) {
  int total = 0, longest = 0;
  // Several lengths in flight per lane (B <= 256: one round trip, where one length at a time
  // took a dependent round trip per 32 requests before the first key tile could be requested).
#pragma unroll 8
  for (int b = threadIdx.x % 32; b < batch; b += 32) {
    const int request_tiles = min(key_tiles_of(seq_lens[b * seq_lens_stride]), kCountedTiles);
    total += request_tiles;
    longest = max(longest, request_tiles);
  }
  warp_total_and_longest(total, longest);
  if (lengths_are_even(total, longest, batch)) return 1;
  const float fair_share = float(total) * float(row_tiles) / float(sm_count * kBalancedChunksPerSm);
  const int chunk = max(1, int(fair_share));
  // At least one split: an empty request's CTA writes its zeros and -inf.
  return max(1, min(splits, (min(tiles, kCountedTiles) + chunk - 1) / chunk));
}

// A value that every lane of the warp holds alike, taken from lane 0 so that ptxas knows it is
// warp-uniform. It does not know that of threadIdx.x / 128, nor of a tile loop's counter: it kept
// the counter, hence each stage address and wgmma descriptor derived from it, in vector
// registers, and every wgmma waited on 64-bit vector adds and two R2UR moves (the 16-bit narrow
// kernel: 173 R2UR for 68 wgmma, 40 with its stage index passed through here; perf log session
// 33). Every lane of the warp must call it (full mask).
__device__ __forceinline__ int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }

// How many of the grid's splits the request of `tiles` key tiles uses. A uniform plan: all of
// them. A balanced plan (decode_plan.h): warp 0 sums the key tiles of all requests and keeps
// one split unless the lengths are uneven and the request is longer than a chunk of the fair
// share per SM (`lengths_even`: cta_work found them even already, one split, no sum); the count
// reaches the other warps through shared memory after a CTA barrier (so every thread of the
// CTA must call this). Computed by every warp instead (no barrier), the count's dependence on
// the sum made ptxas spill 60-150 bytes in every attention kernel.
__device__ __forceinline__ int splits_of_request(const SplitArgs& args, int tiles, bool lengths_even) {
  if (!args.balanced) return args.splits;
  if (threadIdx.x < 32) {
    const int count = lengths_even ? 1
                                   : balanced_split_count(args.seq_lens, args.seq_lens_stride, args.batch, tiles,
                                                          args.splits, int(gridDim.x), args.sm_count);
    if (threadIdx.x == 0) *request_split_count() = count;
  }
  __syncthreads();
  return *request_split_count();
}

// Which request and split a CTA works on. Uniform plans, and balanced plans whose lengths are
// even (every request one split) or of more than kMaxRankedBatch requests: its grid position
// (y, z), splits outermost. Balanced plans of ragged lengths: the (y, z) plane is walked in
// order of request length, longest first, the two splits of a request side by side, so that
// the hardware (which starts CTAs in grid order, one per SM) starts the longest work first and
// the short requests fill the gaps at the end (longest-first list scheduling; a simulation of
// PERF.md's D3 on 132 SMs: 0.96-0.98 of the ideal balance instead of 0.89-0.91 in grid order;
// with even lengths the side-by-side order only delays the working CTAs behind the empty
// second splits). Every CTA ranks all requests itself (so a captured graph replays correctly
// with new lengths), through `scratch` (kMaxRankedBatch + 3 ints of shared memory that are
// free until the pipeline starts); all threads of the CTA must call it.
struct CtaWork {
  int batch_index, split;
  bool lengths_even;  // a balanced plan's lengths, all within 1/8 of their mean: one split each
};
constexpr int kMaxRankedBatch = 256;  // ranking costs every CTA ~B^2 / threads comparisons

// The balanced plan's CtaWork (see above). Not inlined, so that the prologue of the uniform
// plans stays as it was.
static __device__ __noinline__ CtaWork ranked_cta_work(const int32_t* seq_lens, int64_t seq_lens_stride, int batch,
                                                       int* scratch) {
  int& total = scratch[kMaxRankedBatch];  // (in scratch: static shared words are all but used up)
  int& longest = scratch[kMaxRankedBatch + 1];
  int& chosen = scratch[kMaxRankedBatch + 2];
  if (threadIdx.x == 0) total = longest = 0;
  __syncthreads();
  int my_total = 0, my_longest = 0;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    const int tiles = min(key_tiles_of(seq_lens[b * seq_lens_stride]), kCountedTiles);
    scratch[b] = tiles;
    my_total += tiles;
    my_longest = max(my_longest, tiles);
  }
  // One shared atomic per warp (one per thread on the same two words serialised B of them).
  warp_total_and_longest(my_total, my_longest);
  if (threadIdx.x % 32 == 0 && threadIdx.x < batch) {
    atomicAdd(&total, my_total);
    atomicMax(&longest, my_longest);
  }
  __syncthreads();
  if (lengths_are_even(total, longest, batch)) return {int(blockIdx.y), int(blockIdx.z), true};
  const int position = int(blockIdx.y + gridDim.y * blockIdx.z);  // in the grid's order
  const int splits = int(gridDim.z), rank = position / splits;
  // The request of rank `rank`: key tiles descending, then index ascending (a strict order, so
  // the ranks are a permutation of the requests).
  for (int candidate = threadIdx.x; candidate < batch; candidate += blockDim.x) {
    const int tiles = scratch[candidate];
    int ahead = 0;  // requests ranked before the candidate
#pragma unroll 4
    for (int other = 0; other < batch; ++other) {
      const int other_tiles = scratch[other];
      ahead += other_tiles > tiles || (other_tiles == tiles && other < candidate);
    }
    if (ahead == rank) chosen = candidate;
  }
  __syncthreads();  // (scratch is next written by the pipeline, after a later CTA barrier)
  return {chosen, position % splits, false};
}
__device__ __forceinline__ CtaWork cta_work(const SplitArgs& args, int* scratch) {
  if (!args.balanced || args.batch > kMaxRankedBatch) return {int(blockIdx.y), int(blockIdx.z), false};
  return ranked_cta_work(args.seq_lens, args.seq_lens_stride, args.batch, scratch);
}

// Where a CTA's results go: the output itself (its request uses one split) or the partial rows
// of split `split`. Taken once per epilogue: read inside each store, the shared split count
// was loaded again after every global store (which the compiler must assume may alias it).
struct OutputDestination {
  int split;
  bool final_output;
};
__device__ __forceinline__ OutputDestination output_destination(const SplitArgs& args, int split) {
  return {split, args.splits == 1 || (args.balanced && *request_split_count() == 1)};
}

// The tile's key range for this split: keys [begin, end) of the request, cut into `splits`
// chunks of whole key tiles (kTileKeys), and limited (causal) to what the tile's last row can
// see. `splits` is the request's (splits_of_request); a split at or past it is unused: its CTA
// writes nothing.
// Value halves (args.halve_values): a request of at most splits / 2 key tiles would leave half
// of its splits without keys (D4 B1: 64 tiles, 128 splits). Instead splits s and s + splits / 2
// both take key split s's tile and split its value dims: each computes the whole S^T and softmax
// (the same instructions on the same data, so the same P), but O^T and the partial stores over
// 256 of the 512 dims, the two longest steps of a one-tile CTA's chain. Both write key split s's
// partial row (half 0 dims 0..255 and the LSE, half 1 dims 256..511); half 1 writes LSE -inf at
// its own split's slot, so that the combine step skips that slot (an odd last split has no
// partner and no keys: LSE -inf). (Both CTAs load the whole tile. Splitting S^T's dims between
// the two CTAs of a cluster, with the partial scores exchanged through distributed shared
// memory, loaded half a tile each but measured no faster, and the cluster launch slowed the
// plans that it did not halve: perf log, session 45.)
struct KeyRange {
  int length, begin, end, tiles;
  int splits;
  bool in_use;
  bool halved;     // this request's splits work in value halves (above)
  int value_half;  // 0: dims 0..255 (all 512 unless halved), 1: dims 256..511
  int key_split;   // whose keys, and whose partial row the values go to (the split unless halved)
};
// The key range of a request of `length` keys; split_count: the request's (splits_of_request).
// kMayHalve: the kernel can work in value halves (above). (The prefetch before the PDL wait takes
// the range without them: a halved request's tiles are prefetched once, by the half-0 splits.)
template <bool kMayHalve = false>
__device__ __forceinline__ KeyRange key_range_of(const SplitArgs& args, int split, int length, int split_count,
                                                 int first_row, int rows_here) {
  KeyRange range;
  range.length = length;
  range.splits = split_count;
  range.in_use = split < range.splits;
  const int pairs = split_count / 2;
  range.halved = kMayHalve && args.halve_values && key_tiles_of(length) <= pairs;
  range.value_half = range.halved && split >= pairs ? 1 : 0;
  range.key_split = !range.halved ? split : split < pairs ? split : split < 2 * pairs ? split - pairs : pairs;
  const int key_splits = range.halved ? pairs : range.splits;
  const int last_token = (first_row + rows_here - 1) / args.heads;
  const int visible_max = args.causal ? min(range.length, range.length - args.query_tokens + last_token + 1)
                                      : range.length;
  const int per_split =
      (max((range.length + key_splits - 1) / key_splits, kMinKeysPerSplit) + kTileKeys - 1) / kTileKeys * kTileKeys;
  range.begin = range.key_split * per_split;
  range.end = min(visible_max, range.begin + per_split);
  range.tiles = range.in_use && range.end > range.begin ? key_tiles_of(range.end - range.begin) : 0;
  return range;
}
template <bool kMayHalve = false>
__device__ __forceinline__ KeyRange split_key_range(const SplitArgs& args, const CtaWork& work, int first_row,
                                                    int rows_here) {
  const int batch_index = work.batch_index, split = work.split;
  const int length = args.seq_lens[batch_index * args.seq_lens_stride];
  const int split_count = splits_of_request(args, key_tiles_of(length), work.lengths_even);
  const KeyRange range = key_range_of<kMayHalve>(args, split, length, split_count, first_row, rows_here);
  // The combine step's count (one writer per request: row tile 0 of split 0).
  if (args.balanced && blockIdx.x == 0 && split == 0 && threadIdx.x == 0) {
    args.split_counts[batch_index] = range.splits;
  }
  return range;
}

// Keys query row `row` (tile-local) may attend to: [.., visible) within the split's range.
__device__ __forceinline__ int row_visible_end(const SplitArgs& args, const KeyRange& range, int first_row,
                                               int row, int rows_here) {
  if (row >= rows_here) return 0;
  const int token = (first_row + row) / args.heads;
  return args.causal ? min(range.end, range.length - args.query_tokens + token + 1) : range.end;
}

// Where query row m (= token * heads + head) of request `batch_index` lives: in q (elements of
// q's own size), in out, in lse; and its row in the split outputs [split][batch][rows].
__device__ __forceinline__ int64_t query_row_offset(const SplitArgs& args, int batch_index, int m) {
  return batch_index * args.q_batch + (m / args.heads) * args.q_token + (m % args.heads) * args.q_head;
}
// A query tile's rows as kThreads threads load them (the query loaders of key_tiles.cuh and
// fp8_tiles.cuh): kThreads / kRows consecutive threads share a row, each thread working out the
// row's offset once (a division by the head count, ~20 instructions) and taking its 8-dim units
// lead, lead + kThreadsPerRow, ... (8 threads' units of a 16-bit row: one 128-byte line). Worked
// out per unit instead, that was ~650 of the ~2300 instructions a D4 CTA of the 16-row kernel
// runs once, each fetched cold (perf log, session 41). kUnitDims 4: 16 threads a row (576 dims
// are 72 units of 8, which 16 threads do not share evenly).
template <int kRows, int kThreads, int kUnitDims = 8>
struct QueryRowThreads {
  static constexpr int kThreadsPerRow = kThreads / kRows, kUnits = kHeadDim / kUnitDims / kThreadsPerRow;
  static_assert(kThreadsPerRow * kRows == kThreads && kUnits * kThreadsPerRow * kUnitDims == kHeadDim, "whole units");
  int row, lead;
  bool present;        // row < rows_here (rows past it are loaded as zeros)
  int64_t row_offset;  // query_row_offset of the row (0 when absent)
  // thread: this thread's index among the kThreads.
  __device__ __forceinline__ QueryRowThreads(const SplitArgs& args, int batch_index, int first_row, int rows_here,
                                             int thread)
      : row(thread / kThreadsPerRow),
        lead(thread % kThreadsPerRow),
        present(row < rows_here),
        row_offset(present ? query_row_offset(args, batch_index, first_row + row) : 0) {}
  __device__ __forceinline__ int dim_of(int j) const { return kUnitDims * (lead + kThreadsPerRow * j); }
};
__device__ __forceinline__ uint16_t* output_row(const SplitArgs& args, int batch_index, int m) {
  return args.out + batch_index * args.out_batch + (m / args.heads) * args.out_token + (m % args.heads) * args.out_head;
}
// Rows of one split in the split outputs (every request's rows): row r of split s is s x this + r.
__device__ __forceinline__ int64_t partial_rows_per_split(const SplitArgs& args) {
  return int64_t(args.batch) * args.rows;
}
__device__ __forceinline__ int64_t partial_row_index(const SplitArgs& args, int split, int batch_index, int m) {
  return int64_t(split) * partial_rows_per_split(args) + (int64_t(batch_index) * args.rows + m);
}
__device__ __forceinline__ float* partial_output_row(const SplitArgs& args, int split, int batch_index, int m) {
  return args.partial_out + partial_row_index(args, split, batch_index, m) * kLatentDim;
}

// Drops a 128-byte line of partial outputs from L2 without writing it back to HBM: once the
// combine step has read it, its data is dead, and left dirty it would be written back when the
// next grid's key stream evicts it (D1 Hq16 B4's 17 MB of partials: whole op -3.8% bf16, -6.1%
// fp8-qkv on an H100, perf log session 39). Only for a 128-byte-aligned partial_out, where every
// line belongs to one (split, row) (rows are 2 KB); its reader calls it after a barrier that
// orders every thread's loads of the line before it.
__device__ __forceinline__ void discard_partial_line(const float* line) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(line) : "memory");
}

// Four values as bf16 at `out` (8-byte aligned): one store.
__device__ __forceinline__ void store_bf16_quad(uint16_t* out, float4 values) {
  const __nv_bfloat162 low = __floats2bfloat162_rn(values.x, values.y);
  const __nv_bfloat162 high = __floats2bfloat162_rn(values.z, values.w);
  *reinterpret_cast<uint2*>(out) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&low), *reinterpret_cast<const uint32_t*>(&high));
}

// The final LSE of a row (base 2 in), in the requested base; nothing where none was requested.
__device__ __forceinline__ void store_final_lse(const SplitArgs& args, int batch_index, int m, float lse2) {
  if (args.lse != nullptr) {
    args.lse[batch_index * args.lse_batch + (m / args.heads) * args.lse_token + (m % args.heads) * args.lse_head] =
        args.lse_base2 ? lse2 : lse2 * kLn2;
  }
}

// Two consecutive output values (already normalised) of row m at `column`: bf16 into out when
// the request uses one split, fp32 into the split's partial row otherwise (skipped for an empty row:
// the combine step never reads the output of a split whose LSE is -inf).
__device__ __forceinline__ void store_value_pair(const SplitArgs& args, const OutputDestination& destination,
                                                 int batch_index, int m, int column, float first, float second,
                                                 bool empty) {
  if (destination.final_output) {
    *reinterpret_cast<__nv_bfloat162*>(output_row(args, batch_index, m) + column) =
        __floats2bfloat162_rn(first, second);
  } else if (!empty) {
    *reinterpret_cast<float2*>(partial_output_row(args, destination.split, batch_index, m) + column) =
        make_float2(first, second);
  }
}

// Where row m's values go, in elements of its destination: of out (bf16) when the request uses
// one split, of partial_out (fp32) otherwise. For a loop that stores many quads of few rows
// (store_value_quad): taken once per row, the division by the head count and the 64-bit index
// chain stay out of the loop.
__device__ __forceinline__ int64_t destination_row_offset(const SplitArgs& args, const OutputDestination& destination,
                                                          int batch_index, int m) {
  return destination.final_output ? output_row(args, batch_index, m) - args.out
                                  : partial_output_row(args, destination.split, batch_index, m) - args.partial_out;
}

// Four consecutive values (column a multiple of 4) of the row at `row_offset`
// (destination_row_offset; kFinalOutput: destination.final_output, a template argument so that
// a loop of stores has no branch): one 8-byte or 16-byte store.
template <bool kFinalOutput>
__device__ __forceinline__ void store_value_quad(const SplitArgs& args, int64_t row_offset, int column, float4 values) {
  if constexpr (kFinalOutput) {
    store_bf16_quad(args.out + row_offset + column, values);
  } else {
    *reinterpret_cast<float4*>(args.partial_out + row_offset + column) = values;
  }
}

// An epilogue's output rows, staged in shared memory as fp32 [kParts][rows][kRowFloats] (the
// parts summed in order: the narrow kernel's consumer warpgroups), stored row-contiguously by
// `threads` threads: per quad, a 16-byte shared load per part and one 8-byte (bf16 output) or
// 16-byte (fp32 partial) global store, whole rows per warp. row_offsets: destination_row_offset
// of each row. (Stored from the accumulators instead, each warp instruction wrote 4- or 8-byte
// pieces of 8 rows.)
template <int kParts, int kRowFloats, int kPartFloats>
__device__ __forceinline__ void store_staged_rows(const SplitArgs& args, const OutputDestination& destination,
                                                  const float* staged, const int64_t* row_offsets, int rows_here,
                                                  int thread, int threads) {
  auto store_rows = [&](auto final_output) {
#pragma unroll 4  // several quads' loads and stores in flight: a visible part of D4's epilogue
    for (int index = thread; index < rows_here * (kLatentDim / 4); index += threads) {
      const int row = index / (kLatentDim / 4), column = 4 * (index % (kLatentDim / 4));
      const float* first = staged + row * kRowFloats + column;
      float4 values = *reinterpret_cast<const float4*>(first);
#pragma unroll
      for (int part = 1; part < kParts; ++part) {
        const float4 more = *reinterpret_cast<const float4*>(first + part * kPartFloats);
        values.x += more.x;
        values.y += more.y;
        values.z += more.z;
        values.w += more.w;
      }
      store_value_quad<decltype(final_output)::value>(args, row_offsets[row], column, values);
    }
  };
  if (destination.final_output) {
    store_rows(std::true_type{});
  } else {
    store_rows(std::false_type{});
  }
}

// The row's LSE (base 2 in): into lse in the requested base, or the split's partial LSE.
__device__ __forceinline__ void store_row_lse(const SplitArgs& args, const OutputDestination& destination,
                                              int batch_index, int m, float lse2) {
  if (destination.final_output) {
    store_final_lse(args, batch_index, m, lse2);
  } else {
    args.partial_lse[partial_row_index(args, destination.split, batch_index, m)] = lse2;
  }
}

// A split without keys for any row of the tile: LSE -inf and (one split) output 0 for its rows,
// without loading anything; an unused split (past the request's split count) writes nothing.
// Returns true when the CTA is done.
__device__ __forceinline__ bool finish_empty_split(const SplitArgs& args, const KeyRange& range, int split,
                                                   int batch_index, int first_row, int rows_here) {
  if (range.tiles > 0) return false;
  if (!range.in_use) return true;
  const OutputDestination destination = output_destination(args, split);
  for (int index = threadIdx.x; index < rows_here * (kLatentDim / 2); index += blockDim.x) {
    const int row = index / (kLatentDim / 2), column = 2 * (index % (kLatentDim / 2));
    store_value_pair(args, destination, batch_index, first_row + row, column, 0.0f, 0.0f, true);
  }
  for (int row = threadIdx.x; row < rows_here; row += blockDim.x) {
    store_row_lse(args, destination, batch_index, first_row + row, -INFINITY);
  }
  return true;
}

}  // namespace openmla::kernels::sm90
