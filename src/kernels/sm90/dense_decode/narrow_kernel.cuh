// Dense MLA decode, split-KV attention kernel for at most 16 query rows (Sq x Hq <= 16, e.g.
// Hq = 16 heads per GPU at tensor parallelism 8), on Hopper warpgroup MMA, transposed.
//
// What: as wide_kernel.cuh (softmax attention of the rows over one split's keys, V = the first
// 512 dims of the cache rows), but computed as S^T = K Q^T and O^T = V^T P^T, so that the query
// rows are wgmma's N (16) instead of M (64): the wide kernel would spend 3/4 of its tensor
// work on padding rows here, which made 16-head decode compute-bound.
// Roles: 160 threads = one consumer warpgroup (the math) + one producer warp (TMA, as in the
// wide kernel: key_tiles.cuh).
// Tiling: key tiles of 64 tokens.
// - S^T (64 keys x 16 rows): wgmma m64n16k16, 36 steps; A = the K tile (K-major), B = Q.
// - softmax over keys (the M direction): row maxima reduced across the 8 lanes that share a
//   row, then across the 4 warps through shared memory; P^T written to shared memory.
// - O^T (512 dims x 16 rows) += V^T P^T: 8 x 4 wgmma m64n16k16 per tile, A = V read M-major
//   (tnspA) from the same K tile, B = P^T; 64 fp32 accumulators per thread.
// Shared memory: Q 18 KB (9 swizzled blocks of 16 lines), two 72 KB key stages (16-bit cache)
// or one 72 KB math tile + two raw 36 KB stages (FP8 cache, widened exactly), P^T 2 KB.
// Pipeline: tile t + 1 streams in while tile t is computed; two warpgroup barriers per tile
// (16-bit cache; an FP8 cache adds two around the widening of the single math tile).
// Softmax, epilogue: as the wide kernel (base-2 online softmax with -inf guards; one split
// writes bf16 output and LSE, several write fp32 partials for the combine step). The output
// is staged through shared memory so that the stores are row-contiguous.
// Limits: Sq * Hq <= 16.
#pragma once

#include "kernels/sm90/dense_decode/key_tiles.cuh"
#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"

namespace openmla::kernels::sm90 {

constexpr int kNarrowRows = 16;
constexpr int kNarrowConsumers = 128;
constexpr int kNarrowThreads = kNarrowConsumers + 32;
constexpr int kNarrowQueryBytes = kDimBlocks * kNarrowRows * 128;  // 18 KB

template <bool kFp8Cache>
struct NarrowLayout {
  static constexpr int kQuery = 0;
  static constexpr int kKeys = kNarrowQueryBytes;  // stage 0 (16-bit) or the math tile (fp8)
  static constexpr int kRaw = kKeys + (kFp8Cache ? kTileBlockBytes : 0);
  static constexpr int kProbabilities = kKeys + 2 * (kFp8Cache ? kRawFp8StageBytes : kTileBlockBytes) +
                                        (kFp8Cache ? kTileBlockBytes : 0);
  static constexpr int kExchange = kProbabilities + kNarrowRows * 128;  // [4 warps][16 rows] floats
  static constexpr int kBarriers = kExchange + 4 * kNarrowRows * 4;     // full[2], empty[2]
  static constexpr int kBytes = kBarriers + 4 * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
  // After the last tile the output is staged in the first key stage: [16 rows][512] floats.
  static_assert(kNarrowRows * kLatentDim * 4 <= kTileBlockBytes, "output staging fits a stage");
  static_assert(kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ the q amax word)");
};

__device__ __forceinline__ void sync_narrow_consumers() { sync_named(1, kNarrowConsumers); }

template <bool kHalf, bool kFp8Q, bool kFp8Cache>
__global__ void __launch_bounds__(kNarrowThreads, 1)
    dense_decode_narrow_kernel(const __grid_constant__ CUtensorMap cache_map, SplitArgs args) {
  using Layout = NarrowLayout<kFp8Cache>;
  extern __shared__ uint8_t raw_shared[];
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  uint8_t* probabilities = shared + Layout::kProbabilities;  // P^T as [row][key], swizzled
  float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange);
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);
  uint64_t* empty = full + 2;
  constexpr int kStageBytes = kFp8Cache ? kRawFp8StageBytes : kTileBlockBytes;
  uint8_t* stages = shared + (kFp8Cache ? Layout::kRaw : Layout::kKeys);

  wait_for_previous_grid();  // PDL (see wide_kernel.cuh)
  allow_next_grid();

  const int split = blockIdx.y, batch_index = blockIdx.z;
  const int rows_here = args.rows;  // <= 16: one row tile
  const KeyRange range = split_key_range<kTileKeys>(args, batch_index, split, 0, rows_here);
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, 0, rows_here)) return;

  init_stage_barriers(full, empty, kNarrowConsumers);
  __syncthreads();  // the last barrier of all threads: the producer warp leaves after its loop
  if (threadIdx.x >= kNarrowConsumers) {
    if (threadIdx.x == kNarrowConsumers) {
      produce_key_tiles<kFp8Cache>(&cache_map, args, table_row, range, stages, full, empty);
    }
    return;
  }

  const float logit_scale = args.logit_scale_log2 * load_query_tile<kHalf, query_load<kHalf, kFp8Q, kFp8Cache>(), kNarrowRows, kNarrowConsumers>(
                                                        args, batch_index, 0, rows_here, query, 1);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Accumulator element i of this thread: key (M) 16 warp + lane / 4 + 8 ((i / 2) % 2), query
  // row (N) 8 (i / 4) + 2 (lane % 4) + i % 2. A thread holds 4 rows ("slots" 2 (i / 4) + i % 2)
  // x 2 keys of S^T, and the same 4 rows of O^T.
  auto slot_of = [](int i) { return 2 * (i / 4) + i % 2; };
  auto row_of_slot = [lane](int slot) { return 8 * (slot / 2) + 2 * (lane % 4) + slot % 2; };
  int visible[4];
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) visible[slot] = row_visible_end(args, range, 0, row_of_slot(slot), rows_here);

  float output[kLatentDim / 64][8];  // O^T: 8 blocks of 64 dims x 16 rows
#pragma unroll
  for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
    for (int i = 0; i < 8; ++i) output[block][i] = 0.0f;
  }
  float running_max[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float running_sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // over this thread's keys only

  const uint64_t query_descriptor = make_descriptor(query, 16, 1024);
  const uint64_t probability_descriptor = make_descriptor(probabilities, 16, 1024);
  uint8_t* keys = kFp8Cache ? shared + Layout::kKeys : nullptr;

  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = tile % 2;
    const int first_key = range.begin + tile * kTileKeys;
    const int valid = range.length - first_key;
    mbarrier_wait(&full[stage], (tile / 2) % 2);
    if constexpr (kFp8Cache) {
      sync_narrow_consumers();  // every warp is done with the math tile (O^T += V^T P^T of tile - 1)
      widen_key_lines<kHalf, kTileKeys>(stages + stage * kStageBytes, keys, 0, valid, threadIdx.x);
      mbarrier_arrive(&empty[stage]);
      fence_shared_for_async_proxy();
      sync_narrow_consumers();
    } else {
      keys = stages + stage * kStageBytes;
      if (valid < kTileKeys) {
        zero_key_lines(keys, valid, threadIdx.x, kNarrowConsumers);
        fence_shared_for_async_proxy();
        sync_narrow_consumers();
      }
    }

    // S^T = K Q^T.
    float scores[8];
    const uint64_t key_descriptor = make_descriptor(keys, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      wgmma_64x16x16<kHalf>(scores, advance_descriptor(key_descriptor, (k / 4) * kSwizzleBlockBytes + (k % 4) * 32),
                            advance_descriptor(query_descriptor, (k / 4) * (kNarrowRows * 128) + (k % 4) * 32),
                            k > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(scores);

    // Online softmax over keys, base 2.
    float tile_max[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int key = first_key + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      scores[i] = key < visible[slot_of(i)] ? scores[i] * logit_scale : -INFINITY;
      tile_max[slot_of(i)] = fmaxf(tile_max[slot_of(i)], scores[i]);
    }
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
#pragma unroll
      for (int mask = 4; mask < 32; mask *= 2) {
        tile_max[slot] = fmaxf(tile_max[slot], __shfl_xor_sync(0xffffffffu, tile_max[slot], mask));
      }
      if (lane < 4) exchange[warp * kNarrowRows + row_of_slot(slot)] = tile_max[slot];
    }
    sync_narrow_consumers();  // all warps' maxima in; also every warp finished the last O^T update
    float rescale[4], reference[4];
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
      const int row = row_of_slot(slot);
      const float new_max =
          fmaxf(fmaxf(running_max[slot], fmaxf(exchange[row], exchange[kNarrowRows + row])),
                fmaxf(exchange[2 * kNarrowRows + row], exchange[3 * kNarrowRows + row]));
      reference[slot] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[slot] = exp2f(running_max[slot] - reference[slot]);
      running_max[slot] = new_max;
      running_sum[slot] *= rescale[slot];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float probability = exp2f(scores[i] - reference[slot_of(i)]);
      running_sum[slot_of(i)] += probability;
      const int key = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      *reinterpret_cast<uint16_t*>(probabilities + swizzled_offset(row_of_slot(slot_of(i)), key)) =
          uint16_t(pack_two<kHalf>(probability, 0.0f) & 0xffffu);
    }
    if (rescale[0] != 1.0f || rescale[1] != 1.0f || rescale[2] != 1.0f || rescale[3] != 1.0f) {
#pragma unroll
      for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
        for (int i = 0; i < 8; ++i) output[block][i] *= rescale[slot_of(i)];
      }
    }
    fence_shared_for_async_proxy();
    sync_narrow_consumers();  // P^T complete; the exchange reads are done

    // O^T += V^T P^T: V^T block b (64 dims) is the K tile's block b read M-major; a k step of
    // 16 keys is 16 lines (2048 bytes).
    const uint64_t value_descriptor = make_descriptor(keys, kSwizzleBlockBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
      for (int k = 0; k < kTileKeys / 16; ++k) {
        wgmma_64x16x16_a_m_major<kHalf>(output[block],
                                        advance_descriptor(value_descriptor, block * kSwizzleBlockBytes + k * 2048),
                                        advance_descriptor(probability_descriptor, 32 * k), true);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int block = 0; block < kLatentDim / 64; ++block) fence_accumulators(output[block]);
    if constexpr (!kFp8Cache) mbarrier_arrive(&empty[stage]);
  }

  // Row sums: this thread's keys, then the 8 lanes of the row, then the 4 warps.
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) {
#pragma unroll
    for (int mask = 4; mask < 32; mask *= 2) running_sum[slot] += __shfl_xor_sync(0xffffffffu, running_sum[slot], mask);
  }
  sync_narrow_consumers();  // the last tile's reads of the exchange are done
  if (lane < 4) {
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) exchange[warp * kNarrowRows + row_of_slot(slot)] = running_sum[slot];
  }
  // Normalised O^T -> shared [row][dim] floats (the first key stage is free: every tile landed
  // and was consumed), so that rows are stored contiguously below.
  float* staged = reinterpret_cast<float*>(shared + Layout::kKeys);
  sync_narrow_consumers();
  float normalizer[4];
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) {
    const int row = row_of_slot(slot);
    const float sum = exchange[row] + exchange[kNarrowRows + row] + exchange[2 * kNarrowRows + row] +
                      exchange[3 * kNarrowRows + row];
    normalizer[slot] = sum == 0.0f ? 0.0f : args.value_scale / sum;
    if (warp == 0 && lane < 4 && row < rows_here) {
      store_row_lse(args, split, batch_index, row, sum == 0.0f ? -INFINITY : running_max[slot] + log2f(sum));
    }
  }
#pragma unroll
  for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int dim = 64 * block + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      staged[row_of_slot(slot_of(i)) * kLatentDim + dim] = output[block][i] * normalizer[slot_of(i)];
    }
  }
  sync_narrow_consumers();
  // (A row without keys stores zeros; with several splits its LSE is -inf, so the combine
  // step never reads them.)
  for (int index = threadIdx.x; index < rows_here * (kLatentDim / 2); index += kNarrowConsumers) {
    const int row = index / (kLatentDim / 2), column = 2 * (index % (kLatentDim / 2));
    store_value_pair(args, split, batch_index, row, column, staged[row * kLatentDim + column],
                     staged[row * kLatentDim + column + 1], false);
  }
}

}  // namespace openmla::kernels::sm90
