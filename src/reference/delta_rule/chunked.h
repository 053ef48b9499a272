// The chunked delta rule on the CPU (docs/delta_rule.md, "The chunked algorithm"): chunks of
// C = 64 steps, the UT/WY transform, only chunk-entry states kept. A second implementation,
// independent of the recurrent one, whose intermediates GPU stages are compared with.
//
// Everything below works on one (sequence, value head) at a time, in compute precision Real,
// on row-major std::vectors. Notation for chunk c (steps [c*C, c*C + L), L <= C, i, j local):
//   G_i      cumulative log decay inside the chunk: G_i = g_{c*C} + ... + g_{c*C+i}  (per key
//            channel; GDN repeats its scalar over K, the plain rule has G = 0)
//   M_ij     = beta_i * sum_d k_id k_jd exp(G_id - G_jd)   for i > j (0 otherwise)
//   A        = (I + M)^{-1}                                 (L x L, unit lower triangular)
//   w        = A (beta * exp(G) * k)                        (L x K)
//   u        = A (beta * v)                                 (L x V)
//   h_c      the state entering chunk c (K x V); h_0 = initial state
//   v_new    = u - w h_c                                    (= beta_t r_t, L x V)
//   o_i      = scale * [ (q_i * exp(G_i))^T h_c + sum_{j<=i} (sum_d q_id k_jd exp(G_id - G_jd)) v_new_j ]
//   h_{c+1}  = exp(G_{L-1}) * h_c + sum_j (k_j * exp(G_{L-1} - G_j)) v_new_j^T
// Exponent differences are only formed for i >= j (bounded by 1 when g <= 0).
#pragma once

#include <cstdint>
#include <vector>

#include "core/problems.h"

namespace flashgrad::reference::delta_rule {

inline constexpr int64_t kChunk = 64;

// The inputs of one (sequence n, value head j), gathered into contiguous row-major arrays.
template <typename Real>
struct HeadInputs {
  int64_t T = 0, K = 0, V = 0;
  Real scale = 0;
  std::vector<Real> q, k;      // [T, K], L2-normalized when use_qk_l2norm_in_kernel
  std::vector<Real> q_rstd, k_rstd;  // [T]: 1 / sqrt(sum x^2 + eps) (1 without the norm)
  std::vector<Real> v;         // [T, V]
  std::vector<Real> g;         // [T, K]: log decay per key channel (GDN repeated; zeros without gate)
  std::vector<Real> beta;      // [T]
  std::vector<Real> h0;        // [K, V] (zeros without initial_state)
};

// `p`'s tensors must be host memory (copy device tensors to the host first); `pr` comes from
// validate_delta_rule_inputs (src/core/delta_rule_validation.h).
template <typename Real>
HeadInputs<Real> gather_head_inputs(const DeltaRuleParams& p, const DeltaRuleProblem& pr, int64_t n, int64_t j);

// Forward intermediates of one (sequence, value head). Rows of every [T, *] array are the
// sequence's steps; chunk c covers rows [c*C, min(T, (c+1)*C)).
template <typename Real>
struct ChunkedForwardTrace {
  int64_t num_chunks = 0;
  std::vector<Real> G;      // [T, K] cumulative log decay inside each chunk
  std::vector<Real> A;      // [num_chunks, C, C] (I + M)^{-1}; rows/cols past a short last chunk are 0
  std::vector<Real> w;      // [T, K]
  std::vector<Real> u;      // [T, V]
  std::vector<Real> v_new;  // [T, V]
  std::vector<Real> h;      // [num_chunks + 1, K, V]: h[c] enters chunk c, h[num_chunks] = final state
  std::vector<Real> o;      // [T, V]
  std::vector<Real> r;      // [T, V] prediction errors v_t - S~_t^T k_t (what saved_r holds)
};

template <typename Real>
void chunked_forward_head(const HeadInputs<Real>& x, ChunkedForwardTrace<Real>& f);

// Backward intermediates of one (sequence, value head), given do [T, V] and dht [K, V].
// Gradients w.r.t. q and k are w.r.t. the normalized q, k (before the L2-norm backward) and
// belong to this value head only (a q/k head sums them over its value heads).
template <typename Real>
struct ChunkedBackwardTrace {
  std::vector<Real> dh;      // [num_chunks + 1, K, V]: dL/dh[c]; dh[num_chunks] = dht, dh[0] = dh0
  std::vector<Real> dv_new;  // [T, V] dL/dv_new (through o and through the next chunk states)
  std::vector<Real> du;      // [T, V] = dv_new
  std::vector<Real> dw;      // [T, K] = -dv_new h_c^T
  std::vector<Real> dA;      // [num_chunks, C, C]
  std::vector<Real> dG;      // [T, K] dL/dG (cumulative gates)
  std::vector<Real> dq, dk;  // [T, K]
  std::vector<Real> dv;      // [T, V]
  std::vector<Real> dbeta;   // [T]
  std::vector<Real> dg;      // [T, K] per channel (GDN: sum over K gives dg)
};

// Recomputes the forward (its trace is filled too), then runs the chunk backward.
template <typename Real>
void chunked_backward_head(const HeadInputs<Real>& x, const std::vector<Real>& dout, const std::vector<Real>& dht,
                           ChunkedForwardTrace<Real>& f, ChunkedBackwardTrace<Real>& b);

// The whole op through the chunked algorithm, parallel over (sequence, q/k head); each item runs
// its value heads in order and sums their dq, dk before the L2-norm backward (deterministic).
template <typename Real>
void chunked_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out);
template <typename Real>
void chunked_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                      const DeltaRuleGrads& grads);

}  // namespace flashgrad::reference::delta_rule
