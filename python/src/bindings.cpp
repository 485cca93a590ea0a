// openmla._C: the thin layer between Python and the C++ API.
//
// A tensor arrives as a plain tuple (data_ptr, dtype name, shape, strides in elements, device
// type, device index), or None for an absent optional. Plain tuples keep this module free of
// libtorch and of DLPack's dtype list, so FP8 tensors pass through unchanged. Every tensor
// parameter accepts None, so that a missing required tensor is reported by the op's own check,
// naming the argument. Each function fills the op's params struct, releases the GIL and calls
// the op; openmla::Error becomes ValueError (bad input), NotImplementedError (no implementation
// for this device) or RuntimeError (CUDA failure), with the message kept.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "openmla/openmla.h"

namespace nb = nanobind;

namespace {

using openmla::DType;
using openmla::ErrorKind;
using openmla::TensorView;

DType parse_dtype(const char* op, const char* argument, const std::string& name) {
  static const std::pair<const char*, DType> kNames[] = {
      {"float32", DType::kFloat32},     {"float64", DType::kFloat64},
      {"bfloat16", DType::kBFloat16},   {"float16", DType::kFloat16},
      {"float8_e4m3", DType::kFloat8E4M3}, {"int32", DType::kInt32},
      {"int64", DType::kInt64},         {"uint8", DType::kUInt8},
  };
  for (const auto& [known, dtype] : kNames) {
    if (name == known) return dtype;
  }
  throw openmla::Error(ErrorKind::kInvalidArgument, op, argument,
                       "unsupported dtype " + name);
}

openmla::Device parse_device(const char* op, const char* argument, const std::string& type,
                             int index) {
  if (type == "cpu") return {openmla::DeviceType::kCPU, 0};
  if (type == "cuda") return {openmla::DeviceType::kCUDA, index};
  throw openmla::Error(ErrorKind::kInvalidArgument, op, argument,
                       "unsupported device type " + type + " (expected cpu or cuda)");
}

// The tuple (data_ptr, dtype, shape, strides, device_type, device_index) as a TensorView;
// None gives an absent view.
TensorView to_view(const char* op, const char* argument, nb::handle object) {
  TensorView view;
  if (object.is_none()) return view;
  nb::tuple fields;
  if (!nb::try_cast(object, fields) || fields.size() != 6) {
    throw openmla::Error(ErrorKind::kInvalidArgument, op, argument,
                         "expected a tensor tuple (data_ptr, dtype, shape, strides, "
                         "device_type, device_index) or None");
  }
  nb::sequence shape = nb::cast<nb::sequence>(fields[2]);
  nb::sequence strides = nb::cast<nb::sequence>(fields[3]);
  const size_t rank = nb::len(shape);
  if (rank > size_t(openmla::kMaxRank) || nb::len(strides) != rank) {
    throw openmla::Error(ErrorKind::kInvalidArgument, op, argument,
                         "expected rank <= " + std::to_string(openmla::kMaxRank) +
                             " with one stride per dimension");
  }
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(fields[0]));
  view.dtype = parse_dtype(op, argument, nb::cast<std::string>(fields[1]));
  view.rank = int(rank);
  for (size_t dim = 0; dim < rank; ++dim) {
    view.shape[dim] = nb::cast<int64_t>(shape[dim]);
    view.strides[dim] = nb::cast<int64_t>(strides[dim]);
  }
  view.device = parse_device(op, argument, nb::cast<std::string>(fields[4]),
                             nb::cast<int>(fields[5]));
  return view;
}

openmla::Stream to_stream(uintptr_t stream) { return reinterpret_cast<openmla::Stream>(stream); }

openmla::LseBase to_lse_base(bool base2) {
  return base2 ? openmla::LseBase::kBase2 : openmla::LseBase::kNatural;
}

template <typename Params>
using WorkspaceSizeQuery = size_t (*)(const Params&);

// Binds `name` to build(args...) followed by op(params), and, when given, `size_name` to the
// workspace-size query over the same arguments (the outputs may then be None). The op runs
// without the GIL: the CPU reference is multi-threaded and a CUDA launch may wait on the
// driver; neither touches Python objects. (common_type_t keeps workspace_size out of template
// deduction, so nullptr is accepted.)
template <typename Params, typename... Args, typename... Names>
void bind(nb::module_& module, const char* name, Params (*build)(Args...),
          void (*op)(const Params&), const char* size_name,
          std::common_type_t<WorkspaceSizeQuery<Params>> workspace_size, const Names&... names) {
  module.def(
      name,
      [build, op](Args... args) {
        Params params = build(args...);
        nb::gil_scoped_release release;
        op(params);
      },
      names...);
  if (workspace_size != nullptr) {
    module.def(
        size_name, [build, workspace_size](Args... args) { return workspace_size(build(args...)); },
        names...);
  }
}

// ---- params builders: one per op; its workspace-size query takes the same arguments ------

openmla::DensePrefillParams dense_prefill_params(
    nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q, nb::handle cu_seqlens_kv,
    int64_t max_seqlen_q, int64_t max_seqlen_kv, float softmax_scale, bool causal,
    float q_descale, float k_descale, float v_descale, nb::handle out, nb::handle lse,
    bool lse_base2, nb::handle workspace, uintptr_t stream) {
  const char* op = "dense_prefill";
  openmla::DensePrefillParams params;
  params.q = to_view(op, "q", q);
  params.k = to_view(op, "k", k);
  params.v = to_view(op, "v", v);
  params.cu_seqlens_q = to_view(op, "cu_seqlens_q", cu_seqlens_q);
  params.cu_seqlens_kv = to_view(op, "cu_seqlens_kv", cu_seqlens_kv);
  params.max_seqlen_q = max_seqlen_q;
  params.max_seqlen_kv = max_seqlen_kv;
  params.softmax_scale = softmax_scale;
  params.causal = causal;
  params.q_descale = q_descale;
  params.k_descale = k_descale;
  params.v_descale = v_descale;
  params.out = to_view(op, "out", out);
  params.lse = to_view(op, "lse", lse);
  params.lse_base = to_lse_base(lse_base2);
  params.workspace = to_view(op, "workspace", workspace);
  params.stream = to_stream(stream);
  return params;
}

openmla::DenseDecodeParams dense_decode_params(
    nb::handle q, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
    float softmax_scale, bool causal, float q_descale, float kv_scale, nb::handle out,
    nb::handle lse, bool lse_base2, nb::handle workspace, uintptr_t stream, bool enable_pdl,
    int64_t max_seq_len) {
  const char* op = "dense_decode";
  openmla::DenseDecodeParams params;
  params.q = to_view(op, "q", q);
  params.kv_cache = to_view(op, "kv_cache", kv_cache);
  params.block_table = to_view(op, "block_table", block_table);
  params.seq_lens = to_view(op, "seq_lens", seq_lens);
  params.softmax_scale = softmax_scale;
  params.causal = causal;
  params.q_descale = q_descale;
  params.kv_scale = kv_scale;
  params.out = to_view(op, "out", out);
  params.lse = to_view(op, "lse", lse);
  params.lse_base = to_lse_base(lse_base2);
  params.workspace = to_view(op, "workspace", workspace);
  params.stream = to_stream(stream);
  params.enable_pdl = enable_pdl;
  params.max_seq_len = max_seq_len;
  return params;
}

openmla::SparsePrefillParams sparse_prefill_params(
    nb::handle q, nb::handle kv, nb::handle indices, nb::handle topk_length,
    nb::handle attn_sink, float softmax_scale, nb::handle out, nb::handle lse,
    nb::handle max_logits, bool lse_base2, nb::handle workspace, uintptr_t stream) {
  const char* op = "sparse_prefill";
  openmla::SparsePrefillParams params;
  params.q = to_view(op, "q", q);
  params.kv = to_view(op, "kv", kv);
  params.indices = to_view(op, "indices", indices);
  params.topk_length = to_view(op, "topk_length", topk_length);
  params.attn_sink = to_view(op, "attn_sink", attn_sink);
  params.softmax_scale = softmax_scale;
  params.out = to_view(op, "out", out);
  params.lse = to_view(op, "lse", lse);
  params.max_logits = to_view(op, "max_logits", max_logits);
  params.lse_base = to_lse_base(lse_base2);
  params.workspace = to_view(op, "workspace", workspace);
  params.stream = to_stream(stream);
  return params;
}

openmla::SparseDecodeParams sparse_decode_params(
    nb::handle q, nb::handle kv_cache, nb::handle indices, nb::handle topk_length,
    nb::handle extra_kv_cache, nb::handle extra_indices, nb::handle extra_topk_length,
    nb::handle attn_sink, float softmax_scale, nb::handle out, nb::handle lse, bool lse_base2,
    nb::handle workspace, uintptr_t stream) {
  const char* op = "sparse_decode";
  openmla::SparseDecodeParams params;
  params.q = to_view(op, "q", q);
  params.main.kv_cache = to_view(op, "kv_cache", kv_cache);
  params.main.indices = to_view(op, "indices", indices);
  params.main.topk_length = to_view(op, "topk_length", topk_length);
  params.extra.kv_cache = to_view(op, "extra_kv_cache", extra_kv_cache);
  params.extra.indices = to_view(op, "extra_indices", extra_indices);
  params.extra.topk_length = to_view(op, "extra_topk_length", extra_topk_length);
  params.attn_sink = to_view(op, "attn_sink", attn_sink);
  params.softmax_scale = softmax_scale;
  params.out = to_view(op, "out", out);
  params.lse = to_view(op, "lse", lse);
  params.lse_base = to_lse_base(lse_base2);
  params.workspace = to_view(op, "workspace", workspace);
  params.stream = to_stream(stream);
  return params;
}

openmla::WriteKvCacheParams write_kv_cache_params(nb::handle kv_c, nb::handle k_pe,
                                                 nb::handle slot_mapping, nb::handle kv_cache,
                                                 float scale, uintptr_t stream) {
  const char* op = "write_kv_cache";
  openmla::WriteKvCacheParams params;
  params.kv_c = to_view(op, "kv_c", kv_c);
  params.k_pe = to_view(op, "k_pe", k_pe);
  params.slot_mapping = to_view(op, "slot_mapping", slot_mapping);
  params.kv_cache = to_view(op, "kv_cache", kv_cache);
  params.scale = scale;
  params.stream = to_stream(stream);
  return params;
}

openmla::GatherDsMlaCacheParams gather_ds_mla_cache_params(nb::handle kv_cache,
                                                           nb::handle block_table,
                                                           nb::handle cu_seq_lens, nb::handle out,
                                                           uintptr_t stream) {
  const char* op = "gather_ds_mla_cache";
  openmla::GatherDsMlaCacheParams params;
  params.kv_cache = to_view(op, "kv_cache", kv_cache);
  params.block_table = to_view(op, "block_table", block_table);
  params.cu_seq_lens = to_view(op, "cu_seq_lens", cu_seq_lens);
  params.out = to_view(op, "out", out);
  params.stream = to_stream(stream);
  return params;
}

openmla::ConvertTopkIndicesParams convert_topk_indices_params(
    nb::handle local_indices, nb::handle request_ids, nb::handle block_table, int64_t page_size,
    nb::handle topk_length, nb::handle global_indices, uintptr_t stream) {
  const char* op = "convert_topk_indices";
  openmla::ConvertTopkIndicesParams params;
  params.local_indices = to_view(op, "local_indices", local_indices);
  params.request_ids = to_view(op, "request_ids", request_ids);
  params.block_table = to_view(op, "block_table", block_table);
  params.page_size = page_size;
  params.topk_length = to_view(op, "topk_length", topk_length);
  params.global_indices = to_view(op, "global_indices", global_indices);
  params.stream = to_stream(stream);
  return params;
}

openmla::PackKvQuantizeFp8Params pack_kv_quantize_fp8_params(nb::handle k_nope, nb::handle k_pe,
                                                             nb::handle v, float k_scale,
                                                             float v_scale, nb::handle k_out,
                                                             nb::handle v_out, uintptr_t stream) {
  const char* op = "pack_kv_quantize_fp8";
  openmla::PackKvQuantizeFp8Params params;
  params.k_nope = to_view(op, "k_nope", k_nope);
  params.k_pe = to_view(op, "k_pe", k_pe);
  params.v = to_view(op, "v", v);
  params.k_scale = k_scale;
  params.v_scale = v_scale;
  params.k_out = to_view(op, "k_out", k_out);
  params.v_out = to_view(op, "v_out", v_out);
  params.stream = to_stream(stream);
  return params;
}

openmla::MergeAttentionParams merge_attention_params(nb::handle out_a, nb::handle lse_a,
                                                     nb::handle out_b, nb::handle lse_b,
                                                     nb::handle out, nb::handle lse,
                                                     bool lse_base2, uintptr_t stream) {
  const char* op = "merge_attention";
  openmla::MergeAttentionParams params;
  params.out_a = to_view(op, "out_a", out_a);
  params.lse_a = to_view(op, "lse_a", lse_a);
  params.out_b = to_view(op, "out_b", out_b);
  params.lse_b = to_view(op, "lse_b", lse_b);
  params.out = to_view(op, "out", out);
  params.lse = to_view(op, "lse", lse);
  params.lse_base = to_lse_base(lse_base2);
  params.stream = to_stream(stream);
  return params;
}

void translate_error(const std::exception_ptr& pointer, void*) {
  try {
    std::rethrow_exception(pointer);
  } catch (const openmla::Error& error) {
    PyObject* type = PyExc_RuntimeError;
    if (error.kind() == ErrorKind::kInvalidArgument) type = PyExc_ValueError;
    if (error.kind() == ErrorKind::kNotImplemented) type = PyExc_NotImplementedError;
    PyErr_SetString(type, error.what());
  }
}

// Argument names as the params builders take them. Tensors default to None (absent) and the
// scalars to the params structs' defaults, so a workspace-size query passes only the inputs.
auto tensor(const char* name) { return nb::arg(name).none() = nb::none(); }
template <typename T>
auto scalar(const char* name, T value) { return nb::arg(name) = value; }

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "openmla C++ API; tensors are (data_ptr, dtype, shape, strides, device_type, "
            "device_index) tuples or None. Use the torch-facing functions of `openmla`.";
  nb::register_exception_translator(translate_error);

  m.def("version", [] { return std::string(openmla::version()); });
  m.def("cuda_available", &openmla::cuda_available);

  const auto stream = scalar<uintptr_t>("stream", 0);
  const auto lse_base2 = scalar("lse_base2", false);
  bind(m, "dense_prefill", &dense_prefill_params, &openmla::dense_prefill,
       "dense_prefill_workspace_size", &openmla::dense_prefill_workspace_size, tensor("q"),
       tensor("k"), tensor("v"), tensor("cu_seqlens_q"), tensor("cu_seqlens_kv"),
       scalar<int64_t>("max_seqlen_q", 0), scalar<int64_t>("max_seqlen_kv", 0),
       scalar("softmax_scale", 0.0f), scalar("causal", false), scalar("q_descale", 1.0f),
       scalar("k_descale", 1.0f), scalar("v_descale", 1.0f), tensor("out"), tensor("lse"),
       lse_base2, tensor("workspace"), stream);
  bind(m, "dense_decode", &dense_decode_params, &openmla::dense_decode,
       "dense_decode_workspace_size", &openmla::dense_decode_workspace_size, tensor("q"),
       tensor("kv_cache"), tensor("block_table"), tensor("seq_lens"),
       scalar("softmax_scale", 0.0f), scalar("causal", false), scalar("q_descale", 1.0f),
       scalar("kv_scale", 1.0f), tensor("out"), tensor("lse"), lse_base2, tensor("workspace"),
       stream, scalar("enable_pdl", false), scalar<int64_t>("max_seq_len", 0));
  bind(m, "sparse_prefill", &sparse_prefill_params, &openmla::sparse_prefill,
       "sparse_prefill_workspace_size", &openmla::sparse_prefill_workspace_size, tensor("q"),
       tensor("kv"), tensor("indices"), tensor("topk_length"), tensor("attn_sink"),
       scalar("softmax_scale", 0.0f), tensor("out"), tensor("lse"), tensor("max_logits"),
       lse_base2, tensor("workspace"), stream);
  bind(m, "sparse_decode", &sparse_decode_params, &openmla::sparse_decode,
       "sparse_decode_workspace_size", &openmla::sparse_decode_workspace_size, tensor("q"),
       tensor("kv_cache"), tensor("indices"), tensor("topk_length"), tensor("extra_kv_cache"),
       tensor("extra_indices"), tensor("extra_topk_length"), tensor("attn_sink"),
       scalar("softmax_scale", 0.0f), tensor("out"), tensor("lse"), lse_base2,
       tensor("workspace"), stream);

  // KV-cache utilities: no workspace.
  bind(m, "write_kv_cache", &write_kv_cache_params, &openmla::write_kv_cache, nullptr, nullptr,
       tensor("kv_c"), tensor("k_pe"), tensor("slot_mapping"), tensor("kv_cache"),
       scalar("scale", 1.0f), stream);
  bind(m, "gather_ds_mla_cache", &gather_ds_mla_cache_params, &openmla::gather_ds_mla_cache,
       nullptr, nullptr, tensor("kv_cache"), tensor("block_table"), tensor("cu_seq_lens"),
       tensor("out"), stream);
  bind(m, "convert_topk_indices", &convert_topk_indices_params, &openmla::convert_topk_indices,
       nullptr, nullptr, tensor("local_indices"), tensor("request_ids"), tensor("block_table"),
       scalar<int64_t>("page_size", 0), tensor("topk_length"), tensor("global_indices"), stream);
  bind(m, "pack_kv_quantize_fp8", &pack_kv_quantize_fp8_params, &openmla::pack_kv_quantize_fp8,
       nullptr, nullptr, tensor("k_nope"), tensor("k_pe"), tensor("v"), scalar("k_scale", 1.0f),
       scalar("v_scale", 1.0f), tensor("k_out"), tensor("v_out"), stream);
  bind(m, "merge_attention", &merge_attention_params, &openmla::merge_attention, nullptr,
       nullptr, tensor("out_a"), tensor("lse_a"), tensor("out_b"), tensor("lse_b"),
       tensor("out"), tensor("lse"), lse_base2, stream);
}
