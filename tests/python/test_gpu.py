# CUDA tensors through the torch API: the KV utilities against their CPU results, the attention
# ops matching the CPU (those without a kernel yet may refuse with NotImplementedError, never
# a silent CPU copy), and CUDA-graph capture + replay. Skipped where torch sees no CUDA device.
import math

import pytest
import torch

import openmla
from mla_math import FP8, ds_mla_tokens, paged_layout, poisoned, randn, relative_error

pytestmark = pytest.mark.gpu


def _to_cpu(result):
    if isinstance(result, (tuple, list)):
        return [_to_cpu(r) for r in result]
    return result.cpu() if isinstance(result, torch.Tensor) else result


def _bytes(tensor):
    return tensor.cpu().contiguous().view(torch.uint8)


@pytest.mark.parametrize("cache_format", ["bf16", "fp8", "ds_mla"])
def test_write_kv_cache_gpu_matches_cpu(generator, cache_format):
    formats = {"bf16": (576, torch.bfloat16), "fp8": (576, FP8), "ds_mla": (656, torch.uint8)}
    last, dtype = formats[cache_format]
    kv_c, k_pe = randn((9, 512), generator, scale=4.0), randn((9, 64), generator)
    slots = torch.tensor([5, -1, 17, 63, 0, 40, 41, -3, 2], dtype=torch.int64)
    cache_cpu = poisoned((4, 16, last), dtype)
    cache_gpu = cache_cpu.cuda()
    openmla.write_kv_cache(kv_c, k_pe, slots, cache_cpu, scale=0.05)
    openmla.write_kv_cache(kv_c.cuda(), k_pe.cuda(), slots.cuda(), cache_gpu, scale=0.05)
    assert torch.equal(_bytes(cache_gpu), _bytes(cache_cpu))


def test_gather_convert_pack_merge_gpu_match_cpu(generator):
    # gather_ds_mla_cache
    seq_lens = [20, 0, 37]
    block_table, _ = paged_layout(seq_lens, 16, 3, 6, generator)
    cache, _ = ds_mla_tokens(randn((6, 16, 512), generator, scale=3.0),
                             randn((6, 16, 64), generator))
    cu = torch.tensor([0, 20, 20, 57], dtype=torch.int32)
    cpu = openmla.gather_ds_mla_cache(cache, block_table, cu, num_tokens=57)
    gpu = openmla.gather_ds_mla_cache(cache.cuda(), block_table.cuda(), cu.cuda(), num_tokens=57)
    assert torch.equal(gpu.cpu(), cpu)

    # convert_topk_indices
    local = torch.randint(-2, 60, (6, 9), generator=generator, dtype=torch.int32)
    request_ids = torch.tensor([0, 1, 2, 2, 1, 0], dtype=torch.int32)
    table = torch.randint(0, 40, (3, 3), generator=generator, dtype=torch.int32)
    lengths = torch.tensor([9, 0, 4, 9, 1, 7], dtype=torch.int32)
    cpu = openmla.convert_topk_indices(local, request_ids, table, 16, topk_length=lengths)
    gpu = openmla.convert_topk_indices(local.cuda(), request_ids.cuda(), table.cuda(), 16,
                                       topk_length=lengths.cuda())
    assert torch.equal(gpu.cpu(), cpu)

    # pack_kv_quantize_fp8, strided inputs, saturation beyond 448 included
    k_nope = randn((5, 4, 256), generator, scale=3.0)[..., :128]
    k_pe, v = randn((5, 1, 64), generator), randn((5, 4, 128), generator)
    cpu = openmla.pack_kv_quantize_fp8(k_nope, k_pe, v, 0.01, 0.02)
    gpu = openmla.pack_kv_quantize_fp8(k_nope.cuda(), k_pe.cuda(), v.cuda(), 0.01, 0.02)
    for c, g in zip(cpu, gpu):
        assert torch.equal(_bytes(g), _bytes(c))

    # merge_attention with an empty side
    out_a, out_b = randn((6, 3, 32), generator), randn((6, 3, 32), generator)
    lse_a, lse_b = torch.randn(6, 3, generator=generator), torch.randn(6, 3, generator=generator)
    lse_a[0, 0] = lse_b[1, 1] = lse_a[2, 2] = lse_b[2, 2] = -math.inf
    cpu = openmla.merge_attention(out_a, lse_a, out_b, lse_b)
    gpu = openmla.merge_attention(out_a.cuda(), lse_a.cuda(), out_b.cuda(), lse_b.cuda())
    assert relative_error(gpu[0].cpu(), cpu[0]) < 1e-2
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], rtol=1e-5, atol=1e-5)


def _attention_calls(generator):
    """Each attention op with small valid CPU inputs: (name, inputs, call)."""
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    seq_lens = [20, 3]
    block_table, _ = paged_layout(seq_lens, 16, 2, 3, generator)
    return [
        ("dense_prefill", [randn((9, 2, 192), generator), randn((9, 1, 192), generator),
                           randn((9, 1, 128), generator), cu, cu],
         lambda q, k, v, cq, ck: openmla.mla_prefill(q, k, v, cq, ck, 5, 5, 0.07, causal=True)),
        ("dense_decode", [randn((2, 2, 8, 576), generator), randn((3, 16, 576), generator),
                          block_table, torch.tensor(seq_lens, dtype=torch.int32)],
         lambda q, c, t, s: openmla.mla_decode(q, c, t, s, 0.04, causal=True)),
        ("sparse_prefill", [randn((4, 3, 576), generator), randn((8, 1, 576), generator),
                            torch.tensor([[0, 3, -1], [7, 8, 1], [2, 2 ** 20, 5], [-1, -1, -1]],
                                         dtype=torch.int32)],
         lambda q, kv, i: openmla.sparse_mla_prefill(q, kv, i, 0.04)),
        ("sparse_decode", [randn((2, 1, 3, 576), generator), randn((2, 16, 576), generator),
                           torch.tensor([[[0, 31, -1]], [[5, 6, 40]]], dtype=torch.int32)],
         lambda q, c, i: openmla.sparse_mla_decode(q, c, i, 0.04)),
    ]


# Attention ops with a CUDA kernel: these must match the CPU, never refuse.
_WITH_CUDA_KERNEL = {"dense_decode"}


@pytest.mark.parametrize("index", range(4))
def test_attention_on_gpu_matches_cpu_or_is_not_implemented(generator, index):
    name, inputs, call = _attention_calls(generator)[index]
    cpu_result = _to_cpu(call(*inputs))
    try:
        gpu_result = _to_cpu(call(*[t.cuda() for t in inputs]))
    except NotImplementedError as error:
        message = str(error)
        assert name not in _WITH_CUDA_KERNEL, f"{name} has a CUDA kernel: {message}"
        assert name in message and "cuda" in message.lower(), message
        return
    first = lambda r: r[0] if isinstance(r, list) else r  # noqa: E731
    assert relative_error(first(gpu_result), first(cpu_result)) < 1e-2


def test_cuda_graph_capture_and_replay_of_write_kv_cache(generator):
    kv_c = randn((4, 512), generator).cuda()
    k_pe = randn((4, 64), generator).cuda()
    slots = torch.tensor([1, 18, -1, 40], dtype=torch.int32).cuda()
    cache = poisoned((4, 16, 656), torch.uint8, device="cuda")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture, as torch recommends
        openmla.write_kv_cache(kv_c, k_pe, slots, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        openmla.write_kv_cache(kv_c, k_pe, slots, cache)

    # New tokens into the same buffers; only the replay writes them.
    kv_c.copy_(randn((4, 512), generator))
    k_pe.copy_(randn((4, 64), generator))
    slots.copy_(torch.tensor([2, -1, 33, 63], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()

    expected = poisoned((4, 16, 656), torch.uint8)
    openmla.write_kv_cache(kv_c.cpu(), k_pe.cpu(), slots.cpu(), expected)
    flat, flat_expected = cache.cpu().view(-1, 656), expected.view(-1, 656)
    for slot in (2, 33, 63):  # poison before the replay: only the replayed launch wrote them
        assert torch.equal(flat[slot], flat_expected[slot])
