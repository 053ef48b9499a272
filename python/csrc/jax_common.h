// What the JAX FFI handlers share. A call's buffers arrive as XLA FFI "remaining" args / rets;
// the Python side (flashgrad/jax.py) passes only the tensors that are present and names them in
// order in two string attributes, "inputs" and "outputs" (comma-separated), so optional tensors
// need no dummies. Scalar options are further attributes (int64, float32, bool).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashgrad/common.h"
#include "flashgrad/tensor.h"
#include "xla/ffi/api/ffi.h"

namespace flashgrad::jax_ffi {

namespace ffi = xla::ffi;

// Where a call runs: the CPU, or a CUDA device with XLA's stream for this computation.
struct Place {
  Device device = Device::cpu;
  int device_index = 0;
  void* stream = nullptr;
};

// The buffers of one call by name; a name that was not passed gives an absent view.
class NamedViews {
 public:
  void add(std::string name, const TensorView& v) { views_.emplace_back(std::move(name), v); }
  TensorView operator[](std::string_view name) const;

 private:
  std::vector<std::pair<std::string, TensorView>> views_;
};

// One FFI call as the op functions see it.
struct Call {
  NamedViews in, out;
  const ffi::Dictionary* attrs = nullptr;
  ExecutionOptions exec;
  ffi::ScratchAllocator* scratch = nullptr;  // CUDA only

  // Attribute values; a missing or mistyped attribute is a flashgrad::Error naming it.
  int64_t int_attr(std::string_view name) const;
  float float_attr(std::string_view name) const;
  bool bool_attr(std::string_view name) const;
  // Scratch memory on the call's device: XLA's scratch allocator on CUDA; on the CPU, or when XLA
  // cannot provide it, an empty Workspace (the backend then allocates its own).
  Workspace workspace(std::size_t bytes) const;
};

using OpFn = void (*)(const Call&);

// Builds the Call and runs `op`; flashgrad::Error becomes an ffi::Error (invalid argument,
// unimplemented, internal), which JAX raises as an exception carrying the message.
ffi::Error run(OpFn op, const Place& place, ffi::RemainingArgs args, ffi::RemainingRets rets,
               const ffi::Dictionary& attrs, ffi::ScratchAllocator* scratch);

// The op functions (jax_attention.cpp, jax_delta_rule.cpp).
void attention_forward_op(const Call& c);
void attention_backward_op(const Call& c);
void delta_rule_forward_op(const Call& c);
void delta_rule_backward_op(const Call& c);

}  // namespace flashgrad::jax_ffi
