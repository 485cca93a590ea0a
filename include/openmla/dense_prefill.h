// openmla: dense MLA prefill (MHA mode, the non-absorbed form used for prompt processing).
//
// For each request b, its lq = cu_seqlens_q[b+1]-cu_seqlens_q[b] queries attend to its
// lk = cu_seqlens_kv[b+1]-cu_seqlens_kv[b] keys (q and kv packs may differ: chunked prefill
// attends new tokens to cached context). Query head h reads kv head h / (Hq / Hk).
// causal is bottom-right aligned: query i sees keys 0 .. lk-lq+i. A query that sees no key
// outputs 0 and LSE -inf.
#pragma once

#include "openmla/common.h"

namespace openmla {

struct DensePrefillParams {
  TensorView q;              // [Tq, Hq, 192]  bf16 | fp16 | fp8_e4m3
  TensorView k;              // [Tk, Hk, 192]  same dtype as q
  TensorView v;              // [Tk, Hk, 128]  same dtype as q
  TensorView cu_seqlens_q;   // [B+1] int32, starts at 0, non-decreasing, ends at <= Tq
  TensorView cu_seqlens_kv;  // [B+1] int32, starts at 0, non-decreasing, ends at <= Tk
  int64_t max_seqlen_q = 0;  // >= every lq (a planning bound)
  int64_t max_seqlen_kv = 0; // >= every lk
  float softmax_scale = 0;   // logits are softmax_scale * q.k
  bool causal = false;
  float q_descale = 1, k_descale = 1, v_descale = 1;  // fp8 only: real = stored * descale
  TensorView out;            // [Tq, Hq, 128]  bf16 (fp16 when q is fp16)
  TensorView lse;            // optional [Tq, Hq] fp32
  LseBase lse_base = LseBase::kNatural;
  TensorView workspace;      // optional uint8, at least dense_prefill_workspace_size() bytes
  Stream stream = nullptr;
};

size_t dense_prefill_workspace_size(const DensePrefillParams& params);
void dense_prefill(const DensePrefillParams& params);

}  // namespace openmla
