"""The torch-facing API: one function per openmla op, named and ordered like FlashAttention /
FlashMLA where those exist.

Outputs are allocated with torch unless given (`out=` and friends), and the op runs where its
tensors live: CPU tensors run the C++ reference, CUDA tensors the GPU kernel on the current
stream. An op without a kernel for the tensors' device raises NotImplementedError; nothing is
ever copied to the CPU behind the caller's back. Bad arguments raise ValueError naming the
argument. LSEs are float32, natural log unless lse_base2=True; a query with nothing to attend
outputs 0 and LSE -inf.

Shape notation: T tokens of a ragged batch, B requests, Sq query tokens per request, H heads.
"""

import torch

from . import _C
from . import _torch_ops  # noqa: F401  (registers torch.ops.openmla.*)
from ._tensor import view

_ops = torch.ops.openmla

LATENT_DIM = 512  # values of the absorbed (latent) MLA head; the first 512 of 576 key dims
ROPE_DIM = 64
PREFILL_V_DIM = 128
PACKED_K_DIM = 192  # 128 nope + 64 rope: the prefill key head


def _lse_like(q, wanted):
    """float32 [*q.shape[:-1]] when wanted, else None."""
    return q.new_empty(q.shape[:-1], dtype=torch.float32) if wanted else None


def mla_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                softmax_scale, causal=False, q_descale=1.0, k_descale=1.0, v_descale=1.0,
                return_lse=False, lse_base2=False, out=None):
    """Dense MLA prefill (MHA form) over a ragged batch.

    q [Tq, Hq, 192], k [Tk, Hk, 192], v [Tk, Hk, 128] (bf16 | fp16 | float8_e4m3fn with
    descales); cu_seqlens_q / cu_seqlens_kv [B+1] int32. causal is bottom-right aligned.
    Returns out [Tq, Hq, 128] (bf16, fp16 for fp16 q), and lse [Tq, Hq] with return_lse.
    """
    if out is None:
        out_dtype = torch.float16 if q.dtype == torch.float16 else torch.bfloat16
        out = q.new_empty((*q.shape[:-1], PREFILL_V_DIM), dtype=out_dtype)
    lse = _lse_like(q, return_lse)
    _ops.mla_prefill(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                     softmax_scale, causal, q_descale, k_descale, v_descale, lse_base2, out,
                     lse, None)
    return (out, lse) if return_lse else out


def mla_decode(q, kv_cache, block_table, seq_lens, softmax_scale, causal=False, q_descale=1.0,
               kv_scale=1.0, return_lse=False, lse_base2=False, workspace=None, out=None,
               enable_pdl=False, max_seq_len=0):
    """Dense MLA decode (absorbed MQA form) over a paged cache.

    q [B, Sq, Hq, 576], kv_cache [pages, page_size, 576] (or [pages, page_size, 1, 576]),
    block_table [B, max_pages] int32, seq_lens [B] int32 (new tokens included).
    workspace: uint8 of get_mla_decode_workspace_size() bytes; allocated per call when None.
    enable_pdl: launch with programmatic dependent launch (Hopper): the attention kernel may
    start while the previous kernel in the stream finishes, and prefetches its first key tiles
    into L2 meanwhile (it reads every input only after waiting for that kernel); the op's last
    kernel lets the next PDL-launched kernel start early. (The combine step, where there is
    one, always overlaps the attention kernel so.) No effect on CPU.
    max_seq_len: optional bound on seq_lens (0: none). Short requests at small batch then
    launch no split that would get no keys (faster); a longer request is still computed
    correctly, only in fewer, longer splits. A CUDA graph captured with a bound replays
    correctly with any lengths. With 17..64 query rows a request (Sq 2-4 x 16 heads) a bound
    that gives each split few key tiles also runs the rows as CTAs of 16 (faster at small
    batch). The block table's capacity (max_pages * page_size) bounds the lengths too, so a
    table sized to the longest request needs no max_seq_len.
    Precision with an fp8 cache (bf16 or fp8 q): S on FP8 tensor cores (a bf16 q as two e4m3
    parts), P V in fp16 with fp32 accumulation: up to ~3e-3 relative on the output and ~1.3e-3
    on the LSE (against 1 + max(|LSE|, the row's logit magnitude)) beyond the fp8 inputs' own
    error; with logits near 100 a single row up to ~2.3% off (bf16 q) or ~4.5% (fp8 q)
    (include/openmla/dense_decode.h).
    Returns out [B, Sq, Hq, 512] bf16, and lse [B, Sq, Hq] with return_lse.
    """
    if out is None:
        out = q.new_empty((*q.shape[:-1], LATENT_DIM), dtype=torch.bfloat16)
    lse = _lse_like(q, return_lse)
    _ops.mla_decode(q, kv_cache, block_table, seq_lens, softmax_scale, causal, q_descale,
                    kv_scale, lse_base2, out, lse, workspace, enable_pdl, max_seq_len)
    return (out, lse) if return_lse else out


def sparse_mla_prefill(q, kv, indices, softmax_scale, topk_length=None, attn_sink=None,
                       lse_base2=False, out=None):
    """Sparse MLA prefill (DeepSeek V3.2 DSA / V4).

    q [Tq, Hq, D] bf16 (D = 576 or 512), kv [Tk, 1, D] or [Tk, D] bf16, indices [Tq, topk]
    int32 (< 0 or >= Tk: skipped), topk_length [Tq] int32, attn_sink [Hq] float32.
    Returns (out [Tq, Hq, 512] bf16, max_logits [Tq, Hq], lse [Tq, Hq]).
    """
    if out is None:
        out = q.new_empty((*q.shape[:-1], LATENT_DIM), dtype=torch.bfloat16)
    max_logits = _lse_like(q, True)
    lse = _lse_like(q, True)
    _ops.sparse_mla_prefill(q, kv, indices, topk_length, attn_sink, softmax_scale, lse_base2,
                            out, max_logits, lse, None)
    return out, max_logits, lse


def sparse_mla_decode(q, kv_cache, indices, softmax_scale, topk_length=None, attn_sink=None,
                      extra_kv_cache=None, extra_indices=None, extra_topk_length=None,
                      lse_base2=False, workspace=None, out=None):
    """Sparse MLA decode over a paged cache: bf16 [pages, page_size, D] or the 656-byte FP8
    ds_mla layout (uint8 | float8_e4m3fn [pages, page_size, 656]).

    q [B, Sq, Hq, D] bf16; indices [B, Sq, topk] int32 global slot ids (-1: skipped);
    topk_length [B] int32; attn_sink [Hq] float32; extra_*: a second cache attended in the
    same softmax (DeepSeek V4). Returns (out [B, Sq, Hq, 512] bf16, lse [B, Sq, Hq]).
    """
    if out is None:
        out = q.new_empty((*q.shape[:-1], LATENT_DIM), dtype=torch.bfloat16)
    lse = _lse_like(q, True)
    _ops.sparse_mla_decode(q, kv_cache, indices, topk_length, extra_kv_cache, extra_indices,
                           extra_topk_length, attn_sink, softmax_scale, lse_base2, out, lse,
                           workspace)
    return out, lse


def write_kv_cache(kv_c, k_pe, slot_mapping, kv_cache, scale=1.0):
    """Write T new tokens (kv_c [T, 512], k_pe [T, 64]) into kv_cache in place at
    slot_mapping [T] (int32 | int64; negative: skipped). The cache format follows from its
    dtype and last dim: bf16 576, float8_e4m3fn 576 (per-tensor scale), or uint8 |
    float8_e4m3fn 656 (ds_mla)."""
    _ops.write_kv_cache(kv_c, k_pe, slot_mapping, kv_cache, scale)


def gather_ds_mla_cache(kv_cache, block_table, cu_seq_lens, num_tokens=None, out=None):
    """Gather each request's tokens from an FP8 ds_mla cache into a contiguous BF16
    [num_tokens, 576] tensor (row cu_seq_lens[b] + i is token i of request b).

    Without out or num_tokens, num_tokens is read from cu_seq_lens[-1]: a host
    synchronisation for CUDA tensors; pass num_tokens (or out) in graph-captured code.
    """
    if out is None:
        if num_tokens is None:
            num_tokens = int(cu_seq_lens[-1])
        out = torch.empty((num_tokens, LATENT_DIM + ROPE_DIM), dtype=torch.bfloat16,
                          device=kv_cache.device)
    _ops.gather_ds_mla_cache(kv_cache, block_table, cu_seq_lens, out)
    return out


def convert_topk_indices(local_indices, request_ids, block_table, page_size, topk_length=None,
                         out=None):
    """Request-local top-k positions [T, topk] int32 -> global cache slot ids [T, topk] int32
    through block_table [B, max_pages]; request_ids [T] says each row's request. Positions out
    of range, and entries at or past topk_length [T] when given, become -1."""
    if out is None:
        out = torch.empty_like(local_indices, dtype=torch.int32)
    _ops.convert_topk_indices(local_indices, request_ids, block_table, page_size, topk_length,
                              out)
    return out


def pack_kv_quantize_fp8(k_nope, k_pe, v, k_scale, v_scale, k_out=None, v_out=None):
    """Fused K/V pack + FP8 quantisation for chunked prefill.

    k_nope [T, H, 128], k_pe [T, 1 | H, 64] (one head broadcasts), v [T, H, 128], bf16 | fp16,
    strided views allowed. Returns (k [T, H, 192], v [T, H, 128]) float8_e4m3fn with
    k = fp8([k_nope | k_pe] / k_scale), v = fp8(v / v_scale) (saturating at +-448).
    """
    fp8 = torch.float8_e4m3fn
    if k_out is None:
        k_out = torch.empty((*k_nope.shape[:-1], PACKED_K_DIM), dtype=fp8, device=k_nope.device)
    if v_out is None:
        v_out = torch.empty(v.shape, dtype=fp8, device=v.device)
    _ops.pack_kv_quantize_fp8(k_nope, k_pe, v, k_scale, v_scale, k_out, v_out)
    return k_out, v_out


def merge_attention(out_a, lse_a, out_b, lse_b, lse_base2=False, out=None, lse=None):
    """Merge two partial attention results over disjoint key sets by their LSEs.

    out_a / out_b [T, H, D] (bf16 | fp16 | fp32), lse_a / lse_b [T, H] float32 (any strides).
    Returns (out [T, H, D], lse [T, H]); a side with LSE -inf contributes nothing.
    """
    if out is None:
        out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    if lse is None:
        lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    _ops.merge_attention(out_a, lse_a, out_b, lse_b, lse_base2, out, lse)
    return out, lse


# ---- workspace sizes: allocate once per shape (e.g. before CUDA-graph capture) -------------

def get_mla_prefill_workspace_size(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                   max_seqlen_kv):
    return _C.dense_prefill_workspace_size(
        q=view(q), k=view(k), v=view(v), cu_seqlens_q=view(cu_seqlens_q),
        cu_seqlens_kv=view(cu_seqlens_kv), max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)


def get_mla_decode_workspace_size(q, kv_cache, block_table, seq_lens):
    """Bytes of the workspace mla_decode needs on CUDA; it depends on q's shape only."""
    return _C.dense_decode_workspace_size(q=view(q), kv_cache=view(kv_cache),
                                          block_table=view(block_table), seq_lens=view(seq_lens))


def get_sparse_mla_prefill_workspace_size(q, kv, indices, topk_length=None):
    return _C.sparse_prefill_workspace_size(q=view(q), kv=view(kv), indices=view(indices),
                                            topk_length=view(topk_length))


def get_sparse_mla_decode_workspace_size(q, kv_cache, indices, topk_length=None,
                                         extra_kv_cache=None, extra_indices=None,
                                         extra_topk_length=None):
    return _C.sparse_decode_workspace_size(
        q=view(q), kv_cache=view(kv_cache), indices=view(indices), topk_length=view(topk_length),
        extra_kv_cache=view(extra_kv_cache), extra_indices=view(extra_indices),
        extra_topk_length=view(extra_topk_length))


__all__ = [
    "mla_prefill", "mla_decode", "sparse_mla_prefill", "sparse_mla_decode", "write_kv_cache",
    "gather_ds_mla_cache", "convert_topk_indices", "pack_kv_quantize_fp8", "merge_attention",
    "get_mla_prefill_workspace_size", "get_mla_decode_workspace_size",
    "get_sparse_mla_prefill_workspace_size", "get_sparse_mla_decode_workspace_size",
]
