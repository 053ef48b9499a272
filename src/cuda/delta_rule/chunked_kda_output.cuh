// KDA chunked stage 3 ("output"), one block of 128 threads per (chunk, value head, slice of 64
// value columns):
//   P = Lower_incl(sum_d q_id k_jd exp(G_id - G_jd)),  o = scale [(q o exp(G)) h_c + P v_new].
// P is the fp32 sub-chunk product of chunked_kda_decay.cuh; the two products with h_c and v_new
// run on tensor cores (q o exp(G), h_c and P split hi + lo; v_new is stored in T). Warp wp owns
// output rows [16 wp, 16 wp + 16).
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Region `work`: the decayed product's scratch, then h_c (hi, lo), P (hi, lo) and the v_new
// slice. K = 128: 180 KiB (one block per SM).
template <typename T, int KMAX>
struct KdaOutputSmem {
  static constexpr int C = kChunkSize, LDG = KMAX + 1, LDK = KMAX + 8, LDV = kOutputCols + 8, LDP = C + 8,
                       LDM = C + 1;
  static constexpr int64_t kSecond = static_cast<int64_t>(sizeof(T)) * (2 * KMAX * LDV + 2 * C * LDP + C * LDV);
  static constexpr int64_t kWorkBytes =
      kda_decay_stage_bytes<KMAX>() > kSecond ? kda_decay_stage_bytes<KMAX>() : ((kSecond + 15) / 16) * 16;
  T *qs, *qs_lo;  // [C][LDK] q, then (in place) q o exp(G)
  T *ks, *ks_lo;  // [C][LDK] k
  float* G;       // [C][LDG]
  float* Pf;      // [C][LDM] P in fp32
  float* stage;   // region `work`
  T *hs, *hs_lo;  // [KMAX][LDV] region `work`
  T *P, *P_lo;    // [C][LDP]    region `work`
  T* vn;          // [C][LDV]    region `work`
  static constexpr int64_t bytes() {
    return kWorkBytes + sizeof(float) * (C * LDG + C * LDM) + sizeof(T) * 4 * C * LDK;
  }
  __device__ explicit KdaOutputSmem(unsigned char* raw) {
    stage = reinterpret_cast<float*>(raw);
    hs = reinterpret_cast<T*>(raw);
    hs_lo = hs + KMAX * LDV;
    P = hs_lo + KMAX * LDV;
    P_lo = P + C * LDP;
    vn = P_lo + C * LDP;
    G = reinterpret_cast<float*>(raw + kWorkBytes);
    Pf = G + C * LDG;
    qs = reinterpret_cast<T*>(Pf + C * LDM);
    qs_lo = qs + C * LDK;
    ks = qs_lo + C * LDK;
    ks_lo = ks + C * LDK;
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) kda_output_kernel(ChunkedArgs a) {
  using S = KdaOutputSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDG = S::LDG, LDK = S::LDK, LDV = S::LDV, LDP = S::LDP, LDM = S::LDM,
                NT = kOutputCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kOutputCols;
  const ChunkInfo ci = a.chunks[c];
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  kda_read_gate<KMAX>(a.G, ci, row0, hv, a.HV, sm.G, LDG);
  for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) {
    store_split<T>(x, &sm.qs[r * LDK + d], &sm.qs_lo[r * LDK + d]);
  });
  for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) {
    store_split<T>(x, &sm.ks[r * LDK + d], &sm.ks_lo[r * LDK + d]);
  });
  __syncthreads();

  // P (fp32) from q, k as hi + lo (their sum carries 16 (bf16) or 22 (fp16) bits).
  auto qx = [&](int r, int d) { return to_f<T>(sm.qs[r * LDK + d]) + to_f<T>(sm.qs_lo[r * LDK + d]); };
  auto kx = [&](int r, int d) { return to_f<T>(sm.ks[r * LDK + d]) + to_f<T>(sm.ks_lo[r * LDK + d]); };
  kda_decayed_lower<KMAX>(qx, kx, sm.G, LDG, true, sm.Pf, LDM, sm.stage);

  // In place q -> q o exp(G) (each element by the thread that reads it); h_c, P, v_new into `work`.
  for (int e = tid; e < C * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX, at = r * LDK + d;
    store_split<T>(qx(r, d) * expf(sm.G[r * LDG + d]), &sm.qs[at], &sm.qs_lo[at]);
  }
  const float* hc = a.h + (c * a.HV + hv) * a.K * a.V;
  for (int e = tid; e < KMAX * kOutputCols; e += kChunkThreads) {
    const int d = e / kOutputCols, col = e % kOutputCols;
    store_split<T>(hc[d * a.V + col0 + col], &sm.hs[d * LDV + col], &sm.hs_lo[d * LDV + col]);
  }
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    store_split<T>(i < L ? sm.Pf[i * LDM + j] : 0.f, &sm.P[i * LDP + j], &sm.P_lo[i * LDP + j]);
  }
  const T* v_new = static_cast<const T*>(a.v_new);
  for (int e = tid; e < C * kOutputCols; e += kChunkThreads) {
    const int r = e / kOutputCols, col = e % kOutputCols;
    sm.vn[r * LDV + col] = r < L ? v_new[((row0 + r) * a.HV + hv) * a.V + col0 + col] : from_f<T>(0.f);
  }
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
