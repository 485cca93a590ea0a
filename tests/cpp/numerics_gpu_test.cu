// The device conversions of src/kernels/generic/convert.cuh (hardware cvt instructions)
// against the host functions of numerics.h, bit for bit: every fp8 code (in both bytes of a
// pair), every bf16 and fp16 code decoded, and the encoders on every bf16/fp16 value widened
// to float plus ~4M floats over all binades (subnormals, ties of each format, the +-448
// saturation boundary, +-inf, NaNs of both signs and several payloads).
#include <cfloat>

#include "kernels/generic/convert.cuh"
#include "test_support.h"

namespace openmla {
namespace {

using namespace openmla::testing;

// Thread i decodes the 16-bit code i as fp16, as bf16, and as a pair of fp8 codes.
__global__ void decode_codes_kernel(float* from_fp16, float* from_bf16, float* from_fp8_low,
                                    float* from_fp8_high) {
  const int code = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (code >= 65536) return;
  from_fp16[code] = kernels::fp16_to_float_device(uint16_t(code));
  from_bf16[code] = kernels::bf16_to_float_device(uint16_t(code));
  const float2 pair = kernels::floats_from_fp8x2(uint32_t(code));
  from_fp8_low[code] = pair.x;
  from_fp8_high[code] = pair.y;
}

// Thread i encodes floats 2i and 2i + 1 with each paired instruction.
__global__ void encode_floats_kernel(const float* values, int64_t pairs, uint16_t* to_fp8x2,
                                     uint32_t* to_bf16x2, uint32_t* to_fp16x2) {
  const int64_t pair = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair >= pairs) return;
  const float first = values[2 * pair], second = values[2 * pair + 1];
  to_fp8x2[pair] = uint16_t(kernels::fp8x2_from_floats(first, second));
  to_bf16x2[pair] = kernels::bf16x2_from_floats(first, second);
  to_fp16x2[pair] = kernels::fp16x2_from_floats(first, second);
}

void expect_same_float_bits(const HostTensor& device, int64_t i, float host, const char* what) {
  const uint32_t device_bits = device.data<uint32_t>()[i];
  ASSERT_EQ(device_bits, float_bits(host)) << what << " of code " << i;
}

TEST(NumericsGpu, DecodersMatchHostOnEveryCode) {
  OPENMLA_REQUIRE_GPU();
  HostTensor fp16(DType::kFloat32, {65536}), bf16(DType::kFloat32, {65536}),
      fp8_low(DType::kFloat32, {65536}), fp8_high(DType::kFloat32, {65536});
  for (HostTensor* tensor : {&fp16, &bf16, &fp8_low, &fp8_high}) poison(*tensor);
  DeviceTensor fp16_device(fp16), bf16_device(bf16), low_device(fp8_low), high_device(fp8_high);
  decode_codes_kernel<<<65536 / 256, 256>>>(
      static_cast<float*>(fp16_device.pointer), static_cast<float*>(bf16_device.pointer),
      static_cast<float*>(low_device.pointer), static_cast<float*>(high_device.pointer));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  fp16_device.copy_to(fp16);
  bf16_device.copy_to(bf16);
  low_device.copy_to(fp8_low);
  high_device.copy_to(fp8_high);
  for (int64_t code = 0; code < 65536; ++code) {
    expect_same_float_bits(fp16, code, fp16_to_float(uint16_t(code)), "fp16 -> float");
    expect_same_float_bits(bf16, code, bf16_to_float(uint16_t(code)), "bf16 -> float");
    expect_same_float_bits(fp8_low, code, fp8_e4m3_to_float(uint8_t(code)), "fp8 (low byte) -> float");
    expect_same_float_bits(fp8_high, code, fp8_e4m3_to_float(uint8_t(code >> 8)), "fp8 (high byte) -> float");
  }
}

// The encoder inputs: every bf16 and fp16 value, each format's rounding ties and their float
// neighbours, the fp8 saturation boundary, specials, then random floats up to `count`.
std::vector<float> encoder_inputs(std::mt19937_64& rng, size_t count) {
  std::vector<float> values;
  auto with_neighbours = [&](float value) {
    values.push_back(value);
    values.push_back(-value);
    values.push_back(std::nextafter(value, 0.0f));
    values.push_back(std::nextafter(value, INFINITY));
  };
  for (uint32_t code = 0; code < 65536; ++code) {
    values.push_back(bf16_to_float(uint16_t(code)));
    values.push_back(fp16_to_float(uint16_t(code)));
    // Midpoints between neighbouring codes: the round-half-even ties.
    if ((code & 0x7fff) < 0x7f80) with_neighbours(bits_float((code << 16) | 0x8000u));
    float fp16 = fp16_to_float(uint16_t(code)), next = fp16_to_float(uint16_t(code + 1));
    if ((code & 0x7fff) < 0x7bff) with_neighbours(float((double(fp16) + double(next)) / 2));
  }
  for (int code = 0; code < 0x7e; ++code) {
    with_neighbours(float((double(fp8_e4m3_to_float(uint8_t(code))) +
                           double(fp8_e4m3_to_float(uint8_t(code + 1)))) / 2));
  }
  for (float value : {448.0f, 456.0f, 464.0f, 472.0f, 479.99f, 480.0f, 496.0f, 512.0f, 1e6f,
                      65504.0f, 65520.0f, FLT_MAX, INFINITY, FLT_MIN, std::ldexp(1.0f, -149),
                      std::ldexp(1.0f, -6), std::ldexp(1.0f, -9), std::ldexp(1.0f, -10),
                      std::ldexp(3.0f, -11), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), 0.0f}) {
    with_neighbours(value);
  }
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu,
                       0xffffffffu, 0x7fa12345u, 0xffd54321u}) {
    values.push_back(bits_float(nan));
  }
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<double> log_magnitude(-30.0, 20.0);
  while (values.size() < count) {
    values.push_back(bits_float(bits(rng)));  // every exponent, subnormals and NaNs included
    const float sign = (bits(rng) & 1) ? -1.0f : 1.0f;
    values.push_back(sign * float(std::exp2(log_magnitude(rng))));  // dense near the fp8 range
  }
  if (values.size() % 2) values.push_back(1.0f);
  return values;
}

TEST(NumericsGpu, EncodersMatchHostOnMillionsOfFloats) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const std::vector<float> values = encoder_inputs(rng, size_t(1) << 22);
  const int64_t pairs = int64_t(values.size() / 2);
  HostTensor inputs(DType::kFloat32, {int64_t(values.size())});
  std::memcpy(inputs.bytes.data(), values.data(), values.size() * sizeof(float));
  HostTensor to_fp8(DType::kUInt8, {2 * pairs}), to_bf16(DType::kBFloat16, {2 * pairs}),
      to_fp16(DType::kFloat16, {2 * pairs});
  for (HostTensor* tensor : {&to_fp8, &to_bf16, &to_fp16}) poison(*tensor);
  DeviceTensor inputs_device(inputs), fp8_device(to_fp8), bf16_device(to_bf16), fp16_device(to_fp16);
  encode_floats_kernel<<<unsigned((pairs + 255) / 256), 256>>>(
      static_cast<const float*>(inputs_device.pointer), pairs,
      static_cast<uint16_t*>(fp8_device.pointer), static_cast<uint32_t*>(bf16_device.pointer),
      static_cast<uint32_t*>(fp16_device.pointer));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  fp8_device.copy_to(to_fp8);
  bf16_device.copy_to(to_bf16);
  fp16_device.copy_to(to_fp16);
  for (size_t i = 0; i < values.size(); ++i) {
    const float value = values[i];
    ASSERT_EQ(int(to_fp8.data<uint8_t>()[i]), int(float_to_fp8_e4m3(value)))
        << "fp8 of " << value << " (bits " << std::hex << float_bits(value) << ")";
    ASSERT_EQ(int(to_bf16.data<uint16_t>()[i]), int(float_to_bf16(value)))
        << "bf16 of " << value << " (bits " << std::hex << float_bits(value) << ")";
    ASSERT_EQ(int(to_fp16.data<uint16_t>()[i]), int(float_to_fp16(value)))
        << "fp16 of " << value << " (bits " << std::hex << float_bits(value) << ")";
  }
}

}  // namespace
}  // namespace openmla
