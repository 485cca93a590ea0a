// Device helpers of the memory-bound generic kernels: 16-byte chunk loads and stores (number
// conversions: convert.cuh). A chunk address that is not 16-byte aligned (a strided view
// whose row stride is not a multiple of 16 bytes) falls back to byte accesses: one code path
// for every view, at the cost of two integer instructions per 16 bytes on the aligned path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "openmla/numerics.h"

namespace openmla::kernels {

constexpr int kChunkBytes = 16;
constexpr int kWarpSize = 32;

__device__ __forceinline__ bool chunk_aligned(const void* address) {
  return (reinterpret_cast<uintptr_t>(address) & (kChunkBytes - 1)) == 0;
}

__device__ __forceinline__ uint4 load_chunk(const void* address) {
  if (chunk_aligned(address)) return *static_cast<const uint4*>(address);
  uint4 value;
  const uint8_t* bytes = static_cast<const uint8_t*>(address);
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    words[w] = uint32_t(bytes[4 * w]) | uint32_t(bytes[4 * w + 1]) << 8 |
               uint32_t(bytes[4 * w + 2]) << 16 | uint32_t(bytes[4 * w + 3]) << 24;
  }
  value.x = words[0];
  value.y = words[1];
  value.z = words[2];
  value.w = words[3];
  return value;
}

// Outputs of these kernels are written once and not read back by them: streaming stores
// (evict-first) keep them from pushing inputs that are still to be read out of L2.
__device__ __forceinline__ void store_chunk(void* address, uint4 value) {
  if (chunk_aligned(address)) {
    __stcs(static_cast<uint4*>(address), value);
    return;
  }
  uint8_t* bytes = static_cast<uint8_t*>(address);
  const uint32_t words[4] = {value.x, value.y, value.z, value.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) bytes[i] = uint8_t(words[i / 4] >> (8 * (i % 4)));
}

// 8 bytes (half a chunk), with the same fallback.
// 8-byte load with the same unaligned fallback as load_chunk.
__device__ __forceinline__ uint2 load_half_chunk(const void* address) {
  if ((reinterpret_cast<uintptr_t>(address) & 7) == 0) return *static_cast<const uint2*>(address);
  const uint8_t* bytes = static_cast<const uint8_t*>(address);
  uint2 value;
  value.x = uint32_t(bytes[0]) | uint32_t(bytes[1]) << 8 | uint32_t(bytes[2]) << 16 | uint32_t(bytes[3]) << 24;
  value.y = uint32_t(bytes[4]) | uint32_t(bytes[5]) << 8 | uint32_t(bytes[6]) << 16 | uint32_t(bytes[7]) << 24;
  return value;
}

__device__ __forceinline__ void store_half_chunk(void* address, uint2 value) {
  if ((reinterpret_cast<uintptr_t>(address) & 7) == 0) {
    *static_cast<uint2*>(address) = value;
    return;
  }
  uint8_t* bytes = static_cast<uint8_t*>(address);
#pragma unroll
  for (int i = 0; i < 8; ++i) bytes[i] = uint8_t((i < 4 ? value.x : value.y) >> (8 * (i % 4)));
}

// A float at a byte address that a strided cache view may leave unaligned.
__device__ __forceinline__ void store_float(uint8_t* address, float value) {
  if ((reinterpret_cast<uintptr_t>(address) & 3) == 0) {
    *reinterpret_cast<float*>(address) = value;
    return;
  }
  uint32_t bits = float_bits(value);
#pragma unroll
  for (int i = 0; i < 4; ++i) address[i] = uint8_t(bits >> (8 * i));
}
__device__ __forceinline__ float load_float(const uint8_t* address) {
  if ((reinterpret_cast<uintptr_t>(address) & 3) == 0) return *reinterpret_cast<const float*>(address);
  return bits_float(uint32_t(address[0]) | uint32_t(address[1]) << 8 | uint32_t(address[2]) << 16 |
                    uint32_t(address[3]) << 24);
}

// The i-th 16-bit / 8-bit lane of a chunk (i a compile-time constant after unrolling).
__device__ __forceinline__ uint32_t chunk_word(const uint4& chunk, int w) {
  return w == 0 ? chunk.x : w == 1 ? chunk.y : w == 2 ? chunk.z : chunk.w;
}
__device__ __forceinline__ uint16_t chunk_half(const uint4& chunk, int i) {
  return uint16_t(chunk_word(chunk, i / 2) >> (16 * (i % 2)));
}
__device__ __forceinline__ uint8_t chunk_byte(const uint4& chunk, int i) {
  return uint8_t(chunk_word(chunk, i / 4) >> (8 * (i % 4)));
}

}  // namespace openmla::kernels
