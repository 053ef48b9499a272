// Chunked stage 2 ("state"), one block of 128 threads (4 warps) per (sequence, value head,
// slice of 32 value columns), running over the sequence's chunks in order:
//   store h_c (fp32, the chunk-entry state);  v_new = u - w h_c;
//   h_{c+1} = exp(G_{L-1}) h_c + (k exp(G_{L-1} - G))^T v_new.
// Starts from initial_state (or zeros) and writes the final state (when asked).
//
// The state slice (K x 32, fp32) lives in the mma accumulators: warp wp owns state rows
// [16 (wp + 4 mt), +16) for mt < K / 64, columns [8 nt, 8 nt + 8) for nt < 4 (accumulator
// layout: chunked_mma.cuh). Each chunk it is copied into shared memory as hi + lo (both T), the
// B operands of w h = w hi + w lo. The state update multiplies k exp(G_{L-1} - G) and v_new
// as hi + lo parts too (hi hi + lo hi + hi lo), so h keeps fp32 accuracy; v_new is stored in T
// for stage 3. (CPU emulation against the float64 reference, bf16: h 4e-6 - 6e-6 relative RMS
// with the splits, 2.4e-3 - 3.1e-3 with kd and v_new rounded to T.)
#pragma once

#include "chunked_mma.cuh"
#include "chunked_rows.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kStateCols = 32;  // value columns per stage-2 block

template <typename T, int KMAX>
struct StateSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDH = kStateCols + 8;
  T* hs;     // [KMAX][LDH] h_c rounded to T (hi part)
  T* hs_lo;  // [KMAX][LDH] h_c - hi, rounded to T: w h_c = w hi + w lo keeps h's fp32 accuracy
  T* ws;     // [C][LDK] w rows of the chunk
  T* kd;     // [C][LDK] k_j exp(G_{L-1} - G_j), hi part
  T* kd_lo;  // [C][LDK] its lo part
  T* vn;     // [C][LDH] v_new rounded to T (what stage 3 reads), hi part
  T* vn_lo;  // [C][LDH] v_new - hi, rounded to T
  float* G;  // [C]
  static constexpr int64_t bytes() {
    return sizeof(T) * (2 * KMAX * LDH + 3 * C * LDK + 2 * C * LDH) + sizeof(float) * C;
  }
  __device__ explicit StateSmem(unsigned char* raw) {
    hs = reinterpret_cast<T*>(raw);
    hs_lo = hs + KMAX * LDH;
    ws = hs_lo + KMAX * LDH;
    kd = ws + C * LDK;
    kd_lo = kd + C * LDK;
    vn = kd_lo + C * LDK;
    vn_lo = vn + C * LDH;
    G = reinterpret_cast<float*>(vn_lo + C * LDH);
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_state_kernel(ChunkedArgs a) {
  using S = StateSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDH = S::LDH, MT = KMAX / 64, NT = kStateCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kStateCols;
  const int tid = threadIdx.x, wp = tid / 32;
  auto state_row = [&](int mt, int e) { return 16 * (wp + 4 * mt) + mma::acc_row(e); };
  auto state_col = [&](int nt, int e) { return 8 * nt + mma::acc_col(e); };

  float h[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        h[mt][nt][e] = a.h0.p ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, state_row(mt, e),
                                                                         col0 + state_col(nt, e))]
                              : 0.f;

  const T* w = static_cast<const T*>(a.w);
  T* v_new = static_cast<T*>(a.v_new);
  for (int64_t c = a.seq_first_chunk[n]; c < a.seq_first_chunk[n + 1]; ++c) {
    const ChunkInfo ci = a.chunks[c];
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);

    // h_c: to the intermediates (fp32) and to shared memory (T).
    float* hc = a.h + (c * a.HV + hv) * a.K * a.V;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = state_row(mt, e), col = state_col(nt, e);
          hc[d * a.V + col0 + col] = h[mt][nt][e];
          const T hi = from_f<T>(h[mt][nt][e]);
          sm.hs[d * LDH + col] = hi;
          sm.hs_lo[d * LDH + col] = from_f<T>(h[mt][nt][e] - to_f<T>(hi));
        }
    // This chunk's u elements for the v_new epilogue below, loaded now so that their latency
    // overlaps the w, k loads and the products (in the epilogue they would sit behind the
    // v_new stores, which the compiler cannot reorder them across).
    float u_pre[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
        u_pre[nt][e] = i < L ? a.u[((row0 + i) * a.HV + hv) * a.V + col0 + col] : 0.f;
      }
    if (tid < C) sm.G[tid] = (a.G && tid < L) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
    for (int e = tid; e < C * KMAX; e += kChunkThreads) {
      const int r = e / KMAX, d = e % KMAX;
      sm.ws[r * LDK + d] = r < L ? w[((row0 + r) * a.HV + hv) * a.K + d] : from_f<T>(0.f);
    }
    __syncthreads();
    const float G_last = sm.G[L - 1];
    for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) {
      // exp(G_{L-1} - G_r) with r <= L - 1 (rows past L are zero).
      const float y = r < L ? x * expf(G_last - sm.G[r]) : 0.f;
      const T hi = from_f<T>(y);
      sm.kd[r * LDK + d] = hi;
      sm.kd_lo[r * LDK + d] = from_f<T>(y - to_f<T>(hi));
    });

    // v_new = u - w h_c: warp wp, rows [16 wp, 16 wp + 16), the slice's 32 columns.
    {
      float p[NT][4] = {};
#pragma unroll
      for (int kk = 0; kk < KMAX; kk += 16) {
        uint32_t af[4];
        mma::frag_a(sm.ws, LDK, 16 * wp, kk, af);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bf[2];
          mma::frag_b(sm.hs, LDH, kk, 8 * nt, bf);
          mma::mma16816<T>(p[nt], af, bf);
          mma::frag_b(sm.hs_lo, LDH, kk, 8 * nt, bf);
          mma::mma16816<T>(p[nt], af, bf);
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
            val = u_pre[nt][e] - p[nt][e];
            v_new[at] = from_f<T>(val);
          }
          const T hi = from_f<T>(val);
          sm.vn[i * LDH + col] = hi;
          sm.vn_lo[i * LDH + col] = from_f<T>(val - to_f<T>(hi));
        }
    }
    __syncthreads();

    // h_{c+1} = exp(G_{L-1}) h_c + kd^T v_new.
    const float decay = expf(G_last);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[mt][nt][e] *= decay;
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        uint32_t ah[4], al[4];
        mma::frag_a_trans(sm.kd, LDK, 16 * (wp + 4 * mt), kk, ah);
        mma::frag_a_trans(sm.kd_lo, LDK, 16 * (wp + 4 * mt), kk, al);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bh[2], bl[2];
          mma::frag_b(sm.vn, LDH, kk, 8 * nt, bh);
          mma::frag_b(sm.vn_lo, LDH, kk, 8 * nt, bl);
          mma::mma16816<T>(h[mt][nt], ah, bh);
          mma::mma16816<T>(h[mt][nt], al, bh);
          mma::mma16816<T>(h[mt][nt], ah, bl);
        }
      }
    }
    __syncthreads();  // shared memory is refilled by the next chunk
  }

  if (a.ht.p) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          ht[off4(a.ht, n, hv, state_row(mt, e), col0 + state_col(nt, e))] = h[mt][nt][e];
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
