// Split-KV planning for the decode ops. The plan depends on shapes only (batch, query tokens,
// heads) and the device's SM count, never on seq_lens values, so the workspace a caller
// allocates once stays valid for every later call of the same shape and for CUDA-graph
// replays: the per-request split boundaries (and, in a balanced plan, how many of the splits
// each request uses) are derived on the device from seq_lens.
#pragma once

#include <cstddef>
#include <cstdint>

#include "openmla/tensor.h"

namespace openmla {

// Upper bound on how many KV splits one (request, row tile) is cut into. The split kernels
// write a partial output and LSE per split, merged by a combine step.
// 128 lets a single long request (D5: B 1, 32K keys) spread over all 132 SMs of an H100/H200.
constexpr int64_t kMaxDecodeSplits = 128;

// Query rows (Sq tokens x Hq heads of one request, folded into the tensor-core M dimension,
// TokenSpeed's fold_sq_factor idea) handled by one CTA of the dense decode kernel.
constexpr int64_t kDecodeRowsPerTile = 64;
// Rows per CTA of latency_row_tiles (below).
constexpr int64_t kDecodeLatencyRowsPerTile = 16;

// Balanced plans. When the requests alone fill the GPU (one split is the best uniform plan),
// the grid still has kBalancedSplits splits per request, and the device decides per request,
// from every request's length, how many of them it uses: a request gets a second split only
// when the lengths differ (by more than 1/8 of the mean), and only when it is longer than a
// chunk of 1/kBalancedChunksPerSm of an SM's fair share of the keys. Without it, a batch of
// ragged lengths runs as long as its longest requests (list scheduling of a few CTAs per SM:
// a simulation of PERF.md's D3 gave 0.80 of the ideal, 0.89-0.91 with the balanced splits).
// The workspace holds 2 partial rows (2 KB each) per query row (FlashMLA's: B + #SMs rows per
// (token, head)), 134 MB for D3's 32K rows: plans of more than kMaxBalancedRows query rows
// keep the uniform plan (no workspace), and so do batches above kMaxBalancedBatch (every CTA
// reads all seq_lens).
constexpr int64_t kBalancedSplits = 2;
constexpr int64_t kBalancedChunksPerSm = 4;
constexpr int64_t kMaxBalancedBatch = 1024;
constexpr int64_t kMaxBalancedRows = 65536;  // B x Sq x Hq: at most 269 MB of workspace

// Keys a split gets at least (one key tile: below that a CTA's fixed cost outweighs its work).
constexpr int64_t kDecodeMinKeysPerSplit = 64;

struct DenseDecodePlan {
  int64_t rows_per_tile = kDecodeRowsPerTile;  // or kDecodeLatencyRowsPerTile (above)
  int64_t row_tiles = 1;  // ceil(Sq * Hq / rows_per_tile) CTAs per (request, split)
  int64_t splits = 1;     // KV splits per request in the grid; 1 = no combine step
  bool balanced = false;  // splits used per request decided on the device (above)
};

// Splits so that the (request, row tile, split) CTAs fill whole waves of one CTA per SM, with
// a 2% cost per split (decode_plan.cpp); a balanced plan where that gives one split. From
// shapes and the SM count only.
DenseDecodePlan plan_dense_decode(int64_t batch, int64_t query_tokens, int64_t heads,
                                  int sm_count);

// Multiprocessors of `device` (the current CUDA device for host tensors); 132 (an H100 / H200)
// where there is none, so that a CPU-only build answers the workspace query the same way for
// the same shapes. The workspace check and the launch must both ask for the tensors' device:
// the current device may differ (and have another SM count, hence more splits).
int planning_sm_count(Device device);

// A uniform plan for requests of at most max_seq_len keys (> 0; 0: no bound, the plan as it is)
// keeps no more splits than such a request fills: one per kDecodeMinKeysPerSplit keys, times
// splits_per_tile (2 where two splits share a tile's keys: the 16-bit narrow kernel's value
// halves). Splits past that would get no keys and only cost their launch and their empty
// partials (FP8 D4 B1 PDL: 7.6% on an H100, perf log session 49). Balanced plans are kept.
// A hint only: the kernels spread each request's real length over the plan's splits.
DenseDecodePlan bound_decode_splits(DenseDecodePlan plan, int64_t max_seq_len, int64_t splits_per_tile);

// The bound a launch plans for (0: none): the caller's max_seq_len (0: none) and the block
// table's capacity, table_columns * page_size, which bounds every seq_lens[b] by the op's
// contract. Both are fixed when a graph is captured. So a table sized to the longest request
// (FlashMLA's and TokenSpeed's tests size theirs so) needs no max_seq_len; an engine's table
// for its longest context bounds little.
int64_t decode_length_bound(int64_t max_seq_len, int64_t table_columns, int64_t page_size);

// 17..64 rows (multi-token prediction: Sq 2 or 4 x 16 heads) in row tiles of 16 (two to four),
// where one wave of them still splits every request in two or more (B <= 33 / 16 on 132 SMs)
// and the length bound (decode_length_bound) gives each CTA at most max_tiles_per_cta key tiles;
// else `plan` (bounded, bound_decode_splits). Each CTA's chain is the 16-row narrow kernel's,
// much shorter than the 32-row one's or the 64-row kernel's (D4 at Sq 2 / Sq 4, B1, PDL: FP8 13.0
// -> 10.2 us / 17.3 -> 10.8; H200, perf log session 54), but the CTAs of a (request, split) each
// take its key tiles into their SM: a stream of many tiles a CTA (D2's lengths at B 32, Sq 2)
// was 15-27% slower. Never more splits than `plan`.
DenseDecodePlan latency_row_tiles(const DenseDecodePlan& plan, int64_t batch, int64_t rows, int64_t length_bound,
                                  int sm_count, int64_t max_tiles_per_cta);

// Bytes of scratch for split-KV decode with `splits` splits: per (split, request, token, head)
// a partial output of `value_dim` floats and one LSE float, then one int32 per request (the
// splits a balanced plan used); 0 when splits == 1 (no combine).
size_t decode_split_workspace_bytes(int64_t batch, int64_t query_tokens, int64_t heads,
                                    int64_t value_dim, int64_t splits);

// The workspace a decode op with query q [B, Sq, Hq, D] needs: its split plan on q's device,
// 512-wide partial outputs. 0 for a q of another rank (validation reports that).
size_t decode_workspace_bytes(const TensorView& q);

}  // namespace openmla
