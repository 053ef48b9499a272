// Compiled only when flashgrad is built without CUDA: every CUDA entry point reports that clearly
// instead of failing to link.
#include "backends.h"
#include "flashgrad/status.h"

namespace flashgrad {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(ErrorKind::unsupported, "device",
              std::string("flashgrad: ") + op +
                  ": argument 'device': tensors are on CUDA, but this build of flashgrad has no CUDA "
                  "backend (rebuild with nvcc available, or -DFLASHGRAD_CUDA=ON)");
}
}  // namespace

namespace backend {
bool cuda_built() { return false; }
void cuda_copy_to_host(void*, const void*, std::size_t, int, void*) { no_cuda("copy_to_host"); }
}  // namespace backend

namespace cuda {
void attention_forward(const AttentionParams&, const AttentionProblem&, const TensorView&,
                       const TensorView&, Workspace) { no_cuda("attention_forward"); }
void attention_backward(const AttentionParams&, const AttentionProblem&,
                        const AttentionBackwardInputs&, const TensorView&, const TensorView&,
                        const TensorView&, Workspace) { no_cuda("attention_backward"); }
std::size_t attention_workspace_bytes(const AttentionParams&, const AttentionProblem&, Pass) {
  no_cuda("attention_workspace_bytes");
}
void delta_rule_forward(const DeltaRuleParams&, const DeltaRuleProblem&,
                        const DeltaRuleForwardOutputs&, Workspace) { no_cuda("delta_rule_forward"); }
void delta_rule_backward(const DeltaRuleParams&, const DeltaRuleProblem&,
                         const DeltaRuleBackwardInputs&, const DeltaRuleGrads&, Workspace) {
  no_cuda("delta_rule_backward");
}
std::size_t delta_rule_workspace_bytes(const DeltaRuleParams&, const DeltaRuleProblem&, Pass, bool) {
  no_cuda("delta_rule_workspace_bytes");
}
bool delta_rule_keeps_v_new(const DeltaRuleParams&, const DeltaRuleProblem&) { no_cuda("delta_rule_keeps_v_new"); }
}  // namespace cuda
}  // namespace flashgrad
