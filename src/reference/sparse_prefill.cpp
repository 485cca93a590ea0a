// CPU reference of sparse MLA prefill (contract: include/openmla/sparse_prefill.h).
#include <algorithm>
#include <vector>

#include "reference/attention_row.h"
#include "reference/reference.h"

namespace openmla::reference {

void sparse_prefill(const SparsePrefillParams& params) {
  const TensorView& q = params.q;
  const TensorView& kv = params.kv;            // [Tk, D] or [Tk, 1, D]: row t at t * stride(0)
  const TensorView& indices = params.indices;  // [Tq, topk] or [Tq, 1, topk]
  const int64_t query_rows = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t key_rows = kv.size(0), topk = indices.size(-1);
  const int64_t value_dim = params.out.size(2);

  parallel_for(query_rows * heads, [&](int64_t row_index) {
    const int64_t t = row_index / heads, h = row_index % heads;
    int64_t selected = topk;
    if (params.topk_length.present()) {
      selected = std::clamp<int64_t>(
          load_index(params.topk_length, t * params.topk_length.stride(0)), 0, topk);
    }
    AttentionRow row(value_dim);
    std::vector<double> query(static_cast<size_t>(head_dim)), key(static_cast<size_t>(head_dim));
    load_row(q, offset_of(q, {t, h, 0}), head_dim, 1.0, query.data());
    for (int64_t j = 0; j < selected; ++j) {
      const int64_t index = load_index(indices, t * indices.stride(0) + j * indices.stride(-1));
      if (index < 0 || index >= key_rows) continue;  // invalid: skipped, never read
      load_row(kv, index * kv.stride(0), head_dim, 1.0, key.data());
      row.add(params.softmax_scale * dot(query.data(), key.data(), head_dim), key.data());
    }
    const double sink = params.attn_sink.present()
                            ? load(params.attn_sink, h * params.attn_sink.stride(0))
                            : kNegativeInfinity;
    const TensorView& lse = params.lse;
    store_row(row, sink, params.out, offset_of(params.out, {t, h, 0}), lse,
              lse.present() ? offset_of(lse, {t, h}) : 0, params.lse_base);
    if (params.max_logits.present()) {
      store(params.max_logits, offset_of(params.max_logits, {t, h}), row.max_logit());
    }
  });
}

}  // namespace openmla::reference
