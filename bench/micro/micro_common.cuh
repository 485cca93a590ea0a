// Shared by the microbenchmarks under bench/micro (diagnostics, not part of the benchmark's
// report): a 1-D bulk copy into shared memory, the CUDA error check that ends the run, and the
// median of CUDA-event-timed calls.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/async_copy.cuh"

namespace openmla::micro {

// `bytes` (a multiple of 16) from global `source` into shared `destination`, counted on `barrier`.
__device__ __forceinline__ void bulk_copy(void* destination, const void* source, uint32_t bytes, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          openmla::kernels::shared_address(destination)),
      "l"(source), "r"(bytes), "r"(openmla::kernels::shared_address(barrier))
      : "memory");
}

// The GPU's global clock in nanoseconds (its steps are coarse at the microsecond scale on some
// GPUs: per-CTA phases want clock64, perf log session 4).
__device__ __forceinline__ unsigned long long global_nanoseconds() {
  unsigned long long time;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(time));
  return time;
}

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

inline float median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median microseconds of `runs` timed calls of work() on `stream` (CUDA events), after `warm`
// untimed ones.
template <typename Work>
float median_us(cudaStream_t stream, int warm, int runs, Work work) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int run = 0; run < warm; ++run) work();
  std::vector<float> times;
  for (int run = 0; run < runs; ++run) {
    check(cudaEventRecord(start, stream), "record");
    work();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "timed run");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

}  // namespace openmla::micro
