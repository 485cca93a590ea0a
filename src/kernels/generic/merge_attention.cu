// merge_attention: out = w_a out_a + w_b out_b with w = exp(lse - max) / sum, lse = max +
// log(sum), for two partial attention results [T, H, D] (bf16 / fp16 / fp32) and their LSEs
// (any strides). The arithmetic is lse_merge_math.h, shared with the CPU reference.
// Tiling: one thread per 8 consecutive elements of a (t, h) row (16-bit: one 16-byte load per
// input and one store; fp32: two), consecutive threads on consecutive segments; each thread
// reads its row's two LSEs (cached broadcast loads) and computes the weights itself, which
// costs ~60 flops per 8 elements, far below the memory time.
// Pipeline: both inputs' loads are issued before the stores; a side with weight 0 (LSE -inf)
// is not loaded at all.
// Limits: any D; a segment shorter than 8 (D % 8 != 0) uses scalar accesses, and unaligned
// rows take the byte-access fallback of vector_access.cuh.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/lse_merge_math.h"
#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kSegment = 8;

struct MergeArgs {
  const uint8_t* out_a;
  int64_t out_a_token, out_a_head;  // strides in bytes
  const uint8_t* out_b;
  int64_t out_b_token, out_b_head;
  uint8_t* out;
  int64_t out_token, out_head;
  const float* lse_a;
  int64_t lse_a_token, lse_a_head;  // strides in elements
  const float* lse_b;
  int64_t lse_b_token, lse_b_head;
  float* lse;  // null when not requested
  int64_t lse_token, lse_head;
  int64_t heads;
  int64_t rows;  // tokens * heads
  int64_t dim;
  int64_t segments_per_row;
  bool base2;
};

template <DType kElement>
__device__ __forceinline__ float load_element(const uint8_t* row, int64_t i) {
  if constexpr (kElement == DType::kFloat32) return reinterpret_cast<const float*>(row)[i];
  uint16_t bits = reinterpret_cast<const uint16_t*>(row)[i];
  return half_to_float<kElement == DType::kFloat16>(bits);
}

template <DType kElement>
__device__ __forceinline__ uint32_t element_bits(float value) {
  if constexpr (kElement == DType::kFloat32) return float_bits(value);
  if constexpr (kElement == DType::kFloat16) return float_to_fp16(value);
  return float_to_bf16(value);
}

template <DType kElement>
__device__ __forceinline__ void store_element(uint8_t* row, int64_t i, float value) {
  if constexpr (kElement == DType::kFloat32) {
    reinterpret_cast<float*>(row)[i] = value;
  } else {
    reinterpret_cast<uint16_t*>(row)[i] = uint16_t(element_bits<kElement>(value));
  }
}

template <DType kElement>
__device__ __forceinline__ void load_segment(const uint8_t* address, float (&values)[kSegment]) {
  if constexpr (kElement == DType::kFloat32) {
    uint4 first = load_chunk(address), second = load_chunk(address + kChunkBytes);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      values[w] = bits_float(chunk_word(first, w));
      values[4 + w] = bits_float(chunk_word(second, w));
    }
  } else {
    uint4 chunk = load_chunk(address);
#pragma unroll
    for (int i = 0; i < kSegment; ++i) {
      values[i] = half_to_float<kElement == DType::kFloat16>(chunk_half(chunk, i));
    }
  }
}

template <DType kElement>
__device__ __forceinline__ void store_segment(uint8_t* address, const float (&values)[kSegment]) {
  uint32_t bits[kSegment];
#pragma unroll
  for (int i = 0; i < kSegment; ++i) bits[i] = element_bits<kElement>(values[i]);
  if constexpr (kElement == DType::kFloat32) {
    store_chunk(address, make_uint4(bits[0], bits[1], bits[2], bits[3]));
    store_chunk(address + kChunkBytes, make_uint4(bits[4], bits[5], bits[6], bits[7]));
  } else {
    store_chunk(address, make_uint4(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16,
                                    bits[4] | bits[5] << 16, bits[6] | bits[7] << 16));
  }
}

template <DType kElement>
__global__ void __launch_bounds__(kThreads) merge_attention_kernel(MergeArgs args) {
  constexpr int kElementBytes = kElement == DType::kFloat32 ? 4 : 2;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = item / args.segments_per_row;
  if (row >= args.rows) return;
  const int64_t first = (item % args.segments_per_row) * kSegment;
  const int64_t token = row / args.heads;
  const int64_t head = row % args.heads;

  const float lse_a = args.lse_a[token * args.lse_a_token + head * args.lse_a_head];
  const float lse_b = args.lse_b[token * args.lse_b_token + head * args.lse_b_head];
  const merge_math::MergeWeights weights = merge_math::merge_weights(lse_a, lse_b, args.base2);
  if (first == 0 && args.lse != nullptr) {
    args.lse[token * args.lse_token + head * args.lse_head] = weights.lse;
  }
  const int64_t offset = first * kElementBytes;
  const uint8_t* in_a = args.out_a + token * args.out_a_token + head * args.out_a_head + offset;
  const uint8_t* in_b = args.out_b + token * args.out_b_token + head * args.out_b_head + offset;
  uint8_t* out = args.out + token * args.out_token + head * args.out_head + offset;

  const int64_t count = args.dim - first < kSegment ? args.dim - first : kSegment;
  float values_a[kSegment] = {}, values_b[kSegment] = {};
  if (count == kSegment) {
    if (weights.a != 0.0f) load_segment<kElement>(in_a, values_a);
    if (weights.b != 0.0f) load_segment<kElement>(in_b, values_b);
#pragma unroll
    for (int i = 0; i < kSegment; ++i) {
      values_a[i] = merge_math::merge_value(weights, values_a[i], values_b[i]);
    }
    store_segment<kElement>(out, values_a);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      float value_a = weights.a != 0.0f ? load_element<kElement>(in_a, i) : 0.0f;
      float value_b = weights.b != 0.0f ? load_element<kElement>(in_b, i) : 0.0f;
      store_element<kElement>(out, i, merge_math::merge_value(weights, value_a, value_b));
    }
  }
}

}  // namespace

void merge_attention(const MergeAttentionParams& params) {
  const int64_t tokens = params.out_a.size(0);
  const int64_t heads = params.out_a.size(1);
  const int64_t dim = params.out_a.size(2);
  if (tokens == 0 || heads == 0) return;
  const int64_t element_bytes = int64_t(dtype_size(params.out_a.dtype));
  MergeArgs args;
  args.out_a = params.out_a.ptr<const uint8_t>();
  args.out_a_token = params.out_a.stride(0) * element_bytes;
  args.out_a_head = params.out_a.stride(1) * element_bytes;
  args.out_b = params.out_b.ptr<const uint8_t>();
  args.out_b_token = params.out_b.stride(0) * element_bytes;
  args.out_b_head = params.out_b.stride(1) * element_bytes;
  args.out = params.out.ptr<uint8_t>();
  args.out_token = params.out.stride(0) * element_bytes;
  args.out_head = params.out.stride(1) * element_bytes;
  args.lse_a = params.lse_a.ptr<const float>();
  args.lse_a_token = params.lse_a.stride(0);
  args.lse_a_head = params.lse_a.stride(1);
  args.lse_b = params.lse_b.ptr<const float>();
  args.lse_b_token = params.lse_b.stride(0);
  args.lse_b_head = params.lse_b.stride(1);
  args.lse = params.lse.present() ? params.lse.ptr<float>() : nullptr;
  args.lse_token = params.lse.present() ? params.lse.stride(0) : 0;
  args.lse_head = params.lse.present() ? params.lse.stride(1) : 0;
  args.heads = heads;
  args.rows = tokens * heads;
  args.dim = dim;
  // D = 0 still writes the merged LSE: one (empty) segment per row.
  args.segments_per_row = dim > 0 ? (dim + kSegment - 1) / kSegment : 1;
  args.base2 = params.lse_base == LseBase::kBase2;
  const unsigned blocks = blocks_for(args.rows * args.segments_per_row, kThreads);
  cudaStream_t stream = as_cuda_stream(params.stream);
  switch (params.out_a.dtype) {
    case DType::kFloat32:
      merge_attention_kernel<DType::kFloat32><<<blocks, kThreads, 0, stream>>>(args);
      break;
    case DType::kFloat16:
      merge_attention_kernel<DType::kFloat16><<<blocks, kThreads, 0, stream>>>(args);
      break;
    default:
      merge_attention_kernel<DType::kBFloat16><<<blocks, kThreads, 0, stream>>>(args);
      break;
  }
  check_launch("merge_attention");
}

}  // namespace openmla::kernels
