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
// by element (synchronous loads, still correct). Also the launchers' test (host) for the kernels that
// carry no element-by-element fallback (the split B2, the wgmma stage 2; chunked_launch_impl.cuh).
// Whether a [B, T, heads, D] view in T (not fp32) can take its element pairs (columns 2 i, 2 i + 1) as
// one 4-byte store: stage 3's and KDA's output o.
__host__ __device__ __forceinline__ bool column_pairs_storable(const View& x) {
  return !x.f32 && (reinterpret_cast<uintptr_t>(x.p) & 3) == 0 && x.s3 == 1 && x.s0 % 2 == 0 && x.s1 % 2 == 0 &&
         x.s2 % 2 == 0;
}
__host__ __device__ __forceinline__ bool key_rows_vectorizable(const View& x) {
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

// The serial stages' copies (B1, stage 2: one chain of chunks per block, so every instruction
// of a copy is on the chain) without view_rows_async's / intermediate_tile_async's per-copy index
// division and 64-bit row products: rows r < 64 of a tile whose source rows are `pitch` elements E
// apart, P 16-byte pieces per row. `row0` points at piece 0 of the chunk's row 0. Thread tid copies
// piece tid % P of rows r0 + (THREADS / P) m, r0 = tid / P (fixed trip count, one pointer bump per
// copy); rows r >= len are zero-filled (src-size 0, with row 0's address: inside the tensor, since
// len >= 1).
template <int P, int THREADS, typename E>
__device__ __forceinline__ void stepped_rows_async(const E* row0, int64_t pitch, int len, E* dst, int ld) {
  constexpr int kRows = THREADS / P, kPasses = kChunkSize / kRows, kPer = 16 / static_cast<int>(sizeof(E));
  static_assert(THREADS % P == 0 && kChunkSize % kRows == 0, "whole passes");
  const int r0 = static_cast<int>(threadIdx.x) / P, piece = kPer * (static_cast<int>(threadIdx.x) % P);
  const E* first = row0 + piece;
  const E* src = first + r0 * pitch;
  const int64_t step = kRows * pitch;
  E* d = dst + r0 * ld + piece;
  if (len >= kChunkSize) {  // every chunk but a sequence's last: no row test, no address select
#pragma unroll
    for (int m = 0; m < kPasses; ++m) {
      mma::cp_async16(d + kRows * m * ld, src, true);
      src += step;
    }
    return;
  }
#pragma unroll
  for (int m = 0; m < kPasses; ++m) {
    const bool ok = r0 + kRows * m < len;
    mma::cp_async16(d + kRows * m * ld, ok ? src : first, ok);
    src += step;
  }
}

// stepped_rows_async of rows [0, 64) of chunk ci of a [B, T, heads, WIDTH] view x (head idx) when its
// rows are 16-byte copyable (vec: unit inner stride), else view_rows_async's element-by-element copy.
template <typename T, int WIDTH, int THREADS>
__device__ __forceinline__ void view_rows_stepped_async(const View& x, const ChunkInfo& ci, int64_t idx, bool vec,
                                                        T* dst, int ld) {
  if (vec)
    stepped_rows_async<WIDTH / 8, THREADS>(static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0, idx), x.s1, ci.len, dst,
                                           ld);
  else
    view_rows_async<T, THREADS>(x, ci, idx, WIDTH, false, dst, ld);
}

// stepped_rows_async of an intermediate of [rows, HV, W] elements E: columns [col0, +WIDTH) of rows
// row0 + r, r < 64 (intermediate_tile_async's tile).
template <typename E, int WIDTH, int THREADS>
__device__ __forceinline__ void intermediate_stepped_async(const E* base, int64_t row0, int64_t HV, int64_t hv,
                                                           int64_t W, int64_t col0, int len, E* dst, int ld) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  stepped_rows_async<WIDTH / kPer, THREADS>(base + (row0 * HV + hv) * W + col0, HV * W, len, dst, ld);
}

// Stores a transposed 16 x 64 accumulator tile of a warp (chunked_state.cuh's layout: element e of
// p[j8] is chunk row j = 8 j8 + 2 tig + (e & 1), column grp + 8 (e >> 1) of the warp's 16) to
// rows j < len of an intermediate whose rows are `pitch` elements apart: `at` points at row 0's
// column grp. Two row pointers (even, odd row) bumped by 8 rows per j8: no 64-bit product per store.
template <typename E>
__device__ __forceinline__ void store_acc_rows(E* at, int64_t pitch, int len, int tig, const float (&p)[8][4]) {
  E* even = at + 2 * tig * pitch;
  E* odd = even + pitch;
  const int64_t step = 8 * pitch;
#pragma unroll
  for (int j8 = 0; j8 < 8; ++j8) {
    const int j = 8 * j8 + 2 * tig;
    if (j < len) {
      even[0] = from_f<E>(p[j8][0]);
      even[8] = from_f<E>(p[j8][2]);
    }
    if (j + 1 < len) {
      odd[0] = from_f<E>(p[j8][1]);
      odd[8] = from_f<E>(p[j8][3]);
    }
    even += step;
    odd += step;
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
