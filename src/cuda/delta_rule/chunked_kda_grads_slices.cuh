// Pieces shared by the two kernels of the split KDA B2 (session 10: chunked_kda_grads_state.cuh and
// chunked_kda_grads_local.cuh; the default B2). Both kernels walk the key channels in
// slices of 64 so that their per-channel tiles are [64][64] fp32 (16 KiB) whatever K is, and each
// block fits in half an SM's shared memory (two blocks of 8 warps per SM). The slice tiles hold
// chunk rows r < 64 and channels c0 + d (d < 64) of one slice: element (r, d) at [r * 64 + d].
// q and k are read as T (the chunked stages take 16-bit q, k, v only: kda_stages_support).
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_gate_rows.cuh"  // (recurrent_common.cuh: exp2_ftz, kLog2e)
#include "chunked_kda_mma.cuh"  // batched_copy
#include "chunked_rows.cuh"
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kKdaSliceK = 64;          // key channels per slice
constexpr int kKdaSplitThreads = 256;   // 8 warps per block in both kernels

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

// prefetch.global.L2 of the 128-byte lines of n floats at p (a hint: the later loads hit L2 instead of
// waiting for HBM); threads tid, tid + 256, .. take one line each. Nothing in the host emulation.
// The staged state kernel fetches the next slice's h / dh rows this way while it works on the
// current slice (run 11.2: the product loop's loads, two 16-column steps ahead, were 54% long
// scoreboard stalls).
__device__ __forceinline__ void kda_prefetch_l2(const float* p, int64_t n) {
#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
  for (int64_t q = threadIdx.x; q < n / 32; q += kKdaSplitThreads) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 32 * q));
#else
  (void)p, (void)n;
#endif
}

// kda_row_rstd with 16-byte loads (the staged state kernel, session 11; run 11.1: the element loads
// above, 8 rows and 8 lines per warp-wide 2-byte load, were ~10% of its stall samples): lane part of
// row tid / 4 sums channels 8 part + 32 i .. + 8 (i < KMAX / 32), so that a row's 4 lanes read 64
// contiguous bytes per load. Needs 16-byte aligned rows (kda_key_rows16). The same sums in another
// order.
template <typename T, int KMAX>
__device__ __forceinline__ void kda_row_rstd16(const View& x, const ChunkInfo& ci, int64_t head, bool l2norm,
                                               float* out) {
  static_assert(kKdaSplitThreads == 4 * kChunkSize && KMAX % 32 == 0, "four lanes per row, 8 channels per load");
  const int tid = threadIdx.x, r = tid / 4, part = tid % 4;
  float ss = 0.f;
  if (r < ci.len) {
    const T* row = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r, head) + 8 * part;
    uint4 v[KMAX / 32];
#pragma unroll
    for (int i = 0; i < KMAX / 32; ++i) v[i] = *reinterpret_cast<const uint4*>(row + 32 * i);
#pragma unroll
    for (int i = 0; i < KMAX / 32; ++i) {
      const uint32_t wv[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float lo, hi;
        mma::unpack_floats<T>(wv[k], lo, hi);
        ss += lo * lo + hi * hi;
      }
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

// Swizzled slice tiles (the staged state kernel, session 11): element (r, d) of an fp32 [64][64]
// tile at r * 64 + (d ^ s(r)), s(r) = 8 ((r & 3) ^ ((r >> 2) & 1)) (bits 3-4 only: pairs (d, d + 1),
// d even, stay adjacent), so that its passes' access patterns touch distinct banks: a row's 32
// consecutive channels (coalesced passes); rows R + grp, channel pairs D + 2 tig (fragment elements,
// float2: each half-warp's rows R..R + 3 or R + 4..R + 7 get 4 different s); rows R + 2 tig + e,
// channels D + grp (transposed fragments, scalar: s differs over tig). (ncu run 10.4: 8-way conflicts
// in the unswizzled tiles' fragment passes, 74% of all shared wavefronts excessive.) A 16-bit tile
// (k) XORs d with 8 (r & 7): a bank holds a pair, so the 8 rows of a fragment pattern need distinct
// bits 3-5.
__device__ __forceinline__ int kda_swz_at(int r, int d) {
  return r * kKdaSliceK + (d ^ (((r & 3) ^ ((r >> 2) & 1)) << 3));
}
__device__ __forceinline__ int kda_swz16_at(int r, int d) { return r * kKdaSliceK + (d ^ ((r & 7) << 3)); }

// out[r * 64 + d] (kSwz: out[kda_swz_at(r, d)]) = log2(e) G[row0 + r', hv, c0 + d] with
// r' = min(r, L - 1): log2 units, so that exp(G_i - G_j) = exp2_ftz(G2_i - G2_j)
// (chunked_kda_gate_rows.cuh: one ex2.approx.ftz, no multiply per term); rows past L repeat the last
// row (the cumulative sum of zero gates), as the decayed sums require. No barrier.
template <int KMAX, bool kSwz = false>
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
    for (int u = 0; u < 8; ++u) {
      const int r = r0 + kKdaSliceRowsPerPass * (m0 + u);
      out[kSwz ? kda_swz_at(r, d) : r * kKdaSliceK + d] = kLog2e * v[u];
    }
  }
}

// kda_gate_slice<KMAX, true>'s tile by cp.async (the staged state kernel, session 11: the slice's
// loads all in flight at once, no registers): 16-byte copies of raw G rows (rows past L: row L - 1)
// into the swizzled tile; thread tid copies chunks q = tid + 256 i (row q / 16, channels 4 (q % 16)..).
// After this thread's copies have landed (cp_async_wait), kda_gate_slice_to_log2 scales the same
// chunks to log2 units (then a barrier before others read them). G's rows are 16-byte aligned (K is
// a multiple of 64).
constexpr int kKdaGateChunks = kChunkSize * kKdaSliceK / 4 / kKdaSplitThreads;  // 4 per thread
template <int KMAX>
__device__ __forceinline__ void kda_gate_slice_async(const float* G_in, const ChunkInfo& ci, int64_t row0,
                                                     int64_t hv, int64_t HV, int c0, float* out) {
#pragma unroll
  for (int i = 0; i < kKdaGateChunks; ++i) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * i, r = q / 16, d = 4 * (q % 16);
    const int rr = r < ci.len ? r : ci.len - 1;
    mma::cp_async16(out + kda_swz_at(r, d), G_in + ((row0 + rr) * HV + hv) * KMAX + c0 + d, true);
  }
}
__device__ __forceinline__ void kda_gate_slice_to_log2(float* out) {
#pragma unroll
  for (int i = 0; i < kKdaGateChunks; ++i) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * i;
    float4* p = reinterpret_cast<float4*>(out + kda_swz_at(q / 16, 4 * (q % 16)));
    float4 v = *p;
    v.x *= kLog2e, v.y *= kLog2e, v.z *= kLog2e, v.w *= kLog2e;
    *p = v;
  }
}
// k's slice (as stored, T) by cp.async into the 16-bit swizzled tile (kda_swz16_at), rows past L
// zero-filled: thread tid copies chunks q = tid + 256 i (row q / 8, channels 8 (q % 8)..). Needs
// 16-byte aligned rows (kda_key_rows16); no barrier.
template <typename T>
__device__ __forceinline__ bool kda_key_rows16(const View& x, const ChunkInfo& ci, int64_t head) {
  return (reinterpret_cast<uintptr_t>(static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0, head)) & 15) == 0 &&
         x.s1 % 8 == 0;
}
template <typename T>
__device__ __forceinline__ void kda_key_slice_async(const View& x, const ChunkInfo& ci, int64_t head, int c0, T* out) {
  const T* row0 = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0, head) + c0;
#pragma unroll
  for (int i = 0; i < kChunkSize * kKdaSliceK / 8 / kKdaSplitThreads; ++i) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * i, r = q / 8, d = 8 * (q % 8);
    const bool ok = r < ci.len;
    mma::cp_async16(out + kda_swz16_at(r, d), row0 + (ok ? r : 0) * x.s1 + d, ok);
  }
}

// put(r, d, v) for the chunk's rows r < 64 and channels c0 + d (d < 64) of q or k as stored,
// v = x[b, t0 + r, head, c0 + d] (T, 0 past L). No barrier.
template <typename T, typename Put>
__device__ __forceinline__ void kda_key_slice_each(const View& x, const ChunkInfo& ci, int64_t head, int c0, Put&& put) {
  const int tid = threadIdx.x, d = tid % kKdaSliceK, r0 = tid / kKdaSliceK;
  const T* p = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r0, head) + c0 + d;  // then + 4 rows per pass
  const int64_t step = kKdaSliceRowsPerPass * x.s1;
#pragma unroll 1
  for (int m0 = 0; m0 < kKdaSlicePasses; m0 += 8) {
    T v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u, p += step) v[u] = r0 + kKdaSliceRowsPerPass * (m0 + u) < ci.len ? *p : from_f<T>(0.f);
#pragma unroll
    for (int u = 0; u < 8; ++u) put(r0 + kKdaSliceRowsPerPass * (m0 + u), d, v[u]);
  }
}
// out[r * 64 + d] = x[b, t0 + r, head, c0 + d] * rstd[r] (0 past L): one slice of normalized q or k.
template <typename T>
__device__ __forceinline__ void kda_key_slice(const View& x, const ChunkInfo& ci, int64_t head, int c0,
                                              const float* rstd, float* out) {
  kda_key_slice_each<T>(x, ci, head, c0, [&](int r, int d, T v) { out[r * kKdaSliceK + d] = to_f<T>(v) * rstd[r]; });
}
// out[r * 64 + d] = x[b, t0 + r, head, c0 + d] as stored (T, exact; 0 past L).
template <typename T>
__device__ __forceinline__ void kda_key_slice_raw(const View& x, const ChunkInfo& ci, int64_t head, int c0, T* out) {
  kda_key_slice_each<T>(x, ci, head, c0, [&](int r, int d, T v) { out[r * kKdaSliceK + d] = v; });
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

// kda_load_A by cp.async (the staged state kernel, session 11; run 11.3: the prologue's waits on A's
// two batches of loads were ~4% of the stall samples): raw rows into out (ldo a multiple of 4, 16-byte
// aligned), rows past L zero-filled; thread tid copies chunks q = tid + 256 i (row q / 16, columns
// 4 (q % 16)..). After this thread's copies have landed (cp_async_wait), kda_load_A_fix applies the
// same mask to the same chunks (then a barrier before others read them).
constexpr int kKdaAChunks = kChunkSize * kChunkSize / 4 / kKdaSplitThreads;  // 4 per thread
__device__ __forceinline__ void kda_load_A_async(const float* A_in, int64_t row0, int64_t hv, int64_t HV, int L,
                                                 float* out, int ldo) {
  const float* src = A_in + (row0 * HV + hv) * kChunkSize;  // row i: + i * HV * 64
#pragma unroll
  for (int u = 0; u < kKdaAChunks; ++u) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
    const bool ok = i < L;
    mma::cp_async16(out + i * ldo + j, src + (ok ? i : 0) * HV * kChunkSize + j, ok);
  }
}
__device__ __forceinline__ void kda_load_A_fix(int L, float* out, int ldo) {
#pragma unroll
  for (int u = 0; u < kKdaAChunks; ++u) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
    float4* p = reinterpret_cast<float4*>(out + i * ldo + j);
    float4 v = *p;
    auto mask = [&](float x, int jj) { return i < L ? (jj < i ? x : (jj == i ? 1.f : 0.f)) : 0.f; };
    v.x = mask(v.x, j), v.y = mask(v.y, j + 1), v.z = mask(v.z, j + 2), v.w = mask(v.w, j + 3);
    *p = v;
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
