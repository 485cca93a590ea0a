#include "plan/decode_plan.h"

namespace openmla {

size_t decode_split_workspace_bytes(int64_t batch, int64_t query_tokens, int64_t heads,
                                    int64_t value_dim) {
  size_t rows = size_t(batch) * size_t(query_tokens) * size_t(heads) * size_t(kMaxDecodeSplits);
  size_t partial_bytes = rows * size_t(value_dim + 1) * sizeof(float);
  size_t counter_bytes = size_t(batch + 1) * sizeof(int32_t);
  // Round each region to 256 bytes so that kernels can align their views.
  auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  return round_up(partial_bytes) + round_up(counter_bytes);
}

}  // namespace openmla
