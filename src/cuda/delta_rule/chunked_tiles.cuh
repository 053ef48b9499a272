// One chunk's rows (64 of them, zeros past the chunk's length) copied global -> shared with
// cp.async (chunked_mma_ldmatrix.cuh), for the forward stages that prefetch the next chunk while
// computing the current one (chunked_state.cuh, chunked_output.cuh). Any block size THREADS.
// The copies are only issued here: the caller commits, waits and then barriers before reading.
#pragma once

#include "chunked_mma_ldmatrix.cuh"
#include "chunked_stages.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Rows of q / k ([B, T, H, K] views of 16-bit T) can be copied 16 bytes (8 elements) at a time:
// unit inner stride, 16-byte aligned base and row strides. Otherwise key_tile_async copies element
// by element (synchronous loads, still correct).
__device__ __forceinline__ bool key_rows_vectorizable(const View& x) {
  return (reinterpret_cast<uintptr_t>(x.p) & 15) == 0 && x.s3 == 1 && x.s0 % 8 == 0 && x.s1 % 8 == 0 &&
         x.s2 % 8 == 0;
}

// dst[r * ld + d] = x[b, t0 + r, idx, d] for r < 64, d < width (raw T, not normalized; width a
// multiple of 8) of a [B, T, heads, width] view (q, k: idx = the key head; v: the value head);
// rows r >= len are zeros. dst rows must be 16-byte aligned (ld a multiple of 8).
template <typename T, int THREADS>
__device__ __forceinline__ void view_rows_async(const View& x, const ChunkInfo& ci, int64_t idx, int width, bool vec,
                                                T* dst, int ld) {
  const T* src = static_cast<const T*>(x.p);
  if (vec) {
    const int P = width / 8;  // 16-byte pieces per row
    for (int e = threadIdx.x; e < kChunkSize * P; e += THREADS) {
      const int r = e / P, p = e % P;
      const bool ok = r < ci.len;
      mma::cp_async16(dst + r * ld + 8 * p, src + off3(x, ci.b, ci.t0 + (ok ? r : 0), idx) + 8 * p, ok);
    }
  } else {
    for (int e = threadIdx.x; e < kChunkSize * width; e += THREADS) {
      const int r = e / width, d = e % width;
      dst[r * ld + d] = r < ci.len ? src[off3(x, ci.b, ci.t0 + r, idx) + d * x.s3] : from_f<T>(0.f);
    }
  }
}
template <typename T, int KMAX, int THREADS>
__device__ __forceinline__ void key_tile_async(const View& x, const ChunkInfo& ci, int64_t head, bool vec, T* dst,
                                               int ld) {
  view_rows_async<T, THREADS>(x, ci, head, KMAX, vec, dst, ld);
}

// dst[r * ld + col] = base[((row0 + r) * HV + hv) * W + col0 + col] for r < 64, col < WIDTH (an
// intermediate of [rows, HV, W] elements E, W and col0 multiples of 16 / sizeof(E), base 16-byte
// aligned); rows r >= len are zeros.
template <typename E, int WIDTH, int THREADS>
__device__ __forceinline__ void intermediate_tile_async(const E* base, int64_t row0, int64_t HV, int64_t hv,
                                                        int64_t W, int64_t col0, int len, E* dst, int ld) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E)), P = WIDTH / kPer;
  for (int e = threadIdx.x; e < kChunkSize * P; e += THREADS) {
    const int r = e / P, p = e % P;
    const bool ok = r < len;
    mma::cp_async16(dst + r * ld + kPer * p, base + ((row0 + (ok ? r : 0)) * HV + hv) * W + col0 + kPer * p, ok);
  }
}

// 1 / sqrt(sum_d x[r][d]^2 + eps) of row r = threadIdx.x / (THREADS / 64) of a [64][ld] shared
// tile of T (1 without `l2norm`); the THREADS / 64 lanes of a row each sum KMAX / (THREADS / 64)
// columns (16-byte loads) and all of them return the row's value.
template <typename T, int KMAX, int THREADS>
__device__ __forceinline__ float tile_row_rstd(const T* tile, int ld, bool l2norm) {
  constexpr int kLanes = THREADS / kChunkSize, kPer = KMAX / kLanes;
  static_assert(kLanes >= 1 && kPer % 8 == 0, "64 rows over the block's threads, 8-element pieces");
  if (!l2norm) return 1.f;
  const int r = threadIdx.x / kLanes, part = threadIdx.x % kLanes;
  const T* row = tile + r * ld + part * kPer;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; i += 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + i);  // one 16-byte shared load
    const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float lo, hi;
      mma::unpack_floats<T>(x[j], lo, hi);
      ss += lo * lo + hi * hi;
    }
  }
  if constexpr (kLanes > 1) ss = group_sum<kLanes>(ss);
  return 1.0f / sqrtf(ss + kL2NormEps);
}

}  // namespace flashgrad::cuda_detail::delta_rule
