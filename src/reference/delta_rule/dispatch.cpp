// The CPU reference backend's delta-rule entry points: pick the compute precision (double with
// Precision::fp64 or float64 inputs, float otherwise) and the algorithm, and hand out workspace.
#include <cstdint>
#include <memory>
#include <string>

#include "chunked.h"
#include "core/backends.h"
#include "flashgrad/status.h"
#include "recurrent.h"

namespace flashgrad::reference {
namespace {

using delta_rule::RecurrentWorkspace;

bool compute_in_double(const DeltaRuleParams& p) {
  return p.exec.precision == Precision::fp64 || p.q.dtype == DType::f64;
}

// Reals of workspace a call needs (the chunked path allocates its per-head buffers itself).
int64_t workspace_reals(const DeltaRuleParams& p, const DeltaRuleProblem& pr, Pass pass) {
  if (p.algorithm == DeltaRuleAlgorithm::chunked) return 0;
  return RecurrentWorkspace::make(pr, pass, delta_rule::recurrent_workers(p, pr)).total;
}

constexpr std::size_t kAlign = 64;  // slack so a caller's pointer can be aligned up

// Runs fn(Real* workspace) on the caller's workspace when it is big enough, else on our own.
template <typename Real, typename Fn>
void with_workspace(const char* op, int64_t reals, Workspace ws, Fn&& fn) {
  const std::size_t need = static_cast<std::size_t>(reals) * sizeof(Real) + kAlign;
  if (ws.data != nullptr) {
    if (ws.bytes < need)
      throw_invalid_argument(op, "workspace",
                             "must hold at least " + std::to_string(need) +
                                 " bytes (delta_rule_workspace_bytes), got " + std::to_string(ws.bytes));
    auto addr = reinterpret_cast<std::uintptr_t>(ws.data);
    addr = (addr + kAlign - 1) / kAlign * kAlign;
    fn(reinterpret_cast<Real*>(addr));
    return;
  }
  std::unique_ptr<Real[]> own(new Real[static_cast<std::size_t>(reals > 0 ? reals : 1)]);
  fn(own.get());
}

template <typename Real>
void forward_in(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out,
                Workspace ws) {
  if (p.algorithm == DeltaRuleAlgorithm::chunked) {
    delta_rule::chunked_forward<Real>(p, pr, out);
    return;
  }
  with_workspace<Real>("delta_rule_forward", workspace_reals(p, pr, Pass::forward), ws,
                       [&](Real* w) { delta_rule::recurrent_forward<Real>(p, pr, out, w); });
}

template <typename Real>
void backward_in(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                 const DeltaRuleGrads& grads, Workspace ws) {
  if (p.algorithm == DeltaRuleAlgorithm::chunked) {
    delta_rule::chunked_backward<Real>(p, pr, in, grads);
    return;
  }
  with_workspace<Real>("delta_rule_backward", workspace_reals(p, pr, Pass::backward), ws,
                       [&](Real* w) { delta_rule::recurrent_backward<Real>(p, pr, in, grads, w); });
}

}  // namespace

void delta_rule_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                        const DeltaRuleForwardOutputs& out, Workspace ws) {
  if (compute_in_double(p))
    forward_in<double>(p, pr, out, ws);
  else
    forward_in<float>(p, pr, out, ws);
}

void delta_rule_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                         const DeltaRuleBackwardInputs& in, const DeltaRuleGrads& grads, Workspace ws) {
  if (compute_in_double(p))
    backward_in<double>(p, pr, in, grads, ws);
  else
    backward_in<float>(p, pr, in, grads, ws);
}

std::size_t delta_rule_workspace_bytes(const DeltaRuleParams& p, const DeltaRuleProblem& pr, Pass pass, bool) {
  const int64_t reals = workspace_reals(p, pr, pass);
  return static_cast<std::size_t>(reals) * (compute_in_double(p) ? sizeof(double) : sizeof(float)) + kAlign;
}

// The CPU reference recomputes everything its backward needs: it keeps no v_new.
bool delta_rule_keeps_v_new(const DeltaRuleParams&, const DeltaRuleProblem&) { return false; }

}  // namespace flashgrad::reference
