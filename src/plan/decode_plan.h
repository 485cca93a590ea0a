// Split-KV planning for the decode ops. The plan depends on shapes only (batch, query tokens,
// heads) and the device's SM count, never on seq_lens values, so the workspace a caller
// allocates once stays valid for every later call of the same shape and for CUDA-graph
// replays: the per-request split boundaries are derived on the device from seq_lens.
#pragma once

#include <cstddef>
#include <cstdint>

#include "openmla/tensor.h"

namespace openmla {

// Upper bound on how many KV splits one (request, row tile) is cut into. The split kernels
// write a partial output and LSE per split, merged by a combine step.
// 128 lets a single long request (D5: B 1, 32K keys) spread over all 132 SMs of an H100/H200.
constexpr int64_t kMaxDecodeSplits = 128;

// Query rows (Sq tokens x Hq heads of one request, folded into the tensor-core M dimension,
// TokenSpeed's fold_sq_factor idea) handled by one CTA of the dense decode kernel.
constexpr int64_t kDecodeRowsPerTile = 64;

struct DenseDecodePlan {
  int64_t row_tiles = 1;  // ceil(Sq * Hq / kDecodeRowsPerTile) CTAs per (request, split)
  int64_t splits = 1;     // KV splits per request; 1 = no combine step
};

// Splits so that the (request, row tile, split) CTAs fill whole waves of one CTA per SM, with
// a 2% cost per split (decode_plan.cpp). From shapes and the SM count only.
DenseDecodePlan plan_dense_decode(int64_t batch, int64_t query_tokens, int64_t heads,
                                  int sm_count);

// Multiprocessors of `device` (the current CUDA device for host tensors); 132 (an H100 / H200)
// where there is none, so that a CPU-only build answers the workspace query the same way for
// the same shapes. The workspace check and the launch must both ask for the tensors' device:
// the current device may differ (and have another SM count, hence more splits).
int planning_sm_count(Device device);

// Bytes of scratch for split-KV decode with `splits` splits: per (split, request, token, head)
// a partial output of `value_dim` floats and one LSE float; 0 when splits == 1 (no combine).
size_t decode_split_workspace_bytes(int64_t batch, int64_t query_tokens, int64_t heads,
                                    int64_t value_dim, int64_t splits);

// The workspace a decode op with query q [B, Sq, Hq, D] needs: its split plan on q's device,
// 512-wide partial outputs. 0 for a q of another rank (validation reports that).
size_t decode_workspace_bytes(const TensorView& q);

}  // namespace openmla
