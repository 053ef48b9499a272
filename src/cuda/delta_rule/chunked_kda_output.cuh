// KDA chunked stage 3 ("output"), one block of 128 threads per (chunk, value head, slice of 64
// value columns):
//   o = scale [(q o exp(G)) h_c + P v_new],  P = Lower_incl(sum_d q_id k_jd exp(G_id - G_jd)).
// P comes from stage 1 (packed in A's upper triangle, chunked_kda.h); both products run on tensor
// cores with q o exp(G), h_c and P split hi + lo (v_new is stored in T). Warp wp owns output rows
// [16 wp, 16 wp + 16).
#pragma once

#include "chunked_kda_decay.cuh"  // decay_exp
#include "chunked_kda_mma.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// P_ij (j <= i) of chunk rows i, j < L from the A intermediate of stage 1: row j, column i.
__device__ __forceinline__ float kda_packed_P(const float* A, int64_t row0, int64_t hv, int64_t HV, int i, int j) {
  return A[((row0 + j) * HV + hv) * kChunkSize + i];
}

// K = V = 128: 89 KiB (two blocks per SM).
template <typename T, int KMAX>
struct KdaOutputSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDV = kOutputCols + 8, LDP = C + 8;
  T *qs, *qs_lo;  // [C][LDK] q o exp(G)
  T *hs, *hs_lo;  // [KMAX][LDV] h_c slice
  T *P, *P_lo;    // [C][LDP]
  T* vn;          // [C][LDV] v_new slice
  static constexpr int64_t bytes() {
    return sizeof(T) * (2 * C * LDK + 2 * KMAX * LDV + 2 * C * LDP + C * LDV);
  }
  __device__ explicit KdaOutputSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    qs_lo = qs + C * LDK;
    hs = qs_lo + C * LDK;
    hs_lo = hs + KMAX * LDV;
    P = hs_lo + KMAX * LDV;
    P_lo = P + C * LDP;
    vn = P_lo + C * LDP;
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) kda_output_kernel(ChunkedArgs a) {
  using S = KdaOutputSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDV = S::LDV, LDP = S::LDP, NT = kOutputCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kOutputCols;
  const ChunkInfo ci = a.chunks[c];
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  // q o exp(G) (exp(G_rd) <= 1; rows past L are zero).
  const float* Gc = a.G + (row0 * a.HV + hv) * a.K;  // row r: + r * HV K
  const int64_t g_stride = a.HV * a.K;
  auto G_at = [&](int r, int d) { return r < L ? Gc[r * g_stride + d] : 0.f; };
  kda_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, G_at, [&](int r, int d, float x, float g) {
    store_split<T>(r < L ? x * decay_exp(g) : 0.f, &sm.qs[r * LDK + d], &sm.qs_lo[r * LDK + d]);
  });
  const float* hc = a.h + (c * a.HV + hv) * a.K * a.V;
  constexpr int OC = kOutputCols;
  // K = 128: 32 loads in flight per thread (registers to spare: 2 blocks per SM by shared memory),
  // so h's slice, P and v_new cost 2 + 1 + 1 latencies instead of 4 + 2 + 2 (at K = 64 ptxas then
  // spills: 16 there).
  constexpr int MAXB = KMAX == 128 ? 32 : 16;
  batched_copy<KMAX * OC, kChunkThreads, MAXB>([&](int e) { return hc[(e / OC) * a.V + col0 + e % OC]; },
                          [&](int e, float x) {
                            store_split<T>(x, &sm.hs[(e / OC) * LDV + e % OC], &sm.hs_lo[(e / OC) * LDV + e % OC]);
                          });
  batched_copy<C * C, kChunkThreads, MAXB>(  // consecutive threads: one stored row j
      [&](int e) {
        const int j = e / C, i = e % C;
        return i < L && j <= i ? kda_packed_P(a.A, row0, hv, a.HV, i, j) : 0.f;
      },
      [&](int e, float p) {
        const int j = e / C, i = e % C;
        store_split<T>(p, &sm.P[i * LDP + j], &sm.P_lo[i * LDP + j]);
      });
  const T* v_new = static_cast<const T*>(a.v_new);
  batched_copy<C * OC, kChunkThreads, MAXB>(
      [&](int e) { return e / OC < L ? to_f<T>(v_new[((row0 + e / OC) * a.HV + hv) * a.V + col0 + e % OC]) : 0.f; },
      [&](int e, float x) { sm.vn[(e / OC) * LDV + e % OC] = from_f<T>(x); });  // exact: x came from T
  __syncthreads();

  float acc[NT][4] = {};
  kda_mma::rows_times_split<T, NT>(sm.qs, sm.qs_lo, LDK, sm.hs, sm.hs_lo, LDV, 0, KMAX, acc);
  kda_mma::lower_times_split<T, NT>(sm.P, sm.P_lo, LDP, sm.vn, static_cast<const T*>(nullptr), LDV, 0, acc);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
      if (i < L) store_elem<T>(a.o, off4(a.o, ci.b, ci.t0 + i, hv, col0 + col), a.scale * acc[nt][e]);
    }
}

}  // namespace flashgrad::cuda_detail::delta_rule
