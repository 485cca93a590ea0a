// Dense MLA decode: the key tiles the attention kernels (alternating_kernel.cuh,
// narrow_kernel.cuh) stream, and the small pieces of tensor-core plumbing they share.
//
// A key tile is 64 tokens x 576 dims. 16-bit tiles live in shared memory as 9 blocks of 64
// dims, each [64 lines][128 bytes] with the 128-byte swizzle (wgmma.cuh): K-major for S (line =
// key) and, read N/M-major, V for the output. The producer (one thread) walks the block table
// and issues one TMA box per 64 dims x min(page, 64) tokens; FP8 caches land as 9 blocks of
// [64 lines][64 bytes], 64-byte swizzled, read raw by e4m3 wgmma and by the V loads of both
// kernels (fp8_tiles.cuh, fp8_fragments.cuh). Slots past the sequence end are zeroed in shared
// memory before use, or (e4m3 products) their P and V are zero (unused cache slots may hold
// NaN, pages past the end are never read), so masked keys multiply finite zeros.
#pragma once

#include <cfloat>
#include <numeric>

#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace openmla::kernels::sm90 {

constexpr int kDimBlocks = kHeadDim / 64;                         // 9 swizzled blocks per tile
constexpr int kTileBlockBytes = kDimBlocks * kSwizzleBlockBytes;  // 72 KB: 64 lines x 576
constexpr int kRawFp8StageBytes = kTileKeys * kHeadDim;           // 36 KB

// Byte offset of 16-bit element (line, dim) of a tile of kLines lines stored as 9 swizzled
// blocks of 64 dims (key tiles and the alternating kernel's Q: 64 lines; the narrow kernel's Q: 16 or 32).
template <int kLines = kTileKeys>
__device__ __forceinline__ int tile_offset(int line, int dim) {
  return (dim / 64) * (kLines * 128) + swizzled_offset(line, dim % 64);
}

// Key lines [first_invalid, 64) of a 16-bit tile set to zero, by `threads` threads.
__device__ __forceinline__ void zero_key_lines(uint8_t* tile, int first_invalid, int thread, int threads) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per line
  for (int unit = thread; unit < (kTileKeys - first_invalid) * kChunks; unit += threads) {
    const int line = first_invalid + unit / kChunks;
    *reinterpret_cast<uint4*>(tile + tile_offset(line, (unit % kChunks) * 8)) = make_uint4(0, 0, 0, 0);
  }
}

// The alternating kernel's producer warpgroup: it issues the loads and, with an FP8 cache,
// transposes V (fp8_tiles.cuh).
constexpr int kAlternatingProducerThreads = 128;

// A 16-bit q's rows of the tile (bf16 with a bf16 cache, fp16 with fp16) into the swizzled
// layout (kLines lines), by `kThreads` threads that then meet at named barrier `barrier` (rows
// past rows_here are zeros). All of a thread's copies are in flight at once (cp.async): Q is
// every CTA's fixed cost. (With an FP8 cache q becomes e4m3 lines: fp8_tiles.cuh
// load_e4m3_query_rows.)
template <int kLines, int kThreads>
__device__ __forceinline__ void load_query_tile(const SplitArgs& args, int batch_index, int first_row, int rows_here,
                                                uint8_t* query, int barrier) {
  constexpr int kUnitsPerLine = kHeadDim / 8;
  constexpr int kUnitsPerThread = kLines * kUnitsPerLine / kThreads;
  static_assert(kUnitsPerThread * kThreads == kLines * kUnitsPerLine, "whole units per thread");
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j) {
    const int unit = threadIdx.x + j * kThreads;
    const int row = unit / kUnitsPerLine, dim = (unit % kUnitsPerLine) * 8;
    uint8_t* destination = query + tile_offset<kLines>(row, dim);
    if (row < rows_here) {
      copy_async_16(destination, args.q + 2 * (query_row_offset(args, batch_index, first_row + row) + dim));
    } else {
      *reinterpret_cast<uint4*>(destination) = make_uint4(0, 0, 0, 0);
    }
  }
  commit_async_copies();
  wait_async_copies<0>();
  fence_shared_for_async_proxy();
  sync_named(barrier, kThreads);
}

// Every split kernel's first step: the loads that need nothing but the kernel arguments start
// at once (the TMA descriptor; the tile's query rows into L2, one 128-byte line per thread),
// so that their memory latency overlaps the chain seq_lens -> block table -> first key tile
// instead of following it. (On D4 / D5, one H100, L2 cold, clock64: Q still reaches shared
// memory 3-6 us after entry, queued behind the first key tiles, which land then too.)
template <int kQueryElementBytes>
__device__ __forceinline__ void start_early_loads(const CUtensorMap* cache_map, const SplitArgs& args,
                                                  int batch_index, int first_row, int rows_here) {
  constexpr int kRowBytes = kHeadDim * kQueryElementBytes, kLinesPerRow = (kRowBytes + 127) / 128;
  if (threadIdx.x == 0) prefetch_tensor_map(cache_map);
  for (int unit = threadIdx.x; unit < rows_here * kLinesPerRow; unit += blockDim.x) {
    const int m = first_row + unit / kLinesPerRow;
    const int64_t offset = query_row_offset(args, batch_index, m);
    const uint8_t* line = args.q + offset * kQueryElementBytes + min((unit % kLinesPerRow) * 128, kRowBytes - 1);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
  }
}

// Issues a split's key tiles by TMA (one thread): reads the block-table entries of a tile's
// pages (only pages that hold keys of the sequence: entries past its end may be garbage) and
// issues one box per 64 dims per page, counted on the barrier `issue` is given. Block b of stage s lands at
// stages + s * kStageStride + b * kBlockStride (packed).
template <bool kFp8Cache>
struct KeyTileLoader {
  static constexpr int kLineBytes = kFp8Cache ? 64 : 128;  // one box line: 64 dims
  static constexpr int kBlockStride = kTileKeys * kLineBytes, kStageStride = kDimBlocks * kBlockStride;
  static constexpr int kMaxBoxes = kTileKeys / 16;         // pages per tile at the smallest page size
  const CUtensorMap* cache_map;
  const SplitArgs& args;
  const int32_t* table_row;
  const KeyRange& range;
  uint8_t* stages;
  int box_tokens;
  int pages[kMaxBoxes];

  __device__ __forceinline__ KeyTileLoader(const CUtensorMap* cache_map, const SplitArgs& args,
                                           const int32_t* table_row, const KeyRange& range, uint8_t* stages)
      : cache_map(cache_map), args(args), table_row(table_row), range(range), stages(stages),
        box_tokens(min(1 << args.page_shift, kTileKeys)) {}

  __device__ __forceinline__ int boxes_of(int tile) const {
    return (min(kTileKeys, range.length - (range.begin + tile * kTileKeys)) + box_tokens - 1) / box_tokens;
  }
  // Read before waiting for the tile's stage, so that the table's latency is not added to the refill.
  __device__ __forceinline__ void read_pages(int tile) {
    const int first_key = range.begin + tile * kTileKeys, boxes = boxes_of(tile);
#pragma unroll
    for (int box = 0; box < kMaxBoxes; ++box) {
      pages[box] = box < boxes ? table_row[(first_key + box * box_tokens) >> args.page_shift] : 0;
    }
  }
  // Tile `tile` (its pages read last) into stage `stage`; `landed` counts its bytes.
  __device__ __forceinline__ void issue(int tile, int stage, uint64_t* landed) const {
    const int first_key = range.begin + tile * kTileKeys;
    const int boxes = boxes_of(tile);
    mbarrier_arrive_expect_bytes(landed, uint32_t(boxes * kDimBlocks * box_tokens * kLineBytes));
    uint8_t* destination = stages + stage * kStageStride;
#pragma unroll
    for (int box = 0; box < kMaxBoxes; ++box) {
      if (box >= boxes) break;
      const int token = (first_key + box * box_tokens) & ((1 << args.page_shift) - 1);
#pragma unroll
      for (int block = 0; block < kDimBlocks; ++block) {
        tma_load_box(destination + block * kBlockStride + box * box_tokens * kLineBytes, cache_map, block * 64,
                     token, pages[box], landed);
      }
    }
  }
};

// The producer: one thread walks the split's tiles, waits until the consumers have released
// the stage (kStages stages, used in turn) and issues the tile (KeyTileLoader);
// full[stage * kGroups + tile % kGroups] counts the bytes in.
// With kGroups consumer groups taking the tiles in turn (tile t: group t % kGroups), each
// (stage, group) pair has its own full barrier, so that every barrier is waited on by one
// group only (and the producer itself, for tile 0's phase), which has seen all its earlier
// phases: with one barrier per stage and kStages % kGroups != 0, a group could take the
// parity of a phase another group's tile has not completed yet for its own (try_wait.parity
// tells only the two latest phases apart).
// The consumer of tile t waits for phase t / lcm(kStages, kGroups) (full_phase below).
template <bool kFp8Cache, int kStages = 2, int kGroups = 1>
__device__ __forceinline__ void produce_key_tiles(const CUtensorMap* cache_map, const SplitArgs& args,
                                                  const int32_t* table_row, const KeyRange& range,
                                                  uint8_t* stages, uint64_t* full, uint64_t* empty) {
  KeyTileLoader<kFp8Cache> loader(cache_map, args, table_row, range, stages);
  loader.read_pages(0);
  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile >= kStages) mbarrier_wait(&empty[stage], (tile / kStages - 1) % 2);
    loader.issue(tile, stage, &full[stage * kGroups + tile % kGroups]);
    if (tile + 1 < range.tiles) loader.read_pages(tile + 1);
    // Tile 1 waits until tile 0 has landed: issued together, every CTA's first two tiles
    // share the memory system's queues, so tile 0 lands only at the end of the whole GPU's
    // first burst and the math starts late (D5: the stages then stand full while the next
    // tiles cannot be requested). Later tiles are paced by the empty barriers.
    if (tile == 0 && range.tiles > 1) mbarrier_wait(&full[0], 0);
  }
}

// Keeps the compiler from moving reads of wgmma accumulators above the wait that makes them
// valid (the wait names no registers).
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(values[i])::"memory");
}

__device__ __forceinline__ uint64_t advance_descriptor(uint64_t descriptor, int bytes) {
  return descriptor + uint64_t(bytes >> 4);  // the start address field, in 16-byte units
}

// Resizes this warpgroup's register allocation (all its threads call it together).
template <int kCount, bool kIncrease>
__device__ __forceinline__ void set_register_count() {
  if constexpr (kIncrease) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCount));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCount));
  }
}

// The parity of the phase of tile `tile`'s full barrier (see produce_key_tiles).
template <int kStages, int kGroups = 1>
__host__ __device__ constexpr int full_phase(int tile) {
  constexpr int kCycle = kStages / std::gcd(kStages, kGroups) * kGroups;  // tiles per (stage, group) reuse
  return (tile / kCycle) % 2;
}

// Initialises the stages' barriers (full[stages x groups]: one producer arrival + bytes;
// empty[stages]: every thread of the consuming group), by thread 0; the caller synchronises
// the CTA afterwards.
__device__ __forceinline__ void init_stage_barriers(uint64_t* full, uint64_t* empty, int consumer_threads,
                                                    int stages = 2, int groups = 1) {
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int group = 0; group < groups; ++group) mbarrier_init(&full[stage * groups + group], 1);
      mbarrier_init(&empty[stage], consumer_threads);
    }
    fence_barrier_init();
  }
}

// Shared memory a CTA may use on sm_90 (227 KB).
constexpr int kMaxSharedBytes = 232448;

// setmaxnreg.inc waits until the registers are free: what the producer threads give back from
// the launch allocation (65536 / threads, in steps of 8, the count the compiler uses under
// __launch_bounds__(threads, 1)) must cover what the consumer threads take, or the kernel hangs.
constexpr bool register_split_fits(int threads, int consumers, int consumer_registers, int producers,
                                   int producer_registers) {
  const int launch = (65536 / threads) / 8 * 8;
  return (consumer_registers - launch) * consumers <= (launch - producer_registers) * producers;
}

// The 64-row kernel (alternating_kernel.cuh): two consumer warpgroups and a
// producer warpgroup.
constexpr int kConsumerThreads = 256;                        // two warpgroups
constexpr int kAlternatingThreads = kConsumerThreads + kAlternatingProducerThreads;
// Registers per thread after the role split (setmaxnreg): 2 x 128 x 240 + 128 x 24 = 63 K.
// The consumers hold 128 fp32 output accumulators each; the producer needs a handful.
constexpr int kConsumerRegisters = 240, kProducerRegisters = 24;
// With an FP8 cache (e4m3 math) the consumers hold no Q fragments and P in e4m3, and the
// producer's transposition keeps 8 steps of ldmatrix results in flight (fp8_tiles.cuh; with 40
// or 56 registers it spilled).
constexpr int kFp8MathConsumerRegisters = 216, kFp8MathProducerRegisters = 72;
static_assert(register_split_fits(kAlternatingThreads, kConsumerThreads, kConsumerRegisters, 128,
                                  kProducerRegisters) &&
                  register_split_fits(kAlternatingThreads, kConsumerThreads, kFp8MathConsumerRegisters, 128,
                                      kFp8MathProducerRegisters),
              "the consumers' setmaxnreg.inc must be satisfiable");

// The m64k16 A fragment of Q for k step `step` (dims 16 step ..), as wgmma takes A from
// registers: warp w of the warpgroup holds rows 16 w + lane / 4 (+ 8), dims 2 (lane % 4) (+ 8).
__device__ __forceinline__ void query_fragment(const uint8_t* query, int step, int warp, int lane,
                                               uint32_t (&fragment)[4]) {
  const int row = 16 * warp + lane / 4, dim = 16 * step + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    fragment[i] = *reinterpret_cast<const uint32_t*>(query + tile_offset(row + 8 * (i % 2), dim + 8 * (i / 2)));
  }
}

// The 256 consumer threads only (the producer warpgroup is not part of it).
__device__ __forceinline__ void sync_consumers() { sync_named(1, kConsumerThreads); }

// The alternating kernel's epilogue for one consumer warpgroup: it holds O for its 256 value
// columns (m64n256 accumulators) and, for rows row0 and row0 + 8 of its warp, the running
// maximum and the row sums over its own keys, which `other_sums` ([row] of the other
// warpgroup's sums) completes. Writes the normalised output (or the split's partial) and the LSE.
// The sums and O may both carry a factor 2^probability_log2_scale (the FP8 path's P scale).
__device__ __forceinline__ void store_alternating_output(const SplitArgs& args, int split, int batch_index,
                                                         int first_row, int rows_here, int warpgroup, int lane,
                                                         int row0, const float (&running_max)[2],
                                                         const float (&running_sum)[2], const float* other_sums,
                                                         const float (&output)[128], float probability_log2_scale) {
  const OutputDestination destination = output_destination(args, split);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    const float sum = running_sum[half] + other_sums[row];
    if (row >= rows_here) continue;
    const int m = first_row + row;
    const bool empty_row = sum == 0.0f;
    const float normalizer = empty_row ? 0.0f : args.value_scale / sum;
    const float lse2 = empty_row ? -INFINITY : running_max[half] + (log2f(sum) - probability_log2_scale);
#pragma unroll
    for (int i = 2 * half; i < 128; i += 4) {
      store_value_pair(args, destination, batch_index, m, warpgroup * 256 + 8 * (i / 4) + 2 * (lane % 4),
                       output[i] * normalizer, output[i + 1] * normalizer, empty_row);
    }
    if (warpgroup == 0 && lane % 4 == 0) store_row_lse(args, destination, batch_index, m, lse2);
  }
}

// O += P V on e4m3 tensor cores (the 64-row kernel with an FP8 cache and a 16-bit q, whose P
// is two e4m3 parts) adds each wgmma step to its fp32 accumulators at ~13 bits of the running
// sum, an error that grows as the square root of the steps (~4e-3 relative on the output after
// 256 tiles, 1024 steps). So a CTA with more than kFp8PromotionTiles tiles moves O out of the
// accumulators into fp32 rows of the workspace (its own partial rows, which the workspace holds
// even for one split) every kFp8PromotionTiles tiles or fewer and starts them afresh; before
// the epilogue the rows come back into O. (With fp8 q, P's rounding to one e4m3 part dominates
// the error: no promotion.)
constexpr int kFp8PromotionTiles = 128;

// Accumulator i of a consumer thread: row row0 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane %
// 4) + i % 2 of the warpgroup's 256. `rows[half]`: the thread's first column in the workspace
// row of row0 + 8 half, null past rows_here (neither read nor written: no keys, O is 0).
struct PromotedRows {
  float* rows[2];
  __device__ __forceinline__ PromotedRows(const SplitArgs& args, int split, int batch_index, int first_row,
                                          int rows_here, int warpgroup, int lane, int row0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 8 * half;
      rows[half] = row < rows_here
                       ? partial_output_row(args, split, batch_index, first_row + row) + warpgroup * 256 + 2 * (lane % 4)
                       : nullptr;
    }
  }
  __device__ __forceinline__ float* pair_of(int i) const { return rows[(i / 2) % 2] + 8 * (i / 4); }
};

// O into the rows and O = 0: a row whose `overwrite[half]` is set takes O as it is (the first
// promotion, or O's scale has outgrown the row's: below), any other adds O * factor[half] (>= 1,
// from O's scale up to the row's) with fire-and-forget reductions in L2, so that no promotion
// waits for a load.
__device__ __forceinline__ void promote_output(const PromotedRows& promoted, const bool (&overwrite)[2],
                                               const float (&factor)[2], float (&output)[128]) {
#pragma unroll
  for (int i = 0; i < 128; i += 2) {
    const int half = (i / 2) % 2;
    if (promoted.rows[half] != nullptr) {
      float* pair = promoted.pair_of(i);
      if (overwrite[half]) {
        *reinterpret_cast<float2*>(pair) = make_float2(output[i], output[i + 1]);
      } else {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(pair), "f"(output[i] * factor[half]),
                     "f"(output[i + 1] * factor[half])
                     : "memory");
      }
    }
    output[i] = output[i + 1] = 0.0f;
  }
}

// O += the rows * factor[half] (<= 1, from the rows' scale down to O's), before the epilogue.
// Loads go in batches of 16 pairs, each batch in flight together.
__device__ __forceinline__ void take_back_promoted_output(const PromotedRows& promoted, const float (&factor)[2],
                                                          float (&output)[128]) {
  constexpr int kPairsPerBatch = 16;
#pragma unroll
  for (int batch = 0; batch < 64 / kPairsPerBatch; ++batch) {
    float2 stored[kPairsPerBatch];
#pragma unroll
    for (int j = 0; j < kPairsPerBatch; ++j) {
      const int i = 2 * (kPairsPerBatch * batch + j), half = (i / 2) % 2;
      stored[j] = promoted.rows[half] != nullptr ? *reinterpret_cast<const float2*>(promoted.pair_of(i))
                                                 : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kPairsPerBatch; ++j) {
      const int i = 2 * (kPairsPerBatch * batch + j), half = (i / 2) % 2;
      output[i] = fmaf(stored[j].x, factor[half], output[i]);
      output[i + 1] = fmaf(stored[j].y, factor[half], output[i + 1]);
    }
  }
}

// The rows take_back_promoted_output will read, brought into L2 a little ahead of it (their
// last write, a promotion up to 128 tiles earlier, may be evicted by the cache stream): each
// lane of a quad takes 2 of the 8 128-byte lines of the warpgroup's columns of its two rows.
__device__ __forceinline__ void prefetch_promoted_output(const PromotedRows& promoted, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (promoted.rows[half] == nullptr) continue;
    const float* columns = promoted.rows[half] - 2 * (lane % 4);
#pragma unroll
    for (int line = 2 * (lane % 4); line < 2 * (lane % 4) + 2; ++line) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(columns + 32 * line));
    }
  }
}

// Row sums of the m64 accumulator rows: each of the 4 lanes of a quad holds its own columns'.
__device__ __forceinline__ void sum_over_quad(float (&sums)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    sums[half] += __shfl_xor_sync(0xffffffffu, sums[half], 1);
    sums[half] += __shfl_xor_sync(0xffffffffu, sums[half], 2);
  }
}


}  // namespace openmla::kernels::sm90
