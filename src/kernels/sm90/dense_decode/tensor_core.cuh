// Tensor-core vocabulary for the decode kernels (async copies: kernels/async_copy.cuh):
// ldmatrix fragment loads, and the m16n8k16 mma with fp32 accumulation. Fragment
// layouts are PTX's: for a lane, "group" = lane / 4 is its row (A, C) or column (B) within an
// 8-wide slice, "pair" = lane % 4 picks two consecutive elements (columns 2 pair, 2 pair + 1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/async_copy.cuh"

namespace openmla::kernels::sm90 {

// Barrier among `thread_count` threads (whole warps) on named barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void sync_named(int id, int thread_count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(thread_count) : "memory");
}

// Four 8x8 16-bit matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void load_matrix_x4(uint32_t (&fragment)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address(row_address)));
}
// The same, each matrix transposed (for a B operand stored k-major, e.g. V as [token][dim]).
__device__ __forceinline__ void load_matrix_x4_transposed(uint32_t (&fragment)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address(row_address)));
}

// D = A (16x16, row) * B (16x8, col) + D, fp32 accumulators; kHalf selects fp16 over bf16.
template <bool kHalf>
__device__ __forceinline__ void mma_16x8x16(float (&accumulator)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  if constexpr (kHalf) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one register of two 16-bit values (round to nearest even).
template <bool kHalf>
__device__ __forceinline__ uint32_t pack_two(float first, float second) {
  if constexpr (kHalf) {
    __half2 packed = __floats2half2_rn(first, second);
    return *reinterpret_cast<uint32_t*>(&packed);
  } else {
    __nv_bfloat162 packed = __floats2bfloat162_rn(first, second);
    return *reinterpret_cast<uint32_t*>(&packed);
  }
}

}  // namespace openmla::kernels::sm90
