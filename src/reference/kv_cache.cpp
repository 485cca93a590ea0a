// CPU reference of the KV-cache utilities (include/openmla/kv_cache.h). These ops are data
// movement and rounding, not accumulation: each value is computed in float exactly as the CUDA
// kernels do (numerics.h conversions; quantisation multiplies by the float reciprocal of the
// scale, rounded once), so GPU tests compare bytes.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/generic/lse_merge_math.h"
#include "reference/reference.h"
#include "reference/tensor_access.h"

namespace openmla::reference {

namespace {

uint8_t* byte_address(const TensorView& view, int64_t element_offset) {
  return static_cast<uint8_t*>(view.data) + element_offset * int64_t(dtype_size(view.dtype));
}

// A 16-bit float element as float (bf16 or fp16, per dtype).
float load_half(const TensorView& view, int64_t offset) {
  uint16_t bits = view.ptr<const uint16_t>()[offset];
  return view.dtype == DType::kFloat16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

// A 16-bit float element as bf16 bits: a bf16 input is copied as is (NaN payloads included).
uint16_t load_as_bf16(const TensorView& view, int64_t offset) {
  uint16_t bits = view.ptr<const uint16_t>()[offset];
  return view.dtype == DType::kFloat16 ? float_to_bf16(fp16_to_float(bits)) : bits;
}

}  // namespace

void write_kv_cache(const WriteKvCacheParams& params) {
  const TensorView& cache = params.kv_cache;
  const int64_t page_size = cache.size(1);
  const bool bf16_cache = cache.dtype == DType::kBFloat16;
  const bool fp8_cache = !bf16_cache && cache.size(2) == kHeadDim;
  parallel_for(params.kv_c.size(0), [&](int64_t t) {
    int64_t slot = load_index(params.slot_mapping, t * params.slot_mapping.stride(0));
    if (slot < 0) return;
    uint8_t* token = byte_address(cache, (slot / page_size) * cache.stride(0) +
                                             (slot % page_size) * cache.stride(1));
    auto input_offset = [&](int64_t i, const TensorView*& source) {
      source = i < kLatentDim ? &params.kv_c : &params.k_pe;
      int64_t column = i < kLatentDim ? i : i - kLatentDim;
      return t * source->stride(0) + column;
    };
    if (bf16_cache) {
      uint16_t* values = reinterpret_cast<uint16_t*>(token);
      for (int64_t i = 0; i < kHeadDim; ++i) {
        const TensorView* source;
        int64_t offset = input_offset(i, source);
        values[i] = source->ptr<const uint16_t>()[offset];
      }
    } else if (fp8_cache) {
      const float inverse_scale = 1.0f / params.scale;
      for (int64_t i = 0; i < kHeadDim; ++i) {
        const TensorView* source;
        int64_t offset = input_offset(i, source);
        token[i] = float_to_fp8_e4m3(load_half(*source, offset) * inverse_scale);
      }
    } else {  // ds_mla: 512 fp8 | 4 float32 group scales | 64 bf16 rope
      const int64_t row = t * params.kv_c.stride(0);
      for (int group = 0; group < kDsMlaGroups; ++group) {
        float amax = 0.0f;
        for (int i = group * kDsMlaGroupSize; i < (group + 1) * kDsMlaGroupSize; ++i) {
          amax = std::fmax(amax, std::fabs(load_half(params.kv_c, row + i)));
        }
        float scale = std::fmax(amax / kFp8E4M3Max, FLT_MIN);
        std::memcpy(token + kDsMlaScaleOffset + 4 * group, &scale, 4);
        const float inverse_scale = 1.0f / scale;
        for (int i = group * kDsMlaGroupSize; i < (group + 1) * kDsMlaGroupSize; ++i) {
          token[i] = float_to_fp8_e4m3(load_half(params.kv_c, row + i) * inverse_scale);
        }
      }
      for (int i = 0; i < kRopeDim; ++i) {
        uint16_t rope = load_as_bf16(params.k_pe, t * params.k_pe.stride(0) + i);
        std::memcpy(token + kDsMlaRopeOffset + 2 * i, &rope, 2);
      }
    }
  });
}

void gather_ds_mla_cache(const GatherDsMlaCacheParams& params) {
  const TensorView& cache = params.kv_cache;
  const TensorView& lengths = params.cu_seq_lens;
  const int64_t page_size = cache.size(1);
  const int64_t batch = params.block_table.size(0);
  parallel_for(batch, [&](int64_t b) {
    int64_t begin = lengths.ptr<const int32_t>()[b * lengths.stride(0)];
    int64_t end = lengths.ptr<const int32_t>()[(b + 1) * lengths.stride(0)];
    for (int64_t i = 0; i < end - begin; ++i) {
      int64_t page = params.block_table.ptr<const int32_t>()[offset_of(
          params.block_table, {b, i / page_size})];
      const uint8_t* token =
          byte_address(cache, page * cache.stride(0) + (i % page_size) * cache.stride(1));
      uint16_t* out = params.out.ptr<uint16_t>() + (begin + i) * params.out.stride(0);
      for (int group = 0; group < kDsMlaGroups; ++group) {
        float scale;
        std::memcpy(&scale, token + kDsMlaScaleOffset + 4 * group, 4);
        for (int j = group * kDsMlaGroupSize; j < (group + 1) * kDsMlaGroupSize; ++j) {
          out[j] = float_to_bf16(fp8_e4m3_to_float(token[j]) * scale);
        }
      }
      std::memcpy(out + kLatentDim, token + kDsMlaRopeOffset, kRopeDim * 2);
    }
  });
}

void convert_topk_indices(const ConvertTopkIndicesParams& params) {
  const TensorView& local = params.local_indices;
  const TensorView& table = params.block_table;
  const int64_t topk = local.size(1);
  const int64_t capacity = table.size(1) * params.page_size;
  parallel_for(local.size(0), [&](int64_t t) {
    int64_t valid = topk;
    if (params.topk_length.present()) {
      valid = params.topk_length.ptr<const int32_t>()[t * params.topk_length.stride(0)];
    }
    int64_t request = params.request_ids.ptr<const int32_t>()[t * params.request_ids.stride(0)];
    int32_t* out = params.global_indices.ptr<int32_t>() + t * params.global_indices.stride(0);
    const int32_t* positions = local.ptr<const int32_t>() + t * local.stride(0);
    for (int64_t j = 0; j < topk; ++j) {
      int64_t position = positions[j];
      if (j >= valid || position < 0 || position >= capacity) {
        out[j] = -1;
        continue;
      }
      int64_t page = table.ptr<const int32_t>()[offset_of(table, {request, position / params.page_size})];
      out[j] = int32_t(page * params.page_size + position % params.page_size);
    }
  });
}

void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params) {
  const int64_t heads = params.k_nope.size(1);
  const bool shared_rope = params.k_pe.size(1) == 1;
  constexpr int64_t kNope = 128, kRope = 64, kValue = 128;
  const float k_inverse = 1.0f / params.k_scale, v_inverse = 1.0f / params.v_scale;
  parallel_for(params.k_nope.size(0), [&](int64_t t) {
    for (int64_t h = 0; h < heads; ++h) {
      uint8_t* k_out = params.k_out.ptr<uint8_t>() + offset_of(params.k_out, {t, h, 0});
      uint8_t* v_out = params.v_out.ptr<uint8_t>() + offset_of(params.v_out, {t, h, 0});
      int64_t nope = offset_of(params.k_nope, {t, h, 0});
      int64_t rope = offset_of(params.k_pe, {t, shared_rope ? 0 : h, 0});
      int64_t value = offset_of(params.v, {t, h, 0});
      for (int64_t i = 0; i < kNope; ++i) {
        k_out[i] = float_to_fp8_e4m3(load_half(params.k_nope, nope + i) * k_inverse);
      }
      for (int64_t i = 0; i < kRope; ++i) {
        k_out[kNope + i] = float_to_fp8_e4m3(load_half(params.k_pe, rope + i) * k_inverse);
      }
      for (int64_t i = 0; i < kValue; ++i) {
        v_out[i] = float_to_fp8_e4m3(load_half(params.v, value + i) * v_inverse);
      }
    }
  });
}

void merge_attention(const MergeAttentionParams& params) {
  const int64_t heads = params.out_a.size(1);
  const int64_t dim = params.out_a.size(2);
  const bool base2 = params.lse_base == LseBase::kBase2;
  parallel_for(params.out_a.size(0), [&](int64_t t) {
    for (int64_t h = 0; h < heads; ++h) {
      float lse_a = params.lse_a.ptr<const float>()[offset_of(params.lse_a, {t, h})];
      float lse_b = params.lse_b.ptr<const float>()[offset_of(params.lse_b, {t, h})];
      merge_math::MergeWeights weights = merge_math::merge_weights(lse_a, lse_b, base2);
      int64_t a = offset_of(params.out_a, {t, h, 0});
      int64_t b = offset_of(params.out_b, {t, h, 0});
      int64_t out = offset_of(params.out, {t, h, 0});
      for (int64_t i = 0; i < dim; ++i) {
        float value_a = weights.a != 0.0f ? float(load(params.out_a, a + i)) : 0.0f;
        float value_b = weights.b != 0.0f ? float(load(params.out_b, b + i)) : 0.0f;
        store(params.out, out + i, merge_math::merge_value(weights, value_a, value_b));
      }
      if (params.lse.present()) {
        params.lse.ptr<float>()[offset_of(params.lse, {t, h})] = weights.lse;
      }
    }
  });
}

}  // namespace openmla::reference
