// CPU reference of dense MLA prefill (contract: include/openmla/dense_prefill.h).
#include <algorithm>
#include <vector>

#include "reference/attention_row.h"
#include "reference/reference.h"

namespace openmla::reference {

void dense_prefill(const DensePrefillParams& params) {
  const TensorView& q = params.q;
  const TensorView& k = params.k;
  const TensorView& v = params.v;
  const int64_t query_rows = q.size(0), heads = q.size(1), qk_dim = q.size(2);
  const int64_t kv_heads = k.size(1), value_dim = v.size(2);
  const int64_t heads_per_kv_head = heads / kv_heads;
  const int64_t batch = params.cu_seqlens_q.size(0) - 1;
  const bool fp8 = q.dtype == DType::kFloat8E4M3;
  const double q_scale = fp8 ? params.q_descale : 1.0;
  const double k_scale = fp8 ? params.k_descale : 1.0;
  const double v_scale = fp8 ? params.v_descale : 1.0;

  auto cu_entry = [](const TensorView& cu, int64_t i) { return load_index(cu, i * cu.stride(0)); };
  // Request of every packed query row; rows past the last request stay -1 (output 0, -inf).
  std::vector<int64_t> request_of_row(size_t(query_rows), -1);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = cu_entry(params.cu_seqlens_q, b); t < cu_entry(params.cu_seqlens_q, b + 1);
         ++t) {
      request_of_row[size_t(t)] = b;
    }
  }

  parallel_for(query_rows * heads, [&](int64_t row_index) {
    const int64_t t = row_index / heads, h = row_index % heads;
    const int64_t b = request_of_row[size_t(t)];
    const int64_t kv_head = h / heads_per_kv_head;
    AttentionRow row(value_dim);
    if (b >= 0) {
      const int64_t q_begin = cu_entry(params.cu_seqlens_q, b);
      const int64_t kv_begin = cu_entry(params.cu_seqlens_kv, b);
      const int64_t query_length = cu_entry(params.cu_seqlens_q, b + 1) - q_begin;
      const int64_t key_length = cu_entry(params.cu_seqlens_kv, b + 1) - kv_begin;
      const int64_t i = t - q_begin;
      // Bottom-right causal: query i sees keys 0 .. key_length - query_length + i.
      const int64_t visible =
          params.causal ? std::min(key_length, key_length - query_length + i + 1) : key_length;
      std::vector<double> query(static_cast<size_t>(qk_dim)), key(static_cast<size_t>(qk_dim)),
          value(static_cast<size_t>(value_dim));
      load_row(q, offset_of(q, {t, h, 0}), qk_dim, q_scale, query.data());
      for (int64_t j = 0; j < visible; ++j) {
        load_row(k, offset_of(k, {kv_begin + j, kv_head, 0}), qk_dim, k_scale, key.data());
        load_row(v, offset_of(v, {kv_begin + j, kv_head, 0}), value_dim, v_scale, value.data());
        row.add(params.softmax_scale * dot(query.data(), key.data(), qk_dim), value.data());
      }
    }
    const TensorView& lse = params.lse;
    store_row(row, kNegativeInfinity, params.out, offset_of(params.out, {t, h, 0}), lse,
              lse.present() ? offset_of(lse, {t, h}) : 0, params.lse_base);
  });
}

}  // namespace openmla::reference
