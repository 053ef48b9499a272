// Fused recurrent forward: one pass over time per (sequence, value head, column slice), the state
// slice in registers (see recurrent_common.cuh for the thread layout).
//
// Per step t (all in fp32):  S~ = exp(g_t) S;  r = v_t - S~^T k_t;  S = S~ + k_t (beta_t r)^T;
// o_t = scale S^T q_t. Writes o (when asked), r (saved for the backward, when asked) and the final
// state. Also used by the backward to recompute r when the caller saved none.
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Steps of input prefetch (register ring depth): 4 steps cover ~1 us of global-memory latency.
// KDA gates (8 more floats per step) and float32 inputs (twice the q / k registers) get 2, to
// stay within 128 registers (two blocks per SM) without spilling.
template <typename T, Gate G>
constexpr int prefetch_depth() {
#ifdef FLASHGRAD_DELTA_RULE_PREFETCH  // experiments only (tools/dev/delta_rule_build_variant.sh)
  return FLASHGRAD_DELTA_RULE_PREFETCH;
#else
  return (G == Gate::per_channel || sizeof(T) == 4) ? 2 : 4;
#endif
}

template <typename T, int KMAX, Gate G>
__global__ void __launch_bounds__(kThreads, 2) recurrent_forward_kernel(RecurrentArgs a) {
  constexpr int KPT = kRowsPerThread;
  constexpr int L = KMAX / KPT;
  constexpr bool kPC = G == Gate::per_channel;
  const BlockCoords c = block_coords<L>(a);

  __shared__ float tile[kStateTileFloats];
  float S[KPT];
  load_state_slice<KMAX, KPT>(a.h0, c, a.K, a.V, tile, S);
  const QkgbStreams qs = qkgb_streams<T, KPT, G>(a, c);
  const TokenPtr v_at = view_tokens(a.v, elem_size<T>(a.v), c, c.hv, c.col);
  const TokenPtr o_at = view_tokens(a.o, elem_size<T>(a.o), c, c.hv, c.col);
  const TokenPtr r_at = view_tokens(a.r, elem_size<T>(a.r), c, c.hv, c.col);
  auto load_step = [&](int64_t t, StepLoad<T, KPT, kPC>& s) {
    load_qkgb<T, KPT, G>(a, qs, t, s);
    s.x0 = c.col_ok ? load_raw_at<T>(a.v.f32, v_at.at<const void>(t)) : 0u;
  };
  auto step = [&](int64_t t, StepLoad<T, KPT, kPC>& cur) {
    // q, k raw; their norms (1 without the L2 norm) fold into the scalars (qk_to_float).
    float q[KPT], k[KPT], d[KPT], rq, rk;
    qk_to_float<T, L, KPT>(cur.q, cur.k, a.l2norm, q, k, rq, rk);
    gate_scalar<T, G>(a.g.f32, cur);
    decays<G, KPT>(cur.g, d);
    float pk = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] *= d[i];
      pk += S[i] * k[i];
    }
    const float r = raw_to_f<T>(false, cur.x0) - rk * group_sum<L>(pk);
    const float ku = rk * (raw_to_f<T>(a.beta.f32, cur.beta) * r);
    float pq = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] += k[i] * ku;
      pq += S[i] * q[i];
    }
    const float o = (a.scale * rq) * group_sum<L>(pq);
    if (c.gl == 0 && c.col_ok) {
      if (a.o.p) store_elem_at<T>(a.o.f32, o_at.at<void>(t), o);
      if (a.r.p) store_elem_at<T>(a.r.f32, r_at.at<void>(t), r);
    }
  };
  constexpr int kDepth = prefetch_depth<T, G>();
  StepLoad<T, KPT, kPC> ring[kDepth];
  pipelined_loop<kDepth, false>(c.len, ring, load_step, step);

  store_state_slice<KMAX, KPT>(a.ht, c, a.K, a.V, tile, S);
}

}  // namespace flashgrad::cuda_detail::delta_rule
