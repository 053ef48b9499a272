// Stand-in for the CPU delta-rule reference in the standalone GPU test build
// (tools/dev/delta_rule_build.sh) while src/reference/delta_rule does not build.
#include "core/backends.h"
#include "flashgrad/status.h"

namespace flashgrad::reference {
namespace {
[[noreturn]] void absent(const char* op) {
  throw Error(ErrorKind::unsupported, "", std::string("flashgrad: ") + op + ": CPU reference not linked (stub)");
}
}  // namespace
void delta_rule_forward(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleForwardOutputs&,
                        Workspace) { absent("delta_rule_forward"); }
void delta_rule_backward(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleBackwardInputs&,
                         const DeltaRuleGrads&, Workspace) { absent("delta_rule_backward"); }
std::size_t delta_rule_workspace_bytes(const DeltaRuleParams&, const DeltaRuleProblem&, Pass) {
  absent("delta_rule_workspace_bytes");
}
}  // namespace flashgrad::reference
