// Pieces shared by the two kernels of the split KDA B2 (session 10: chunked_kda_grads_state.cuh and
// chunked_kda_grads_local.cuh; FLASHGRAD_CHUNKED_KDA_B2=split). Both kernels walk the key channels in
// slices of 64 so that their per-channel tiles are [64][64] fp32 (16 KiB) whatever K is, and each
// block fits in half an SM's shared memory (two blocks of 8 warps per SM). The slice tiles hold
// chunk rows r < 64 and channels c0 + d (d < 64) of one slice: element (r, d) at [r * 64 + d].
// q and k are read as T (the chunked stages take 16-bit q, k, v only: kda_stages_support).
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"  // batched_copy
#include "chunked_rows.cuh"
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kKdaSliceK = 64;          // key channels per slice
constexpr int kKdaSplitThreads = 256;   // 8 warps per block in both kernels

// 2^x for x <= 0 through ex2.approx.ftz (one instruction; decay_exp, __expf without ftz, takes five):
// both kernels keep their G slices in log2 units (kda_gate_slice multiplies by log2(e) once per
// element), so exp(G_i - G_j) = 2^(G2_i - G2_j) costs no multiply per term. A factor below 2^-126
// flushes to 0 instead of a denormal, far below the fp32 rounding of the sums it enters. The host
// emulation: exp2f.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float kda_exp2_ftz(float x) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// L2 prefetch (prefetch.global.L2) of the 128-byte lines of rows r < rows (<= 64) of a row-strided
// array: row r at base + r * stride, row_bytes bytes each; four threads per row. Both kernels issue
// these at their start (and the first one per key slice for h and dh, which come from HBM) so that
// their later loads, which wait one latency per mma step or batch, find the lines in L2 (ncu run
// 10.1: long scoreboard 54% / 36% of the stalls). No effect in the host emulation.
__device__ __forceinline__ void kda_prefetch_l2(const void* p) {
#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}
template <typename E>
__device__ __forceinline__ void kda_prefetch_rows(const E* base, int64_t stride, int rows, int64_t row_bytes) {
  static_assert(kKdaSplitThreads == 4 * kChunkSize, "four lanes per row");
  const int r = threadIdx.x / 4;  // rows <= 64: lane threadIdx.x % 4 takes lines 4 j + lane of row r
  if (r >= rows) return;
  const char* p = reinterpret_cast<const char*>(base + r * stride);
  for (int64_t off = 128 * (threadIdx.x % 4); off < row_bytes; off += 512) kda_prefetch_l2(p + off);
}

// out[r] = 1 / sqrt(sum_d x_rd^2 + eps) for the chunk's rows r < 64 of q or k (rows past L: any
// finite value, their elements read as 0), 1 without the L2 norm. Four lanes per row (the 256
// threads cover the 64 rows once), each summing channels part, part + 4, ...; then a shuffle sum.
template <typename T, int KMAX>
__device__ __forceinline__ void kda_row_rstd(const View& x, const ChunkInfo& ci, int64_t head, bool l2norm,
                                             float* out) {
  static_assert(kKdaSplitThreads == 4 * kChunkSize, "four lanes per row");
  const int tid = threadIdx.x, r = tid / 4, part = tid % 4;
  float ss = 0.f;
  if (r < ci.len) {
    const T* row = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r, head);  // the last dim is contiguous
#pragma unroll 8
    for (int d = part; d < KMAX; d += 4) {
      const float v = to_f<T>(row[d]);
      ss += v * v;
    }
  }
  ss = group_sum<4>(ss);
  if (part == 0) out[r] = l2norm ? 1.0f / sqrtf(ss + kL2NormEps) : 1.f;
}

// The slice loads below: thread tid owns channel d = tid % 64 of rows r = tid / 64 + 4 m (m < 16),
// i.e. consecutive lanes read consecutive channels of one row (coalesced), and the row pointers
// step by a constant (4 rows): one 64-bit add per element, where a product per element cost ~12
// instructions (SASS, session 10). Loads are issued in
// batches of 8 before their stores (8 global loads in flight per thread, few registers).
constexpr int kKdaSliceRowsPerPass = kKdaSplitThreads / kKdaSliceK;                   // 4
constexpr int kKdaSlicePasses = kChunkSize * kKdaSliceK / kKdaSplitThreads;          // 16

// out[r * 64 + d] = log2(e) G[row0 + r', hv, c0 + d] with r' = min(r, L - 1) (log2 units, for
// kda_exp2_ftz): rows past L repeat the last row (the cumulative sum of zero gates), as the decayed
// sums require. No barrier.
template <int KMAX>
__device__ __forceinline__ void kda_gate_slice(const float* G_in, const ChunkInfo& ci, int64_t row0, int64_t hv,
                                               int64_t HV, int c0, float* out) {
  const int tid = threadIdx.x, d = tid % kKdaSliceK, r0 = tid / kKdaSliceK;
  const int64_t rstride = HV * KMAX;                                 // G's row stride
  const float* p = G_in + ((row0 + r0) * HV + hv) * KMAX + c0 + d;  // row r0, then + 4 rows per pass
  const float* last = G_in + ((row0 + ci.len - 1) * HV + hv) * KMAX + c0 + d;  // row L - 1
  const int64_t step = kKdaSliceRowsPerPass * rstride;
#pragma unroll 1
  for (int m0 = 0; m0 < kKdaSlicePasses; m0 += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u, p += step) v[u] = *(r0 + kKdaSliceRowsPerPass * (m0 + u) < ci.len ? p : last);
#pragma unroll
    for (int u = 0; u < 8; ++u) out[(r0 + kKdaSliceRowsPerPass * (m0 + u)) * kKdaSliceK + d] = kLog2e * v[u];
  }
}

// out[r * 64 + d] = x[b, t0 + r, head, c0 + d] * rstd[r] (0 past L): one slice of normalized q or k.
// No barrier.
template <typename T>
__device__ __forceinline__ void kda_key_slice(const View& x, const ChunkInfo& ci, int64_t head, int c0,
                                              const float* rstd, float* out) {
  const int tid = threadIdx.x, d = tid % kKdaSliceK, r0 = tid / kKdaSliceK;
  const T* p = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r0, head) + c0 + d;  // then + 4 rows per pass
  const int64_t step = kKdaSliceRowsPerPass * x.s1;
#pragma unroll 1
  for (int m0 = 0; m0 < kKdaSlicePasses; m0 += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u, p += step) v[u] = r0 + kKdaSliceRowsPerPass * (m0 + u) < ci.len ? to_f<T>(*p) : 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int r = r0 + kKdaSliceRowsPerPass * (m0 + u);
      out[r * kKdaSliceK + d] = v[u] * rstd[r];
    }
  }
}

// out[r * 64 + d] = x[b, t0 + r, head, c0 + d] as stored (T, exact; 0 past L). No barrier.
template <typename T>
__device__ __forceinline__ void kda_key_slice_raw(const View& x, const ChunkInfo& ci, int64_t head, int c0, T* out) {
  const int tid = threadIdx.x, d = tid % kKdaSliceK, r0 = tid / kKdaSliceK;
  const T* p = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r0, head) + c0 + d;  // then + 4 rows per pass
  const int64_t step = kKdaSliceRowsPerPass * x.s1;
#pragma unroll 1
  for (int m0 = 0; m0 < kKdaSlicePasses; m0 += 8) {
    T v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u, p += step) v[u] = r0 + kKdaSliceRowsPerPass * (m0 + u) < ci.len ? *p : from_f<T>(0.f);
#pragma unroll
    for (int u = 0; u < 8; ++u) out[(r0 + kKdaSliceRowsPerPass * (m0 + u)) * kKdaSliceK + d] = v[u];
  }
}

// out[i * ldo + j] = src[i * stride + j] for the chunk's 64 x 64 matrices (i < L; rows past L are 0
// and not read: the last chunk's may lie past the array), with f(i, j, x) applied: thread tid owns
// column j = tid % 64 of rows tid / 64 + 4 u (u < 16), row pointers stepped by 4 rows, 8 loads in
// flight per batch. No barrier.
template <typename F>
__device__ __forceinline__ void kda_load_square(const float* src, int64_t stride, int L, float* out, int ldo, F&& f) {
  constexpr int C = kChunkSize;
  const int tid = threadIdx.x, j = tid % C, i0 = tid / C;
  const float* p = src + i0 * stride + j;
  const int64_t step = kKdaSliceRowsPerPass * stride;
#pragma unroll 1
  for (int u0 = 0; u0 < kKdaSlicePasses; u0 += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u, p += step) v[u] = i0 + kKdaSliceRowsPerPass * (u0 + u) < L ? *p : 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + kKdaSliceRowsPerPass * (u0 + u);
      out[i * ldo + j] = f(i, j, v[u]);
    }
  }
}

// A from stage 1 into out[i * ldo + j] (64 x 64): stage 1 packs P^T into A's upper triangle
// (chunked_kda.h), so keep the strict lower part and put the unit diagonal back (rows past L: 0).
// No barrier.
__device__ __forceinline__ void kda_load_A(const float* A_in, int64_t row0, int64_t hv, int64_t HV, int L, float* out,
                                           int ldo) {
  kda_load_square(A_in + (row0 * HV + hv) * kChunkSize, HV * kChunkSize, L, out, ldo,
                  [L](int i, int j, float x) { return i < L ? (j < i ? x : (j == i ? 1.f : 0.f)) : 0.f; });
}

}  // namespace flashgrad::cuda_detail::delta_rule
