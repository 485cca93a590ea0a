// Dense MLA decode, split-KV attention kernel for more than 32 query rows (<= 32:
// narrow_kernel.cuh), any cache dtype. 16-bit caches: two consumer warpgroups take turns on the
// key tiles. FP8 caches: the roles split, one warpgroup scores every tile, two multiply by V.
//
// What: for one request b, one tile of 64 query rows and one KV split, the softmax attention of
// the rows over the split's keys: S = Q K^T (576 dims), P = softmax(S), O = P V (V = the first
// 512 dims of the same cache rows). Query rows are the request's Sq tokens x Hq heads folded
// into M (row m = s * Hq + h), so a 64-row wgmma tile is filled by Hq = 64, Hq = 16 x Sq = 4...
//
// 16-bit caches. Roles: 384 threads = two consumer warpgroups (the math) + one producer
// warpgroup (setmaxnreg moves its registers to the consumers): one thread of it issues the TMA
// loads. Tiling: key tiles of 64 tokens taken in pairs (a, b). Warpgroup 0 owns tile a,
// warpgroup 1 tile b: the owner computes S = Q K^T for its tile (64 x 64, wgmma m64n64k16; Q from
// shared memory for dims 0..511, from registers for the 64 rope dims), its softmax, and
// publishes the new row maxima, the rescale factor and P (16-bit) in shared memory. Every
// warpgroup owns 256 of the 512 value columns: O += P V for the own tile takes P from registers,
// for the other tile from shared memory (m64n256k16, V read N-major from the key tile itself, so
// each cache row is loaded once). The running maximum is handed on a -> b -> next a, so each
// tile's softmax depends on the previous tile's, but one warpgroup's softmax runs while the
// other's S or O += P V keeps the tensor cores busy. (Splitting every tile's S between the
// warpgroups and trading maxima and P at two CTA barriers per tile, as an earlier kernel did,
// reached 0.57-0.65 of the BF16 GEMM rate on the compute-bound cases against this one's
// 0.72-0.81: perf log, session 8.) Ordering between the warpgroups (mbarriers: arrive by the
// signalling warpgroup, wait by the other):
//   published_a / published_b: maxima, factor and P of tile a / b are in shared memory;
//   consumed_a / consumed_b: the other warpgroup's O += P V has finished reading that P buffer;
//   sums: a warpgroup's row sums are written (once, at the end).
// (Named barriers with bar.arrive did the same job, but compute-sanitizer's racecheck does not
// see their ordering and reported races; mbarriers it follows.)
// Shared memory: Q 72 KB (its rope block is reused as tile a's P buffer once the rope values
// are in registers), two 72 KB key stages, tile b's P buffer 8 KB, maxima and factors: 226 KB.
// Pipeline: the TMA producer of key_tiles.cuh; a stage is released when both warpgroups' O +=
// P V of its tile are done; a 16-bit tile lands in its parts (KeyParts: three, or two at pages
// of 16 tokens), S waiting for each part in turn.
//
// FP8 caches (kRawKeys, kScoreWarpgroup). Roles: 512 threads. Warpgroup 2 (the score
// warpgroup) computes every tile's S and softmax and publishes P (fp16), the rescale factors
// and a moved flag through two P buffers (tile t in buffer t % 2; mbarriers published /
// consumed); warpgroups 0 and 1 (the output warpgroups) only run O^T over their 256 value dims,
// each tile as soon as its P is published, their products running on across tiles; the
// producer warpgroup as above. Nothing is widened in shared memory: S runs on e4m3 wgmma
// (m64n64k32) from Q's e4m3 lines (an fp8 q as it is, its first 256 dims from the score
// warpgroup's registers; a bf16 q as high and low e4m3 parts with a power-of-two factor per row:
// fp8_tiles.cuh load_e4m3_query_rows) and the raw tile (36 KB, 128-dim boxes) as it landed, in
// segments added in fp32 (three with a bf16 q, two with an fp8 q); the output runs transposed
// in fp16, O^T += V^T P^T (4 M tiles of m64n64k16 per warpgroup and k step), V^T's fragments
// widened exactly in registers from the raw tile (fp8_fragments.cuh WideValueFragments), P^T
// read as the softmax stored it; four (fp8 q) or
// three (bf16 q) raw stages of 40 KB, each released once both output warpgroups have its
// fragments. Registers: ScoreRoles. History (H100 cycles, perf log): no widening producer, -30%
// (fp8 q) and -13..14% (bf16 q) in session 24; the split roles instead of turns, -9..11% (fp8 q,
// session 25) and -8..10% (bf16 q, session 26); an fp8 q's first dims in registers, -4..5%
// (session 26).
// Softmax: online, base 2 (logits scaled by softmax_scale * descales * log2 e), with the -inf
// guards that keep a row without keys at output 0 and LSE -inf; the reference moves (and the
// output is rescaled) only when a tile's maximum passes it by more than 2^8.
// The output product is always 16-bit with fp32 accumulation (e4m3 widens exactly to fp16).
// (Until session 23 an fp8 q with an FP8 cache ran O^T on e4m3 tensor cores too, P stored as
// 2^8 p: the output's accumulation on FP8 tensor cores keeps ~13 bits a step and drifted by
// 11-41% over long splits of values that share a component: perf log session 23,
// docs/experiments/2026-11-27-fp8-qkv-e4m3-products.patch.)
// Epilogue: one split writes the 16-bit output and LSE directly; several splits write fp32
// partial outputs and base-2 LSEs to the workspace for the combine kernel. The rows are staged
// in the free key stages first, so that each warp stores whole rows (store_staged_rows; from the
// accumulators, each store instruction wrote 4-byte pieces of 8 rows: D2 Hq 64 1.2% slower on
// an H100, perf log session 16).
// Limits: head dim 576 / value dim 512 fixed; rows tiled by 64 (rows past the end are zero
// queries whose keys are all masked).
#pragma once

#include <type_traits>

#include "kernels/generic/convert.cuh"
#include "kernels/sm90/dense_decode/fp8_tiles.cuh"
#include "kernels/sm90/dense_decode/key_tiles.cuh"
#include "kernels/sm90/dense_decode/split_common.cuh"

namespace openmla::kernels::sm90 {

constexpr int kRopeSteps = (kHeadDim - kLatentDim) / 16;  // S's k steps over the rope dims: 4

// Handoffs between the warpgroups: mbarriers that all 128 threads of the signalling warpgroup
// arrive on (release) and the other waits on (acquire), one phase per pair; the waiter passes
// the phase number (the pair whose signal it needs).
constexpr int kPublishedA = 0, kPublishedB = 1, kConsumedA = 2, kConsumedB = 3;
// A warpgroup's row sums are in shared memory (once). kScoreWarpgroup: kSumsOf0 says the score
// warpgroup's normalizers are, kSumsOf1 (256 arrivals) that both output warpgroups are past
// their last tile.
constexpr int kSumsOf0 = 4, kSumsOf1 = 5;
constexpr int kRowsStaged = 6;              // both warpgroups' output rows (once; 256 arrivals)
constexpr int kHandoffCount = 7;
// A 16-bit tile lands in its parts (KeyTileParts: 4, 4 and 1 blocks of 64 dims since session 37,
// 3 x 3 before), each on its own full barrier, so that S starts on the first blocks while the
// rest stream in. A stage is refilled only once both
// warpgroups' O += P V of its tile are done, and its 72 KB take 1200-2200 cycles to arrive,
// about as long as the rest of the pair after that release (perf log sessions 17, 18): with
// the parts, H100 cycles (locked clocks) of D1 Hq128 B16 -3%, D3 -6%, D1 Hq32 -10%. Parts of
// one block each were slower than three (perf log session 18).
constexpr int kAlternatingKeyParts = KeyTileParts::kParts;  // the most (SmallPageKeyTileParts: 2)
static_assert(SmallPageKeyTileParts::kParts <= kAlternatingKeyParts, "the layout's barriers cover both tile layouts");

struct AlternatingLayout {
  static constexpr int kStages = 2;  // key stages of 72 KB
  static constexpr int kQuery = 0;
  static constexpr int kProbabilitiesA = kLatentDim / 64 * kSwizzleBlockBytes;  // Q's rope block
  static constexpr int kKeys = kTileBlockBytes;
  static constexpr int kProbabilitiesB = kKeys + 2 * kTileBlockBytes;
  static constexpr int kMaxima = kProbabilitiesB + kSwizzleBlockBytes;  // [64] floats
  static constexpr int kFactorA = kMaxima + kRowsPerTile * 4;          // [64]
  static constexpr int kFactorB = kFactorA + kRowsPerTile * 4;         // [64]
  static constexpr int kSums = kFactorB + kRowsPerTile * 4;            // [2][64]
  // full[2 stages][kAlternatingKeyParts], empty[2]
  static constexpr int kBarriers = kSums + 2 * kRowsPerTile * 4;
  static constexpr int kHandoffs = kBarriers + (2 * kAlternatingKeyParts + 2) * 8;  // see kPublishedA ...
  static constexpr int kBytes = kHandoffs + kHandoffCount * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
};
static_assert(AlternatingLayout::kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");
static_assert(AlternatingLayout::kKeys + kAlternatingStagingBytes <= AlternatingLayout::kMaxima,
              "the epilogue's staging fits the key stages (and P_b)");

// FP8 cache (kRawKeys): Q's e4m3 lines (an fp8 q: 64 lines, 36 KB; a bf16 q, kSplitQuery: its
// high and low e4m3 parts, 128 lines, 72 KB), raw key stages of 40 KB (128-dim boxes,
// wide_raw_offset; 4 with an fp8 q, 3 with a bf16 q), the P buffers 8 KB each: 212 / 208 KB.
template <bool kSplitQuery>
struct AlternatingRawKeysLayout {
  static constexpr int kQueryLines = kSplitQuery ? 2 * kRowsPerTile : kRowsPerTile;
  static constexpr int kStages = kSplitQuery ? 3 : 4;  // a stage is free once both warpgroups have its V^T fragments
  static constexpr int kQuery = 0;
  static constexpr int kKeys = kQueryLines * kHeadDim;
  static constexpr int kProbabilitiesA = kKeys + kStages * kWideRawStageBytes;
  static constexpr int kProbabilitiesB = kProbabilitiesA + kSwizzleBlockBytes;
  static constexpr int kFactorA = kProbabilitiesB + kSwizzleBlockBytes;  // [64] per P buffer
  static constexpr int kFactorB = kFactorA + kRowsPerTile * 4;
  static constexpr int kNormalizers = kFactorB + kRowsPerTile * 4;  // [64]: the score warpgroup's
  static constexpr int kRowFactors = kNormalizers + kRowsPerTile * 4;  // [64]: kSplitQuery's 2^s per row
  static constexpr int kMovedFlags = kRowFactors + kRowsPerTile * 4;  // [P buffer] ints
  // full[kStages], empty[kStages]
  static constexpr int kBarriers = kMovedFlags + 2 * 4;
  static constexpr int kHandoffs = kBarriers + 2 * kStages * 8;
  static constexpr int kBytes = kHandoffs + kHandoffCount * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
  static_assert(kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");
  static_assert(kKeys % 1024 == 0 && kWideRawStageBytes % 1024 == 0, "swizzle atoms stay aligned");
  static_assert(kKeys + kAlternatingStagingBytes <= kFactorA,
                "the epilogue's staging fits the raw stages and P buffers");
};

// The kernel's and its launcher's (the shared-memory size) layout: FP8 caches read the raw
// tiles (kRawKeys), 16-bit caches 16-bit tiles.
template <bool kFp8Q, bool kFp8Cache>
using AlternatingLayoutOf = std::conditional_t<kFp8Cache, AlternatingRawKeysLayout<!kFp8Q>, AlternatingLayout>;

// FP8 cache (kScoreWarpgroup): a third consumer warpgroup computes every tile's S and
// softmax, the two others only O^T over their 256 value dims each: 512 threads. Registers after
// setmaxnreg, 2 x 128 x output + 128 x scores + 128 x 24 (producer) = 64 K. An fp8 q: the score
// warpgroup holds Q's first 256 dims as wgmma A fragments (kQueryInRegisters, 32 registers), so
// that 8 of S's 18 k steps read only K from shared memory, whose bandwidth S and O^T share (per
// tile ~212 KB at 128 bytes a cycle against ~1600 cycles of tensor work: H100 cycles -4..5%,
// perf log session 26); it takes 136 registers, the output warpgroups 176 (their V^T batches of
// one M tile). All 16 latent steps (64 registers) spill beside S's two segments. A bf16 q (two
// e4m3 parts) stays in shared memory, and its output warpgroups need 192 for its split Q load.
constexpr int kScoreRolesThreads = 512;
template <bool kFp8Q>
struct ScoreRoles {
  static constexpr bool kQueryInRegisters = kFp8Q;
  static constexpr int kOutputRegisters = kFp8Q ? 176 : 192, kScoreRegisters = kFp8Q ? 136 : 104;
  static constexpr int kBatchTiles = kFp8Q ? 1 : 2;  // M tiles per batch of O^T (8 registers each)
  static_assert((kOutputRegisters - 128) * 256 <= (128 - kScoreRegisters) * 128 + (128 - kProducerRegisters) * 128,
                "the output warpgroups' setmaxnreg.inc must be satisfiable");
};
template <bool kFp8Cache>
constexpr int alternating_threads() {
  return kFp8Cache ? kScoreRolesThreads : kAlternatingThreads;
}

// Named barriers (bar.sync ids; 0 is __syncthreads'): 1 both turn-taking or both output
// warpgroups (sync_consumers, the Q load), 2 + w consumer warpgroup w alone (the score
// warpgroup: 4), kQueryLoaded (5) the three consumer warpgroups of the FP8 roles.

// KeyParts: the 16-bit tiles' parts (KeyTileParts; SmallPageKeyTileParts at pages of 16 tokens).
template <bool kHalf, bool kFp8Q, bool kFp8Cache, class KeyParts = KeyTileParts>
__global__ void __launch_bounds__(alternating_threads<kFp8Cache>(), 1)
    dense_decode_alternating_kernel(const __grid_constant__ KeyMaps maps, SplitArgs args) {
  static_assert(kHalf || !kFp8Cache, "FP8 caches compute in fp16");
  static_assert(kFp8Cache || !kFp8Q, "an fp8 q comes with an FP8 cache");
  // FP8 caches: S on e4m3 wgmma straight from the raw tiles, O^T in fp16 from V^T fragments
  // widened in registers (fp8_fragments.cuh WideValueFragments).
  constexpr bool kRawKeys = kFp8Cache;
  constexpr bool kSplitQuery = kRawKeys && !kFp8Q;  // a bf16 q as two e4m3 parts
  // FP8 caches split the roles (S and the softmax of every tile in warpgroup 2, O^T in
  // warpgroups 0 and 1); 16-bit caches take turns on pairs of tiles.
  constexpr bool kScoreWarpgroup = kRawKeys;
  constexpr int kScoreGroup = 2;  // the score warpgroup's index
  using Layout = AlternatingLayoutOf<kFp8Q, kFp8Cache>;
  extern __shared__ uint8_t raw_shared[];
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  float* maxima = nullptr;  // 16-bit caches: the row maxima a warpgroup publishes with its P
  if constexpr (!kRawKeys) maxima = reinterpret_cast<float*>(shared + Layout::kMaxima);
  // Per tile of the pair (0: a, 1: b; kScoreWarpgroup: tile t in t % 2): the factor that
  // rescales the state before that tile, and its P.
  auto factors = [&](int which) { return reinterpret_cast<float*>(shared + (which ? Layout::kFactorB : Layout::kFactorA)); };
  auto probability_buffer = [&](int which) {
    return shared + (which ? Layout::kProbabilitiesB : Layout::kProbabilitiesA);
  };
  // The stages are released per tile on `empty` (kRawKeys: once both output warpgroups have the
  // tile's V^T fragments in registers).
  constexpr int kStages = Layout::kStages;
  // `full`: the TMA's bytes.
  constexpr int kKeyParts = kFp8Cache ? 1 : KeyParts::kParts;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);  // [stage][part]
  uint64_t* empty = full + kStages * kKeyParts;
  uint64_t* handoffs = reinterpret_cast<uint64_t*>(shared + Layout::kHandoffs);
  // Whole warps signal (see narrow_fp8_kernel.cuh `signal`: no lane of a warp waits
  // while another lane of it has yet to arrive).
  auto signal = [&](int handoff) {
    __syncwarp();
    mbarrier_arrive(&handoffs[handoff]);
  };
  auto await = [&](int handoff, int phase) { mbarrier_wait(&handoffs[handoff], phase % 2); };
  uint8_t* stages = shared + Layout::kKeys;

  const int tile_index = blockIdx.x;
  const int first_row = tile_index * kRowsPerTile;
  const int rows_here = min(kRowsPerTile, args.rows - first_row);
  const CtaWork work = start_split_cta<(kFp8Q ? 1 : 2), kFp8Cache, false, KeyParts>(&maps, args, first_row, rows_here,
                                                                                      reinterpret_cast<int*>(stages));
  const int batch_index = work.batch_index, split = work.split;
  const KeyRange range = split_key_range(args, work, first_row, rows_here);
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, first_row, rows_here)) return;

  if (threadIdx.x == 0) {
    for (int handoff = 0; handoff < kHandoffCount; ++handoff) {
      // kScoreWarpgroup: both output warpgroups read both P buffers.
      const bool both = handoff == kRowsStaged ||
                        (kScoreWarpgroup && (handoff == kConsumedA || handoff == kConsumedB || handoff == kSumsOf1));
      mbarrier_init(&handoffs[handoff], both ? kConsumerThreads : 128);
    }
  }
  init_stage_barriers(full, empty, kConsumerThreads, kStages, 1, kKeyParts);
  __syncthreads();
  constexpr int kProducerStart = kScoreWarpgroup ? kScoreRolesThreads - 128 : kConsumerThreads;
  if (threadIdx.x >= kProducerStart) {  // the producer warpgroup
    set_register_count<kProducerRegisters, false>();
    if (threadIdx.x == kProducerStart) {
      if constexpr (kRawKeys) {
        produce_key_tiles<true, kStages>(&maps, args, table_row, range, stages, full, empty, /*early=*/nullptr,
                                         /*speculative_landed=*/nullptr, /*tile_one_waits=*/true);
      } else {
        produce_key_tiles<false, 2, 1, kKeyParts, KeyParts>(&maps, args, table_row, range, stages, full, empty,
                                                            /*early=*/nullptr, /*speculative_landed=*/nullptr,
                                                            /*tile_one_waits=*/true);
      }
    }
    return;
  }
  // (kScoreWarpgroup: each role resizes where its code starts, below, so that ptxas sees one
  // register budget per path.)
  if constexpr (!kScoreWarpgroup) set_register_count<kConsumerRegisters, true>();

  const int warpgroup = warpgroup_index<!kFp8Cache>(), warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int thread_in_warpgroup = threadIdx.x % 128;
  const int row0 = 16 * warp + lane / 4;  // this thread's accumulator rows: row0, row0 + 8
  // The logits' scale (base 2) of rows row0, row0 + 8: a bf16 q split into e4m3 parts carries a
  // factor 2^s per row (the other kernels read only [0]: one register fewer, which the 16-bit
  // kernel, at its register limit, needs).
  float logit_scale[2] = {args.logit_scale_log2, args.logit_scale_log2};
  // (kRawKeys: Q's e4m3 lines are loaded in the role branches below.)
  if constexpr (!kRawKeys) load_query_tile<kRowsPerTile, kConsumerThreads>(args, batch_index, first_row, rows_here, query, 1);
  uint32_t rope_query[kRopeSteps][4];
  if constexpr (!kRawKeys) {
#pragma unroll
    for (int step = 0; step < kRopeSteps; ++step) {
      query_fragment(query, kLatentDim / 16 + step, warp, lane, rope_query[step]);
    }
    sync_consumers();  // the rope block is read: it becomes tile a's P buffer
  }

  int visible[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) visible[half] = row_visible_end(args, range, first_row, row0 + 8 * half, rows_here);
  float output[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) output[i] = 0.0f;
  // The softmax's reference: the maximum over every tile so far, or up to the slack below it
  // (own_softmax).
  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.0f, 0.0f};            // over this warpgroup's own tiles

  const uint64_t query_descriptor = make_descriptor(query, 16, 1024);
  const int pairs = (range.tiles + 1) / 2;
  const int value_block = 4 * warpgroup;  // first of this warpgroup's 4 blocks of 64 value columns
  // kRawKeys: tile `tile`'s raw stage, and the wait until its bytes have landed.
  auto raw_tile = [&](int tile) { return stages + (tile % kStages) * kWideRawStageBytes; };
  auto wait_for_raw_tile = [&](int tile) { mbarrier_wait(&full[tile % kStages], (tile / kStages) % 2); };

  // S = Q K^T for tile `tile` (stage tile % kStages), masked (unscaled); returns in tile_max,
  // scaled (base 2), this thread's maxima over its 16 keys of each of its rows (own_softmax takes
  // the row's only if it needs it). The stages' slots past the sequence end are zeroed after S.
  // kQueryInRegisters (the score warpgroup, an fp8 q): S's A fragments of Q's first
  // kQueryFragmentSteps k steps of 32 dims (the later steps read Q from shared memory).
  constexpr bool kQueryInRegisters = ScoreRoles<kFp8Q>::kQueryInRegisters;
  constexpr int kQueryFragmentSteps = kQueryInRegisters ? 8 : 1;
  uint32_t query_fragments[kQueryFragmentSteps][4];
  float scores[32];
  auto tile_scores = [&](int tile, float (&tile_max)[2]) {
    const int first_key = range.begin + tile * kTileKeys;
    const int valid = range.length - first_key;
    if constexpr (kRawKeys) {
      // S = Q K^T on e4m3 wgmma (m64n64k32, 18 k steps) straight from the raw tile, in
      // kScoreSegments segments of steps, each accumulated afresh and added in fp32: e4m3 wgmma
      // adds each step to its accumulator at reduced precision (~13 bits), and one chain of 18
      // steps moved the narrow kernel's LSEs by up to 8e-4 (1 + |LSE|). Three segments of 6
      // for a bf16 q, two of 9 for an fp8 q. With logits near 100 (H200, perf log session 55)
      // two segments left single rows off by up to 2.7% (bf16 q) and 4.5% (fp8 q), three 2.1%
      // (bf16 q), at +0.2..1.3% of the kernel's time with a bf16 q (D1 / D2 / D3) but +4..6%
      // with an fp8 q, whose own e4m3 rounding (2^-4 of each element) moves such logits far more
      // than S's accumulation does.
      uint8_t* keys = raw_tile(tile);
      wait_for_raw_tile(tile);
      const uint64_t fp8_query_descriptor = make_descriptor_64b(query, 512);
      const uint64_t key_descriptor = make_descriptor(keys, 16, RawTileParts::group_stride(0));  // (wide_raw_offset)
      const int rope_first_dim = raw_rope_first_dim(args.page_shift);
      constexpr int kScoreSegments = kSplitQuery ? 3 : 2, kSegmentSteps = kHeadDim / 32 / kScoreSegments;
      static_assert(kSegmentSteps * kScoreSegments * 32 == kHeadDim, "whole segments");
      // A bf16 q's low parts (lines 64..127 of each block, ~2^-4 of the high parts) go into the
      // same accumulators, each segment's low steps first: an add loses bits relative to the
      // accumulator's magnitude, which is still small while they go in, so the error stays that
      // of the segment's high steps (interleaved, high and low, one C++ case's LSE was off by
      // 3.1e-3).
      constexpr int kParts = kSplitQuery ? 2 : 1;
      // Segments 1, 2, ... share later_segment: each one's sum is added in before the next
      // starts (a drain of the wgmma chain, where a third array of 32 accumulators would spill).
      float later_segment[32];
      auto add_later_segment = [&]() {
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(scores);
        fence_accumulators(later_segment);
#pragma unroll
        for (int i = 0; i < 32; ++i) scores[i] += later_segment[i];
      };
      wgmma_fence();
#pragma unroll
      for (int segment = 0; segment < kScoreSegments; ++segment) {
        if (segment >= 2) {
          add_later_segment();
          wgmma_fence();
        }
        float(&terms)[32] = segment == 0 ? scores : later_segment;
#pragma unroll
        for (int part = kParts - 1; part >= 0; --part) {
#pragma unroll
          for (int step = 0; step < kSegmentSteps; ++step) {
            const int k = segment * kSegmentSteps + step;
            const int query_offset = (k / 2) * (Layout::kQueryLines * 64) + part * (kRowsPerTile * 64) + (k % 2) * 32;
            const uint64_t key_step = raw_key_step_descriptor(key_descriptor, k, rope_first_dim);
            if (kQueryInRegisters && part == 0 && k < kQueryFragmentSteps) {  // (part 0: the high lines)
              // (k % ...: an index in range in the instantiations that never take this branch)
              wgmma_64x64x32_fp8_a_registers(terms, query_fragments[k % kQueryFragmentSteps], key_step,
                                             step > 0 || part < kParts - 1);
            } else {
              wgmma_64x64x32_fp8(terms, advance_descriptor(fp8_query_descriptor, query_offset), key_step,
                                 step > 0 || part < kParts - 1);
            }
          }
        }
      }
      add_later_segment();
      // Slots past the sequence end: S's mask drops whatever they hold; the output warpgroups' V^T
      // fragments (after the publish handoff) must read zeros.
      if (valid < kTileKeys) {
        RawTileParts::zero_lines<kLatentDim / kWideRawBoxDims>(keys, valid, thread_in_warpgroup, 128);
        sync_named(2 + warpgroup, 128);
      }
    } else {
      uint8_t* keys = stages + (tile % 2) * kTileBlockBytes;
      auto wait_for_part = [&](int part) { mbarrier_wait(&full[(tile % 2) * kKeyParts + part], (tile / 2) % 2); };
      wait_for_part(0);
      // The descriptors are opaque per tile, so that the compiler computes them next to their
      // wgmmas instead of hoisting them out of the loop. Together with the zeroing after S
      // (below) this made the FP8-cache kernel 2-8% faster on an H100 (D2 Hq64, D3, D1 Hq128;
      // bf16 within noise; perf log session 17).
      uint64_t key_descriptor = make_descriptor(keys, 16, KeyParts::group_stride(0)),
               q_descriptor = query_descriptor;
      asm volatile("" : "+l"(key_descriptor), "+l"(q_descriptor));
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kLatentDim / 16; ++k) {
        const int block = k / 4;
        if (k % 4 == 0 && KeyParts::opens_later_part(block)) {  // the fence after the wait keeps
          wait_for_part(KeyParts::part_of(block));              // ptxas from serialising every
          wgmma_fence();                                        // wgmma (C7518)
        }
        wgmma_64x64x16<kHalf>(scores, advance_descriptor(q_descriptor, block * kSwizzleBlockBytes + (k % 4) * 32),
                              KeyParts::key_descriptor(key_descriptor, block, (k % 4) * 32), k > 0);
      }
      static_assert(KeyParts::first_block(kKeyParts - 1) == kLatentDim / 64, "the rope block is the last part");
      wait_for_part(kKeyParts - 1);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kRopeSteps; ++step) {
        wgmma_64x64x16_a_registers<kHalf>(
            scores, rope_query[step], KeyParts::key_descriptor(key_descriptor, kLatentDim / 64, step * 32), true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(scores);
      // Slots past the sequence end: S's mask drops whatever they hold; O += P V (this
      // warpgroup's, and the other's after the publish handoff) must read zeros.
      if (valid < kTileKeys) {
        KeyParts::template zero_lines<kDimBlocks>(keys, valid, thread_in_warpgroup, 128);
        fence_shared_for_async_proxy();
        sync_named(2 + warpgroup, 128);
      }
    }
    // The scores stay unscaled (logit_scale > 0: the maximum commutes with it, and the softmax
    // folds it into one FFMA per score); only a tile that ends past a row's visible keys is
    // masked. Per score that leaves FMNMX here and FFMA, MUFU, FADD in the softmax: a
    // warpgroup's softmax is on the pair's critical path, with one warp per scheduler to
    // issue it (timeline, perf log session 17).
    tile_max[0] = tile_max[1] = -INFINITY;
    if (first_key + kTileKeys <= min(visible[0], visible[1])) {
#pragma unroll
      for (int i = 0; i < 32; ++i) tile_max[(i / 2) % 2] = fmaxf(tile_max[(i / 2) % 2], scores[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {  // score i: row row0 + 8 ((i / 2) % 2), key 8 (i / 4) + 2 (lane % 4) + i % 2
        const int half = (i / 2) % 2;
        const int key = first_key + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        scores[i] = key < visible[half] ? scores[i] : -INFINITY;
        tile_max[half] = fmaxf(tile_max[half], scores[i]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) tile_max[half] *= logit_scale[kSplitQuery ? half : 0];
  };

  // Softmax of the own tile against the running maximum: P in registers (wgmma A fragments:
  // k step s is accumulators 8 s .. 8 s + 7).
  uint32_t probabilities[kTileKeys / 16][4];
  bool own_rows_moved = false;  // kRawKeys: a factor of this thread's rows moved (see moved_flags)
  auto own_softmax = [&](float (&tile_max)[2], float (&factor)[2]) {
    // Lazy reference: it moves only when the tile's row maximum passes it by more than the slack
    // (kReferenceSlackLog2), so most tiles leave factor 1 and both
    // warpgroups skip the rescale of their 128 output accumulators, which sits on the pair's chain
    // (adopt, then O += P V).
    // A 16-bit p <= 2^8 keeps its relative precision and the fp32 sums have range to spare.
    // A row's maximum over its quad takes two shuffle rounds, and shuffles queue behind the
    // other warpgroup's S, whose operands stream through shared memory (softmax a: ~460 cycles a
    // pair, ncu, perf log session 18). A reference can move only where some lane's own maximum
    // passes it, so the warp votes first and shuffles only then (the result is the same): bf16
    // D1 Hq128 3-5% fewer cycles, FP8 caches 1-2.5% (session 24; with the widening producer of
    // before, 1-2% more).
    // (A NaN tile maximum compares false and leaves the reference, as fmaxf would.)
    float new_max[2] = {running_max[0], running_max[1]};
    bool passes = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) passes |= tile_max[half] > running_max[half] + kReferenceSlackLog2;
    if (__any_sync(0xffffffffu, passes)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        tile_max[half] = max_over_quad(tile_max[half]);
        if (tile_max[half] > running_max[half] + kReferenceSlackLog2) new_max[half] = tile_max[half];
      }
    }
    float reference[2];
    if constexpr (kRawKeys) own_rows_moved = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      reference[half] = new_max[half] == -INFINITY ? 0.0f : new_max[half];  // no key yet: exp2 stays 0
      factor[half] = fast_exp2(running_max[half] - reference[half]);
      // (A row without keys so far has no output to rescale: its factor 0 needs no flag.)
      if constexpr (kRawKeys) own_rows_moved |= factor[half] != 1.0f && running_max[half] != -INFINITY;
      running_max[half] = new_max[half];
      running_sum[half] *= factor[half];
    }
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      const int half = (i / 2) % 2;
      const float first = fast_exp2(fmaf(scores[i], logit_scale[kSplitQuery ? half : 0], -reference[half]));
      const float second = fast_exp2(fmaf(scores[i + 1], logit_scale[kSplitQuery ? half : 0], -reference[half]));
      running_sum[half] += first + second;
      probabilities[i / 8][(i % 8) / 2] = halves_from_floats<kHalf>(first, second);
    }
  };
  // kRawKeys: whether any factor of the tile in P buffer `which` differs from 1; the score
  // warpgroup publishes one flag per P buffer with P (moved_flags[which]), so that the O^T
  // rescale, whose accumulator columns are rows of every warp, reads the factors only when they
  // moved.
  int* moved_flags = nullptr;
  if constexpr (kRawKeys) moved_flags = reinterpret_cast<int*>(shared + Layout::kMovedFlags);
  // The own P into `buffer` ([64 rows][64 keys], 16-bit, 128-byte swizzle). stmatrix (one
  // instruction per k step instead of 4 stores and their addresses, on the pair's chain): step
  // k's 4 registers are 8 x 8 blocks of 16-bit pairs, rows row0 / row0 + 8 x the 16-byte chunks
  // 2 k / 2 k + 1 of the row (keys 16 k .. + 7 / + 8 .. + 15); lane l addresses row l % 16 of the
  // warp's 16 in chunk 2 k + l / 16.
  auto store_probabilities = [&](uint8_t* buffer) {
    const int row = 16 * warp + lane % 16;
#pragma unroll
    for (int step = 0; step < kTileKeys / 16; ++step) {
      const int chunk = 2 * step + lane / 16;
      store_matrices_x4(buffer + swizzled_offset(row, 8 * chunk), probabilities[step]);
    }
  };
  // 16-bit caches: P, the new maxima and the factor that rescales everything before the own
  // tile, into shared memory for the other warpgroup.
  auto publish = [&](int pair, const float (&factor)[2]) {
    if (pair > 0) await(warpgroup == 0 ? kConsumedA : kConsumedB, pair - 1);  // our previous P was read
    store_probabilities(probability_buffer(warpgroup));
    __syncwarp();  // the quad's reads of the previous maxima come first
    if (lane % 4 == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        maxima[row0 + 8 * half] = running_max[half];
        factors(warpgroup)[row0 + 8 * half] = factor[half];
      }
    }
    fence_shared_for_async_proxy();
    signal(warpgroup == 0 ? kPublishedA : kPublishedB);
  };

  // The other warpgroup's published maxima and factor: rescale the running state to them.
  auto adopt = [&](int owner, int pair, float (&factor)[2]) {
    await(owner == 0 ? kPublishedA : kPublishedB, pair);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      factor[half] = factors(owner)[row0 + 8 * half];
      running_max[half] = maxima[row0 + 8 * half];
      running_sum[half] *= factor[half];
    }
  };
  // 16-bit caches: `factor` holds this thread's rows' factors.
  auto rescale_output = [&](const float (&factor)[2]) {
    if (factor[0] != 1.0f || factor[1] != 1.0f) {
#pragma unroll
      for (int i = 0; i < 128; ++i) output[i] *= factor[(i / 2) % 2];
    }
  };
  // kRawKeys (the output warpgroups): O^T's rows are dims, its accumulator columns query rows,
  // whose factors are read from P buffer `which`'s published factors.
  auto rescale_transposed_output = [&](int which) {
    float column_factor[16];  // accumulator i of each M tile: column_factor[2 ((i % 32) / 4) + i % 2]
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 pair = *reinterpret_cast<const float2*>(factors(which) + 8 * j + 2 * (lane % 4));
      column_factor[2 * j] = pair.x;
      column_factor[2 * j + 1] = pair.y;
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) output[i] *= column_factor[2 * ((i % 32) / 4) + i % 2];
  };
  // kRawKeys: O^T += V^T P^T for an output warpgroup's 256 value dims over tile `tile`: 16 wgmma
  // m64n64k16 (4 M tiles x 4 k steps) in kValueBatches batches of kBatchTiles M tiles x 2 k steps
  // (one ldmatrix.x4 per M tile, WideValueFragments; 8 registers per M tile; ScoreRoles), P read
  // from its shared-memory buffer. Each batch's fragments are widened while earlier ones run
  // (kValueBuffers buffers: the registers of a batch in flight must stay untouched).
  constexpr int kBatchTiles = ScoreRoles<kFp8Q>::kBatchTiles;
  constexpr int kValueBatches = 2 * kOutputTilesPerWarpgroup / kBatchTiles, kValueBuffers = 2;
  static_assert(kValueBatches % kValueBuffers == 0, "each tile's batch b uses buffer b % kValueBuffers");
  uint32_t value_fragments[kValueBuffers][2 * kBatchTiles][4];  // [buffer][wgmma of the batch][register]
  const WideValueFragments value_reader(warpgroup, warp, lane);
  auto batch_place = [&](int batch, int& half, int& first_tile) {
    half = batch / (kOutputTilesPerWarpgroup / kBatchTiles);
    first_tile = kBatchTiles * (batch % (kOutputTilesPerWarpgroup / kBatchTiles));
  };
  auto load_value_batch = [&](int tile, int batch) {
    const uint8_t* raw = raw_tile(tile);
    int half, first_tile;
    batch_place(batch, half, first_tile);
    uint32_t(&into)[2 * kBatchTiles][4] = value_fragments[batch % kValueBuffers];
#pragma unroll
    for (int m = 0; m < kBatchTiles; ++m) value_reader.load(raw, first_tile + m, half, into[2 * m], into[2 * m + 1]);
  };
  auto issue_value_batch = [&](int tile, int batch) {
    const uint64_t probability_descriptor = make_descriptor(probability_buffer(tile % 2), 16, 1024);
    int half, first_tile;
    batch_place(batch, half, first_tile);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 2 * kBatchTiles; ++j) {
      wgmma_64x64x16_a_registers<true>(*reinterpret_cast<float(*)[32]>(output + 32 * (first_tile + j / 2)),
                                       value_fragments[batch % kValueBuffers][j],
                                       advance_descriptor(probability_descriptor, 32 * (2 * half + j % 2)), true);
    }
    wgmma_commit();
  };
  // 16-bit caches: O += P V for this warpgroup's value columns over tile `tile`, P from registers
  // or from the other warpgroup's buffer (one wgmma group; finish_value_product waits).
  auto value_product = [&](int tile, bool own) {
    // This warpgroup's 4 value blocks are in one part of the tile (KeyParts): 1 KB apart (LBO).
    const uint64_t value_descriptor =
        make_descriptor(stages + (tile % 2) * kTileBlockBytes, 1024, KeyParts::group_stride(0));
    const uint64_t probability_descriptor = make_descriptor(probability_buffer(tile % 2), 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kTileKeys / 16; ++k) {
      if (own) {
        wgmma_64x256x16_a_registers_b_n_major<kHalf>(output, probabilities[k],
                                                     KeyParts::value_descriptor(value_descriptor, value_block, k),
                                                     true);
      } else {
        wgmma_64x256x16_b_n_major<kHalf>(output, advance_descriptor(probability_descriptor, 32 * k),
                                         KeyParts::value_descriptor(value_descriptor, value_block, k), true);
      }
    }
    wgmma_commit();
  };
  // Once per tile per warpgroup: the stage is released here (V is read by the product).
  auto finish_value_product = [&](int tile) {
    wgmma_wait<0>();
    fence_accumulators(output);
    mbarrier_arrive(&empty[tile % 2]);
  };

  if constexpr (kScoreWarpgroup) {
    // Tile t's P, factors and moved flag go through P buffer t % 2: published (the score
    // warpgroup's 128 arrivals), consumed (both output warpgroups' 256).
    float* normalizers = reinterpret_cast<float*>(shared + Layout::kNormalizers);  // at the end
    const OutputDestination destination = output_destination(args, split);
    // The output warpgroups load Q (with the score warpgroup's 128 threads alone, a bf16 q's
    // loads, all in flight at once, take 144 registers per thread), then all three meet.
    constexpr int kQueryLoaded = 5;  // named barrier: the 384 consumer threads
    float* row_factors = kSplitQuery ? reinterpret_cast<float*>(shared + Layout::kRowFactors) : nullptr;
    if (warpgroup == kScoreGroup) {
      // (512 threads launch with 128 registers each: above that the score warpgroup grows too.)
      constexpr int kScoreRegisters = ScoreRoles<kFp8Q>::kScoreRegisters;
      set_register_count<kScoreRegisters, (kScoreRegisters > 128)>();
      sync_named(kQueryLoaded, kConsumerThreads + 128);
      if constexpr (kQueryInRegisters) {
#pragma unroll
        for (int k = 0; k < kQueryFragmentSteps; ++k) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int row = 16 * warp + lane / 4 + 8 * (r % 2), dim = 32 * k + 16 * (r / 2) + 4 * (lane % 4);
            query_fragments[k][r] = *reinterpret_cast<const uint32_t*>(query + raw_fp8_offset<Layout::kQueryLines>(row, dim));
          }
        }
      }
      if constexpr (kSplitQuery) {
#pragma unroll
        for (int half = 0; half < 2; ++half) logit_scale[half] *= row_factors[row0 + 8 * half];
      }
      for (int tile = 0; tile < range.tiles; ++tile) {
        const int which = tile % 2;
        float tile_max[2], factor[2];
        tile_scores(tile, tile_max);
        own_softmax(tile_max, factor);
        if (tile >= 2) await(which == 0 ? kConsumedA : kConsumedB, tile / 2 - 1);
        store_probabilities(probability_buffer(which));
        if (lane % 4 == 0) {
#pragma unroll
          for (int half = 0; half < 2; ++half) factors(which)[row0 + 8 * half] = factor[half];
        }
        const bool moved = sync_named_any(2 + kScoreGroup, 128, own_rows_moved);
        if (thread_in_warpgroup == 0) moved_flags[which] = moved;
        fence_shared_for_async_proxy();
        signal(which == 0 ? kPublishedA : kPublishedB);
      }
      sum_over_quad(running_sum);
      if (lane % 4 == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row0 + 8 * half;
          const FinishedRow finished = finish_row(args, running_sum[half], running_max[half], row < rows_here);
          normalizers[row] = finished.normalizer;
          if (row < rows_here) store_row_lse(args, destination, batch_index, first_row + row, finished.lse2);
        }
      }
      signal(kSumsOf0);
      return;
    }
    set_register_count<ScoreRoles<kFp8Q>::kOutputRegisters, true>();
    load_e4m3_query_rows<kRowsPerTile, kConsumerThreads, kSplitQuery>(args, batch_index, first_row, rows_here, query,
                                                                      row_factors, 1);
    sync_named(kQueryLoaded, kConsumerThreads + 128);
#pragma unroll
    for (int i = 0; i < 128; ++i) output[i] = 0.0f;
    // The products run on across tiles: a tile's batches wait only for the batch two before
    // them (its fragment buffer), so the tensor pipe is not drained at every tile's end; only a
    // rescale (the factors moved) waits for every earlier product. P buffer t % 2 is consumed
    // once tile t's last batch is done: signalled during tile t + 1's second batch.
    for (int tile = 0; tile < range.tiles; ++tile) {
      const int which = tile % 2;
      await(which == 0 ? kPublishedA : kPublishedB, tile / 2);
      if (moved_flags[which] != 0) {
        wgmma_wait<0>();
        fence_accumulators(output);
        rescale_transposed_output(which);
      }
      wait_for_raw_tile(tile);
#pragma unroll
      for (int batch = 0; batch < kValueBatches; ++batch) {
        wgmma_wait<kValueBuffers - 1>();  // (unconditional: ptxas serialises every wgmma otherwise, C7513)
        if (tile > 0 && batch == kValueBuffers - 1) signal(which == 1 ? kConsumedA : kConsumedB);
        load_value_batch(tile, batch);
        issue_value_batch(tile, batch);
      }
      mbarrier_arrive(&empty[tile % kStages]);
    }
    wgmma_wait<0>();
    fence_accumulators(output);
    if (range.tiles > 0) signal((range.tiles - 1) % 2 == 0 ? kConsumedA : kConsumedB);
    signal(kSumsOf1);  // both output warpgroups past their last tile: the key stages are free
    await(kSumsOf1, 0);
    await(kSumsOf0, 0);  // the score warpgroup's normalizers
    float* staged = reinterpret_cast<float*>(shared + Layout::kKeys);
    int64_t* row_offsets = reinterpret_cast<int64_t*>(shared + Layout::kKeys + kAlternatingStagedRowOffsets);
    if (threadIdx.x < rows_here) {
      row_offsets[threadIdx.x] = destination_row_offset(args, destination, batch_index, first_row + threadIdx.x);
    }
    stage_transposed_output(warpgroup, lane, row0, output, normalizers, staged);
    signal(kRowsStaged);
    await(kRowsStaged, 0);
    store_staged_rows<1, kAlternatingStagedRowFloats, 0>(args, destination, staged, row_offsets, rows_here, threadIdx.x,
                                                         kConsumerThreads);
  } else {
    for (int pair = 0; pair < pairs; ++pair) {
      const int tile_a = 2 * pair, tile_b = tile_a + 1;
      const bool has_b = tile_b < range.tiles, has_next = pair + 1 < pairs;
      float tile_max[2], factor[2];
      if (warpgroup == 0) {
        tile_scores(tile_a, tile_max);
        own_softmax(tile_max, factor);
        publish(pair, factor);
        rescale_output(factor);
        value_product(tile_a, true);
        if (has_b) {
          adopt(1, pair, factor);
          finish_value_product(tile_a);
          rescale_output(factor);
          value_product(tile_b, false);
          finish_value_product(tile_b);
          if (has_next) signal(kConsumedB);
        } else {
          finish_value_product(tile_a);
        }
      } else {
        if (has_b) tile_scores(tile_b, tile_max);
        adopt(0, pair, factor);
        rescale_output(factor);
        value_product(tile_a, false);  // runs while this warpgroup does tile b's softmax
        if (has_b) {
          own_softmax(tile_max, factor);
          publish(pair, factor);  // first: warpgroup 0 waits for it (releasing tile a's stage
                                  // before it measured 3-6% slower)
          finish_value_product(tile_a);
          if (has_next) signal(kConsumedA);
          rescale_output(factor);
          value_product(tile_b, true);
          finish_value_product(tile_b);
        } else {
          finish_value_product(tile_a);
        }
      }
    }

    // Row sums: this thread's keys, the quad, then the other warpgroup's tiles.
    float* sums = reinterpret_cast<float*>(shared + Layout::kSums);  // [warpgroup][row]
    sum_over_quad(running_sum);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (lane % 4 == 0) sums[warpgroup * kRowsPerTile + row0 + 8 * half] = running_sum[half];
    }
    signal(warpgroup == 0 ? kSumsOf0 : kSumsOf1);
    await(warpgroup == 0 ? kSumsOf1 : kSumsOf0, 0);
    // Both warpgroups are past their last tile (the sums handoff above): the key stages are free.
    const OutputDestination destination = output_destination(args, split);
    uint8_t* staging = shared + Layout::kKeys;
    stage_alternating_output(args, destination, batch_index, first_row, rows_here, warpgroup, lane, row0, running_max,
                             running_sum, sums + (1 - warpgroup) * kRowsPerTile, output, staging);
    // Every row staged, on an mbarrier (racecheck does not count a named barrier across the two
    // warpgroups, bar.sync 1, 256, as ordering their shared-memory accesses: see narrow_fp8_kernel.cuh
    // `meet`).
    signal(kRowsStaged);
    await(kRowsStaged, 0);
    // (A row without keys stores zeros; with several splits its LSE is -inf, so the combine step
    // never reads them.)
    const float* staged = reinterpret_cast<const float*>(staging);
    const int64_t* row_offsets = reinterpret_cast<const int64_t*>(staging + kAlternatingStagedRowOffsets);
    store_staged_rows<1, kAlternatingStagedRowFloats, 0>(args, destination, staged, row_offsets, rows_here, threadIdx.x,
                                                         kConsumerThreads);
  }
}

}  // namespace openmla::kernels::sm90
