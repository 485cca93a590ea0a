// Microbenchmark: what straight-line code costs a CTA that runs it for the first time (the
// dense-decode kernels of D4 run most of their instructions once: prologue, one tile, epilogue).
// A kernel of N independent FFMAs (8 register chains, so a warm warp issues ~1 a cycle), one CTA
// per SM, times its body with clock64 twice in a row (pass 1 right after pass 0, in a rolled loop:
// pass 1 shows the body warm, where it fits the SM's instruction caches). Scenarios, each after
// the step before it in this order:
//   after flush   an L2-sized memset first: the code comes from DRAM
//   again         the same kernel straight again: the code is in L2, and in the SM if its caches
//                 keep code across launches
//   after other   another kernel of the same size (other code) first
// Prints cycles per instruction (median over the CTAs) for each scenario and pass.
// A diagnostic, not part of the benchmark's report (perf log, session 41).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "micro_common.cuh"

using openmla::micro::check;

namespace {

template <int kInstructions, int kTag>
__global__ void straight_line(long long* cycles, float* sink) {
  float chains[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) chains[j] = float(threadIdx.x + j + kTag);
  long long pass_cycles[2];
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    const long long start = clock64();
#pragma unroll
    for (int i = 0; i < kInstructions / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(chains[j]));
    }
    asm volatile("" ::: "memory");
    pass_cycles[pass] = clock64() - start;
  }
  if (threadIdx.x == 0) {
    cycles[2 * blockIdx.x] = pass_cycles[0];
    cycles[2 * blockIdx.x + 1] = pass_cycles[1];
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum += chains[j];
  if (sum == 12345.0f) sink[threadIdx.x] = sum;  // keeps the chains live
}

struct Scenario {
  const char* name;
  double pass_cycles_per_instruction[2];
};

template <int kInstructions>
void measure(int sm_count, int threads, void* flush_buffer, size_t flush_bytes, long long* cycles, float* sink) {
  std::vector<long long> host(2 * sm_count);
  auto run = [&](auto kernel) {
    kernel<<<sm_count, threads>>>(cycles, sink);
    check(cudaDeviceSynchronize(), "kernel");
    check(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost), "copy");
    double result[2];
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<long long> values;
      for (int cta = 0; cta < sm_count; ++cta) values.push_back(host[2 * cta + pass]);
      std::sort(values.begin(), values.end());
      result[pass] = double(values[values.size() / 2]) / kInstructions;
    }
    return std::vector<double>{result[0], result[1]};
  };
  auto kernel_a = straight_line<kInstructions, 0>;
  auto kernel_b = straight_line<kInstructions, 1>;
  run(kernel_a);  // loads the module's code (lazy loading) before anything is timed
  run(kernel_b);
  for (int round = 0; round < 3; ++round) {
    check(cudaMemset(flush_buffer, round, flush_bytes), "flush");
    check(cudaDeviceSynchronize(), "flush");
    const auto after_flush = run(kernel_a);
    const auto again = run(kernel_a);
    run(kernel_b);
    const auto after_other = run(kernel_a);
    std::printf("%6d instr (%4d KB) %3d threads | after flush %5.2f / %5.2f | again %5.2f / %5.2f | after other %5.2f / %5.2f\n",
                kInstructions, kInstructions * 16 / 1024, threads, after_flush[0], after_flush[1], again[0], again[1],
                after_other[0], after_other[1]);
  }
}

}  // namespace

int main() {
  int device = 0, sm_count = 0, l2_bytes = 0;
  check(cudaGetDevice(&device), "device");
  check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device), "SMs");
  check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "L2");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "properties");
  std::printf("%s, %d SMs, L2 %d MB; cycles per instruction, pass 0 (first) / pass 1 (same CTA, right after)\n",
              properties.name, sm_count, l2_bytes >> 20);
  const size_t flush_bytes = size_t(l2_bytes) * 4;
  void* flush_buffer = nullptr;
  long long* cycles = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&flush_buffer, flush_bytes), "alloc");
  check(cudaMalloc(&cycles, 2 * sm_count * sizeof(long long)), "alloc");
  check(cudaMalloc(&sink, 1024 * sizeof(float)), "alloc");
  for (int threads : {32, 128}) {
    measure<1024>(sm_count, threads, flush_buffer, flush_bytes, cycles, sink);
    measure<4096>(sm_count, threads, flush_buffer, flush_bytes, cycles, sink);
    measure<16384>(sm_count, threads, flush_buffer, flush_bytes, cycles, sink);
  }
  return 0;
}
