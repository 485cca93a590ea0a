"""FlashMLA's entry points (package `flash_mla`) on openmla.

    from openmla.compat.flash_mla import (get_mla_metadata, flash_mla_with_kvcache,
                                          flash_mla_sparse_fwd)

Same names, argument order, defaults and return conventions as FlashMLA's:
out [B, Sq, Hq, 512] in q's dtype, softmax_lse [B, Hq, Sq] float32 natural log, +inf where a
query has nothing to attend (openmla's own API says -inf there), softmax_scale defaulting to
576 ** -0.5 (1 / sqrt of q's head dim), causal bottom-right among the Sq new tokens.

Scheduling. openmla plans every call by itself, on the device, so no metadata has to be
computed ahead and the op never synchronises the host (CUDA-graph safe). get_mla_metadata
accepts both of FlashMLA's forms:
- argument-less (FlashMLA's current form): returns (MlaSchedMeta(), None). The object records
  the shape of its first call and keeps openmla's workspace for that shape, so later calls
  (and CUDA-graph replays) allocate nothing; a call of another shape raises ValueError, as
  FlashMLA rejects a reused metadata object whose shape changed.
- older form (cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...): returns int32
  tensors shaped like FlashMLA's (tile_scheduler_metadata [num_sm_parts, 8], num_splits
  [B + 1]), zero-filled placeholders that flash_mla_with_kvcache does not read. Tensors rather
  than an object so that engine code copying them into CUDA-graph buffers keeps working; the
  workspace then comes from torch's allocator on each call (graph-capture safe as well).

Paths:
- dense (indices None): k_cache bf16 | fp16 [pages, page_size, 1, 576] (or 3-D), any page
  size openmla supports (16..256; FlashMLA: 64). is_fp8_kvcache=True (FlashMLA's FP8 dense
  layout, 656 bytes per token) raises NotImplementedError: openmla's dense decode takes a
  per-tensor FP8 cache instead (openmla.mla_decode with kv_scale).
- sparse (indices given): routed to openmla.sparse_mla_decode. k_cache is the 656-byte ds_mla
  layout (is_fp8_kvcache=True, uint8 | float8_e4m3fn) or bf16 576, indices [B, Sq, topk]
  global slot ids (page * page_size + offset, -1 skipped); attn_sink, topk_length and the
  extra cache (DeepSeek V4) map one to one. causal must be False there, as in FlashMLA.
"""

import math

import torch

from .. import ops
from .._torch_ops import _workspace
from ..ops import LATENT_DIM

_TILE_SCHEDULER_METADATA_SIZE = 8  # int32 fields per row of FlashMLA's scheduler metadata
_ROWS_PER_SM_PART = 64  # query rows one FlashMLA CTA holds: sizes num_sm_parts like FlashMLA


class MlaSchedMeta:
    """What get_mla_metadata() returns: the shape of the first call it served, and openmla's
    workspace for that shape (CUDA only). Reuse it for every call of that shape, as FlashMLA
    asks of its own FlashMLASchedMeta; make one per shape."""

    def __init__(self):
        self.config = None     # (B, Sq, Hq, page_size, h_kv, causal, is_fp8_kvcache, topk)
        self.workspace = None  # uint8 tensor, or None where the op needs none (CPU)

    def _bind(self, config, make_workspace):
        if self.config is None:
            self.config = config
            self.workspace = make_workspace()
        elif self.config != config:
            raise ValueError(
                "tile_scheduler_metadata: it served a call of (device, B, Sq, Hq, page_size, "
                f"h_kv, causal, is_fp8_kvcache, topk) = {self.config}, this call has {config}; "
                "use one get_mla_metadata() object per shape")
        return self.workspace


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=None,
                     num_heads_q=None, is_fp8_kvcache=False, topk=None):
    """FlashMLA's scheduler-metadata query; see the module docstring for both forms.

    Returns (MlaSchedMeta(), None) without arguments, else placeholder int32 tensors
    (tile_scheduler_metadata [num_sm_parts, 8], num_splits [B + 1]) on cache_seqlens' device.
    """
    del num_heads_q, is_fp8_kvcache, topk
    if cache_seqlens is None:
        return MlaSchedMeta(), None
    if num_q_tokens_per_head_k is None or num_heads_k is None:
        raise ValueError("get_mla_metadata: the older form needs cache_seqlens, "
                         "num_q_tokens_per_head_k and num_heads_k (or call it with no arguments)")
    device = cache_seqlens.device
    sm_count = (torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda" else 1)
    row_tiles = max(1, math.ceil(num_q_tokens_per_head_k / _ROWS_PER_SM_PART))
    num_sm_parts = max(1, sm_count // max(1, num_heads_k) // row_tiles)
    tile_scheduler_metadata = torch.zeros((num_sm_parts, _TILE_SCHEDULER_METADATA_SIZE),
                                          dtype=torch.int32, device=device)
    num_splits = torch.zeros(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=device)
    return tile_scheduler_metadata, num_splits


def _workspace_maker(size_query, args, device):
    """Allocates the op's workspace on first use (the one allocation rule: _torch_ops)."""
    return lambda: _workspace(None, size_query, args, device)


def _flashmla_lse(q):
    """An LSE buffer in FlashMLA's [B, Hq, Sq] layout, and the [B, Sq, Hq] view openmla writes."""
    batch, query_tokens, heads = q.shape[:3]
    lse = torch.empty((batch, heads, query_tokens), dtype=torch.float32, device=q.device)
    return lse, lse.transpose(1, 2)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """FlashMLA's decode: returns (out [B, Sq, Hq, 512], softmax_lse [B, Hq, Sq] float32).

    q [B, Sq, Hq, 576]; k_cache [pages, page_size, 1, 576] (dense; see the module docstring
    for sparse); block_table [B, max_pages] int32 and cache_seqlens [B] int32 (dense only);
    tile_scheduler_metadata / num_splits: what get_mla_metadata returned (either form).
    """
    del num_splits  # openmla splits on the device; FlashMLA's newest form passes None here
    if head_dim_v != LATENT_DIM:
        raise ValueError(f"head_dim_v: openmla supports {LATENT_DIM}, got {head_dim_v}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    sparse = indices is not None
    if not sparse and any(x is not None for x in (attn_sink, extra_k_cache,
                                                  extra_indices_in_kvcache, topk_length,
                                                  extra_topk_length)):
        raise ValueError("attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length and "
                         "extra_topk_length need sparse attention (indices)")
    if sparse and causal:
        raise ValueError("causal: must be False with indices (sparse attention)")
    if not sparse and is_fp8_kvcache:
        raise NotImplementedError(
            "flash_mla_with_kvcache: FlashMLA's FP8 dense cache (656-byte tokens) is not "
            "supported by openmla's dense decode; use a bf16 cache, or openmla.mla_decode with "
            "a per-tensor float8_e4m3fn cache and kv_scale")
    if not sparse and k_cache.dtype != q.dtype:
        raise ValueError(f"k_cache: expected {q.dtype} like q, got {k_cache.dtype}")

    lse, lse_openmla_layout = _flashmla_lse(q)
    # openmla writes bf16; an fp16 q gets its fp16 output through one conversion at the end.
    out = q.new_empty((*q.shape[:-1], LATENT_DIM), dtype=torch.bfloat16)
    shape_key = (q.device, q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1],
                 k_cache.shape[2] if k_cache.dim() == 4 else 1, bool(causal),
                 bool(is_fp8_kvcache), indices.shape[-1] if sparse else None)
    if sparse:
        args = (q, k_cache, indices, topk_length, extra_k_cache, extra_indices_in_kvcache,
                extra_topk_length)
        size_query = ops.get_sparse_mla_decode_workspace_size
    else:
        args = (q, k_cache, block_table, cache_seqlens)
        size_query = ops.get_mla_decode_workspace_size
    workspace = None
    if isinstance(tile_scheduler_metadata, MlaSchedMeta):
        workspace = tile_scheduler_metadata._bind(
            shape_key, _workspace_maker(size_query, args, q.device))

    if sparse:
        torch.ops.openmla.sparse_mla_decode(
            q, k_cache, indices, topk_length, extra_k_cache, extra_indices_in_kvcache,
            extra_topk_length, attn_sink, softmax_scale, False, out, lse_openmla_layout,
            workspace)
    else:
        torch.ops.openmla.mla_decode(q, k_cache, block_table, cache_seqlens, softmax_scale,
                                     causal, 1.0, 1.0, False, out, lse_openmla_layout,
                                     workspace)
    # FlashMLA reports +inf for a query with nothing to attend; one pass, no host sync.
    lse.nan_to_num_(nan=math.nan, posinf=math.inf, neginf=math.inf)
    if q.dtype == torch.float16:
        out = out.to(torch.float16)
    return out, lse


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """FlashMLA's sparse prefill: q [s_q, h_q, d_qk], kv [s_kv, h_kv, d_qk], indices
    [s_q, h_kv, topk] int32 (-1 or >= s_kv skipped) -> (out [s_q, h_q, 512], max_logits
    [s_q, h_q], lse [s_q, h_q]). As in FlashMLA, max_logits and lse are in base 2 of the scaled
    logits (P = q.k * sm_scale * log2 e: max_logits = max P, lse = log2 sum 2^P), and a query
    with nothing valid reports lse +inf (max_logits -inf, out 0). attn_sink and topk_length
    follow openmla.sparse_mla_prefill (the sink joins the denominator, not the LSE)."""
    if d_v != LATENT_DIM:
        raise ValueError(f"d_v: expected {LATENT_DIM} (values are the first 512 dims), got {d_v}")
    out, max_logits, lse = ops.sparse_mla_prefill(q, kv, indices, sm_scale, topk_length=topk_length,
                                                  attn_sink=attn_sink, lse_base2=True)
    max_logits.mul_(_LOG2E)  # openmla reports max_logits in natural units; -inf stays -inf
    lse.masked_fill_(torch.isneginf(lse), math.inf)
    return out, max_logits, lse


_LOG2E = 1.0 / math.log(2.0)

__all__ = ["MlaSchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"]
