// KV-cache utilities: validation and dispatch. The contract is in include/openmla/kv_cache.h.
#include "openmla/kv_cache.h"

#include <cstdint>

#include "dispatch.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "openmla/numerics.h"
#include "reference/reference.h"

namespace openmla {

namespace {

// Pages hold any power-of-two number of tokens; the bound only rejects nonsense.
constexpr int64_t kMaxPageSize = int64_t(1) << 20;

int64_t load_int(const TensorView& view, int64_t index) {
  int64_t offset = index * view.stride(0);
  if (view.dtype == DType::kInt64) return view.ptr<const int64_t>()[offset];
  return view.ptr<const int32_t>()[offset];
}

// A paged cache [pages, page_size, last] (or [pages, page_size, 1, last]) seen as 3-D.
TensorView paged_cache(const ArgumentChecker& check, const char* argument, const TensorView& given) {
  check.required(argument, given);
  TensorView cache = drop_single_head_dim(check, argument, given);
  check.power_of_two(argument, cache.size(1), 1, kMaxPageSize);
  check.last_dim_contiguous(argument, cache);
  return cache;
}

void check_ds_mla_last_dim(const ArgumentChecker& check, const char* argument,
                           const TensorView& cache) {
  if (cache.size(2) != kDsMlaBytesPerToken) {
    check.fail(argument, "expected last dimension 656 (ds_mla: 512 fp8 + 4 float32 scales + "
                         "64 bf16), got " + std::to_string(cache.size(2)));
  }
}

// Host-resident block-table entries that a request of `length` tokens reads must name pages.
void check_pages_in_range(const ArgumentChecker& check, const TensorView& block_table,
                          int64_t request, int64_t length, int64_t page_size, int64_t pages) {
  for (int64_t column = 0; column * page_size < length; ++column) {
    int64_t page = block_table.ptr<const int32_t>()[request * block_table.stride(0) + column];
    if (page < 0 || page >= pages) {
      check.fail("block_table", "expected page ids in [0, " + std::to_string(pages) +
                                    "), got block_table[" + std::to_string(request) + "][" +
                                    std::to_string(column) + "] = " + std::to_string(page));
    }
  }
}

WriteKvCacheParams validate(const ArgumentChecker& check, const WriteKvCacheParams& given) {
  WriteKvCacheParams params = given;
  check.required("kv_c", params.kv_c);
  check.required("k_pe", params.k_pe);
  check.required("slot_mapping", params.slot_mapping);
  params.kv_cache = paged_cache(check, "kv_cache", params.kv_cache);

  const TensorView& cache = params.kv_cache;
  check.dtype("kv_cache", cache, {DType::kBFloat16, DType::kFloat8E4M3, DType::kUInt8});
  const bool bf16_cache = cache.dtype == DType::kBFloat16;
  if (bf16_cache) {
    check.size("kv_cache", cache, 2, kHeadDim, "head dim: 512 latent + 64 rope");
  } else if (cache.dtype == DType::kUInt8) {
    check_ds_mla_last_dim(check, "kv_cache", cache);
  } else if (cache.size(2) != kHeadDim && cache.size(2) != kDsMlaBytesPerToken) {
    check.fail("kv_cache", "expected last dimension 576 (fp8 per-tensor) or 656 (ds_mla) for a "
                           "float8_e4m3 cache, got " + std::to_string(cache.size(2)));
  }
  const bool fp8_per_tensor = cache.dtype == DType::kFloat8E4M3 && cache.size(2) == kHeadDim;

  if (bf16_cache) {
    check.dtype("kv_c", params.kv_c, {DType::kBFloat16});
  } else {
    check.dtype("kv_c", params.kv_c, {DType::kBFloat16, DType::kFloat16});
  }
  check.rank("kv_c", params.kv_c, 2);
  check.size("kv_c", params.kv_c, 1, kLatentDim, "latent dim");
  check.last_dim_contiguous("kv_c", params.kv_c);
  const int64_t tokens = params.kv_c.size(0);
  check.same_dtype("k_pe", params.k_pe, "kv_c", params.kv_c);
  check.rank("k_pe", params.k_pe, 2);
  check.same_size("k_pe", params.k_pe, 0, "kv_c", params.kv_c, 0, "tokens");
  check.size("k_pe", params.k_pe, 1, kRopeDim, "rope dim");
  check.last_dim_contiguous("k_pe", params.k_pe);
  check.dtype("slot_mapping", params.slot_mapping, {DType::kInt32, DType::kInt64});
  check.rank("slot_mapping", params.slot_mapping, 1);
  check.same_size("slot_mapping", params.slot_mapping, 0, "kv_c", params.kv_c, 0, "tokens");
  if (fp8_per_tensor) check.positive_finite("scale", params.scale);

  Device device = check.common_device({{"kv_c", &params.kv_c},
                                       {"k_pe", &params.k_pe},
                                       {"slot_mapping", &params.slot_mapping},
                                       {"kv_cache", &params.kv_cache}});
  if (device.type == DeviceType::kCPU) {
    const int64_t slots = cache.size(0) * cache.size(1);
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t slot = load_int(params.slot_mapping, t);
      if (slot >= slots) {
        check.fail("slot_mapping", "expected slots < pages * page_size = " +
                                       std::to_string(slots) + " (or negative to skip), got " +
                                       "slot_mapping[" + std::to_string(t) + "] = " +
                                       std::to_string(slot));
      }
    }
  }
  return params;
}

GatherDsMlaCacheParams validate(const ArgumentChecker& check, const GatherDsMlaCacheParams& given) {
  GatherDsMlaCacheParams params = given;
  params.kv_cache = paged_cache(check, "kv_cache", params.kv_cache);
  check.dtype("kv_cache", params.kv_cache, {DType::kUInt8, DType::kFloat8E4M3});
  check_ds_mla_last_dim(check, "kv_cache", params.kv_cache);
  check.required("block_table", params.block_table);
  check.dtype("block_table", params.block_table, {DType::kInt32});
  check.rank("block_table", params.block_table, 2);
  check.last_dim_contiguous("block_table", params.block_table);
  const int64_t batch = params.block_table.size(0);
  check.required("out", params.out);
  check.dtype("out", params.out, {DType::kBFloat16});
  check.rank("out", params.out, 2);
  check.size("out", params.out, 1, kHeadDim, "head dim: 512 latent + 64 rope");
  check.last_dim_contiguous("out", params.out);
  check.cu_seqlens("cu_seq_lens", params.cu_seq_lens, batch, params.out.size(0));

  Device device = check.common_device({{"kv_cache", &params.kv_cache},
                                       {"block_table", &params.block_table},
                                       {"cu_seq_lens", &params.cu_seq_lens},
                                       {"out", &params.out}});
  if (device.type == DeviceType::kCPU) {
    const int64_t page_size = params.kv_cache.size(1);
    const int64_t capacity = params.block_table.size(1) * page_size;
    for (int64_t b = 0; b < batch; ++b) {
      int64_t length = load_int(params.cu_seq_lens, b + 1) - load_int(params.cu_seq_lens, b);
      if (length > capacity) {
        check.fail("cu_seq_lens", "expected request lengths <= max_pages * page_size = " +
                                      std::to_string(capacity) + ", request " +
                                      std::to_string(b) + " has " + std::to_string(length));
      }
      check_pages_in_range(check, params.block_table, b, length, page_size,
                           params.kv_cache.size(0));
    }
  }
  return params;
}

void validate(const ArgumentChecker& check, const ConvertTopkIndicesParams& params) {
  check.required("local_indices", params.local_indices);
  check.dtype("local_indices", params.local_indices, {DType::kInt32});
  check.rank("local_indices", params.local_indices, 2);
  check.last_dim_contiguous("local_indices", params.local_indices);
  const int64_t tokens = params.local_indices.size(0);
  check.required("request_ids", params.request_ids);
  check.dtype("request_ids", params.request_ids, {DType::kInt32});
  check.rank("request_ids", params.request_ids, 1);
  check.same_size("request_ids", params.request_ids, 0, "local_indices", params.local_indices, 0,
                  "tokens");
  check.required("block_table", params.block_table);
  check.dtype("block_table", params.block_table, {DType::kInt32});
  check.rank("block_table", params.block_table, 2);
  check.last_dim_contiguous("block_table", params.block_table);
  check.power_of_two("page_size", params.page_size, 1, kMaxPageSize);
  // Global slot ids are int32, so every position of a request must map to one.
  if (params.block_table.size(1) * params.page_size > INT32_MAX) {
    check.fail("block_table", "expected max_pages * page_size <= 2^31 - 1 (int32 slot ids), got " +
                                  std::to_string(params.block_table.size(1) * params.page_size));
  }
  if (params.topk_length.present()) {
    check.required("topk_length", params.topk_length);
    check.dtype("topk_length", params.topk_length, {DType::kInt32});
    check.rank("topk_length", params.topk_length, 1);
    check.same_size("topk_length", params.topk_length, 0, "local_indices", params.local_indices,
                    0, "tokens");
  }
  check.required("global_indices", params.global_indices);
  check.dtype("global_indices", params.global_indices, {DType::kInt32});
  check.rank("global_indices", params.global_indices, 2);
  check.same_size("global_indices", params.global_indices, 0, "local_indices",
                  params.local_indices, 0, "tokens");
  check.same_size("global_indices", params.global_indices, 1, "local_indices",
                  params.local_indices, 1, "topk");
  check.last_dim_contiguous("global_indices", params.global_indices);

  Device device = check.common_device({{"local_indices", &params.local_indices},
                                       {"request_ids", &params.request_ids},
                                       {"block_table", &params.block_table},
                                       {"topk_length", &params.topk_length},
                                       {"global_indices", &params.global_indices}});
  if (device.type == DeviceType::kCPU) {
    const int64_t batch = params.block_table.size(0);
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t request = load_int(params.request_ids, t);
      if (request < 0 || request >= batch) {
        check.fail("request_ids", "expected request ids in [0, " + std::to_string(batch) +
                                      ") (rows of block_table), got request_ids[" +
                                      std::to_string(t) + "] = " + std::to_string(request));
      }
    }
  }
}

void validate(const ArgumentChecker& check, const PackKvQuantizeFp8Params& params) {
  constexpr int64_t kNopeDim = 128, kPackRopeDim = 64, kValueDim = 128;
  check.required("k_nope", params.k_nope);
  check.dtype("k_nope", params.k_nope, {DType::kBFloat16, DType::kFloat16});
  check.rank("k_nope", params.k_nope, 3);
  check.size("k_nope", params.k_nope, 2, kNopeDim, "nope head dim");
  check.last_dim_contiguous("k_nope", params.k_nope);
  const int64_t heads = params.k_nope.size(1);
  check.required("k_pe", params.k_pe);
  check.same_dtype("k_pe", params.k_pe, "k_nope", params.k_nope);
  check.rank("k_pe", params.k_pe, 3);
  check.same_size("k_pe", params.k_pe, 0, "k_nope", params.k_nope, 0, "tokens");
  if (params.k_pe.size(1) != 1 && params.k_pe.size(1) != heads) {
    check.fail("k_pe", "expected dimension 1 (heads) to be 1 (broadcast) or " +
                           std::to_string(heads) + " (heads of k_nope), got " +
                           std::to_string(params.k_pe.size(1)));
  }
  check.size("k_pe", params.k_pe, 2, kPackRopeDim, "rope dim");
  check.last_dim_contiguous("k_pe", params.k_pe);
  check.required("v", params.v);
  check.same_dtype("v", params.v, "k_nope", params.k_nope);
  check.rank("v", params.v, 3);
  check.same_size("v", params.v, 0, "k_nope", params.k_nope, 0, "tokens");
  check.same_size("v", params.v, 1, "k_nope", params.k_nope, 1, "heads");
  check.size("v", params.v, 2, kValueDim, "value head dim");
  check.last_dim_contiguous("v", params.v);
  check.positive_finite("k_scale", params.k_scale);
  check.positive_finite("v_scale", params.v_scale);
  check.required("k_out", params.k_out);
  check.dtype("k_out", params.k_out, {DType::kFloat8E4M3});
  check.rank("k_out", params.k_out, 3);
  check.same_size("k_out", params.k_out, 0, "k_nope", params.k_nope, 0, "tokens");
  check.same_size("k_out", params.k_out, 1, "k_nope", params.k_nope, 1, "heads");
  check.size("k_out", params.k_out, 2, kNopeDim + kPackRopeDim, "nope + rope");
  check.last_dim_contiguous("k_out", params.k_out);
  check.required("v_out", params.v_out);
  check.dtype("v_out", params.v_out, {DType::kFloat8E4M3});
  check.rank("v_out", params.v_out, 3);
  check.same_size("v_out", params.v_out, 0, "k_nope", params.k_nope, 0, "tokens");
  check.same_size("v_out", params.v_out, 1, "k_nope", params.k_nope, 1, "heads");
  check.size("v_out", params.v_out, 2, kValueDim, "value head dim");
  check.last_dim_contiguous("v_out", params.v_out);
  check.common_device({{"k_nope", &params.k_nope},
                       {"k_pe", &params.k_pe},
                       {"v", &params.v},
                       {"k_out", &params.k_out},
                       {"v_out", &params.v_out}});
}

void validate(const ArgumentChecker& check, const MergeAttentionParams& params) {
  check.required("out_a", params.out_a);
  check.dtype("out_a", params.out_a, {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  check.rank("out_a", params.out_a, 3);
  check.last_dim_contiguous("out_a", params.out_a);
  auto check_like_out_a = [&](const char* argument, const TensorView& tensor) {
    check.required(argument, tensor);
    check.same_dtype(argument, tensor, "out_a", params.out_a);
    check.rank(argument, tensor, 3);
    check.same_size(argument, tensor, 0, "out_a", params.out_a, 0, "tokens");
    check.same_size(argument, tensor, 1, "out_a", params.out_a, 1, "heads");
    check.same_size(argument, tensor, 2, "out_a", params.out_a, 2, "head dim");
    check.last_dim_contiguous(argument, tensor);
  };
  auto check_lse = [&](const char* argument, const TensorView& tensor) {
    check.required(argument, tensor);
    check.dtype(argument, tensor, {DType::kFloat32});
    check.rank(argument, tensor, 2);
    check.same_size(argument, tensor, 0, "out_a", params.out_a, 0, "tokens");
    check.same_size(argument, tensor, 1, "out_a", params.out_a, 1, "heads");
  };
  check_like_out_a("out_b", params.out_b);
  check_like_out_a("out", params.out);
  check_lse("lse_a", params.lse_a);
  check_lse("lse_b", params.lse_b);
  if (params.lse.present()) check_lse("lse", params.lse);
  check.common_device({{"out_a", &params.out_a},
                       {"lse_a", &params.lse_a},
                       {"out_b", &params.out_b},
                       {"lse_b", &params.lse_b},
                       {"out", &params.out},
                       {"lse", &params.lse}});
}

}  // namespace

void write_kv_cache(const WriteKvCacheParams& given) {
  ArgumentChecker check("write_kv_cache");
  WriteKvCacheParams params = validate(check, given);
  run_where_arguments_live(
      check, params.kv_cache.device, [&] { reference::write_kv_cache(params); },
      [&] { OPENMLA_IF_CUDA(kernels::write_kv_cache(params)); });
}

void gather_ds_mla_cache(const GatherDsMlaCacheParams& given) {
  ArgumentChecker check("gather_ds_mla_cache");
  GatherDsMlaCacheParams params = validate(check, given);
  run_where_arguments_live(
      check, params.kv_cache.device, [&] { reference::gather_ds_mla_cache(params); },
      [&] { OPENMLA_IF_CUDA(kernels::gather_ds_mla_cache(params)); });
}

void convert_topk_indices(const ConvertTopkIndicesParams& params) {
  ArgumentChecker check("convert_topk_indices");
  validate(check, params);
  run_where_arguments_live(
      check, params.local_indices.device, [&] { reference::convert_topk_indices(params); },
      [&] { OPENMLA_IF_CUDA(kernels::convert_topk_indices(params)); });
}

void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params) {
  ArgumentChecker check("pack_kv_quantize_fp8");
  validate(check, params);
  run_where_arguments_live(
      check, params.k_nope.device, [&] { reference::pack_kv_quantize_fp8(params); },
      [&] { OPENMLA_IF_CUDA(kernels::pack_kv_quantize_fp8(params)); });
}

void merge_attention(const MergeAttentionParams& params) {
  ArgumentChecker check("merge_attention");
  validate(check, params);
  run_where_arguments_live(
      check, params.out_a.device, [&] { reference::merge_attention(params); },
      [&] { OPENMLA_IF_CUDA(kernels::merge_attention(params)); });
}

}  // namespace openmla
