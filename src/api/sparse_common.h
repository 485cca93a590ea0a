// Checks that the two sparse ops (prefill and decode) share: head dims, top-k lengths and the
// attention sink.
#pragma once

#include <string>

#include "openmla/numerics.h"
#include "validate.h"

namespace openmla {

// Sparse MLA keys are 576 (V3.2: 512 latent + 64 rope) or 512 (V4: 448 + 64) wide.
inline void check_sparse_head_dim(const ArgumentChecker& check, const TensorView& q, int dim) {
  int64_t head_dim = q.size(dim);
  if (head_dim != kHeadDim && head_dim != kLatentDim) {
    check.fail("q", "expected head dim (dimension " + std::to_string(dim) + ") 576 or 512, got " +
                        std::to_string(head_dim));
  }
}

// Optional int32 [count]; its values are checked by check_topk_length_values.
inline void check_topk_length(const ArgumentChecker& check, const char* argument,
                              const TensorView& topk_length, int64_t count) {
  if (!topk_length.present()) return;
  check.required(argument, topk_length);
  check.dtype(argument, topk_length, {DType::kInt32});
  check.rank(argument, topk_length, 1);
  if (topk_length.size(0) != count) {
    check.fail(argument, "expected " + std::to_string(count) + " entries, got " +
                             std::to_string(topk_length.size(0)));
  }
}

// Host-resident lengths must lie in 0..topk; device-resident ones are trusted (and clamped).
inline void check_topk_length_values(const ArgumentChecker& check, const char* argument,
                                     const TensorView& topk_length, int64_t topk) {
  if (!topk_length.present() || topk_length.is_cuda()) return;
  for (int64_t i = 0; i < topk_length.size(0); ++i) {
    int64_t length = topk_length.ptr<const int32_t>()[i * topk_length.stride(0)];
    if (length < 0 || length > topk) {
      check.fail(argument, "expected 0 <= " + std::string(argument) + "[" + std::to_string(i) +
                               "] <= topk = " + std::to_string(topk) + ", got " +
                               std::to_string(length));
    }
  }
}

inline void check_attn_sink(const ArgumentChecker& check, const TensorView& attn_sink,
                            int64_t heads) {
  if (!attn_sink.present()) return;
  check.required("attn_sink", attn_sink);
  check.dtype("attn_sink", attn_sink, {DType::kFloat32});
  check.rank("attn_sink", attn_sink, 1);
  if (attn_sink.size(0) != heads) {
    check.fail("attn_sink", "expected one logit per head (" + std::to_string(heads) + "), got " +
                                std::to_string(attn_sink.size(0)));
  }
}

}  // namespace openmla
