// Hopper warpgroup MMA (wgmma) vocabulary: shared-memory matrix descriptors for the 128-byte
// (16-bit) and 64-byte (e4m3) swizzled layouts, and the m64nNk16 instructions (fp16 or bf16
// inputs) and m64nNk32 e4m3 instructions (fp32 accumulators) for the decode kernels
// (dense_decode/alternating_kernel.cuh, narrow_kernel.cuh, fp8_tiles.cuh);
// tests/cpp/wgmma_gpu_test.cu checks the 16-bit layouts against a CPU product, and the
// dense-decode GPU tests cover the e4m3 products end to end.
//
// Layout (both majors): a tile is stored as 8 KB blocks of 64 x 64 16-bit values, 128 bytes per
// line, with the 16-byte chunk c of line l stored at chunk c ^ (l % 8) (the hardware's 128-byte
// swizzle; blocks must be 1024-byte aligned). swizzled_offset() gives the byte offset of an
// element inside a block.
// - K-major operand (A, or B = K^T as [n][k]): line = row (m or n), column = k. A 16-deep k step
//   inside a block advances the start address by 32 bytes; SBO = 1024 (8 lines).
// - N-major B (tnspB = 1; e.g. V stored [key][dim], k = key, n = dim): line = k, column = n. A
//   16-deep k step advances by 16 lines (2048 bytes); SBO = 1024 (8 k lines); LBO = the
//   stride between 64-wide n blocks.
// (The decode kernels' key tiles keep each 8-line group of a block on its own 1 KB but place the
// groups further apart, SBO = the group stride: dense_decode/key_tiles.cuh GroupedTile.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/async_copy.cuh"

namespace openmla::kernels::sm90 {

constexpr int kSwizzleBlockBytes = 64 * 128;

__host__ __device__ constexpr int swizzled_offset(int line, int column) {
  return line * 128 + (((column / 8) ^ (line % 8)) * 16) + (column % 8) * 2;
}

// 64-bit shared-memory matrix descriptor with the 128-byte swizzle.
__device__ __forceinline__ uint64_t make_descriptor(const void* shared_start, uint32_t leading_byte_offset,
                                                   uint32_t stride_byte_offset) {
  const uint64_t address = shared_address(shared_start);
  return ((address & 0x3FFFF) >> 4) | (uint64_t((leading_byte_offset >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_byte_offset >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// The same with the 64-byte swizzle (e4m3 tiles of 64-byte lines; 512-byte aligned atoms of 8
// lines, chunk c of line l at chunk c ^ ((l / 2) % 4)).
__device__ __forceinline__ uint64_t make_descriptor_64b(const void* shared_start, uint32_t stride_byte_offset) {
  const uint64_t address = shared_address(shared_start);
  return ((address & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t((stride_byte_offset >> 4) & 0x3FFF) << 32) |
         (uint64_t(2) << 62);
}

// Orders this thread's ordinary shared-memory stores before the tensor cores' reads of them.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The wgmma wrappers: one per shape used (kHalf picks fp16 over bf16 inputs; fp32 accumulators;
// scales +1; accumulate = false overwrites D). Inline asm needs literal operand lists, so the
// accumulator lists are spelled out once per register count below.
#define OPENMLA_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define OPENMLA_WGMMA_OUT8(d) \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define OPENMLA_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define OPENMLA_WGMMA_OUT16(d) \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define OPENMLA_WGMMA_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define OPENMLA_WGMMA_OUT32(d) \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define OPENMLA_WGMMA_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define OPENMLA_WGMMA_OUT64(d) \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define OPENMLA_WGMMA_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define OPENMLA_WGMMA_OUT128(d) \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// A and B from shared memory (descriptors a, b); operand numbers of a, b and accumulate follow
// the N accumulators. TRANSPOSE: ", tnspA, tnspB" (empty for e4m3, whose operands are K-major).
#define OPENMLA_WGMMA_SS(SHAPE, TYPES, N, A, B, ACCUMULATE, TRANSPOSE)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACCUMULATE ", 0;\nwgmma.mma_async.sync.aligned." SHAPE \
               ".f32." TYPES " " OPENMLA_WGMMA_D##N ", " A ", " B ", p, 1, 1" TRANSPOSE ";\n}\n"            \
               : OPENMLA_WGMMA_OUT##N(d)                                                                    \
               : "l"(a), "l"(b), "r"(int(accumulate)))
// A from registers (the m64k16 fragment a[4]), B from shared memory (TRANSPOSE_B: ", tnspB").
#define OPENMLA_WGMMA_RS(SHAPE, TYPES, N, A, B, ACCUMULATE, TRANSPOSE_B)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACCUMULATE ", 0;\nwgmma.mma_async.sync.aligned." SHAPE \
               ".f32." TYPES " " OPENMLA_WGMMA_D##N ", " A ", " B ", p, 1, 1" TRANSPOSE_B ";\n}\n"         \
               : OPENMLA_WGMMA_OUT##N(d)                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
// Defines template <bool kHalf> NAME(d, a[4], b, accumulate) for A from registers.
#define OPENMLA_DEFINE_WGMMA_RS(NAME, SHAPE, N, A, B, ACCUMULATE, TRANSPOSE_B)                                   \
  template <bool kHalf>                                                                                       \
  __device__ __forceinline__ void NAME(float(&d)[N], const uint32_t(&a)[4], uint64_t b, bool accumulate) {    \
    if constexpr (kHalf) {                                                                                    \
      OPENMLA_WGMMA_RS(SHAPE, "f16.f16", N, A, B, ACCUMULATE, TRANSPOSE_B);                                   \
    } else {                                                                                                  \
      OPENMLA_WGMMA_RS(SHAPE, "bf16.bf16", N, A, B, ACCUMULATE, TRANSPOSE_B);                                 \
    }                                                                                                         \
  }
// Defines template <bool kHalf> NAME(d, a, b, accumulate) for both operands in shared memory.
#define OPENMLA_DEFINE_WGMMA_SS(NAME, SHAPE, N, A, B, ACCUMULATE, TRANSPOSE)                            \
  template <bool kHalf>                                                                              \
  __device__ __forceinline__ void NAME(float(&d)[N], uint64_t a, uint64_t b, bool accumulate) {      \
    if constexpr (kHalf) {                                                                           \
      OPENMLA_WGMMA_SS(SHAPE, "f16.f16", N, A, B, ACCUMULATE, TRANSPOSE);                            \
    } else {                                                                                         \
      OPENMLA_WGMMA_SS(SHAPE, "bf16.bf16", N, A, B, ACCUMULATE, TRANSPOSE);                          \
    }                                                                                                \
  }

// D (64 x 16) += A (K-major) * B (K-major, [n][k]): S^T = K Q^T for 16 query rows.
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x16x16, "m64n16k16", 8, "%8", "%9", "%10", ", 0, 0")

// D (64 x 16) += A (registers: an m64k16 fragment) * B (K-major): O^T with an FP8 cache, whose
// V^T fragments are widened in registers (dense_decode/fp8_fragments.cuh).
OPENMLA_DEFINE_WGMMA_RS(wgmma_64x16x16_a_registers, "m64n16k16", 8, "{%8, %9, %10, %11}", "%12", "%13", ", 0")

// D (64 x 16) += A (M-major: [k][m], tnspA) * B (K-major): O^T = V^T P^T, V stored [key][dim].
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x16x16_a_m_major, "m64n16k16", 8, "%8", "%9", "%10", ", 1, 0")

// D (64 x 32) += A (K-major) * B (K-major, [n][k]): S^T for 32 query rows.
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x32x16, "m64n32k16", 16, "%16", "%17", "%18", ", 0, 0")

// D (64 x 32) += A (M-major, tnspA) * B (K-major): O^T = V^T P^T for 32 query rows.
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x32x16_a_m_major, "m64n32k16", 16, "%16", "%17", "%18", ", 1, 0")

// D (64 x 32) += A (registers: the m64k16 fragment, as for the 64 x 16 form above) * B (K-major,
// [n][k]).
OPENMLA_DEFINE_WGMMA_RS(wgmma_64x32x16_a_registers, "m64n32k16", 16, "{%16, %17, %18, %19}", "%20", "%21", ", 0")

// D (64 x 64) += A (K-major) * B (K-major, [n][k]).
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x64x16, "m64n64k16", 32, "%32", "%33", "%34", ", 0, 0")

// D (64 x 64) += A (registers) * B (K-major, [n][k]): S over the dims whose Q is in registers.
OPENMLA_DEFINE_WGMMA_RS(wgmma_64x64x16_a_registers, "m64n64k16", 32, "{%32, %33, %34, %35}", "%36", "%37", ", 0")

// D (64 x 128) += A (K-major) * B (N-major: [k][n], tnspB). Used by the layout test only.
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x128x16_b_n_major, "m64n128k16", 64, "%64", "%65", "%66", ", 0, 1")

// D (64 x 256) += A (K-major) * B (N-major: [k][n], tnspB): O += P V for 256 value columns.
OPENMLA_DEFINE_WGMMA_SS(wgmma_64x256x16_b_n_major, "m64n256k16", 128, "%128", "%129", "%130", ", 0, 1")

// D (64 x 256) += A (registers: P straight from the S accumulators) * B (N-major, tnspB): O += P V.
OPENMLA_DEFINE_WGMMA_RS(wgmma_64x256x16_a_registers_b_n_major, "m64n256k16", 128, "{%128, %129, %130, %131}",
                        "%132", "%133", ", 1")

// e4m3 x e4m3 (k 32 per instruction; both operands K-major, the only layout wgmma takes for
// 8-bit types), for the FP8 cache's products (dense_decode/fp8_tiles.cuh).
// Descriptors with the 64-byte swizzle (make_descriptor_64b): one 64-byte line per row, a
// 32-deep k step inside a line advances the start address by 32 bytes.
#define OPENMLA_DEFINE_WGMMA_FP8_SS(NAME, SHAPE, N, A, B, ACCUMULATE)                          \
  __device__ __forceinline__ void NAME(float(&d)[N], uint64_t a, uint64_t b, bool accumulate) { \
    OPENMLA_WGMMA_SS(SHAPE, "e4m3.e4m3", N, A, B, ACCUMULATE, "");                               \
  }
// D (64 x N) += A (K-major) * B (K-major, [n][k]): S = Q K^T (N 64, the alternating kernel) and
// S^T = K Q^T (N 16 / 32 / 64: the narrow kernel's query lines, dense_decode/fp8_tiles.cuh).
OPENMLA_DEFINE_WGMMA_FP8_SS(wgmma_64x16x32_fp8, "m64n16k32", 8, "%8", "%9", "%10")
OPENMLA_DEFINE_WGMMA_FP8_SS(wgmma_64x32x32_fp8, "m64n32k32", 16, "%16", "%17", "%18")
OPENMLA_DEFINE_WGMMA_FP8_SS(wgmma_64x64x32_fp8, "m64n64k32", 32, "%32", "%33", "%34")
// The same with A in registers (an m64k32 e4m3 fragment: register r holds row 16 w + lane / 4
// + 8 (r % 2), k 16 (r / 2) + 4 (lane % 4) .. + 3): S = Q K^T with an fp8 q's latent dims held by
// the score warpgroup (dense_decode/alternating_kernel.cuh).
__device__ __forceinline__ void wgmma_64x64x32_fp8_a_registers(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                               bool accumulate) {
  OPENMLA_WGMMA_RS("m64n64k32", "e4m3.e4m3", 32, "{%32, %33, %34, %35}", "%36", "%37", "");
}
// D (64 x 256) += A (K-major, or an m64k32 e4m3 fragment in registers) * B (K-major): the rate
// micro-benchmark's shapes (bench/micro/wgmma_rate.cu).
OPENMLA_DEFINE_WGMMA_FP8_SS(wgmma_64x256x32_fp8, "m64n256k32", 128, "%128", "%129", "%130")
__device__ __forceinline__ void wgmma_64x256x32_fp8_a_registers(float (&d)[128], const uint32_t (&a)[4], uint64_t b,
                                                                bool accumulate) {
  OPENMLA_WGMMA_RS("m64n256k32", "e4m3.e4m3", 128, "{%128, %129, %130, %131}", "%132", "%133", "");
}

// Accumulator element i of a thread (warp w of the warpgroup, lane l): row and column of D.
__host__ __device__ constexpr int accumulator_row(int warp, int lane, int i) {
  return 16 * warp + 8 * ((i / 2) % 2) + lane / 4;
}
__host__ __device__ constexpr int accumulator_column(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

}  // namespace openmla::kernels::sm90
