// flashgrad: the gated delta rule family (GDN, KDA, plain delta rule), forward and backward
// (contract: docs/delta_rule.md; semantics and signatures follow flash-linear-attention).
//
// Shapes (fla's layout):
//   q, k [B, T, H, K]    v [B, T, HV, V]    beta [B, T, HV]    HV % H == 0 (value head j reads
//   q/k head j / (HV / H))
//   g: absent (plain delta rule), [B, T, HV] (GDN: one decay per head and step) or
//      [B, T, HV, K] (KDA: one decay per key channel); natural-log decay.
//   initial_state / final_state float32 [N, HV, K, V]; N = B, or the number of sequences of cu_seqlens.
//   cu_seqlens int32 or int64 [N+1], only with B == 1.
//   o [B, T, HV, V] in q's dtype.
// Recurrence per (sequence, value head), state S (K x V, float32):
//   S~ = diag(exp(g_t)) S;  r_t = v_t - S~^T k_t;  S = S~ + k_t (beta_t r_t)^T;  o_t = scale S^T q_t
#pragma once

#include "flashgrad/common.h"
#include "flashgrad/tensor.h"

namespace flashgrad {

enum class GateKind : int32_t { none, scalar /* GDN */, per_channel /* KDA */ };
const char* gate_kind_name(GateKind g);

// recurrent: step by step (fla's fused_recurrent_*); chunked: chunks of 64 with the UT/WY
// transform (fla's chunk_*). Both compute the same function.
enum class DeltaRuleAlgorithm : int32_t { recurrent, chunked };

struct DeltaRuleParams {
  TensorView q, k, v;
  TensorView g;     // optional; its rank picks the gate kind
  TensorView beta;  // required
  float scale = kDefaultScale;  // default K^-0.5
  TensorView initial_state;     // optional
  TensorView cu_seqlens;        // optional
  bool use_qk_l2norm_in_kernel = false;
  DeltaRuleAlgorithm algorithm = DeltaRuleAlgorithm::chunked;
  ExecutionOptions exec;
};

// The gate kind the params describe (validates g's rank).
GateKind delta_rule_gate_kind(const DeltaRuleParams& p);

struct DeltaRuleForwardOutputs {
  TensorView o;            // required
  TensorView final_state;  // optional (fla's output_final_state)
  // optional: the prediction errors r [B, T, HV, V], float32 (float64 with float64 inputs; a 16-bit
  // r costs KDA's dg its accuracy bar, so it is refused). The recurrent backward
  // reads them instead of re-running the forward; pass the same tensor to delta_rule_backward.
  TensorView saved_r;
  // optional: beta_t r_t [B, T, HV, V] in v's dtype (dense, contiguous), what the chunked algorithm
  // calls v_new. Taken only where delta_rule_keeps_v_new(p) says so (the CUDA chunked path, GDN or
  // the plain delta rule, 16-bit inputs); refused elsewhere. Pass the same tensor to
  // delta_rule_backward: it then rebuilds the chunk states from it (chunk-parallel) instead of
  // re-running the forward's serial state pass. Costs one tensor the size of v held from the forward
  // to the backward (the backward then allocates none of its own).
  TensorView saved_v_new;
};

// Whether delta_rule_forward / delta_rule_backward take saved_v_new for these params (validates them).
bool delta_rule_keeps_v_new(const DeltaRuleParams& p);

void delta_rule_forward(const DeltaRuleParams& p, const DeltaRuleForwardOutputs& out,
                        Workspace workspace = {});

struct DeltaRuleBackwardInputs {
  TensorView dout;     // [B, T, HV, V], q's dtype
  TensorView dht;      // optional, float32 [N, HV, K, V]: gradient of final_state
  TensorView saved_r;  // optional: what delta_rule_forward saved
  TensorView saved_v_new;  // optional: what delta_rule_forward kept (see DeltaRuleForwardOutputs)
};

struct DeltaRuleGrads {
  TensorView dq, dk, dv;  // shapes and dtypes of q, k, v
  TensorView dg;          // shape of g (required when g is present; absent otherwise)
  TensorView dbeta;       // shape of beta
  TensorView dh0;         // optional, float32 [N, HV, K, V] (only meaningful with initial_state)
};

void delta_rule_backward(const DeltaRuleParams& p, const DeltaRuleBackwardInputs& in,
                         const DeltaRuleGrads& grads, Workspace workspace = {});

// `with_saved_v_new`: the call will pass saved_v_new (delta_rule_keeps_v_new(p) must hold); the
// chunked path then needs no scratch for v_new.
std::size_t delta_rule_workspace_bytes(const DeltaRuleParams& p, Pass pass, bool with_saved_v_new = false);

}  // namespace flashgrad
