// openmla-bench without a GPU: the CPU reference on a small case, so that the CLI does
// something useful (and shows the library links and runs) on any machine. The time is the
// reference's (float64 accumulation, not tuned); the checksum lets two builds be compared.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench.h"
#include "openmla/openmla.h"

namespace openmla::bench {

namespace {

// A contiguous host tensor that owns its bytes.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;

  HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
    view = TensorView::contiguous(nullptr, dtype, shape);
    bytes.resize(size_t(view.numel()) * dtype_size(dtype) + 1);  // +1: never a null pointer
    view.data = bytes.data();
  }

  void fill_bf16(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto* values = reinterpret_cast<uint16_t*>(bytes.data());
    for (int64_t i = 0; i < view.numel(); ++i) values[i] = float_to_bf16(uniform(rng));
  }
  void set_int32(const std::vector<int32_t>& values) {
    auto* destination = reinterpret_cast<int32_t*>(bytes.data());
    for (size_t i = 0; i < values.size(); ++i) destination[i] = values[i];
  }
  double bf16_sum() const {
    const auto* values = reinterpret_cast<const uint16_t*>(bytes.data());
    double sum = 0;
    for (int64_t i = 0; i < view.numel(); ++i) sum += bf16_to_float(values[i]);
    return sum;
  }
};

std::vector<int32_t> shuffled(int32_t count, std::mt19937_64& rng) {
  std::vector<int32_t> order(size_t(count), 0);
  for (int32_t i = 0; i < count; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

template <typename Fn>
double time_us(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(stop - start).count();
}

Result dense_decode_case(std::mt19937_64& rng) {
  constexpr int64_t kBatch = 2, kQueryTokens = 1, kHeads = 16, kSeqLen = 256, kPage = 64;
  constexpr int64_t kPagesPerRequest = kSeqLen / kPage;
  HostTensor q(DType::kBFloat16, {kBatch, kQueryTokens, kHeads, kHeadDim});
  HostTensor cache(DType::kBFloat16, {kBatch * kPagesPerRequest, kPage, kHeadDim});
  HostTensor block_table(DType::kInt32, {kBatch, kPagesPerRequest});
  HostTensor seq_lens(DType::kInt32, {kBatch});
  HostTensor out(DType::kBFloat16, {kBatch, kQueryTokens, kHeads, kLatentDim});
  HostTensor lse(DType::kFloat32, {kBatch, kQueryTokens, kHeads});
  q.fill_bf16(rng);
  cache.fill_bf16(rng);
  block_table.set_int32(shuffled(int32_t(kBatch * kPagesPerRequest), rng));
  seq_lens.set_int32(std::vector<int32_t>(size_t(kBatch), int32_t(kSeqLen)));

  DenseDecodeParams params;
  params.q = q.view;
  params.kv_cache = cache.view;
  params.block_table = block_table.view;
  params.seq_lens = seq_lens.view;
  params.softmax_scale = float(1.0 / std::sqrt(double(kHeadDim)));
  params.causal = true;
  params.out = out.view;
  params.lse = lse.view;
  const double elapsed_us = time_us([&] { dense_decode(params); });

  Case described;
  described.op = "dense_decode";
  described.name = "B=2 Sq=1 Hq=16 seq_len=256 page=64 (CPU reference)";
  described.dtype = "bf16";
  described.bytes = double(q.view.numel() * 2 + kBatch * kSeqLen * kHeadDim * 2 +
                           kBatch * kPagesPerRequest * 4 + kBatch * 4 + out.view.numel() * 2 +
                           lse.view.numel() * 4);
  described.flops = 2.0 * kBatch * kQueryTokens * kHeads * kSeqLen * (kHeadDim + kLatentDim);
  std::printf("%s %s %s: %.3f ms, checksum %.6e\n", described.op.c_str(), described.name.c_str(),
              described.dtype.c_str(), elapsed_us * 1e-3, out.bf16_sum());
  return make_result(described, Measurement{elapsed_us}, Ceilings{});
}

Result write_kv_cache_case(std::mt19937_64& rng) {
  constexpr int64_t kTokens = 256, kPage = 64, kPages = kTokens / kPage;
  HostTensor kv_c(DType::kBFloat16, {kTokens, kLatentDim});
  HostTensor k_pe(DType::kBFloat16, {kTokens, kRopeDim});
  HostTensor slots(DType::kInt32, {kTokens});
  HostTensor cache(DType::kBFloat16, {kPages, kPage, kHeadDim});
  kv_c.fill_bf16(rng);
  k_pe.fill_bf16(rng);
  std::vector<int32_t> page_order = shuffled(int32_t(kPages), rng);
  std::vector<int32_t> slot_values;
  for (int64_t t = 0; t < kTokens; ++t) {
    slot_values.push_back(int32_t(page_order[size_t(t / kPage)] * kPage + t % kPage));
  }
  slots.set_int32(slot_values);

  WriteKvCacheParams params;
  params.kv_c = kv_c.view;
  params.k_pe = k_pe.view;
  params.slot_mapping = slots.view;
  params.kv_cache = cache.view;
  const double elapsed_us = time_us([&] { write_kv_cache(params); });

  Case described;
  described.op = "write_kv_cache";
  described.name = "T=256 page=64 (CPU reference)";
  described.dtype = "bf16";
  described.bytes = double(kTokens * (kHeadDim * 2 + 4 + kHeadDim * 2));
  std::printf("%s %s %s: %.3f ms, checksum %.6e\n", described.op.c_str(), described.name.c_str(),
              described.dtype.c_str(), elapsed_us * 1e-3, cache.bf16_sum());
  return make_result(described, Measurement{elapsed_us}, Ceilings{});
}

}  // namespace

std::vector<Result> run_cpu_reference() {
  std::mt19937_64 rng(20261121);  // fixed: the checksum is comparable between builds
  std::vector<Result> results;
  results.push_back(dense_decode_case(rng));
  results.push_back(write_kv_cache_case(rng));
  return results;
}

}  // namespace openmla::bench
