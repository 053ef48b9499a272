// Fragment loads and conversions for the chunked stages' mma.sync m16n8k16 products
// (chunked_mma.cuh gives the layouts), without per-element packing:
//   - ldmatrix .x4 (and .trans): one instruction loads four 8 x 8 tiles of 16-bit elements from
//     shared memory, i.e. two B fragments (or one A fragment), instead of 8 - 16 scalar loads;
//   - accumulators (C layout) turned into A fragments in registers (the C layout of two adjacent
//     16 x 8 tiles is the A layout of one 16 x 16 operand), split into hi = T(x) and lo = T(x - hi)
//     so that an fp32 operand keeps ~16 (bf16) / ~22 (fp16) bits through two mmas;
//   - cp.async 16-byte copies global -> shared (with zero fill), so the next chunk's tiles load
//     while the current chunk computes.
// Under FLASHGRAD_CHUNKED_HOST_EMULATION each has a host model (chunked_emulation/emulator.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "chunked_mma.cuh"

namespace flashgrad::cuda_detail::delta_rule::mma {

// stmatrix .x4 .trans (sm_90): the inverse of ldmatrix_x4<true>. Lane l passes the address of stored
// row (l % 8) of tile (l / 8) (16 contiguous bytes, 16-byte aligned); register m of lane l holds tile
// m's fragment row l / 4, columns 2 (l % 4), 2 (l % 4) + 1 (low half first), which go to stored rows
// 2 (l % 4) and 2 (l % 4) + 1 at position l / 4. So an mma accumulator tile (C layout: lane holds
// row grp, columns 2 tig + {0, 1}) packed in pairs lands transposed: its columns become stored rows.
__device__ __forceinline__ void stmatrix_x4_trans(const uint32_t (&r)[4], void* row_addr) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  emulated_stmatrix_x4_trans(r, row_addr);
#else
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
               :
               : "r"(s), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

// Four 8 x 8 tiles of 16-bit elements: lane l passes the address of row (l % 8) of tile (l / 8)
// (16 contiguous bytes, 16-byte aligned). Without .trans, register m of lane l holds tile m's
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low half first); with .trans, tile m's rows
// 2 (l % 4) and 2 (l % 4) + 1 of column l / 4.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  emulated_ldmatrix_x4(r, row_addr, kTrans);
#else
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

// 16 bytes global -> shared, asynchronously; `full` false: the 16 shared bytes are zero-filled and
// nothing is read (src must still be a valid address expression, it is not dereferenced).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool full) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  emulated_cp_async16(smem_dst, gmem_src, full);
#else
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int n = full ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem_src), "r"(n) : "memory");
#endif
}
// 4 bytes global -> shared, asynchronously (cp.async.ca: 4-byte copies go through L1); `full` false:
// zero-filled, src not dereferenced (as cp_async16).
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src, bool full) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  emulated_cp_async4(smem_dst, gmem_src, full);
#else
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int n = full ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(gmem_src), "r"(n) : "memory");
#endif
}
// Closes the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `kPending` committed groups are still in flight (this thread's copies only:
// a block barrier must follow before other threads read them).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Two floats as one register of two T (lo in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack_floats(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  }
}
// The two T of a register back to float.
template <typename T>
__device__ __forceinline__ void unpack_floats(uint32_t r, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bf16 -> f32 is the 16 bits moved to the top of the word.
    lo = __uint_as_float(r << 16);
    hi = __uint_as_float(r & 0xffff0000u);
  } else {
    __half2 v;
    memcpy(&v, &r, 4);
    lo = __low2float(v);
    hi = __high2float(v);
  }
}
// (x0, x1) -> hi = T(x) pair and lo = T(x - hi) pair.
template <typename T>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack_floats<T>(x0, x1);
  float h0, h1;
  unpack_floats<T>(hi, h0, h1);
  lo = pack_floats<T>(x0 - h0, x1 - h1);
}

// (x0, x1) -> hi = T(x) pair, and with kSplit lo = T(x - hi) pair (lo untouched otherwise): for
// kernels whose products are hi + lo or single-fragment by a template parameter.
template <typename T, bool kSplit>
__device__ __forceinline__ void round_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kSplit)
    split_pair<T>(x0, x1, hi, lo);
  else
    hi = pack_floats<T>(x0, x1);
}

// The A fragment (16 x 16) of an operand held as two adjacent 16 x 8 accumulator tiles
// (columns [0, 8) in c0, [8, 16) in c1), each element multiplied by the column's factor:
// columns 2 tig + {0, 1} by s0[0..1] (tile c0) and 8 + 2 tig + {0, 1} by s1[0..1] (tile c1).
// Split into hi and lo fragments.
template <typename T>
__device__ __forceinline__ void acc_to_a_split(const float (&c0)[4], const float (&c1)[4], const float (&s0)[2],
                                               const float (&s1)[2], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  split_pair<T>(c0[0] * s0[0], c0[1] * s0[1], hi[0], lo[0]);  // row grp,     cols 2 tig + {0, 1}
  split_pair<T>(c0[2] * s0[0], c0[3] * s0[1], hi[1], lo[1]);  // row grp + 8
  split_pair<T>(c1[0] * s1[0], c1[1] * s1[1], hi[2], lo[2]);  // row grp,     cols 8 + 2 tig + {0, 1}
  split_pair<T>(c1[2] * s1[0], c1[3] * s1[1], hi[3], lo[3]);  // row grp + 8
}
template <typename T>
__device__ __forceinline__ void acc_to_a_split(const float (&c0)[4], const float (&c1)[4], uint32_t (&hi)[4],
                                               uint32_t (&lo)[4]) {
  split_pair<T>(c0[0], c0[1], hi[0], lo[0]);
  split_pair<T>(c0[2], c0[3], hi[1], lo[1]);
  split_pair<T>(c1[0], c1[1], hi[2], lo[2]);
  split_pair<T>(c1[2], c1[3], hi[3], lo[3]);
}

// acc_to_a_split's two forms with the split optional (round_pair): hi only unless kSplit.
template <typename T, bool kSplit>
__device__ __forceinline__ void acc_to_a(const float (&c0)[4], const float (&c1)[4], const float (&s0)[2],
                                         const float (&s1)[2], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  round_pair<T, kSplit>(c0[0] * s0[0], c0[1] * s0[1], hi[0], lo[0]);
  round_pair<T, kSplit>(c0[2] * s0[0], c0[3] * s0[1], hi[1], lo[1]);
  round_pair<T, kSplit>(c1[0] * s1[0], c1[1] * s1[1], hi[2], lo[2]);
  round_pair<T, kSplit>(c1[2] * s1[0], c1[3] * s1[1], hi[3], lo[3]);
}
template <typename T, bool kSplit>
__device__ __forceinline__ void acc_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&hi)[4],
                                         uint32_t (&lo)[4]) {
  round_pair<T, kSplit>(c0[0], c0[1], hi[0], lo[0]);
  round_pair<T, kSplit>(c0[2], c0[3], hi[1], lo[1]);
  round_pair<T, kSplit>(c1[0], c1[1], hi[2], lo[2]);
  round_pair<T, kSplit>(c1[2], c1[3], hi[3], lo[3]);
}

// acc[t0 + 2 i] += a * (b[i][0], b[i][1]) and acc[t0 + 2 i + 1] += a * (b[i][2], b[i][3]) for i < N
// (b[i]: an ldmatrix .x4 result holding the B fragments of two adjacent 8-column tiles), in that
// order: 2N mmas on distinct accumulators back to back.
template <typename T, int N, int M>
__device__ __forceinline__ void mma_tiles(float (&acc)[M][4], const uint32_t (&a)[4], const uint32_t (&b)[N][4],
                                          int t0 = 0) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t b0[2] = {b[i][0], b[i][1]}, b1[2] = {b[i][2], b[i][3]};
    mma16816<T>(acc[t0 + 2 * i], a, b0);
    mma16816<T>(acc[t0 + 2 * i + 1], a, b1);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule::mma
