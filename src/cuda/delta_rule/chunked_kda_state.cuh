// KDA chunked stage 2 ("state"), one block of 128 threads per (sequence, value head, slice of 32
// value columns), over the sequence's chunks in order:
//   store h_c;  v_new = u - w h_c;
//   h_{c+1} = diag(exp(G_{L-1})) h_c + (k o exp(G_{L-1} - G))^T v_new     (per key channel d)
// Layout and accuracy as the GDN stage (chunked_state.cuh): the K x 32 state slice lives in mma
// accumulators, warp wp owning state rows [16 (wp + 4 mt), +16); operands split hi + lo. The only
// differences are the per-row decay of the state and the per-channel exponent of kd.
#pragma once

#include "chunked_kda_decay.cuh"  // decay_exp
#include "chunked_kda_mma.cuh"
#include "chunked_kda_prefetch.cuh"
#include "chunked_state.cuh"  // kStateCols
#include "chunked_state_acc.cuh"
#include "chunked_tiles.cuh"  // intermediate_tile_async

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX>
struct KdaStateSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDH = kStateCols + 8;
  T *hs, *hs_lo;  // [KMAX][LDH] h_c split
  T* ws;          // [C][LDK] w rows of the chunk
  T *kd, *kd_lo;  // [C][LDK] k o exp(G_{L-1} - G), split
  T *vn, *vn_lo;  // [C][LDH] v_new split
  float* Gl;      // [KMAX] G_{L-1} per channel
  static constexpr int64_t bytes() {
    return sizeof(T) * (2 * KMAX * LDH + 3 * C * LDK + 2 * C * LDH) + sizeof(float) * KMAX;
  }
  __device__ explicit KdaStateSmem(unsigned char* raw) {
    hs = reinterpret_cast<T*>(raw);
    hs_lo = hs + KMAX * LDH;
    ws = hs_lo + KMAX * LDH;
    kd = ws + C * LDK;
    kd_lo = kd + C * LDK;
    vn = kd_lo + C * LDK;
    vn_lo = vn + C * LDH;
    Gl = reinterpret_cast<float*>(vn_lo + C * LDH);
  }
};

// kPrefetch: the next chunk's rows into L2 each step (false: the session-5 schedule, for the
// legacy comparison, FLASHGRAD_CHUNKED_KDA=legacy).
template <typename T, int KMAX, bool kPrefetch = true>
__global__ void __launch_bounds__(kChunkThreads) kda_state_kernel(ChunkedArgs a) {
  using S = KdaStateSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDH = S::LDH, MT = KMAX / 64, NT = kStateCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kStateCols;
  const int tid = threadIdx.x, wp = tid / 32;

  float h[MT][NT][4];
  load_state_acc(h, a.h0, n, hv, col0, wp);

  const T* w = static_cast<const T*>(a.w);
  T* v_new = static_cast<T*>(a.v_new);
  const int64_t c_end = a.seq_first_chunk[n + 1];
  for (int64_t c = a.seq_first_chunk[n]; c < c_end; ++c) {
    const ChunkInfo ci = a.chunks[c];
    const bool has_next = c + 1 < c_end;
    const ChunkInfo cn = a.chunks[has_next ? c + 1 : c];  // issued now, used after the loads below
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    // G rows of the chunk: row r at Gc + r * HV K (formed once, not per element).
    const float* Gc = a.G + (row0 * a.HV + hv) * a.K;
    const int64_t g_stride = a.HV * a.K;
    auto G_at = [&](int r, int d) { return Gc[r * g_stride + d]; };

    store_state_acc_chunk<T>(h, a.h, a, c, hv, col0, sm.hs, sm.hs_lo, LDH, wp);
    if (tid < KMAX) sm.Gl[tid] = G_at(L - 1, tid);
    // w's rows by cp.async (raw T, 16 bytes per copy, rows past L zero-filled; chunked_tiles.cuh),
    // in flight while k is loaded and scaled below.
    intermediate_tile_async<T, KMAX, kChunkThreads>(w, row0, a.HV, hv, a.K, 0, L, sm.ws, LDK);
    mma::cp_async_commit();
    // This thread's u elements (v_new's accumulator layout below) into registers now, in flight
    // during k's loads and scaling.
    float uu[NT][4];
    {
      const float* u0 = a.u + (row0 * a.HV + hv) * a.V + col0;  // row i: + i * HV V
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
          uu[nt][e] = i < L ? u0[i * a.HV * a.V + col] : 0.f;
        }
    }
    // The next chunk's k, G, w, u rows into L2 while this one computes.
    if (kPrefetch && has_next) prefetch_kda_serial_rows<T, kChunkThreads>(a, cn, hv, head, col0, false);
    __syncthreads();
    auto G_in = [&](int r, int d) { return r < L ? G_at(r, d) : 0.f; };
    kda_key_rows<T, KMAX>(a.k, ci, head, a.l2norm, G_in, [&](int r, int d, float x, float g) {
      // exp(G_{L-1, d} - G_rd) with r <= L - 1: <= 1 (rows past L are zero).
      store_split<T>(r < L ? x * decay_exp(sm.Gl[d] - g) : 0.f, &sm.kd[r * LDK + d], &sm.kd_lo[r * LDK + d]);
    });
    mma::cp_async_wait<0>();
    __syncthreads();  // w's rows are in

    // v_new = u - w h_c: warp wp, rows [16 wp, +16), the slice's 32 columns (w exact in T).
    {
      float p[NT][4] = {};
#pragma unroll
      for (int kk = 0; kk < KMAX; kk += 16) {  // fragments by ldmatrix (kda_mma::ldm_*)
        uint32_t af[4];
        kda_mma::ldm_a(sm.ws, LDK, 16 * wp, kk, af);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t bh[4], bl[4];
          kda_mma::ldm_b_pair(sm.hs, LDH, kk, 16 * np, bh);
          kda_mma::ldm_b_pair(sm.hs_lo, LDH, kk, 16 * np, bl);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t b_h[2] = {bh[2 * t], bh[2 * t + 1]}, b_l[2] = {bl[2 * t], bl[2 * t + 1]};
            mma::mma16816<T>(p[2 * np + t], af, b_h);
            mma::mma16816<T>(p[2 * np + t], af, b_l);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
          float val = 0.f;
          if (i < L) {
            const int64_t at = ((row0 + i) * a.HV + hv) * a.V + col0 + col;
            val = uu[nt][e] - p[nt][e];
            v_new[at] = from_f<T>(val);
          }
          store_split<T>(val, &sm.vn[i * LDH + col], &sm.vn_lo[i * LDH + col]);
        }
    }
    __syncthreads();

    // h_{c+1} = diag(exp(G_{L-1})) h_c + kd^T v_new.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[mt][nt][e] *= decay_exp(sm.Gl[state_acc_row(wp, mt, e)]);
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        uint32_t ah[4], al[4];
        kda_mma::ldm_a_trans(sm.kd, LDK, 16 * (wp + 4 * mt), kk, ah);
        kda_mma::ldm_a_trans(sm.kd_lo, LDK, 16 * (wp + 4 * mt), kk, al);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t bh[4], bl[4];
          kda_mma::ldm_b_pair(sm.vn, LDH, kk, 16 * np, bh);
          kda_mma::ldm_b_pair(sm.vn_lo, LDH, kk, 16 * np, bl);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t b_h[2] = {bh[2 * t], bh[2 * t + 1]}, b_l[2] = {bl[2 * t], bl[2 * t + 1]};
            mma::mma16816<T>(h[mt][2 * np + t], ah, b_h);
            mma::mma16816<T>(h[mt][2 * np + t], al, b_h);
            mma::mma16816<T>(h[mt][2 * np + t], ah, b_l);
          }
        }
      }
    }
    __syncthreads();  // shared memory is refilled by the next chunk
  }

  if (a.ht.p) store_state_acc(h, a.ht, n, hv, col0, wp);
}

}  // namespace flashgrad::cuda_detail::delta_rule
