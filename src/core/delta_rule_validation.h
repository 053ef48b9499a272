// Validation of gated-delta-rule calls (docs/delta_rule.md), once for all backends. Each function
// throws flashgrad::Error naming the argument and the rule; none writes anything.
#pragma once

#include "problems.h"

namespace flashgrad {

// Checks q, k, v, g, beta, scale, initial_state, cu_seqlens; resolves the problem.
DeltaRuleProblem validate_delta_rule_inputs(const char* op, const DeltaRuleParams& p);
void validate_delta_rule_forward_outputs(const char* op, const DeltaRuleParams& p,
                                         const DeltaRuleProblem& pr,
                                         const DeltaRuleForwardOutputs& out, bool keeps_v_new);
void validate_delta_rule_backward_args(const char* op, const DeltaRuleParams& p,
                                       const DeltaRuleProblem& pr,
                                       const DeltaRuleBackwardInputs& in,
                                       const DeltaRuleGrads& grads, bool keeps_v_new);

}  // namespace flashgrad
