// Bad input to the four attention ops: each class of mistake is rejected with an
// InvalidArgument error naming the argument, before anything is written (the poisoned output
// stays poisoned). CUDA-device arguments answer NotImplemented while no GPU kernel exists
// (or in a build without CUDA).
#include <algorithm>
#include <functional>
#include <vector>

#include "openmla/numerics.h"
#include "test_support.h"

namespace openmla::testing {
namespace {

bool all_bytes_are(const HostTensor& tensor, uint8_t value) {
  return std::all_of(tensor.bytes.begin(), tensor.bytes.end(),
                     [&](uint8_t b) { return b == value; });
}

HostTensor random_tensor(DType dtype, std::initializer_list<int64_t> shape) {
  static std::mt19937_64 rng(7);
  HostTensor tensor(dtype, shape);
  fill_uniform(tensor, rng);
  return tensor;
}

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor tensor(DType::kInt32, {int64_t(values.size())});
  std::copy(values.begin(), values.end(), tensor.data<int32_t>());
  return tensor;
}

// The same memory, described with another shape / strides / dtype / device.
TensorView reshaped(const TensorView& view, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(view.data, view.dtype, shape, view.device);
}
TensorView with_dtype(TensorView view, DType dtype) {
  view.dtype = dtype;
  return view;
}
TensorView with_last_stride(TensorView view, int64_t stride) {
  view.strides[view.rank - 1] = stride;
  return view;
}
TensorView on_cuda(TensorView view, int index = 0) {
  view.device = Device{DeviceType::kCUDA, index};
  return view;
}

// Valid arguments for each op (small shapes), outputs poisoned. Each test breaks one thing.
struct DensePrefillArgs {
  HostTensor q = random_tensor(DType::kBFloat16, {4, 2, 192});
  HostTensor k = random_tensor(DType::kBFloat16, {5, 1, 192});
  HostTensor v = random_tensor(DType::kBFloat16, {5, 1, 128});
  HostTensor cu_q = int32_tensor({0, 1, 4});
  HostTensor cu_kv = int32_tensor({0, 2, 5});
  HostTensor out{DType::kBFloat16, {4, 2, 128}};
  HostTensor lse{DType::kFloat32, {4, 2}};
  DensePrefillParams params;
  DensePrefillArgs() {
    poison(out);
    poison(lse);
    params.q = q.view(), params.k = k.view(), params.v = v.view();
    params.cu_seqlens_q = cu_q.view(), params.cu_seqlens_kv = cu_kv.view();
    params.max_seqlen_q = 3, params.max_seqlen_kv = 3;
    params.softmax_scale = 0.1f;
    params.out = out.view(), params.lse = lse.view();
  }
  void run() const { dense_prefill(params); }
  bool untouched() const { return all_bytes_are(out, 0xff) && all_bytes_are(lse, 0xff); }
};

struct DenseDecodeArgs {
  HostTensor q = random_tensor(DType::kBFloat16, {2, 1, 2, 576});
  HostTensor cache = random_tensor(DType::kBFloat16, {3, 16, 576});
  HostTensor block_table = int32_tensor({2, 0, 1, 2147480000});  // [2, 2]
  HostTensor seq_lens = int32_tensor({20, 9});
  HostTensor out{DType::kBFloat16, {2, 1, 2, 512}};
  HostTensor lse{DType::kFloat32, {2, 1, 2}};
  DenseDecodeParams params;
  DenseDecodeArgs() {
    poison(out);
    poison(lse);
    params.q = q.view(), params.kv_cache = cache.view();
    params.block_table = reshaped(block_table.view(), {2, 2});
    params.seq_lens = seq_lens.view();
    params.softmax_scale = 0.1f;
    params.out = out.view(), params.lse = lse.view();
  }
  void run() const { dense_decode(params); }
  bool untouched() const { return all_bytes_are(out, 0xff) && all_bytes_are(lse, 0xff); }
};

struct SparsePrefillArgs {
  HostTensor q = random_tensor(DType::kBFloat16, {3, 3, 576});
  HostTensor kv = random_tensor(DType::kBFloat16, {8, 1, 576});
  HostTensor indices = int32_tensor({0, 5, -1, 7, 2, 3});  // [3, 2]
  HostTensor topk_length = int32_tensor({2, 1, 0});
  HostTensor sink = random_tensor(DType::kFloat32, {3});
  HostTensor out{DType::kBFloat16, {3, 3, 512}};
  HostTensor lse{DType::kFloat32, {3, 3}};
  HostTensor max_logits{DType::kFloat32, {3, 3}};
  SparsePrefillParams params;
  SparsePrefillArgs() {
    poison(out);
    poison(lse);
    poison(max_logits);
    params.q = q.view(), params.kv = kv.view();
    params.indices = reshaped(indices.view(), {3, 2});
    params.topk_length = topk_length.view(), params.attn_sink = sink.view();
    params.softmax_scale = 0.1f;
    params.out = out.view(), params.lse = lse.view(), params.max_logits = max_logits.view();
  }
  void run() const { sparse_prefill(params); }
  bool untouched() const {
    return all_bytes_are(out, 0xff) && all_bytes_are(lse, 0xff) && all_bytes_are(max_logits, 0xff);
  }
};

struct SparseDecodeArgs {
  HostTensor q = random_tensor(DType::kBFloat16, {2, 1, 3, 576});
  HostTensor cache = random_tensor(DType::kBFloat16, {2, 16, 576});
  HostTensor indices = int32_tensor({0, 17, -1, 31, 3, 4});  // [2, 1, 3]
  HostTensor ds_mla_cache{DType::kUInt8, {2, 16, kDsMlaBytesPerToken}};
  HostTensor extra_indices = int32_tensor({1, 2, 3, 4});  // [2, 1, 2]
  HostTensor topk_length = int32_tensor({3, 1});
  HostTensor sink = random_tensor(DType::kFloat32, {3});
  HostTensor out{DType::kBFloat16, {2, 1, 3, 512}};
  HostTensor lse{DType::kFloat32, {2, 1, 3}};
  SparseDecodeParams params;
  SparseDecodeArgs() {
    fill_bytes(ds_mla_cache, 0x38);  // fp8 1.0, small finite scales and rope values
    poison(out);
    poison(lse);
    params.q = q.view();
    params.main = {cache.view(), reshaped(indices.view(), {2, 1, 3}), topk_length.view()};
    params.extra = {ds_mla_cache.view(), reshaped(extra_indices.view(), {2, 1, 2}), {}};
    params.attn_sink = sink.view();
    params.softmax_scale = 0.1f;
    params.out = out.view(), params.lse = lse.view();
  }
  void run() const { sparse_decode(params); }
  bool untouched() const { return all_bytes_are(out, 0xff) && all_bytes_are(lse, 0xff); }
};

// Runs `break_args` on fresh valid arguments, expects the op to reject them naming
// `argument`, and the outputs to stay poisoned.
template <typename Args>
void expect_rejected(const std::function<void(Args&)>& break_args, const std::string& argument) {
  Args args;
  break_args(args);
  SCOPED_TRACE("argument " + argument);
  expect_invalid_argument([&] { args.run(); }, argument);
  EXPECT_TRUE(args.untouched()) << "output written although the input was rejected";
}

// The valid baselines really run (so each rejection below comes from the one broken thing).
TEST(AttentionBadInput, BaselinesAreAccepted) {
  DensePrefillArgs dense_prefill_args;
  dense_prefill_args.run();
  EXPECT_FALSE(dense_prefill_args.untouched());
  DenseDecodeArgs dense_decode_args;
  dense_decode_args.run();
  EXPECT_FALSE(dense_decode_args.untouched());
  SparsePrefillArgs sparse_prefill_args;
  sparse_prefill_args.run();
  EXPECT_FALSE(sparse_prefill_args.untouched());
  SparseDecodeArgs sparse_decode_args;
  sparse_decode_args.run();
  EXPECT_FALSE(sparse_decode_args.untouched());
}

TEST(AttentionBadInput, WrongDtype) {
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.q = with_dtype(a.params.q, DType::kFloat32); }, "q");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.k = with_dtype(a.params.k, DType::kFloat16); }, "k");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.out = with_dtype(a.params.out, DType::kFloat16); }, "out");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.cu_seqlens_q = with_dtype(a.params.cu_seqlens_q, DType::kFloat32); },
      "cu_seqlens_q");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) { a.params.block_table = with_dtype(a.params.block_table, DType::kFloat32); },
      "block_table");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) { a.params.lse = with_dtype(a.params.lse, DType::kBFloat16); }, "lse");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.kv = with_dtype(a.params.kv, DType::kFloat16); }, "kv");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.indices = with_dtype(a.params.indices, DType::kUInt8); }, "indices");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.attn_sink = with_dtype(a.params.attn_sink, DType::kBFloat16); },
      "attn_sink");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) { a.params.q = with_dtype(a.params.q, DType::kFloat16); }, "q");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) { a.params.main.kv_cache = with_dtype(a.params.main.kv_cache, DType::kFloat32); },
      "main.kv_cache");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.main.topk_length = with_dtype(a.params.main.topk_length, DType::kFloat32);
      },
      "main.topk_length");
}

TEST(AttentionBadInput, WrongRank) {
  expect_rejected<DensePrefillArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {4, 2 * 192});
      },
      "q");
  expect_rejected<DensePrefillArgs>([](auto& a) { a.params.lse = reshaped(a.params.lse, {8}); },
                                    "lse");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {2, 2, 576});
      },
      "q");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.out = reshaped(a.params.out, {9, 512});
      },
      "out");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.kv = reshaped(a.params.kv, {8, 1, 1, 576});
      },
      "kv");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.main.indices = reshaped(a.params.main.indices, {2, 3});
      },
      "main.indices");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.extra.kv_cache = reshaped(a.params.extra.kv_cache, {32, kDsMlaBytesPerToken});
      },
      "extra.kv_cache");
}

TEST(AttentionBadInput, MismatchedSizes) {
  expect_rejected<DensePrefillArgs>(
      [](auto& a) {
        a.params.v = reshaped(a.params.v, {4, 1, 128});
      },
      "v");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) {
        a.params.out = reshaped(a.params.out, {4, 1, 128});
      },
      "out");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) { a.params.seq_lens = reshaped(a.params.seq_lens, {1}); }, "seq_lens");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) {
        a.params.block_table = reshaped(a.params.block_table, {1, 4});
      },
      "block_table");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.indices = reshaped(a.params.indices, {2, 3});
      },
      "indices");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.topk_length = reshaped(a.params.topk_length, {2}); }, "topk_length");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.max_logits = reshaped(a.params.max_logits, {3, 2});
      },
      "max_logits");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.kv = reshaped(a.params.kv, {16, 1, 288});
      },
      "kv");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.main.indices = reshaped(a.params.main.indices, {1, 2, 3});
      },
      "main.indices");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) { a.params.attn_sink = reshaped(a.params.attn_sink, {2}); }, "attn_sink");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.lse = reshaped(a.params.lse, {2, 1, 2});
      },
      "lse");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.main.kv_cache = reshaped(a.params.main.kv_cache, {2, 18, 512});
      },
      "main.kv_cache");
}

// Host-resident lengths and tables are checked against the shapes they index.
TEST(AttentionBadInput, LengthsOutOfRange) {
  expect_rejected<DenseDecodeArgs>([](auto& a) { a.seq_lens.template data<int32_t>()[1] = 33; },
                                   "seq_lens");
  expect_rejected<DenseDecodeArgs>([](auto& a) { a.block_table.template data<int32_t>()[1] = 3; },
                                   "block_table");
  expect_rejected<DensePrefillArgs>([](auto& a) { a.params.max_seqlen_q = 2; }, "max_seqlen_q");
  expect_rejected<SparsePrefillArgs>([](auto& a) { a.topk_length.template data<int32_t>()[0] = 3; },
                                     "topk_length");
  expect_rejected<SparseDecodeArgs>([](auto& a) { a.topk_length.template data<int32_t>()[1] = -1; },
                                    "main.topk_length");
  expect_rejected<SparseDecodeArgs>([](auto& a) { a.params.extra.kv_cache = {}; }, "extra.indices");
}

TEST(AttentionBadInput, LastDimNotContiguous) {
  expect_rejected<DensePrefillArgs>([](auto& a) { a.params.q = with_last_stride(a.params.q, 2); },
                                    "q");
  expect_rejected<DensePrefillArgs>([](auto& a) { a.params.v = with_last_stride(a.params.v, 2); },
                                    "v");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) { a.params.kv_cache = with_last_stride(a.params.kv_cache, 2); }, "kv_cache");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.indices = with_last_stride(a.params.indices, 3); }, "indices");
  expect_rejected<SparseDecodeArgs>([](auto& a) { a.params.q = with_last_stride(a.params.q, 2); },
                                    "q");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) { a.params.out = with_last_stride(a.params.out, 2); }, "out");
}

TEST(AttentionBadInput, CuSeqlensWrongLengthStartOrOrder) {
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.cu_seqlens_kv = reshaped(a.params.cu_seqlens_kv, {2}); },
      "cu_seqlens_kv");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.cu_seqlens_q = reshaped(a.params.cu_seqlens_q, {0}); },
      "cu_seqlens_q");
  expect_rejected<DensePrefillArgs>([](auto& a) { a.cu_q.template data<int32_t>()[0] = 1; },
                                    "cu_seqlens_q");
  expect_rejected<DensePrefillArgs>([](auto& a) { a.cu_kv.template data<int32_t>()[1] = 6; },
                                    "cu_seqlens_kv");  // 6 > 5: decreasing
  expect_rejected<DensePrefillArgs>([](auto& a) { a.cu_q.template data<int32_t>()[2] = 5; },
                                    "cu_seqlens_q");  // past Tq = 4
}

TEST(AttentionBadInput, HeadsNotAMultipleOfKvHeads) {
  // Hq = 3 with Hk = 2: 3 is not a multiple of 2.
  DensePrefillArgs args;
  HostTensor q = random_tensor(DType::kBFloat16, {4, 3, 192});
  HostTensor k = random_tensor(DType::kBFloat16, {5, 2, 192});
  HostTensor out(DType::kBFloat16, {4, 3, 128});
  poison(out);
  args.params.q = q.view(), args.params.k = k.view(), args.params.out = out.view();
  args.params.lse = {};
  expect_invalid_argument([&] { args.run(); }, "k");
  EXPECT_TRUE(all_bytes_are(out, 0xff));
}

TEST(AttentionBadInput, UnsupportedHeadDims) {
  expect_rejected<DensePrefillArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {4, 3, 128});
      },
      "q");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) {
        a.params.v = reshaped(a.params.v, {5, 1, 64});
      },
      "v");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {2, 1, 2, 512});
      },
      "q");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {3, 3, 448});
      },
      "q");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {2, 1, 3, 256});
      },
      "q");
  // V4 keys (512) cannot come from a ds_mla cache, which holds 576-dim tokens.
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.q = reshaped(a.params.q, {2, 1, 3, 512});
        a.params.main.kv_cache = reshaped(a.params.main.kv_cache, {2, 18, 512});
      },
      "extra.kv_cache");
}

TEST(AttentionBadInput, DsMlaCacheLastDimNot656) {
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.extra.kv_cache = reshaped(a.params.extra.kv_cache, {2, 16, 1, 576});
      },
      "extra.kv_cache");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.main.kv_cache =
            with_dtype(reshaped(a.params.main.kv_cache, {2, 16, 1152}), DType::kFloat8E4M3);
      },
      "main.kv_cache");
}

TEST(AttentionBadInput, TensorsOnDifferentDevices) {
  expect_rejected<DensePrefillArgs>([](auto& a) { a.params.out = on_cuda(a.params.out); }, "out");
  expect_rejected<DensePrefillArgs>(
      [](auto& a) { a.params.cu_seqlens_kv = on_cuda(a.params.cu_seqlens_kv); }, "cu_seqlens_kv");
  expect_rejected<DenseDecodeArgs>([](auto& a) { a.params.kv_cache = on_cuda(a.params.kv_cache); },
                                   "kv_cache");
  expect_rejected<SparsePrefillArgs>(
      [](auto& a) { a.params.attn_sink = on_cuda(a.params.attn_sink); }, "attn_sink");
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) { a.params.extra.indices = on_cuda(a.params.extra.indices); }, "extra.indices");
  // Two GPUs are two devices too.
  expect_rejected<SparseDecodeArgs>(
      [](auto& a) {
        a.params.q = on_cuda(a.params.q, 0);
        a.params.main.kv_cache = on_cuda(a.params.main.kv_cache, 1);
      },
      "main.kv_cache");
}

TEST(AttentionBadInput, WorkspaceTooSmall) {
  HostTensor small(DType::kUInt8, {64});
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.workspace = small.view(); },
                                   "workspace");
  expect_rejected<SparseDecodeArgs>([&](auto& a) { a.params.workspace = small.view(); },
                                    "workspace");
  // Prefill needs none, so any workspace passes; a decode workspace of the queried size too.
  DensePrefillArgs prefill;
  prefill.params.workspace = small.view();
  EXPECT_EQ(dense_prefill_workspace_size(prefill.params), 0u);
  EXPECT_NO_THROW(prefill.run());
  SparseDecodeArgs decode;
  HostTensor enough(DType::kUInt8, {int64_t(sparse_decode_workspace_size(decode.params))});
  EXPECT_GT(enough.numel(), 64);
  decode.params.workspace = enough.view();
  EXPECT_NO_THROW(decode.run());
}

// ---- dense decode: what the Hopper kernel supports (issue 3) --------------------------------
// Each out-of-range argument gets its own correctly sized memory, so that only the validation,
// never an out-of-bounds read, can stop the call.

TEST(AttentionBadInput, DenseDecodeQueryTokensOrHeadsOutOfRange) {
  for (auto shape : {std::vector<int64_t>{2, 0, 2, 576}, std::vector<int64_t>{2, 9, 2, 576},
                     std::vector<int64_t>{2, 1, 0, 576}, std::vector<int64_t>{2, 1, 129, 576}}) {
    HostTensor q = random_tensor(DType::kBFloat16, {shape[0], shape[1], shape[2], shape[3]});
    HostTensor out(DType::kBFloat16, {shape[0], shape[1], shape[2], 512});
    HostTensor lse(DType::kFloat32, {shape[0], shape[1], shape[2]});
    expect_rejected<DenseDecodeArgs>(
        [&](auto& a) {
          poison(out);
          poison(lse);
          a.params.q = q.view(), a.params.out = out.view(), a.params.lse = lse.view();
        },
        "q");
    EXPECT_TRUE(all_bytes_are(out, 0xff) && all_bytes_are(lse, 0xff));
  }
}

TEST(AttentionBadInput, DenseDecodeHeadDimsNot576And512) {
  HostTensor q_640 = random_tensor(DType::kBFloat16, {2, 1, 2, 640});
  HostTensor cache_512 = random_tensor(DType::kBFloat16, {3, 16, 512});
  HostTensor cache_640 = random_tensor(DType::kBFloat16, {3, 16, 1, 640});
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.q = q_640.view(); }, "q");
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.kv_cache = cache_512.view(); },
                                   "kv_cache");
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.kv_cache = cache_640.view(); },
                                   "kv_cache");
  // The values are the first 512 key dims: out's last dim must be 512, not 576 or 256.
  HostTensor out_576(DType::kBFloat16, {2, 1, 2, 576});
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.out = out_576.view(); }, "out");
  expect_rejected<DenseDecodeArgs>(
      [](auto& a) { a.params.out = reshaped(a.params.out, {2, 1, 2, 256}); }, "out");
}

TEST(AttentionBadInput, DenseDecodePageSizeNotSupported) {
  // 8 and 512 are powers of two outside 16..256; 48 lies inside but is not a power of two.
  for (int64_t page_size : {8, 48, 512}) {
    SCOPED_TRACE("page size " + std::to_string(page_size));
    const int64_t pages = (3 * 16 + page_size - 1) / page_size + 1;
    HostTensor cache = random_tensor(DType::kBFloat16, {pages, page_size, 576});
    expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.kv_cache = cache.view(); },
                                     "kv_cache");
  }
}

TEST(AttentionBadInput, DenseDecodeWorkspaceOneByteShort) {
  const size_t needed = dense_decode_workspace_size(DenseDecodeArgs().params);
  ASSERT_GT(needed, 1u);
  HostTensor short_workspace(DType::kUInt8, {int64_t(needed) - 1});
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.workspace = short_workspace.view(); },
                                   "workspace");
  HostTensor enough(DType::kUInt8, {int64_t(needed)});
  DenseDecodeArgs args;
  args.params.workspace = enough.view();
  EXPECT_NO_THROW(args.run());
}

TEST(AttentionBadInput, DenseDecodeFp8WithoutAScale) {
  HostTensor fp8_cache = random_tensor(DType::kFloat8E4M3, {3, 16, 576});
  HostTensor fp8_q = random_tensor(DType::kFloat8E4M3, {2, 1, 2, 576});
  // An fp8 cache needs a positive finite kv_scale (the default 1 is one; 0, < 0, NaN, inf not).
  for (float scale : {0.0f, -0.5f, NAN, INFINITY}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    expect_rejected<DenseDecodeArgs>(
        [&](auto& a) {
          a.params.kv_cache = fp8_cache.view();
          a.params.kv_scale = scale;
        },
        "kv_scale");
    expect_rejected<DenseDecodeArgs>(
        [&](auto& a) {
          a.params.q = fp8_q.view(), a.params.kv_cache = fp8_cache.view();
          a.params.q_descale = scale;
        },
        "q_descale");
  }
  // Scales of dtypes that are not fp8 are ignored: a bf16 call with kv_scale 0 runs.
  DenseDecodeArgs bf16;
  bf16.params.kv_scale = 0, bf16.params.q_descale = 0;
  EXPECT_NO_THROW(bf16.run());
}

TEST(AttentionBadInput, DenseDecodeDtypePairingsNotSupported) {
  HostTensor fp16_q = random_tensor(DType::kFloat16, {2, 1, 2, 576});
  HostTensor fp16_cache = random_tensor(DType::kFloat16, {3, 16, 576});
  HostTensor fp8_q = random_tensor(DType::kFloat8E4M3, {2, 1, 2, 576});
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.q = fp16_q.view(); }, "kv_cache");
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.kv_cache = fp16_cache.view(); },
                                   "kv_cache");
  expect_rejected<DenseDecodeArgs>([&](auto& a) { a.params.q = fp8_q.view(); }, "kv_cache");
}

// ---- CUDA arguments without a kernel --------------------------------------------------------
// Every argument claims cuda:0. No GPU kernel of these ops exists yet and nothing reads the
// memory, so a CPU-only build and a CUDA build alike must answer NotImplemented (never a
// hidden copy to the CPU). When an op gets its kernel, its GPU tests replace its case here,
// which stays for builds without CUDA only (dense decode so far).

template <typename Args>
void expect_not_implemented_on_cuda(const std::function<void(Args&)>& move_to_cuda) {
  Args args;
  move_to_cuda(args);
  try {
    args.run();
    ADD_FAILURE() << "expected ErrorKind::kNotImplemented, got no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kNotImplemented) << error.what();
  }
  EXPECT_TRUE(args.untouched());
}

TEST(AttentionBadInput, DensePrefillOnCudaIsNotImplemented) {
  expect_not_implemented_on_cuda<DensePrefillArgs>([](auto& a) {
    for (TensorView* view : {&a.params.q, &a.params.k, &a.params.v, &a.params.cu_seqlens_q,
                             &a.params.cu_seqlens_kv, &a.params.out, &a.params.lse}) {
      *view = on_cuda(*view);
    }
  });
}

#if !OPENMLA_WITH_CUDA
// Dense decode has a Hopper kernel (tests/cpp/dense_decode_gpu_test.cpp covers it); only a
// build without CUDA still answers NotImplemented. (With CUDA this host memory marked cuda:0
// would be launched on.)
TEST(AttentionBadInput, DenseDecodeOnCudaWithoutCudaBuildIsNotImplemented) {
  HostTensor workspace(DType::kUInt8,
                       {int64_t(dense_decode_workspace_size(DenseDecodeArgs().params))});
  expect_not_implemented_on_cuda<DenseDecodeArgs>([&](auto& a) {
    a.params.workspace = workspace.view();
    for (TensorView* view :
         {&a.params.q, &a.params.kv_cache, &a.params.block_table, &a.params.seq_lens, &a.params.out,
          &a.params.lse, &a.params.workspace}) {
      *view = on_cuda(*view);
    }
  });
}
#endif

TEST(AttentionBadInput, SparsePrefillOnCudaIsNotImplemented) {
  expect_not_implemented_on_cuda<SparsePrefillArgs>([](auto& a) {
    for (TensorView* view :
         {&a.params.q, &a.params.kv, &a.params.indices, &a.params.topk_length, &a.params.attn_sink,
          &a.params.out, &a.params.lse, &a.params.max_logits}) {
      *view = on_cuda(*view);
    }
  });
}

TEST(AttentionBadInput, SparseDecodeOnCudaIsNotImplemented) {
  HostTensor workspace(DType::kUInt8,
                       {int64_t(sparse_decode_workspace_size(SparseDecodeArgs().params))});
  expect_not_implemented_on_cuda<SparseDecodeArgs>([&](auto& a) {
    a.params.workspace = workspace.view();
    for (TensorView* view :
         {&a.params.q, &a.params.main.kv_cache, &a.params.main.indices, &a.params.main.topk_length,
          &a.params.extra.kv_cache, &a.params.extra.indices, &a.params.attn_sink, &a.params.out,
          &a.params.lse, &a.params.workspace}) {
      *view = on_cuda(*view);
    }
  });
}

}  // namespace
}  // namespace openmla::testing
