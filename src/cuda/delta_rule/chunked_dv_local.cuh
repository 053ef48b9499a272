// Chunked backward stage B0 ("dv_local", session 9; where B1 takes 4-warp blocks, the default since
// run 9.3: state_backward_local_wanted, chunked_stages.h): the part of dv_new that does not depend on the state, formed for every chunk at
// once before B1, so that B1's serial chain over a sequence's chunks no longer forms P:
//   dv_local^T = do^T (scale P),  scale P_ij = scale rstd_qi rstd_kj exp(G_i - G_j) (q_raw k_raw^T)_ij
// for j <= i < L (chunked_scaled_p.cuh), written in T where B1 then writes dv_new (a.dv_new16,
// [rows, HV, V]): B1 with kLocal reads a chunk's rows of it (cp.async, waited for at the top of that
// chunk's iteration) and writes dv_new = (dh^T k^T) colscale + dv_local over the same elements.
// Why: ncu of B1 (run 9.2, B8 T4096) put ~58% of its stall samples in the part of the loop that does
// not depend on dh (row scales, P's formation and the barrier its triangular items unbalance); with
// few long sequences (B1 T32768 H16: 32 blocks of 4 warps on 132 SMs, 8.7 us per chunk) that part is
// on the serial chain. Run 9.3: B1 T32768 H16 K=V=128 B0 0.264 + B1 2.960 ms against B1 4.345.
// One block of 8 warps per (chunk, value head); warp wp forms P's item wp and then the value columns
// [16 vg, +16) for vg = wp, wp + 8, ... < V / 16. Rounding: dv_local is stored in T once (as fla's
// chunk-local dv), P enters its product as one T fragment.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_scaled_p.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kDvLocalThreads = 256;

template <typename T, int KMAX>
struct DvLocalSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDP = C + 8;
  static constexpr int64_t kTileBytes = sizeof(T) * C * LDK, kPBytes = sizeof(T) * C * LDP;
  static_assert(kTileBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned tiles");
  T *q, *k;         // [C][LDK] the chunk's raw rows
  T* P;             // [C][LDP] scale P
  float* G;         // [C] cumulative gate (zeros past L)
  float* pscale;    // [C] scale rstd_qi
  float* rstd_k;    // [C]
  T* dout;          // [C][V + 8] the chunk's do rows, all value columns
  static constexpr int64_t bytes(int64_t V) { return 2 * kTileBytes + kPBytes + sizeof(float) * 3 * C + sizeof(T) * C * (V + 8); }
  __device__ explicit DvLocalSmem(unsigned char* raw) {
    q = reinterpret_cast<T*>(raw);
    k = q + C * LDK;
    P = k + C * LDK;
    G = reinterpret_cast<float*>(P + C * LDP);
    pscale = G + C;
    rstd_k = pscale + C;
    dout = reinterpret_cast<T*>(rstd_k + C);  // 16-byte aligned: 2 tiles + P + 3 x 256 bytes
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kDvLocalThreads) chunk_dv_local_kernel(ChunkedArgs a) {
  using S = DvLocalSmem<T, KMAX>;
  constexpr int C = kChunkSize, THREADS = kDvLocalThreads, WARPS = THREADS / 32, LDK = S::LDK, LDP = S::LDP;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  const int LDD = static_cast<int>(a.V) + 8;
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len;
  const int64_t row0 = chunk_row0(ci, a.T);

  key_tile_async<T, KMAX, THREADS>(a.q, ci, head, key_rows_vectorizable(a.q), sm.q, LDK);
  key_tile_async<T, KMAX, THREADS>(a.k, ci, head, key_rows_vectorizable(a.k), sm.k, LDK);
  view_rows_async<T, THREADS>(a.dout, ci, hv, static_cast<int>(a.V), key_rows_vectorizable(a.dout), sm.dout, LDD);
  mma::cp_async_commit();
  if (tid < C) sm.G[tid] = (a.G && tid < L) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
  mma::cp_async_wait<0>();
  __syncthreads();
  {
    constexpr int kLanes = THREADS / C;
    const float rk = tile_row_rstd<T, KMAX, THREADS>(sm.k, LDK, a.l2norm);
    const float rq = tile_row_rstd<T, KMAX, THREADS>(sm.q, LDK, a.l2norm);
    if (tid % kLanes == 0) {
      const int i = tid / kLanes;
      sm.pscale[i] = a.scale * rq;
      sm.rstd_k[i] = rk;
      // B1's row scales of do (ChunkedArgs::rowscale), for rows of the chunk only.
      if (a.rowscale && i < L) a.rowscale[(row0 + i) * a.HV + hv] = a.scale * rq * expf(sm.G[i]);
    }
  }
  __syncthreads();
  // ldmatrix lane addresses (chunked_state_backward_transposed.cuh): nb_* for non-trans B fragments
  // of two 8-column tiles and .trans A fragments of do^T, tb_* for .trans B fragments of P.
  const int nb_r = 8 * (lane >> 4) + (lane & 7), nb_c = 8 * ((lane >> 3) & 1);
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);
  form_scaled_p<T, KMAX, WARPS, false>(sm.q, sm.k, LDK, sm.pscale, sm.rstd_k, sm.G, L, sm.P, nullptr, LDP,
                                       threadIdx.x & 31, threadIdx.x / 32, nb_r, nb_c);
  __syncthreads();

  T* dvl = static_cast<T*>(a.dv_new16);
  for (int vg = wp; vg < a.V / 16; vg += WARPS) {
    const int vc0 = 16 * vg;
    float p[8][4] = {};  // dv_local^T: value columns vc0 + grp (+8), chunk rows 8 j8 + 2 tig + {0, 1}
#pragma unroll
    for (int is = 0; is < C / 16; ++is) {
      uint32_t ad[4];
      mma::ldmatrix_x4<true>(ad, sm.dout + (16 * is + nb_r) * LDD + vc0 + nb_c);
      accumulate_dot_p<T, false>(p, ad, is, sm.P, nullptr, LDP, tb_r, tb_c);
    }
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 8 * j8 + 2 * tig + (e & 1), v = vc0 + grp + 8 * (e >> 1);
        if (j < L) dvl[((row0 + j) * a.HV + hv) * a.V + v] = from_f<T>(p[j8][e]);
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
