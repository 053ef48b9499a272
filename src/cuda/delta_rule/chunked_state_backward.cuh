// Chunked backward stage B1 ("state backward"), one block of 128 threads (4 warps) per
// (sequence, value head, slice of 32 value columns), over the sequence's chunks in reverse:
// with dh = dL/dh_{c+1} (the gradient of the state leaving chunk c; dht for the last chunk),
//   dv_new = (k exp(G_last - G)) dh + scale P^T do,   P = Lower(q k^T exp(G_i - G_j))
//   dh_c   = exp(G_last) dh + scale (q exp(G))^T do - w^T dv_new
// (the derivatives of chunked.h's v_new, o and h_{c+1} formulas; src/reference/delta_rule/
// chunked_backward.cpp, state_update / output / prediction). Writes dh per chunk, dv_new (fp32)
// and dh0. Needs the forward's G and w (stage 1); h is not needed here.
//
// Layout as stage 2 (chunked_state.cuh): dh (K x 32, fp32) lives in mma accumulators; warp wp owns
// rows [16 (wp + 4 mt), +16) of it and rows [16 wp, +16) of dv_new. Operands are split into
// hi + lo parts in T (chunked_prepare_compact.cuh says why), except do and w, which are exact in T.
// The shared arrays of q and k are first used for P, then transformed in place into
// scale exp(G) q and k exp(G_last - G) (each element by the thread that reads it).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_output.cuh"  // store_split
#include "chunked_rows.cuh"
#include "chunked_state.cuh"   // kStateCols
#include "chunked_state_acc.cuh"
#include "chunked_dv_new_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX>
struct StateBackwardSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDH = kStateCols + 8, LDP = C + 8;
  T *qs, *qs_lo;    // [C][LDK] q, then scale exp(G) q
  T *ks, *ks_lo;    // [C][LDK] k, then k exp(G_last - G)
  T* ws;            // [C][LDK] w
  T* dos;           // [C][LDH] do slice
  T *dhs, *dhs_lo;  // [KMAX][LDH] dh
  T *Ps, *Ps_lo;    // [C][LDP] scale * P
  T *nd, *nd_lo;    // [C][LDH] -dv_new
  float* G;         // [C]
  static constexpr int64_t bytes() {
    return sizeof(T) * (5 * C * LDK + C * LDH + 2 * KMAX * LDH + 2 * C * LDP + 2 * C * LDH) + sizeof(float) * C;
  }
  __device__ explicit StateBackwardSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    qs_lo = qs + C * LDK;
    ks = qs_lo + C * LDK;
    ks_lo = ks + C * LDK;
    ws = ks_lo + C * LDK;
    dos = ws + C * LDK;
    dhs = dos + C * LDH;
    dhs_lo = dhs + KMAX * LDH;
    Ps = dhs_lo + KMAX * LDH;
    Ps_lo = Ps + C * LDP;
    nd = Ps_lo + C * LDP;
    nd_lo = nd + C * LDH;
    G = reinterpret_cast<float*>(nd_lo + C * LDH);
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_state_backward_kernel(ChunkedArgs a) {
  using S = StateBackwardSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDH = S::LDH, LDP = S::LDP, MT = KMAX / 64, NT = kStateCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kStateCols;
  const int tid = threadIdx.x, wp = tid / 32;

  float dh[MT][NT][4];
  load_state_acc(dh, a.dht, n, hv, col0, wp);

  const T* w = static_cast<const T*>(a.w);
  for (int64_t c = a.seq_first_chunk[n + 1] - 1; c >= a.seq_first_chunk[n]; --c) {
    const ChunkInfo ci = chunk_info(a, c);
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);

    // dL/dh_{c+1}: to the intermediates (fp32) and to shared memory (hi + lo).
    store_state_acc_chunk<T>(dh, a.dh, a, c, hv, col0, sm.dhs, sm.dhs_lo, LDH, wp);
    if (tid < C) sm.G[tid] = (a.G && tid < L) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
    for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) {
      store_split<T>(x, &sm.qs[r * LDK + d], &sm.qs_lo[r * LDK + d]);
    });
    for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) {
      store_split<T>(x, &sm.ks[r * LDK + d], &sm.ks_lo[r * LDK + d]);
    });
    for (int e = tid; e < C * KMAX; e += kChunkThreads) {
      const int r = e / KMAX, d = e % KMAX;
      sm.ws[r * LDK + d] = r < L ? w[((row0 + r) * a.HV + hv) * a.K + d] : from_f<T>(0.f);
    }
    for_each_value_row<T>(a.dout, ci, hv, col0, kStateCols,
                          [&](int r, int col, float x) { sm.dos[r * LDH + col] = from_f<T>(x); });
    __syncthreads();
    const float G_last = sm.G[L - 1];

    // scale * P = scale * Lower(q k^T exp(G_i - G_j)), rows [16 wp, +16), as hi + lo.
    {
      float pacc[8][4] = {};
#pragma unroll
      for (int kk = 0; kk < KMAX; kk += 16) {
        uint32_t qh[4], ql[4];
        mma::frag_a(sm.qs, LDK, 16 * wp, kk, qh);
        mma::frag_a(sm.qs_lo, LDK, 16 * wp, kk, ql);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (nt > 2 * wp + 1) continue;
          uint32_t bh[2], bl[2];
          mma::frag_b_trans(sm.ks, LDK, kk, 8 * nt, bh);
          mma::frag_b_trans(sm.ks_lo, LDK, kk, 8 * nt, bl);
          mma::mma16816<T>(pacc[nt], qh, bh);
          mma::mma16816<T>(pacc[nt], ql, bh);
          mma::mma16816<T>(pacc[nt], qh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
          const float p = i >= j && i < L ? a.scale * pacc[nt][e] * expf(sm.G[i] - sm.G[j]) : 0.f;
          store_split<T>(p, &sm.Ps[i * LDP + j], &sm.Ps_lo[i * LDP + j]);
        }
    }
    __syncthreads();  // every warp is done with q, k as they were

    // In place: q -> scale exp(G_r) q, k -> k exp(G_last - G_r) (r < L; exponents <= 0).
    for (int e = tid; e < C * KMAX; e += kChunkThreads) {
      const int r = e / KMAX, d = e % KMAX, at = r * LDK + d;
      const float qv = to_f<T>(sm.qs[at]) + to_f<T>(sm.qs_lo[at]);
      const float kv = to_f<T>(sm.ks[at]) + to_f<T>(sm.ks_lo[at]);
      store_split<T>(r < L ? a.scale * expf(sm.G[r]) * qv : 0.f, &sm.qs[at], &sm.qs_lo[at]);
      store_split<T>(r < L ? kv * expf(G_last - sm.G[r]) : 0.f, &sm.ks[at], &sm.ks_lo[at]);
    }
    __syncthreads();

    // dv_new = kd dh + (scale P)^T do: warp wp, rows [16 wp, +16), the slice's 32 columns.
    {
      float acc[NT][4] = {};
#pragma unroll
      for (int kk = 0; kk < KMAX; kk += 16) {
        uint32_t ah[4], al[4];
        mma::frag_a(sm.ks, LDK, 16 * wp, kk, ah);
        mma::frag_a(sm.ks_lo, LDK, 16 * wp, kk, al);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bh[2], bl[2];
          mma::frag_b(sm.dhs, LDH, kk, 8 * nt, bh);
          mma::frag_b(sm.dhs_lo, LDH, kk, 8 * nt, bl);
          mma::mma16816<T>(acc[nt], ah, bh);
          mma::mma16816<T>(acc[nt], al, bh);
          mma::mma16816<T>(acc[nt], ah, bl);
        }
      }
      // (P^T)[j][i] = P[i][j] is nonzero for i >= j only: row blocks kb >= wp.
      for (int kb = wp; kb < 4; ++kb) {
        uint32_t ph[4], pl[4];
        mma::frag_a_trans(sm.Ps, LDP, 16 * wp, 16 * kb, ph);
        mma::frag_a_trans(sm.Ps_lo, LDP, 16 * wp, 16 * kb, pl);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bf[2];
          mma::frag_b(sm.dos, LDH, 16 * kb, 8 * nt, bf);
          mma::mma16816<T>(acc[nt], ph, bf);
          mma::mma16816<T>(acc[nt], pl, bf);
        }
      }
      store_dv_new_rows<T>(acc, a, row0, hv, col0, L, sm.nd, sm.nd_lo, LDH, wp);
    }
    __syncthreads();

    // dh_c = exp(G_last) dh + (scale exp(G) q)^T do + w^T (-dv_new).
    const float decay = expf(G_last);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dh[mt][nt][e] *= decay;
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        const int m0 = 16 * (wp + 4 * mt);
        uint32_t qh[4], ql[4], wf[4];
        mma::frag_a_trans(sm.qs, LDK, m0, kk, qh);
        mma::frag_a_trans(sm.qs_lo, LDK, m0, kk, ql);
        mma::frag_a_trans(sm.ws, LDK, m0, kk, wf);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bf[2], nh[2], nl[2];
          mma::frag_b(sm.dos, LDH, kk, 8 * nt, bf);
          mma::frag_b(sm.nd, LDH, kk, 8 * nt, nh);
          mma::frag_b(sm.nd_lo, LDH, kk, 8 * nt, nl);
          mma::mma16816<T>(dh[mt][nt], qh, bf);
          mma::mma16816<T>(dh[mt][nt], ql, bf);
          mma::mma16816<T>(dh[mt][nt], wf, nh);
          mma::mma16816<T>(dh[mt][nt], wf, nl);
        }
      }
    }
    __syncthreads();  // shared memory is refilled by the previous chunk
  }

  if (a.dh0.p) store_state_acc(dh, a.dh0, n, hv, col0, wp);
}

}  // namespace flashgrad::cuda_detail::delta_rule
