// Validation of softmax-attention calls: every rule of docs/attention.md that can be checked
// before running, once for all backends. Each function throws flashgrad::Error naming the
// argument and the rule; none writes anything.
#pragma once

#include "problems.h"

namespace flashgrad {

// Checks q, k, v, cu_seqlens, mask and softcap parameters, fp8 descales; resolves the problem.
AttentionProblem validate_attention_inputs(const char* op, const AttentionParams& p);
// Checks out (required) and lse (optional) against the resolved problem.
void validate_attention_forward_outputs(const char* op, const AttentionParams& p,
                                        const AttentionProblem& pr, const TensorView& out,
                                        const TensorView& lse);
// Checks out, lse, dout, dlse, z_loss_weight and dq, dk, dv.
void validate_attention_backward_args(const char* op, const AttentionParams& p,
                                      const AttentionProblem& pr, const AttentionBackwardInputs& in,
                                      const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv);

}  // namespace flashgrad
