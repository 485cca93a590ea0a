"""openmla's ops registered with torch.library, so torch.compile(fullgraph=True) traces them
and CUDA-graph capture records their launches.

Every op is an out-variant: the caller (ops.py) allocates the outputs with torch, and the op
writes them, declaring them in mutates_args. Nothing is returned, so the fake implementations
have nothing to compute and the same registration serves eager, compiled and captured code.
Scratch workspaces that the caller did not provide are allocated here, at run time, because
their size comes from a C++ query that tracing cannot call.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _C
from ._tensor import stream_of, view


def _workspace(given, size_query, args, device):
    """The caller's workspace, or for CUDA a fresh one of the size that the op's query gives
    for the same arguments (the CPU reference needs none)."""
    if given is not None or device.type != "cuda":
        return given
    size = size_query(*args)
    return torch.empty(size, dtype=torch.uint8, device=device) if size else None


def _no_output(*args, **kwargs):
    return None


@torch.library.custom_op("openmla::mla_prefill", mutates_args=("out", "lse", "workspace"))
def mla_prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    softmax_scale: float,
    causal: bool,
    q_descale: float,
    k_descale: float,
    v_descale: float,
    lse_base2: bool,
    out: Tensor,
    lse: Optional[Tensor],
    workspace: Optional[Tensor],
) -> None:
    args = (view(q), view(k), view(v), view(cu_seqlens_q), view(cu_seqlens_kv), max_seqlen_q,
            max_seqlen_kv, softmax_scale, causal, q_descale, k_descale, v_descale, view(out),
            view(lse), lse_base2)
    workspace = _workspace(workspace, _C.dense_prefill_workspace_size, args, q.device)
    _C.dense_prefill(*args, view(workspace), stream_of(q))


@torch.library.custom_op("openmla::mla_decode", mutates_args=("out", "lse", "workspace"))
def mla_decode(
    q: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    softmax_scale: float,
    causal: bool,
    q_descale: float,
    kv_scale: float,
    lse_base2: bool,
    out: Tensor,
    lse: Optional[Tensor],
    workspace: Optional[Tensor],
    enable_pdl: bool = False,
    max_seq_len: int = 0,
) -> None:
    args = (view(q), view(kv_cache), view(block_table), view(seq_lens), softmax_scale, causal,
            q_descale, kv_scale, view(out), view(lse), lse_base2)
    workspace = _workspace(workspace, _C.dense_decode_workspace_size, args, q.device)
    _C.dense_decode(*args, view(workspace), stream_of(q), enable_pdl, max_seq_len)


@torch.library.custom_op(
    "openmla::sparse_mla_prefill", mutates_args=("out", "max_logits", "lse", "workspace"))
def sparse_mla_prefill(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    topk_length: Optional[Tensor],
    attn_sink: Optional[Tensor],
    softmax_scale: float,
    lse_base2: bool,
    out: Tensor,
    max_logits: Optional[Tensor],
    lse: Optional[Tensor],
    workspace: Optional[Tensor],
) -> None:
    args = (view(q), view(kv), view(indices), view(topk_length), view(attn_sink), softmax_scale,
            view(out), view(lse), view(max_logits), lse_base2)
    workspace = _workspace(workspace, _C.sparse_prefill_workspace_size, args, q.device)
    _C.sparse_prefill(*args, view(workspace), stream_of(q))


@torch.library.custom_op("openmla::sparse_mla_decode", mutates_args=("out", "lse", "workspace"))
def sparse_mla_decode(
    q: Tensor,
    kv_cache: Tensor,
    indices: Tensor,
    topk_length: Optional[Tensor],
    extra_kv_cache: Optional[Tensor],
    extra_indices: Optional[Tensor],
    extra_topk_length: Optional[Tensor],
    attn_sink: Optional[Tensor],
    softmax_scale: float,
    lse_base2: bool,
    out: Tensor,
    lse: Optional[Tensor],
    workspace: Optional[Tensor],
) -> None:
    args = (view(q), view(kv_cache), view(indices), view(topk_length), view(extra_kv_cache),
            view(extra_indices), view(extra_topk_length), view(attn_sink), softmax_scale,
            view(out), view(lse), lse_base2)
    workspace = _workspace(workspace, _C.sparse_decode_workspace_size, args, q.device)
    _C.sparse_decode(*args, view(workspace), stream_of(q))


@torch.library.custom_op("openmla::write_kv_cache", mutates_args=("kv_cache",))
def write_kv_cache(
    kv_c: Tensor, k_pe: Tensor, slot_mapping: Tensor, kv_cache: Tensor, scale: float
) -> None:
    _C.write_kv_cache(view(kv_c), view(k_pe), view(slot_mapping), view(kv_cache), scale,
                      stream_of(kv_cache))


@torch.library.custom_op("openmla::gather_ds_mla_cache", mutates_args=("out",))
def gather_ds_mla_cache(
    kv_cache: Tensor, block_table: Tensor, cu_seq_lens: Tensor, out: Tensor
) -> None:
    _C.gather_ds_mla_cache(view(kv_cache), view(block_table), view(cu_seq_lens), view(out),
                           stream_of(kv_cache))


@torch.library.custom_op("openmla::convert_topk_indices", mutates_args=("global_indices",))
def convert_topk_indices(
    local_indices: Tensor,
    request_ids: Tensor,
    block_table: Tensor,
    page_size: int,
    topk_length: Optional[Tensor],
    global_indices: Tensor,
) -> None:
    _C.convert_topk_indices(view(local_indices), view(request_ids), view(block_table), page_size,
                            view(topk_length), view(global_indices), stream_of(local_indices))


@torch.library.custom_op("openmla::pack_kv_quantize_fp8", mutates_args=("k_out", "v_out"))
def pack_kv_quantize_fp8(
    k_nope: Tensor,
    k_pe: Tensor,
    v: Tensor,
    k_scale: float,
    v_scale: float,
    k_out: Tensor,
    v_out: Tensor,
) -> None:
    _C.pack_kv_quantize_fp8(view(k_nope), view(k_pe), view(v), k_scale, v_scale, view(k_out),
                            view(v_out), stream_of(k_nope))


@torch.library.custom_op("openmla::merge_attention", mutates_args=("out", "lse"))
def merge_attention(
    out_a: Tensor,
    lse_a: Tensor,
    out_b: Tensor,
    lse_b: Tensor,
    lse_base2: bool,
    out: Tensor,
    lse: Optional[Tensor],
) -> None:
    _C.merge_attention(view(out_a), view(lse_a), view(out_b), view(lse_b), view(out), view(lse),
                       lse_base2, stream_of(out_a))


for _op in (mla_prefill, mla_decode, sparse_mla_prefill, sparse_mla_decode, write_kv_cache,
            gather_ds_mla_cache, convert_topk_indices, pack_kv_quantize_fp8, merge_attention):
    _op.register_fake(_no_output)
