// Chunked stage 1 ("prepare"), one block of 128 threads (4 warps) per (chunk, value head):
//   G = cumsum(g) inside the chunk,  M_ij = beta_i exp(G_i - G_j) k_i.k_j (i > j),
//   A = (I + M)^{-1},  w = A (beta exp(G) k),  u = A (beta v).
// Writes G, A (fp32), w (T) and u (fp32) to the intermediates (layouts: chunked_stages.h).
//
// Products on tensor cores (chunked_mma.cuh): warp `wp` owns rows [16 wp, 16 wp + 16) of every
// 64-row result. Every operand x is split into x_hi = T(x) and x_lo = T(x - x_hi), and a product
// is formed as hi hi + hi lo + lo hi (three mmas), so k k^T, w and u keep close to fp32 accuracy
// instead of T's 8 (bf16) or 11 (fp16) bits; the only roundings left are w's storage in T.
// (Measured on a CPU emulation of these kernels against the float64 reference, bf16: A 5e-6,
// u 1e-6 relative RMS, w 1.7e-3 = its storage rounding.)
// The inverse is blocked: the four 16 x 16 diagonal blocks by forward substitution (one thread
// per column), then block rows I = 1..3: A_IJ = -A_II sum_{J <= m < I} M_Im A_mJ, m over 16-blocks.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Shared memory of stage 1. Region `keys` holds k (hi, lo) for k k^T, then M during the
// inverse, then A (hi, lo) for the products w = A wb and u = A ub; each use begins after a
// block barrier that ends the previous one. u is formed 64 value columns at a time, so the
// layout does not depend on V: K = V = 128 takes 106 KiB (two blocks per SM).
template <typename T, int KMAX>
struct PrepareSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDA = C + 8, LDM = C + 1, LDU = 64 + 8;
  static constexpr int64_t kKeysBytes = (2 * C * LDK * sizeof(T) > C * LDM * sizeof(float))
                                            ? 2 * C * LDK * sizeof(T)
                                            : C * LDM * sizeof(float);
  static_assert(kKeysBytes >= 2 * C * LDA * sizeof(T), "A (hi, lo) fits where k was");
  T* ks;       // [C][LDK] k (normalized), rounded to T (hi part)     } region `keys`
  T* ks_lo;    // [C][LDK] k - hi, rounded to T                       }
  float* M;    // [C][LDM] (aliases ks, ks_lo)                        }
  T* a_hi;     // [C][LDA] (aliases M)                                }
  T* a_lo;     // [C][LDA]                                            }
  float* A;    // [C][LDM] the inverse in fp32
  float* tmp;  // [16][48]: sum_m M_Im A_mJ of one block row
  T* wb;       // [C][LDK] beta exp(G) k (hi part)
  T* wb_lo;    // [C][LDK] its lo part
  T* ub;       // [C][LDU] beta v, one 64-column piece (hi part)
  T* ub_lo;    // [C][LDU] its lo part
  float* G;    // [C]
  float* beta;  // [C]

  static constexpr int64_t bytes() {
    return kKeysBytes + sizeof(float) * (C * LDM + 16 * 48) + sizeof(T) * (2 * C * LDK + 2 * C * LDU) +
           sizeof(float) * 2 * C;
  }
  __device__ explicit PrepareSmem(unsigned char* raw) {
    ks = reinterpret_cast<T*>(raw);
    ks_lo = ks + C * LDK;
    M = reinterpret_cast<float*>(raw);
    a_hi = reinterpret_cast<T*>(raw);
    a_lo = a_hi + C * LDA;
    A = reinterpret_cast<float*>(raw + kKeysBytes);  // kKeysBytes is a multiple of 16
    tmp = A + C * LDM;
    wb = reinterpret_cast<T*>(tmp + 16 * 48);
    wb_lo = wb + C * LDK;
    ub = wb_lo + C * LDK;
    ub_lo = ub + C * LDU;
    G = reinterpret_cast<float*>(ub_lo + C * LDU);
    beta = G + C;
  }
};

// Inclusive prefix sum of G[0..63] in place (threads 0..63; the whole block calls it).
__device__ __forceinline__ void chunk_cumsum64(float* G) {
  const int tid = threadIdx.x, lane = tid & 31;
  float x = tid < kChunkSize ? G[tid] : 0.f;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (tid < kChunkSize) G[tid] = x;
  __syncthreads();
  if (tid >= 32 && tid < kChunkSize) G[tid] += G[31];  // warp 1 adds warp 0's total
  __syncthreads();
}

// As = (I + M)^{-1} for the 64 x 64 strictly lower M (both fp32 in shared memory, ld LDM).
template <int LDM>
__device__ __forceinline__ void invert_unit_lower64(const float* M, float* As, float* tmp) {
  const int tid = threadIdx.x;
  for (int e = tid; e < 64 * 64; e += kChunkThreads) As[(e / 64) * LDM + e % 64] = 0.f;
  __syncthreads();
  // Diagonal blocks: thread (block bI, column jj) runs forward substitution down its column:
  // A_jj = 1, A_ij = -sum_{m=j}^{i-1} M_im A_mj for i in the block.
  if (tid < 64) {
    const int j = tid, end = (j / 16) * 16 + 16;
    As[j * LDM + j] = 1.f;
    for (int i = j + 1; i < end; ++i) {
      float s = 0.f;
      for (int m = j; m < i; ++m) s += M[i * LDM + m] * As[m * LDM + j];
      As[i * LDM + j] = -s;
    }
  }
  __syncthreads();
  // Block rows I = 1..3, rows [16 I, 16 I + 16), columns c < 16 I:
  //   tmp[r][c] = sum_{m = c}^{16 I - 1} M[16 I + r][m] A[m][c]   (A[m][c] = 0 for m < c)
  //   A[16 I + r][c] = -sum_{m' = 0}^{r} A[16 I + r][16 I + m'] tmp[m'][c]
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, width = 16 * I;
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = c; m < r0; ++m) s += M[(r0 + r) * LDM + m] * As[m * LDM + c];
      tmp[r * 48 + c] = s;
    }
    __syncthreads();
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = 0; m <= r; ++m) s += As[(r0 + r) * LDM + r0 + m] * tmp[m * 48 + c];
      As[(r0 + r) * LDM + c] = -s;
    }
    __syncthreads();
  }
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_prepare_kernel(ChunkedArgs a) {
  using S = PrepareSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDA = S::LDA, LDM = S::LDM, LDU = S::LDU;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const ChunkInfo ci = a.chunks[blockIdx.x];
  const int64_t hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  // g and beta (zeros past L), then G = cumsum(g).
  if (tid < C) {
    float gi = 0.f, bi = 0.f;
    if (tid < L) {
      const int64_t tok = ci.t0 + tid;
      bi = load_elem<T>(a.beta, off3(a.beta, ci.b, tok, hv));
      if (a.g.p) gi = load_elem<T>(a.g, off3(a.g, ci.b, tok, hv));
    }
    sm.G[tid] = gi;
    sm.beta[tid] = bi;
  }
  __syncthreads();
  chunk_cumsum64(sm.G);
  if (a.G && tid < L) a.G[(row0 + tid) * a.HV + hv] = sm.G[tid];

  // k (normalized) and beta exp(G) k, each as hi + lo.
  for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) {
    const T hi = from_f<T>(x);
    sm.ks[r * LDK + d] = hi;
    sm.ks_lo[r * LDK + d] = from_f<T>(x - to_f<T>(hi));
    const float y = sm.beta[r] * expf(sm.G[r]) * x;
    const T yh = from_f<T>(y);
    sm.wb[r * LDK + d] = yh;
    sm.wb_lo[r * LDK + d] = from_f<T>(y - to_f<T>(yh));
  });
  __syncthreads();

  // M = StrictLower(beta_i exp(G_i - G_j) (k k^T)_ij). Column tiles right of the warp's
  // diagonal block are all zero and skipped.
  {
    float acc[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KMAX; kk += 16) {
      uint32_t ah[4], al[4];
      mma::frag_a(sm.ks, LDK, 16 * wp, kk, ah);
      mma::frag_a(sm.ks_lo, LDK, 16 * wp, kk, al);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt > 2 * wp + 1) continue;
        uint32_t bh[2], bl[2];
        mma::frag_b_trans(sm.ks, LDK, kk, 8 * nt, bh);
        mma::frag_b_trans(sm.ks_lo, LDK, kk, 8 * nt, bl);
        mma::mma16816<T>(acc[nt], ah, bh);  // k k^T ~ hi hi^T + hi lo^T + lo hi^T
        mma::mma16816<T>(acc[nt], ah, bl);
        mma::mma16816<T>(acc[nt], al, bh);
      }
    }
    __syncthreads();  // every warp is done with ks, ks_lo: M takes their place
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
        // exp(G_i - G_j) with i > j only: bounded by 1 for g <= 0.
        sm.M[i * LDM + j] = i > j && i < L ? sm.beta[i] * expf(sm.G[i] - sm.G[j]) * acc[nt][e] : 0.f;
      }
  }
  __syncthreads();
  invert_unit_lower64<LDM>(sm.M, sm.A, sm.tmp);

  // A to the intermediates (rows < L; columns >= L are 0 there) and as hi + lo in T (where M
  // was: the inverse ended with a barrier).
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    const float x = sm.A[i * LDM + j];
    if (a.A && i < L) a.A[((row0 + i) * a.HV + hv) * C + j] = x;
    const T hi = from_f<T>(x);
    sm.a_hi[i * LDA + j] = hi;
    sm.a_lo[i * LDA + j] = from_f<T>(x - to_f<T>(hi));
  }
  __syncthreads();

  // w = A wb (A is lower triangular: column blocks kb <= wp only).
  {
    constexpr int NT = KMAX / 8;
    float acc[NT][4] = {};
    for (int kb = 0; kb <= wp; ++kb) {
      uint32_t ah[4], al[4];
      mma::frag_a(sm.a_hi, LDA, 16 * wp, 16 * kb, ah);
      mma::frag_a(sm.a_lo, LDA, 16 * wp, 16 * kb, al);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t bh[2], bl[2];
        mma::frag_b(sm.wb, LDK, 16 * kb, 8 * nt, bh);
        mma::frag_b(sm.wb_lo, LDK, 16 * kb, 8 * nt, bl);
        mma::mma16816<T>(acc[nt], ah, bh);
        mma::mma16816<T>(acc[nt], al, bh);
        mma::mma16816<T>(acc[nt], ah, bl);
      }
    }
    T* w = static_cast<T*>(a.w);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), d = 8 * nt + mma::acc_col(e);
        if (i < L) w[((row0 + i) * a.HV + hv) * a.K + d] = from_f<T>(acc[nt][e]);
      }
  }

  // u = A ub, 64 value columns at a time: each piece of beta v is loaded as hi + lo between
  // two barriers (the previous piece's readers are done; this piece is complete).
  for (int c0 = 0; c0 < a.V; c0 += 64) {
    __syncthreads();
    for_each_value_row<T>(a.v, ci, hv, c0, 64, [&](int r, int col, float x) {
      const float y = sm.beta[r] * x;
      const T yh = from_f<T>(y);
      sm.ub[r * LDU + col] = yh;
      sm.ub_lo[r * LDU + col] = from_f<T>(y - to_f<T>(yh));
    });
    __syncthreads();
    float acc[8][4] = {};
    for (int kb = 0; kb <= wp; ++kb) {
      uint32_t ah[4], al[4];
      mma::frag_a(sm.a_hi, LDA, 16 * wp, 16 * kb, ah);
      mma::frag_a(sm.a_lo, LDA, 16 * wp, 16 * kb, al);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t bh[2], bl[2];
        mma::frag_b(sm.ub, LDU, 16 * kb, 8 * nt, bh);
        mma::frag_b(sm.ub_lo, LDU, 16 * kb, 8 * nt, bl);
        mma::mma16816<T>(acc[nt], ah, bh);
        mma::mma16816<T>(acc[nt], al, bh);
        mma::mma16816<T>(acc[nt], ah, bl);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), col = c0 + 8 * nt + mma::acc_col(e);
        if (i < L) a.u[((row0 + i) * a.HV + hv) * a.V + col] = acc[nt][e];
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
