// The backend interface: one function per op and pass, in a namespace per backend. The public
// entry points (src/core/*_api.cpp) validate, then call the backend that owns the tensors' device.
// The CUDA functions exist only in a CUDA build; src/core/cuda_absent.cpp stands in otherwise
// and reports that flashgrad was built without CUDA.
#pragma once

#include <cstddef>

#include "problems.h"

namespace flashgrad::backend {

// Whether this build of flashgrad contains the CUDA backend.
bool cuda_built();
// cudaMemcpyAsync device-to-host + stream sync; errors become flashgrad::Error.
void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes, int device_index, void* stream);

}  // namespace flashgrad::backend

// One namespace per backend with the same three functions per op family: forward, backward and
// the workspace query.
#define FLASHGRAD_DECLARE_BACKEND(NS)                                                              \
  namespace flashgrad::NS {                                                                        \
  void attention_forward(const AttentionParams& p, const AttentionProblem& pr,                     \
                         const TensorView& out, const TensorView& lse, Workspace ws);              \
  void attention_backward(const AttentionParams& p, const AttentionProblem& pr,                    \
                          const AttentionBackwardInputs& in, const TensorView& dq,                 \
                          const TensorView& dk, const TensorView& dv, Workspace ws);               \
  std::size_t attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr,      \
                                        Pass pass);                                                \
  void delta_rule_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,                    \
                          const DeltaRuleForwardOutputs& out, Workspace ws);                       \
  void delta_rule_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,                   \
                           const DeltaRuleBackwardInputs& in, const DeltaRuleGrads& grads,         \
                           Workspace ws);                                                          \
  std::size_t delta_rule_workspace_bytes(const DeltaRuleParams& p, const DeltaRuleProblem& pr,     \
                                         Pass pass, bool with_saved_v_new);                        \
  bool delta_rule_keeps_v_new(const DeltaRuleParams& p, const DeltaRuleProblem& pr);               \
  }

FLASHGRAD_DECLARE_BACKEND(reference)
FLASHGRAD_DECLARE_BACKEND(cuda)
