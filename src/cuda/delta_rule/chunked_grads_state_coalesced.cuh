// B2a with resident tiles and whole-sector state loads (session 11, helper gdnb2s;
// docs/perf/delta_rule.md "GDN B2, session 11"): chunk_grads_state_coalesced_kernel computes what
// chunk_grads_state_kernel (chunked_grads_split.cuh) computes, for V == K: every tile it reads is
// issued at its start, and the products' contraction index (V) is visited in another order.
//
// Why (1): the slice kernel moves ~1.6 GB per call at B8 T4096 H16 K=V=128 (~0.35 ms of HBM time) and
// took 0.79 ms (ncu, session 7: issue active 28%, long scoreboard 30%, DRAM 45%): each of its 8
// 32-column V slices waited for its own cp.async copies and h / dh fragments behind a block barrier,
// one slice of loads in flight per block. Here do, dv_new (cp.async group 0), v_new, q, k (group 1) go
// whole into shared memory, all of the warp's h blocks into registers before the first wait; each
// block's registers take dh's block of the same columns once its pass-1 products are issued, so dh is in
// flight through the rest of pass 1; h is read again (L2) for <h_c, dh_{c+1}>. 4 barriers (was 10).
// Why (2): an mma A fragment of h / dh as ldmatrix lays it out holds, per lane, two 32-bit words 8
// columns apart, so each 32-bit load instruction takes 16 bytes of each of 8 rows, half of every
// 32-byte sector (ncu of session 11's first resident kernel, run 11.2: 39% of its L2 sectors excess).
// The products contract over V, and any order of V works if both operands follow it: per 32-column
// block of V, lane (grp, tig) takes columns 8 tig + [0, 8) of rows grp and grp + 8 (one 16-byte load
// each: 4 lanes cover a row's 64 bytes), and mma k-step 0 of the block uses columns 8 tig + {0, 1}
// (k slots 2 tig + {0, 1}) and 8 tig + {2, 3} (slots 8 + 2 tig + {0, 1}), k-step 1 columns 8 tig +
// {4, 5} and {6, 7}. The B operands (do, dv_new, v_new rows) take the same columns of their rows: one
// 16-byte shared load per row gives both k-steps (instead of ldmatrix). Shared tiles [64][K + 8]
// (272-byte rows at K = 128); mma column n (lane grp) of an 8-row tile reads chunk row pi(n) = n / 2 +
// 4 (n % 2), so a quarter warp's 16-byte loads (grp 2 m, 2 m + 1) touch rows m and m + 4, 1088 bytes
// apart: opposite halves of the banks. Accumulator element (nt, e) is then chunk row 8 nt + tig + 4
// (e % 2) of the warp's rows.
// Pass 1 runs in two halves (Y, then Z: 32 accumulator registers live, not 64), dq_s staged in the
// dk_s tile, dw in do's after the barrier that ends pass 1, dk_s in dv_new's. 4 barriers, 107 KiB.
// Sums inside each mma run in another order than the other kernels': gradients equal to rounding.
#pragma once

#include "chunked_grads_frags.cuh"
#include "chunked_grads_split.cuh"  // row_rstd, tile_rows_async / _store, exact_state_dot, store_state_dG_terms
#include "chunked_mma.cuh"
#include "chunked_mma_tf32.cuh"  // zero_acc, column_sum
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Shared memory: q, k raw; do (then dw's staging tile), dv_new (then dk_s's), v_new, and one tile for
// dq_s's staging (out_k), each [C][K + 8] of T (V == K); per-row factors; the dG dots' per-warp column
// partials (as GradsStateSmem's).
template <typename T, int KMAX>
struct GradsStateCoalescedSmem {
  static constexpr int C = kChunkSize, KS = KMAX / 16;
  static constexpr int LDK = KMAX + 8;  // +8 elements: 16-byte aligned rows, rows m, m + 4 in opposite bank halves
  static constexpr int64_t kTile = sizeof(T) * C * LDK;
  static_assert(kTile % 16 == 0, "16-byte aligned tiles");
  // floats: rq, rk, eG, kd [C]; dot partials q, k [KS][C]; hdh per warp [8].
  static constexpr int64_t bytes() { return 6 * kTile + sizeof(float) * ((4 + 2 * KS) * C + 8); }
  unsigned char* raw;
  T *q, *k, *dO, *dvn, *vn, *out_k;
  float *rq, *rk, *eG, *kd, *pq, *pk, *hsum;
  __device__ explicit GradsStateCoalescedSmem(unsigned char* r) : raw(r) {
    T* t = reinterpret_cast<T*>(raw);
    constexpr int64_t n = C * LDK;  // elements per tile
    q = t;
    k = t + n;
    dO = t + 2 * n;
    dvn = t + 3 * n;
    vn = t + 4 * n;
    out_k = t + 5 * n;
    place_state_floats<KMAX>(reinterpret_cast<float*>(raw + 6 * kTile), rq, rk, eG, kd, pq, pk, hsum);
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(256, 2) chunk_grads_state_coalesced_kernel(ChunkedArgs a) {
  using S = GradsStateCoalescedSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, NB = KMAX / 32;  // NB 32-column blocks of V
  constexpr int KS = KMAX / 16, CG = 8 / KS, NTV = 8 / CG;     // key strips, column groups, 8-row tiles
  static_assert(KS * CG == 8 && NTV % 2 == 0, "K = 64 or 128 over 8 warps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = a.chunks[c];  // (read: computing it, chunk_info, made this kernel 5 % slower in run 20.2)
  const int L = ci.len, tid = static_cast<int>(threadIdx.x), lane = tid & 31, wp = tid >> 5, grp = lane >> 2,
            tig = lane & 3;
  // Key role: warp (kst, cgp) owns key rows [16 kst, +16) and chunk rows [n0k, n0k + 8 NTV).
  const int kst = wp % KS, cgp = wp / KS, n0k = cgp * 8 * NTV;
  const int64_t row0 = chunk_row0(ci, a.T), HV = a.HV;
  constexpr int64_t V = KMAX;
  auto erow = [&](int e) { return grp + 8 * (e >> 1); };
  auto ecol = [&](int e) { return tig + 4 * (e & 1); };  // (chunk row of mma column 2 tig + e % 2)
  auto at = [&](int r, int col) { return r * LDK + col; };
  const int pig = (grp >> 1) + 4 * (grp & 1);  // chunk row pi(grp) of the B operands

  const T* hc = static_cast<const T*>(a.h16) + (c * HV + hv) * KMAX * V;   // h_c [K][V]
  const T* dhc = static_cast<const T*>(a.dh16) + (c * HV + hv) * KMAX * V;  // dL/dh_{c+1} [K][V]
  // State block b (columns [32 b, +32)) of key rows 16 kst + grp (x[2 b]) and + 8 (x[2 b + 1]):
  // columns 32 b + 8 tig + [0, 8), one 16-byte load each.
  const T* st_h = hc + (16 * kst + grp) * V + 8 * tig;
  const T* st_dh = dhc + (16 * kst + grp) * V + 8 * tig;
  // As the A fragments of k-steps 0 (f0) and 1 (f1) of the block (see the file comment).
  auto load_block = [&](const T* p, int b, uint32_t(&f0)[4], uint32_t(&f1)[4]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p + 32 * b);
    const uint4 w = *reinterpret_cast<const uint4*>(p + 8 * V + 32 * b);
    f0[0] = u.x, f0[1] = w.x, f0[2] = u.y, f0[3] = w.y;
    f1[0] = u.z, f1[1] = w.z, f1[2] = u.w, f1[3] = w.w;
  };
  // acc0 / acc1 (8-row tiles n0, n0 + 8 of the chunk rows) += block b's product with rows of tile X.
  auto block_mma = [&](float(&acc0)[4], float(&acc1)[4], const uint32_t(&f0)[4], const uint32_t(&f1)[4],
                       const T* X, int b, int n0) {
    const uint4 u = *reinterpret_cast<const uint4*>(X + at(n0 + pig, 32 * b + 8 * tig));
    const uint4 w = *reinterpret_cast<const uint4*>(X + at(n0 + 8 + pig, 32 * b + 8 * tig));
    const uint32_t u0[2] = {u.x, u.y}, u1[2] = {u.z, u.w}, w0[2] = {w.x, w.y}, w1[2] = {w.z, w.w};
    mma::mma16816<T>(acc0, f0, u0);
    mma::mma16816<T>(acc1, f0, w0);
    mma::mma16816<T>(acc0, f1, u1);
    mma::mma16816<T>(acc1, f1, w1);
  };
  auto view_rows = [&](const View& x, int64_t idx) { return static_cast<T*>(x.p) + off3(x, ci.b, ci.t0, idx); };
  auto inter_rows = [&](const void* base) { return static_cast<const T*>(base) + (row0 * HV + hv) * V; };

  // ---- Loads, all issued first: h blocks (registers), then do, dv_new (group 0) and v_new, q, k
  // (group 1) by cp.async; per-row gate factors.
  uint32_t hr[2 * NB][4];  // h, then dh: block b's A fragments of k-steps 0 (2 b) and 1 (2 b + 1)
#pragma unroll
  for (int b = 0; b < NB; ++b) load_block(st_h, b, hr[2 * b], hr[2 * b + 1]);
  tile_rows_async<T, KMAX>(view_rows(a.dout, hv), a.dout.s1, L, sm.dO, tid);
  tile_rows_async<T, KMAX>(view_rows(a.q, head), a.q.s1, L, sm.q, tid);
  tile_rows_async<T, KMAX>(inter_rows(a.dv_new16), HV * V, L, sm.dvn, tid);
  mma::cp_async_commit();
  tile_rows_async<T, KMAX>(inter_rows(a.v_new), HV * V, L, sm.vn, tid);
  tile_rows_async<T, KMAX>(view_rows(a.k, head), a.k.s1, L, sm.k, tid);
  mma::cp_async_commit();
  const float gl = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
  if (tid < C) {
    const float g = (a.G && tid < L) ? a.G[(row0 + tid) * HV + hv] : 0.f;
    sm.eG[tid] = expf(g);
    sm.kd[tid] = expf(gl - g);  // arguments <= 0 for gates g <= 0
  }
  mma::cp_async_wait<1>();
  __syncthreads();  // do, q, dv_new (and the gate factors) in shared memory

  // ---- Pass 1 in two halves (32 accumulator registers live at a time, not 64): Y^T = h do^T, then
  // Z^T = h dv_new^T (no barrier between: dq_s is staged in dk_s's tile, unused until pass 2's end).
  // dq_s = scale exp(G_i) Y (element: key channel d, chunk row i) and <q_raw_i, dq_s_i> over this
  // warp's channels.
  T* out_q = sm.out_k;
  T* out_w = sm.dO;  // (after the barrier that ends pass 1)
  T* out_dk = sm.dvn;  // (likewise)
  {
    float accY[NTV][4];
    mma::zero_acc(accY);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int np = 0; np < NTV / 2; ++np)
        block_mma(accY[2 * np], accY[2 * np + 1], hr[2 * b], hr[2 * b + 1], sm.dO, b, n0k + 16 * np);
    }
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt) {
      float p[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
        const float y = accY[nt][e] * (a.scale * sm.eG[i]);
        out_q[at(i, d)] = from_f<T>(y);
        p[e & 1] += to_f<T>(sm.q[at(i, d)]) * y;
      }
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const float s = mma::column_sum(p[q2]);
        if (grp == 0) sm.pq[kst * C + n0k + 8 * nt + tig + 4 * q2] = s;
      }
    }
  }
  float accZ[NTV][4];
  mma::zero_acc(accZ);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int np = 0; np < NTV / 2; ++np)
      block_mma(accZ[2 * np], accZ[2 * np + 1], hr[2 * b], hr[2 * b + 1], sm.dvn, b, n0k + 16 * np);
    load_block(st_dh, b, hr[2 * b], hr[2 * b + 1]);  // dh's block of the same columns, for pass 2
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with do / dv_new (they become staging tiles); v_new, k landed
  // dw = -Z into do's tile.
#pragma unroll
  for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
      out_w[at(i, d)] = from_f<T>(-accZ[nt][e]);
    }
  // h again (L2) for <h_c, dh_{c+1}>, used after pass 2's products: the first column group's warps
  // (each (key channel, value column) once).
  uint32_t h2[2 * NB][4];
  if (cgp == 0) {
#pragma unroll
    for (int b = 0; b < NB; ++b) load_block(st_h, b, h2[2 * b], h2[2 * b + 1]);
  }
  const float rq = row_rstd<T, KMAX>(sm.q, LDK, a.l2norm, tid);
  const float rk = row_rstd<T, KMAX>(sm.k, LDK, a.l2norm, tid);
  if ((tid & 3) == 0) {
    sm.rq[tid >> 2] = rq;
    sm.rk[tid >> 2] = rk;
  }
  __syncthreads();  // staging tiles of dq_s, dw complete

  tile_rows_store<T, KMAX>(out_q, view_rows(a.dq_out, head), a.dq_out.s1, L, tid);
  tile_rows_store<T, KMAX>(out_w, view_rows(a.dv_out, hv), a.dv_out.s1, L, tid);

  // ---- Pass 2: X^T = dh v_new^T; then <h_c, dh_{c+1}> from the same blocks.
  {
    float accX[NTV][4];
    mma::zero_acc(accX);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int np = 0; np < NTV / 2; ++np)
        block_mma(accX[2 * np], accX[2 * np + 1], hr[2 * b], hr[2 * b + 1], sm.vn, b, n0k + 16 * np);
    }
    float hdh = 0.f;
    if (cgp == 0) {
#pragma unroll
      for (int j = 0; j < 2 * NB; ++j)
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          float h0, h1, d0, d1;
          mma::unpack_floats<T>(h2[j][m], h0, h1);
          mma::unpack_floats<T>(hr[j][m], d0, d1);
          hdh += h0 * d0 + h1 * d1;
        }
    }
    // dk_s = exp(G_last - G_i) X into its tile, and <k_raw_i, dk_s_i> over this warp's channels.
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt) {
      float p[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
        const float x = accX[nt][e] * sm.kd[i];
        out_dk[at(i, d)] = from_f<T>(x);
        p[e & 1] += to_f<T>(sm.k[at(i, d)]) * x;
      }
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const float s = mma::column_sum(p[q2]);
        if (grp == 0) sm.pk[kst * C + n0k + 8 * nt + tig + 4 * q2] = s;
      }
    }
    if (cgp == 0) exact_state_dot<T>(a, ci, c, hv, hc, dhc, V, 16 * kst + grp, tig, hdh);
    hdh = group_sum<32>(hdh);
    if (lane == 0) sm.hsum[wp] = cgp == 0 ? hdh : 0.f;
  }
  __syncthreads();  // dk_s's tile, the dot partials and hdh complete
  tile_rows_store<T, KMAX>(out_dk, view_rows(a.dk_out, head), a.dk_out.s1, L, tid);

  // ---- dG's state terms (warp 0).
  if (wp == 0 && a.dG_state) store_state_dG_terms<KS>(a, sm.pq, sm.pk, sm.rq, sm.rk, sm.hsum, L, row0, hv, gl, lane);
}

}  // namespace flashgrad::cuda_detail::delta_rule
