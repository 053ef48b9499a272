// A warp's slice of the state in the transposed KDA state kernels: h^T in stage 2
// (kda_state_transposed_kernel, chunked_kda_state_transposed.cuh), dh^T in B1
// (kda_state_backward_transposed_kernel, chunked_kda_state_backward_transposed.cuh). The block
// covers BV = 8 WARPS value columns of one value head; warp wp holds value columns
// [vc0, +16) = [16 (wp % NG), +16) and key channels [kc0, +K/2) = [K/2 (wp / NG), +K/2) of them,
// NG = WARPS / 2, as NK = K/16 mma accumulator tiles (16 value columns x 8 key channels).
// Where its elements sit, the lane addresses of the ldmatrix fragments its products read, and the
// moves both kernels make with it: from / to a [N, HV, K, V] state view, to the per-chunk
// intermediates, the decay by exp(G_{L-1}), and the exchange of the two channel halves' partial
// sums (KdaHalfSums).
#pragma once

#include "chunked_mma_ldmatrix.cuh"  // ldmatrix_x4
#include "chunked_stages.h"           // ChunkedArgs
#include "recurrent_common.cuh"       // View, off4

namespace flashgrad::cuda_detail::delta_rule {

template <int KMAX, int WARPS>
struct KdaStateSlice {
  static constexpr int NG = WARPS / 2, KH = KMAX / 2, NK = KH / 8, BV = 8 * WARPS;
  // The block's sequence n (blockIdx.x), value head hv (blockIdx.y), the key head of hv (HV / H
  // value heads per key head), and first value column col0 (blockIdx.z BV).
  int64_t n, hv, head, col0;
  int grp, tig;  // the lane's accumulator row group and thread in group (lane / 4, lane % 4)
  int vc0;       // the warp's first value column inside the block's BV
  int kh, kc0;   // its channel half (0, 1) and first key channel (K/2 kh)
  // ldmatrix lane addresses inside a 16 x 16 block of a row-major tile: nb_* for non-trans B
  // fragments of two 8-column tiles (rows +0 / +8 by lane / 16, columns +0 / +8 by (lane / 8) % 2)
  // and for .trans A fragments; tb_* for .trans B fragments (rows by (lane / 8) % 2, columns by
  // lane / 16).
  int nb_r, nb_c, tb_r, tb_c;
  __device__ explicit KdaStateSlice(const ChunkedArgs& a)
      : n(blockIdx.x), hv(blockIdx.y), head(hv / (a.HV / a.H)), col0(static_cast<int64_t>(blockIdx.z) * BV) {
    // threadIdx after blockIdx: the order of the reads in the kernels whose SASS was tested (the
    // other order changes it).
    const int tid = threadIdx.x, lane = tid & 31, wp = tid / 32;
    grp = lane >> 2, tig = lane & 3;
    vc0 = 16 * (wp % NG), kh = wp / NG, kc0 = KH * kh;
    nb_r = 8 * (lane >> 4) + (lane & 7), nb_c = 8 * ((lane >> 3) & 1);
    tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);
  }
  // Accumulator element e of a tile: value column vc0 + grp + 8 (e / 2) (the tile's row), column
  // 2 tig + e % 2 of the tile (a key channel of the state, tile nk: kc0 + 8 nk + tcol(e); or a chunk
  // row of the products' v_new^T / dv_new^T).
  __device__ int vcol(int e) const { return vc0 + grp + 8 * (e >> 1); }
  __device__ int tcol(int e) const { return 2 * tig + (e & 1); }

  // x = the slice of state view v (fp32 [N, HV, K, V]) of sequence n, head hv, value columns
  // col0 + [0, BV); zeros without a view.
  __device__ __forceinline__ void load(float (&x)[NK][4], const View& v) const {
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        x[nk][e] = v.p ? static_cast<const float*>(v.p)[off4(v, n, hv, kc0 + 8 * nk + tcol(e), col0 + vcol(e))] : 0.f;
  }
  // The slice x into state view v (which exists).
  __device__ __forceinline__ void store(const float (&x)[NK][4], const View& v) const {
    float* out = static_cast<float*>(v.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[off4(v, n, hv, kc0 + 8 * nk + tcol(e), col0 + vcol(e))] = x[nk][e];
  }
  // The slice x into one chunk's state, fp32 [K][V] row-major at states + chunk_off (V columns per
  // key channel), value columns col0 + [0, BV): element e of tile nk at channel kc0 + 8 nk + 2 tig
  // (+ 1 for odd e), column col0 + vc0 + grp (+ 8 for e >= 2). (The base and the chunk's offset
  // come apart, not as one pointer: so the address sums stay those the kernels were tested with.)
  __device__ __forceinline__ void store_chunk(const float (&x)[NK][4], float* states, int64_t chunk_off,
                                              int64_t V) const {
    float* at = states + chunk_off + col0 + (kc0 + 2 * tig) * V + vc0 + grp;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk) {
      float* q = at + 8 * nk * V;
      q[0] = x[nk][0], q[V] = x[nk][1], q[8] = x[nk][2], q[V + 8] = x[nk][3];
    }
  }
  // x = x diag(decay) over the slice's channels: decay[d] multiplies key channel d (a chunk's
  // exp(G_{L-1}), KdaGateSlots::decay), read as float2 pairs (channels kc0 + 8 nk + 2 tig, + 1).
  __device__ __forceinline__ void scale_channels(float (&x)[NK][4], const float* decay) const {
    const float* dec = decay + kc0;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk) {
      const float2 d = *reinterpret_cast<const float2*>(dec + 8 * nk + 2 * tig);
      x[nk][0] *= d.x, x[nk][1] *= d.y, x[nk][2] *= d.x, x[nk][3] *= d.y;
    }
  }
  // .trans B fragments of the slice's state tiles 2 (np + q) + {0, 1}, q = 0, 1, from a row-major
  // [C][ld] tile of chunk rows x key channels: its 16 x 16 blocks (rows 16 rb + [0, 16), channels
  // kc0 + 16 (np + q) + [0, 16)), each as (rows, channels), (rows + 8, ..), (.., channels + 8),
  // (rows + 8, channels + 8).
  template <typename T>
  __device__ __forceinline__ void ldmatrix_trans_pair(uint32_t (&b)[2][4], const T* tile, int ld, int rb,
                                                      int np) const {
#pragma unroll
    for (int q = 0; q < 2; ++q) mma::ldmatrix_x4<true>(b[q], tile + (16 * rb + tb_r) * ld + kc0 + 16 * (np + q) + tb_c);
  }
};

// The partial sums p[8][4] over one channel half (p[j8]: chunk rows [8 j8, +8) of the slice's
// v_new^T or dv_new^T) that the two warps of a column group exchange in shared memory,
// [8][THREADS] float4: thread tid's j8-th at [j8 THREADS + tid]. The partner of tid is the same
// lane of the other channel half's warp, tid ^ 32 NG.
template <int THREADS>
struct KdaHalfSums {
  static constexpr int64_t kBytes = sizeof(float) * 32 * THREADS;
  float4* at;
  __device__ __forceinline__ void put(const float (&p)[8][4], int tid) const {
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) at[j8 * THREADS + tid] = make_float4(p[j8][0], p[j8][1], p[j8][2], p[j8][3]);
  }
  __device__ __forceinline__ float4 get(int j8, int thread) const { return at[j8 * THREADS + thread]; }
};

}  // namespace flashgrad::cuda_detail::delta_rule
