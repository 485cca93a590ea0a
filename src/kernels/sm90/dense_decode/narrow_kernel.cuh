// Dense MLA decode, split-KV attention kernel for few query rows (Sq x Hq <= 32: Hq = 16 heads
// per GPU at tensor parallelism 8, Sq 2 x 16 heads with one speculative token, 32 heads) with a
// 16-bit cache, on Hopper warpgroup MMA, transposed. (An FP8 cache: narrow_fp8_kernel.cuh.)
//
// What: as alternating_kernel.cuh (softmax attention of the rows over one split's keys, V = the first
// 512 dims of the cache rows), but computed as S^T = K Q^T and O^T = V^T P^T, so that the query
// rows are wgmma's N (kRows = 16 or 32) instead of M (64): a 64-row kernel would spend 3/4 of
// its tensor work on padding rows here, which made 16-head decode compute-bound.
// Roles: one consumer warpgroup (the math) + a producer warp (one thread issues the TMA, as in
// the alternating kernel: key_tiles.cuh).
// Tiling: key tiles of 64 tokens.
// - S^T (64 keys x kRows): wgmma m64nNk16, 36 steps over 4 independent accumulators; A = the K
//   tile (K-major), B = Q.
// - softmax over keys (the M direction), with a lazy reference (it moves only when a row maximum
//   passes it by 2^8): a vote of the warpgroup first; only if some score passes the reference by
//   that, row maxima reduced across the 8 lanes that share a row, then across the 4 warps
//   through shared memory; P^T written to shared memory.
// - O^T (512 dims x kRows) += V^T P^T: 8 x 4 wgmma m64nNk16 per tile, A = V read M-major
//   (tnspA) from the same K tile, B = P^T; 4 kRows fp32 accumulators per thread. Eight more
//   with A = ones sum the rows of P^T and of P's rounding residuals (P - P^T) into a ninth
//   accumulator block (every M row of it a row sum, in the thread that holds the row's O^T),
//   rescaled with O^T: the row sums need no shuffles, exchange or barrier at the end.
// Shared memory: Q (9 swizzled blocks of kRows 128-byte lines), P^T and the residuals, the ones,
// the maxima exchange, and two 72 KB key stages. 32-row tiles moved D2 Hq 32 off the 64-row
// kernel (431 -> 419 us on an H100, as fast as Hq 16).
// Pipeline: the next tile streams in while tile t is computed; two warpgroup barriers per tile
// (one more when the reference moves, one more when the tile is partial). A tile lands in three
// parts (kParts), S^T starting on the first. With PDL, for a uniform plan of one wave (D4, D5),
// a split's first part is issued right after the wait from the entries read before it
// (kSpeculative; key_tiles.cuh start_split_cta).
// Softmax, epilogue: as the alternating kernel (base-2 online softmax with -inf guards; one split
// writes bf16 output and LSE, several write fp32 partials for the combine step). The bf16 output
// is staged through shared memory so that the stores are row-contiguous; fp32 partials go
// straight from the accumulators (a warp's store covers whole 32-byte sectors of 4 rows).
// Value halves (16 rows; split_common.cuh key_range_of): where a request has at most half as many
// tiles as the grid has splits (D4 B1), two CTAs take each tile, both computing S^T and the
// softmax, each O^T and the partial stores for 256 of the 512 value dims.
// Row tiles (blockIdx.x): one of Sq * Hq <= 32 rows, or 16-row tiles of up to 64 rows where the
// plan cuts a request's rows so for latency (decode_plan.h latency_row_tiles).
// Limits: tiles of 16 or 32 rows, bf16 / fp16 q and cache.
#pragma once

#include "kernels/generic/convert.cuh"
#include "kernels/sm90/dense_decode/key_tiles.cuh"
#include "kernels/sm90/dense_decode/split_common.cuh"

namespace openmla::kernels::sm90 {

constexpr int kNarrowRows = 32;  // the most query rows of the narrow kernel's tile (16 or 32)
constexpr int kNarrowGroupThreads = 128;  // one consumer warpgroup
// The launcher's choice of kernel. 32 rows are
// Sq 2 x 16 heads (speculative decoding at tensor parallelism 8) or 32 heads.
__host__ __device__ constexpr bool uses_narrow_kernel(int rows) { return rows <= kNarrowRows; }
static_assert(kDecodeLatencyRowsPerTile == 16, "the plan's latency row tiles (decode_plan.h) are 16-row CTAs");

template <int kRows>
struct NarrowLayout {
  static_assert(kRows == 16 || kRows == 32, "16 or 32 query rows");
  static constexpr int kThreads = kNarrowGroupThreads + 32;  // the consumers + a producer warp
  static constexpr int kStages = 2;
  // A tile lands in its three parts (KeyTileParts), each on its own full barrier, so that S^T
  // starts on the first part while the rest streams in (a CTA of D4 / D5 computes one to four
  // tiles, the first straight after it lands: kernel time D4 B4 -2.9%, D5 -2.2%, perf log
  // session 30).
  static constexpr int kParts = KeyTileParts::kParts;
  static constexpr int kQuery = 0;  // 9 swizzled blocks of kRows lines
  static constexpr int kKeys = kDimBlocks * kRows * 128;  // the stages
  static constexpr int kProbabilities = kKeys + kStages * kTileBlockBytes;  // P^T
  static constexpr int kResiduals = kProbabilities + kRows * 128;  // P - P^T, as P^T
  // 16-bit ones, the A operand whose product with P^T is each row's sum of P (kOnesBytes: an
  // m64 x k16 M-major operand with the 128-byte swizzle reads 2 KB; room for either stride).
  static constexpr int kOnes = kResiduals + kRows * 128;
  static constexpr int kOnesBytes = 4096;
  static constexpr int kExchange = kOnes + kOnesBytes;  // [4 warps][kRows]; the final rows' LSEs
  // full[kStages x kParts], empty[kStages], speculative_landed
  static constexpr int kBarriers = kExchange + 4 * kRows * 4;
  static constexpr int kBytes = kBarriers + (kStages * kParts + kStages + 1) * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
  // After the last tile the key stages hold each row's destination offset (int64) and, for the
  // bf16 output, the staged rows: [kRows][512 + 4] floats (the padding puts the 4 rows that one
  // store instruction of a warp writes in distinct banks).
  static constexpr int kStagedRowFloats = kLatentDim + 4;
  static constexpr int kStagedRowOffsets = kRows * kStagedRowFloats * 4;
  static_assert(kStagedRowOffsets + kRows * 8 <= kStages * kTileBlockBytes, "output staging fits the stages");
  static_assert(kKeys % 1024 == 0 && kOnes % 1024 == 0, "swizzled stages and the ones are 1024-byte aligned");
  static_assert(kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");
};

// Named barrier 1: the consumer warpgroup.
__device__ __forceinline__ void sync_narrow_consumers() { sync_named(1, kNarrowGroupThreads); }

// D (64 x kRows) += A * B, A from shared memory: K-major (S^T = K Q^T) or M-major (O^T = V^T P^T,
// V read from the key tile as [key][dim]).
template <bool kHalf, int kRows>
__device__ __forceinline__ void wgmma_rows(float (&d)[kRows / 2], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (kRows == 16) {
    wgmma_64x16x16<kHalf>(d, a, b, accumulate);
  } else {
    wgmma_64x32x16<kHalf>(d, a, b, accumulate);
  }
}
template <bool kHalf, int kRows>
__device__ __forceinline__ void wgmma_rows_a_m_major(float (&d)[kRows / 2], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (kRows == 16) {
    wgmma_64x16x16_a_m_major<kHalf>(d, a, b, accumulate);
  } else {
    wgmma_64x32x16_a_m_major<kHalf>(d, a, b, accumulate);
  }
}

// The transposed kernels' softmax, first step (this one and narrow_fp8_kernel.cuh): S^T's
// scores of a tile (element i of a thread: key 16 warp + lane / 4 + 8 ((i / 2) % 2), query row
// row_of_slot(slot_of(i))) scaled to base-2 logits by scale_of(slot) and masked to -inf past each
// row's visible end; into tile_max, this thread's maximum of each of its rows (fmaxf: NaN scores
// do not count unless all are NaN).
template <int kRows, class SlotOf, class ScaleOf>
__device__ __forceinline__ void mask_scores(float (&scores)[kRows / 2], float (&tile_max)[kRows / 4],
                                            const int (&visible)[kRows / 4], int first_key, int warp, int lane,
                                            SlotOf slot_of, ScaleOf scale_of) {
  constexpr int kSlots = kRows / 4;
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) tile_max[slot] = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) {
    const int key = first_key + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    scores[i] = key < visible[slot_of(i)] ? scores[i] * scale_of(slot_of(i)) : -INFINITY;
    tile_max[slot_of(i)] = fmaxf(tile_max[slot_of(i)], scores[i]);
  }
}

// Second step, for a lazy reference (it moves only where a row's maximum passes it by more than
// kReferenceSlackLog2): row_max, each of this thread's rows' maximum over the warpgroup's 64 keys,
// or -inf where the reference cannot move. A vote of the warpgroup first (bar.red on named
// barrier `barrier`, 128 threads; share_without_vote skips it, for a first tile whose reference
// is -inf): only if some score passes `reference` (a reference no later than the one the caller
// compares row_max with) by the slack, the maxima over the 8 lanes that share a row (shuffles),
// then over the 4 warps through exchange[warp][row] and a second barrier. Most tiles, once the
// rows have seen keys, skip those shared-memory steps.
template <int kRows, class RowOfSlot>
__device__ __forceinline__ void lazy_row_maxima(float (&tile_max)[kRows / 4], const float (&reference)[kRows / 4],
                                                bool share_without_vote, int barrier, int warp, int lane,
                                                RowOfSlot row_of_slot, float* exchange, float (&row_max)[kRows / 4]) {
  constexpr int kSlots = kRows / 4;
  bool may_move = false;
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) may_move |= tile_max[slot] > reference[slot] + kReferenceSlackLog2;
  if (share_without_vote || sync_named_any(barrier, 128, may_move)) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll
      for (int mask = 4; mask < 32; mask *= 2) {
        tile_max[slot] = fmaxf(tile_max[slot], __shfl_xor_sync(0xffffffffu, tile_max[slot], mask));
      }
      if (lane < 4) exchange[warp * kRows + row_of_slot(slot)] = tile_max[slot];
    }
    sync_named(barrier, 128);  // all warps' maxima in
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int row = row_of_slot(slot);
      row_max[slot] = fmaxf(fmaxf(exchange[row], exchange[kRows + row]),
                            fmaxf(exchange[2 * kRows + row], exchange[3 * kRows + row]));
    }
  } else {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) row_max[slot] = -INFINITY;  // the reference stays
  }
}

// Third step: P^T = 2^(score - reference of the row) into the swizzled P^T rows (16-bit, kHalf:
// fp16, else bf16), each p passed to add_to_row_sum(slot, p) (the FP8 kernel's running sums).
// With residual_rows (the 16-bit kernel, which sums P's rows on the tensor cores), also each
// p's rounding residual p - P^T (16-bit again) into residual_rows, laid out as P^T: the sums of
// P^T and of the residuals are then P's sums to ~2^-17 (P^T alone, rounded to bf16, was off by up
// to 2^-9: LSEs by up to 1.2e-3). A thread's elements 4 j + 2 h + e are
// (key 16 warp + lane / 4 + 8 h, query row 8 j + 2 (lane % 4) + e): per (j, h) an 8 x 8 matrix
// of keys x query rows in the mma fragment layout, which stmatrix.trans stores as query rows of 8
// keys (16 bytes). Two stores of four matrices at 32 rows (one at 16) instead of one 16-bit
// store per element, each with its own swizzled address.
template <bool kHalf, int kRows, class SlotOf, class AddToRowSum>
__device__ __forceinline__ void store_transposed_probabilities(const float (&scores)[kRows / 2],
                                                               const float (&reference)[kRows / 4], uint8_t* rows,
                                                               uint8_t* residual_rows, int warp, int lane,
                                                               SlotOf slot_of, AddToRowSum add_to_row_sum) {
  static_assert(kRows % 16 == 0, "whole stores of four matrices");
  uint32_t packed[kRows / 4], residuals[kRows / 4];  // matrix 2 j + h
#pragma unroll
  for (int i = 0; i < kRows / 2; i += 2) {
    const float first = fast_exp2(scores[i] - reference[slot_of(i)]);
    const float second = fast_exp2(scores[i + 1] - reference[slot_of(i + 1)]);
    add_to_row_sum(slot_of(i), first);
    add_to_row_sum(slot_of(i + 1), second);
    packed[i / 2] = halves_from_floats<kHalf>(first, second);
    if (residual_rows != nullptr) {
      const float first_rounded = half_to_float<kHalf>(uint16_t(packed[i / 2]));
      const float second_rounded = half_to_float<kHalf>(uint16_t(packed[i / 2] >> 16));
      residuals[i / 2] = halves_from_floats<kHalf>(first - first_rounded, second - second_rounded);
    }
  }
  // Lane l addresses row l % 8 of matrix 4 x + l / 8: query row 8 j + l % 8, keys 16 warp + 8 h ..
#pragma unroll
  for (int x = 0; x < kRows / 16; ++x) {
    const int matrix = 4 * x + lane / 8;
    const int offset = swizzled_offset(8 * (matrix / 2) + lane % 8, 16 * warp + 8 * (matrix % 2));
    store_matrices_x4<true>(rows + offset, *reinterpret_cast<const uint32_t(*)[4]>(&packed[4 * x]));
    if (residual_rows != nullptr) {
      store_matrices_x4<true>(residual_rows + offset, *reinterpret_cast<const uint32_t(*)[4]>(&residuals[4 * x]));
    }
  }
}

// O^T (value blocks [0, kBlocks) of output, 64 dims each) += V^T P^T, and the row sums
// (output[8]) += ones P^T + ones (P - P^T). V^T block b is the K tile's block b read M-major
// (from value_descriptor: make_descriptor(tile, 1024, KeyTileParts::group_stride(0)), moved to
// the value half's part); a k step of 16 keys is two 8-key groups.
template <bool kHalf, int kRows, int kBlocks>
__device__ __forceinline__ void narrow_values(float (&output)[kLatentDim / 64 + 1][kRows / 2],
                                              uint64_t value_descriptor, uint64_t ones_descriptor,
                                              uint64_t probability_descriptor, uint64_t residual_descriptor) {
  constexpr int kSumBlock = kLatentDim / 64;
  wgmma_fence();
#pragma unroll
  for (int block = 0; block < kBlocks; ++block) {
#pragma unroll
    for (int k = 0; k < kTileKeys / 16; ++k) {
      wgmma_rows_a_m_major<kHalf, kRows>(output[block], KeyTileParts::value_descriptor(value_descriptor, block, k),
                                         advance_descriptor(probability_descriptor, 32 * k), true);
    }
  }
#pragma unroll
  for (int k = 0; k < kTileKeys / 16; ++k) {
    wgmma_rows_a_m_major<kHalf, kRows>(output[kSumBlock], ones_descriptor,
                                       advance_descriptor(probability_descriptor, 32 * k), true);
    wgmma_rows_a_m_major<kHalf, kRows>(output[kSumBlock], ones_descriptor,
                                       advance_descriptor(residual_descriptor, 32 * k), true);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int block = 0; block <= kSumBlock; ++block) fence_accumulators(output[block]);
}

// kSpeculative: with PDL a split's first tile part is issued right after the wait
// (start_split_cta, in both value halves where a request is halved); an instantiation of its own,
// so that the other launches run the code they ran without it.
template <bool kHalf, int kRows, bool kSpeculative = false>
__global__ void __launch_bounds__(NarrowLayout<kRows>::kThreads, 1)
    dense_decode_narrow_kernel(const __grid_constant__ KeyMaps maps, SplitArgs args) {
  using Layout = NarrowLayout<kRows>;
  constexpr int kSlots = kRows / 4;  // query rows per thread (accumulator columns)
  extern __shared__ uint8_t raw_shared[];
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);
  uint64_t* empty = full + Layout::kStages * Layout::kParts;
  // Tile 0's first part, issued before the CTA barrier (start_split_cta); null where the kernel
  // does not.
  uint64_t* speculative_landed = kSpeculative ? empty + Layout::kStages : nullptr;
  uint8_t* stages = shared + Layout::kKeys;

  // One row tile of kRows (or of 16 among two to four: decode_plan.h latency_row_tiles).
  const int first_row = int(blockIdx.x) * kRows, rows_here = min(kRows, args.rows - first_row);
  constexpr bool kMayHalve = kRows == 16;  // value halves (split_common.cuh key_range_of): D4, D5
  EarlyPages early;
  const CtaWork work = start_split_cta<2, false, kMayHalve && kSpeculative>(
      &maps, args, first_row, rows_here, reinterpret_cast<int*>(stages), kSpeculative ? &early : nullptr, speculative_landed,
      stages);
  const int batch_index = work.batch_index, split = work.split;
  const KeyRange range = split_key_range<kMayHalve>(args, work, first_row, rows_here);
  if constexpr (kSpeculative) publish_early_pages(early, early_pages_slot<false>(stages));
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, first_row, rows_here)) {
    wait_for_speculative_copy_before_exit(speculative_landed);
    return;
  }

  init_stage_barriers(full, empty, kNarrowGroupThreads, Layout::kStages, 1, Layout::kParts);
  __syncthreads();  // the last barrier of all threads: the producer leaves after its loop
  if (threadIdx.x >= kNarrowGroupThreads) {
    if (threadIdx.x == kNarrowGroupThreads) {
      produce_key_tiles<false, Layout::kStages, 1, Layout::kParts>(
          &maps, args, table_row, range, stages, full, empty, kSpeculative ? early_pages_slot<false>(stages) : nullptr,
          speculative_landed);
    }
    return;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* probabilities = shared + Layout::kProbabilities;  // P^T [row][key], swizzled
  uint8_t* residuals = shared + Layout::kResiduals;          // P - P^T, as P^T
  float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange);
  uint8_t* ones = shared + Layout::kOnes;
  {
    const uint32_t one_pair = kHalf ? 0x3C003C00u : 0x3F803F80u;  // two 16-bit 1.0
    static_assert(Layout::kOnesBytes == 16 * 2 * kNarrowGroupThreads, "two 16-byte stores a thread");
#pragma unroll
    for (int unit = 0; unit < 2; ++unit) {
      *reinterpret_cast<uint4*>(ones + 16 * (threadIdx.x + unit * kNarrowGroupThreads)) =
          make_uint4(one_pair, one_pair, one_pair, one_pair);
    }
  }
  // (Its fence and barrier also publish the ones to the tensor cores.)
  load_query_tile<kRows, kNarrowGroupThreads>(args, batch_index, first_row, rows_here, query, 1);

  // Accumulator element i of this thread: key (M) 16 warp + lane / 4 + 8 ((i / 2) % 2), query
  // row (N) 8 (i / 4) + 2 (lane % 4) + i % 2. A thread holds kSlots rows ("slots"
  // 2 (i / 4) + i % 2) x 2 keys of S^T, and the same rows of O^T.
  auto slot_of = [](int i) { return 2 * (i / 4) + i % 2; };
  auto row_of_slot = [lane](int slot) { return 8 * (slot / 2) + 2 * (lane % 4) + slot % 2; };
  // Each row's visible end once per lane (row = lane: kRows <= 32), then shuffled to the slots:
  // per slot, its division by the head count was cold code that every CTA runs once.
  const int lane_row_visible = row_visible_end(args, range, first_row, lane, rows_here);
  int visible[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) visible[slot] = __shfl_sync(0xffffffffu, lane_row_visible, row_of_slot(slot));
  const float logit_scale = args.logit_scale_log2;
  // Value halves: O^T and the stores over 4 of the 8 value blocks, from block 4 value_half
  // (warp-uniform, so that the branch between the two runs of O^T's wgmma is).
  const bool halved = kMayHalve && warp_uniform(range.halved);
  const int value_half = kMayHalve ? warp_uniform(range.value_half) : 0;

  // O^T: 8 M tiles of 64 dims x kRows, then the row sums' tile (kSumBlock).
  constexpr int kValueBlocks = kLatentDim / 64, kSumBlock = kValueBlocks;
  float output[kValueBlocks + 1][kRows / 2];
#pragma unroll
  for (int block = 0; block <= kValueBlocks; ++block) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) output[block][i] = 0.0f;
  }
  float running_max[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) running_max[slot] = -INFINITY;

  const uint64_t query_descriptor = make_descriptor(query, 16, 1024);
  const uint64_t probability_descriptor = make_descriptor(probabilities, 16, 1024);
  const uint64_t residual_descriptor = make_descriptor(residuals, 16, 1024);
  const uint64_t ones_descriptor = make_descriptor(ones, 1024, 1024);  // (every k step the same ones)

  // Tile 0's first part lands on full[0] or, issued speculatively, on speculative_landed
  // (start_split_cta); either way both complete.
  if (speculative_landed != nullptr) mbarrier_wait(speculative_landed, 0);
  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = warp_uniform(tile % Layout::kStages);
    const int first_key = range.begin + tile * kTileKeys;
    const int valid = range.length - first_key;
    const int full_parity = full_phase<Layout::kStages>(tile);
    auto wait_for_part = [&](int part) { mbarrier_wait(&full[stage * Layout::kParts + part], full_parity); };
    wait_for_part(0);
    uint8_t* keys = stages + stage * kTileBlockBytes;
    if (valid < kTileKeys) {
#pragma unroll
      for (int part = 1; part < Layout::kParts; ++part) wait_for_part(part);  // zeroing writes every block
      KeyTileParts::zero_lines<kDimBlocks>(keys, valid, threadIdx.x, kNarrowGroupThreads);
      fence_shared_for_async_proxy();
      sync_narrow_consumers();
    }

    // S^T = K Q^T, its 36 k steps spread over independent accumulators (summed below): one
    // chain of dependent wgmma is latency-bound at these small N.
    float scores[kRows / 2];
    {
      constexpr int kChains = 4;
      float chains[kChains][kRows / 2];
      const uint64_t key_descriptor = make_descriptor(keys, 16, KeyTileParts::group_stride(0));
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kHeadDim / 16; ++step) {
        const int block = step / 4;
        if (step % 4 == 0 && KeyTileParts::opens_later_part(block)) {  // (the fence after the wait keeps
          wait_for_part(KeyTileParts::part_of(block));                // ptxas from serialising every
          wgmma_fence();                                              // wgmma: C7518)
        }
        wgmma_rows<kHalf, kRows>(chains[step % kChains],
                              KeyTileParts::key_descriptor(key_descriptor, block, (step % 4) * 32),
                              advance_descriptor(query_descriptor, (step / 4) * (kRows * 128) + (step % 4) * 32),
                              step >= kChains);
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int chain = 0; chain < kChains; ++chain) fence_accumulators(chains[chain]);
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        scores[i] = chains[0][i];
#pragma unroll
        for (int chain = 1; chain < kChains; ++chain) scores[i] += chains[chain][i];
      }
    }

    // Online softmax over keys, base 2, with a lazy reference (running_max; as the FP8 kernels'):
    // it moves only where a row's maximum passes it by more than kReferenceSlackLog2 (p <= 2^8
    // keeps its relative precision in fp16), so that most tiles leave O^T unscaled, and where no
    // score of the warpgroup passes it so (one vote) the row maxima are not needed: their
    // shuffles, shared-memory exchange and barrier are skipped.
    float tile_max[kSlots], row_max[kSlots];
    mask_scores<kRows>(scores, tile_max, visible, first_key, warp, lane, slot_of, [&](int) { return logit_scale; });
    // (The vote's barrier: also every warp finished the last O^T update, which read P^T. Tile 0
    // follows no update and its reference is -inf: it shares without a vote, as D4's splits of
    // one tile did before the vote.)
    static_assert(kNarrowGroupThreads == 128, "lazy_row_maxima's barrier spans one warpgroup");
    lazy_row_maxima<kRows>(tile_max, running_max, tile == 0, 1, warp, lane, row_of_slot, exchange, row_max);
    float rescale[kSlots], reference[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const float new_max = row_max[slot] > running_max[slot] + kReferenceSlackLog2 ? row_max[slot] : running_max[slot];
      reference[slot] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[slot] = fast_exp2(running_max[slot] - reference[slot]);
      running_max[slot] = new_max;
    }
    store_transposed_probabilities<kHalf, kRows>(scores, reference, probabilities, residuals, warp, lane, slot_of,
                                                 [](int, float) {});
    bool rescaled = false;
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) rescaled |= rescale[slot] != 1.0f;
    if (rescaled) {
#pragma unroll
      for (int block = 0; block <= kValueBlocks; ++block) {
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) output[block][i] *= rescale[slot_of(i)];
      }
    }
    fence_shared_for_async_proxy();
    sync_narrow_consumers();  // P^T complete; the exchange reads are done

    // O^T += V^T P^T, and the row sums (narrow_values). Halved, accumulator block b holds value
    // block 4 value_half + b (the second latent part, one part further: the same layout). (Each
    // path one straight run of wgmma: a branch inside the group made ptxas add a fence.)
    static_assert(KeyTileParts::first_block(1) == kValueBlocks / 2, "a value half is one latent part");
    const uint64_t value_descriptor =
        make_descriptor(keys + value_half * KeyTileParts::part_start(1), 1024, KeyTileParts::group_stride(0));
    if (halved) {
      narrow_values<kHalf, kRows, kValueBlocks / 2>(output, value_descriptor, ones_descriptor, probability_descriptor,
                                                     residual_descriptor);
    } else {
      narrow_values<kHalf, kRows, kValueBlocks>(output, value_descriptor, ones_descriptor, probability_descriptor,
                                                residual_descriptor);
    }
    mbarrier_arrive(&empty[stage]);
  }

  // The finished rows, in the threads that hold them: each slot's sum of P is any M row of the
  // sums' tile (element 4 (slot / 2) + slot % 2). (Summed in each thread's registers instead,
  // the sums took shuffles, an exchange through shared memory and three barriers, and one thread
  // per row for the normaliser: ~0.45 us of a D4 CTA's chain, perf log session 43.)
  float normalizer[kSlots], row_lse[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    const float reference = running_max[slot] == -INFINITY ? 0.0f : running_max[slot];
    const FinishedRow done = finish_row<true>(args, output[kSumBlock][4 * (slot / 2) + slot % 2], reference, true);
    normalizer[slot] = done.normalizer;
    row_lse[slot] = done.lse2;
  }
  const OutputDestination destination = output_destination(args, split);
  // Lanes 0..3 of warp 0 hold every row (lane % 4 picks the rows).
  const bool holds_row_lses = warp == 0 && lane < 4;
  if (!destination.final_output) {
    // A split's fp32 partial rows straight from the accumulators: element i of a warp's store
    // is 8 consecutive dims (lane / 4) of 4 rows (lane % 4), whole 32-byte sectors, so no
    // staging is needed (it moved 64 KB through shared memory per CTA: ~600 of D4's ~1800
    // epilogue cycles, perf log session 30). A split's rows are consecutive partial rows.
    // Rows past rows_here have no destination; a row without keys stores zeros (its LSE is
    // -inf, so the combine step never reads them).
    // Halved: half 0 stores the LSEs, half 1 -inf at its own split's slot (the values go to the
    // key split's row).
    // The split's LSE row from one address (per row, the 64-bit index chain was ~22 cold
    // instructions, kSlots copies on warp 0's way to its stores).
    if (holds_row_lses) {
      float* lses = args.partial_lse + partial_row_index(args, split, batch_index, first_row);
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) {
        const int row = row_of_slot(slot);
        if (row < rows_here) lses[row] = value_half == 0 ? row_lse[slot] : -INFINITY;
      }
    }
    float* rows = partial_output_row(args, range.key_split, batch_index, first_row) + value_half * (kLatentDim / 2) +
                  accumulator_row(warp, lane, 0);
#pragma unroll
    for (int block = 0; block < kValueBlocks; ++block) {
      if (block == kValueBlocks / 2 && halved) break;
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        const int row = row_of_slot(slot_of(i));
        if (row < rows_here) {
          rows[row * kLatentDim + 64 * block + accumulator_row(warp, lane, i) - accumulator_row(warp, lane, 0)] =
              output[block][i] * normalizer[slot_of(i)];
        }
      }
    }
    return;
  }
  // The final bf16 rows: the normalised O^T -> shared [row][dim] floats (the key stages are
  // free once every warp's O^T has read its tile: the barrier below), so that rows are stored
  // contiguously (per accumulator element a warp would write 2-byte pieces of 4 rows); and each
  // row's LSE and destination, one thread per row (the stores below then run as independent
  // shared loads and global stores: computed per stored quad, the destination's division by
  // the head count and 64-bit index chain serialised every quad; 0.5-1% of D2 on an H100, perf
  // log session 15). (The exchange's last readers passed the last tile's P^T barrier.)
  float* row_lses = exchange;  // [row]
  if (holds_row_lses) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) row_lses[row_of_slot(slot)] = row_lse[slot];
  }
  float* staged = reinterpret_cast<float*>(shared + Layout::kKeys);
  int64_t* row_offsets = reinterpret_cast<int64_t*>(shared + Layout::kKeys + Layout::kStagedRowOffsets);
  sync_narrow_consumers();
  if (threadIdx.x < rows_here) {
    const int row = threadIdx.x;
    store_row_lse(args, destination, batch_index, first_row + row, row_lses[row]);
    row_offsets[row] = destination_row_offset(args, destination, batch_index, first_row + row);
  }
#pragma unroll
  for (int block = 0; block < kValueBlocks; ++block) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const int row = accumulator_row(warp, lane, i);  // of O^T: a dim
      staged[row_of_slot(slot_of(i)) * Layout::kStagedRowFloats + 64 * block + row] = output[block][i] * normalizer[slot_of(i)];
    }
  }
  sync_narrow_consumers();
  store_staged_rows<1, Layout::kStagedRowFloats, 0>(args, destination, staged, row_offsets, rows_here, threadIdx.x,
                                                    kNarrowGroupThreads);
}

}  // namespace openmla::kernels::sm90
