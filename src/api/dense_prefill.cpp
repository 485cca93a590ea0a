// Dense MLA prefill: validation and dispatch. The contract is in include/openmla/dense_prefill.h.
#include "openmla/dense_prefill.h"

#include "dispatch.h"
#include "reference/reference.h"

namespace openmla {

namespace {

constexpr int64_t kQueryKeyDim = 192;  // DeepSeek R1: 128 nope + 64 rope
constexpr int64_t kValueDim = 128;

int64_t cu_entry(const TensorView& cu_seqlens, int64_t i) {
  return cu_seqlens.ptr<const int32_t>()[i * cu_seqlens.stride(0)];
}

// Host-resident lengths must fit the planning bound the caller gave.
void check_max_seqlen(const ArgumentChecker& check, const char* argument, int64_t max_seqlen,
                      const TensorView& cu_seqlens, int64_t batch) {
  if (max_seqlen < 0) check.fail(argument, "expected >= 0, got " + std::to_string(max_seqlen));
  if (cu_seqlens.is_cuda()) return;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t length = cu_entry(cu_seqlens, b + 1) - cu_entry(cu_seqlens, b);
    if (length > max_seqlen) {
      check.fail(argument, "expected >= every sequence length, but request " + std::to_string(b) +
                               " has " + std::to_string(length));
    }
  }
}

void validate(const ArgumentChecker& check, const DensePrefillParams& params) {
  check.required("q", params.q);
  check.required("k", params.k);
  check.required("v", params.v);
  check.required("cu_seqlens_q", params.cu_seqlens_q);
  check.required("cu_seqlens_kv", params.cu_seqlens_kv);
  check.required("out", params.out);

  check.dtype("q", params.q, {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3});
  check.rank("q", params.q, 3);
  check.size("q", params.q, 2, kQueryKeyDim, "query/key head dim");
  check.last_dim_contiguous("q", params.q);
  const int64_t query_rows = params.q.size(0), heads = params.q.size(1);

  check.same_dtype("k", params.k, "q", params.q);
  check.rank("k", params.k, 3);
  check.size("k", params.k, 2, kQueryKeyDim, "query/key head dim");
  check.last_dim_contiguous("k", params.k);
  const int64_t key_rows = params.k.size(0), kv_heads = params.k.size(1);
  if (kv_heads < 1 || heads % kv_heads != 0) {
    check.fail("k", "expected a kv head count (dimension 1) that divides the " +
                        std::to_string(heads) + " query heads, got " + std::to_string(kv_heads));
  }

  check.same_dtype("v", params.v, "q", params.q);
  check.rank("v", params.v, 3);
  check.same_size("v", params.v, 0, "k", params.k, 0, "key tokens");
  check.same_size("v", params.v, 1, "k", params.k, 1, "kv heads");
  check.size("v", params.v, 2, kValueDim, "value head dim");
  check.last_dim_contiguous("v", params.v);

  if (params.q.dtype == DType::kFloat8E4M3) {
    check.positive_finite("q_descale", params.q_descale);
    check.positive_finite("k_descale", params.k_descale);
    check.positive_finite("v_descale", params.v_descale);
  }

  check.rank("cu_seqlens_q", params.cu_seqlens_q, 1);
  const int64_t batch = params.cu_seqlens_q.size(0) - 1;
  if (batch < 0) check.fail("cu_seqlens_q", "expected at least one entry (batch + 1), got 0");
  check.cu_seqlens("cu_seqlens_q", params.cu_seqlens_q, batch, query_rows);
  check.cu_seqlens("cu_seqlens_kv", params.cu_seqlens_kv, batch, key_rows);
  check_max_seqlen(check, "max_seqlen_q", params.max_seqlen_q, params.cu_seqlens_q, batch);
  check_max_seqlen(check, "max_seqlen_kv", params.max_seqlen_kv, params.cu_seqlens_kv, batch);

  // Output follows q: fp16 stays fp16; bf16 and fp8 produce bf16.
  check.dtype("out", params.out,
              {params.q.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16});
  check.rank("out", params.out, 3);
  check.size("out", params.out, 0, query_rows, "query tokens, from q");
  check.size("out", params.out, 1, heads, "heads, from q");
  check.size("out", params.out, 2, kValueDim, "value head dim");
  check.last_dim_contiguous("out", params.out);
  if (params.lse.present()) {
    check.dtype("lse", params.lse, {DType::kFloat32});
    check.rank("lse", params.lse, 2);
    check.size("lse", params.lse, 0, query_rows, "query tokens, from q");
    check.size("lse", params.lse, 1, heads, "heads, from q");
  }
  check.positive_finite("softmax_scale", params.softmax_scale);

  Device device = check.common_device({{"q", &params.q},
                                       {"k", &params.k},
                                       {"v", &params.v},
                                       {"cu_seqlens_q", &params.cu_seqlens_q},
                                       {"cu_seqlens_kv", &params.cu_seqlens_kv},
                                       {"out", &params.out},
                                       {"lse", &params.lse},
                                       {"workspace", &params.workspace}});
  if (device.type == DeviceType::kCUDA || params.workspace.present()) {
    check.workspace(params.workspace, dense_prefill_workspace_size(params));
  }
}

}  // namespace

// Prefill keeps no split partials: every query tile owns its whole key range.
size_t dense_prefill_workspace_size(const DensePrefillParams&) { return 0; }

void dense_prefill(const DensePrefillParams& params) {
  ArgumentChecker check("dense_prefill");
  validate(check, params);
  run_where_arguments_live(
      check, params.q.device, [&] { reference::dense_prefill(params); },
      [&] { check.not_implemented("no CUDA kernel for dense_prefill yet"); });
}

}  // namespace openmla
