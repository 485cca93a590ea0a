// Dense MLA decode, split-KV attention kernel for few query rows (Sq x Hq <= 32) with an FP8
// cache, on Hopper warpgroup MMA, transposed as narrow_kernel.cuh (the rows are wgmma's N), the
// work split by role.
//
// What: softmax attention of kRows (16 or 32) query rows over one split's keys, V = the first 512
// dims of the cache rows, from the raw e4m3 tiles (never widened in shared memory).
// Roles (512 threads): warpgroups 1 and 2 score the even and the odd tiles (S^T = K Q^T on e4m3
// wgmma, the online softmax, P^T into P buffer t % 2 with each row's rescale factor); warpgroup 0
// runs O^T += V^T P^T over all 512 value dims for every tile in order; warpgroup 3 is the
// producer (one thread issues the TMA). So two score chains and the output chain run at once
// on three tiles. (Until session 31 two (32 rows) or three (16 rows) warpgroups took the tiles
// in turn, each with the whole chain of a tile, ~1350 instructions a warp: on an H200 FP8 D2
// Hq 32 stopped at 0.70 of copy with neither the DRAM, the issue slots nor the tensor pipe above
// 47%. One score warpgroup with two output warpgroups was slower than that: its chain bound
// the kernel. Perf log, sessions 30 and 31.)
// Tiling: key tiles of 64 tokens.
// - S^T (64 keys x kRows): e4m3 wgmma m64nNk32, 18 steps, A = the raw tile as the TMA landed it
//   (128-dim boxes, 128-byte swizzle: key_tiles.cuh wide_raw_offset), B = Q's e4m3 lines (an fp8
//   q as it is, N = kRows; a bf16 q as high and low parts, N = 2 kRows, summed after,
//   fp8_tiles.cuh E4m3QueryRows, loaded and split by the score warpgroups: see the kernel), in
//   3 segments of steps (2 at 32 rows with an fp8 q) accumulated afresh and added in fp32
//   (e4m3 wgmma keeps ~13 bits of each step; alternating_kernel.cuh says what they cost).
// - softmax over keys (M): the reference is lazy (it moves only when a row maximum passes it by
//   2^8), so a vote of the score warpgroup comes first (bar.red): only if some score passes the
//   group's last reference by that, row maxima over the 8 lanes that share a row, then over the
//   4 warps through shared memory (one named barrier; its exchange alternates between two
//   buffers so that the next tile's writes cannot overtake this tile's reads); then the
//   reference from the other score warpgroup's after tile t - 1; each group keeps its row sums
//   against its own last reference and rescales them at the end.
// - O^T (512 dims x kRows) += V^T P^T: 4 k steps x 8 M tiles of fp16 wgmma m64nNk16, A = V^T
//   fragments widened from the raw tile in registers (fp8_fragments.cuh WideValueFragments: one
//   ldmatrix.trans per 16 values), B = P^T; batches of 2 k steps x 2 M tiles, each batch's
//   bytes loaded before the wait for the batch that still holds its buffer, widened after it (the
//   loads' latency runs beside the wait: FP8 D2 -4..9% cycles on an H200, perf log session 32).
// Handoffs (mbarriers): reference_published[b] (score group of tile t -> the other: the
// reference after tile t, b = t % 2), published[b] (score -> output: tile t's P^T, factors and
// moved flag), consumed[b] (output -> score: tile t's products are done, buffer b may be
// rewritten for t + 2), scores_met (the score groups: Q loaded, row sums in), finished (score ->
// output: the rows' normalisers; the score warpgroup stores the LSEs after it, and the output
// warpgroup works out its rows' offsets itself before tile 0). The raw stages are released by
// the output warpgroup once a tile's V^T is in registers; a score warpgroup's reads of the stage
// end before it publishes the tile, so before that.
// Epilogue (as narrow_kernel.cuh): the output warpgroup stores a split's fp32 partial rows
// straight from its accumulators, and stages the bf16 output's normalised rows (dims in the
// fragments' order, transposed_value_dim, restored here) in the free key stages to store them
// row-contiguously; either way each row's stores at constant offsets from one address. A
// one-tile CTA (D4) runs all of this once and cold, so its instruction count is its time.
// Row tiles as narrow_kernel.cuh's (one of <= 32 rows, or 16-row tiles of up to 64).
// Limits: tiles of 16 or 32 rows, FP8 E4M3 cache, q bf16 (as e4m3 parts) or e4m3 (an fp16 q
// takes an fp16 cache only).
#pragma once

#include "kernels/sm90/dense_decode/fp8_tiles.cuh"
#include "kernels/sm90/dense_decode/narrow_kernel.cuh"

namespace openmla::kernels::sm90 {

// D (64 x kRows) += A (an fp16 m64k16 fragment in registers) * B (K-major fp16, kRows lines).
template <int kRows>
__device__ __forceinline__ void wgmma_rows_a_registers(float (&d)[kRows / 2], const uint32_t (&a)[4], uint64_t b,
                                                       bool accumulate) {
  if constexpr (kRows == 16) {
    wgmma_64x16x16_a_registers<true>(d, a, b, accumulate);
  } else {
    wgmma_64x32x16_a_registers<true>(d, a, b, accumulate);
  }
}

// D (64 x kLines) += A (K-major e4m3: the raw key tile) * B (K-major e4m3: Q's lines), k 32.
template <int kLines>
__device__ __forceinline__ void wgmma_lines_fp8(float (&d)[kLines / 2], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (kLines == 16) {
    wgmma_64x16x32_fp8(d, a, b, accumulate);
  } else if constexpr (kLines == 32) {
    wgmma_64x32x32_fp8(d, a, b, accumulate);
  } else {
    static_assert(kLines == 64, "16, 32 or 64 query lines");
    wgmma_64x64x32_fp8(d, a, b, accumulate);
  }
}

template <bool kFp8Q, int kRows>
struct NarrowFp8Layout {
  static_assert(kRows == 16 || kRows == 32, "16 or 32 query rows");
  static constexpr int kQueryLines = kFp8Q ? kRows : 2 * kRows;
  // Warpgroup 0: the output; 1 and 2: the scores of the even / odd tiles; 3: the producer.
  static constexpr int kThreads = 512;
  static constexpr int kProducerGroup = 3;
  // Registers after setmaxnreg: 128 x output + 2 x 128 x score + 128 x 24 <= 64 K (512 threads
  // launch with 128 each). The output warpgroup holds O^T (8 x kRows / 2 fp32) and two batches
  // of V^T fragments (32); a score warpgroup S^T's segments (kQueryLines) and the softmax state.
  // An fp8 q's score warpgroups need fewer (kQueryLines = kRows): with 200 the output's wgmma
  // were serialised at 32 rows (C7512) once its next fragments' loads ran beside the wait.
  static constexpr int kOutputRegisters = kFp8Q ? 208 : 200, kScoreRegisters = kFp8Q ? 136 : 144;
  static_assert((kOutputRegisters - 128) + 2 * (kScoreRegisters - 128) <= 128 - kProducerRegisters,
                "the consumers' setmaxnreg.inc must be satisfiable");
  static constexpr int kQuery = 0;  // 9 blocks of [kQueryLines][64 bytes]
  static constexpr int kKeys = kDimBlocks * kQueryLines * 64;
  // Five raw stages where they fit beside Q, the P buffers and the small arrays below (< 4 KB):
  // all but 32 rows of a bf16 q, whose 64 e4m3 lines take 36 KB. More bytes in flight per SM
  // (H200, whole op: with four at 16 rows, D2 Hq 16 was 1% slower than the turn-taking kernel's
  // five; perf log session 31).
  static constexpr int kStages = kKeys + 5 * kWideRawStageBytes + 2 * kRows * 128 + 4096 <= kMaxSharedBytes - 1024 ? 5 : 4;
  static constexpr int kProbabilities = kKeys + kStages * kWideRawStageBytes;  // [2][kRows][64 keys] fp16
  static constexpr int kExchange = kProbabilities + 2 * kRows * 128;  // [score group][2][4 warps][kRows] floats
  static constexpr int kReferences = kExchange + 2 * 2 * 4 * kRows * 4;  // [2][kRows]: the reference after tile t
  static constexpr int kFactors = kReferences + 2 * kRows * 4;          // [2][kRows]: O^T's rescale before tile t
  static constexpr int kSums = kFactors + 2 * kRows * 4;            // [2][kRows]: each score group's row sums
  static constexpr int kNormalizers = kSums + 2 * kRows * 4;        // [kRows]
  static constexpr int kRowFactors = kNormalizers + kRows * 4;      // [kRows]: a bf16 q's 2^s
  static constexpr int kRowOffsets = kRowFactors + kRows * 4;       // [kRows] int64
  static constexpr int kMovedFlags = kRowOffsets + kRows * 8;       // [2] int (+ padding)
  // full[kStages], empty[kStages], published[2], consumed[2], reference_published[2], finished,
  // scores_met, speculative_landed
  static constexpr int kBarriers = kMovedFlags + 16;
  static constexpr int kBytes = kBarriers + (2 * kStages + 9) * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
  // After the last tile the output is staged in the key stages: [kRows][512 + 8] floats (as the
  // 64-row kernel's float2 staging).
  static constexpr int kStagedRowFloats = kLatentDim + 8;
  static_assert(kRows * kStagedRowFloats * 4 <= kStages * kWideRawStageBytes, "output staging fits the stages");
  static_assert(kKeys % 1024 == 0 && kProbabilities % 1024 == 0, "swizzled buffers are 1024-byte aligned");
  static_assert(kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");
};

// kSpeculative: with PDL a split's first tile is issued right after the wait (start_split_cta);
// an instantiation of its own, so that the other launches run the code they ran without it.
template <bool kFp8Q, int kRows, bool kSpeculative = false>
__global__ void __launch_bounds__(NarrowFp8Layout<kFp8Q, kRows>::kThreads, 1)
    dense_decode_narrow_fp8_kernel(const __grid_constant__ KeyMaps maps, SplitArgs args) {
  using Layout = NarrowFp8Layout<kFp8Q, kRows>;
  constexpr int kSlots = kRows / 4;  // query rows per thread (accumulator columns)
  constexpr int kQueryLines = Layout::kQueryLines;
  constexpr int kSegments = kRows == 16 || !kFp8Q ? 3 : 2;  // of S^T's e4m3 steps (see the top)
  constexpr int kStages = Layout::kStages;
  // Named barriers: the output warpgroup (1), score warpgroup g (1 + g), both score warpgroups (4).
  constexpr int kOutputBarrier = 1, kScoresBarrier = 4;
  extern __shared__ uint8_t raw_shared[];
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  uint8_t* stages = shared + Layout::kKeys;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);
  uint64_t* empty = full + kStages;
  uint64_t* published = empty + kStages;
  uint64_t* consumed = published + 2;
  uint64_t* reference_published = consumed + 2;
  uint64_t* finished = reference_published + 2;
  uint64_t* scores_met = finished + 1;
  // Tile 0, issued before the CTA barrier (start_split_cta); null where the kernel does not.
  uint64_t* speculative_landed = kSpeculative ? scores_met + 1 : nullptr;
  auto probabilities = [&](int which) { return shared + Layout::kProbabilities + which * (kRows * 128); };
  float* references = reinterpret_cast<float*>(shared + Layout::kReferences);  // [which][row]
  float* factors = reinterpret_cast<float*>(shared + Layout::kFactors);  // [which][row]
  float* sums = reinterpret_cast<float*>(shared + Layout::kSums);        // [score group][row]
  float* normalizers = reinterpret_cast<float*>(shared + Layout::kNormalizers);
  float* row_factors = reinterpret_cast<float*>(shared + Layout::kRowFactors);
  int64_t* row_offsets = reinterpret_cast<int64_t*>(shared + Layout::kRowOffsets);
  int* moved_flags = reinterpret_cast<int*>(shared + Layout::kMovedFlags);
  // Whole warps signal: the warp reconverges first, so that no lane spins in try_wait while
  // lanes of its own warp (after an `if (lane < 4)` block, say) have yet to arrive.
  auto signal = [](uint64_t* barrier) {
    __syncwarp();
    mbarrier_arrive(barrier);
  };
  // The parity of the phase that tile t completes on a barrier of its buffer (t % 2).
  auto phase_of = [](int tile) { return (tile / 2) % 2; };

  // One row tile of kRows (or of 16 among two to four: decode_plan.h latency_row_tiles).
  const int first_row = int(blockIdx.x) * kRows, rows_here = min(kRows, args.rows - first_row);
  EarlyPages early;
  const CtaWork work =
      start_split_cta<(kFp8Q ? 1 : 2), true>(&maps, args, first_row, rows_here, reinterpret_cast<int*>(stages), &early,
                                             speculative_landed, stages);
  const int batch_index = work.batch_index, split = work.split;
  const KeyRange range = split_key_range(args, work, first_row, rows_here);
  publish_early_pages(early, early_pages_slot<true>(stages));
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, first_row, rows_here)) {
    wait_for_speculative_copy_before_exit(speculative_landed);
    return;
  }
  // Q by both score warpgroups with 32 rows (by one, a bf16 q's loads in flight took 72
  // registers and spilled) and a bf16 q's 16 (in 4-dim units: half the split code a thread,
  // which each CTA runs once and cold); an fp8 q's 16 by the first (8-dim units per row: 72).
  // Loaded after the CTA barrier and split there; with the speculative tile 0 the loads are
  // issued here instead, once the split is known to hold keys (so after the seq_lens read, which
  // loads before it delayed: perf log, session 51), so that their round trip runs beside the
  // barriers' set-up. (Everywhere, that made FP8 D4 B4 / D5 PDL 1.6-2.2% slower: session 52.)
  constexpr int kQueryThreads = kRows == 32 || !kFp8Q ? 256 : 128;
  const bool loads_query = threadIdx.x >= 128 && threadIdx.x < 128 + kQueryThreads;
  const bool loads_early = kSpeculative && loads_query;
  // (rows_here 0 elsewhere: no row is present, so no thread works out a row offset it never uses,
  // and without kSpeculative the object is dead code.)
  E4m3QueryRows<kRows, kQueryThreads, !kFp8Q> early_query(args, batch_index, first_row, loads_early ? rows_here : 0);
  if (loads_early) early_query.load(args);

  init_stage_barriers(full, empty, 128, kStages);
  if (threadIdx.x == 0) {
    for (int which = 0; which < 2; ++which) {
      mbarrier_init(&published[which], 128);
      mbarrier_init(&consumed[which], 128);
      mbarrier_init(&reference_published[which], 128);
    }
    mbarrier_init(finished, 128);
    mbarrier_init(scores_met, 256);
    fence_barrier_init();
  }
  __syncthreads();  // the last barrier of all threads: each role leaves on its own
  const int warpgroup = warpgroup_index<kRows == 16>(), warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  if (warpgroup == Layout::kProducerGroup) {
    set_register_count<kProducerRegisters, false>();
    if (threadIdx.x == Layout::kProducerGroup * 128) {
      produce_key_tiles<true, kStages>(&maps, args, table_row, range, stages, full, empty,
                                       early_pages_slot<true>(stages), speculative_landed);
    }
    return;
  }

  // Accumulator element i of this thread: key (S^T) or dim (O^T) row 16 warp + lane / 4 + 8
  // ((i / 2) % 2), query row (N) 8 (i / 4) + 2 (lane % 4) + i % 2: kSlots rows ("slots"
  // 2 (i / 4) + i % 2) per thread, the same in every warp (so every warp sees all kRows rows).
  auto slot_of = [](int i) { return 2 * (i / 4) + i % 2; };
  auto row_of_slot = [lane](int slot) { return 8 * (slot / 2) + 2 * (lane % 4) + slot % 2; };

  if (warpgroup != 0) {
    // A score warpgroup: tiles first, first + 2, ... (first = its group's index - 1).
    set_register_count<Layout::kScoreRegisters, true>();
    const int first = warpgroup - 1;
    const int own_barrier = 1 + warpgroup;
    // The two score warpgroups meet on an mbarrier, whose arrive (release) / wait (acquire)
    // orders their shared-memory accesses (racecheck did not count named barriers spanning
    // warpgroups, bar.sync 4, 384, as doing so): once Q is in (phase 0), once both groups' row
    // sums are (phase 1).
    auto meet = [&](int phase) {
      __syncwarp();
      mbarrier_arrive(scores_met);
      mbarrier_wait(scores_met, phase);
    };
    if (loads_query) {
      const int barrier = kQueryThreads == 256 ? kScoresBarrier : own_barrier;
      if constexpr (kSpeculative) {
        early_query.store(query, row_factors, barrier);
      } else {
        load_e4m3_query_rows<kRows, kQueryThreads, !kFp8Q>(args, batch_index, first_row, rows_here, query, row_factors,
                                                           barrier);
      }
    }
    meet(0);
    const int lane_row_visible = row_visible_end(args, range, first_row, lane, rows_here);
    int visible[kSlots];
    // reference: the softmax's reference as of this group's last tile (-inf while no key; used
    // as 0 then); running_sum: the sums of this thread's keys, relative to it.
    float logit_scale[kSlots], reference[kSlots], used_reference[kSlots], running_sum[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      visible[slot] = __shfl_sync(0xffffffffu, lane_row_visible, row_of_slot(slot));
      logit_scale[slot] = args.logit_scale_log2 * (kFp8Q ? 1.0f : row_factors[row_of_slot(slot)]);
      reference[slot] = -INFINITY;
      running_sum[slot] = 0.0f;
    }
    const uint64_t query_descriptor = make_descriptor_64b(query, 512);
    // The reference after tile t - 1 (published by the other score warpgroup; -inf: no key yet).
    auto previous_reference = [&](int tile, int slot) {
      return tile == 0 ? -INFINITY : references[((tile - 1) % 2) * kRows + row_of_slot(slot)];
    };
    // Tile 0 lands on full[0] or, issued speculatively, on speculative_landed (start_split_cta);
    // either way both complete (the odd tiles' group waits too, at no cost: its tile 1 needs the
    // reference after tile 0, so tile 0 must have landed anyway). Waited for
    // here rather than at tile 0 in the loop: in the loop its address took a register that the
    // 32-row kernels do not have (C7512).
    if (speculative_landed != nullptr) mbarrier_wait(speculative_landed, 0);
    for (int tile = first; tile < range.tiles; tile += 2) {
      const int stage = warp_uniform(tile % kStages), which = tile % 2;
      const int first_key = range.begin + tile * kTileKeys;
      const int valid = range.length - first_key;
      float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange) + (2 * first + (tile / 2) % 2) * 4 * kRows;
      mbarrier_wait(&full[stage], full_phase<kStages>(tile));
      uint8_t* keys = stages + stage * kWideRawStageBytes;

      // S^T on e4m3 wgmma, 18 k steps of 32 dims straight from the raw tile; a bf16 q's high and
      // low parts are separate query lines, summed here. In kSegments segments of steps, each
      // accumulated afresh and added to the scores in fp32: e4m3 wgmma adds each step to its
      // accumulator at reduced precision (truncated to ~13 bits), and one chain of 18 steps moved
      // LSEs by up to 8e-4 (1 + |LSE|). (Independent accumulators instead of segments made ptxas
      // spill at 32 rows; an array per segment because with one array reused, ptxas took the
      // first segment's values for the later segments' sums.)
      constexpr int kSegmentSteps = kHeadDim / 32 / kSegments;
      static_assert(kSegmentSteps * kSegments * 32 == kHeadDim, "whole segments");
      float scores[kRows / 2];
      // An array per segment, but at 32 rows three arrays spilled (a bf16 q): segment s in
      // terms[s % kTermArrays].
      constexpr int kTermArrays = kRows == 16 ? kSegments : 2;
      float terms[kTermArrays][kQueryLines / 2];
      const uint64_t key_descriptor = make_descriptor(keys, 16, RawTileParts::group_stride(0));  // (wide_raw_offset)
      const int rope_first_dim = raw_rope_first_dim(args.page_shift);
#pragma unroll
      for (int segment = 0; segment < kSegments; ++segment) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kSegmentSteps; ++k) {
          const int step = segment * kSegmentSteps + k, offset = (step % 2) * 32;
          wgmma_lines_fp8<kQueryLines>(terms[segment % kTermArrays],
                                       raw_key_step_descriptor(key_descriptor, step, rope_first_dim),
                                       advance_descriptor(query_descriptor, (step / 2) * (kQueryLines * 64) + offset),
                                       k > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();  // (one segment at a time: both segments' terms at once spilled)
        float(&segment_terms)[kQueryLines / 2] = terms[segment % kTermArrays];
        fence_accumulators(segment_terms);
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) {
          const float sum = kFp8Q ? segment_terms[i] : segment_terms[i] + segment_terms[i + kRows / 2];
          scores[i] = segment == 0 ? sum : scores[i] + sum;
        }
      }
      // Slots past the sequence end may hold NaN: S^T's mask drops them, but the output
      // warpgroup's V^T fragments (after the publish handoff, which orders these stores) must
      // read zeros (P = 0 times NaN is NaN). Only the value blocks, after S^T has read the tile.
      if (valid < kTileKeys) RawTileParts::zero_lines<kLatentDim / kWideRawBoxDims>(keys, valid, threadIdx.x % 128, 128);

      // Online softmax over keys, base 2: the tile's row maxima over this group's 4 warps, then
      // the reference through tile t, from the other group's through tile t - 1. The lazy
      // reference moves only where a row maximum passes the reference before the tile by more
      // than kReferenceSlackLog2, and that reference is at least this group's own last one; so
      // where no score passes that by the slack (one vote of the warpgroup: most tiles once the
      // rows have seen keys) the maxima are not needed and their shuffles, shared-memory exchange
      // and second barrier are skipped (they queue behind the other roles' shared-memory traffic).
      float tile_max[kSlots], row_max[kSlots];
      mask_scores<kRows>(scores, tile_max, visible, first_key, warp, lane, slot_of,
                         [&](int slot) { return logit_scale[slot]; });
      // (A group's first tile always shares: its reference is -inf. Without a vote, so that a
      // split of one or two tiles, D4's, pays none.)
      lazy_row_maxima<kRows>(tile_max, reference, tile == first, own_barrier, warp, lane, row_of_slot, exchange, row_max);
      if (tile > 0) mbarrier_wait(&reference_published[1 - which], phase_of(tile - 1));
      // Lazy reference (as the 64-row kernel's, kReferenceSlackLog2): it moves only when the
      // tile's row maximum passes it by more than 2^8, so that most tiles leave O^T's factors 1
      // and the output warpgroup skips the rescale of its accumulators (its chain bounds the
      // kernel). p <= 2^8 keeps its relative precision in fp16. (A NaN maximum compares false.)
      float new_reference[kSlots], factor[kSlots];
      bool moved = false;
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) {
        const float before = previous_reference(tile, slot);
        new_reference[slot] = row_max[slot] > before + kReferenceSlackLog2 ? row_max[slot] : before;
        const float used = new_reference[slot] == -INFINITY ? 0.0f : new_reference[slot];  // no key yet: p = 0
        factor[slot] = fast_exp2(before - used);  // O^T's (0 before a row's first key: O^T is 0 there)
        moved |= factor[slot] != 1.0f && before != -INFINITY;
        running_sum[slot] *= fast_exp2(reference[slot] - used);
        reference[slot] = new_reference[slot];
        used_reference[slot] = used;
      }
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int slot = 0; slot < kSlots; ++slot) references[which * kRows + row_of_slot(slot)] = new_reference[slot];
      }
      // (This group's reads of the other group's reference precede the arrive; that group writes
      // its buffer again only after waiting for it.)
      signal(&reference_published[which]);
      // Every warp holds every row (lanes 4 apart share rows), so this is the same in all warps.
      moved = __any_sync(0xffffffffu, moved);

      if (tile >= 2) mbarrier_wait(&consumed[which], phase_of(tile - 2));  // tile t - 2's products are done
      store_transposed_probabilities<true, kRows>(scores, used_reference, probabilities(which), nullptr, warp, lane,
                                                  slot_of, [&](int slot, float p) { running_sum[slot] += p; });
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int slot = 0; slot < kSlots; ++slot) factors[which * kRows + row_of_slot(slot)] = factor[slot];
        if (lane == 0) moved_flags[which] = moved;
      }
      fence_shared_for_async_proxy();  // P^T is read by wgmma
      signal(&published[which]);
    }

    // Row sums: this thread's keys, the 8 lanes of the row, the 4 warps (through an exchange
    // buffer of this group's, whose last reads were before its last tile's barrier), then
    // rescaled to the last tile's reference and added over both groups.
    const int last = range.tiles - 1;
    if (last % 2 != first) mbarrier_wait(&reference_published[last % 2], phase_of(last));
    float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange) + 2 * first * 4 * kRows;
    sync_named(own_barrier, 128);  // (the exchange: a warp may still read its last tile's maxima)
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll
      for (int mask = 4; mask < 32; mask *= 2) running_sum[slot] += __shfl_xor_sync(0xffffffffu, running_sum[slot], mask);
      if (lane < 4) exchange[warp * kRows + row_of_slot(slot)] = running_sum[slot];
    }
    sync_named(own_barrier, 128);
    if (warp == 0 && lane < 4) {
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) {
        const int row = row_of_slot(slot);
        const float final_reference = references[(last % 2) * kRows + row];
        const float sum = exchange[row] + exchange[kRows + row] + exchange[2 * kRows + row] + exchange[3 * kRows + row];
        // (A group without keys in the row has sum 0, whatever its reference.)
        sums[first * kRows + row] = sum == 0.0f ? 0.0f : sum * fast_exp2(reference[slot] - final_reference);
      }
    }
    meet(1);
    // The finished rows: each row's normaliser, handed to the output warpgroup at once (its
    // stores wait for it), then the LSEs (stored after the handoff; the rows' output offsets
    // are the output warpgroup's own, worked out before its first tile). In the order
    // normaliser, LSE, offset before the handoff, the output warpgroup waited ~0.6 us for this
    // code after its last products (FP8 D4 B1 PDL on an H200, perf log session 62). At 16 rows
    // one thread per row (lane `row` of the first group's warp 0): by the 4 lanes that hold a
    // row's sums, per accumulator slot, this was kSlots unrolled copies of code that each CTA runs
    // once and cold (FP8 D4 B1 / B2 / B4 PDL -5..6%, H100, perf log session 43). At 32 rows any
    // other form of this code (one thread per row; the slot loop rolled) made ptxas serialise
    // the kernel's wgmma with a bf16 q (C7512: its output warpgroup's 200 registers are at the
    // edge), so the slots stay unrolled there.
    constexpr int kFinishingLanes = kRows == 16 ? kRows : 4, kRowsPerLane = kRows == 16 ? 1 : kSlots;
    auto lane_row = [&](int index) { return kRows == 16 ? lane : row_of_slot(index); };
    const bool finishes_rows = first == 0 && warp == 0 && lane < kFinishingLanes;
    float row_lse2[kRowsPerLane];
    if (finishes_rows) {
#pragma unroll
      for (int index = 0; index < kRowsPerLane; ++index) {
        const int row = lane_row(index);
        const FinishedRow done = finish_row<true>(args, sums[row] + sums[kRows + row],
                                                  references[(last % 2) * kRows + row], row < rows_here);
        normalizers[row] = done.normalizer;
        row_lse2[index] = done.lse2;
      }
    }
    if (first == 0) signal(finished);
    if (finishes_rows) {
      const OutputDestination destination = output_destination(args, split);
#pragma unroll
      for (int index = 0; index < kRowsPerLane; ++index) {
        const int row = lane_row(index);
        if (row < rows_here) store_row_lse(args, destination, batch_index, first_row + row, row_lse2[index]);
      }
    }
    return;
  }

  // The output warpgroup: O^T over all 512 dims (8 M tiles in the fragments' dim order:
  // fp8_fragments.cuh), in batches of two k steps (32 keys) x 2 M tiles, the next batch loaded and
  // widened while one runs.
  set_register_count<Layout::kOutputRegisters, true>();
  // Each row's destination offset (a division by the head count and a 64-bit index chain),
  // while this warpgroup waits for tile 0's P^T rather than after the last tile (the score
  // warpgroup worked it out there, on the way to the stores: see the finished rows above).
  if (warp == 0 && lane < rows_here) {
    row_offsets[lane] = destination_row_offset(args, output_destination(args, split), batch_index, first_row + lane);
  }
  sync_named(kOutputBarrier, 128);  // (row_offsets: written by warp 0, read by every warp's stores)
  constexpr int kTiles = kLatentDim / 64, kBatches = (kTileKeys / 32) * (kTiles / 2);
  float output[kTiles][kRows / 2];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) output[j][i] = 0.0f;
  }
  // V^T fragments by ldmatrix.trans from the wide raw tile (fp8_fragments.cuh WideValueFragments:
  // one ldmatrix.x4 per 16 values of a thread, keys in P^T's natural order): dims 0..255 and
  // 256..511.
  const WideValueFragments value_readers[2] = {WideValueFragments(0, warp, lane), WideValueFragments(1, warp, lane)};
  constexpr int kBuffers = 2;
  uint32_t fragments[kBuffers][4][4];  // [buffer][M tile a, a + 1 x k step 2 h, 2 h + 1][register]
  if (speculative_landed != nullptr) mbarrier_wait(speculative_landed, 0);  // (as in the score warpgroups)
  // Each tile's products are waited for at its end (run on into the next tile, ptxas serialised
  // every wgmma: C7513), so a rescale needs no wait and the P buffer is handed back at once.
  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = warp_uniform(tile % kStages), which = tile % 2;
    mbarrier_wait(&published[which], phase_of(tile));
    if (moved_flags[which] != 0) {
      float factor[kSlots];
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) factor[slot] = factors[which * kRows + row_of_slot(slot)];
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) output[j][i] *= factor[slot_of(i)];
      }
    }
    mbarrier_wait(&full[stage], full_phase<kStages>(tile));  // (landed long ago: for the TMA bytes' visibility)
    const uint8_t* keys = stages + stage * kWideRawStageBytes;
    const uint64_t probability_descriptor = make_descriptor(probabilities(which), 16, 1024);
    // Batch b: keys 32 h .. 32 h + 31 (h = b / 4) of M tiles 2 (b % 4) and 2 (b % 4) + 1. Its
    // bytes are loaded before the wait for the batch that still holds its buffer and widened after
    // it, so that the loads' latency runs beside the wait.
    auto load_raw_batch = [&](int batch, uint32_t(&matrices)[2][4]) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int tile_index = 2 * (batch % 4) + m;
        value_readers[tile_index / 4].load_raw(keys, tile_index % 4, batch / 4, matrices[m]);
      }
    };
    auto widen_batch = [](const uint32_t(&matrices)[2][4], uint32_t(&into)[4][4]) {
#pragma unroll
      for (int m = 0; m < 2; ++m) WideValueFragments::widen(matrices[m], into[2 * m], into[2 * m + 1]);
    };
    // At 16 rows the bytes of batches b + 1 and b + 2 are in flight while batch b runs (kLoadAhead
    // 2): loaded one batch ahead, each batch's byte permutes waited for its ldmatrix (ptxas
    // places the widening of b + 1 among b's wgmmas). H200 cycles: FP8 D2 Hq16 -2.5..3.2%; at 32
    // rows -0.7% (fp8 q) / +0.8% (bf16 q, whose output path then spills 56 bytes): one ahead.
    constexpr int kLoadAhead = kRows == 16 ? 2 : 1;
    uint32_t matrices[kLoadAhead][2][4];  // [batch % kLoadAhead]: raw V^T bytes
#pragma unroll
    for (int batch = 0; batch < kLoadAhead; ++batch) load_raw_batch(batch, matrices[batch]);
    widen_batch(matrices[0], fragments[0]);
#pragma unroll
    for (int batch = 0; batch < kBatches; ++batch) {
      const int half = batch / 4, first_tile = 2 * (batch % 4);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        wgmma_rows_a_registers<kRows>(output[first_tile + j / 2], fragments[batch % kBuffers][j],
                                      advance_descriptor(probability_descriptor, 32 * (2 * half + j % 2)), true);
      }
      wgmma_commit();
      if (batch + kLoadAhead < kBatches) load_raw_batch(batch + kLoadAhead, matrices[batch % kLoadAhead]);
      if (batch + 1 < kBatches) {
        wgmma_wait<kBuffers - 1>();  // batch - 1 (the other buffer's last user) is done
        widen_batch(matrices[(batch + 1) % kLoadAhead], fragments[(batch + 1) % kBuffers]);
      }
    }
    mbarrier_arrive(&empty[stage]);  // every byte of the raw tile this thread reads is in registers
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < kTiles; ++j) fence_accumulators(output[j]);
    signal(&consumed[which]);
  }
  mbarrier_wait(finished, 0);
  float normalizer[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) normalizer[slot] = normalizers[row_of_slot(slot)];
  // O^T's dims are in the fragments' order (transposed_value_dim): accumulator rows r and r + 8
  // of an M tile are adjacent dims of one query row, one float2.
  static_assert(transposed_value_dim(0, 0, 8) == transposed_value_dim(0, 0, 0) + 1, "rows g, g + 8: adjacent dims");
  const OutputDestination destination = output_destination(args, split);
  // Accumulator elements i and i + 2 ((i / 2) % 2 == 0) of M tile j are two adjacent dims of
  // query row row_of_slot(slot_of(i)): 64 j + lane_dims and the next. A row's stores are then
  // at constant offsets from one address (with each store's dim and row test worked out in the
  // loop, ptxas recomputed the dim and branched around every store: ~12 instructions a store,
  // ~400 in all, of code that a D4 CTA runs once and cold; perf log session 62).
  const int lane_dims = transposed_value_dim(0, 0, accumulator_row(warp, lane, 0));
  static_assert(transposed_value_dim(1, 3, 5) == 64 * 7 + transposed_value_dim(0, 0, 5), "M tile j: dims 64 j on");
  // Row `i`'s (slot_of(i)) normalised pairs at row_dims + 64 j (the row's lane_dims).
  auto store_row_pairs = [&](int i, float* row_dims) {
    const float factor = normalizer[slot_of(i)];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      *reinterpret_cast<float2*>(row_dims + 64 * j) = make_float2(output[j][i] * factor, output[j][i + 2] * factor);
    }
  };
  if (!destination.final_output) {
    // A split's fp32 partial rows straight from the accumulators, as the 16-bit kernel's: a
    // warp's float2 store is 16 consecutive dims of 4 rows, whole 32-byte sectors, so no
    // staging. Rows past rows_here have no destination; a row without keys stores zeros (its
    // LSE is -inf, so the combine step never reads them).
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const int row = row_of_slot(slot_of(i));
      if ((i / 2) % 2 != 0 || row >= rows_here) continue;  // row r + 8: element i + 2
      store_row_pairs(i, args.partial_out + row_offsets[row] + lane_dims);
    }
    return;
  }
  // The final bf16 rows: O^T -> shared [row][dim] floats (the key stages are free once every
  // warp's last V^T loads are done), so that rows are stored contiguously.
  sync_named(kOutputBarrier, 128);
  float* staged = reinterpret_cast<float*>(stages);
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) {
    if ((i / 2) % 2 != 0) continue;  // accumulator row r + 8: element i + 2
    store_row_pairs(i, staged + row_of_slot(slot_of(i)) * Layout::kStagedRowFloats + lane_dims);
  }
  sync_named(kOutputBarrier, 128);
  store_staged_rows<1, Layout::kStagedRowFloats, 0>(args, destination, staged, row_offsets, rows_here, threadIdx.x,
                                                    128);
}

}  // namespace openmla::kernels::sm90
