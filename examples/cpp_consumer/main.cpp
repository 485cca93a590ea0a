// A minimal C++ user of openmla: merge two partial attention results (the chunked-prefill
// step) with the CPU reference. The same call on CUDA device pointers runs the GPU kernel.
#include <cmath>
#include <cstdio>
#include <vector>

#include "openmla/openmla.h"

int main() {
  const int64_t tokens = 4, heads = 2, dim = 8;
  std::vector<float> out_a(tokens * heads * dim, 1.0f), out_b(tokens * heads * dim, 3.0f);
  std::vector<float> lse_a(tokens * heads, 0.0f), lse_b(tokens * heads, 0.0f);
  std::vector<float> out(tokens * heads * dim), lse(tokens * heads);
  using openmla::DType;
  using openmla::TensorView;

  openmla::MergeAttentionParams params;
  params.out_a = TensorView::contiguous(out_a.data(), DType::kFloat32, {tokens, heads, dim});
  params.out_b = TensorView::contiguous(out_b.data(), DType::kFloat32, {tokens, heads, dim});
  params.lse_a = TensorView::contiguous(lse_a.data(), DType::kFloat32, {tokens, heads});
  params.lse_b = TensorView::contiguous(lse_b.data(), DType::kFloat32, {tokens, heads});
  params.out = TensorView::contiguous(out.data(), DType::kFloat32, {tokens, heads, dim});
  params.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {tokens, heads});
  try {
    openmla::merge_attention(params);
  } catch (const openmla::Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
  // Equal LSEs: the average of 1 and 3, and LSE log(2).
  bool ok = std::fabs(out[0] - 2.0f) < 1e-6f && std::fabs(lse[0] - std::log(2.0f)) < 1e-6f;
  std::printf("openmla %s consumer: out[0] = %.3f, lse[0] = %.4f: %s\n", openmla::version(),
              out[0], lse[0], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
