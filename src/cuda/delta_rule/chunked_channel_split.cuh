// The key-channel split of the serial stages (stage 2's and B1's KSPLIT, chunked_state.cuh and
// chunked_state_backward_transposed.cuh): KSPLIT warps share each group of 16 value columns, warp wp
// of a block with NG groups holding group wp % NG and key-channel part wp / NG of the state. A product
// over the key channels (h^T w^T in stage 2, dh^T k^T in B1) is then summed over the group's parts here.
#pragma once

#include "chunked_stage_sync.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// p: this thread's 32 partial sums (the 8 accumulator tiles of a warp's 16 x 64 product). Every warp
// parks them in its own slots swap[j8 * THREADS + tid] (swap: [8][THREADS] float4), waits at the
// stage's block barrier (kBar: chunked_stage_sync.cuh), then holds the sum over its group's KSPLIT
// parts, the same bits in every warp of the group: two parts as its own plus its partner's
// (a + b == b + a); four read back in part order. Slot of part
// q of lane tid's group: tid % (32 NG) + 32 NG q. The caller's next block barrier orders the slots'
// next writes after these reads.
template <int KSPLIT, int THREADS, int NG, int kBar>
__device__ __forceinline__ void sum_channel_parts(float (&p)[8][4], float4* swap, int tid) {
  static_assert(KSPLIT == 2 || KSPLIT == 4, "two or four channel parts");
#pragma unroll
  for (int j8 = 0; j8 < 8; ++j8) swap[j8 * THREADS + tid] = make_float4(p[j8][0], p[j8][1], p[j8][2], p[j8][3]);
  stage_sync<kBar, THREADS>();
  if constexpr (KSPLIT == 2) {
    const int partner = tid ^ (32 * NG);  // same lane, the other channel half of the group
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      const float4 x = swap[j8 * THREADS + partner];
      p[j8][0] += x.x;
      p[j8][1] += x.y;
      p[j8][2] += x.z;
      p[j8][3] += x.w;
    }
  } else {
    const int slot0 = tid % (32 * NG);
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      float4 s = swap[j8 * THREADS + slot0];
#pragma unroll
      for (int q = 1; q < KSPLIT; ++q) {
        const float4 x = swap[j8 * THREADS + slot0 + 32 * NG * q];
        s.x += x.x;
        s.y += x.y;
        s.z += x.z;
        s.w += x.w;
      }
      p[j8][0] = s.x;
      p[j8][1] = s.y;
      p[j8][2] = s.z;
      p[j8][3] = s.w;
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
