// numerics.h conversions against brute-force rounding (nearest representable value found by
// search, ties to the even code), exhaustive where the format is small, and the ds_mla layout
// round trip (write_kv_cache then gather_ds_mla_cache).
#include <cfloat>

#include "test_support.h"

namespace openmla {
namespace {

using namespace openmla::testing;

// Floats spread over every binade: random bit patterns, plus values near the fp8 range.
std::vector<float> random_floats(std::mt19937_64& rng, size_t count) {
  std::vector<float> values;
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<double> log_magnitude(-14.0, 10.0);
  while (values.size() < count) {
    float from_bits = bits_float(bits(rng));
    if (!std::isnan(from_bits)) values.push_back(from_bits);
    float sign = (bits(rng) & 1) ? -1.0f : 1.0f;
    values.push_back(sign * float(std::exp2(log_magnitude(rng))));
  }
  return values;
}

TEST(Numerics, Fp8AllCodesRoundTrip) {
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    float value = fp8_e4m3_to_float(uint8_t(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(float_to_fp8_e4m3(value), code) << "code " << code << " value " << value;
    EXPECT_EQ(brute_force_fp8(value), code) << "code " << code << " value " << value;
    ++checked;
  }
  EXPECT_EQ(checked, 254);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0.001953125f);  // smallest subnormal, 2^-9
}

TEST(Numerics, Bf16AndFp16AllCodesRoundTrip) {
  for (uint32_t code = 0; code < 65536; ++code) {
    float bf16 = bf16_to_float(uint16_t(code));
    float fp16 = fp16_to_float(uint16_t(code));
    if (std::isnan(bf16)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bf16)))) << code;
    } else {
      ASSERT_EQ(float_to_bf16(bf16), code) << "bf16 code " << code;
    }
    if (std::isnan(fp16)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(fp16)))) << code;
    } else {
      ASSERT_EQ(float_to_fp16(fp16), code) << "fp16 code " << code;
      ASSERT_EQ(brute_force_fp16(fp16), code) << "fp16 code " << code;
    }
  }
}

TEST(Numerics, RoundsHalfToEven) {
  // Ties between two representable values go to the even mantissa.
  EXPECT_EQ(float_to_fp8_e4m3(1.0f + 1.0f / 16), float_to_fp8_e4m3(1.0f));         // 1.0625 -> 1
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(1.0f + 3.0f / 16)), 1.25f);         // -> 1.25
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(std::ldexp(1.0f, -10))), 0.0f);     // half step
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(std::ldexp(3.0f, -10))), std::ldexp(2.0f, -9));
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(3.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + std::ldexp(3.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  // fp16 subnormal tie: 2^-25 is half the smallest subnormal.
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 2);
}

TEST(Numerics, Fp8SaturatesAt448) {
  for (float value : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 1e6f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(float_to_fp8_e4m3(value), 0x7e) << value;
    EXPECT_EQ(float_to_fp8_e4m3(-value), 0xfe) << value;
  }
  EXPECT_EQ(float_to_fp8_e4m3(NAN), 0x7f);
  // NaNs take the GPU instructions' canonical encodings, whatever their sign and payload.
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffa12345u}) {
    EXPECT_EQ(float_to_fp8_e4m3(bits_float(nan)), 0x7f) << std::hex << nan;
    EXPECT_EQ(float_to_bf16(bits_float(nan)), 0x7fff) << std::hex << nan;
    EXPECT_EQ(float_to_fp16(bits_float(nan)), 0x7fff) << std::hex << nan;
  }
  EXPECT_EQ(float_bits(fp8_e4m3_to_float(0xff)), 0x7fffffffu);
  EXPECT_EQ(float_bits(fp16_to_float(0xfe01)), 0x7fffffffu);
  EXPECT_EQ(float_bits(fp16_to_float(0xfc00)), 0xff800000u);  // -inf keeps its sign
  EXPECT_EQ(float_bits(bf16_to_float(0xffc1)), 0xffc10000u);  // a widening: bits kept
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(432.0f)), 448.0f);  // tie 416|448 -> even 448
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(431.0f)), 416.0f);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the fp16 overflow tie rounds to infinity
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
}

TEST(Numerics, ConversionsMatchBruteForceOnRandomFloats) {
  auto rng = make_rng();
  std::vector<float> values = random_floats(rng, 400000);
  // Subnormal and boundary values of every format.
  for (int k = 0; k < 64; ++k) {
    for (float base : {std::ldexp(1.0f, -9), std::ldexp(1.0f, -24), std::ldexp(1.0f, -133)}) {
      values.push_back(base * float(k) * 0.25f);
      values.push_back(-base * float(k) * 0.25f);
    }
  }
  for (float value : {0.0f, -0.0f, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY,
                      std::ldexp(1.0f, -6), std::ldexp(0.9375f, -6), 65504.0f, 65505.0f}) {
    values.push_back(value);
  }
  for (float value : values) {
    ASSERT_EQ(float_to_fp8_e4m3(value), brute_force_fp8(value)) << value;
    ASSERT_EQ(float_to_bf16(value), brute_force_bf16(value)) << value;
    ASSERT_EQ(float_to_fp16(value), brute_force_fp16(value)) << value;
  }
}

// write_kv_cache then gather_ds_mla_cache reproduces the latent within the fp8 quantisation
// error of its group and the rope exactly.
TEST(Numerics, DsMlaLayoutRoundTrip) {
  auto rng = make_rng();
  const int64_t tokens = 21, pages = 3, page_size = 8;
  HostTensor kv_c(DType::kBFloat16, {tokens, kLatentDim});
  HostTensor k_pe(DType::kBFloat16, {tokens, kRopeDim});
  fill_uniform(kv_c, rng, -3.0, 3.0);
  fill_uniform(k_pe, rng, -3.0, 3.0);
  for (int64_t i = 0; i < kDsMlaGroupSize; ++i) kv_c.set(2 * kLatentDim + i, 0.0);  // all-zero group
  for (int64_t i = 0; i < kDsMlaGroupSize; ++i) kv_c.set(3 * kLatentDim + 128 + i, 1e-30 * (i + 1));
  HostTensor slots(DType::kInt32, {tokens});
  for (int64_t t = 0; t < tokens; ++t) slots.data<int32_t>()[t] = int32_t((t * 5 + 2) % (pages * page_size));
  HostTensor cache(DType::kUInt8, {pages, page_size, kDsMlaBytesPerToken});
  poison(cache);
  WriteKvCacheParams write;
  write.kv_c = kv_c.view();
  write.k_pe = k_pe.view();
  write.slot_mapping = slots.view();
  write.kv_cache = cache.view();
  write_kv_cache(write);

  HostTensor block_table(DType::kInt32, {1, pages});
  for (int64_t p = 0; p < pages; ++p) block_table.data<int32_t>()[p] = int32_t(p);
  HostTensor cu_seq_lens(DType::kInt32, {2});
  cu_seq_lens.data<int32_t>()[0] = 0;
  cu_seq_lens.data<int32_t>()[1] = int32_t(pages * page_size);
  HostTensor gathered(DType::kBFloat16, {pages * page_size, kHeadDim});
  poison(gathered);
  GatherDsMlaCacheParams gather;
  gather.kv_cache = cache.view();
  gather.block_table = block_table.view();
  gather.cu_seq_lens = cu_seq_lens.view();
  gather.out = gathered.view();
  gather_ds_mla_cache(gather);

  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t row = slots.data<int32_t>()[t];
    for (int group = 0; group < kDsMlaGroups; ++group) {
      double amax = 0;
      for (int i = 0; i < kDsMlaGroupSize; ++i) {
        amax = std::max(amax, std::fabs(kv_c.get(t * kLatentDim + group * kDsMlaGroupSize + i)));
      }
      const double scale = std::max(amax / 448.0, double(FLT_MIN));
      for (int i = group * kDsMlaGroupSize; i < (group + 1) * kDsMlaGroupSize; ++i) {
        double expected = kv_c.get(t * kLatentDim + i);
        double actual = gathered.get(row * kHeadDim + i);
        // fp8: half a step of a 3-bit mantissa (2^-4 relative) or of the subnormal spacing
        // (2^-10 * scale); then bf16 rounding of the result (2^-8 relative).
        double bound = std::fabs(expected) * (0.0625 + 0.0040) + scale * std::ldexp(1.0, -10);
        ASSERT_LE(std::fabs(actual - expected), bound) << "token " << t << " value " << i;
      }
    }
    for (int i = 0; i < kRopeDim; ++i) {
      ASSERT_EQ(gathered.data<uint16_t>()[row * kHeadDim + kLatentDim + i],
                k_pe.data<uint16_t>()[t * kRopeDim + i]);
    }
  }
}

}  // namespace
}  // namespace openmla
