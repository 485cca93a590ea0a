"""Independent float64 math for the Python tests: brute-force attention and the number
formats, written with torch from the contract (include/openmla/*.h), not from the C++."""

import math

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FLT_MIN = 1.1754943508222875e-38
NAN_SLOT = 2147480000  # garbage in padded block-table entries: must never be read


def randn(shape, generator, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype)


def poisoned(shape, dtype, device="cpu"):
    """An output buffer full of NaN (or 0x7f NaN bytes for fp8, -12345 for ints)."""
    if dtype in (torch.int32, torch.int64):
        return torch.full(shape, -12345, dtype=dtype, device=device)
    if dtype in (FP8, torch.uint8):
        return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def attention(q, k, v, scale, visible=None, sink=None):
    """Softmax attention of one head in float64.

    q [M, D], k [N, D], v [N, Dv]; visible [M, N] bool (None: all); sink: a logit in the
    denominator only. Returns out [M, Dv], natural LSE [M] (sink excluded), max logit [M];
    a row with no visible key gives 0, -inf, -inf.
    """
    q, k, v = q.double(), k.double(), v.double()
    logits = scale * q @ k.T
    if visible is None:
        visible = torch.ones_like(logits, dtype=torch.bool)
    logits = logits.masked_fill(~visible, -math.inf)
    empty = ~visible.any(dim=1)
    lse = torch.logsumexp(logits, dim=1) if logits.shape[1] else torch.full(
        (logits.shape[0],), -math.inf, dtype=torch.float64)
    max_logit = logits.amax(dim=1) if logits.shape[1] else lse.clone()
    denominator = lse if sink is None else torch.logaddexp(lse, torch.tensor(float(sink)).double())
    denominator = torch.where(empty, torch.zeros_like(denominator), denominator)  # no -inf - -inf
    out = torch.exp(logits - denominator[:, None]) @ v
    lse[empty] = -math.inf
    max_logit[empty] = -math.inf
    return out, lse, max_logit


def relative_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def assert_close_lse(actual, expected, base2=False, tolerance=1e-4):
    """LSEs agree: -inf exactly where expected, else to `tolerance` (absolute + relative).
    Returns the largest |actual - expected| / (1 + |expected|), for the margin."""
    expected = expected / math.log(2) if base2 else expected
    actual = actual.double()
    infinite = torch.isinf(expected)
    assert torch.equal(torch.isneginf(actual), infinite), "LSE -inf pattern differs"
    torch.testing.assert_close(actual[~infinite], expected[~infinite], rtol=tolerance,
                               atol=tolerance)
    finite_actual, finite_expected = actual[~infinite], expected[~infinite]
    if finite_expected.numel() == 0:
        return 0.0
    return ((finite_actual - finite_expected).abs() / (1 + finite_expected.abs())).max().item()


def quantize_fp8(values, scale):
    """fp8(values / scale) as the library computes it: values in float32 times the float32
    reciprocal of the scale, then torch's float8_e4m3fn rounding (the contract's in range).
    scale: a number or a float32 tensor that broadcasts against values."""
    reciprocal = 1.0 / torch.as_tensor(scale, dtype=torch.float32)  # float32 division
    return (values.float() * reciprocal).to(FP8)


def ds_mla_tokens(latent, rope):
    """The 656-byte ds_mla layout of tokens [..., 512] + [..., 64] as uint8 [..., 656], and the
    dequantised float64 [..., 576] the kernels see."""
    shape = latent.shape[:-1]
    groups = latent.float().reshape(*shape, 4, 128)
    scales = torch.clamp(groups.abs().amax(dim=-1) / FP8_MAX, min=FLT_MIN)  # [..., 4] fp32
    quantized = quantize_fp8(groups, scales[..., None])
    encoded = torch.cat([
        quantized.reshape(*shape, 512).view(torch.uint8),
        scales.contiguous().view(torch.uint8).reshape(*shape, 16),
        rope.to(torch.bfloat16).contiguous().view(torch.uint8).reshape(*shape, 128),
    ], dim=-1)
    dequantized = torch.cat([
        (quantized.double() * scales[..., None].double()).reshape(*shape, 512),
        rope.to(torch.bfloat16).double(),
    ], dim=-1)
    return encoded, dequantized


def paged_layout(seq_lens, page_size, max_pages, num_pages, generator):
    """A block table [B, max_pages] int32 that gives each request its own pages in a random
    order; entries past a request's last page hold garbage. Returns (block_table, used pages)."""
    order = torch.randperm(num_pages, generator=generator)
    block_table = torch.full((len(seq_lens), max_pages), NAN_SLOT, dtype=torch.int32)
    next_page = 0
    for b, length in enumerate(seq_lens):
        pages = -(-length // page_size)
        block_table[b, :pages] = order[next_page:next_page + pages].to(torch.int32)
        next_page += pages
    assert next_page <= num_pages
    return block_table, order[:next_page]
