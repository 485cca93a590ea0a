// merge_attention: out = w_a out_a + w_b out_b with w = exp(lse - max) / sum, lse = max +
// log(sum), for two partial attention results [T, H, D] (bf16 / fp16 / fp32) and their LSEs
// (any strides). The arithmetic is lse_merge_math.h, shared with the CPU reference; 16-bit
// conversions are hardware instructions (convert.cuh).
// Tiling: a (t, h) row is cut into 8-element segments (16-bit: one 16-byte access per input
// and output; fp32: two) and shared by ceil(segments / 4) consecutive threads; thread j of a
// row takes segments j, j + G, j + 2G, j + 3G (G threads per row), so each of its accesses is
// coalesced with its neighbours'. The weight math (~60 flops) runs once per 32 elements.
// Pipeline: a thread issues its two LSE loads and all its data loads of both sides together,
// before the weights are known; a side of weight 0 (LSE -inf) is read like any other (its
// buffer is readable) but its values are then ignored by a select, not multiplied by 0, so a
// NaN there cannot reach the output.
// Limits: any D; a segment shorter than 8 (D % 8 != 0) uses scalar accesses, and unaligned
// rows take the byte-access fallback of vector_access.cuh.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/lse_merge_math.h"
#include "kernels/generic/convert.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kSegment = 8;
constexpr int kSegmentsPerThread = 4;

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
  int64_t threads_per_row;  // ceil(segments_per_row / kSegmentsPerThread)
  bool base2;
};

// One segment's raw bytes: 8 elements, 16 bytes (16-bit types) or 32 bytes (fp32).
template <DType kElement>
struct RawSegment {
  static constexpr int kChunks = kElement == DType::kFloat32 ? 2 : 1;
  uint4 chunks[kChunks];
};

template <DType kElement>
__device__ __forceinline__ RawSegment<kElement> load_segment(const uint8_t* address) {
  RawSegment<kElement> raw;
#pragma unroll
  for (int c = 0; c < RawSegment<kElement>::kChunks; ++c) raw.chunks[c] = load_chunk(address + c * kChunkBytes);
  return raw;
}

template <DType kElement>
__device__ __forceinline__ float segment_value(const RawSegment<kElement>& raw, int i) {
  if constexpr (kElement == DType::kFloat32) return bits_float(chunk_word(raw.chunks[i / 4], i % 4));
  return half_to_float<kElement == DType::kFloat16>(chunk_half(raw.chunks[0], i));
}

template <DType kElement>
__device__ __forceinline__ float load_element(const uint8_t* row, int64_t i) {
  if constexpr (kElement == DType::kFloat32) return reinterpret_cast<const float*>(row)[i];
  return half_to_float<kElement == DType::kFloat16>(reinterpret_cast<const uint16_t*>(row)[i]);
}

template <DType kElement>
__device__ __forceinline__ void store_element(uint8_t* row, int64_t i, float value) {
  if constexpr (kElement == DType::kFloat32) {
    reinterpret_cast<float*>(row)[i] = value;
  } else {
    reinterpret_cast<uint16_t*>(row)[i] = uint16_t(halves_from_floats<kElement == DType::kFloat16>(value, 0.0f));
  }
}

template <DType kElement>
__device__ __forceinline__ void store_segment(uint8_t* address, const float (&values)[kSegment]) {
  if constexpr (kElement == DType::kFloat32) {
    store_chunk(address, make_uint4(float_bits(values[0]), float_bits(values[1]),
                                    float_bits(values[2]), float_bits(values[3])));
    store_chunk(address + kChunkBytes, make_uint4(float_bits(values[4]), float_bits(values[5]),
                                                  float_bits(values[6]), float_bits(values[7])));
  } else {
    constexpr bool kFp16 = kElement == DType::kFloat16;
    store_chunk(address, make_uint4(halves_from_floats<kFp16>(values[0], values[1]),
                                    halves_from_floats<kFp16>(values[2], values[3]),
                                    halves_from_floats<kFp16>(values[4], values[5]),
                                    halves_from_floats<kFp16>(values[6], values[7])));
  }
}

// A value of a side is used only where that side's weight is non-zero: a select, so that a NaN
// in an ignored output cannot propagate (0 * NaN would).
__device__ __forceinline__ float merged(const merge_math::MergeWeights& weights, float a, float b) {
  return merge_math::merge_value(weights, weights.a != 0.0f ? a : 0.0f, weights.b != 0.0f ? b : 0.0f);
}

template <DType kElement>
__global__ void __launch_bounds__(kThreads) merge_attention_kernel(MergeArgs args) {
  constexpr int kElementBytes = kElement == DType::kFloat32 ? 4 : 2;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = item / args.threads_per_row;
  if (row >= args.rows) return;
  const int64_t part = item % args.threads_per_row;
  const int64_t token = row / args.heads;
  const int64_t head = row % args.heads;

  const float lse_a = args.lse_a[token * args.lse_a_token + head * args.lse_a_head];
  const float lse_b = args.lse_b[token * args.lse_b_token + head * args.lse_b_head];
  const uint8_t* row_a = args.out_a + token * args.out_a_token + head * args.out_a_head;
  const uint8_t* row_b = args.out_b + token * args.out_b_token + head * args.out_b_head;
  uint8_t* row_out = args.out + token * args.out_token + head * args.out_head;

  // Issue every data load before the weights exist: they do not depend on them.
  RawSegment<kElement> raw_a[kSegmentsPerThread], raw_b[kSegmentsPerThread];
  int64_t firsts[kSegmentsPerThread];
  bool full[kSegmentsPerThread];
#pragma unroll
  for (int s = 0; s < kSegmentsPerThread; ++s) {
    const int64_t segment = part + s * args.threads_per_row;
    firsts[s] = segment * kSegment;
    full[s] = segment < args.segments_per_row && firsts[s] + kSegment <= args.dim;
    if (full[s]) {
      raw_a[s] = load_segment<kElement>(row_a + firsts[s] * kElementBytes);
      raw_b[s] = load_segment<kElement>(row_b + firsts[s] * kElementBytes);
    }
  }

  const merge_math::MergeWeights weights = merge_math::merge_weights(lse_a, lse_b, args.base2);
  if (part == 0 && args.lse != nullptr) {
    args.lse[token * args.lse_token + head * args.lse_head] = weights.lse;
  }
#pragma unroll
  for (int s = 0; s < kSegmentsPerThread; ++s) {
    if (full[s]) {
      float values[kSegment];
#pragma unroll
      for (int i = 0; i < kSegment; ++i) {
        values[i] = merged(weights, segment_value<kElement>(raw_a[s], i), segment_value<kElement>(raw_b[s], i));
      }
      store_segment<kElement>(row_out + firsts[s] * kElementBytes, values);
    } else if (firsts[s] < args.dim) {  // the last, short segment of a row (D % 8 != 0)
      for (int64_t i = firsts[s]; i < args.dim; ++i) {
        store_element<kElement>(row_out, i, merged(weights, load_element<kElement>(row_a, i),
                                                   load_element<kElement>(row_b, i)));
      }
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
  // D = 0 still writes the merged LSE: one (empty) segment, one thread per row.
  args.segments_per_row = dim > 0 ? (dim + kSegment - 1) / kSegment : 1;
  args.threads_per_row = (args.segments_per_row + kSegmentsPerThread - 1) / kSegmentsPerThread;
  args.base2 = params.lse_base == LseBase::kBase2;
  const unsigned blocks = blocks_for(args.rows * args.threads_per_row, kThreads);
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
