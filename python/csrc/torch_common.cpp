#include "torch_common.h"

#include <ATen/Parallel.h>

#include <cmath>

#ifdef FLASHGRAD_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace flashgrad::torch_ops {
namespace {

DType flashgrad_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kDouble: return DType::f64;
    case at::kFloat8_e4m3fn: return DType::e4m3;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default: break;
  }
  // Not a flashgrad dtype at all; the argument's name is only known to the core, so the message
  // names the dtype (the core's own dtype rules name the argument for every supported dtype).
  TORCH_CHECK_VALUE(false, "flashgrad: tensor dtype ", t.scalar_type(),
                    " is not supported (float32, float16, bfloat16, float64, float8_e4m3fn, int32, int64)");
}

Device flashgrad_device(const at::Tensor& t) {
  if (t.device().is_cpu()) return Device::cpu;
  if (t.device().is_cuda()) return Device::cuda;
  TORCH_CHECK_VALUE(false, "flashgrad: tensors on ", t.device(), " are not supported (cpu or cuda)");
}

}  // namespace

TensorView view(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() <= TensorView::kMaxRank, "flashgrad: tensor of rank ", t.dim(),
                    " has more than ", TensorView::kMaxRank, " dimensions");
  TensorView v;
  v.data = t.data_ptr();
  v.dtype = flashgrad_dtype(t);
  v.device = flashgrad_device(t);
  v.device_index = t.device().is_cuda() ? t.device().index() : 0;
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[d] = t.size(d);
    v.stride[d] = t.stride(d);
  }
  return v;
}

TensorView view(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? view(*t) : TensorView{};
}

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  if (t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) return t;
  return t.contiguous();
}

std::optional<at::Tensor> last_dim_contiguous(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return last_dim_contiguous(*t);
}

ExecutionOptions execution_options(const at::Tensor& q) {
  ExecutionOptions exec;
  exec.precision = q.scalar_type() == at::kDouble ? Precision::fp64 : Precision::fp32;
  if (q.device().is_cpu()) {
    exec.num_threads = at::get_num_threads();
  } else {
#ifdef FLASHGRAD_WITH_CUDA
    exec.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
#endif
  }
  return exec;
}

float scale_or_default(const std::optional<double>& scale) {
  return scale.has_value() ? static_cast<float>(*scale) : kDefaultScale;
}

}  // namespace flashgrad::torch_ops
