// Sparse MLA decode: validation and dispatch. The contract is in include/openmla/sparse_decode.h.
#include "openmla/sparse_decode.h"

#include "dispatch.h"
#include "openmla/numerics.h"
#include "plan/decode_plan.h"
#include "reference/reference.h"
#include "sparse_common.h"

namespace openmla {

namespace {

// Argument names of one source, so that messages say which cache is wrong.
struct SourceNames {
  const char* kv_cache;
  const char* indices;
  const char* topk_length;
};
constexpr SourceNames kMainNames{"main.kv_cache", "main.indices", "main.topk_length"};
constexpr SourceNames kExtraNames{"extra.kv_cache", "extra.indices", "extra.topk_length"};

// Checks one source against q [B, Sq, Hq, D]; returns it with the cache seen as 3-D.
SparseKvSource validate_source(const ArgumentChecker& check, const SourceNames& names,
                               const SparseKvSource& given, const TensorView& q) {
  SparseKvSource source = given;
  check.required(names.kv_cache, source.kv_cache);
  check.required(names.indices, source.indices);
  source.kv_cache = drop_single_head_dim(check, names.kv_cache, source.kv_cache);
  const TensorView& cache = source.kv_cache;
  check.dtype(names.kv_cache, cache, {DType::kBFloat16, DType::kUInt8, DType::kFloat8E4M3});
  if (cache.dtype == DType::kBFloat16) {
    check.same_size(names.kv_cache, cache, 2, "q", q, 3, "head dim");
  } else {
    if (q.size(3) != kHeadDim) {
      check.fail(names.kv_cache, "a ds_mla (FP8) cache holds 576-dim keys, but 'q' has head dim " +
                                     std::to_string(q.size(3)));
    }
    check.size(names.kv_cache, cache, 2, kDsMlaBytesPerToken, "ds_mla bytes per token");
  }
  if (cache.size(1) < 1) check.fail(names.kv_cache, "expected a page size (dimension 1) >= 1");
  check.last_dim_contiguous(names.kv_cache, cache);

  check.dtype(names.indices, source.indices, {DType::kInt32});
  check.rank(names.indices, source.indices, 3);
  check.same_size(names.indices, source.indices, 0, "q", q, 0, "batch");
  check.same_size(names.indices, source.indices, 1, "q", q, 1, "query tokens");
  check.last_dim_contiguous(names.indices, source.indices);
  check_topk_length(check, names.topk_length, source.topk_length, q.size(0));
  return source;
}

SparseDecodeParams validate(const ArgumentChecker& check, const SparseDecodeParams& given) {
  SparseDecodeParams params = given;
  check.required("q", params.q);
  check.required("out", params.out);
  check.dtype("q", params.q, {DType::kBFloat16});
  check.rank("q", params.q, 4);
  check_sparse_head_dim(check, params.q, 3);
  check.last_dim_contiguous("q", params.q);
  const int64_t batch = params.q.size(0), query_tokens = params.q.size(1);
  const int64_t heads = params.q.size(2);

  params.main = validate_source(check, kMainNames, params.main, params.q);
  const bool has_extra = params.extra.kv_cache.present();
  if (has_extra) {
    params.extra = validate_source(check, kExtraNames, params.extra, params.q);
  } else if (params.extra.indices.present() || params.extra.topk_length.present()) {
    check.fail(params.extra.indices.present() ? kExtraNames.indices : kExtraNames.topk_length,
               "given without 'extra.kv_cache'");
  }
  check_attn_sink(check, params.attn_sink, heads);

  check_decode_outputs(check, params.out, params.lse, batch, query_tokens, heads);
  check.positive_finite("softmax_scale", params.softmax_scale);

  Device device = check.common_device({{"q", &params.q},
                                       {"main.kv_cache", &params.main.kv_cache},
                                       {"main.indices", &params.main.indices},
                                       {"main.topk_length", &params.main.topk_length},
                                       {"extra.kv_cache", &params.extra.kv_cache},
                                       {"extra.indices", &params.extra.indices},
                                       {"extra.topk_length", &params.extra.topk_length},
                                       {"attn_sink", &params.attn_sink},
                                       {"out", &params.out},
                                       {"lse", &params.lse},
                                       {"workspace", &params.workspace}});
  if (device.type == DeviceType::kCPU) {
    check_topk_length_values(check, kMainNames.topk_length, params.main.topk_length,
                             params.main.indices.size(2));
    if (has_extra) {
      check_topk_length_values(check, kExtraNames.topk_length, params.extra.topk_length,
                               params.extra.indices.size(2));
    }
  }
  // The CPU reference needs no scratch; a CUDA call must bring the workspace the query asks.
  if (device.type == DeviceType::kCUDA || params.workspace.present()) {
    check.workspace(params.workspace, sparse_decode_workspace_size(params));
  }
  return params;
}

}  // namespace

size_t sparse_decode_workspace_size(const SparseDecodeParams& params) { return decode_workspace_bytes(params.q); }

void sparse_decode(const SparseDecodeParams& given) {
  ArgumentChecker check("sparse_decode");
  SparseDecodeParams params = validate(check, given);
  run_where_arguments_live(
      check, params.q.device, [&] { reference::sparse_decode(params); },
      [&] { check.not_implemented("no CUDA kernel for sparse_decode yet"); });
}

}  // namespace openmla
