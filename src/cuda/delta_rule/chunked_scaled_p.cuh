// The backward's intra-chunk matrix scale P and its product with do, shared by B1
// (chunked_state_backward_transposed.cuh, which forms P per chunk on its serial chain) and the
// chunk-parallel dv_local stage (chunked_dv_local.cuh, which forms it once per chunk ahead of B1):
//   scale P_ij = scale rstd_qi rstd_kj exp(G_i - G_j) (q_raw k_raw^T)_ij  for j <= i < L, else 0,
//   dv_local^T (16 value columns x 64 chunk rows) += do^T (scale P)  (summed over P's rows i).
// Both run per warp on 16-bit T tiles in shared memory with ldmatrix + mma.m16n8k16; with kSplit,
// P is held as hi + lo (store_split) and both parts are multiplied.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_output.cuh"  // store_split
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

// One item's raw products praw (q_raw k_raw^T of row block prb, 8-column tiles nt = 4 phalf + q4,
// accumulator layout) scaled into P (and P_lo with kSplit): scale P_ij = pscale_i rstd_kj
// exp(G_i - G_j) raw_ij for j <= i < L, else 0. Tiles right of the diagonal block are skipped
// (never read). Shared by form_scaled_p and the fused forward (chunked_state.cuh), which forms
// praw in its own schedule.
template <typename T, bool kSplit>
__device__ __forceinline__ void store_scaled_p_item(const float (&praw)[4][4], int prb, int phalf, const float* pscale,
                                                    const float* rstd_k, const float* G, int L, T* P, T* P_lo,
                                                    int ldp) {
#pragma unroll
  for (int q4 = 0; q4 < 4; ++q4) {
    const int nt = 4 * phalf + q4;
    if (nt > 2 * prb + 1) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * prb + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
      const float x = j <= i && i < L ? pscale[i] * rstd_k[j] * expf(G[i] - G[j]) * praw[q4][e] : 0.f;
      if constexpr (kSplit)
        store_split<T>(x, &P[i * ldp + j], &P_lo[i * ldp + j]);
      else
        P[i * ldp + j] = from_f<T>(x);
    }
  }
}

// This warp's items of scale P into P (and P_lo with kSplit), [64][ldp] T; qs, ks: the chunk's raw
// q, k rows ([64][ldk] T); pscale[i] = scale rstd_qi, rstd_k[j], G[i] (zeros past L) in shared
// memory; lane, wp: the thread's lane and warp; nb_r, nb_c: the lane's ldmatrix address offsets for
// non-trans B fragments of two 8-column tiles (row 8 (lane / 16) + lane % 8, column 8 ((lane / 8) %
// 2)). The kernels pass the values they already hold (recomputing them here changed B1's SASS). Items it = (row block it % 4, column tiles [4 (it / 4), +4)) of q_raw k_raw^T; tiles
// right of the diagonal block are never read, so item it costs (16-column pairs) 1 2 2 2 0 0 1 2.
// With 8 warps each takes one (the longest, 2, bounds the phase). With 4 warps, warp wp takes the
// items in slots wp and wp + 4 of the order 3 7 1 2 0 6 4 5 (nibbles of kItemOrder4, low first):
// pairs of cost 3 3 2 2, not the 1 2 3 4 of items wp, wp + 4 (session 9: the 4-warp B1 serves few
// long sequences, where this phase sits on the serial chain). With 2 warps, slots in order.
template <typename T, int KMAX, int WARPS, bool kSplit>
__device__ __forceinline__ void form_scaled_p(const T* qs, const T* ks, int ldk, const float* pscale,
                                              const float* rstd_k, const float* G, int L, T* P, T* P_lo, int ldp,
                                              int lane, int wp, int nb_r, int nb_c) {
  constexpr uint32_t kItemOrder4 = 0x54602173u;
#pragma unroll
  for (int slot = wp; slot < 8; slot += WARPS) {
    const int it = WARPS == 4 ? static_cast<int>((kItemOrder4 >> (4 * slot)) & 7u) : slot;
    const int prb = it & 3, phalf = it >> 2;
    float praw[4][4] = {};
    const T* qrow = qs + (16 * prb + (lane & 15)) * ldk + 8 * (lane >> 4);
#pragma unroll
    for (int kq = 0; kq < KMAX / 16; ++kq) {
      uint32_t af[4];
      mma::ldmatrix_x4<false>(af, qrow + 16 * kq);
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const int np = 2 * phalf + q2;  // column tiles 2 np, 2 np + 1
        if (np > prb) continue;
        uint32_t b[4];
        mma::ldmatrix_x4<false>(b, ks + (16 * np + nb_r) * ldk + 16 * kq + nb_c);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma::mma16816<T>(praw[2 * q2], af, b0);
        mma::mma16816<T>(praw[2 * q2 + 1], af, b1);
      }
    }
    store_scaled_p_item<T, kSplit>(praw, prb, phalf, pscale, rstd_k, G, L, P, P_lo, ldp);
  }
}

// p[2 jp], p[2 jp + 1] (the 16 x 8 accumulator tiles of dv_local^T's chunk rows [16 jp, +16))
// += ad (do^T's A fragment for P's rows [16 is, +16), ldmatrix.trans of do) x scale P's rows
// [16 is, +16), columns [16 jp, +16), for the nonzero column blocks jp <= is. tb_r, tb_c: the lane's
// ldmatrix address offsets for .trans B fragments (row 8 ((lane / 8) % 2) + lane % 8, column
// 8 (lane / 16) of a 16 x 16 block).
template <typename T, bool kSplit>
__device__ __forceinline__ void accumulate_dot_p(float (&p)[8][4], const uint32_t (&ad)[4], int is, const T* P,
                                                 const T* P_lo, int ldp, int tb_r, int tb_c) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
    if (jp > is) continue;
    uint32_t bh[4];
    mma::ldmatrix_x4<true>(bh, P + (16 * is + tb_r) * ldp + 16 * jp + tb_c);
    const uint32_t bh0[2] = {bh[0], bh[1]}, bh1[2] = {bh[2], bh[3]};
    if constexpr (kSplit) {
      uint32_t bl[4];
      mma::ldmatrix_x4<true>(bl, P_lo + (16 * is + tb_r) * ldp + 16 * jp + tb_c);
      const uint32_t bl0[2] = {bl[0], bl[1]}, bl1[2] = {bl[2], bl[3]};
      mma::mma16816<T>(p[2 * jp], ad, bh0);
      mma::mma16816<T>(p[2 * jp], ad, bl0);
      mma::mma16816<T>(p[2 * jp + 1], ad, bh1);
      mma::mma16816<T>(p[2 * jp + 1], ad, bl1);
    } else {
      mma::mma16816<T>(p[2 * jp], ad, bh0);
      mma::mma16816<T>(p[2 * jp + 1], ad, bh1);
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
