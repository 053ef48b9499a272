// Test support for softmax attention: a random problem (padded or packed varlen, any mask), the
// calls through the public API with NaN-poisoned outputs, and a naive reference written directly
// from the formulas of docs/attention.md: it materializes each head's full score matrix in double
// and shares no code with the library.
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashgrad/attention.h"
#include "test_util.h"

namespace flashgrad::test {

struct AttnConfig {
  DType dtype = DType::f64;
  bool varlen = false;
  int64_t batch = 2, sq = 5, sk = 7;       // padded layout
  std::vector<int64_t> lens_q, lens_k;     // varlen layout: one length per sequence
  int64_t hq = 4, hk = 2, d = 3, dv = 2;
  float scale = kDefaultScale;
  MaskKind mask = MaskKind::none;
  int64_t window_left = -1, window_right = -1;
  std::vector<int64_t> prefix;  // prefix_lm: one per sequence
  std::vector<int64_t> bounds;  // candidate_isolation: h0, h1, c0, c1 per sequence
  float softcap = 0.0f;
  SoftcapMethod softcap_method = SoftcapMethod::tanh;
  bool padded_strides = false;  // give q, k, v, out, ... non-contiguous strides
  int threads = 1;
  Precision precision = Precision::fp32;
  double input_range = 1.0;  // q, k, v uniform in [-input_range, input_range)
};

struct AttnCase {
  AttnConfig cfg;
  int64_t num_seqs = 0, total_q = 0, total_k = 0;
  std::vector<int64_t> q_start, k_start, q_len, k_len;  // per sequence, in tokens
  HostTensor q, k, v, cu_q, cu_k, prefix, bounds;

  std::vector<int64_t> pad(size_t rank) const {
    // Extra elements in every dim except the first: rows, heads and batches get gaps.
    std::vector<int64_t> p(rank, cfg.padded_strides ? 1 : 0);
    p[0] = 0;
    return p;
  }
  std::vector<int64_t> q_like(int64_t x) const {
    return cfg.varlen ? std::vector<int64_t>{total_q, cfg.hq, x}
                      : std::vector<int64_t>{cfg.batch, cfg.sq, cfg.hq, x};
  }
  std::vector<int64_t> k_like(int64_t x) const {
    return cfg.varlen ? std::vector<int64_t>{total_k, cfg.hk, x}
                      : std::vector<int64_t>{cfg.batch, cfg.sk, cfg.hk, x};
  }
  std::vector<int64_t> lse_shape() const {
    return cfg.varlen ? std::vector<int64_t>{cfg.hq, total_q}
                      : std::vector<int64_t>{cfg.batch, cfg.hq, cfg.sq};
  }
  // Logical (row-major) flat indices.
  int64_t q_index(int64_t n, int64_t i, int64_t h, int64_t e, int64_t x) const {
    return ((q_start[n] + i) * cfg.hq + h) * x + e;
  }
  int64_t k_index(int64_t n, int64_t j, int64_t g, int64_t e, int64_t x) const {
    return ((k_start[n] + j) * cfg.hk + g) * x + e;
  }
  int64_t lse_index(int64_t n, int64_t h, int64_t i) const {
    return cfg.varlen ? h * total_q + q_start[n] + i : (n * cfg.hq + h) * cfg.sq + i;
  }
  double scale() const {
    return std::isnan(cfg.scale) ? 1.0 / std::sqrt(static_cast<double>(cfg.d)) : cfg.scale;
  }

  HostTensor make(DType dtype, std::vector<int64_t> shape) const {
    HostTensor t(dtype, shape, pad(shape.size()));
    return t;  // NaN-poisoned by construction
  }
  // Incoming gradients of the backward, uniform in [-1, 1): dout shaped like out, dlse like lse.
  HostTensor random_dout(DType dtype, std::mt19937_64& rng) const {
    HostTensor t = make(dtype, q_like(cfg.dv));
    t.fill_uniform(rng, -1, 1);
    return t;
  }
  HostTensor random_dlse(DType dtype, std::mt19937_64& rng) const {
    HostTensor t = make(dtype, lse_shape());
    t.fill_uniform(rng, -1, 1);
    return t;
  }
  DType out_dtype() const { return cfg.dtype == DType::e4m3 ? DType::bf16 : cfg.dtype; }
  DType lse_dtype() const { return cfg.dtype == DType::f64 ? DType::f64 : DType::f32; }

  AttentionParams params() const {
    AttentionParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    if (cfg.varlen) {
      p.cu_seqlens_q = cu_q.view();
      p.cu_seqlens_k = cu_k.view();
    }
    p.scale = cfg.scale;
    p.mask = cfg.mask;
    p.window_left = cfg.window_left;
    p.window_right = cfg.window_right;
    if (cfg.mask == MaskKind::prefix_lm) p.prefix_lengths = prefix.view();
    if (cfg.mask == MaskKind::candidate_isolation) p.candidate_bounds = bounds.view();
    p.softcap = cfg.softcap;
    p.softcap_method = cfg.softcap_method;
    p.exec.num_threads = cfg.threads;
    p.exec.precision = cfg.precision;
    return p;
  }
};

inline AttnCase make_case(const AttnConfig& cfg, std::mt19937_64& rng) {
  AttnCase c;
  c.cfg = cfg;
  if (cfg.varlen) {
    c.num_seqs = static_cast<int64_t>(cfg.lens_q.size());
    c.q_len = cfg.lens_q;
    c.k_len = cfg.lens_k;
  } else {
    c.num_seqs = cfg.batch;
    c.q_len.assign(cfg.batch, cfg.sq);
    c.k_len.assign(cfg.batch, cfg.sk);
  }
  std::vector<int64_t> cu_q{0}, cu_k{0};
  for (int64_t n = 0; n < c.num_seqs; ++n) {
    c.q_start.push_back(cu_q.back());
    c.k_start.push_back(cu_k.back());
    cu_q.push_back(cu_q.back() + c.q_len[n]);
    cu_k.push_back(cu_k.back() + c.k_len[n]);
  }
  c.total_q = cu_q.back();
  c.total_k = cu_k.back();
  c.q = c.make(cfg.dtype, c.q_like(cfg.d));
  c.k = c.make(cfg.dtype, c.k_like(cfg.d));
  c.v = c.make(cfg.dtype, c.k_like(cfg.dv));
  c.q.fill_uniform(rng, -cfg.input_range, cfg.input_range);
  c.k.fill_uniform(rng, -cfg.input_range, cfg.input_range);
  c.v.fill_uniform(rng, -cfg.input_range, cfg.input_range);
  c.cu_q = int32_tensor(cu_q);
  c.cu_k = int32_tensor(cu_k);
  if (!cfg.prefix.empty()) c.prefix = int32_tensor(cfg.prefix);
  if (!cfg.bounds.empty()) c.bounds = int32_tensor(cfg.bounds, {c.num_seqs, 4});
  return c;
}

// An fp8 (e4m3) problem: q, k, v in e4m3 with float32 descales [N, Hk] (true value = stored *
// descale of the sequence and kv head; q uses its query head's kv head).
struct Fp8Case {
  AttnCase c;
  HostTensor descale[3];  // q, k, v

  AttentionParams params() const {
    AttentionParams p = c.params();
    p.descale_q = descale[0].view();
    p.descale_k = descale[1].view();
    p.descale_v = descale[2].view();
    return p;
  }

  // The same problem in float32 on the dequantized values (each product rounded to float, as a
  // float32 computation of stored * descale would be).
  AttnCase dequantized() const {
    AttnCase f = c;
    f.cfg.dtype = DType::f32;
    const HostTensor* src[3] = {&c.q, &c.k, &c.v};
    HostTensor* dst[3] = {&f.q, &f.k, &f.v};
    for (int t = 0; t < 3; ++t) {
      const std::vector<int64_t>& shape = src[t]->shape();  // padded [B, S, H, X]
      *dst[t] = HostTensor(DType::f32, shape);
      for (int64_t e = 0; e < src[t]->numel(); ++e) {
        const int64_t head = (e / shape[3]) % shape[2];
        const int64_t n = e / (shape[3] * shape[2] * shape[1]);
        const int64_t g = t == 0 ? head / (c.cfg.hq / c.cfg.hk) : head;
        dst[t]->set(e, static_cast<float>(src[t]->get(e)) *
                           static_cast<float>(descale[t].get(n * c.cfg.hk + g)));
      }
    }
    return f;
  }
};

inline Fp8Case make_fp8_case(AttnConfig cfg, std::mt19937_64& rng) {
  cfg.dtype = DType::e4m3;
  cfg.varlen = false;
  Fp8Case f{make_case(cfg, rng), {}};
  for (auto& t : f.descale) {
    t = HostTensor(DType::f32, {f.c.num_seqs, cfg.hk});
    t.fill_uniform(rng, 0.05, 0.5);
  }
  return f;
}

// ---- the naive reference ------------------------------------------------------------------

// The mask rule of docs/attention.md, restated for the test.
inline bool naive_allowed(const AttnCase& c, int64_t n, int64_t i, int64_t j) {
  const int64_t a = i + c.k_len[n] - c.q_len[n];  // bottom-right alignment
  const AttnConfig& f = c.cfg;
  switch (f.mask) {
    case MaskKind::none: return true;
    case MaskKind::causal: return j <= a;
    case MaskKind::sliding_window:
      return (f.window_left == -1 || a - f.window_left <= j) &&
             (f.window_right == -1 || j <= a + f.window_right);
    case MaskKind::prefix_lm: {
      const int64_t P = f.prefix[n];
      return j <= a || (a < P && j < P);
    }
    case MaskKind::candidate_isolation: {
      const int64_t* b = &f.bounds[4 * n];
      auto in = [](int64_t x, int64_t lo, int64_t hi) { return lo <= x && x < hi; };
      return (in(j, b[0], b[1]) && (in(i, b[0], b[1]) || in(i, b[2], b[3]))) ||
             (in(i, b[2], b[3]) && j == i);
    }
  }
  return false;
}

struct NaiveForward {
  std::vector<double> out, lse;  // logical layouts of out and lse
  double min_abs_raw_score = std::numeric_limits<double>::infinity();  // over allowed pairs
};

// Direct formula: full score matrix S[i][j] per (sequence, head), softmax over allowed keys.
inline NaiveForward naive_forward(const AttnCase& c, const std::vector<double>& q,
                                  const std::vector<double>& k, const std::vector<double>& v) {
  const AttnConfig& f = c.cfg;
  NaiveForward r;
  r.out.assign(static_cast<size_t>(c.total_q * f.hq * f.dv), 0.0);
  r.lse.assign(static_cast<size_t>(c.total_q * f.hq), -std::numeric_limits<double>::infinity());
  const double scale = c.scale(), cap = f.softcap;
  for (int64_t n = 0; n < c.num_seqs; ++n) {
    const int64_t sq = c.q_len[n], sk = c.k_len[n];
    for (int64_t h = 0; h < f.hq; ++h) {
      const int64_t g = h / (f.hq / f.hk);
      std::vector<std::vector<double>> S(sq, std::vector<double>(sk, 0.0));
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) {
          double s = 0;
          for (int64_t e = 0; e < f.d; ++e)
            s += q[c.q_index(n, i, h, e, f.d)] * k[c.k_index(n, j, g, e, f.d)];
          s *= scale;
          if (naive_allowed(c, n, i, j)) r.min_abs_raw_score = std::min(r.min_abs_raw_score, std::fabs(s));
          if (cap > 0)
            s = f.softcap_method == SoftcapMethod::tanh ? cap * std::tanh(s / cap)
                                                        : s / (1 + std::fabs(s) / cap);
          S[i][j] = s;
        }
      for (int64_t i = 0; i < sq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < sk; ++j)
          if (naive_allowed(c, n, i, j)) m = std::max(m, S[i][j]);
        if (m == -std::numeric_limits<double>::infinity()) continue;  // fully masked: 0 / -inf
        double z = 0;
        for (int64_t j = 0; j < sk; ++j)
          if (naive_allowed(c, n, i, j)) z += std::exp(S[i][j] - m);
        for (int64_t j = 0; j < sk; ++j) {
          if (!naive_allowed(c, n, i, j)) continue;
          const double p = std::exp(S[i][j] - m) / z;
          for (int64_t e = 0; e < f.dv; ++e)
            r.out[c.q_index(n, i, h, e, f.dv)] += p * v[c.k_index(n, j, g, e, f.dv)];
        }
        r.lse[c.lse_index(n, h, i)] = m + std::log(z);
      }
    }
  }
  return r;
}

// ---- calls through the public API -----------------------------------------------------------

struct ForwardResult {
  HostTensor out, lse;
};

inline ForwardResult run_forward(const AttnCase& c, Workspace ws = {}) {
  ForwardResult r{c.make(c.out_dtype(), c.q_like(c.cfg.dv)), c.make(c.lse_dtype(), c.lse_shape())};
  attention_forward(c.params(), r.out.view(), r.lse.view(), ws);
  return r;
}

struct Gradients {
  HostTensor dq, dk, dv;
};

// dlse may be null (absent).
inline Gradients run_backward(const AttnCase& c, const ForwardResult& fwd, const HostTensor& dout,
                              const HostTensor* dlse, float z_loss_weight, Workspace ws = {}) {
  const DType gd = c.out_dtype();
  Gradients g{c.make(gd, c.q_like(c.cfg.d)), c.make(gd, c.k_like(c.cfg.d)),
              c.make(gd, c.k_like(c.cfg.dv))};
  AttentionBackwardInputs in;
  in.out = fwd.out.view();
  in.lse = fwd.lse.view();
  in.dout = dout.view();
  if (dlse) in.dlse = dlse->view();
  in.z_loss_weight = z_loss_weight;
  attention_backward(c.params(), in, g.dq.view(), g.dk.view(), g.dv.view(), ws);
  return g;
}

}  // namespace flashgrad::test
