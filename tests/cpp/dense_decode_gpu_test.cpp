// Dense MLA decode on the GPU against the CPU reference: openmla::dense_decode on device
// copies of the inputs vs. the same call on host tensors (float64 accumulation, checked
// against brute force in attention_reference_test.cpp).
//
// Every input is hostile to a kernel that reads what it should not: fresh random values, NaN in
// every cache slot no request uses (spare pages, and slots past seq_len in a last page),
// 2147480000 in block-table entries past each request's pages, pages in a random order,
// zero-length requests and (with causal, Sq > 1) requests shorter than Sq, whose first query
// tokens see no key at all. Outputs and the workspace start as NaN. Some cases launch with PDL,
// and one test has the previous kernel write seq_lens and the block table late (DenseDecodeGpuPdl).
//
// The shapes form a covering design over B {1, 2, 6, 64}, Sq {1, 2, 4, 8}, Lk {20, 140, 4096},
// Hq {1, 3, 9, 16, 63, 64, 126, 128}, varlen, causal, page size {16..256} and the four dtype
// pairings: every value occurs, each dtype meets causal and not, long and short sequences, and
// large Lk comes only with small B * Hq (the float64 reference is the cost). "Small/" cases
// are cheap enough for compute-sanitizer; "Covering/" holds the rest.
//
// Tolerances (on the whole output, relative Frobenius; per row looser, to catch one bad row):
//   q bf16 / fp16 (cache bf16, fp16 or fp8): out 1e-2, row 3e-2; LSE |a - e| <= 1e-3 (1 + |e|),
//   3e-3 (1 + |e|) with an fp8 cache: every kernel computes S on e4m3 tensor cores then (since
//   session 24 the 64-row kernel too), q as two e4m3 parts (~8 significant bits, about what
//   rounding q to bf16 once more costs) with ~13-bit accumulation, and a row that sees few keys
//   has its LSE off by its logits' error (measured: up to 7.5e-4 (1 + |e|) in the narrow kernel,
//   1.1e-3 in the 64-row kernel with an fp8 q; out <= 2.3e-3).
//   q fp8 (cache fp8): as q bf16 with an fp8 cache. No kernel runs P V on fp8 tensor cores: one
//   that did (the 64-row kernel until session 23) rounded P to e4m3 and truncated its long
//   accumulations, and needed 4e-2 here (and was off by 11-41% on values that share a
//   component: the Python test of coherent values).
// A row that attends nothing must be exactly 0 with LSE -inf.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "plan/decode_plan.h"
#include "test_support.h"

namespace openmla::testing {
namespace {

constexpr int32_t kGarbagePage = 2147480000;  // block-table padding: must never be followed
constexpr int64_t kDim = 576, kValueDim = 512;
constexpr int64_t kPaddedTokenStride = 640;  // 16-byte multiples in every dtype, as the TMA needs

struct DecodeCase {
  int64_t batch, query_tokens, heads, max_length, page_size;
  bool varlen, causal;
  DType q_dtype = DType::kBFloat16, kv_dtype = DType::kBFloat16;
  LseBase lse_base = LseBase::kNatural;
  bool strided_q = false;            // q inside a larger NaN buffer, batch and token dims swapped
  bool with_lse = true;
  bool cache_with_head_dim = false;  // [pages, page_size, 1, 576]
  // The cache inside a larger NaN buffer: token rows kPaddedTokenStride elements apart and one
  // spare token slot after each page, so that neither a token's nor a page's stride is the packed
  // one (the TMA views take both from the tensor) and a read past a row's 576 dims meets NaN.
  bool padded_cache = false;
  float softmax_scale = 0.1f;        // logits' spread ~1.6 with the value ranges below
  // q values times this, softmax_scale divided by it (same logits): far outside fp16's range
  // (1e5) or tiny (1e-6), for kernels that carry a bf16 q in fp16 (FP8 caches).
  double query_magnitude = 1;
  // enable_pdl: a uniform plan's CTAs prefetch their first key tiles before the PDL wait, on a
  // speculative read of seq_lens and the block table (key_tiles.cuh start_split_cta).
  bool pdl = false;
  // DenseDecodeParams::max_seq_len: a bound on the lengths that trims the split plan; a launch
  // hint only, so it may also be below a request's length.
  int64_t max_seq_len = 0;
  // A block table of exactly the longest request's pages (no garbage entries past them): its
  // capacity bounds the lengths as max_seq_len does (decode_plan.h decode_length_bound).
  bool tight_table = false;
};

int64_t uniform_int(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// Without varlen every request has max_length keys. With it, requests cycle through: the
// longest (max_length; a random length when alone), empty, shorter than Sq (causal leaves the
// first query tokens nothing; 1 key when Sq = 1), and a random length.
std::vector<int32_t> sequence_lengths(const DecodeCase& c, std::mt19937_64& rng) {
  std::vector<int32_t> lengths(size_t(c.batch), int32_t(c.max_length));
  if (!c.varlen) return lengths;
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t length = 0;
    switch (b % 4) {
      case 0: length = c.batch == 1 ? uniform_int(rng, 1, c.max_length) : c.max_length; break;
      case 1: length = 0; break;
      case 2: length = uniform_int(rng, 1, std::max<int64_t>(1, c.query_tokens - 1)); break;
      case 3: length = uniform_int(rng, 1, c.max_length); break;
    }
    lengths[size_t(b)] = int32_t(std::min(length, c.max_length));
  }
  return lengths;
}

// Host inputs of one call; params holds host views of them (out, lse, workspace absent).
struct DecodeInputs {
  std::vector<int32_t> lengths;
  int64_t query_tokens = 0, heads = 0;
  bool causal = false, with_lse = true;
  HostTensor q_buffer;  // q itself, or the NaN buffer a strided q view lives in
  HostTensor cache, block_table, seq_lens;
  DenseDecodeParams params;
};

// table_width / page_count 0: just enough, plus two garbage table entries per request and
// three spare pages. A CUDA-graph replay passes fixed values so that every buffer keeps its size.
DecodeInputs make_inputs(const DecodeCase& c, const std::vector<int32_t>& lengths,
                         std::mt19937_64& rng, int64_t table_width = 0, int64_t page_count = 0) {
  const int64_t batch = int64_t(lengths.size()), page_size = c.page_size;
  const bool fp8_q = c.q_dtype == DType::kFloat8E4M3, fp8_kv = c.kv_dtype == DType::kFloat8E4M3;
  const float q_descale = 0.02f, kv_scale = 0.05f;  // real q in [-2, 2], real keys in [-1, 1]
  auto pages_of = [&](int32_t length) { return (int64_t(length) + page_size - 1) / page_size; };
  int64_t used_pages = 0, longest = 0;
  for (int32_t length : lengths) {
    used_pages += pages_of(length);
    longest = std::max(longest, pages_of(length));
  }
  if (table_width == 0) table_width = std::max<int64_t>(1, longest + (c.tight_table ? 0 : 2));
  if (page_count == 0) page_count = used_pages + 3;
  EXPECT_LE(longest, table_width);
  EXPECT_LE(used_pages, page_count);

  DecodeInputs inputs;
  inputs.lengths = lengths;
  inputs.query_tokens = c.query_tokens;
  inputs.heads = c.heads;
  inputs.causal = c.causal;
  inputs.with_lse = c.with_lse;

  std::vector<int32_t> page_order(static_cast<size_t>(page_count));
  std::iota(page_order.begin(), page_order.end(), 0);
  std::shuffle(page_order.begin(), page_order.end(), rng);
  inputs.block_table = HostTensor(DType::kInt32, {batch, table_width});
  std::fill_n(inputs.block_table.data<int32_t>(), batch * table_width, kGarbagePage);
  const int64_t token_stride = c.padded_cache ? kPaddedTokenStride : kDim;
  const int64_t page_stride = (c.padded_cache ? page_size + 1 : page_size) * token_stride;
  inputs.cache = HostTensor(c.kv_dtype, {page_count, page_stride});
  poison(inputs.cache);
  std::uniform_real_distribution<double> key_value(fp8_kv ? -1 / kv_scale : -1,
                                                   fp8_kv ? 1 / kv_scale : 1);
  size_t next_page = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < lengths[size_t(b)]; ++t) {
      if (t % page_size == 0) {
        inputs.block_table.data<int32_t>()[b * table_width + t / page_size] =
            page_order[next_page++];
      }
      const int64_t page = inputs.block_table.data<int32_t>()[b * table_width + t / page_size];
      const int64_t row = page * page_stride + (t % page_size) * token_stride;
      for (int64_t d = 0; d < kDim; ++d) inputs.cache.set(row + d, key_value(rng));
    }
  }
  inputs.seq_lens = HostTensor(DType::kInt32, {batch});
  std::copy(lengths.begin(), lengths.end(), inputs.seq_lens.data<int32_t>());

  const int64_t tokens = c.query_tokens, heads = c.heads;
  const double query_range = fp8_q ? 2 / q_descale : 2 * c.query_magnitude;
  std::uniform_real_distribution<double> query_value(-query_range, query_range);
  TensorView q;
  if (c.strided_q) {
    // [Sq, B, Hq + 1, 600] NaN buffer, viewed as [B, Sq, Hq, 576]: every stride but the last
    // differs from the packed layout; rows are 1200 bytes apart for 16-bit q (16-byte aligned)
    // and 600 for fp8 q (8-byte aligned, what the kernel's fp8 loads need).
    const int64_t row = 600, head_stride = row, batch_stride = (heads + 1) * row;
    inputs.q_buffer = HostTensor(c.q_dtype, {tokens, batch, heads + 1, row});
    poison(inputs.q_buffer);
    q = strided_view(inputs.q_buffer, {batch, tokens, heads, kDim},
                     {batch_stride, batch * batch_stride, head_stride, 1});
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < tokens; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < kDim; ++d)
            inputs.q_buffer.set(b * q.strides[0] + s * q.strides[1] + h * q.strides[2] + d,
                                query_value(rng));
  } else {
    inputs.q_buffer = HostTensor(c.q_dtype, {batch, tokens, heads, kDim});
    for (int64_t i = 0; i < inputs.q_buffer.numel(); ++i) inputs.q_buffer.set(i, query_value(rng));
    q = inputs.q_buffer.view();
  }

  DenseDecodeParams& params = inputs.params;
  params.q = q;
  params.kv_cache = strided_view(inputs.cache, {page_count, page_size, kDim}, {page_stride, token_stride, 1});
  if (c.cache_with_head_dim) {
    EXPECT_FALSE(c.padded_cache) << "the 4-D cache is packed";
    params.kv_cache = TensorView::contiguous(inputs.cache.bytes.data(), c.kv_dtype,
                                             {page_count, page_size, 1, kDim});
  }
  params.block_table = inputs.block_table.view();
  params.seq_lens = inputs.seq_lens.view();
  params.softmax_scale = float(c.softmax_scale / c.query_magnitude);
  params.causal = c.causal;
  params.q_descale = fp8_q ? q_descale : 1.0f;
  params.kv_scale = fp8_kv ? kv_scale : 1.0f;
  params.lse_base = c.lse_base;
  params.enable_pdl = c.pdl;
  params.max_seq_len = c.max_seq_len;
  return inputs;
}

int64_t row_count(const DecodeInputs& inputs) {
  return int64_t(inputs.lengths.size()) * inputs.query_tokens * inputs.heads;
}

// Rows (b, s, h in output order) that see no key: empty requests, and with causal the query
// tokens of a request shorter than Sq that come before its first key.
std::vector<bool> rows_attending_nothing(const DecodeInputs& inputs) {
  std::vector<bool> empty;
  for (int32_t length : inputs.lengths) {
    for (int64_t s = 0; s < inputs.query_tokens; ++s) {
      const int64_t visible = inputs.causal ? length - inputs.query_tokens + s + 1 : length;
      empty.insert(empty.end(), size_t(inputs.heads), visible <= 0);
    }
  }
  return empty;
}

std::string row_name(const DecodeInputs& inputs, int64_t row) {
  return "row (b " + std::to_string(row / (inputs.query_tokens * inputs.heads)) + ", s " +
         std::to_string(row / inputs.heads % inputs.query_tokens) + ", h " +
         std::to_string(row % inputs.heads) + ")";
}

struct DecodeResult {
  HostTensor out, lse;  // lse is poison when the call had none
};

DecodeResult poisoned_result(const DecodeInputs& inputs) {
  const int64_t batch = int64_t(inputs.lengths.size());
  const int64_t tokens = inputs.query_tokens, heads = inputs.heads;
  DecodeResult result{HostTensor(DType::kBFloat16, {batch, tokens, heads, kValueDim}),
                      HostTensor(DType::kFloat32, {batch, tokens, heads})};
  poison(result.out);
  poison(result.lse);
  return result;
}

DecodeResult run_reference(const DecodeInputs& inputs) {
  DecodeResult result = poisoned_result(inputs);
  DenseDecodeParams params = inputs.params;
  params.out = result.out.view();
  if (inputs.with_lse) params.lse = result.lse.view();
  dense_decode(params);
  return result;
}

struct Tolerance {
  double out, out_row, lse;
};
constexpr Tolerance kHalfPrecision{1e-2, 3e-2, 1e-3};
// S on e4m3 tensor cores (every FP8 cache): e4m3 wgmma keeps ~13 bits of each accumulation
// step, which moves LSEs by up to ~1e-3 of their scale (logit_magnitudes) even in segments.
constexpr Tolerance kFp8Scores{1e-2, 3e-2, 3e-3};
// An fp8 q with logits near 100 (softmax_scale 2): S's two segments of 9 e4m3 steps (the kernels
// of 32 and 64 rows a CTA) leave rows off by up to 4.5% (H200, perf log session 55). A third
// segment would cost those kernels 4-6% for precision that q's own e4m3 rounding (2^-4 of each
// element: ~1 unit of such logits) has already lost; a bf16 q gets three (rows within 2.3%).
constexpr Tolerance kFp8QuerySharpLogits{1e-2, 6e-2, 3e-3};

// Keeps the largest error; a NaN, once seen, stays.
void keep_worst(double& worst, int64_t& worst_row, double error, int64_t row) {
  if (std::isnan(worst)) return;
  if (std::isnan(error) || error > worst) worst = error, worst_row = row;
}

// Per row, the size of its logits as dot products: softmax_scale |q| max_k |k| / sqrt(576) over
// its request's keys (descales applied), what a logit of unaligned q and k measures. A logit's
// rounding follows the size of its partial sums, i.e. this, not the logit itself: a row of one
// key whose logit lies near 0 gets an LSE near 0 with the rounding of logits of this size (with
// logits near 100, rows of one key read LSE errors of 2e-3..1.4e-2 (1 + |LSE|) through e4m3
// tensor cores, where rows of thousands of keys read 2e-4..7e-4: perf log session 55).
std::vector<double> logit_magnitudes(const DecodeInputs& inputs) {
  const DenseDecodeParams& p = inputs.params;
  const TensorView& q = p.q;
  const int64_t width = inputs.block_table.view().size(1);
  const int64_t page_size = p.kv_cache.size(1), page_stride = p.kv_cache.strides[0],
                token_stride = p.kv_cache.strides[1];
  const double unit = p.lse_base == LseBase::kBase2 ? 1 / std::log(2.0) : 1;  // the LSE's log base
  std::vector<double> magnitudes;
  for (int64_t b = 0; b < int64_t(inputs.lengths.size()); ++b) {
    double longest_key = 0;
    for (int64_t t = 0; t < inputs.lengths[size_t(b)]; ++t) {
      const int64_t page = inputs.block_table.data<int32_t>()[b * width + t / page_size];
      const int64_t row = page * page_stride + (t % page_size) * token_stride;
      double squares = 0;
      for (int64_t d = 0; d < kDim; ++d) squares += std::pow(inputs.cache.get(row + d), 2);
      longest_key = std::max(longest_key, std::sqrt(squares) * p.kv_scale);
    }
    for (int64_t s = 0; s < inputs.query_tokens; ++s) {
      for (int64_t h = 0; h < inputs.heads; ++h) {
        double squares = 0;
        for (int64_t d = 0; d < kDim; ++d) {
          squares += std::pow(inputs.q_buffer.get(b * q.strides[0] + s * q.strides[1] + h * q.strides[2] + d), 2);
        }
        magnitudes.push_back(unit * p.softmax_scale * std::sqrt(squares) * p.q_descale * longest_key / std::sqrt(double(kDim)));
      }
    }
  }
  return magnitudes;
}

struct Comparison {
  double out_error = 0;        // relative Frobenius over the whole output (NaN if any NaN)
  double worst_row_error = 0;  // the largest relative Frobenius error of one row
  double worst_lse_error = 0;  // the largest |a - e| / (1 + max(|e|, the row's logit magnitude))
  int64_t worst_row = -1, worst_lse_row = -1;
  int64_t attending_rows = 0;
  std::string problem;  // the first row breaking the empty-row rule (0 and -inf), if any
};

Comparison compare(const DecodeInputs& inputs, const DecodeResult& actual,
                   const DecodeResult& expected) {
  Comparison comparison;
  const std::vector<double> out = to_doubles(actual.out), want = to_doubles(expected.out);
  const std::vector<double> lse = to_doubles(actual.lse), want_lse = to_doubles(expected.lse);
  const std::vector<bool> empty = rows_attending_nothing(inputs);
  const std::vector<double> magnitudes = logit_magnitudes(inputs);
  comparison.out_error = relative_error(out, want);
  auto report = [&](int64_t row, const std::string& what) {
    if (comparison.problem.empty()) comparison.problem = row_name(inputs, row) + ": " + what;
  };
  for (int64_t row = 0; row < row_count(inputs); ++row) {
    const auto begin = size_t(row * kValueDim), end = begin + size_t(kValueDim);
    if (empty[size_t(row)]) {
      for (size_t i = begin; i < end; ++i) {
        if (out[i] != 0.0) report(row, "attends nothing, out = " + std::to_string(out[i]));
      }
      if (inputs.with_lse && !(std::isinf(lse[size_t(row)]) && lse[size_t(row)] < 0)) {
        report(row, "attends nothing, LSE = " + std::to_string(lse[size_t(row)]));
      }
      if (inputs.with_lse && !std::isinf(want_lse[size_t(row)])) {
        report(row, "the reference attends something where the test expects nothing");
      }
      continue;
    }
    ++comparison.attending_rows;
    const std::vector<double> got(out.begin() + begin, out.begin() + end),
        expected_row(want.begin() + begin, want.begin() + end);
    keep_worst(comparison.worst_row_error, comparison.worst_row, relative_error(got, expected_row),
               row);
    if (inputs.with_lse) {
      const double a = lse[size_t(row)], e = want_lse[size_t(row)];
      const double error = std::isfinite(a) && std::isfinite(e)
                               ? std::fabs(a - e) / (1 + std::max(std::fabs(e), magnitudes[size_t(row)]))
                               : std::numeric_limits<double>::quiet_NaN();
      keep_worst(comparison.worst_lse_error, comparison.worst_lse_row, error, row);
    }
  }
  return comparison;
}

HostTensor copy_of(const HostTensor& tensor) {
  HostTensor copy(tensor.view().dtype, {tensor.numel()});
  copy.bytes = tensor.bytes;
  copy.view_ = tensor.view();
  copy.view_.data = copy.bytes.data();
  return copy;
}

// The harness itself, on the CPU: the inputs break every rule a kernel could lean on, and the
// comparison catches a slightly wrong row, a non-zero empty row and a NaN LSE.
TEST(DenseDecodeHarness, InputsAreHostileAndComparisonCatchesErrors) {
  auto rng = make_rng();
  DecodeCase c{6, 4, 3, 40, 16, /*varlen=*/true, /*causal=*/true};
  c.strided_q = true;
  const std::vector<int32_t> lengths = sequence_lengths(c, rng);
  DecodeInputs inputs = make_inputs(c, lengths, rng);
  EXPECT_EQ(lengths[0], 40);
  EXPECT_EQ(lengths[1], 0);
  EXPECT_LT(lengths[2], c.query_tokens);

  // NaN exactly in the slots no request uses; garbage exactly past each request's pages.
  const int64_t width = inputs.block_table.view().size(1);
  std::vector<bool> used(size_t(inputs.params.kv_cache.size(0) * c.page_size), false);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t pages = (lengths[size_t(b)] + c.page_size - 1) / c.page_size;
    for (int64_t p = 0; p < width; ++p) {
      const int32_t page = inputs.block_table.data<int32_t>()[b * width + p];
      if (p >= pages) {
        EXPECT_EQ(page, kGarbagePage);
        continue;
      }
      const int64_t end = std::min<int64_t>(lengths[size_t(b)], (p + 1) * c.page_size);
      for (int64_t t = p * c.page_size; t < end; ++t) {
        EXPECT_FALSE(used[size_t(page * c.page_size + t % c.page_size)]) << "slot shared";
        used[size_t(page * c.page_size + t % c.page_size)] = true;
      }
    }
  }
  for (size_t slot = 0; slot < used.size(); ++slot) {
    EXPECT_EQ(std::isnan(inputs.cache.get(int64_t(slot) * kDim)), !used[slot]) << "slot " << slot;
  }
  EXPECT_TRUE(std::isnan(inputs.q_buffer.get(kDim)));  // padding after the first q row

  // A padded cache: neither stride is the packed one, and the padding after a used row is NaN.
  DecodeCase padded = c;
  padded.padded_cache = true;
  const DecodeInputs padded_inputs = make_inputs(padded, lengths, rng);
  const TensorView& cache = padded_inputs.params.kv_cache;
  EXPECT_EQ(cache.strides[1], kPaddedTokenStride);
  EXPECT_EQ(cache.strides[0], (c.page_size + 1) * kPaddedTokenStride);
  const int64_t first_row = padded_inputs.block_table.data<int32_t>()[0] * cache.strides[0];
  EXPECT_FALSE(std::isnan(padded_inputs.cache.get(first_row + kDim - 1)));
  EXPECT_TRUE(std::isnan(padded_inputs.cache.get(first_row + kDim)));

  const DecodeResult reference = run_reference(inputs);
  const Comparison same = compare(inputs, reference, reference);
  EXPECT_TRUE(same.problem.empty()) << same.problem;
  EXPECT_EQ(same.out_error, 0);
  EXPECT_EQ(same.worst_lse_error, 0);
  EXPECT_GT(same.attending_rows, 0);
  EXPECT_LT(same.attending_rows, row_count(inputs));  // empty rows exist too

  // Row 0 attends 40 keys: 5% off, then one NaN; row (b 1, ...) is empty: a tiny value.
  DecodeResult wrong{copy_of(reference.out), copy_of(reference.lse)};
  for (int64_t d = 0; d < kValueDim; ++d) wrong.out.set(d, reference.out.get(d) * 1.05);
  EXPECT_GT(compare(inputs, wrong, reference).worst_row_error, kHalfPrecision.out_row);
  wrong.out.set(7, NAN);
  EXPECT_TRUE(std::isnan(compare(inputs, wrong, reference).out_error));
  const int64_t empty_row = c.query_tokens * c.heads;
  DecodeResult nonzero{copy_of(reference.out), copy_of(reference.lse)};
  nonzero.out.set(empty_row * kValueDim + 3, 1e-6);
  EXPECT_FALSE(compare(inputs, nonzero, reference).problem.empty());
  DecodeResult nan_lse{copy_of(reference.out), copy_of(reference.lse)};
  nan_lse.lse.set(1, NAN);
  EXPECT_TRUE(std::isnan(compare(inputs, nan_lse, reference).worst_lse_error));
  // Row 0's LSE off by 1% of its scale (1 + max(|LSE|, its logit magnitude)): read as 1e-2.
  const std::vector<double> magnitudes = logit_magnitudes(inputs);
  EXPECT_GT(magnitudes[0], 0);
  const double lse0 = reference.lse.get(0);
  DecodeResult off_lse{copy_of(reference.out), copy_of(reference.lse)};
  off_lse.lse.set(0, lse0 + 1e-2 * (1 + std::max(std::fabs(lse0), magnitudes[0])));
  EXPECT_NEAR(compare(inputs, off_lse, reference).worst_lse_error, 1e-2, 1e-5);
}

#if OPENMLA_WITH_CUDA

std::string case_name(const DecodeCase& c) {
  auto dtype = [](DType t) {
    return t == DType::kBFloat16 ? "bf16" : t == DType::kFloat16 ? "fp16" : "fp8";
  };
  std::ostringstream name;
  name << "B" << c.batch << "_Sq" << c.query_tokens << "_Hq" << c.heads << "_Lk" << c.max_length
       << (c.varlen ? "_varlen" : "") << (c.causal ? "_causal" : "") << "_page" << c.page_size
       << "_q" << dtype(c.q_dtype) << "_kv" << dtype(c.kv_dtype)
       << (c.lse_base == LseBase::kBase2 ? "_lse2" : "") << (c.strided_q ? "_stridedq" : "")
       << (c.with_lse ? "" : "_nolse") << (c.cache_with_head_dim ? "_cache4d" : "")
       << (c.softmax_scale > 1 ? "_sharp" : "") << (c.query_magnitude > 1 ? "_hugeq" : "")
       << (c.query_magnitude < 1 ? "_tinyq" : "") << (c.padded_cache ? "_paddedcache" : "")
       << (c.pdl ? "_pdl" : "") << (c.max_seq_len > 0 ? "_bound" + std::to_string(c.max_seq_len) : "")
       << (c.tight_table ? "_tighttable" : "");
  return name.str();
}

// Test names and failure messages show the case, e.g. B64_Sq2_Hq128_Lk140_varlen_causal_...
void PrintTo(const DecodeCase& c, std::ostream* stream) { *stream << case_name(c); }

Tolerance tolerance_for(const DecodeCase& c) {
  if (c.kv_dtype != DType::kFloat8E4M3) return kHalfPrecision;
  return c.q_dtype == DType::kFloat8E4M3 && c.softmax_scale > 1 ? kFp8QuerySharpLogits : kFp8Scores;
}

void expect_close(const DecodeInputs& inputs, const DecodeResult& actual,
                  const DecodeResult& expected, const Tolerance& tolerance) {
  const Comparison c = compare(inputs, actual, expected);
  // The errors themselves, for the margins (--gtest_output=xml lists them per test).
  ::testing::Test::RecordProperty("out_error", std::to_string(c.out_error));
  ::testing::Test::RecordProperty("worst_row_error", std::to_string(c.worst_row_error));
  if (inputs.with_lse) ::testing::Test::RecordProperty("worst_lse_error", std::to_string(c.worst_lse_error));
  // OPENMLA_TEST_REPORT: every comparison's errors on stdout, for margins over many draws
  // (OPENMLA_TEST_SEED).
  if (std::getenv("OPENMLA_TEST_REPORT")) {
    std::printf("errors: output %.3g, worst row %.3g at %s, worst LSE %.3g at %s\n", c.out_error,
                c.worst_row_error, c.worst_row >= 0 ? row_name(inputs, c.worst_row).c_str() : "-",
                c.worst_lse_error, c.worst_lse_row >= 0 ? row_name(inputs, c.worst_lse_row).c_str() : "-");
  }
  EXPECT_TRUE(c.problem.empty()) << c.problem;
  EXPECT_LE(c.out_error, tolerance.out) << "whole output";  // NaN fails
  EXPECT_LE(c.worst_row_error, tolerance.out_row)
      << "worst " << (c.worst_row >= 0 ? row_name(inputs, c.worst_row) : "row");
  if (inputs.with_lse) {
    EXPECT_LE(c.worst_lse_error, tolerance.lse)
        << "worst LSE at " << (c.worst_lse_row >= 0 ? row_name(inputs, c.worst_lse_row) : "?");
  }
}

// The device copies of one call's inputs and outputs; params are ready to launch.
struct DeviceCall {
  DeviceTensor q, cache, block_table, seq_lens, out, lse;
  std::unique_ptr<DeviceTensor> workspace;
  DenseDecodeParams params;

  DeviceCall(const DecodeInputs& inputs, const DecodeResult& poisoned, Stream stream = nullptr)
      : q(inputs.q_buffer), cache(inputs.cache), block_table(inputs.block_table),
        seq_lens(inputs.seq_lens), out(poisoned.out), lse(poisoned.lse) {
    params = inputs.params;
    params.q = q.relocate(inputs.q_buffer, inputs.params.q);
    params.kv_cache = cache.relocate(inputs.cache, inputs.params.kv_cache);
    params.block_table = block_table.view();
    params.seq_lens = seq_lens.view();
    params.out = out.view();
    if (inputs.with_lse) params.lse = lse.view();
    params.stream = stream;
    // 0 bytes where the plan needs no split (no combine step); a buffer is given all the same.
    const size_t workspace_bytes = dense_decode_workspace_size(params);
    const std::initializer_list<int64_t> workspace_shape{int64_t(workspace_bytes)};
    workspace = std::make_unique<DeviceTensor>(DType::kUInt8, workspace_shape, uint8_t(0xff));
    params.workspace = workspace->view();
  }

  DecodeResult result(const DecodeInputs& inputs) const {
    DecodeResult result = poisoned_result(inputs);
    out.copy_to(result.out);  // synchronises the device first
    lse.copy_to(result.lse);
    return result;
  }
};

DecodeResult run_gpu(const DecodeInputs& inputs) {
  DeviceCall call(inputs, poisoned_result(inputs));
  dense_decode(call.params);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return call.result(inputs);
}

class DenseDecodeGpu : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DenseDecodeGpu, MatchesReference) {
  OPENMLA_REQUIRE_GPU();
  const DecodeCase& c = GetParam();
  auto rng = make_rng();
  const DecodeInputs inputs = make_inputs(c, sequence_lengths(c, rng), rng);
  const DecodeResult expected = run_reference(inputs);
  const DecodeResult actual = run_gpu(inputs);
  expect_close(inputs, actual, expected, tolerance_for(c));
  EXPECT_GT(compare(inputs, expected, expected).attending_rows, 0) << "a case that tests nothing";
}

constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16, kFp8 = DType::kFloat8E4M3;

DecodeCase with(DecodeCase c, void (*change)(DecodeCase&)) {
  change(c);
  return c;
}

// {B, Sq, Hq, Lk, page size, varlen, causal[, q dtype, cache dtype]}, then any extras.
const DecodeCase kSmallCases[] = {
    {1, 1, 1, 20, 16, false, false},
    {2, 2, 3, 140, 128, true, true},
    with({6, 4, 9, 140, 16, true, true}, [](DecodeCase& c) { c.lse_base = LseBase::kBase2; }),
    {2, 8, 16, 20, 32, false, true, kFp16, kFp16},
    {6, 1, 63, 140, 256, true, false, kBf16, kFp8},
    {2, 2, 64, 140, 64, true, true, kFp8, kFp8},
    {2, 2, 8, 140, 32, true, true, kFp8, kFp8},     // FP8 narrow kernel, 16 rows (3 warpgroups)
    // 17..32 rows: few requests of few tiles in two row tiles of 16 (16 + 4 rows here;
    // decode_plan.h latency_row_tiles), many in the narrow kernels' 32-row tile (40 requests).
    {3, 1, 20, 140, 64, true, false, kBf16, kFp8},   // FP8 narrow kernel
    {40, 1, 20, 140, 64, true, false, kBf16, kFp8},  // ... 32 rows (2 score warpgroups)
    {2, 2, 16, 140, 64, true, true},                 // 16-bit narrow kernel, Sq 2 x 16 heads
    {40, 2, 16, 140, 64, true, true},                // ... 32 rows
    with({1, 4, 128, 20, 16, false, false}, [](DecodeCase& c) { c.strided_q = true; }),
    with({6, 2, 126, 20, 32, true, true}, [](DecodeCase& c) { c.cache_with_head_dim = true; }),
    // Balanced plans (132 CTAs) with requests in two splits: the alternating kernel, bf16 and FP8.
    {66, 2, 64, 140, 32, true, true},
    {66, 1, 128, 140, 64, true, false, kBf16, kFp8},
    // Caches with padded token rows and pages (the TMA views' strides; NaN past each row's end).
    with({2, 2, 16, 140, 16, true, true}, [](DecodeCase& c) { c.padded_cache = true; }),
    with({2, 1, 9, 140, 32, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.padded_cache = true; }),
    // With PDL (each kernel's prefetch before the wait), a padded cache at pages of 16.
    with({2, 2, 16, 140, 16, true, true}, [](DecodeCase& c) {
      c.padded_cache = true;
      c.pdl = true;
    }),
    with({3, 1, 20, 140, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; }),
    // One request in value halves (split_common.cuh key_range_of) at pages of 16, causal, its
    // last tile partial (zeroed lines in both halves).
    {1, 1, 9, 1000, 16, false, true},
};

const DecodeCase kCoveringCases[] = {
    // bf16 / bf16: one long sequence over the whole GPU (D5), small batches (D4), compute-bound
    // head counts (D1, D3), large batches (D2); long sequences meet every Sq and page size.
    // softmax_scale 2 makes logits reach ~100: exp overflows float without the running max.
    {1, 1, 16, 4096, 64, false, false},
    {2, 1, 16, 4096, 256, true, false},
    {6, 1, 1, 4096, 32, true, true},
    {1, 2, 128, 4096, 128, false, true},
    {2, 4, 128, 4096, 64, true, true},  // 1024 rows x 8 splits: the warp-per-row combine of uniform plans
    {1, 8, 3, 4096, 16, false, true},
    with({2, 4, 16, 4096, 128, true, true}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    {64, 1, 16, 140, 64, true, false},
    with({64, 2, 128, 140, 16, true, true}, [](DecodeCase& c) { c.strided_q = true; }),
    with({64, 1, 128, 20, 256, false, false}, [](DecodeCase& c) { c.with_lse = false; }),
    {64, 8, 9, 140, 128, true, true},
    {64, 4, 63, 20, 16, false, true},
    {64, 8, 128, 140, 64, true, false},
    {2, 8, 126, 140, 32, false, true},
    // 17..32 rows with a 16-bit cache: the narrow kernel's 32-row tile (here 5 tiles a split
    // and more: decode_plan.h latency_row_tiles) or two row tiles of 16 (Sq 8 x 3 heads above:
    // a token across the tiles, causal; the PDL cases below).
    {4, 2, 16, 4096, 64, true, true},
    {64, 2, 13, 140, 32, true, true},
    {36, 2, 16, 1000, 16, true, true, kFp16, kFp16},
    with({2, 2, 16, 4096, 32, false, false}, [](DecodeCase& c) {
      c.strided_q = true;
      c.with_lse = false;
    }),
    {6, 4, 64, 140, 256, true, false},
    with({1, 1, 128, 4096, 256, false, false}, [](DecodeCase& c) { c.padded_cache = true; }),
    with({2, 2, 64, 140, 16, true, true}, [](DecodeCase& c) { c.padded_cache = true; }),
    // fp16 / fp16
    {6, 1, 128, 140, 32, true, true, kFp16, kFp16},
    {1, 2, 64, 4096, 256, false, false, kFp16, kFp16},
    {64, 4, 3, 140, 16, true, false, kFp16, kFp16},
    {3, 1, 32, 4096, 256, false, false, kFp16, kFp16},
    {2, 4, 64, 4096, 16, true, true, kFp16, kFp16},  // the 64-row kernel's small-page tiles, fp16
    // bf16 q, fp8 cache (kv_scale 0.05)
    {1, 1, 128, 4096, 64, false, false, kBf16, kFp8},
    with({64, 1, 16, 140, 128, true, true, kBf16, kFp8},
         [](DecodeCase& c) { c.cache_with_head_dim = true; }),
    {2, 8, 9, 4096, 16, true, true, kBf16, kFp8},
    {6, 4, 126, 20, 256, false, true, kBf16, kFp8},
    with({2, 1, 16, 140, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.query_magnitude = 1e5; }),
    with({2, 2, 64, 140, 64, false, true, kBf16, kFp8}, [](DecodeCase& c) { c.query_magnitude = 1e5; }),
    with({2, 1, 9, 140, 32, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.query_magnitude = 1e-6; }),
    // <= 16 rows with an FP8 cache (S^T on e4m3, V^T fragments widened in registers, five raw
    // stages): splits of 8 tiles wrap the stages at least once.
    {16, 1, 16, 4096, 16, true, false, kBf16, kFp8},
    {3, 1, 5, 4096, 256, false, true, kBf16, kFp8},
    // 17..32 rows with an FP8 cache: the same kernel with 32 rows (Sq 2 x 16 heads, 32 heads) or
    // in two row tiles of 16 (at most 8 tiles a split; 3 x 32 heads below, 22 splits).
    {16, 2, 16, 4096, 64, true, true, kBf16, kFp8},
    {40, 2, 16, 1000, 64, true, true, kBf16, kFp8},
    {48, 1, 32, 700, 32, true, false, kFp8, kFp8},
    {2, 3, 7, 140, 128, true, true, kBf16, kFp8},
    with({3, 1, 32, 4096, 32, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.query_magnitude = 1e5; }),
    // > 32 rows with an FP8 cache (64-row tiles, three raw stages with a bf16 q): splits of 4
    // tiles wrap the stages.
    {8, 4, 16, 4096, 64, true, true, kBf16, kFp8},
    // Logits reaching ~100 (log2 spread ~46): the softmax's lazy reference (alternating_kernel.cuh
    // own_softmax) both lags the maximum (p up to 2^8 in fp16) and moves well into a sequence;
    // and S's e4m3 accumulation error (~1e-3 of |S|'s partial sums) is scaled up with the logits,
    // in every FP8 kernel: the narrow one at 16 rows (two requests of Sq 4 or 2 x 16 heads: row
    // tiles, decode_plan.h latency_row_tiles) and 32 rows (Hq 32), the 64-row one (17 requests of
    // Sq 4 x 16 heads, Hq 64 and 128), each with a bf16 and an fp8 q (kFp8QuerySharpLogits). The
    // varlen cases hold rows of one key whose logit lies near 0 (logit_magnitudes).
    with({2, 4, 16, 4096, 32, true, true, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({2, 4, 16, 4096, 32, true, true, kFp8, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({2, 2, 16, 4096, 32, true, true, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({17, 4, 16, 1000, 32, true, true, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({17, 4, 16, 1000, 32, true, true, kFp8, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({8, 1, 128, 4096, 64, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({8, 1, 128, 4096, 64, false, false, kFp8, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({64, 1, 64, 1000, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({64, 1, 32, 1000, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    with({64, 1, 32, 1000, 64, true, false, kFp8, kFp8}, [](DecodeCase& c) { c.softmax_scale = 2.0f; }),
    {4, 2, 64, 4096, 32, false, true, kFp8, kFp8},
    with({2, 2, 64, 4096, 64, true, true, kFp8, kFp8}, [](DecodeCase& c) { c.padded_cache = true; }),
    // fp8 q (q_descale 0.02), fp8 cache
    {1, 1, 128, 4096, 64, false, false, kFp8, kFp8},
    {64, 2, 64, 140, 32, true, true, kFp8, kFp8},
    {6, 8, 16, 140, 128, false, true, kFp8, kFp8},
    {16, 2, 8, 4096, 64, true, true, kFp8, kFp8},
    {6, 2, 16, 4096, 256, true, true, kFp8, kFp8},
    with({2, 1, 3, 20, 16, true, false, kFp8, kFp8},
         [](DecodeCase& c) { c.lse_base = LseBase::kBase2; }),
    // > 32 rows with fp8 q (the 64-row kernel in fp16, q widened exactly): every page size, odd
    // head counts, a balanced ragged plan.
    {3, 4, 16, 700, 16, true, true, kFp8, kFp8},
    {3, 1, 126, 700, 256, true, false, kFp8, kFp8},
    {66, 1, 128, 1000, 16, true, true, kFp8, kFp8},
    // Balanced plans (the requests fill the GPU; ragged lengths: the long requests take two
    // splits, merged by the per-row combine kernel), for each kernel: narrow 16 and 32 rows,
    // alternating (bf16 and FP8 cache), and fp8 q.
    {130, 1, 3, 700, 16, true, false},
    {130, 2, 16, 700, 32, true, true, kBf16, kFp8},
    {66, 2, 64, 1000, 32, true, true},
    with({66, 1, 128, 1000, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.with_lse = false; }),
    with({130, 1, 9, 1000, 128, true, true, kFp8, kFp8}, [](DecodeCase& c) { c.lse_base = LseBase::kBase2; }),
    // Balanced plans walk the requests longest first (split_common.cuh cta_work) up to 256
    // requests (here with many equal lengths: ties broken by index), in grid order above.
    {256, 1, 16, 140, 32, true, true},
    {300, 1, 16, 140, 64, true, false},
    // With PDL: each kernel's first key tiles prefetched before the wait (one and two tiles a
    // split, pages of 16 to 256), and a balanced plan (no prefetch: the ranking needs seq_lens).
    with({1, 1, 16, 4096, 64, false, false}, [](DecodeCase& c) { c.pdl = true; }),
    with({2, 1, 16, 4096, 256, true, false}, [](DecodeCase& c) { c.pdl = true; }),
    with({6, 1, 1, 4096, 32, true, true}, [](DecodeCase& c) { c.pdl = true; }),
    with({16, 1, 16, 4096, 16, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; }),
    with({6, 2, 16, 4096, 256, true, true, kFp8, kFp8}, [](DecodeCase& c) { c.pdl = true; }),
    with({2, 4, 128, 4096, 16, true, true}, [](DecodeCase& c) { c.pdl = true; }),
    with({1, 1, 128, 4096, 64, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; }),
    with({130, 1, 3, 700, 16, true, false}, [](DecodeCase& c) { c.pdl = true; }),
    // A bound on the lengths (bound_decode_splits): D4 B1's plans without empty splits (FP8: 64
    // splits of a tile; bf16: 128 in value halves), and bounds below the real lengths (FP8 B2:
    // one split, no combine, for 4096 keys; bf16: 4 splits for up to 4096 keys, not halved).
    with({1, 1, 16, 4096, 64, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    with({1, 1, 16, 4096, 64, false, false}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    // The same FP8 plan (64 splits, the speculative tile 0) over 6 tiles a split, with 13 heads
    // (a bf16 q's rows split by 256 threads, rows past rows_here zeros).
    with({1, 1, 13, 24576, 64, false, false, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    // The 16-bit kernel's speculative first part (PDL, a uniform plan of one wave; D4 B1's 128
    // splits) with a bound: 3 tiles a split, not halved (the bound is a hint); Sq 2 x 8 heads,
    // causal, fp16, pages of 32 (two boxes a part), a partial last tile, halved.
    with({1, 1, 13, 24576, 64, false, false}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    with({1, 2, 8, 3000, 32, false, true, kFp16, kFp16}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    // ... at pages of 256 (a tile is an 8-key-group offset inside its page) and of 16 (four boxes
    // a part: more than a speculative copy takes, so only the entries are read early).
    with({1, 1, 16, 4096, 256, false, false}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    with({1, 1, 16, 4000, 16, false, false}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    // ... with Sq 2 x 16 heads (multi-token prediction: two row tiles of 16, never halved),
    // causal, 1 and 6 tiles a split, pages of 32 and 64, both caches (FP8: the speculative tile).
    with({1, 2, 16, 4096, 32, false, true}, [](DecodeCase& c) { c.pdl = true; }),
    with({1, 2, 16, 24576, 64, false, true}, [](DecodeCase& c) { c.pdl = true; c.max_seq_len = 4096; }),
    with({2, 2, 16, 4000, 64, false, true, kBf16, kFp8}, [](DecodeCase& c) { c.pdl = true; }),
    with({2, 1, 16, 4096, 64, true, false, kFp8, kFp8}, [](DecodeCase& c) { c.max_seq_len = 64; }),
    with({6, 2, 8, 4096, 32, true, true}, [](DecodeCase& c) { c.max_seq_len = 100; }),
    // The table's capacity as the bound: D4 B1's FP8 plan of 64 splits; one tile's keys (bf16:
    // two splits in value halves; FP8 B2: one split, no combine).
    with({1, 1, 16, 4096, 64, false, false, kFp8, kFp8}, [](DecodeCase& c) { c.pdl = true; c.tight_table = true; }),
    with({1, 1, 16, 20, 16, false, false}, [](DecodeCase& c) { c.tight_table = true; }),
    with({2, 1, 16, 60, 64, true, false, kBf16, kFp8}, [](DecodeCase& c) { c.tight_table = true; }),
};

std::string param_name(const ::testing::TestParamInfo<DecodeCase>& info) {
  return case_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Small, DenseDecodeGpu, ::testing::ValuesIn(kSmallCases), param_name);
INSTANTIATE_TEST_SUITE_P(Covering, DenseDecodeGpu, ::testing::ValuesIn(kCoveringCases), param_name);

TEST(DenseDecodeGpuEdges, AllRequestsEmpty) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const DecodeCase c{3, 2, 16, 0, 64, false, true};
  const DecodeInputs inputs = make_inputs(c, {0, 0, 0}, rng);
  const DecodeResult actual = run_gpu(inputs);
  const Comparison comparison = compare(inputs, actual, run_reference(inputs));
  EXPECT_EQ(comparison.attending_rows, 0);
  EXPECT_TRUE(comparison.problem.empty()) << comparison.problem;
}

// A NaN query row gives a NaN output row and LSE, as in the reference, also when the keys are
// split over many CTAs and merged (the combine must not drop the NaN and report an empty row);
// the other heads stay finite.
// One query row of NaN (or inf: its logits are inf - inf = NaN) poisons that row only, in each
// kernel: narrow (16 heads), alternating (64 heads, bf16 cache, and FP8 cache, where a
// bf16 q is scaled into fp16's range from the tile's largest value: an inf row must not switch
// that off for the 1e5-sized rows beside it).
TEST(DenseDecodeGpuEdges, NanQueryRowStaysNanAcrossSplits) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const DecodeCase huge_query_fp8 = with({1, 1, 64, 4096, 64, false, false, DType::kBFloat16, DType::kFloat8E4M3},
                                         [](DecodeCase& c) { c.query_magnitude = 1e5; });
  const DecodeCase huge_query_fp8_16_rows = with({1, 1, 16, 4096, 64, false, false, DType::kBFloat16, DType::kFloat8E4M3},
                                                 [](DecodeCase& c) { c.query_magnitude = 1e5; });
  const DecodeCase huge_query_fp8_32_rows = with({1, 1, 32, 4096, 64, false, false, DType::kBFloat16, DType::kFloat8E4M3},
                                                 [](DecodeCase& c) { c.query_magnitude = 1e5; });
  // A table of 64 + 2 columns gives 32 and 64 rows two and four row tiles of 16 (the narrow
  // kernel: decode_plan.h latency_row_tiles); one of 1024 the 32- and 64-row kernels.
  for (const int64_t table_width : {int64_t(0), int64_t(1024)})
  for (const DecodeCase& c : {DecodeCase{1, 1, 16, 4096, 64, false, false}, DecodeCase{1, 1, 64, 4096, 64, false, false},
                              huge_query_fp8, huge_query_fp8_16_rows, huge_query_fp8_32_rows}) {
    SCOPED_TRACE(case_name(c) + " table width " + std::to_string(table_width));
    DecodeInputs inputs = make_inputs(c, {4096}, rng, table_width);
    constexpr int64_t kNanHead = 3;
    const float poison = c.kv_dtype == DType::kFloat8E4M3 ? INFINITY : NAN;
    for (int64_t d = 0; d < kDim; ++d) inputs.q_buffer.set(kNanHead * kDim + d, poison);
    const DecodeResult actual = run_gpu(inputs);
    const DecodeResult expected = run_reference(inputs);
    for (int64_t head = 0; head < c.heads; ++head) {
      const bool nan_head = head == kNanHead;
      EXPECT_EQ(std::isnan(expected.lse.get(head)), nan_head) << "reference, head " << head;
      EXPECT_EQ(std::isnan(actual.lse.get(head)), nan_head) << "GPU LSE, head " << head;
      for (int64_t d = 0; d < kValueDim; d += 37) {
        const float value = actual.out.get(head * kValueDim + d);
        EXPECT_EQ(std::isnan(value), nan_head) << "GPU out, head " << head << " column " << d;
        if (!nan_head) EXPECT_TRUE(std::isfinite(value)) << "GPU out, head " << head << " column " << d;
      }
    }
  }
}

// The same through a balanced plan's per-row combine: 130 requests of ragged lengths, the
// long ones in two splits; a NaN head in request 0 (long) stays NaN, its other heads and the
// other requests stay finite.
TEST(DenseDecodeGpuEdges, NanQueryRowStaysNanInBalancedCombine) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const DecodeCase c{130, 1, 16, 2048, 64, true, false};
  std::vector<int32_t> lengths(size_t(c.batch));
  for (size_t b = 0; b < lengths.size(); ++b) lengths[b] = b % 3 == 0 ? 2048 : 64;
  DecodeInputs inputs = make_inputs(c, lengths, rng);
  constexpr int64_t kNanHead = 3;
  for (int64_t d = 0; d < kDim; ++d) inputs.q_buffer.set(kNanHead * kDim + d, NAN);
  const DecodeResult actual = run_gpu(inputs);
  const DecodeResult expected = run_reference(inputs);
  for (int64_t row = 0; row < row_count(inputs); ++row) {
    const bool nan_row = row == kNanHead;
    EXPECT_EQ(std::isnan(expected.lse.get(row)), nan_row) << "reference, " << row_name(inputs, row);
    EXPECT_EQ(std::isnan(actual.lse.get(row)), nan_row) << "GPU LSE, " << row_name(inputs, row);
    for (int64_t d = 0; d < kValueDim; d += 37) {
      const float value = actual.out.get(row * kValueDim + d);
      EXPECT_EQ(std::isnan(value), nan_row) << "GPU out, " << row_name(inputs, row) << " column " << d;
    }
  }
}

// Every byte still 0xff (poison): nothing was written.
bool all_poison(const HostTensor& tensor) {
  return std::all_of(tensor.bytes.begin(), tensor.bytes.end(), [](uint8_t byte) { return byte == 0xff; });
}

// A CUDA call must bring the workspace that dense_decode_workspace_size asks for; the API
// refuses before launching, leaving the outputs untouched.
TEST(DenseDecodeGpuEdges, RejectsMissingOrShortWorkspace) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  const DecodeCase c{2, 1, 16, 140, 64, true, false};
  const DecodeInputs inputs = make_inputs(c, sequence_lengths(c, rng), rng);
  DeviceCall call(inputs, poisoned_result(inputs));
  const size_t needed = dense_decode_workspace_size(call.params);
  ASSERT_GT(needed, 1u) << "2 requests of 16 heads should be split across the GPU";
  DeviceTensor short_workspace(DType::kUInt8, {int64_t(needed) - 1}, 0xff);
  DenseDecodeParams params = call.params;
  params.workspace = {};
  expect_invalid_argument([&] { dense_decode(params); }, "workspace");
  params.workspace = short_workspace.view();
  expect_invalid_argument([&] { dense_decode(params); }, "workspace");
  const DecodeResult untouched = call.result(inputs);
  EXPECT_TRUE(all_poison(untouched.out) && all_poison(untouched.lse));
}

// A cache whose token rows are not 16-byte multiples apart cannot be described to the TMA: an
// InvalidArgument error naming kv_cache, before any launch (the outputs stay poisoned).
TEST(DenseDecodeGpuEdges, RejectsCacheStridesTheTmaCannotTake) {
  OPENMLA_REQUIRE_GPU();
  for (const DType kv_dtype : {DType::kBFloat16, DType::kFloat8E4M3}) {
    auto rng = make_rng();
    DecodeCase c{2, 1, 16, 140, 64, true, false, DType::kBFloat16, kv_dtype};
    c.padded_cache = true;
    const DecodeInputs inputs = make_inputs(c, sequence_lengths(c, rng), rng);
    DeviceCall call(inputs, poisoned_result(inputs));
    DenseDecodeParams params = call.params;
    // 580 bf16 elements = 1160 bytes, 584 e4m3 = 584 bytes: both inside the padded rows.
    params.kv_cache.strides[1] = kv_dtype == DType::kBFloat16 ? 580 : 584;
    expect_invalid_argument([&] { dense_decode(params); }, "kv_cache");
    const DecodeResult untouched = call.result(inputs);
    EXPECT_TRUE(all_poison(untouched.out) && all_poison(untouched.lse));
  }
}

// One call captured in a CUDA graph (no warm-up call of its own; global capture mode, as torch
// uses), then replayed after new seq_lens, block tables, cache pages and queries were copied
// into the same device buffers: each replay must follow the new values. The workspace is
// poisoned once, before the capture, and then keeps what each replay leaves in it, as in an
// engine. `after_replay` (optional) inspects the call after replay `set`.
void expect_replays_follow(const DecodeCase& c, const std::vector<std::vector<int32_t>>& length_sets,
                           int64_t table_width, int64_t page_count,
                           const std::function<void(const DeviceCall&, size_t)>& after_replay = nullptr) {
  auto rng = make_rng();
  const DecodeInputs captured = make_inputs(c, length_sets[0], rng, table_width, page_count);
  const DecodeResult poisoned = poisoned_result(captured);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);  // blocking: ordered after cudaMemcpy
  DeviceCall call(captured, poisoned, stream);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  bool launched = true;
  try {
    dense_decode(call.params);
  } catch (const Error& error) {
    launched = false;
    ADD_FAILURE() << "dense_decode during capture: " << error.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "capture invalidated";
  ASSERT_TRUE(launched);
  cudaGraphExec_t replay = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&replay, graph, 0), cudaSuccess);

  for (size_t set = 0; set < length_sets.size(); ++set) {
    const std::vector<int32_t>& lengths = length_sets[set];
    std::string listed;
    for (size_t b = 0; b < lengths.size() && b < 4; ++b) listed += (b ? ", " : "") + std::to_string(lengths[b]);
    SCOPED_TRACE("length set " + std::to_string(set) + ": seq_lens " + listed + (lengths.size() > 4 ? ", ..." : ""));
    const DecodeInputs inputs = make_inputs(c, lengths, rng, table_width, page_count);
    call.q.copy_from(inputs.q_buffer);
    call.cache.copy_from(inputs.cache);
    call.block_table.copy_from(inputs.block_table);
    call.seq_lens.copy_from(inputs.seq_lens);
    call.out.copy_from(poisoned.out);
    call.lse.copy_from(poisoned.lse);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(replay, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_close(inputs, call.result(inputs), run_reference(inputs), kHalfPrecision);
    if (after_replay) after_replay(call, set);
  }
  EXPECT_EQ(cudaGraphExecDestroy(replay), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// A uniform plan (3 requests over the whole GPU): a longest request that moves and lengths
// that change how much of the split plan is used.
TEST(DenseDecodeGpuGraph, ReplayFollowsNewLengthsAndBlockTables) {
  OPENMLA_REQUIRE_GPU();
  const DecodeCase c{3, 2, 16, 640, 64, true, true};
  expect_replays_follow(c, {{100, 0, 640}, {640, 1, 0}, {17, 639, 64}}, /*table_width=*/10,
                        /*page_count=*/3 * 10 + 2);  // room for any lengths <= 640
}

// The 16-bit narrow kernel's value halves (split_common.cuh key_range_of): 3 requests of 16 rows
// take 44 splits, and a request of at most 22 key tiles (1408 keys) has each tile computed by two
// CTAs, one per value half. Requests with and without halves in the same call, and a request
// that changes between them from replay to replay (its odd splits' LSE slots must be -inf again
// after a replay that wrote real LSEs there).
TEST(DenseDecodeGpuGraph, ReplayFollowsValueHalves) {
  OPENMLA_REQUIRE_GPU();
  const DecodeCase c{3, 1, 16, 2048, 64, true, false};
  expect_replays_follow(c, {{100, 1408, 0}, {2048, 17, 1409}, {1408, 2048, 64}}, /*table_width=*/34,
                        /*page_count=*/3 * 34 + 2);
}

// One request of 16 rows (D4 B1's plan: 128 splits on 132 SMs) in value halves: replays switch
// between halves (at most 64 tiles; a single key; a partial last tile), a request too long to
// halve (128 tiles: one a split, every split whole) and no keys at all. With PDL each split
// issues its first tile part speculatively (key_tiles.cuh start_split_cta), in both halves where
// the request is halved. With an FP8 cache (no halves) the same 128 splits, half of them empty
// at 4096 keys, issue their whole first tiles speculatively with PDL.
TEST(DenseDecodeGpuGraph, ReplayFollowsOneRequestsValueHalves) {
  OPENMLA_REQUIRE_GPU();
  for (const DType kv_dtype : {DType::kBFloat16, DType::kFloat8E4M3})
  for (const bool pdl : {false, true}) {
    SCOPED_TRACE(std::string(kv_dtype == DType::kBFloat16 ? "bf16 cache, " : "fp8 cache, ") + (pdl ? "pdl" : "no pdl"));
    DecodeCase c{1, 1, 16, 8192, 64, false, false, DType::kBFloat16, kv_dtype};
    c.pdl = pdl;
    expect_replays_follow(c, {{4096}, {8192}, {1}, {0}, {4033}, {4096}}, /*table_width=*/130,
                          /*page_count=*/130 + 2);
  }
}

// Captured with a bound on the lengths (max_seq_len 4096: an FP8 cache gets 64 splits, a bf16
// one 128 in value halves), replayed with lengths within it and past it (8192: 128 tiles over
// those splits, two a split): a bound only trims the plan, never the keys a call reads.
TEST(DenseDecodeGpuGraph, ReplayWithABoundFollowsLongerLengths) {
  OPENMLA_REQUIRE_GPU();
  for (const DType kv_dtype : {DType::kFloat8E4M3, DType::kBFloat16}) {
    SCOPED_TRACE(kv_dtype == DType::kBFloat16 ? "bf16 cache" : "fp8 cache");
    DecodeCase c{1, 1, 16, 8192, 64, false, false, DType::kBFloat16, kv_dtype};
    c.max_seq_len = 4096;
    c.pdl = true;
    expect_replays_follow(c, {{4096}, {8192}, {1}, {0}, {4033}}, /*table_width=*/130,
                          /*page_count=*/130 + 2);
  }
}

// A balanced plan (130 requests): equal lengths (one split each, no partials), then ragged ones
// (the long requests take two splits), then equal again: the combine step must follow each
// replay's split counts, never an earlier one's (a stale 2 would merge old partials over a
// request's direct output). The counts in the workspace show that both kinds of request ran.
TEST(DenseDecodeGpuGraph, BalancedReplayFollowsSplitCounts) {
  OPENMLA_REQUIRE_GPU();
  constexpr int64_t kBatch = 130, kPage = 16, kLongest = 640;
  const DecodeCase c{kBatch, 1, 3, kLongest, kPage, true, false};
  const DenseDecodePlan plan = plan_dense_decode(kBatch, c.query_tokens, c.heads,
                                                 planning_sm_count(Device{DeviceType::kCUDA, 0}));
  if (!plan.balanced) GTEST_SKIP() << "this GPU's SM count gives 130 requests a uniform plan";
  std::vector<int32_t> equal(kBatch, 300), ragged(kBatch, 0), equal_long(kBatch, kLongest);
  for (int64_t b = 0; b < kBatch; ++b) ragged[size_t(b)] = int32_t(b % 3 == 0 ? kLongest : b % 3 == 1 ? 0 : 5 * b);
  const std::vector<std::vector<int32_t>> sets{equal, ragged, equal_long, ragged};
  // [split][batch][rows] partial rows of 512 floats, as many LSE floats, then the counts.
  const size_t partial_rows = size_t(plan.splits * kBatch * c.query_tokens * c.heads);
  const size_t counts_offset = partial_rows * (512 + 1) * sizeof(float);
  auto check_counts = [&](const DeviceCall& call, size_t set) {
    std::vector<int32_t> counts(kBatch);
    ASSERT_EQ(cudaMemcpy(counts.data(), static_cast<uint8_t*>(call.workspace->pointer) + counts_offset,
                         counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    // Equal lengths: one split each. Ragged (10 tiles at most, a fair share of ~5 tiles per
    // SM, so chunks of 1 tile): the longest requests take two, the empty ones one.
    const bool is_ragged = set % 2 == 1;
    for (int64_t b = 0; b < kBatch; ++b) {
      const int32_t length = sets[set][size_t(b)];
      const int32_t expected = !is_ragged || length == 0 ? 1 : length == kLongest ? 2 : counts[size_t(b)];
      EXPECT_TRUE(counts[size_t(b)] == 1 || counts[size_t(b)] == 2) << "request " << b << ": " << counts[size_t(b)];
      EXPECT_EQ(counts[size_t(b)], expected) << "request " << b << " (length " << length << ") of set " << set;
    }
  };
  const int64_t width = kLongest / kPage;
  expect_replays_follow(c, sets, width, kBatch * width + 2, check_counts);
}

// With PDL, dense_decode's kernels may start while the previous kernel in the stream still
// writes their inputs. Here that kernel writes seq_lens and the block table 100 us after letting
// the op start, over hostile values (lengths far past the table, a negative one; garbage and
// negative pages), so that what the CTAs prefetch before their wait (key_tiles.cuh
// start_split_cta) follows stale values. The results must follow the new ones; and a
// speculative read outside the table would fault (compute-sanitizer: out of bounds). A second
// form keeps the true lengths and moves every page to the next one of the cache: a narrow CTA at
// 16 rows then issues its first tile (16-bit: its first part) speculatively from valid but wrong
// pages, and must load it again.
TEST(DenseDecodeGpuPdl, InputsWrittenByThePreviousKernel) {
  OPENMLA_REQUIRE_GPU();
  const DecodeCase cases[] = {
      {2, 1, 16, 4096, 64, true, false},              // narrow 16-bit kernel, 16 rows (speculative first part)
      {2, 2, 16, 4096, 16, true, true, kBf16, kFp8},  // narrow FP8 kernel, 2 row tiles of 16, pages of 16
      {40, 2, 16, 1000, 64, true, false, kBf16, kFp8},  // ... 32 rows (40 requests)
      {2, 1, 128, 4096, 256, false, false},           // 64-row kernel
      {2, 1, 16, 4096, 128, true, false, kFp8, kFp8},
      {1, 1, 16, 4096, 64, true, false, kBf16, kFp8},  // D4 B1's plan (66 splits): early entries, speculative tile 0
      {1, 1, 16, 4096, 64, true, false, kFp8, kFp8},   // the same with an fp8 q
      {1, 1, 16, 4096, 64, true, false},  // the same in the 16-bit kernel: value halves, speculative first part
      {1, 2, 16, 4096, 64, true, true},   // Sq 2 x 16 heads (2 row tiles of 16): speculative first part
      {1, 2, 16, 4096, 64, true, true, kBf16, kFp8},  // ... FP8 cache: speculative tile 0
      // ... with a bound (128 splits still)
      with({1, 1, 16, 4096, 64, true, false}, [](DecodeCase& c) { c.max_seq_len = 4096; }),
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);  // blocking: ordered after cudaMemcpy
  for (const bool plausible : {false, true})
  for (DecodeCase c : cases) {
    c.pdl = true;
    SCOPED_TRACE(case_name(c) + (plausible ? " (stale: the next pages)" : " (stale: hostile values)"));
    auto rng = make_rng();
    const DecodeInputs inputs = make_inputs(c, sequence_lengths(c, rng), rng);
    const DecodeResult poisoned = poisoned_result(inputs);
    DeviceCall call(inputs, poisoned, stream);
    // A first call loads the kernels (lazy module loading would hold the call below back until
    // the late writes are done); then the outputs are poisoned again.
    dense_decode(call.params);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    call.out.copy_from(poisoned.out);
    call.lse.copy_from(poisoned.lse);
    const DeviceTensor true_lengths(inputs.seq_lens), true_table(inputs.block_table);
    const int64_t batch = int64_t(inputs.lengths.size()), width = inputs.block_table.numel() / batch;
    HostTensor stale_lengths(DType::kInt32, {batch}), stale_table(DType::kInt32, {batch, width});
    const int32_t lengths[] = {std::numeric_limits<int32_t>::max(), -7, 1 << 30};
    const int64_t cache_pages = inputs.cache.view().size(0);
    for (int64_t b = 0; b < batch; ++b) {
      stale_lengths.data<int32_t>()[b] = plausible ? inputs.lengths[size_t(b)] : lengths[b % 3];
    }
    for (int64_t i = 0; i < batch * width; ++i) {
      const int32_t page = inputs.block_table.data<int32_t>()[i];
      stale_table.data<int32_t>()[i] = !plausible ? (i % 2 ? kGarbagePage : -5)
                                       : page >= 0 && page < cache_pages ? int32_t((page + 1) % cache_pages)
                                                                         : page;
    }
    call.seq_lens.copy_from(stale_lengths);
    call.block_table.copy_from(stale_table);
    launch_late_copies(true_lengths, call.seq_lens, true_table, call.block_table, /*delay_us=*/100, stream);
    dense_decode(call.params);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_close(inputs, call.result(inputs), run_reference(inputs), tolerance_for(c));
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

#endif  // OPENMLA_WITH_CUDA

}  // namespace
}  // namespace openmla::testing
