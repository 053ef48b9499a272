// TensorView (the public API's strided view) -> View (the delta-rule kernels' four strides), and
// the argument fields both kernel paths share.
#pragma once

#include "core/problems.h"
#include "flashgrad/delta_rule.h"
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

// The inputs and sizes every launch of either path takes (RecurrentArgs, ChunkedArgs: the same
// field names), from the validated call.
template <typename Args>
void set_inputs_and_sizes(Args& a, const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  a.q = view_of(p.q);
  a.k = view_of(p.k);
  a.v = view_of(p.v);
  a.g = view_of(p.g);
  a.beta = view_of(p.beta);
  a.h0 = view_of(p.initial_state);
  a.T = pr.seq_len;
  a.H = pr.heads;
  a.HV = pr.value_heads;
  a.K = pr.key_dim;
  a.V = pr.value_dim;
  a.scale = pr.scale;
  a.l2norm = p.use_qk_l2norm_in_kernel;
}

}  // namespace flashgrad::cuda_detail::delta_rule
