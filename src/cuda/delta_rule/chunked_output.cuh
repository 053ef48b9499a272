// Chunked stage 3 ("output"), one block of 128 threads (4 warps) per (chunk, value head, slice
// of 64 value columns):
//   P = Lower(q k^T exp(G_i - G_j))  (j <= i),  o = scale [exp(G) (q h_c) + P v_new].
// Reads q, k (normalized here again), G, h_c and v_new from stages 1 and 2; writes o.
// Warp wp owns output rows [16 wp, 16 wp + 16); the rows of P it writes are the rows it reads
// back as the A operand, so P needs only a warp barrier.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kOutputCols = 64;  // value columns per stage-3 block

template <typename T, int KMAX>
struct OutputSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDV = kOutputCols + 8, LDP = C + 8;
  T* qs;     // [C][LDK]
  T* ks;     // [C][LDK]
  T* hs;     // [KMAX][LDV] h_c slice rounded to T
  T* vn;     // [C][LDV]
  T* P;      // [C][LDP]
  float* G;  // [C]
  static constexpr int64_t bytes() {
    return sizeof(T) * (2 * C * LDK + KMAX * LDV + C * LDV + C * LDP) + sizeof(float) * C;
  }
  __device__ explicit OutputSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    ks = qs + C * LDK;
    hs = ks + C * LDK;
    vn = hs + KMAX * LDV;
    P = vn + C * LDV;
    G = reinterpret_cast<float*>(P + C * LDP);
  }
};

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
  for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) { sm.qs[r * LDK + d] = from_f<T>(x); });
  for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) { sm.ks[r * LDK + d] = from_f<T>(x); });
  const float* hc = a.h + (c * a.HV + hv) * a.K * a.V;
  for (int e = tid; e < KMAX * kOutputCols; e += kChunkThreads) {
    const int d = e / kOutputCols, col = e % kOutputCols;
    sm.hs[d * LDV + col] = from_f<T>(hc[d * a.V + col0 + col]);
  }
  const T* v_new = static_cast<const T*>(a.v_new);
  for (int e = tid; e < C * kOutputCols; e += kChunkThreads) {
    const int r = e / kOutputCols, col = e % kOutputCols;
    sm.vn[r * LDV + col] = r < L ? v_new[((row0 + r) * a.HV + hv) * a.V + col0 + col] : from_f<T>(0.f);
  }
  __syncthreads();

  // P = Lower(q k^T exp(G_i - G_j)); tiles right of the warp's diagonal block are zero.
  {
    float acc[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KMAX; kk += 16) {
      uint32_t af[4];
      mma::frag_a(sm.qs, LDK, 16 * wp, kk, af);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt > 2 * wp + 1) continue;
        uint32_t bf[2];
        mma::frag_b_trans(sm.ks, LDK, kk, 8 * nt, bf);
        mma::mma16816<T>(acc[nt], af, bf);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
        // exp(G_i - G_j) with j <= i < L only (rows past L hold G = 0 and are never stored).
        sm.P[i * LDP + j] = from_f<T>(i >= j && i < L ? acc[nt][e] * expf(sm.G[i] - sm.G[j]) : 0.f);
      }
  }
  __syncwarp();

  // o = scale [exp(G_i) (q h_c)_i + (P v_new)_i].
  float acc[NT][4] = {};
#pragma unroll
  for (int kk = 0; kk < KMAX; kk += 16) {
    uint32_t af[4];
    mma::frag_a(sm.qs, LDK, 16 * wp, kk, af);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bf[2];
      mma::frag_b(sm.hs, LDV, kk, 8 * nt, bf);
      mma::mma16816<T>(acc[nt], af, bf);
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
  for (int kb = 0; kb <= wp; ++kb) {
    uint32_t af[4];
    mma::frag_a(sm.P, LDP, 16 * wp, 16 * kb, af);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bf[2];
      mma::frag_b(sm.vn, LDV, 16 * kb, 8 * nt, bf);
      mma::mma16816<T>(acc[nt], af, bf);
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
