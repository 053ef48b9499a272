// The per-channel decayed sums of the split KDA B2's second kernel (chunked_kda_grads_local.cuh), for
// one 64-channel slice and blocks of 8 warps, two sums per pass:
//   rows pair: out1_rd = sum_{j <= r} W1_rj y_jd E_rjd,  out2_rd = sum_{j < r} W2_rj y_jd E_rjd
//              (aq with W1 = dP and bm with W2 = dM, both with y = k: one exp and one staged operand
//              serve both sums);
//   cols sum:  out_rd = sum_{i >= r} W1_ir x1_id E_ird + sum_{i > r} W2_ir x2_id E_ird
//              (ak + ck with W1 = dP, x1 = q, W2 = dM, x2 = beta k: dk and dG need only the sum);
// with E_ijd = exp(G_id - G_jd) (i >= j, <= 1). kda_decayed_rows_mma / cols_mma (chunked_kda_decay.cuh)
// form one sum per pass; run per slice, four of them cost ~15k instructions per warp (SASS count,
// session 10), half of the kernel. Same three parts, same accuracy argument as there:
//   1. inside an 8-row half: fp32, one exp per (i, j, d) term, shared by the two sums;
//   2. between the two halves of a 16-row sub-chunk, through the upper half's first row m;
//   3. across sub-chunks, through the later sub-chunk's first row b = 16 I: here all J < I at once
//      (one staged operand of 16 I rows per I, one barrier pair per I instead of one per (I, J)).
// Parts 2 and 3 run on tensor cores: with kSplit their fp32 operands split hi + lo in registers (three
// mmas, close to fp32), without it rounded once to T (one mma, as fla takes these products in bf16;
// the default). Exps are exp2_ftz of G differences in log2 units (one instruction each).
// Contract (as the decay helpers'): W1, W2 [64][ldw] in shared memory, zero in rows past L; G [64][64]
// in log2 units (kda_gate_slice; rows past L hold G_{L-1}); y, x1, x2 loaders return 0 past L; the
// caller has a barrier between writing the inputs (and reading the previous outputs) and the call;
// the call ends with one.
// `stage`: kKdaDecayedStageFloats floats of shared memory.
#pragma once

#include "chunked_kda_grads_slices.cuh"
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"  // round_pair

namespace flashgrad::cuda_detail::delta_rule {

// Staged operands have rows of 64 channels at a pitch of 68 floats: the B-fragment loads (rows 2 tig,
// 2 tig + 1 apart, columns grp) then hit 32 distinct banks (at pitch 64 the four tig lanes of a
// column collide).
constexpr int kKdaStagePitch = kKdaSliceK + 4;
constexpr int kKdaDecayedStageFloats = 48 * kKdaStagePitch;  // part 3's largest operand: rows j < 48

// acc += A B (16 x 16 by 16 x 8): with kSplit both operands split (hi hi + lo hi + hi lo), else both
// rounded once to T (one mma; lo unused).
template <typename T, bool kSplit>
__device__ __forceinline__ void mma_split3(float (&acc)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                           const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  mma::mma16816<T>(acc, ah, bh);
  if constexpr (kSplit) {
    mma::mma16816<T>(acc, al, bh);
    mma::mma16816<T>(acc, ah, bl);
  }
}

// A fragment of a 16 x 16 block read through a loader a(row, col), split hi + lo or rounded
// (fragment elements: (grp, 2 tig + {0, 1}), (grp + 8, ..), (grp, 8 + 2 tig + {0, 1}), (grp + 8, ..)).
template <typename T, bool kSplit, typename AF>
__device__ __forceinline__ void frag_a_split(AF&& a, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const int g = mma::grp(), t2 = 2 * mma::tig();
  mma::round_pair<T, kSplit>(a(g, t2), a(g, t2 + 1), hi[0], lo[0]);
  mma::round_pair<T, kSplit>(a(g + 8, t2), a(g + 8, t2 + 1), hi[1], lo[1]);
  mma::round_pair<T, kSplit>(a(g, t2 + 8), a(g, t2 + 9), hi[2], lo[2]);
  mma::round_pair<T, kSplit>(a(g + 8, t2 + 8), a(g + 8, t2 + 9), hi[3], lo[3]);
}
// B fragment (16 x 8) through b(k, n): elements (2 tig + {0, 1}, grp), (8 + 2 tig + {0, 1}, grp).
template <typename T, bool kSplit, typename BF>
__device__ __forceinline__ void frag_b_split(BF&& b, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const int g = mma::grp(), t2 = 2 * mma::tig();
  mma::round_pair<T, kSplit>(b(t2, g), b(t2 + 1, g), hi[0], lo[0]);
  mma::round_pair<T, kSplit>(b(t2 + 8, g), b(t2 + 9, g), hi[1], lo[1]);
}

template <typename T, bool kSplit, typename YF>
__device__ __forceinline__ void kda_rows_pair(const float* W1, const float* W2, int ldw, YF&& y, const float* G,
                                              float* out1, float* out2, float* stage) {
  constexpr int KS = kKdaSliceK, SP = kKdaStagePitch, NTHR = kKdaSplitThreads;
  const int tid = threadIdx.x, wp = tid / 32, g = mma::grp();
  // 1. Inside the 8-row half of r: item (channel d, half r0 = 8 h), 2 per thread; lanes of a warp
  //    take consecutive channels of one half, so W's loads are broadcasts.
  for (int it = tid; it < 8 * KS; it += NTHR) {
    const int d = it % KS, r0 = 8 * (it / KS);
    float gg[8], s1[8], s2[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) gg[i] = G[(r0 + i) * KS + d], s1[i] = 0.f, s2[i] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float yj = y(r0 + j, d);
#pragma unroll
      for (int i = j; i < 8; ++i) {
        const float t = yj * exp2_ftz(gg[i] - gg[j]);
        s1[i] += W1[(r0 + i) * ldw + r0 + j] * t;
        if (i > j) s2[i] += W2[(r0 + i) * ldw + r0 + j] * t;
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out1[(r0 + i) * KS + d] = s1[i], out2[(r0 + i) * KS + d] = s2[i];
  }
  // 2. Rows r of sub-chunk I's upper half, columns j of its lower half (j < m = 16 I + 8 <= r):
  //    out[r] += exp(G_r - G_m) o sum_jj W[r, 16 I + jj] ys[8 I + jj],  ys[8 I + jj] = y_j o exp(G_m - G_j)
  //    (j = 16 I + jj), staged for the four sub-chunks at once (32 x 64). One 16 x 16 x 64 product per
  //    sub-chunk and sum, only the A block's rows and columns < 8 nonzero: the fragment registers
  //    a[1..3] and b[1] are zero. Warp w: sub-chunk w / 2, channels [32 (w % 2), +32) (4 tiles).
  for (int e = tid; e < 32 * KS; e += NTHR) {
    const int q = e / KS, d = e % KS, j = 16 * (q / 8) + q % 8, m = 16 * (q / 8) + 8;
    stage[q * SP + d] = y(j, d) * exp2_ftz(G[m * KS + d] - G[j * KS + d]);
  }
  __syncthreads();  // (also orders part 1's stores of out before the read-modify-writes below)
  {
    const int I = wp / 2, m = 16 * I + 8, nq = (wp % 2) * 32, t2 = 2 * mma::tig();
    uint32_t a1h[4] = {0u, 0u, 0u, 0u}, a1l[4] = {0u, 0u, 0u, 0u}, a2h[4] = {0u, 0u, 0u, 0u},
             a2l[4] = {0u, 0u, 0u, 0u};
    mma::round_pair<T, kSplit>(W1[(m + g) * ldw + 16 * I + t2], W1[(m + g) * ldw + 16 * I + t2 + 1], a1h[0], a1l[0]);
    mma::round_pair<T, kSplit>(W2[(m + g) * ldw + 16 * I + t2], W2[(m + g) * ldw + 16 * I + t2 + 1], a2h[0], a2l[0]);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int n = nq + 8 * nt + g;
      uint32_t bh[2] = {0u, 0u}, bl[2] = {0u, 0u};
      mma::round_pair<T, kSplit>(stage[(8 * I + t2) * SP + n], stage[(8 * I + t2 + 1) * SP + n], bh[0], bl[0]);
      float c1[4] = {}, c2[4] = {};
      mma_split3<T, kSplit>(c1, a1h, a1l, bh, bl);
      mma_split3<T, kSplit>(c2, a2h, a2l, bh, bl);
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // accumulator rows grp (< 8); rows grp + 8 are the padding
        const int r = m + g, d = nq + 8 * nt + 2 * mma::tig() + e;
        const float f = exp2_ftz(G[r * KS + d] - G[m * KS + d]);
        out1[r * KS + d] += c1[e] * f;
        out2[r * KS + d] += c2[e] * f;
      }
    }
  }
  // 3. Later sub-chunk I (rows b + a, b = 16 I) from every earlier column j < b:
  //    out[b + a] += exp(G_{b+a} - G_b) o sum_{j < b} W[b + a, j] Ys[j],  Ys[j] = y_j o exp(G_b - G_j),
  //    one 16 x (16 I) x 64 product per sum; warp w: the 8-column tile [8 w, +8).
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();  // the previous readers of `stage` and writers of out are done
    for (int e = tid; e < b * KS; e += NTHR) {
      const int j = e / KS, d = e % KS;
      stage[j * SP + d] = y(j, d) * exp2_ftz(G[b * KS + d] - G[j * KS + d]);
    }
    __syncthreads();
    float c1[4] = {}, c2[4] = {};
    const int n0 = 8 * wp;
    for (int J = 0; J < I; ++J) {
      uint32_t a1h[4], a1l[4], a2h[4], a2l[4], bh[2], bl[2];
      frag_a_split<T, kSplit>([&](int r, int k) { return W1[(b + r) * ldw + 16 * J + k]; }, a1h, a1l);
      frag_a_split<T, kSplit>([&](int r, int k) { return W2[(b + r) * ldw + 16 * J + k]; }, a2h, a2l);
      frag_b_split<T, kSplit>([&](int k, int n) { return stage[(16 * J + k) * SP + n0 + n]; }, bh, bl);
      mma_split3<T, kSplit>(c1, a1h, a1l, bh, bl);
      mma_split3<T, kSplit>(c2, a2h, a2l, bh, bl);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = b + mma::acc_row(e), d = n0 + mma::acc_col(e);
      const float f = exp2_ftz(G[r * KS + d] - G[b * KS + d]);
      out1[r * KS + d] += c1[e] * f;
      out2[r * KS + d] += c2[e] * f;
    }
  }
  __syncthreads();
}

template <typename T, bool kSplit, typename X1F, typename X2F>
__device__ __forceinline__ void kda_cols_sum(const float* W1, const float* W2, int ldw, X1F&& x1, X2F&& x2,
                                             const float* G, float* out, float* stage) {
  constexpr int KS = kKdaSliceK, SP = kKdaStagePitch, NTHR = kKdaSplitThreads;
  const int tid = threadIdx.x, wp = tid / 32, g = mma::grp();
  // 1. Inside the 8-row half of r (items as in kda_rows_pair).
  for (int it = tid; it < 8 * KS; it += NTHR) {
    const int d = it % KS, r0 = 8 * (it / KS);
    float gg[8], s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) gg[i] = G[(r0 + i) * KS + d], s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float u1 = x1(r0 + i, d), u2 = x2(r0 + i, d);
#pragma unroll
      for (int r = 0; r <= i; ++r) {
        float w = W1[(r0 + i) * ldw + r0 + r] * u1;
        if (r < i) w += W2[(r0 + i) * ldw + r0 + r] * u2;
        s[r] += w * exp2_ftz(gg[i] - gg[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) out[(r0 + r) * KS + d] = s[r];
  }
  // 2. Rows r of sub-chunk I's lower half, terms i of its upper half (r < m = 16 I + 8 <= i):
  //    out[r] += exp(G_m - G_r) o sum_ii (W1[m + ii, r] x1s[ii] + W2[m + ii, r] x2s[ii]),
  //    xNs[ii] = xN_{m+ii} o exp(G_{m+ii} - G_m): one product with k = [ii of W1 | ii of W2] (16),
  //    A rows (r - 16 I) < 8 nonzero (a[1], a[3] zero). Two rounds of two sub-chunks (stage: x1s and
  //    x2s of 2 sub-chunks, 32 x 64); warp w: sub-chunk 2 round + w / 4, channels [16 (w % 4), +16).
  for (int round = 0; round < 2; ++round) {
    if (round) __syncthreads();  // round 0's readers of `stage` are done
    for (int e = tid; e < 16 * KS; e += NTHR) {  // row q < 16 of the round: sub-chunk 2 round + q / 8
      const int q = e / KS, d = e % KS, m = 16 * (2 * round + q / 8) + 8, i = m + q % 8;
      const float f = exp2_ftz(G[i * KS + d] - G[m * KS + d]);
      stage[((q / 8) * 16 + q % 8) * SP + d] = x1(i, d) * f;      // x1s: rows 0..7 of the sub-chunk's block
      stage[((q / 8) * 16 + 8 + q % 8) * SP + d] = x2(i, d) * f;  // x2s: rows 8..15
    }
    __syncthreads();  // (round 0: also orders part 1's stores of out before the updates below)
    const int sub = wp / 4, I = 2 * round + sub, m = 16 * I + 8, n0 = 16 * (wp % 4), t2 = 2 * mma::tig();
    const float* st = stage + sub * 16 * SP;  // k rows 0..7: x1s, 8..15: x2s
    uint32_t ah[4] = {0u, 0u, 0u, 0u}, al[4] = {0u, 0u, 0u, 0u};
    // A[a][kk] = W1[m + kk][16 I + a] (kk < 8), W2[m + kk - 8][16 I + a] (kk >= 8); rows a < 8.
    mma::round_pair<T, kSplit>(W1[(m + t2) * ldw + 16 * I + g], W1[(m + t2 + 1) * ldw + 16 * I + g], ah[0], al[0]);
    mma::round_pair<T, kSplit>(W2[(m + t2) * ldw + 16 * I + g], W2[(m + t2 + 1) * ldw + 16 * I + g], ah[2], al[2]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t bh[2], bl[2];
      frag_b_split<T, kSplit>([&](int k, int n) { return st[k * SP + n0 + 8 * nt + n]; }, bh, bl);
      float c[4] = {};
      mma_split3<T, kSplit>(c, ah, al, bh, bl);
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // rows grp (< 8)
        const int r = 16 * I + g, d = n0 + 8 * nt + 2 * mma::tig() + e;
        out[r * KS + d] += c[e] * exp2_ftz(G[m * KS + d] - G[r * KS + d]);
      }
    }
  }
  // 3. Later sub-chunk I (terms i = b + ii, b = 16 I) into every earlier row r < b:
  //    out[r] += exp(G_b - G_r) o sum_ii (W1[b + ii, r] x1s[ii] + W2[b + ii, r] x2s[ii]),
  //    xNs[ii] = xN_{b+ii} o exp(G_{b+ii} - G_b); one (16 J strip) x 32 x 64 product per earlier
  //    16-row strip J < I (k = [ii of W1 | ii of W2]); warp w: the 8-column tile [8 w, +8).
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();  // the previous readers of `stage` and writers of out are done
    for (int e = tid; e < 16 * KS; e += NTHR) {
      const int ii = e / KS, d = e % KS, i = b + ii;
      const float f = exp2_ftz(G[i * KS + d] - G[b * KS + d]);
      stage[ii * SP + d] = x1(i, d) * f;
      stage[(16 + ii) * SP + d] = x2(i, d) * f;
    }
    __syncthreads();
    const int n0 = 8 * wp;
    uint32_t b1h[2], b1l[2], b2h[2], b2l[2];
    frag_b_split<T, kSplit>([&](int k, int n) { return stage[k * SP + n0 + n]; }, b1h, b1l);
    frag_b_split<T, kSplit>([&](int k, int n) { return stage[(16 + k) * SP + n0 + n]; }, b2h, b2l);
    for (int J = 0; J < I; ++J) {
      uint32_t a1h[4], a1l[4], a2h[4], a2l[4];
      frag_a_split<T, kSplit>([&](int r, int k) { return W1[(b + k) * ldw + 16 * J + r]; }, a1h, a1l);
      frag_a_split<T, kSplit>([&](int r, int k) { return W2[(b + k) * ldw + 16 * J + r]; }, a2h, a2l);
      float c[4] = {};
      mma_split3<T, kSplit>(c, a1h, a1l, b1h, b1l);
      mma_split3<T, kSplit>(c, a2h, a2l, b2h, b2l);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * J + mma::acc_row(e), d = n0 + mma::acc_col(e);
        out[r * KS + d] += c[e] * exp2_ftz(G[b * KS + d] - G[r * KS + d]);
      }
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule
