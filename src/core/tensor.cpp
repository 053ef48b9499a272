// TensorView helpers: sizes, names, contiguity, descriptions for error messages.
#include "flashgrad/tensor.h"

#include <sstream>

namespace flashgrad {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::e4m3: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::e4m3: return "float8_e4m3fn";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "unknown";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       std::initializer_list<int64_t> strides_, Device device_, int device_index_)
    : data(data_), dtype(dtype_), device(device_), device_index(device_index_) {
  rank = static_cast<int>(shape_.size());
  int i = 0;
  for (int64_t s : shape_) shape[i++] = s;
  if (strides_.size() == shape_.size()) {
    i = 0;
    for (int64_t s : strides_) stride[i++] = s;
  } else {
    int64_t running = 1;
    for (int d = rank - 1; d >= 0; --d) {
      stride[d] = running;
      running *= shape[d];
    }
  }
}

int64_t TensorView::numel() const {
  if (rank < 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t running = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != running) return false;
    running *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  if (!present()) return "absent";
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << shape[d];
  os << "] " << dtype_name(dtype) << " on " << device_name(device);
  return os.str();
}

}  // namespace flashgrad
