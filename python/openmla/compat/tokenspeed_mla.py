"""TokenSpeed-MLA's Python entry points (package `tokenspeed_mla`) on openmla.

    from openmla.compat.tokenspeed_mla import (tokenspeed_mla_decode, tokenspeed_mla_prefill,
                                               mla_kv_pack_quantize_fp8, warmup_compile_prefill)

Same names, argument order and defaults as TokenSpeed's; what had to be interpreted:

- FP8. TokenSpeed passes no scale tensors: its engine quantises the query to FP8 without a
  scale, folds the cache's k_scale into `softmax_scale`, and uses `output_scale` for the value
  scale. So an FP8 query or cache is taken as is (openmla's q_descale = kv_scale = 1), with
  logits = softmax_scale * q.k and out = output_scale * softmax(.) @ v in stored units. Unlike
  TokenSpeed, a BF16 query with an FP8 cache is accepted too (openmla runs that natively).
- output_scale. With an FP8 cache it is folded into the kernel (kv_scale = output_scale,
  softmax_scale / output_scale: the same logits, values scaled on the fly), so it costs
  nothing; otherwise the output is multiplied after the op.
- Output dtype. TokenSpeed writes FP16 for an FP16 query; openmla's kernels write BF16, so
  that case goes through a BF16 buffer and one conversion (its precision is BF16's).
- LSE (return_lse / lse_out): [B, q_len, H] float32 in base 2, as TokenSpeed documents for its
  decode-context-parallel merge. A request with seq_lens 0 gives -inf (openmla's convention;
  TokenSpeed does not document one).
- causal_mask applies bottom-right causal masking among the q_len new tokens for every dtype
  (TokenSpeed's BF16/FP16 kernel ignores the flag; the FP8 one honours it).
- kv_cache: [pages, page_size, 576], [pages, 1, page_size, 576] (TokenSpeed's 4-D form) or
  [pages, page_size, 1, 576]. Page sizes 16..256 (TokenSpeed: 32 and 64).
- workspace_buffer (int8 or uint8, contiguous) is openmla's split-KV workspace; it must hold
  openmla.get_mla_decode_workspace_size(...) bytes (ValueError otherwise).
- is_var_seq: accepted for compatibility; openmla plans every call from shapes and device-side
  lengths, and has no separate persistent/variable-length kernels to choose.
- enable_pdl: passed to openmla's decode (programmatic dependent launch on Hopper).
- TokenSpeed's decode-context-parallel arguments (causal_seqs, cp_world, cp_rank) and custom
  masks are not supported.
"""

import math

import torch

from .. import ops
from ..ops import LATENT_DIM, ROPE_DIM

_FP8 = torch.float8_e4m3fn


def _check_mla_dims(kv_lora_rank, qk_rope_head_dim):
    if kv_lora_rank != LATENT_DIM:
        raise ValueError(f"kv_lora_rank: openmla supports {LATENT_DIM}, got {kv_lora_rank}")
    if qk_rope_head_dim != ROPE_DIM:
        raise ValueError(f"qk_rope_head_dim: openmla supports {ROPE_DIM}, got {qk_rope_head_dim}")


def _three_dim_cache(kv_cache):
    """TokenSpeed's 4-D cache is [pages, 1, page_size, D]; openmla takes [pages, page_size, D]
    or [pages, page_size, 1, D]. Dropping the unit dimension is a view."""
    if kv_cache.dim() == 4 and kv_cache.shape[1] == 1 and kv_cache.shape[2] != 1:
        return kv_cache.squeeze(1)
    return kv_cache


def _workspace(workspace_buffer, query, kv_cache, block_tables, seq_lens):
    """workspace_buffer seen as openmla's uint8 workspace, after checking its size."""
    if workspace_buffer.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"workspace_buffer: expected torch.int8, got {workspace_buffer.dtype}")
    if not workspace_buffer.is_contiguous():
        raise ValueError("workspace_buffer: expected a contiguous buffer")
    needed = ops.get_mla_decode_workspace_size(query, kv_cache, block_tables, seq_lens)
    if workspace_buffer.numel() < needed:
        raise ValueError(
            f"workspace_buffer: expected at least {needed} bytes for query "
            f"{tuple(query.shape)} (openmla.get_mla_decode_workspace_size), got "
            f"{workspace_buffer.numel()}")
    return workspace_buffer.view(torch.uint8).reshape(-1)


def tokenspeed_mla_decode(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim,
                          block_tables, seq_lens, max_seq_len, softmax_scale, output_scale=1.0,
                          out=None, is_var_seq=True, causal_mask=True, enable_pdl=False,
                          return_lse=False, lse_out=None):
    """MLA decode over a paged latent cache (absorbed MQA form).

    query [B, q_len, H, 576] bf16 | fp16 | float8_e4m3fn; kv_cache (see the module docstring);
    block_tables [B, max_pages] int32; seq_lens [B] (new tokens included; int64 is converted);
    max_seq_len > 0: a bound on seq_lens, which openmla plans its splits with as TokenSpeed does
    (a request past it is still computed correctly, only in fewer, longer splits).
    Returns out [B, q_len, H, 512] (bf16; fp16 for an fp16 query), and with return_lse also
    lse [B, q_len, H] float32 in base 2 (written into lse_out when given).
    """
    del is_var_seq  # a scheduling hint of TokenSpeed's kernels: nothing to choose
    _check_mla_dims(kv_lora_rank, qk_rope_head_dim)
    if max_seq_len <= 0:
        raise ValueError(f"max_seq_len: expected > 0, got {max_seq_len}")
    if lse_out is not None and not return_lse:
        raise ValueError("lse_out: requires return_lse=True")
    kv_cache = _three_dim_cache(kv_cache)
    if seq_lens.dtype != torch.int32:
        seq_lens = seq_lens.to(torch.int32)
    workspace = _workspace(workspace_buffer, query, kv_cache, block_tables, seq_lens)

    out_dtype = torch.float16 if query.dtype == torch.float16 else torch.bfloat16
    if out is not None and out.dtype != out_dtype:
        raise ValueError(f"out: expected {out_dtype} for a {query.dtype} query, got {out.dtype}")
    if out is None:
        out = query.new_empty((*query.shape[:-1], LATENT_DIM), dtype=out_dtype)
    bf16_out = out if out_dtype == torch.bfloat16 else torch.empty_like(out,
                                                                        dtype=torch.bfloat16)
    lse = None
    if return_lse:
        lse = lse_out if lse_out is not None else query.new_empty(query.shape[:-1],
                                                                  dtype=torch.float32)

    # The value scale rides on the fp8 cache's dequantisation scale; the logits keep their
    # scale because softmax_scale is divided by the same factor.
    fold_output_scale = (kv_cache.dtype == _FP8 and output_scale != 1.0 and output_scale > 0
                         and math.isfinite(output_scale))
    kv_scale = output_scale if fold_output_scale else 1.0
    scale = softmax_scale / output_scale if fold_output_scale else softmax_scale
    torch.ops.openmla.mla_decode(query, kv_cache, block_tables, seq_lens, scale, causal_mask,
                                 1.0, kv_scale, True, bf16_out, lse, workspace, enable_pdl,
                                 int(max_seq_len))
    if output_scale != 1.0 and not fold_output_scale:
        bf16_out.mul_(output_scale)
    if bf16_out is not out:
        out.copy_(bf16_out)
    return (out, lse) if return_lse else out


def tokenspeed_mla_prefill(query, key, value, seq_lens, cum_seq_lens, max_seq_len, batch_size,
                           softmax_scale, is_causal=True, return_lse=False, cum_seq_lens_q=None,
                           max_seq_len_q=None, enable_pdl=False, out=None):
    """MLA prefill (MHA form) over a ragged batch: openmla.mla_prefill under TokenSpeed's names.

    query [Tq, Hq, 192], key [Tk, Hk, 192], value [Tk, Hk, 128] (bf16 | fp16 | float8_e4m3fn,
    fp8 without scales: TokenSpeed has none); cum_seq_lens [>= batch_size + 1] int32 are the
    key offsets, cum_seq_lens_q the query offsets (default: the key ones, i.e. plain
    self-attention), max_seq_len / max_seq_len_q their bounds. seq_lens (the per-request key
    lengths) is implied by cum_seq_lens and not read. Causal masking is bottom-right aligned.
    Returns out [Tq, Hq, 128] bf16 (fp16 for fp16 inputs), and lse [Tq, Hq] float32 in natural
    log with return_lse.
    """
    del seq_lens, enable_pdl
    if cum_seq_lens_q is None:
        cum_seq_lens_q = cum_seq_lens
    if max_seq_len_q is None:
        max_seq_len_q = max_seq_len
    # Engines pad these to a captured batch size; the first batch_size + 1 entries are the batch.
    cum_seq_lens = cum_seq_lens[:batch_size + 1]
    cum_seq_lens_q = cum_seq_lens_q[:batch_size + 1]
    return ops.mla_prefill(query, key, value, cum_seq_lens_q, cum_seq_lens, max_seq_len_q,
                           max_seq_len, softmax_scale, causal=is_causal, return_lse=return_lse,
                           out=out)


def mla_kv_pack_quantize_fp8(k_nope, k_pe, v, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, fp8_dtype=_FP8, enable_pdl=False):
    """Pack [k_nope | k_pe] and quantise K and V to FP8: k = fp8([k_nope | k_pe] * k_scale_inv),
    v = fp8(v * v_scale_inv). k_pe [T, 64] or [T, 1 | H, 64] is broadcast over heads.

    openmla.pack_kv_quantize_fp8 takes the scales (real = stored * scale) and multiplies by
    their float32 reciprocals, so k_scale_inv reaches it as 1 / (1 / k_scale_inv): the same
    multiplier except for scales whose double reciprocal rounds differently in float32 (never
    for powers of two). Out-of-range values saturate to +-448.
    Returns (k [T, H, 192], v [T, H, 128]) float8_e4m3fn.
    """
    del enable_pdl
    if fp8_dtype != _FP8:
        raise ValueError(f"fp8_dtype: openmla supports {_FP8}, got {fp8_dtype}")
    for name, value in (("k_scale_inv", k_scale_inv), ("v_scale_inv", v_scale_inv)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}: expected a positive finite number, got {value}")
    if k_pe.dim() == 2:
        k_pe = k_pe.unsqueeze(1)
    return ops.pack_kv_quantize_fp8(k_nope, k_pe, v, 1.0 / k_scale_inv, 1.0 / v_scale_inv,
                                    k_out=k_out, v_out=v_out)


def warmup_compile_prefill(q_dtype=_FP8, d_qk=192, d_v=128, enable_pdl=False):
    """A no-op: openmla's kernels are compiled ahead of time, so there is nothing to JIT at
    start-up (TokenSpeed compiles its prefill variants here, 1.5-2 minutes)."""
    del q_dtype, d_qk, d_v, enable_pdl
    return None


__all__ = ["tokenspeed_mla_decode", "tokenspeed_mla_prefill", "mla_kv_pack_quantize_fp8",
           "warmup_compile_prefill"]
