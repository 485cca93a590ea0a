// The CPU reference of the four attention ops (through the public API, so validation runs too)
// against a brute-force float64 computation written here: explicit logits, a two-pass
// softmax, and the masks / selections spelled out per query. Outputs are poisoned before
// every run; unused cache slots hold NaN, padded block-table entries garbage.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "test_support.h"

namespace openmla::testing {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kOutputTolerance = 1e-2;  // relative Frobenius per row, bf16/fp16 outputs
constexpr double kLseTolerance = 1e-5;     // relative (absolute below magnitude 1)

// ---- the brute-force oracle -------------------------------------------------------------

// Expected results, one row per (query, head) in the output's own order.
struct Expected {
  int64_t value_dim = 0;
  std::vector<double> out, lse, max_logits;

  // Softmax over `logits` with one value row each; exp(sink) only joins the denominator.
  void add_row(const std::vector<double>& logits, const std::vector<std::vector<double>>& values,
               double sink = -kInfinity) {
    std::vector<double> row(static_cast<size_t>(value_dim), 0.0);
    if (logits.empty()) {
      out.insert(out.end(), row.begin(), row.end());
      lse.push_back(-kInfinity);
      max_logits.push_back(-kInfinity);
      return;
    }
    double max_logit = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double logit : logits) sum += std::exp(logit - max_logit);
    double denominator = sum + std::exp(sink - max_logit);
    for (size_t j = 0; j < logits.size(); ++j) {
      double probability = std::exp(logits[j] - max_logit) / denominator;
      for (int64_t d = 0; d < value_dim; ++d) row[size_t(d)] += probability * values[j][size_t(d)];
    }
    out.insert(out.end(), row.begin(), row.end());
    lse.push_back(max_logit + std::log(sum));
    max_logits.push_back(max_logit);
  }
};

void expect_scalar_close(double actual, double expected, const char* what, size_t row) {
  if (std::isinf(expected)) {
    EXPECT_EQ(actual, expected) << what << " row " << row;
  } else {
    EXPECT_LE(std::fabs(actual - expected), kLseTolerance * std::max(1.0, std::fabs(expected)))
        << what << " row " << row << ": got " << actual << ", expected " << expected;
  }
}

// Compares out (and the optional LSE / max-logit tensors) with the oracle, row by row: a row
// with nothing attended must be exactly 0 with LSE -inf.
void expect_matches(const Expected& expected, const HostTensor& out, const HostTensor* lse,
                    LseBase lse_base, const HostTensor* max_logits = nullptr) {
  std::vector<double> actual = to_doubles(out);
  ASSERT_EQ(actual.size(), expected.out.size());
  const size_t rows = expected.lse.size(), width = size_t(expected.value_dim);
  size_t empty_rows = 0;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<double> got(actual.begin() + r * width, actual.begin() + (r + 1) * width);
    std::vector<double> want(expected.out.begin() + r * width,
                             expected.out.begin() + (r + 1) * width);
    if (std::isinf(expected.lse[r])) {
      ++empty_rows;
      for (double value : got) ASSERT_EQ(value, 0.0) << "row " << r << " attends nothing";
    } else {
      double error = relative_error(got, want);
      ASSERT_LT(error, kOutputTolerance) << "row " << r;  // NaN fails too
    }
  }
  const double to_base = lse_base == LseBase::kBase2 ? 1.0 / std::log(2.0) : 1.0;
  if (lse) {
    std::vector<double> lse_values = to_doubles(*lse);
    for (size_t r = 0; r < rows; ++r) {
      expect_scalar_close(lse_values[r], expected.lse[r] * to_base, "lse", r);
    }
  }
  if (max_logits) {
    std::vector<double> max_values = to_doubles(*max_logits);
    for (size_t r = 0; r < rows; ++r) {
      expect_scalar_close(max_values[r], expected.max_logits[r], "max_logits", r);
    }
  }
  // Every case mixes attended and empty rows; a case where all rows are empty tests little.
  EXPECT_LT(empty_rows, rows);
}

// ---- inputs -------------------------------------------------------------------------------

// A copy of `tensor` (contiguous, rank >= 2) inside a larger NaN-filled buffer: the
// second-to-last dim gets one extra entry and each row 64 padding elements, so the view is
// strided everywhere except in its last dim and any read of the padding shows up as NaN.
struct StridedCopy {
  HostTensor buffer;
  TensorView view;
};

StridedCopy strided_copy(const HostTensor& tensor) {
  const TensorView& source = tensor.view();
  const int rank = source.rank;
  std::vector<int64_t> padded(source.shape, source.shape + rank);
  padded[size_t(rank - 2)] += 1;
  padded[size_t(rank - 1)] += 64;
  int64_t total = std::accumulate(padded.begin(), padded.end(), int64_t(1), std::multiplies<>());
  StridedCopy copy{HostTensor(source.dtype, {total}), source};
  poison(copy.buffer);
  copy.view.data = copy.buffer.bytes.data();
  int64_t stride = 1;
  for (int dim = rank - 1; dim >= 0; --dim) {
    copy.view.strides[dim] = stride;
    stride *= padded[size_t(dim)];
  }
  for (int64_t flat = 0; flat < tensor.numel(); ++flat) {
    int64_t remaining = flat, offset = 0;
    for (int dim = rank - 1; dim >= 0; --dim) {
      offset += (remaining % source.shape[dim]) * copy.view.strides[dim];
      remaining /= source.shape[dim];
    }
    copy.buffer.set(offset, tensor.get(flat));
  }
  return copy;
}

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor tensor(DType::kInt32, {int64_t(values.size())});
  std::copy(values.begin(), values.end(), tensor.data<int32_t>());
  return tensor;
}

HostTensor poisoned(DType dtype, std::initializer_list<int64_t> shape) {
  HostTensor tensor(dtype, shape);
  poison(tensor);
  return tensor;
}

// ---- dense prefill ------------------------------------------------------------------------

struct DensePrefillCase {
  std::vector<int32_t> query_lengths, key_lengths;
  int64_t heads = 3, kv_heads = 1;
  bool causal = false;
  DType dtype = DType::kBFloat16;
  bool strided_q = false;
  LseBase lse_base = LseBase::kNatural;
  int64_t unused_query_rows = 0;  // packed rows after the last request: must come out 0 / -inf
};

void run_dense_prefill(const DensePrefillCase& test_case) {
  SCOPED_TRACE(::testing::Message()
               << "heads " << test_case.heads << "/" << test_case.kv_heads << " causal "
               << test_case.causal << " dtype " << dtype_name(test_case.dtype));
  auto rng = make_rng();
  const int64_t batch = int64_t(test_case.query_lengths.size());
  std::vector<int32_t> cu_q{0}, cu_kv{0};
  for (int64_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + test_case.query_lengths[size_t(b)]);
    cu_kv.push_back(cu_kv.back() + test_case.key_lengths[size_t(b)]);
  }
  const int64_t query_rows = cu_q.back() + test_case.unused_query_rows, key_rows = cu_kv.back();
  const int64_t heads = test_case.heads, kv_heads = test_case.kv_heads;
  const bool fp8 = test_case.dtype == DType::kFloat8E4M3;
  const double range = fp8 ? 3.0 : 1.0;

  HostTensor q(test_case.dtype, {query_rows, heads, 192}),
      k(test_case.dtype, {key_rows, kv_heads, 192}), v(test_case.dtype, {key_rows, kv_heads, 128});
  fill_uniform(q, rng, -range, range);
  fill_uniform(k, rng, -range, range);
  fill_uniform(v, rng, -range, range);
  HostTensor cu_seqlens_q = int32_tensor(cu_q), cu_seqlens_kv = int32_tensor(cu_kv);
  const DType out_dtype = test_case.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  HostTensor out = poisoned(out_dtype, {query_rows, heads, 128});
  HostTensor lse = poisoned(DType::kFloat32, {query_rows, heads});
  StridedCopy q_strided = strided_copy(q);

  DensePrefillParams params;
  params.q = test_case.strided_q ? q_strided.view : q.view();
  params.k = k.view();
  params.v = v.view();
  params.cu_seqlens_q = cu_seqlens_q.view();
  params.cu_seqlens_kv = cu_seqlens_kv.view();
  params.max_seqlen_q = *std::max_element(cu_q.begin(), cu_q.end());
  params.max_seqlen_kv = *std::max_element(cu_kv.begin(), cu_kv.end());
  params.softmax_scale = fp8 ? 0.05f : 0.3f;
  params.causal = test_case.causal;
  if (fp8) params.q_descale = 0.5f, params.k_descale = 0.25f, params.v_descale = 2.0f;
  params.out = out.view();
  params.lse = lse.view();
  params.lse_base = test_case.lse_base;
  dense_prefill(params);

  const double q_scale = fp8 ? params.q_descale : 1, k_scale = fp8 ? params.k_descale : 1,
               v_scale = fp8 ? params.v_descale : 1;
  Expected expected{128};
  for (int64_t t = 0; t < query_rows; ++t) {
    int64_t b = 0;
    while (b < batch && t >= cu_q[size_t(b) + 1]) ++b;
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> logits;
      std::vector<std::vector<double>> values;
      if (b < batch) {
        const int64_t lq = test_case.query_lengths[size_t(b)],
                      lk = test_case.key_lengths[size_t(b)];
        const int64_t i = t - cu_q[size_t(b)], kv_head = h / (heads / kv_heads);
        for (int64_t j = 0; j < lk; ++j) {
          if (test_case.causal && j > lk - lq + i) continue;
          const int64_t key_row = cu_kv[size_t(b)] + j;
          double logit = 0;
          for (int64_t d = 0; d < 192; ++d) {
            logit += q.get((t * heads + h) * 192 + d) * q_scale *
                     k.get((key_row * kv_heads + kv_head) * 192 + d) * k_scale;
          }
          logits.push_back(params.softmax_scale * logit);
          std::vector<double> value(128);
          for (int64_t d = 0; d < 128; ++d) {
            value[size_t(d)] = v.get((key_row * kv_heads + kv_head) * 128 + d) * v_scale;
          }
          values.push_back(value);
        }
      }
      expected.add_row(logits, values);
    }
  }
  expect_matches(expected, out, &lse, test_case.lse_base);
}

TEST(AttentionReference, DensePrefillMatchesBruteForce) {
  // Ragged batches where q and kv packs differ (chunked prefill), a zero-length query side,
  // a request with keys but no queries and one with queries but no keys.
  const std::vector<int32_t> query_lengths{3, 0, 5, 1, 4}, key_lengths{7, 2, 5, 0, 9};
  for (bool causal : {false, true}) {
    run_dense_prefill({query_lengths, key_lengths, 3, 1, causal});
    run_dense_prefill(
        {query_lengths, key_lengths, 6, 3, causal, DType::kBFloat16, true, LseBase::kBase2, 2});
  }
  run_dense_prefill({{4}, {4}, 1, 1, true});
  run_dense_prefill({{2, 6}, {5, 6}, 4, 2, true, DType::kFloat16});
  run_dense_prefill({{2, 6}, {5, 6}, 3, 3, true, DType::kFloat8E4M3, true});
}

// A query that sees no key under the causal mask (lq > lk) outputs 0 and LSE -inf.
TEST(AttentionReference, DensePrefillCausalMaskedRowsAreEmpty) {
  run_dense_prefill({{5}, {2}, 3, 1, true});
}

// ---- dense decode -------------------------------------------------------------------------

struct DenseDecodeCase {
  std::vector<int32_t> sequence_lengths;
  int64_t query_tokens = 1, heads = 3, page_size = 16;
  bool causal = false;
  DType q_dtype = DType::kBFloat16, kv_dtype = DType::kBFloat16;
  bool cache_with_head_dim = false;  // [pages, page_size, 1, 576]
  bool strided_q = false;
  LseBase lse_base = LseBase::kNatural;
};

void run_dense_decode(const DenseDecodeCase& test_case) {
  SCOPED_TRACE(::testing::Message()
               << "Sq " << test_case.query_tokens << " heads " << test_case.heads << " causal "
               << test_case.causal << " q " << dtype_name(test_case.q_dtype) << " kv "
               << dtype_name(test_case.kv_dtype));
  auto rng = make_rng();
  const int64_t batch = int64_t(test_case.sequence_lengths.size());
  const int64_t query_tokens = test_case.query_tokens, heads = test_case.heads;
  const int64_t page_size = test_case.page_size;
  // Pages in a random order, two spare pages left unused (NaN), padded entries garbage.
  int64_t max_pages = 0, used_pages = 0;
  for (int32_t length : test_case.sequence_lengths) {
    max_pages = std::max(max_pages, (length + page_size - 1) / page_size);
    used_pages += (length + page_size - 1) / page_size;
  }
  max_pages += 1;
  const int64_t pages = used_pages + 2;
  std::vector<int32_t> page_order(static_cast<size_t>(pages));
  std::iota(page_order.begin(), page_order.end(), 0);
  std::shuffle(page_order.begin(), page_order.end(), rng);
  HostTensor block_table(DType::kInt32, {batch, max_pages});
  std::fill_n(block_table.data<int32_t>(), batch * max_pages, 2147480000);
  std::vector<std::vector<int32_t>> page_of(static_cast<size_t>(batch));
  size_t next_page = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p = 0; p * page_size < test_case.sequence_lengths[size_t(b)]; ++p) {
      page_of[size_t(b)].push_back(page_order[next_page++]);
      block_table.data<int32_t>()[b * max_pages + p] = page_of[size_t(b)].back();
    }
  }

  const bool fp8_q = test_case.q_dtype == DType::kFloat8E4M3;
  const bool fp8_kv = test_case.kv_dtype == DType::kFloat8E4M3;
  HostTensor cache = poisoned(test_case.kv_dtype, {pages, page_size, 576});
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < test_case.sequence_lengths[size_t(b)]; ++t) {
      int64_t slot = page_of[size_t(b)][size_t(t / page_size)] * page_size + t % page_size;
      for (int64_t d = 0; d < 576; ++d) cache.set(slot * 576 + d, uniform(rng) * (fp8_kv ? 4 : 1));
    }
  }
  HostTensor q(test_case.q_dtype, {batch, query_tokens, heads, 576});
  fill_uniform(q, rng, fp8_q ? -4.0 : -1.0, fp8_q ? 4.0 : 1.0);
  HostTensor seq_lens = int32_tensor(test_case.sequence_lengths);
  HostTensor out = poisoned(DType::kBFloat16, {batch, query_tokens, heads, 512});
  HostTensor lse = poisoned(DType::kFloat32, {batch, query_tokens, heads});
  StridedCopy q_strided = strided_copy(q);

  DenseDecodeParams params;
  params.q = test_case.strided_q ? q_strided.view : q.view();
  params.kv_cache = cache.view();
  if (test_case.cache_with_head_dim) {
    params.kv_cache =
        TensorView::contiguous(cache.bytes.data(), test_case.kv_dtype, {pages, page_size, 1, 576});
  }
  params.block_table = block_table.view();
  params.seq_lens = seq_lens.view();
  params.softmax_scale = 0.12f;
  params.causal = test_case.causal;
  params.q_descale = 0.25f;  // ignored unless q is fp8
  params.kv_scale = 0.25f;   // ignored unless the cache is fp8
  params.out = out.view();
  params.lse = lse.view();
  params.lse_base = test_case.lse_base;
  dense_decode(params);

  const double q_scale = fp8_q ? params.q_descale : 1, kv_scale = fp8_kv ? params.kv_scale : 1;
  Expected expected{512};
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = test_case.sequence_lengths[size_t(b)];
    for (int64_t s = 0; s < query_tokens; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> logits;
        std::vector<std::vector<double>> values;
        for (int64_t t = 0; t < length; ++t) {
          if (test_case.causal && t > length - query_tokens + s) continue;
          int64_t slot = page_of[size_t(b)][size_t(t / page_size)] * page_size + t % page_size;
          std::vector<double> key(576);
          double logit = 0;
          for (int64_t d = 0; d < 576; ++d) {
            key[size_t(d)] = cache.get(slot * 576 + d) * kv_scale;
            logit +=
                q.get(((b * query_tokens + s) * heads + h) * 576 + d) * q_scale * key[size_t(d)];
          }
          logits.push_back(params.softmax_scale * logit);
          values.push_back(key);  // the value is the first 512 dims of the key
        }
        expected.add_row(logits, values);
      }
    }
  }
  expect_matches(expected, out, &lse, test_case.lse_base);
}

TEST(AttentionReference, DenseDecodeMatchesBruteForce) {
  // Zero-length sequence, a sequence shorter than Sq (causal masks some tokens entirely),
  // partial last pages.
  const std::vector<int32_t> lengths{37, 0, 1, 16, 50};
  for (bool causal : {false, true}) {
    run_dense_decode({lengths, 2, 3, 16, causal});
  }
  run_dense_decode(
      {lengths, 3, 5, 32, true, DType::kBFloat16, DType::kBFloat16, true, true, LseBase::kBase2});
  run_dense_decode({{20, 9}, 1, 4, 16, false, DType::kFloat16, DType::kFloat16});
  run_dense_decode({{20, 0, 33}, 2, 3, 16, true, DType::kBFloat16, DType::kFloat8E4M3});
  run_dense_decode({{20, 0, 33}, 1, 3, 16, false, DType::kFloat8E4M3, DType::kFloat8E4M3});
}

// ---- sparse prefill -----------------------------------------------------------------------

struct SparsePrefillCase {
  int64_t query_rows = 6, key_rows = 40, heads = 3, head_dim = 576, topk = 16;
  bool with_topk_length = false, with_sink = false;
  bool kv_with_head_dim = false;  // kv [Tk, 1, D] and indices [Tq, 1, topk]
  bool strided_q = false;
  LseBase lse_base = LseBase::kNatural;
};

void run_sparse_prefill(const SparsePrefillCase& test_case) {
  SCOPED_TRACE(::testing::Message()
               << "D " << test_case.head_dim << " heads " << test_case.heads << " topk_length "
               << test_case.with_topk_length << " sink " << test_case.with_sink);
  auto rng = make_rng();
  const int64_t query_rows = test_case.query_rows, key_rows = test_case.key_rows;
  const int64_t heads = test_case.heads, dim = test_case.head_dim, topk = test_case.topk;
  // kv lives two rows into a NaN buffer with two NaN rows after it: reading an invalid index
  // that lands just outside (-2, -1, Tk, Tk + 1) poisons the result.
  HostTensor kv_buffer = poisoned(DType::kBFloat16, {key_rows + 4, dim});
  for (int64_t i = 2 * dim; i < (key_rows + 2) * dim; ++i) {
    kv_buffer.set(i, std::uniform_real_distribution<double>(-1, 1)(rng));
  }
  auto kv_value = [&](int64_t row, int64_t d) { return kv_buffer.get((row + 2) * dim + d); };
  void* kv_data = kv_buffer.data<uint16_t>() + 2 * dim;

  const std::vector<int32_t> invalid{-1,         -2,       int32_t(key_rows), int32_t(key_rows + 1),
                                     2147480000, INT32_MIN};
  HostTensor indices(DType::kInt32, {query_rows, topk});
  std::uniform_int_distribution<int32_t> valid_index(0, int32_t(key_rows - 1));
  std::uniform_int_distribution<size_t> pick_invalid(0, invalid.size() - 1);
  for (int64_t t = 0; t < query_rows; ++t) {
    for (int64_t j = 0; j < topk; ++j) {
      // Query 0 selects nothing valid; the others mix valid and invalid indices.
      bool valid = t != 0 && std::uniform_real_distribution<double>(0, 1)(rng) < 0.75;
      indices.data<int32_t>()[t * topk + j] = valid ? valid_index(rng) : invalid[pick_invalid(rng)];
    }
  }
  std::vector<int32_t> lengths(static_cast<size_t>(query_rows), int32_t(topk));
  if (test_case.with_topk_length) {
    for (auto& length : lengths)
      length = std::uniform_int_distribution<int32_t>(0, int32_t(topk))(rng);
    lengths[1] = 0;  // an empty prefix although every index behind it is valid
    lengths[2] = int32_t(topk);
  }
  HostTensor topk_length = int32_tensor(lengths);
  HostTensor sink(DType::kFloat32, {heads});
  fill_uniform(sink, rng, -1.0, 2.0);
  HostTensor q(DType::kBFloat16, {query_rows, heads, dim});
  fill_uniform(q, rng);
  StridedCopy q_strided = strided_copy(q);
  HostTensor out = poisoned(DType::kBFloat16, {query_rows, heads, 512});
  HostTensor lse = poisoned(DType::kFloat32, {query_rows, heads});
  HostTensor max_logits = poisoned(DType::kFloat32, {query_rows, heads});

  SparsePrefillParams params;
  params.q = test_case.strided_q ? q_strided.view : q.view();
  params.kv = TensorView::contiguous(kv_data, DType::kBFloat16, {key_rows, dim});
  params.indices = indices.view();
  if (test_case.kv_with_head_dim) {
    params.kv = TensorView::contiguous(kv_data, DType::kBFloat16, {key_rows, 1, dim});
    params.indices =
        TensorView::contiguous(indices.bytes.data(), DType::kInt32, {query_rows, 1, topk});
  }
  if (test_case.with_topk_length) params.topk_length = topk_length.view();
  if (test_case.with_sink) params.attn_sink = sink.view();
  params.softmax_scale = 0.1f;
  params.out = out.view();
  params.lse = lse.view();
  params.max_logits = max_logits.view();
  params.lse_base = test_case.lse_base;
  sparse_prefill(params);

  Expected expected{512};
  for (int64_t t = 0; t < query_rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> logits;
      std::vector<std::vector<double>> values;
      for (int64_t j = 0; j < lengths[size_t(t)]; ++j) {
        int64_t index = indices.data<int32_t>()[t * topk + j];
        if (index < 0 || index >= key_rows) continue;
        double logit = 0;
        for (int64_t d = 0; d < dim; ++d)
          logit += q.get((t * heads + h) * dim + d) * kv_value(index, d);
        logits.push_back(params.softmax_scale * logit);
        std::vector<double> value(512);
        for (int64_t d = 0; d < 512; ++d) value[size_t(d)] = kv_value(index, d);
        values.push_back(value);
      }
      expected.add_row(logits, values, test_case.with_sink ? sink.get(h) : -kInfinity);
    }
  }
  expect_matches(expected, out, &lse, test_case.lse_base, &max_logits);
}

TEST(AttentionReference, SparsePrefillMatchesBruteForce) {
  run_sparse_prefill({});
  run_sparse_prefill({6, 40, 3, 576, 16, true, true, true, true, LseBase::kBase2});
  run_sparse_prefill({5, 33, 5, 512, 24, true, false});
  run_sparse_prefill({4, 20, 1, 512, 8, false, true, false, true});
}

// ---- sparse decode ------------------------------------------------------------------------

enum class CacheFormat { kBFloat16, kDsMlaUInt8, kDsMlaFp8 };

// One source: a paged cache inside a buffer with one extra NaN page after it, half of its
// slots written (the rest NaN), and indices into the written ones, mixed with invalid ones.
struct SparseSource {
  HostTensor buffer, indices, topk_length;
  TensorView cache;
  std::map<int64_t, std::vector<double>> keys;  // slot -> dequantised key, as the oracle sees it
  std::vector<int32_t> lengths;
};

// Quantises one token into the 656-byte ds_mla layout and returns the key it stands for.
std::vector<double> write_ds_mla_token(uint8_t* token, const std::vector<double>& values) {
  std::vector<double> key(576);
  for (int group = 0; group < kDsMlaGroups; ++group) {
    double max_magnitude = 0;
    for (int i = 0; i < kDsMlaGroupSize; ++i) {
      max_magnitude =
          std::max(max_magnitude, std::fabs(values[size_t(group * kDsMlaGroupSize + i)]));
    }
    float scale = float(max_magnitude / kFp8E4M3Max);
    std::memcpy(token + kDsMlaScaleOffset + 4 * group, &scale, 4);
    for (int i = 0; i < kDsMlaGroupSize; ++i) {
      int d = group * kDsMlaGroupSize + i;
      token[d] = float_to_fp8_e4m3(float(values[size_t(d)] / scale));
      key[size_t(d)] = double(fp8_e4m3_to_float(token[d])) * double(scale);
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t bits = float_to_bf16(float(values[size_t(kLatentDim + i)]));
    std::memcpy(token + kDsMlaRopeOffset + 2 * i, &bits, 2);
    key[size_t(kLatentDim + i)] = bf16_to_float(bits);
  }
  return key;
}

SparseSource make_sparse_source(std::mt19937_64& rng, CacheFormat format, int64_t batch,
                                int64_t query_tokens, int64_t dim, int64_t pages, int64_t page_size,
                                int64_t topk, bool with_topk_length, bool with_head_dim) {
  SparseSource source;
  const bool ds_mla = format != CacheFormat::kBFloat16;
  const DType dtype = format == CacheFormat::kBFloat16   ? DType::kBFloat16
                      : format == CacheFormat::kDsMlaFp8 ? DType::kFloat8E4M3
                                                         : DType::kUInt8;
  const int64_t last = ds_mla ? kDsMlaBytesPerToken : dim, slots = pages * page_size;
  source.buffer = HostTensor(dtype, {(pages + 1) * page_size * last});
  poison(source.buffer);  // NaN in every float format, including the ds_mla scales
  source.cache =
      with_head_dim
          ? TensorView::contiguous(source.buffer.bytes.data(), dtype, {pages, page_size, 1, last})
          : TensorView::contiguous(source.buffer.bytes.data(), dtype, {pages, page_size, last});

  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<int32_t> written, unwritten;
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (std::uniform_real_distribution<double>(0, 1)(rng) >= 0.5) {
      unwritten.push_back(int32_t(slot));
      continue;
    }
    written.push_back(int32_t(slot));
    std::vector<double> values(static_cast<size_t>(dim));
    for (auto& value : values) value = uniform(rng);
    if (ds_mla) {
      source.keys[slot] = write_ds_mla_token(source.buffer.data<uint8_t>() + slot * last, values);
    } else {
      std::vector<double>& key = source.keys[slot];
      for (int64_t d = 0; d < dim; ++d) {
        source.buffer.set(slot * dim + d, values[size_t(d)]);
        key.push_back(source.buffer.get(slot * dim + d));
      }
    }
  }
  source.lengths.assign(static_cast<size_t>(batch), int32_t(topk));
  if (with_topk_length) {
    for (auto& length : source.lengths)
      length = std::uniform_int_distribution<int32_t>(0, int32_t(topk))(rng);
    source.lengths[0] = 0;
  }
  source.topk_length = int32_tensor(source.lengths);
  // Invalid slots: -1, the NaN page just past the cache, far garbage. Entries past a
  // request's topk_length point at unwritten (NaN) slots, so reading them shows.
  const std::vector<int32_t> invalid{-1, int32_t(slots), int32_t(slots + page_size - 1),
                                     2147480000};
  source.indices = HostTensor(DType::kInt32, {batch, query_tokens, topk});
  auto pick = [&](const std::vector<int32_t>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < query_tokens; ++s) {
      for (int64_t j = 0; j < topk; ++j) {
        int32_t slot;
        if (j >= source.lengths[size_t(b)]) {
          slot = pick(unwritten);
        } else {
          slot = std::uniform_real_distribution<double>(0, 1)(rng) < 0.8 ? pick(written)
                                                                         : pick(invalid);
        }
        source.indices.data<int32_t>()[(b * query_tokens + s) * topk + j] = slot;
      }
    }
  }
  return source;
}

struct SparseDecodeCase {
  int64_t batch = 3, query_tokens = 2, heads = 3, head_dim = 576;
  CacheFormat main_format = CacheFormat::kBFloat16;
  bool with_extra = false;
  CacheFormat extra_format = CacheFormat::kBFloat16;
  bool with_topk_length = false, with_sink = false, cache_with_head_dim = false;
  LseBase lse_base = LseBase::kNatural;
};

void run_sparse_decode(const SparseDecodeCase& test_case) {
  SCOPED_TRACE(::testing::Message()
               << "D " << test_case.head_dim << " main format " << int(test_case.main_format)
               << " extra " << test_case.with_extra << "/" << int(test_case.extra_format)
               << " topk_length " << test_case.with_topk_length << " sink " << test_case.with_sink);
  auto rng = make_rng();
  const int64_t batch = test_case.batch, query_tokens = test_case.query_tokens;
  const int64_t heads = test_case.heads, dim = test_case.head_dim;
  SparseSource main =
      make_sparse_source(rng, test_case.main_format, batch, query_tokens, dim, 5, 16, 20,
                         test_case.with_topk_length, test_case.cache_with_head_dim);
  SparseSource extra = make_sparse_source(rng, test_case.extra_format, batch, query_tokens, dim, 3,
                                          64, 12, test_case.with_topk_length, false);
  HostTensor q(DType::kBFloat16, {batch, query_tokens, heads, dim});
  fill_uniform(q, rng);
  HostTensor sink(DType::kFloat32, {heads});
  fill_uniform(sink, rng, -1.0, 2.0);
  HostTensor out = poisoned(DType::kBFloat16, {batch, query_tokens, heads, 512});
  HostTensor lse = poisoned(DType::kFloat32, {batch, query_tokens, heads});

  SparseDecodeParams params;
  params.q = q.view();
  params.main = {main.cache, main.indices.view(), {}};
  if (test_case.with_topk_length) params.main.topk_length = main.topk_length.view();
  if (test_case.with_extra) {
    params.extra = {extra.cache, extra.indices.view(), {}};
    if (test_case.with_topk_length) params.extra.topk_length = extra.topk_length.view();
  }
  if (test_case.with_sink) params.attn_sink = sink.view();
  params.softmax_scale = 0.1f;
  params.out = out.view();
  params.lse = lse.view();
  params.lse_base = test_case.lse_base;
  sparse_decode(params);

  Expected expected{512};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < query_tokens; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> logits;
        std::vector<std::vector<double>> values;
        auto attend = [&](const SparseSource& source) {
          const int64_t topk = source.indices.view().size(2);
          for (int64_t j = 0; j < source.lengths[size_t(b)]; ++j) {
            int64_t slot = source.indices.data<int32_t>()[(b * query_tokens + s) * topk + j];
            auto found = source.keys.find(slot);
            if (found == source.keys.end()) continue;  // invalid (every valid pick was written)
            double logit = 0;
            for (int64_t d = 0; d < dim; ++d) {
              logit +=
                  q.get(((b * query_tokens + s) * heads + h) * dim + d) * found->second[size_t(d)];
            }
            logits.push_back(params.softmax_scale * logit);
            values.push_back(found->second);
          }
        };
        attend(main);
        if (test_case.with_extra) attend(extra);
        expected.add_row(logits, values, test_case.with_sink ? sink.get(h) : -kInfinity);
      }
    }
  }
  expect_matches(expected, out, &lse, test_case.lse_base);
}

TEST(AttentionReference, SparseDecodeMatchesBruteForce) {
  run_sparse_decode({});
  run_sparse_decode({3, 2, 3, 576, CacheFormat::kBFloat16, false, CacheFormat::kBFloat16, true,
                     true, true, LseBase::kBase2});
  run_sparse_decode(
      {2, 1, 5, 512, CacheFormat::kBFloat16, true, CacheFormat::kBFloat16, true, true});
}

TEST(AttentionReference, SparseDecodeDsMlaCacheMatchesBruteForce) {
  run_sparse_decode({3, 2, 3, 576, CacheFormat::kDsMlaUInt8});
  run_sparse_decode(
      {2, 2, 1, 576, CacheFormat::kDsMlaFp8, false, CacheFormat::kBFloat16, true, true, true});
  // DeepSeek V4 style: an FP8 main cache plus a BF16 second source in one softmax, and the
  // other way round.
  run_sparse_decode({3, 1, 3, 576, CacheFormat::kDsMlaUInt8, true, CacheFormat::kBFloat16, true,
                     true, false, LseBase::kBase2});
  run_sparse_decode(
      {2, 2, 4, 576, CacheFormat::kBFloat16, true, CacheFormat::kDsMlaFp8, false, false});
}

}  // namespace
}  // namespace openmla::testing
