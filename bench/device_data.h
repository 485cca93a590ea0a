// openmla-bench: owning device tensors with random contents (never zeros), so that every
// timed call works on realistic data. CUDA builds only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "openmla/tensor.h"

namespace openmla::bench {

// A contiguous device tensor on the current CUDA device that owns its memory. Copies share
// the memory (a shared_ptr), so launch lambdas can capture tensors by value.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::initializer_list<int64_t> shape);

  const TensorView& view() const { return view_; }
  size_t bytes() const { return size_t(view_.numel()) * dtype_size(view_.dtype); }

  // Uniform random values in [low, high), rounded to the dtype (float dtypes only).
  DeviceTensor& fill_uniform(uint64_t seed, float low = -1.0f, float high = 1.0f);
  // Host values copied in (int32 tensors: slot maps, block tables, indices).
  DeviceTensor& upload(const std::vector<int32_t>& values);
  // Random tokens of the 656-byte ds_mla layout: fp8 latent values, positive group scales,
  // bf16 rope. The tensor's last dimension must be 656 (uint8 or float8_e4m3).
  DeviceTensor& fill_ds_mla_tokens(uint64_t seed);

 private:
  std::shared_ptr<void> memory_;
  TensorView view_;
};

// Launches of the fill kernels (device_data.cu); stream 0, synchronous for the caller.
void launch_fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, float low,
                         float high);
void launch_fill_ds_mla_tokens(uint8_t* data, int64_t tokens, uint64_t seed);

}  // namespace openmla::bench
