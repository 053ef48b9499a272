// Validation of gated-delta-rule calls (docs/delta_rule.md, "Validation"). Every rule throws
// flashgrad::Error naming the argument before any output is touched; the backends then trust the
// resolved DeltaRuleProblem.
#include "delta_rule_validation.h"

#include <cmath>
#include <string>
#include <vector>

#include "checks.h"

namespace flashgrad {
namespace {

using checks::Checker;

const std::initializer_list<DType> kFloatDTypes = {DType::f32, DType::f16, DType::bf16, DType::f64};

// States (initial_state, final_state, dht, dh0) are float32, as in fla; float64 is accepted too
// when q is float64, so that a float64 gradient check can run end to end.
void check_state_dtype(const Checker& c, const TensorView& t, const std::string& arg,
                       const TensorView& q) {
  if (q.dtype == DType::f64)
    c.dtype(t, arg, {DType::f32, DType::f64});
  else
    c.dtype(t, arg, {DType::f32});
}

// g, beta: float32 or q's dtype.
void check_f32_or_q_dtype(const Checker& c, const TensorView& t, const std::string& arg,
                          const TensorView& q) {
  if (t.dtype == DType::f32 || t.dtype == q.dtype) return;
  c.fail(arg, std::string("dtype must be float32 or q's dtype (") + dtype_name(q.dtype) + "), got " +
                  dtype_name(t.dtype));
}

std::vector<int64_t> state_shape(const DeltaRuleProblem& pr) {
  return {pr.num_seqs, pr.value_heads, pr.key_dim, pr.value_dim};
}
std::vector<int64_t> v_shape(const DeltaRuleProblem& pr) {
  return {pr.batch, pr.seq_len, pr.value_heads, pr.value_dim};
}

void check_cu_seqlens(const Checker& c, const DeltaRuleParams& p, DeltaRuleProblem& pr) {
  const TensorView& cu = p.cu_seqlens;
  c.tensor(cu, "cu_seqlens", {1});
  c.dtype(cu, "cu_seqlens", {DType::i32, DType::i64});
  c.require(cu.device == Device::cpu || (cu.device == p.q.device && cu.device_index == p.q.device_index),
            "cu_seqlens", "must be on the CPU or on q's device");
  c.require(pr.batch == 1, "cu_seqlens",
            "requires batch size 1 (sequences are packed along T), got q with batch " +
                std::to_string(pr.batch));
  c.require(cu.shape[0] >= 2, "cu_seqlens",
            "must have at least 2 entries (N + 1 for N >= 1 sequences), got " +
                std::to_string(cu.shape[0]));
  std::vector<int64_t> v = checks::read_index_tensor(c, cu, "cu_seqlens", p.exec.stream);
  c.require(v[0] == 0, "cu_seqlens", "must start at 0, got " + std::to_string(v[0]));
  for (size_t i = 1; i < v.size(); ++i)
    c.require(v[i] >= v[i - 1], "cu_seqlens",
              "must be non-decreasing (entry " + std::to_string(i) + " = " + std::to_string(v[i]) +
                  " < entry " + std::to_string(i - 1) + " = " + std::to_string(v[i - 1]) + ")");
  c.require(v.back() == pr.seq_len, "cu_seqlens",
            "last entry must equal the packed length T = " + std::to_string(pr.seq_len) +
                " of q, got " + std::to_string(v.back()));
  pr.varlen = true;
  pr.num_seqs = static_cast<int64_t>(v.size()) - 1;
  pr.cu_seqlens = std::move(v);
}

}  // namespace

DeltaRuleProblem validate_delta_rule_inputs(const char* op, const DeltaRuleParams& p) {
  const Checker c{op};
  DeltaRuleProblem pr;

  // q, k, v: rank 4, same floating dtype, same device.
  c.tensor(p.q, "q", {4});
  c.dtype(p.q, "q", kFloatDTypes);
  c.tensor(p.k, "k", {4});
  c.same_dtype(p.k, "k", p.q, "q");
  c.same_device(p.k, "k", p.q, "q");
  c.tensor(p.v, "v", {4});
  c.same_dtype(p.v, "v", p.q, "q");
  c.same_device(p.v, "v", p.q, "q");

  pr.batch = p.q.shape[0];
  pr.seq_len = p.q.shape[1];
  pr.heads = p.q.shape[2];
  pr.key_dim = p.q.shape[3];
  pr.value_heads = p.v.shape[2];
  pr.value_dim = p.v.shape[3];
  pr.num_seqs = pr.batch;
  c.require(pr.heads > 0, "q", "must have at least one head, got shape " + checks::shape_string(p.q));
  c.require(pr.key_dim > 0, "q", "must have a key dimension K > 0, got shape " + checks::shape_string(p.q));
  c.require(pr.value_dim > 0, "v", "must have a value dimension V > 0, got shape " + checks::shape_string(p.v));
  c.shape(p.k, "k", {pr.batch, pr.seq_len, pr.heads, pr.key_dim}, "the shape of q");
  c.require(p.v.shape[0] == pr.batch && p.v.shape[1] == pr.seq_len, "v",
            "must have q's batch and time sizes [" + std::to_string(pr.batch) + ", " +
                std::to_string(pr.seq_len) + ", HV, V], got " + checks::shape_string(p.v));
  c.require(pr.value_heads > 0 && pr.value_heads % pr.heads == 0, "v",
            "number of value heads HV = " + std::to_string(pr.value_heads) +
                " must be a positive multiple of the q/k heads H = " + std::to_string(pr.heads));

  // g: absent, [B, T, HV] (GDN) or [B, T, HV, K] (KDA).
  if (p.g.present()) {
    c.tensor(p.g, "g", {3, 4});
    check_f32_or_q_dtype(c, p.g, "g", p.q);
    c.same_device(p.g, "g", p.q, "q");
    if (p.g.rank == 3) {
      pr.gate = GateKind::scalar;
      c.shape(p.g, "g", {pr.batch, pr.seq_len, pr.value_heads}, "[B, T, HV]: one decay per value head and step (GDN)");
    } else {
      pr.gate = GateKind::per_channel;
      c.shape(p.g, "g", {pr.batch, pr.seq_len, pr.value_heads, pr.key_dim},
              "[B, T, HV, K]: one decay per key channel (KDA)");
    }
  }

  c.tensor(p.beta, "beta", {3});
  check_f32_or_q_dtype(c, p.beta, "beta", p.q);
  c.same_device(p.beta, "beta", p.q, "q");
  c.shape(p.beta, "beta", {pr.batch, pr.seq_len, pr.value_heads}, "[B, T, HV]");

  c.require(std::isnan(p.scale) || std::isfinite(p.scale), "scale",
            "must be finite (or kDefaultScale for K^-0.5), got " + std::to_string(p.scale));
  pr.scale = std::isnan(p.scale) ? 1.0f / std::sqrt(static_cast<float>(pr.key_dim)) : p.scale;

  c.require(p.algorithm == DeltaRuleAlgorithm::recurrent || p.algorithm == DeltaRuleAlgorithm::chunked,
            "algorithm", "must be recurrent or chunked, got value " +
                             std::to_string(static_cast<int>(p.algorithm)));
  c.require(p.exec.precision == Precision::fp32 || p.exec.precision == Precision::fp64, "exec.precision",
            "must be fp32 or fp64");
  c.require(p.exec.num_threads >= 0, "exec.num_threads",
            "must be >= 0 (0 = one per hardware thread), got " + std::to_string(p.exec.num_threads));

  if (p.cu_seqlens.present()) check_cu_seqlens(c, p, pr);

  if (p.initial_state.present()) {
    c.tensor(p.initial_state, "initial_state", {4});
    check_state_dtype(c, p.initial_state, "initial_state", p.q);
    c.same_device(p.initial_state, "initial_state", p.q, "q");
    c.shape(p.initial_state, "initial_state", state_shape(pr),
            pr.varlen ? "[N, HV, K, V], N = len(cu_seqlens) - 1" : "[B, HV, K, V]");
    pr.has_initial_state = true;
  }
  return pr;
}

namespace {
// An output: present, right shape and device, no two elements at one address, and not aliasing
// any input.
void check_output(const Checker& c, const DeltaRuleParams& p, const TensorView& t, const std::string& arg,
                  const std::vector<int64_t>& shape, const std::string& why) {
  c.tensor(t, arg, {static_cast<int>(shape.size())});
  c.same_device(t, arg, p.q, "q");
  c.shape(t, arg, shape, why);
  c.distinct_elements(t, arg);
  c.no_overlap(t, arg, p.q, "q");
  c.no_overlap(t, arg, p.k, "k");
  c.no_overlap(t, arg, p.v, "v");
  c.no_overlap(t, arg, p.g, "g");
  c.no_overlap(t, arg, p.beta, "beta");
  c.no_overlap(t, arg, p.initial_state, "initial_state");
  c.no_overlap(t, arg, p.cu_seqlens, "cu_seqlens");
}

void check_outputs_disjoint(const Checker& c, const std::vector<std::pair<const TensorView*, const char*>>& outs) {
  for (size_t a = 0; a < outs.size(); ++a)
    for (size_t b = a + 1; b < outs.size(); ++b)
      c.no_overlap(*outs[a].first, outs[a].second, *outs[b].first, outs[b].second);
}
}  // namespace

// saved_v_new (forward output or backward input): only where the backend keeps it (the CUDA chunked
// path: delta_rule_keeps_v_new), the shape and dtype of v, dense row-major (the kernels index it as
// [rows, HV, V]). As the forward's output it also must not overlap the inputs (check_output).
static void check_saved_v_new(const Checker& c, const DeltaRuleParams& p, const DeltaRuleProblem& pr, const TensorView& t,
                              bool keeps_v_new, bool is_output) {
  if (!t.present()) return;
  c.require(keeps_v_new, "saved_v_new",
            "is taken only by the CUDA chunked algorithm for GDN or the plain delta rule with bf16 / fp16 "
            "inputs (delta_rule_keeps_v_new() says false for these params): leave it absent");
  if (is_output) {
    check_output(c, p, t, "saved_v_new", v_shape(pr), "the shape of v");
  } else {
    c.tensor(t, "saved_v_new", {4});
    c.same_device(t, "saved_v_new", p.q, "q");
    c.shape(t, "saved_v_new", v_shape(pr), "the shape of v");
  }
  c.same_dtype(t, "saved_v_new", p.v, "v");
  c.require(t.is_contiguous(), "saved_v_new", "must be contiguous (dense [B, T, HV, V])");
}

void validate_delta_rule_forward_outputs(const char* op, const DeltaRuleParams& p,
                                         const DeltaRuleProblem& pr,
                                         const DeltaRuleForwardOutputs& out, bool keeps_v_new) {
  const Checker c{op};
  check_output(c, p, out.o, "o", v_shape(pr), "the shape of v");
  c.same_dtype(out.o, "o", p.q, "q");
  if (out.final_state.present()) {
    check_output(c, p, out.final_state, "final_state", state_shape(pr), "[N, HV, K, V]");
    check_state_dtype(c, out.final_state, "final_state", p.q);
  }
  if (out.saved_r.present()) {
    check_output(c, p, out.saved_r, "saved_r", v_shape(pr), "the shape of v");
    // Float32 only (float64 with float64 inputs): measured on the H200, a bf16 saved_r put KDA's
    // dg at 0.021 relative RMS, over the 0.02 bar (float32: 0.004), because r's rounding enters
    // dk and the reverse sum of dg directly.
    check_state_dtype(c, out.saved_r, "saved_r", p.q);
  }
  check_saved_v_new(c, p, pr, out.saved_v_new, keeps_v_new, true);
  c.require(!(out.saved_v_new.present() && out.saved_r.present()), "saved_v_new",
            "and saved_r: ask for one (saved_r sends the call to the recurrent algorithm, which keeps no v_new)");
  check_outputs_disjoint(c, {{&out.o, "o"}, {&out.final_state, "final_state"}, {&out.saved_r, "saved_r"},
                             {&out.saved_v_new, "saved_v_new"}});
}

void validate_delta_rule_backward_args(const char* op, const DeltaRuleParams& p,
                                       const DeltaRuleProblem& pr,
                                       const DeltaRuleBackwardInputs& in,
                                       const DeltaRuleGrads& grads, bool keeps_v_new) {
  const Checker c{op};
  // Inputs of the backward.
  c.tensor(in.dout, "dout", {4});
  c.same_dtype(in.dout, "dout", p.q, "q");
  c.same_device(in.dout, "dout", p.q, "q");
  c.shape(in.dout, "dout", v_shape(pr), "the shape of v");
  if (in.dht.present()) {
    c.tensor(in.dht, "dht", {4});
    check_state_dtype(c, in.dht, "dht", p.q);
    c.same_device(in.dht, "dht", p.q, "q");
    c.shape(in.dht, "dht", state_shape(pr), "the shape of final_state [N, HV, K, V]");
  }
  if (in.saved_r.present()) {
    c.tensor(in.saved_r, "saved_r", {4});
    check_state_dtype(c, in.saved_r, "saved_r", p.q);
    c.same_device(in.saved_r, "saved_r", p.q, "q");
    c.shape(in.saved_r, "saved_r", v_shape(pr), "the shape of v");
  }
  check_saved_v_new(c, p, pr, in.saved_v_new, keeps_v_new, false);

  // Gradients: shapes and dtypes of what they differentiate.
  const std::vector<int64_t> qk_shape = {pr.batch, pr.seq_len, pr.heads, pr.key_dim};
  check_output(c, p, grads.dq, "dq", qk_shape, "the shape of q");
  c.same_dtype(grads.dq, "dq", p.q, "q");
  check_output(c, p, grads.dk, "dk", qk_shape, "the shape of k");
  c.same_dtype(grads.dk, "dk", p.k, "k");
  check_output(c, p, grads.dv, "dv", v_shape(pr), "the shape of v");
  c.same_dtype(grads.dv, "dv", p.v, "v");
  if (p.g.present()) {
    std::vector<int64_t> g_shape(p.g.shape, p.g.shape + p.g.rank);
    check_output(c, p, grads.dg, "dg", g_shape, "the shape of g");
    c.same_dtype(grads.dg, "dg", p.g, "g");
  } else {
    c.require(!grads.dg.present(), "dg", "must be absent when g is absent (plain delta rule has no gate)");
  }
  check_output(c, p, grads.dbeta, "dbeta", {pr.batch, pr.seq_len, pr.value_heads}, "the shape of beta");
  c.same_dtype(grads.dbeta, "dbeta", p.beta, "beta");
  if (grads.dh0.present()) {
    check_output(c, p, grads.dh0, "dh0", state_shape(pr), "the shape of initial_state [N, HV, K, V]");
    check_state_dtype(c, grads.dh0, "dh0", p.q);
  }
  const std::vector<std::pair<const TensorView*, const char*>> outs = {
      {&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"},
      {&grads.dg, "dg"}, {&grads.dbeta, "dbeta"}, {&grads.dh0, "dh0"}};
  check_outputs_disjoint(c, outs);
  for (const auto& o : outs) {
    c.no_overlap(*o.first, o.second, in.dout, "dout");
    c.no_overlap(*o.first, o.second, in.dht, "dht");
    c.no_overlap(*o.first, o.second, in.saved_r, "saved_r");
    c.no_overlap(*o.first, o.second, in.saved_v_new, "saved_v_new");
  }
}

}  // namespace flashgrad
