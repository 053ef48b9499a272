// The flashgrad operator library: one schema per op and pass. The backward of each op is an op
// of its own, so torch.compile and AOT autograd see both passes as opaque calls with known
// shapes (python/flashgrad/_torch_fake.py gives the shape functions, _torch_autograd.py wires
// forward to backward). Implementations: torch_attention.cpp, torch_delta_rule.cpp.
//
// String arguments (mask, softcap_method, algorithm) carry the core's enum names:
//   mask: none | causal | sliding_window | prefix_lm | candidate_isolation
//   softcap_method: tanh | soft_sign          algorithm: recurrent | chunked
#include <torch/library.h>

TORCH_LIBRARY(flashgrad, m) {
  // out [B, Sq, Hq, Dv] / [Tq, Hq, Dv] in q's dtype (bfloat16 for float8_e4m3fn q, k, v); lse
  // float32 (float64 for float64 inputs) [B, Hq, Sq] / [Hq, Tq]. descale_q/k/v: float32 [N, Hk],
  // required with float8_e4m3fn inputs (true value = stored * descale), absent otherwise. z_loss_weight and deterministic only matter to the backward; the
  // forward carries them so that autograd can hand them on.
  m.def(
      "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float? softmax_scale, str mask, int window_left, "
      "int window_right, Tensor? prefix_lengths, Tensor? candidate_bounds, float softcap, "
      "str softcap_method, float z_loss_weight=0., bool deterministic=False, Tensor? descale_q=None, "
      "Tensor? descale_k=None, Tensor? descale_v=None) -> (Tensor out, Tensor lse)");
  // dlse: gradient of lse (None when lse did not reach the loss); z_loss_weight adds
  // z_loss_weight * lse to it inside the backward. dq, dk, dv in q's dtype (out's dtype, bfloat16,
  // for float8_e4m3fn inputs: gradients with respect to the dequantized q, k, v).
  m.def(
      "attention_backward(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float? softmax_scale, str mask, int window_left, int window_right, Tensor? prefix_lengths, "
      "Tensor? candidate_bounds, float softcap, str softcap_method, float z_loss_weight, "
      "bool deterministic, Tensor? descale_q=None, Tensor? descale_k=None, Tensor? descale_v=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv)");
  // o [B, T, HV, V]; final_state [N, HV, K, V] (shape [0] unless output_final_state);
  // saved_r [B, T, HV, V] prediction errors for the recurrent backward (shape [0] unless save_r);
  // saved_v_new [B, T, HV, V] in v's dtype, the chunked path's v_new for its backward (shape [0]
  // unless keep_v_new; where the core keeps none, keep_v_new=True raises).
  m.def(
      "delta_rule_forward(Tensor q, Tensor k, Tensor v, Tensor? g, Tensor beta, float? scale, "
      "Tensor? initial_state, Tensor? cu_seqlens, bool use_qk_l2norm_in_kernel, str algorithm, "
      "bool output_final_state, bool save_r, bool keep_v_new=False) -> (Tensor o, Tensor final_state, "
      "Tensor saved_r, Tensor saved_v_new)");
  // dg has g's shape (shape [0] without g); dh0 initial_state's (shape [0] without it).
  m.def(
      "delta_rule_backward(Tensor dout, Tensor? dht, Tensor? saved_r, Tensor q, Tensor k, Tensor v, "
      "Tensor? g, Tensor beta, float? scale, Tensor? initial_state, Tensor? cu_seqlens, "
      "bool use_qk_l2norm_in_kernel, str algorithm, Tensor? saved_v_new=None) -> (Tensor dq, Tensor dk, "
      "Tensor dv, Tensor dg, Tensor dbeta, Tensor dh0)");
}
