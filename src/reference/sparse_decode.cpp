// CPU reference of sparse MLA decode (contract: include/openmla/sparse_decode.h), over a BF16
// paged cache or the 656-byte FP8 ds_mla layout, with an optional second source that joins
// the same softmax.
#include <algorithm>
#include <cstring>
#include <vector>

#include "reference/attention_row.h"
#include "reference/reference.h"

namespace openmla::reference {

namespace {

bool is_ds_mla(const TensorView& cache) { return cache.dtype != DType::kBFloat16; }

// Key row of a ds_mla token (656 bytes): latent fp8 * its group's scale, then the bf16 RoPE.
void load_ds_mla_row(const uint8_t* token, int64_t head_dim, double* key) {
  float scales[kDsMlaGroups];
  std::memcpy(scales, token + kDsMlaScaleOffset, sizeof(scales));
  for (int64_t d = 0; d < kLatentDim; ++d) {
    key[d] = double(fp8_e4m3_to_float(token[d])) * double(scales[d / kDsMlaGroupSize]);
  }
  for (int64_t d = kLatentDim; d < head_dim; ++d) {
    uint16_t bits;
    std::memcpy(&bits, token + kDsMlaRopeOffset + 2 * (d - kLatentDim), sizeof(bits));
    key[d] = bf16_to_float(bits);
  }
}

// Adds the selection of (b, s) from one source to the row.
void attend_source(const SparseKvSource& source, int64_t b, int64_t s, const double* query,
                   int64_t head_dim, double softmax_scale, double* key, AttentionRow& row) {
  const TensorView& cache = source.kv_cache;  // [pages, page_size, (1,) last]
  const TensorView& indices = source.indices;
  const int64_t page_size = cache.size(1), slots = cache.size(0) * page_size;
  const int64_t topk = indices.size(2);
  int64_t selected = topk;
  if (source.topk_length.present()) {
    selected = std::clamp<int64_t>(load_index(source.topk_length, b * source.topk_length.stride(0)),
                                   0, topk);
  }
  for (int64_t j = 0; j < selected; ++j) {
    const int64_t slot = load_index(indices, offset_of(indices, {b, s, j}));
    if (slot < 0 || slot >= slots) continue;  // invalid: skipped, never read
    const int64_t offset =
        (slot / page_size) * cache.stride(0) + (slot % page_size) * cache.stride(1);
    if (is_ds_mla(cache)) {
      load_ds_mla_row(static_cast<const uint8_t*>(cache.data) + offset, head_dim, key);
    } else {
      load_row(cache, offset, head_dim, 1.0, key);
    }
    row.add(softmax_scale * dot(query, key, head_dim), key);
  }
}

}  // namespace

void sparse_decode(const SparseDecodeParams& params) {
  const TensorView& q = params.q;
  const int64_t batch = q.size(0), query_tokens = q.size(1), heads = q.size(2);
  const int64_t head_dim = q.size(3), value_dim = params.out.size(3);
  const bool has_extra = params.extra.kv_cache.present();

  parallel_for(batch * query_tokens * heads, [&](int64_t row_index) {
    const int64_t h = row_index % heads;
    const int64_t s = (row_index / heads) % query_tokens;
    const int64_t b = row_index / (heads * query_tokens);
    AttentionRow row(value_dim);
    std::vector<double> query(static_cast<size_t>(head_dim)), key(static_cast<size_t>(head_dim));
    load_row(q, offset_of(q, {b, s, h, 0}), head_dim, 1.0, query.data());
    attend_source(params.main, b, s, query.data(), head_dim, params.softmax_scale, key.data(), row);
    if (has_extra) {
      attend_source(params.extra, b, s, query.data(), head_dim, params.softmax_scale, key.data(),
                    row);
    }
    const double sink = params.attn_sink.present()
                            ? load(params.attn_sink, h * params.attn_sink.stride(0))
                            : kNegativeInfinity;
    const TensorView& lse = params.lse;
    store_row(row, sink, params.out, offset_of(params.out, {b, s, h, 0}), lse,
              lse.present() ? offset_of(lse, {b, s, h}) : 0, params.lse_base);
  });
}

}  // namespace openmla::reference
