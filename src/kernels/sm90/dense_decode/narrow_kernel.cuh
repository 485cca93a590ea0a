// Dense MLA decode, split-KV attention kernel for few query rows (Sq x Hq <= 32: Hq = 16 heads
// per GPU at tensor parallelism 8, Sq 2 x 16 heads with one speculative token, 32 heads), on
// Hopper warpgroup MMA, transposed.
//
// What: as alternating_kernel.cuh (softmax attention of the rows over one split's keys, V = the first
// 512 dims of the cache rows), but computed as S^T = K Q^T and O^T = V^T P^T, so that the query
// rows are wgmma's N (kRows = 16 or 32) instead of M (64): a 64-row kernel would spend 3/4 of
// its tensor work on padding rows here, which made 16-head decode compute-bound.
// Roles: consumer warpgroups (the math) + a producer (one thread issues the TMA, as in the
// alternating kernel: key_tiles.cuh). A 16-bit cache has one consumer warpgroup; an FP8 cache has
// three (16 rows) or two (32 rows) that take the tiles in turn, each with its own online
// softmax and O^T, merged at the end: one warpgroup's chain of dependent steps per tile
// (wgmma, softmax, V^T fragment loads) is longer than an FP8 tile takes to stream in (1 / 2 / 3
// warpgroups measured 0.47 / 0.68 / 0.80 of the copy rate on D2 Hq 16, H200, when S^T's
// fragments were widened in registers too).
// Tiling: key tiles of 64 tokens.
// - S^T (64 keys x kRows): wgmma m64nNk16, 36 steps; A = the K tile (K-major), B = Q. With an
//   FP8 cache, e4m3 wgmma m64nNk32, 18 steps, A = the raw tile as the TMA landed it, B = Q's
//   e4m3 lines: an fp8 q as it is (N = kRows), a bf16 q as high and low e4m3 parts (N = 2 kRows,
//   summed after; a power-of-two factor per row, fp8_tiles.cuh load_e4m3_query_rows); the steps
//   accumulate in 3 (16 rows) or 2 (32 rows) segments added in fp32, for precision. (Until
//   session 12 each k step's A fragment was read from the raw tile and widened to fp16 in
//   registers, a chain of ldmatrix, cvt and wgmma per step: FP8 D2 Hq 16 / 32 ran 11% / 23%
//   slower on an H200.)
// - softmax over keys (the M direction): row maxima reduced across the 8 lanes that share a
//   row, then across the 4 warps through shared memory; P^T written to shared memory.
// - O^T (512 dims x kRows) += V^T P^T: 8 x 4 wgmma m64nNk16 per tile, A = V read M-major
//   (tnspA) from the same K tile, B = P^T; 4 kRows fp32 accumulators per thread. FP8 cache: A
//   from registers again (4 keys x 4 dims per thread, keys paired by byte permutes), so P^T's
//   keys and O^T's dims are stored in the fragments' order and O^T's dims restored at the end.
// Shared memory: Q (9 swizzled blocks of kRows 128-byte lines, or with an FP8 cache of up to
// 2 kRows 64-byte lines), P^T per warpgroup, a logit factor per row, and two 72 KB key
// stages (16-bit cache) or five / four raw 36 KB stages (FP8 cache: nothing is widened in
// shared memory, and the spare room keeps more bytes in flight). 32-row tiles with a 16-bit
// cache moved D2 Hq 32 off the 64-row kernel (431 -> 419 us on an H100, as fast as Hq 16).
// Pipeline: the next tiles stream in while tile t is computed; two warpgroup barriers per tile
// (three when the tile is partial). A 16-bit tile lands in three parts (kParts), S^T starting
// on the first. With an FP8 cache the V^T fragments of batch i + 1 (4 wgmma)
// are loaded and widened while batch i runs, and a stage is released as soon as its last bytes
// are in registers.
// Softmax, epilogue: as the alternating kernel (base-2 online softmax with -inf guards; one split
// writes bf16 output and LSE, several write fp32 partials for the combine step). The output
// is staged through shared memory so that the stores are row-contiguous.
// Limits: Sq * Hq <= 32 (tiles of 16 or 32 rows).
#pragma once

#include "kernels/sm90/dense_decode/fp8_tiles.cuh"
#include "kernels/sm90/dense_decode/key_tiles.cuh"
#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"

namespace openmla::kernels::sm90 {

constexpr int kNarrowRows = 32;  // the most query rows of the narrow kernel's tile (16 or 32)
constexpr int kNarrowGroupThreads = 128;  // one consumer warpgroup
// The launcher's choice of kernel (it also picks the FP8 cache's TMA swizzle). 32 rows are
// Sq 2 x 16 heads (speculative decoding at tensor parallelism 8) or 32 heads.
__host__ __device__ constexpr bool uses_narrow_kernel(int rows) { return rows <= kNarrowRows; }

template <bool kFp8Cache, int kRows>
struct NarrowLayout {
  static_assert(kRows == 16 || kRows == 32, "16 or 32 query rows");
  // Consumer warpgroups taking the tiles in turn: as many as the registers allow (O^T is
  // 4 x kRows fp32 per thread).
  static constexpr int kGroups = !kFp8Cache ? 1 : (kRows == 16 ? 3 : 2);
  static constexpr int kConsumers = kGroups * kNarrowGroupThreads;
  // + the producer: a warp, or with several consumer warpgroups a whole warpgroup, so that it
  // can hand its registers to them (setmaxnreg works per warpgroup): 3 x 128 x 160 + 128 x 24
  // or 2 x 128 x 240 + 128 x 24.
  static constexpr int kProducerThreads = kGroups > 1 ? 128 : 32;
  static constexpr int kThreads = kConsumers + kProducerThreads;
  static constexpr int kConsumerRegisters = kGroups == 3 ? 160 : 240;
  // (4 consumer warpgroups at 120 registers hung: key_tiles.cuh register_split_fits.)
  static_assert(kGroups == 1 ||
                    register_split_fits(kThreads, kConsumers, kConsumerRegisters, kProducerThreads, kProducerRegisters),
                "the consumers' setmaxnreg.inc must be satisfiable");
  static constexpr int kStages = !kFp8Cache ? 2 : (kRows == 16 ? 5 : 4);
  // A 16-bit tile lands in three parts of 3 blocks of 64 dims, each on its own full barrier, so
  // that S^T starts on the first part while the rest streams in (a CTA of D4 / D5 computes one
  // to four tiles, the first straight after it lands). FP8 tiles land whole: in three parts
  // they measured within +-2% on FP8 D4 / D5 (perf log, session 30).
  static constexpr int kParts = kFp8Cache ? 1 : 3;
  static constexpr int kStageBytes = kFp8Cache ? kRawFp8StageBytes : kTileBlockBytes;
  static constexpr int kQuery = 0;  // 9 swizzled blocks of kRows lines
  static constexpr int kKeys = kDimBlocks * kRows * 128;  // the stages
  static constexpr int kProbabilities = kKeys + kStages * kStageBytes;  // P^T per group
  static constexpr int kExchange = kProbabilities + kGroups * kRows * 128;  // [group][4 warps][kRows]
  static constexpr int kMerge = kExchange + kGroups * 4 * kRows * 4;  // [group][max, sum][kRows]
  static constexpr int kRowFactors = kMerge + kGroups * 2 * kRows * 4;  // [kRows]: bf16 q, FP8 cache
  // full[kStages x kGroups x kParts], empty[kStages], then the consumers' barrier
  static constexpr int kBarriers = kRowFactors + kRows * 4;
  static constexpr int kBytes = kBarriers + (kStages * kGroups * kParts + kStages + 1) * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;
  // After the last tile the output is staged in the key stages: [group][kRows][512 + 4] floats
  // (the padding puts the 4 rows that one store instruction of a warp writes in distinct banks),
  // then each row's destination offset (int64).
  static constexpr int kStagedRowFloats = kLatentDim + 4;
  static constexpr int kStagedGroupFloats = kRows * kStagedRowFloats;
  static constexpr int kStagedRowOffsets = kGroups * kStagedGroupFloats * 4;
  static_assert(kStagedRowOffsets + kRows * 8 <= kStages * kStageBytes, "output staging fits the stages");
  static_assert(kKeys % 1024 == 0 && kStageBytes % 1024 == 0, "swizzled stages are 1024-byte aligned");
  static_assert(kLaunchBytes + 16 <= kMaxSharedBytes, "shared memory (+ static words)");
};

// Named barriers 1 + group: one consumer warpgroup.
__device__ __forceinline__ void sync_narrow_group(int group) { sync_named(1 + group, kNarrowGroupThreads); }
// All consumer warpgroups. Several: on an mbarrier (phases alternate parity); named barriers
// spanning the warpgroups (bar.sync 4, 384) were reported by racecheck as not ordering the
// accesses across them, the mbarrier's arrive (release) / wait (acquire) does. The warp
// reconverges first, so that no lane spins in try_wait while lanes of its own warp (after an
// `if (lane < 4)` block, say) have yet to arrive. One warpgroup: its named barrier.
struct ConsumerBarrier {
  uint64_t* barrier;  // null with one consumer warpgroup
  int parity = 0;
  __device__ __forceinline__ void sync() {
    if (barrier == nullptr) {
      sync_narrow_group(0);
      return;
    }
    __syncwarp();
    mbarrier_arrive(barrier);
    mbarrier_wait(barrier, parity);
    parity ^= 1;
  }
};

// Register buffers of V^T fragments in the FP8 O^T loop (2: the 160 registers of three warpgroups).
constexpr int kFragmentBuffers = 2;

// D (64 x kRows) += A (an m64k16 fragment in registers) * B (K-major, kRows lines).
template <bool kHalf, int kRows>
__device__ __forceinline__ void wgmma_rows_a_registers(float (&d)[kRows / 2], const uint32_t (&a)[4], uint64_t b,
                                                       bool accumulate) {
  if constexpr (kRows == 16) {
    wgmma_64x16x16_a_registers<kHalf>(d, a, b, accumulate);
  } else {
    wgmma_64x32x16_a_registers<kHalf>(d, a, b, accumulate);
  }
}

// The same with A from shared memory: K-major (S^T = K Q^T) or M-major (O^T = V^T P^T, V read
// from the key tile as [key][dim]).
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

template <bool kHalf, bool kFp8Q, bool kFp8Cache, int kRows>
__global__ void __launch_bounds__(NarrowLayout<kFp8Cache, kRows>::kThreads, 1)
    dense_decode_narrow_kernel(const __grid_constant__ CUtensorMap cache_map, SplitArgs args) {
  using Layout = NarrowLayout<kFp8Cache, kRows>;
  constexpr int kSlots = kRows / 4;  // query rows per thread (accumulator columns)
  // Q's e4m3 lines with an FP8 cache: a bf16 q's high and low parts (fp8_tiles.cuh).
  constexpr int kQueryLines = kFp8Q ? kRows : 2 * kRows;
  constexpr int kFp8Segments = kRows == 16 ? 3 : 2;  // of S^T's e4m3 steps (below)
  static_assert(kHalf || !kFp8Cache, "an FP8 cache computes in fp16");
  extern __shared__ uint8_t raw_shared[];
  uint8_t* shared = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  uint8_t* query = shared + Layout::kQuery;
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);
  uint64_t* empty = full + Layout::kStages * Layout::kGroups * Layout::kParts;
  uint8_t* stages = shared + Layout::kKeys;

  wait_for_previous_grid();  // PDL (see alternating_kernel.cuh)
  allow_next_grid();

  const CtaWork work = cta_work(args, reinterpret_cast<int*>(stages));
  const int batch_index = work.batch_index, split = work.split;
  const int rows_here = args.rows;  // <= kRows: one row tile
  start_early_loads<(kFp8Q ? 1 : 2)>(&cache_map, args, batch_index, 0, rows_here);
  const KeyRange range = split_key_range(args, work, 0, rows_here);
  const int32_t* table_row = args.block_table + int64_t(batch_index) * args.block_table_row;
  if (finish_empty_split(args, range, split, batch_index, 0, rows_here)) return;

  // A stage is released by the one warpgroup that consumes the tile in it (tile t: stage
  // t % kStages, warpgroup t % kGroups).
  init_stage_barriers(full, empty, kNarrowGroupThreads, Layout::kStages, Layout::kGroups, Layout::kParts);
  ConsumerBarrier consumers{Layout::kGroups > 1 ? empty + Layout::kStages : nullptr};
  if constexpr (Layout::kGroups > 1) {
    if (threadIdx.x == 0) {
      mbarrier_init(consumers.barrier, Layout::kConsumers);
      fence_barrier_init();
    }
  }
  __syncthreads();  // the last barrier of all threads: the producer leaves after its loop
  if (threadIdx.x >= Layout::kConsumers) {
    if constexpr (Layout::kGroups > 1) set_register_count<kProducerRegisters, false>();
    if (threadIdx.x == Layout::kConsumers) {
      produce_key_tiles<kFp8Cache, Layout::kStages, Layout::kGroups, Layout::kParts>(&cache_map, args, table_row, range,
                                                                                     stages, full, empty);
    }
    return;
  }
  if constexpr (Layout::kGroups > 1) set_register_count<Layout::kConsumerRegisters, true>();

  const int group = threadIdx.x / kNarrowGroupThreads;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  uint8_t* probabilities = shared + Layout::kProbabilities + group * (kRows * 128);  // P^T [row][key], swizzled
  float* exchange = reinterpret_cast<float*>(shared + Layout::kExchange) + group * 4 * kRows;
  float* merge = reinterpret_cast<float*>(shared + Layout::kMerge);

  // Q by the first warpgroup (the others wait at the consumer barrier below): with an FP8 cache
  // as e4m3 lines, a bf16 q as high and low parts with a power-of-two factor per row.
  float* row_factors = reinterpret_cast<float*>(shared + Layout::kRowFactors);
  if (group == 0) {
    if constexpr (kFp8Cache) {
      load_e4m3_query_rows<kRows, kNarrowGroupThreads, !kFp8Q>(args, batch_index, 0, rows_here, query, row_factors, 1);
    } else {
      load_query_tile<kRows, kNarrowGroupThreads>(args, batch_index, 0, rows_here, query, 1);
    }
  }
  consumers.sync();

  // Accumulator element i of this thread: key (M) 16 warp + lane / 4 + 8 ((i / 2) % 2), query
  // row (N) 8 (i / 4) + 2 (lane % 4) + i % 2. A thread holds kSlots rows ("slots"
  // 2 (i / 4) + i % 2) x 2 keys of S^T, and the same rows of O^T.
  auto slot_of = [](int i) { return 2 * (i / 4) + i % 2; };
  auto row_of_slot = [lane](int slot) { return 8 * (slot / 2) + 2 * (lane % 4) + slot % 2; };
  // Each row's visible end once per lane (row = lane: kRows <= 32), then shuffled to the slots:
  // per slot, its division by the head count was cold code that every CTA runs once.
  const int lane_row_visible = row_visible_end(args, range, 0, lane, rows_here);
  int visible[kSlots];
  float logit_scale[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    visible[slot] = __shfl_sync(0xffffffffu, lane_row_visible, row_of_slot(slot));
    logit_scale[slot] = args.logit_scale_log2 * (kFp8Cache && !kFp8Q ? row_factors[row_of_slot(slot)] : 1.0f);
  }

  float output[kLatentDim / 64][kRows / 2];  // O^T: 8 M tiles of 64 dims x kRows
#pragma unroll
  for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) output[block][i] = 0.0f;
  }
  float running_max[kSlots], running_sum[kSlots];  // the sums over this thread's keys only
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    running_max[slot] = -INFINITY;
    running_sum[slot] = 0.0f;
  }

  const uint64_t query_descriptor = kFp8Cache ? make_descriptor_64b(query, 512) : make_descriptor(query, 16, 1024);
  const uint64_t probability_descriptor = make_descriptor(probabilities, 16, 1024);
  const ValueFragmentReader value_reader(warp, lane);  // FP8 cache only

  for (int tile = group; tile < range.tiles; tile += Layout::kGroups) {
    const int stage = tile % Layout::kStages;
    const int first_key = range.begin + tile * kTileKeys;
    const int valid = range.length - first_key;
    const int full_parity = full_phase<Layout::kStages, Layout::kGroups>(tile);
    auto wait_for_part = [&](int part) {
      mbarrier_wait(&full[(stage * Layout::kGroups + group) * Layout::kParts + part], full_parity);
    };
    wait_for_part(0);
    uint8_t* keys = stages + stage * Layout::kStageBytes;
    if (valid < kTileKeys) {
#pragma unroll
      for (int part = 1; part < Layout::kParts; ++part) wait_for_part(part);  // zeroing writes every block
      if constexpr (kFp8Cache) {
        zero_key_lines<kDimBlocks, 64>(keys, valid, threadIdx.x % kNarrowGroupThreads, kNarrowGroupThreads);
      } else {
        zero_key_lines<kDimBlocks, 128>(keys, valid, threadIdx.x % kNarrowGroupThreads, kNarrowGroupThreads);
      }
      fence_shared_for_async_proxy();
      sync_narrow_group(group);
    }

    float scores[kRows / 2];
    if constexpr (kFp8Cache) {
      // S^T = K Q^T on e4m3 wgmma, 18 k steps of 32 dims, straight from the raw tile as the TMA
      // landed it; a bf16 q's high and low parts are separate query lines, summed here. In
      // kFp8Segments segments of steps, each accumulated afresh and added to the scores in fp32:
      // e4m3 wgmma adds each step to its accumulator at reduced precision (truncated to ~13
      // bits), and one chain of 18 steps moved LSEs by up to 8e-4 (1 + |LSE|). (Independent
      // accumulators instead of segments made ptxas spill in the 32-row kernel.)
      constexpr int kSegmentSteps = kHeadDim / 32 / kFp8Segments;
      static_assert(kSegmentSteps * kFp8Segments * 32 == kHeadDim, "whole segments");
      // (An array per segment: with one array reused, ptxas took the first segment's values for
      // the later segments' sums.)
      float terms[kFp8Segments][kQueryLines / 2];
      const uint64_t key_descriptor = make_descriptor_64b(keys, 512);
#pragma unroll
      for (int segment = 0; segment < kFp8Segments; ++segment) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kSegmentSteps; ++k) {
          const int step = segment * kSegmentSteps + k, offset = (step % 2) * 32;
          wgmma_lines_fp8<kQueryLines>(terms[segment],
                                       advance_descriptor(key_descriptor, (step / 2) * kRawBlockBytes + offset),
                                       advance_descriptor(query_descriptor, (step / 2) * (kQueryLines * 64) + offset),
                                       k > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(terms[segment]);
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) {
          const float sum = kFp8Q ? terms[segment][i] : terms[segment][i] + terms[segment][i + kRows / 2];
          scores[i] = segment == 0 ? sum : scores[i] + sum;
        }
      }
    } else {
      // S^T = K Q^T, its 36 k steps spread over independent accumulators (summed below): one
      // chain of dependent wgmma is latency-bound at these small N.
      constexpr int kChains = 4;
      constexpr int kStepsPerPart = kHeadDim / 16 / Layout::kParts;
      float chains[kChains][kRows / 2];
      const uint64_t key_descriptor = make_descriptor(keys, 16, 1024);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kHeadDim / 16; ++step) {
        if (step > 0 && step % kStepsPerPart == 0) {  // (the fence after the wait keeps ptxas
          wait_for_part(step / kStepsPerPart);       // from serialising every wgmma: C7518)
          wgmma_fence();
        }
        wgmma_rows<kHalf, kRows>(chains[step % kChains],
                              advance_descriptor(key_descriptor, (step / 4) * kSwizzleBlockBytes + (step % 4) * 32),
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

    // Online softmax over keys, base 2.
    float tile_max[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) tile_max[slot] = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const int key = first_key + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      scores[i] = key < visible[slot_of(i)] ? scores[i] * logit_scale[slot_of(i)] : -INFINITY;
      tile_max[slot_of(i)] = fmaxf(tile_max[slot_of(i)], scores[i]);
    }
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll
      for (int mask = 4; mask < 32; mask *= 2) {
        tile_max[slot] = fmaxf(tile_max[slot], __shfl_xor_sync(0xffffffffu, tile_max[slot], mask));
      }
      if (lane < 4) exchange[warp * kRows + row_of_slot(slot)] = tile_max[slot];
    }
    sync_narrow_group(group);  // all warps' maxima in; also every warp finished the last O^T update
    float rescale[kSlots], reference[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int row = row_of_slot(slot);
      const float new_max =
          fmaxf(fmaxf(running_max[slot], fmaxf(exchange[row], exchange[kRows + row])),
                fmaxf(exchange[2 * kRows + row], exchange[3 * kRows + row]));
      reference[slot] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[slot] = fast_exp2(running_max[slot] - reference[slot]);
      running_max[slot] = new_max;
      running_sum[slot] *= rescale[slot];
    }
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const float probability = fast_exp2(scores[i] - reference[slot_of(i)]);
      running_sum[slot_of(i)] += probability;
      const int key = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      const int column = kFp8Cache ? value_column_of_key(key) : key;
      *reinterpret_cast<uint16_t*>(probabilities + swizzled_offset(row_of_slot(slot_of(i)), column)) =
          uint16_t(pack_two<kHalf>(probability, 0.0f) & 0xffffu);
    }
    bool rescaled = false;
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) rescaled |= rescale[slot] != 1.0f;
    if (rescaled) {
#pragma unroll
      for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) output[block][i] *= rescale[slot_of(i)];
      }
    }
    fence_shared_for_async_proxy();
    sync_narrow_group(group);  // P^T complete; the exchange reads are done

    // O^T += V^T P^T.
    if constexpr (kFp8Cache) {
      // A batch = one k step (16 keys) of four M tiles (256 dims): two load batches of 4 keys x
      // 4 dims per thread; buffers as above. k steps outermost, so consecutive batches
      // chain no accumulator.
      constexpr int kPairs = kLatentDim / 128, kSteps = kTileKeys / 16, kBatches = kSteps * kPairs / 2;
      uint32_t fragments[kFragmentBuffers][4][4];
      auto load_batch = [&](int batch, uint32_t(&into)[4][4]) {
        const int k = batch / (kPairs / 2), first_pair = 2 * (batch % (kPairs / 2));
        value_reader.load(keys, first_pair, k, into[0], into[1]);
        value_reader.load(keys, first_pair + 1, k, into[2], into[3]);
      };
      load_batch(0, fragments[0]);
#pragma unroll
      for (int batch = 0; batch < kBatches; ++batch) {
        const int k = batch / (kPairs / 2), first_tile = 4 * (batch % (kPairs / 2));
        const uint64_t probability_step = advance_descriptor(probability_descriptor, 32 * k);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wgmma_rows_a_registers<kHalf, kRows>(output[first_tile + j], fragments[batch % kFragmentBuffers][j],
                                               probability_step, true);
        }
        wgmma_commit();
        if (batch + 1 < kBatches) {
          wgmma_wait<kFragmentBuffers - 1>();
          load_batch(batch + 1, fragments[(batch + 1) % kFragmentBuffers]);
        }
      }
      mbarrier_arrive(&empty[stage]);  // every byte of the raw tile this thread reads is in registers
    } else {
      // V^T block b (64 dims) is the K tile's block b read M-major; a k step of 16 keys is 16
      // lines (2048 bytes).
      const uint64_t value_descriptor = make_descriptor(keys, kSwizzleBlockBytes, 1024);
      wgmma_fence();
#pragma unroll
      for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
        for (int k = 0; k < kTileKeys / 16; ++k) {
          wgmma_rows_a_m_major<kHalf, kRows>(output[block],
                                          advance_descriptor(value_descriptor, block * kSwizzleBlockBytes + k * 2048),
                                          advance_descriptor(probability_descriptor, 32 * k), true);
        }
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int block = 0; block < kLatentDim / 64; ++block) fence_accumulators(output[block]);
    if constexpr (!kFp8Cache) mbarrier_arrive(&empty[stage]);
  }

  // Row sums: this thread's keys, then the 8 lanes of the row, then the 4 warps.
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll
    for (int mask = 4; mask < 32; mask *= 2) running_sum[slot] += __shfl_xor_sync(0xffffffffu, running_sum[slot], mask);
  }
  sync_narrow_group(group);  // the last tile's reads of the exchange are done
  if (lane < 4) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) exchange[warp * kRows + row_of_slot(slot)] = running_sum[slot];
  }
  sync_narrow_group(group);
  // Each group's (max, sum) per row, then the merged row: max M = max over groups of m_g, sum
  // L = sum of l_g 2^(m_g - M); this group's O^T is scaled by 2^(m_g - M) / L.
  if (warp == 0 && lane < 4) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int row = row_of_slot(slot);
      merge[(2 * group) * kRows + row] = running_max[slot];
      merge[(2 * group + 1) * kRows + row] = exchange[row] + exchange[kRows + row] +
                                                   exchange[2 * kRows + row] + exchange[3 * kRows + row];
    }
  }
  consumers.sync();
  // The merged rows, one thread per row (warp 0): the LSE, each group's factor into shared
  // memory (the exchange words are free: their last reads were before the barrier above), and
  // the row's destination offset. Written per accumulator slot instead, unrolled for every
  // slot and group, this was ~600 instructions of code that each CTA runs once, cold: 3000
  // (bf16, 16 rows) to 5500 cycles (32 rows, or 16 rows of the FP8 cache's three groups) between
  // the merge and the staging, more than a D4 CTA's whole tile; now 800-1000 cycles with the
  // MUFU forms below (H100, clock64; perf log, session 16).
  const OutputDestination destination = output_destination(args, split);
  float* row_factors_of_groups = reinterpret_cast<float*>(shared + Layout::kExchange);  // [group][row]
  float* staged = reinterpret_cast<float*>(shared + Layout::kKeys);
  int64_t* row_offsets = reinterpret_cast<int64_t*>(shared + Layout::kKeys + Layout::kStagedRowOffsets);
  if (threadIdx.x < kRows) {
    const int row = threadIdx.x;
    float row_max = -INFINITY;
#pragma unroll
    for (int g = 0; g < Layout::kGroups; ++g) row_max = fmaxf(row_max, merge[(2 * g) * kRows + row]);
    const float reference = row_max == -INFINITY ? 0.0f : row_max;
    float sum = 0.0f, group_weights[Layout::kGroups];
#pragma unroll
    for (int g = 0; g < Layout::kGroups; ++g) {
      group_weights[g] = fast_exp2(merge[(2 * g) * kRows + row] - reference);
      sum += merge[(2 * g + 1) * kRows + row] * group_weights[g];
    }
    const float scale = sum == 0.0f ? 0.0f : args.value_scale * fast_reciprocal(sum);
#pragma unroll
    for (int g = 0; g < Layout::kGroups; ++g) row_factors_of_groups[g * kRows + row] = scale * group_weights[g];
    if (row < rows_here) {
      store_row_lse(args, destination, batch_index, row, sum == 0.0f ? -INFINITY : reference + fast_log2(sum));
      row_offsets[row] = destination_row_offset(args, destination, batch_index, row);
    }
  }
  consumers.sync();
  float normalizer[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) normalizer[slot] = row_factors_of_groups[group * kRows + row_of_slot(slot)];
  // Each group's normalised O^T -> shared [row][dim] floats, all groups at once into rows of
  // their own (the key stages are free: every tile landed and was consumed), so that rows are
  // stored contiguously and the groups' parts are summed as they are stored (staged into one
  // set of rows group after group, a barrier each, FP8 D4 B1 took 1.3 us longer: perf log,
  // session 16); and each row's destination, once per row (the stores below then run as
  // independent shared loads and global stores: computed per stored quad, its division by the
  // head count and 64-bit index chain serialised every quad; 0.5-1% of D2 on an H100, perf log
  // session 15).
  float* group_rows = staged + group * Layout::kStagedGroupFloats;
  if constexpr (kFp8Cache) {
    // O^T's dims in the fragments' order (value_dim_of_row): accumulator rows r and r + 8 of
    // M tiles 2p and 2p + 1 are 4 consecutive dims of one query row, stored as one float4 (as
    // scalars, the lanes' dims 4 apart put 4 lanes on each bank: 3000 cycles for 16 rows).
#pragma unroll
    for (int pair = 0; pair < kLatentDim / 128; ++pair) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        if ((i / 2) % 2 != 0) continue;  // accumulator row r + 8: element i + 2
        const int dim = value_dim_of_row(2 * pair, accumulator_row(warp, lane, i));
        const float factor = normalizer[slot_of(i)];
        *reinterpret_cast<float4*>(&group_rows[row_of_slot(slot_of(i)) * Layout::kStagedRowFloats + dim]) =
            make_float4(output[2 * pair][i] * factor, output[2 * pair][i + 2] * factor,
                        output[2 * pair + 1][i] * factor, output[2 * pair + 1][i + 2] * factor);
      }
    }
  } else {
#pragma unroll
    for (int block = 0; block < kLatentDim / 64; ++block) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        const int row = accumulator_row(warp, lane, i);  // of O^T: a dim
        group_rows[row_of_slot(slot_of(i)) * Layout::kStagedRowFloats + 64 * block + row] =
            output[block][i] * normalizer[slot_of(i)];
      }
    }
  }
  consumers.sync();
  // (A row without keys stores zeros; with several splits its LSE is -inf, so the combine
  // step never reads them.)
  store_staged_rows<Layout::kGroups, Layout::kStagedRowFloats, Layout::kStagedGroupFloats>(
      args, destination, staged, row_offsets, rows_here, threadIdx.x, Layout::kConsumers);
}

}  // namespace openmla::kernels::sm90
