// The compute type of the reference attention passes and the softmax scale in it.
#pragma once

#include <cmath>

#include "core/problems.h"

namespace flashgrad::reference::attn {

// Double for float64 inputs or when fp64 precision is requested; else float (fp32 accumulation,
// what the GPU kernels promise).
inline bool computes_in_double(const AttentionParams& p) {
  return p.exec.precision == Precision::fp64 || p.q.dtype == DType::f64;
}

// The default 1/sqrt(D) evaluated in T: AttentionProblem::scale holds it rounded to float, which
// would cost fp64 gradient checks 8 digits. An explicit scale is taken as given.
template <typename T>
T softmax_scale(const AttentionParams& p, const AttentionProblem& pr) {
  if (std::isnan(p.scale)) return T(1) / std::sqrt(static_cast<T>(pr.head_dim));
  return static_cast<T>(pr.scale);
}

}  // namespace flashgrad::reference::attn
