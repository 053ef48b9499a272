// Public softmax-attention entry points: validate once, then hand the call to the backend that
// owns the tensors' device.
#include "attention_validation.h"
#include "backends.h"
#include "flashgrad/attention.h"

namespace flashgrad {

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::none: return "none";
    case MaskKind::causal: return "causal";
    case MaskKind::sliding_window: return "sliding_window";
    case MaskKind::prefix_lm: return "prefix_lm";
    case MaskKind::candidate_isolation: return "candidate_isolation";
  }
  return "unknown";
}

const char* softcap_method_name(SoftcapMethod m) {
  switch (m) {
    case SoftcapMethod::tanh: return "tanh";
    case SoftcapMethod::soft_sign: return "soft_sign";
  }
  return "unknown";
}

void attention_forward(const AttentionParams& p, const TensorView& out, const TensorView& lse,
                       Workspace ws) {
  const char* op = "attention_forward";
  const AttentionProblem pr = validate_attention_inputs(op, p);
  validate_attention_forward_outputs(op, p, pr, out, lse);
  if (p.q.device == Device::cpu)
    reference::attention_forward(p, pr, out, lse, ws);
  else
    cuda::attention_forward(p, pr, out, lse, ws);
}

void attention_backward(const AttentionParams& p, const AttentionBackwardInputs& in,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        Workspace ws) {
  const char* op = "attention_backward";
  const AttentionProblem pr = validate_attention_inputs(op, p);
  validate_attention_backward_args(op, p, pr, in, dq, dk, dv);
  if (p.q.device == Device::cpu)
    reference::attention_backward(p, pr, in, dq, dk, dv, ws);
  else
    cuda::attention_backward(p, pr, in, dq, dk, dv, ws);
}

std::size_t attention_workspace_bytes(const AttentionParams& p, Pass pass) {
  const AttentionProblem pr = validate_attention_inputs("attention_workspace_bytes", p);
  return p.q.device == Device::cpu ? reference::attention_workspace_bytes(p, pr, pass)
                                   : cuda::attention_workspace_bytes(p, pr, pass);
}

}  // namespace flashgrad
