// Warp-level TF32 tensor-core products for the chunked backward: mma.sync m16n8k8 with tf32
// operands (fp32 in shared memory, rounded to tf32 = 10 mantissa bits on load) and fp32
// accumulators. TF32 keeps the backward's fp32 shared-memory operands as they are (no bf16
// split) at 2^-11 relative rounding per operand.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32, .row.col), lane = 4 * grp + tig:
//   A (16 x 8, row r, column kk): a0 = (grp, tig), a1 = (grp + 8, tig), a2 = (grp, tig + 4), a3 = (grp + 8, tig + 4)
//   B (8 x 8, row kk, column n):  b0 = (tig, grp), b1 = (tig + 4, grp)
//   C (16 x 8, fp32):             c0, c1 = (grp, 2 tig + {0, 1}), c2, c3 = (grp + 8, 2 tig + {0, 1})
// Operands are read through functors a_at(r, kk) / b_at(kk, n) returning fp32 from shared memory,
// so one routine serves X Y, X^T Y and X Y^T (the caller's functor does the index math).
#pragma once

#include <cstdint>
#include <cstring>

#include "chunked_mma.cuh"

namespace flashgrad::cuda_detail::delta_rule::mma {

__device__ __forceinline__ uint32_t to_tf32(float x) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  return emulated_to_tf32(x);
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#endif
}

// d += a * b (16 x 8 x 8, tf32).
__device__ __forceinline__ void mma1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  emulated_mma1688_tf32(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// acc[nt] (the 16 x 8 tile at rows [r0, r0 + 16), columns [8 nt, 8 nt + 8)) +=
//   sum over kk in [k0, k0 + 8 ksteps) of a_at(r, kk) * b_at(kk, n).
template <int NT, typename FA, typename FB>
__device__ __forceinline__ void warp_gemm_tf32(float (&acc)[NT][4], int r0, int k0, int ksteps, FA&& a_at,
                                               FB&& b_at) {
  const int g = grp(), t = tig();
  for (int ks = 0; ks < ksteps; ++ks) {
    const int kb = k0 + 8 * ks;
    const uint32_t a[4] = {to_tf32(a_at(r0 + g, kb + t)), to_tf32(a_at(r0 + g + 8, kb + t)),
                           to_tf32(a_at(r0 + g, kb + t + 4)), to_tf32(a_at(r0 + g + 8, kb + t + 4))};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint32_t b[2] = {to_tf32(b_at(kb + t, 8 * nt + g)), to_tf32(b_at(kb + t + 4, 8 * nt + g))};
      mma1688_tf32(acc[nt], a, b);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

// Calls f(r, n, value) for every accumulator element of the warp's 16 x 8 NT tile at row r0.
template <int NT, typename F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[NT][4], int r0, F&& f) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(r0 + acc_row(e), 8 * nt + acc_col(e), acc[nt][e]);
}

}  // namespace flashgrad::cuda_detail::delta_rule::mma
