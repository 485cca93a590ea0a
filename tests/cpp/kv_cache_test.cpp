// KV-cache utilities: the CPU reference against brute force written here (byte-exact where the
// op is rounding only, tolerance for merge_attention), bad input per argument class, and each
// CUDA kernel against the CPU reference, byte for byte.
#include <cfloat>
#include <numeric>

#include "test_support.h"

namespace openmla {
namespace {

using namespace openmla::testing;

constexpr int32_t kGarbage = 2147480000;  // padded block-table entries

float half_value(const TensorView& view, int64_t offset) {
  uint16_t bits = view.ptr<const uint16_t>()[offset];
  return view.dtype == DType::kFloat16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

bool all_bytes(const HostTensor& tensor, uint8_t value) {
  for (uint8_t byte : tensor.bytes) {
    if (byte != value) return false;
  }
  return true;
}

void expect_same_bytes(const HostTensor& actual, const HostTensor& expected, const char* what) {
  ASSERT_EQ(actual.bytes.size(), expected.bytes.size());
  for (size_t i = 0; i < actual.bytes.size(); ++i) {
    ASSERT_EQ(int(actual.bytes[i]), int(expected.bytes[i])) << what << ": byte " << i;
  }
}

TensorView on_device(TensorView view, DeviceType type = DeviceType::kCUDA) {
  view.device = Device{type, 0};
  return view;
}

// ---- write_kv_cache ------------------------------------------------------------------------

struct WriteSetup {
  HostTensor rows;   // kv_c | k_pe | padding per token, row stride `row_stride`
  HostTensor slots;
  HostTensor cache;  // poisoned
  WriteKvCacheParams params;
};

// `slot_count` slots; tokens go to a random permutation of them, every fourth token skipped.
WriteSetup make_write(std::mt19937_64& rng, DType input, DType cache_dtype, int64_t last_dim,
                      DType slot_dtype, int64_t tokens, int64_t pages, int64_t page_size,
                      int64_t row_stride, bool four_d) {
  WriteSetup setup;
  setup.rows = HostTensor(input, {tokens, row_stride});
  fill_uniform(setup.rows, rng, -2.0, 2.0);
  if (tokens > 3) {  // an all-zero group and an outlier group exercise the ds_mla scale bounds
    for (int i = 0; i < kDsMlaGroupSize; ++i) setup.rows.set(1 * row_stride + 128 + i, 0.0);
    setup.rows.set(2 * row_stride + 300, 900.0);
  }
  std::vector<int64_t> order(size_t(pages * page_size));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  setup.slots = HostTensor(slot_dtype, {tokens});
  for (int64_t t = 0; t < tokens; ++t) setup.slots.set(t, t % 4 == 3 ? -1.0 : double(order[size_t(t)]));
  setup.cache = four_d ? HostTensor(cache_dtype, {pages, page_size, 1, last_dim})
                       : HostTensor(cache_dtype, {pages, page_size, last_dim});
  poison(setup.cache);
  setup.params.kv_c = strided_view(setup.rows, {tokens, kLatentDim}, {row_stride, 1});
  setup.params.k_pe = strided_view(setup.rows, {tokens, kRopeDim}, {row_stride, 1}, kLatentDim);
  setup.params.slot_mapping = setup.slots.view();
  setup.params.kv_cache = setup.cache.view();
  setup.params.scale = 0.004f;  // |x| / scale reaches 500: some values saturate at 448
  return setup;
}

// The cache the contract describes, built from the inputs by brute force.
HostTensor brute_force_write(const WriteSetup& setup) {
  HostTensor expected = setup.cache;
  poison(expected);
  const WriteKvCacheParams& p = setup.params;
  const int64_t last_dim = p.kv_cache.size(-1), page_size = p.kv_cache.size(1);
  const bool bf16_cache = p.kv_cache.dtype == DType::kBFloat16;
  for (int64_t t = 0; t < p.kv_c.size(0); ++t) {
    int64_t slot = int64_t(setup.slots.get(t));
    if (slot < 0) continue;
    uint8_t* row = expected.bytes.data() + ((slot / page_size) * page_size + slot % page_size) *
                                               last_dim * int64_t(dtype_size(p.kv_cache.dtype));
    auto input = [&](int i) {
      return i < kLatentDim ? half_value(p.kv_c, t * p.kv_c.stride(0) + i)
                            : half_value(p.k_pe, t * p.k_pe.stride(0) + i - kLatentDim);
    };
    if (bf16_cache) {
      for (int i = 0; i < kHeadDim; ++i) {
        uint16_t bits = brute_force_bf16(input(i));  // exact: the input is bf16
        std::memcpy(row + 2 * i, &bits, 2);
      }
    } else if (last_dim == kHeadDim) {
      for (int i = 0; i < kHeadDim; ++i) row[i] = brute_force_fp8(input(i) * (1.0f / p.scale));
    } else {
      for (int group = 0; group < kDsMlaGroups; ++group) {
        float amax = 0;
        for (int i = 0; i < kDsMlaGroupSize; ++i) {
          amax = std::max(amax, std::fabs(input(group * kDsMlaGroupSize + i)));
        }
        float scale = std::max(amax / 448.0f, FLT_MIN);
        std::memcpy(row + 512 + 4 * group, &scale, 4);
        for (int i = group * kDsMlaGroupSize; i < (group + 1) * kDsMlaGroupSize; ++i) {
          row[i] = brute_force_fp8(input(i) * (1.0f / scale));
        }
      }
      for (int i = 0; i < kRopeDim; ++i) {
        uint16_t bits = brute_force_bf16(input(kLatentDim + i));
        std::memcpy(row + 528 + 2 * i, &bits, 2);
      }
    }
  }
  return expected;
}

struct WriteFormat {
  DType input, cache;
  int64_t last_dim;
  DType slots;
  bool four_d;
};
const WriteFormat kWriteFormats[] = {
    {DType::kBFloat16, DType::kBFloat16, 576, DType::kInt32, false},
    {DType::kBFloat16, DType::kBFloat16, 576, DType::kInt64, true},
    {DType::kBFloat16, DType::kFloat8E4M3, 576, DType::kInt32, false},
    {DType::kFloat16, DType::kFloat8E4M3, 576, DType::kInt64, true},
    {DType::kBFloat16, DType::kUInt8, 656, DType::kInt32, false},
    {DType::kFloat16, DType::kFloat8E4M3, 656, DType::kInt64, true},
};

TEST(KvCache, WriteMatchesBruteForce) {
  auto rng = make_rng();
  for (const WriteFormat& format : kWriteFormats) {
    SCOPED_TRACE(std::string(dtype_name(format.cache)) + " " + std::to_string(format.last_dim) +
                 " from " + dtype_name(format.input));
    WriteSetup setup = make_write(rng, format.input, format.cache, format.last_dim, format.slots,
                                  37, 6, 8, 600, format.four_d);
    write_kv_cache(setup.params);
    expect_same_bytes(setup.cache, brute_force_write(setup), "cache");
    // Skipped slots stay poisoned: 10 of 48 slots are never written.
    int64_t poisoned = 0;
    int64_t row_bytes = format.last_dim * int64_t(dtype_size(format.cache));
    for (int64_t slot = 0; slot < 48; ++slot) {
      poisoned += std::all_of(setup.cache.bytes.begin() + slot * row_bytes,
                              setup.cache.bytes.begin() + (slot + 1) * row_bytes,
                              [](uint8_t b) { return b == 0xff; });
    }
    EXPECT_EQ(poisoned, 48 - 28);
  }
}

TEST(KvCache, WriteRejectsBadInput) {
  auto rng = make_rng();
  WriteSetup setup = make_write(rng, DType::kBFloat16, DType::kFloat8E4M3, 576, DType::kInt32, 9,
                                2, 8, 576, false);
  HostTensor ds_cache(DType::kUInt8, {2, 8, 576});
  HostTensor odd_pages(DType::kBFloat16, {2, 12, 576});
  auto run = [&](auto edit) {
    WriteKvCacheParams params = setup.params;
    edit(params);
    write_kv_cache(params);
  };
  expect_invalid_argument([&] { run([](auto& p) { p.kv_c.dtype = DType::kFloat32; }); }, "kv_c");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_c.rank = 3; }); }, "kv_c");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_c.strides[1] = 2; }); }, "kv_c");
  expect_invalid_argument([&] { run([](auto& p) { p.k_pe.shape[0] = 8; }); }, "k_pe");
  expect_invalid_argument([&] { run([](auto& p) { p.k_pe.dtype = DType::kFloat16; }); }, "k_pe");
  expect_invalid_argument([&] { run([](auto& p) { p.slot_mapping.dtype = DType::kFloat32; }); },
                          "slot_mapping");
  expect_invalid_argument([&] { run([](auto& p) { p.slot_mapping.shape[0] = 10; }); },
                          "slot_mapping");
  expect_invalid_argument([&] { run([](auto& p) { p.scale = 0; }); }, "scale");
  expect_invalid_argument([&] { run([](auto& p) { p.scale = -1; }); }, "scale");
  expect_invalid_argument([&] { run([](auto& p) { p.scale = INFINITY; }); }, "scale");
  expect_invalid_argument([&] { run([&](auto& p) { p.kv_cache = odd_pages.view(); }); }, "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_cache.dtype = DType::kFloat32; }); },
                          "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_cache.shape[2] = 600; }); }, "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.slot_mapping = on_device(p.slot_mapping); }); },
                          "slot_mapping");
  try {
    run([&](auto& p) { p.kv_cache = ds_cache.view(); });
    ADD_FAILURE() << "a uint8 cache of last dim 576 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), "kv_cache");
    EXPECT_NE(std::string(error.what()).find("expected last dimension 656"), std::string::npos)
        << error.what();
  }
  // A bf16 cache takes bf16 input only.
  HostTensor bf16_cache(DType::kBFloat16, {2, 8, 576});
  HostTensor fp16_rows(DType::kFloat16, {9, 576});
  expect_invalid_argument([&] {
    run([&](auto& p) {
      p.kv_cache = bf16_cache.view();
      p.kv_c = strided_view(fp16_rows, {9, 512}, {576, 1});
      p.k_pe = strided_view(fp16_rows, {9, 64}, {576, 1}, 512);
    });
  }, "kv_c");
  setup.slots.data<int32_t>()[4] = 16;  // one past the last slot
  expect_invalid_argument([&] { write_kv_cache(setup.params); }, "slot_mapping");
  EXPECT_TRUE(all_bytes(setup.cache, 0xff)) << "a rejected call wrote the cache";
}

// ---- gather_ds_mla_cache -------------------------------------------------------------------

struct GatherSetup {
  HostTensor cache, block_table, cu_seq_lens, out;
  GatherDsMlaCacheParams params;
};

// Requests of lengths {0, 17, 40, 5} (page size 16) on permuted pages; page `unused` is NaN
// bytes and never read; out has 3 spare rows that must stay poisoned.
GatherSetup make_gather(std::mt19937_64& rng, DType cache_dtype, int64_t out_row_stride) {
  GatherSetup setup;
  const int64_t pages = 7, page_size = 16, batch = 4, max_pages = 4;
  const int64_t lengths[batch] = {0, 17, 40, 5};
  setup.cache = HostTensor(cache_dtype, {pages, page_size, kDsMlaBytesPerToken});
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<double> log_scale(-12.0, 3.0);
  for (int64_t token = 0; token < pages * page_size; ++token) {
    uint8_t* row = setup.cache.bytes.data() + token * kDsMlaBytesPerToken;
    for (int i = 0; i < kLatentDim; ++i) {
      do row[i] = uint8_t(code(rng)); while ((row[i] & 0x7f) == 0x7f);  // no NaN codes
    }
    for (int g = 0; g < kDsMlaGroups; ++g) {
      float scale = float(std::exp2(log_scale(rng)));
      std::memcpy(row + 512 + 4 * g, &scale, 4);
    }
    for (int i = 0; i < kRopeDim; ++i) {
      uint16_t bits = float_to_bf16(float(log_scale(rng)));
      std::memcpy(row + 528 + 2 * i, &bits, 2);
    }
  }
  std::vector<int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int32_t unused = order.back();
  std::memset(setup.cache.bytes.data() + unused * page_size * kDsMlaBytesPerToken, 0xff,
              size_t(page_size * kDsMlaBytesPerToken));
  setup.block_table = HostTensor(DType::kInt32, {batch, max_pages});
  setup.cu_seq_lens = HostTensor(DType::kInt32, {batch + 1});
  size_t next_page = 0;
  int32_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    setup.cu_seq_lens.data<int32_t>()[b] = total;
    total += int32_t(lengths[b]);
    for (int64_t column = 0; column < max_pages; ++column) {
      bool used = column * page_size < lengths[b];
      setup.block_table.data<int32_t>()[b * max_pages + column] = used ? order[next_page++] : kGarbage;
    }
  }
  setup.cu_seq_lens.data<int32_t>()[batch] = total;
  setup.out = HostTensor(DType::kBFloat16, {total + 3, out_row_stride});
  poison(setup.out);
  setup.params.kv_cache = setup.cache.view();
  setup.params.block_table = setup.block_table.view();
  setup.params.cu_seq_lens = setup.cu_seq_lens.view();
  setup.params.out = strided_view(setup.out, {total + 3, kHeadDim}, {out_row_stride, 1});
  return setup;
}

HostTensor brute_force_gather(const GatherSetup& setup) {
  HostTensor expected = setup.out;
  poison(expected);
  const int64_t batch = setup.block_table.view().shape[0];
  const int64_t max_pages = setup.block_table.view().shape[1], page_size = 16;
  const int64_t stride = setup.params.out.stride(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t begin = setup.cu_seq_lens.data<int32_t>()[b];
    const int32_t end = setup.cu_seq_lens.data<int32_t>()[b + 1];
    for (int64_t i = 0; i < end - begin; ++i) {
      int64_t page = setup.block_table.data<int32_t>()[b * max_pages + i / page_size];
      const uint8_t* token =
          setup.cache.bytes.data() + (page * page_size + i % page_size) * kDsMlaBytesPerToken;
      uint16_t* out = expected.data<uint16_t>() + (begin + i) * stride;
      for (int j = 0; j < kLatentDim; ++j) {
        float scale;
        std::memcpy(&scale, token + 512 + 4 * (j / 128), 4);
        float product = float(double(fp8_e4m3_to_float(token[j])) * double(scale));  // exact, then RNE
        out[j] = brute_force_bf16(product);
      }
      std::memcpy(out + kLatentDim, token + 528, 128);
    }
  }
  return expected;
}

TEST(KvCache, GatherDsMlaMatchesBruteForce) {
  auto rng = make_rng();
  for (DType dtype : {DType::kUInt8, DType::kFloat8E4M3}) {
    GatherSetup setup = make_gather(rng, dtype, 580);
    gather_ds_mla_cache(setup.params);
    expect_same_bytes(setup.out, brute_force_gather(setup), "out");
  }
}

TEST(KvCache, GatherRejectsBadInput) {
  auto rng = make_rng();
  GatherSetup setup = make_gather(rng, DType::kUInt8, 576);
  HostTensor bf16_cache(DType::kBFloat16, {7, 16, 576});
  auto run = [&](auto edit) {
    GatherDsMlaCacheParams params = setup.params;
    edit(params);
    gather_ds_mla_cache(params);
  };
  expect_invalid_argument([&] { run([&](auto& p) { p.kv_cache = bf16_cache.view(); }); }, "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_cache.shape[2] = 576; }); }, "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.kv_cache.shape[1] = 24; }); }, "kv_cache");
  expect_invalid_argument([&] { run([](auto& p) { p.out.shape[1] = 512; }); }, "out");
  expect_invalid_argument([&] { run([](auto& p) { p.out.dtype = DType::kFloat16; }); }, "out");
  expect_invalid_argument([&] { run([](auto& p) { p.block_table.dtype = DType::kInt64; }); },
                          "block_table");
  expect_invalid_argument([&] { run([](auto& p) { p.cu_seq_lens.shape[0] = 4; }); }, "cu_seq_lens");
  expect_invalid_argument([&] { run([](auto& p) { p.out = on_device(p.out); }); }, "out");
  std::swap(setup.cu_seq_lens.data<int32_t>()[1], setup.cu_seq_lens.data<int32_t>()[2]);
  expect_invalid_argument([&] { gather_ds_mla_cache(setup.params); }, "cu_seq_lens");
  std::swap(setup.cu_seq_lens.data<int32_t>()[1], setup.cu_seq_lens.data<int32_t>()[2]);
  setup.block_table.data<int32_t>()[4] = 7;  // request 1, page 0: one past the last page
  expect_invalid_argument([&] { gather_ds_mla_cache(setup.params); }, "block_table");
  EXPECT_TRUE(all_bytes(setup.out, 0xff)) << "a rejected call wrote out";
}

// ---- convert_topk_indices ------------------------------------------------------------------

struct ConvertSetup {
  HostTensor local, request_ids, block_table, topk_length, global;
  ConvertTopkIndicesParams params;
};

// consecutive_requests: each request owns one run of rows (as in a real batch), so that some
// 8-row groups of the kernel have one request (table staged in shared memory) and some span two.
ConvertSetup make_convert(std::mt19937_64& rng, int64_t tokens, int64_t topk, bool with_length,
                          bool consecutive_requests = false) {
  ConvertSetup setup;
  const int64_t batch = 3, max_pages = 5, page_size = 16;
  setup.local = HostTensor(DType::kInt32, {tokens, topk});
  std::uniform_int_distribution<int32_t> position(-5, int32_t(max_pages * page_size + 10));
  for (int64_t i = 0; i < setup.local.numel(); ++i) setup.local.data<int32_t>()[i] = position(rng);
  setup.request_ids = HostTensor(DType::kInt32, {tokens});
  std::uniform_int_distribution<int32_t> request(0, int32_t(batch - 1));
  for (int64_t t = 0; t < tokens; ++t) {
    setup.request_ids.data<int32_t>()[t] = consecutive_requests ? int32_t(t * batch / tokens) : request(rng);
  }
  setup.block_table = HostTensor(DType::kInt32, {batch, max_pages});
  std::uniform_int_distribution<int32_t> page(0, 100000);
  for (int64_t i = 0; i < batch * max_pages; ++i) setup.block_table.data<int32_t>()[i] = page(rng);
  setup.topk_length = HostTensor(DType::kInt32, {tokens});
  std::uniform_int_distribution<int32_t> length(-1, int32_t(topk + 3));
  for (int64_t t = 0; t < tokens; ++t) setup.topk_length.data<int32_t>()[t] = t == 0 ? 0 : length(rng);
  setup.global = HostTensor(DType::kInt32, {tokens, topk + 3});
  poison(setup.global);
  setup.params.local_indices = setup.local.view();
  setup.params.request_ids = setup.request_ids.view();
  setup.params.block_table = setup.block_table.view();
  setup.params.page_size = page_size;
  if (with_length) setup.params.topk_length = setup.topk_length.view();
  setup.params.global_indices = strided_view(setup.global, {tokens, topk}, {topk + 3, 1});
  return setup;
}

HostTensor brute_force_convert(const ConvertSetup& setup) {
  HostTensor expected = setup.global;
  poison(expected);
  const auto& p = setup.params;
  const int64_t tokens = p.local_indices.size(0), topk = p.local_indices.size(1);
  const int64_t max_pages = p.block_table.size(1);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < topk; ++j) {
      int64_t position = setup.local.data<int32_t>()[t * topk + j];
      bool valid = position >= 0 && position < max_pages * p.page_size;
      if (p.topk_length.present()) valid = valid && j < setup.topk_length.data<int32_t>()[t];
      int32_t slot = -1;
      if (valid) {
        int64_t request = setup.request_ids.data<int32_t>()[t];
        int64_t page = setup.block_table.data<int32_t>()[request * max_pages + position / p.page_size];
        slot = int32_t(page * p.page_size + position % p.page_size);
      }
      expected.data<int32_t>()[t * (topk + 3) + j] = slot;
    }
  }
  return expected;
}

TEST(KvCache, ConvertTopkMatchesBruteForce) {
  auto rng = make_rng();
  for (int64_t topk : {37, 64, 1}) {
    for (bool with_length : {false, true}) {
      ConvertSetup setup = make_convert(rng, 9, topk, with_length);
      convert_topk_indices(setup.params);
      expect_same_bytes(setup.global, brute_force_convert(setup), "global_indices");
    }
  }
}

TEST(KvCache, ConvertRejectsBadInput) {
  auto rng = make_rng();
  ConvertSetup setup = make_convert(rng, 5, 8, true);
  auto run = [&](auto edit) {
    ConvertTopkIndicesParams params = setup.params;
    edit(params);
    convert_topk_indices(params);
  };
  expect_invalid_argument([&] { run([](auto& p) { p.page_size = 24; }); }, "page_size");
  expect_invalid_argument([&] { run([](auto& p) { p.page_size = 0; }); }, "page_size");
  expect_invalid_argument([&] { run([](auto& p) { p.local_indices.dtype = DType::kInt64; }); },
                          "local_indices");
  expect_invalid_argument([&] { run([](auto& p) { p.global_indices.shape[1] = 9; }); },
                          "global_indices");
  expect_invalid_argument([&] { run([](auto& p) { p.global_indices.strides[1] = 2; }); },
                          "global_indices");
  expect_invalid_argument([&] { run([](auto& p) { p.topk_length.shape[0] = 4; }); }, "topk_length");
  expect_invalid_argument([&] { run([](auto& p) { p.request_ids.shape[0] = 4; }); }, "request_ids");
  expect_invalid_argument([&] { run([](auto& p) { p.block_table = on_device(p.block_table); }); },
                          "block_table");
  setup.request_ids.data<int32_t>()[2] = 3;  // batch is 3
  expect_invalid_argument([&] { convert_topk_indices(setup.params); }, "request_ids");
  EXPECT_TRUE(all_bytes(setup.global, 0xff)) << "a rejected call wrote global_indices";
}

// ---- pack_kv_quantize_fp8 ------------------------------------------------------------------

struct PackSetup {
  HostTensor k_nope, k_pe, v, k_out, v_out;  // inputs and outputs padded: strided views
  PackKvQuantizeFp8Params params;
};

PackSetup make_pack(std::mt19937_64& rng, DType dtype, int64_t tokens, int64_t heads,
                    bool shared_rope, int64_t pad) {
  PackSetup setup;
  const int64_t rope_heads = shared_rope ? 1 : heads;
  setup.k_nope = HostTensor(dtype, {tokens, heads, 128 + pad});
  setup.k_pe = HostTensor(dtype, {tokens, rope_heads, 64 + pad});
  setup.v = HostTensor(dtype, {tokens, heads, 128 + pad});
  for (HostTensor* input : {&setup.k_nope, &setup.k_pe, &setup.v}) fill_uniform(*input, rng, -6.0, 6.0);
  setup.k_out = HostTensor(DType::kFloat8E4M3, {tokens, heads, 192 + pad});
  setup.v_out = HostTensor(DType::kFloat8E4M3, {tokens, heads, 128 + pad});
  poison(setup.k_out);
  poison(setup.v_out);
  auto view3 = [](HostTensor& tensor, int64_t dim) {
    const TensorView& whole = tensor.view();
    return strided_view(tensor, {whole.shape[0], whole.shape[1], dim},
                        {whole.strides[0], whole.strides[1], 1});
  };
  setup.params.k_nope = view3(setup.k_nope, 128);
  setup.params.k_pe = view3(setup.k_pe, 64);
  setup.params.v = view3(setup.v, 128);
  setup.params.k_out = view3(setup.k_out, 192);
  setup.params.v_out = view3(setup.v_out, 128);
  setup.params.k_scale = 0.0125f;  // 6 / 0.0125 = 480: the largest values saturate
  setup.params.v_scale = 0.02f;
  return setup;
}

void brute_force_pack(const PackSetup& setup, HostTensor& k_out, HostTensor& v_out) {
  poison(k_out);
  poison(v_out);
  const auto& p = setup.params;
  for (int64_t t = 0; t < p.k_nope.size(0); ++t) {
    for (int64_t h = 0; h < p.k_nope.size(1); ++h) {
      int64_t rope_head = p.k_pe.size(1) == 1 ? 0 : h;
      uint8_t* k = k_out.bytes.data() + t * p.k_out.stride(0) + h * p.k_out.stride(1);
      uint8_t* v = v_out.bytes.data() + t * p.v_out.stride(0) + h * p.v_out.stride(1);
      for (int i = 0; i < 128; ++i) {
        k[i] = brute_force_fp8(half_value(p.k_nope, t * p.k_nope.stride(0) + h * p.k_nope.stride(1) + i) * (1.0f / p.k_scale));
        v[i] = brute_force_fp8(half_value(p.v, t * p.v.stride(0) + h * p.v.stride(1) + i) * (1.0f / p.v_scale));
      }
      for (int i = 0; i < 64; ++i) {
        k[128 + i] = brute_force_fp8(
            half_value(p.k_pe, t * p.k_pe.stride(0) + rope_head * p.k_pe.stride(1) + i) * (1.0f / p.k_scale));
      }
    }
  }
}

TEST(KvCache, PackQuantizeMatchesBruteForce) {
  auto rng = make_rng();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (bool shared_rope : {true, false}) {
      PackSetup setup = make_pack(rng, dtype, 5, 3, shared_rope, 8);
      pack_kv_quantize_fp8(setup.params);
      HostTensor k_expected = setup.k_out, v_expected = setup.v_out;
      brute_force_pack(setup, k_expected, v_expected);
      expect_same_bytes(setup.k_out, k_expected, "k_out");
      expect_same_bytes(setup.v_out, v_expected, "v_out");
    }
  }
}

TEST(KvCache, PackRejectsBadInput) {
  auto rng = make_rng();
  PackSetup setup = make_pack(rng, DType::kBFloat16, 4, 3, false, 0);
  auto run = [&](auto edit) {
    PackKvQuantizeFp8Params params = setup.params;
    edit(params);
    pack_kv_quantize_fp8(params);
  };
  expect_invalid_argument([&] { run([](auto& p) { p.k_pe.shape[1] = 2; }); }, "k_pe");
  expect_invalid_argument([&] { run([](auto& p) { p.k_pe.shape[0] = 3; }); }, "k_pe");
  expect_invalid_argument([&] { run([](auto& p) { p.v.dtype = DType::kFloat16; }); }, "v");
  expect_invalid_argument([&] { run([](auto& p) { p.k_nope.dtype = DType::kFloat32; }); }, "k_nope");
  expect_invalid_argument([&] { run([](auto& p) { p.k_nope.strides[2] = 3; }); }, "k_nope");
  expect_invalid_argument([&] { run([](auto& p) { p.k_out.dtype = DType::kBFloat16; }); }, "k_out");
  expect_invalid_argument([&] { run([](auto& p) { p.v_out.shape[2] = 192; }); }, "v_out");
  expect_invalid_argument([&] { run([](auto& p) { p.k_scale = 0; }); }, "k_scale");
  expect_invalid_argument([&] { run([](auto& p) { p.v_scale = NAN; }); }, "v_scale");
  expect_invalid_argument([&] { run([](auto& p) { p.v_out = on_device(p.v_out); }); }, "v_out");
  EXPECT_TRUE(all_bytes(setup.k_out, 0xff) && all_bytes(setup.v_out, 0xff))
      << "a rejected call wrote an output";
}

// ---- merge_attention -----------------------------------------------------------------------

struct MergeSetup {
  HostTensor out_a, out_b, out, lse_a, lse_b_transposed, lse;
  MergeAttentionParams params;
};

// Row 0 of every token has lse_b = -inf (out_b is NaN there: its values must be ignored), row 1
// lse_a = -inf, token 0 head 2 both -inf; lse_b lives in an [H, T] buffer, seen transposed.
MergeSetup make_merge(std::mt19937_64& rng, DType dtype, int64_t tokens, int64_t heads,
                      int64_t dim, LseBase base, bool with_lse) {
  MergeSetup setup;
  setup.out_a = HostTensor(dtype, {tokens, heads, dim});
  setup.out_b = HostTensor(dtype, {tokens, heads, dim});
  fill_uniform(setup.out_a, rng, -2.0, 2.0);
  fill_uniform(setup.out_b, rng, -2.0, 2.0);
  setup.lse_a = HostTensor(DType::kFloat32, {tokens, heads});
  setup.lse_b_transposed = HostTensor(DType::kFloat32, {heads, tokens});
  fill_uniform(setup.lse_a, rng, -6.0, 6.0);
  fill_uniform(setup.lse_b_transposed, rng, -6.0, 6.0);
  const size_t element = dtype_size(dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    setup.lse_b_transposed.set(0 * tokens + t, -INFINITY);
    std::memset(setup.out_b.bytes.data() + (t * heads + 0) * dim * element, 0xff, dim * element);
    if (heads > 1) {
      setup.lse_a.set(t * heads + 1, -INFINITY);
      std::memset(setup.out_a.bytes.data() + (t * heads + 1) * dim * element, 0xff, dim * element);
    }
  }
  if (heads > 2) {
    setup.lse_a.set(2, -INFINITY);
    setup.lse_b_transposed.set(2 * tokens, -INFINITY);
  }
  setup.out = HostTensor(dtype, {tokens, heads, dim});
  setup.lse = HostTensor(DType::kFloat32, {tokens, heads});
  poison(setup.out);
  poison(setup.lse);
  setup.params.out_a = setup.out_a.view();
  setup.params.out_b = setup.out_b.view();
  setup.params.out = setup.out.view();
  setup.params.lse_a = setup.lse_a.view();
  setup.params.lse_b = strided_view(setup.lse_b_transposed, {tokens, heads}, {1, tokens});
  if (with_lse) setup.params.lse = setup.lse.view();
  setup.params.lse_base = base;
  return setup;
}

TEST(KvCache, MergeMatchesBruteForce) {
  auto rng = make_rng();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int64_t dim : {128, 13}) {
      for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " D=" + std::to_string(dim) +
                     (base == LseBase::kBase2 ? " base 2" : " natural"));
        const int64_t tokens = 6, heads = 5;
        MergeSetup setup = make_merge(rng, dtype, tokens, heads, dim, base, true);
        merge_attention(setup.params);
        const double output_epsilon = dtype == DType::kBFloat16 ? 1.0 / 256
                                      : dtype == DType::kFloat16 ? 1.0 / 2048 : 1e-6;
        const double log_base = base == LseBase::kBase2 ? std::log(2.0) : 1.0;
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t h = 0; h < heads; ++h) {
            double lse_a = setup.lse_a.get(t * heads + h);
            double lse_b = setup.lse_b_transposed.get(h * tokens + t);
            double lse_max = std::max(lse_a, lse_b);
            double actual_lse = setup.lse.get(t * heads + h);
            if (lse_max == -INFINITY) {
              EXPECT_EQ(actual_lse, -INFINITY);
              for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(setup.out.get((t * heads + h) * dim + i), 0.0);
              continue;
            }
            double weight_a = std::exp((lse_a - lse_max) * log_base);
            double weight_b = std::exp((lse_b - lse_max) * log_base);
            double expected_lse = lse_max + std::log(weight_a + weight_b) / log_base;
            EXPECT_NEAR(actual_lse, expected_lse, 2e-6 * (1 + std::fabs(expected_lse)));
            for (int64_t i = 0; i < dim; ++i) {
              int64_t index = (t * heads + h) * dim + i;
              double a = weight_a > 0 ? setup.out_a.get(index) : 0.0;
              double b = weight_b > 0 ? setup.out_b.get(index) : 0.0;
              double expected = (weight_a * a + weight_b * b) / (weight_a + weight_b);
              double actual = setup.out.get(index);
              ASSERT_LE(std::fabs(actual - expected),
                        output_epsilon * std::fabs(expected) + 1e-6 * (std::fabs(a) + std::fabs(b)))
                  << "t " << t << " h " << h << " i " << i;
            }
          }
        }
      }
    }
  }
}

TEST(KvCache, MergeRejectsBadInput) {
  auto rng = make_rng();
  MergeSetup setup = make_merge(rng, DType::kBFloat16, 3, 4, 16, LseBase::kNatural, true);
  auto run = [&](auto edit) {
    MergeAttentionParams params = setup.params;
    edit(params);
    merge_attention(params);
  };
  expect_invalid_argument([&] { run([](auto& p) { p.out_a.dtype = DType::kFloat64; }); }, "out_a");
  expect_invalid_argument([&] { run([](auto& p) { p.out_b.dtype = DType::kFloat16; }); }, "out_b");
  expect_invalid_argument([&] { run([](auto& p) { p.out.shape[2] = 8; }); }, "out");
  expect_invalid_argument([&] { run([](auto& p) { p.out.strides[2] = 2; }); }, "out");
  expect_invalid_argument([&] { run([](auto& p) { p.lse_a.rank = 1; }); }, "lse_a");
  expect_invalid_argument([&] { run([](auto& p) { p.lse_b.shape[1] = 3; }); }, "lse_b");
  expect_invalid_argument([&] { run([](auto& p) { p.lse.dtype = DType::kBFloat16; }); }, "lse");
  expect_invalid_argument([&] { run([](auto& p) { p.lse_b = on_device(p.lse_b); }); }, "lse_b");
  EXPECT_TRUE(all_bytes(setup.out, 0xff) && all_bytes(setup.lse, 0xff))
      << "a rejected call wrote an output";
}

// ---- GPU: every kernel against the CPU reference, byte for byte ----------------------------
#if OPENMLA_WITH_CUDA

TEST(KvCacheGpu, WriteMatchesReference) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  for (const WriteFormat& format : kWriteFormats) {
    for (int64_t row_stride : {576, 584, 579}) {  // packed, aligned padding, unaligned rows
      SCOPED_TRACE(std::string(dtype_name(format.cache)) + " " + std::to_string(format.last_dim) +
                   " from " + dtype_name(format.input) + ", row stride " + std::to_string(row_stride));
      WriteSetup setup = make_write(rng, format.input, format.cache, format.last_dim,
                                    format.slots, 301, 20, 16, row_stride, format.four_d);
      DeviceTensor rows(setup.rows), slots(setup.slots), cache(setup.cache);
      WriteKvCacheParams params = setup.params;
      params.kv_c = rows.relocate(setup.rows, setup.params.kv_c);
      params.k_pe = rows.relocate(setup.rows, setup.params.k_pe);
      params.slot_mapping = slots.view();
      params.kv_cache = cache.view();
      write_kv_cache(params);
      HostTensor from_gpu = setup.cache;
      cache.copy_to(from_gpu);
      write_kv_cache(setup.params);
      expect_same_bytes(from_gpu, setup.cache, "cache");
    }
  }
}

TEST(KvCacheGpu, GatherDsMlaMatchesReference) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  for (DType dtype : {DType::kUInt8, DType::kFloat8E4M3}) {
    for (int64_t out_stride : {576, 580}) {
      GatherSetup setup = make_gather(rng, dtype, out_stride);
      // out_stride 580 also moves the cache to a 664-byte token stride (not a multiple of 16),
      // which takes the register kernel instead of the cp.async staged one.
      const bool padded_cache = out_stride != 576;
      if (padded_cache) {
        const int64_t pages = setup.cache.view().size(0), page_size = setup.cache.view().size(1);
        constexpr int64_t kPaddedToken = kDsMlaBytesPerToken + 8;
        HostTensor padded(dtype, {pages, page_size, kPaddedToken});
        poison(padded);
        for (int64_t token = 0; token < pages * page_size; ++token) {
          std::memcpy(padded.bytes.data() + token * kPaddedToken,
                      setup.cache.bytes.data() + token * kDsMlaBytesPerToken, kDsMlaBytesPerToken);
        }
        setup.cache = std::move(padded);
        setup.params.kv_cache = strided_view(setup.cache, {pages, page_size, kDsMlaBytesPerToken},
                                             {page_size * kPaddedToken, kPaddedToken, 1});
      }
      DeviceTensor cache(setup.cache), table(setup.block_table), lengths(setup.cu_seq_lens), out(setup.out);
      GatherDsMlaCacheParams params;
      params.kv_cache = cache.relocate(setup.cache, setup.params.kv_cache);
      params.block_table = table.view();
      params.cu_seq_lens = lengths.view();
      params.out = out.relocate(setup.out, setup.params.out);
      gather_ds_mla_cache(params);
      HostTensor from_gpu = setup.out;
      out.copy_to(from_gpu);
      gather_ds_mla_cache(setup.params);
      expect_same_bytes(from_gpu, setup.out, "out");
    }
  }
}

TEST(KvCacheGpu, ConvertTopkMatchesReference) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  struct Case {
    int64_t tokens, topk;
    bool consecutive_requests;
  };
  // Random requests: every 8-row group mixes requests (global lookups). Consecutive requests
  // over 37 rows: groups 0-7, 16-23 and 32-36 (partial) have one request (staged table),
  // groups 8-15 and 24-31 span two.
  for (Case c : {Case{67, 2048, false}, Case{67, 37, false}, Case{67, 1, false}, Case{37, 300, true},
                 Case{37, 2048, true}, Case{37, 1, true}}) {
    for (bool with_length : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " topk " << c.topk
                                        << " consecutive " << c.consecutive_requests << " length " << with_length);
      ConvertSetup setup = make_convert(rng, c.tokens, c.topk, with_length, c.consecutive_requests);
      DeviceTensor local(setup.local), requests(setup.request_ids), table(setup.block_table),
          length(setup.topk_length), global(setup.global);
      ConvertTopkIndicesParams params = setup.params;
      params.local_indices = local.view();
      params.request_ids = requests.view();
      params.block_table = table.view();
      if (with_length) params.topk_length = length.view();
      params.global_indices = global.relocate(setup.global, setup.params.global_indices);
      convert_topk_indices(params);
      HostTensor from_gpu = setup.global;
      global.copy_to(from_gpu);
      expect_same_bytes(from_gpu, brute_force_convert(setup), "global_indices");
    }
  }
}

TEST(KvCacheGpu, PackQuantizeMatchesReference) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (bool shared_rope : {true, false}) {
      for (int64_t pad : {0, 8, 3}) {
        PackSetup setup = make_pack(rng, dtype, 131, 7, shared_rope, pad);
        DeviceTensor k_nope(setup.k_nope), k_pe(setup.k_pe), v(setup.v), k_out(setup.k_out),
            v_out(setup.v_out);
        PackKvQuantizeFp8Params params = setup.params;
        params.k_nope = k_nope.relocate(setup.k_nope, setup.params.k_nope);
        params.k_pe = k_pe.relocate(setup.k_pe, setup.params.k_pe);
        params.v = v.relocate(setup.v, setup.params.v);
        params.k_out = k_out.relocate(setup.k_out, setup.params.k_out);
        params.v_out = v_out.relocate(setup.v_out, setup.params.v_out);
        pack_kv_quantize_fp8(params);
        HostTensor k_gpu = setup.k_out, v_gpu = setup.v_out;
        k_out.copy_to(k_gpu);
        v_out.copy_to(v_gpu);
        pack_kv_quantize_fp8(setup.params);
        expect_same_bytes(k_gpu, setup.k_out, "k_out");
        expect_same_bytes(v_gpu, setup.v_out, "v_out");
      }
    }
  }
}

TEST(KvCacheGpu, MergeMatchesReference) {
  OPENMLA_REQUIRE_GPU();
  auto rng = make_rng();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int64_t dim : {512, 128, 13, 1}) {
      for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
        for (bool with_lse : {true, false}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " D=" + std::to_string(dim));
          MergeSetup setup = make_merge(rng, dtype, 97, 9, dim, base, with_lse);
          DeviceTensor out_a(setup.out_a), out_b(setup.out_b), out(setup.out), lse_a(setup.lse_a),
              lse_b(setup.lse_b_transposed), lse(setup.lse);
          MergeAttentionParams params = setup.params;
          params.out_a = out_a.view();
          params.out_b = out_b.view();
          params.out = out.view();
          params.lse_a = lse_a.view();
          params.lse_b = lse_b.relocate(setup.lse_b_transposed, setup.params.lse_b);
          if (with_lse) params.lse = lse.view();
          merge_attention(params);
          HostTensor out_gpu = setup.out, lse_gpu = setup.lse;
          out.copy_to(out_gpu);
          lse.copy_to(lse_gpu);
          merge_attention(setup.params);
          expect_same_bytes(out_gpu, setup.out, "out");
          expect_same_bytes(lse_gpu, setup.lse, "lse");
        }
      }
    }
  }
}

#endif  // OPENMLA_WITH_CUDA

}  // namespace
}  // namespace openmla

namespace openmla::testing {
namespace {

// A NaN LSE on either side makes the merged row NaN (it is not dropped like an empty side),
// while a row with finite LSEs next to it is unaffected.
TEST(KvCache, MergeNanLsePoisonsItsRow) {
  auto rng = make_rng();
  const int64_t tokens = 2, heads = 1, dim = 8;
  HostTensor out_a(DType::kFloat32, {tokens, heads, dim}), out_b(DType::kFloat32, {tokens, heads, dim});
  HostTensor lse_a(DType::kFloat32, {tokens, heads}), lse_b(DType::kFloat32, {tokens, heads});
  HostTensor out(DType::kFloat32, {tokens, heads, dim}), lse(DType::kFloat32, {tokens, heads});
  fill_uniform(out_a, rng);
  fill_uniform(out_b, rng);
  fill_uniform(lse_a, rng);
  fill_uniform(lse_b, rng);
  lse_b.set(0, NAN);  // row 0: NaN on side b
  poison(out);
  poison(lse);
  MergeAttentionParams params;
  params.out_a = out_a.view();
  params.out_b = out_b.view();
  params.lse_a = lse_a.view();
  params.lse_b = lse_b.view();
  params.out = out.view();
  params.lse = lse.view();
  merge_attention(params);
  EXPECT_TRUE(std::isnan(lse.get(0)));
  EXPECT_FALSE(std::isnan(lse.get(1)));
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_TRUE(std::isnan(out.get(d))) << d;
    EXPECT_FALSE(std::isnan(out.get(dim + d))) << d;
  }
}

}  // namespace
}  // namespace openmla::testing
