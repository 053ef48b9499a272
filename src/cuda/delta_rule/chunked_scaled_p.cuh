// The intra-chunk matrix scale P and its product with do, shared by B1
// (chunked_state_backward_transposed.cuh, which forms P per chunk on its serial chain), the
// chunk-parallel dv_local stage (chunked_dv_local.cuh, which forms it once per chunk ahead of B1) and,
// for P alone, the fused forward chain (chunked_state.cuh: p_tile_deal, p_tiles_products, store_p_tiles):
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

// One 16 x 8 tile of q_raw k_raw^T (accumulator layout: the lane's rows i0 = 16 rb + grp and i0 + 8,
// columns j0 = 8 nt + 2 tig and j0 + 1) scaled into P (and P_lo with kSplit): scale P_ij = pscale_i
// rstd_kj exp(G_i - G_j) raw_ij for j <= i < L, else 0. The two rows' factors are loaded once, the
// columns' as float2, the exponential is decay_exp_ftz (ex2.approx.ftz: ~2 ulp, under the T rounding
// P gets; it was expf, ~8 instructions), and without kSplit the two columns go out as one 4-byte pair
// (conflict-free at ldp = 72: rows 4 banks apart). Session 22: ~25 -> ~10 instructions per element.
template <typename T, bool kSplit>
__device__ __forceinline__ void store_p_tile(const float (&acc)[4], int rb, int nt, const float* pscale,
                                             const float* rstd_k, const float* G, int L, T* P, T* P_lo, int ldp) {
  const int i0 = 16 * rb + mma::grp(), j0 = 8 * nt + 2 * mma::tig();
  const float2 rk = *reinterpret_cast<const float2*>(rstd_k + j0), gj = *reinterpret_cast<const float2*>(G + j0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // accumulator elements 2 h, 2 h + 1: row i0 + 8 h, columns j0, j0 + 1
    const int i = i0 + 8 * h;
    const float ps = pscale[i], gi = G[i];
    const bool in = i < L;
    const float x0 = in && j0 <= i ? ps * rk.x * decay_exp_ftz(gi - gj.x) * acc[2 * h] : 0.f;
    const float x1 = in && j0 + 1 <= i ? ps * rk.y * decay_exp_ftz(gi - gj.y) * acc[2 * h + 1] : 0.f;
    if constexpr (kSplit) {
      store_split<T>(x0, &P[i * ldp + j0], &P_lo[i * ldp + j0]);
      store_split<T>(x1, &P[i * ldp + j0 + 1], &P_lo[i * ldp + j0 + 1]);
    } else {
      *reinterpret_cast<uint32_t*>(&P[i * ldp + j0]) = mma::pack_floats<T>(x0, x1);
    }
  }
}

// One item's raw products praw (q_raw k_raw^T of row block prb, 8-column tiles nt = 4 phalf + q4,
// accumulator layout) scaled into P (and P_lo with kSplit) by store_p_tile. Tiles right of the
// diagonal block are skipped (never read).
template <typename T, bool kSplit>
__device__ __forceinline__ void store_scaled_p_item(const float (&praw)[4][4], int prb, int phalf, const float* pscale,
                                                    const float* rstd_k, const float* G, int L, T* P, T* P_lo,
                                                    int ldp) {
#pragma unroll
  for (int q4 = 0; q4 < 4; ++q4) {
    const int nt = 4 * phalf + q4;
    if (nt > 2 * prb + 1) continue;
    store_p_tile<T, kSplit>(praw[q4], prb, nt, pscale, rstd_k, G, L, P, P_lo, ldp);
  }
}

// The 20 nonzero 16 x 8 tiles of q_raw k_raw^T's lower block triangle (row block rb: column tiles
// nt = 0 .. 2 rb + 1), dealt to 8 warps for the serial chains (B1, the fused forward), whose warps meet
// at a barrier right after forming P. Warps wp and wp + 4 share an SM scheduler, and the tensor pipe
// and issue slots are per scheduler, so each pair gets 5 tiles and no warp more than 3:
//   warp  0: (3, 0 1 2)   1: (3, 5 6 7)   2: (2, 0 1 2)   3: (1, 0 1 2)
//   warp  4: (3, 3 4)     5: (0, 0 1)     6: (2, 3 4)     7: (1, 3) (2, 5)
// ((row block, column tiles); slot 2 shares slot 0's row block; only warp 7's slots 0 and 1 differ in
// row block.) The item deal it replaces (items = (row block wp % 4, column tiles [4 (wp / 4), +4)),
// form_scaled_p below) gave the schedulers 2, 4, 6, 8 tiles and warps up to 4: run 21.2's ncu of B1 had
// 13 % of its stall samples at the barrier after P, the fused forward ~7 % at its two P barriers.
// Packed per warp in 16 bits (warps 0 - 3 in kPTileDealLo, 4 - 7 in kPTileDealHi, warp w at bit
// 16 (w % 4)): n (tiles, 2 bits) | rb0 (2) | rb1 (2) | nt0 (3) | nt1 (3) | nt2 (3).
struct PTileDeal {
  int n, rb0, rb1, nt[3];
};
constexpr uint32_t p_tile_word(int n, int rb0, int rb1, int nt0, int nt1, int nt2) {
  return static_cast<uint32_t>(n | rb0 << 2 | rb1 << 4 | nt0 << 6 | nt1 << 9 | nt2 << 12);
}
constexpr uint64_t kPTileDealLo = uint64_t{p_tile_word(3, 3, 3, 0, 1, 2)} | uint64_t{p_tile_word(3, 3, 3, 5, 6, 7)} << 16 |
                                  uint64_t{p_tile_word(3, 2, 2, 0, 1, 2)} << 32 | uint64_t{p_tile_word(3, 1, 1, 0, 1, 2)} << 48;
constexpr uint64_t kPTileDealHi = uint64_t{p_tile_word(2, 3, 3, 3, 4, 0)} | uint64_t{p_tile_word(2, 0, 0, 0, 1, 0)} << 16 |
                                  uint64_t{p_tile_word(2, 2, 2, 3, 4, 0)} << 32 | uint64_t{p_tile_word(2, 1, 2, 3, 5, 0)} << 48;
__device__ __forceinline__ PTileDeal p_tile_deal(int wp) {
  const uint32_t d = static_cast<uint32_t>(((wp < 4 ? kPTileDealLo : kPTileDealHi) >> (16 * (wp & 3))) & 0xffffu);
  return {static_cast<int>(d & 3u), static_cast<int>((d >> 2) & 3u), static_cast<int>((d >> 4) & 3u),
          {static_cast<int>((d >> 6) & 7u), static_cast<int>((d >> 9) & 7u), static_cast<int>((d >> 12) & 7u)}};
}

// praw[t] (accumulator layout, rows 16 rb_t + [0, 16), columns 8 nt_t + [0, 8)) += q_raw k_raw^T over
// the KMAX channels, for this warp's dealt tiles t < deal.n (praw zeroed by the caller). B fragments of
// slots 0 and 1 come from one ldmatrix.x4 (lane l addresses row l % 8 of k's column tile nt_(l / 16),
// channel half (l / 8) % 2), slot 2's from another (its tile twice); A fragments of q's row block rb0,
// and of rb1 only where it differs (warp 7).
template <typename T, int KMAX>
__device__ __forceinline__ void p_tiles_products(const T* qs, const T* ks, int ldk, const PTileDeal& deal, int lane,
                                                 float (&praw)[3][4]) {
  const int arow = (lane & 15), acol = 8 * (lane >> 4), brow = lane & 7, bcol = 8 * ((lane >> 3) & 1);
  const T* qa0 = qs + (16 * deal.rb0 + arow) * ldk + acol;
  const T* qa1 = qs + (16 * deal.rb1 + arow) * ldk + acol;
  const T* kb01 = ks + (8 * ((lane >> 4) ? deal.nt[1] : deal.nt[0]) + brow) * ldk + bcol;
  const T* kb2 = ks + (8 * deal.nt[2] + brow) * ldk + bcol;
  const bool two_rows = deal.rb1 != deal.rb0, three = deal.n == 3;
#pragma unroll
  for (int kq = 0; kq < KMAX / 16; ++kq) {
    uint32_t a0[4], a1[4], b01[4];
    mma::ldmatrix_x4<false>(a0, qa0 + 16 * kq);
    mma::ldmatrix_x4<false>(b01, kb01 + 16 * kq);
    const uint32_t b0[2] = {b01[0], b01[1]}, b1[2] = {b01[2], b01[3]};
    mma::mma16816<T>(praw[0], a0, b0);
    if (two_rows) {
      mma::ldmatrix_x4<false>(a1, qa1 + 16 * kq);
      mma::mma16816<T>(praw[1], a1, b1);
    } else {
      mma::mma16816<T>(praw[1], a0, b1);
    }
    if (three) {
      uint32_t b2[4];
      mma::ldmatrix_x4<false>(b2, kb2 + 16 * kq);
      const uint32_t b2f[2] = {b2[0], b2[1]};
      mma::mma16816<T>(praw[2], a0, b2f);
    }
  }
}

// The dealt tiles scaled into P (and P_lo with kSplit) by store_p_tile.
template <typename T, bool kSplit>
__device__ __forceinline__ void store_p_tiles(const float (&praw)[3][4], const PTileDeal& deal, const float* pscale,
                                              const float* rstd_k, const float* G, int L, T* P, T* P_lo, int ldp) {
#pragma unroll
  for (int t = 0; t < 3; ++t) {
    if (t >= deal.n) continue;
    store_p_tile<T, kSplit>(praw[t], t == 1 ? deal.rb1 : deal.rb0, deal.nt[t], pscale, rstd_k, G, L, P, P_lo, ldp);
  }
}

// This warp's items of scale P into P (and P_lo with kSplit), [64][ldp] T; qs, ks: the chunk's raw
// q, k rows ([64][ldk] T); pscale[i] = scale rstd_qi, rstd_k[j], G[i] (zeros past L) in shared
// memory; lane, wp: the thread's lane and warp; nb_r, nb_c: the lane's ldmatrix address offsets for
// non-trans B fragments of two 8-column tiles (row 8 (lane / 16) + lane % 8, column 8 ((lane / 8) %
// 2)). The kernels pass the values they already hold (recomputing them here changed B1's SASS). Items it = (row block it % 4, column tiles [4 (it / 4), +4)) of q_raw k_raw^T; tiles
// right of the diagonal block are never read, so item it costs (16-column pairs) 1 2 2 2 0 0 1 2.
// With 8 warps the tiles are dealt by p_tile_deal instead (5 per scheduler, <= 3 per warp; one item
// each gave 2, 4, 6, 8 per scheduler). With 4 warps, warp wp takes the
// items in slots wp and wp + 4 of the order 3 7 1 2 0 6 4 5 (nibbles of kItemOrder4, low first):
// pairs of cost 3 3 2 2, not the 1 2 3 4 of items wp, wp + 4 (session 9: the 4-warp B1 serves few
// long sequences, where this phase sits on the serial chain). With 2 warps, slots in order.
template <typename T, int KMAX, int WARPS, bool kSplit>
__device__ __forceinline__ void form_scaled_p(const T* qs, const T* ks, int ldk, const float* pscale,
                                              const float* rstd_k, const float* G, int L, T* P, T* P_lo, int ldp,
                                              int lane, int wp, int nb_r, int nb_c) {
  if constexpr (WARPS == 8) {  // the balanced deal of P's tiles (p_tile_deal)
    const PTileDeal deal = p_tile_deal(wp);
    float praw[3][4] = {};
    p_tiles_products<T, KMAX>(qs, ks, ldk, deal, lane, praw);
    store_p_tiles<T, kSplit>(praw, deal, pscale, rstd_k, G, L, P, P_lo, ldp);
    return;
  }
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
