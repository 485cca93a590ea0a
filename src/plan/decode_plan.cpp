#include "plan/decode_plan.h"

#include "openmla/numerics.h"

#include <algorithm>

#if OPENMLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace openmla {

DenseDecodePlan plan_dense_decode(int64_t batch, int64_t query_tokens, int64_t heads,
                                  int sm_count) {
  DenseDecodePlan plan;
  const int64_t rows = query_tokens * heads;
  plan.row_tiles = (rows + kDecodeRowsPerTile - 1) / kDecodeRowsPerTile;
  const int64_t ctas_without_split = std::max<int64_t>(1, batch * plan.row_tiles);
  const int64_t wanted = (2 * int64_t(std::max(sm_count, 1)) + ctas_without_split - 1) /
                         ctas_without_split;
  plan.splits = std::clamp<int64_t>(wanted, 1, kMaxDecodeSplits);
  return plan;
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
  size_t partial_bytes = rows * size_t(value_dim + 1) * sizeof(float);
  // Round to 256 bytes so that kernels can align their views.
  return (partial_bytes + 255) / 256 * 256;
}

size_t decode_workspace_bytes(const TensorView& q) {
  if (q.rank != 4) return 0;
  const DenseDecodePlan plan = plan_dense_decode(q.size(0), q.size(1), q.size(2), planning_sm_count(q.device));
  return decode_split_workspace_bytes(q.size(0), q.size(1), q.size(2), kLatentDim, plan.splits);
}

}  // namespace openmla
