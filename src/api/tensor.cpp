// TensorView and Error: the vocabulary types of the public API.
#include <sstream>

#include "openmla/error.h"
#include "openmla/tensor.h"

namespace openmla {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat8E4M3:
    case DType::kUInt8: return 1;
  }
  return 0;
}

std::string device_name(Device device) {
  return device.type == DeviceType::kCPU ? std::string("cpu")
                                         : "cuda:" + std::to_string(device.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = int(shape.size());
  if (view.rank > kMaxRank) {
    throw Error(ErrorKind::kInvalidArgument, "TensorView", "shape",
                "expected rank <= " + std::to_string(kMaxRank));
  }
  int dim = 0;
  for (int64_t extent : shape) view.shape[dim++] = extent;
  int64_t stride = 1;
  for (dim = view.rank - 1; dim >= 0; --dim) {
    view.strides[dim] = stride;
    stride *= view.shape[dim];
  }
  return view;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  if (shape.size() != strides.size()) {
    throw Error(ErrorKind::kInvalidArgument, "TensorView", "strides",
                "expected as many strides as dimensions");
  }
  TensorView view = contiguous(data, dtype, shape, device);
  int dim = 0;
  for (int64_t stride : strides) view.strides[dim++] = stride;
  return view;
}

int64_t TensorView::numel() const {
  if (rank < 0) return 0;
  int64_t count = 1;
  for (int dim = 0; dim < rank; ++dim) count *= shape[dim];
  return count;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int dim = rank - 1; dim >= 0; --dim) {
    if (shape[dim] != 1 && strides[dim] != expected) return false;
    expected *= shape[dim];
  }
  return true;
}

std::string TensorView::shape_string() const {
  if (rank < 0) return "(absent)";
  std::ostringstream text;
  text << '[';
  for (int dim = 0; dim < rank; ++dim) text << (dim ? ", " : "") << shape[dim];
  text << ']';
  return text.str();
}

static std::string error_message(const std::string& op, const std::string& argument,
                                 const std::string& detail) {
  std::string message = "openmla." + op;
  if (!argument.empty()) message += ": argument '" + argument + "'";
  return message + ": " + detail;
}

Error::Error(ErrorKind kind, std::string op, std::string argument, const std::string& detail)
    : std::runtime_error(error_message(op, argument, detail)),
      kind_(kind),
      op_(std::move(op)),
      argument_(std::move(argument)) {}

}  // namespace openmla
