// B2's A tiles: stage 1's fp32 A (UT transform, [rows, HV, 64], lower triangle) loaded for one
// (chunk, value head) item and split into hi / lo tiles of T, as the fused B2 (chunked_grads_mma.cuh)
// and the split B2b (chunked_grads_split.cuh) take it. Two steps so that a kernel can issue the loads
// early and consume them after other work (the split B2b issues them before its copies: session 20).
#pragma once

#include <cstdint>

#include "chunked_mma_ldmatrix.cuh"  // split_pair
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

// Thread tid of a 256-thread item loads pieces e = tid + 256 p (p < 4): row i = e / 16, columns
// j0 = 4 (e % 16) + [0, 4) of A[row0 + i][hv][.] (pitch HV * 64 floats per row); rows i >= L and pieces
// right of the diagonal (j0 > i) read as zeros without a load.
__device__ __forceinline__ void load_a_pieces(const float* A, int64_t row0, int64_t hv, int64_t HV, int L, int tid,
                                              float4 (&y)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int e = tid + 256 * p, i = e >> 4, j0 = 4 * (e & 15);
    y[p] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < L && j0 <= i) y[p] = *reinterpret_cast<const float4*>(A + ((row0 + i) * HV + hv) * kChunkSize + j0);
  }
}

// The pieces of load_a_pieces masked to columns j <= i (the stored rows may hold anything above the
// diagonal) and split into hi / lo T tiles of pitch ldp: hi[i][j] + lo[i][j] = A[i][j] to ~2^-16.
template <typename T>
__device__ __forceinline__ void store_a_split(const float4 (&y)[4], T* hi, T* lo, int ldp, int tid) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int e = tid + 256 * p, i = e >> 4, j0 = 4 * (e & 15);
    const float m[4] = {y[p].x, j0 + 1 <= i ? y[p].y : 0.f, j0 + 2 <= i ? y[p].z : 0.f, j0 + 3 <= i ? y[p].w : 0.f};
    uint2 h, l;
    mma::split_pair<T>(m[0], m[1], h.x, l.x);
    mma::split_pair<T>(m[2], m[3], h.y, l.y);
    *reinterpret_cast<uint2*>(hi + i * ldp + j0) = h;
    *reinterpret_cast<uint2*>(lo + i * ldp + j0) = l;
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
