// openmla-bench: dense MLA decode (include/openmla/dense_decode.h), PERF.md cases D1-D5 with a
// page size of 64, and a few of them again with the other page sizes the op takes (named
// "D2 page=16 Hq=16 B=128": engines run pages of 16 to 256 tokens), each with a BF16 cache
// ("bf16"), an FP8 cache read by a BF16 query ("fp8"), and an FP8 cache read by an FP8 query
// ("fp8-qkv": e4m3 tensor cores; FlashMLA's FP8 form).
//
// Bytes: every byte the op must read once (Q, the live KV rows = sum of seq_lens x 576
// values, the block-table entries of the live pages, seq_lens) plus every byte it writes once
// (O in bf16, the fp32 LSE, which the cases request). FLOPs: 2 * Hq * (576 + 512) per attended
// (query token, key) pair; with Sq > 1 the cases are causal (bottom-right, as speculative
// decoding runs them), so query s of a request of length L attends L - Sq + 1 + s keys.
// D4 and D5 take a few microseconds: they are timed as whole ops by CUDA-graph replay.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "openmla/dense_decode.h"
#include "openmla/numerics.h"

namespace openmla::bench {

namespace {

constexpr int64_t kPageSize = 64;  // PERF.md's cases
constexpr int kGraphCalls = 20;  // calls per captured graph for the latency-bound cases
constexpr uint64_t kVarlenSeed = 20240611;  // D3's lengths: the same in every run
constexpr int64_t kDeepSeekContext = 163840;  // DeepSeek-V3's longest context: an engine's table width
// FP8 values stored over [-8, 8) with a scale of 1/8: real values in [-1, 1) like the BF16
// cases, while the stored ones use a good part of the E4M3 range.
constexpr float kFp8StoredRange = 8.0f;

enum class Format { kBf16, kFp8Cache, kFp8QueryAndCache };

const char* format_label(Format format) {
  switch (format) {
    case Format::kBf16: return "bf16";
    case Format::kFp8Cache: return "fp8";
    case Format::kFp8QueryAndCache: return "fp8-qkv";
  }
  return "?";
}

struct DecodeShape {
  std::string name;              // "D1 Hq=128 B=4"
  int64_t query_tokens = 1;      // Sq
  int64_t heads = 16;            // Hq
  std::vector<int32_t> lengths;  // seq_lens, one per request (B = lengths.size())
  bool graph_replay = false;
  bool pdl = false;  // DenseDecodeParams::enable_pdl
  // DenseDecodeParams::max_seq_len = the longest length (as TokenSpeed's and FlashAttention's
  // callers pass it); case name ends in "max_seq_len"
  bool bound = false;
  // Block-table columns for this many keys at least (0: the longest request's pages). An
  // engine's table spans its longest context (vLLM: max_model_len), which is no bound on the
  // lengths; case name contains "wide_table".
  int64_t table_keys = 0;
  int64_t page_size = kPageSize;
};

Case dense_decode_case(const DecodeShape& shape, Format format) {
  const int64_t batch = int64_t(shape.lengths.size());
  const int64_t rows = batch * shape.query_tokens * shape.heads;  // (request, token, head)
  const double q_bytes = format == Format::kFp8QueryAndCache ? 1 : 2;
  const double kv_bytes = format == Format::kBf16 ? 2 : 1;
  const int64_t page_size = shape.page_size;
  auto pages_of = [page_size](int64_t length) { return (length + page_size - 1) / page_size; };
  int64_t max_pages = 0, total_pages = 0;
  double keys = 0, attended_pairs = 0;
  for (int32_t length : shape.lengths) {
    max_pages = std::max(max_pages, pages_of(length));
    total_pages += pages_of(length);
    keys += length;
    // Causal (Sq > 1): token s sees L - Sq + 1 + s keys; summed over s.
    attended_pairs += double(shape.query_tokens) * length -
                      double(shape.query_tokens) * double(shape.query_tokens - 1) / 2;
  }

  max_pages = std::max(max_pages, pages_of(shape.table_keys));

  Case decode;
  decode.op = "dense_decode";
  decode.name = shape.name;
  decode.dtype = format_label(format);
  decode.bytes = rows * kHeadDim * q_bytes + keys * kHeadDim * kv_bytes +
                 (total_pages + batch) * 4.0 + rows * (kLatentDim * 2.0 + 4.0);
  decode.flops = 2.0 * shape.heads * attended_pairs * (kHeadDim + kLatentDim);
  decode.prepare = [shape, format, batch, max_pages, total_pages, pages_of, bytes = decode.bytes] {
    auto make = [&](int copy) {
      OwnedParams<DenseDecodeParams> in(copy);
      DenseDecodeParams& params = in.params;
      // Each request gets its own pages, in a random order over the whole cache; entries past
      // a request's last page point at page 0 (never read).
      const std::vector<int32_t> order = shuffled_pages(total_pages, in.seed);
      std::vector<int32_t> block_table(size_t(batch * max_pages), 0);
      size_t next = 0;
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t p = 0; p < pages_of(shape.lengths[size_t(b)]); ++p) {
          block_table[size_t(b * max_pages + p)] = order[next++];
        }
      }
      const bool fp8_query = format == Format::kFp8QueryAndCache;
      const float query_range = fp8_query ? kFp8StoredRange : 1.0f;
      const float cache_range = format == Format::kBf16 ? 1.0f : kFp8StoredRange;
      params.q = in.random(fp8_query ? DType::kFloat8E4M3 : DType::kBFloat16,
                           {batch, shape.query_tokens, shape.heads, kHeadDim}, -query_range,
                           query_range);
      params.kv_cache = in.random(format == Format::kBf16 ? DType::kBFloat16 : DType::kFloat8E4M3,
                                  {total_pages, shape.page_size, kHeadDim}, -cache_range, cache_range);
      params.q_descale = 1.0f / query_range;
      params.kv_scale = 1.0f / cache_range;
      params.block_table = in.upload(block_table, {batch, max_pages});
      params.seq_lens = in.upload(shape.lengths, {batch});
      params.softmax_scale = 1.0f / std::sqrt(float(kHeadDim));
      params.causal = shape.query_tokens > 1;
      params.enable_pdl = shape.pdl;
      params.max_seq_len = shape.bound ? *std::max_element(shape.lengths.begin(), shape.lengths.end()) : 0;
      params.out = in.output(DType::kBFloat16, {batch, shape.query_tokens, shape.heads, kLatentDim});
      params.lse = in.output(DType::kFloat32, {batch, shape.query_tokens, shape.heads});
      params.workspace = in.output(DType::kUInt8, {int64_t(dense_decode_workspace_size(params))});
      return in;
    };
    Launcher launcher = rotated_launcher(bytes, make, &dense_decode);
    if (shape.graph_replay) launcher.graph_calls = kGraphCalls;
    return launcher;
  };
  return decode;
}

std::string shape_name(const char* id, int64_t heads, int64_t batch) {
  return std::string(id) + " Hq=" + std::to_string(heads) + " B=" + std::to_string(batch);
}

DecodeShape uniform_shape(const char* id, int64_t batch, int64_t query_tokens, int64_t heads,
                          int32_t length, bool graph_replay = false, bool pdl = false) {
  DecodeShape shape;
  shape.name = shape_name(id, heads, batch) + (pdl ? " pdl" : "");
  shape.pdl = pdl;
  shape.query_tokens = query_tokens;
  shape.heads = heads;
  shape.lengths.assign(size_t(batch), length);
  shape.graph_replay = graph_replay;
  return shape;
}

}  // namespace

void add_dense_decode_cases(std::vector<Case>& cases) {
  std::vector<DecodeShape> shapes;
  for (int64_t heads : {16, 32, 128}) {
    for (int64_t batch : {4, 8, 16}) shapes.push_back(uniform_shape("D1", batch, 4, heads, 81920));
  }
  for (int64_t heads : {16, 32, 64, 128}) {
    shapes.push_back(uniform_shape("D2", 128, 1, heads, 8192));
  }
  DecodeShape varlen = uniform_shape("D3", 128, 2, 128, 0);
  varlen.name += " Sq=2 varlen";
  std::mt19937_64 rng(kVarlenSeed);
  std::uniform_int_distribution<int32_t> length(4096, 32768);
  for (int32_t& request_length : varlen.lengths) request_length = length(rng);
  shapes.push_back(varlen);
  // The latency cases also with programmatic dependent launch (case name ends in "pdl").
  for (bool pdl : {false, true}) {
    for (int64_t batch : {1, 2, 4}) shapes.push_back(uniform_shape("D4", batch, 1, 16, 4096, true, pdl));
    shapes.push_back(uniform_shape("D5", 1, 1, 16, 32768, true, pdl));
  }
  // Multi-token prediction (DeepSeek-V3's MTP: draft tokens beside each new one, so Sq 2 x Hq 16
  // = 32 rows, the narrow kernels' second row count, or Sq 4: 64 rows): D4's and D5's latency
  // with PDL, and D2's lengths at a batch whose CTAs still leave SMs idle (decode_plan.h
  // latency_row_tiles). Not PERF.md cases: "D4 Sq=2 Hq=16 B=1 pdl" (a filter for "D4 Hq=16"
  // leaves them out).
  for (DecodeShape shape :
       {uniform_shape("D4", 1, 2, 16, 4096, true, true), uniform_shape("D4", 2, 2, 16, 4096, true, true),
        uniform_shape("D5", 1, 2, 16, 32768, true, true), uniform_shape("D2", 32, 2, 16, 8192),
        uniform_shape("D4", 1, 4, 16, 4096, true, true), uniform_shape("D4", 2, 4, 16, 4096, true, true),
        uniform_shape("D4", 4, 4, 16, 4096, true, true)}) {
    shape.name.insert(2, shape.query_tokens == 4 ? " Sq=4" : " Sq=2");
    shapes.push_back(shape);
  }
  // The cases above size the block table to the longest request, which bounds the lengths
  // (dense_decode.h max_seq_len): no split without keys is launched. With PDL, a table for
  // DeepSeek-V3's 163840-token context as an engine sizes it, without and with max_seq_len (FP8
  // D4 B1: 128 splits, half of them without keys, or 64; the bf16 plans and D5 keep theirs).
  for (bool bound : {false, true}) {
    for (int64_t batch : {1, 2, 4}) {
      DecodeShape shape = uniform_shape("D4", batch, 1, 16, 4096, true, true);
      shape.name += bound ? " wide_table max_seq_len" : " wide_table";
      shape.table_keys = kDeepSeekContext;
      shape.bound = bound;
      shapes.push_back(shape);
    }
  }

  for (Format format : {Format::kBf16, Format::kFp8Cache, Format::kFp8QueryAndCache}) {
    for (const DecodeShape& shape : shapes) cases.push_back(dense_decode_case(shape, format));
  }

  // The other page sizes on one case of each kernel: the narrow kernels (D2 Hq16), the 64-row
  // kernel streaming (D2 Hq64) and compute-bound (D1 Hq128 B4), and the latency chain (D4 B1).
  // A tile of pages below 64 tokens takes 64 / page TMA boxes per part (perf log session 37),
  // a page above 64 several tiles.
  std::vector<DecodeShape> paged;
  for (int64_t page_size : {16, 32, 128, 256}) {
    const std::string page = " page=" + std::to_string(page_size);
    for (DecodeShape shape : {uniform_shape("D2", 128, 1, 16, 8192), uniform_shape("D2", 128, 1, 64, 8192),
                              uniform_shape("D1", 4, 4, 128, 81920),
                              uniform_shape("D4", 1, 1, 16, 4096, true, true)}) {
      shape.name.insert(2, page);  // "D2 page=16 Hq=16 B=128": a filter for "D2 Hq=16" keeps to page 64
      shape.page_size = page_size;
      paged.push_back(shape);
    }
  }
  for (Format format : {Format::kBf16, Format::kFp8Cache}) {
    for (const DecodeShape& shape : paged) cases.push_back(dense_decode_case(shape, format));
  }
}

}  // namespace openmla::bench
