// Microbenchmark: how long one 16-bit key tile (64 tokens x 576 dims, 72 KB: one page of 64) takes
// to land in an SM's shared memory when G SMs each load one at the same moment, the first step of
// a D4 CTA's chain (perf log, session 48: a value-halved D4 CTA that lands half its tile ran the
// op 0.8 us faster; is that the SM's intake, the TMA's box handling, L2 or DRAM?).
// One CTA per SM (G <= the SM count, so all are resident: a grid-wide start by one counter), one
// thread issues the loads and waits on one mbarrier; clock64 from issue to landing per CTA, and
// globaltimer from the first issue to the last landing over the grid. Loaders:
//   3 boxes      the narrow kernel's: 5-D tensor map, 128-byte swizzle, parts of 4 + 4 + 1 blocks
//   9 boxes      one box per 64-dim block
//   1 bulk       one 1-D bulk copy of the whole page (72 KB, contiguous)
//   9 bulk       nine 1-D bulk copies of 8 KB, issued by nine threads
//   dims half    a dims-split CTA's share: the first latent part's box and the rope's (40 KB)
//   1 bulk half  one 1-D bulk copy of 36 KB
// Scenarios: G = 1, 64, 128 distinct pages; 128 CTAs in pairs on 64 pages (the value halves);
// pages resident in L2 (loaded once before) or cold (an L2-sized memset between).
// A diagnostic, not part of the benchmark's report; built with everything so that it keeps
// compiling.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/sm90/tma.cuh"
#include "micro_common.cuh"

namespace sm90 = openmla::kernels::sm90;
using openmla::micro::bulk_copy;
using openmla::micro::check;
using openmla::micro::global_nanoseconds;
using openmla::micro::median;

namespace {

constexpr int kTokens = 64, kDims = 576, kBlocks = 9;
constexpr int kPageBytes = kTokens * kDims * 2;  // 73728
constexpr int kPages = 256;

struct Maps {
  CUtensorMap part;   // boxes of 4 blocks x 64 tokens
  CUtensorMap block;  // boxes of 1 block x 64 tokens
};

enum Loader { kThreeBoxes, kNineBoxes, kOneBulk, kNineBulk, kDimsHalf, kOneBulkHalf, kLoaders };
const char* const kLoaderNames[kLoaders] = {"3 boxes", "9 boxes", "1 bulk", "9 bulk", "dims half", "1 bulk half"};
__constant__ uint32_t kLoaderBytes[kLoaders] = {kPageBytes, kPageBytes, kPageBytes, kPageBytes, 5 * 8192, kPageBytes / 2};

// result[cta] = {issue -> landed cycles, issue globaltimer, landed globaltimer}
__global__ void __launch_bounds__(128, 1)
    landing_kernel(const __grid_constant__ Maps maps, const uint8_t* cache, const int* page_of_cta, int loader,
                   unsigned* start_counter, long long* result) {
  extern __shared__ uint8_t raw[];
  uint8_t* tile = raw + ((1024 - (openmla::kernels::shared_address(raw) & 1023)) & 1023);
  uint64_t* barrier = reinterpret_cast<uint64_t*>(tile + kPageBytes);
  const int page = page_of_cta[blockIdx.x];
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(barrier, 1);
    sm90::fence_barrier_init();
    sm90::prefetch_tensor_map(&maps.part);
    sm90::prefetch_tensor_map(&maps.block);
    // Every CTA issues at the same moment (all are resident: one per SM, G <= SMs).
    atomicAdd(start_counter, 1u);
    while (*reinterpret_cast<volatile unsigned*>(start_counter) < gridDim.x) {
    }
  }
  __syncthreads();
  long long issue_cycles = 0, issue_time = 0;
  if (threadIdx.x == 0) {
    issue_time = (long long)global_nanoseconds();
    issue_cycles = clock64();
    sm90::mbarrier_arrive_expect_bytes(barrier, kLoaderBytes[loader]);
  }
  __syncthreads();  // the expected bytes are set before any copy can complete
  const uint8_t* source = cache + int64_t(page) * kPageBytes;
  switch (loader) {
    case kThreeBoxes:
      if (threadIdx.x == 0) {
        sm90::tma_load_group_box(tile, &maps.part, 0, 0, 0, page, barrier);
        sm90::tma_load_group_box(tile + 32768, &maps.part, 0, 4, 0, page, barrier);
        sm90::tma_load_group_box(tile + 65536, &maps.block, 0, 8, 0, page, barrier);
      }
      break;
    case kNineBoxes:
      if (threadIdx.x == 0) {
        for (int block = 0; block < kBlocks; ++block) {
          sm90::tma_load_group_box(tile + 8192 * block, &maps.block, 0, block, 0, page, barrier);
        }
      }
      break;
    case kOneBulk:
      if (threadIdx.x == 0) bulk_copy(tile, source, kPageBytes, barrier);
      break;
    case kNineBulk:
      if (threadIdx.x < kBlocks) bulk_copy(tile + 8192 * threadIdx.x, source + 8192 * threadIdx.x, 8192, barrier);
      break;
    case kDimsHalf:
      if (threadIdx.x == 0) {
        sm90::tma_load_group_box(tile, &maps.part, 0, 0, 0, page, barrier);
        sm90::tma_load_group_box(tile + 32768, &maps.block, 0, 8, 0, page, barrier);
      }
      break;
    default:
      if (threadIdx.x == 0) bulk_copy(tile, source, kPageBytes / 2, barrier);
      break;
  }
  if (threadIdx.x == 0) {
    sm90::mbarrier_wait(barrier, 0);
    const long long landed_cycles = clock64();
    const long long landed_time = (long long)global_nanoseconds();
    result[3 * blockIdx.x] = landed_cycles - issue_cycles;
    result[3 * blockIdx.x + 1] = issue_time;
    result[3 * blockIdx.x + 2] = landed_time;
  }
}

Maps make_maps(const uint8_t* cache) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
        "cuTensorMapEncodeTiled");
  // (dims of a block, 8 tokens of a group, blocks, groups of a page, pages), as the kernels' maps
  const cuuint64_t sizes[5] = {64, 8, kBlocks, kTokens / 8, kPages};
  const cuuint64_t strides[4] = {kDims * 2, 128, 8 * kDims * 2, kPageBytes};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  Maps maps{};
  auto make = [&](CUtensorMap& map, cuuint32_t blocks) {
    const cuuint32_t box[5] = {64, 8, blocks, kTokens / 8, 1};
    const CUresult status = reinterpret_cast<Encode>(function)(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<uint8_t*>(cache), sizes, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS) {
      std::fprintf(stderr, "tensor map: %d\n", int(status));
      std::exit(1);
    }
  };
  make(maps.part, 4);
  make(maps.block, 1);
  return maps;
}

}  // namespace

int main() {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "properties");
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock");
  std::printf("%s, %d SMs, L2 %d MB, max SM clock %d MHz\n", properties.name, properties.multiProcessorCount,
              properties.l2CacheSize >> 20, clock_khz / 1000);
  uint8_t* cache = nullptr;
  uint8_t* flush = nullptr;
  int* page_of_cta = nullptr;
  unsigned* start_counter = nullptr;
  long long* result = nullptr;
  const size_t flush_bytes = size_t(4) * properties.l2CacheSize;
  check(cudaMalloc(&cache, size_t(kPages) * kPageBytes), "cache");
  check(cudaMemset(cache, 0x3c, size_t(kPages) * kPageBytes), "cache fill");
  check(cudaMalloc(&flush, flush_bytes), "flush");
  check(cudaMalloc(&page_of_cta, 1024 * sizeof(int)), "pages");
  check(cudaMalloc(&start_counter, sizeof(unsigned)), "counter");
  check(cudaMalloc(&result, 3 * 1024 * sizeof(long long)), "result");
  const Maps maps = make_maps(cache);
  const int shared_bytes = kPageBytes + 1024 + 64;
  check(cudaFuncSetAttribute(landing_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes), "smem");

  struct Scenario {
    const char* name;
    int ctas, pages;  // CTA c lands page (7 c) % pages' (spread over the cache)
  };
  const Scenario scenarios[] = {{"1 CTA", 1, 1}, {"64 CTAs", 64, 64}, {"128 CTAs", 128, 128},
                                {"128 CTAs, pairs on 64 pages", 128, 64}};
  std::printf("per CTA: cycles from issue to landed (median / max over CTAs, median of 5 runs); grid: us from the "
              "first issue to the last landing\n");
  std::printf("%-30s %-12s %-6s %12s %12s %10s\n", "scenario", "loader", "L2", "median cyc", "max cyc", "grid us");
  for (const Scenario& scenario : scenarios) {
    std::vector<int> pages(scenario.ctas);
    for (int cta = 0; cta < scenario.ctas; ++cta) pages[cta] = (7 * (cta % scenario.pages)) % kPages;
    check(cudaMemcpy(page_of_cta, pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice), "pages");
    for (int loader = 0; loader < kLoaders; ++loader) {
      for (const bool warm : {true, false}) {
        std::vector<float> medians, maxima, spans;
        for (int run = 0; run < 5; ++run) {
          check(cudaMemset(flush, run, flush_bytes), "flush");  // evicts the pages
          if (warm) {  // loads them once: the timed launch finds them in L2
            check(cudaMemset(start_counter, 0, sizeof(unsigned)), "counter");
            landing_kernel<<<scenario.ctas, 128, shared_bytes>>>(maps, cache, page_of_cta, loader, start_counter,
                                                                  result);
          }
          check(cudaMemset(start_counter, 0, sizeof(unsigned)), "counter");
          landing_kernel<<<scenario.ctas, 128, shared_bytes>>>(maps, cache, page_of_cta, loader, start_counter, result);
          check(cudaDeviceSynchronize(), "landing");
          std::vector<long long> host(3 * scenario.ctas);
          check(cudaMemcpy(host.data(), result, host.size() * sizeof(long long), cudaMemcpyDeviceToHost), "result");
          std::vector<long long> cycles;
          long long first_issue = host[1], last_landing = host[2];
          for (int cta = 0; cta < scenario.ctas; ++cta) {
            cycles.push_back(host[3 * cta]);
            first_issue = std::min(first_issue, host[3 * cta + 1]);
            last_landing = std::max(last_landing, host[3 * cta + 2]);
          }
          std::sort(cycles.begin(), cycles.end());
          medians.push_back(float(cycles[cycles.size() / 2]));
          maxima.push_back(float(cycles.back()));
          spans.push_back(float(last_landing - first_issue) / 1e3f);
        }
        std::printf("%-30s %-12s %-6s %12.0f %12.0f %10.2f\n", scenario.name, kLoaderNames[loader],
                    warm ? "warm" : "cold", median(medians), median(maxima), median(spans));
      }
    }
  }
  std::printf("(cycles at the max SM clock: %.2f ns each)\n", 1e6 / clock_khz);
  return 0;
}
