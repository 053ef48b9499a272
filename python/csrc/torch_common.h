// What the PyTorch ops share: at::Tensor -> flashgrad::TensorView, execution options for the
// tensors' device (CPU threads, CUDA stream), and flashgrad::Error -> the Python exception type.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>
#include <utility>

#include "flashgrad/common.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"

namespace flashgrad::torch_ops {

// A view of `t` (which must outlive it). The last dimension must already be contiguous or of
// size 1 (see last_dim_contiguous).
TensorView view(const at::Tensor& t);
// Absent view for a missing optional tensor.
TensorView view(const std::optional<at::Tensor>& t);

// `t` itself when its last dimension has stride 1 (or size <= 1), else a contiguous copy: the
// core reads rows with unit stride, other strides are free.
at::Tensor last_dim_contiguous(const at::Tensor& t);
std::optional<at::Tensor> last_dim_contiguous(const std::optional<at::Tensor>& t);

// CPU: torch's intra-op thread count; CUDA: the current stream of q's device. float64 inputs
// select the fp64 reference precision (used by gradient checks).
ExecutionOptions execution_options(const at::Tensor& q);

// A float scale argument of an op: None -> kDefaultScale (the core fills in its default).
float scale_or_default(const std::optional<double>& scale);

// Calls fn(); a flashgrad::Error becomes c10::ValueError (invalid_argument),
// c10::NotImplementedError (unsupported) or c10::Error (backend failure), which Python sees as
// ValueError, NotImplementedError and RuntimeError.
template <typename Fn>
auto translate_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::invalid_argument: TORCH_CHECK_VALUE(false, e.what());
      case ErrorKind::unsupported: TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
      case ErrorKind::backend_failure: break;
    }
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace flashgrad::torch_ops
