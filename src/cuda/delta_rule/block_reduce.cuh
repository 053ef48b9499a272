// Per-step reduction over the columns of a block, for the backward's per-row vectors (dk, dq: sums
// over value columns j of S[k, j] * x_j) and per-column scalars (dbeta, the GDN gate terms).
//
// Each thread holds NVEC vectors of KPT row slots for its own column, and NSC
// scalars that are equal on all lanes of its column group. Rows: row_of<KPT>(gl, i). Steps:
//   1. xor-shuffles across the column groups of a warp (lanes gl, gl + L, ...): lanes gl < L of
//      each warp then hold the warp's sum for their rows;
//   2. those lanes write them to shared memory, one row of floats per warp;
//   3. one __syncthreads; thread `row` (< KMAX) then sums its row over the warps in a fixed order.
// Buffers and barriers (end_of_step): with NB = 2 buffers the block synchronizes after every step
// (buffer n % 2 is written again at step n + 2, after the barrier of step n + 1, which every thread
// reaches only after its reads of step n). With NB = 4 (KMAX <= 128, session 7) it synchronizes after
// every second step and then does the post-barrier work of both steps in order: buffer n % 4 is
// written again at step n + 4, in the pair after next, which a warp starts only after the barrier
// that ends the next pair, reached by every thread only after its reads of step n. Fewer barriers
// let the warps of a block drift apart by a step (the backward passes are partly latency-bound).
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// NB shared buffers of the per-step column sums: 4 fit in the 48 KiB of static shared memory beside
// the state tile for KMAX <= 128 (launch_recurrent_fixed picks), 2 always.
template <int KMAX, int NVEC, int NSC, int NB>
struct ColumnReduceSmem {
  static constexpr int kRow = NVEC * KMAX + NSC;
  static constexpr int kBuffers = NB;
  float red[NB][kWarps][kRow];
  float qk[NB][2][KMAX];  // the step's (normalized) q and k rows, written by the first group
};

// Called by every thread at the end of step number n (0-based, in processing order) of a sequence of
// `len` steps, after writing buffer n % NB (see step_buffer): synchronizes the block and runs
// post(t, buffer) for the steps whose sums are complete, in processing order. `t_prev` keeps the
// time index of a step waiting for its partner (NB = 4).
// (32-bit counters: launch_recurrent refuses sequences of 2^31 tokens or more.)
template <int NB>
__device__ __forceinline__ int step_buffer(int32_t n) {
  return n & (NB - 1);
}
template <int NB, typename Post>
__device__ __forceinline__ void end_of_step(int32_t& n, int64_t len, int64_t t, int32_t& t_prev, Post&& post) {
  static_assert(NB == 2 || NB == 4, "2 or 4 buffers");
  const int buf = step_buffer<NB>(n);
  ++n;
  if constexpr (NB == 2) {
    __syncthreads();
    post(t, buf);
  } else {
    const bool pair_done = (n & 1) == 0;  // the second step of a pair; else maybe a lone last step
    if (pair_done || n == len) {
      __syncthreads();
      if (pair_done) post(t_prev, step_buffer<NB>(n - 2));
      post(t, buf);
    } else {
      t_prev = static_cast<int32_t>(t);
    }
  }
}

template <int KMAX, int L, int KPT, int NVEC, int NSC, int NB>
__device__ __forceinline__ void column_reduce_write(ColumnReduceSmem<KMAX, NVEC, NSC, NB>& sm, int buf,
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
template <int KMAX, int NVEC, int NSC, int NB>
__device__ __forceinline__ float column_sum(const ColumnReduceSmem<KMAX, NVEC, NSC, NB>& sm, int buf, int slot) {
  float acc = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) acc += sm.red[buf][w][slot];
  return acc;
}

}  // namespace flashgrad::cuda_detail::delta_rule
