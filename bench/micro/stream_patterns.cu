// Microbenchmark: how fast one CTA per request can stream a paged MLA cache (PERF.md D2: 128
// requests x 8192 keys, pages of 64 tokens in a random order) into shared memory, with no math,
// by three ways of loading a 64-key tile:
//   boxes   the split kernels' TMA: a 3-D tensor map (dim, token, page), boxes of 64 (16-bit) or
//           128 (FP8) dims x 64 tokens, 128-byte swizzle: 9 or 5 boxes a tile, each reading a
//           128-byte piece of every token's row (576 or 1152 bytes apart). Every tensor map here
//           promotes L2 fetches to 128 bytes, as the kernels' do since session 57; until then
//           both used 256 bytes, which cost an H200's box streams 6-10% (perf log, session 57:
//           the figures of sessions 32-56 from this program were taken so)
//   boxes, prefetched  the same, each page first prefetched whole into L2 (one bulk prefetch),
//           `ahead` tiles before its boxes
//   page    one 1-D bulk copy of the tile's 64 contiguous rows (the page itself)
//   rows    one 1-D bulk copy per token row, into rows padded by 16 bytes (the layout an
//           ldmatrix reader could take without bank conflicts)
// One thread issues the loads into a ring of stages; one warp waits for each stage to land,
// touches a word, holds the stage for a given number of cycles (the math's stand-in: how many
// bytes stay in flight while a stage is computed) and releases it. Plain launches (the cache is larger than L2), median of 10,
// against a device-to-device copy (bytes read + written) in the same run. A diagnostic for the
// roadmap's question "does the narrow kernels' stream lose in the TMA's access pattern?" (perf
// log, session 32); built with everything so that it keeps compiling.
// `openmla-stream-patterns schedules` runs only the second part (perf log, session 35): the boxes
// loader under three schedules, with each CTA's start and end (globaltimer) summarised:
//   static   one CTA per request, as the split kernels run D2 (128 CTAs, 4 SMs idle)
//   dynamic  one CTA per SM; every CTA claims chunks of a request's tiles from one global counter
//            (atomicAdd, one chunk claimed ahead) until none is left, so that an SM that streams
//            faster takes more chunks. The bound on what a work-stealing split kernel could gain
//            where CTAs of one schedule end unevenly (no math: switching requests costs nothing here).
//   balanced one CTA per SM, each a contiguous, equal share of all requests' tiles (FlashMLA's
//            static schedule: shares cross requests); equal bytes per SM, no claims, so it shows
//            whether the SMs' unequal bandwidth shares or the 4 idle SMs hold the static one.
// `openmla-stream-patterns relayout` runs only the fourth part (perf log, session 56): each page
// as one bulk copy (part one's fastest loader) re-laid out in place into the 128-byte-swizzled
// blocks that the kernels' wgmma read (a converter warpgroup: every 16-byte chunk of the tile
// into registers, a barrier, each chunk to its swizzled place), then held by the consumer warp;
// against the TMA boxes and the bare page copy in the same run. Whether the pages' DRAM pattern
// keeps its rate once a re-layout sits in every stage's cycle.
// `openmla-stream-patterns grouped` runs only the fifth part (perf log, session 57): the 16-bit
// tile as the split kernels land it now (key_tiles.cuh GroupedTile: 5-D boxes whose blocks and
// 8-key groups land [group][block][line]), with the latent dims in boxes of 4 blocks (the
// kernels' KeyTileParts: 3 boxes a tile), 8 (SmallPageKeyTileParts: 2) or all 9 blocks in one
// box; against part one's boxes and the page copy in the same run. Whether a box that reads each
// 8-key group's 9 KB whole streams as the page copy does.
// `openmla-stream-patterns pages` runs only the third part (perf log, session 42): whole pages
// of 16 to 256 tokens in a random order, each 64-key tile as contiguous bulk copies of its
// pages (4 of 9 KB at FP8 pages of 16), with the split kernels' stages. Whether the DRAM
// serves a cache of small scattered pages at the copy rate, before any TMA box or math.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"
#include "micro_common.cuh"

namespace sm90 = openmla::kernels::sm90;
using openmla::micro::bulk_copy;
using openmla::micro::check;
using openmla::micro::global_nanoseconds;
using openmla::micro::median_us;

namespace {

constexpr int kRequests = 128, kKeys = 8192, kPageTokens = 64, kPages = kKeys / kPageTokens;
constexpr int kDims = 576;
constexpr int kThreads = 64;  // warp 0: the producer's thread; warp 1: the consumer

enum class Loader { kBoxes, kBoxesPrefetched, kPage, kRows };
const char* name_of(Loader loader) {
  switch (loader) {
    case Loader::kBoxes: return "boxes (tensor map, 128B swizzle)";
    case Loader::kBoxesPrefetched: return "boxes, page prefetched to L2 ahead";
    case Loader::kPage: return "page (one bulk copy)";
    case Loader::kRows: return "rows (bulk copy per token, padded)";
  }
  return "?";
}

struct StreamArgs {
  const uint8_t* cache;         // [pages][64 tokens][576 x element bytes]
  const int* block_table;       // [request][kPages]
  unsigned* checksum;           // [request]
  int row_bytes, box_bytes, boxes, stage_bytes, stages;
  int hold_cycles;              // how long the consumer keeps each stage before releasing it (the math)
  int prefetch_ahead;           // kBoxesPrefetched: tile t + this is prefetched to L2 before tile t's boxes
  int* work_counter;            // the dynamic schedule's next chunk (zeroed before each launch)
  int chunk_tiles;              // tiles a claim takes; 0: the balanced schedule's equal shares
  unsigned long long* spans;    // [CTA][2]: globaltimer at the start and the end
  int page_tokens;              // page_size_stream_kernel: tokens a page (the other kernels: kPageTokens)
};


// The whole page (contiguous) into L2, so that DRAM sees one sequential read instead of the
// boxes' 128-byte pieces of every row.
__device__ __forceinline__ void prefetch_to_l2(const void* source, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(source), "r"(bytes) : "memory");
}

// Thread 0: the stages' barriers (one producer arrival + bytes; the consumer warp) and, when
// args.spans is given, the CTA's start. The caller synchronises the CTA afterwards.
__device__ __forceinline__ void init_stages(uint64_t* full, uint64_t* empty, const StreamArgs& args) {
  if (threadIdx.x != 0) return;
  if (args.spans != nullptr) args.spans[2 * blockIdx.x] = global_nanoseconds();
  for (int stage = 0; stage < args.stages; ++stage) {
    sm90::mbarrier_init(&full[stage], 1);
    sm90::mbarrier_init(&empty[stage], 32);
  }
  sm90::fence_barrier_init();
}

// The boxes of one page into `destination`, counted on `landed`.
__device__ __forceinline__ void issue_boxes(const CUtensorMap* map, const StreamArgs& args, int page,
                                            uint8_t* destination, uint64_t* landed) {
  sm90::mbarrier_arrive_expect_bytes(landed, uint32_t(args.boxes * args.box_bytes * kPageTokens));
  for (int box = 0; box < args.boxes; ++box) {
    sm90::tma_load_box(destination + box * args.box_bytes * kPageTokens, map, box * args.box_bytes / (args.row_bytes / kDims),
                       0, page, landed);
  }
}

// The consumer warp's side of tile `tile` once it has landed: one word into the checksum, the
// math's stand-in (args.hold_cycles), the stage released.
__device__ __forceinline__ void consume_stage(const uint8_t* stage_bytes, uint64_t* empty, const StreamArgs& args,
                                              unsigned& checksum) {
  checksum += reinterpret_cast<const unsigned*>(stage_bytes)[threadIdx.x];
  for (const long long start = clock64(); clock64() - start < args.hold_cycles;) {
  }
  __syncwarp();
  sm90::mbarrier_arrive(empty);
}

// The consumer warp's side of a static stream: `tiles` tiles through the ring of stages in
// order; returns its lane's checksum.
__device__ __forceinline__ unsigned consume_tiles(const uint8_t* stages, uint64_t* full, uint64_t* empty,
                                                  const StreamArgs& args, int tiles) {
  unsigned checksum = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % args.stages;
    sm90::mbarrier_wait(&full[stage], (tile / args.stages) % 2);
    consume_stage(stages + stage * args.stage_bytes, &empty[stage], args, checksum);
  }
  return checksum;
}

// One CTA's static stream of its request's tiles: thread 0 issues each tile into the ring of
// stages with `issue_tile(tile, page, destination, landed)` (the loader), the consumer warp holds
// and releases them (consume_tiles), then stores its checksum and, with args.spans, its end.
template <class IssueTile>
__device__ __forceinline__ void stream_request(const StreamArgs& args, IssueTile issue_tile) {
  extern __shared__ __align__(1024) uint8_t stages[];
  __shared__ uint64_t full[8], empty[8];
  const int request = blockIdx.x;
  init_stages(full, empty, args);
  __syncthreads();
  const int* table = args.block_table + request * kPages;
  if (threadIdx.x == 0) {
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      if (tile >= args.stages) sm90::mbarrier_wait(&empty[stage], (tile / args.stages - 1) % 2);
      issue_tile(tile, table[tile], stages + stage * args.stage_bytes, &full[stage]);
    }
  }
  if (threadIdx.x >= 32) {
    const unsigned checksum = consume_tiles(stages, full, empty, args, kPages);
    if (threadIdx.x == 32) {
      args.checksum[request] = checksum;
      if (args.spans != nullptr) args.spans[2 * blockIdx.x + 1] = global_nanoseconds();
    }
  }
}

template <Loader kLoader>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(const __grid_constant__ CUtensorMap map, StreamArgs args) {
  const int* table = args.block_table + blockIdx.x * kPages;
  stream_request(args, [&](int tile, int page, uint8_t* destination, uint64_t* landed) {
    if constexpr (kLoader == Loader::kBoxesPrefetched) {
      const int page_bytes = kPageTokens * args.row_bytes;
      if (tile == 0) {
        for (int ahead = 0; ahead < args.prefetch_ahead && ahead < kPages; ++ahead) {
          prefetch_to_l2(args.cache + int64_t(table[ahead]) * page_bytes, page_bytes);
        }
      }
      if (tile + args.prefetch_ahead < kPages) {
        prefetch_to_l2(args.cache + int64_t(table[tile + args.prefetch_ahead]) * page_bytes, page_bytes);
      }
    }
    if constexpr (kLoader == Loader::kBoxes || kLoader == Loader::kBoxesPrefetched) {
      issue_boxes(&map, args, page, destination, landed);
    } else if constexpr (kLoader == Loader::kPage) {
      sm90::mbarrier_arrive_expect_bytes(landed, uint32_t(kPageTokens * args.row_bytes));
      bulk_copy(destination, args.cache + int64_t(page) * kPageTokens * args.row_bytes, kPageTokens * args.row_bytes,
                landed);
    } else {
      const int padded = args.row_bytes + 16;
      sm90::mbarrier_arrive_expect_bytes(landed, uint32_t(kPageTokens * args.row_bytes));
      const uint8_t* source = args.cache + int64_t(page) * kPageTokens * args.row_bytes;
      for (int token = 0; token < kPageTokens; ++token) {
        bulk_copy(destination + token * padded, source + token * args.row_bytes, args.row_bytes, landed);
      }
    }
  });
}

// The boxes loader over claimed chunks (the dynamic schedule) or over one equal share of all
// requests' tiles (the balanced schedule: chunk_tiles 0). Stage slot `stage_tile` carries the
// tile's global index, -1 once the counter ran out (the producer then completes the stage's full
// barrier without bytes, so the consumer learns the end from the stage it waits for anyway).
__global__ void __launch_bounds__(kThreads, 1) dynamic_stream_kernel(const __grid_constant__ CUtensorMap map, StreamArgs args) {
  extern __shared__ __align__(1024) uint8_t stages[];
  __shared__ uint64_t full[8], empty[8];
  __shared__ int stage_tile[8];
  init_stages(full, empty, args);
  __syncthreads();
  if (threadIdx.x == 0) {
    // The tiles still to issue, [next_tile, end_tile) of all requests' ([request][kPages]): the
    // balanced schedule's one share, or the dynamic one's current chunk, then the chunk claimed
    // ahead (`ahead`, none once the counter ran out).
    const int tiles = kRequests * kPages;
    const int chunks = args.chunk_tiles == 0 ? 0 : tiles / args.chunk_tiles;
    int next_tile = 0, end_tile = 0, ahead = chunks;
    if (args.chunk_tiles == 0) {
      next_tile = int(int64_t(tiles) * blockIdx.x / gridDim.x);
      end_tile = int(int64_t(tiles) * (blockIdx.x + 1) / gridDim.x);
    } else if (const int chunk = atomicAdd(args.work_counter, 1); chunk < chunks) {
      ahead = atomicAdd(args.work_counter, 1);
      next_tile = chunk * args.chunk_tiles;
      end_tile = next_tile + args.chunk_tiles;
    }
    for (int tile = 0;; ++tile) {
      const int stage = tile % args.stages;
      if (tile >= args.stages) sm90::mbarrier_wait(&empty[stage], (tile / args.stages - 1) % 2);
      if (next_tile >= end_tile) {
        stage_tile[stage] = -1;
        sm90::mbarrier_arrive(&full[stage]);
        break;
      }
      stage_tile[stage] = next_tile;
      issue_boxes(&map, args, args.block_table[next_tile], stages + stage * args.stage_bytes, &full[stage]);
      if (++next_tile == end_tile && ahead < chunks) {
        next_tile = ahead * args.chunk_tiles;
        end_tile = next_tile + args.chunk_tiles;
        ahead = atomicAdd(args.work_counter, 1);
      }
    }
  }
  if (threadIdx.x >= 32) {
    unsigned checksum = 0;
    for (int tile = 0;; ++tile) {
      const int stage = tile % args.stages;
      sm90::mbarrier_wait(&full[stage], (tile / args.stages) % 2);
      if (stage_tile[stage] < 0) break;
      consume_stage(stages + stage * args.stage_bytes, &empty[stage], args, checksum);
    }
    if (threadIdx.x == 32) {
      atomicAdd(&args.checksum[blockIdx.x % kRequests], checksum);
      args.spans[2 * blockIdx.x + 1] = global_nanoseconds();
    }
  }
}

// Part three: a 64-key tile as the bulk copies of its pages (64 / page_tokens whole pages, or
// 64 tokens of a larger page), each CTA one request of kKeys keys over a table of
// kKeys / page_tokens random pages. The tile's table entries are read before the wait for its
// stage (as the split kernels' producer), so that their latency is not a refill's.
__global__ void __launch_bounds__(kThreads, 1) page_size_stream_kernel(StreamArgs args) {
  extern __shared__ __align__(1024) uint8_t stages[];
  __shared__ uint64_t full[8], empty[8];
  init_stages(full, empty, args);
  __syncthreads();
  constexpr int kTileKeys = 64, kTiles = kKeys / kTileKeys, kMostPages = kTileKeys / 16;
  const int page_tokens = args.page_tokens, tile_pages = max(1, kTileKeys / page_tokens);
  const int copy_tokens = min(kTileKeys, page_tokens), copy_bytes = copy_tokens * args.row_bytes;
  const int* table = args.block_table + blockIdx.x * (kKeys / page_tokens);
  if (threadIdx.x == 0) {
    int pages[kMostPages];
    auto read_pages = [&](int tile) {
      for (int p = 0; p < kMostPages; ++p) pages[p] = p < tile_pages ? table[(tile * kTileKeys) / page_tokens + p] : 0;
    };
    read_pages(0);
    for (int tile = 0; tile < kTiles; ++tile) {
      const int stage = tile % args.stages;
      if (tile >= args.stages) sm90::mbarrier_wait(&empty[stage], (tile / args.stages - 1) % 2);
      uint8_t* destination = stages + stage * args.stage_bytes;
      const int offset = (tile * kTileKeys) % page_tokens;  // within a page larger than the tile
      sm90::mbarrier_arrive_expect_bytes(&full[stage], uint32_t(kTileKeys * args.row_bytes));
      for (int p = 0; p < tile_pages; ++p) {
        bulk_copy(destination + p * copy_bytes, args.cache + (int64_t(pages[p]) * page_tokens + offset) * args.row_bytes,
                  copy_bytes, &full[stage]);
      }
      if (tile + 1 < kTiles) read_pages(tile + 1);
    }
  }
  if (threadIdx.x >= 32) {
    const unsigned checksum = consume_tiles(stages, full, empty, args, kTiles);
    if (threadIdx.x == 32) args.checksum[blockIdx.x] = checksum;
  }
}

// Part four: one bulk copy a page into the stage, re-laid out in place by warps 1-4 (kChunks
// 16-byte chunks each: the tile's bytes / 16 / 128) into the layout the TMA boxes land in (64-row
// blocks of 128-byte lines, the 128-byte swizzle); warp 5 holds each converted stage.
template <int kChunks>
__global__ void __launch_bounds__(192, 1) relayout_stream_kernel(StreamArgs args) {
  extern __shared__ __align__(1024) uint8_t stages[];
  __shared__ uint64_t full[8], empty[8], converted[8];
  const int request = blockIdx.x;
  if (threadIdx.x == 0) {
    if (args.spans != nullptr) args.spans[2 * blockIdx.x] = global_nanoseconds();
    for (int stage = 0; stage < args.stages; ++stage) {
      sm90::mbarrier_init(&full[stage], 1);
      sm90::mbarrier_init(&converted[stage], 128);
      sm90::mbarrier_init(&empty[stage], 32);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();
  const int* table = args.block_table + request * kPages;
  const int tile_bytes = kPageTokens * args.row_bytes, row_chunks = args.row_bytes / 16;
  if (threadIdx.x == 0) {
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      if (tile >= args.stages) sm90::mbarrier_wait(&empty[stage], (tile / args.stages - 1) % 2);
      sm90::mbarrier_arrive_expect_bytes(&full[stage], uint32_t(tile_bytes));
      bulk_copy(stages + stage * args.stage_bytes, args.cache + int64_t(table[tile]) * tile_bytes, tile_bytes, &full[stage]);
    }
  } else if (threadIdx.x >= 32 && threadIdx.x < 160) {
    const int thread = threadIdx.x - 32;
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      uint8_t* base = stages + stage * args.stage_bytes;
      sm90::mbarrier_wait(&full[stage], (tile / args.stages) % 2);
      uint4 chunks[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) chunks[j] = reinterpret_cast<const uint4*>(base)[thread + 128 * j];
      asm volatile("bar.sync 1, 128;" ::: "memory");  // every chunk read before any is overwritten
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int chunk = thread + 128 * j, row = chunk / row_chunks, column = chunk % row_chunks;
        *reinterpret_cast<uint4*>(base + (column / 8) * (kPageTokens * 128) + row * 128 + (((column % 8) ^ (row % 8)) * 16)) =
            chunks[j];
      }
      sm90::fence_shared_for_async_proxy();
      sm90::mbarrier_arrive(&converted[stage]);
    }
  } else if (threadIdx.x >= 160) {
    unsigned checksum = 0;
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      sm90::mbarrier_wait(&converted[stage], (tile / args.stages) % 2);
      consume_stage(stages + stage * args.stage_bytes, &empty[stage], args, checksum);
    }
    if (threadIdx.x == 160) {
      args.checksum[request] = checksum;
      if (args.spans != nullptr) args.spans[2 * blockIdx.x + 1] = global_nanoseconds();
    }
  }
}

// Part five: each tile as the grouped boxes of the split kernels (5-D view, box per part: blocks
// [first, first + n) of all 8 groups, landing [group][block][line] at the part's start), with
// n = args.boxes latent blocks a box and, where n does not divide the 9 blocks, the rest one block
// a box (`block_map`), as the kernels' rope box.
__global__ void __launch_bounds__(kThreads, 1) grouped_stream_kernel(const __grid_constant__ CUtensorMap parts_map,
                                                                      const __grid_constant__ CUtensorMap block_map,
                                                                      StreamArgs args) {
  constexpr int kBlocks = kDims / 64, kBlockBytes = kPageTokens * 128;
  stream_request(args, [&](int, int page, uint8_t* destination, uint64_t* landed) {
    sm90::mbarrier_arrive_expect_bytes(landed, uint32_t(kBlocks * kBlockBytes));
    int block = 0;
    for (; block + args.boxes <= kBlocks; block += args.boxes) {
      sm90::tma_load_group_box(destination + block * kBlockBytes, &parts_map, 0, block, 0, page, landed);
    }
    for (; block < kBlocks; ++block) {
      sm90::tma_load_group_box(destination + block * kBlockBytes, &block_map, 0, block, 0, page, landed);
    }
  });
}

// cuTensorMapEncodeTiled with the kernels' settings (128-byte swizzle, no OOB fill) and
// `promotion`; exits with `what` on failure.
CUtensorMap encode_tiled_map(const uint8_t* cache, CUtensorMapDataType type, int rank, const cuuint64_t* sizes,
                             const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapL2promotion promotion,
                             const char* what) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
        "cuTensorMapEncodeTiled");
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult result = reinterpret_cast<Encode>(function)(
      &map, type, cuuint32_t(rank), const_cast<uint8_t*>(cache), sizes, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: cuTensorMapEncodeTiled error %d\n", what, int(result));
    std::exit(1);
  }
  return map;
}

// The split kernels' 5-D view of a 16-bit cache (dense_decode.cu make_key_maps), boxes of
// `part_blocks` blocks of 64 dims x 8 groups of 8 tokens.
CUtensorMap make_grouped_map(const uint8_t* cache, int part_blocks, int total_pages,
                             CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B) {
  const cuuint64_t row_bytes = kDims * 2;
  const cuuint64_t sizes[5] = {64, 8, cuuint64_t(kDims / 64), kPageTokens / 8, cuuint64_t(total_pages)};
  const cuuint64_t strides[4] = {row_bytes, 128, 8 * row_bytes, kPageTokens * row_bytes};
  const cuuint32_t box[5] = {64, 8, cuuint32_t(part_blocks), kPageTokens / 8, 1};
  return encode_tiled_map(cache, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, sizes, strides, box, promotion, "grouped tensor map");
}

CUtensorMap make_map(const uint8_t* cache, int element_bytes, int box_dims, int total_pages,
                     CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B) {
  const cuuint64_t sizes[3] = {cuuint64_t(kDims), cuuint64_t(kPageTokens), cuuint64_t(total_pages)};
  const cuuint64_t strides[2] = {cuuint64_t(kDims * element_bytes), cuuint64_t(kDims * element_bytes * kPageTokens)};
  const cuuint32_t box[3] = {cuuint32_t(box_dims), cuuint32_t(kPageTokens), 1};
  return encode_tiled_map(cache, element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                          sizes, strides, box, promotion, "tensor map");
}

// The boxes loader as the split kernels stream D2 (parts two and four): the tensor map, the bytes
// of the whole cache, and the arguments with the kernels' stages (two of 72 KB for the 16-bit
// narrow kernel, five of 40 KB for the FP8 one at 16 rows) and their shared memory.
struct KernelStream {
  CUtensorMap map;
  int64_t bytes;
  StreamArgs args;
  int shared;
};
KernelStream kernel_stream(const uint8_t* cache, const int* block_table, unsigned* checksum, int total_pages,
                           int element_bytes, int* work_counter, unsigned long long* spans) {
  const int row_bytes = kDims * element_bytes, box_dims = element_bytes == 1 ? 128 : 64;
  KernelStream stream{make_map(cache, element_bytes, box_dims, total_pages), int64_t(total_pages) * kPageTokens * row_bytes,
                      StreamArgs{cache, block_table, checksum, row_bytes, box_dims * element_bytes,
                                 (kDims + box_dims - 1) / box_dims, 0, 0, 0, 0, work_counter, 1, spans},
                      0};
  stream.args.stage_bytes = (stream.args.boxes * stream.args.box_bytes * kPageTokens + 1023) / 1024 * 1024;
  stream.args.stages = element_bytes == 1 ? 5 : 2;
  stream.shared = std::max(stream.args.stages * stream.args.stage_bytes, 116 * 1024);
  return stream;
}

// When the CTAs of one launch end (us after the first start), and how busy they kept the grid.
void print_spans(const unsigned long long* device_spans, int ctas) {
  std::vector<unsigned long long> spans(2 * ctas);
  check(cudaMemcpy(spans.data(), device_spans, spans.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "spans");
  unsigned long long first = ~0ull;
  for (int cta = 0; cta < ctas; ++cta) first = std::min(first, spans[2 * cta]);
  std::vector<double> ends;
  double busy = 0;
  for (int cta = 0; cta < ctas; ++cta) {
    ends.push_back(double(spans[2 * cta + 1] - first) / 1e3);
    busy += double(spans[2 * cta + 1] - spans[2 * cta]) / 1e3;
  }
  std::sort(ends.begin(), ends.end());
  std::printf("      CTA ends (us): min %.1f p10 %.1f p50 %.1f p90 %.1f max %.1f; busy %.3f of CTAs x last end\n", ends[0],
              ends[ends.size() / 10], ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back(),
              busy / (double(ctas) * ends.back()));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string part = argc > 1 ? argv[1] : "";
  const bool schedules_only = part == "schedules", pages_only = part == "pages", relayout_only = part == "relayout";
  const bool grouped_only = part == "grouped";
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "properties");
  std::printf("%s, %d SMs\n", properties.name, properties.multiProcessorCount);
  const int total_pages = kRequests * kPages;
  const int64_t largest = int64_t(total_pages) * kPageTokens * kDims * 2;
  uint8_t* cache = nullptr;
  int* block_table = nullptr;
  unsigned* checksum = nullptr;
  check(cudaMalloc(&cache, largest), "cache");
  check(cudaMemset(cache, 0x3c, largest), "cache fill");
  std::vector<int> pages(total_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(7));
  check(cudaMalloc(&block_table, size_t(kRequests) * kKeys / 16 * sizeof(int)), "table");  // pages of 16 at least
  check(cudaMemcpy(block_table, pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice), "table copy");
  check(cudaMalloc(&checksum, kRequests * sizeof(unsigned)), "checksum");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  const float copy_us = median_us(stream, 2, 5, [&] {
    check(cudaMemcpyAsync(cache + largest / 2, cache, largest / 2, cudaMemcpyDeviceToDevice, stream), "copy");
  });
  const double copy_rate = 2.0 * double(largest / 2) / (copy_us * 1e3);
  std::printf("copy ceiling (read + written): %.0f GB/s\n", copy_rate);
  if (part.empty()) {
    std::printf("%-6s %-36s %7s %6s %6s %10s %10s %8s\n", "cache", "loader", "stages", "hold", "ahead", "us", "GB/s",
                "of copy");
  }

  int* work_counter = nullptr;
  unsigned long long* spans = nullptr;
  check(cudaMalloc(&work_counter, sizeof(int)), "counter");
  check(cudaMalloc(&spans, 2 * 1024 * sizeof(unsigned long long)), "spans");
  for (int element_bytes : {1, 2}) {
    if (schedules_only || pages_only || relayout_only || grouped_only) break;
    const int row_bytes = kDims * element_bytes;
    const int box_dims = element_bytes == 1 ? 128 : 64;
    const CUtensorMap map = make_map(cache, element_bytes, box_dims, total_pages);
    const int64_t bytes = int64_t(total_pages) * kPageTokens * row_bytes;
    for (Loader loader : {Loader::kBoxes, Loader::kBoxesPrefetched, Loader::kPage, Loader::kRows}) {
      StreamArgs args{cache, block_table, checksum, row_bytes, box_dims * element_bytes, (kDims + box_dims - 1) / box_dims, 0, 0, 0, 0,
                      nullptr, 0, nullptr};
      const bool boxes = loader == Loader::kBoxes || loader == Loader::kBoxesPrefetched;
      args.stage_bytes = boxes ? args.boxes * args.box_bytes * kPageTokens
                         : loader == Loader::kPage ? kPageTokens * row_bytes
                                                   : kPageTokens * (row_bytes + 16);
      args.stage_bytes = (args.stage_bytes + 1023) / 1024 * 1024;
      auto kernel = loader == Loader::kBoxes ? stream_kernel<Loader::kBoxes>
                    : loader == Loader::kBoxesPrefetched ? stream_kernel<Loader::kBoxesPrefetched>
                    : loader == Loader::kPage ? stream_kernel<Loader::kPage>
                                              : stream_kernel<Loader::kRows>;
      const int most = std::min(8, int((227 * 1024) / args.stage_bytes));
      for (int stages : {2, 3, 4, 5, 6}) {
        if (stages > most) continue;
        for (int variant = 0; variant < 20; ++variant) {
          // The math's stand-in: at the copy rate an SM has ~4600 (16-bit) / ~2300 (FP8) cycles a tile.
          const int hold = 1000 * (variant % 5), ahead = variant / 5;
          if (hold > 0 && loader == Loader::kRows) continue;
          if (hold > (element_bytes == 1 ? 1000 : 3000)) continue;
          if (ahead > 0 && loader != Loader::kBoxesPrefetched) continue;
          args.stages = stages;
          args.hold_cycles = hold;
          args.prefetch_ahead = ahead;
          // At least 116 KB, so that one CTA per SM runs, as in the split kernels.
          const int shared = std::max(stages * args.stage_bytes, 116 * 1024);
          check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
          const float us = median_us(stream, 2, 10, [&] { kernel<<<kRequests, kThreads, shared, stream>>>(map, args); });
          check(cudaGetLastError(), "launch");
          const double rate = double(bytes) / (us * 1e3);
          std::printf("%-6s %-36s %7d %6d %6d %10.1f %10.0f %8.3f\n", element_bytes == 1 ? "fp8" : "bf16",
                      name_of(loader), stages, hold, ahead, us, rate, rate / copy_rate);
        }
      }
    }
  }

  // Grouped boxes: the kernels' 16-bit tile loads by box size, beside part one's boxes and the
  // page copy (one CTA per request, the 16-bit narrow kernel's two 72 KB stages).
  if (grouped_only) {
    std::printf("\ngrouped (16-bit, one CTA per request; latent blocks a box: 4 = the kernels' tiles now)\n");
    std::printf("%-50s %7s %6s %10s %10s %8s\n", "loader", "stages", "hold", "us", "GB/s", "of copy");
    KernelStream kernels = kernel_stream(cache, block_table, checksum, total_pages, 2, work_counter, spans);
    StreamArgs& args = kernels.args;
    const int shared = kernels.shared;
    check(cudaFuncSetAttribute(grouped_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
    check(cudaFuncSetAttribute(stream_kernel<Loader::kBoxes>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
    check(cudaFuncSetAttribute(stream_kernel<Loader::kPage>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
    const int boxes = args.boxes;
    for (int round = 0; round < 2; ++round) {
      for (int hold : {0, 3000}) {
        args.hold_cycles = hold;
        // way: 0 part one's boxes, 1 the page copy, else latent blocks a grouped box; the boxes with
        // the kernels' L2 promotion (128 B) and with 256 B (theirs until session 57).
        for (int way : {0, 4, 8, 9, 1, 10, 14, 19}) {
          const auto promotion = way < 10 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
          const int shape = way % 10;
          const CUtensorMap parts_map = make_grouped_map(cache, shape > 1 ? shape : 1, total_pages, promotion);
          const CUtensorMap block_map = make_grouped_map(cache, 1, total_pages, promotion);
          const CUtensorMap box_map = make_map(cache, 2, 64, total_pages, promotion);
          args.boxes = shape > 1 ? shape : boxes;
          auto launch = [&] {
            if (shape == 0) stream_kernel<Loader::kBoxes><<<kRequests, kThreads, shared, stream>>>(box_map, args);
            if (shape == 1) stream_kernel<Loader::kPage><<<kRequests, kThreads, shared, stream>>>(kernels.map, args);
            if (shape > 1) grouped_stream_kernel<<<kRequests, kThreads, shared, stream>>>(parts_map, block_map, args);
          };
          const float us = median_us(stream, 2, 10, launch);
          check(cudaGetLastError(), "launch");
          const double rate = double(kernels.bytes) / (us * 1e3);
          char name[64];
          std::snprintf(name, sizeof name, "%s, L2 promotion %s", shape == 0 ? "boxes (64 dims x 64 tokens)" : "grouped",
                        way < 10 ? "128 B" : "256 B");
          if (shape > 1) std::snprintf(name + std::strlen(name), sizeof name - std::strlen(name), ", %d blocks a box", shape);
          std::printf("%-50s %7d %6d %10.1f %10.0f %8.3f\n", shape == 1 ? "page copy" : name, args.stages, hold, us,
                      rate, rate / copy_rate);
        }
      }
    }
    check(cudaStreamSynchronize(stream), "end");
    return 0;
  }
  // Page copies re-laid out: the boxes, the bare page copy and the page copy re-laid out in place,
  // one CTA per request (the page copy lands in the start of the swizzled blocks' stage).
  if (relayout_only) {
    std::printf("\nrelayout (one CTA per request; the boxes, the page copy, the page copy re-laid out in place)\n");
    std::printf("%-6s %-30s %7s %6s %10s %10s %8s\n", "cache", "loader", "stages", "hold", "us", "GB/s", "of copy");
    for (int element_bytes : {2, 1}) {
      KernelStream kernels = kernel_stream(cache, block_table, checksum, total_pages, element_bytes, work_counter, spans);
      const CUtensorMap& map = kernels.map;
      const int64_t bytes = kernels.bytes;
      StreamArgs& args = kernels.args;
      const int shared = kernels.shared;
      auto relayout = element_bytes == 1 ? relayout_stream_kernel<kPageTokens * kDims / 16 / 128>
                                         : relayout_stream_kernel<kPageTokens * kDims * 2 / 16 / 128>;
      check(cudaFuncSetAttribute(relayout, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
      check(cudaFuncSetAttribute(stream_kernel<Loader::kBoxes>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
      check(cudaFuncSetAttribute(stream_kernel<Loader::kPage>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
      for (int hold : {0, element_bytes == 1 ? 1500 : 3000}) {
        args.hold_cycles = hold;
        for (int way = 0; way < 3; ++way) {
          auto launch = [&] {
            if (way == 0) stream_kernel<Loader::kBoxes><<<kRequests, kThreads, shared, stream>>>(map, args);
            if (way == 1) stream_kernel<Loader::kPage><<<kRequests, kThreads, shared, stream>>>(map, args);
            if (way == 2) relayout<<<kRequests, 192, shared, stream>>>(args);
          };
          const float us = median_us(stream, 2, 10, launch);
          check(cudaGetLastError(), "launch");
          const double rate = double(bytes) / (us * 1e3);
          std::printf("%-6s %-30s %7d %6d %10.1f %10.0f %8.3f\n", element_bytes == 1 ? "fp8" : "bf16",
                      way == 0 ? "boxes" : way == 1 ? "page copy" : "page copy, re-laid out", args.stages, hold, us, rate,
                      rate / copy_rate);
          launch();
          check(cudaStreamSynchronize(stream), "spans launch");
          print_spans(spans, kRequests);
        }
      }
    }
  }
  // Schedules: the boxes loader, one CTA per request against one CTA per SM (balanced shares, or
  // chunks claimed from a counter).
  if (!pages_only && !relayout_only) {
    std::printf("\nschedules (boxes loader; counter zeroed before every launch, every schedule)\n");
    std::printf("%-6s %-30s %7s %6s %6s %10s %10s %8s\n", "cache", "schedule", "stages", "hold", "chunk", "us", "GB/s",
                "of copy");
    for (int element_bytes : {2, 1}) {
      // Holds near the kernels' math a tile (D2 Hq 16 at the copy rate: ~4600 / ~2300 cycles).
      KernelStream kernels = kernel_stream(cache, block_table, checksum, total_pages, element_bytes, work_counter, spans);
      const CUtensorMap& map = kernels.map;
      const int64_t bytes = kernels.bytes;
      StreamArgs& args = kernels.args;
      const int stages = args.stages, shared = kernels.shared;
      for (int hold : {0, element_bytes == 1 ? 1500 : 3000}) {
        args.hold_cycles = hold;
        for (int chunk : {0, -1, 2, 8, 32}) {  // 0: static, -1: balanced
          args.chunk_tiles = std::max(chunk, 0);
          const int ctas = chunk == 0 ? kRequests : properties.multiProcessorCount;
          auto launch = [&] {
            check(cudaMemsetAsync(work_counter, 0, sizeof(int), stream), "counter");
            if (chunk == 0) {
              stream_kernel<Loader::kBoxes><<<ctas, kThreads, shared, stream>>>(map, args);
            } else {
              dynamic_stream_kernel<<<ctas, kThreads, shared, stream>>>(map, args);
            }
          };
          check(cudaFuncSetAttribute(stream_kernel<Loader::kBoxes>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
          check(cudaFuncSetAttribute(dynamic_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
          const float us = median_us(stream, 2, 10, launch);
          check(cudaGetLastError(), "launch");
          const double rate = double(bytes) / (us * 1e3);
          std::printf("%-6s %-30s %7d %6d %6d %10.1f %10.0f %8.3f\n", element_bytes == 1 ? "fp8" : "bf16",
                      chunk == 0 ? "static (CTA per request)" : chunk < 0 ? "balanced (CTA per SM, static)" : "dynamic (CTA per SM)",
                      stages, hold, chunk, us, rate,
                      rate / copy_rate);
          launch();
          check(cudaStreamSynchronize(stream), "spans launch");
          print_spans(spans, ctas);
        }
      }
    }
  }

  if (relayout_only || schedules_only) {
    check(cudaStreamSynchronize(stream), "end");
    return 0;
  }
  // Page sizes: a fresh random table per size (pages of the whole cache, each request its own).
  std::printf("\npage sizes (bulk copies of whole pages, random page order; CTA per request)\n");
  std::printf("%-6s %6s %7s %6s %10s %10s %8s\n", "cache", "page", "stages", "hold", "us", "GB/s", "of copy");
  for (int element_bytes : {1, 2}) {
    const int row_bytes = kDims * element_bytes;
    const int64_t bytes = int64_t(kRequests) * kKeys * row_bytes;
    for (int page_tokens : {16, 32, 64, 128, 256}) {
      const int sized_pages = kRequests * kKeys / page_tokens;
      std::vector<int> order(sized_pages);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(page_tokens));
      check(cudaMemcpy(block_table, order.data(), order.size() * sizeof(int), cudaMemcpyHostToDevice), "table copy");
      StreamArgs args{cache, block_table, checksum, row_bytes, 0, 0, 0, 0, 0, 0, nullptr, 0, nullptr, page_tokens};
      args.stage_bytes = (64 * row_bytes + 1023) / 1024 * 1024;
      // The split kernels' stages (FP8 narrow at 16 rows: five of 40 KB; 16-bit narrow: two of
      // 72 KB) and one more; holds near their math a tile (D2 Hq 16 at the copy rate).
      for (int stages : {element_bytes == 1 ? 5 : 2, element_bytes == 1 ? 6 : 3}) {
        for (int hold : {0, element_bytes == 1 ? 1500 : 3000}) {
          args.stages = stages;
          args.hold_cycles = hold;
          const int shared = std::max(stages * args.stage_bytes, 116 * 1024);
          check(cudaFuncSetAttribute(page_size_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared),
                "smem");
          const float us =
              median_us(stream, 2, 10, [&] { page_size_stream_kernel<<<kRequests, kThreads, shared, stream>>>(args); });
          check(cudaGetLastError(), "launch");
          const double rate = double(bytes) / (us * 1e3);
          std::printf("%-6s %6d %7d %6d %10.1f %10.0f %8.3f\n", element_bytes == 1 ? "fp8" : "bf16", page_tokens, stages,
                      hold, us, rate, rate / copy_rate);
        }
      }
    }
  }
  check(cudaStreamSynchronize(stream), "end");
  return 0;
}
