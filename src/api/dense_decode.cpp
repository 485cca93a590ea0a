// Dense MLA decode: validation and dispatch. The contract is in include/openmla/dense_decode.h.
#include "openmla/dense_decode.h"

#include "dispatch.h"
#include "openmla/numerics.h"
#include "plan/decode_plan.h"
#include "reference/reference.h"

#if OPENMLA_WITH_CUDA
#include "kernels/sm90/dense_decode/dense_decode.h"
#endif

namespace openmla {

namespace {

constexpr int64_t kMaxQueryTokens = 8;   // speculative / MTP tokens per request
constexpr int64_t kMaxHeads = 128;
constexpr int64_t kMinPageSize = 16;
constexpr int64_t kMaxPageSize = 256;

// Checks every argument and returns the params with the cache seen as 3-D.
DenseDecodeParams validate(const ArgumentChecker& check, const DenseDecodeParams& given) {
  DenseDecodeParams params = given;
  check.required("q", params.q);
  check.required("kv_cache", params.kv_cache);
  check.required("block_table", params.block_table);
  check.required("seq_lens", params.seq_lens);
  check.required("out", params.out);

  check.dtype("q", params.q, {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3});
  check.rank("q", params.q, 4);
  check.size("q", params.q, 3, kHeadDim, "head dim: 512 latent + 64 rope");
  const int64_t batch = params.q.size(0);
  const int64_t query_tokens = params.q.size(1);
  const int64_t heads = params.q.size(2);
  if (query_tokens < 1 || query_tokens > kMaxQueryTokens) {
    check.fail("q", "expected 1.." + std::to_string(kMaxQueryTokens) +
                        " query tokens per request (dimension 1), got " +
                        std::to_string(query_tokens));
  }
  if (heads < 1 || heads > kMaxHeads) {
    check.fail("q", "expected 1.." + std::to_string(kMaxHeads) + " heads (dimension 2), got " +
                        std::to_string(heads));
  }
  check.last_dim_contiguous("q", params.q);

  params.kv_cache = drop_single_head_dim(check, "kv_cache", params.kv_cache);
  check.dtype("kv_cache", params.kv_cache,
              {DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3});
  check.size("kv_cache", params.kv_cache, 2, kHeadDim, "head dim");
  check.power_of_two("kv_cache", params.kv_cache.size(1), kMinPageSize, kMaxPageSize);
  check.last_dim_contiguous("kv_cache", params.kv_cache);
  const bool fp8_cache = params.kv_cache.dtype == DType::kFloat8E4M3;
  if (params.q.dtype == DType::kFloat16 && params.kv_cache.dtype != DType::kFloat16) {
    check.fail("kv_cache", "expected float16 to match a float16 'q', got " +
                               std::string(dtype_name(params.kv_cache.dtype)));
  }
  if (params.q.dtype == DType::kBFloat16 && params.kv_cache.dtype == DType::kFloat16) {
    check.fail("kv_cache", "expected bfloat16 or float8_e4m3 for a bfloat16 'q', got float16");
  }
  if (params.q.dtype == DType::kFloat8E4M3 && !fp8_cache) {
    check.fail("kv_cache", "expected float8_e4m3 for a float8_e4m3 'q', got " +
                               std::string(dtype_name(params.kv_cache.dtype)));
  }
  if (fp8_cache) check.positive_finite("kv_scale", params.kv_scale);
  if (params.q.dtype == DType::kFloat8E4M3) check.positive_finite("q_descale", params.q_descale);

  check.dtype("block_table", params.block_table, {DType::kInt32});
  check.rank("block_table", params.block_table, 2);
  check.size("block_table", params.block_table, 0, batch, "batch, from q");
  check.last_dim_contiguous("block_table", params.block_table);
  check.dtype("seq_lens", params.seq_lens, {DType::kInt32});
  check.rank("seq_lens", params.seq_lens, 1);
  check.size("seq_lens", params.seq_lens, 0, batch, "batch, from q");

  check_decode_outputs(check, params.out, params.lse, batch, query_tokens, heads);
  check.positive_finite("softmax_scale", params.softmax_scale);
  if (params.max_seq_len < 0) {
    check.fail("max_seq_len", "expected >= 0 (0: no bound), got " + std::to_string(params.max_seq_len));
  }

  Device device = check.common_device({{"q", &params.q},
                                       {"kv_cache", &params.kv_cache},
                                       {"block_table", &params.block_table},
                                       {"seq_lens", &params.seq_lens},
                                       {"out", &params.out},
                                       {"lse", &params.lse},
                                       {"workspace", &params.workspace}});
  if (device.type == DeviceType::kCPU) {
    // Host-resident lengths can be checked; device-resident ones are trusted (documented range).
    const int64_t capacity = params.block_table.size(1) * params.kv_cache.size(1);
    for (int64_t b = 0; b < batch; ++b) {
      int64_t length = params.seq_lens.ptr<const int32_t>()[b * params.seq_lens.stride(0)];
      if (length < 0 || length > capacity) {
        check.fail("seq_lens", "expected 0 <= seq_lens[" + std::to_string(b) + "] <= " +
                                   std::to_string(capacity) + " (max_pages * page_size), got " +
                                   std::to_string(length));
      }
      // Pages a request uses must exist (entries past its last page are never read).
      const int64_t page_size = params.kv_cache.size(1), pages = params.kv_cache.size(0);
      for (int64_t p = 0; p < (length + page_size - 1) / page_size; ++p) {
        int64_t page = params.block_table.ptr<const int32_t>()[b * params.block_table.stride(0) +
                                                                p * params.block_table.stride(1)];
        if (page < 0 || page >= pages) {
          check.fail("block_table", "expected block_table[" + std::to_string(b) + "][" +
                                        std::to_string(p) + "] in [0, " + std::to_string(pages) +
                                        ") (a page used by seq_lens), got " + std::to_string(page));
        }
      }
    }
  }
  // The CPU reference needs no scratch; a CUDA call must bring the workspace the query asks.
  if (device.type == DeviceType::kCUDA || params.workspace.present()) {
    check.workspace(params.workspace, dense_decode_workspace_size(params));
  }
  return params;
}

}  // namespace

size_t dense_decode_workspace_size(const DenseDecodeParams& params) { return decode_workspace_bytes(params.q); }

void dense_decode(const DenseDecodeParams& given) {
  ArgumentChecker check("dense_decode");
  DenseDecodeParams params = validate(check, given);
  run_where_arguments_live(
      check, params.q.device, [&] { reference::dense_decode(params); },
      [&] { OPENMLA_IF_CUDA(kernels::sm90::dense_decode(params)); });
}

}  // namespace openmla
