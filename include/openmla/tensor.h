// openmla: the one tensor view every operation takes.
//
// A TensorView is a non-owning description of memory that the caller owns: a pointer, an
// element type, a shape, strides in elements, and the device the memory lives on. Every op
// reads its arguments through views, so the same API serves C++ engines (raw pointers),
// Python (torch tensors) and the tests. Host-only header: it needs no CUDA toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace openmla {

enum class DType : int32_t {
  kFloat32,
  kFloat64,
  kBFloat16,
  kFloat16,
  kFloat8E4M3,  // float8_e4m3fn: no infinities, 0x7f/0xff are NaN, max finite 448
  kInt32,
  kInt64,
  kUInt8,
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

enum class DeviceType : int32_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};
std::string device_name(Device device);

// CUDA stream as an opaque handle (a cudaStream_t), so that this header needs no CUDA.
using Stream = void*;

constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int rank = -1;  // -1: absent (an optional argument that was not given)
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};  // in elements, not bytes
  Device device{};

  // A view with row-major (contiguous) strides.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  // A view with explicit strides (in elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = {});

  bool present() const { return rank >= 0; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + rank : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  bool is_cuda() const { return device.type == DeviceType::kCUDA; }
  std::string shape_string() const;  // e.g. "[4, 64, 576]"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace openmla
