// flashgrad::delta_rule_forward / delta_rule_backward for CPU and (in CUDA builds) CUDA tensors:
// the gated delta rule family (GDN, KDA, plain), gate kind picked by g's rank in the core.
#include <torch/library.h>

#include <string>
#include <vector>

#include "flashgrad/delta_rule.h"
#include "torch_common.h"

namespace flashgrad::torch_ops {
namespace {

DeltaRuleAlgorithm parse_algorithm(c10::string_view name) {
  if (name == "recurrent") return DeltaRuleAlgorithm::recurrent;
  if (name == "chunked") return DeltaRuleAlgorithm::chunked;
  TORCH_CHECK_VALUE(false, "flashgrad: delta_rule: argument 'algorithm': must be 'recurrent' or "
                    "'chunked', got '", std::string(name), "'");
}

// The op's input tensors after making last dimensions contiguous (kept alive for the views).
struct DeltaRuleTensors {
  at::Tensor q, k, v;
  std::optional<at::Tensor> g;
  at::Tensor beta;
  std::optional<at::Tensor> initial_state, cu_seqlens;
};

DeltaRuleParams make_params(const DeltaRuleTensors& t, const std::optional<double>& scale,
                            bool use_qk_l2norm_in_kernel, c10::string_view algorithm) {
  DeltaRuleParams p;
  p.q = view(t.q);
  p.k = view(t.k);
  p.v = view(t.v);
  p.g = view(t.g);
  p.beta = view(t.beta);
  p.scale = scale_or_default(scale);
  p.initial_state = view(t.initial_state);
  p.cu_seqlens = view(t.cu_seqlens);
  p.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  p.algorithm = parse_algorithm(algorithm);
  p.exec = execution_options(t.q);
  return p;
}

at::Tensor workspace_for(const DeltaRuleParams& p, Pass pass, const at::Tensor& q, Workspace& ws,
                         bool with_saved_v_new = false) {
  if (!q.is_cuda()) return {};
  const std::size_t bytes = delta_rule_workspace_bytes(p, pass, with_saved_v_new);
  if (bytes == 0) return {};
  at::Tensor buffer = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  ws = {buffer.data_ptr(), bytes};
  return buffer;
}

// States and saved prediction errors are float32 (float64 for float64 inputs, so that gradient
// checks see no float rounding).
at::ScalarType state_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// [N, HV, K, V] with N = B, or len(cu_seqlens) - 1. Placeholder [0] for inputs the core rejects.
std::vector<int64_t> state_shape(const at::Tensor& q, const at::Tensor& v,
                                 const std::optional<at::Tensor>& cu_seqlens) {
  if (q.dim() != 4 || v.dim() != 4) return {0};
  int64_t n = q.size(0);
  if (cu_seqlens.has_value() && cu_seqlens->dim() == 1 && cu_seqlens->size(0) >= 1)
    n = cu_seqlens->size(0) - 1;
  return {n, v.size(2), q.size(3), v.size(3)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> delta_rule_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& g,
    const at::Tensor& beta, std::optional<double> scale,
    const std::optional<at::Tensor>& initial_state, const std::optional<at::Tensor>& cu_seqlens,
    bool use_qk_l2norm_in_kernel, c10::string_view algorithm, bool output_final_state,
    bool save_r, bool keep_v_new) {
  return translate_errors([&] {
    c10::OptionalDeviceGuard guard(q.device());
    const DeltaRuleTensors t{last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v),
                             last_dim_contiguous(g), last_dim_contiguous(beta),
                             last_dim_contiguous(initial_state), cu_seqlens};
    const DeltaRuleParams p = make_params(t, scale, use_qk_l2norm_in_kernel, algorithm);
    const auto state_options = q.options().dtype(state_dtype(q));
    DeltaRuleForwardOutputs outs;
    at::Tensor o = at::empty(v.sizes(), q.options());
    at::Tensor final_state = output_final_state
                                 ? at::empty(state_shape(q, v, cu_seqlens), state_options)
                                 : at::empty({0}, state_options);
    at::Tensor saved_r = save_r ? at::empty(v.sizes(), state_options) : at::empty({0}, state_options);
    // v_new kept for the backward (the caller asked: flashgrad.delta_rule decides where the core takes
    // it; the core refuses it elsewhere, naming saved_v_new).
    at::Tensor saved_v_new = keep_v_new ? at::empty(v.sizes(), v.options()) : at::empty({0}, v.options());
    outs.o = view(o);
    if (output_final_state) outs.final_state = view(final_state);
    if (save_r) outs.saved_r = view(saved_r);
    if (keep_v_new) outs.saved_v_new = view(saved_v_new);
    Workspace ws;
    const at::Tensor scratch = workspace_for(p, Pass::forward, t.q, ws, keep_v_new && delta_rule_keeps_v_new(p));
    flashgrad::delta_rule_forward(p, outs, ws);
    return std::make_tuple(o, final_state, saved_r, saved_v_new);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
delta_rule_backward(const at::Tensor& dout, const std::optional<at::Tensor>& dht,
                    const std::optional<at::Tensor>& saved_r, const at::Tensor& q,
                    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& g,
                    const at::Tensor& beta, std::optional<double> scale,
                    const std::optional<at::Tensor>& initial_state,
                    const std::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel,
                    c10::string_view algorithm, const std::optional<at::Tensor>& saved_v_new) {
  return translate_errors([&] {
    c10::OptionalDeviceGuard guard(q.device());
    const DeltaRuleTensors t{last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v),
                             last_dim_contiguous(g), last_dim_contiguous(beta),
                             last_dim_contiguous(initial_state), cu_seqlens};
    const DeltaRuleParams p = make_params(t, scale, use_qk_l2norm_in_kernel, algorithm);
    const at::Tensor dout_c = last_dim_contiguous(dout);
    const std::optional<at::Tensor> dht_c = last_dim_contiguous(dht);
    // An empty saved_r means "not saved" (the chunked forward saves none).
    std::optional<at::Tensor> r_c = last_dim_contiguous(saved_r);
    if (r_c.has_value() && r_c->dim() == 1 && r_c->numel() == 0) r_c.reset();
    DeltaRuleBackwardInputs in;
    in.dout = view(dout_c);
    in.dht = view(dht_c);
    in.saved_r = view(r_c);
    // An empty saved_v_new (or none) means "not kept": the backward recomputes it.
    std::optional<at::Tensor> vn = saved_v_new;
    if (vn.has_value() && vn->numel() == 0) vn.reset();
    in.saved_v_new = view(vn);
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    at::Tensor dg = g.has_value() ? at::empty(g->sizes(), g->options()) : at::empty({0}, q.options());
    at::Tensor dbeta = at::empty(beta.sizes(), beta.options());
    at::Tensor dh0 = initial_state.has_value() ? at::empty(initial_state->sizes(), initial_state->options())
                                               : at::empty({0}, q.options().dtype(state_dtype(q)));
    DeltaRuleGrads grads;
    grads.dq = view(dq);
    grads.dk = view(dk);
    grads.dv = view(dv);
    if (g.has_value()) grads.dg = view(dg);
    grads.dbeta = view(dbeta);
    if (initial_state.has_value()) grads.dh0 = view(dh0);
    Workspace ws;
    const at::Tensor scratch =
        workspace_for(p, Pass::backward, t.q, ws, vn.has_value() && delta_rule_keeps_v_new(p));
    flashgrad::delta_rule_backward(p, in, grads, ws);
    return std::make_tuple(dq, dk, dv, dg, dbeta, dh0);
  });
}

}  // namespace
}  // namespace flashgrad::torch_ops

TORCH_LIBRARY_IMPL(flashgrad, CPU, m) {
  m.impl("delta_rule_forward", &flashgrad::torch_ops::delta_rule_forward);
  m.impl("delta_rule_backward", &flashgrad::torch_ops::delta_rule_backward);
}

#ifdef FLASHGRAD_WITH_CUDA
TORCH_LIBRARY_IMPL(flashgrad, CUDA, m) {
  m.impl("delta_rule_forward", &flashgrad::torch_ops::delta_rule_forward);
  m.impl("delta_rule_backward", &flashgrad::torch_ops::delta_rule_backward);
}
#endif
