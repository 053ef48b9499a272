// Fused recurrent forward: one pass over time per (sequence, value head, column slice), the state
// slice in registers (see recurrent_common.cuh for the thread layout).
//
// Per step t (all in fp32):  S~ = exp(g_t) S;  r = v_t - S~^T k_t;  S = S~ + k_t (beta_t r)^T;
// o_t = scale S^T q_t. Writes o (when asked), r (saved for the backward, when asked) and the final
// state. Also used by the backward to recompute r when the caller saved none.
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, Gate G>
__global__ void __launch_bounds__(kThreads) recurrent_forward_kernel(RecurrentArgs a) {
  constexpr int KPT = kRowsPerThread;
  constexpr int L = KMAX / KPT;
  constexpr bool kPC = G == Gate::per_channel;
  const BlockCoords c = block_coords<L>(a);

  float S[KPT];
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    const int64_t row = c.gl + L * i;
    S[i] = (a.h0.p && c.col_ok && row < a.K)
               ? static_cast<const float*>(a.h0.p)[off4(a.h0, c.n, c.hv, row, c.col)]
               : 0.f;
  }
  const T* vp = static_cast<const T*>(a.v.p);
  auto load_step = [&](int64_t t, StepLoad<T, KPT, kPC>& s) {
    const int64_t tok = c.bos + t;
    load_qkgb<T, L, KPT, G>(a, c, tok, s);
    s.x0 = c.col_ok ? to_f<T>(vp[off4(a.v, c.b, tok, c.hv, c.col)]) : 0.f;
  };

  StepLoad<T, KPT, kPC> cur, nxt;
  if (c.len > 0) load_step(0, cur);
  for (int64_t t = 0; t < c.len; ++t) {
    if (t + 1 < c.len) load_step(t + 1, nxt);
    float q[KPT], k[KPT], d[KPT];
    qk_to_float<T, L, KPT>(cur.q, cur.k, a.l2norm, q, k, nullptr, nullptr);
    decays<G, KPT>(cur.g, d);
    float pk = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] *= d[i];
      pk += S[i] * k[i];
    }
    const float r = cur.x0 - group_sum<L>(pk);
    const float u = cur.beta * r;
    float pq = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] += k[i] * u;
      pq += S[i] * q[i];
    }
    const float o = a.scale * group_sum<L>(pq);
    if (c.gl == 0 && c.col_ok) {
      const int64_t tok = c.bos + t;
      if (a.o.p) store_elem<T>(a.o, off4(a.o, c.b, tok, c.hv, c.col), o);
      if (a.r.p) store_elem<T>(a.r, off4(a.r, c.b, tok, c.hv, c.col), r);
    }
    cur = nxt;
  }
  if (a.ht.p && c.col_ok) {
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int64_t row = c.gl + L * i;
      if (row < a.K) static_cast<float*>(a.ht.p)[off4(a.ht, c.n, c.hv, row, c.col)] = S[i];
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
