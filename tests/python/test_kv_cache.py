# The KV-cache utilities on CPU tensors against float64 / torch math written here.
import math

import pytest
import torch

import openmla
from mla_math import (FP8, ds_mla_tokens, paged_layout, poisoned, quantize_fp8, randn,
                      relative_error)

PAGES, PAGE_SIZE = 4, 16


def _written_slots(slot_mapping):
    return [(t, int(slot)) for t, slot in enumerate(slot_mapping) if slot >= 0]


def _assert_untouched(flat_cache, slot_mapping, is_poison):
    untouched = torch.ones(flat_cache.shape[0], dtype=torch.bool)
    untouched[[slot for _, slot in _written_slots(slot_mapping)]] = False
    assert is_poison(flat_cache[untouched]).all(), "a slot outside slot_mapping was written"


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_write_kv_cache_bf16(generator, slot_dtype):
    kv_c, k_pe = randn((6, 512), generator), randn((6, 64), generator)
    slots = torch.tensor([5, -1, 17, 63, 0, 40], dtype=slot_dtype)
    cache = poisoned((PAGES, PAGE_SIZE, 576), torch.bfloat16)

    openmla.write_kv_cache(kv_c, k_pe, slots, cache)

    flat = cache.view(-1, 576)
    for t, slot in _written_slots(slots):
        assert torch.equal(flat[slot], torch.cat([kv_c[t], k_pe[t]]))
    _assert_untouched(flat, slots, torch.isnan)


@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16])
def test_write_kv_cache_fp8_per_tensor(generator, input_dtype):
    kv_c, k_pe = randn((5, 512), generator, input_dtype), randn((5, 64), generator, input_dtype)
    slots = torch.tensor([3, 60, -7, 18, 33], dtype=torch.int32)
    cache = poisoned((PAGES, PAGE_SIZE, 576), FP8)
    scale = 0.05  # values / scale stay far inside +-448, where torch's rounding is the contract's

    openmla.write_kv_cache(kv_c, k_pe, slots, cache, scale=scale)

    flat = cache.view(torch.uint8).view(-1, 576)
    for t, slot in _written_slots(slots):
        expected = quantize_fp8(torch.cat([kv_c[t], k_pe[t]]), scale).view(torch.uint8)
        assert torch.equal(flat[slot], expected)
    _assert_untouched(flat, slots, lambda rows: rows == 0x7F)


@pytest.mark.parametrize("cache_dtype", [torch.uint8, FP8])
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16])
def test_write_kv_cache_ds_mla(generator, cache_dtype, input_dtype):
    # Groups of very different magnitude, so each of the 4 scales matters.
    group_scales = torch.tensor([0.01, 1.0, 30.0, 0.2]).repeat_interleave(128)
    kv_c = randn((5, 512), generator, torch.float64) * group_scales
    kv_c, k_pe = kv_c.to(input_dtype), randn((5, 64), generator, input_dtype)
    kv_c[2, 128:256] = 0  # an all-zero group: scale FLT_MIN, no division by zero
    slots = torch.tensor([3, 60, -1, 18, 33], dtype=torch.int64)
    cache = poisoned((PAGES, PAGE_SIZE, 656), cache_dtype)

    openmla.write_kv_cache(kv_c, k_pe, slots, cache)

    flat = cache.view(torch.uint8).view(-1, 656)
    expected, _ = ds_mla_tokens(kv_c, k_pe)
    for t, slot in _written_slots(slots):
        assert torch.equal(flat[slot], expected[t]), f"token {t}"
    _assert_untouched(flat, slots, lambda rows: rows == 0x7F)


def test_gather_ds_mla_cache(generator):
    seq_lens = [20, 0, 17]
    block_table, used = paged_layout(seq_lens, PAGE_SIZE, 3, PAGES + 1, generator)
    latent = randn((PAGES + 1, PAGE_SIZE, 512), generator, scale=3.0)
    rope = randn((PAGES + 1, PAGE_SIZE, 64), generator)
    cache, real = ds_mla_tokens(latent, rope)
    unused = torch.ones(PAGES + 1, dtype=torch.bool)
    unused[used] = False
    cache[unused] = 0x7F  # NaN latents: must never be read
    cu_seq_lens = torch.tensor([0, 20, 20, 37], dtype=torch.int32)
    out = poisoned((39, 576), torch.bfloat16)  # two spare rows past cu_seq_lens[-1]

    result = openmla.gather_ds_mla_cache(cache, block_table, cu_seq_lens, out=out)

    assert result is out
    for b, length in enumerate(seq_lens):
        i = torch.arange(length)
        expected = real[block_table[b, i // PAGE_SIZE].long(), i % PAGE_SIZE]
        rows = out[cu_seq_lens[b]:cu_seq_lens[b + 1]].double()
        # One bf16 rounding of the dequantised value (float32 product first: 1 ulp apart).
        torch.testing.assert_close(rows, expected.to(torch.bfloat16).double(), rtol=8e-3, atol=0)
    assert torch.isnan(out[37:].float()).all()
    # Without out: num_tokens read from cu_seq_lens.
    fresh = openmla.gather_ds_mla_cache(cache, block_table, cu_seq_lens)
    assert fresh.shape == (37, 576) and torch.equal(fresh, out[:37])


@pytest.mark.parametrize("with_lengths", [False, True])
def test_convert_topk_indices(generator, with_lengths):
    tokens, topk, batch, max_pages = 5, 7, 3, 3
    block_table = torch.randint(0, 50, (batch, max_pages), generator=generator, dtype=torch.int32)
    capacity = max_pages * PAGE_SIZE
    local = torch.randint(-3, capacity + 5, (tokens, topk), generator=generator, dtype=torch.int32)
    local[0, :2] = torch.tensor([-1, capacity])
    request_ids = torch.tensor([2, 0, 1, 2, 0], dtype=torch.int32)
    topk_length = torch.tensor([7, 0, 3, 5, 1], dtype=torch.int32) if with_lengths else None

    result = openmla.convert_topk_indices(local, request_ids, block_table, PAGE_SIZE,
                                          topk_length=topk_length,
                                          out=poisoned((tokens, topk), torch.int32))

    for t in range(tokens):
        for j in range(topk):
            position = int(local[t, j])
            valid = 0 <= position < capacity and (topk_length is None or j < topk_length[t])
            page = int(block_table[request_ids[t], position // PAGE_SIZE]) if valid else 0
            expected = page * PAGE_SIZE + position % PAGE_SIZE if valid else -1
            assert int(result[t, j]) == expected, (t, j)


@pytest.mark.parametrize("rope_heads", [1, 3])
def test_pack_kv_quantize_fp8(generator, rope_heads):
    tokens, heads, k_scale, v_scale = 4, 3, 0.02, 0.03
    # Strided views of wider buffers, as the up-projection hands them over.
    k_nope = randn((tokens, heads, 256), generator)[..., 128:]
    k_pe = randn((tokens, rope_heads, 96), generator)[..., :64]
    v = randn((tokens, heads, 200), generator)[..., 72:]

    k_out, v_out = openmla.pack_kv_quantize_fp8(k_nope, k_pe, v, k_scale, v_scale)

    assert k_out.dtype == FP8 and k_out.shape == (tokens, heads, 192)
    assert v_out.dtype == FP8 and v_out.shape == (tokens, heads, 128)
    packed = torch.cat([k_nope, k_pe.expand(tokens, heads, 64)], dim=-1)
    # In range (|x / scale| < 448) torch's float8_e4m3fn rounding is the contract's, bit for bit.
    assert (packed.float().abs() / k_scale).max() < 448
    assert torch.equal(k_out.view(torch.uint8), quantize_fp8(packed, k_scale).view(torch.uint8))
    assert torch.equal(v_out.view(torch.uint8), quantize_fp8(v, v_scale).view(torch.uint8))


def test_pack_kv_quantize_fp8_into_given_outputs(generator):
    k_nope, v = randn((2, 2, 128), generator), randn((2, 2, 128), generator)
    k_pe = randn((2, 1, 64), generator)
    k_out, v_out = poisoned((2, 2, 192), FP8), poisoned((2, 2, 128), FP8)
    result = openmla.pack_kv_quantize_fp8(k_nope, k_pe, v, 0.5, 0.25, k_out=k_out, v_out=v_out)
    assert result[0] is k_out and result[1] is v_out
    assert not torch.isnan(k_out.float()).any() and not torch.isnan(v_out.float()).any()
    assert relative_error(v_out.float() * 0.25, v) < 0.07  # fp8: 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lse_base2", [False, True])
def test_merge_attention(generator, dtype, lse_base2):
    tokens, heads, dim = 5, 3, 16
    out_a = randn((tokens, heads, dim), generator, dtype)
    out_b = randn((tokens, heads, dim), generator, dtype)
    lse_a = randn((heads, tokens), generator, torch.float32, scale=3.0).t()  # [T, H], transposed
    lse_b = randn((tokens, heads), generator, torch.float32, scale=3.0)
    lse_a[0, 0] = -math.inf
    out_a[0, 0] = float("nan")  # a side with LSE -inf is not read
    lse_b[1, 1] = -math.inf
    out_b[1, 1] = float("nan")
    lse_a[2, 2] = lse_b[2, 2] = -math.inf

    out, lse = openmla.merge_attention(out_a, lse_a, out_b, lse_b, lse_base2=lse_base2,
                                       out=poisoned((tokens, heads, dim), dtype))

    unit = math.log(2) if lse_base2 else 1.0
    natural_a, natural_b = lse_a.double() * unit, lse_b.double() * unit
    merged = torch.logaddexp(natural_a, natural_b)
    both_empty = torch.isneginf(merged)
    safe = torch.where(both_empty, torch.zeros_like(merged), merged)
    weight_a, weight_b = torch.exp(natural_a - safe), torch.exp(natural_b - safe)
    expected = (torch.nan_to_num(out_a.double()) * weight_a[..., None]
                + torch.nan_to_num(out_b.double()) * weight_b[..., None])
    assert relative_error(out, expected) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert torch.equal(out[2, 2].float(), torch.zeros(dim))
    expected_lse = merged / unit
    assert torch.isneginf(lse[2, 2])
    finite = ~both_empty
    torch.testing.assert_close(lse[finite].double(), expected_lse[finite], rtol=1e-6, atol=1e-5)
