# The drop-in compat modules (openmla.compat.tokenspeed_mla / flash_mla) on CPU tensors: their
# argument names and order, their conventions (LSE base and layout, +inf for empty rows,
# output_scale, default softmax_scale), checked against brute-force float64 attention from
# mla_math.py and against openmla's own API; and their errors.
import inspect
import math

import pytest
import torch

import openmla
from mla_math import (FP8, assert_close_lse, attention, paged_layout, poisoned, randn,
                      relative_error)
from openmla.compat import flash_mla, tokenspeed_mla

BF16_TOLERANCE = 1e-2
FP8_TOLERANCE = 2e-2  # fp8 keys may be rounded to bf16 before the dot product
PAGE_SIZE = 16


def _paged(seq_lens, generator, dtype, scale=1.0):
    """A [pages, PAGE_SIZE, 576] cache in random page order, NaN in unused pages, garbage in
    block-table entries past each request's pages; also each request's float64 keys as the
    kernels see them (stored values: the compat APIs pass no cache scale)."""
    max_pages = max(-(-n // PAGE_SIZE) for n in seq_lens) + 1
    num_pages = sum(-(-n // PAGE_SIZE) for n in seq_lens) + 2
    block_table, used = paged_layout(seq_lens, PAGE_SIZE, max_pages, num_pages, generator)
    values = randn((num_pages, PAGE_SIZE, 576), generator, torch.float64, scale=scale)
    cache = values.float().to(dtype)
    real = cache.double()
    unused = torch.ones(num_pages, dtype=torch.bool)
    unused[used] = False
    cache.view(torch.uint8 if dtype == FP8 else dtype)[unused] = (
        0x7F if dtype == FP8 else float("nan"))
    keys = []
    for b, length in enumerate(seq_lens):
        t = torch.arange(length)
        keys.append(real[block_table[b, t // PAGE_SIZE].long(), t % PAGE_SIZE])
    return cache, block_table, keys


def _expected_decode(q, keys, seq_lens, scale, causal):
    """float64 out [B, Sq, Hq, 512] and natural LSE [B, Sq, Hq] of dense decode."""
    batch, query_tokens, heads = q.shape[:3]
    out = torch.zeros(batch, query_tokens, heads, 512, dtype=torch.float64)
    lse = torch.full((batch, query_tokens, heads), -math.inf, dtype=torch.float64)
    for b, length in enumerate(seq_lens):
        s = torch.arange(query_tokens)[:, None]
        visible = torch.arange(length)[None, :] <= length - query_tokens + s if causal else None
        for h in range(heads):
            out[b, :, h], lse[b, :, h], _ = attention(q[b, :, h].double(), keys[b],
                                                      keys[b][:, :512], scale, visible)
    return out, lse


def _check_out(out, expected, seq_lens, tolerance):
    for b, length in enumerate(seq_lens):
        if length:
            assert relative_error(out[b], expected[b]) < tolerance
        else:
            assert torch.equal(out[b].float(), torch.zeros_like(out[b].float()))


def _workspace_for(q, cache, block_table, seq_lens):
    size = openmla.get_mla_decode_workspace_size(q, cache, block_table, seq_lens)
    return torch.empty(size, dtype=torch.int8)


# ---- TokenSpeed ---------------------------------------------------------------------------

def test_tokenspeed_signatures():
    def names(function):
        return list(inspect.signature(function).parameters)
    assert names(tokenspeed_mla.tokenspeed_mla_decode)[:15] == [
        "query", "kv_cache", "workspace_buffer", "kv_lora_rank", "qk_rope_head_dim",
        "block_tables", "seq_lens", "max_seq_len", "softmax_scale", "output_scale", "out",
        "is_var_seq", "causal_mask", "enable_pdl", "return_lse"]
    assert names(tokenspeed_mla.tokenspeed_mla_prefill)[:13] == [
        "query", "key", "value", "seq_lens", "cum_seq_lens", "max_seq_len", "batch_size",
        "softmax_scale", "is_causal", "return_lse", "cum_seq_lens_q", "max_seq_len_q",
        "enable_pdl"]
    assert names(tokenspeed_mla.mla_kv_pack_quantize_fp8)[:7] == [
        "k_nope", "k_pe", "v", "k_scale_inv", "v_scale_inv", "k_out", "v_out"]
    defaults = inspect.signature(tokenspeed_mla.tokenspeed_mla_decode).parameters
    assert defaults["causal_mask"].default is True and defaults["is_var_seq"].default is True
    assert defaults["output_scale"].default == 1.0 and defaults["return_lse"].default is False


@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float16, torch.float16),
                                              (FP8, FP8), (torch.bfloat16, FP8)])
@pytest.mark.parametrize("causal_mask,output_scale", [(True, 1.0), (False, 0.37), (True, 2.5)])
@pytest.mark.parametrize("layout", ["3d", "pages_1_page", "pages_page_1"])
def test_tokenspeed_decode(generator, q_dtype, kv_dtype, causal_mask, output_scale, layout):
    seq_lens, query_tokens, heads = [21, 0, 35], 3, 5
    fp8_values = 8.0 if kv_dtype == FP8 else 1.0  # stored fp8 values use the format's range
    cache, block_table, keys = _paged(seq_lens, generator, kv_dtype, scale=fp8_values)
    q = randn((len(seq_lens), query_tokens, heads, 576), generator, torch.float64,
              scale=8.0 if q_dtype == FP8 else 1.0).float().to(q_dtype)
    lengths = torch.tensor(seq_lens, dtype=torch.int32)
    scale = 0.3 / math.sqrt(576) / fp8_values  # a caller's k_scale folded into softmax_scale
    kv = {"3d": cache, "pages_1_page": cache.unsqueeze(1),
          "pages_page_1": cache.unsqueeze(2)}[layout]
    out_dtype = torch.float16 if q_dtype == torch.float16 else torch.bfloat16

    out, lse = tokenspeed_mla.tokenspeed_mla_decode(
        q, kv, _workspace_for(q, cache, block_table, lengths), 512, 64, block_table, lengths,
        max(seq_lens), scale, output_scale=output_scale, causal_mask=causal_mask,
        return_lse=True)

    assert out.dtype == out_dtype and out.shape == (3, query_tokens, heads, 512)
    expected_out, expected_lse = _expected_decode(q, keys, seq_lens, scale, causal_mask)
    tolerance = FP8_TOLERANCE if kv_dtype == FP8 else BF16_TOLERANCE
    _check_out(out, expected_out * output_scale, seq_lens, tolerance)
    assert_close_lse(lse, expected_lse, base2=True)  # TokenSpeed's LSE is base 2


def test_tokenspeed_decode_is_mla_decode(generator):
    """Same numbers as openmla.mla_decode, into the caller's out / lse_out, int64 seq_lens;
    enable_pdl=True is passed through (a launch option: no effect on CPU numbers)."""
    seq_lens = [40, 7]
    cache, block_table, _ = _paged(seq_lens, generator, torch.bfloat16)
    q = randn((2, 2, 16, 576), generator)
    lengths = torch.tensor(seq_lens, dtype=torch.int32)
    out, lse_out = poisoned((2, 2, 16, 512), torch.bfloat16), poisoned((2, 2, 16), torch.float32)
    expected, expected_lse = openmla.mla_decode(q, cache, block_table, lengths, 0.05, causal=True,
                                                return_lse=True, lse_base2=True)

    result, lse = tokenspeed_mla.tokenspeed_mla_decode(
        q, cache, _workspace_for(q, cache, block_table, lengths), 512, 64, block_table,
        lengths.long(), 64, 0.05, 1.0, out, True, True, False, True, lse_out=lse_out)

    assert result is out and lse is lse_out
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    only_out = tokenspeed_mla.tokenspeed_mla_decode(
        query=q, kv_cache=cache, workspace_buffer=_workspace_for(q, cache, block_table, lengths),
        kv_lora_rank=512, qk_rope_head_dim=64, block_tables=block_table, seq_lens=lengths,
        max_seq_len=64, softmax_scale=0.05)  # causal_mask defaults to True
    assert isinstance(only_out, torch.Tensor) and torch.equal(only_out, expected)
    with_pdl = tokenspeed_mla.tokenspeed_mla_decode(
        q, cache, _workspace_for(q, cache, block_table, lengths), 512, 64, block_table, lengths,
        64, 0.05, enable_pdl=True)
    assert torch.equal(with_pdl, expected)


def test_tokenspeed_decode_errors(generator):
    cache, block_table, _ = _paged([20], generator, torch.bfloat16)
    q = randn((1, 1, 4, 576), generator)
    lengths = torch.tensor([20], dtype=torch.int32)
    workspace = _workspace_for(q, cache, block_table, lengths)
    needed = workspace.numel()
    assert needed > 0

    def call(**changes):
        args = dict(query=q, kv_cache=cache, workspace_buffer=workspace, kv_lora_rank=512,
                    qk_rope_head_dim=64, block_tables=block_table, seq_lens=lengths,
                    max_seq_len=20, softmax_scale=0.1)
        args.update(changes)
        return tokenspeed_mla.tokenspeed_mla_decode(**args)

    with pytest.raises(ValueError, match=f"workspace_buffer.*{needed}"):
        call(workspace_buffer=workspace[:needed - 1])
    with pytest.raises(ValueError, match="workspace_buffer.*int8"):
        call(workspace_buffer=torch.empty(needed, dtype=torch.float32))
    with pytest.raises(ValueError, match="kv_lora_rank"):
        call(kv_lora_rank=448)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        call(qk_rope_head_dim=32)
    with pytest.raises(ValueError, match="max_seq_len"):
        call(max_seq_len=0)
    with pytest.raises(ValueError, match="out"):
        call(out=torch.empty(1, 1, 4, 512, dtype=torch.float16))
    with pytest.raises(ValueError, match="lse_out"):
        call(lse_out=torch.empty(1, 1, 4))
    with pytest.raises(ValueError, match="q"):  # openmla's own validation: Sq 9 > 8
        call(query=randn((1, 9, 4, 576), generator),
             workspace_buffer=torch.empty(1 << 24, dtype=torch.int8))
    assert call().shape == (1, 1, 4, 512)  # the arguments above were fine


@pytest.mark.parametrize("causal", [True, False])
def test_tokenspeed_prefill(generator, causal):
    lengths_q, lengths_kv = [3, 5], [7, 5]
    cu_q = torch.tensor([0, 3, 8, 8, 8], dtype=torch.int32)  # padded past the batch
    cu_kv = torch.tensor([0, 7, 12, 12], dtype=torch.int32)
    q, k = randn((8, 4, 192), generator), randn((12, 2, 192), generator)
    v = randn((12, 2, 128), generator)
    expected, expected_lse = openmla.mla_prefill(q, k, v, cu_q[:3], cu_kv[:3], 5, 7, 0.1,
                                                 causal=causal, return_lse=True)

    out, lse = tokenspeed_mla.tokenspeed_mla_prefill(
        q, k, v, torch.tensor(lengths_kv, dtype=torch.int32), cu_kv, 7, 2, 0.1, causal, True,
        cu_q, 5, False)

    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    # Without cum_seq_lens_q, queries are the keys' own tokens (self-attention).
    only_out = tokenspeed_mla.tokenspeed_mla_prefill(
        query=k.repeat(1, 2, 1), key=k, value=v, seq_lens=None, cum_seq_lens=cu_kv,
        max_seq_len=7, batch_size=2, softmax_scale=0.1, is_causal=causal)
    self_attention = openmla.mla_prefill(k.repeat(1, 2, 1), k, v, cu_kv[:3], cu_kv[:3], 7, 7,
                                         0.1, causal=causal)
    assert torch.equal(only_out, self_attention)


@pytest.mark.parametrize("rope_shape", ["2d", "one_head"])
def test_tokenspeed_pack_quantize(generator, rope_shape):
    tokens, heads = 6, 3
    k_nope = randn((tokens, heads, 128), generator, scale=30.0)
    k_pe = randn((tokens, 64) if rope_shape == "2d" else (tokens, 1, 64), generator, scale=30.0)
    v = randn((tokens, heads, 128), generator, scale=30.0)

    # Power-of-two multipliers: 1 / (1 / x) is exact, so the result is bit for bit.
    k, quantized_v = tokenspeed_mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, 4.0, 0.5)

    rope = k_pe.reshape(tokens, 1, 64).expand(tokens, heads, 64)
    expected_k = (torch.cat([k_nope, rope], dim=-1).float() * 4.0).to(FP8)
    expected_v = (v.float() * 0.5).to(FP8)
    assert k.dtype == FP8 and k.shape == (tokens, heads, 192)
    assert torch.equal(k.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(quantized_v.view(torch.uint8), expected_v.view(torch.uint8))
    with pytest.raises(ValueError, match="fp8_dtype"):
        tokenspeed_mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, fp8_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="v_scale_inv"):
        tokenspeed_mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, 1.0, 0.0)


def test_tokenspeed_warmup_is_a_no_op():
    assert tokenspeed_mla.warmup_compile_prefill() is None
    assert tokenspeed_mla.warmup_compile_prefill(torch.bfloat16, 192, 128, True) is None


# ---- FlashMLA -----------------------------------------------------------------------------

def test_flash_mla_signatures():
    names = list(inspect.signature(flash_mla.flash_mla_with_kvcache).parameters)
    assert names[:11] == ["q", "k_cache", "block_table", "cache_seqlens", "head_dim_v",
                          "tile_scheduler_metadata", "num_splits", "softmax_scale", "causal",
                          "is_fp8_kvcache", "indices"]
    assert list(inspect.signature(flash_mla.get_mla_metadata).parameters) == [
        "cache_seqlens", "num_q_tokens_per_head_k", "num_heads_k", "num_heads_q",
        "is_fp8_kvcache", "topk"]


def _flash_mla_inputs(generator, dtype=torch.bfloat16, seq_lens=(30, 0, 17), query_tokens=2,
                      heads=3):
    cache, block_table, keys = _paged(list(seq_lens), generator, dtype)
    q = randn((len(seq_lens), query_tokens, heads, 576), generator, dtype)
    return q, cache.unsqueeze(2), block_table, torch.tensor(seq_lens, dtype=torch.int32), keys


@pytest.mark.parametrize("form", ["argument_less", "older"])
@pytest.mark.parametrize("dtype,causal", [(torch.bfloat16, True), (torch.float16, False)])
def test_flash_mla_dense(generator, form, dtype, causal):
    seq_lens, query_tokens, heads = [30, 0, 17], 2, 3
    q, cache, block_table, lengths, keys = _flash_mla_inputs(generator, dtype, seq_lens,
                                                             query_tokens, heads)
    if form == "argument_less":
        metadata, num_splits = flash_mla.get_mla_metadata()
        assert isinstance(metadata, flash_mla.MlaSchedMeta) and num_splits is None
    else:
        metadata, num_splits = flash_mla.get_mla_metadata(lengths, query_tokens * heads, 1)
        assert metadata.dtype == torch.int32 and metadata.dim() == 2
        assert metadata.shape[1] == 8 and metadata.shape[0] >= 1
        assert num_splits.dtype == torch.int32 and num_splits.shape == (4,)

    for _ in range(2):  # a metadata object serves every call of its shape
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512,
                                                    metadata, num_splits, causal=causal)
        assert out.dtype == dtype and out.shape == (3, query_tokens, heads, 512)
        assert lse.shape == (3, heads, query_tokens) and lse.dtype == torch.float32
        expected_out, expected_lse = _expected_decode(q, keys, seq_lens, 576 ** -0.5, causal)
        _check_out(out, expected_out, seq_lens, BF16_TOLERANCE)
        # FlashMLA's layout [B, Hq, Sq], and +inf (not -inf) for the empty request.
        assert torch.equal(lse[1], torch.full((heads, query_tokens), math.inf))
        assert_close_lse(lse[[0, 2]].transpose(1, 2), expected_lse[[0, 2]])


def test_flash_mla_dense_is_mla_decode(generator):
    q, cache, block_table, lengths, _ = _flash_mla_inputs(generator)
    expected, expected_lse = openmla.mla_decode(q, cache, block_table, lengths, 0.07,
                                                causal=True, return_lse=True)
    metadata, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512, metadata,
                                                None, 0.07, True)
    assert torch.equal(out, expected)
    assert torch.equal(lse.transpose(1, 2), torch.where(torch.isneginf(expected_lse),
                                                        math.inf, expected_lse))


def test_flash_mla_errors(generator):
    q, cache, block_table, lengths, _ = _flash_mla_inputs(generator)
    metadata, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512, metadata)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):  # another shape
        flash_mla.flash_mla_with_kvcache(q[:, :1], cache, block_table, lengths, 512, metadata)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):  # causal differs
        flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512, metadata,
                                         causal=True)
    fresh, _ = flash_mla.get_mla_metadata()
    with pytest.raises(ValueError, match="head_dim_v"):
        flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 128, fresh)
    with pytest.raises(NotImplementedError, match="FP8 dense"):
        flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512, fresh,
                                         is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="k_cache"):
        flash_mla.flash_mla_with_kvcache(q, cache.half(), block_table, lengths, 512, fresh)
    with pytest.raises(ValueError, match="sparse"):
        flash_mla.flash_mla_with_kvcache(q, cache, block_table, lengths, 512, fresh,
                                         attn_sink=torch.zeros(3))
    with pytest.raises(ValueError, match="older form"):
        flash_mla.get_mla_metadata(lengths)


def test_flash_mla_sparse_routes_to_sparse_decode(generator):
    batch, query_tokens, heads, pages, topk = 2, 2, 3, 4, 8
    q = randn((batch, query_tokens, heads, 576), generator)
    cache = randn((pages, PAGE_SIZE, 1, 576), generator)
    indices = torch.stack([torch.randperm(pages * PAGE_SIZE, generator=generator)[:topk]
                           for _ in range(batch * query_tokens)]).to(torch.int32)
    indices[-1] = -1  # the last query of the last request selects nothing: LSE +inf
    indices = indices.reshape(batch, query_tokens, topk)
    sink = randn((heads,), generator, torch.float32)
    expected, expected_lse = openmla.sparse_mla_decode(q, cache, indices, 0.05, attn_sink=sink)

    metadata, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, metadata, None, 0.05,
                                                indices=indices, attn_sink=sink)

    assert torch.equal(out, expected)
    assert torch.equal(lse[1, :, 1], torch.full((heads,), math.inf))
    assert torch.equal(lse.transpose(1, 2), torch.where(torch.isneginf(expected_lse),
                                                        math.inf, expected_lse))
    rows = cache.reshape(-1, 576)[indices[0, 0].long()].double()
    o, l, _ = attention(q[0, 0, 0][None], rows, rows[:, :512], 0.05, sink=float(sink[0]))
    assert relative_error(out[0, 0, 0], o[0]) < BF16_TOLERANCE
    assert_close_lse(lse[0, 0, 0][None], l)
    with pytest.raises(ValueError, match="causal"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, metadata, None, 0.05,
                                         causal=True, indices=indices)


def test_flash_mla_sparse_fwd_follows_flash_mla_conventions(generator):
    tokens, heads, rows, topk = 5, 3, 40, 8
    q = randn((tokens, heads, 576), generator)
    kv = randn((rows, 1, 576), generator)
    indices = torch.stack([torch.randperm(rows, generator=generator)[:topk]
                           for _ in range(tokens)]).to(torch.int32)
    indices[2, 3] = -1
    indices[4] = -1  # query 4 selects nothing: lse +inf, max_logits -inf, out 0
    indices = indices.reshape(tokens, 1, topk)
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.05)
    for t in range(tokens - 1):
        valid = indices[t, 0][indices[t, 0] >= 0].long()
        keys = kv[valid, 0].double()
        logits = q[t].double() @ keys.T * 0.05 / math.log(2.0)  # base-2 scaled logits
        o, _, _ = attention(q[t].double(), keys, keys[:, :512], 0.05)
        assert relative_error(out[t], o) < BF16_TOLERANCE
        assert torch.allclose(max_logits[t].double(), logits.max(dim=-1).values, rtol=1e-5, atol=1e-5)
        assert torch.allclose(lse[t].double(), torch.logsumexp(logits * math.log(2.0), dim=-1) /
                              math.log(2.0), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[4].float(), torch.zeros(heads, 512))
    assert torch.equal(lse[4], torch.full((heads,), math.inf))
    assert torch.equal(max_logits[4], torch.full((heads,), -math.inf))
    with pytest.raises(ValueError, match="d_v"):
        flash_mla.flash_mla_sparse_fwd(q, kv, indices, 0.05, d_v=256)
