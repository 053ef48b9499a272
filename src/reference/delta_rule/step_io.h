// Reading and writing one time step of one (sequence, value head) of a delta-rule call, in the
// compute precision Real (float or double), straight from the user's strided tensors.
//
// Index math: sequence n lives in batch row b = pr.batch_of(n) at tokens
// [pr.t_begin(n), pr.t_begin(n) + pr.t_len(n)); value head j reads q/k head h = j / (HV / H).
// Element (i0, i1, i2, i3) of a view sits at sum_d i_d * stride[d] (strides in elements, int64);
// validation makes the last dim contiguous, so a row of D elements is read from one offset.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/host_dtype.h"
#include "core/problems.h"

namespace flashgrad::reference::delta_rule {

// Epsilon of the in-kernel L2 norm, inside the square root (fla's l2norm).
inline constexpr double kL2NormEps = 1e-6;

inline int64_t offset3(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2];
}
inline int64_t offset4(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] + i3 * t.stride[3];
}

// Which (sequence, value head) a worker is on, and where its rows are.
struct HeadCursor {
  int64_t b = 0;       // batch row
  int64_t t0 = 0;      // first token of the sequence in that row
  int64_t len = 0;     // number of steps
  int64_t n = 0;       // sequence index (indexes initial_state / final_state)
  int64_t j = 0;       // value head
  int64_t h = 0;       // q/k head read by value head j

  static HeadCursor make(const DeltaRuleProblem& pr, int64_t n, int64_t j) {
    HeadCursor c;
    c.b = pr.batch_of(n);
    c.t0 = pr.t_begin(n);
    c.len = pr.t_len(n);
    c.n = n;
    c.j = j;
    c.h = j / (pr.value_heads / pr.heads);
    return c;
  }
};

// Loads x[b, t, h, 0:D] as Real; when `normalize`, replaces it by x * rstd with
// rstd = 1 / sqrt(sum x^2 + eps) and returns rstd (1 otherwise).
template <typename Real>
Real load_row(const TensorView& x, int64_t b, int64_t t, int64_t h, int64_t D, bool normalize, Real* dst) {
  host::load_n<Real>(x.data, x.dtype, offset4(x, b, t, h, 0), D, dst);
  if (!normalize) return Real(1);
  Real ss = 0;
  for (int64_t d = 0; d < D; ++d) ss += dst[d] * dst[d];
  const Real rstd = Real(1) / std::sqrt(ss + static_cast<Real>(kL2NormEps));
  for (int64_t d = 0; d < D; ++d) dst[d] *= rstd;
  return rstd;
}

template <typename Real>
void store_row(const TensorView& x, int64_t b, int64_t t, int64_t h, int64_t D, const Real* src) {
  host::store_n<Real>(x.data, x.dtype, offset4(x, b, t, h, 0), D, src);
}

// Backward of y = x * rstd (x already replaced by y): dx = rstd * (dy - (dy . y) y), in place on dy.
template <typename Real>
void l2norm_backward(const Real* y, Real rstd, int64_t D, Real* dy) {
  Real dot = 0;
  for (int64_t d = 0; d < D; ++d) dot += dy[d] * y[d];
  for (int64_t d = 0; d < D; ++d) dy[d] = rstd * (dy[d] - dot * y[d]);
}

// The inputs of one step of one value head: q, k (normalized when asked), v, decay, beta.
template <typename Real>
struct StepInputs {
  Real* q = nullptr;      // [K]
  Real* k = nullptr;      // [K]
  Real* v = nullptr;      // [V]
  Real* decay = nullptr;  // [K]: exp(g) per key channel (all equal for GDN, all 1 without a gate)
  Real* g = nullptr;      // [K]: the log decay per key channel (0 without a gate)
  Real beta = 0;
  Real q_rstd = 1, k_rstd = 1;

  // Points the arrays at scratch_size(K, V) Reals of `scratch`.
  void bind(Real* scratch, int64_t K) {
    q = scratch;
    k = q + K;
    decay = k + K;
    g = decay + K;
    v = g + K;
  }
  static int64_t scratch_size(int64_t K, int64_t V) { return 4 * K + V; }

  void load(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const HeadCursor& c, int64_t step) {
    const int64_t t = c.t0 + step, K = pr.key_dim, V = pr.value_dim;
    const bool norm = p.use_qk_l2norm_in_kernel;
    q_rstd = load_row<Real>(p.q, c.b, t, c.h, K, norm, q);
    k_rstd = load_row<Real>(p.k, c.b, t, c.h, K, norm, k);
    load_row<Real>(p.v, c.b, t, c.j, V, false, v);
    beta = host::load<Real>(p.beta.data, p.beta.dtype, offset3(p.beta, c.b, t, c.j));
    switch (pr.gate) {
      case GateKind::none:
        for (int64_t i = 0; i < K; ++i) g[i] = 0;
        break;
      case GateKind::scalar: {
        const Real gs = host::load<Real>(p.g.data, p.g.dtype, offset3(p.g, c.b, t, c.j));
        for (int64_t i = 0; i < K; ++i) g[i] = gs;
        break;
      }
      case GateKind::per_channel:
        load_row<Real>(p.g, c.b, t, c.j, K, false, g);
        break;
    }
    for (int64_t i = 0; i < K; ++i) decay[i] = std::exp(g[i]);
  }
};

// State tensors [N, HV, K, V]: load / store one (sequence, value head) slice as row-major K x V.
template <typename Real>
void load_state(const TensorView& s, int64_t n, int64_t j, int64_t K, int64_t V, Real* dst) {
  for (int64_t i = 0; i < K; ++i) host::load_n<Real>(s.data, s.dtype, offset4(s, n, j, i, 0), V, dst + i * V);
}
template <typename Real>
void store_state(const TensorView& s, int64_t n, int64_t j, int64_t K, int64_t V, const Real* src) {
  for (int64_t i = 0; i < K; ++i) host::store_n<Real>(s.data, s.dtype, offset4(s, n, j, i, 0), V, src + i * V);
}

}  // namespace flashgrad::reference::delta_rule
