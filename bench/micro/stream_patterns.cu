// Microbenchmark: how fast one CTA per request can stream a paged MLA cache (PERF.md D2: 128
// requests x 8192 keys, pages of 64 tokens in a random order) into shared memory, with no math,
// by three ways of loading a 64-key tile:
//   boxes   the split kernels' TMA: a 3-D tensor map (dim, token, page), boxes of 64 (16-bit) or
//           128 (FP8) dims x 64 tokens, 128-byte swizzle: 9 or 5 boxes a tile, each reading a
//           128-byte piece of every token's row (576 or 1152 bytes apart)
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
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/sm90/tma.cuh"
#include "micro_common.cuh"

namespace sm90 = openmla::kernels::sm90;
using openmla::micro::bulk_copy;
using openmla::micro::check;
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
};


// The whole page (contiguous) into L2, so that DRAM sees one sequential read instead of the
// boxes' 128-byte pieces of every row.
__device__ __forceinline__ void prefetch_to_l2(const void* source, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(source), "r"(bytes) : "memory");
}

template <Loader kLoader>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(const __grid_constant__ CUtensorMap map, StreamArgs args) {
  extern __shared__ __align__(1024) uint8_t stages[];
  __shared__ uint64_t full[8], empty[8];
  const int request = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < args.stages; ++stage) {
      sm90::mbarrier_init(&full[stage], 1);
      sm90::mbarrier_init(&empty[stage], 32);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();
  const int* table = args.block_table + request * kPages;
  if (threadIdx.x == 0) {
    const int padded = args.row_bytes + 16;
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      if (tile >= args.stages) sm90::mbarrier_wait(&empty[stage], (tile / args.stages - 1) % 2);
      const int page = table[tile];
      uint8_t* destination = stages + stage * args.stage_bytes;
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
        sm90::mbarrier_arrive_expect_bytes(&full[stage], uint32_t(args.boxes * args.box_bytes * kPageTokens));
        for (int box = 0; box < args.boxes; ++box) {
          sm90::tma_load_box(destination + box * args.box_bytes * kPageTokens, &map, box * args.box_bytes / (args.row_bytes / kDims),
                             0, page, &full[stage]);
        }
      } else if constexpr (kLoader == Loader::kPage) {
        sm90::mbarrier_arrive_expect_bytes(&full[stage], uint32_t(kPageTokens * args.row_bytes));
        bulk_copy(destination, args.cache + int64_t(page) * kPageTokens * args.row_bytes, kPageTokens * args.row_bytes,
                  &full[stage]);
      } else {
        sm90::mbarrier_arrive_expect_bytes(&full[stage], uint32_t(kPageTokens * args.row_bytes));
        const uint8_t* source = args.cache + int64_t(page) * kPageTokens * args.row_bytes;
        for (int token = 0; token < kPageTokens; ++token) {
          bulk_copy(destination + token * padded, source + token * args.row_bytes, args.row_bytes, &full[stage]);
        }
      }
    }
  }
  if (threadIdx.x >= 32) {
    unsigned checksum = 0;
    for (int tile = 0; tile < kPages; ++tile) {
      const int stage = tile % args.stages;
      sm90::mbarrier_wait(&full[stage], (tile / args.stages) % 2);
      checksum += reinterpret_cast<const unsigned*>(stages + stage * args.stage_bytes)[threadIdx.x];
      for (const long long start = clock64(); clock64() - start < args.hold_cycles;) {
      }
      __syncwarp();
      sm90::mbarrier_arrive(&empty[stage]);
    }
    if (threadIdx.x == 32) args.checksum[request] = checksum;
  }
}



CUtensorMap make_map(const uint8_t* cache, int element_bytes, int box_dims, int total_pages) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
        "cuTensorMapEncodeTiled");
  const cuuint64_t sizes[3] = {cuuint64_t(kDims), cuuint64_t(kPageTokens), cuuint64_t(total_pages)};
  const cuuint64_t strides[2] = {cuuint64_t(kDims * element_bytes), cuuint64_t(kDims * element_bytes * kPageTokens)};
  const cuuint32_t box[3] = {cuuint32_t(box_dims), cuuint32_t(kPageTokens), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult result = reinterpret_cast<Encode>(function)(
      &map, element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
      const_cast<uint8_t*>(cache), sizes, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "tensor map: %d\n", int(result));
    std::exit(1);
  }
  return map;
}

}  // namespace

int main() {
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
  check(cudaMalloc(&block_table, pages.size() * sizeof(int)), "table");
  check(cudaMemcpy(block_table, pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice), "table copy");
  check(cudaMalloc(&checksum, kRequests * sizeof(unsigned)), "checksum");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  const float copy_us = median_us(stream, 2, 5, [&] {
    check(cudaMemcpyAsync(cache + largest / 2, cache, largest / 2, cudaMemcpyDeviceToDevice, stream), "copy");
  });
  const double copy_rate = 2.0 * double(largest / 2) / (copy_us * 1e3);
  std::printf("copy ceiling (read + written): %.0f GB/s\n", copy_rate);
  std::printf("%-6s %-36s %7s %6s %6s %10s %10s %8s\n", "cache", "loader", "stages", "hold", "ahead", "us", "GB/s",
              "of copy");

  for (int element_bytes : {1, 2}) {
    const int row_bytes = kDims * element_bytes;
    const int box_dims = element_bytes == 1 ? 128 : 64;
    const CUtensorMap map = make_map(cache, element_bytes, box_dims, total_pages);
    const int64_t bytes = int64_t(total_pages) * kPageTokens * row_bytes;
    for (Loader loader : {Loader::kBoxes, Loader::kBoxesPrefetched, Loader::kPage, Loader::kRows}) {
      StreamArgs args{cache, block_table, checksum, row_bytes, box_dims * element_bytes, (kDims + box_dims - 1) / box_dims, 0, 0, 0, 0};
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
  check(cudaStreamSynchronize(stream), "end");
  return 0;
}
