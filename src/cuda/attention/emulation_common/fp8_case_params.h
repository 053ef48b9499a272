// Kernel parameters from a test case of the FP8 recipe (tests/cpp/attention_fp8_recipe.h), as the
// host launchers fill them, for the emulation harnesses; and the 16-bit encodings of the inputs
// and outputs. Include after the kernels' headers (it needs their parameter structs).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_fp8_recipe.h"
#include "core/host_dtype.h"
#include "fp8_kernel_params.h"  // the rewritten copy (namespace flashgrad::cuda_attn_emulated)

namespace flashgrad::fp8_emulation {

using cuda_attn_emulated::AttentionKernelParams;
using cuda_attn_emulated::Fp8KernelParams;
using cuda_attn_emulated::RowMajorStrides;
using fp8_test::Fp8Case;
using fp8_test::Fp8Config;
using fp8_test::Fp8Outputs;

inline std::vector<uint16_t> encode16(DType dt, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = dt == DType::f16 ? host::float_to_f16(x[i]) : host::float_to_bf16(x[i]);
  return h;
}
inline std::vector<float> decode16(DType dt, const std::vector<uint16_t>& x) {
  std::vector<float> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = dt == DType::f16 ? host::f16_to_float(x[i]) : host::bf16_to_float(x[i]);
  return h;
}

// Row-major strides of [B, S, H, D] / [T, H, D] contiguous tensors.
inline RowMajorStrides strides(const Fp8Case& c, bool is_q, int heads) {
  RowMajorStrides s;
  const int64_t rows = int64_t{heads} * c.cfg.d;
  s.row = rows;
  s.head = c.cfg.d;
  s.batch = c.varlen ? 0 : (is_q ? c.cfg.sq : c.cfg.sk) * rows;
  return s;
}

// Everything of p but the tensors and their strides: sequences (varlen or padded), heads, the
// scale 1 / sqrt(D), the mask, the softcap, and the lse layout ([H, T] varlen, [B, H, S] padded).
inline void set_problem(AttentionKernelParams& p, const Fp8Case& c, int D) {
  namespace ca = cuda_attn_emulated;
  const fp8_test::Fp8Config& cfg = c.cfg;
  if (c.varlen) {
    p.cu_seqlens_q = c.cu_q.data();
    p.cu_seqlens_k = c.cu_k.data();
  }
  p.num_seqs = c.n;
  p.seqlen_q = c.max_q;
  p.seqlen_k = c.max_k;
  p.total_q = c.tq;
  p.heads_q = cfg.hq;
  p.heads_k = cfg.hk;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  switch (cfg.mask) {
    case MaskKind::none: p.mask = ca::kMaskNone; break;
    case MaskKind::causal: p.mask = ca::kMaskCausal; break;
    case MaskKind::sliding_window: p.mask = ca::kMaskWindow; break;
    case MaskKind::prefix_lm: p.mask = ca::kMaskPrefix; break;
    case MaskKind::candidate_isolation: p.mask = ca::kMaskCandidate; break;
  }
  if (cfg.mask == MaskKind::prefix_lm) p.prefix_lengths = cfg.prefix.data();
  if (cfg.mask == MaskKind::candidate_isolation) p.candidate_bounds = cfg.bounds.data();
  if (cfg.mask == MaskKind::sliding_window) {
    p.window_left = cfg.wl;
    p.window_right = cfg.wr;
  }
  if (cfg.softcap > 0.f) {
    p.softcap = cfg.softcap;
    p.softcap_method = cfg.method == SoftcapMethod::tanh ? ca::kSoftcapTanh : ca::kSoftcapSoftSign;
  }
  if (c.varlen) {
    p.lse_head_stride = c.tq;
    p.lse_row_stride = 1;
  } else {
    p.lse_batch_stride = int64_t{cfg.hq} * cfg.sq;
    p.lse_head_stride = cfg.sq;
    p.lse_row_stride = 1;
  }
}

// The FP8 part of f but the V^T copy: output type, per-(sequence, head) descales, and the [N, H]
// strides of the descale arrays.
inline void set_fp8_scales(Fp8KernelParams& f, const Fp8Case& c) {
  f.out_bf16 = c.cfg.out_dtype == DType::bf16;
  f.descale_q = c.dsq.data();
  f.descale_k = c.dsk.data();
  f.descale_v = c.dsv.data();
  f.dq_st_n = f.dk_st_n = f.dv_st_n = c.cfg.hk;
  f.dq_st_h = f.dk_st_h = f.dv_st_h = 1;
}

}  // namespace flashgrad::fp8_emulation
