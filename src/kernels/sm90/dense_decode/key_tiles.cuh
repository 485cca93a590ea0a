// Dense MLA decode: the key tiles the attention kernels (alternating_kernel.cuh,
// narrow_kernel.cuh) stream, and the small pieces of tensor-core plumbing they share.
//
// A key tile is 64 tokens x 576 dims, in shared memory in parts of whole 8-key groups
// (GroupedTile: inside a part [8-key group][its blocks][8 lines][128 bytes], the 128-byte swizzle),
// so that one TMA box per part and page lands a part (KeyTileLoader). 16-bit tiles
// (KeyTileParts): blocks of 64 dims in parts {0..3}, {4..7} (the latent halves) and {8} (the
// rope), K-major for S (line = key) and, read N/M-major, V for the output; the 64-row kernel at
// pages of 16 tokens: {0..7} and {8} (SmallPageKeyTileParts, fewer boxes). FP8 tiles
// (RawTileParts): blocks of 128 dims in parts {0..3} and {4} (the rope's), S on e4m3
// wgmma and V^T fragments widened in registers (fp8_fragments.cuh WideValueFragments). The
// producer (one thread) walks the block table and issues the boxes (with PDL, a split's first
// key tiles are also prefetched into L2 before the PDL wait: start_split_cta). Slots past the
// sequence end are zeroed in shared memory before use (unused cache slots may hold NaN, pages
// past the end are never read), so masked keys multiply finite zeros.
#pragma once

#include <cfloat>
#include <numeric>
#include <type_traits>

#include "kernels/sm90/dense_decode/split_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace openmla::kernels::sm90 {

constexpr int kDimBlocks = kHeadDim / 64;                         // 9 swizzled blocks per tile
constexpr int kTileBlockBytes = kDimBlocks * kSwizzleBlockBytes;  // 72 KB: 64 lines x 576

// Byte offset of 16-bit element (line, dim) of a tile of kLines lines stored as 9 swizzled
// blocks of 64 dims: Q (the alternating kernel's: 64 lines; the narrow kernel's: 16 or 32). Key
// tiles are laid out in parts of 8-key groups instead (GroupedTile).
template <int kLines = kTileKeys>
__device__ __forceinline__ int tile_offset(int line, int dim) {
  return (dim / 64) * (kLines * 128) + swizzled_offset(line, dim % 64);
}

// A key tile in shared memory as parts of whole 8-key groups. The tile's blocks (each 64 lines
// of 128 bytes: 64 dims of a 16-bit cache, 128 of an FP8 one) are grouped into kLatentParts
// parts of kPartBlocks blocks (the latent dims) and a last part of one block (the rope dims);
// part p starts at part_start(p), and inside it 8-key group g lies at g * blocks_in(p) KB, its
// block i at i KB, each block's 8 lines with the 128-byte swizzle on its 1 KB (the wgmma layout:
// a block's 8-key groups are group_stride apart, wgmma's SBO).
// Why whole key groups rather than [block][64 lines]: a TMA box is written densely in the order
// of its dimensions, so [group][block][line] is the only order in which one box covers several
// blocks of a page; the TMA takes a box at a fixed cost of ~40 cycles besides its lines, and with
// pages of 16 tokens a [block][line] 16-bit tile took 36 boxes (3 now), which cost the
// compute-bound 64-row kernel 30% (perf log, session 37).
template <int kPartBlocks, int kLatentParts>
struct GroupedTile {
  static constexpr int kParts = kLatentParts + 1;
  __host__ __device__ static constexpr int blocks_in(int part) { return part < kLatentParts ? kPartBlocks : 1; }
  __host__ __device__ static constexpr int first_block(int part) { return part * kPartBlocks; }
  __host__ __device__ static constexpr int part_of(int block) {
    return block / kPartBlocks < kLatentParts ? block / kPartBlocks : kLatentParts;
  }
  __host__ __device__ static constexpr int part_start(int part) { return first_block(part) * kTileKeys * 128; }
  // Whether `block` opens a part after the first (where a consumer waits for that part).
  __host__ __device__ static constexpr bool opens_later_part(int block) {
    return block > 0 && block == first_block(part_of(block));
  }
  // Between a block's 8-key groups.
  __host__ __device__ static constexpr int group_stride(int block) { return blocks_in(part_of(block)) * 1024; }
  // Where a block's first 8-key group starts.
  __host__ __device__ static constexpr int block_start(int block) {
    return part_start(part_of(block)) + (block - first_block(part_of(block))) * 1024;
  }
  __host__ __device__ static constexpr int line_start(int line, int block) {
    return block_start(block) + (line / 8) * group_stride(block) + (line % 8) * 128;
  }
  // Byte offset of byte `byte` (of 128) of line `line` of block `block`.
  __host__ __device__ static constexpr int offset(int line, int block, int byte) {
    return line_start(line, block) + ((((byte / 16) ^ (line % 8)) * 16) | (byte % 16));
  }
  // Lines [first_invalid, 64) of the first kZeroedBlocks blocks set to zero, by `threads` threads
  // (whole lines: the swizzle does not matter).
  template <int kZeroedBlocks>
  __device__ __forceinline__ static void zero_lines(uint8_t* tile, int first_invalid, int thread, int threads) {
    constexpr int kUnitsPerLine = kZeroedBlocks * 8;  // 16-byte units
    for (int unit = thread; unit < (kTileKeys - first_invalid) * kUnitsPerLine; unit += threads) {
      const int line = first_invalid + unit / kUnitsPerLine, rest = unit % kUnitsPerLine;
      *reinterpret_cast<uint4*>(tile + line_start(line, rest / 8) + (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
    }
  }
  // A K-major wgmma descriptor of block `block` at `byte_offset` into its lines (a k step: 32
  // bytes), from `descriptor` = make_descriptor(tile, 16, group_stride(0)): the start address
  // moves to the block and the SBO field to its part's group stride.
  __device__ __forceinline__ static uint64_t key_descriptor(uint64_t descriptor, int block, int byte_offset) {
    const int64_t stride_change = (group_stride(block) - group_stride(0)) >> 4;
    return descriptor + uint64_t((block_start(block) + byte_offset) >> 4) + (uint64_t(stride_change) << 32);
  }
  // An N/M-major descriptor (V; LBO = 1 KB between the blocks of a part, SBO = group_stride) of
  // 16 keys from key 16 k of the blocks from `block`, from `descriptor` = make_descriptor(tile,
  // 1024, group_stride(0)); for blocks of part 0's group stride.
  __device__ __forceinline__ static uint64_t value_descriptor(uint64_t descriptor, int block, int k) {
    return descriptor + uint64_t((block_start(block) + 2 * k * group_stride(0)) >> 4);
  }
};
// 16-bit key tiles: 9 blocks of 64 dims in three parts, the latent halves that each warpgroup of
// the 64-row kernel multiplies by P (one n256 wgmma needs its 4 blocks at one stride) and the
// rope; each lands on its own full barrier, so that S starts on the first part.
using KeyTileParts = GroupedTile<4, 2>;
// The 64-row kernel's 16-bit tiles at pages of up to kSmallPageTokens tokens: the latent blocks in
// one part, then the rope. A tile is then 4 pages and each part costs a box per page (~40
// cycles of the TMA's time besides its lines): 8 boxes a tile instead of 12, and the kernel's
// refills arrive sooner: 5.6% fewer cycles at page 16 (bf16 D1 Hq128 B4). At page 32 the two
// layouts are level, and at 64 this one takes 3% more (S waits for 8 blocks instead of 4); the
// narrow kernel, bound by the stream, is level at every page size and keeps KeyTileParts (perf
// log, session 38).
using SmallPageKeyTileParts = GroupedTile<8, 1>;
constexpr int kSmallPageTokens = 16;
template <class Parts>
constexpr bool fills_key_tile = Parts::part_start(Parts::kParts - 1) + kSwizzleBlockBytes == kTileBlockBytes;
static_assert(fills_key_tile<KeyTileParts> && fills_key_tile<SmallPageKeyTileParts>, "the parts fill the 72 KB tile");

// The alternating kernel's producer warpgroup (one thread of it issues the loads).
constexpr int kAlternatingProducerThreads = 128;

// The raw FP8 key tiles of both kernels: 5 blocks of 64 lines x 128 bytes (128 dims), in two
// parts of whole 8-key groups (GroupedTile), the latent dims 0..511 and the rope block, 128 dims
// of a view of whole rows that hold the rope dims 512..575 (raw_rope_first_dim): one TMA box per
// part and page, on one full barrier. Boxes of 128-byte rows halve the box rows of a tile
// against 64-byte ones (the TMA takes box rows at its own pace, ~1.1-1.5 cycles each: perf log,
// session 21).
constexpr int kWideRawBoxDims = 128;
constexpr int kWideRawBlockBytes = kTileKeys * kWideRawBoxDims;                                // 8 KB
constexpr int kWideRawStageBytes = (kHeadDim + kWideRawBoxDims - 1) / kWideRawBoxDims * kWideRawBlockBytes;  // 40 KB
using RawTileParts = GroupedTile<kLatentDim / kWideRawBoxDims, 1>;  // dims 0..511, the rope
static_assert(RawTileParts::part_start(1) + kWideRawBlockBytes == kWideRawStageBytes, "the parts fill the 40 KB tile");
constexpr int kRawRopeBlock = RawTileParts::first_block(RawTileParts::kParts - 1);  // 4
// The rope block's first dim, by page size. At pages of fewer than 64 tokens, 448 (the row's last
// 128 dims, the rope in the second half of each line): a box reaching past the row's end costs the
// TMA extra once per page, and with 2-4 pages a tile that slowed the 16-row FP8 kernel 4% at page
// 16 and 3% at 32 (H100, perf log session 38). From 64 tokens on, 512 (the rope, then 64 dims past
// the row's end, which the TMA fills with zeros without reading them): the box inside the row
// brings 64 bytes a row more into the SM, which cost the same kernel 4% on an H200 at page 64 and
// nothing on an H100 (perf log, session 39).
constexpr int kTileKeysShift = 6;
static_assert(1 << kTileKeysShift == kTileKeys, "log2 of the tile's keys");
__host__ __device__ constexpr int raw_rope_first_dim(int page_shift) {
  return page_shift < kTileKeysShift ? kHeadDim - kWideRawBoxDims : kLatentDim;  // several pages a tile?
}
// Byte offset of value dim `dim` (< 512) of line `line` in a wide raw tile.
__host__ __device__ constexpr int wide_raw_offset(int line, int dim) {
  return RawTileParts::offset(line, dim / kWideRawBoxDims, dim % kWideRawBoxDims);
}
// The K-major wgmma descriptor of e4m3 k step `step` (dims 32 step .. + 31, of 18) of a raw tile,
// from `descriptor` = make_descriptor(tile, 16, RawTileParts::group_stride(0)); rope_first_dim:
// raw_rope_first_dim of the cache's pages.
__device__ __forceinline__ uint64_t raw_key_step_descriptor(uint64_t descriptor, int step, int rope_first_dim) {
  const int dim = 32 * step, block = min(dim / kWideRawBoxDims, kRawRopeBlock);
  const int block_first_dim = block == kRawRopeBlock ? rope_first_dim : block * kWideRawBoxDims;
  return RawTileParts::key_descriptor(descriptor, block, dim - block_first_dim);
}

// The tile's query rows into the swizzled layout (kLines lines; a 16-bit q for a 16-bit cache),
// by `kThreads` threads that then meet at named barrier `barrier` (rows past rows_here are
// zeros). All of a thread's loads are in flight at once (cp.async): Q is every CTA's fixed cost.
// kThreads / kLines consecutive threads share a row (QueryRowThreads).
template <int kLines, int kThreads>
__device__ __forceinline__ void load_query_tile(const SplitArgs& args, int batch_index, int first_row, int rows_here,
                                                uint8_t* query, int barrier) {
  const QueryRowThreads<kLines, kThreads> rows(args, batch_index, first_row, rows_here, threadIdx.x);
  const uint8_t* source = args.q + 2 * rows.row_offset;
#pragma unroll
  for (int j = 0; j < rows.kUnits; ++j) {
    const int dim = rows.dim_of(j);
    uint8_t* destination = query + tile_offset<kLines>(rows.row, dim);
    if (rows.present) {
      copy_async_16(destination, source + 2 * dim);
    } else {
      *reinterpret_cast<uint4*>(destination) = make_uint4(0, 0, 0, 0);
    }
  }
  commit_async_copies();
  wait_async_copies<0>();
  fence_shared_for_async_proxy();
  sync_named(barrier, kThreads);
}

// The TMA descriptors of a launch's cache (dense_decode.cu make_key_maps): 5-D views (dims of a
// block, 8 lines of a group, blocks, groups of a page, pages) whose boxes land a part of a tile
// (GroupedTile): `latent` boxes of the latent parts' blocks, `rope` boxes of the rope block. For
// 16-bit caches a block is 64 dims (boxes of 4 blocks and of 1); for FP8 caches 128 (`latent`:
// dims 0..511 as 4 blocks; `rope`: a view of whole rows, boxes of 128 dims from raw_rope_first_dim).
struct KeyMaps {  // (CUtensorMap carries its own alignment)
  CUtensorMap latent;
  CUtensorMap rope;
};
// The box of a tile's part `part` (of Parts: KeyTileParts, SmallPageKeyTileParts or RawTileParts)
// in those views: the map and the box's first dim and block. The rope part is the last; an FP8
// rope box reads 128 dims of a view of whole rows from raw_rope_first_dim (its block a dummy).
struct PartBox {
  const CUtensorMap* map;
  int dim, block;
};
template <bool kFp8Cache, class Parts>
__device__ __forceinline__ PartBox part_box(const KeyMaps* maps, int part, int page_shift) {
  const bool rope = part == Parts::kParts - 1, fp8_rope = kFp8Cache && rope;
  return {rope ? &maps->rope : &maps->latent, fp8_rope ? raw_rope_first_dim(page_shift) : 0,
          fp8_rope ? 0 : Parts::first_block(part)};
}

// Every split kernel's first step: the loads that need nothing but the kernel arguments start
// at once (the TMA descriptor; the tile's query rows into L2, one 128-byte line per thread),
// so that their memory latency overlaps the chain seq_lens -> block table -> first key tile
// instead of following it. (On D4 / D5, one H100, L2 cold, clock64: Q still reaches shared
// memory 3-6 us after entry, queued behind the first key tiles, which land then too.)
template <int kQueryElementBytes>
__device__ __forceinline__ void start_early_loads(const KeyMaps* maps, const SplitArgs& args,
                                                  int batch_index, int first_row, int rows_here) {
  constexpr int kRowBytes = kHeadDim * kQueryElementBytes, kLinesPerRow = (kRowBytes + 127) / 128;
  if (threadIdx.x == 0) prefetch_tensor_map(&maps->latent);
  if (threadIdx.x == 32) prefetch_tensor_map(&maps->rope);  // (FP8: unused, and harmless)
  for (int unit = threadIdx.x; unit < rows_here * kLinesPerRow; unit += blockDim.x) {
    const int m = first_row + unit / kLinesPerRow;
    const int64_t offset = query_row_offset(args, batch_index, m);
    const uint8_t* line = args.q + offset * kQueryElementBytes + min((unit % kLinesPerRow) * 128, kRowBytes - 1);
    prefetch_line_to_l2(line);
  }
}

// Tokens in one TMA box of a key tile: a page, or the whole tile where pages are longer; a power
// of two, so box counts are shifts (a division by the box's tokens was ~25 instructions around a
// MUFU.RCP, cold, on the way to each CTA's first tile issue).
__device__ __forceinline__ int box_tokens_shift_of(const SplitArgs& args) { return min(args.page_shift, kTileKeysShift); }
__device__ __forceinline__ int box_tokens_of(const SplitArgs& args) { return 1 << box_tokens_shift_of(args); }
// Boxes that hold `keys` consecutive keys from a tile's start (boxes of 2^box_shift tokens).
__device__ __forceinline__ int boxes_for_keys(int keys, int box_shift) { return (keys + (1 << box_shift) - 1) >> box_shift; }
// Pages a tile spans at most (at the smallest page size, one box each).
constexpr int kMaxTileBoxes = kTileKeys / 16;
// The block-table entries of the first `boxes` boxes of the tile at `first_key` (0 for the others:
// entries past a sequence's end may be garbage, so they are never read).
__device__ __forceinline__ void read_table_entries(const SplitArgs& args, const int32_t* table_row, int first_key,
                                                   int boxes, int box_tokens, int (&pages)[kMaxTileBoxes]) {
#pragma unroll
  for (int box = 0; box < kMaxTileBoxes; ++box) {
    pages[box] = box < boxes ? table_row[(first_key + box * box_tokens) >> args.page_shift] : 0;
  }
}

// A uniform plan's first key tile's block-table entries, read with PDL right after the wait (so
// they are valid) by the thread that prefetched the tile, at the places that the request's length
// as read before the wait gives: those loads are then in flight beside every thread's seq_lens
// read, and published in shared memory before the CTA barrier (publish_early_pages). The
// producer takes them where the length read after the wait gives the same first key and no more
// boxes (KeyTileLoader::take_early_pages), else reads the table itself. Read only by the producer
// after the barrier, the table was a second dependent round trip after seq_lens: ~0.4 us of a D4
// CTA's ~0.8 us from its CTA barrier to its tile's issue (perf log, session 43).
// With a speculative first tile (start_split_cta's `speculative_landed`), the same thread also
// issues tile 0 right after the wait from the entries it read before it (speculative_pages), so
// that the tile's landing does not wait for the entries' round trip; the entries read after the
// wait then only confirm it (speculative_boxes: the boxes issued where they match, else 0).
struct EarlyPages {
  int first_key, boxes;       // first_key -1: none
  int pages[kMaxTileBoxes];
  int speculative_boxes;
  int speculative_pages[kMaxTileBoxes];
};

// Issues a split's key tiles by TMA (one thread): reads the block-table entries of a tile's
// pages (only pages that hold keys of the sequence: entries past its end may be garbage) and
// issues per page one box per part of the tile (16-bit: KeyParts, KeyTileParts or
// SmallPageKeyTileParts, each part counted on its own barrier of `landed`; FP8: RawTileParts,
// both on one).
template <bool kFp8Cache, class KeyParts = KeyTileParts>
struct KeyTileLoader {
  using Parts = std::conditional_t<kFp8Cache, RawTileParts, KeyParts>;
  static constexpr int kStageStride = kFp8Cache ? kWideRawStageBytes : kTileBlockBytes;
  // The parts of tile 0 that a speculative copy takes (start_split_cta): those that its first
  // full barrier counts, an FP8 tile whole, a 16-bit tile's first part.
  static constexpr int kSpeculativeParts = kFp8Cache ? Parts::kParts : 1;
  const KeyMaps* maps;
  const SplitArgs& args;
  const int32_t* table_row;
  const KeyRange& range;
  uint8_t* stages;
  int box_shift, box_tokens;
  int pages[kMaxTileBoxes];

  __device__ __forceinline__ KeyTileLoader(const KeyMaps* maps, const SplitArgs& args, const int32_t* table_row,
                                           const KeyRange& range, uint8_t* stages)
      : maps(maps), args(args), table_row(table_row), range(range), stages(stages),
        box_shift(box_tokens_shift_of(args)), box_tokens(1 << box_shift) {}

  __device__ __forceinline__ int boxes_of(int tile) const {
    return boxes_for_keys(min(kTileKeys, range.length - (range.begin + tile * kTileKeys)), box_shift);
  }
  // Tile 0's entries from `early` (EarlyPages, in shared memory) where they are this range's;
  // false where the caller must read them (read_pages).
  __device__ __forceinline__ bool take_early_pages(const EarlyPages& early) {
    const int boxes = boxes_of(0);
    if (early.first_key != range.begin || early.boxes < boxes) return false;
#pragma unroll
    for (int box = 0; box < kMaxTileBoxes; ++box) pages[box] = box < boxes ? early.pages[box] : 0;
    return true;
  }
  // Read before waiting for the tile's stage, so that the table's latency is not added to the refill.
  __device__ __forceinline__ void read_pages(int tile) {
    read_table_entries(args, table_row, range.begin + tile * kTileKeys, boxes_of(tile), box_tokens, pages);
  }
  // Parts [first_part, end_part) of tile `tile` (its pages read last) into stage `stage`, part by
  // part so that a consumer may start on the first: with kBarriers = Parts::kParts (16-bit
  // tiles) part p counted on landed[p], with one barrier (FP8 tiles; a speculative copy) all on
  // landed[0].
  template <int kBarriers = 1>
  __device__ __forceinline__ void issue(int tile, int stage, uint64_t* landed, int first_part = 0,
                                        int end_part = Parts::kParts) const {
    static_assert(kBarriers == 1 || kBarriers == Parts::kParts, "a barrier per part, or one for them all");
    const int first_key = range.begin + tile * kTileKeys;
    const int boxes = boxes_of(tile), groups = box_tokens >> 3;  // 8-key groups a box
    int blocks = 0;  // counted on landed[0] (one barrier)
#pragma unroll
    for (int part = 0; part < Parts::kParts; ++part) {
      if (part < first_part || part >= end_part) continue;
      blocks += Parts::blocks_in(part);
      if (kBarriers > 1) {
        mbarrier_arrive_expect_bytes(&landed[part], uint32_t(boxes * Parts::blocks_in(part) * box_tokens * 128));
      }
    }
    if (kBarriers == 1) mbarrier_arrive_expect_bytes(&landed[0], uint32_t(boxes * blocks * box_tokens * 128));
    uint8_t* destination = stages + stage * kStageStride;
#pragma unroll
    for (int part = 0; part < Parts::kParts; ++part) {
      if (part < first_part || part >= end_part) continue;
      const PartBox source = part_box<kFp8Cache, Parts>(maps, part, args.page_shift);
#pragma unroll
      for (int box = 0; box < kMaxTileBoxes; ++box) {
        if (box >= boxes) break;
        const int group = ((first_key + box * box_tokens) & ((1 << args.page_shift) - 1)) / 8;
        tma_load_group_box(destination + Parts::part_start(part) + box * groups * Parts::blocks_in(part) * 1024,
                           source.map, source.dim, source.block, group, pages[box], &landed[kBarriers == 1 ? 0 : part]);
      }
    }
  }
};

// The producer: one thread walks the split's tiles, waits until the consumers have released
// the stage (kStages stages, used in turn) and issues the tile (KeyTileLoader);
// full[stage * kGroups + tile % kGroups] counts the bytes in.
// With kGroups consumer groups taking the tiles in turn (tile t: group t % kGroups), each
// (stage, group) pair has its own full barrier, so that every barrier is waited on by one
// group only, which has seen all its earlier phases: with one barrier per stage and
// kStages % kGroups != 0, a group could take the parity of a phase another group's tile has not
// completed yet for its own (try_wait.parity tells only the two latest phases apart).
// The consumer of tile t waits for phase t / lcm(kStages, kGroups) (full_phase below).
// kParts > 1: each (stage, group) has kParts full barriers, one per part of the tile
// (KeyParts: the 16-bit tile's layout).
// early (optional): tile 0's entries as published before the CTA barrier (EarlyPages).
// tile_one_waits: tile 1 is issued only once tile 0 has landed (below).
// speculative_landed (optional, with early): the barrier of a speculative copy of tile 0's first
// barrier's parts (start_split_cta; KeyTileLoader::kSpeculativeParts). Where it is confirmed, the
// producer only completes full[0]'s first phase (its consumers wait for both barriers) and issues
// the tile's other parts; else it lets the speculative copy land before it issues tile 0 into the
// same stage.
template <bool kFp8Cache, int kStages = 2, int kGroups = 1, int kParts = 1, class KeyParts = KeyTileParts>
__device__ __forceinline__ void produce_key_tiles(const KeyMaps* maps, const SplitArgs& args,
                                                  const int32_t* table_row, const KeyRange& range,
                                                  uint8_t* stages, uint64_t* full, uint64_t* empty,
                                                  const EarlyPages* early = nullptr,
                                                  uint64_t* speculative_landed = nullptr, bool tile_one_waits = false) {
  KeyTileLoader<kFp8Cache, KeyParts> loader(maps, args, table_row, range, stages);
  const bool took_early = early != nullptr && loader.take_early_pages(*early);
  if (!took_early) loader.read_pages(0);
  const bool speculated =
      took_early && speculative_landed != nullptr && early->speculative_boxes == loader.boxes_of(0);
  using Loader = decltype(loader);
  static_assert(Loader::kSpeculativeParts == (kParts == 1 ? Loader::Parts::kParts : 1),
                "a speculative copy takes what full[0] counts");
  for (int tile = 0; tile < range.tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile >= kStages) mbarrier_wait(&empty[stage], (tile / kStages - 1) % 2);
    if (tile == 0 && speculated) {  // the speculative copy holds full[0]'s parts: the rest, if any
      mbarrier_arrive(&full[0]);
      if constexpr (kParts > 1) loader.template issue<kParts>(0, 0, full, Loader::kSpeculativeParts);
    } else {
      if (tile == 0 && speculative_landed != nullptr) mbarrier_wait(speculative_landed, 0);
      loader.template issue<kParts>(tile, stage, &full[(stage * kGroups + tile % kGroups) * kParts]);
    }
    if (tile + 1 < range.tiles) loader.read_pages(tile + 1);
    // Tiles are issued as fast as the stages free up, tile 1 without waiting for tile 0 to land
    // (narrow kernels, H200, first tiles prefetched before the PDL wait: D4 B4 PDL bf16 -4%, FP8
    // -2%, D5 -1..3%, perf log session 60), except where row tiles share the keys (gridDim.x > 1:
    // two to four CTAs read each tile) or the caller asks (tile_one_waits: the 64-row kernel,
    // whose pair chain starts on tile 0 alone): there tile 1 waits, so that tile 0 does not land
    // only at the end of the whole GPU's first burst (the wait is session 4's, H100: D4 B4 -4%
    // then; without it, once the producer's issue had no division left, D4 Sq 4 B4 PDL read 3-5%
    // slower on an H200: perf log, session 61).
    if (tile == 0 && range.tiles > 1 && (tile_one_waits || gridDim.x > 1)) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) mbarrier_wait(&full[part], 0);
      if (speculative_landed != nullptr) mbarrier_wait(speculative_landed, 0);
    }
  }
}

// A uniform plan's CTA, before the PDL wait (one thread): its first key tiles into L2, on a
// speculative read of the request's length and the tiles' block-table entries. The previous grid
// in the stream may still be writing them: the values only steer the prefetch (read through L2
// only, ld.global.cg, so that no stale line stays in L1 for the reads after the wait; bounded to
// the row's entries and the cache's pages), and the producer reads them again after the wait.
// What it buys: the chain seq_lens -> block table -> first tile (~4 us of a D4 CTA's ~8.6, perf
// log session 30) runs while the previous kernel ends (the combine step lets the next grid start
// at its own start): the tile whole (below); two tiles of a split longer than two (D5's four: -3.6..5.6%),
// else one (D4 B4's two: +1..4% with both; H100, perf log session 40). At most two pages (a box a part each),
// unrolled: a rolled loop made ptxas spill in every kernel, and unrolled for a tile of four pages
// this was 7 KB of code before the wait.
// How: the tile whole, one TMA prefetch box a part and page (the kernel's part layout: KeyParts
// for a 16-bit cache, RawTileParts for FP8), by one thread (the last). Until session 57 the 16-bit
// tile's first part only and an FP8 tile as line prefetches over the last warp: under 256-byte L2
// promotion the whole 16-bit tile had been slower on D4 B1 / B2 (sessions 40, 48) and FP8 boxes
// slower on D5 (+3.5%, H100, session 48); with 128-byte promotion (6a7d2bb) the whole 16-bit tile
// is 2.5-4.5% faster on every bf16 D4 / D5 case and the FP8 boxes 1-3% on FP8 D4 B2 / D5 (H200,
// perf log sessions 57, 58; neither timed on an H100 yet).
constexpr int kMaxPrefetchBoxes = 2;
// Returns the length it read.
// pages: the entries it read (-1 where none or out of the cache).
// kMayHalve: the range in value halves (key_range_of), where the kernel speculates in both halves;
// a halved request's tiles are prefetched once, by the half-0 splits, but read by both.
template <bool kFp8Cache, bool kMayHalve = false, class KeyParts = KeyTileParts>
__device__ __forceinline__ int prefetch_first_key_tiles(const KeyMaps* maps, const SplitArgs& args, int first_row,
                                                        int rows_here, int (&pages)[kMaxTileBoxes]) {
#pragma unroll
  for (int box = 0; box < kMaxTileBoxes; ++box) pages[box] = -1;
  const int batch_index = int(blockIdx.y);
  const int length = __ldcg(args.seq_lens + batch_index * args.seq_lens_stride);
  const KeyRange range = key_range_of<kMayHalve>(args, int(blockIdx.z), length, args.splits, first_row, rows_here);
  const int32_t* table_row = args.block_table + batch_index * args.block_table_row;
  const int page_tokens = 1 << args.page_shift, box_shift = box_tokens_shift_of(args), box_tokens = 1 << box_shift;
  const int boxes = min((range.tiles > 2 ? 2 : min(range.tiles, 1)) << (kTileKeysShift - box_shift), kMaxPrefetchBoxes);
  // Every box's entry is loaded before any is used: one round trip for all of them. (Read and
  // used box by box, the second tile's entry waited for the first's, and the chain before the
  // wait took three round trips where a split prefetches two tiles: D5.)
  int entries[kMaxPrefetchBoxes];
#pragma unroll
  for (int box = 0; box < kMaxPrefetchBoxes; ++box) {
    const int entry = (range.begin + box * box_tokens) >> args.page_shift;
    entries[box] = box < boxes && unsigned(entry) < unsigned(args.block_table_columns) ? __ldcg(table_row + entry) : -1;
  }
#pragma unroll
  for (int box = 0; box < kMaxPrefetchBoxes; ++box) {
    const int key = range.begin + box * box_tokens, page = entries[box];
    if (unsigned(page) >= unsigned(args.cache_pages)) continue;
    pages[box] = page;
    const int token = key & (page_tokens - 1);
    if (range.value_half != 0) continue;
    using Parts = std::conditional_t<kFp8Cache, RawTileParts, KeyParts>;
#pragma unroll
    for (int part = 0; part < Parts::kParts; ++part) {
      const PartBox source = part_box<kFp8Cache, Parts>(maps, part, args.page_shift);
      tma_prefetch_group_box(source.map, source.dim, source.block, token / 8, page);
    }
  }
  return length;
}

// Every split kernel's prologue up to its work (all threads). A uniform plan's CTA knows its
// request and split from its grid position, so before the PDL wait it starts what needs no
// input the previous grid may write (start_early_loads) and, with PDL, prefetches its first key
// tiles; a balanced plan's (cta_work ranks the requests by length) only after the wait.
// early (optional): with PDL the prefetching thread also reads its first tile's entries right
// after the wait (EarlyPages; first_key -1 in every other thread and without PDL).
// speculative_landed (optional, with early): a barrier in shared memory that the last thread sets
// up before the wait and completes once after it: where the prefetch read tile 0's entries (at
// most kMaxPrefetchBoxes boxes), by issuing tile 0 (an FP8 tile whole, a 16-bit tile's first part:
// KeyTileLoader::kSpeculativeParts) from them into `first_stage` right after the wait (the tile's
// bytes are read after the wait, so they are the previous kernel's final ones; only its pages may
// be stale, which publish_early_pages checks), else by a plain arrival. Every thread that uses
// stage 0 waits for it (tile 0's consumers, an empty split's exit: wait_for_speculative_copy_before_exit).
// kMayHalve: the kernel works in value halves (key_range_of); then the range read before the
// wait is in halves too, so that a half-1 split speculates on its own tile (the prefetch takes a
// halved tile once, in half 0).
// KeyParts: a 16-bit tile's layout in the kernel (KeyTileParts; the 64-row kernel's
// SmallPageKeyTileParts at small pages), whose parts the prefetch takes one box each.
template <int kQueryElementBytes, bool kFp8Cache, bool kMayHalve = false, class KeyParts = KeyTileParts>
__device__ __forceinline__ CtaWork start_split_cta(const KeyMaps* maps, const SplitArgs& args, int first_row,
                                                   int rows_here, int* scratch, EarlyPages* early = nullptr,
                                                   uint64_t* speculative_landed = nullptr,
                                                   uint8_t* first_stage = nullptr) {
  KeyRange speculative_range;
  speculative_range.tiles = 0;
  if (early != nullptr) {
    early->first_key = -1;
    early->boxes = 0;
    early->speculative_boxes = 0;
  }
  if (speculative_landed != nullptr && threadIdx.x == blockDim.x - 1) {
    mbarrier_init(speculative_landed, 1);
    fence_barrier_init();
  }
  if (!args.balanced) {
    start_early_loads<kQueryElementBytes>(maps, args, int(blockIdx.y), first_row, rows_here);
    if (args.prefetch_before_wait && threadIdx.x == blockDim.x - 1) {
      int pages[kMaxTileBoxes];
      const int length = prefetch_first_key_tiles<kFp8Cache, kMayHalve, KeyParts>(maps, args, first_row, rows_here, pages);
      // Where the first tile's entries are (after the wait, only the loads). (The range is worked
      // out again: ptxas does not merge it with the prefetch's, ~45 instructions, but returning it
      // from there measured FP8 D4 B2 PDL 1.7% and 2.4% slower in two A/B calls, B4 1.1-1.4%
      // faster: perf log, session 46.)
      const KeyRange range = key_range_of<kMayHalve>(args, int(blockIdx.z), length, args.splits, first_row, rows_here);
      if (early != nullptr && range.tiles > 0 && threadIdx.x == blockDim.x - 1) {
        // (Only boxes whose entries lie in the table's row: the length may be stale.)
        const int table_keys = args.block_table_columns << args.page_shift;
        early->first_key = range.begin;
        early->boxes =
            max(0, boxes_for_keys(min(range.begin + kTileKeys, min(length, table_keys)) - range.begin, box_tokens_shift_of(args)));
        if (speculative_landed != nullptr && early->boxes <= kMaxPrefetchBoxes &&
            early->boxes == boxes_for_keys(min(kTileKeys, length - range.begin), box_tokens_shift_of(args))) {
          early->speculative_boxes = early->boxes;
#pragma unroll
          for (int box = 0; box < kMaxTileBoxes; ++box) {
            early->speculative_pages[box] = pages[box];
            if (box < early->boxes && pages[box] < 0) early->speculative_boxes = 0;
          }
          speculative_range = range;
        }
      }
    }
  }
  // PDL: inputs may come from the previous kernel in the stream; and the combine kernel may be
  // scheduled now (it waits for this whole grid before reading).
  wait_for_previous_grid();
  allow_next_grid();
  if (early != nullptr && early->first_key >= 0) {
    const int32_t* table_row = args.block_table + int(blockIdx.y) * args.block_table_row;
    read_table_entries(args, table_row, early->first_key, early->boxes, box_tokens_of(args), early->pages);
  }
  if (speculative_landed != nullptr && threadIdx.x == blockDim.x - 1) {
    if (early->speculative_boxes > 0) {
      const int32_t* table_row = args.block_table + int(blockIdx.y) * args.block_table_row;
      using Loader = KeyTileLoader<kFp8Cache>;
      Loader loader(maps, args, table_row, speculative_range, first_stage);
#pragma unroll
      for (int box = 0; box < kMaxTileBoxes; ++box) loader.pages[box] = early->speculative_pages[box];
      loader.issue(0, 0, speculative_landed, 0, Loader::kSpeculativeParts);
    } else {
      mbarrier_arrive(speculative_landed);
    }
  }
  const CtaWork work = cta_work(args, scratch);
  if (args.balanced) start_early_loads<kQueryElementBytes>(maps, args, work.batch_index, first_row, rows_here);
  return work;
}

// The prefetching thread's EarlyPages (start_split_cta) into `slot` (shared memory that nothing
// uses before the producer has issued tile 1: stage 1), for the producer after the CTA barrier;
// called after the CTA's seq_lens read (split_key_range), so that the entries' loads overlap it.
// Every CTA's slot is written (first_key -1: none).
// A speculative tile 0 is confirmed where the entries read after the wait are the ones it was
// issued from.
__device__ __forceinline__ void publish_early_pages(const EarlyPages& early, EarlyPages* slot) {
  if (threadIdx.x == blockDim.x - 1) {
    EarlyPages published = early;
#pragma unroll
    for (int box = 0; box < kMaxTileBoxes; ++box) {
      const bool moved = early.pages[box] != early.speculative_pages[box];
      if (box < early.speculative_boxes && moved) published.speculative_boxes = 0;
    }
    *slot = published;
  }
}
// An empty split's exit: a speculative tile 0 (start_split_cta) lands in this CTA's shared
// memory, so the CTA may not end before it has (the thread that issued it waits).
__device__ __forceinline__ void wait_for_speculative_copy_before_exit(uint64_t* speculative_landed) {
  if (speculative_landed != nullptr && threadIdx.x == blockDim.x - 1) mbarrier_wait(speculative_landed, 0);
}
template <bool kFp8Cache>
__device__ __forceinline__ EarlyPages* early_pages_slot(uint8_t* stages) {
  return reinterpret_cast<EarlyPages*>(stages + KeyTileLoader<kFp8Cache>::kStageStride);
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

// This thread's warpgroup (threadIdx.x / 128), taken through warp_uniform: whatever derives
// from it (a warpgroup's first tile, hence each stage address and wgmma descriptor) then lives
// in uniform registers instead of being advanced with 64-bit vector adds and moved by R2UR
// before every wgmma (CUTLASS's canonical_warp_group_idx does the same). Kernel cycles on an
// H200 (perf log, session 33): 16-bit 64-row kernel -2.3..2.6% (D1 Hq128, D3), 16-row narrow
// FP8 kernel -2%; but the 32-row narrow FP8 kernel +1.3% and the FP8 64-row kernel +4.7%, which
// therefore keep threadIdx.x / 128 (kUniform = false).
template <bool kUniform = true>
__device__ __forceinline__ int warpgroup_index() {
  if constexpr (kUniform) return warp_uniform(int(threadIdx.x) / 128);
  return int(threadIdx.x) / 128;
}

// The parity of the phase of tile `tile`'s full barrier (see produce_key_tiles).
template <int kStages, int kGroups = 1>
__host__ __device__ constexpr int full_phase(int tile) {
  constexpr int kCycle = kStages / std::gcd(kStages, kGroups) * kGroups;  // tiles per (stage, group) reuse
  return (tile / kCycle) % 2;
}

// Initialises the stages' barriers (full[stages x groups x parts]: one producer arrival + bytes;
// empty[stages]: every thread of the consuming group), by thread 0; the caller synchronises
// the CTA afterwards.
__device__ __forceinline__ void init_stage_barriers(uint64_t* full, uint64_t* empty, int consumer_threads,
                                                    int stages = 2, int groups = 1, int parts = 1) {
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int barrier = 0; barrier < groups * parts; ++barrier) mbarrier_init(&full[stage * groups * parts + barrier], 1);
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
static_assert(register_split_fits(kAlternatingThreads, kConsumerThreads, kConsumerRegisters, 128, kProducerRegisters),
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

// The alternating kernel's output rows staged in shared memory (store_staged_rows): [64][512 + 8]
// floats (the padding puts the 4 rows that one float2 staging store of a warp writes in
// distinct banks), then each row's destination offset (int64).
constexpr int kAlternatingStagedRowFloats = kLatentDim + 8;
constexpr int kAlternatingStagedRowOffsets = kRowsPerTile * kAlternatingStagedRowFloats * 4;
constexpr int kAlternatingStagingBytes = kAlternatingStagedRowOffsets + kRowsPerTile * 8;

// With an FP8 cache the alternating kernel computes O^T (fp8_fragments.cuh
// WideValueFragments): each consumer warpgroup's 256 value dims are 4 M tiles of 64.
constexpr int kOutputTilesPerWarpgroup = 4;
// The dim that row `row` (0..63) of M tile `tile` of warpgroup `warpgroup`'s O^T holds: warp w's
// 16 rows are dims 16 w .. 16 w + 15 of the tile's 64, row g (< 8) dim 2 g, row g + 8 dim 2 g + 1.
__host__ __device__ constexpr int transposed_value_dim(int warpgroup, int tile, int row) {
  return 256 * warpgroup + 64 * tile + 16 * (row / 16) + 2 * (row % 8) + (row / 8) % 2;
}

// Stages a warpgroup's O^T (4 M tiles of m64n64 accumulators: its 256 value dims as M,
// transposed_value_dim; the 64 query rows as N) into the rows of `staged`
// ([64][kAlternatingStagedRowFloats]), each row times its normalizer (`normalizers`: [64], in
// shared memory).
__device__ __forceinline__ void stage_transposed_output(int warpgroup, int lane, int row0, const float (&output)[128],
                                                        const float* normalizers, float* staged) {
  static_assert(transposed_value_dim(0, 0, 8) == transposed_value_dim(0, 0, 0) + 1, "rows g, g + 8: adjacent dims");
  // Accumulator i of M tile m: M row row0 + 8 ((i / 2) % 2) (accumulator_row), whose dims are
  // adjacent, and query row 8 (i / 4) + 2 (lane % 4) + i % 2 (accumulator_column).
#pragma unroll
  for (int m = 0; m < kOutputTilesPerWarpgroup; ++m) {
    const int dim = transposed_value_dim(warpgroup, m, row0);
#pragma unroll
    for (int i = 0; i < 32; i += 4) {
#pragma unroll
      for (int parity = 0; parity < 2; ++parity) {
        const int row = 8 * (i / 4) + 2 * (lane % 4) + parity;
        const float normalizer = normalizers[row];
        *reinterpret_cast<float2*>(staged + row * kAlternatingStagedRowFloats + dim) =
            make_float2(output[32 * m + i + parity] * normalizer, output[32 * m + i + 2 + parity] * normalizer);
      }
    }
  }
}

// A finished row of every split kernel: its output normaliser (value_scale / sum; 0 for a row
// without keys or past the tile's rows) and its base-2 LSE (-inf without keys), from the row's
// sum of probabilities relative to `reference` (the running maximum, or the lazy reference).
// kApproximate (the narrow kernels): the one-instruction reciprocal and log2 (split_common.cuh);
// in the narrow FP8 kernel the accurate forms were ~60 instructions (log2f's polynomial, the
// division's slow-path check) on the way from a one-tile CTA's row sums to its output stores,
// run once and cold (FP8 D4 PDL -0.5..1.3% on an H200). The 64-row kernel keeps the accurate
// forms: there the approximate ones changed only register choices in its main loop, and bf16 D1
// Hq128 B4 read 3-6% slower in two calls (within that case's spread between calls, but not
// taken; perf log session 62).
struct FinishedRow {
  float normalizer, lse2;
};
template <bool kApproximate = false>
__device__ __forceinline__ FinishedRow finish_row(const SplitArgs& args, float sum, float reference, bool present) {
  const bool empty_row = sum == 0.0f || !present;
  if constexpr (kApproximate) {
    return {empty_row ? 0.0f : args.value_scale * fast_reciprocal(sum),
            empty_row ? -INFINITY : reference + fast_log2(sum)};
  } else {
    return {empty_row ? 0.0f : args.value_scale / sum, empty_row ? -INFINITY : reference + log2f(sum)};
  }
}

// The alternating kernel's epilogue (16-bit caches), first part, by each consumer warpgroup
// (every tile consumed by both, so that the key stages are free for `staging`): it holds O
// (m64n256 accumulators, rows as M) for its 256 value columns and, for rows row0 and row0 + 8 of
// its warp, the running maximum and the row sums over its own keys, which `other_sums` ([row] of
// the other warpgroup's sums) completes. Writes the LSE and stages the normalised rows (the
// output or the split's partial) with each row's destination offset; once both warpgroups have,
// the rows are stored by store_staged_rows.
__device__ __forceinline__ void stage_alternating_output(const SplitArgs& args, const OutputDestination& destination,
                                                         int batch_index, int first_row, int rows_here, int warpgroup,
                                                         int lane, int row0, const float (&running_max)[2],
                                                         const float (&running_sum)[2], const float* other_sums,
                                                         const float (&output)[128], uint8_t* staging) {
  float* staged = reinterpret_cast<float*>(staging);
  int64_t* row_offsets = reinterpret_cast<int64_t*>(staging + kAlternatingStagedRowOffsets);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= rows_here) continue;
    const FinishedRow finished = finish_row(args, running_sum[half] + other_sums[row], running_max[half], true);
    float* staged_row = staged + row * kAlternatingStagedRowFloats + warpgroup * 256 + 2 * (lane % 4);
#pragma unroll
    for (int i = 2 * half; i < 128; i += 4) {
      *reinterpret_cast<float2*>(staged_row + 8 * (i / 4)) =
          make_float2(output[i] * finished.normalizer, output[i + 1] * finished.normalizer);
    }
    if (warpgroup == 0 && lane % 4 == 0) {
      store_row_lse(args, destination, batch_index, first_row + row, finished.lse2);
      row_offsets[row] = destination_row_offset(args, destination, batch_index, first_row + row);
    }
  }
}

// Four 8 x 8 matrices of 16-bit values stored; lane l gives the address of row l % 8 of matrix l / 8.
// kTransposed: each matrix stored transposed (a thread's pair (row g, columns 2 q, 2 q + 1) lands
// in rows 2 q, 2 q + 1 at column g).
template <bool kTransposed = false>
__device__ __forceinline__ void store_matrices_x4(uint8_t* row, const uint32_t (&values)[4]) {
  if constexpr (kTransposed) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(shared_address(row)),
                 "r"(values[0]), "r"(values[1]), "r"(values[2]), "r"(values[3])
                 : "memory");
  } else {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(shared_address(row)),
                 "r"(values[0]), "r"(values[1]), "r"(values[2]), "r"(values[3])
                 : "memory");
  }
}

// Row maxima of the m64 accumulator rows (the 4 lanes of a quad hold a row's columns).
__device__ __forceinline__ float max_over_quad(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
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
