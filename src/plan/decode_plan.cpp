#include "plan/decode_plan.h"

#include "openmla/numerics.h"

#include <algorithm>

#if OPENMLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace openmla {
namespace {

// Key tiles (kDecodeMinKeysPerSplit keys each, the least a split takes) that `keys` keys fill;
// without the (keys + 63) / 64 form's overflow for a bound near INT64_MAX.
int64_t key_tiles_in(int64_t keys) {
  return keys / kDecodeMinKeysPerSplit + (keys % kDecodeMinKeysPerSplit != 0);
}

}  // namespace

DenseDecodePlan plan_dense_decode(int64_t batch, int64_t query_tokens, int64_t heads,
                                  int sm_count) {
  DenseDecodePlan plan;
  const int64_t rows = query_tokens * heads;
  plan.row_tiles = (rows + kDecodeRowsPerTile - 1) / kDecodeRowsPerTile;
  const int64_t ctas = std::max<int64_t>(1, batch * plan.row_tiles);
  const int64_t sms = std::max(sm_count, 1);
  // The kernels run one CTA per SM, so s splits take ceil(ctas * s / sms) waves of 1/s of the
  // work each. Each split also costs a partial output, a share of the combine step and a CTA's
  // fixed cost: 2% per split, so that s grows only for a real gain (e.g. 67 CTAs on 132 SMs:
  // 7 splits, 0.89 of the GPU busy instead of 0.51; 128 CTAs: 1 split).
  double best_cost = 0;
  for (int64_t splits = 1; splits <= kMaxDecodeSplits; ++splits) {
    const double waves = double((ctas * splits + sms - 1) / sms);
    const double cost = waves / double(splits) * (1.0 + 0.02 * double(splits - 1));
    if (splits == 1 || cost < best_cost) {
      best_cost = cost;
      plan.splits = splits;
    }
  }
  if (plan.splits == 1 && batch >= 2 && batch <= kMaxBalancedBatch &&
      batch * query_tokens * heads <= kMaxBalancedRows) {
    plan.splits = kBalancedSplits;
    plan.balanced = true;
  }
  return plan;
}

DenseDecodePlan bound_decode_splits(DenseDecodePlan plan, int64_t max_seq_len, int64_t splits_per_tile) {
  if (max_seq_len <= 0 || plan.balanced) return plan;
  const int64_t tiles = key_tiles_in(max_seq_len);
  if (tiles >= plan.splits) return plan;  // (and the product below cannot overflow)
  plan.splits = std::max<int64_t>(1, std::min(plan.splits, tiles * std::max<int64_t>(1, splits_per_tile)));
  return plan;
}

DenseDecodePlan latency_row_tiles(const DenseDecodePlan& plan, int64_t batch, int64_t rows, int64_t length_bound,
                                  int sm_count, int64_t max_tiles_per_cta) {
  if (plan.balanced || rows <= kDecodeLatencyRowsPerTile || rows > kDecodeRowsPerTile || length_bound <= 0) {
    return plan;
  }
  DenseDecodePlan cut;
  cut.rows_per_tile = kDecodeLatencyRowsPerTile;
  cut.row_tiles = (rows + kDecodeLatencyRowsPerTile - 1) / kDecodeLatencyRowsPerTile;
  // One wave: the most splits that fit (never more than the plan's, which the workspace holds).
  cut.splits = std::min(plan.splits, std::max<int64_t>(1, sm_count) / std::max<int64_t>(1, batch * cut.row_tiles));
  if (cut.splits < 2) return plan;
  cut = bound_decode_splits(cut, length_bound, 1);
  const int64_t tiles = key_tiles_in(length_bound);
  return (tiles + cut.splits - 1) / cut.splits <= max_tiles_per_cta ? cut : plan;
}

int64_t decode_length_bound(int64_t max_seq_len, int64_t table_columns, int64_t page_size) {
  const int64_t capacity = table_columns * page_size;  // (0 for an empty table: no bound)
  return max_seq_len > 0 && (capacity <= 0 || max_seq_len < capacity) ? max_seq_len : std::max<int64_t>(0, capacity);
}

int planning_sm_count(Device device) {
#if OPENMLA_WITH_CUDA
  int index = device.index, count = 0;
  if ((device.type == DeviceType::kCUDA || cudaGetDevice(&index) == cudaSuccess) &&
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, index) == cudaSuccess &&
      count > 0) {
    return count;
  }
  cudaGetLastError();  // no device: clear the error, fall back to the default below
#else
  (void)device;
#endif
  return 132;
}

size_t decode_split_workspace_bytes(int64_t batch, int64_t query_tokens, int64_t heads,
                                    int64_t value_dim, int64_t splits) {
  if (splits <= 1) return 0;
  size_t rows = size_t(batch) * size_t(query_tokens) * size_t(heads) * size_t(splits);
  size_t partial_bytes = rows * size_t(value_dim + 1) * sizeof(float) + size_t(batch) * sizeof(int32_t);
  // Round to 256 bytes so that kernels can align their views.
  return (partial_bytes + 255) / 256 * 256;
}

size_t decode_workspace_bytes(const TensorView& q) {
  if (q.rank != 4) return 0;
  const DenseDecodePlan plan = plan_dense_decode(q.size(0), q.size(1), q.size(2), planning_sm_count(q.device));
  return decode_split_workspace_bytes(q.size(0), q.size(1), q.size(2), kLatentDim, plan.splits);
}

}  // namespace openmla
