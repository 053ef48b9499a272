// Warp-level products shared by the KDA chunked stages, on the mma.sync helpers of
// chunked_mma.cuh. Operands are split x = hi + lo (both in T, see chunked_prepare_compact.cuh); a
// product of two split operands is hi hi + hi lo + lo hi (the lo lo term is below fp32 rounding of
// the sum). Warp wp = threadIdx.x / 32 owns result rows [16 wp, 16 wp + 16); acc[nt] is the 16 x 8
// accumulator tile of columns [8 nt, 8 nt + 8).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"  // split_pair
#include "chunked_output.cuh"  // store_split
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule::kda_mma {

// Fragments by ldmatrix (one .x4 instead of 4 - 16 scalar shared loads; chunked_mma_ldmatrix.cuh):
// lane l passes row l % 8 of 8 x 8 tile l / 8. Rows must start 16-byte aligned (ld a multiple of 8
// elements, 16-byte aligned bases, offsets multiples of 8).
//   ldm_a:       A[r][kk] = X[r0 + r][k0 + kk]            tiles (r 0-7, kk 0-7), (r 8-15, kk 0-7),
//                                                          (r 0-7, kk 8-15), (r 8-15, kk 8-15)
//   ldm_a_trans: A[r][kk] = X[k0 + kk][r0 + r] (X^T)       the same tiles read transposed
//   ldm_b_pair:  B[kk][n] = Z[k0 + kk][n0 + n] for the two 8-column tiles n0, n0 + 8: b[0..1] the
//                first tile's fragment, b[2..3] the second's
template <typename T>
__device__ __forceinline__ void ldm_a(const T* X, int ld, int r0, int k0, uint32_t (&a)[4]) {
  const int l = threadIdx.x & 31, t = l >> 3;
  mma::ldmatrix_x4<false>(a, X + (r0 + (l & 7) + 8 * (t & 1)) * ld + k0 + 8 * (t >> 1));
}
template <typename T>
__device__ __forceinline__ void ldm_a_trans(const T* X, int ld, int r0, int k0, uint32_t (&a)[4]) {
  const int l = threadIdx.x & 31, t = l >> 3;
  mma::ldmatrix_x4<true>(a, X + (k0 + (l & 7) + 8 * (t >> 1)) * ld + r0 + 8 * (t & 1));
}
template <typename T>
__device__ __forceinline__ void ldm_b_pair(const T* Z, int ld, int k0, int n0, uint32_t (&b)[4]) {
  const int l = threadIdx.x & 31, t = l >> 3;
  mma::ldmatrix_x4<true>(b, Z + (k0 + (l & 7) + 8 * (t & 1)) * ld + n0 + 8 * (t >> 1));
}

// acc += X[16 wp.., :kdim] Y[:kdim, col0 + 8 nt..] for a dense X (row-major, ld lda) and Y
// (row-major, ld ldb), both split; kdim a multiple of 16, NT even; fragments by ldmatrix.
template <typename T, int NT>
__device__ __forceinline__ void rows_times_split(const T* Xh, const T* Xl, int lda, const T* Yh, const T* Yl,
                                                 int ldb, int col0, int kdim, float (&acc)[NT][4]) {
  static_assert(NT % 2 == 0, "tile pairs");
  const int wp = threadIdx.x / 32;
  for (int kk = 0; kk < kdim; kk += 16) {
    uint32_t ah[4], al[4];
    ldm_a(Xh, lda, 16 * wp, kk, ah);
    ldm_a(Xl, lda, 16 * wp, kk, al);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bh[4], bl[4];
      ldm_b_pair(Yh, ldb, kk, col0 + 16 * np, bh);
      ldm_b_pair(Yl, ldb, kk, col0 + 16 * np, bl);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b_h[2] = {bh[2 * h], bh[2 * h + 1]}, b_l[2] = {bl[2 * h], bl[2 * h + 1]};
        mma::mma16816<T>(acc[2 * np + h], ah, b_h);
        mma::mma16816<T>(acc[2 * np + h], al, b_h);
        mma::mma16816<T>(acc[2 * np + h], ah, b_l);
      }
    }
  }
}

// acc += Xs[0..16, :kdim] Ys[n0..n0 + 8, :kdim]^T for one 16 x 8 tile (Xs, Ys row-major with ld,
// both split); the calling warp's rows are Xs's 16 rows whatever its index.
template <typename T>
__device__ __forceinline__ void rows_times_rows_split(const T* Xh, const T* Xl, const T* Yh, const T* Yl, int ld,
                                                      int n0, int kdim, float (&acc)[4]) {
  for (int kk = 0; kk < kdim; kk += 16) {
    uint32_t ah[4], al[4], bh[2], bl[2];
    mma::frag_a(Xh, ld, 0, kk, ah);
    mma::frag_a(Xl, ld, 0, kk, al);
    mma::frag_b_trans(Yh, ld, kk, n0, bh);
    mma::frag_b_trans(Yl, ld, kk, n0, bl);
    mma::mma16816<T>(acc, ah, bh);
    mma::mma16816<T>(acc, al, bh);
    mma::mma16816<T>(acc, ah, bl);
  }
}

// acc += Lw[16 wp.., :] Y[:, col0 + 8 nt..] for a 64 x 64 lower-triangular Lw (row-major, split):
// column blocks kb <= wp only. Y split (Yl non-null) or exact in T (Yl null: two mmas). NT even;
// fragments by ldmatrix.
template <typename T, int NT>
__device__ __forceinline__ void lower_times_split(const T* Lh, const T* Ll, int lda, const T* Yh, const T* Yl,
                                                  int ldb, int col0, float (&acc)[NT][4]) {
  static_assert(NT % 2 == 0, "tile pairs");
  const int wp = threadIdx.x / 32;
  for (int kb = 0; kb <= wp; ++kb) {
    uint32_t ah[4], al[4];
    ldm_a(Lh, lda, 16 * wp, 16 * kb, ah);
    ldm_a(Ll, lda, 16 * wp, 16 * kb, al);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bh[4];
      ldm_b_pair(Yh, ldb, 16 * kb, col0 + 16 * np, bh);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b_h[2] = {bh[2 * h], bh[2 * h + 1]};
        mma::mma16816<T>(acc[2 * np + h], ah, b_h);
        mma::mma16816<T>(acc[2 * np + h], al, b_h);
      }
      if (Yl) {
        uint32_t bl[4];
        ldm_b_pair(Yl, ldb, 16 * kb, col0 + 16 * np, bl);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t b_l[2] = {bl[2 * h], bl[2 * h + 1]};
          mma::mma16816<T>(acc[2 * np + h], ah, b_l);
        }
      }
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule::kda_mma

namespace flashgrad::cuda_detail::delta_rule::kda_mma {

// Bytes of `stage` that contract_rows needs for NB = 8 NT rows of Y.
template <typename T, int NT>
constexpr int64_t contract_stage_bytes() {
  return static_cast<int64_t>(sizeof(T)) * 2 * (kChunkSize + 8 * NT) * 24;
}

// acc[nt] += sum_{c < ncols} x(16 wp + row, c) y(8 nt + n, c): the product X Y^T of a 64 x ncols X
// and an (8 NT) x ncols Y given by loaders (float values; rows of X past the chunk must read 0),
// on tensor cores 16 columns at a time through `stage` (shared memory, contract_stage_bytes).
// XSPLIT / YSPLIT: split the operand hi + lo (values exact in T need no lo part). ncols is a
// multiple of 16. Every thread of the block calls it; it begins and ends with a barrier.
// The next piece's values are loaded into registers before the current piece's mmas, so their
// (global memory) latency overlaps the mmas and the barrier. NTHR = 128: warp w owns rows
// [16 w, +16) and every tile; NTHR = 256: warp w owns rows [16 (w % 4), +16) and the tiles of half
// w / 4 of the NT (kda_tile_owned); the other tiles of acc stay untouched.
template <typename T, int NT, bool XSPLIT, bool YSPLIT, int NTHR = kChunkThreads, typename XF, typename YF>
__device__ __forceinline__ void contract_rows(XF&& x, YF&& y, int64_t ncols, T* stage, float (&acc)[NT][4]) {
  constexpr int C = kChunkSize, NB = 8 * NT, LD = 24;  // LD: 8 fragment rows hit distinct banks
  constexpr int XPER = C * 16 / NTHR, YPER = NB * 16 / NTHR;  // values per thread
  static_assert(C * 16 % NTHR == 0 && NB * 16 % NTHR == 0, "whole passes");
  static_assert(NTHR == 128 || (NTHR == 256 && NT % 2 == 0), "4 or 8 warps");
  T* xh = stage;
  T* xl = xh + C * LD;
  T* yh = xl + C * LD;
  T* yl = yh + NB * LD;
  const int tid = threadIdx.x, wp = (tid / 32) % 4, half = tid / 128;
  float xv[XPER], yv[YPER];
  auto fetch = [&](int64_t c0) {  // element e = tid + NTHR m: row e / 16, column c0 + e % 16
#pragma unroll
    for (int m = 0; m < XPER; ++m) xv[m] = x((tid + NTHR * m) / 16, c0 + (tid + NTHR * m) % 16);
#pragma unroll
    for (int m = 0; m < YPER; ++m) yv[m] = y((tid + NTHR * m) / 16, c0 + (tid + NTHR * m) % 16);
  };
  fetch(0);
  for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
    __syncthreads();  // the previous piece's readers are done
#pragma unroll
    for (int m = 0; m < XPER; ++m) {
      const int e = tid + NTHR * m, at = (e / 16) * LD + e % 16;
      if (XSPLIT)
        store_split<T>(xv[m], &xh[at], &xl[at]);
      else
        xh[at] = from_f<T>(xv[m]);
    }
#pragma unroll
    for (int m = 0; m < YPER; ++m) {
      const int e = tid + NTHR * m, at = (e / 16) * LD + e % 16;
      if (YSPLIT)
        store_split<T>(yv[m], &yh[at], &yl[at]);
      else
        yh[at] = from_f<T>(yv[m]);
    }
    __syncthreads();
    if (c0 + 16 < ncols) fetch(c0 + 16);
    uint32_t ah[4], al[4];
    mma::frag_a(xh, LD, 16 * wp, 0, ah);
    if (XSPLIT) mma::frag_a(xl, LD, 16 * wp, 0, al);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (NTHR == 256 && nt / (NT / 2) != half) continue;
      uint32_t bh[2], bl[2];
      mma::frag_b_trans(yh, LD, 0, 8 * nt, bh);
      mma::mma16816<T>(acc[nt], ah, bh);
      if (XSPLIT) mma::mma16816<T>(acc[nt], al, bh);
      if (YSPLIT) {
        mma::frag_b_trans(yl, LD, 0, 8 * nt, bl);
        mma::mma16816<T>(acc[nt], ah, bl);
      }
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule::kda_mma

namespace flashgrad::cuda_detail::delta_rule {

// Block-wide copy loop with batched loads: for e = threadIdx.x + NTHR m (m < N / NTHR), calls
// put(e, get(e)), issuing 16 (or all, if fewer) gets before their puts. A plain
// `for (e...) put(e, get(e))` loop can wait one global-memory latency per iteration (the next load
// is not issued before the previous shared store); the H200 profile of the first KDA stages fits
// that (stage 3: 1.5 ms for 8192 blocks of ~130 such iterations). Here a batch's loads are in
// flight together.
// MAXB: loads in flight per thread (registers) per batch.
template <int N, int NTHR = kChunkThreads, int MAXB = 16, typename Get, typename Put>
__device__ __forceinline__ void batched_copy(Get&& get, Put&& put) {
  static_assert(N % NTHR == 0, "whole passes");
  constexpr int kIters = N / NTHR, kBatch = kIters < MAXB ? kIters : MAXB;
  static_assert(kIters % kBatch == 0, "whole batches");
  const int tid = threadIdx.x;
#pragma unroll 1
  for (int m0 = 0; m0 < kIters; m0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = get(tid + NTHR * (m0 + u));
#pragma unroll
    for (int u = 0; u < kBatch; ++u) put(tid + NTHR * (m0 + u), v[u]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule {

// for_each_key_row (chunked_rows.cuh) with its global loads batched: for every row r < 64 of the
// chunk and channel d < KMAX, emit(r, d, x, y) with x = q/k[b, t0 + r, head, d] (0 past L; L2-
// normalized when `l2norm`) and y = aux(r, d), a second per-element load (e.g. the gate G; aux
// handles rows past L itself). Same thread layout as for_each_key_row (KMAX / 8 lanes per row,
// 8 consecutive elements each, 128 threads), but the loads of up to 4 of its passes (x and aux)
// are issued before any of them is used: a sequence-serial stage (2, B1) pays 2 memory latencies
// per call instead of 2 per pass.
// kda_key_rows_from: the same run by threads [tid0, tid0 + 128) of a larger block.
template <typename T, int KMAX, typename Aux, typename Emit>
__device__ __forceinline__ void kda_key_rows_from(int tid0, const View& x, const ChunkInfo& ci, int64_t head,
                                                  bool l2norm, Aux&& aux, Emit&& emit) {
  constexpr int kLanesPerRow = KMAX / 8, kRowsPerPass = kChunkThreads / kLanesPerRow;
  constexpr int kPasses = kChunkSize / kRowsPerPass, kBatch = kPasses < 4 ? kPasses : 4;
  const int t = static_cast<int>(threadIdx.x) - tid0, lr = t / kLanesPerRow, seg = t % kLanesPerRow;
#pragma unroll 1
  for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
    float e[kBatch][8], y[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int r = (p0 + b) * kRowsPerPass + lr;
      const bool ok = r < ci.len;
      const int64_t base = ok ? off3(x, ci.b, ci.t0 + r, head) + seg * 8 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        e[b][i] = ok ? load_elem<T>(x, base + i) : 0.f;
        y[b][i] = aux(r, seg * 8 + i);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += e[b][i] * e[b][i];
      const float rstd = l2norm ? 1.0f / sqrtf(group_sum<kLanesPerRow>(ss) + kL2NormEps) : 1.f;
      const int r = (p0 + b) * kRowsPerPass + lr;
#pragma unroll
      for (int i = 0; i < 8; ++i) emit(r, seg * 8 + i, e[b][i] * rstd, y[b][i]);
    }
  }
}

template <typename T, int KMAX, typename Aux, typename Emit>
__device__ __forceinline__ void kda_key_rows(const View& x, const ChunkInfo& ci, int64_t head, bool l2norm,
                                             Aux&& aux, Emit&& emit) {
  kda_key_rows_from<T, KMAX>(0, x, ci, head, l2norm, aux, emit);
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule::kda_mma {

// acc[nt] += sum_{kk in [k0, k1)} x(m0 + i, kk) y(kk, n0 + 8 nt + j) for the calling warp's 16 x 8
// tiles (i < 16, j < 8): fp32 operands read through loaders (shared memory, any layout) and split
// x = hi + lo in registers (mma::split_pair), three mmas per step (hi hi + lo hi + hi lo: close to
// an fp32 product). No staging copy and no barrier: the chunk-local 64 x 64 products and the
// decayed sums' cross-sub-chunk parts of B2 (which were per-element fp32 loops) run on it.
// k0, k1 multiples of 16. Fragment elements (chunked_mma.cuh): A (grp, 2 tig + {0, 1}),
// (grp + 8, ..), (grp, 2 tig + 8 + {0, 1}), (grp + 8, ..); B (2 tig + {0, 1}, grp), (2 tig + 8 + {0, 1}, grp).
template <typename T, int NT, typename XF, typename YF>
__device__ __forceinline__ void warp_fp32_product(XF&& x, YF&& y, int m0, int n0, int k0, int k1,
                                                  float (&acc)[NT][4]) {
  const int g = mma::grp(), t2 = 2 * mma::tig();
  for (int kk = k0; kk < k1; kk += 16) {
    uint32_t ah[4], al[4];
    mma::split_pair<T>(x(m0 + g, kk + t2), x(m0 + g, kk + t2 + 1), ah[0], al[0]);
    mma::split_pair<T>(x(m0 + g + 8, kk + t2), x(m0 + g + 8, kk + t2 + 1), ah[1], al[1]);
    mma::split_pair<T>(x(m0 + g, kk + t2 + 8), x(m0 + g, kk + t2 + 9), ah[2], al[2]);
    mma::split_pair<T>(x(m0 + g + 8, kk + t2 + 8), x(m0 + g + 8, kk + t2 + 9), ah[3], al[3]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = n0 + 8 * nt + g;
      uint32_t bh[2], bl[2];
      mma::split_pair<T>(y(kk + t2, n), y(kk + t2 + 1, n), bh[0], bl[0]);
      mma::split_pair<T>(y(kk + t2 + 8, n), y(kk + t2 + 9, n), bh[1], bl[1]);
      mma::mma16816<T>(acc[nt], ah, bh);
      mma::mma16816<T>(acc[nt], al, bh);
      mma::mma16816<T>(acc[nt], ah, bl);
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule::kda_mma

namespace flashgrad::cuda_detail::delta_rule::kda_mma {

// Fragment registers straight from global memory (the B2 products below): elements c, c + 1 of a
// row at p (row masked by ok: 0 past the chunk).
//   exact: a 16-bit operand (E == T) as one register of two T; PAIRS: one 32-bit load (p 4-byte
//          aligned), else two element loads packed (exact: the values are T);
//   split: an fp32 operand, one float2 load (p 8-byte aligned), split hi + lo.
template <typename T, bool PAIRS, typename E>
__device__ __forceinline__ uint32_t pair_exact(const E* p, bool ok) {
  static_assert(std::is_same_v<E, T>, "16-bit operand of the mma's type");
  if constexpr (PAIRS)
    return ok ? *reinterpret_cast<const uint32_t*>(p) : 0u;
  else
    return ok ? mma::pack_floats<T>(to_f<T>(p[0]), to_f<T>(p[1])) : 0u;
}
template <typename T>
__device__ __forceinline__ void pair_split(const float* p, bool ok, uint32_t& hi, uint32_t& lo) {
  const float2 v = ok ? *reinterpret_cast<const float2*>(p) : make_float2(0.f, 0.f);
  mma::split_pair<T>(v.x, v.y, hi, lo);
}

// out[r * KMAX + d] = sign * sum_{c < V} X[r][c] S[d][c] for r < 64, d < KMAX: a V-contracted
// product of one chunk's rows X (row r at x + r * xstride, elements E contiguous in c; rows r >= L
// read as 0) with an fp32 K x V state S (h_c or dh_{c+1}, global, row-major). Computed transposed,
// out^T = S X^T, so that each warp loads its own 16 state rows once, straight into A fragments
// (float2 loads, split hi + lo in registers), and X into B fragments (E = T: exact, two mmas, one
// 32-bit load per register with PAIRS; E = float: float2 loads split, three mmas): no staging
// copy and no barrier (B2's contract_rows pieces had two each). Warp w (8 warps): channels
// [16 (w % (KMAX / 16)), +16), row tiles [NT (w / (KMAX / 16)), +NT) with NT = 8 (KMAX = 128) or
// 4 (KMAX = 64). V a multiple of 16. The caller barriers before others read `out` (shared
// memory, [64][KMAX]).
//
// With `S2` (another K x V state, same layout), the call also returns in `dot` the row dots
// <S[d], S2[d]> over all V columns for this lane's channels d0 + grp and d0 + grp + 8 (dot[0],
// dot[1]; valid in lanes with tig == 0 of the warps with nt0 == 0, 0 elsewhere): B2's
// <h_c[d], dh_{c+1}[d]> on the loads of its X pass instead of a separate pass over both states.
template <typename T, int KMAX, bool PAIRS, typename E>
__device__ __forceinline__ void state_times_rows(const float* S, int64_t V, const E* x, int64_t xstride, int L,
                                                 float sign, float* out, const float* S2 = nullptr,
                                                 float* dot = nullptr) {
  constexpr int kStrips = KMAX / 16, NT = 8 * kStrips / 8;  // 8 warps over kStrips x (8 / NT)
  constexpr bool XS = std::is_same_v<E, float>;
  static_assert(KMAX == 64 || KMAX == 128, "K 64 or 128");
  const int w = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  const int d0 = 16 * (w % kStrips), nt0 = NT * (w / kStrips);
  const float* s0 = S + static_cast<int64_t>(d0 + g) * V + t2;  // rows d0 + g and d0 + g + 8
  const float* s1 = s0 + 8 * V;
  const E* xr[NT];  // this lane's B-fragment row of each tile (row 8 (nt0 + nt) + g; row 0 past L)
  bool xok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = 8 * (nt0 + nt) + g;
    xr[nt] = x + (r < L ? r : 0) * xstride + t2;
    xok[nt] = r < L;
  }
  // Raw operands of one 16-column step, loaded one step ahead (in flight during the current step's
  // mmas): the state's four float2, X's pairs (32-bit words, or float2 when split).
  using XPair = std::conditional_t<XS, float2, uint32_t>;
  float2 sv[4], tv[4];
  XPair xv[NT][2];
  const bool with_dot = S2 != nullptr;  // block-uniform
  const float* u0 = with_dot ? S2 + (s0 - S) : nullptr;
  const float* u1 = with_dot ? S2 + (s1 - S) : nullptr;
  float dsum[2] = {0.f, 0.f};
  auto fetch = [&](int64_t c) {
    sv[0] = *reinterpret_cast<const float2*>(s0 + c), sv[1] = *reinterpret_cast<const float2*>(s1 + c);
    sv[2] = *reinterpret_cast<const float2*>(s0 + c + 8), sv[3] = *reinterpret_cast<const float2*>(s1 + c + 8);
    if (with_dot) {
      tv[0] = *reinterpret_cast<const float2*>(u0 + c), tv[1] = *reinterpret_cast<const float2*>(u1 + c);
      tv[2] = *reinterpret_cast<const float2*>(u0 + c + 8), tv[3] = *reinterpret_cast<const float2*>(u1 + c + 8);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (XS)
          xv[nt][h] = xok[nt] ? *reinterpret_cast<const float2*>(xr[nt] + c + 8 * h) : make_float2(0.f, 0.f);
        else
          xv[nt][h] = pair_exact<T, PAIRS>(xr[nt] + c + 8 * h, xok[nt]);
      }
  };
  float acc[NT][4] = {};
  fetch(0);
#pragma unroll 1
  for (int64_t c = 0; c < V; c += 16) {
    uint32_t ah[4], al[4], bh[NT][2], bl[NT][2];
    // A (16 x 16): (g, t2..), (g + 8, t2..), (g, t2 + 8..), (g + 8, t2 + 8..); B (16 x 8): rows
    // t2.., t2 + 8.. of column g.
#pragma unroll
    for (int i = 0; i < 4; ++i) mma::split_pair<T>(sv[i].x, sv[i].y, ah[i], al[i]);
    if (with_dot)  // rows grp (i = 0, 2) and grp + 8 (i = 1, 3)
#pragma unroll
      for (int i = 0; i < 4; ++i) dsum[i & 1] += sv[i].x * tv[i].x + sv[i].y * tv[i].y;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (XS)
          mma::split_pair<T>(xv[nt][h].x, xv[nt][h].y, bh[nt][h], bl[nt][h]);
        else
          bh[nt][h] = xv[nt][h];
      }
    if (c + 16 < V) fetch(c + 16);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma::mma16816<T>(acc[nt], ah, bh[nt]);
      mma::mma16816<T>(acc[nt], al, bh[nt]);
      if constexpr (XS) mma::mma16816<T>(acc[nt], ah, bl[nt]);
    }
  }
  if (with_dot) {  // over the 4 lanes (tig) of a row
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 1);
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 2);
      dot[i] = nt0 == 0 && mma::tig() == 0 ? dsum[i] : 0.f;
    }
  }
  // acc[nt][e] is out^T at (channel d0 + acc_row(e), row 8 (nt0 + nt) + acc_col(e)).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[(8 * (nt0 + nt) + mma::acc_col(e)) * KMAX + d0 + mma::acc_row(e)] = sign * acc[nt][e];
}

// acc[nt] += sum_{c < ncols} X[16 rs + i][c] Y[32 hf + 8 nt + j][c]: the calling warp's 16 x 32
// block (rs = w % 4, hf = w / 4 of 8 warps) of X Y^T for two 64-row operands in global memory
// (row r at x + r * xs / y + r * ys, elements XE / YE contiguous; rows >= L read as 0), fragments
// loaded straight from global memory: 16-bit operands exact (PAIRS: 32-bit loads), fp32 ones
// split hi + lo in registers (one mma per step when both are exact, two when one is split). No
// staging, no barrier.
template <typename T, bool PAIRS, typename XE, typename YE>
__device__ __forceinline__ void rows_times_rows_global(const XE* x, int64_t xs, const YE* y, int64_t ys,
                                                       int64_t ncols, int L, float (&acc)[4][4]) {
  constexpr bool XS = std::is_same_v<XE, float>, YS = std::is_same_v<YE, float>;
  static_assert(!(XS && YS), "at most one split operand");
  const int w = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig(), rs = w % 4, hf = w / 4;
  const int ra = 16 * rs + g, rb = ra + 8;
  const XE* xa = x + (ra < L ? ra : 0) * xs + t2;
  const XE* xb = x + (rb < L ? rb : 0) * xs + t2;
  const bool oka = ra < L, okb = rb < L;
  const YE* yr[4];
  bool yok[4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int n = 32 * hf + 8 * nt + g;
    yr[nt] = y + (n < L ? n : 0) * ys + t2;
    yok[nt] = n < L;
  }
  // Raw operands of one 16-column step, loaded one step ahead (in flight during the current
  // step's mmas): 32-bit words of exact pairs, float2 of split ones.
  using XPair = std::conditional_t<XS, float2, uint32_t>;
  using YPair = std::conditional_t<YS, float2, uint32_t>;
  XPair xv[4];  // (ra, c), (rb, c), (ra, c + 8), (rb, c + 8)
  YPair yv[4][2];
  auto fetch = [&](int64_t c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const XE* p = (i & 1 ? xb : xa) + c + 8 * (i >> 1);
      const bool ok = i & 1 ? okb : oka;
      if constexpr (XS)
        xv[i] = ok ? *reinterpret_cast<const float2*>(p) : make_float2(0.f, 0.f);
      else
        xv[i] = pair_exact<T, PAIRS>(p, ok);
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (YS)
          yv[nt][h] = yok[nt] ? *reinterpret_cast<const float2*>(yr[nt] + c + 8 * h) : make_float2(0.f, 0.f);
        else
          yv[nt][h] = pair_exact<T, PAIRS>(yr[nt] + c + 8 * h, yok[nt]);
      }
  };
  fetch(0);
#pragma unroll 1
  for (int64_t c = 0; c < ncols; c += 16) {
    uint32_t ah[4], al[4], bh[4][2], bl[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (XS)
        mma::split_pair<T>(xv[i].x, xv[i].y, ah[i], al[i]);
      else
        ah[i] = xv[i];
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (YS)
          mma::split_pair<T>(yv[nt][h].x, yv[nt][h].y, bh[nt][h], bl[nt][h]);
        else
          bh[nt][h] = yv[nt][h];
      }
    if (c + 16 < ncols) fetch(c + 16);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      mma::mma16816<T>(acc[nt], ah, bh[nt]);
      if constexpr (XS) mma::mma16816<T>(acc[nt], al, bh[nt]);
      if constexpr (YS) mma::mma16816<T>(acc[nt], ah, bl[nt]);
    }
  }
}

// The B2 epilogue of dUb for a warp's 16 x 32 tile (rows 16 rs + [0, 16) of the chunk, columns
// col + n0 + [0, 32) of V; accumulator layout): dv = beta_j dUb_j for rows j < L into dv's rows (HVV
// elements apart, dv0 at row 0), and v . dUb summed over this thread's columns of its two rows (grp,
// grp + 8), then over the 4 lanes of a row (xor 1, 2): one shared atomic per row and lane quad into
// dbeta. vv holds v at the accumulator's elements, 0 past L. (kda_grads_kernel and both local kernels.)
__device__ __forceinline__ void kda_store_dv_add_dbeta(float* dv0, int64_t HVV, int64_t col, int rs, int n0, int L,
                                                       const float* beta, const float (&vv)[4][4],
                                                       const float (&acc)[4][4], float* dbeta) {
  float vd[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 16 * rs + mma::acc_row(e), n = n0 + 8 * nt + mma::acc_col(e);
      if (j < L) dv0[j * HVV + col + n] = beta[j] * acc[nt][e];
      vd[e >> 1] += vv[nt][e] * acc[nt][e];  // vv is 0 past L
    }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    vd[h2] += __shfl_xor_sync(0xffffffffu, vd[h2], 1);
    vd[h2] += __shfl_xor_sync(0xffffffffu, vd[h2], 2);
    const int j = 16 * rs + mma::grp() + 8 * h2;
    if (mma::tig() == 0 && j < L) atomicAdd(&dbeta[j], vd[h2]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule::kda_mma
