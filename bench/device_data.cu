// openmla-bench: random device data without curand. Each element's value is a hash of
// (seed, element index), so fills are reproducible, independent of the launch shape, and
// cost one pass of memory bandwidth. Grid-stride loops; conversions from openmla/numerics.h
// so the bench rounds exactly as the library does.
#include <cuda_runtime.h>

#include <cstring>

#include "device_data.h"
#include "kernels/cuda_check.h"
#include "openmla/numerics.h"

namespace openmla::bench {

namespace {

constexpr const char* kOp = "openmla-bench";

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 24 bits of the hash (exact in float).
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t index) {
  return float(splitmix64(seed * 0x100000001b3ull ^ index) >> 40) * (1.0f / 16777216.0f);
}

__global__ void fill_uniform_kernel(void* data, DType dtype, int64_t count, uint64_t seed,
                                    float low, float high) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    float value = low + (high - low) * uniform01(seed, uint64_t(i));
    switch (dtype) {
      case DType::kFloat32: static_cast<float*>(data)[i] = value; break;
      case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = float_to_bf16(value); break;
      case DType::kFloat16: static_cast<uint16_t*>(data)[i] = float_to_fp16(value); break;
      case DType::kFloat8E4M3: static_cast<uint8_t*>(data)[i] = float_to_fp8_e4m3(value); break;
      default: break;  // the host side rejects other dtypes
    }
  }
}

// One thread per 4-byte word of a token, so that every store is a full word.
__global__ void fill_ds_mla_tokens_kernel(uint8_t* data, int64_t tokens, uint64_t seed) {
  constexpr int kWordsPerToken = kDsMlaBytesPerToken / 4;
  const int64_t words = tokens * kWordsPerToken;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int byte = int(w % kWordsPerToken) * 4;
    uint32_t word = 0;
    if (byte < kDsMlaScaleOffset) {
      // Latent values already divided by their group scale: spread over the fp8 range.
      for (int k = 0; k < 4; ++k) {
        float value = (2.0f * uniform01(seed, uint64_t(w) * 4 + k) - 1.0f) * kFp8E4M3Max;
        word |= uint32_t(float_to_fp8_e4m3(value)) << (8 * k);
      }
    } else if (byte < kDsMlaRopeOffset) {
      // Group scale = amax / 448 for latent values of magnitude up to ~1..4.
      word = float_bits((0.25f + 0.75f * uniform01(seed, uint64_t(w))) / 112.0f);
    } else {
      for (int k = 0; k < 2; ++k) {
        float value = 2.0f * uniform01(seed, uint64_t(w) * 2 + k) - 1.0f;
        word |= uint32_t(float_to_bf16(value)) << (16 * k);
      }
    }
    reinterpret_cast<uint32_t*>(data)[w] = word;
  }
}

unsigned fill_blocks(int64_t work_items) {
  constexpr int64_t kMaxBlocks = 4096;  // grid-stride: enough to fill any GPU
  int64_t blocks = (work_items + 255) / 256;
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace

void launch_fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, float low,
                         float high) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16 &&
      dtype != DType::kFloat8E4M3) {
    throw Error(ErrorKind::kInvalidArgument, kOp, "dtype",
                std::string("fill_uniform supports float dtypes, got ") + dtype_name(dtype));
  }
  fill_uniform_kernel<<<fill_blocks(count), 256>>>(data, dtype, count, seed, low, high);
  check_launch(kOp);
  check_cuda(cudaDeviceSynchronize(), kOp, "fill_uniform");
}

void launch_fill_ds_mla_tokens(uint8_t* data, int64_t tokens, uint64_t seed) {
  fill_ds_mla_tokens_kernel<<<fill_blocks(tokens * kDsMlaBytesPerToken / 4), 256>>>(data, tokens,
                                                                                     seed);
  check_launch(kOp);
  check_cuda(cudaDeviceSynchronize(), kOp, "fill_ds_mla_tokens");
}

DeviceTensor::DeviceTensor(DType dtype, std::initializer_list<int64_t> shape) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), kOp, "cudaGetDevice");
  view_ = TensorView::contiguous(nullptr, dtype, shape, Device{DeviceType::kCUDA, device});
  void* pointer = nullptr;
  check_cuda(cudaMalloc(&pointer, bytes() + 16), kOp, "cudaMalloc");  // +16: never empty
  memory_ = std::shared_ptr<void>(pointer, [](void* p) { cudaFree(p); });
  view_.data = pointer;
}

DeviceTensor& DeviceTensor::fill_uniform(uint64_t seed, float low, float high) {
  launch_fill_uniform(view_.data, view_.dtype, view_.numel(), seed, low, high);
  return *this;
}

DeviceTensor& DeviceTensor::upload(const std::vector<int32_t>& values) {
  if (view_.dtype != DType::kInt32 || int64_t(values.size()) != view_.numel()) {
    throw Error(ErrorKind::kInvalidArgument, kOp, "values",
                "upload expects an int32 tensor of " + std::to_string(view_.numel()) +
                    " elements, got " + std::to_string(values.size()));
  }
  check_cuda(cudaMemcpy(view_.data, values.data(), bytes(), cudaMemcpyHostToDevice), kOp,
             "cudaMemcpy");
  return *this;
}

DeviceTensor& DeviceTensor::fill_ds_mla_tokens(uint64_t seed) {
  if (view_.size(-1) != kDsMlaBytesPerToken || dtype_size(view_.dtype) != 1) {
    throw Error(ErrorKind::kInvalidArgument, kOp, "tensor",
                "ds_mla tokens need a byte tensor whose last dimension is 656, got " +
                    view_.shape_string());
  }
  launch_fill_ds_mla_tokens(static_cast<uint8_t*>(view_.data), view_.numel() / kDsMlaBytesPerToken,
                            seed);
  return *this;
}

}  // namespace openmla::bench
