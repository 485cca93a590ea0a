// Dense MLA decode, FP8 cache: the wgmma A fragments of V^T read straight from the raw e4m3 key
// tile and widened to fp16 in registers, for the narrow kernel's O^T = V^T P^T
// (narrow_kernel.cuh; its S^T = K Q^T runs on e4m3 wgmma from the raw tile, fp8_tiles.cuh). No
// 16-bit copy of the tile is ever written to shared memory: widening through shared memory
// (read 36 KB, write 72 KB, then wgmma reads the 72 KB) serialised with the math and held the
// FP8 cache below the BF16 speed.
//
// Raw tile: as the TMA lands it with the 64-byte swizzle, 9 blocks (64 dims each) of
// [64 keys][64 bytes], the 16-byte chunk c of key k stored at chunk c ^ ((k / 2) % 4). The
// swizzle is what makes the value loads (4 keys x 8 dim words per warp) fall on 32 distinct
// banks.
//
// V^T fragments (O^T: M = dims, k = keys). A thread needs 2 dims x 4 keys per fragment; it loads
// 4 keys x 4 consecutive dims as 32-bit words and pairs the keys with byte permutes, so one load
// batch feeds two M tiles. M row 16 w + g (+ 8) of M tile 2 p + h (w: warp, g = lane / 4) is
// dim 128 p + 32 w + 4 g + 2 h (+ 1), and k column j of k step s is key 16 s + j with bits 0
// and 1 of j swapped (value_column_of_key): P^T is stored in that key order.
#pragma once

#include "kernels/sm90/dense_decode/key_tiles.cuh"

namespace openmla::kernels::sm90 {

constexpr int kRawBlockBytes = kTileKeys * 64;  // 64 keys x 64 dims of e4m3

// Byte offset of (line, dim) in an e4m3 tile of kLines lines stored as 9 blocks of [kLines][64
// bytes] with the 64-byte swizzle: a raw key tile as the TMA lands it (64 lines), or Q as an
// e4m3 operand (fp8_tiles.cuh load_e4m3_query_rows).
template <int kLines = kTileKeys>
__host__ __device__ constexpr int raw_fp8_offset(int line, int dim) {
  return (dim / 64) * (kLines * 64) + line * 64 + ((((dim % 64) / 16) ^ ((line / 2) % 4)) * 16) + dim % 16;
}

// The k column of P^T (and of the V^T fragments) that holds tile key `key`; its own inverse.
__host__ __device__ constexpr int value_column_of_key(int key) {
  return (key & ~3) | ((key & 1) << 1) | ((key >> 1) & 1);
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

// A thread's place in the V^T fragments.
struct ValueFragmentReader {
  int even, odd;  // offsets for keys with (key / 2) even or odd: the swizzle XOR differs by 1
  __device__ __forceinline__ ValueFragmentReader(int warp, int lane) {
    const int g = lane / 4, q = lane % 4;
    const int key_offset = q % 2 + 4 * (q / 2);             // the key of column 2q (bits 0, 1 swapped)
    const int chunk = (2 * (warp % 2) + g / 4) ^ (2 * (q / 2));  // dims 32 (w % 2) + 4 g, swizzled
    const int base = (warp / 2) * kRawBlockBytes + key_offset * 64 + 4 * (g % 4);
    even = base + chunk * 16;
    odd = base + (chunk ^ 1) * 16;
  }
  // The fp16 A fragments of M tiles 2 pair and 2 pair + 1 (dims 128 pair ..) for k step `step`
  // (keys 16 step ..).
  __device__ __forceinline__ void load(const uint8_t* raw, int pair, int step, uint32_t (&first)[4],
                                       uint32_t (&second)[4]) const {
    uint32_t words[4];  // [i]: 4 dims of key 16 step + 8 (i / 2) + 2 (i % 2) + key_offset
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int offset = 2 * pair * kRawBlockBytes + (16 * step + 8 * (i / 2) + 2 * (i % 2)) * 64;
      words[i] = *reinterpret_cast<const uint32_t*>(raw + offset + (i % 2 == 0 ? even : odd));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t(&fragment)[4] = half == 0 ? first : second;
      // Byte 2 half (+ 1) of two keys' words side by side: (dim, key a), (dim, key b), ...
      const uint32_t selector = half == 0 ? 0x5140u : 0x7362u;
      const uint32_t columns_low = __byte_perm(words[0], words[1], selector);   // columns 2q, 2q + 1
      const uint32_t columns_high = __byte_perm(words[2], words[3], selector);  // columns 2q + 8, + 9
      fragment[0] = widen_fp8_pair(columns_low);         // dim row g
      fragment[1] = widen_fp8_pair_high(columns_low);   // dim row g + 8
      fragment[2] = widen_fp8_pair(columns_high);
      fragment[3] = widen_fp8_pair_high(columns_high);
    }
  }
};

// The dim that O^T accumulator row `row` (0..63) of M tile `tile` holds (see above).
__host__ __device__ constexpr int value_dim_of_row(int tile, int row) {
  return 128 * (tile / 2) + 32 * (row / 16) + 4 * (row % 8) + 2 * (tile % 2) + (row / 8) % 2;
}

// The 64-row kernel with an FP8 cache (alternating_kernel.cuh, kRawKeys) computes O^T = V^T P^T: each
// consumer warpgroup owns 256 of the 512 value dims as 4 M tiles of 64 (wgmma m64n64k16 in fp16,
// N = the 64 query rows, B = P^T: P as the softmax stores it, [row][key], K-major), so that V^T
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
  int offset[2];  // key line `lane`, M tiles 0 / 1 (tiles 2, 3: one raw block on; keys 32 h ..: + 32 h lines)

  __device__ __forceinline__ WideValueFragments(int warpgroup, int warp, int lane) {
#pragma unroll
    for (int m = 0; m < 2; ++m) offset[m] = wide_raw_offset(lane, transposed_value_dim(warpgroup, m, 16 * warp));
  }
  // The fragments of M tile `tile`, keys 32 half .. 32 half + 31: [k step 2 half, 2 half + 1][4].
  __device__ __forceinline__ void load(const uint8_t* raw, int tile, int half, uint32_t (&first)[4],
                                       uint32_t (&second)[4]) const {
    static_assert(transposed_value_dim(0, 2, 0) - transposed_value_dim(0, 0, 0) == kWideRawBoxDims,
                  "tiles 2, 3 are tiles 0, 1 one raw block on");
    uint32_t matrices[4];
    load_transposed_matrices_x4(raw + offset[tile % 2] + (tile / 2) * kWideRawBlockBytes + half * 32 * 128, matrices);
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
