// Microbenchmark: how many cycles per SM the wgmma shapes of the dense-decode kernels take when
// only they run (no softmax, no loads), with one or two warpgroups issuing, operands in shared
// memory as the kernels lay them out. Answers whether S (both operands in shared memory) runs
// at the tensor rate or at shared memory's. Built as bench/openmla-wgmma-rate with CUDA; on a
// Hopper machine it prints cycles per instruction per SM and the implied FLOP / cycle / SM for
// each case (H100, session 9: every case at the full tensor rate with two warpgroups).
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/sm90/wgmma.cuh"

namespace sm90 = openmla::kernels::sm90;

enum Case { kFp8Scores, kFp8Values, kFp8ValuesRegisters, kBf16Scores, kBf16Values };
constexpr int kIterations = 256;

template <Case kCase>
__global__ void __launch_bounds__(256, 1) rate_kernel(int warpgroups, long long* cycles) {
  extern __shared__ uint8_t raw[];
  uint8_t* shared = raw + ((1024 - (openmla::kernels::shared_address(raw) & 1023)) & 1023);
  for (int i = threadIdx.x; i < 200 * 1024 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(shared)[i] = 0x38383838u * (i % 3);
  sm90::fence_shared_for_async_proxy();
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup >= warpgroups) return;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  uint32_t a_registers[4] = {0x38383838u, 0x30303030u, 0x38383838u, 0x30303030u};
  uint8_t* a_tile = shared;                          // Q-like: 64 x 576 bytes (fp8) / 64 x 576 x 2
  uint8_t* b_tile = shared + 80 * 1024 + warpgroup * 40 * 1024;
  const long long start = clock64();
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    sm90::wgmma_fence();
    if constexpr (kCase == kFp8Scores) {  // S of one tile: 18 x m64n64k32, both from shared memory
      const uint64_t a = sm90::make_descriptor_64b(a_tile, 512), b = sm90::make_descriptor_64b(b_tile, 512);
#pragma unroll
      for (int k = 0; k < 18; ++k) {
        const int offset = (k / 2) * 4096 + (k % 2) * 32;
        sm90::wgmma_64x64x32_fp8(*reinterpret_cast<float(*)[32]>(d), a + (offset >> 4), b + (offset >> 4), true);
      }
    } else if constexpr (kCase == kFp8Values) {  // O += P V for one tile, P from shared memory
      const uint64_t a = sm90::make_descriptor_64b(a_tile, 512), b = sm90::make_descriptor_64b(b_tile, 512);
#pragma unroll
      for (int k = 0; k < 2; ++k) sm90::wgmma_64x256x32_fp8(d, a + (32 * k >> 4), b + (32 * k >> 4), true);
    } else if constexpr (kCase == kFp8ValuesRegisters) {  // the same with P from registers
      const uint64_t b = sm90::make_descriptor_64b(b_tile, 512);
#pragma unroll
      for (int k = 0; k < 2; ++k) sm90::wgmma_64x256x32_fp8_a_registers(d, a_registers, b + (32 * k >> 4), true);
    } else if constexpr (kCase == kBf16Scores) {  // S of one tile: 36 x m64n64k16 (latent dims from shared memory)
      const uint64_t a = sm90::make_descriptor(a_tile, 16, 1024), b = sm90::make_descriptor(b_tile, 16, 1024);
#pragma unroll
      for (int k = 0; k < 36; ++k) {
        const int offset = (k / 4) * 8192 + (k % 4) * 32;
        sm90::wgmma_64x64x16<false>(*reinterpret_cast<float(*)[32]>(d), a + (offset >> 4), b + (offset >> 4), true);
      }
    } else {  // O += P V for one tile (256 columns), bf16, V N-major
      const uint64_t a = sm90::make_descriptor(a_tile, 16, 1024), b = sm90::make_descriptor(b_tile, 8192, 1024);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sm90::wgmma_64x256x16_b_n_major<false>(d, a + (32 * k >> 4), b + (2048 * k >> 4), true);
      }
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
  }
  const long long end = clock64();
  float sum = 0;
#pragma unroll
  for (int i = 0; i < 128; ++i) sum += d[i];
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + warpgroup] = (end - start) + (sum == 12345.0f);
}

template <Case kCase>
void run(const char* name, int instructions, double flops_per_instruction, int sms) {
  long long* cycles;
  cudaMalloc(&cycles, sms * 2 * sizeof(long long));
  const int bytes = 200 * 1024 + 1024;
  cudaFuncSetAttribute(rate_kernel<kCase>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  for (int warpgroups = 1; warpgroups <= 2; ++warpgroups) {
    rate_kernel<kCase><<<sms, 256, bytes>>>(warpgroups, cycles);  // warm-up
    rate_kernel<kCase><<<sms, 256, bytes>>>(warpgroups, cycles);
    long long host[2 * 132 * 2] = {};
    cudaMemcpy(host, cycles, sms * 2 * sizeof(long long), cudaMemcpyDeviceToHost);
    long long longest = 0;
    for (int i = 0; i < sms * 2; ++i) {
      if (i % 2 < warpgroups && host[i] > longest) longest = host[i];
    }
    const double per_instruction = double(longest) / (double(kIterations) * instructions * warpgroups);
    std::printf("%-34s warpgroups %d: %7.1f cycles per instruction per SM, %6.0f FLOP / cycle / SM\n", name,
                warpgroups, per_instruction, flops_per_instruction / per_instruction);
  }
  cudaFree(cycles);
}

int main() {
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  const int sms = properties.multiProcessorCount;
  std::printf("%s, %d SMs\n", properties.name, sms);
  run<kFp8Scores>("fp8 S m64n64k32 SS", 18, 2.0 * 64 * 64 * 32, sms);
  run<kFp8Values>("fp8 PV m64n256k32 SS", 2, 2.0 * 64 * 256 * 32, sms);
  run<kFp8ValuesRegisters>("fp8 PV m64n256k32 RS", 2, 2.0 * 64 * 256 * 32, sms);
  run<kBf16Scores>("bf16 S m64n64k16 SS", 36, 2.0 * 64 * 64 * 16, sms);
  run<kBf16Values>("bf16 PV m64n256k16 SS (V N-major)", 4, 2.0 * 64 * 256 * 16, sms);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
