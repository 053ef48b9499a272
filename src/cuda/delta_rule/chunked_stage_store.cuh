// Stores of the chunk-entry states h_c by the warps that hold h^T in mma accumulators: stage 2
// (chunked_state.cuh) and the states rebuilt from v_new (chunked_state_from_vnew.cuh).
#pragma once

#include "chunked_stages.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// h_c of chunk c (global chunk index), value head hv, into the intermediates: T when the backward
// asked for 16-bit storage (a.h16), else fp32 (a.h); layout [num_chunks, HV, K, V]. The warp's
// accumulator element e of tile nk is key channel kc0 + 8 nk + 2 tig + (e & 1) and value column
// col0 + vc0 + grp + 8 (e >> 1) (h^T's rows are value columns, so a lane holds no two neighbours
// of one of h's rows: one store per element).
template <typename T, int NK>
__device__ __forceinline__ void store_state_tiles(const ChunkedArgs& a, int64_t c, int64_t hv, int64_t col0, int vc0,
                                                  int kc0, int grp, int tig, const float (&hT)[NK][4]) {
  auto vcol = [&](int e) { return vc0 + grp + 8 * (e >> 1); };
  auto tcol = [&](int e) { return 2 * tig + (e & 1); };
  const int64_t at = (c * a.HV + hv) * a.K * a.V + col0;
  if (a.h16) {
    T* hc = static_cast<T*>(a.h16) + at;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = from_f<T>(hT[nk][e]);
  } else {
    float* hc = a.h + at;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = hT[nk][e];
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
