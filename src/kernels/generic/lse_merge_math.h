// The arithmetic of merge_attention, shared by the CUDA kernel and the CPU reference so that
// both produce the same bits. Host-only compilers can include it (no CUDA needed).
//
// Why not expf/logf: libm and CUDA's math library differ in the last bit. Why mul_rn and
// friends: nvcc fuses a*b+c into one fma (one rounding) where the host compiler rounds twice,
// so every product that feeds a sum is rounded explicitly, and every fused multiply-add is
// written as fmaf. Only IEEE-rounded operations remain (add, mul, div, fma, rint).
#pragma once

#include <cmath>

#include "openmla/numerics.h"

namespace openmla::merge_math {

OPENMLA_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

OPENMLA_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

constexpr float kLog2E = 1.44269504088896341f;

// 2^x for x <= 0, exactly 1 at x = 0 (the larger LSE's weight); 0 for x < -150, -inf and NaN.
OPENMLA_HOST_DEVICE float exp2_nonpositive(float x) {
  if (!(x >= -150.0f)) return 0.0f;
  float whole = rintf(x);
  float fraction = x - whole;  // exact, in [-0.5, 0.5]
  // Taylor series of e^(f ln 2) to degree 7: truncation error < 6e-9 on |f| <= 0.5.
  float power = 1.5252733804059840e-5f;
  power = fmaf(power, fraction, 1.5403530393381608e-4f);
  power = fmaf(power, fraction, 1.3333558146428443e-3f);
  power = fmaf(power, fraction, 9.6181291076284772e-3f);
  power = fmaf(power, fraction, 5.5504108664821580e-2f);
  power = fmaf(power, fraction, 2.4022650695910071e-1f);
  power = fmaf(power, fraction, 6.9314718055994531e-1f);
  power = fmaf(power, fraction, 1.0f);
  int exponent = int(whole);  // in [-150, 0]
  if (exponent < -100) {      // keep 2^exponent normal; this first step is exact
    power = mul_rn(power, 0x1p-50f);
    exponent += 50;
  }
  return mul_rn(power, bits_float(uint32_t(exponent + 127) << 23));
}

// ln(s) for s in [1, 2] (a sum of two weights, one of them 1): 2 atanh(z) with
// z = (s - 1) / (s + 1) in [0, 1/3], odd series to z^15 (truncation error < 1e-9).
OPENMLA_HOST_DEVICE float log_one_to_two(float s) {
  float z = div_rn(s - 1.0f, s + 1.0f);
  float z2 = mul_rn(z, z);
  float series = 2.0f / 15.0f;
  series = fmaf(series, z2, 2.0f / 13.0f);
  series = fmaf(series, z2, 2.0f / 11.0f);
  series = fmaf(series, z2, 2.0f / 9.0f);
  series = fmaf(series, z2, 2.0f / 7.0f);
  series = fmaf(series, z2, 2.0f / 5.0f);
  series = fmaf(series, z2, 2.0f / 3.0f);
  series = fmaf(series, z2, 2.0f);
  return mul_rn(series, z);
}

// Normalised weights of the two sides and the merged LSE. A side with weight 0 (LSE -inf, or
// so far below the other that its weight underflows) is never read.
struct MergeWeights {
  float a;
  float b;
  float lse;
};

OPENMLA_HOST_DEVICE MergeWeights merge_weights(float lse_a, float lse_b, bool base2) {
  // A NaN LSE poisons the merge (fmaxf alone would drop it and silently lose that side).
  if (lse_a != lse_a || lse_b != lse_b) return {NAN, NAN, NAN};
  float lse_max = fmaxf(lse_a, lse_b);
  if (!(lse_max > -INFINITY)) return {0.0f, 0.0f, -INFINITY};  // nothing on either side
  float to_base2 = base2 ? 1.0f : kLog2E;
  float weight_a = exp2_nonpositive(mul_rn(lse_a - lse_max, to_base2));
  float weight_b = exp2_nonpositive(mul_rn(lse_b - lse_max, to_base2));
  float sum = weight_a + weight_b;
  float log_sum = log_one_to_two(sum);
  float lse = lse_max + (base2 ? mul_rn(log_sum, kLog2E) : log_sum);
  return {div_rn(weight_a, sum), div_rn(weight_b, sum), lse};
}

// One output element; value_a / value_b are ignored (pass 0) where their weight is 0.
OPENMLA_HOST_DEVICE float merge_value(const MergeWeights& weights, float value_a, float value_b) {
  return fmaf(weights.a, value_a, mul_rn(weights.b, value_b));
}

}  // namespace openmla::merge_math
