// flashgrad::attention_forward / attention_backward for CPU and (in CUDA builds) CUDA tensors.
// Thin: build the core's params from the op's arguments, allocate outputs, call the core (which
// validates everything and dispatches on the tensors' device).
#include <torch/library.h>

#include <string>
#include <vector>

#include "flashgrad/attention.h"
#include "torch_common.h"

namespace flashgrad::torch_ops {
namespace {

MaskKind parse_mask(c10::string_view name) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::sliding_window, MaskKind::prefix_lm,
                     MaskKind::candidate_isolation})
    if (name == mask_name(m)) return m;
  TORCH_CHECK_VALUE(false, "flashgrad: attention: argument 'mask': must be one of none, causal, "
                    "sliding_window, prefix_lm, candidate_isolation, got '", std::string(name), "'");
}

SoftcapMethod parse_softcap_method(c10::string_view name) {
  for (SoftcapMethod m : {SoftcapMethod::tanh, SoftcapMethod::soft_sign})
    if (name == softcap_method_name(m)) return m;
  TORCH_CHECK_VALUE(false, "flashgrad: attention: argument 'softcap_method': must be 'tanh' or "
                    "'soft_sign', got '", std::string(name), "'");
}

// The op's tensors after making last dimensions contiguous (kept alive for the views).
struct AttentionTensors {
  at::Tensor q, k, v;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds;
  std::optional<at::Tensor> descale_q, descale_k, descale_v;  // fp8 inputs only
};

AttentionParams make_params(const AttentionTensors& t, int64_t max_seqlen_q, int64_t max_seqlen_k,
                            const std::optional<double>& softmax_scale, c10::string_view mask,
                            int64_t window_left, int64_t window_right, double softcap,
                            c10::string_view softcap_method) {
  AttentionParams p;
  p.q = view(t.q);
  p.k = view(t.k);
  p.v = view(t.v);
  p.cu_seqlens_q = view(t.cu_seqlens_q);
  p.cu_seqlens_k = view(t.cu_seqlens_k);
  p.max_seqlen_q = max_seqlen_q;
  p.max_seqlen_k = max_seqlen_k;
  p.scale = scale_or_default(softmax_scale);
  p.mask = parse_mask(mask);
  p.window_left = window_left;
  p.window_right = window_right;
  p.prefix_lengths = view(t.prefix_lengths);
  p.candidate_bounds = view(t.candidate_bounds);
  p.softcap = static_cast<float>(softcap);
  p.softcap_method = parse_softcap_method(softcap_method);
  p.descale_q = view(t.descale_q);
  p.descale_k = view(t.descale_k);
  p.descale_v = view(t.descale_v);
  p.exec = execution_options(t.q);
  return p;
}

// Scratch memory from torch's allocator on CUDA (so the backend does not cudaMalloc per call);
// on the CPU the reference manages its own.
at::Tensor workspace_for(const AttentionParams& p, Pass pass, const at::Tensor& q, Workspace& ws) {
  if (!q.is_cuda()) return {};
  const std::size_t bytes = attention_workspace_bytes(p, pass);
  if (bytes == 0) return {};
  at::Tensor buffer = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  ws = {buffer.data_ptr(), bytes};
  return buffer;
}

// out: q's leading dims with v's head dim; lse: [B, Hq, Sq] (padded) or [Hq, Tq] (varlen).
// Inputs of a rank the core rejects get placeholder outputs: the core reports the input first.
std::vector<int64_t> out_shape(const at::Tensor& q, const at::Tensor& v) {
  if (q.dim() < 1 || v.dim() < 1) return {0};
  std::vector<int64_t> s(q.sizes().begin(), q.sizes().end());
  s.back() = v.size(-1);
  return s;
}
std::vector<int64_t> lse_shape(const at::Tensor& q) {
  if (q.dim() == 4) return {q.size(0), q.size(2), q.size(1)};
  if (q.dim() == 3) return {q.size(1), q.size(0)};
  return {0};
}
at::ScalarType lse_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}
// out, and the gradients: q's dtype, bfloat16 for float8_e4m3fn inputs (FlashAttention 3's choice).
at::ScalarType result_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kFloat8_e4m3fn ? at::kBFloat16 : q.scalar_type();
}

std::tuple<at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double> softmax_scale,
    c10::string_view mask, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& prefix_lengths,
    const std::optional<at::Tensor>& candidate_bounds, double softcap,
    c10::string_view softcap_method, double /*z_loss_weight: backward only*/, bool deterministic,
    const std::optional<at::Tensor>& descale_q, const std::optional<at::Tensor>& descale_k,
    const std::optional<at::Tensor>& descale_v) {
  return translate_errors([&] {
    c10::OptionalDeviceGuard guard(q.device());
    const AttentionTensors t{last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v),
                             cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds,
                             descale_q, descale_k, descale_v};
    AttentionParams p = make_params(t, max_seqlen_q, max_seqlen_k, softmax_scale, mask,
                                    window_left, window_right, softcap, softcap_method);
    p.deterministic = deterministic;
    at::Tensor out = at::empty(out_shape(q, v), q.options().dtype(result_dtype(q)));
    at::Tensor lse = at::empty(lse_shape(q), q.options().dtype(lse_dtype(q)));
    Workspace ws;
    const at::Tensor scratch = workspace_for(p, Pass::forward, t.q, ws);
    flashgrad::attention_forward(p, view(out), view(lse), ws);
    return std::make_tuple(out, lse);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double> softmax_scale,
    c10::string_view mask, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& prefix_lengths,
    const std::optional<at::Tensor>& candidate_bounds, double softcap,
    c10::string_view softcap_method, double z_loss_weight, bool deterministic,
    const std::optional<at::Tensor>& descale_q, const std::optional<at::Tensor>& descale_k,
    const std::optional<at::Tensor>& descale_v) {
  return translate_errors([&] {
    c10::OptionalDeviceGuard guard(q.device());
    const AttentionTensors t{last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v),
                             cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds,
                             descale_q, descale_k, descale_v};
    AttentionParams p = make_params(t, max_seqlen_q, max_seqlen_k, softmax_scale, mask,
                                    window_left, window_right, softcap, softcap_method);
    p.deterministic = deterministic;
    const at::Tensor out_c = last_dim_contiguous(out), lse_c = last_dim_contiguous(lse);
    const at::Tensor dout_c = last_dim_contiguous(dout);
    const std::optional<at::Tensor> dlse_c = last_dim_contiguous(dlse);
    AttentionBackwardInputs in;
    in.out = view(out_c);
    in.lse = view(lse_c);
    in.dout = view(dout_c);
    in.dlse = view(dlse_c);
    in.z_loss_weight = static_cast<float>(z_loss_weight);
    const at::ScalarType grad_dtype = result_dtype(q);
    at::Tensor dq = at::empty(q.sizes(), q.options().dtype(grad_dtype));
    at::Tensor dk = at::empty(k.sizes(), k.options().dtype(grad_dtype));
    at::Tensor dv = at::empty(v.sizes(), v.options().dtype(grad_dtype));
    Workspace ws;
    const at::Tensor scratch = workspace_for(p, Pass::backward, t.q, ws);
    flashgrad::attention_backward(p, in, view(dq), view(dk), view(dv), ws);
    return std::make_tuple(dq, dk, dv);
  });
}

}  // namespace

}  // namespace flashgrad::torch_ops

TORCH_LIBRARY_IMPL(flashgrad, CPU, m) {
  m.impl("attention_forward", &flashgrad::torch_ops::attention_forward);
  m.impl("attention_backward", &flashgrad::torch_ops::attention_backward);
}

#ifdef FLASHGRAD_WITH_CUDA
TORCH_LIBRARY_IMPL(flashgrad, CUDA, m) {
  m.impl("attention_forward", &flashgrad::torch_ops::attention_forward);
  m.impl("attention_backward", &flashgrad::torch_ops::attention_backward);
}
#endif

