// JAX FFI op functions for softmax attention: attributes and named buffers -> the core's params.
// Buffers (by name): q, k, v, cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds,
// descale_q, descale_k, descale_v (float32 [N, Hk], with float8_e4m3fn q, k, v);
// forward outputs out, lse; backward inputs also out, lse, dout, dlse and outputs dq, dk, dv.
// Attributes: max_seqlen_q, max_seqlen_k, window_left, window_right (int64); softmax_scale (NaN
// = default), softcap, z_loss_weight (float32); mask, softcap_method (str); deterministic (bool).
#include <string>

#include "flashgrad/attention.h"
#include "flashgrad/status.h"
#include "jax_common.h"

namespace flashgrad::jax_ffi {
namespace {

std::string_view str_attr(const Call& c, std::string_view name) {
  auto value = c.attrs->get<std::string_view>(name);
  if (!value.has_value())
    throw Error(ErrorKind::invalid_argument, std::string(name),
                "flashgrad: jax binding: attribute '" + std::string(name) + "' (str) is missing");
  return *value;
}

MaskKind parse_mask(std::string_view name) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::sliding_window, MaskKind::prefix_lm,
                     MaskKind::candidate_isolation})
    if (name == mask_name(m)) return m;
  throw_invalid_argument("flash_attention", "mask", "unknown mask '" + std::string(name) + "'");
}

SoftcapMethod parse_softcap_method(std::string_view name) {
  for (SoftcapMethod m : {SoftcapMethod::tanh, SoftcapMethod::soft_sign})
    if (name == softcap_method_name(m)) return m;
  throw_invalid_argument("flash_attention", "softcap_method",
                         "must be 'tanh' or 'soft_sign', got '" + std::string(name) + "'");
}

AttentionParams params_of(const Call& c) {
  AttentionParams p;
  p.q = c.in["q"];
  p.k = c.in["k"];
  p.v = c.in["v"];
  p.cu_seqlens_q = c.in["cu_seqlens_q"];
  p.cu_seqlens_k = c.in["cu_seqlens_k"];
  p.max_seqlen_q = c.int_attr("max_seqlen_q");
  p.max_seqlen_k = c.int_attr("max_seqlen_k");
  p.scale = c.float_attr("softmax_scale");
  p.mask = parse_mask(str_attr(c, "mask"));
  p.window_left = c.int_attr("window_left");
  p.window_right = c.int_attr("window_right");
  p.prefix_lengths = c.in["prefix_lengths"];
  p.candidate_bounds = c.in["candidate_bounds"];
  p.softcap = c.float_attr("softcap");
  p.softcap_method = parse_softcap_method(str_attr(c, "softcap_method"));
  p.descale_q = c.in["descale_q"];  // fp8 (e4m3) inputs only
  p.descale_k = c.in["descale_k"];
  p.descale_v = c.in["descale_v"];
  p.deterministic = c.bool_attr("deterministic");
  p.exec = c.exec;
  return p;
}

}  // namespace

void attention_forward_op(const Call& c) {
  const AttentionParams p = params_of(c);
  const Workspace ws = c.scratch ? c.workspace(attention_workspace_bytes(p, Pass::forward)) : Workspace{};
  attention_forward(p, c.out["out"], c.out["lse"], ws);
}

void attention_backward_op(const Call& c) {
  const AttentionParams p = params_of(c);
  AttentionBackwardInputs in;
  in.out = c.in["out"];
  in.lse = c.in["lse"];
  in.dout = c.in["dout"];
  in.dlse = c.in["dlse"];
  in.z_loss_weight = c.float_attr("z_loss_weight");
  const Workspace ws = c.scratch ? c.workspace(attention_workspace_bytes(p, Pass::backward)) : Workspace{};
  attention_backward(p, in, c.out["dq"], c.out["dk"], c.out["dv"], ws);
}

}  // namespace flashgrad::jax_ffi
