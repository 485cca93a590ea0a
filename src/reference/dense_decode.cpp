// CPU reference of dense MLA decode (contract: include/openmla/dense_decode.h).
#include <algorithm>
#include <vector>

#include "reference/attention_row.h"
#include "reference/reference.h"

namespace openmla::reference {

void dense_decode(const DenseDecodeParams& params) {
  const TensorView& q = params.q;
  const TensorView& cache = params.kv_cache;  // [pages, page_size, 576] after validation
  const int64_t batch = q.size(0), query_tokens = q.size(1), heads = q.size(2);
  const int64_t head_dim = q.size(3), value_dim = params.out.size(3);
  const int64_t page_size = cache.size(1);
  const double q_scale = q.dtype == DType::kFloat8E4M3 ? params.q_descale : 1.0;
  const double kv_scale = cache.dtype == DType::kFloat8E4M3 ? params.kv_scale : 1.0;

  parallel_for(batch * query_tokens * heads, [&](int64_t row_index) {
    const int64_t h = row_index % heads;
    const int64_t s = (row_index / heads) % query_tokens;
    const int64_t b = row_index / (heads * query_tokens);
    const int64_t length = load_index(params.seq_lens, b * params.seq_lens.stride(0));
    // Bottom-right causal among the new tokens: token s sees keys 0 .. length - Sq + s.
    const int64_t visible =
        params.causal ? std::min(length, length - query_tokens + s + 1) : length;
    AttentionRow row(value_dim);
    std::vector<double> query(static_cast<size_t>(head_dim)), key(static_cast<size_t>(head_dim));
    load_row(q, offset_of(q, {b, s, h, 0}), head_dim, q_scale, query.data());
    for (int64_t t = 0; t < visible; ++t) {
      const int64_t page =
          load_index(params.block_table, offset_of(params.block_table, {b, t / page_size}));
      load_row(cache, offset_of(cache, {page, t % page_size, 0}), head_dim, kv_scale, key.data());
      row.add(params.softmax_scale * dot(query.data(), key.data(), head_dim), key.data());
    }
    const TensorView& lse = params.lse;
    store_row(row, kNegativeInfinity, params.out, offset_of(params.out, {b, s, h, 0}), lse,
              lse.present() ? offset_of(lse, {b, s, h}) : 0, params.lse_base);
  });
}

}  // namespace openmla::reference
