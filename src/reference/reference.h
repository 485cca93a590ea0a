// The CPU reference implementation of every op: the "embedded default" that runs anywhere
// and the oracle of every GPU test. Each function takes the op's params after validation
// (src/api), with host-resident tensors, and computes in float64.
#pragma once

#include "openmla/dense_decode.h"
#include "openmla/dense_prefill.h"
#include "openmla/kv_cache.h"
#include "openmla/sparse_decode.h"
#include "openmla/sparse_prefill.h"

namespace openmla::reference {

void dense_prefill(const DensePrefillParams& params);
void dense_decode(const DenseDecodeParams& params);
void sparse_prefill(const SparsePrefillParams& params);
void sparse_decode(const SparseDecodeParams& params);

void write_kv_cache(const WriteKvCacheParams& params);
void gather_ds_mla_cache(const GatherDsMlaCacheParams& params);
void convert_topk_indices(const ConvertTopkIndicesParams& params);
void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params);
void merge_attention(const MergeAttentionParams& params);

}  // namespace openmla::reference
