// Warp-level tensor-core products for the chunked stages: mma.sync m16n8k16 with bf16 or fp16
// operands and fp32 accumulators, operands read from shared memory.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, .row.col), lane = 4 * grp + tig (grp = lane / 4,
// tig = lane % 4). A pair (x, x + 1) of 16-bit elements sits in one 32-bit register, the lower
// index in the low half:
//   A (16 x 16, row r, column kk): a0 = (grp, 2 tig), a1 = (grp + 8, 2 tig),
//                                  a2 = (grp, 2 tig + 8), a3 = (grp + 8, 2 tig + 8)
//   B (16 x 8, row kk, column n):  b0 = (2 tig, grp), b1 = (2 tig + 8, grp)
//   C (16 x 8, fp32):              c0, c1 = (grp, 2 tig + {0, 1}), c2, c3 = (grp + 8, 2 tig + {0, 1})
// Shared-memory operands are row-major with a leading dimension `ld` (in elements, even, and
// padded by 8 so that the 8 rows a load touches fall in different banks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule::mma {

__device__ __forceinline__ int grp() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int tig() { return threadIdx.x & 3; }

// Row / column inside a 16 x 8 accumulator tile of accumulator element e (0..3).
__device__ __forceinline__ int acc_row(int e) { return grp() + ((e >> 1) << 3); }
__device__ __forceinline__ int acc_col(int e) { return 2 * tig() + (e & 1); }

template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  uint16_t l, h;
  memcpy(&l, &lo, 2);
  memcpy(&h, &hi, 2);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t ld32(const T* p) {  // two consecutive elements, 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(p);
}

// d += a * b (16 x 8 x 16).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  // A CPU harness that runs these kernels with one host thread per CUDA thread supplies this
  // (it exchanges the fragments across the emulated warp); never defined in the library build.
  emulated_mma16816<T>(d, a, b);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma16816: bf16 or fp16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// A[r][kk] = X[(r0 + r) * ld + k0 + kk]  (X row-major: the product X ...).
template <typename T>
__device__ __forceinline__ void frag_a(const T* X, int ld, int r0, int k0, uint32_t (&a)[4]) {
  const T* p = X + (r0 + grp()) * ld + k0 + 2 * tig();
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * ld);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * ld + 8);
}

// A[r][kk] = X[(k0 + kk) * ld + r0 + r]  (the product X^T ...; pairs along kk are in two rows).
template <typename T>
__device__ __forceinline__ void frag_a_trans(const T* X, int ld, int r0, int k0, uint32_t (&a)[4]) {
  const int r = r0 + grp(), kk = k0 + 2 * tig();
  a[0] = pack2(X[kk * ld + r], X[(kk + 1) * ld + r]);
  a[1] = pack2(X[kk * ld + r + 8], X[(kk + 1) * ld + r + 8]);
  a[2] = pack2(X[(kk + 8) * ld + r], X[(kk + 9) * ld + r]);
  a[3] = pack2(X[(kk + 8) * ld + r + 8], X[(kk + 9) * ld + r + 8]);
}

// B[kk][n] = Y[(n0 + n) * ld + k0 + kk]  (the product ... Y^T, Y row-major).
template <typename T>
__device__ __forceinline__ void frag_b_trans(const T* Y, int ld, int k0, int n0, uint32_t (&b)[2]) {
  const T* p = Y + (n0 + grp()) * ld + k0 + 2 * tig();
  b[0] = ld32(p);
  b[1] = ld32(p + 8);
}

// B[kk][n] = Z[(k0 + kk) * ld + n0 + n]  (the product ... Z, Z row-major).
template <typename T>
__device__ __forceinline__ void frag_b(const T* Z, int ld, int k0, int n0, uint32_t (&b)[2]) {
  const int kk = k0 + 2 * tig(), n = n0 + grp();
  b[0] = pack2(Z[kk * ld + n], Z[(kk + 1) * ld + n]);
  b[1] = pack2(Z[(kk + 8) * ld + n], Z[(kk + 9) * ld + n]);
}

}  // namespace flashgrad::cuda_detail::delta_rule::mma
