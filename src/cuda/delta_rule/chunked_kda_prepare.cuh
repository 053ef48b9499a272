// KDA chunked stage 1 ("prepare"), one block of 128 threads (4 warps) per (chunk, value head):
//   G = per-channel cumsum(g),  M_ij = beta_i sum_d k_id k_jd exp(G_id - G_jd) (i > j),
//   A = (I + M)^{-1},  w = A (beta exp(G) o k),  u = A (beta v),
//   P_ij = sum_d q_id k_jd exp(G_id - G_jd) (j <= i; the output's decayed q k^T).
// Writes G [rows, HV, K], A with P^T packed into its upper triangle, w, u (layouts: chunked_kda.h).
// P is formed once here so that stage 3 and B1 (which runs over a sequence's chunks one after
// another) read it instead of recomputing it.
//
// M and P come from one sub-chunk pass (chunked_kda_decay.cuh, kda_decayed_mp); the inverse is
// the blocked CUDA-core one (chunked_unit_lower_inverse.cuh). w and u are tensor-core products with
// hi + lo operand splits (three mmas per product, chunked_kda_mma.cuh), warp wp owning rows
// [16 wp, 16 wp + 16).
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"
#include "chunked_unit_lower_inverse.cuh"  // invert_unit_lower64(_blocked)

namespace flashgrad::cuda_detail::delta_rule {

// Region `work` holds the decayed products' scratch, then A (hi, lo) and the beta v piece.
// K = 128: 203 KiB (one block per SM).
template <typename T, int KMAX>
struct KdaPrepareSmem {
  static constexpr int C = kChunkSize, LDG = KMAX + 1, LDK = KMAX + 8, LDA = C + 8, LDM = C + 4, LDU = 64 + 8;  // LDM % 4 == 0: float4 rows (blocked inverse)
  static constexpr int64_t kWorkBytes =
      kda_decay_stage_bytes<T, KMAX>() > 4 * C * LDA * static_cast<int64_t>(sizeof(T))
          ? kda_decay_stage_bytes<T, KMAX>()
          : 4 * C * LDA * static_cast<int64_t>(sizeof(T));  // a_hi, a_lo, ub, ub_lo (LDU == LDA)
  float* G;     // [C][LDG] cumulative gate
  float* kf;    // [C][LDG] k (normalized), fp32
  float* qf;    // [C][LDG] q (normalized), fp32
  float* M;     // [C][LDM] M (strict lower triangle) and P^T (upper triangle, diagonal)
  float* A;     // [C][LDM]
  float* tmp;   // [16][48] (the inverse's scratch)
  float* beta;  // [C]
  T *wb, *wb_lo;  // [C][LDK] beta exp(G) o k
  T* stage;       // region `work`: the decayed products' staging (chunked_kda_decay.cuh)
  T *a_hi, *a_lo, *ub, *ub_lo;  // region `work`: [C][LDA] each
  static constexpr int64_t bytes() {
    return sizeof(float) * (3 * C * LDG + 2 * C * LDM + 16 * 48 + C) + sizeof(T) * 2 * C * LDK + kWorkBytes;
  }
  __device__ explicit KdaPrepareSmem(unsigned char* raw) {
    stage = reinterpret_cast<T*>(raw);  // kWorkBytes: a multiple of 16
    a_hi = reinterpret_cast<T*>(raw);
    a_lo = a_hi + C * LDA;
    ub = a_lo + C * LDA;
    ub_lo = ub + C * LDA;
    G = reinterpret_cast<float*>(raw + kWorkBytes);
    kf = G + C * LDG;
    qf = kf + C * LDG;
    M = qf + C * LDG;
    A = M + C * LDM;
    tmp = A + C * LDM;
    beta = tmp + 16 * 48;
    wb = reinterpret_cast<T*>(beta + C);
    wb_lo = wb + C * LDK;
  }
};

// kHalves: the diagonal blocks' cross-half quadrants of M and P on tensor cores (kda_decayed_mp)
// and the GDN stage's blocked inverse; false for the legacy comparison (FLASHGRAD_CHUNKED_KDA=legacy).
template <typename T, int KMAX, bool kHalves = true>
__global__ void __launch_bounds__(kChunkThreads, 1) kda_prepare_kernel(ChunkedArgs a) {
  using S = KdaPrepareSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDG = S::LDG, LDK = S::LDK, LDA = S::LDA, LDM = S::LDM, LDU = S::LDU;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const ChunkInfo ci = chunk_info(a, blockIdx.x);
  const int64_t hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  if (tid < C) sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
  kda_load_cumulative_gate<T, KMAX>(a.g, ci, hv, sm.G, LDG, a.G, row0, a.HV);

  // k (normalized, fp32) and beta exp(G) o k as hi + lo (exp(G) <= 1).
  auto none = [](int, int) { return 0.f; };
  kda_key_rows<T, KMAX>(a.k, ci, head, a.l2norm, none, [&](int r, int d, float x, float) {
    sm.kf[r * LDG + d] = x;
    store_split<T>(sm.beta[r] * decay_exp(sm.G[r * LDG + d]) * x, &sm.wb[r * LDK + d], &sm.wb_lo[r * LDK + d]);
  });
  kda_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, none,
                        [&](int r, int d, float x, float) { sm.qf[r * LDG + d] = x; });
  __syncthreads();

  // M (strict lower triangle of sm.M) and P^T (its upper triangle and diagonal), then
  // M = diag(beta) M with rows past L zero; the inverse reads only the strict lower triangle.
  auto kx = [&](int r, int d) { return sm.kf[r * LDG + d]; };
  auto qx = [&](int r, int d) { return sm.qf[r * LDG + d]; };
  kda_decayed_mp<T, KMAX, kHalves>(qx, kx, sm.G, LDG, sm.M, LDM, sm.stage);
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    if (j < i) sm.M[i * LDM + j] *= i < L ? sm.beta[i] : 0.f;
  }
  __syncthreads();
  if constexpr (kHalves)
    invert_unit_lower64_blocked<LDM>(sm.M, sm.A, sm.tmp);  // float4 strips, fixed trip counts
  else
    invert_unit_lower64<LDM>(sm.M, sm.A, sm.tmp);

  // Intermediates' chunk rows: row i at + i * HV * (C, K, V) (addresses formed once).
  float* A0 = a.A + (row0 * a.HV + hv) * C;
  T* w0 = static_cast<T*>(a.w) + (row0 * a.HV + hv) * a.K;
  float* u0 = a.u + (row0 * a.HV + hv) * a.V;
  const int64_t v0 = off4(a.v, ci.b, ci.t0, hv, 0);  // v row r: + r * s1
  // Row i < L of the intermediate: A_ij for j < i, P_ji = sm.M[i][j] for j >= i (chunked_kda.h);
  // A as hi + lo in `work` (the products' scratch is free; the inverse ended with a barrier).
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    const float x = sm.A[i * LDM + j];
    if (i < L) A0[i * a.HV * C + j] = j < i ? x : sm.M[i * LDM + j];
    store_split<T>(x, &sm.a_hi[i * LDA + j], &sm.a_lo[i * LDA + j]);
  }
  __syncthreads();

  // w = A wb (A lower triangular: column blocks kb <= wp only).
  {
    constexpr int NT = KMAX / 8;
    float acc[NT][4] = {};
    kda_mma::lower_times_split<T, NT>(sm.a_hi, sm.a_lo, LDA, sm.wb, sm.wb_lo, LDK, 0, acc);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), d = 8 * nt + mma::acc_col(e);
        if (i < L) w0[i * a.HV * a.K + d] = from_f<T>(acc[nt][e]);
      }
  }

  // u = A (beta v), 64 value columns at a time.
  for (int c0 = 0; c0 < a.V; c0 += 64) {
    __syncthreads();  // the previous piece's readers are done
    batched_copy<C * 64, kChunkThreads, 32>(  // one batch
        [&](int e) { return e / 64 < L ? load_elem<T>(a.v, v0 + (e / 64) * a.v.s1 + c0 + e % 64) : 0.f; },
        [&](int e, float x) {
          const int r = e / 64, col = e % 64;
          store_split<T>(sm.beta[r] * x, &sm.ub[r * LDU + col], &sm.ub_lo[r * LDU + col]);
        });
    __syncthreads();
    float acc[8][4] = {};
    kda_mma::lower_times_split<T, 8>(sm.a_hi, sm.a_lo, LDA, sm.ub, sm.ub_lo, LDU, 0, acc);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), col = c0 + 8 * nt + mma::acc_col(e);
        if (i < L) u0[i * a.HV * a.V + col] = acc[nt][e];
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
