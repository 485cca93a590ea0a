// Sparse MLA prefill: validation and dispatch. The contract is in include/openmla/sparse_prefill.h.
#include "openmla/sparse_prefill.h"

#include "dispatch.h"
#include "openmla/numerics.h"
#include "reference/reference.h"
#include "sparse_common.h"

namespace openmla {

namespace {

void validate(const ArgumentChecker& check, const SparsePrefillParams& params) {
  check.required("q", params.q);
  check.required("kv", params.kv);
  check.required("indices", params.indices);
  check.required("out", params.out);

  check.dtype("q", params.q, {DType::kBFloat16});
  check.rank("q", params.q, 3);
  check_sparse_head_dim(check, params.q, 2);
  check.last_dim_contiguous("q", params.q);
  const int64_t query_rows = params.q.size(0), heads = params.q.size(1);

  check.dtype("kv", params.kv, {DType::kBFloat16});
  if (params.kv.rank == 3) {
    check.size("kv", params.kv, 1, 1, "kv heads");
  } else if (params.kv.rank != 2) {
    check.fail("kv", "expected rank 2 [Tk, dim] or 3 [Tk, 1, dim], got rank " +
                         std::to_string(params.kv.rank));
  }
  check.same_size("kv", params.kv, -1, "q", params.q, 2, "head dim");
  check.last_dim_contiguous("kv", params.kv);

  check.dtype("indices", params.indices, {DType::kInt32});
  if (params.indices.rank == 3) {
    check.size("indices", params.indices, 1, 1, "kv heads");
  } else if (params.indices.rank != 2) {
    check.fail("indices", "expected rank 2 [Tq, topk] or 3 [Tq, 1, topk], got rank " +
                              std::to_string(params.indices.rank));
  }
  check.same_size("indices", params.indices, 0, "q", params.q, 0, "query tokens");
  check.last_dim_contiguous("indices", params.indices);
  const int64_t topk = params.indices.size(-1);

  check_topk_length(check, "topk_length", params.topk_length, query_rows);
  check_attn_sink(check, params.attn_sink, heads);

  check.dtype("out", params.out, {DType::kBFloat16});
  check.rank("out", params.out, 3);
  check.size("out", params.out, 0, query_rows, "query tokens, from q");
  check.size("out", params.out, 1, heads, "heads, from q");
  check.size("out", params.out, 2, kLatentDim, "value dim");
  check.last_dim_contiguous("out", params.out);
  for (auto [name, tensor] : {std::pair{"lse", &params.lse}, {"max_logits", &params.max_logits}}) {
    if (!tensor->present()) continue;
    check.dtype(name, *tensor, {DType::kFloat32});
    check.rank(name, *tensor, 2);
    check.size(name, *tensor, 0, query_rows, "query tokens, from q");
    check.size(name, *tensor, 1, heads, "heads, from q");
  }
  check.positive_finite("softmax_scale", params.softmax_scale);

  Device device = check.common_device({{"q", &params.q},
                                       {"kv", &params.kv},
                                       {"indices", &params.indices},
                                       {"topk_length", &params.topk_length},
                                       {"attn_sink", &params.attn_sink},
                                       {"out", &params.out},
                                       {"lse", &params.lse},
                                       {"max_logits", &params.max_logits},
                                       {"workspace", &params.workspace}});
  if (device.type == DeviceType::kCPU) {
    check_topk_length_values(check, "topk_length", params.topk_length, topk);
  }
  if (device.type == DeviceType::kCUDA || params.workspace.present()) {
    check.workspace(params.workspace, sparse_prefill_workspace_size(params));
  }
}

}  // namespace

// Each query's selection fits one pass (no split partials), so no scratch is needed.
size_t sparse_prefill_workspace_size(const SparsePrefillParams&) { return 0; }

void sparse_prefill(const SparsePrefillParams& params) {
  ArgumentChecker check("sparse_prefill");
  validate(check, params);
  run_where_arguments_live(
      check, params.q.device, [&] { reference::sparse_prefill(params); },
      [&] { check.not_implemented("no CUDA kernel for sparse_prefill yet"); });
}

}  // namespace openmla
