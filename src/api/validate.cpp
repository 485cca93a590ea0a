#include "validate.h"

#include "openmla/numerics.h"

#include <cfloat>
#include <cmath>
#include <vector>

namespace openmla {

namespace {
std::string dim_name(const TensorView& tensor, int dim) {
  int resolved = dim < 0 ? dim + tensor.rank : dim;
  return "dimension " + std::to_string(resolved);
}
}  // namespace

void ArgumentChecker::fail(const char* argument, const std::string& detail) const {
  throw Error(ErrorKind::kInvalidArgument, op_, argument, detail);
}

void ArgumentChecker::not_implemented(const std::string& detail) const {
  throw Error(ErrorKind::kNotImplemented, op_, "", detail);
}

void ArgumentChecker::required(const char* argument, const TensorView& tensor) const {
  if (!tensor.present()) fail(argument, "is required but was not given");
  if (tensor.data == nullptr && tensor.numel() > 0) fail(argument, "has a null data pointer");
}

void ArgumentChecker::dtype(const char* argument, const TensorView& tensor,
                            std::initializer_list<DType> allowed) const {
  for (DType candidate : allowed) {
    if (tensor.dtype == candidate) return;
  }
  std::string names;
  for (DType candidate : allowed) names += std::string(names.empty() ? "" : " or ") + dtype_name(candidate);
  fail(argument, "expected dtype " + names + ", got " + dtype_name(tensor.dtype));
}

void ArgumentChecker::same_dtype(const char* argument, const TensorView& tensor,
                                 const char* other_argument, const TensorView& other) const {
  if (tensor.dtype != other.dtype) {
    fail(argument, std::string("expected the same dtype as '") + other_argument + "' (" +
                       dtype_name(other.dtype) + "), got " + dtype_name(tensor.dtype));
  }
}

void ArgumentChecker::rank(const char* argument, const TensorView& tensor, int expected) const {
  if (tensor.rank != expected) {
    fail(argument, "expected rank " + std::to_string(expected) + ", got rank " +
                       std::to_string(tensor.rank) + " (shape " + tensor.shape_string() + ")");
  }
}

void ArgumentChecker::size(const char* argument, const TensorView& tensor, int dim,
                           int64_t expected, const char* meaning) const {
  if (tensor.size(dim) != expected) {
    fail(argument, "expected " + dim_name(tensor, dim) + " (" + meaning + ") to be " +
                       std::to_string(expected) + ", got " + std::to_string(tensor.size(dim)) +
                       " (shape " + tensor.shape_string() + ")");
  }
}

void ArgumentChecker::same_size(const char* argument, const TensorView& tensor, int dim,
                                const char* other_argument, const TensorView& other,
                                int other_dim, const char* meaning) const {
  if (tensor.size(dim) != other.size(other_dim)) {
    fail(argument, "expected " + dim_name(tensor, dim) + " (" + meaning + ") to match '" +
                       other_argument + "' " + dim_name(other, other_dim) + " = " +
                       std::to_string(other.size(other_dim)) + ", got " +
                       std::to_string(tensor.size(dim)));
  }
}

void ArgumentChecker::last_dim_contiguous(const char* argument, const TensorView& tensor) const {
  if (tensor.rank > 0 && tensor.size(-1) > 1 && tensor.stride(-1) != 1) {
    fail(argument, "expected a contiguous last dimension (stride 1), got stride " +
                       std::to_string(tensor.stride(-1)));
  }
}

void ArgumentChecker::positive_finite(const char* argument, float value) const {
  // At least FLT_MIN (normal), so that kernels may use its reciprocal, which stays finite.
  if (!(value >= FLT_MIN) || !std::isfinite(value)) {
    fail(argument, "expected a positive, finite, normal float, got " + std::to_string(value));
  }
}

void ArgumentChecker::power_of_two(const char* argument, int64_t value, int64_t min,
                                   int64_t max) const {
  bool is_power = value > 0 && (value & (value - 1)) == 0;
  if (!is_power || value < min || value > max) {
    fail(argument, "expected a power of two in [" + std::to_string(min) + ", " +
                       std::to_string(max) + "], got " + std::to_string(value));
  }
}

void ArgumentChecker::cu_seqlens(const char* argument, const TensorView& tensor, int64_t batch,
                                 int64_t total) const {
  required(argument, tensor);
  dtype(argument, tensor, {DType::kInt32});
  rank(argument, tensor, 1);
  if (tensor.size(0) != batch + 1) {
    fail(argument, "expected length batch + 1 = " + std::to_string(batch + 1) + ", got " +
                       std::to_string(tensor.size(0)));
  }
  if (tensor.is_cuda()) return;  // device-resident values are trusted (documented ranges)
  const int32_t* values = tensor.ptr<const int32_t>();
  int64_t stride = tensor.stride(0);
  if (values[0] != 0) fail(argument, "expected to start at 0, got " + std::to_string(values[0]));
  for (int64_t i = 1; i <= batch; ++i) {
    if (values[i * stride] < values[(i - 1) * stride]) {
      fail(argument, "expected non-decreasing values, but entry " + std::to_string(i) + " (" +
                         std::to_string(values[i * stride]) + ") < entry " +
                         std::to_string(i - 1) + " (" +
                         std::to_string(values[(i - 1) * stride]) + ")");
    }
  }
  if (values[batch * stride] > total) {
    fail(argument, "expected the last entry <= " + std::to_string(total) +
                       " (rows of the packed tensor), got " +
                       std::to_string(values[batch * stride]));
  }
}

void ArgumentChecker::workspace(const TensorView& workspace, size_t needed_bytes) const {
  if (needed_bytes == 0) return;
  if (!workspace.present()) {
    fail("workspace", "is required: " + std::to_string(needed_bytes) + " bytes");
  }
  size_t bytes = size_t(workspace.numel()) * dtype_size(workspace.dtype);
  if (!workspace.is_contiguous()) fail("workspace", "expected a contiguous buffer");
  if (bytes < needed_bytes) {
    fail("workspace", "expected at least " + std::to_string(needed_bytes) +
                          " bytes (the workspace-size query), got " + std::to_string(bytes));
  }
}

Device ArgumentChecker::common_device(
    std::initializer_list<std::pair<const char*, const TensorView*>> tensors) const {
  const char* first_name = nullptr;
  Device first{};
  for (const auto& [name, tensor] : tensors) {
    if (!tensor->present()) continue;
    if (first_name == nullptr) {
      first_name = name;
      first = tensor->device;
    } else if (tensor->device != first) {
      fail(name, "expected the same device as '" + std::string(first_name) + "' (" +
                     device_name(first) + "), got " + device_name(tensor->device));
    }
  }
  return first;
}

void check_decode_outputs(const ArgumentChecker& check, const TensorView& out, const TensorView& lse,
                          int64_t batch, int64_t query_tokens, int64_t heads) {
  check.required("out", out);
  check.dtype("out", out, {DType::kBFloat16});
  check.rank("out", out, 4);
  check.size("out", out, 0, batch, "batch, from q");
  check.size("out", out, 1, query_tokens, "query tokens, from q");
  check.size("out", out, 2, heads, "heads, from q");
  check.size("out", out, 3, kLatentDim, "value dim");
  check.last_dim_contiguous("out", out);
  if (!lse.present()) return;
  check.dtype("lse", lse, {DType::kFloat32});
  check.rank("lse", lse, 3);
  check.size("lse", lse, 0, batch, "batch, from q");
  check.size("lse", lse, 1, query_tokens, "query tokens, from q");
  check.size("lse", lse, 2, heads, "heads, from q");
}

TensorView drop_single_head_dim(const ArgumentChecker& check, const char* argument,
                                const TensorView& cache) {
  if (cache.rank == 3) return cache;
  if (cache.rank != 4) {
    check.fail(argument, "expected rank 3 [pages, page_size, dim] or 4 [pages, page_size, 1, "
                         "dim], got rank " + std::to_string(cache.rank));
  }
  check.size(argument, cache, 2, 1, "kv heads");
  TensorView squeezed = cache;
  squeezed.rank = 3;
  squeezed.shape[2] = cache.shape[3];
  squeezed.strides[2] = cache.strides[3];
  return squeezed;
}

}  // namespace openmla
