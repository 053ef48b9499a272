// flashgrad: a non-owning strided tensor view.
//
// flashgrad never allocates or owns user tensors. A TensorView is a pointer plus dtype, device,
// shape and strides (in elements, not bytes). Bindings (PyTorch, JAX, C) build views from their
// own tensors; the core validates them and the backends read raw pointers and strides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashgrad {

enum class DType : int32_t { f32, f16, bf16, f64, e4m3, i32, i64 };
enum class Device : int32_t { cpu, cuda };

// Bytes per element.
std::size_t dtype_size(DType t);
// "float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "int32", "int64".
const char* dtype_name(DType t);
const char* device_name(Device d);

struct TensorView {
  static constexpr int kMaxRank = 6;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int rank = -1;  // -1: absent (an optional argument the caller did not pass)
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements

  TensorView() = default;
  // A view with the given shape and strides; strides default to contiguous (row-major).
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides = {}, Device device = Device::cpu,
             int device_index = 0);

  bool present() const { return rank >= 0; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  int64_t numel() const;
  // True when the strides are exactly row-major for the shape (size-1 dims ignored).
  bool is_contiguous() const;
  // "[2, 128, 16, 64] bfloat16 on cpu"
  std::string describe() const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace flashgrad
