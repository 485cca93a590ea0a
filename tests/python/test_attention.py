# The four attention ops on CPU tensors (the C++ reference behind the torch API) against
# brute-force float64 attention written in mla_math.py.
import math

import pytest
import torch

import openmla
from mla_math import (FP8, assert_close_lse, attention, ds_mla_tokens, paged_layout,
                      poisoned, randn, relative_error)

BF16_TOLERANCE = 1e-2
FP8_CACHE_TOLERANCE = 2e-2  # the kernels may round dequantised fp8 keys to bf16 before the dot


@pytest.mark.parametrize("heads,kv_heads", [(3, 1), (4, 2)])
@pytest.mark.parametrize("causal,lse_base2", [(False, False), (True, True), (True, False)])
def test_mla_prefill(generator, heads, kv_heads, causal, lse_base2):
    # Chunked prefill: lq <= lk; a request with no queries and one with queries but no keys.
    lengths_q, lengths_kv = [3, 0, 5, 2], [7, 4, 5, 0]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0)], dtype=torch.int32)
    cu_kv = torch.tensor([0, *torch.tensor(lengths_kv).cumsum(0)], dtype=torch.int32)
    total_q, total_kv = int(cu_q[-1]), int(cu_kv[-1])
    # Strided views (only the last dim contiguous), as a fused qkv projection hands them over.
    q = randn((total_q, heads, 256), generator)[..., :192]
    k = randn((total_kv, kv_heads, 192), generator)
    v = randn((total_kv, kv_heads, 256), generator)[..., 128:]
    scale = 1 / math.sqrt(192)
    out = poisoned((total_q, heads, 128), torch.bfloat16)

    result, lse = openmla.mla_prefill(q, k, v, cu_q, cu_kv, max(lengths_q), max(lengths_kv),
                                      scale, causal=causal, return_lse=True,
                                      lse_base2=lse_base2, out=out)

    assert result is out and lse.shape == (total_q, heads) and lse.dtype == torch.float32
    expected_out = torch.zeros(total_q, heads, 128, dtype=torch.float64)
    expected_lse = torch.full((total_q, heads), -math.inf, dtype=torch.float64)
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_kv)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        i = torch.arange(lq)[:, None]
        visible = torch.arange(lk)[None, :] <= lk - lq + i if causal else None
        for h in range(heads):
            kv_head = h // (heads // kv_heads)
            o, l, _ = attention(q[rows, h], k[keys, kv_head], v[keys, kv_head], scale, visible)
            expected_out[rows, h], expected_lse[rows, h] = o, l
    assert relative_error(out, expected_out) < BF16_TOLERANCE
    assert_close_lse(lse, expected_lse, base2=lse_base2)


def test_mla_prefill_fp8_with_descales(generator):
    lengths = [6, 3]
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    q8, k8, v8 = (randn((9, 2, d), generator, scale=40.0).float().to(FP8) for d in (192, 192, 128))
    descales = (0.02, 0.03, 0.05)
    out, lse = openmla.mla_prefill(q8, k8, v8, cu, cu, 6, 6, 0.1, causal=True,
                                   q_descale=descales[0], k_descale=descales[1],
                                   v_descale=descales[2], return_lse=True)
    assert out.dtype == torch.bfloat16
    q, k, v = (t.double() * s for t, s in zip((q8, k8, v8), descales))
    for b, length in enumerate(lengths):
        rows = slice(cu[b], cu[b + 1])
        visible = torch.ones(length, length, dtype=torch.bool).tril()
        for h in range(2):
            o, l, _ = attention(q[rows, h], k[rows, h], v[rows, h], 0.1, visible)
            assert relative_error(out[rows, h], o) < BF16_TOLERANCE
            assert_close_lse(lse[rows, h], l)


def _paged_cache(seq_lens, page_size, generator, dtype, extra_pages=3, kv_scale=1.0):
    """A paged [pages, page_size, 576] cache with NaN in unused pages, its block table (garbage
    past each request's pages) and the float64 keys of each request."""
    max_pages = max(-(-n // page_size) for n in seq_lens) + 1
    num_pages = sum(-(-n // page_size) for n in seq_lens) + extra_pages
    block_table, used = paged_layout(seq_lens, page_size, max_pages, num_pages, generator)
    values = randn((num_pages, page_size, 576), generator, torch.float64)
    if dtype == FP8:
        cache = (values / kv_scale).float().to(FP8)  # stored values well inside +-448
    else:
        cache = values.to(dtype)
    real = cache.double() * (kv_scale if dtype == FP8 else 1.0)
    unused = torch.ones(num_pages, dtype=torch.bool)
    unused[used] = False
    cache.view(torch.uint8 if dtype == FP8 else cache.dtype)[unused] = (
        0x7F if dtype == FP8 else float("nan"))
    keys = []
    for b, length in enumerate(seq_lens):
        t = torch.arange(length)
        keys.append(real[block_table[b, t // page_size].long(), t % page_size])
    return cache, block_table, keys


@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float16, torch.float16),
                                              (torch.bfloat16, FP8)])
@pytest.mark.parametrize("causal", [False, True])
def test_mla_decode(generator, q_dtype, kv_dtype, causal):
    seq_lens, query_tokens, heads, page_size, kv_scale = [20, 0, 33, 1], 2, 3, 16, 0.7
    cache, block_table, keys = _paged_cache(seq_lens, page_size, generator, kv_dtype,
                                            kv_scale=kv_scale)
    q = randn((len(seq_lens), query_tokens, heads, 576), generator, q_dtype)
    scale = 1 / math.sqrt(576)
    out = poisoned((len(seq_lens), query_tokens, heads, 512), torch.bfloat16)

    result, lse = openmla.mla_decode(q, cache, block_table,
                                     torch.tensor(seq_lens, dtype=torch.int32), scale,
                                     causal=causal, kv_scale=kv_scale, return_lse=True, out=out)

    assert result is out
    for b, length in enumerate(seq_lens):
        s = torch.arange(query_tokens)[:, None]
        visible = torch.arange(length)[None, :] <= length - query_tokens + s if causal else None
        for h in range(heads):
            o, l, _ = attention(q[b, :, h], keys[b], keys[b][:, :512], scale, visible)
            tolerance = FP8_CACHE_TOLERANCE if kv_dtype == FP8 else BF16_TOLERANCE
            if length:
                assert relative_error(out[b, :, h], o) < tolerance
            else:
                assert torch.equal(out[b, :, h].float(), torch.zeros(query_tokens, 512))
            assert_close_lse(lse[b, :, h], l)


def _sparse_selection(rows, topk, num_slots, generator, length=None):
    """Distinct random slots [rows, topk] with invalid entries (-1, num_slots, huge) mixed in;
    the last row selects nothing valid."""
    indices = torch.stack([torch.randperm(num_slots, generator=generator)[:topk]
                           for _ in range(rows)]).to(torch.int32)
    indices[0, 1], indices[min(1, rows - 1), 0] = -1, num_slots
    indices[rows - 1] = torch.tensor([-1, num_slots, 1 << 30] * topk)[:topk]
    return indices


def _valid(indices, length, num_slots):
    chosen = indices[:length].long()
    return chosen[(chosen >= 0) & (chosen < num_slots)]


@pytest.mark.parametrize("head_dim", [576, 512])
@pytest.mark.parametrize("with_lengths,with_sink", [(False, False), (True, True), (True, False)])
def test_sparse_mla_prefill(generator, head_dim, with_lengths, with_sink):
    tokens_q, tokens_kv, heads, topk = 5, 9, 3, 6
    q = randn((tokens_q, heads, head_dim), generator)
    kv = randn((tokens_kv, 1, head_dim), generator)
    indices = _sparse_selection(tokens_q, topk, tokens_kv, generator)
    topk_length = torch.tensor([6, 0, 3, 6, 2], dtype=torch.int32) if with_lengths else None
    sink = randn((heads,), generator, torch.float32) if with_sink else None
    scale = 1 / math.sqrt(head_dim)

    out, max_logits, lse = openmla.sparse_mla_prefill(
        q, kv, indices, scale, topk_length=topk_length, attn_sink=sink,
        out=poisoned((tokens_q, heads, 512), torch.bfloat16))

    for i in range(tokens_q):
        length = int(topk_length[i]) if with_lengths else topk
        rows = kv[_valid(indices[i], length, tokens_kv), 0]
        for h in range(heads):
            o, l, m = attention(q[i, h][None], rows, rows[:, :512], scale,
                                sink=None if sink is None else float(sink[h]))
            if torch.isinf(l):
                assert torch.equal(out[i, h].float(), torch.zeros(512))
            else:
                assert relative_error(out[i, h], o[0]) < BF16_TOLERANCE
            assert_close_lse(lse[i, h][None], l)
            assert_close_lse(max_logits[i, h][None], m)


def _sparse_cache(pages, page_size, head_dim, ds_mla, generator):
    """A paged sparse cache (bf16 or ds_mla bytes) and its float64 [slots, head_dim] view."""
    values = randn((pages, page_size, head_dim), generator)
    if not ds_mla:
        return values, values.double().reshape(-1, head_dim)
    encoded, real = ds_mla_tokens(values[..., :512], values[..., 512:])
    return encoded, real.reshape(-1, head_dim)


def _poison_unselected(cache, selected_slots, page_size, ds_mla):
    flat = cache.view(-1, cache.shape[-1])
    keep = torch.zeros(flat.shape[0], dtype=torch.bool)
    keep[selected_slots] = True
    flat[~keep] = 0x7F if ds_mla else float("nan")  # 0x7f bytes: NaN fp8 and scales


@pytest.mark.parametrize("head_dim,ds_mla", [(576, False), (512, False), (576, True)])
@pytest.mark.parametrize("with_lengths,with_sink,with_extra",
                         [(False, False, False), (True, True, False), (True, True, True),
                          (False, False, True)])
def test_sparse_mla_decode(generator, head_dim, ds_mla, with_lengths, with_sink, with_extra):
    batch, query_tokens, heads, page_size, topk, extra_topk = 2, 2, 3, 16, 8, 5
    sources = [(4, topk)] + ([(3, extra_topk)] if with_extra else [])
    caches, reals, selections, lengths = [], [], [], []
    for pages, k in sources:
        cache, real = _sparse_cache(pages, page_size, head_dim, ds_mla, generator)
        indices = _sparse_selection(batch * query_tokens, k, pages * page_size, generator)
        length = torch.tensor([k, 3], dtype=torch.int32) if with_lengths else None
        selected = torch.cat([
            _valid(indices[r], k if length is None else int(length[r // query_tokens]),
                   pages * page_size) for r in range(batch * query_tokens)])
        _poison_unselected(cache, selected, page_size, ds_mla)
        caches.append(cache)
        reals.append(real)
        selections.append(indices.reshape(batch, query_tokens, k))
        lengths.append(length)
    if ds_mla:
        caches[0] = caches[0].view(FP8)  # both uint8 and float8_e4m3fn name the ds_mla layout
    q = randn((batch, query_tokens, heads, head_dim), generator)
    sink = randn((heads,), generator, torch.float32) if with_sink else None
    scale = 1 / math.sqrt(head_dim)
    extra = dict(extra_kv_cache=caches[1], extra_indices=selections[1],
                 extra_topk_length=lengths[1]) if with_extra else {}

    out, lse = openmla.sparse_mla_decode(
        q, caches[0], selections[0], scale, topk_length=lengths[0], attn_sink=sink,
        out=poisoned((batch, query_tokens, heads, 512), torch.bfloat16), **extra)

    tolerance = FP8_CACHE_TOLERANCE if ds_mla else BF16_TOLERANCE
    for b in range(batch):
        for s in range(query_tokens):
            rows = torch.cat([
                real[_valid(indices[b, s], k if length is None else int(length[b]), len(real))]
                for real, indices, length, k in zip(reals, selections, lengths,
                                                    [topk, extra_topk])])
            for h in range(heads):
                o, l, _ = attention(q[b, s, h][None], rows, rows[:, :512], scale,
                                    sink=None if sink is None else float(sink[h]))
                if torch.isinf(l):
                    assert torch.equal(out[b, s, h].float(), torch.zeros(512))
                else:
                    assert relative_error(out[b, s, h], o[0]) < tolerance
                assert_close_lse(lse[b, s, h][None], l)
