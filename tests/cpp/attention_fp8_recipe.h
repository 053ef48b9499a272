// The FP8 (e4m3) attention recipe (docs/fp8.md), emulated on the host in fp32, and the test
// problems both the CPU test (attention_fp8_fragments_test.cpp) and the GPU test
// (attention_fp8_gpu_test.cu) use.
//
// A problem: q, k, v drawn in fp32, quantized with current per-(sequence, kv head) scales
// (descale = amax / 448, e4m3 round-to-nearest-even, saturating; q's amax is over the query heads
// of the kv head's group), dout in bf16, optional dlse. The references:
//   reference32(): flashgrad's CPU reference in fp32 on the dequantized inputs (e4m3 * descale);
//   recipe():      the recipe written out plainly: S from the e4m3 values (fp32 sums), scaled by
//                  descale_q descale_k scale; softcap and mask in fp32; p~ = exp(s - m) with the row's
//                  final max; l = sum p~ (unquantized); out = sum e4m3(448 p~) v8 descale_v / (448 l),
//                  rounded to the output dtype; lse = m + log l. Backward: p = exp(s - lse);
//                  dO8 = e4m3(dO / descale_do), descale_do = amax(|dO| of the (sequence, head)) / 448;
//                  dP = (dO8 . v8) descale_do descale_v; Delta = rowsum(dO8 * out) descale_do (the
//                  dequantized dO8, the dO dP sees, not the 16-bit dO); dS = p (dP - Delta
//                  + dLSE) softcap'; dV = sum r(p) dO; dK = scale descale_q sum r(dS) q8;
//                  dQ = scale descale_k sum r(dS) k8, r = rounding to the output dtype (bf16 or fp16,
//                  the dtype of the 16-bit products); each result rounded once to the output dtype.
// The kernels quantize P against the running max of the online softmax instead of the final one,
// so their P8 rounding differs element by element from recipe()'s; the 2x rule absorbs that.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/attention_validation.h"
#include "core/host_dtype.h"
#include "flashgrad/attention.h"
#include "reference/attention/mask.h"

namespace flashgrad::fp8_test {

constexpr float fp8_max() { return 448.f; }  // the largest e4m3 value

struct Fp8Config {
  std::string name;
  int d = 128;
  int hq = 2, hk = 2;
  int batch = 2, sq = 128, sk = 128;  // padded
  std::vector<int> lens_q, lens_k;    // varlen when non-empty
  MaskKind mask = MaskKind::none;
  int64_t wl = -1, wr = -1;
  std::vector<int32_t> prefix;  // prefix_lm: one per sequence
  std::vector<int32_t> bounds;  // candidate_isolation: h0, h1, c0, c1 per sequence
  float softcap = 0.f;
  SoftcapMethod method = SoftcapMethod::tanh;
  bool with_dlse = false;
  float z_loss = 0.f;
  DType out_dtype = DType::bf16;
  float input_std = 1.f;
  bool deterministic = false;  // backward: the kernels' deterministic dq
  bool packed_qkv = false;     // GPU test: q, k, v as head slices of one [B, S, Hq + 2 Hk, D] buffer
                               // (padded, Sq == Sk) and the descales with padded rows  // q, k, v ~ N(0, input_std^2) before quantization
};

struct Fp8Outputs {
  std::vector<float> out, lse, dq, dk, dv;
  // recipe() only: the largest scale descale_q descale_k sum_d |q8 k8| over allowed pairs, the
  // magnitude of the terms the tensor cores sum into a score (see score_accumulator_atol).
  double score_terms_max = 0;
};

struct Fp8Case {
  Fp8Config cfg;
  bool varlen = false;
  int n = 0;             // sequences
  int64_t tq = 0, tk = 0;  // tokens
  std::vector<int32_t> cu_q, cu_k;
  int max_q = 0, max_k = 0;
  // [tokens, H, D] contiguous: e4m3 codes, their values, and the dequantized values.
  std::vector<uint8_t> q8, k8, v8;
  std::vector<float> q8f, k8f, v8f, qf, kf, vf;
  std::vector<float> dsq, dsk, dsv;  // [N, Hk]
  std::vector<float> dout, dlse;     // dout rounded to the output dtype

  int64_t q_tok(int64_t s, int64_t i) const { return (varlen ? cu_q[s] : s * cfg.sq) + i; }
  int64_t k_tok(int64_t s, int64_t j) const { return (varlen ? cu_k[s] : s * cfg.sk) + j; }
  int64_t q_len(int64_t s) const { return varlen ? cu_q[s + 1] - cu_q[s] : cfg.sq; }
  int64_t k_len(int64_t s) const { return varlen ? cu_k[s + 1] - cu_k[s] : cfg.sk; }
  int64_t lse_at(int64_t s, int64_t h, int64_t i) const {
    return varlen ? h * tq + cu_q[s] + i : (s * cfg.hq + h) * cfg.sq + i;
  }
  std::vector<int64_t> q_shape() const {
    return varlen ? std::vector<int64_t>{tq, cfg.hq, cfg.d} : std::vector<int64_t>{cfg.batch, cfg.sq, cfg.hq, cfg.d};
  }
  std::vector<int64_t> k_shape() const {
    return varlen ? std::vector<int64_t>{tk, cfg.hk, cfg.d} : std::vector<int64_t>{cfg.batch, cfg.sk, cfg.hk, cfg.d};
  }
  std::vector<int64_t> lse_shape() const {
    return varlen ? std::vector<int64_t>{cfg.hq, tq} : std::vector<int64_t>{cfg.batch, cfg.hq, cfg.sq};
  }
  int64_t lse_count() const { return int64_t{cfg.hq} * tq; }
};

inline float round_out(DType dt, float x) {
  return dt == DType::f16 ? host::f16_to_float(host::float_to_f16(x))
                          : host::bf16_to_float(host::float_to_bf16(x));
}
inline float e4m3_round(float x) { return host::e4m3_to_float(host::float_to_e4m3(x)); }

inline TensorView host_view(void* data, DType dt, const std::vector<int64_t>& shape, Device dev = Device::cpu) {
  TensorView t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.rank = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

// Quantizes x [tokens, H, D] per (sequence, kv head): amax over the sequence's rows and the heads
// h with h / (H / Hk) == kv head.
inline void quantize(Fp8Case& c, const std::vector<float>& x, bool is_q, int heads, std::vector<uint8_t>& codes,
                     std::vector<float>& values, std::vector<float>& dequant, std::vector<float>& descale) {
  const int D = c.cfg.d, group = heads / c.cfg.hk;
  codes.assign(x.size(), 0);
  values.assign(x.size(), 0.f);
  dequant.assign(x.size(), 0.f);
  descale.assign(static_cast<size_t>(c.n) * c.cfg.hk, 1.f);
  for (int s = 0; s < c.n; ++s) {
    const int64_t len = is_q ? c.q_len(s) : c.k_len(s);
    for (int g = 0; g < c.cfg.hk; ++g) {
      float amax = 0.f;
      for (int64_t i = 0; i < len; ++i)
        for (int h = g * group; h < (g + 1) * group; ++h)
          for (int d = 0; d < D; ++d) {
            const int64_t tok = is_q ? c.q_tok(s, i) : c.k_tok(s, i);
            amax = std::max(amax, std::fabs(x[(tok * heads + h) * D + d]));
          }
      const float ds = amax > 0.f ? amax / fp8_max() : 1.f;
      descale[s * c.cfg.hk + g] = ds;
      for (int64_t i = 0; i < len; ++i)
        for (int h = g * group; h < (g + 1) * group; ++h)
          for (int d = 0; d < D; ++d) {
            const int64_t tok = is_q ? c.q_tok(s, i) : c.k_tok(s, i);
            const int64_t e = (tok * heads + h) * D + d;
            codes[e] = host::float_to_e4m3(x[e] / ds);
            values[e] = host::e4m3_to_float(codes[e]);
            dequant[e] = values[e] * ds;
          }
    }
  }
}

inline Fp8Case make_case(const Fp8Config& cfg, std::mt19937& rng) {
  Fp8Case c;
  c.cfg = cfg;
  c.varlen = !cfg.lens_q.empty();
  if (c.varlen) {
    c.n = static_cast<int>(cfg.lens_q.size());
    c.cu_q = {0};
    c.cu_k = {0};
    for (int i = 0; i < c.n; ++i) {
      c.cu_q.push_back(c.cu_q.back() + cfg.lens_q[i]);
      c.cu_k.push_back(c.cu_k.back() + cfg.lens_k[i]);
    }
    c.tq = c.cu_q.back();
    c.tk = c.cu_k.back();
    c.max_q = *std::max_element(cfg.lens_q.begin(), cfg.lens_q.end());
    c.max_k = *std::max_element(cfg.lens_k.begin(), cfg.lens_k.end());
  } else {
    c.n = cfg.batch;
    c.tq = int64_t{cfg.batch} * cfg.sq;
    c.tk = int64_t{cfg.batch} * cfg.sk;
    c.max_q = cfg.sq;
    c.max_k = cfg.sk;
  }
  std::normal_distribution<float> normal(0.f, 1.f);
  auto draw = [&](int64_t count, float std_dev) {
    std::vector<float> x(count);
    for (auto& e : x) e = normal(rng) * std_dev;
    return x;
  };
  const int D = cfg.d;
  const std::vector<float> q = draw(c.tq * cfg.hq * D, cfg.input_std);
  const std::vector<float> k = draw(c.tk * cfg.hk * D, cfg.input_std);
  const std::vector<float> v = draw(c.tk * cfg.hk * D, 1.f);
  quantize(c, q, true, cfg.hq, c.q8, c.q8f, c.qf, c.dsq);
  quantize(c, k, false, cfg.hk, c.k8, c.k8f, c.kf, c.dsk);
  quantize(c, v, false, cfg.hk, c.v8, c.v8f, c.vf, c.dsv);
  c.dout = draw(c.tq * cfg.hq * D, 1.f);
  for (auto& e : c.dout) e = round_out(cfg.out_dtype, e);
  if (cfg.with_dlse) c.dlse = draw(c.lse_count(), 1.f);
  return c;
}

inline AttentionParams mask_params(const Fp8Config& cfg) {
  AttentionParams p;
  p.mask = cfg.mask;
  p.window_left = cfg.wl;
  p.window_right = cfg.wr;
  p.softcap = cfg.softcap;
  p.softcap_method = cfg.method;
  return p;
}

// fp32 CPU reference on the dequantized inputs.
inline Fp8Outputs reference32(Fp8Case& c) {
  const Fp8Config& cfg = c.cfg;
  AttentionParams p = mask_params(cfg);
  p.q = host_view(c.qf.data(), DType::f32, c.q_shape());
  p.k = host_view(c.kf.data(), DType::f32, c.k_shape());
  p.v = host_view(c.vf.data(), DType::f32, c.k_shape());
  if (c.varlen) {
    p.cu_seqlens_q = host_view(c.cu_q.data(), DType::i32, {c.n + 1});
    p.cu_seqlens_k = host_view(c.cu_k.data(), DType::i32, {c.n + 1});
  }
  if (cfg.mask == MaskKind::prefix_lm)
    p.prefix_lengths = host_view(c.cfg.prefix.data(), DType::i32, {c.n});
  if (cfg.mask == MaskKind::candidate_isolation)
    p.candidate_bounds = host_view(c.cfg.bounds.data(), DType::i32, {c.n, 4});
  Fp8Outputs r;
  r.out.resize(c.qf.size());
  r.lse.resize(c.lse_count());
  const TensorView out = host_view(r.out.data(), DType::f32, c.q_shape());
  const TensorView lse = host_view(r.lse.data(), DType::f32, c.lse_shape());
  attention_forward(p, out, lse);
  r.dq.resize(c.qf.size());
  r.dk.resize(c.kf.size());
  r.dv.resize(c.vf.size());
  AttentionBackwardInputs in;
  in.out = out;
  in.lse = lse;
  in.dout = host_view(c.dout.data(), DType::f32, c.q_shape());
  if (cfg.with_dlse) in.dlse = host_view(c.dlse.data(), DType::f32, c.lse_shape());
  in.z_loss_weight = cfg.z_loss;
  attention_backward(p, in, host_view(r.dq.data(), DType::f32, c.q_shape()),
                     host_view(r.dk.data(), DType::f32, c.k_shape()),
                     host_view(r.dv.data(), DType::f32, c.k_shape()));
  return r;
}

// The recipe, plainly (see the top of this file).
inline Fp8Outputs recipe(Fp8Case& c) {
  const Fp8Config& cfg = c.cfg;
  const int D = cfg.d, hq = cfg.hq, hk = cfg.hk, group = hq / hk;
  const DType odt = cfg.out_dtype;
  AttentionParams p = mask_params(cfg);
  AttentionProblem pr;
  pr.varlen = c.varlen;
  pr.num_seqs = c.n;
  pr.seqlen_q = cfg.sq;
  pr.seqlen_k = cfg.sk;
  for (int32_t x : c.cu_q) pr.cu_seqlens_q.push_back(x);
  for (int32_t x : c.cu_k) pr.cu_seqlens_k.push_back(x);
  for (int32_t x : cfg.prefix) pr.prefix_lengths.push_back(x);
  for (int32_t x : cfg.bounds) pr.candidate_bounds.push_back(x);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Fp8Outputs r;
  r.out.assign(c.qf.size(), 0.f);
  r.lse.assign(c.lse_count(), -INFINITY);
  r.dq.assign(c.qf.size(), 0.f);
  std::vector<float> dk32(c.kf.size(), 0.f), dv32(c.vf.size(), 0.f);
  for (int s = 0; s < c.n; ++s) {
    const reference::attn::SequenceMask mask(p, pr, s);
    const int64_t lq = c.q_len(s), lk = c.k_len(s);
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const float dsq = c.dsq[s * hk + g], dsk = c.dsk[s * hk + g], dsv = c.dsv[s * hk + g];
      // dO8 for this (sequence, head).
      float amax = 0.f;
      for (int64_t i = 0; i < lq; ++i)
        for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(c.dout[(c.q_tok(s, i) * hq + h) * D + d]));
      const float dsdo = amax > 0.f ? amax / fp8_max() : 1.f;
      std::vector<float> sv(lk), factor(lk), pt(lk), dsrow(lk);
      std::vector<float> do8(D);
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t qe = (c.q_tok(s, i) * hq + h) * D;
        float mx = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          sv[j] = -INFINITY;
          factor[j] = 1.f;
          if (!mask.allowed(i, j)) continue;
          const int64_t ke = (c.k_tok(s, j) * hk + g) * D;
          float dot = 0.f, terms = 0.f;
          for (int d = 0; d < D; ++d) {
            dot += c.q8f[qe + d] * c.k8f[ke + d];
            terms += std::fabs(c.q8f[qe + d] * c.k8f[ke + d]);
          }
          r.score_terms_max = std::max(r.score_terms_max, double(terms) * dsq * dsk * scale);
          float x = dot * dsq * dsk * scale;
          if (cfg.softcap > 0.f) {
            if (cfg.method == SoftcapMethod::tanh) {
              const float t = std::tanh(x / cfg.softcap);
              factor[j] = 1.f - t * t;
              x = cfg.softcap * t;
            } else {
              const float den = 1.f + std::fabs(x) / cfg.softcap;
              factor[j] = 1.f / (den * den);
              x = x / den;
            }
          }
          sv[j] = x;
          mx = std::max(mx, x);
        }
        if (mx == -INFINITY) continue;  // fully masked: out 0, lse -inf, no gradient
        float l = 0.f;
        for (int64_t j = 0; j < lk; ++j) {
          pt[j] = sv[j] == -INFINITY ? 0.f : std::exp(sv[j] - mx);
          l += pt[j];
        }
        const float lse = mx + std::log(l);
        r.lse[c.lse_at(s, h, i)] = lse;
        float* oi = &r.out[qe];
        for (int d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j)
            if (pt[j] != 0.f) acc += e4m3_round(pt[j] * fp8_max()) * c.v8f[(c.k_tok(s, j) * hk + g) * D + d];
          oi[d] = round_out(odt, acc * dsv / (fp8_max() * l));
        }
        // Backward of row i.
        const float* doi = &c.dout[qe];
        float delta = 0.f;
        for (int d = 0; d < D; ++d) {
          do8[d] = e4m3_round(doi[d] / dsdo);
          delta += do8[d] * oi[d];
        }
        delta *= dsdo;  // Delta from the dO that dP sees (fp8_prepass_kernels.cuh says why)
        float dl = cfg.z_loss * lse;
        if (cfg.with_dlse) dl += c.dlse[c.lse_at(s, h, i)];
        for (int64_t j = 0; j < lk; ++j) {
          dsrow[j] = 0.f;
          if (sv[j] == -INFINITY) continue;
          const int64_t ke = (c.k_tok(s, j) * hk + g) * D;
          const float pj = std::exp(sv[j] - lse);
          float dp = 0.f;
          for (int d = 0; d < D; ++d) dp += do8[d] * c.v8f[ke + d];
          dp *= dsdo * dsv;
          dsrow[j] = round_out(odt, pj * (dp - delta + dl) * factor[j]);
          const float pb = round_out(odt, pj);
          for (int d = 0; d < D; ++d) {
            dv32[ke + d] += pb * doi[d];
            dk32[ke + d] += dsrow[j] * c.q8f[qe + d] * (scale * dsq);
          }
        }
        for (int d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j)
            if (dsrow[j] != 0.f) acc += dsrow[j] * c.k8f[(c.k_tok(s, j) * hk + g) * D + d];
          r.dq[qe + d] = round_out(odt, acc * scale * dsk);
        }
      }
    }
  }
  r.dk.resize(dk32.size());
  r.dv.resize(dv32.size());
  for (size_t x = 0; x < dk32.size(); ++x) r.dk[x] = round_out(odt, dk32[x]);
  for (size_t x = 0; x < dv32.size(); ++x) r.dv[x] = round_out(odt, dv32[x]);
  return r;
}

// sqrt(sum (a - b)^2 / sum b^2) over finite reference entries; NaN in `a` gives NaN.
inline double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(b[i])) {
      if (a[i] != b[i]) return NAN;
      continue;
    }
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// max |a - b| (equal entries, including equal infinities, count 0; NaN counts infinite).
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

// atol of the design doc's rule at the magnitude of `ref`: 2 max |rd(rd(x + 0.3) - 0.3) - x|.
inline double rounding_atol(const std::vector<float>& ref, DType dt) {
  double atol = 0;
  for (float x : ref) {
    if (!std::isfinite(x)) continue;
    const float back = dt == DType::f32 ? (x + 0.3f) - 0.3f : round_out(dt, round_out(dt, x + 0.3f) - 0.3f);
    atol = std::max(atol, 2.0 * std::fabs(double(back) - double(x)));
  }
  return atol;
}

// atol for lse (fp32): two fp32 ulps at the largest finite |lse|. The design doc's formula gives 0
// for fp32 values above ~0.6 ((x + 0.3) - 0.3 rounds back to x), which would make the rule demand
// that the kernels' lse, from the same fp32 math summed in another order (and ex2.approx on the
// GPU), be within twice the recipe's last-bit error.
inline double lse_atol(const std::vector<float>& ref) {
  double atol = 0;
  for (float x : ref)
    if (std::isfinite(x)) atol = std::max(atol, 2.0 * (std::nextafter(std::fabs(x), INFINITY) - std::fabs(x)));
  return atol;
}

// The rounding of the e4m3 tensor cores' accumulator at the magnitude of a score's terms: Hopper
// sums e4m3 products with a 13-bit mantissa (products aligned to the largest one and cut to 14
// bits: DeepSeek-V3; the accumulator input cut to 13 mantissa bits: SageAttention2), so a score,
// hence lse, can be off by about 2^-13 of the terms' magnitude per k32 step. lse's atol adds
// 2 * 2^-13 * score_terms_max to lse_atol (the kernels' lse matches the recipe's to ~1e-6 with an
// exact accumulator in the host emulation, to ~2e-4 with the Hopper model, where this term is
// ~1.5e-3 for unit-normal inputs at D = 128).
inline double score_accumulator_atol(double score_terms_max) { return 2.0 * std::ldexp(score_terms_max, -13); }

}  // namespace flashgrad::fp8_test
