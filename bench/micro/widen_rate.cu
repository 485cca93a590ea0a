// Microbenchmark: how fast an SM widens e4m3 bytes to fp16 pairs, the FP8 kernels' V^T
// fragments (src/kernels/sm90/dense_decode/fp8_fragments.cuh), by three methods:
// - cvt: one byte permute per 4 bytes, then cvt.rn.f16x2.e4m3x2 per pair (F2FP in SASS; the
//   kernels' own widen_fp8_pair / widen_fp8_pair_high; conversion instructions are said to run
//   at a fraction of the ALU rate on Hopper);
// - bits: integer ops only (mask, shift, or: the e4m3 sign, exponent and mantissa moved into an
//   fp16's fields), which gives every value exactly, scaled by 2^-8 (zero and subnormals too);
// - half of each, on alternate words, so that both pipes work.
// Each thread widens 16 independent words a round (no dependence between them); `baseline` runs
// the same loop without widening (its cost is subtracted). Prints widened values per cycle per SM
// for 1, 2 and 4 warps per scheduler. Built as bench/openmla-widen-rate with CUDA.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/sm90/dense_decode/fp8_fragments.cuh"
#include "micro_common.cuh"

using openmla::kernels::sm90::widen_fp8_pair;
using openmla::kernels::sm90::widen_fp8_pair_high;
using openmla::micro::check;

enum Method { kBaseline, kCvt, kBits, kHalfEach };
constexpr int kWords = 16;
constexpr int kRounds = 4096;

// Bytes 1 and 3 of `bytes` as an fp16 pair, each value x 2^-8.
__device__ __forceinline__ uint32_t bits_odd(uint32_t bytes) {
  return (bytes & 0x80008000u) | ((bytes & 0x7f007f00u) >> 1);
}

template <Method kMethod>
__global__ void widen_kernel(uint32_t seed, uint32_t* sink, long long* cycles) {
  uint32_t words[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = seed * (threadIdx.x + 7 * i + 1);
  uint32_t accumulated = 0;
  __syncthreads();
  const long long start = clock64();
  for (int round = 0; round < kRounds; ++round) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t word = words[i] ^ uint32_t(round);
      uint32_t low, high;
      if (kMethod == kCvt || (kMethod == kHalfEach && i % 2 == 0)) {
        const uint32_t paired = __byte_perm(word, 0, 0x3120);
        low = widen_fp8_pair(paired);
        high = widen_fp8_pair_high(paired);
      } else if (kMethod == kBits || kMethod == kHalfEach) {
        low = bits_odd(word << 8);
        high = bits_odd(word);
      } else {
        low = word;
        high = 0;
      }
      accumulated ^= low ^ high;
    }
  }
  const long long end = clock64();
  if (accumulated == 0x12345678u) sink[threadIdx.x] = accumulated;  // keeps the work
  if (threadIdx.x == 0) cycles[blockIdx.x] = end - start;
}

template <Method kMethod>
double cycles_per_round(int threads, uint32_t* sink, long long* cycles, int blocks) {
  widen_kernel<kMethod><<<blocks, threads>>>(0x9e3779b9u, sink, cycles);
  check(cudaGetLastError(), "launch");
  check(cudaDeviceSynchronize(), "run");
  long long host[1024];
  check(cudaMemcpy(host, cycles, blocks * sizeof(long long), cudaMemcpyDeviceToHost), "copy");
  double sum = 0;
  for (int b = 0; b < blocks; ++b) sum += double(host[b]);
  return sum / blocks / kRounds;
}

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  uint32_t* sink;
  long long* cycles;
  check(cudaMalloc(&sink, 1024 * sizeof(uint32_t)), "malloc");
  check(cudaMalloc(&cycles, 1024 * sizeof(long long)), "malloc");
  std::printf("e4m3 -> fp16 widening, values per cycle per SM (%d words x 4 values per thread a round)\n", kWords);
  for (int warps_per_scheduler : {1, 2, 4}) {
    const int threads = 128 * warps_per_scheduler;
    const double base = cycles_per_round<kBaseline>(threads, sink, cycles, sms);
    const double cvt = cycles_per_round<kCvt>(threads, sink, cycles, sms);
    const double bits = cycles_per_round<kBits>(threads, sink, cycles, sms);
    const double half = cycles_per_round<kHalfEach>(threads, sink, cycles, sms);
    const double values = 4.0 * kWords * threads;  // per round per SM
    std::printf("%d warp(s) per scheduler: baseline %.1f cycles a round; cvt %.1f values/cycle, bits %.1f, half each %.1f\n",
                warps_per_scheduler, base, values / (cvt - base), values / (bits - base), values / (half - base));
  }
  return 0;
}
