// KDA chunked backward stage B1 ("state backward"), one block of 128 threads per (sequence,
// value head, slice of 32 value columns), over the sequence's chunks in reverse. With dh =
// dL/dh_{c+1} (dht for the last chunk), per key channel d:
//   dv_new = (k o exp(G_last - G)) dh + scale P^T do,  P = Lower_incl(sum_d q_id k_jd exp(G_id - G_jd))
//   dh_c   = diag(exp(G_last)) dh + scale (q o exp(G))^T do - w^T dv_new
// Writes dh per chunk, dv_new (fp32) and dh0; needs G and w (stage 1).
//
// As the GDN stage (chunked_state_backward.cuh): dh lives in mma accumulators, operands split
// hi + lo. P comes from stage 1 (packed in A's upper triangle, chunked_kda.h).
#pragma once

#include "chunked_kda_decay.cuh"  // decay_exp
#include "chunked_kda_mma.cuh"
#include "chunked_kda_prefetch.cuh"
#include "chunked_kda_output.cuh"  // kda_packed_P
#include "chunked_state.cuh"       // kStateCols
#include "chunked_state_acc.cuh"
#include "chunked_dv_new_rows.cuh"
#include "chunked_tiles.cuh"       // intermediate_tile_async, view_rows_async

namespace flashgrad::cuda_detail::delta_rule {

// Per chunk: (1) dh_regs = diag(exp(G_last)) dh + (scale q o exp(G))^T do, which frees q's
// arrays for scale P; (2) dv_new = kd dh + (scale P)^T do, which frees k's arrays for -dv_new;
// (3) dh_regs += w^T (-dv_new). The aliasing keeps K = 128 at 111 KiB: two blocks per SM.
template <typename T, int KMAX>
struct KdaStateBackwardSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDH = kStateCols + 8, LDP = C + 8;
  static_assert(2 * C * LDP <= 2 * C * LDK && 2 * C * LDH <= 2 * C * LDK, "P, -dv_new fit where q, k were");
  T *qs, *qs_lo;    // [C][LDK] scale q o exp(G)             } region `q`
  T *Ps, *Ps_lo;    // [C][LDP] scale P (after step 1)         }
  T *ks, *ks_lo;    // [C][LDK] k o exp(G_last - G)          } region `k`
  T *nd, *nd_lo;    // [C][LDH] -dv_new (after step 2)         }
  T* ws;            // [C][LDK] w
  T* dos;           // [C][LDH] do slice
  T *dhs, *dhs_lo;  // [KMAX][LDH] dh
  float* Gl;        // [KMAX] G_{L-1} per channel
  static constexpr int64_t bytes() {
    return sizeof(T) * (5 * C * LDK + C * LDH + 2 * KMAX * LDH) + sizeof(float) * KMAX;
  }
  __device__ explicit KdaStateBackwardSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    qs_lo = qs + C * LDK;
    Ps = qs;
    Ps_lo = Ps + C * LDP;
    ks = qs_lo + C * LDK;
    ks_lo = ks + C * LDK;
    nd = ks;
    nd_lo = nd + C * LDH;
    ws = ks_lo + C * LDK;
    dos = ws + C * LDK;
    dhs = dos + C * LDH;
    dhs_lo = dhs + KMAX * LDH;
    Gl = reinterpret_cast<float*>(dhs_lo + KMAX * LDH);
  }
};

// kPrefetch: the next chunk's rows into L2 each step (chunked_kda_prefetch.cuh); off by default (run
// 6.4: 2.22 ms without, 2.36 ms with, once the step's loads were cp.async and its addresses hoisted).
template <typename T, int KMAX, bool kPrefetch = false>
__global__ void __launch_bounds__(kChunkThreads, 1) kda_state_backward_kernel(ChunkedArgs a) {
  using S = KdaStateBackwardSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDH = S::LDH, LDP = S::LDP, MT = KMAX / 64, NT = kStateCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kStateCols;
  const int tid = threadIdx.x, wp = tid / 32;

  float dh[MT][NT][4];
  load_state_acc(dh, a.dht, n, hv, col0, wp);

  const T* w = static_cast<const T*>(a.w);
  // do's columns [col0, col0 + 32) as a view of their own (16-byte copies when aligned).
  View do_slice = a.dout;
  do_slice.p = static_cast<T*>(a.dout.p) + col0;
  const bool do_vec = key_rows_vectorizable(do_slice);
  const int64_t c_first = a.seq_first_chunk[n];
  for (int64_t c = a.seq_first_chunk[n + 1] - 1; c >= c_first; --c) {
    const ChunkInfo ci = a.chunks[c];
    const bool has_next = c - 1 >= c_first;  // the next chunk in this stage's (reverse) order
    const ChunkInfo cn = a.chunks[has_next ? c - 1 : c];  // issued now, used after the loads below
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);

    store_state_acc_chunk<T>(dh, a.dh, a, c, hv, col0, sm.dhs, sm.dhs_lo, LDH, wp);
    // G rows of the chunk: row r at Gc + r * HV K (formed once, not per element).
    const float* Gc = a.G + (row0 * a.HV + hv) * a.K;
    const int64_t g_stride = a.HV * a.K;
    auto G_at = [&](int r, int d) { return Gc[r * g_stride + d]; };
    if (tid < KMAX) sm.Gl[tid] = G_at(L - 1, tid);
    // w's rows and the do slice by cp.async (raw T, 16 bytes per copy, rows past L zero-filled;
    // chunked_tiles.cuh), in flight while q and k are loaded and scaled below.
    intermediate_tile_async<T, KMAX, kChunkThreads>(w, row0, a.HV, hv, a.K, 0, L, sm.ws, LDK);
    view_rows_async<T, kChunkThreads>(do_slice, ci, hv, kStateCols, do_vec, sm.dos, LDH);
    mma::cp_async_commit();
    // The next chunk's q, k, G, w, do, P rows into L2 while this one computes.
    if (kPrefetch && has_next) prefetch_kda_serial_rows<T, kChunkThreads>(a, cn, hv, head, col0);
    __syncthreads();
    // scale q o exp(G) and k o exp(G_last - G) (exponents <= 0; rows past L are zero).
    auto G_in = [&](int r, int d) { return r < L ? G_at(r, d) : 0.f; };
    kda_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, G_in, [&](int r, int d, float x, float g) {
      store_split<T>(r < L ? a.scale * decay_exp(g) * x : 0.f, &sm.qs[r * LDK + d], &sm.qs_lo[r * LDK + d]);
    });
    kda_key_rows<T, KMAX>(a.k, ci, head, a.l2norm, G_in, [&](int r, int d, float x, float g) {
      store_split<T>(r < L ? x * decay_exp(sm.Gl[d] - g) : 0.f, &sm.ks[r * LDK + d], &sm.ks_lo[r * LDK + d]);
    });
    mma::cp_async_wait<0>();
    __syncthreads();

    // (1) dh_regs = diag(exp(G_last)) dh + (scale q o exp(G))^T do (dh's copy in dhs stays for (2)).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dh[mt][nt][e] *= decay_exp(sm.Gl[state_acc_row(wp, mt, e)]);
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        const int m0 = 16 * (wp + 4 * mt);
        uint32_t qh[4], ql[4];  // fragments by ldmatrix (kda_mma::ldm_*)
        kda_mma::ldm_a_trans(sm.qs, LDK, m0, kk, qh);
        kda_mma::ldm_a_trans(sm.qs_lo, LDK, m0, kk, ql);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b4[4];
          kda_mma::ldm_b_pair(sm.dos, LDH, kk, 16 * np, b4);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t bf[2] = {b4[2 * t], b4[2 * t + 1]};
            mma::mma16816<T>(dh[mt][2 * np + t], qh, bf);
            mma::mma16816<T>(dh[mt][2 * np + t], ql, bf);
          }
        }
      }
    }
    __syncthreads();  // q's arrays are free: scale P takes their place
    batched_copy<C * C>(  // consecutive threads: one stored row j
        [&](int e) {
          const int j = e / C, i = e % C;
          return i < L && j <= i ? a.scale * kda_packed_P(a.A, row0, hv, a.HV, i, j) : 0.f;
        },
        [&](int e, float p) {
          const int j = e / C, i = e % C;
          store_split<T>(p, &sm.Ps[i * LDP + j], &sm.Ps_lo[i * LDP + j]);
        });
    __syncthreads();

    // (2) dv_new = kd dh + (scale P)^T do: warp wp, rows [16 wp, +16), the slice's 32 columns.
    {
      float acc[NT][4] = {};
      kda_mma::rows_times_split<T, NT>(sm.ks, sm.ks_lo, LDK, sm.dhs, sm.dhs_lo, LDH, 0, KMAX, acc);
      // (P^T)[j][i] = P[i][j] is nonzero for i >= j only: row blocks kb >= wp.
      for (int kb = wp; kb < 4; ++kb) {
        uint32_t ph[4], pl[4];
        kda_mma::ldm_a_trans(sm.Ps, LDP, 16 * wp, 16 * kb, ph);
        kda_mma::ldm_a_trans(sm.Ps_lo, LDP, 16 * wp, 16 * kb, pl);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b4[4];
          kda_mma::ldm_b_pair(sm.dos, LDH, 16 * kb, 16 * np, b4);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t bf[2] = {b4[2 * t], b4[2 * t + 1]};
            mma::mma16816<T>(acc[2 * np + t], ph, bf);
            mma::mma16816<T>(acc[2 * np + t], pl, bf);
          }
        }
      }
      __syncthreads();  // every warp is done with k's arrays: -dv_new takes their place
      store_dv_new_rows<T>(acc, a, row0, hv, col0, L, sm.nd, sm.nd_lo, LDH, wp);
    }
    __syncthreads();

    // (3) dh_regs += w^T (-dv_new).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        uint32_t wf[4];
        kda_mma::ldm_a_trans(sm.ws, LDK, 16 * (wp + 4 * mt), kk, wf);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t nh[4], nl[4];
          kda_mma::ldm_b_pair(sm.nd, LDH, kk, 16 * np, nh);
          kda_mma::ldm_b_pair(sm.nd_lo, LDH, kk, 16 * np, nl);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t b_h[2] = {nh[2 * t], nh[2 * t + 1]}, b_l[2] = {nl[2 * t], nl[2 * t + 1]};
            mma::mma16816<T>(dh[mt][2 * np + t], wf, b_h);
            mma::mma16816<T>(dh[mt][2 * np + t], wf, b_l);
          }
        }
      }
    }
    __syncthreads();  // shared memory is refilled by the previous chunk
  }

  if (a.dh0.p) store_state_acc(dh, a.dh0, n, hv, col0, wp);
}

}  // namespace flashgrad::cuda_detail::delta_rule
