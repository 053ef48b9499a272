// B1's dv_new rows (GDN's legacy chunked_state_backward.cuh; KDA's session-6 B1 until run 9.3): warp wp's
// accumulators hold rows [16 wp, +16) of the chunk's dv_new over the slice's 32 value columns
// (acc[nt][e]: row 16 wp + acc_row(e), column 8 nt + acc_col(e)). They go to the intermediate dv_new
// (fp32 [rows, HV, V], rows < L) and, negated and split hi + lo, to shared memory ([C][ld] tiles; rows
// past L zero) for dh_c's w^T (-dv_new) product. Was shared by two kernels (their machine code is the
// same as with the copies this replaced; the sizes are read from `a` where they are used, as there).
#pragma once

#include <cstdint>

#include "chunked_mma.cuh"     // acc_row, acc_col
#include "chunked_output.cuh"  // store_split
#include "chunked_stages.h"    // ChunkedArgs

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int NT>
__device__ __forceinline__ void store_dv_new_rows(const float (&acc)[NT][4], const ChunkedArgs& a, int64_t row0,
                                                  int64_t hv, int64_t col0, int L, T* neg_hi, T* neg_lo, int ld,
                                                  int wp) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
      const float val = i < L ? acc[nt][e] : 0.f;
      if (i < L) a.dv_new[((row0 + i) * a.HV + hv) * a.V + col0 + col] = val;
      store_split<T>(-val, &neg_hi[i * ld + col], &neg_lo[i * ld + col]);
    }
}

}  // namespace flashgrad::cuda_detail::delta_rule
