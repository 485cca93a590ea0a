// Split-KV planning for the decode ops. The plan depends on shapes only (batch, query tokens,
// heads), never on seq_lens values, so the workspace a caller allocates once stays valid for
// every later call of the same shape and for CUDA-graph replays.
#pragma once

#include <cstddef>
#include <cstdint>

namespace openmla {

// Upper bound on how many KV splits one (request, query-token-group) is cut into. The split
// kernels write a partial output and LSE per split, merged by a combine step.
constexpr int64_t kMaxDecodeSplits = 64;

// Bytes of scratch for split-KV decode: per (request, token, head, split) a partial output of
// `value_dim` floats and one LSE float, plus per-request split counters.
size_t decode_split_workspace_bytes(int64_t batch, int64_t query_tokens, int64_t heads,
                                    int64_t value_dim);

}  // namespace openmla
