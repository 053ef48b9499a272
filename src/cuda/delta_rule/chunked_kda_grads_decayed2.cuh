// The per-channel decayed sums of the KDA B2 local kernel, session 12 form (helper kdaloc;
// chunked_kda_grads_local2.cuh, the default since session 12): the same sums, the same three
// parts and the same rounded tensor-core operands as kda_rows_pair / kda_cols_sum
// (chunked_kda_grads_decayed.cuh, which defines the sums and the accuracy argument) with kSplit =
// false, so that the results differ from theirs at most in fp32 summation order. What changes is how
// the operands reach the tensor cores and how the staging loops index (SASS of the session-10 form:
// ~17 instructions per staged element, of which ~11 were signed divisions and remainders of the loop
// index; every A fragment 8 scalar loads + 4 conversions from the fp32 W tiles, per slice):
//   - W1 = dP and W2 = dM come as 16-bit copies (rounded once to T, as round_pair rounded them at each
//     fragment load) in [64][kKdaHalfPitch] tiles, read by ldmatrix (.trans where the product takes
//     W^T): one instruction per A fragment;
//   - part 1 (fp32, inside the 8-row halves) reads W from compact copies of the halves' 8 x 8 diagonal
//     blocks, Wd[h * 64 + i * 8 + j] = W[8 h + i][8 h + j] (the only elements part 1 reads; rows of
//     32 bytes, so a row's 8 values are two 16-byte broadcast loads);
//   - staged operands are rounded to T where they are written (the value the fragment load rounded
//     before) into [rows][kKdaHalfPitch] T tiles, read by ldmatrix.trans (B fragments, and the cols
//     sum's transposed A);
//   - the staging loops give warp w rows w, w + 8, .. and lane l the channel pair 2 l, 2 l + 1: fixed
//     offsets, float2 loads of G / y / x, the reference row's G loaded once, one packed 4-byte store.
// The fp32 slice tiles (G, y / x, out) are swizzled by row (kda_swz_at, chunked_kda_grads_slices.cuh):
// the post-scales' read-modify-writes in fragment layout (8 rows x 4 column pairs per warp) hit one bank
// per row pair at pitch 64 (ncu, run 12.1: 54% of the shared wavefronts excessive, ~20% of the stall
// samples on those lines); swizzled and by float2 they are conflict-free, and the row-wise passes
// (consecutive channels of one row) stay so.
// Pitch 72 T (144 bytes = 36 banks) puts the 8 rows of every ldmatrix phase (8 rows x 16 bytes) in
// distinct banks, and keeps each row 16-byte aligned. Contract as the session-10 functions': inputs
// written and a barrier before the call, previous outputs read; the call ends with a barrier.
#pragma once

#include "chunked_kda_grads_decayed.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kKdaHalfPitch = kChunkSize + 8;                         // 72 T per row of the 16-bit tiles
constexpr int kKdaStage2Rows = 48;                                     // the rows sum's part 3 at I = 3
constexpr int kKdaDiagFloats = kChunkSize * 8;                         // 8 halves x 8 x 8
static_assert(kKdaSplitThreads == 256 && kKdaSliceK == 64, "8 warps; lane l owns channels 2 l, 2 l + 1");

// ldmatrix of two 8 x 8 tiles (lanes 16..31 repeat lanes 0..15's rows, so registers 2, 3 repeat 0, 1).
template <bool kTrans>
__device__ __forceinline__ void kda_ldm_x2(uint32_t (&r)[2], const void* row_addr) {
  uint32_t q[4];
  mma::ldmatrix_x4<kTrans>(q, row_addr);
  r[0] = q[0], r[1] = q[1];
}

// stage[row * 72 + 2 l + {0, 1}] = T(a.x * e.x), T(a.y * e.y): one staged pair, rounded as pack_floats.
template <typename T>
__device__ __forceinline__ void kda_stage_pair(T* stage, int row, int lane, float2 a, float2 e) {
  *reinterpret_cast<uint32_t*>(stage + row * kKdaHalfPitch + 2 * lane) = mma::pack_floats<T>(a.x * e.x, a.y * e.y);
}
__device__ __forceinline__ float2 kda_ld2(const float* tile, int r, int lane) {
  return *reinterpret_cast<const float2*>(tile + kda_swz_at(r, 2 * lane));
}
// The pair (r, d), (r, d + 1) (d even) of a swizzled fp32 slice tile.
__device__ __forceinline__ float2& kda_at2(float* tile, int r, int d) {
  return *reinterpret_cast<float2*>(tile + kda_swz_at(r, d));
}
__device__ __forceinline__ float2 kda_get2(const float* tile, int r, int d) {
  return *reinterpret_cast<const float2*>(tile + kda_swz_at(r, d));
}
// exp2 of (G_a - G_b) for a channel pair.
__device__ __forceinline__ float2 exp2_ftz_diff(float2 a, float2 b) {
  return make_float2(exp2_ftz(a.x - b.x), exp2_ftz(a.y - b.y));
}

// aq / bm (W1 = dP, W2 = dM, y = k): see kda_rows_pair. y: the k tile [64][64] fp32.
template <typename T>
__device__ __forceinline__ void kda_rows_pair2(const T* W1h, const T* W2h, const float* W1d, const float* W2d,
                                               const float* y, const float* G, float* out1, float* out2, T* stage) {
  constexpr int KS = kKdaSliceK, HP = kKdaHalfPitch;
  const int tid = threadIdx.x, wp = tid / 32, lane = tid % 32, g = mma::grp(), t2 = 2 * mma::tig();
  // 1. Inside the 8-row half: item (channel d, half h), 2 per thread (h = tid / 64 and + 4).
#pragma unroll 1
  for (int it = tid; it < 8 * KS; it += kKdaSplitThreads) {
    const int d = it % KS, h = it / KS, r0 = 8 * h;
    const float* w1 = W1d + 64 * h;
    const float* w2 = W2d + 64 * h;
    float gg[8], s1[8], s2[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) gg[i] = G[kda_swz_at(r0 + i, d)], s1[i] = 0.f, s2[i] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float yj = y[kda_swz_at(r0 + j, d)];
#pragma unroll
      for (int i = j; i < 8; ++i) {
        const float t = yj * exp2_ftz(gg[i] - gg[j]);
        s1[i] += w1[8 * i + j] * t;
        if (i > j) s2[i] += w2[8 * i + j] * t;
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out1[kda_swz_at(r0 + i, d)] = s1[i], out2[kda_swz_at(r0 + i, d)] = s2[i];
  }
  // 2. Staged rows q = 8 p + w (p < 4: sub-chunk p): ys[q] = y_j o exp(G_m - G_j), j = 16 p + w,
  //    m = 16 p + 8.
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int j = 16 * p + wp, m = 16 * p + 8;
    kda_stage_pair<T>(stage, 8 * p + wp, lane, kda_ld2(y, j, lane), exp2_ftz_diff(kda_ld2(G, m, lane), kda_ld2(G, j, lane)));
  }
  __syncthreads();  // (also orders part 1's stores of out before the read-modify-writes below)
  {
    // Warp w: sub-chunk I = w / 2, channels [32 (w % 2), +32): A rows m + grp (< 8 nonzero), k < 8.
    const int I = wp / 2, m = 16 * I + 8, nq = (wp % 2) * 32;
    const uint32_t a1[4] = {mma::ld32(W1h + (m + g) * HP + 16 * I + t2), 0u, 0u, 0u};
    const uint32_t a2[4] = {mma::ld32(W2h + (m + g) * HP + 16 * I + t2), 0u, 0u, 0u};
    // B: stage rows 8 I + kk (kk < 8), 4 column tiles at once (tile nt: lanes 8 nt.. give its rows).
    uint32_t b4[4];
    mma::ldmatrix_x4<true>(b4, stage + (8 * I + (lane & 7)) * HP + nq + 8 * (lane >> 3));
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const uint32_t b[2] = {b4[nt], 0u};
      float c1[4] = {}, c2[4] = {};
      mma::mma16816<T>(c1, a1, b);
      mma::mma16816<T>(c2, a2, b);
      {  // accumulator rows grp (< 8; rows grp + 8 are the padding), columns d, d + 1
        const int r = m + g, d = nq + 8 * nt + t2;
        const float2 f = exp2_ftz_diff(kda_get2(G, r, d), kda_get2(G, m, d));
        float2& o1 = kda_at2(out1, r, d);
        float2& o2 = kda_at2(out2, r, d);
        o1.x += c1[0] * f.x, o1.y += c1[1] * f.y;
        o2.x += c2[0] * f.x, o2.y += c2[1] * f.y;
      }
    }
  }
  // 3. Later sub-chunk I (rows b + a, b = 16 I) from every earlier column j < b; Ys[j] = y_j o
  //    exp(G_b - G_j) staged in rows j (warp w: rows w + 8 p); warp w: the 8-column tile [8 w, +8).
#pragma unroll 1
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();  // the previous readers of `stage` and writers of out are done
    const float2 gb = kda_ld2(G, b, lane);
#pragma unroll 2
    for (int p = 0; p < 2 * I; ++p) {
      const int j = 8 * p + wp;
      kda_stage_pair<T>(stage, j, lane, kda_ld2(y, j, lane), exp2_ftz_diff(gb, kda_ld2(G, j, lane)));
    }
    __syncthreads();
    float c1[4] = {}, c2[4] = {};
    const int n0 = 8 * wp;
    // A rows b + (lane & 7) + 8 ((lane >> 3) & 1), columns 16 J + 8 (lane >> 4): fragments a[0..3].
    const int arow = b + (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);
    // B (.trans): stage rows 16 J + (lane & 7) + 8 ((lane >> 3) & 1), columns n0..: b[0], b[1].
    const int brow = (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll 1
    for (int J = 0; J < I; ++J) {
      uint32_t a1[4], a2[4], bb[2];
      mma::ldmatrix_x4<false>(a1, W1h + arow * HP + 16 * J + acol);
      mma::ldmatrix_x4<false>(a2, W2h + arow * HP + 16 * J + acol);
      kda_ldm_x2<true>(bb, stage + (16 * J + brow) * HP + n0);
      mma::mma16816<T>(c1, a1, bb);
      mma::mma16816<T>(c2, a2, bb);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // accumulator rows grp + 8 h, columns d, d + 1
      const int r = b + g + 8 * h, d = n0 + t2;
      const float2 f = exp2_ftz_diff(kda_get2(G, r, d), kda_get2(G, b, d));
      float2& o1 = kda_at2(out1, r, d);
      float2& o2 = kda_at2(out2, r, d);
      o1.x += c1[2 * h] * f.x, o1.y += c1[2 * h + 1] * f.y;
      o2.x += c2[2 * h] * f.x, o2.y += c2[2 * h + 1] * f.y;
    }
  }
  __syncthreads();
}

// ak + ck (W1 = dP, x1 = q, W2 = dM, x2 = beta k): see kda_cols_sum. x1: the q tile, xk: the k tile
// (x2 = beta_r k_rd, formed here as the session-10 loader formed it).
template <typename T>
__device__ __forceinline__ void kda_cols_sum2(const T* W1h, const T* W2h, const float* W1d, const float* W2d,
                                              const float* x1, const float* xk, const float* beta, const float* G,
                                              float* out, T* stage) {
  constexpr int KS = kKdaSliceK, HP = kKdaHalfPitch;
  const int tid = threadIdx.x, wp = tid / 32, lane = tid % 32, g = mma::grp(), t2 = 2 * mma::tig();
  // 1. Inside the 8-row half of r (items as in kda_rows_pair2).
#pragma unroll 1
  for (int it = tid; it < 8 * KS; it += kKdaSplitThreads) {
    const int d = it % KS, h = it / KS, r0 = 8 * h;
    const float* w1 = W1d + 64 * h;
    const float* w2 = W2d + 64 * h;
    float gg[8], s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) gg[i] = G[kda_swz_at(r0 + i, d)], s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float u1 = x1[kda_swz_at(r0 + i, d)], u2 = beta[r0 + i] * xk[kda_swz_at(r0 + i, d)];
#pragma unroll
      for (int r = 0; r <= i; ++r) {
        float w = w1[8 * i + r] * u1;
        if (r < i) w += w2[8 * i + r] * u2;
        s[r] += w * exp2_ftz(gg[i] - gg[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) out[kda_swz_at(r0 + r, d)] = s[r];
  }
  // 2. Two rounds of two sub-chunks; staged rows: sub-chunk block s (16 rows) holds x1s in rows 0..7,
  //    x2s in 8..15, xNs[ii] = xN_{m+ii} o exp(G_{m+ii} - G_m), m = 16 I + 8; warp w stages ii = w of
  //    both sub-chunks of the round. Warp w then: sub-chunk 2 round + w / 4, channels [16 (w % 4), +16).
#pragma unroll 1
  for (int round = 0; round < 2; ++round) {
    if (round) __syncthreads();  // round 0's readers of `stage` are done
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int m = 16 * (2 * round + s) + 8, i = m + wp;
      const float2 e = exp2_ftz_diff(kda_ld2(G, i, lane), kda_ld2(G, m, lane));
      const float2 kq = kda_ld2(xk, i, lane);
      const float bi = beta[i];
      kda_stage_pair<T>(stage, 16 * s + wp, lane, kda_ld2(x1, i, lane), e);
      kda_stage_pair<T>(stage, 16 * s + 8 + wp, lane, make_float2(bi * kq.x, bi * kq.y), e);
    }
    __syncthreads();  // (round 0: also orders part 1's stores of out before the updates below)
    const int sub = wp / 4, I = 2 * round + sub, m = 16 * I + 8, n0 = 16 * (wp % 4);
    const T* st = stage + sub * 16 * HP;  // k rows 0..7: x1s, 8..15: x2s
    // A[a][kk] = W1[m + kk][16 I + a] (kk < 8; a[0]), W2[m + kk - 8][16 I + a] (kk >= 8; a[2]); rows
    // a < 8 (a[1], a[3] zero). ldmatrix.trans: tile 0 = W1 rows m.., tile 1 = W2 rows m.. (columns 16 I..).
    uint32_t a[4];
    {
      uint32_t t[2];
      kda_ldm_x2<true>(t, ((lane >> 3) & 1 ? W2h : W1h) + (m + (lane & 7)) * HP + 16 * I);
      a[0] = t[0], a[1] = 0u, a[2] = t[1], a[3] = 0u;
    }
    // B (.trans), both column tiles: tile 2 nt + hf = st rows 8 hf.., columns n0 + 8 nt.
    uint32_t b4[4];
    mma::ldmatrix_x4<true>(b4, st + ((lane & 7) + 8 * ((lane >> 3) & 1)) * HP + n0 + 8 * (lane >> 4));
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const uint32_t b[2] = {b4[2 * nt], b4[2 * nt + 1]};
      float c[4] = {};
      mma::mma16816<T>(c, a, b);
      {  // rows grp (< 8), columns d, d + 1
        const int r = 16 * I + g, d = n0 + 8 * nt + t2;
        const float2 f = exp2_ftz_diff(kda_get2(G, m, d), kda_get2(G, r, d));
        float2& o = kda_at2(out, r, d);
        o.x += c[0] * f.x, o.y += c[1] * f.y;
      }
    }
  }
  // 3. Later sub-chunk I (terms i = b + ii, b = 16 I) into every earlier row r < b: staged rows ii
  //    (x1s) and 16 + ii (x2s), warp w: ii = w, w + 8; then warp w: the 8-column tile [8 w, +8).
#pragma unroll 1
  for (int I = 1; I < 4; ++I) {
    const int b = 16 * I;
    __syncthreads();  // the previous readers of `stage` and writers of out are done
    const float2 gb = kda_ld2(G, b, lane);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int ii = 8 * p + wp, i = b + ii;
      const float2 e = exp2_ftz_diff(kda_ld2(G, i, lane), gb);
      const float2 kq = kda_ld2(xk, i, lane);
      const float bi = beta[i];
      kda_stage_pair<T>(stage, ii, lane, kda_ld2(x1, i, lane), e);
      kda_stage_pair<T>(stage, 16 + ii, lane, make_float2(bi * kq.x, bi * kq.y), e);
    }
    __syncthreads();
    const int n0 = 8 * wp;
    // B (.trans): stage rows lane (0..31), columns n0..: b1 = {rows 0..7, 8..15}, b2 = {16..23, 24..31}.
    uint32_t b4[4];
    mma::ldmatrix_x4<true>(b4, stage + lane * HP + n0);
    const uint32_t b1[2] = {b4[0], b4[1]}, b2[2] = {b4[2], b4[3]};
    // A[r][kk] = W[b + kk][16 J + r] (.trans): tile t = lane / 8 from rows b + 8 (t >> 1) + (lane & 7),
    // columns 16 J + 8 (t & 1).
    const int arow = b + 8 * (lane >> 4) + (lane & 7), acol = 8 * ((lane >> 3) & 1);
#pragma unroll 1
    for (int J = 0; J < I; ++J) {
      uint32_t a1[4], a2[4];
      mma::ldmatrix_x4<true>(a1, W1h + arow * HP + 16 * J + acol);
      mma::ldmatrix_x4<true>(a2, W2h + arow * HP + 16 * J + acol);
      float c[4] = {};
      mma::mma16816<T>(c, a1, b1);
      mma::mma16816<T>(c, a2, b2);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows grp + 8 h, columns d, d + 1
        const int r = 16 * J + g + 8 * h, d = n0 + t2;
        const float2 f = exp2_ftz_diff(kda_get2(G, b, d), kda_get2(G, r, d));
        float2& o = kda_at2(out, r, d);
        o.x += c[2 * h] * f.x, o.y += c[2 * h + 1] * f.y;
      }
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule
