// TensorView (the public API's strided view) -> View (the delta-rule kernels' four strides).
#pragma once

#include "flashgrad/tensor.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Rank <= 4; missing trailing dims get stride 0 (the last one 1). Null view for an absent tensor.
inline View view_of(const TensorView& t) {
  View v;
  if (!t.present()) return v;
  v.p = t.data;
  v.s0 = t.rank > 0 ? t.stride[0] : 0;
  v.s1 = t.rank > 1 ? t.stride[1] : 0;
  v.s2 = t.rank > 2 ? t.stride[2] : 0;
  v.s3 = t.rank > 3 ? t.stride[3] : 1;
  v.f32 = t.dtype == DType::f32;
  return v;
}

}  // namespace flashgrad::cuda_detail::delta_rule
