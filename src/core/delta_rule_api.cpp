// Public gated-delta-rule entry points: validate once, then hand the call to the backend that
// owns the tensors' device.
#include "backends.h"
#include "delta_rule_validation.h"
#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"

#include <string>

namespace flashgrad {

const char* gate_kind_name(GateKind g) {
  switch (g) {
    case GateKind::none: return "none (plain delta rule)";
    case GateKind::scalar: return "scalar (GDN)";
    case GateKind::per_channel: return "per_channel (KDA)";
  }
  return "unknown";
}

GateKind delta_rule_gate_kind(const DeltaRuleParams& p) {
  return validate_delta_rule_inputs("delta_rule_gate_kind", p).gate;
}

namespace {
bool keeps_v_new(const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  return p.q.device == Device::cpu ? reference::delta_rule_keeps_v_new(p, pr) : cuda::delta_rule_keeps_v_new(p, pr);
}
}  // namespace

void delta_rule_forward(const DeltaRuleParams& p, const DeltaRuleForwardOutputs& out, Workspace ws) {
  const char* op = "delta_rule_forward";
  const DeltaRuleProblem pr = validate_delta_rule_inputs(op, p);
  validate_delta_rule_forward_outputs(op, p, pr, out, out.saved_v_new.present() && keeps_v_new(p, pr));
  if (p.q.device == Device::cpu)
    reference::delta_rule_forward(p, pr, out, ws);
  else
    cuda::delta_rule_forward(p, pr, out, ws);
}

void delta_rule_backward(const DeltaRuleParams& p, const DeltaRuleBackwardInputs& in,
                         const DeltaRuleGrads& grads, Workspace ws) {
  const char* op = "delta_rule_backward";
  const DeltaRuleProblem pr = validate_delta_rule_inputs(op, p);
  validate_delta_rule_backward_args(op, p, pr, in, grads, in.saved_v_new.present() && keeps_v_new(p, pr));
  if (p.q.device == Device::cpu)
    reference::delta_rule_backward(p, pr, in, grads, ws);
  else
    cuda::delta_rule_backward(p, pr, in, grads, ws);
}

bool delta_rule_keeps_v_new(const DeltaRuleParams& p) {
  return keeps_v_new(p, validate_delta_rule_inputs("delta_rule_keeps_v_new", p));
}

std::size_t delta_rule_workspace_bytes(const DeltaRuleParams& p, Pass pass, bool with_saved_v_new) {
  const char* op = "delta_rule_workspace_bytes";
  const DeltaRuleProblem pr = validate_delta_rule_inputs(op, p);
  if (with_saved_v_new && !keeps_v_new(p, pr))
    throw Error(ErrorKind::invalid_argument, "with_saved_v_new",
                std::string("flashgrad: ") + op + ": argument 'with_saved_v_new': these params keep no v_new "
                "(delta_rule_keeps_v_new() says false): pass false");
  return p.q.device == Device::cpu ? reference::delta_rule_workspace_bytes(p, pr, pass, with_saved_v_new)
                                   : cuda::delta_rule_workspace_bytes(p, pr, pass, with_saved_v_new);
}

}  // namespace flashgrad
