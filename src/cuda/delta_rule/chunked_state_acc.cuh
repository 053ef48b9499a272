// The K x 32 state slice that the chunked state stages keep in mma accumulators (GDN's legacy B1
// chunked_state_backward.cuh; KDA's session-6 B1 used it too until run 9.3 replaced that kernel):
// a block of 4 warps per (sequence, value head, 32 value columns [col0, col0 + 32)); warp wp owns state
// rows [16 (wp + 4 mt), +16), and s[mt][nt][e] is the element (row 16 (wp + 4 mt) + acc_row(e), column
// 8 nt + acc_col(e)) of the slice. Its loads and stores, shared by the kernels (their machine code
// is the same as with the copies these replaced). (Not recurrent_common.cuh's load_state_slice, which
// stages a slice of the recurrent kernels through shared memory.)
#pragma once

#include <cstdint>

#include "chunked_mma.cuh"     // acc_row, acc_col
#include "chunked_output.cuh"  // store_split
#include "chunked_stages.h"    // ChunkedArgs

namespace flashgrad::cuda_detail::delta_rule {

// Row and column (within the slice) of element e of tile (mt, nt). The column is formed in int and only
// then added to a 64-bit col0 (the order the kernels had; another order changes their code).
__device__ __forceinline__ int state_acc_row(int wp, int mt, int e) { return 16 * (wp + 4 * mt) + mma::acc_row(e); }
__device__ __forceinline__ int state_acc_col(int nt, int e) { return 8 * nt + mma::acc_col(e); }

// s = x[n, hv, rows, col0 + cols] (fp32 [N, HV, K, V]: h0 / dht), zeros when x is null.
template <int MT, int NT>
__device__ __forceinline__ void load_state_acc(float (&s)[MT][NT][4], const View& x, int64_t n, int64_t hv,
                                               int64_t col0, int wp) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] =
            x.p ? static_cast<const float*>(x.p)[off4(x, n, hv, state_acc_row(wp, mt, e), col0 + state_acc_col(nt, e))]
                : 0.f;
}

// x[n, hv, rows, col0 + cols] = s (fp32 [N, HV, K, V]: ht / dh0; x not null).
template <int MT, int NT>
__device__ __forceinline__ void store_state_acc(const float (&s)[MT][NT][4], const View& x, int64_t n, int64_t hv,
                                                int64_t col0, int wp) {
  float* p = static_cast<float*>(x.p);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p[off4(x, n, hv, state_acc_row(wp, mt, e), col0 + state_acc_col(nt, e))] = s[mt][nt][e];
}

// The chunk's copy of the slice: to the intermediates (fp32 [num_chunks, HV, K, V] at `states`: a.h or
// a.dh) and to shared memory split hi + lo ([K][ld] tiles of the slice's 32 columns). (The sizes are read
// from `a` here, where they are used, as in the kernels' own copies: read earlier, the code changes.)
template <typename T, int MT, int NT>
__device__ __forceinline__ void store_state_acc_chunk(const float (&s)[MT][NT][4], float* states, const ChunkedArgs& a,
                                                      int64_t c, int64_t hv, int64_t col0, T* hi, T* lo, int ld, int wp) {
  float* chunk_state = states + (c * a.HV + hv) * a.K * a.V;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = state_acc_row(wp, mt, e), col = state_acc_col(nt, e);
        chunk_state[d * a.V + col0 + col] = s[mt][nt][e];
        store_split<T>(s[mt][nt][e], &hi[d * ld + col], &lo[d * ld + col]);
      }
}

}  // namespace flashgrad::cuda_detail::delta_rule
