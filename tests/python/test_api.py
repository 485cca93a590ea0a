# The Python surface itself: errors, FP8 pass-through, torch.library registration and
# torch.compile, on CPU tensors.
import math

import pytest
import torch

import openmla
from mla_math import FP8, poisoned, randn


def test_version_and_cuda_query():
    assert openmla.__version__ == openmla.version()
    assert openmla.version().count(".") == 2
    assert isinstance(openmla.cuda_available(), bool)


def _decode_args(generator, last_dim=576):
    q = randn((2, 1, 4, 576), generator)
    cache = randn((3, 16, last_dim), generator)
    block_table = torch.tensor([[0, 1], [2, 2147480000]], dtype=torch.int32)
    seq_lens = torch.tensor([20, 5], dtype=torch.int32)
    return q, cache, block_table, seq_lens


def test_bad_argument_raises_value_error_naming_it_and_writes_nothing(generator):
    q, cache, block_table, seq_lens = _decode_args(generator, last_dim=512)
    out = poisoned((2, 1, 4, 512), torch.bfloat16)
    with pytest.raises(ValueError, match=r"dense_decode.*'kv_cache'.*576"):
        openmla.mla_decode(q, cache, block_table, seq_lens, 0.1, out=out)
    assert torch.isnan(out.float()).all()


def test_seq_lens_beyond_the_block_table_is_rejected(generator):
    q, cache, block_table, _ = _decode_args(generator)
    with pytest.raises(ValueError, match="'seq_lens'"):
        openmla.mla_decode(q, cache, block_table, torch.tensor([20, 33], dtype=torch.int32), 0.1)


@pytest.mark.parametrize("call,argument", [
    (lambda g: openmla.write_kv_cache(randn((2, 512), g), randn((2, 64), g),
                                      torch.tensor([0.0, 1.0]),
                                      poisoned((1, 16, 576), torch.bfloat16)),
     "slot_mapping"),
    (lambda g: openmla.merge_attention(torch.ones(2, 2, 8, dtype=torch.int16), torch.zeros(2, 2),
                                       torch.ones(2, 2, 8), torch.zeros(2, 2)),
     "out_a"),
    (lambda g: openmla.sparse_mla_prefill(randn((2, 2, 576), g), randn((4, 1, 576), g),
                                          torch.zeros(2, 3, dtype=torch.int64), 0.1),
     "indices"),
    (lambda g: openmla.convert_topk_indices(torch.zeros(2, 3, dtype=torch.int32),
                                            torch.zeros(2, dtype=torch.int32),
                                            torch.zeros(1, 2, dtype=torch.int32), 12),
     "page_size"),
    (lambda g: openmla.mla_prefill(randn((4, 2, 192), g), randn((4, 1, 192), g),
                                   randn((4, 1, 128), g), torch.tensor([0, 4], dtype=torch.int32),
                                   torch.tensor([0, 4], dtype=torch.int32), 4, 4, float("nan")),
     "softmax_scale"),
])
def test_bad_arguments_name_the_argument(generator, call, argument):
    with pytest.raises(ValueError, match=f"'{argument}'"):
        call(generator)


def test_fp8_tensors_pass_through_unconverted(generator):
    # A float8_e4m3fn cache goes to C++ as is: fp8 decode equals decode over its bf16 image.
    q, cache, block_table, seq_lens = _decode_args(generator)
    cache8 = cache.float().to(FP8)
    out8 = openmla.mla_decode(q, cache8, block_table, seq_lens, 0.1, kv_scale=1.0)
    out16 = openmla.mla_decode(q, cache8.to(torch.bfloat16), block_table, seq_lens, 0.1)
    torch.testing.assert_close(out8, out16, rtol=0, atol=0)


def test_ops_are_registered_with_torch_library():
    for name in ("mla_prefill", "mla_decode", "sparse_mla_prefill", "sparse_mla_decode",
                 "write_kv_cache", "gather_ds_mla_cache", "convert_topk_indices",
                 "pack_kv_quantize_fp8", "merge_attention"):
        assert hasattr(torch.ops.openmla, name), name
    # In-place utilities declare what they write, so functionalisation keeps the writes.
    schema = torch.ops.openmla.write_kv_cache.default._schema
    written = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ["kv_cache"]


def test_opcheck_merge_attention_and_write_kv_cache(generator):
    lse_a, lse_b = torch.randn(3, 2, generator=generator), torch.randn(3, 2, generator=generator)
    merge_args = (randn((3, 2, 8), generator, torch.float32), lse_a,
                  randn((3, 2, 8), generator, torch.float32), lse_b,
                  False, torch.empty(3, 2, 8), torch.empty(3, 2))
    torch.library.opcheck(torch.ops.openmla.merge_attention.default, merge_args)
    write_args = (randn((2, 512), generator), randn((2, 64), generator),
                  torch.tensor([3, -1], dtype=torch.int32),
                  torch.zeros(1, 16, 576, dtype=torch.bfloat16), 1.0)
    torch.library.opcheck(torch.ops.openmla.write_kv_cache.default, write_args)


def test_torch_compile_fullgraph_on_cpu(generator):
    def decode_step(q, cache, block_table, seq_lens, kv_c, k_pe, slots):
        openmla.write_kv_cache(kv_c, k_pe, slots, cache)
        out, lse = openmla.mla_decode(q * 2, cache, block_table, seq_lens, 0.05, causal=True,
                                      return_lse=True)
        return out.float() + 1, lse

    q, cache, block_table, seq_lens = _decode_args(generator)
    kv_c, k_pe = randn((2, 512), generator), randn((2, 64), generator)
    slots = torch.tensor([19, 16 * 2 + 4], dtype=torch.int32)  # last token of each request
    cache_eager, cache_compiled = cache.clone(), cache.clone()

    expected = decode_step(q, cache_eager, block_table, seq_lens, kv_c, k_pe, slots)
    compiled = torch.compile(decode_step, fullgraph=True)
    actual = compiled(q, cache_compiled, block_table, seq_lens, kv_c, k_pe, slots)

    assert torch.equal(cache_compiled, cache_eager)  # the in-place write survived compilation
    assert not torch.equal(cache_eager, cache)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert torch.isfinite(actual[1]).all() and not math.isnan(actual[0].sum().item())


def test_launch_hints_reach_the_op_and_leave_cpu_results_unchanged(generator):
    # PDL and the max_seq_len bound only change how CUDA kernels are launched (the bound: how
    # many splits); the CPU reference ignores both, even a bound below the real lengths (20).
    arguments = torch.ops.openmla.mla_decode.default._schema.arguments
    assert [(a.name, a.default_value) for a in arguments][-2:] == [("enable_pdl", False),
                                                                   ("max_seq_len", 0)]
    q, cache, block_table, seq_lens = _decode_args(generator)
    results = []
    for enable_pdl, max_seq_len in ((False, 0), (True, 0), (False, 20), (True, 1)):
        out = poisoned((2, 1, 4, 512), torch.bfloat16)
        results.append(openmla.mla_decode(q, cache, block_table, seq_lens, 0.1, causal=True,
                                          return_lse=True, out=out, enable_pdl=enable_pdl,
                                          max_seq_len=max_seq_len))
    out_plain, lse_plain = results[0]
    for out, lse in results[1:]:
        assert not torch.isnan(out.float()).any()
        assert torch.equal(out, out_plain) and torch.equal(lse, lse_plain)


def test_negative_max_seq_len_is_rejected_before_any_write(generator):
    q, cache, block_table, seq_lens = _decode_args(generator)
    out = poisoned((2, 1, 4, 512), torch.bfloat16)
    with pytest.raises(ValueError, match=r"dense_decode.*'max_seq_len'.*>= 0"):
        openmla.mla_decode(q, cache, block_table, seq_lens, 0.1, out=out, max_seq_len=-1)
    assert torch.isnan(out.float()).all()


def test_workspace_size_helpers_and_a_given_workspace(generator):
    q, cache, block_table, seq_lens = _decode_args(generator)
    size = openmla.get_mla_decode_workspace_size(q, cache, block_table, seq_lens)
    assert isinstance(size, int) and size > 0  # split-KV partials for [2, 1, 4] queries
    expected = openmla.mla_decode(q, cache, block_table, seq_lens, 0.1)
    given = openmla.mla_decode(q, cache, block_table, seq_lens, 0.1,
                               workspace=torch.empty(size, dtype=torch.uint8))
    assert torch.equal(given, expected)
    with pytest.raises(ValueError, match="'workspace'"):
        openmla.mla_decode(q, cache, block_table, seq_lens, 0.1,
                           workspace=torch.empty(size - 1, dtype=torch.uint8))
    sparse_q = randn((2, 1, 4, 576), generator)
    indices = torch.zeros(2, 1, 8, dtype=torch.int32)
    assert openmla.get_sparse_mla_decode_workspace_size(sparse_q, cache, indices) >= 0
    assert openmla.get_sparse_mla_prefill_workspace_size(q[:, 0], cache[0, :, None],
                                                         indices[:, 0]) >= 0
    cu = torch.tensor([0, 2], dtype=torch.int32)
    prefill_q = q[:, 0, :, :192]
    assert openmla.get_mla_prefill_workspace_size(prefill_q, prefill_q, q[:, 0, :, :128], cu, cu,
                                                  2, 2) >= 0
