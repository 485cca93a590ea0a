// Device number conversions of the generic kernels, each one hardware instruction (sm_89+:
// cvt.rn.satfinite.e4m3x2.f32, cvt.rn.f16x2.e4m3x2; sm_80+: cvt.rn.bf16x2.f32,
// cvt.rn.f16x2.f32, cvt.f32.f16) that equals the host functions of openmla/numerics.h bit for
// bit, NaN encodings included (numerics.h produces the hardware's canonical NaNs;
// tests/cpp/numerics_gpu_test.cu checks every code and millions of floats). The cuda_fp8.h
// intrinsics fall back to an exact software emulation on the compute_80 PTX path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

// Two floats -> two fp8 e4m3 codes (first in the low byte), satfinite, NaN -> 0x7f.
__device__ __forceinline__ uint32_t fp8x2_from_floats(float first, float second) {
  return __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float fp16_to_float_device(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float bf16_to_float_device(uint16_t bits) {
  return bits_float(uint32_t(bits) << 16);  // exact: bf16 is the top half of a float
}

// Two fp8 e4m3 codes (low byte first) -> two floats; through fp16, which holds every e4m3
// value exactly.
__device__ __forceinline__ float2 floats_from_fp8x2(uint32_t pair) {
  __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  return make_float2(fp16_to_float_device(halves.x), fp16_to_float_device(halves.y));
}

// Two floats -> a packed pair of bf16 / fp16 (first in the low half), round to nearest even.
// (The pair's register as it is: one F2FP. Assembled from its two halves with shifts and ORs,
// ptxas kept a PRMT and a LOP3 beside it in some kernels.)
__device__ __forceinline__ uint32_t bf16x2_from_floats(float first, float second) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
__device__ __forceinline__ uint32_t fp16x2_from_floats(float first, float second) {
  const __half2 pair = __floats2half2_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// A 16-bit float (bf16 or fp16) as float, and two floats as a packed 16-bit pair.
template <bool kFp16>
__device__ __forceinline__ float half_to_float(uint16_t bits) {
  return kFp16 ? fp16_to_float_device(bits) : bf16_to_float_device(bits);
}
template <bool kFp16>
__device__ __forceinline__ uint32_t halves_from_floats(float first, float second) {
  return kFp16 ? fp16x2_from_floats(first, second) : bf16x2_from_floats(first, second);
}

// One 32-bit word of two 16-bit floats -> four fp8 bytes' worth: the two low bytes of the
// result hold fp8(first * inverse_scale), fp8(second * inverse_scale). __fmul_rn: the product
// is rounded to float before the conversion, as on the host.
template <bool kFp16>
__device__ __forceinline__ uint32_t quantize_pair(uint32_t word, float inverse_scale) {
  return fp8x2_from_floats(__fmul_rn(half_to_float<kFp16>(uint16_t(word)), inverse_scale),
                           __fmul_rn(half_to_float<kFp16>(uint16_t(word >> 16)), inverse_scale));
}

// 8 halves (one chunk) -> 8 fp8 bytes of x * inverse_scale.
template <bool kFp16>
__device__ __forceinline__ uint2 quantize_8(const uint4& chunk, float inverse_scale) {
  return make_uint2(quantize_pair<kFp16>(chunk.x, inverse_scale) |
                        quantize_pair<kFp16>(chunk.y, inverse_scale) << 16,
                    quantize_pair<kFp16>(chunk.z, inverse_scale) |
                        quantize_pair<kFp16>(chunk.w, inverse_scale) << 16);
}

// 16 halves (two chunks, in order) -> 16 fp8 bytes of x * inverse_scale.
template <bool kFp16>
__device__ __forceinline__ uint4 quantize_16(const uint4& low, const uint4& high, float inverse_scale) {
  uint2 first = quantize_8<kFp16>(low, inverse_scale), second = quantize_8<kFp16>(high, inverse_scale);
  return make_uint4(first.x, first.y, second.x, second.y);
}

}  // namespace openmla::kernels
