// Deterministic dQ: one CTA per (sequence, query head, block of 64 queries), 4 warps of 16 rows,
// walking the allowed key blocks in increasing order and keeping dQ in fp32 registers:
//   S = Q K^T, P = exp2(S log2e - lse log2e), dP = dO V^T, dS = P (dP - shift) softcap'(S),
//   dQ += dS K;  dq = scale * dQ, rounded once.
// The summation order is fixed by the loop, so dq is bitwise repeatable (no atomics). It redoes the
// S and dP products the main backward kernel also computes; that is the price of determinism.
#pragma once

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "sequence_and_mask.cuh"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn {

template <int D>
struct DqConfig {
  static constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;
  static constexpr int kSmemBytes = (2 * kBlockM + 2 * kBlockN) * D * 2;
};

template <typename T, int D>
__global__ void __launch_bounds__(128)
    attention_dq_kernel(const AttentionKernelParams p, int num_m_blocks) {
  using Cfg = DqConfig<D>;
  using Ops = ElementOps<T>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, NT = BN / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + BM * D;
  T* sK = sdO + BM * D;
  T* sV = sK + BN * D;
  const uint32_t uQ = smem_address(sQ), udO = smem_address(sdO), uK = smem_address(sK),
                 uV = smem_address(sV);

  const int seq = blockIdx.x / num_m_blocks;
  const int mb = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int h = blockIdx.y;
  const int hk = h / (p.heads_q / p.heads_k);
  const SequenceView sv = sequence_view(p, seq);
  const int m0 = mb * BM;
  if (m0 >= sv.len_q) return;
  const MaskView mask = mask_view(p, sv, seq);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row_in_warp = warp * 16;
  const LaneOffsets<D> rc(lane, kRowsThenCols), cr(lane, kColsThenRows);

  const T* q = static_cast<const T*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h);
  const T* dout = static_cast<const T*>(p.dout) + row_offset(p.dout_st, sv.q_batch, sv.q_row0, m0, h);
  const T* k = static_cast<const T*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, 0, hk);
  const T* v = static_cast<const T*>(p.v) + row_offset(p.v_st, sv.k_batch, sv.k_row0, 0, hk);
  load_tile_async<BM, D, Cfg::kThreads>(sQ, q, p.q_st.row, sv.len_q - m0, tid);
  load_tile_async<BM, D, Cfg::kThreads>(sdO, dout, p.dout_st.row, sv.len_q - m0, tid);

  const int num_nb = (sv.len_k + BN - 1) / BN;
  int cls = kTileEmpty;
  int nb = next_key_block<BN>(mask, 0, num_nb, m0, m0 + BM, cls);
  if (nb >= 0) {
    load_tile_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(nb) * BN * p.k_st.row,
                                          p.k_st.row, sv.len_k - nb * BN, tid);
    load_tile_async<BN, D, Cfg::kThreads>(sV, v + static_cast<int64_t>(nb) * BN * p.v_st.row,
                                          p.v_st.row, sv.len_k - nb * BN, tid);
  }
  cp_async_commit();

  // Per-row lse (log2 units) and shift of this thread's two rows.
  float row_lse[2], row_shift[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + row_in_warp + g + 8 * r;
    const int64_t idx = static_cast<int64_t>(h) * p.total_q + sv.scratch_row0 + i;
    row_lse[r] = i < sv.len_q ? p.lse_log2[idx] : INFINITY;
    row_shift[r] = i < sv.len_q ? p.delta_shift[idx] : 0.f;
  }

  float acc_dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) acc_dq[i][0] = acc_dq[i][1] = acc_dq[i][2] = acc_dq[i][3] = 0.f;

  while (nb >= 0) {
    cp_async_wait<0>();
    __syncthreads();
    float acc_s[NT][4], acc_dp[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4], a2[4];
      load_a<D>(a, uQ, rc, row_in_warp, kk * 16);
      load_a<D>(a2, udO, rc, row_in_warp, kk * 16);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        load_b_nk<D>(b, uK, cr, np * 16, kk * 16);
        Ops::mma(acc_s[2 * np], a, b[0], b[1]);
        Ops::mma(acc_s[2 * np + 1], a, b[2], b[3]);
        load_b_nk<D>(b, uV, cr, np * 16, kk * 16);
        Ops::mma(acc_dp[2 * np], a2, b[0], b[1]);
        Ops::mma(acc_dp[2 * np + 1], a2, b[2], b[3]);
      }
    }
    __syncthreads();  // V(nb) is no longer read: fetch the next V while dS K runs
    int next_cls = kTileEmpty;
    const int next = next_key_block<BN>(mask, nb + 1, num_nb, m0, m0 + BM, next_cls);
    if (next >= 0)
      load_tile_async<BN, D, Cfg::kThreads>(sV, v + static_cast<int64_t>(next) * BN * p.v_st.row,
                                            p.v_st.row, sv.len_k - next * BN, tid);
    cp_async_commit();

    const int n0 = nb * BN;
    int k_lo[2], k_hi[2], k_diag[2];  // keys of this thread's rows, relative to n0 + 2t
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mask.query_keys(m0 + row_in_warp + g + 8 * r, k_lo[r], k_hi[r], k_diag[r]);
      k_lo[r] -= n0 + 2 * t;
      k_hi[r] -= n0 + 2 * t;
      k_diag[r] -= n0 + 2 * t;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float factor;
        const float s = apply_softcap(p.softcap_method, p.softcap, acc_s[nt][e] * p.scale, factor);
        float pr = fast_exp2(s * kLog2e - row_lse[r]);
        if (cls == kTilePartial) {
          const int jr = nt * 8 + (e & 1);  // key - n0 - 2t
          if (!((jr >= k_lo[r] && jr < k_hi[r]) || jr == k_diag[r])) pr = 0.f;
        }
        acc_dp[nt][e] = pr * (acc_dp[nt][e] - row_shift[r]) * factor;
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = Ops::pack(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      a[1] = Ops::pack(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      a[2] = Ops::pack(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      a[3] = Ops::pack(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        load_b_kn<D>(b, uK, rc, kk * 16, dp * 16);
        Ops::mma(acc_dq[2 * dp], a, b[0], b[1]);
        Ops::mma(acc_dq[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // K(nb) is no longer read
    if (next >= 0)
      load_tile_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(next) * BN * p.k_st.row,
                                            p.k_st.row, sv.len_k - next * BN, tid);
    cp_async_commit();
    nb = next;
    cls = next_cls;
  }
  cp_async_wait<0>();

  T* dq = static_cast<T*>(p.dq) + row_offset(p.dq_st, sv.q_batch, sv.q_row0, m0, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_in_warp + g + 8 * r;
    if (m0 + i >= sv.len_q) continue;
    T* drow = dq + static_cast<int64_t>(i) * p.dq_st.row;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(drow + dt * 8 + 2 * t) =
          Ops::pack(acc_dq[dt][2 * r] * p.scale, acc_dq[dt][2 * r + 1] * p.scale);
  }
}

}  // namespace flashgrad::cuda_attn
