// ldmatrix fragment addressing of the B2 kernels' 64 x 64 products (fused chunked_grads_mma.cuh, split
// chunked_grads_split.cuh): the lane's row / column offsets, formed once per thread, and the loads and
// paired mmas that use them (lane = 4 grp + tig). a_* non-trans A fragments (rows +8 by (lane / 8) % 2,
// columns +8 by lane / 16); nb_* non-trans B fragments of two 8-column tiles and .trans A fragments;
// tb_* .trans B fragments.
#pragma once

#include <cstdint>

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T>
struct GradsFrags {
  int a_r, a_c, nb_r, nb_c, tb_r, tb_c;
  __device__ explicit GradsFrags(int lane)
      : a_r(lane & 15),
        a_c(8 * (lane >> 4)),
        nb_r(8 * (lane >> 4) + (lane & 7)),
        nb_c(8 * ((lane >> 3) & 1)),
        tb_r(8 * ((lane >> 3) & 1) + (lane & 7)),
        tb_c(8 * (lane >> 4)) {}
  // A[r][kk] = X[r0 + r][k0 + kk] (X row-major, pitch ld).
  __device__ void lda(uint32_t (&f)[4], const T* X, int ld, int r0, int k0) const {
    mma::ldmatrix_x4<false>(f, X + (r0 + a_r) * ld + k0 + a_c);
  }
  // A[r][kk] = X[k0 + kk][r0 + r].
  __device__ void lda_t(uint32_t (&f)[4], const T* X, int ld, int r0, int k0) const {
    mma::ldmatrix_x4<true>(f, X + (k0 + nb_r) * ld + r0 + nb_c);
  }
  // B fragments of the two 8-column tiles n0 / 8, n0 / 8 + 1: B[kk][n] = Y[n0 + n][k0 + kk].
  __device__ void ldb(uint32_t (&f)[4], const T* Y, int ld, int k0, int n0) const {
    mma::ldmatrix_x4<false>(f, Y + (n0 + nb_r) * ld + k0 + nb_c);
  }
  // B[kk][n] = X[k0 + kk][n0 + n].
  __device__ void ldb_t(uint32_t (&f)[4], const T* X, int ld, int k0, int n0) const {
    mma::ldmatrix_x4<true>(f, X + (k0 + tb_r) * ld + n0 + tb_c);
  }
  // acc0 += a * (first tile of b), acc1 += a * (second tile of b).
  __device__ static void mma2(float (&c0)[4], float (&c1)[4], const uint32_t (&af)[4], const uint32_t (&b)[4]) {
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    mma::mma16816<T>(c0, af, b0);
    mma::mma16816<T>(c1, af, b1);
  }
};

}  // namespace flashgrad::cuda_detail::delta_rule
