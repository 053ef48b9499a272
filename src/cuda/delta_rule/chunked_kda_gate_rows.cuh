// The gate G (fp32 [rows, HV, K], cumulative log decay within each chunk) as the transposed KDA
// state kernels read it: stage 2 (kda_state_transposed_kernel, chunked_kda_state_transposed.cuh)
// and B1 (kda_state_backward_transposed_kernel, chunked_kda_state_backward_transposed.cuh). Both
// form decayed key rows (kd = k o exp(G_{L-1} - G); B1 also qg = q o exp(G)) with the same thread
// layout, and both keep G_{L-1} and exp(G_{L-1}) of a chunk in a two-stage gate slot in shared
// memory. Functions of the kernels' arguments and this thread's layout; the kernels call them
// with the values their former lambdas captured, so the machine code is the same.
#pragma once

#include "chunked_rows.cuh"  // chunk_row0
#include "chunked_stages.h"  // ChunkedArgs, ChunkInfo, kChunkSize

namespace flashgrad::cuda_detail::delta_rule {

// exp2_ftz, kLog2e: recurrent_common.cuh (shared with the GDN stages' decays).

// Which key channels of which chunk row a thread forms (kd, qg): kLanes adjacent threads share a
// chunk row (row fr = tid / kLanes), kPer channels each, as 8-channel pieces q < kPer / 8 at
// channels ch(q) = 16 fp + 16 kLanes (q / 2) + 8 (q % 2), fp = tid % kLanes. So each 16-byte
// shared access (and k load) of a quarter warp, two rows x 4 lanes, hits 8 distinct 16-byte bank
// groups (row pitch 272 bytes = 16 mod 128, lanes 32 bytes apart).
template <int KMAX, int THREADS>
struct KdaRowPieces {
  static constexpr int kLanes = THREADS / kChunkSize, kPer = KMAX / kLanes;
  static_assert(THREADS % kChunkSize == 0 && kPer % 16 == 0 && kLanes <= 32,
                "chunk rows over the block, pairs of 8-channel pieces");
  static_assert(KMAX / 4 <= THREADS, "one float4 of G_{L-1} per thread (kda_load_gate_last)");
  int fr, fp;  // chunk row, and this thread's place among the row's kLanes threads
  __device__ explicit KdaRowPieces(int tid) : fr(tid / kLanes), fp(tid % kLanes) {}
  __device__ int ch(int q) const { return 16 * fp + 16 * kLanes * (q >> 1) + 8 * (q & 1); }
};

// This thread's kPer gate values of chunk row rp.fr of chunk ci (head hv): g[8 q + j] at channel
// rp.ch(q) + j, as float4 loads (g[4 i + 0..3] = channels rp.ch(i / 2) + 4 (i % 2) + 0..3); 0 past
// the chunk. G's row r of the chunk is at ((chunk_row0 + r) HV + hv) K.
template <int KMAX, int THREADS>
__device__ __forceinline__ void kda_load_gate_rows(const ChunkedArgs& a, int64_t hv,
                                                   const KdaRowPieces<KMAX, THREADS>& rp, const ChunkInfo& ci,
                                                   float (&g)[KdaRowPieces<KMAX, THREADS>::kPer]) {
  constexpr int kPer = KdaRowPieces<KMAX, THREADS>::kPer;
  const bool ok = rp.fr < ci.len;
  const float* src = a.G + ((chunk_row0(ci, a.T) + (ok ? rp.fr : 0)) * a.HV + hv) * a.K;
#pragma unroll
  for (int i = 0; i < kPer / 4; ++i) {
    const float4 v = ok ? *reinterpret_cast<const float4*>(src + rp.ch(i >> 1) + 4 * (i & 1))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    g[4 * i] = v.x, g[4 * i + 1] = v.y, g[4 * i + 2] = v.z, g[4 * i + 3] = v.w;
  }
}

// G_{L-1} of chunk ci (its last row, L = ci.len), channels [4 tid, +4) for threads tid < KMAX / 4
// (zeros for the others).
template <int KMAX>
__device__ __forceinline__ float4 kda_load_gate_last(const ChunkedArgs& a, int64_t hv, int tid, const ChunkInfo& ci) {
  return tid < KMAX / 4
             ? reinterpret_cast<const float4*>(a.G + ((chunk_row0(ci, a.T) + ci.len - 1) * a.HV + hv) * a.K)[tid]
             : make_float4(0.f, 0.f, 0.f, 0.f);
}

// The gate slots in shared memory, [2 stages][2 KMAX] floats: stage s holds G_{L-1} at
// [2 KMAX s + d] and exp(G_{L-1}) (the chunk's total decay) at [2 KMAX s + KMAX + d].
template <int KMAX>
struct KdaGateSlots {
  static constexpr int64_t kBytes = sizeof(float) * 4 * KMAX;
  float* at;
  __device__ const float* last(int s) const { return at + 2 * KMAX * s; }
  __device__ const float* decay(int s) const { return at + 2 * KMAX * s + KMAX; }
  // Stage s's slot from G_{L-1}'s channels [4 tid, +4) (threads tid < KMAX / 4, as loaded by
  // kda_load_gate_last).
  __device__ __forceinline__ void put(const float4& gl, int s, int tid) const {
    if (tid < KMAX / 4) {
      float* p = at + 2 * KMAX * s + 4 * tid;
      *reinterpret_cast<float4*>(p) = gl;
      *reinterpret_cast<float4*>(p + KMAX) =
          make_float4(exp2_ftz(gl.x * kLog2e), exp2_ftz(gl.y * kLog2e), exp2_ftz(gl.z * kLog2e),
                      exp2_ftz(gl.w * kLog2e));
    }
  }
};

}  // namespace flashgrad::cuda_detail::delta_rule
