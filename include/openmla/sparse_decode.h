// openmla: sparse MLA decode over a paged cache (DeepSeek V3.2 / V4).
//
// Query (b, s) attends to the cache slots indices[b][s][0 .. topk_length[b]) (all topk
// without topk_length); a slot is page * page_size + offset, and -1 (any value < 0 or
// >= pages * page_size) is invalid and skipped. The cache is either BF16 [pages, page, D]
// or the 656-byte FP8 ds_mla layout (numerics.h; D must be 576), told apart by dtype:
// bf16 = dense, uint8 / float8_e4m3 = ds_mla. With an extra source (DeepSeek V4: a
// sliding-window cache plus a compressed cache), one softmax runs over the union of both
// selections. attn_sink and empty selections behave as in sparse prefill.
#pragma once

#include "openmla/common.h"

namespace openmla {

struct SparseKvSource {
  TensorView kv_cache;     // [pages, page_size, D] bf16 | [pages, page_size, 656] uint8/fp8
                           // (a 4-D [pages, page_size, 1, last] view is accepted too)
  TensorView indices;      // [B, Sq, topk] int32 global slot ids
  TensorView topk_length;  // optional [B] int32, each in 0..topk
};

struct SparseDecodeParams {
  TensorView q;            // [B, Sq, Hq, D] bf16, D = 576 or 512
  SparseKvSource main;
  SparseKvSource extra;    // optional second cache: extra.kv_cache absent = none
  TensorView attn_sink;    // optional [Hq] fp32
  float softmax_scale = 0;
  TensorView out;          // [B, Sq, Hq, 512] bf16
  TensorView lse;          // optional [B, Sq, Hq] fp32
  LseBase lse_base = LseBase::kNatural;
  TensorView workspace;    // uint8, at least sparse_decode_workspace_size() bytes
  Stream stream = nullptr;
};

size_t sparse_decode_workspace_size(const SparseDecodeParams& params);
void sparse_decode(const SparseDecodeParams& params);

}  // namespace openmla
