// Dense MLA decode, split-KV attention kernel on Hopper warpgroup MMA (wgmma), for more than 32
// query rows with an FP8 cache (<= 32 rows: narrow_kernel.cuh; 16-bit caches:
// alternating_kernel.cuh, faster, but it holds two key tiles at once, which does not fit in
// shared memory next to the FP8 raw stages).
//
// What: for one request b, one tile of 64 query rows and one KV split, the softmax attention of
// the rows over the split's keys: S = Q K^T (576 dims), P = softmax(S), O = P V (V = the first
// 512 dims of the same cache rows). Query rows are the request's Sq tokens x Hq heads folded
// into M (row m = s * Hq + h), so a 64-row wgmma tile is filled by Hq = 64, Hq = 16 x Sq = 4...
// Roles: 384 threads = two consumer warpgroups (the math) + one producer warpgroup, of which
// one thread issues the loads (a whole warpgroup so that setmaxnreg can move its registers to
// the consumers).
// Tiling: key tiles of 64 tokens.
// - S: warpgroup w computes the 64 x 32 scores of keys 32 w .. 32 w + 31 (wgmma m64n32k16,
//   36 steps over the 576 dims; K from shared memory, Q from shared memory for the first 20
//   steps and from registers for the last 16, which keeps S under shared memory's bandwidth).
// - softmax: both warpgroups trade their row maxima through shared memory, so both rescale by
//   the same factor, and write their half of P (16-bit) to shared memory.
// - O += P V: warpgroup w owns value columns 256 w .. 256 w + 255 (wgmma m64n256k16, 128 fp32
//   accumulators per thread), P and V from shared memory. V is read N-major from the K tile
//   itself, so each cache row is loaded once.
// Shared memory (all operands in 128-byte swizzled 64 x 64 blocks, see wgmma.cuh): Q 72 KB,
// one 72 KB fp16 math tile, two raw 36 KB FP8 stages, P 8 KB: ~225 KB, one CTA per SM.
// Pipeline: one thread of the producer warpgroup streams raw key tiles with the TMA into two
// stages (key_tiles.cuh); per tile the consumers meet at four barriers (the math tile is free;
// this warpgroup's half is widened; row maxima traded; P written), and the raw stage goes back
// to the producer as soon as it is widened, so tile t + 1 streams in while tile t is computed.
// Softmax: online, base 2 (logits scaled by softmax_scale * descales * log2 e), with the -inf
// guards that keep a row without keys at output 0 and LSE -inf.
// Epilogue: one split writes the 16-bit output and LSE directly; several splits write fp32
// partial outputs and base-2 LSEs to the workspace for the combine kernel.
// Limits: head dim 576 / value dim 512 fixed; rows tiled by 64 (rows past the end are zero
// queries whose keys are all masked).
#pragma once

#include "kernels/sm90/dense_decode/key_tiles.cuh"
#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"

namespace openmla::kernels::sm90 {

constexpr int kRegisterQuerySteps = 16;                             // of S's 36 k steps
constexpr int kSharedQuerySteps = kHeadDim / 16 - kRegisterQuerySteps;
constexpr int kProbabilityBlockBytes = kSwizzleBlockBytes;          // P: 64 rows x 64 keys

// Byte offsets of the shared-memory regions (from a 1024-byte aligned base).
struct WideLayout {
  static constexpr int kQuery = 0;
  static constexpr int kKeys = kTileBlockBytes;           // the 16-bit math tile
  static constexpr int kRaw = kKeys + kTileBlockBytes;    // two raw FP8 stages
  static constexpr int kProbabilities = kRaw + 2 * kRawFp8StageBytes;
  static constexpr int kExchange = kProbabilities + kProbabilityBlockBytes;  // [2][64] floats
  static constexpr int kBarriers = kExchange + 2 * kRowsPerTile * 4;        // full[2], empty[2]
  static constexpr int kBytes = kBarriers + 4 * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;  // slack to align the base by hand
};
static_assert(WideLayout::kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");

template <bool kFp8Q>
__global__ void __launch_bounds__(kWideThreads, 1)
    dense_decode_wide_kernel(const __grid_constant__ CUtensorMap cache_map, SplitArgs args) {
  constexpr bool kHalf = true, kFp8Cache = true;  // FP8 caches compute in fp16
  using Layout = WideLayout;
  extern __shared__ uint8_t raw_shared[];
  // The swizzle pattern is a function of address bits 4-9: every block starts 1024-aligned.
  // (Offsetting raw_shared, not casting an integer, keeps the accesses in the shared space.)
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  uint8_t* probabilities = shared + Layout::kProbabilities;
  float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange);  // [warpgroup][row]
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);  // [2]
  uint64_t* empty = full + 2;                                               // [2]
  constexpr int kStageBytes = kRawFp8StageBytes;
  uint8_t* stages = shared + Layout::kRaw;  // raw FP8 tiles, widened into `keys` one at a time

  // PDL: inputs may come from the previous kernel in the stream; and the combine kernel may be
  // scheduled now (it waits for this whole grid before reading).
  wait_for_previous_grid();
  allow_next_grid();

  const CtaWork work = cta_work<true>(args, reinterpret_cast<int*>(stages));
  const int tile_index = blockIdx.x, batch_index = work.batch_index, split = work.split;
  const int first_row = tile_index * kRowsPerTile;
  const int rows_here = min(kRowsPerTile, args.rows - first_row);
  start_early_loads<(kFp8Q ? 1 : 2)>(&cache_map, args, batch_index, first_row, rows_here);
  const KeyRange range = split_key_range(args, batch_index, split, first_row, rows_here);
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, first_row, rows_here)) return;

  init_stage_barriers(full, empty, kConsumerThreads);
  __syncthreads();  // the last barrier of all threads: the producer warpgroup leaves after its loop
  if (threadIdx.x >= kConsumerThreads) {
    set_register_count<kProducerRegisters, false>();
    if (threadIdx.x == kConsumerThreads) {
      produce_key_tiles<kFp8Cache>(&cache_map, args, table_row, range, stages, full, empty);
    }
    return;
  }
  set_register_count<kConsumerRegisters, true>();

  const float logit_scale = args.logit_scale_log2 * load_query_tile<kHalf, query_load<kHalf, kFp8Q, kFp8Cache>(), kRowsPerTile, kConsumerThreads>(
                                                        args, batch_index, first_row, rows_here, query, 1);

  const int warpgroup = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int thread_in_warpgroup = threadIdx.x % 128;
  // Accumulator rows of this thread (wgmma D layout): row0 and row0 + 8 ("half" 0 and 1).
  const int row0 = 16 * warp + lane / 4;
  int visible[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) visible[half] = row_visible_end(args, range, first_row, row0 + 8 * half, rows_here);

  float output[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) output[i] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.0f, 0.0f};  // over this warpgroup's keys only

  // The last kRegisterQuerySteps k steps of S take Q from registers: with both operands in
  // shared memory an m64n32k16 reads 3 KB per 16 tensor cycles, more than shared memory's
  // 128 B/cycle, so S would be bandwidth-bound; 64 registers of Q bring it to ~1 KB per step.
  uint32_t query_registers[kRegisterQuerySteps][4];
#pragma unroll
  for (int step = 0; step < kRegisterQuerySteps; ++step) {
    query_fragment(query, kSharedQuerySteps + step, warp, lane, query_registers[step]);
  }
  const uint64_t query_descriptor = make_descriptor(query, 16, 1024);
  const uint64_t probability_descriptor = make_descriptor(probabilities, 16, 1024);
  uint8_t* keys = shared + Layout::kKeys;

  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = tile % 2;
    const int first_key = range.begin + tile * kTileKeys;
    const int valid = range.length - first_key;  // key lines of the tile inside the sequence
    mbarrier_wait(&full[stage], (tile / 2) % 2);
    // This warpgroup's 32 key lines into the math tile (slots past the sequence end as zeros),
    // once both warpgroups are done with it (O += P V of tile - 1).
    sync_consumers();
    widen_key_lines<kHalf, 32>(stages + stage * kStageBytes, keys, 32 * warpgroup, valid, thread_in_warpgroup);
    mbarrier_arrive(&empty[stage]);  // the raw stage is consumed
    fence_shared_for_async_proxy();
    sync_named(2 + warpgroup, 128);

    // S = Q K^T for this warpgroup's 32 keys.
    float scores[16];
    const uint64_t key_descriptor = make_descriptor(keys + warpgroup * 32 * 128, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const int offset = (k / 4) * kSwizzleBlockBytes + (k % 4) * 32;
      if (k < kSharedQuerySteps) {
        wgmma_64x32x16<kHalf>(scores, advance_descriptor(query_descriptor, offset),
                              advance_descriptor(key_descriptor, offset), k > 0);
      } else {
        wgmma_64x32x16_a_registers<kHalf>(scores, query_registers[k - kSharedQuerySteps],
                                          advance_descriptor(key_descriptor, offset), true);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(scores);

    // Online softmax in base 2; score i of this thread is row row0 + 8 ((i / 2) % 2), key
    // 8 (i / 4) + 2 (lane % 4) + i % 2 of the warpgroup's 32.
    const int first_own_key = first_key + warpgroup * 32;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int half = (i / 2) % 2;
      const int key = first_own_key + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      scores[i] = key < visible[half] ? scores[i] * logit_scale : -INFINITY;
      tile_max[half] = fmaxf(tile_max[half], scores[i]);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 1));
      tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 2));
      if (lane % 4 == 0) exchange[warpgroup * kRowsPerTile + row0 + 8 * half] = tile_max[half];
    }
    // Both warpgroups' maxima are in; also, both finished O += P V of the previous tile, so P
    // may be overwritten.
    sync_consumers();
    float rescale[2], reference[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float other = exchange[(1 - warpgroup) * kRowsPerTile + row0 + 8 * half];
      const float new_max = fmaxf(running_max[half], fmaxf(tile_max[half], other));
      // A row that has seen no key yet keeps max -inf; subtracting 0 then keeps exp2 at 0.
      reference[half] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[half] = exp2f(running_max[half] - reference[half]);
      running_max[half] = new_max;
      running_sum[half] *= rescale[half];
    }
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int half = (i / 2) % 2;
      const float first = exp2f(scores[i] - reference[half]);
      const float second = exp2f(scores[i + 1] - reference[half]);
      running_sum[half] += first + second;
      const int row = row0 + 8 * half, key = warpgroup * 32 + 8 * (i / 4) + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(probabilities + swizzled_offset(row, key)) = pack_two<kHalf>(first, second);
    }
    // Once the row maxima settle (most tiles) the factors are 1: skip the 128 multiplies.
    if (rescale[0] != 1.0f || rescale[1] != 1.0f) {
#pragma unroll
      for (int i = 0; i < 128; ++i) output[i] *= rescale[(i / 2) % 2];
    }
    fence_shared_for_async_proxy();
    sync_consumers();  // both halves of P written (and, FP8, both halves of the math tile)

    // O += P V for this warpgroup's 256 value columns (4 swizzled blocks of 64 dims; a k step
    // of 16 keys is 16 lines = 2048 bytes).
    const uint64_t value_descriptor =
        make_descriptor(keys + warpgroup * 4 * kSwizzleBlockBytes, kSwizzleBlockBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kTileKeys / 16; ++k) {
      wgmma_64x256x16_b_n_major<kHalf>(output, advance_descriptor(probability_descriptor, 32 * k),
                                       advance_descriptor(value_descriptor, 2048 * k), true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(output);
  }

  sum_over_quad(running_sum);
  sync_consumers();  // the last tile's reads of the exchange are done
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (lane % 4 == 0) exchange[warpgroup * kRowsPerTile + row0 + 8 * half] = running_sum[half];
  }
  sync_consumers();  // each warpgroup summed only its own keys: add the other's
  store_wide_output(args, split, batch_index, first_row, rows_here, warpgroup, lane, row0, running_max, running_sum,
                    exchange + (1 - warpgroup) * kRowsPerTile, output);
}

}  // namespace openmla::kernels::sm90
