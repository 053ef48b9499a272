// Per-step reduction over the columns of a block, for the backward's per-row vectors (dk, dq: sums
// over value columns j of S[k, j] * x_j) and per-column scalars (dbeta, the GDN gate terms).
//
// Each thread holds NVEC vectors of KPT row slots for its own column, and NSC
// scalars that are equal on all lanes of its column group. Rows: row_of<KPT>(gl, i). Steps:
//   1. xor-shuffles across the column groups of a warp (lanes gl, gl + L, ...): lanes gl < L of
//      each warp then hold the warp's sum for their rows;
//   2. those lanes write them to shared memory, one row of floats per warp;
//   3. one __syncthreads; thread `row` (< KMAX) then sums its row over the warps in a fixed order.
// The shared buffer is double-buffered by step parity, so one barrier per step suffices: a warp
// can only write buffer (t % 2) again at step t + 2, after the barrier of step t + 1, which every
// thread reaches only after finishing its reads of step t.
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <int KMAX, int NVEC, int NSC>
struct ColumnReduceSmem {
  static constexpr int kRow = NVEC * KMAX + NSC;
  float red[2][kWarps][kRow];
  float qk[2][2][KMAX];  // the step's (normalized) q and k rows, written by the first group
};

template <int KMAX, int L, int KPT, int NVEC, int NSC>
__device__ __forceinline__ void column_reduce_write(ColumnReduceSmem<KMAX, NVEC, NSC>& sm, int buf,
                                                    float (&vec)[NVEC][KPT], float (&sc)[NSC > 0 ? NSC : 1],
                                                    const float (&q)[KPT], const float (&k)[KPT],
                                                    bool write_qk) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int v = 0; v < NVEC; ++v)
#pragma unroll
    for (int i = 0; i < KPT; ++i) vec[v][i] = across_groups_sum<L>(vec[v][i]);
#pragma unroll
  for (int s = 0; s < NSC; ++s) sc[s] = across_groups_sum<L>(sc[s]);
  if (lane < L) {
#pragma unroll
    for (int v = 0; v < NVEC; ++v)
#pragma unroll
      for (int i = 0; i < KPT; ++i) sm.red[buf][warp][v * KMAX + row_of<KPT>(lane, i)] = vec[v][i];
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < NSC; ++s) sm.red[buf][warp][NVEC * KMAX + s] = sc[s];
    }
    if (write_qk && warp == 0) {
#pragma unroll
      for (int i = 0; i < KPT; ++i) {
        sm.qk[buf][0][row_of<KPT>(lane, i)] = q[i];
        sm.qk[buf][1][row_of<KPT>(lane, i)] = k[i];
      }
    }
  }
}

// After the barrier: the block's column sum of vector v at row `row`, or of scalar s.
template <int KMAX, int NVEC, int NSC>
__device__ __forceinline__ float column_sum(const ColumnReduceSmem<KMAX, NVEC, NSC>& sm, int buf, int slot) {
  float acc = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) acc += sm.red[buf][w][slot];
  return acc;
}

}  // namespace flashgrad::cuda_detail::delta_rule
