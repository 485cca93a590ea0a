// openmla: sparse MLA prefill (DeepSeek V3.2 "DSA" and V4).
//
// Query i attends to the KV rows indices[i][0 .. topk_length[i]) (all topk without
// topk_length); an index < 0 or >= Tk is invalid and skipped. Keys use all D dims, values the
// first 512. With attn_sink, exp(sink[h]) joins the softmax denominator with no value; the
// returned LSE excludes it. A query with no valid index outputs 0, LSE -inf, max_logit -inf.
#pragma once

#include "openmla/common.h"

namespace openmla {

struct SparsePrefillParams {
  TensorView q;            // [Tq, Hq, D] bf16, D = 576 (V3.2) or 512 (V4)
  TensorView kv;           // [Tk, 1, D] or [Tk, D] bf16
  TensorView indices;      // [Tq, topk] int32 (or [Tq, 1, topk])
  TensorView topk_length;  // optional [Tq] int32, each in 0..topk
  TensorView attn_sink;    // optional [Hq] fp32 (a logit, natural-log scale)
  float softmax_scale = 0;
  TensorView out;          // [Tq, Hq, 512] bf16
  TensorView lse;          // optional [Tq, Hq] fp32
  TensorView max_logits;   // optional [Tq, Hq] fp32: max of softmax_scale * q.k over valid keys
  LseBase lse_base = LseBase::kNatural;
  TensorView workspace;    // optional uint8
  Stream stream = nullptr;
};

size_t sparse_prefill_workspace_size(const SparsePrefillParams& params);
void sparse_prefill(const SparsePrefillParams& params);

}  // namespace openmla
