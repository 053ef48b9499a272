// Fused recurrent backward without per-step states (docs: shared/design/delta_rule.md):
//   pass 1, reverse in time, carries dS (K x V slice in registers) from dht;
//   pass 2, forward in time, recomputes S from h0.
// Neither ever runs the state backwards. With the in-kernel L2 norm both take 1 / ||q||, 1 / ||k|| per
// row from qk_rstd_kernel (run once before pass 1) instead of reducing over K at every step. Memory beyond inputs and outputs: the saved r and the
// fp32 accumulators below (sizes of q, k, beta, g), no per-step state.
//
// Cross-block sums (dq, dk over the V slices and over the value heads of a group; dbeta over the
// V slices; dg over the V slices) go through fp32 atomics into zeroed accumulators (dq and dk
// interleaved, RecurrentArgs::dqk_acc) after an
// in-block column reduction (block_reduce.cuh): one atomic per row per block per step. The order
// of those few fp32 additions across blocks is not fixed, so results may differ in the last bits
// from run to run (documented in docs/perf/delta_rule.md).
//
// Gate gradient. With c_s the per-step term of the design doc's closed form,
// dg_t = sum_{s >= t} c_s + <S_T, dht>. c_s splits into a pass-1 part (reverse in time: kept as a
// running suffix sum and added to dg_acc[t] directly) and a pass-2 part (forward in time: the
// suffix sum is Total - prefix_{<t}, so dg_acc[t] gets -prefix_{<t} and the per-sequence Total
// goes into dg_const, added to every step by the finishing kernel together with <S_T, dht>).
//   KDA, per key channel k (dk = dk1 - P2 with dk1 = dS u, P2 = S~ dv):
//     c_s[k] = q[k] dq[k] - k[k] dk[k] - 2 k[k] P2[k] = (-k[k] dk1[k])_{pass 1} + (q[k] dq[k] - k[k] P2[k])_{pass 2}
//   GDN: the sum over k of the KDA terms, which collapses to per-column sums
//     c_s = sum_j (o_j do_j)_{pass 2} - (v_j dv_j)_{pass 1}
//   (q.dq = o.do; k.dk1 = u.du = r.dv; k.P2 = (v - r).dv). Pass 1 takes v.dv per column; pass 2
//   takes o.do as q.dq over the rows after the block's column sums (one warp sum per warp of rows,
//   each warp keeping its own prefix; session 7), instead of recomputing o per column at every step.
#pragma once

#include "block_reduce.cuh"
#include "recurrent_common.cuh"
#include "recurrent_forward.cuh"  // prefetch_depth

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, Gate G>
__global__ void __launch_bounds__(kThreads, 2) recurrent_backward_pass1_kernel(RecurrentArgs a) {
  constexpr int KPT = kRowsPerThread;
  constexpr int L = KMAX / KPT;
  constexpr bool kPC = G == Gate::per_channel;
  __shared__ ColumnReduceSmem<KMAX, 1, 2> sm;
  const BlockCoords c = block_coords<L>(a);
  const int tid = threadIdx.x;

  __shared__ float tile[kStateTileFloats];
  float dS[KPT];
  load_state_slice<KMAX, KPT>(a.dht, c, a.K, a.V, tile, dS);
  // Per-token addresses (recurrent_common.cuh, TokenPtr): inputs, dv, and the accumulators' rows
  // (dk / KDA dg: row tid of the head; dbeta / GDN dg: the head's scalar).
  const QkgbStreams qs = qkgb_streams<T, KPT, G>(a, c);
  const TokenPtr do_at = view_tokens(a.dout, elem_size<T>(a.dout), c, c.hv, c.col);
  const TokenPtr r_at = view_tokens(a.r, elem_size<T>(a.r), c, c.hv, c.col);
  const TokenPtr v_at = view_tokens(a.v, elem_size<T>(a.v), c, c.hv, c.col);
  const TokenPtr dv_at = view_tokens(a.dv, elem_size<T>(a.dv), c, c.hv, c.col);
  const TokenPtr dqk_row = acc_tokens(a.dqk_acc, a.T, c, a.H, c.h, a.K, tid);
  const TokenPtr dg_row = acc_tokens(a.dg_acc, a.T, c, a.HV, c.hv, a.K, tid);      // KDA
  const TokenPtr dbeta_at = acc_tokens(a.dbeta_acc, a.T, c, a.HV, c.hv, 1, 0);
  const TokenPtr dg_at = acc_tokens(a.dg_acc, a.T, c, a.HV, c.hv, 1, 0);           // GDN
  auto load_step = [&](int64_t t, StepLoad<T, KPT, kPC>& s) {
    load_qkgb<T, KPT, G>(a, qs, t, s);
    s.x0 = c.col_ok ? load_raw_at<T>(a.dout.f32, do_at.at<const void>(t)) : 0u;
    s.x1 = c.col_ok ? load_raw_at<T>(a.r.f32, r_at.at<const void>(t)) : 0u;
    s.x2 = (G == Gate::scalar && c.col_ok) ? load_raw_at<T>(a.v.f32, v_at.at<const void>(t)) : 0u;
  };

  float run = 0.f;  // owner's running suffix sum of the pass-1 gate term (KDA: row tid; GDN: tid 0)
  auto step = [&](int64_t t, StepLoad<T, KPT, kPC>& cur) {
    const int buf = static_cast<int>(t & 1);
    // q, k raw with their norms rq, rk folded into the scalars (GDN / plain; KDA: normalized rows,
    // rq = rk = 1): dS += (scale dout rq) q_raw, du = rk (k_raw.dS), dS -= (rk dv) k_raw.
    float q[KPT], k[KPT], d[KPT], rq, rk;
    qk_rows_rstd<T, KPT, !kPC>(cur.q, cur.k, cur.q_rstd, cur.k_rstd, q, k, rq, rk);
    gate_scalar<T, G>(a.g.f32, cur);
    decays<G, KPT>(cur.g, d);
    const float dout = raw_to_f<T>(a.dout.f32, cur.x0), r = raw_to_f<T>(a.r.f32, cur.x1);
    const float beta = raw_to_f<T>(a.beta.f32, cur.beta);
    const float cq = a.scale * dout * rq;
    float pk = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      dS[i] += cq * q[i];
      pk += dS[i] * k[i];
    }
    const float du = rk * group_sum<L>(pk);
    const float u = beta * r, dv = beta * du;
    if (c.gl == 0 && c.col_ok) store_elem_at<T>(a.dv.f32, dv_at.at<void>(t), dv);
    float vec[1][KPT];
    float sc[2] = {du * r, -raw_to_f<T>(a.v.f32, cur.x2) * dv};
#pragma unroll
    for (int i = 0; i < KPT; ++i) vec[0][i] = dS[i] * u;
    column_reduce_write<KMAX, L, KPT, 1, 2>(sm, buf, vec, sc, q, k, kPC);
    const float kdv = rk * dv;
#pragma unroll
    for (int i = 0; i < KPT; ++i) dS[i] = d[i] * (dS[i] - k[i] * kdv);
    __syncthreads();
    if (tid < a.K) {
      const float dk1 = column_sum(sm, buf, tid);
      atomicAdd(&dqk_row.at<float2>(t)->y, dk1);
      if constexpr (kPC) {
        run -= sm.qk[buf][1][tid] * dk1;
        atomicAdd(dg_row.at<float>(t), run);
      }
    }
    if (tid == 0) {
      atomicAdd(dbeta_at.at<float>(t), column_sum(sm, buf, KMAX + 0));
      if constexpr (G == Gate::scalar) {
        run += column_sum(sm, buf, KMAX + 1);
        atomicAdd(dg_at.at<float>(t), run);
      }
    }
  };
  constexpr int kDepth = prefetch_depth<T, G>();
  StepLoad<T, KPT, kPC> ring[kDepth];
  pipelined_loop<kDepth, true>(c.len, ring, load_step, step);

  store_state_slice<KMAX, KPT>(a.dh0, c, a.K, a.V, tile, dS);
}

template <typename T, int KMAX, Gate G>
__global__ void __launch_bounds__(kThreads, 2) recurrent_backward_pass2_kernel(RecurrentArgs a) {
  constexpr int KPT = kRowsPerThread;
  constexpr int L = KMAX / KPT;
  constexpr bool kPC = G == Gate::per_channel;
  // Two per-row vectors (dq, P2), no per-column scalar: GDN's gate term o.do is taken as q.dq after
  // the barrier (see post below), KDA's per row.
  __shared__ ColumnReduceSmem<KMAX, 2, 0> sm;
  const BlockCoords c = block_coords<L>(a);
  const int tid = threadIdx.x;

  __shared__ float tile[kStateTileFloats];
  float S[KPT];
  load_state_slice<KMAX, KPT>(a.h0, c, a.K, a.V, tile, S);
  const QkgbStreams qs = qkgb_streams<T, KPT, G>(a, c);
  const TokenPtr v_at = view_tokens(a.v, elem_size<T>(a.v), c, c.hv, c.col);
  const TokenPtr do_at = view_tokens(a.dout, elem_size<T>(a.dout), c, c.hv, c.col);
  const TokenPtr dv_at = view_tokens(a.dv, elem_size<T>(a.dv), c, c.hv, c.col);
  const TokenPtr dqk_row = acc_tokens(a.dqk_acc, a.T, c, a.H, c.h, a.K, tid);
  const TokenPtr dg_row = acc_tokens(a.dg_acc, a.T, c, a.HV, c.hv, a.K, tid);      // KDA
  const TokenPtr dg_at = acc_tokens(a.dg_acc, a.T, c, a.HV, c.hv, 1, 0);           // GDN
  auto load_step = [&](int64_t t, StepLoad<T, KPT, kPC>& s) {
    load_qkgb<T, KPT, G>(a, qs, t, s);
    s.x0 = c.col_ok ? load_raw_at<T>(a.v.f32, v_at.at<const void>(t)) : 0u;
    s.x1 = c.col_ok ? load_raw_at<T>(a.dout.f32, do_at.at<const void>(t)) : 0u;
    s.x2 = c.col_ok ? load_raw_at<T>(a.dv.f32, dv_at.at<const void>(t)) : 0u;
  };

  // Running prefix sum of the pass-2 gate term: KDA, of row tid (tid < K); GDN, of this warp's rows
  // (lane 0 of each warp with rows below K: the block's prefix is the sum over those warps).
  float prefix = 0.f;
  const int lane = tid & 31;
  const bool row_warp = (tid & ~31) < a.K;  // warp-uniform: the warp holds rows below K
  auto step = [&](int64_t t, StepLoad<T, KPT, kPC>& cur) {
    const int buf = static_cast<int>(t & 1);
    // As in pass 1: q, k raw, rq / rk folded (k.S~ = rk (k_raw.S~), S += (rk u) k_raw, o = scale rq (q_raw.S)).
    float q[KPT], k[KPT], d[KPT], rq, rk;
    qk_rows_rstd<T, KPT, !kPC>(cur.q, cur.k, cur.q_rstd, cur.k_rstd, q, k, rq, rk);
    gate_scalar<T, G>(a.g.f32, cur);
    decays<G, KPT>(cur.g, d);
    const float v = raw_to_f<T>(a.v.f32, cur.x0), dout = raw_to_f<T>(a.dout.f32, cur.x1),
                dv = raw_to_f<T>(a.dv.f32, cur.x2);
    const float beta = raw_to_f<T>(a.beta.f32, cur.beta);
    float vec[2][KPT];
    float pk = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] *= d[i];  // S~
      pk += S[i] * k[i];
      vec[1][i] = S[i] * dv;  // P2 = S~ dv
    }
    const float ku = rk * (beta * (v - rk * group_sum<L>(pk)));
    const float sdo = a.scale * dout;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      S[i] += k[i] * ku;
      vec[0][i] = S[i] * sdo;  // dq
    }
    float sc[1] = {0.f};  // (no per-column scalar)
    // q's rows to shared memory: KDA's normalized ones for its per-row term, GDN's raw ones for o.do.
    column_reduce_write<KMAX, L, KPT, 2, 0>(sm, buf, vec, sc, q, k, G != Gate::none);
    __syncthreads();
    float qdq = 0.f;  // GDN: q_raw[row] dq[row] of this block's columns
    if (tid < a.K) {
      const float dq = column_sum(sm, buf, tid), p2 = column_sum(sm, buf, KMAX + tid);
      atomicAdd(dqk_row.at<float2>(t), make_float2(dq, -p2));  // one 8-byte vector atomic (sm_90)
      if constexpr (kPC) {
        atomicAdd(dg_row.at<float>(t), -prefix);
        prefix += sm.qk[buf][0][tid] * dq - sm.qk[buf][1][tid] * p2;
      }
      if constexpr (G == Gate::scalar) qdq = sm.qk[buf][0][tid] * dq;
    }
    if constexpr (G == Gate::scalar) {
      // o.do over the block's columns = q.dq (o_j = scale S_j.q, dq = scale S do): the warp's rows
      // summed here, times rq (q's norm, folded); each warp keeps its own prefix (linear in c_s).
      if (row_warp) {
        qdq = rq * group_sum<32>(qdq);
        if (lane == 0) {
          atomicAdd(dg_at.at<float>(t), -prefix);
          prefix += qdq;
        }
      }
    }
  };
  constexpr int kDepth = prefetch_depth<T, G>();
  StepLoad<T, KPT, kPC> ring[kDepth];
  pipelined_loop<kDepth, false>(c.len, ring, load_step, step);

  // Per-sequence constant of the gate gradient: this block's Total (= prefix; GDN: the warps' prefixes)
  // + <S_T, dht> (summed over the block's columns per row, then over rows).
  if constexpr (G != Gate::none) {
    const int buf = static_cast<int>(c.len & 1);
    float dh[KPT];
    load_state_slice<KMAX, KPT>(a.dht, c, a.K, a.V, tile, dh);
    float vec[2][KPT];
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      vec[0][i] = S[i] * dh[i];
      vec[1][i] = 0.f;
    }
    float sc[1] = {0.f};
    float zq[KPT] = {}, zk[KPT] = {};
    column_reduce_write<KMAX, L, KPT, 2, 0>(sm, buf, vec, sc, zq, zk, false);
    __syncthreads();
    if constexpr (kPC) {
      if (tid < a.K)
        atomicAdd(a.dg_const + (c.n * a.HV + c.hv) * a.K + tid, prefix + column_sum(sm, buf, tid));
    } else if (row_warp) {  // GDN: the warp's rows of <S_T, dht> plus the warp's prefix
      const float rows = group_sum<32>(tid < a.K ? column_sum(sm, buf, tid) : 0.f);
      if (lane == 0) atomicAdd(a.dg_const + c.n * a.HV + c.hv, prefix + rows);
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
