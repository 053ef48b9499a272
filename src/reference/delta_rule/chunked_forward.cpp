// Chunked delta rule, forward of one (sequence, value head): gathering its inputs, then chunk by
// chunk G, A = (I + M)^{-1}, w, u, v_new, o, r and the next chunk-entry state (chunked.h).
// Arrays are row-major: x[t * K + d], h[d * V + col], A[(c * C + i) * C + j].
#include "chunked.h"

#include <algorithm>
#include <cmath>

#include "chunk_math.h"
#include "step_io.h"

namespace flashgrad::reference::delta_rule {

template <typename Real>
HeadInputs<Real> gather_head_inputs(const DeltaRuleParams& p, const DeltaRuleProblem& pr, int64_t n, int64_t j) {
  const HeadCursor c = HeadCursor::make(pr, n, j);
  HeadInputs<Real> x;
  x.T = c.len;
  x.K = pr.key_dim;
  x.V = pr.value_dim;
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

template HeadInputs<float> gather_head_inputs<float>(const DeltaRuleParams&, const DeltaRuleProblem&, int64_t, int64_t);
template HeadInputs<double> gather_head_inputs<double>(const DeltaRuleParams&, const DeltaRuleProblem&, int64_t,
                                                       int64_t);
template void chunked_forward_head<float>(const HeadInputs<float>&, ChunkedForwardTrace<float>&);
template void chunked_forward_head<double>(const HeadInputs<double>&, ChunkedForwardTrace<double>&);

}  // namespace flashgrad::reference::delta_rule
