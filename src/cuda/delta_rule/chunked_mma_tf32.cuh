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

// Per-row and per-column sums of accumulator-shaped values, so that a warp adds one value per row
// (or column) to shared memory instead of one per element (32x fewer contended atomics).
// rows: each thread holds rows grp and grp + 8 (half 0 / 1); the 4 lanes of a quad share them.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}
// columns: each thread holds columns 8 nt + 2 tig + {0, 1}; the 8 lanes with the same tig share them.
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  x += __shfl_xor_sync(0xffffffffu, x, 16);
  return x;
}
// Adds rs[half] (this thread's share of row r0 + grp + 8 half) to dst[row], one atomic per row.
__device__ __forceinline__ void add_row_sums(float* dst, int r0, const float (&rs)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float v = quad_sum(rs[half]);
    if (tig() == 0) atomicAdd(&dst[r0 + grp() + 8 * half], v);
  }
}
// Adds cs[nt][p] (this thread's share of column 8 nt + 2 tig + p) to dst[column], one atomic per column.
template <int NT>
__device__ __forceinline__ void add_column_sums(float* dst, const float (&cs)[NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const float v = column_sum(cs[nt][p]);
      if (grp() == 0) atomicAdd(&dst[8 * nt + 2 * tig() + p], v);
    }
}

}  // namespace flashgrad::cuda_detail::delta_rule::mma
