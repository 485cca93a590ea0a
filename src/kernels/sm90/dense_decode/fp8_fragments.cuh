// Dense MLA decode, FP8 cache: the wgmma A fragments of V^T read straight from the raw e4m3 key
// tile and widened to fp16 in registers, for the transposed output products O^T = V^T P^T of
// both kernels (narrow_fp8_kernel.cuh, alternating_kernel.cuh; their S runs on e4m3 wgmma from
// the raw tile, fp8_tiles.cuh). No 16-bit copy of the tile is ever written to shared memory:
// widening through shared memory (read 36 KB, write 72 KB, then wgmma reads the 72 KB)
// serialised with the math and held the FP8 cache below the BF16 speed.
//
// Raw tile: as the TMA lands it, boxes of 128 dims with the 128-byte swizzle (key_tiles.cuh
// wide_raw_offset). Q's e4m3 lines: 9 blocks of [lines][64 bytes], 64-byte swizzled
// (raw_fp8_offset). (Until session 31 the narrow kernel's raw tiles were 64-byte swizzled
// 64-dim boxes, V^T loaded as 32-bit words and paired by byte permutes: 4 loads per 16 values
// where ldmatrix.trans takes one.)
#pragma once

#include "kernels/sm90/dense_decode/key_tiles.cuh"

namespace openmla::kernels::sm90 {

// Byte offset of (line, dim) in an e4m3 operand of kLines lines stored as 9 blocks of [kLines][64
// bytes] with the 64-byte swizzle: Q's e4m3 lines (fp8_tiles.cuh load_e4m3_query_rows).
template <int kLines>
__host__ __device__ constexpr int raw_fp8_offset(int line, int dim) {
  return (dim / 64) * (kLines * 64) + line * 64 + ((((dim % 64) / 16) ^ ((line / 2) % 4)) * 16) + dim % 16;
}

// Two e4m3 values (the low 16 bits) -> fp16x2, exactly, in one instruction.
__device__ __forceinline__ uint32_t widen_fp8_pair(uint32_t bytes) {
  const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bytes & 0xffffu), __NV_E4M3);
  return uint32_t(pair.x) | (uint32_t(pair.y) << 16);
}
// The same for the high 16 bits, read as the register's upper half (widen_fp8_pair(bytes >> 16)
// spent a shift on each).
__device__ __forceinline__ uint32_t widen_fp8_pair_high(uint32_t bytes) {
  uint32_t pair;
  asm("{\n.reg .b16 low, high;\nmov.b32 {low, high}, %1;\ncvt.rn.f16x2.e4m3x2 %0, high;\n}\n" : "=r"(pair) : "r"(bytes));
  return pair;
}

// Both kernels with an FP8 cache compute O^T = V^T P^T: 256 value dims are 4 M tiles of 64 (wgmma
// m64nNk16 in fp16, N = the query rows, B = P^T: P as the softmax stores it, [row][key],
// K-major; the 64-row kernel's output warpgroups own 256 dims each, the narrow kernel's one
// output warpgroup all 512 through two readers), so that V^T
// is the A operand, which wgmma takes from registers: widened exactly from the wide raw tile
// (key_tiles.cuh wide_raw_offset), no 16-bit copy of the tile is written to shared memory, and
// the output accumulates in fp32 (the e4m3 output product kept ~13 bits a step: perf log
// session 23).
// (O^T's rows: key_tiles.cuh transposed_value_dim.)

// Four 8 x 8 matrices of 16-bit values, transposed; lane l gives the address of row l % 8 of
// matrix l / 8, and receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of each.
__device__ __forceinline__ void load_transposed_matrices_x4(const uint8_t* row, uint32_t (&values)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(values[0]), "=r"(values[1]), "=r"(values[2]), "=r"(values[3])
               : "r"(shared_address(row))
               : "memory");
}

// A thread's fp16 V^T A fragments (m64k16: register r holds M row g + 8 (r % 2) of the warp's 16,
// k columns 2 q, 2 q + 1 (+ 8 for r >= 2), g = lane / 4, q = lane % 4) from the wide raw tile.
// ldmatrix.trans on the tile viewed as 16-bit dim pairs, lane l addressing key line 32 h + l
// (matrix j: keys 32 h + 8 j ..) at the warp's 16 dims, gives per matrix the bytes (key 8 j + 2 q:
// dims 2 g, 2 g + 1), (key 8 j + 2 q + 1: dims 2 g, 2 g + 1); one byte permute pairs the keys of
// each dim, and each pair widens exactly in one instruction. So one ldmatrix.x4 feeds two k
// steps (32 keys) of one M tile, keys in their natural order (P's), and M rows g, g + 8 are dims
// 2 g, 2 g + 1 (transposed_value_dim). The 128-byte swizzle puts a matrix's 8 key lines on 8
// distinct chunks: no bank conflicts.
struct WideValueFragments {
  int offset[2];  // key line `lane`, M tiles 0 / 1 (tiles 2, 3: one raw block on; keys 32 h ..: 4 h key groups on)

  __device__ __forceinline__ WideValueFragments(int warpgroup, int warp, int lane) {
#pragma unroll
    for (int m = 0; m < 2; ++m) offset[m] = wide_raw_offset(lane, transposed_value_dim(warpgroup, m, 16 * warp));
  }
  // The fragments of M tile `tile`, keys 32 half .. 32 half + 31: [k step 2 half, 2 half + 1][4].
  __device__ __forceinline__ void load(const uint8_t* raw, int tile, int half, uint32_t (&first)[4],
                                       uint32_t (&second)[4]) const {
    uint32_t matrices[4];
    load_raw(raw, tile, half, matrices);
    widen(matrices, first, second);
  }
  // The same in two steps, so that a caller can issue the shared-memory load before it waits for
  // the wgmma that still reads the fragments' registers: the e4m3 bytes ...
  __device__ __forceinline__ void load_raw(const uint8_t* raw, int tile, int half, uint32_t (&matrices)[4]) const {
    static_assert(transposed_value_dim(0, 2, 0) - transposed_value_dim(0, 0, 0) == kWideRawBoxDims,
                  "tiles 2, 3 are tiles 0, 1 one raw block on");
    // (Tiles 2, 3: the next raw block of the part; keys 32 .. 63: 4 key groups on.)
    load_transposed_matrices_x4(raw + offset[tile % 2] + (tile / 2) * (RawTileParts::block_start(1) - RawTileParts::block_start(0)) +
                                    half * 4 * RawTileParts::group_stride(0),
                                matrices);
  }
  // ... and their widening into the fragments.
  __device__ __forceinline__ static void widen(const uint32_t (&matrices)[4], uint32_t (&first)[4], uint32_t (&second)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t(&fragment)[4] = j < 2 ? first : second;
      const uint32_t paired = __byte_perm(matrices[j], 0, 0x3120);  // (dim 2 g: keys k, k + 1), (dim 2 g + 1: ...)
      fragment[2 * (j % 2)] = widen_fp8_pair(paired);
      fragment[2 * (j % 2) + 1] = widen_fp8_pair_high(paired);
    }
  }
};

}  // namespace openmla::kernels::sm90
