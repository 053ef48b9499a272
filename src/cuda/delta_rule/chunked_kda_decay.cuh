// Per-channel decay helpers of the KDA chunked stages (chunked_kda.h), block-wide (128 threads):
// the per-channel cumulative gate of a chunk, and the decayed lower-triangular product
//   out_ij = sum_d x_id y_jd exp(G_id - G_jd)   (j < i, or j <= i when `inclusive`; 0 above)
// in fp32, for 64 x 64 chunks.
//
// Rows past the chunk's length L must read x = y = 0 and hold G_i = G_{L-1} (the cumulative sum of
// zero gates), so every exponent formed below stays <= 0 and 0 * exp(...) is never 0 * inf.
#pragma once

#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Chunk rows r < 64 of the per-channel gate into G[r * ldg + d] as the cumulative sum over rows
// (rows >= L read g = 0). Also writes G to the intermediates (rows < L). Ends with a barrier.
template <typename T, int KMAX>
__device__ __forceinline__ void kda_load_cumulative_gate(const View& g, const ChunkInfo& ci, int64_t hv,
                                                         float* G, int ldg, float* G_out, int64_t row0,
                                                         int64_t HV) {
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunkSize * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;  // consecutive threads: consecutive channels (coalesced)
    G[r * ldg + d] = r < ci.len ? load_elem<T>(g, off4(g, ci.b, ci.t0 + r, hv, d)) : 0.f;
  }
  __syncthreads();
  if (tid < KMAX) {  // one thread per channel runs down the rows
    float acc = 0.f;
    for (int r = 0; r < kChunkSize; ++r) {
      acc += G[r * ldg + tid];
      G[r * ldg + tid] = acc;
    }
  }
  __syncthreads();
  if (G_out)
    for (int e = tid; e < ci.len * KMAX; e += kChunkThreads) {
      const int r = e / KMAX, d = e % KMAX;
      G_out[((row0 + r) * HV + hv) * KMAX + d] = G[r * ldg + d];
    }
}

// Chunk rows of the stored G [rows, HV, K] (stage 1's output) into G[r * ldg + d]; rows >= L
// repeat row L - 1. No barrier.
template <int KMAX>
__device__ __forceinline__ void kda_read_gate(const float* G_in, const ChunkInfo& ci, int64_t row0, int64_t hv,
                                              int64_t HV, float* G, int ldg) {
  for (int e = threadIdx.x; e < kChunkSize * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;
    const int rr = r < ci.len ? r : ci.len - 1;
    G[r * ldg + d] = G_in[((row0 + rr) * HV + hv) * KMAX + d];
  }
}

// Scratch the product needs: [64][KMAX + 1] floats.
template <int KMAX>
constexpr int64_t kda_decay_stage_bytes() {
  return static_cast<int64_t>(sizeof(float)) * kChunkSize * (KMAX + 1);
}

// out[i * ldo + j] for all i, j < 64 (see the file comment); x(i, d), y(j, d) return fp32 values,
// G is [64][ldg] in shared memory, `stage` [64][KMAX + 1] floats of shared scratch. The caller
// has a barrier between writing x, y, G and the call; the call ends with one.
//
// Diagonal 16 x 16 blocks: one exp per term (exp(G_id - G_jd), j <= i). Off-diagonal blocks of
// row sub-chunk I (rows [16 I, 16 I + 16), columns j < 16 I): with r = 16 I,
//   stage[a]      = x_{r + a} o exp(G_{r + a} - G_r)     (a < 16; exponent <= 0)
//   stage[16 + j] = y_j o exp(G_r - G_j)                  (j < r;  exponent <= 0)
//   out_{r + a, j} = stage[a] . stage[16 + j]
// Stage rows are padded to KMAX + 1 floats so that threads with consecutive j hit distinct banks.
template <int KMAX, typename XF, typename YF>
__device__ __forceinline__ void kda_decayed_lower(XF&& x, YF&& y, const float* G, int ldg, bool inclusive,
                                                  float* out, int ldo, float* stage) {
  constexpr int C = kChunkSize, LDS = KMAX + 1;
  const int tid = threadIdx.x;
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    if (j / 16 != i / 16) {
      if (j > i) out[i * ldo + j] = 0.f;  // upper off-diagonal blocks; lower ones come below
      continue;
    }
    float s = 0.f;
    if (j < i || (inclusive && j == i))
      for (int d = 0; d < KMAX; ++d) s += x(i, d) * y(j, d) * expf(G[i * ldg + d] - G[j * ldg + d]);
    out[i * ldo + j] = s;
  }
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, nj = 16 * I;
    __syncthreads();  // the previous sub-chunk's readers of `stage` are done
    for (int e = tid; e < (16 + nj) * KMAX; e += kChunkThreads) {
      const int a = e / KMAX, d = e % KMAX;
      const float gr = G[r0 * ldg + d];
      stage[a * LDS + d] = a < 16 ? x(r0 + a, d) * expf(G[(r0 + a) * ldg + d] - gr)
                                  : y(a - 16, d) * expf(gr - G[(a - 16) * ldg + d]);
    }
    __syncthreads();
    for (int e = tid; e < 16 * nj; e += kChunkThreads) {
      const int a = e / nj, j = e % nj;
      const float* xs = stage + a * LDS;
      const float* ys = stage + (16 + j) * LDS;
      float s = 0.f;
#pragma unroll 8
      for (int d = 0; d < KMAX; ++d) s += xs[d] * ys[d];
      out[(r0 + a) * ldo + j] = s;
    }
  }
  __syncthreads();
}

}  // namespace flashgrad::cuda_detail::delta_rule
