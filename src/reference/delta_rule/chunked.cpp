// Chunked delta rule (UT/WY transform) for one (sequence, value head), and the op over all of
// them. Notation and formulas: chunked.h. Arrays are row-major: x[t * K + d], h[d * V + col],
// A[(c * C + i) * C + j].
#include "chunked.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "step_io.h"

namespace flashgrad::reference::delta_rule {

template <typename Real>
HeadInputs<Real> gather_head_inputs(const DeltaRuleParams& p, const DeltaRuleProblem& pr, int64_t n, int64_t j) {
  const HeadCursor c = HeadCursor::make(pr, n, j);
  HeadInputs<Real> x;
  x.T = c.len;
  x.K = pr.key_dim;
  x.V = pr.value_dim;
  x.gate = pr.gate;
  x.scale = static_cast<Real>(pr.scale);
  const int64_t T = x.T, K = x.K, V = x.V;
  x.q.resize(T * K);
  x.k.resize(T * K);
  x.q_rstd.resize(T);
  x.k_rstd.resize(T);
  x.v.resize(T * V);
  x.g.assign(T * K, Real(0));
  x.beta.resize(T);
  std::vector<Real> scratch(StepInputs<Real>::scratch_size(K, V));
  StepInputs<Real> s;
  s.bind(scratch.data(), K);
  for (int64_t t = 0; t < T; ++t) {
    s.load(p, pr, c, t);
    std::copy(s.q, s.q + K, x.q.begin() + t * K);
    std::copy(s.k, s.k + K, x.k.begin() + t * K);
    std::copy(s.v, s.v + V, x.v.begin() + t * V);
    std::copy(s.g, s.g + K, x.g.begin() + t * K);
    x.q_rstd[t] = s.q_rstd;
    x.k_rstd[t] = s.k_rstd;
    x.beta[t] = s.beta;
  }
  x.h0.assign(K * V, Real(0));
  if (pr.has_initial_state) load_state<Real>(p.initial_state, n, j, K, V, x.h0.data());
  return x;
}

namespace {

// Steps [begin, begin + len) of chunk c.
struct ChunkRange {
  int64_t begin, len;
};
inline ChunkRange chunk_range(int64_t c, int64_t T) { return {c * kChunk, std::min(kChunk, T - c * kChunk)}; }

// sum_d a_d b_d exp(G_id - G_jd): the decayed dot product of row i of a and row j of b (i >= j).
template <typename Real>
Real decayed_dot(const Real* a, const Real* b, const Real* Gi, const Real* Gj, int64_t K) {
  Real acc = 0;
  for (int64_t d = 0; d < K; ++d) acc += a[d] * b[d] * std::exp(Gi[d] - Gj[d]);
  return acc;
}

}  // namespace

// ---- forward ----------------------------------------------------------------------------------

template <typename Real>
void chunked_forward_head(const HeadInputs<Real>& x, ChunkedForwardTrace<Real>& f) {
  const int64_t T = x.T, K = x.K, V = x.V, C = kChunk;
  const int64_t NC = (T + C - 1) / C;
  f.num_chunks = NC;
  f.G.assign(T * K, 0);
  f.A.assign(NC * C * C, 0);
  f.w.assign(T * K, 0);
  f.u.assign(T * V, 0);
  f.v_new.assign(T * V, 0);
  f.h.assign((NC + 1) * K * V, 0);
  f.o.assign(T * V, 0);
  f.r.assign(T * V, 0);
  std::copy(x.h0.begin(), x.h0.end(), f.h.begin());

  std::vector<Real> Kk(C * C), Wb(C * K), Ub(C * V);
  for (int64_t c = 0; c < NC; ++c) {
    const auto [s0, L] = chunk_range(c, T);
    const Real* h = &f.h[c * K * V];
    Real* h_next = &f.h[(c + 1) * K * V];
    Real* G = &f.G[s0 * K];
    Real* A = &f.A[c * C * C];
    const Real* q = &x.q[s0 * K];
    const Real* k = &x.k[s0 * K];
    const Real* v = &x.v[s0 * V];
    const Real* beta = &x.beta[s0];

    // G: cumulative log decay inside the chunk.
    for (int64_t i = 0; i < L; ++i)
      for (int64_t d = 0; d < K; ++d) G[i * K + d] = x.g[(s0 + i) * K + d] + (i ? G[(i - 1) * K + d] : Real(0));

    // Kk_ij = k_i . (k_j exp(G_i - G_j)), i > j;  M = diag(beta) Kk.
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) Kk[i * C + j] = decayed_dot(&k[i * K], &k[j * K], &G[i * K], &G[j * K], K);

    // A = (I + M)^{-1} by forward substitution, column by column:
    // A_jj = 1;  A_ij = -sum_{m=j}^{i-1} M_im A_mj  for i > j.
    for (int64_t j = 0; j < L; ++j) {
      A[j * C + j] = 1;
      for (int64_t i = j + 1; i < L; ++i) {
        Real acc = 0;
        for (int64_t m = j; m < i; ++m) acc += beta[i] * Kk[i * C + m] * A[m * C + j];
        A[i * C + j] = -acc;
      }
    }

    // w = A (beta exp(G) k), u = A (beta v).
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t d = 0; d < K; ++d) Wb[j * K + d] = beta[j] * std::exp(G[j * K + d]) * k[j * K + d];
      for (int64_t col = 0; col < V; ++col) Ub[j * V + col] = beta[j] * v[j * V + col];
    }
    Real* w = &f.w[s0 * K];
    Real* u = &f.u[s0 * V];
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const Real a = A[i * C + j];
        for (int64_t d = 0; d < K; ++d) w[i * K + d] += a * Wb[j * K + d];
        for (int64_t col = 0; col < V; ++col) u[i * V + col] += a * Ub[j * V + col];
      }

    // v_new = u - w h.
    Real* vn = &f.v_new[s0 * V];
    for (int64_t i = 0; i < L; ++i)
      for (int64_t col = 0; col < V; ++col) {
        Real acc = u[i * V + col];
        for (int64_t d = 0; d < K; ++d) acc -= w[i * K + d] * h[d * V + col];
        vn[i * V + col] = acc;
      }

    // o_i = scale [ (q_i exp(G_i))^T h + sum_{j<=i} P_ij v_new_j ];
    // r_i = v_i - (k_i exp(G_i))^T h - sum_{j<i} Kk_ij v_new_j.
    Real* o = &f.o[s0 * V];
    Real* r = &f.r[s0 * V];
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t col = 0; col < V; ++col) {
        Real oq = 0, rk = 0;
        for (int64_t d = 0; d < K; ++d) {
          const Real e = std::exp(G[i * K + d]);
          oq += q[i * K + d] * e * h[d * V + col];
          rk += k[i * K + d] * e * h[d * V + col];
        }
        o[i * V + col] = oq;
        r[i * V + col] = v[i * V + col] - rk;
      }
      for (int64_t j = 0; j <= i; ++j) {
        const Real P = decayed_dot(&q[i * K], &k[j * K], &G[i * K], &G[j * K], K);
        const Real Kij = j < i ? Kk[i * C + j] : Real(0);
        for (int64_t col = 0; col < V; ++col) {
          o[i * V + col] += P * vn[j * V + col];
          r[i * V + col] -= Kij * vn[j * V + col];
        }
      }
      for (int64_t col = 0; col < V; ++col) o[i * V + col] *= x.scale;
    }

    // h_next = exp(G_last) h + sum_j (k_j exp(G_last - G_j)) v_new_j^T.
    const Real* Gl = &G[(L - 1) * K];
    for (int64_t d = 0; d < K; ++d) {
      const Real el = std::exp(Gl[d]);
      for (int64_t col = 0; col < V; ++col) h_next[d * V + col] = el * h[d * V + col];
      for (int64_t j = 0; j < L; ++j) {
        const Real kd = k[j * K + d] * std::exp(Gl[d] - G[j * K + d]);
        for (int64_t col = 0; col < V; ++col) h_next[d * V + col] += kd * vn[j * V + col];
      }
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------

template <typename Real>
void chunked_backward_head(const HeadInputs<Real>& x, const std::vector<Real>& dout, const std::vector<Real>& dht,
                           ChunkedForwardTrace<Real>& f, ChunkedBackwardTrace<Real>& b) {
  chunked_forward_head(x, f);
  const int64_t T = x.T, K = x.K, V = x.V, C = kChunk, NC = f.num_chunks;
  b.dh.assign((NC + 1) * K * V, 0);
  b.dv_new.assign(T * V, 0);
  b.du.assign(T * V, 0);
  b.dw.assign(T * K, 0);
  b.dA.assign(NC * C * C, 0);
  b.dG.assign(T * K, 0);
  b.dq.assign(T * K, 0);
  b.dk.assign(T * K, 0);
  b.dv.assign(T * V, 0);
  b.dbeta.assign(T, 0);
  b.dg.assign(T * K, 0);
  std::copy(dht.begin(), dht.end(), b.dh.begin() + NC * K * V);

  std::vector<Real> Kk(C * C), Wb(C * K), Ub(C * V), dUb(C * V), dWb(C * K), dM(C * C), tmp(C * C);
  for (int64_t c = NC - 1; c >= 0; --c) {
    const auto [s0, L] = chunk_range(c, T);
    const Real* h = &f.h[c * K * V];
    const Real* dhn = &b.dh[(c + 1) * K * V];
    Real* dh = &b.dh[c * K * V];
    const Real* G = &f.G[s0 * K];
    const Real* A = &f.A[c * C * C];
    const Real* q = &x.q[s0 * K];
    const Real* k = &x.k[s0 * K];
    const Real* v = &x.v[s0 * V];
    const Real* beta = &x.beta[s0];
    const Real* w = &f.w[s0 * K];
    const Real* vn = &f.v_new[s0 * V];
    const Real* dO = &dout[s0 * V];
    Real* dvn = &b.dv_new[s0 * V];
    Real* dq = &b.dq[s0 * K];
    Real* dk = &b.dk[s0 * K];
    Real* dG = &b.dG[s0 * K];
    Real* dv = &b.dv[s0 * V];
    Real* dbeta = &b.dbeta[s0];
    Real* dw = &b.dw[s0 * K];
    Real* du = &b.du[s0 * V];
    Real* dA = &b.dA[c * C * C];
    const Real* Gl = &G[(L - 1) * K];
    Real* dGl = &dG[(L - 1) * K];

    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) Kk[i * C + j] = decayed_dot(&k[i * K], &k[j * K], &G[i * K], &G[j * K], K);

    // h_next = exp(G_last) h + sum_j kd_j v_new_j^T, kd_j = k_j exp(G_last - G_j).
    for (int64_t d = 0; d < K; ++d) {
      const Real el = std::exp(Gl[d]);
      Real hdh = 0;
      for (int64_t col = 0; col < V; ++col) {
        dh[d * V + col] = el * dhn[d * V + col];
        hdh += h[d * V + col] * dhn[d * V + col];
      }
      dGl[d] += el * hdh;
      for (int64_t j = 0; j < L; ++j) {
        const Real kd = k[j * K + d] * std::exp(Gl[d] - G[j * K + d]);
        Real dkd = 0;  // (dh_next v_new_j)_d
        for (int64_t col = 0; col < V; ++col) {
          dvn[j * V + col] += kd * dhn[d * V + col];
          dkd += dhn[d * V + col] * vn[j * V + col];
        }
        dk[j * K + d] += dkd * std::exp(Gl[d] - G[j * K + d]);
        dGl[d] += dkd * kd;
        dG[j * K + d] -= dkd * kd;
      }
    }

    // o_i = scale [ qg_i^T h + sum_{j<=i} P_ij v_new_j ], qg_i = q_i exp(G_i).
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t d = 0; d < K; ++d) {
        const Real e = std::exp(G[i * K + d]);
        Real dqg = 0;
        for (int64_t col = 0; col < V; ++col) {
          dqg += h[d * V + col] * dO[i * V + col];
          dh[d * V + col] += x.scale * q[i * K + d] * e * dO[i * V + col];
        }
        dqg *= x.scale;
        dq[i * K + d] += dqg * e;
        dG[i * K + d] += dqg * q[i * K + d] * e;
      }
      for (int64_t j = 0; j <= i; ++j) {
        Real dP = 0;
        const Real P = decayed_dot(&q[i * K], &k[j * K], &G[i * K], &G[j * K], K);
        for (int64_t col = 0; col < V; ++col) {
          dP += dO[i * V + col] * vn[j * V + col];
          dvn[j * V + col] += x.scale * P * dO[i * V + col];
        }
        dP *= x.scale;
        for (int64_t d = 0; d < K; ++d) {
          const Real e = std::exp(G[i * K + d] - G[j * K + d]);
          dq[i * K + d] += dP * k[j * K + d] * e;
          dk[j * K + d] += dP * q[i * K + d] * e;
          const Real dE = dP * q[i * K + d] * k[j * K + d] * e;
          dG[i * K + d] += dE;
          dG[j * K + d] -= dE;
        }
      }
    }

    // v_new = u - w h:  du = dv_new;  dw = -dv_new h^T;  dh -= w^T dv_new.
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t col = 0; col < V; ++col) du[i * V + col] = dvn[i * V + col];
      for (int64_t d = 0; d < K; ++d) {
        Real acc = 0;
        for (int64_t col = 0; col < V; ++col) {
          acc += dvn[i * V + col] * h[d * V + col];
          dh[d * V + col] -= w[i * K + d] * dvn[i * V + col];
        }
        dw[i * K + d] = -acc;
      }
    }

    // u = A Ub, w = A Wb (Ub = beta v, Wb = beta exp(G) k):
    // dA_ij = du_i . Ub_j + dw_i . Wb_j (j <= i);  dUb = A^T du;  dWb = A^T dw.
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t d = 0; d < K; ++d) Wb[j * K + d] = beta[j] * std::exp(G[j * K + d]) * k[j * K + d];
      for (int64_t col = 0; col < V; ++col) Ub[j * V + col] = beta[j] * v[j * V + col];
    }
    std::fill(dUb.begin(), dUb.end(), Real(0));
    std::fill(dWb.begin(), dWb.end(), Real(0));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        Real acc = 0;
        for (int64_t col = 0; col < V; ++col) acc += du[i * V + col] * Ub[j * V + col];
        for (int64_t d = 0; d < K; ++d) acc += dw[i * K + d] * Wb[j * K + d];
        dA[i * C + j] = acc;
        const Real a = A[i * C + j];
        for (int64_t col = 0; col < V; ++col) dUb[j * V + col] += a * du[i * V + col];
        for (int64_t d = 0; d < K; ++d) dWb[j * K + d] += a * dw[i * K + d];
      }
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t col = 0; col < V; ++col) {
        dv[j * V + col] = beta[j] * dUb[j * V + col];
        dbeta[j] += v[j * V + col] * dUb[j * V + col];
      }
      for (int64_t d = 0; d < K; ++d) {
        const Real e = std::exp(G[j * K + d]);
        dk[j * K + d] += beta[j] * e * dWb[j * K + d];
        dbeta[j] += e * k[j * K + d] * dWb[j * K + d];
        dG[j * K + d] += dWb[j * K + d] * Wb[j * K + d];
      }
    }

    // A = (I + M)^{-1}:  dM = -A^T dA A^T, kept on the strict lower triangle (M's support).
    // tmp = dA A^T (lower x upper), then dM = -A^T tmp.
    for (int64_t i = 0; i < L; ++i)
      for (int64_t m = 0; m < L; ++m) {
        Real acc = 0;  // sum_j dA_ij A_mj, j <= min(i, m)
        for (int64_t j = 0; j <= std::min(i, m); ++j) acc += dA[i * C + j] * A[m * C + j];
        tmp[i * C + m] = acc;
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) {
        Real acc = 0;  // sum_m A_mi tmp_mj, m >= i
        for (int64_t m = i; m < L; ++m) acc += A[m * C + i] * tmp[m * C + j];
        dM[i * C + j] = -acc;
      }

    // M_ij = beta_i Kk_ij, Kk_ij = sum_d k_id k_jd exp(G_id - G_jd)  (i > j).
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) {
        dbeta[i] += dM[i * C + j] * Kk[i * C + j];
        const Real dKk = beta[i] * dM[i * C + j];
        for (int64_t d = 0; d < K; ++d) {
          const Real e = std::exp(G[i * K + d] - G[j * K + d]);
          dk[i * K + d] += dKk * k[j * K + d] * e;
          dk[j * K + d] += dKk * k[i * K + d] * e;
          const Real dE = dKk * k[i * K + d] * k[j * K + d] * e;
          dG[i * K + d] += dE;
          dG[j * K + d] -= dE;
        }
      }

    // G_i = g_0 + ... + g_i inside the chunk, so dg_i = sum_{i' >= i} dG_i' (reverse cumsum).
    for (int64_t d = 0; d < K; ++d) {
      Real acc = 0;
      for (int64_t i = L - 1; i >= 0; --i) {
        acc += dG[i * K + d];
        b.dg[(s0 + i) * K + d] = acc;
      }
    }
  }
}

// ---- the op -----------------------------------------------------------------------------------

template <typename Real>
void chunked_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out) {
  const int64_t HV = pr.value_heads, V = pr.value_dim, K = pr.key_dim;
  const int workers = resolve_num_threads(p.exec.num_threads, pr.num_seqs * HV);
  parallel_for(pr.num_seqs * HV, workers, [&](int64_t item, int) {
    const int64_t n = item / HV, j = item % HV;
    const HeadCursor c = HeadCursor::make(pr, n, j);
    const HeadInputs<Real> x = gather_head_inputs<Real>(p, pr, n, j);
    ChunkedForwardTrace<Real> f;
    chunked_forward_head(x, f);
    for (int64_t t = 0; t < c.len; ++t) {
      store_row<Real>(out.o, c.b, c.t0 + t, j, V, &f.o[t * V]);
      if (out.saved_r.present()) store_row<Real>(out.saved_r, c.b, c.t0 + t, j, V, &f.r[t * V]);
    }
    if (out.final_state.present()) store_state<Real>(out.final_state, n, j, K, V, &f.h[f.num_chunks * K * V]);
  });
}

template <typename Real>
void chunked_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                      const DeltaRuleGrads& grads) {
  const int64_t H = pr.heads, HV = pr.value_heads, group = HV / H, V = pr.value_dim, K = pr.key_dim;
  const int workers = resolve_num_threads(p.exec.num_threads, pr.num_seqs * H);
  // One item per (sequence, q/k head): its value heads run in order and their dq, dk add up in
  // that order, so the result does not depend on the number of workers.
  parallel_for(pr.num_seqs * H, workers, [&](int64_t item, int) {
    const int64_t n = item / H, h = item % H;
    const HeadCursor c0 = HeadCursor::make(pr, n, h * group);
    const int64_t T = c0.len;
    std::vector<Real> dq_sum(T * K, 0), dk_sum(T * K, 0), dout(T * V), dht(K * V);
    HeadInputs<Real> x;
    for (int64_t j = h * group; j < (h + 1) * group; ++j) {
      const HeadCursor c = HeadCursor::make(pr, n, j);
      x = gather_head_inputs<Real>(p, pr, n, j);
      for (int64_t t = 0; t < T; ++t) load_row<Real>(in.dout, c.b, c.t0 + t, j, V, false, &dout[t * V]);
      if (in.dht.present())
        load_state<Real>(in.dht, n, j, K, V, dht.data());
      else
        std::fill(dht.begin(), dht.end(), Real(0));
      ChunkedForwardTrace<Real> f;
      ChunkedBackwardTrace<Real> b;
      chunked_backward_head(x, dout, dht, f, b);
      for (int64_t i = 0; i < T * K; ++i) {
        dq_sum[i] += b.dq[i];
        dk_sum[i] += b.dk[i];
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t tt = c.t0 + t;
        store_row<Real>(grads.dv, c.b, tt, j, V, &b.dv[t * V]);
        host::store<Real>(grads.dbeta.data, grads.dbeta.dtype, offset3(grads.dbeta, c.b, tt, j), b.dbeta[t]);
        if (pr.gate == GateKind::per_channel) {
          store_row<Real>(grads.dg, c.b, tt, j, K, &b.dg[t * K]);
        } else if (pr.gate == GateKind::scalar) {
          Real acc = 0;
          for (int64_t d = 0; d < K; ++d) acc += b.dg[t * K + d];
          host::store<Real>(grads.dg.data, grads.dg.dtype, offset3(grads.dg, c.b, tt, j), acc);
        }
      }
      if (grads.dh0.present()) store_state<Real>(grads.dh0, n, j, K, V, b.dh.data());
    }
    // L2-norm backward (rstd is the same for every value head of the group), then store.
    for (int64_t t = 0; t < T; ++t) {
      if (p.use_qk_l2norm_in_kernel) {
        l2norm_backward<Real>(&x.q[t * K], x.q_rstd[t], K, &dq_sum[t * K]);
        l2norm_backward<Real>(&x.k[t * K], x.k_rstd[t], K, &dk_sum[t * K]);
      }
      store_row<Real>(grads.dq, c0.b, c0.t0 + t, h, K, &dq_sum[t * K]);
      store_row<Real>(grads.dk, c0.b, c0.t0 + t, h, K, &dk_sum[t * K]);
    }
  });
}

#define FLASHGRAD_INSTANTIATE_CHUNKED(Real)                                                              \
  template HeadInputs<Real> gather_head_inputs<Real>(const DeltaRuleParams&, const DeltaRuleProblem&,    \
                                                     int64_t, int64_t);                                  \
  template void chunked_forward_head<Real>(const HeadInputs<Real>&, ChunkedForwardTrace<Real>&);         \
  template void chunked_backward_head<Real>(const HeadInputs<Real>&, const std::vector<Real>&,           \
                                            const std::vector<Real>&, ChunkedForwardTrace<Real>&,        \
                                            ChunkedBackwardTrace<Real>&);                                \
  template void chunked_forward<Real>(const DeltaRuleParams&, const DeltaRuleProblem&,                   \
                                      const DeltaRuleForwardOutputs&);                                   \
  template void chunked_backward<Real>(const DeltaRuleParams&, const DeltaRuleProblem&,                  \
                                       const DeltaRuleBackwardInputs&, const DeltaRuleGrads&);

FLASHGRAD_INSTANTIATE_CHUNKED(float)
FLASHGRAD_INSTANTIATE_CHUNKED(double)

}  // namespace flashgrad::reference::delta_rule
