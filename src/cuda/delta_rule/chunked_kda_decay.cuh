// Per-channel decay helpers of the KDA chunked stages (chunked_kda.h), block-wide (128 threads):
// the per-channel cumulative gate of a chunk; stage 1's decayed products M and P (kda_decayed_mp:
// diagonal 16 x 16 blocks in fp32, the rest on tensor cores); and the backward's per-channel
// decayed sums (kda_decayed_rows / cols, fp32).
//
// Rows past the chunk's length L must read x = y = 0 and hold G_i = G_{L-1} (the cumulative sum of
// zero gates), so every exponent formed below stays <= 0 and 0 * exp(...) is never 0 * inf.
#pragma once

#include "chunked_kda_mma.cuh"
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// exp of a decay difference (always <= 0 here) in the per-term loops of the decayed products and
// sums: the hardware ex2 (__expf; CUDA guide: at most 2 + floor(1.173 |x|) ulp, i.e. ~1e-5
// relative at x = -80, below which the result is flushed to 0 anyway) instead of expf's longer
// sequence; the bars are 5e-3 and up. The host emulation uses expf.
__device__ __forceinline__ float decay_exp(float x) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  return expf(x);
#else
  return __expf(x);
#endif
}

// Chunk rows r < 64 of the per-channel gate into G[r * ldg + d] as the cumulative sum over rows
// (rows >= L read g = 0). Also writes G to the intermediates (rows < L). Ends with a barrier.
template <typename T, int KMAX>
__device__ __forceinline__ void kda_load_cumulative_gate(const View& g, const ChunkInfo& ci, int64_t hv,
                                                         float* G, int ldg, float* G_out, int64_t row0,
                                                         int64_t HV) {
  const int tid = threadIdx.x;
  const int64_t g0 = off4(g, ci.b, ci.t0, hv, 0);  // row r: + r * s1 (the last dim is contiguous)
  batched_copy<kChunkSize * KMAX, kChunkThreads, 32>(  // consecutive threads: consecutive channels (coalesced)
      [&](int e) { return e / KMAX < ci.len ? load_elem<T>(g, g0 + (e / KMAX) * g.s1 + e % KMAX) : 0.f; },
      [&](int e, float x) { G[(e / KMAX) * ldg + e % KMAX] = x; });
  __syncthreads();
  if (tid < KMAX) {  // one thread per channel runs down the rows
    float acc = 0.f;
#pragma unroll 16
    for (int r = 0; r < kChunkSize; ++r) {
      acc += G[r * ldg + tid];
      G[r * ldg + tid] = acc;
    }
  }
  __syncthreads();
  if (G_out) {
    float* out0 = G_out + (row0 * HV + hv) * KMAX;  // row r: + r * HV KMAX
    for (int e = tid; e < ci.len * KMAX; e += kChunkThreads) {
      const int r = e / KMAX, d = e % KMAX;
      out0[r * HV * KMAX + d] = G[r * ldg + d];
    }
  }
}

// Chunk rows of the stored G [rows, HV, K] (stage 1's output) into G[r * ldg + d]; rows >= L
// repeat row L - 1. No barrier.
template <int KMAX, int NTHR = kChunkThreads>
__device__ __forceinline__ void kda_read_gate(const float* G_in, const ChunkInfo& ci, int64_t row0, int64_t hv,
                                              int64_t HV, float* G, int ldg) {
  batched_copy<kChunkSize * KMAX, NTHR>(
      [&](int e) {
        const int r = e / KMAX, rr = r < ci.len ? r : ci.len - 1;
        return G_in[((row0 + rr) * HV + hv) * KMAX + e % KMAX];
      },
      [&](int e, float x) { G[(e / KMAX) * ldg + e % KMAX] = x; });
}

// Shared scratch the product needs: 16 + 48 rows of KMAX + 8 elements of T, hi and lo.
template <typename T, int KMAX>
constexpr int64_t kda_decay_stage_bytes() {
  return static_cast<int64_t>(sizeof(T)) * 2 * (16 + 48) * (KMAX + 8);
}

// Stage 1's two decayed products of one chunk into one 64 x 64 array `out` (leading dimension
// ldo, shared memory):
//   M_ij = sum_d k_id k_jd exp(G_id - G_jd)  (j < i)   at out[i][j]   (the strict lower triangle)
//   P_ij = sum_d q_id k_jd exp(G_id - G_jd)  (j <= i)  at out[j][i]   (P^T: upper triangle, diagonal)
// q(i, d), k(i, d) return fp32 values (0 past L); G is [64][ldg] in shared memory (rows past L
// hold G_{L-1}); `stage`: kda_decay_stage_bytes of shared scratch. The caller has a barrier
// between writing q, k, G and the call; the call ends with one.
//
// Diagonal 16 x 16 blocks (kHalves, session 6): pairs inside an 8-row half in fp32, one exp per
// (i, j, d), shared by M and P; the 8 x 8 quadrant between the halves on tensor cores through the
// upper half's first row (below). kHalves = false: every pair of the block in fp32 (session 5,
// FLASHGRAD_CHUNKED_KDA=legacy). Off-diagonal blocks of
// row sub-chunk I (rows [16 I, 16 I + 16), columns j < 16 I), with r = 16 I:
//   ys[j] = k_j o exp(G_r - G_j)                  (j < r;  exponent <= 0)
//   xs[a] = k_{r + a} o exp(G_{r + a} - G_r), then q_{r + a} o exp(G_{r + a} - G_r)   (<= 0)
//   M_{r + a, j} = xs[a] . ys[j] (k's xs),  P_{r + a, j} = xs[a] . ys[j] (q's xs)
// on tensor cores (xs, ys split hi + lo in T, three mmas per tile: close to fp32); warp w takes
// the 8-column tiles nt = w, w + 4 of the sub-chunk's 2 I tiles.
template <typename T, int KMAX, bool kHalves = true, typename QF, typename KF>
__device__ __forceinline__ void kda_decayed_mp(QF&& q, KF&& k, const float* G, int ldg, float* out, int ldo,
                                               T* stage) {
  constexpr int LDS = KMAX + 8;
  T* xh = stage;
  T* xl = xh + 16 * LDS;
  T* yh = xl + 16 * LDS;
  T* yl = yh + 48 * LDS;
  const int tid = threadIdx.x, wp = tid / 32;
  if constexpr (kHalves) {
    // Diagonal blocks by 8-row halves. Pairs inside a half (2 x 36 per block, 288 in all: 2.25
    // per thread instead of 4.25): fp32, one exp per term; pair p of a half is row a, column
    // c = p - a (a + 1) / 2.
    for (int pr = tid; pr < 4 * 72; pr += kChunkThreads) {
      const int blk = pr / 72, hh = (pr % 72) / 36, p = pr % 36;
      int a = static_cast<int>((sqrtf(8.f * p + 1.f) - 1.f) * 0.5f);
      while ((a + 1) * (a + 2) / 2 <= p) ++a;  // float rounding of the root
      while (a * (a + 1) / 2 > p) --a;
      const int i = 16 * blk + 8 * hh + a, j = 16 * blk + 8 * hh + p - a * (a + 1) / 2;
      float m = 0.f, pq = 0.f;
      for (int d = 0; d < KMAX; ++d) {
        const float kj = k(j, d) * decay_exp(G[i * ldg + d] - G[j * ldg + d]);
        m += k(i, d) * kj;
        pq += q(i, d) * kj;
      }
      if (j < i) out[i * ldo + j] = m;
      out[j * ldo + i] = pq;
    }
    // The 8 x 8 quadrant (rows i in the upper half, columns j in the lower one) of block wp, through
    // its upper half's first row m (j < m <= i, both factors <= 1) as one 16 x 8 tensor-core tile:
    // A rows a < 8: k_{m+a} o exp(G_{m+a} - G_m), rows 8 + a: q_{m+a} o exp(..); B column jj:
    // k_{16 wp + jj} o exp(G_m - G_{16 wp + jj}); formed in registers (split hi + lo), so the tile
    // holds M (rows < 8) and P (rows >= 8) of the quadrant.
    {
      const int j0 = 16 * wp, m = j0 + 8;
      float acc[1][4] = {};
      kda_mma::warp_fp32_product<T, 1>(
          [&](int row, int d) {
            const int i = m + (row & 7);
            return (row < 8 ? k(i, d) : q(i, d)) * decay_exp(G[i * ldg + d] - G[m * ldg + d]);
          },
          [&](int d, int jj) { return k(j0 + jj, d) * decay_exp(G[m * ldg + d] - G[(j0 + jj) * ldg + d]); }, 0, 0,
          0, KMAX, acc);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = mma::acc_row(e), j = j0 + mma::acc_col(e), i = m + (row & 7);
        if (row < 8)
          out[i * ldo + j] = acc[0][e];
        else
          out[j * ldo + i] = acc[0][e];
      }
    }
  } else {
    // Lower triangles (with the diagonal) of the four diagonal blocks: 4 x 136 (i, j) pairs, one per
    // thread and pass (all lanes busy); pair p of a block is row a, column c = p - a (a + 1) / 2.
    for (int pr = tid; pr < 4 * 136; pr += kChunkThreads) {
      const int blk = pr / 136, p = pr % 136;
      int a = static_cast<int>((sqrtf(8.f * p + 1.f) - 1.f) * 0.5f);
      while ((a + 1) * (a + 2) / 2 <= p) ++a;  // float rounding of the root
      while (a * (a + 1) / 2 > p) --a;
      const int i = 16 * blk + a, j = 16 * blk + p - a * (a + 1) / 2;
      float m = 0.f, pq = 0.f;
      for (int d = 0; d < KMAX; ++d) {
        const float kj = k(j, d) * decay_exp(G[i * ldg + d] - G[j * ldg + d]);
        m += k(i, d) * kj;
        pq += q(i, d) * kj;
      }
      if (j < i) out[i * ldo + j] = m;
      out[j * ldo + i] = pq;
    }
  }
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I;
    for (int pass = 0; pass < 2; ++pass) {  // 0: M (k's rows), 1: P (q's rows)
      __syncthreads();  // the previous readers of `stage` are done
      for (int e = tid; e < (pass == 0 ? 16 + r0 : 16) * KMAX; e += kChunkThreads) {
        const int a = e / KMAX, d = e % KMAX;
        const float gr = G[r0 * ldg + d];
        if (a < 16) {
          const float x = pass == 0 ? k(r0 + a, d) : q(r0 + a, d);
          store_split<T>(x * decay_exp(G[(r0 + a) * ldg + d] - gr), &xh[a * LDS + d], &xl[a * LDS + d]);
        } else {  // ys, staged once per sub-chunk
          store_split<T>(k(a - 16, d) * decay_exp(gr - G[(a - 16) * ldg + d]), &yh[(a - 16) * LDS + d],
                         &yl[(a - 16) * LDS + d]);
        }
      }
      __syncthreads();
      for (int nt = wp; nt < 2 * I; nt += 4) {
        float acc[4] = {};
        kda_mma::rows_times_rows_split<T>(xh, xl, yh, yl, LDS, 8 * nt, KMAX, acc);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = r0 + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
          if (pass == 0)
            out[i * ldo + j] = acc[e];
          else
            out[j * ldo + i] = acc[e];
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule {

// Per-channel decayed sums of the backward (block-wide, fp32), for r < 64, d < KMAX:
//   rows:  out_rd = sum_{j <= r} W_rj y_jd exp(G_rd - G_jd)      (j < r unless `inclusive`)
//   cols:  out_rd = sum_{i >= r} W_ir x_id exp(G_id - G_rd)      (i > r unless `inclusive`)
// W is [64][ldw] in shared memory (zero in rows past L), G [64][KMAX] (rows past L hold G_{L-1}),
// x, y return fp32 values (0 past L). Both write `out` [64][KMAX] (every element), use `stage`
// (16 * KMAX floats) and end with a barrier; the caller has one between writing the inputs and
// the call. NTHR threads per block; element (r, d) is written only by thread (r * KMAX + d) % NTHR
// in both helpers.
//
// Inside a 16-row sub-chunk one exp per term. Across sub-chunks, through the first row b = 16 I
// of the later sub-chunk I (j < b <= r, resp. r < b <= i), so both factors are <= 1:
//   rows: exp(G_rd - G_jd) = exp(G_rd - G_bd) exp(G_bd - G_jd)
//   cols: exp(G_id - G_rd) = exp(G_id - G_bd) exp(G_bd - G_rd)
// with the factor of the summed index folded into the staged operand.
template <int KMAX, int NTHR, typename YF>
__device__ __forceinline__ void kda_decayed_rows(const float* W, int ldw, YF&& y, const float* G, bool inclusive,
                                                 float* out, float* stage) {
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunkSize * KMAX; e += NTHR) {
    const int r = e / KMAX, d = e % KMAX, end = inclusive ? r : r - 1;
    const float gr = G[r * KMAX + d];
    float s = 0.f;
    for (int j = r & ~15; j <= end; ++j) s += W[r * ldw + j] * y(j, d) * decay_exp(gr - G[j * KMAX + d]);
    out[e] = s;
  }
  for (int J = 0; J < 3; ++J)
    for (int I = J + 1; I < 4; ++I) {
      const int b = 16 * I;
      __syncthreads();  // the previous pair's readers of `stage` are done
      for (int e = tid; e < 16 * KMAX; e += NTHR) {
        const int jj = e / KMAX, d = e % KMAX, j = 16 * J + jj;
        stage[e] = y(j, d) * decay_exp(G[b * KMAX + d] - G[j * KMAX + d]);
      }
      __syncthreads();
      for (int e = tid; e < 16 * KMAX; e += NTHR) {
        const int r = b + e / KMAX, d = e % KMAX;
        float s = 0.f;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) s += W[r * ldw + 16 * J + jj] * stage[jj * KMAX + d];
        out[r * KMAX + d] += s * decay_exp(G[r * KMAX + d] - G[b * KMAX + d]);
      }
    }
  __syncthreads();
}

template <int KMAX, int NTHR, typename XF>
__device__ __forceinline__ void kda_decayed_cols(const float* W, int ldw, XF&& x, const float* G, bool inclusive,
                                                 float* out, float* stage) {
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunkSize * KMAX; e += NTHR) {
    const int r = e / KMAX, d = e % KMAX, end = (r & ~15) + 16;
    const float gr = G[r * KMAX + d];
    float s = 0.f;
    for (int i = inclusive ? r : r + 1; i < end; ++i) s += W[i * ldw + r] * x(i, d) * decay_exp(G[i * KMAX + d] - gr);
    out[e] = s;
  }
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();
    for (int e = tid; e < 16 * KMAX; e += NTHR) {
      const int i = b + e / KMAX, d = e % KMAX;
      stage[e] = x(i, d) * decay_exp(G[i * KMAX + d] - G[b * KMAX + d]);
    }
    __syncthreads();
    for (int e = tid; e < b * KMAX; e += NTHR) {  // rows r < b
      const int r = e / KMAX, d = e % KMAX;
      float s = 0.f;
#pragma unroll
      for (int ii = 0; ii < 16; ++ii) s += W[(b + ii) * ldw + r] * stage[ii * KMAX + d];
      out[e] += s * decay_exp(G[b * KMAX + d] - G[r * KMAX + d]);
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule {

// kda_decayed_rows / cols (same contract, same results up to fp32 rounding) with the cross-sub-chunk
// parts on tensor cores, for blocks of 8 warps (B2). Inside an 8-row half of a 16-row sub-chunk the
// terms stay fp32, one exp each (a reference row there could overflow: 7 strong gates can sum past
// -88); between the two halves of a sub-chunk, through the upper half's first row (below); across
// sub-chunks, for the later sub-chunk I with first row b = 16 I:
//   rows: out[b + a, :] += exp(G_{b+a} - G_b) o sum_{J < I} W[b + a, 16 J ..] Ys_J,
//         Ys_J[jj, d] = y(16 J + jj, d) exp(G_bd - G_{16J+jj, d})        (<= 1)
//   cols: out[r, :] += exp(G_b - G_r) o sum_ii W[b + ii, r] Xs_I[ii, :]   (r < b),
//         Xs_I[ii, d] = x(b + ii, d) exp(G_{b+ii, d} - G_bd)              (<= 1)
// i.e. 16 x 16 (W) times 16 x KMAX (staged, fp32) products, split hi + lo in registers
// (kda_mma::warp_fp32_product); warp w takes the 8-column tiles [NTW w, NTW (w + 1)) of every
// 16-row output strip (NTW = KMAX / 64). The in-half part's elements (r, d) belong to the thread of
// item (d, r / 8), the other parts' to their fragment owners; barriers separate the parts.
template <typename T, int KMAX, typename YF>
__device__ __forceinline__ void kda_decayed_rows_mma(const float* W, int ldw, YF&& y, const float* G,
                                                     bool inclusive, float* out, float* stage) {
  constexpr int NTHR = 256, NTW = KMAX / 64;
  static_assert(KMAX % 64 == 0, "8 warps x NTW 8-column tiles");
  const int tid = threadIdx.x, wp = tid / 32, n0 = 8 * NTW * wp;
  // Inside the 8-row half of r: fp32, one exp per term. Thread item (channel d, half r0 = 8 h): the
  // half's 8 G and y values of channel d loaded once, the 36 (28) terms unrolled into 8 sums
  // (lanes of a warp: consecutive channels of one half, so W's loads are broadcasts).
  for (int it = tid; it < 8 * KMAX; it += NTHR) {
    const int d = it % KMAX, r0 = 8 * (it / KMAX);
    float g[8], s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = G[(r0 + i) * KMAX + d], s[i] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float yj = y(r0 + j, d);
#pragma unroll
      for (int i = j; i < 8; ++i)
        if (i > j || inclusive) s[i] += W[(r0 + i) * ldw + r0 + j] * yj * decay_exp(g[i] - g[j]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out[(r0 + i) * KMAX + d] = s[i];
  }
  // Rows r of a sub-chunk's upper half, columns j of its lower half (j < m = 16 I + 8 <= r):
  // out[r] += exp(G_r - G_m) o sum_jj W[r, 16 I + jj] ys[8 I + jj], ys[8 I + jj] = y_j o exp(G_m - G_j)
  // (j = 16 I + jj), staged for the four sub-chunks at once (32 x KMAX floats); one 16 x 16 x KMAX
  // product per sub-chunk with the A operand's rows and columns 8..15 zero (warp w: sub-chunk
  // w / 2, channel half w % 2).
  for (int e = tid; e < 32 * KMAX; e += NTHR) {
    const int q = e / KMAX, d = e % KMAX, j = 16 * (q / 8) + q % 8, m = 16 * (q / 8) + 8;
    stage[e] = y(j, d) * decay_exp(G[m * KMAX + d] - G[j * KMAX + d]);
  }
  __syncthreads();
  {
    constexpr int NTQ = KMAX / 16;
    const int I = wp / 2, m = 16 * I + 8, nq = (wp % 2) * (KMAX / 2);
    float acc[NTQ][4] = {};
    kda_mma::warp_fp32_product<T, NTQ>(
        [&](int a, int jj) { return a < 8 && jj < 8 ? W[(m + a) * ldw + 16 * I + jj] : 0.f; },
        [&](int jj, int n) { return jj < 8 ? stage[(8 * I + jj) * KMAX + n] : 0.f; }, 0, nq, 0, 16, acc);
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // accumulator rows grp (< 8); rows grp + 8 are the zero padding
        const int r = m + mma::grp(), d = nq + 8 * nt + mma::acc_col(e);
        out[r * KMAX + d] += acc[nt][e] * decay_exp(G[r * KMAX + d] - G[m * KMAX + d]);
      }
  }
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    float acc[NTW][4] = {};
    for (int J = 0; J < I; ++J) {
      __syncthreads();  // the previous readers of `stage` (and the diagonal part's writers of out) are done
      for (int e = tid; e < 16 * KMAX; e += NTHR) {
        const int jj = e / KMAX, d = e % KMAX, j = 16 * J + jj;
        stage[e] = y(j, d) * decay_exp(G[b * KMAX + d] - G[j * KMAX + d]);
      }
      __syncthreads();
      kda_mma::warp_fp32_product<T, NTW>([&](int m, int kk) { return W[m * ldw + 16 * J + kk]; },
                                         [&](int kk, int n) { return stage[kk * KMAX + n]; }, b, n0, 0, 16, acc);
    }
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = b + mma::acc_row(e), d = n0 + 8 * nt + mma::acc_col(e);
        out[r * KMAX + d] += acc[nt][e] * decay_exp(G[r * KMAX + d] - G[b * KMAX + d]);
      }
  }
  __syncthreads();
}

template <typename T, int KMAX, typename XF>
__device__ __forceinline__ void kda_decayed_cols_mma(const float* W, int ldw, XF&& x, const float* G,
                                                     bool inclusive, float* out, float* stage) {
  constexpr int NTHR = 256, NTW = KMAX / 64;
  static_assert(KMAX % 64 == 0, "8 warps x NTW 8-column tiles");
  const int tid = threadIdx.x, wp = tid / 32, n0 = 8 * NTW * wp;
  // Inside the 8-row half of r: fp32, one exp per term; thread items as in kda_decayed_rows_mma.
  for (int it = tid; it < 8 * KMAX; it += NTHR) {
    const int d = it % KMAX, r0 = 8 * (it / KMAX);
    float g[8], s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = G[(r0 + i) * KMAX + d], s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float xi = x(r0 + i, d);
#pragma unroll
      for (int r = 0; r <= i; ++r)
        if (r < i || inclusive) s[r] += W[(r0 + i) * ldw + r0 + r] * xi * decay_exp(g[i] - g[r]);
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) out[(r0 + r) * KMAX + d] = s[r];
  }
  // Rows r of a sub-chunk's lower half, terms i of its upper half (r < m = 16 I + 8 <= i):
  // out[r] += exp(G_m - G_r) o sum_ii W[m + ii, r] xs[8 I + ii], xs[8 I + ii] = x_{m+ii} o exp(G_{m+ii} - G_m),
  // staged for the four sub-chunks at once; one padded 16 x 16 x KMAX product per sub-chunk as in
  // kda_decayed_rows_mma.
  for (int e = tid; e < 32 * KMAX; e += NTHR) {
    const int q = e / KMAX, d = e % KMAX, m = 16 * (q / 8) + 8, i = m + q % 8;
    stage[e] = x(i, d) * decay_exp(G[i * KMAX + d] - G[m * KMAX + d]);
  }
  __syncthreads();
  {
    constexpr int NTQ = KMAX / 16;
    const int I = wp / 2, m = 16 * I + 8, nq = (wp % 2) * (KMAX / 2);
    float acc[NTQ][4] = {};
    kda_mma::warp_fp32_product<T, NTQ>(
        [&](int a, int ii) { return a < 8 && ii < 8 ? W[(m + ii) * ldw + 16 * I + a] : 0.f; },
        [&](int ii, int n) { return ii < 8 ? stage[(8 * I + ii) * KMAX + n] : 0.f; }, 0, nq, 0, 16, acc);
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 16 * I + mma::grp(), d = nq + 8 * nt + mma::acc_col(e);
        out[r * KMAX + d] += acc[nt][e] * decay_exp(G[m * KMAX + d] - G[r * KMAX + d]);
      }
  }
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();  // the previous readers of `stage` (and the diagonal part's writers of out) are done
    for (int e = tid; e < 16 * KMAX; e += NTHR) {
      const int i = b + e / KMAX, d = e % KMAX;
      stage[e] = x(i, d) * decay_exp(G[i * KMAX + d] - G[b * KMAX + d]);
    }
    __syncthreads();
    for (int J = 0; J < I; ++J) {  // output rows [16 J, 16 J + 16)
      float acc[NTW][4] = {};
      kda_mma::warp_fp32_product<T, NTW>([&](int m, int kk) { return W[(b + kk) * ldw + m]; },
                                         [&](int kk, int n) { return stage[kk * KMAX + n]; }, 16 * J, n0, 0, 16,
                                         acc);
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * J + mma::acc_row(e), d = n0 + 8 * nt + mma::acc_col(e);
          out[r * KMAX + d] += acc[nt][e] * decay_exp(G[b * KMAX + d] - G[r * KMAX + d]);
        }
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule
