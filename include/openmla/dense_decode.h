// openmla: dense MLA decode (MQA mode: absorbed weights, one latent KV head of 576 dims, of
// which the first 512 are also the values).
//
// Request b has Sq new query tokens and seq_lens[b] cached tokens (the new ones included).
// With causal, query token s (0-based among the Sq) sees keys 0 .. seq_lens[b]-Sq+s
// (bottom-right aligned); without, it sees all seq_lens[b] keys. Key t of request b lives in
// kv_cache[block_table[b][t / page_size], t % page_size]. Entries of block_table past a
// request's last page are never read. seq_lens[b] == 0 gives output 0 and LSE -inf.
// Precision: a 16-bit cache computes in bf16 / fp16 with fp32 accumulation. An FP8 cache
// computes S = Q K^T on FP8 tensor cores from the raw e4m3 keys (a bf16 q as two e4m3 parts,
// ~8 significant bits as bf16 has; an fp8 q as it is), which keep ~13 bits of each accumulation
// step (S adds segments of steps in fp32), and P V in fp16 with fp32 accumulation (e4m3 widens
// exactly to fp16), whatever q's dtype: up to ~3e-3 relative on the whole output and ~1.3e-3
// on the LSE beyond the error of the fp8 inputs themselves, an LSE's error taken against
// 1 + max(|LSE|, m) where m = softmax_scale |q| |k| / sqrt(576) is the row's logit magnitude (a
// row of one key whose logit lies near 0 has the rounding of logits of size m). The tests allow
// 1e-2 (output), 3e-2 (any one row) and 3e-3 (LSE), also with logits near 100 and values that
// add up coherently over long splits (where an output product on FP8 tensor cores, which an
// earlier kernel used for an fp8 q, drifted by 3.5-41%). With logits near 100 one row in
// thousands reads up to ~2.3% off with a bf16 q and up to ~4.5% with an fp8 q: at 32 and 64 rows
// a CTA an fp8 q's S adds two segments of 9 steps, not three of 6, as q's own e4m3 rounding moves
// such logits far more than that (the tests allow 6e-2 a row there).
#pragma once

#include "openmla/common.h"

namespace openmla {

struct DenseDecodeParams {
  TensorView q;            // [B, Sq, Hq, 576]  bf16 | fp16 | fp8_e4m3 (with q_descale)
  TensorView kv_cache;     // [pages, page_size, 576] or [pages, page_size, 1, 576]
                           // bf16 | fp16 | fp8_e4m3 (with kv_scale)
  TensorView block_table;  // [B, max_pages] int32
  TensorView seq_lens;     // [B] int32, 0 <= seq_lens[b] <= max_pages * page_size
  float softmax_scale = 0;
  bool causal = false;
  float q_descale = 1;     // fp8 q: real = stored * q_descale
  float kv_scale = 1;      // fp8 cache: real = stored * kv_scale
  TensorView out;          // [B, Sq, Hq, 512] bf16
  TensorView lse;          // optional [B, Sq, Hq] fp32
  LseBase lse_base = LseBase::kNatural;
  TensorView workspace;    // uint8, at least dense_decode_workspace_size() bytes
  Stream stream = nullptr;
  // Programmatic dependent launch (Hopper): the attention kernel may start while the previous
  // kernel in the stream finishes. It waits for that kernel before it uses an input or writes
  // anything; before the wait, a split of a uniform plan only prefetches its query rows and
  // first key tiles into L2, the tiles' addresses from a speculative read of seq_lens and
  // block_table, repeated after the wait (so the previous kernel may still be writing them).
  // (With an FP8 cache, at 16 rows and a grid of at most half the SMs, a split requests its first
  // tile at those addresses right after the wait, and uses it only where the entries read again
  // after the wait are the same; else it loads the tile again.)
  // The op's last kernel lets the next PDL-launched kernel start early too. Saves 1-2.5 us per
  // call at small batch (D4 / D5 on an H100). (The combine step, where there is one, always
  // launches so behind the attention kernel: both are this op's own kernels.)
  bool enable_pdl = false;
  // Optional bound on every seq_lens[b] (0: none), as TokenSpeed's max_seq_len and
  // FlashAttention's max_seqlen_k. With it, a call whose requests are short for their batch
  // launches no split that would get no keys (D4 B1 with an FP8 cache: 64 splits of one tile
  // instead of 128, half of them empty). Only a launch hint: each split's keys still come from
  // seq_lens on the device, so a request longer than the bound is computed correctly, in fewer,
  // longer splits. With 17..64 query rows a request (Sq 2-4 x 16 heads), a bound that gives each
  // split few key tiles also runs the rows as CTAs of 16 (faster at small batch: D4 Sq 2 B1 with
  // an FP8 cache 13.0 -> 10.1 us on an H200). The workspace query does not use it. The block
  // table's capacity (max_pages * page_size, which bounds seq_lens by contract) is always taken
  // as a bound too, so a table sized to the longest request needs no max_seq_len.
  int64_t max_seq_len = 0;
};

// Scratch for split-KV partial results; depends on shapes only (B, Sq, Hq), so one
// allocation serves every later call of the same shape, including CUDA-graph replays. Its
// contents after a call are undefined (the combine step drops read partials from L2 unwritten).
size_t dense_decode_workspace_size(const DenseDecodeParams& params);
void dense_decode(const DenseDecodeParams& params);

}  // namespace openmla
