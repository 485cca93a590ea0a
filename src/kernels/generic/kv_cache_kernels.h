// Launchers of the KV-cache utility kernels (write_kv_cache.cu, gather_ds_mla.cu,
// convert_topk_indices.cu, pack_kv_quantize_fp8.cu, merge_attention.cu). src/api/kv_cache.cpp
// calls them after validation with CUDA-resident arguments (caches already seen as 3-D); each
// launches on params.stream, synchronises nothing and reports failures through cuda_check.h.
// Host-only header: no CUDA toolkit needed to include it.
#pragma once

#include "openmla/kv_cache.h"

namespace openmla::kernels {

void write_kv_cache(const WriteKvCacheParams& params);
void gather_ds_mla_cache(const GatherDsMlaCacheParams& params);
void convert_topk_indices(const ConvertTopkIndicesParams& params);
void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params);
void merge_attention(const MergeAttentionParams& params);

}  // namespace openmla::kernels
