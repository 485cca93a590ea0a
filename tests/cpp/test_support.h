// The one C++ test harness: owning host/device tensors, random fills, poison, and the
// comparisons every test uses. GPU tests call OPENMLA_REQUIRE_GPU() first, which skips the
// test cleanly where no GPU (or no CUDA build) is present.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "openmla/openmla.h"

#if OPENMLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace openmla::testing {

// A contiguous host tensor that owns its bytes; view() describes it to the API.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view_;

  HostTensor() = default;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
    view_ = TensorView::contiguous(nullptr, dtype, shape);
    bytes.resize(size_t(view_.numel()) * dtype_size(dtype) + 1);  // +1: never a null pointer
    view_.data = bytes.data();
  }
  const TensorView& view() const { return view_; }
  int64_t numel() const { return view_.numel(); }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(bytes.data()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(bytes.data()); }

  // Element i (flat, contiguous order) as double / set from double (rounded to the dtype).
  double get(int64_t i) const;
  void set(int64_t i, double value);
};

inline double HostTensor::get(int64_t i) const {
  const uint8_t* base = bytes.data();
  switch (view_.dtype) {
    case DType::kFloat32: return reinterpret_cast<const float*>(base)[i];
    case DType::kFloat64: return reinterpret_cast<const double*>(base)[i];
    case DType::kBFloat16: return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3: return fp8_e4m3_to_float(base[i]);
    case DType::kInt32: return reinterpret_cast<const int32_t*>(base)[i];
    case DType::kInt64: return double(reinterpret_cast<const int64_t*>(base)[i]);
    case DType::kUInt8: return base[i];
  }
  return 0;
}

inline void HostTensor::set(int64_t i, double value) {
  uint8_t* base = bytes.data();
  float narrowed = float(value);
  switch (view_.dtype) {
    case DType::kFloat32: reinterpret_cast<float*>(base)[i] = narrowed; break;
    case DType::kFloat64: reinterpret_cast<double*>(base)[i] = value; break;
    case DType::kBFloat16: reinterpret_cast<uint16_t*>(base)[i] = float_to_bf16(narrowed); break;
    case DType::kFloat16: reinterpret_cast<uint16_t*>(base)[i] = float_to_fp16(narrowed); break;
    case DType::kFloat8E4M3: base[i] = float_to_fp8_e4m3(narrowed); break;
    case DType::kInt32: reinterpret_cast<int32_t*>(base)[i] = int32_t(value); break;
    case DType::kInt64: reinterpret_cast<int64_t*>(base)[i] = int64_t(value); break;
    case DType::kUInt8: base[i] = uint8_t(value); break;
  }
}

// Fresh random inputs for every test (never zeros): the seed comes from the test's name so
// that a failure reproduces, while different tests see different data. OPENMLA_TEST_SEED, where
// set, is mixed in: other draws of the same cases (the margins of a tolerance over many draws).
inline std::mt19937_64 make_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  if (const char* seed = std::getenv("OPENMLA_TEST_SEED")) name += std::string("#") + seed;
  return std::mt19937_64(std::hash<std::string>{}(name));
}

inline void fill_uniform(HostTensor& tensor, std::mt19937_64& rng, double low = -1.0,
                         double high = 1.0) {
  std::uniform_real_distribution<double> dist(low, high);
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.set(i, dist(rng));
}

inline void fill_bytes(HostTensor& tensor, uint8_t value) {
  std::memset(tensor.bytes.data(), value, tensor.bytes.size());
}

// Poison: NaN for floats (0xff bytes are NaN in every float dtype we use), 0xff.. for ints.
inline void poison(HostTensor& tensor) { fill_bytes(tensor, 0xff); }

// ||actual - expected|| / ||expected|| over all elements (Frobenius); NaN if any NaN appears.
inline double relative_error(const std::vector<double>& actual, const std::vector<double>& expected) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i]) || std::isnan(expected[i])) return NAN;
    double d = actual[i] - expected[i];
    diff += d * d;
    norm += expected[i] * expected[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline std::vector<double> to_doubles(const HostTensor& tensor) {
  std::vector<double> values(size_t(tensor.numel()));
  for (int64_t i = 0; i < tensor.numel(); ++i) values[size_t(i)] = tensor.get(i);
  return values;
}

// Expects fn() to throw openmla::Error of kind InvalidArgument naming `argument`.
template <typename Fn>
void expect_invalid_argument(Fn&& fn, const std::string& argument) {
  try {
    fn();
    ADD_FAILURE() << "expected an openmla::Error naming '" << argument << "', got no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), argument) << error.what();
    EXPECT_NE(std::string(error.what()).find("'" + argument + "'"), std::string::npos)
        << error.what();
  }
}

// ---- Brute-force rounding, independent of numerics.h ------------------------------------------
// Each format's positive codes in increasing order, decoded from the format's definition; the
// rounding of a value is the nearest entry, ties to the even code.
inline std::vector<double> positive_code_values(int mantissa_bits, int exponent_bias, uint32_t last_code) {
  std::vector<double> values;
  for (uint32_t code = 0; code <= last_code; ++code) {
    int exponent = int(code >> mantissa_bits);
    double mantissa = double(code & ((1u << mantissa_bits) - 1)) / double(1u << mantissa_bits);
    values.push_back(exponent == 0 ? std::ldexp(mantissa, 1 - exponent_bias)
                                   : std::ldexp(1.0 + mantissa, exponent - exponent_bias));
  }
  return values;
}
inline uint32_t nearest_code(const std::vector<double>& values, double magnitude) {
  size_t above = size_t(std::lower_bound(values.begin(), values.end(), magnitude) - values.begin());
  if (above == values.size()) return uint32_t(values.size() - 1);  // saturate
  if (values[above] == magnitude || above == 0) return uint32_t(above);
  double down = magnitude - values[above - 1], up = values[above] - magnitude;
  if (down != up) return uint32_t(down < up ? above - 1 : above);
  return uint32_t(above % 2 == 0 ? above : above - 1);
}
// float8_e4m3fn, saturating at 448 (code 0x7e); NaN -> 0x7f.
inline uint8_t brute_force_fp8(float value) {
  static const std::vector<double> values = positive_code_values(3, 7, 0x7e);
  if (std::isnan(value)) return 0x7f;
  return uint8_t((std::signbit(value) ? 0x80 : 0) | nearest_code(values, std::fabs(double(value))));
}
// bfloat16 / float16 with overflow to infinity (the last code); value must not be NaN.
inline uint16_t brute_force_bf16(double value) {
  static const std::vector<double> values = positive_code_values(7, 127, 0x7f80);
  return uint16_t((std::signbit(value) ? 0x8000 : 0) | nearest_code(values, std::fabs(value)));
}
inline uint16_t brute_force_fp16(double value) {
  static const std::vector<double> values = positive_code_values(10, 15, 0x7c00);
  return uint16_t((std::signbit(value) ? 0x8000 : 0) | nearest_code(values, std::fabs(value)));
}

// A strided view into a host tensor's bytes: shape and strides in elements, offset in elements.
inline TensorView strided_view(HostTensor& tensor, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, int64_t offset = 0) {
  return TensorView::strided(tensor.bytes.data() + offset * int64_t(dtype_size(tensor.view().dtype)),
                             tensor.view().dtype, shape, strides);
}

// ---- GPU side ------------------------------------------------------------------------------
inline bool gpu_available() { return cuda_available(); }

#define OPENMLA_REQUIRE_GPU()                                           \
  do {                                                                  \
    if (!::openmla::testing::gpu_available()) GTEST_SKIP() << "no GPU"; \
  } while (0)

#if OPENMLA_WITH_CUDA
// A device copy of a HostTensor, with the same shape; view() is on cuda:0.
struct DeviceTensor {
  void* pointer = nullptr;
  size_t byte_count = 0;
  TensorView view_;

  explicit DeviceTensor(const HostTensor& host) {
    byte_count = host.bytes.size();
    EXPECT_EQ(cudaMalloc(&pointer, byte_count), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(pointer, host.bytes.data(), byte_count, cudaMemcpyHostToDevice),
              cudaSuccess);
    view_ = host.view();
    view_.data = pointer;
    view_.device = Device{DeviceType::kCUDA, 0};
  }
  // A device tensor of `shape` with every byte `fill` (0xff: poison), never staged through
  // host memory (for large scratch buffers).
  DeviceTensor(DType dtype, std::initializer_list<int64_t> shape, uint8_t fill) {
    view_ = TensorView::contiguous(nullptr, dtype, shape, Device{DeviceType::kCUDA, 0});
    byte_count = size_t(view_.numel()) * dtype_size(dtype) + 1;  // +1: never a null pointer
    EXPECT_EQ(cudaMalloc(&pointer, byte_count), cudaSuccess);
    EXPECT_EQ(cudaMemset(pointer, fill, byte_count), cudaSuccess);
    view_.data = pointer;
  }
  ~DeviceTensor() { cudaFree(pointer); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  const TensorView& view() const { return view_; }
  // Overwrites the device bytes with `host`'s (same size), e.g. new inputs for a graph replay.
  void copy_from(const HostTensor& host) const {
    ASSERT_EQ(host.bytes.size(), byte_count);
    EXPECT_EQ(cudaMemcpy(pointer, host.bytes.data(), byte_count, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // `host_view` (a view into `host`'s bytes, e.g. strided_view) moved onto this device copy.
  TensorView relocate(const HostTensor& host, TensorView host_view) const {
    host_view.data = static_cast<uint8_t*>(pointer) +
                     (static_cast<const uint8_t*>(host_view.data) - host.bytes.data());
    host_view.device = view_.device;
    return host_view;
  }
  // Copies the device bytes back into `host` (same size), after synchronising.
  void copy_to(HostTensor& host) const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.bytes.data(), pointer, byte_count, cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
};

// Launches into `stream` a kernel that lets the next grid start at once (PDL), waits `delay_us`,
// then copies each source's bytes onto its destination (late_writer.cu): inputs that the
// previous kernel writes while a PDL-launched op's prologue already runs.
void launch_late_copies(const DeviceTensor& source_a, const DeviceTensor& destination_a, const DeviceTensor& source_b,
                        const DeviceTensor& destination_b, int delay_us, cudaStream_t stream);
#endif

}  // namespace openmla::testing
