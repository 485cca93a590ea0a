// openmla-bench: what a case file needs to describe a workload in a few lines. A case builds
// one op's params struct per input copy (OwnedParams keeps the device tensors its views point
// into alive), and rotated_launcher turns that into a Launcher that cycles through the copies.
// CUDA builds only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include "bench.h"
#include "device_data.h"

namespace openmla::bench {

template <typename Params>
struct OwnedParams {
  Params params{};
  std::vector<DeviceTensor> tensors;
  uint64_t seed;

  // Each copy draws different random values.
  explicit OwnedParams(int copy) : seed(1000 * uint64_t(copy) + 1) {}

  // An input of uniform random values in [low, high).
  TensorView random(DType dtype, std::initializer_list<int64_t> shape, float low = -1.0f,
                    float high = 1.0f) {
    return keep(DeviceTensor(dtype, shape).fill_uniform(seed++, low, high));
  }
  // An int32 input with the given contents.
  TensorView upload(const std::vector<int32_t>& values, std::initializer_list<int64_t> shape) {
    return keep(DeviceTensor(DType::kInt32, shape).upload(values));
  }
  // A cache of random tokens in the 656-byte ds_mla layout.
  TensorView ds_mla_tokens(std::initializer_list<int64_t> shape) {
    return keep(DeviceTensor(DType::kUInt8, shape).fill_ds_mla_tokens(seed++));
  }
  // An output: every byte the op reads of it, it wrote first, so its contents do not matter.
  TensorView output(DType dtype, std::initializer_list<int64_t> shape) {
    return keep(DeviceTensor(dtype, shape));
  }

 private:
  TensorView keep(const DeviceTensor& tensor) {
    tensors.push_back(tensor);
    return tensor.view();
  }
};

// make(copy) -> OwnedParams<Params> builds the inputs of one copy (seeded by copy so that the
// copies differ); op is the public API function that the launcher calls on them.
template <typename Params, typename Make>
Launcher rotated_launcher(double bytes_per_copy, Make make, void (*op)(const Params&)) {
  auto copies = std::make_shared<std::vector<OwnedParams<Params>>>();
  const int count = rotation_copies(bytes_per_copy);
  for (int copy = 0; copy < count; ++copy) copies->push_back(make(copy));
  Launcher launcher;
  launcher.copies = count;
  launcher.run = [copies, op](int copy, Stream stream) {
    Params params = (*copies)[size_t(copy)].params;
    params.stream = stream;
    op(params);
  };
  return launcher;
}

// Pages 0..pages-1 in a random order: caches are never laid out in request order in an engine.
inline std::vector<int32_t> shuffled_pages(int64_t pages, uint64_t seed) {
  std::vector<int32_t> order(size_t(pages), 0);
  for (int64_t page = 0; page < pages; ++page) order[size_t(page)] = int32_t(page);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

}  // namespace openmla::bench
