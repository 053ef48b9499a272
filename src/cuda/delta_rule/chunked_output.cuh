// Chunked stage 3 ("output"), one block of 128 threads (4 warps) per (chunk, value head, slice
// of 64 value columns):
//   P = Lower(q k^T exp(G_i - G_j))  (j <= i),  o = scale [exp(G) (q h_c) + P v_new].
// Reads q, k (normalized here again), G, h_c and v_new from stages 1 and 2; writes o.
// Warp wp owns output rows [16 wp, 16 wp + 16).
//
// Accuracy: q, k, h_c and P are split into hi + lo parts in T and multiplied as
// hi hi + hi lo + lo hi (chunked_prepare.cuh says why); v_new arrives already rounded to T.
// (CPU emulation against the float64 reference, bf16: o 2.1e-3 - 2.3e-3 relative RMS with the
// splits, 3.2e-3 - 3.7e-3 without.)
#pragma once

#include "chunked_mma.cuh"
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kOutputCols = 64;  // value columns per stage-3 block

// Region `state` holds h_c (hi, lo) for q h_c, then P (hi, lo) and the v_new slice: the second
// use begins after a block barrier. K = V = 128: 107 KiB (two blocks per SM).
template <typename T, int KMAX>
struct OutputSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDV = kOutputCols + 8, LDP = C + 8;
  static constexpr int64_t kStateBytes = (2 * KMAX * LDV > 2 * C * LDP + C * LDV ? 2 * KMAX * LDV
                                                                                : 2 * C * LDP + C * LDV) *
                                         static_cast<int64_t>(sizeof(T));
  T* qs;     // [C][LDK] q (normalized), hi part
  T* qs_lo;  // [C][LDK]
  T* ks;     // [C][LDK] k (normalized), hi part
  T* ks_lo;  // [C][LDK]
  T* hs;     // [KMAX][LDV] h_c slice, hi part       } region `state`
  T* hs_lo;  // [KMAX][LDV]                          }
  T* P;      // [C][LDP] hi part (aliases hs)        }
  T* P_lo;   // [C][LDP]                             }
  T* vn;     // [C][LDV] v_new slice                 }
  float* G;  // [C]
  static constexpr int64_t bytes() { return sizeof(T) * 4 * C * LDK + kStateBytes + sizeof(float) * C; }
  __device__ explicit OutputSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    qs_lo = qs + C * LDK;
    ks = qs_lo + C * LDK;
    ks_lo = ks + C * LDK;
    hs = ks_lo + C * LDK;
    hs_lo = hs + KMAX * LDV;
    P = hs;
    P_lo = P + C * LDP;
    vn = P_lo + C * LDP;
    G = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(hs) + kStateBytes);
  }
};

// x -> (T(x), T(x - T(x))) stored at `hi` and `lo`.
template <typename T>
__device__ __forceinline__ void store_split(float x, T* hi, T* lo) {
  const T h = from_f<T>(x);
  *hi = h;
  *lo = from_f<T>(x - to_f<T>(h));
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_output_kernel(ChunkedArgs a) {
  using S = OutputSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDV = S::LDV, LDP = S::LDP, NT = kOutputCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kOutputCols;
  const ChunkInfo ci = a.chunks[c];
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  if (tid < C) sm.G[tid] = (a.G && tid < L) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
  for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) {
    store_split<T>(x, &sm.qs[r * LDK + d], &sm.qs_lo[r * LDK + d]);
  });
  for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) {
    store_split<T>(x, &sm.ks[r * LDK + d], &sm.ks_lo[r * LDK + d]);
  });
  const float* hc = a.h + (c * a.HV + hv) * a.K * a.V;
  for (int e = tid; e < KMAX * kOutputCols; e += kChunkThreads) {
    const int d = e / kOutputCols, col = e % kOutputCols;
    store_split<T>(hc[d * a.V + col0 + col], &sm.hs[d * LDV + col], &sm.hs_lo[d * LDV + col]);
  }
  __syncthreads();

  // o = exp(G_i) (q h_c)_i, then P = q k^T in registers.
  float acc[NT][4] = {};
  float pacc[8][4] = {};
#pragma unroll
  for (int kk = 0; kk < KMAX; kk += 16) {
    uint32_t qh[4], ql[4];
    mma::frag_a(sm.qs, LDK, 16 * wp, kk, qh);
    mma::frag_a(sm.qs_lo, LDK, 16 * wp, kk, ql);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bh[2], bl[2];
      mma::frag_b(sm.hs, LDV, kk, 8 * nt, bh);
      mma::frag_b(sm.hs_lo, LDV, kk, 8 * nt, bl);
      mma::mma16816<T>(acc[nt], qh, bh);
      mma::mma16816<T>(acc[nt], ql, bh);
      mma::mma16816<T>(acc[nt], qh, bl);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt > 2 * wp + 1) continue;  // tiles right of the warp's diagonal block are masked anyway
      uint32_t bh[2], bl[2];
      mma::frag_b_trans(sm.ks, LDK, kk, 8 * nt, bh);
      mma::frag_b_trans(sm.ks_lo, LDK, kk, 8 * nt, bl);
      mma::mma16816<T>(pacc[nt], qh, bh);
      mma::mma16816<T>(pacc[nt], ql, bh);
      mma::mma16816<T>(pacc[nt], qh, bl);
    }
  }
  const float eg_lo = expf(sm.G[16 * wp + mma::grp()]), eg_hi = expf(sm.G[16 * wp + mma::grp() + 8]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] *= eg_lo;
    acc[nt][1] *= eg_lo;
    acc[nt][2] *= eg_hi;
    acc[nt][3] *= eg_hi;
  }
  __syncthreads();  // every warp is done with h_c: P and v_new take its place

  // P = Lower(q k^T exp(G_i - G_j)) as hi + lo; the v_new slice (zeros past L).
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
      // exp(G_i - G_j) with j <= i < L only (rows past L hold G = 0 and are never stored).
      const float p = i >= j && i < L ? pacc[nt][e] * expf(sm.G[i] - sm.G[j]) : 0.f;
      store_split<T>(p, &sm.P[i * LDP + j], &sm.P_lo[i * LDP + j]);
    }
  const T* v_new = static_cast<const T*>(a.v_new);
  for (int e = tid; e < C * kOutputCols; e += kChunkThreads) {
    const int r = e / kOutputCols, col = e % kOutputCols;
    sm.vn[r * LDV + col] = r < L ? v_new[((row0 + r) * a.HV + hv) * a.V + col0 + col] : from_f<T>(0.f);
  }
  __syncthreads();

  // o += P v_new (P is lower triangular: column blocks kb <= wp only); o = scale * o.
  for (int kb = 0; kb <= wp; ++kb) {
    uint32_t ph[4], pl[4];
    mma::frag_a(sm.P, LDP, 16 * wp, 16 * kb, ph);
    mma::frag_a(sm.P_lo, LDP, 16 * wp, 16 * kb, pl);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bf[2];
      mma::frag_b(sm.vn, LDV, 16 * kb, 8 * nt, bf);
      mma::mma16816<T>(acc[nt], ph, bf);
      mma::mma16816<T>(acc[nt], pl, bf);
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
      if (i < L) store_elem<T>(a.o, off4(a.o, ci.b, ci.t0 + i, hv, col0 + col), a.scale * acc[nt][e]);
    }
}

}  // namespace flashgrad::cuda_detail::delta_rule
