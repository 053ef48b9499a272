// The recurrent (step-by-step) delta rule on the CPU: forward, and the two-pass backward of
// docs/delta_rule.md that keeps only O(K*V) state per (sequence, value head) and never runs the
// state backwards.
//
// Workspace (in Reals, Real = float or double, laid out by RecurrentWorkspace):
//   forward : per worker, the state S (K*V) and step vectors.
//   backward: per worker, S and dS (2*K*V), step vectors, and for the (sequence, value head) it
//             is on, with L = the longest sequence's steps:
//               rd [L, V]   r (recomputed when saved_r is absent), then overwritten by dr
//               dk [L, K]   (HV == H) the value head's dk: its first part (dS u) is formed in
//                           pass 1 and only finished in pass 2, so it must outlive pass 1
//             GVA (HV > H) instead shares dk_part, dq_part [B, T, HV, K]: each value head's dk
//             and dq, summed over a q/k head's value heads in a fixed order after the passes.
//             With HV == H pass 2 finishes dq and dk of a step and writes them.
// So the backward needs O(K*V + L*(V + K)) per worker, plus two tensors of k per value head
// with GVA; nothing of size T*K*V.
#pragma once

#include <cstdint>

#include "core/problems.h"

namespace flashgrad::reference::delta_rule {

struct RecurrentWorkspace {
  bool gva = false;                   // HV > H: dq, dk go through per-value-head partials
  int64_t dk_part = 0, dq_part = 0;   // GVA backward: offsets (Reals) of the shared partials
  int64_t rd = 0, dk_item = 0;        // backward: offsets inside a worker's block
  int64_t per_worker = 0;             // Reals per worker block
  int64_t workers_begin = 0;          // offset of worker 0's block
  int64_t total = 0;                  // Reals in all

  static RecurrentWorkspace make(const DeltaRuleProblem& pr, Pass pass, int workers);
};

// Number of parallel work items ((sequence, value head) pairs) and the workers used for them.
int recurrent_workers(const DeltaRuleParams& p, const DeltaRuleProblem& pr);

template <typename Real>
void recurrent_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                       const DeltaRuleForwardOutputs& out, Real* workspace);

template <typename Real>
void recurrent_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                        const DeltaRuleBackwardInputs& in, const DeltaRuleGrads& grads, Real* workspace);

}  // namespace flashgrad::reference::delta_rule
