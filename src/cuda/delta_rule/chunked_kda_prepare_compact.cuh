// KDA chunked stage 1 ("prepare"), compact variant (session 7, the default): the same outputs as
// kda_prepare_kernel (chunked_kda_prepare.cuh: G, A with P^T packed into its upper triangle, w, u)
// in ~107 KiB of shared memory at K = 128 instead of 203 KiB, so that two blocks (8 warps) share
// an SM. ncu of the wide kernel (session 6): 4 warps per SM, issue active 15%, most cycles waiting
// on global loads (long scoreboard 36%) and on dependent instructions (wait 27%) that no other
// warp could cover. What shrank:
//   - q and k are kept as their 16-bit input values plus one fp32 rstd (L2 norm) per row, read as
//     x(i, d) = value * rstd[i] (the same fp32 value the wide kernel stored: 66 -> 35 KiB);
//   - the off-diagonal 16 x 8 tiles of M and P form their tensor-core fragments in registers
//     (kda_decayed_offdiag_registers) instead of staging the pre-scaled rows (35 KiB, 12 barriers);
//   - beta exp(G) o k (w's operand, 35 KiB) is formed after the inverse, over M / A / tmp, and the
//     beta v pieces of u over G; A's 16-bit hi / lo copies go over q.
// One block of 128 threads per (chunk, value head), as the wide kernel. FLASHGRAD_CHUNKED_KDA_PREPARE
// =old selects the wide kernel (chunked_kda_launch_impl.cuh) for the same-process comparison.
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"
#include "chunked_prepare.cuh"  // invert_unit_lower64_blocked

namespace flashgrad::cuda_detail::delta_rule {

// Regions (bytes at K = 128, T 16-bit): G 34816 | k 17408 | q 18432 | M 17408 | A 17408 | tmp 3072
// | rstd 512 | beta 256 = 109312 (106.75 KiB; two blocks need <= 113 KiB each).
//   k, q: [C][LDK] input values (rows past L zero); rstd[0][r] k's, rstd[1][r] q's row factor.
//   q's region later holds a_hi, a_lo ([C][LDA] each, after the decayed products);
//   M .. tmp later hold wb, wb_lo ([C][LDK] each: beta exp(G) o k, after A is stored);
//   G later holds ub, ub_lo ([C][LDU] each: beta v, after wb is formed).
// LDG = KMAX + 8: the fragment loads read G as float2 at (row g, columns 2 t..) of a lane (g, t),
// conflict-free with a pitch of 8 mod 32 words.
template <typename T, int KMAX>
struct KdaPrepareCompactSmem {
  static constexpr int C = kChunkSize, LDG = KMAX + 8, LDK = KMAX + 8, LDM = C + 4, LDA = C + 8, LDU = 64 + 8;
  static constexpr int64_t kGBytes = sizeof(float) * C * LDG;
  static constexpr int64_t kKBytes = sizeof(T) * C * LDK;
  static constexpr int64_t kQBytes = kKBytes > 2 * sizeof(T) * C * LDA ? kKBytes : 2 * sizeof(T) * C * LDA;
  static constexpr int64_t kMBytes = sizeof(float) * C * LDM;
  static constexpr int64_t kTmpBytes = sizeof(float) * 16 * 48;
  static_assert(2 * sizeof(T) * C * LDK <= 2 * kMBytes + kTmpBytes, "wb, wb_lo fit over M, A and tmp");
  static_assert(2 * sizeof(T) * C * LDU <= kGBytes, "ub, ub_lo fit over G");
  static_assert(kGBytes % 16 == 0 && kKBytes % 16 == 0 && kQBytes % 16 == 0 && kMBytes % 16 == 0, "16-byte regions");
  float* G;       // [C][LDG]
  T* k;           // [C][LDK]
  T* q;           // [C][LDK]
  float* M;       // [C][LDM] M (strict lower triangle), P^T (upper triangle and diagonal)
  float* A;       // [C][LDM]
  float* tmp;     // [16][48] (the inverse's scratch)
  float* rstd;    // [2][C]
  float* beta;    // [C]
  T *a_hi, *a_lo;  // over q
  T *wb, *wb_lo;   // over M, A, tmp
  T *ub, *ub_lo;   // over G
  static constexpr int64_t bytes() {
    return kGBytes + kKBytes + kQBytes + 2 * kMBytes + kTmpBytes + sizeof(float) * 3 * C;
  }
  __device__ explicit KdaPrepareCompactSmem(unsigned char* raw) {
    G = reinterpret_cast<float*>(raw);
    k = reinterpret_cast<T*>(raw + kGBytes);
    q = reinterpret_cast<T*>(raw + kGBytes + kKBytes);
    M = reinterpret_cast<float*>(raw + kGBytes + kKBytes + kQBytes);
    A = M + C * LDM;
    tmp = A + C * LDM;
    rstd = tmp + 16 * 48;
    beta = rstd + 2 * C;
    a_hi = q;
    a_lo = q + C * LDA;
    wb = reinterpret_cast<T*>(M);
    wb_lo = wb + C * LDK;
    ub = reinterpret_cast<T*>(G);
    ub_lo = ub + C * LDU;
  }
};

// q / k rows of the chunk as input values into X[r * ldx + d] (T; rows past L zero) and the row's
// L2-norm factor 1 / sqrt(sum_d x^2 + eps) into rs[r] (1 without `l2norm`). The thread layout and
// batching of kda_key_rows (chunked_kda_mma.cuh): KMAX / 8 lanes per row, 8 consecutive elements
// each, the loads of up to 4 passes in flight together; the sum of squares is the same fp32 sum,
// so x * rs[r] is the value kda_key_rows emits. The inputs are T (the dispatch's dtype), so the
// stored values are exact. No barrier.
template <typename T, int KMAX>
__device__ __forceinline__ void kda_raw_key_rows(const View& x, const ChunkInfo& ci, int64_t head, bool l2norm, T* X,
                                                 int ldx, float* rs) {
  constexpr int kLanesPerRow = KMAX / 8, kRowsPerPass = kChunkThreads / kLanesPerRow;
  constexpr int kPasses = kChunkSize / kRowsPerPass, kBatch = kPasses < 4 ? kPasses : 4;
  const int t = threadIdx.x, lr = t / kLanesPerRow, seg = t % kLanesPerRow;
#pragma unroll 1
  for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
    float e[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int r = (p0 + b) * kRowsPerPass + lr;
      const bool ok = r < ci.len;
      const int64_t base = ok ? off3(x, ci.b, ci.t0 + r, head) + seg * 8 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) e[b][i] = ok ? load_elem<T>(x, base + i) : 0.f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += e[b][i] * e[b][i];
      const float rstd = l2norm ? 1.0f / sqrtf(group_sum<kLanesPerRow>(ss) + kL2NormEps) : 1.f;
      const int r = (p0 + b) * kRowsPerPass + lr;
#pragma unroll
      for (int i = 0; i < 8; i += 2)
        *reinterpret_cast<uint32_t*>(&X[r * ldx + seg * 8 + i]) = mma::pack_floats<T>(e[b][i], e[b][i + 1]);
      if (seg == 0) rs[r] = rstd;
    }
  }
}

// The off-diagonal 16 x 8 tiles of stage 1's M and P (kda_decayed_mp's contract, chunked_kda_decay.cuh):
// row sub-chunk I (rows [r0, r0 + 16), r0 = 16 I), column tile nt (columns [8 nt, 8 nt + 8),
// all < r0), through the reference row r0 (j < r0 <= i, both factors <= 1):
//   M_ij = sum_d (k_id e^(G_id - G_r0,d)) (k_jd e^(G_r0,d - G_jd)),  P_ij the same with q_i,
// one mma tile each for M and P, the A (x) and B (y) fragments formed in registers from G and the
// rows (split hi + lo: three mmas per step, close to fp32), the exps of x shared by M and P.
// The 12 tiles (2 I per sub-chunk) are spread over the 4 warps, 3 each: tile index
// job = w, w + 4, w + 8 in the order (1, 0), (1, 1), (2, 0) .. (2, 3), (3, 0) .. (3, 5).
// kpair / qpair(i, d) return (x(i, d), x(i, d + 1)) for even d (0 past L); G [64][ldg] fp32 in
// shared memory with an even ldg (float2 loads; rows past L hold G_{L-1}). Writes only these
// tiles of `out` (M at out[i][j], P^T at out[j][i]); no barrier.
template <typename T, int KMAX, typename QP, typename KP>
__device__ __forceinline__ void kda_decayed_offdiag_registers(QP&& qpair, KP&& kpair, const float* G, int ldg,
                                                              float* out, int ldo) {
  const int wp = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  auto g2 = [&](int r, int d) { return *reinterpret_cast<const float2*>(&G[r * ldg + d]); };
#pragma unroll 1
  for (int job = wp; job < 12; job += 4) {
    const int I = job < 2 ? 1 : (job < 6 ? 2 : 3), nt = job - (I == 1 ? 0 : (I == 2 ? 2 : 6));
    const int r0 = 16 * I, ra = r0 + g, rb = ra + 8, j = 8 * nt + g;  // this lane's A rows, B column
    float accm[4] = {}, accp[4] = {};
#pragma unroll 2
    for (int kk = 0; kk < KMAX; kk += 16) {
      uint32_t kh[4], kl[4], qh[4], ql[4], bh[2], bl[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns d, d + 1 of A registers 2h (row ra), 2h + 1 (row rb); B register h
        const int d = kk + t2 + 8 * h;
        const float2 gr = g2(r0, d), ga = g2(ra, d), gb = g2(rb, d), gj = g2(j, d);
        const float ea0 = decay_exp(ga.x - gr.x), ea1 = decay_exp(ga.y - gr.y);
        const float eb0 = decay_exp(gb.x - gr.x), eb1 = decay_exp(gb.y - gr.y);
        const float2 ka = kpair(ra, d), kb = kpair(rb, d), qa = qpair(ra, d), qb = qpair(rb, d), kj = kpair(j, d);
        mma::split_pair<T>(ka.x * ea0, ka.y * ea1, kh[2 * h], kl[2 * h]);
        mma::split_pair<T>(kb.x * eb0, kb.y * eb1, kh[2 * h + 1], kl[2 * h + 1]);
        mma::split_pair<T>(qa.x * ea0, qa.y * ea1, qh[2 * h], ql[2 * h]);
        mma::split_pair<T>(qb.x * eb0, qb.y * eb1, qh[2 * h + 1], ql[2 * h + 1]);
        mma::split_pair<T>(kj.x * decay_exp(gr.x - gj.x), kj.y * decay_exp(gr.y - gj.y), bh[h], bl[h]);
      }
      mma::mma16816<T>(accm, kh, bh);
      mma::mma16816<T>(accp, qh, bh);
      mma::mma16816<T>(accm, kl, bh);
      mma::mma16816<T>(accp, ql, bh);
      mma::mma16816<T>(accm, kh, bl);
      mma::mma16816<T>(accp, qh, bl);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + mma::acc_row(e), jj = 8 * nt + mma::acc_col(e);
      out[i * ldo + jj] = accm[e];
      out[jj * ldo + i] = accp[e];
    }
  }
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads, 2) kda_prepare_compact_kernel(ChunkedArgs a) {
  using S = KdaPrepareCompactSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDG = S::LDG, LDK = S::LDK, LDA = S::LDA, LDM = S::LDM, LDU = S::LDU;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const ChunkInfo ci = a.chunks[blockIdx.x];
  const int64_t hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  if (tid < C) sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
  kda_raw_key_rows<T, KMAX>(a.k, ci, head, a.l2norm, sm.k, LDK, sm.rstd);
  kda_raw_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, sm.q, LDK, sm.rstd + C);
  kda_load_cumulative_gate<T, KMAX>(a.g, ci, hv, sm.G, LDG, a.G, row0, a.HV);  // barriers inside

  // x(i, d) = input value * row factor: the fp32 values the wide kernel kept (k / q normalized).
  const float* krs = sm.rstd;
  const float* qrs = sm.rstd + C;
  auto kx = [&](int r, int d) { return to_f<T>(sm.k[r * LDK + d]) * krs[r]; };
  auto qx = [&](int r, int d) { return to_f<T>(sm.q[r * LDK + d]) * qrs[r]; };
  auto pair_of = [](const T* X, float s) {
    float x0, x1;
    mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(X), x0, x1);
    return make_float2(x0 * s, x1 * s);
  };
  auto kp = [&](int r, int d) { return pair_of(&sm.k[r * LDK + d], krs[r]); };
  auto qp = [&](int r, int d) { return pair_of(&sm.q[r * LDK + d], qrs[r]); };

  // M (strict lower triangle of sm.M) and P^T (its upper triangle and diagonal): the diagonal
  // blocks as the wide kernel, the rest from register fragments (disjoint tiles: no barrier
  // between them). Then M = diag(beta) M with rows past L zero.
  kda_decayed_diagonal_halves<T, KMAX>(qx, kx, sm.G, LDG, sm.M, LDM);
  kda_decayed_offdiag_registers<T, KMAX>(qp, kp, sm.G, LDG, sm.M, LDM);
  __syncthreads();
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    if (j < i) sm.M[i * LDM + j] *= i < L ? sm.beta[i] : 0.f;
  }
  __syncthreads();
  invert_unit_lower64_blocked<LDM>(sm.M, sm.A, sm.tmp);  // ends with a barrier

  // Intermediates' chunk rows: row i at + i * HV * (C, K, V) (addresses formed once).
  float* A0 = a.A + (row0 * a.HV + hv) * C;
  T* w0 = static_cast<T*>(a.w) + (row0 * a.HV + hv) * a.K;
  float* u0 = a.u + (row0 * a.HV + hv) * a.V;
  const int64_t v0 = off4(a.v, ci.b, ci.t0, hv, 0);  // v row r: + r * s1
  // Row i < L of the intermediate: A_ij for j < i, P_ji = sm.M[i][j] for j >= i (chunked_kda.h);
  // A as hi + lo over q (q's last readers were the decayed products, before the inverse's barriers).
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    const float x = sm.A[i * LDM + j];
    if (i < L) A0[i * a.HV * C + j] = j < i ? x : sm.M[i * LDM + j];
    store_split<T>(x, &sm.a_hi[i * LDA + j], &sm.a_lo[i * LDA + j]);
  }
  __syncthreads();  // M, A and tmp are free
  // beta exp(G) o k as hi + lo (exp(G) <= 1) over M, A and tmp.
  for (int e = tid; e < C * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;
    store_split<T>(sm.beta[r] * decay_exp(sm.G[r * LDG + d]) * kx(r, d), &sm.wb[r * LDK + d], &sm.wb_lo[r * LDK + d]);
  }
  __syncthreads();  // G is free

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

  // u = A (beta v), 64 value columns at a time, the pieces over G.
  for (int c0 = 0; c0 < a.V; c0 += 64) {
    if (c0 > 0) __syncthreads();  // the previous piece's readers are done
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
