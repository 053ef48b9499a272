// Chunked delta rule, backward of one (sequence, value head): chunks in reverse order, each
// differentiating its forward formulas (chunked.h) by hand, from the gradient of the state that
// leaves the chunk to the gradient of the state that enters it.
// Arrays are row-major: x[t * K + d], h[d * V + col], A[(c * C + i) * C + j].
#include <algorithm>
#include <cmath>

#include "chunk_math.h"
#include "chunked.h"
#include "step_io.h"

namespace flashgrad::reference::delta_rule {

namespace {

// One chunk of the backward: views of the chunk's rows in the inputs, forward trace and gradients
// (local step i is global row s0 + i), and scratch reused across chunks. Each stage below
// differentiates one forward formula of chunked.h; they run in reverse order of the forward.
template <typename Real>
struct ChunkBackward {
  int64_t K, V, C = kChunk, L;
  Real scale;
  const Real *h, *dhn, *G, *A, *q, *k, *v, *beta, *w, *vn, *dO, *Gl;
  Real *dh, *dvn, *dq, *dk, *dG, *dv, *dbeta, *dw, *du, *dA, *dGl, *dg;
  Real *Kk, *Wb, *Ub, *dUb, *dWb, *dM, *tmp;  // scratch, C*C or C*K or C*V each

  // h_next = exp(G_last) h + sum_j kd_j v_new_j^T, kd_j = k_j exp(G_last - G_j).
  void state_update() {
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
  }

  // o_i = scale [ qg_i^T h + sum_{j<=i} P_ij v_new_j ], qg_i = q_i exp(G_i).
  void output() {
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t d = 0; d < K; ++d) {
        const Real e = std::exp(G[i * K + d]);
        Real dqg = 0;
        for (int64_t col = 0; col < V; ++col) {
          dqg += h[d * V + col] * dO[i * V + col];
          dh[d * V + col] += scale * q[i * K + d] * e * dO[i * V + col];
        }
        dqg *= scale;
        dq[i * K + d] += dqg * e;
        dG[i * K + d] += dqg * q[i * K + d] * e;
      }
      for (int64_t j = 0; j <= i; ++j) {
        Real dP = 0;
        const Real P = decayed_dot(&q[i * K], &k[j * K], &G[i * K], &G[j * K], K);
        for (int64_t col = 0; col < V; ++col) {
          dP += dO[i * V + col] * vn[j * V + col];
          dvn[j * V + col] += scale * P * dO[i * V + col];
        }
        dP *= scale;
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
  }

  // v_new = u - w h:  du = dv_new;  dw = -dv_new h^T;  dh -= w^T dv_new.
  void prediction() {
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
  }

  // u = A Ub, w = A Wb (Ub = beta v, Wb = beta exp(G) k):
  // dA_ij = du_i . Ub_j + dw_i . Wb_j (j <= i);  dUb = A^T du;  dWb = A^T dw.
  void wy_products() {
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t d = 0; d < K; ++d) Wb[j * K + d] = beta[j] * std::exp(G[j * K + d]) * k[j * K + d];
      for (int64_t col = 0; col < V; ++col) Ub[j * V + col] = beta[j] * v[j * V + col];
    }
    std::fill(dUb, dUb + C * V, Real(0));
    std::fill(dWb, dWb + C * K, Real(0));
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
  }

  // A = (I + M)^{-1}:  dM = -A^T dA A^T, kept on the strict lower triangle (M's support).
  // tmp = dA A^T (lower x upper), then dM = -A^T tmp.
  void inverse() {
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
  }

  // M_ij = beta_i Kk_ij, Kk_ij = sum_d k_id k_jd exp(G_id - G_jd)  (i > j).
  void key_products() {
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
  }

  // G_i = g_0 + ... + g_i inside the chunk, so dg_i = sum_{i' >= i} dG_i' (reverse cumsum).
  void gates() {
    for (int64_t d = 0; d < K; ++d) {
      Real acc = 0;
      for (int64_t i = L - 1; i >= 0; --i) {
        acc += dG[i * K + d];
        dg[i * K + d] = acc;
      }
    }
  }
};

}  // namespace

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
    ChunkBackward<Real> cb;
    cb.K = K;
    cb.V = V;
    cb.L = L;
    cb.scale = x.scale;
    cb.h = &f.h[c * K * V];
    cb.dhn = &b.dh[(c + 1) * K * V];
    cb.dh = &b.dh[c * K * V];
    cb.G = &f.G[s0 * K];
    cb.Gl = &f.G[(s0 + L - 1) * K];
    cb.A = &f.A[c * C * C];
    cb.q = &x.q[s0 * K];
    cb.k = &x.k[s0 * K];
    cb.v = &x.v[s0 * V];
    cb.beta = &x.beta[s0];
    cb.w = &f.w[s0 * K];
    cb.vn = &f.v_new[s0 * V];
    cb.dO = &dout[s0 * V];
    cb.dvn = &b.dv_new[s0 * V];
    cb.dq = &b.dq[s0 * K];
    cb.dk = &b.dk[s0 * K];
    cb.dG = &b.dG[s0 * K];
    cb.dGl = &b.dG[(s0 + L - 1) * K];
    cb.dv = &b.dv[s0 * V];
    cb.dbeta = &b.dbeta[s0];
    cb.dw = &b.dw[s0 * K];
    cb.du = &b.du[s0 * V];
    cb.dA = &b.dA[c * C * C];
    cb.dg = &b.dg[s0 * K];
    cb.Kk = Kk.data();
    cb.Wb = Wb.data();
    cb.Ub = Ub.data();
    cb.dUb = dUb.data();
    cb.dWb = dWb.data();
    cb.dM = dM.data();
    cb.tmp = tmp.data();

    for (int64_t i = 0; i < L; ++i)  // Kk_ij (i > j), shared by the two last stages
      for (int64_t j = 0; j < i; ++j)
        Kk[i * C + j] = decayed_dot(&cb.k[i * K], &cb.k[j * K], &cb.G[i * K], &cb.G[j * K], K);
    cb.state_update();  // h_{c+1} -> dh_c (first part), dv_new, dk, dG
    cb.output();        // o -> dq, dk, dG, dv_new, dh_c
    cb.prediction();    // v_new = u - w h_c -> du, dw, dh_c
    cb.wy_products();   // u, w = A (.) -> dA, dv, dbeta, dk, dG
    cb.inverse();       // A = (I + M)^{-1} -> dM
    cb.key_products();  // M = diag(beta) Kk -> dbeta, dk, dG
    cb.gates();         // G = cumsum(g) -> dg
  }
}

template void chunked_backward_head<float>(const HeadInputs<float>&, const std::vector<float>&,
                                           const std::vector<float>&, ChunkedForwardTrace<float>&,
                                           ChunkedBackwardTrace<float>&);
template void chunked_backward_head<double>(const HeadInputs<double>&, const std::vector<double>&,
                                            const std::vector<double>&, ChunkedForwardTrace<double>&,
                                            ChunkedBackwardTrace<double>&);

}  // namespace flashgrad::reference::delta_rule
