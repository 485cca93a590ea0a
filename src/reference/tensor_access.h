// Element access for the CPU reference: read any floating dtype as double, write doubles
// back rounded like the GPU kernels (numerics.h), and walk strided views.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "openmla/numerics.h"
#include "openmla/tensor.h"

namespace openmla::reference {

// Offset in elements of index (i0, i1, ...) in a strided view.
inline int64_t offset_of(const TensorView& view, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int dim = 0;
  for (int64_t i : index) offset += i * view.strides[dim++];
  return offset;
}

inline double load(const TensorView& view, int64_t offset) {
  const char* base = static_cast<const char*>(view.data);
  switch (view.dtype) {
    case DType::kFloat32: return reinterpret_cast<const float*>(base)[offset];
    case DType::kFloat64: return reinterpret_cast<const double*>(base)[offset];
    case DType::kBFloat16: return bf16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kFloat16: return fp16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]);
    case DType::kFloat8E4M3:
      return fp8_e4m3_to_float(reinterpret_cast<const uint8_t*>(base)[offset]);
    case DType::kInt32: return reinterpret_cast<const int32_t*>(base)[offset];
    case DType::kInt64: return double(reinterpret_cast<const int64_t*>(base)[offset]);
    case DType::kUInt8: return reinterpret_cast<const uint8_t*>(base)[offset];
  }
  return 0;
}

inline int64_t load_index(const TensorView& view, int64_t offset) {
  if (view.dtype == DType::kInt64) return view.ptr<const int64_t>()[offset];
  return view.ptr<const int32_t>()[offset];
}

// Stores value rounded to the view's dtype (float -> bf16/fp16/fp8 round to nearest even,
// fp8 saturating), the same rounding the kernels use.
inline void store(const TensorView& view, int64_t offset, double value) {
  char* base = static_cast<char*>(view.data);
  float narrowed = float(value);
  switch (view.dtype) {
    case DType::kFloat32: reinterpret_cast<float*>(base)[offset] = narrowed; break;
    case DType::kFloat64: reinterpret_cast<double*>(base)[offset] = value; break;
    case DType::kBFloat16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_bf16(narrowed); break;
    case DType::kFloat16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_fp16(narrowed); break;
    case DType::kFloat8E4M3:
      reinterpret_cast<uint8_t*>(base)[offset] = float_to_fp8_e4m3(narrowed);
      break;
    case DType::kInt32: reinterpret_cast<int32_t*>(base)[offset] = int32_t(value); break;
    case DType::kInt64: reinterpret_cast<int64_t*>(base)[offset] = int64_t(value); break;
    case DType::kUInt8: reinterpret_cast<uint8_t*>(base)[offset] = uint8_t(value); break;
  }
}

// Runs body(i) for i in [0, count) on all hardware threads; items are independent.
template <typename Body>
void parallel_for(int64_t count, Body&& body) {
  int64_t threads = std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads));
  for (int64_t worker = 0; worker < threads; ++worker) {
    pool.emplace_back([&, worker] {
      for (int64_t i = worker; i < count; i += threads) body(i);
    });
  }
  for (auto& thread : pool) thread.join();
}

}  // namespace openmla::reference
