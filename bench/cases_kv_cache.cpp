// openmla-bench: the KV-cache utilities of include/openmla/kv_cache.h. All are memory-bound,
// so each case counts bytes only: every input byte the op must read once plus every output
// byte it must write once. Each case moves 0.5-2 GB per call, far beyond the 50-60 MB L2 of
// an H100/H200 and long enough (100-500 us) that launch ramp-up and tail stay a few percent:
// a 512K-token prefill written to the cache, 8 requests of 64K tokens gathered, 2048-of-64K
// top-k indices for a 64K-token chunk of 32 requests, 128 heads of an 8K-token chunk packed.

#include <string>
#include <vector>

#include "case_helpers.h"
#include "openmla/kv_cache.h"
#include "openmla/numerics.h"

namespace openmla::bench {

namespace {

constexpr int64_t kPageSize = 64;
constexpr double kInt32Bytes = 4;
constexpr double kBf16Bytes = 2;

std::string page_suffix() { return " page=" + std::to_string(kPageSize); }

// ---- write_kv_cache: T new tokens scattered page by page into a shuffled cache -------------
enum class CacheFormat { kBf16, kFp8, kDsMla };

Case write_kv_cache_case(CacheFormat format) {
  constexpr int64_t kTokens = 524288;
  constexpr int64_t kPages = kTokens / kPageSize;
  const char* label = format == CacheFormat::kBf16 ? "bf16"
                      : format == CacheFormat::kFp8 ? "fp8"
                                                    : "ds_mla";
  const double cache_bytes_per_token = format == CacheFormat::kBf16  ? kHeadDim * kBf16Bytes
                                       : format == CacheFormat::kFp8 ? kHeadDim
                                                                     : kDsMlaBytesPerToken;
  Case write;
  write.op = "write_kv_cache";
  write.name = "T=" + std::to_string(kTokens) + page_suffix();
  write.dtype = label;
  write.bytes = kTokens * (kHeadDim * kBf16Bytes + kInt32Bytes + cache_bytes_per_token);
  write.prepare = [format, bytes = write.bytes] {
    return rotated_launcher(
        bytes,
        [format](int copy) {
          OwnedParams<WriteKvCacheParams> in(copy);
          std::vector<int32_t> page_order = shuffled_pages(kPages, in.seed);
          std::vector<int32_t> slots(size_t(kTokens), 0);
          for (int64_t t = 0; t < kTokens; ++t) {
            const int64_t page = page_order[size_t(t / kPageSize)];
            slots[size_t(t)] = int32_t(page * kPageSize + t % kPageSize);
          }
          in.params.kv_c = in.random(DType::kBFloat16, {kTokens, kLatentDim});
          in.params.k_pe = in.random(DType::kBFloat16, {kTokens, kRopeDim});
          in.params.slot_mapping = in.upload(slots, {kTokens});
          if (format == CacheFormat::kBf16) {
            in.params.kv_cache = in.output(DType::kBFloat16, {kPages, kPageSize, kHeadDim});
          } else if (format == CacheFormat::kFp8) {
            in.params.kv_cache = in.output(DType::kFloat8E4M3, {kPages, kPageSize, kHeadDim});
            in.params.scale = 4.0f / kFp8E4M3Max;  // inputs in [-1, 1] use the fp8 range
          } else {
            in.params.kv_cache = in.output(DType::kUInt8, {kPages, kPageSize, kDsMlaBytesPerToken});
          }
          return in;
        },
        &write_kv_cache);
  };
  return write;
}

// ---- gather_ds_mla_cache: B requests of L tokens each, from shuffled pages to bf16 rows ----
Case gather_ds_mla_cache_case() {
  constexpr int64_t kRequests = 8, kLength = 65536;
  constexpr int64_t kPagesPerRequest = kLength / kPageSize;
  constexpr int64_t kTokens = kRequests * kLength;
  Case gather;
  gather.op = "gather_ds_mla_cache";
  gather.name = "B=" + std::to_string(kRequests) + " L=" + std::to_string(kLength) + page_suffix();
  gather.dtype = "ds_mla";
  gather.bytes = kTokens * (kDsMlaBytesPerToken + kHeadDim * kBf16Bytes) +
                 kRequests * kPagesPerRequest * kInt32Bytes + (kRequests + 1) * kInt32Bytes;
  gather.prepare = [bytes = gather.bytes] {
    return rotated_launcher(
        bytes,
        [](int copy) {
          OwnedParams<GatherDsMlaCacheParams> in(copy);
          std::vector<int32_t> block_table = shuffled_pages(kRequests * kPagesPerRequest, in.seed);
          std::vector<int32_t> cu_seq_lens;
          for (int64_t b = 0; b <= kRequests; ++b) cu_seq_lens.push_back(int32_t(b * kLength));
          in.params.kv_cache =
              in.ds_mla_tokens({kRequests * kPagesPerRequest, kPageSize, kDsMlaBytesPerToken});
          in.params.block_table = in.upload(block_table, {kRequests, kPagesPerRequest});
          in.params.cu_seq_lens = in.upload(cu_seq_lens, {kRequests + 1});
          in.params.out = in.output(DType::kBFloat16, {kTokens, kHeadDim});
          return in;
        },
        &gather_ds_mla_cache);
  };
  return gather;
}

// ---- convert_topk_indices: an 8K-token chunk of 4 requests, top-2048 of a 64K context -------
Case convert_topk_indices_case() {
  constexpr int64_t kTokens = 65536, kTopk = 2048, kRequests = 32, kContext = 65536;
  constexpr int64_t kMaxPages = kContext / kPageSize;
  Case convert;
  convert.op = "convert_topk_indices";
  convert.name = "T=" + std::to_string(kTokens) + " topk=" + std::to_string(kTopk) +
                 " ctx=" + std::to_string(kContext) + page_suffix();
  convert.dtype = "int32";
  convert.bytes = kInt32Bytes * (2.0 * kTokens * kTopk + kTokens + kRequests * kMaxPages);
  convert.prepare = [bytes = convert.bytes] {
    return rotated_launcher(
        bytes,
        [](int copy) {
          OwnedParams<ConvertTopkIndicesParams> in(copy);
          std::mt19937_64 rng(in.seed);
          std::uniform_int_distribution<int32_t> position(0, int32_t(kContext - 1));
          std::vector<int32_t> local(size_t(kTokens * kTopk), 0);
          for (int32_t& index : local) index = position(rng);
          std::vector<int32_t> request_ids(size_t(kTokens), 0);
          for (int64_t t = 0; t < kTokens; ++t) {
            request_ids[size_t(t)] = int32_t(t * kRequests / kTokens);  // contiguous requests
          }
          in.params.local_indices = in.upload(local, {kTokens, kTopk});
          in.params.request_ids = in.upload(request_ids, {kTokens});
          in.params.block_table =
              in.upload(shuffled_pages(kRequests * kMaxPages, in.seed), {kRequests, kMaxPages});
          in.params.page_size = kPageSize;
          in.params.global_indices = in.output(DType::kInt32, {kTokens, kTopk});
          return in;
        },
        &convert_topk_indices);
  };
  return convert;
}

// ---- pack_kv_quantize_fp8: a 2K-token prefill chunk, 128 heads, rope shared by the heads ---
Case pack_kv_quantize_fp8_case() {
  constexpr int64_t kTokens = 8192, kHeads = 128, kNope = 128, kRope = 64, kValue = 128;
  Case pack;
  pack.op = "pack_kv_quantize_fp8";
  pack.name = "T=" + std::to_string(kTokens) + " H=" + std::to_string(kHeads) + " rope=shared";
  pack.dtype = "bf16->fp8";
  pack.bytes = kTokens * (kHeads * (kNope + kValue) * kBf16Bytes + kRope * kBf16Bytes +
                          kHeads * (kNope + kRope + kValue));
  pack.prepare = [bytes = pack.bytes] {
    return rotated_launcher(
        bytes,
        [](int copy) {
          OwnedParams<PackKvQuantizeFp8Params> in(copy);
          in.params.k_nope = in.random(DType::kBFloat16, {kTokens, kHeads, kNope});
          in.params.k_pe = in.random(DType::kBFloat16, {kTokens, 1, kRope});
          in.params.v = in.random(DType::kBFloat16, {kTokens, kHeads, kValue});
          in.params.k_scale = 4.0f / kFp8E4M3Max;
          in.params.v_scale = 4.0f / kFp8E4M3Max;
          in.params.k_out = in.output(DType::kFloat8E4M3, {kTokens, kHeads, kNope + kRope});
          in.params.v_out = in.output(DType::kFloat8E4M3, {kTokens, kHeads, kValue});
          return in;
        },
        &pack_kv_quantize_fp8);
  };
  return pack;
}

// ---- merge_attention: two prefill partials (Dv 128, 128 heads) merged with their LSEs ------
Case merge_attention_case(DType dtype, int64_t tokens) {
  constexpr int64_t kHeads = 128, kValueDim = 128;
  const double element_bytes = double(dtype_size(dtype));
  Case merge;
  merge.op = "merge_attention";
  merge.name = "T=" + std::to_string(tokens) + " H=" + std::to_string(kHeads) +
               " D=" + std::to_string(kValueDim);
  merge.dtype = dtype == DType::kBFloat16 ? "bf16" : "fp32";
  // out_a, out_b, lse_a, lse_b read; out, lse written.
  merge.bytes = 3.0 * tokens * kHeads * (kValueDim * element_bytes + 4.0);
  merge.prepare = [dtype, tokens, bytes = merge.bytes] {
    return rotated_launcher(
        bytes,
        [dtype, tokens](int copy) {
          OwnedParams<MergeAttentionParams> in(copy);
          in.params.out_a = in.random(dtype, {tokens, kHeads, kValueDim});
          in.params.out_b = in.random(dtype, {tokens, kHeads, kValueDim});
          // LSEs a few units apart, so that both sides carry weight.
          in.params.lse_a = in.random(DType::kFloat32, {tokens, kHeads}, 2.0f, 8.0f);
          in.params.lse_b = in.random(DType::kFloat32, {tokens, kHeads}, 2.0f, 8.0f);
          in.params.out = in.output(dtype, {tokens, kHeads, kValueDim});
          in.params.lse = in.output(DType::kFloat32, {tokens, kHeads});
          return in;
        },
        &merge_attention);
  };
  return merge;
}

}  // namespace

void add_kv_cache_cases(std::vector<Case>& cases) {
  cases.push_back(write_kv_cache_case(CacheFormat::kBf16));
  cases.push_back(write_kv_cache_case(CacheFormat::kFp8));
  cases.push_back(write_kv_cache_case(CacheFormat::kDsMla));
  cases.push_back(gather_ds_mla_cache_case());
  cases.push_back(convert_topk_indices_case());
  cases.push_back(pack_kv_quantize_fp8_case());
  cases.push_back(merge_attention_case(DType::kBFloat16, 16384));
  cases.push_back(merge_attention_case(DType::kFloat32, 8192));
}

}  // namespace openmla::bench
