// The wgmma vocabulary (src/kernels/sm90/wgmma.cuh) against a CPU product: one warpgroup
// multiplies 64 x 64 A (K-major, 128-byte swizzle) by B given K-major ([n][k], as K for
// S = Q K^T) and N-major ([k][n], as V for O = P V), so a wrong descriptor field, swizzle or
// accumulator mapping shows up as a wrong element before any attention kernel relies on it.
#include <cuda_bf16.h>

#include <vector>

#include "kernels/sm90/dense_decode/fp8_tiles.cuh"
#include "kernels/sm90/wgmma.cuh"
#include "test_support.h"

namespace openmla::testing {
namespace {

using kernels::sm90::accumulator_column;
using kernels::sm90::accumulator_row;
using kernels::sm90::swizzled_offset;

constexpr int kM = 64, kK = 64;

// The 128-byte swizzle is computed from address bits, so each 8 KB block must start on a
// 1024-byte boundary: dynamic shared memory, rounded up by hand.
__device__ uint8_t* aligned_shared(uint8_t* raw) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(raw);
  return reinterpret_cast<uint8_t*>((address + 1023) & ~uintptr_t(1023));
}

// A [64][64] row-major, B K-major [64 n][64 k]: d = A B^T, 64 x 64.
__global__ void k_major_product(const uint16_t* a, const uint16_t* b, float* d) {
  extern __shared__ uint8_t raw_shared[];
  uint8_t* a_tile = aligned_shared(raw_shared);
  uint8_t* b_tile = a_tile + kernels::sm90::kSwizzleBlockBytes;
  for (int i = threadIdx.x; i < kM * kK; i += blockDim.x) {
    const int row = i / kK, column = i % kK;
    *reinterpret_cast<uint16_t*>(a_tile + swizzled_offset(row, column)) = a[i];
    *reinterpret_cast<uint16_t*>(b_tile + swizzled_offset(row, column)) = b[i];
  }
  kernels::sm90::fence_shared_for_async_proxy();
  __syncthreads();
  float accumulator[32];
  kernels::sm90::wgmma_fence();
#pragma unroll
  for (int step = 0; step < kK / 16; ++step) {
    kernels::sm90::wgmma_64x64x16<false>(accumulator, kernels::sm90::make_descriptor(a_tile + 32 * step, 16, 1024),
                                  kernels::sm90::make_descriptor(b_tile + 32 * step, 16, 1024), step > 0);
  }
  kernels::sm90::wgmma_commit();
  kernels::sm90::wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = 0; i < 32; ++i) d[accumulator_row(warp, lane, i) * 64 + accumulator_column(lane, i)] = accumulator[i];
}

// A [64][64] row-major, B N-major [64 k][128 n] (two 64-wide n blocks, 8 KB apart): d = A B.
__global__ void n_major_product(const uint16_t* a, const uint16_t* b, float* d) {
  extern __shared__ uint8_t raw_shared[];
  uint8_t* a_tile = aligned_shared(raw_shared);
  uint8_t* b_tile = a_tile + kernels::sm90::kSwizzleBlockBytes;
  for (int i = threadIdx.x; i < kM * kK; i += blockDim.x) {
    *reinterpret_cast<uint16_t*>(a_tile + swizzled_offset(i / kK, i % kK)) = a[i];
  }
  for (int i = threadIdx.x; i < kK * 128; i += blockDim.x) {
    const int k = i / 128, n = i % 128;
    *reinterpret_cast<uint16_t*>(b_tile + (n / 64) * kernels::sm90::kSwizzleBlockBytes + swizzled_offset(k, n % 64)) = b[i];
  }
  kernels::sm90::fence_shared_for_async_proxy();
  __syncthreads();
  float accumulator[64];
  kernels::sm90::wgmma_fence();
#pragma unroll
  for (int step = 0; step < kK / 16; ++step) {
    kernels::sm90::wgmma_64x128x16_b_n_major<false>(
        accumulator, kernels::sm90::make_descriptor(a_tile + 32 * step, 16, 1024),
        kernels::sm90::make_descriptor(b_tile + 2048 * step, kernels::sm90::kSwizzleBlockBytes, 1024), step > 0);
  }
  kernels::sm90::wgmma_commit();
  kernels::sm90::wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = 0; i < 64; ++i) d[accumulator_row(warp, lane, i) * 128 + accumulator_column(lane, i)] = accumulator[i];
}

std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> values(count);
  for (auto& value : values) value = float_to_bf16(dist(rng));
  return values;
}

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return device;
}

// Products of bf16 values summed in fp32 (the tensor cores) vs double: 64-term sums of
// values in [-1, 1] agree to ~1e-5; a layout error is off by O(1).
void expect_product(const std::vector<float>& actual, const std::vector<uint16_t>& a,
                    const std::vector<uint16_t>& b, int n_count, bool b_k_major) {
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < n_count; ++n) {
      double expected = 0;
      for (int k = 0; k < kK; ++k) {
        const uint16_t b_value = b_k_major ? b[n * kK + k] : b[k * n_count + n];
        expected += double(bf16_to_float(a[m * kK + k])) * bf16_to_float(b_value);
      }
      ASSERT_NEAR(actual[m * n_count + n], expected, 1e-3) << "m " << m << ", n " << n;
    }
  }
}

// fp8 q and cache, more than 32 rows: the alternating kernel's O^T. Each consumer warpgroup's 4 M
// tiles of 64 rows hold its 256 value dims, each once, and accumulator rows g and g + 8 of a
// warp's 16 are the dims 2 g and 2 g + 1 that the byte permute of an ldmatrix.trans result gives
// (fp8_fragments.cuh WideValueFragments), which the epilogue stages as (dim 2 g, dim 2 g + 1)
// pairs (CPU only: the mapping is arithmetic; the dense-decode GPU tests check the products).
TEST(WgmmaLayout, TransposedOutputRowsCoverTheValueDims) {
  std::vector<int> seen(512, 0);
  for (int warpgroup = 0; warpgroup < 2; ++warpgroup) {
    for (int tile = 0; tile < kernels::sm90::kOutputTilesPerWarpgroup; ++tile) {
      for (int row = 0; row < 64; ++row) {
        const int dim = kernels::sm90::transposed_value_dim(warpgroup, tile, row);
        ASSERT_GE(dim, 256 * warpgroup);
        ASSERT_LT(dim, 256 * warpgroup + 256);
        ++seen[dim];
        const int warp = row / 16, g = row % 8;
        EXPECT_EQ(dim, 256 * warpgroup + 64 * tile + 16 * warp + 2 * g + (row % 16) / 8) << "row " << row;
      }
    }
  }
  for (int dim = 0; dim < 512; ++dim) EXPECT_EQ(seen[dim], 1) << "dim " << dim;
}

TEST(WgmmaGpu, KMajorOperandsMatchCpuProduct) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const auto a = random_bf16(rng, kM * kK), b = random_bf16(rng, 64 * kK);
  uint16_t *a_device = to_device(a), *b_device = to_device(b);
  float* d_device = to_device(std::vector<float>(kM * 64, NAN));
  k_major_product<<<1, 128, 2 * kernels::sm90::kSwizzleBlockBytes + 1024>>>(a_device, b_device, d_device);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> d(kM * 64);
  ASSERT_EQ(cudaMemcpy(d.data(), d_device, d.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  expect_product(d, a, b, 64, true);
  cudaFree(a_device);
  cudaFree(b_device);
  cudaFree(d_device);
}

TEST(WgmmaGpu, NMajorBMatchesCpuProduct) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const auto a = random_bf16(rng, kM * kK), b = random_bf16(rng, kK * 128);
  uint16_t *a_device = to_device(a), *b_device = to_device(b);
  float* d_device = to_device(std::vector<float>(kM * 128, NAN));
  n_major_product<<<1, 128, 3 * kernels::sm90::kSwizzleBlockBytes + 1024>>>(a_device, b_device, d_device);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> d(kM * 128);
  ASSERT_EQ(cudaMemcpy(d.data(), d_device, d.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  expect_product(d, a, b, 128, false);
  cudaFree(a_device);
  cudaFree(b_device);
  cudaFree(d_device);
}

}  // namespace
}  // namespace openmla::testing
