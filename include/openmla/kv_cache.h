// openmla: the KV-cache utilities a serving engine needs around the attention kernels.
// All are memory-bound; every one runs on the CPU (reference) and on CUDA devices.
#pragma once

#include "openmla/common.h"

namespace openmla {

// Write new tokens into a paged latent cache. Token t goes to slot slot_mapping[t]
// (page = slot / page_size, offset = slot % page_size); slot -1 (any negative) is skipped.
// The cache format follows from its dtype and last dimension:
//   bf16 [pages, page, 576]          : copy (kv_c | k_pe)
//   float8_e4m3 [pages, page, 576]   : fp8(x * (1 / scale)) for all 576 values
//   uint8 or float8 [pages, page, 656]: ds_mla; per group of 128 latent values
//                                      s = max(amax / 448, FLT_MIN), fp8(x * (1 / s)); rope
//                                      as bf16
// Quantisation multiplies by the reciprocal of the scale, itself rounded to float once (not a
// division per value); each product is rounded to float, then to fp8 (numerics.h).
struct WriteKvCacheParams {
  TensorView kv_c;          // [T, 512] bf16 (bf16 cache) or bf16 | fp16 (fp8 and ds_mla caches)
  TensorView k_pe;          // [T, 64] same dtype as kv_c
  TensorView slot_mapping;  // [T] int32 | int64
  TensorView kv_cache;      // see above (a 4-D [pages, page, 1, last] view is accepted too)
  float scale = 1;          // fp8 per-tensor format: real = stored * scale
  Stream stream = nullptr;
};
void write_kv_cache(const WriteKvCacheParams& params);

// Gather the tokens of each request from an FP8 ds_mla cache and up-convert them to BF16:
// row cu_seq_lens[b] + i of out is token i of request b (i < cu_seq_lens[b+1]-cu_seq_lens[b]),
// found at kv_cache[block_table[b][i / page_size], i % page_size]. Rows of out past
// cu_seq_lens[B] are not written.
struct GatherDsMlaCacheParams {
  TensorView kv_cache;     // [pages, page_size, 656] uint8 | float8_e4m3
  TensorView block_table;  // [B, max_pages] int32
  TensorView cu_seq_lens;  // [B+1] int32, starts at 0, non-decreasing, ends at <= rows of out
  TensorView out;          // [T, 576] bf16
  Stream stream = nullptr;
};
void gather_ds_mla_cache(const GatherDsMlaCacheParams& params);

// Convert request-local top-k token positions into global cache slot ids through the block
// table: global = block_table[r][p / page_size] * page_size + p % page_size, r =
// request_ids[t]. Positions < 0 or >= max_pages * page_size, and entries at or past
// topk_length[t] when given, become -1.
struct ConvertTopkIndicesParams {
  TensorView local_indices;   // [T, topk] int32
  TensorView request_ids;     // [T] int32, each in 0..B-1
  TensorView block_table;     // [B, max_pages] int32
  int64_t page_size = 0;      // a power of two
  TensorView topk_length;     // optional [T] int32
  TensorView global_indices;  // [T, topk] int32 out
  Stream stream = nullptr;
};
void convert_topk_indices(const ConvertTopkIndicesParams& params);

// Fused K/V pack + FP8 quantise for chunked prefill:
//   k_out[t, h] = fp8([k_nope[t, h] | k_pe[t, h or 0]] * (1 / k_scale)),
//   v_out[t, h] = fp8(v[t, h] * (1 / v_scale)), the reciprocals rounded to float once
// k_pe with one head is broadcast over all heads. Real values are stored * scale.
struct PackKvQuantizeFp8Params {
  TensorView k_nope;  // [T, H, 128] bf16 | fp16
  TensorView k_pe;    // [T, 1, 64] or [T, H, 64] same dtype
  TensorView v;       // [T, H, 128] same dtype
  float k_scale = 1;
  float v_scale = 1;
  TensorView k_out;   // [T, H, 192] float8_e4m3
  TensorView v_out;   // [T, H, 128] float8_e4m3
  Stream stream = nullptr;
};
void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params);

// Merge two partial attention results over disjoint key sets by their LSEs:
//   m = max(lse_a, lse_b); w_a = exp(lse_a - m); w_b = exp(lse_b - m)
//   out = (w_a out_a + w_b out_b) / (w_a + w_b); lse = m + log(w_a + w_b)
// A side with LSE -inf contributes nothing (its values are ignored, NaN included: it must
// still be a readable buffer); both -inf gives 0, -inf; a NaN LSE on either side gives NaN.
// lse_base says the base of all three LSEs.
struct MergeAttentionParams {
  TensorView out_a;  // [T, H, D] bf16 | fp16 | fp32
  TensorView lse_a;  // [T, H] fp32 (any strides: an [H, T] buffer transposed works)
  TensorView out_b;  // [T, H, D] same dtype as out_a
  TensorView lse_b;  // [T, H] fp32
  TensorView out;    // [T, H, D] same dtype as out_a
  TensorView lse;    // optional [T, H] fp32
  LseBase lse_base = LseBase::kNatural;
  Stream stream = nullptr;
};
void merge_attention(const MergeAttentionParams& params);

}  // namespace openmla
