// Chunked stage 3 ("output"), one block of 128 threads (4 warps) per (chunk, value head), looping
// over the value columns in slices of 64:
//   P = Lower(q k^T exp(G_i - G_j))  (j <= i),  o = scale [exp(G) (q h_c) + P v_new].
// Reads q, k (raw), G, h_c and v_new from stages 1 and 2; writes o. Warp wp owns output rows
// [16 wp, 16 wp + 16).
//
// q's and k's raw rows (exact in T) and the chunk's v_new rows arrive by cp.async; the in-kernel
// L2 norm is applied in fp32 outside the products: P_ij = scale rstd_qi rstd_kj exp(G_i - G_j)
// (q_raw k_raw^T)_ij, and the row factor scale exp(G_i) rstd_qi multiplies (q_raw h_c)_i. P stays
// in registers (accumulators -> A fragments, split hi + lo); h_c (fp32) is split hi + lo into
// shared memory once per slice and read by ldmatrix.trans, like v_new; q by ldmatrix. So every
// product keeps ~fp32 operands except v_new, which stage 2 stores in T.
// kSingle (session 17; the forward's unfused path, chunked_stages.h output_h16_wanted): h_c comes in T
// (ChunkedArgs::h16, stage 2 rounds it once) and P enters its product as one T fragment: the operands
// of the fused state + output kernel (chunked_state.cuh) and of fla's output kernel, at half the mmas
// and half h's bytes (h_c is 64 KiB in fp32 per (chunk, value head) at K = V = 128, the kernel's
// largest read).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kOutputCols = 64;  // value columns per block of the KDA output stage; per slice of stage 3

// Region `keys` holds k's rows for P, then the h_c slice (hi, lo): the second use begins after a
// block barrier. v_new's tile is V + 8 wide (a runtime size). K = V = 128: 71 KiB (three blocks
// per SM).
template <typename T, int KMAX>
struct OutputSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDH = kOutputCols + 8;
  static constexpr int64_t kKeyBytes = sizeof(T) * C * LDK, kStateBytes = sizeof(T) * 2 * KMAX * LDH;
  static constexpr int64_t kRegionBytes = kKeyBytes > kStateBytes ? kKeyBytes : kStateBytes;
  static constexpr int64_t kFixedBytes = kKeyBytes + kRegionBytes + sizeof(float) * 4 * C;
  static_assert(kFixedBytes % 16 == 0 && kKeyBytes % 16 == 0, "16-byte aligned tiles");
  T* q;            // [C][LDK] q rows, raw
  T* k;            // [C][LDK] k rows, raw                   } region `keys`
  T* hs;           // [KMAX][LDH] h_c slice, hi part         }
  T* hs_lo;        // [KMAX][LDH] lo part                     }
  float* G;        // [C]
  float* rowscale;  // [C] scale exp(G_i) rstd_qi
  float* pscale;   // [C] scale rstd_qi
  float* rstd_k;   // [C]
  T* vn;           // [C][V + 8] v_new rows

  __host__ __device__ static int ldv(int64_t V) { return static_cast<int>(V) + 8; }
  __host__ __device__ static int64_t bytes(int64_t V) { return kFixedBytes + sizeof(T) * C * ldv(V); }
  __device__ explicit OutputSmem(unsigned char* raw) {
    q = reinterpret_cast<T*>(raw);
    k = reinterpret_cast<T*>(raw + kKeyBytes);
    hs = k;
    hs_lo = hs + KMAX * LDH;
    G = reinterpret_cast<float*>(raw + kKeyBytes + kRegionBytes);
    rowscale = G + C;
    pscale = rowscale + C;
    rstd_k = pscale + C;
    vn = reinterpret_cast<T*>(raw + kFixedBytes);
  }
};

// x -> (T(x), T(x - T(x))) stored at `hi` and `lo`.
template <typename T>
__device__ __forceinline__ void store_split(float x, T* hi, T* lo) {
  const T h = from_f<T>(x);
  *hi = h;
  *lo = from_f<T>(x - to_f<T>(h));
}

template <typename T, int KMAX, bool kSingle = false>
__global__ void __launch_bounds__(kChunkThreads) chunk_output_kernel(ChunkedArgs a) {
  using S = OutputSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDH = S::LDH;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = threadIdx.x, lane = tid & 31, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);
  const int ldv = S::ldv(a.V);

  // q, k rows (group 0); v_new rows (group 1).
  view_rows_async<T, kChunkThreads>(a.q, ci, head, KMAX, key_rows_vectorizable(a.q), sm.q, LDK);
  view_rows_async<T, kChunkThreads>(a.k, ci, head, KMAX, key_rows_vectorizable(a.k), sm.k, LDK);
  mma::cp_async_commit();
  const T* v_new = static_cast<const T*>(a.v_new);
  for (int c0 = 0; c0 < a.V; c0 += 64)
    intermediate_tile_async<T, 64, kChunkThreads>(v_new, row0, a.HV, hv, a.V, c0, L, sm.vn + c0, ldv);
  mma::cp_async_commit();
  if (tid < C) sm.G[tid] = (a.G && tid < L) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
  mma::cp_async_wait<1>();
  __syncthreads();
  {
    const float rq = tile_row_rstd<T, KMAX, kChunkThreads>(sm.q, LDK, a.l2norm);
    const float rk = tile_row_rstd<T, KMAX, kChunkThreads>(sm.k, LDK, a.l2norm);
    constexpr int kLanes = kChunkThreads / C;
    if (tid % kLanes == 0) {
      const int j = tid / kLanes;
      sm.rstd_k[j] = rk;
      sm.pscale[j] = a.scale * rq;
      sm.rowscale[j] = a.scale * rq * expf(sm.G[j]);  // exp(G_j) <= 1 for g <= 0
    }
  }
  __syncthreads();

  // P (this warp's 16 rows) on raw q, k; column tiles right of the diagonal block are zero.
  const int g = mma::grp(), i0 = 16 * wp + g;  // this thread's rows i0, i0 + 8
  const T* qrow = sm.q + (16 * wp + (lane & 15)) * LDK + 8 * (lane >> 4);  // A tiles (rows +0/+8, cols +0/+8)
  uint32_t ph[4][4], pl[4][4];
  {
    float pacc[8][4] = {};
    const T* krow = sm.k + (8 * (lane >> 4) + (lane & 7)) * LDK + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int ks = 0; ks < KMAX / 16; ++ks) {
      uint32_t af[4];
      mma::ldmatrix_x4<false>(af, qrow + 16 * ks);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (np > wp) continue;
        uint32_t b[4];
        mma::ldmatrix_x4<false>(b, krow + 16 * np * LDK + 16 * ks);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma::mma16816<T>(pacc[2 * np], af, b0);
        mma::mma16816<T>(pacc[2 * np + 1], af, b1);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
        // exp(G_i - G_j) with j <= i < L only (bounded by 1 for g <= 0).
        pacc[nt][e] = j <= i && i < L ? sm.pscale[i] * sm.rstd_k[j] * expf(sm.G[i] - sm.G[j]) * pacc[nt][e] : 0.f;
      }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) mma::acc_to_a_split<T>(pacc[2 * kb], pacc[2 * kb + 1], ph[kb], pl[kb]);
  }
  const float rs0 = sm.rowscale[i0], rs1 = sm.rowscale[i0 + 8];
  mma::cp_async_wait<0>();  // v_new rows
  __syncthreads();          // everyone's; every warp is done with k: the region takes h_c

  // The o view's element pairs (columns 2 tig, 2 tig + 1) can be stored as one 32-bit word.
  const bool o_pairs = column_pairs_storable(a.o);
  // With pairs: this thread's rows i0 and i0 + 8 of o at the block's head, column 2 tig (64-bit offsets
  // formed once; per store only the slice's column c0 + 8 nt is added, an immediate in the store).
  T* const o_row0 = o_pairs ? static_cast<T*>(a.o.p) + off4(a.o, ci.b, ci.t0 + i0, hv, 2 * mma::tig()) : nullptr;
  T* const o_row8 = o_pairs ? o_row0 + 8 * a.o.s1 : nullptr;
  const float* hc = kSingle ? nullptr : a.h + (c * a.HV + hv) * a.K * a.V;
  const T* hc16 = kSingle ? static_cast<const T*>(a.h16) + (c * a.HV + hv) * a.K * a.V : nullptr;
  for (int c0 = 0; c0 < a.V; c0 += kOutputCols) {
    if (c0 > 0) __syncthreads();  // the previous slice's readers of hs are done
    if constexpr (kSingle) {
      // h_c[:, c0 + [0, 64)] in T -> hs: KMAX x 8 16-byte pieces, all loads issued first.
      constexpr int kIters = KMAX * 8 / kChunkThreads;
      uint4 x[kIters];
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = tid + it * kChunkThreads, d = e / 8, p = e % 8;
        x[it] = *reinterpret_cast<const uint4*>(hc16 + d * a.V + c0 + 8 * p);
      }
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = tid + it * kChunkThreads, d = e / 8, p = e % 8;
        *reinterpret_cast<uint4*>(sm.hs + d * LDH + 8 * p) = x[it];
      }
    } else {
      // h_c[:, c0 + [0, 64)] -> hs (hi, lo): KMAX x 16 float4 pieces, all loads issued first.
      constexpr int kIters = KMAX * 16 / kChunkThreads;
      float4 x[kIters];
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = tid + it * kChunkThreads, d = e / 16, p = e % 16;
        x[it] = *reinterpret_cast<const float4*>(hc + d * a.V + c0 + 4 * p);
      }
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int e = tid + it * kChunkThreads, d = e / 16, p = e % 16;
        uint32_t h0, l0, h1, l1;
        mma::split_pair<T>(x[it].x, x[it].y, h0, l0);
        mma::split_pair<T>(x[it].z, x[it].w, h1, l1);
        *reinterpret_cast<uint2*>(sm.hs + d * LDH + 4 * p) = make_uint2(h0, h1);
        *reinterpret_cast<uint2*>(sm.hs_lo + d * LDH + 4 * p) = make_uint2(l0, l1);
      }
    }
    __syncthreads();

    // o = rowscale (q h_c) + P v_new on this slice.
    float acc[8][4] = {};
    const int tr = 8 * ((lane >> 3) & 1) + (lane & 7), tc = 8 * (lane >> 4);  // .trans tile row / column
#pragma unroll
    for (int ks = 0; ks < KMAX / 16; ++ks) {
      uint32_t af[4];
      mma::ldmatrix_x4<false>(af, qrow + 16 * ks);
      uint32_t bh[4][4], bl[4][4];  // h_c's hi and lo B fragments of the slice's 8 column tiles
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        mma::ldmatrix_x4<true>(bh[np], sm.hs + (16 * ks + tr) * LDH + 16 * np + tc);
        if constexpr (!kSingle) mma::ldmatrix_x4<true>(bl[np], sm.hs_lo + (16 * ks + tr) * LDH + 16 * np + tc);
      }
      mma::mma_tiles<T, 4>(acc, af, bh);  // 8 mmas apart on each accumulator
      if constexpr (!kSingle) mma::mma_tiles<T, 4>(acc, af, bl);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[nt][0] *= rs0;
      acc[nt][1] *= rs0;
      acc[nt][2] *= rs1;
      acc[nt][3] *= rs1;
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      if (kb > wp) continue;  // P is lower triangular
      uint32_t b[4][4];
#pragma unroll
      for (int np = 0; np < 4; ++np) mma::ldmatrix_x4<true>(b[np], sm.vn + (16 * kb + tr) * ldv + c0 + 16 * np + tc);
      mma::mma_tiles<T, 4>(acc, ph[kb], b);
      if constexpr (!kSingle) mma::mma_tiles<T, 4>(acc, pl[kb], b);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + 8 * half;
        if (i >= L) continue;
        const float x0 = acc[nt][2 * half], x1 = acc[nt][2 * half + 1];
        if (o_pairs) {
          *reinterpret_cast<uint32_t*>((half ? o_row8 : o_row0) + c0 + 8 * nt) = mma::pack_floats<T>(x0, x1);
        } else {
          const int64_t at = off4(a.o, ci.b, ci.t0 + i, hv, c0 + 8 * nt + 2 * mma::tig());
          store_elem<T>(a.o, at, x0);
          store_elem<T>(a.o, at + a.o.s3, x1);
        }
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
