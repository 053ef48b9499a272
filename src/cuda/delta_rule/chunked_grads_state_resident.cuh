// B2a with resident tiles (session 11, helper gdnb2s; docs/perf/delta_rule.md "GDN B2, session 11"):
// chunk_grads_state_resident_kernel computes what chunk_grads_state_kernel (chunked_grads_split.cuh)
// computes, for V == K, with the same products and roundings, but loads differently.
//
// Why: the slice kernel moves ~1.6 GB per call at B8 T4096 H16 K=V=128 (~0.35 ms of HBM time) and
// took 0.79 ms (ncu, session 7: issue active 28%, long scoreboard 30%, DRAM 45%): each of its 8
// 32-column V slices waited for its own cp.async copies and h / dh fragments behind a block barrier,
// one slice of loads in flight per block (~16 KiB; two blocks per SM keep ~32 KiB in flight, about
// half of what hides the memory latency at full bandwidth). Here every tile a block reads is issued
// at its start:
//   - do, dv_new, v_new, q, k whole ([64][K] each) by cp.async into shared memory (two groups: do and
//     dv_new first, then v_new, q, k); the staging tiles of dq_s and dw take do's and dv_new's places
//     once pass 1 is done (one barrier), dk_s has its own tile: 6 tiles, 107 KiB at K = 128;
//   - all of this warp's h fragments (16 key rows x V: 32 registers at K = 128) by 32-bit loads into
//     registers before the first wait; each 16-column step's registers are refilled with dh's
//     fragment of the same columns once its pass-1 products are issued, so dh is in flight through
//     the rest of pass 1 and its epilogue; h is read again (L2) for <h_c, dh_{c+1}> at pass 2's start
//     and used after pass 2's products.
// No barrier inside the passes (4 in all, was 10), and dq_s / dw leave (16-byte stores) before pass 2.
#pragma once

#include "chunked_grads_frags.cuh"
#include "chunked_grads_split.cuh"  // row_rstd, tile_rows_async / _store (it includes this file at its end)
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_mma_tf32.cuh"  // zero_acc, column_sum
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {


// <h_c, dh_{c+1}> from the fp32 initial_state / dht on a sequence's first / last chunk (as the slice
// kernel: 16-bit copies of those arbitrary states lose most of dg's largest term there): the thread's
// share (key rows key0, key0 + 8, columns 2 tig + 8 m + {0, 1}) replaces hdh there.
template <typename T>
__device__ __forceinline__ void exact_state_dot(const ChunkedArgs& a, const ChunkInfo& ci, int64_t c, int64_t hv,
                                                const T* hc, const T* dhc, int64_t V, int key0, int tig, float& hdh) {
  const int64_t n = ci.seq;
  const bool exact_h = a.h0.p && c == a.seq_first_chunk[n], exact_dh = a.dht.p && c == a.seq_first_chunk[n + 1] - 1;
  if (!(exact_h || exact_dh)) return;
  const float* h0 = static_cast<const float*>(a.h0.p);
  const float* dht = static_cast<const float*>(a.dht.p);
  hdh = 0.f;
  for (int col = 2 * tig; col < V; col += 8)
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int key = key0 + 8 * r8;
#pragma unroll
      for (int p2 = 0; p2 < 2; ++p2) {
        const float x = exact_h ? h0[off4(a.h0, n, hv, key, col + p2)] : to_f<T>(hc[key * V + col + p2]);
        const float y = exact_dh ? dht[off4(a.dht, n, hv, key, col + p2)] : to_f<T>(dhc[key * V + col + p2]);
        hdh += x * y;
      }
    }
}
// dG's state terms by one warp (lane l: rows l and l + 32) from the per-warp column partials pq, pk
// ([KS][C]) of the raw dots, the row norms and the per-warp hdh sums: s_i = k_i.dk_s_i, dG_i = q_i.dq_s_i
// - s_i (normalized q, k: the raw dots times rstd), dG_{L-1} += sum_{i < L} s_i + exp(G_last) <h, dh>.
template <int KS>
__device__ __forceinline__ void store_state_dG_terms(const ChunkedArgs& a, const float* pq, const float* pk,
                                                     const float* rq, const float* rk, const float* hsum8, int L,
                                                     int64_t row0, int64_t hv, float gl, int lane) {
  constexpr int C = kChunkSize;
  float sq[2], sk[2], ssum = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + 32 * h;
    float x = 0.f, y = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) {
      x += pq[w * C + i];
      y += pk[w * C + i];
    }
    sq[h] = x * rq[i];
    sk[h] = y * rk[i];
    if (i < L) ssum += sk[h];
  }
  ssum = group_sum<32>(ssum);
  float hsum = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) hsum += hsum8[w];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + 32 * h;
    if (i < L) a.dG_state[(row0 + i) * a.HV + hv] = sq[h] - sk[h] + (i == L - 1 ? ssum + expf(gl) * hsum : 0.f);
  }
}

// Shared memory: q, k raw; do (then the dq_s staging tile), dv_new (then dw's), v_new, dk_s's staging
// tile, each [C][K + 8] of T (V == K); per-row factors; the dG dots' per-warp column partials.
template <typename T, int KMAX>
struct GradsStateResidentSmem {
  static constexpr int C = kChunkSize, KS = KMAX / 16;
  static constexpr int LDK = KMAX + 8;  // +8 elements: conflict-free ldmatrix rows, 16-byte aligned
  static constexpr int64_t kTile = sizeof(T) * C * LDK;
  static_assert(kTile % 16 == 0, "16-byte aligned tiles");
  // floats: rq, rk, eG, kd [C]; dot partials q, k [KS][C]; hdh per warp [8].
  static constexpr int64_t bytes() { return 6 * kTile + sizeof(float) * ((4 + 2 * KS) * C + 8); }
  unsigned char* raw;
  T *q, *k, *dO, *dvn, *vn, *out_k;
  float *rq, *rk, *eG, *kd, *pq, *pk, *hsum;
  __device__ explicit GradsStateResidentSmem(unsigned char* r) : raw(r) {
    T* t = reinterpret_cast<T*>(raw);
    constexpr int64_t n = C * LDK;  // elements per tile
    q = t;
    k = t + n;
    dO = t + 2 * n;
    dvn = t + 3 * n;
    vn = t + 4 * n;
    out_k = t + 5 * n;
    rq = reinterpret_cast<float*>(raw + 6 * kTile);
    rk = rq + C;
    eG = rk + C;
    kd = eG + C;
    pq = kd + C;  // [KS][C]
    pk = pq + KS * C;
    hsum = pk + KS * C;
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(256, 2) chunk_grads_state_resident_kernel(ChunkedArgs a) {
  using S = GradsStateResidentSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, NJ = KMAX / 16;  // NJ 16-column steps of V
  constexpr int KS = KMAX / 16, CG = 8 / KS, NTV = 8 / CG;  // key strips, column groups, 8-row tiles
  static_assert(KS * CG == 8 && NTV % 2 == 0, "K = 64 or 128 over 8 warps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = a.chunks[c];
  const int L = ci.len, tid = static_cast<int>(threadIdx.x), lane = tid & 31, wp = tid >> 5, grp = lane >> 2,
            tig = lane & 3;
  // Key role: warp (kst, cgp) owns key rows [16 kst, +16) and chunk rows [n0k, n0k + 8 NTV).
  const int kst = wp % KS, cgp = wp / KS, n0k = cgp * 8 * NTV;
  const int64_t row0 = chunk_row0(ci, a.T), HV = a.HV;
  constexpr int64_t V = KMAX;
  const GradsFrags<T> fr(lane);
  auto erow = [&](int e) { return grp + 8 * (e >> 1); };
  auto ecol = [&](int e) { return 2 * tig + (e & 1); };

  const T* hc = static_cast<const T*>(a.h16) + (c * HV + hv) * KMAX * V;   // h_c [K][V]
  const T* dhc = static_cast<const T*>(a.dh16) + (c * HV + hv) * KMAX * V;  // dL/dh_{c+1} [K][V]
  // A fragment (rows [16 kst, +16), columns [col, +16)) of a [K][V] state in T: register m holds row
  // grp + 8 (m % 2), columns col + 2 tig + 8 (m / 2) + {0, 1}: one 32-bit load each.
  const T* frag_h = hc + (16 * kst + grp) * V + 2 * tig;
  const T* frag_dh = dhc + (16 * kst + grp) * V + 2 * tig;
  auto load_state_frag = [&](const T* p, int col, uint32_t(&x)[4]) {
#pragma unroll
    for (int m = 0; m < 4; ++m)
      x[m] = *reinterpret_cast<const uint32_t*>(p + col + 8 * (m & 1) * V + 8 * (m >> 1));
  };
  // Row 0 of this item in a view (q, k, do, the gradients; row stride x.s1) and in a [rows, HV, V]
  // intermediate (v_new, dv_new; row stride HV V).
  auto view_rows = [&](const View& x, int64_t idx) { return static_cast<T*>(x.p) + off3(x, ci.b, ci.t0, idx); };
  auto inter_rows = [&](const void* base) { return static_cast<const T*>(base) + (row0 * HV + hv) * V; };

  // ---- Loads, all issued first: h fragments (registers), then do, dv_new (group 0) and v_new, q, k
  // (group 1) by cp.async; per-row gate factors.
  uint32_t hr[NJ][4];  // h, then dh: fragment of 16-column step j
#pragma unroll
  for (int j = 0; j < NJ; ++j) load_state_frag(frag_h, 16 * j, hr[j]);
  tile_rows_async<T, KMAX>(view_rows(a.dout, hv), a.dout.s1, L, sm.dO, tid);
  tile_rows_async<T, KMAX>(inter_rows(a.dv_new16), HV * V, L, sm.dvn, tid);
  mma::cp_async_commit();
  tile_rows_async<T, KMAX>(inter_rows(a.v_new), HV * V, L, sm.vn, tid);
  tile_rows_async<T, KMAX>(view_rows(a.q, head), a.q.s1, L, sm.q, tid);
  tile_rows_async<T, KMAX>(view_rows(a.k, head), a.k.s1, L, sm.k, tid);
  mma::cp_async_commit();
  const float gl = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
  if (tid < C) {
    const float g = (a.G && tid < L) ? a.G[(row0 + tid) * HV + hv] : 0.f;
    sm.eG[tid] = expf(g);
    sm.kd[tid] = expf(gl - g);  // arguments <= 0 for gates g <= 0
  }
  mma::cp_async_wait<1>();
  __syncthreads();  // do, dv_new (and the gate factors) in shared memory

  // ---- Pass 1: Y^T = h do^T, Z^T = h dv_new^T (no barriers: every operand is resident).
  float accY[NTV][4], accZ[NTV][4];
  mma::zero_acc(accY);
  mma::zero_acc(accZ);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
#pragma unroll
    for (int np = 0; np < NTV / 2; ++np) {
      uint32_t bd[4], bh[4];
      fr.ldb(bd, sm.dO, LDK, 16 * j, n0k + 16 * np);
      fr.ldb(bh, sm.dvn, LDK, 16 * j, n0k + 16 * np);
      fr.mma2(accY[2 * np], accY[2 * np + 1], hr[j], bd);
      fr.mma2(accZ[2 * np], accZ[2 * np + 1], hr[j], bh);
    }
    load_state_frag(frag_dh, 16 * j, hr[j]);  // dh's fragment of the same columns, for pass 2
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with do / dv_new (they become staging tiles); v_new, q, k landed

  // dq_s = scale exp(G_i) Y into do's tile, dw = -Z into dv_new's (element: key channel d, chunk row i).
  T* out_q = sm.dO;
  T* out_w = sm.dvn;
#pragma unroll
  for (int nt = 0; nt < NTV; ++nt) {
    float p[2] = {0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
      const float y = accY[nt][e] * (a.scale * sm.eG[i]);
      out_q[i * LDK + d] = from_f<T>(y);
      out_w[i * LDK + d] = from_f<T>(-accZ[nt][e]);
      p[e & 1] += to_f<T>(sm.q[i * LDK + d]) * y;  // <q_raw_i, dq_s_i> over this warp's channels
    }
#pragma unroll
    for (int q2 = 0; q2 < 2; ++q2) {
      const float s = mma::column_sum(p[q2]);
      if (grp == 0) sm.pq[kst * C + n0k + 8 * nt + 2 * tig + q2] = s;
    }
  }
  // h again (L2) for <h_c, dh_{c+1}>, used after pass 2's products: the first column group's warps
  // (each (key channel, value column) once).
  uint32_t h2[NJ][4];
  if (cgp == 0) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) load_state_frag(frag_h, 16 * j, h2[j]);
  }
  const float rq = row_rstd<T, KMAX>(sm.q, LDK, a.l2norm, tid);
  const float rk = row_rstd<T, KMAX>(sm.k, LDK, a.l2norm, tid);
  if ((tid & 3) == 0) {
    sm.rq[tid >> 2] = rq;
    sm.rk[tid >> 2] = rk;
  }
  __syncthreads();  // staging tiles of dq_s, dw complete

  // The staged outputs, rows < L, in 16-byte pieces.
  tile_rows_store<T, KMAX>(out_q, view_rows(a.dq_out, head), a.dq_out.s1, L, tid);
  tile_rows_store<T, KMAX>(out_w, view_rows(a.dv_out, hv), a.dv_out.s1, L, tid);

  // ---- Pass 2: X^T = dh v_new^T; then <h_c, dh_{c+1}> from the same fragments.
  {
    float accX[NTV][4];
    mma::zero_acc(accX);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
      for (int np = 0; np < NTV / 2; ++np) {
        uint32_t bv[4];
        fr.ldb(bv, sm.vn, LDK, 16 * j, n0k + 16 * np);
        fr.mma2(accX[2 * np], accX[2 * np + 1], hr[j], bv);
      }
    }
    float hdh = 0.f;
    if (cgp == 0) {
#pragma unroll
      for (int j = 0; j < NJ; ++j)
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
        sm.out_k[i * LDK + d] = from_f<T>(x);
        p[e & 1] += to_f<T>(sm.k[i * LDK + d]) * x;
      }
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const float s = mma::column_sum(p[q2]);
        if (grp == 0) sm.pk[kst * C + n0k + 8 * nt + 2 * tig + q2] = s;
      }
    }
    if (cgp == 0) exact_state_dot<T>(a, ci, c, hv, hc, dhc, V, 16 * kst + grp, tig, hdh);
    hdh = group_sum<32>(hdh);
    if (lane == 0) sm.hsum[wp] = cgp == 0 ? hdh : 0.f;
  }
  __syncthreads();  // dk_s's tile, the dot partials and hdh complete
  tile_rows_store<T, KMAX>(sm.out_k, view_rows(a.dk_out, head), a.dk_out.s1, L, tid);

  // ---- dG's state terms (warp 0).
  if (wp == 0 && a.dG_state) store_state_dG_terms<KS>(a, sm.pq, sm.pk, sm.rq, sm.rk, sm.hsum, L, row0, hv, gl, lane);
}

}  // namespace flashgrad::cuda_detail::delta_rule
