// JAX FFI op functions for the gated delta rule family.
// Buffers (by name): q, k, v, g, beta, initial_state, cu_seqlens; forward outputs o, final_state,
// saved_r, saved_v_new; backward inputs also dout, dht, saved_r, saved_v_new and outputs dq, dk, dv,
// dg, dbeta, dh0.
// saved_v_new ([B, T, HV, V], v's dtype) is a request, not a demand: JAX declares its buffers when it
// traces, before it knows which backend runs the call (a jit under jax.default_device(cpu) on a GPU
// machine), so both ops use the buffer only where the core keeps v_new for these params
// (delta_rule_keeps_v_new: the CUDA chunked path for GDN and the plain rule); elsewhere the forward
// leaves it unwritten and the backward ignores it, the same decision on both sides.
// Attributes: scale (float32, NaN = default), use_qk_l2norm_in_kernel (bool), algorithm (str:
// recurrent | chunked).
#include <string>

#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"
#include "jax_common.h"

namespace flashgrad::jax_ffi {
namespace {

DeltaRuleAlgorithm algorithm_of(const Call& c) {
  auto name = c.attrs->get<std::string_view>("algorithm");
  if (name.has_value() && *name == "recurrent") return DeltaRuleAlgorithm::recurrent;
  if (name.has_value() && *name == "chunked") return DeltaRuleAlgorithm::chunked;
  throw_invalid_argument("gated_delta_rule", "algorithm", "must be 'recurrent' or 'chunked'");
}

DeltaRuleParams params_of(const Call& c) {
  DeltaRuleParams p;
  p.q = c.in["q"];
  p.k = c.in["k"];
  p.v = c.in["v"];
  p.g = c.in["g"];
  p.beta = c.in["beta"];
  p.scale = c.float_attr("scale");
  p.initial_state = c.in["initial_state"];
  p.cu_seqlens = c.in["cu_seqlens"];
  p.use_qk_l2norm_in_kernel = c.bool_attr("use_qk_l2norm_in_kernel");
  p.algorithm = algorithm_of(c);
  p.exec = c.exec;
  return p;
}

}  // namespace

void delta_rule_forward_op(const Call& c) {
  const DeltaRuleParams p = params_of(c);
  DeltaRuleForwardOutputs out;
  out.o = c.out["o"];
  out.final_state = c.out["final_state"];
  out.saved_r = c.out["saved_r"];
  const bool kept = c.out["saved_v_new"].present() && delta_rule_keeps_v_new(p);
  if (kept) out.saved_v_new = c.out["saved_v_new"];
  const Workspace ws = c.scratch ? c.workspace(delta_rule_workspace_bytes(p, Pass::forward, kept)) : Workspace{};
  delta_rule_forward(p, out, ws);
}

void delta_rule_backward_op(const Call& c) {
  const DeltaRuleParams p = params_of(c);
  DeltaRuleBackwardInputs in;
  in.dout = c.in["dout"];
  in.dht = c.in["dht"];
  in.saved_r = c.in["saved_r"];
  const bool kept = c.in["saved_v_new"].present() && delta_rule_keeps_v_new(p);
  if (kept) in.saved_v_new = c.in["saved_v_new"];
  DeltaRuleGrads grads;
  grads.dq = c.out["dq"];
  grads.dk = c.out["dk"];
  grads.dv = c.out["dv"];
  grads.dg = c.out["dg"];
  grads.dbeta = c.out["dbeta"];
  grads.dh0 = c.out["dh0"];
  const Workspace ws = c.scratch ? c.workspace(delta_rule_workspace_bytes(p, Pass::backward, kept)) : Workspace{};
  delta_rule_backward(p, in, grads, ws);
}

}  // namespace flashgrad::jax_ffi
