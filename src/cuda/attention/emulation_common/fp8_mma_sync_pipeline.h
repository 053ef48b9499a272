// The FP8 attention forward and backward as fp8_attention_host.cpp runs them, on emulated threads:
// the V^T copy, the mma.sync forward, the backward's pre-passes (rows, dO quantization, K widened),
// the backward's main pass (supplied by the harness: the mma.sync kernel or the wgmma kernel), and
// dq (the deterministic dq kernel, or dq = scale dq_accum rounded). Every output and scratch array
// starts poisoned (NaN / 0xff) so that what a kernel fails to write shows. Include after the
// kernels' headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/attention/emulation_common/fp8_case_params.h"
#include "cuda/attention/emulation_common/thread_model.h"

namespace flashgrad::fp8_emulation {

// main_pass(f, bf16): launches the backward's main pass with f complete (inputs, pre-pass outputs,
// dq_accum, dk, dv); bf16: the 16-bit type is bf16 (else f16).
template <int D, typename MainPass>
Fp8Outputs run_fp8_attention(Fp8Case& c, const MainPass& main_pass) {
  namespace fp8 = cuda_attn_emulated::fp8;
  const Fp8Config& cfg = c.cfg;
  const DType odt = cfg.out_dtype;
  const bool bf16 = odt == DType::bf16;
  Fp8KernelParams f;
  AttentionKernelParams& p = f.base;
  p.q = c.q8.data();
  p.k = c.k8.data();
  p.v = c.v8.data();
  p.q_st = p.out_st = p.dout_st = p.dq_st = strides(c, true, cfg.hq);
  p.k_st = p.v_st = p.dk_st = p.dv_st = strides(c, false, cfg.hk);
  set_problem(p, c, D);
  set_fp8_scales(f, c);
  f.vt_cols = fp8::vt_columns(c.varlen, c.n, c.max_k, c.tk);
  std::vector<uint8_t> vt(static_cast<size_t>(cfg.hk) * D * f.vt_cols, 0xff);  // poisoned
  f.vt = vt.data();
  std::vector<uint16_t> out(c.q8.size(), 0xffff), dq(c.q8.size(), 0xffff), dk(c.k8.size(), 0xffff),
      dv(c.v8.size(), 0xffff);
  std::vector<float> lse(c.lse_count(), NAN);
  p.out = out.data();
  p.lse = lse.data();

  // Forward: transpose, then the forward kernel.
  const int key_blocks = (c.max_k + fp8::kTransposeKeys - 1) / fp8::kTransposeKeys;
  ::launch(c.n * key_blocks, cfg.hk, 256, [&] { fp8::transpose_v_kernel<D>(f, key_blocks); });
  using FCfg = fp8::Fp8ForwardConfig<D>;
  const int mblocks = (c.max_q + FCfg::kBlockM - 1) / FCfg::kBlockM;
  ::launch(c.n * mblocks, cfg.hq, FCfg::kThreads, [&] { fp8::fp8_attention_forward_kernel<D>(f, mblocks); });

  // Backward.
  std::vector<uint16_t> dout = encode16(odt, c.dout);
  p.dout = dout.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  if (cfg.with_dlse) {
    p.dlse = c.dlse.data();
    p.dlse_batch_stride = p.lse_batch_stride;
    p.dlse_head_stride = p.lse_head_stride;
    p.dlse_row_stride = p.lse_row_stride;
  }
  p.z_loss_weight = cfg.z_loss;
  p.deterministic = cfg.deterministic;
  std::vector<float> lse_log2(int64_t{cfg.hq} * c.tq, NAN), shift(lse_log2.size(), NAN),
      dq_accum(c.q8.size(), 0.f), amax(int64_t{c.n} * cfg.hq, 0.f);
  std::vector<uint8_t> dout8(c.q8.size(), 0xff);
  std::vector<uint16_t> q16(c.q8.size(), 0xffff), k16(c.k8.size(), 0xffff);
  p.lse_log2 = lse_log2.data();
  p.delta_shift = shift.data();
  p.dq_accum = dq_accum.data();
  f.dout_amax = amax.data();
  f.dout8 = dout8.data();
  f.q16 = q16.data();
  f.k16 = k16.data();
  f.total_k = c.tk;
  const unsigned q_blocks = static_cast<unsigned>((c.tq * cfg.hq * 32 + 255) / 256);
  const unsigned k_blocks = static_cast<unsigned>((c.tk * cfg.hk * 32 + 255) / 256);
  if (bf16) {
    ::launch(q_blocks, 1, 256, [&] { fp8::fp8_prepass_rows_kernel<__nv_bfloat16>(f, D); });
    ::launch(q_blocks, 1, 256, [&] { fp8::fp8_quantize_dout_kernel<__nv_bfloat16>(f, D); });
    ::launch(k_blocks, 1, 256, [&] { fp8::fp8_widen_k_kernel<__nv_bfloat16>(f, c.tk, D); });
  } else {
    ::launch(q_blocks, 1, 256, [&] { fp8::fp8_prepass_rows_kernel<__half>(f, D); });
    ::launch(q_blocks, 1, 256, [&] { fp8::fp8_quantize_dout_kernel<__half>(f, D); });
    ::launch(k_blocks, 1, 256, [&] { fp8::fp8_widen_k_kernel<__half>(f, c.tk, D); });
  }
  main_pass(f, bf16);
  Fp8Outputs r;
  r.out = decode16(odt, out);
  r.lse = lse;
  if (cfg.deterministic) {
    using QCfg = fp8::Fp8DqConfig<D>;
    const int qblocks = (c.max_q + QCfg::kBlockM - 1) / QCfg::kBlockM;
    if (bf16)
      ::launch(c.n * qblocks, cfg.hq, QCfg::kThreads, [&] { fp8::fp8_attention_dq_kernel<__nv_bfloat16, D>(f, qblocks); });
    else
      ::launch(c.n * qblocks, cfg.hq, QCfg::kThreads, [&] { fp8::fp8_attention_dq_kernel<__half, D>(f, qblocks); });
    r.dq = decode16(odt, dq);
  } else {  // dq = scale * dq_accum, rounded (what launch_dq_convert does)
    r.dq.resize(dq_accum.size());
    for (size_t i = 0; i < dq_accum.size(); ++i) r.dq[i] = fp8_test::round_out(odt, dq_accum[i] * p.scale);
  }
  r.dk = decode16(odt, dk);
  r.dv = decode16(odt, dv);
  return r;
}

}  // namespace flashgrad::fp8_emulation
