// Warp-level products shared by the KDA chunked stages, on the mma.sync helpers of
// chunked_mma.cuh. Operands are split x = hi + lo (both in T, see chunked_prepare.cuh); a product
// of two split operands is hi hi + hi lo + lo hi (the lo lo term is below fp32 rounding of the
// sum). Warp wp = threadIdx.x / 32 owns result rows [16 wp, 16 wp + 16); acc[nt] is the 16 x 8
// accumulator tile of columns [8 nt, 8 nt + 8).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_output.cuh"  // store_split
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule::kda_mma {

// acc += X[16 wp.., :kdim] Y[:kdim, col0 + 8 nt..] for a dense X (row-major, ld lda) and Y
// (row-major, ld ldb), both split; kdim a multiple of 16.
template <typename T, int NT>
__device__ __forceinline__ void rows_times_split(const T* Xh, const T* Xl, int lda, const T* Yh, const T* Yl,
                                                 int ldb, int col0, int kdim, float (&acc)[NT][4]) {
  const int wp = threadIdx.x / 32;
  for (int kk = 0; kk < kdim; kk += 16) {
    uint32_t ah[4], al[4];
    mma::frag_a(Xh, lda, 16 * wp, kk, ah);
    mma::frag_a(Xl, lda, 16 * wp, kk, al);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bh[2], bl[2];
      mma::frag_b(Yh, ldb, kk, col0 + 8 * nt, bh);
      mma::frag_b(Yl, ldb, kk, col0 + 8 * nt, bl);
      mma::mma16816<T>(acc[nt], ah, bh);
      mma::mma16816<T>(acc[nt], al, bh);
      mma::mma16816<T>(acc[nt], ah, bl);
    }
  }
}

// acc += Lw[16 wp.., :] Y[:, col0 + 8 nt..] for a 64 x 64 lower-triangular Lw (row-major, split):
// column blocks kb <= wp only. Y split (Yl non-null) or exact in T (Yl null: two mmas).
template <typename T, int NT>
__device__ __forceinline__ void lower_times_split(const T* Lh, const T* Ll, int lda, const T* Yh, const T* Yl,
                                                  int ldb, int col0, float (&acc)[NT][4]) {
  const int wp = threadIdx.x / 32;
  for (int kb = 0; kb <= wp; ++kb) {
    uint32_t ah[4], al[4];
    mma::frag_a(Lh, lda, 16 * wp, 16 * kb, ah);
    mma::frag_a(Ll, lda, 16 * wp, 16 * kb, al);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bh[2];
      mma::frag_b(Yh, ldb, 16 * kb, col0 + 8 * nt, bh);
      mma::mma16816<T>(acc[nt], ah, bh);
      mma::mma16816<T>(acc[nt], al, bh);
      if (Yl) {
        uint32_t bl[2];
        mma::frag_b(Yl, ldb, 16 * kb, col0 + 8 * nt, bl);
        mma::mma16816<T>(acc[nt], ah, bl);
      }
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule::kda_mma
