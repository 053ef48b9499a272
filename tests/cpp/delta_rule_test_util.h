// Delta-rule test helpers: a case description, random inputs as fla tests them, calls through the
// public API with poisoned (NaN) outputs, the fp64 loss sum(o * do) + sum(final_state * dht), and
// a plain, materialize-nothing-clever direct recurrence to compare with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "flashgrad/delta_rule.h"
#include "test_util.h"

namespace flashgrad::test {

struct DeltaCase {
  int64_t B = 1, T = 9, H = 1, HV = 1, K = 4, V = 5;
  GateKind gate = GateKind::scalar;
  bool l2norm = false;
  bool initial_state = true;
  bool dht = true;
  std::vector<int64_t> cu_seqlens;  // empty: padded batch
  DType dtype = DType::f64;         // q, k, v, do
  DType gate_dtype = DType::f64;    // g and beta (f32 or dtype)
  float scale = kDefaultScale;
  double g_scale = 1.0;  // g = logsigmoid(x) / n with n = 1 / g_scale
  DeltaRuleAlgorithm algorithm = DeltaRuleAlgorithm::recurrent;
  Precision precision = Precision::fp64;
  int threads = 1;

  int64_t num_seqs() const { return cu_seqlens.empty() ? B : static_cast<int64_t>(cu_seqlens.size()) - 1; }
  DType state_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
};

// The inputs of a case, and the random cotangents of the loss.
struct DeltaData {
  DeltaCase c;
  HostTensor q, k, v, g, beta, h0, cu, dout, dht;

  explicit DeltaData(const DeltaCase& cs, std::mt19937_64& rng) : c(cs) {
    const int64_t B = c.B, T = c.T, N = c.num_seqs();
    q = HostTensor(c.dtype, {B, T, c.H, c.K});
    k = HostTensor(c.dtype, {B, T, c.H, c.K});
    v = HostTensor(c.dtype, {B, T, c.HV, c.V});
    q.fill_uniform(rng, -1, 1);
    k.fill_uniform(rng, -1, 1);
    v.fill_uniform(rng, -1, 1);
    if (!c.l2norm) {  // fla's callers normalize k; keep |k| <= 1 so the delta rule is a contraction
      scale_rows(k, c.K, 1.0);
      scale_rows(q, c.K, 1.0);
    }
    if (c.gate != GateKind::none) {
      std::vector<int64_t> shape = {B, T, c.HV};
      if (c.gate == GateKind::per_channel) shape.push_back(c.K);
      g = HostTensor(c.gate_dtype, shape);
      // g = logsigmoid(x) * g_scale, with some g exactly 0 (fla's inputs).
      std::normal_distribution<double> x(0, 2);
      std::uniform_int_distribution<int> zero(0, 9);
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double a = x(rng);
        const double ls = a > 0 ? -std::log1p(std::exp(-a)) : a - std::log1p(std::exp(a));
        g.set(i, zero(rng) == 0 ? 0.0 : ls * c.g_scale);
      }
    }
    beta = HostTensor(c.gate_dtype, {B, T, c.HV});
    beta.fill_uniform(rng, 0.05, 0.95);
    if (c.initial_state) {
      h0 = HostTensor(c.state_dtype(), {N, c.HV, c.K, c.V});
      h0.fill_uniform(rng, -1, 1);
    }
    if (!c.cu_seqlens.empty()) cu = int32_tensor(c.cu_seqlens);
    dout = HostTensor(c.dtype, {B, T, c.HV, c.V});
    dout.fill_uniform(rng, -1, 1);
    if (c.dht) {
      dht = HostTensor(c.state_dtype(), {N, c.HV, c.K, c.V});
      dht.fill_uniform(rng, -1, 1);
    }
  }

  // Rows of a [.., D] tensor rescaled to norm `target` (unit-norm keys, as fla's callers use).
  static void scale_rows(HostTensor& t, int64_t D, double target) {
    for (int64_t r = 0; r < t.numel() / D; ++r) {
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += t.get(r * D + d) * t.get(r * D + d);
      const double f = target / std::sqrt(ss + 1e-12);
      for (int64_t d = 0; d < D; ++d) t.set(r * D + d, t.get(r * D + d) * f);
    }
  }

  DeltaRuleParams params() const {
    DeltaRuleParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    if (c.gate != GateKind::none) p.g = g.view();
    p.beta = beta.view();
    p.scale = c.scale;
    if (c.initial_state) p.initial_state = h0.view();
    if (!c.cu_seqlens.empty()) p.cu_seqlens = cu.view();
    p.use_qk_l2norm_in_kernel = c.l2norm;
    p.algorithm = c.algorithm;
    p.exec.num_threads = c.threads;
    p.exec.precision = c.precision;
    return p;
  }

  std::vector<int64_t> state_shape() const { return {c.num_seqs(), c.HV, c.K, c.V}; }
};

struct DeltaForward {
  HostTensor o, final_state, r;
};

// Forward through the public API; outputs start as NaN.
inline DeltaForward run_forward(const DeltaData& d, const DeltaRuleParams& p, bool save_r = false,
                                DType r_dtype = DType::f32) {
  DeltaForward f;
  f.o = HostTensor(d.c.dtype, {d.c.B, d.c.T, d.c.HV, d.c.V});
  f.final_state = HostTensor(d.c.state_dtype(), d.state_shape());
  DeltaRuleForwardOutputs out;
  out.o = f.o.view();
  out.final_state = f.final_state.view();
  if (save_r) {
    f.r = HostTensor(r_dtype, {d.c.B, d.c.T, d.c.HV, d.c.V});
    out.saved_r = f.r.view();
  }
  delta_rule_forward(p, out);
  return f;
}
inline DeltaForward run_forward(const DeltaData& d) { return run_forward(d, d.params()); }

struct DeltaGrads {
  HostTensor dq, dk, dv, dg, dbeta, dh0;
};

inline DeltaGrads make_grads(const DeltaData& d) {
  DeltaGrads g;
  g.dq = HostTensor(d.c.dtype, d.q.shape());
  g.dk = HostTensor(d.c.dtype, d.k.shape());
  g.dv = HostTensor(d.c.dtype, d.v.shape());
  if (d.c.gate != GateKind::none) g.dg = HostTensor(d.g.dtype(), d.g.shape());
  g.dbeta = HostTensor(d.beta.dtype(), d.beta.shape());
  g.dh0 = HostTensor(d.c.state_dtype(), d.state_shape());
  return g;
}

// The gradients of two results side by side, named, for a check over all of them (dg only when
// the case has a gate).
struct GradPair {
  const char* name;
  const HostTensor& a;
  const HostTensor& b;
};
inline std::vector<GradPair> grad_pairs(const DeltaGrads& a, const DeltaGrads& b, GateKind gate) {
  std::vector<GradPair> pairs = {{"dq", a.dq, b.dq},          {"dk", a.dk, b.dk},
                                 {"dv", a.dv, b.dv},          {"dbeta", a.dbeta, b.dbeta},
                                 {"dh0", a.dh0, b.dh0}};
  if (gate != GateKind::none) pairs.push_back({"dg", a.dg, b.dg});
  return pairs;
}

inline DeltaRuleGrads grad_views(const DeltaData& d, const DeltaGrads& g) {
  DeltaRuleGrads v;
  v.dq = g.dq.view();
  v.dk = g.dk.view();
  v.dv = g.dv.view();
  if (d.c.gate != GateKind::none) v.dg = g.dg.view();
  v.dbeta = g.dbeta.view();
  v.dh0 = g.dh0.view();
  return v;
}

inline DeltaRuleBackwardInputs backward_inputs(const DeltaData& d, const HostTensor* saved_r = nullptr) {
  DeltaRuleBackwardInputs in;
  in.dout = d.dout.view();
  if (d.c.dht) in.dht = d.dht.view();
  if (saved_r) in.saved_r = saved_r->view();
  return in;
}

// Backward through the public API; gradients start as NaN.
inline DeltaGrads run_backward(const DeltaData& d, const DeltaRuleParams& p, const HostTensor* saved_r = nullptr) {
  DeltaGrads g = make_grads(d);
  delta_rule_backward(p, backward_inputs(d, saved_r), grad_views(d, g));
  return g;
}
inline DeltaGrads run_backward(const DeltaData& d) { return run_backward(d, d.params()); }

// sum(o * do) + sum(final_state * dht), in double.
inline double loss_of(const DeltaData& d, const DeltaForward& f) {
  double L = 0;
  for (int64_t i = 0; i < f.o.numel(); ++i) L += f.o.get(i) * d.dout.get(i);
  if (d.c.dht)
    for (int64_t i = 0; i < f.final_state.numel(); ++i) L += f.final_state.get(i) * d.dht.get(i);
  return L;
}

// Relative error max|a - ref| / max|ref| (ref_max floored at 1e-30 so zero references compare exactly).
inline double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  const MaxDiff m = max_abs_diff(a, ref);
  return m.diff / std::max(m.ref_max, 1e-30);
}

// rms(a - ref) / rms(ref), the GPU rule of the design doc.
inline double rel_rms(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline bool all_finite(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i))) return false;
  return true;
}

// The plain recurrence of the contract, in double, written independently of the library: for
// each (sequence, value head) materialize S step by step. Returns o [B,T,HV,V] and final [N,HV,K,V].
struct DirectResult {
  std::vector<double> o, final_state;
};
inline DirectResult direct_recurrence(const DeltaData& d) {
  const DeltaCase& c = d.c;
  const int64_t N = c.num_seqs(), K = c.K, V = c.V, group = c.HV / c.H;
  const double scale = std::isnan(c.scale) ? 1.0 / std::sqrt(static_cast<double>(K)) : c.scale;
  DirectResult res;
  res.o.assign(c.B * c.T * c.HV * V, 0);
  res.final_state.assign(N * c.HV * K * V, 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = c.cu_seqlens.empty() ? n : 0;
    const int64_t t0 = c.cu_seqlens.empty() ? 0 : c.cu_seqlens[n];
    const int64_t t1 = c.cu_seqlens.empty() ? c.T : c.cu_seqlens[n + 1];
    for (int64_t j = 0; j < c.HV; ++j) {
      const int64_t h = j / group;
      std::vector<double> S(K * V, 0);
      if (c.initial_state)
        for (int64_t e = 0; e < K * V; ++e) S[e] = d.h0.get((n * c.HV + j) * K * V + e);
      for (int64_t t = t0; t < t1; ++t) {
        std::vector<double> q(K), k(K), v(V), dec(K, 1.0);
        for (int64_t i = 0; i < K; ++i) {
          q[i] = d.q.get(((b * c.T + t) * c.H + h) * K + i);
          k[i] = d.k.get(((b * c.T + t) * c.H + h) * K + i);
        }
        if (c.l2norm) {
          double sq = 0, sk = 0;
          for (int64_t i = 0; i < K; ++i) sq += q[i] * q[i], sk += k[i] * k[i];
          for (int64_t i = 0; i < K; ++i) q[i] /= std::sqrt(sq + 1e-6), k[i] /= std::sqrt(sk + 1e-6);
        }
        for (int64_t e = 0; e < V; ++e) v[e] = d.v.get(((b * c.T + t) * c.HV + j) * V + e);
        const int64_t row = (b * c.T + t) * c.HV + j;
        if (c.gate == GateKind::scalar) std::fill(dec.begin(), dec.end(), std::exp(d.g.get(row)));
        if (c.gate == GateKind::per_channel)
          for (int64_t i = 0; i < K; ++i) dec[i] = std::exp(d.g.get(row * K + i));
        const double beta = d.beta.get(row);
        for (int64_t i = 0; i < K; ++i)
          for (int64_t e = 0; e < V; ++e) S[i * V + e] *= dec[i];
        for (int64_t e = 0; e < V; ++e) {
          double pred = 0;
          for (int64_t i = 0; i < K; ++i) pred += S[i * V + e] * k[i];
          const double u = beta * (v[e] - pred);
          for (int64_t i = 0; i < K; ++i) S[i * V + e] += k[i] * u;
        }
        for (int64_t e = 0; e < V; ++e) {
          double o = 0;
          for (int64_t i = 0; i < K; ++i) o += S[i * V + e] * q[i];
          res.o[row * V + e] = scale * o;
        }
      }
      for (int64_t e = 0; e < K * V; ++e) res.final_state[(n * c.HV + j) * K * V + e] = S[e];
    }
  }
  return res;
}

// Gate gradient of the plain recurrence, in long double with every state kept: for each step,
// dL/dS~_t = (I - beta k k^T) dL/dS_t with S~_t = diag(exp g_t) S_{t-1} the decayed state, and
// dg_t = sum over values of dL/dS~_t * S~_t (per key channel; GDN sums the channels). No
// running sums that cancel, so it arbitrates between the library's two algorithms.
// Returns dg in the layout of d.g ([B,T,HV] or [B,T,HV,K]).
inline std::vector<double> direct_gate_gradient(const DeltaData& d) {
  using LD = long double;
  const DeltaCase& c = d.c;
  const int64_t N = c.num_seqs(), K = c.K, V = c.V, group = c.HV / c.H;
  const LD scale = std::isnan(c.scale) ? 1.0L / std::sqrt(static_cast<LD>(K)) : c.scale;
  const int64_t gw = c.gate == GateKind::per_channel ? K : 1;
  std::vector<double> dg(c.B * c.T * c.HV * gw, 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = c.cu_seqlens.empty() ? n : 0;
    const int64_t t0 = c.cu_seqlens.empty() ? 0 : c.cu_seqlens[n];
    const int64_t t1 = c.cu_seqlens.empty() ? c.T : c.cu_seqlens[n + 1];
    for (int64_t j = 0; j < c.HV; ++j) {
      const int64_t h = j / group, L = t1 - t0;
      std::vector<LD> q(L * K), k(L * K), dec(L * K, 1.0L), beta(L), Sd(L * K * V), S(K * V, 0);
      if (c.initial_state)
        for (int64_t e = 0; e < K * V; ++e) S[e] = d.h0.get((n * c.HV + j) * K * V + e);
      for (int64_t s = 0; s < L; ++s) {
        const int64_t t = t0 + s, row = (b * c.T + t) * c.HV + j;
        LD sq = 0, sk = 0;
        for (int64_t i = 0; i < K; ++i) {
          q[s * K + i] = d.q.get(((b * c.T + t) * c.H + h) * K + i);
          k[s * K + i] = d.k.get(((b * c.T + t) * c.H + h) * K + i);
          sq += q[s * K + i] * q[s * K + i], sk += k[s * K + i] * k[s * K + i];
        }
        if (c.l2norm)
          for (int64_t i = 0; i < K; ++i) q[s * K + i] /= std::sqrt(sq + 1e-6L), k[s * K + i] /= std::sqrt(sk + 1e-6L);
        for (int64_t i = 0; i < K; ++i)
          dec[s * K + i] = std::exp(static_cast<LD>(d.g.get(c.gate == GateKind::per_channel ? row * K + i : row)));
        beta[s] = d.beta.get(row);
        for (int64_t i = 0; i < K; ++i)
          for (int64_t e = 0; e < V; ++e) S[i * V + e] *= dec[s * K + i];
        std::copy(S.begin(), S.end(), Sd.begin() + s * K * V);
        for (int64_t e = 0; e < V; ++e) {
          LD pred = 0;
          for (int64_t i = 0; i < K; ++i) pred += S[i * V + e] * k[s * K + i];
          const LD u = beta[s] * (static_cast<LD>(d.v.get(((b * c.T + t) * c.HV + j) * V + e)) - pred);
          for (int64_t i = 0; i < K; ++i) S[i * V + e] += k[s * K + i] * u;
        }
      }
      std::vector<LD> dS(K * V, 0);
      if (c.dht) for (int64_t e = 0; e < K * V; ++e) dS[e] = d.dht.get((n * c.HV + j) * K * V + e);
      for (int64_t s = L - 1; s >= 0; --s) {
        const int64_t row = (b * c.T + t0 + s) * c.HV + j;
        for (int64_t i = 0; i < K; ++i)
          for (int64_t e = 0; e < V; ++e) dS[i * V + e] += scale * q[s * K + i] * static_cast<LD>(d.dout.get(row * V + e));
        for (int64_t e = 0; e < V; ++e) {  // dS~ = (I - beta k k^T) dS, column by column
          LD kd = 0;
          for (int64_t i = 0; i < K; ++i) kd += k[s * K + i] * dS[i * V + e];
          for (int64_t i = 0; i < K; ++i) dS[i * V + e] -= beta[s] * k[s * K + i] * kd;
        }
        for (int64_t i = 0; i < K; ++i) {
          LD acc = 0;
          for (int64_t e = 0; e < V; ++e) acc += dS[i * V + e] * Sd[(s * K + i) * V + e];
          dg[row * gw + (gw == 1 ? 0 : i)] += static_cast<double>(acc);
          for (int64_t e = 0; e < V; ++e) dS[i * V + e] *= dec[s * K + i];
        }
      }
    }
  }
  return dg;
}

}  // namespace flashgrad::test
