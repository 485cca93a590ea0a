// openmla: scalar number formats and the ds_mla cache layout, shared by the CPU reference,
// the CUDA kernels and the tests, so that every side rounds the same way.
//
// Conversions round to nearest, ties to even. float -> FP8 E4M3 saturates to +-448 (the
// "satfinite" mode of Hopper's cvt instruction). This differs from torch's
// Tensor.to(float8_e4m3fn), which turns values beyond 448 into NaN; in range the two agree bit
// for bit.
//
// NaN encodings are those of the GPU's conversion instructions (the kernels use them, and
// tests/cpp/numerics_gpu_test.cu checks the match code by code): every NaN becomes the
// canonical, positive NaN of the target, whatever its sign and payload: 0x7f in fp8 e4m3,
// 0x7fff in bf16 and fp16, 0x7fffffff in float (from fp16 or fp8). bf16 -> float is a plain
// widening and keeps a NaN's bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OPENMLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define OPENMLA_HOST_DEVICE inline
#endif

namespace openmla {

// ---- The ds_mla FP8 cache layout (DeepSeek V3.2 sparse MLA) ------------------------------
// One token is 656 bytes: 512 float8_e4m3 latent values, 4 float32 scales (one per group of
// 128 latent values), then the 64 RoPE values as bfloat16 (not quantised).
constexpr int kLatentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kHeadDim = kLatentDim + kRopeDim;  // 576
constexpr int kDsMlaGroupSize = 128;
constexpr int kDsMlaGroups = kLatentDim / kDsMlaGroupSize;                       // 4
constexpr int kDsMlaScaleOffset = kLatentDim;                                    // bytes
constexpr int kDsMlaRopeOffset = kDsMlaScaleOffset + kDsMlaGroups * 4;           // 528
constexpr int kDsMlaBytesPerToken = kDsMlaRopeOffset + kRopeDim * 2;             // 656
constexpr float kFp8E4M3Max = 448.0f;

OPENMLA_HOST_DEVICE uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  return bits;
}
OPENMLA_HOST_DEVICE float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

// ---- bfloat16 --------------------------------------------------------------------------
OPENMLA_HOST_DEVICE float bf16_to_float(uint16_t value) { return bits_float(uint32_t(value) << 16); }

OPENMLA_HOST_DEVICE uint16_t float_to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // canonical NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

// ---- float16 ---------------------------------------------------------------------------
OPENMLA_HOST_DEVICE float fp16_to_float(uint16_t value) {
  uint32_t sign = uint32_t(value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1f) return bits_float(mantissa != 0 ? 0x7fffffffu : sign | 0x7f800000u);
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-24, exact in float.
    float magnitude = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

OPENMLA_HOST_DEVICE uint16_t float_to_fp16(float value) {
  uint32_t bits = float_bits(value);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7fff;                          // canonical NaN
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);       // rounds to >= 65520: inf
  if (magnitude < 0x38800000u) {                                       // below 2^-14: subnormal
    // In [0.5, 1) the float spacing is 2^-24, one fp16 subnormal step: adding 0.5 makes the
    // float adder round half-even to that step; the low bits are then the fp16 mantissa.
    float scaled = bits_float(magnitude) + 0.5f;
    return uint16_t(sign | (float_bits(scaled) - 0x3f000000u));
  }
  uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

// ---- float8 E4M3 (fn: finite, NaN = 0x7f / 0xff) ---------------------------------------
OPENMLA_HOST_DEVICE float fp8_e4m3_to_float(uint8_t value) {
  uint32_t sign = uint32_t(value & 0x80u) << 24;
  uint32_t exponent = (value >> 3) & 0xfu;
  uint32_t mantissa = value & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return bits_float(0x7fffffffu);  // canonical NaN
  if (exponent == 0) {
    float magnitude = float(mantissa) * 0.001953125f;  // mantissa * 2^-9
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

OPENMLA_HOST_DEVICE uint8_t float_to_fp8_e4m3(float value) {
  uint32_t bits = float_bits(value);
  uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7f;                  // NaN
  if (magnitude >= 0x43e00000u) return uint8_t(sign | 0x7e);  // >= 448 (inf too): saturate
  if (magnitude < 0x3c800000u) {                              // below 2^-6: subnormal range
    // One E4M3 subnormal step is 2^-9: scale by 2^9 (exact), then round half-even to an
    // integer by adding and removing 2^23, where the float spacing is exactly 1.
    float scaled = bits_float(magnitude) * 512.0f;  // exact: power-of-two scaling
    float rounded = (scaled + 8388608.0f) - 8388608.0f;  // round-half-even to an integer
    return uint8_t(sign | uint8_t(rounded));  // 8 (= 2^-6) rolls into the normal encoding
  }
  uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  uint32_t encoded = (rounded - 0x3c000000u) >> 20;  // rebias exponent 127 -> 7
  if (encoded > 0x7e) encoded = 0x7e;
  return uint8_t(sign | encoded);
}

}  // namespace openmla
