// Chunked backward stage B2 split in two kernels (session 7): the default of the 16-bit backward's common
// case (h, dh, dv_new in T, direct outputs, H == HV, V >= K, views in 16-byte row pieces:
// split_grads_applies); FLASHGRAD_CHUNKED_B2=fused runs the one-kernel B2 of chunked_grads_mma.cuh, which
// also takes every other case (docs/perf/delta_rule.md "B2 split (session 7)"). Where V == K, the
// session-11 kernels run by default (chunked_grads_split_variants.cuh: B2a from
// chunked_grads_state_coalesced.cuh, this file's B2b with kVersion 6; FLASHGRAD_CHUNKED_B2_SPLIT=v1
// runs the session-7 kernels: chunk_grads_state_kernel, chunk_grads_local_kernel with kVersion 1).
// Same notation:
// X = v_new dh^T, Y = do h^T, Z = dv_new h^T, dP, du, dUb, ...
//
// Why: the fused kernel holds one block of 8 warps per SM (211 KiB of shared memory, 232 registers)
// and is latency-bound (ncu, session 6: issue active 28%, stalls wait / short / long scoreboard).
// Each kernel here is built for 16 warps per SM, 8 per (chunk, value head) item (at most 128 registers,
// at most 113 KiB of shared memory per item): two blocks of one item, or one block of two (kItems):
//
//   B2a, chunk_grads_state_kernel (grid chunks x HV): the products with the states h_c / dh_{c+1},
//     each over V in 32-column slices, key-role warps as in the fused kernel (warp = 16 key channels,
//     transposed products so h / dh go from global memory straight into A fragments):
//       pass 1: Y^T = h do^T, Z^T = h dv_new^T -> dq_s = scale exp(G_i) Y, dw = -Z;
//       pass 2: X^T = dh v_new^T, <h_c, dh_{c+1}> -> dk_s = exp(G_last - G_i) X.
//     Writes: dq_s, dk_s into the user's dq, dk (T),
//     dw (T) into the first K columns of the user's dv (dv is written only by B2b, which reads dw
//     before it writes dv, block by block: no scratch), and dG's state terms per row into dG_state
//     (fp32 [rows, HV]): q_i.dq_s_i - k_i.dk_s_i (normalized q, k), and on row L - 1 also
//     sum_i k_i.dk_s_i + exp(G_last) <h_c, dh_{c+1}>.
//   B2b, chunk_grads_local_kernel (grid chunks x HV): the chunk-local 64 x 64 products, row-role
//     warps as in the fused kernel: pass over V (16-column slices) dP = do v_new^T, du = dv_new v^T,
//     dUb = A^T dv_new -> dv, dbeta; then QK, WK = dw k^T -> S, dA; dq += S k; dk += S^T q + WY
//     terms (A^T dw, dA A^T, A^T tmp, S2 products); dbeta, dG -> dg (reverse cumsum, plus dG_state);
//     dq, dk = the state parts read back + these, through the L2-norm backward.
//   dq, dk and dG partials stay in registers (no fp32 [64][K] tiles): dq's L2-norm dot <qn, dq> is
//   summed per (row, K half) and exchanged through 2 x 64 floats.
// Costs of the split: dq_s, dk_s, dw written and read back once in T (3 x 16 KiB per block at
// K = 128), dG_state (256 bytes), and one rounding of the state parts of dq, dk (2^-9 relative).
#pragma once

#include <algorithm>

#include "chunked_grads_a_tiles.cuh"
#include "chunked_grads_frags.cuh"
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_mma_tf32.cuh"  // zero_acc, quad_sum, column_sum
#include "chunked_output.cuh"    // store_split
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Block shape: kItems = 1 (the default): one (chunk, value head) item per block of 8 warps, two blocks
// per SM; kItems = 2 (FLASHGRAD_CHUNKED_B2=split2, an experiment): the items of value heads 2 y and
// 2 y + 1 in one block of 16 warps (threads [256 item, +256)), one block per SM, both items passing the
// same barriers, so they run the same code at the same time. (Run 7.1: with ~11600 instructions of code,
// two independent blocks lost 43% of B2b's issue slots to instruction fetch; with the fallback paths
// gone, ~5400, run 7.3 measured 1.6%, so one item per block stays the default.) Helpers below take the
// item's thread index.
//
// dst[r * ld + 8 p ..] = 16-byte pieces of rows r < 64 (zeros past len) of x[b, t0 + r, idx, 0 .. width).
template <typename T>
__device__ __forceinline__ void rows16_async(const View& x, const ChunkInfo& ci, int64_t idx, int width, T* dst,
                                             int ld, int tid) {
  const T* src = static_cast<const T*>(x.p);
  const int P = width / 8;
  for (int e = tid; e < kChunkSize * P; e += 256) {
    const int r = e / P, p = e % P;
    const bool ok = r < ci.len;
    mma::cp_async16(dst + r * ld + 8 * p, src + off3(x, ci.b, ci.t0 + (ok ? r : 0), idx) + 8 * p, ok);
  }
}
// 1 / sqrt(sum_d x[r][d]^2 + eps) of row r = tid / 4 of a [64][ld] tile of T (four lanes per row, each
// K / 4 columns; all four return it); 1 without the norm. (tile_row_rstd with the item's thread index.)
template <typename T, int KMAX>
__device__ __forceinline__ float row_rstd(const T* tile, int ld, bool l2norm, int tid) {
  if (!l2norm) return 1.f;
  constexpr int kPer = KMAX / 4;
  const T* row = tile + (tid >> 2) * ld + (tid & 3) * kPer;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; i += 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + i);
    const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float lo, hi;
      mma::unpack_floats<T>(x[j], lo, hi);
      ss += lo * lo + hi * hi;
    }
  }
  ss = group_sum<4>(ss);
  return 1.0f / sqrtf(ss + kL2NormEps);
}

// Rows r < 64 of a source whose row r starts at src + r * stride (elements) into a [C][KMAX + 8] tile by
// 16-byte cp.async pieces: thread tid copies piece tid % P of rows tid / P + (256 / P) i (P = KMAX / 8
// pieces per row; rows >= L zero-filled, their sources pointed at row 0). One 64-bit multiply per row.
template <typename T, int KMAX>
__device__ __forceinline__ void tile_rows_async(const T* src, int64_t stride, int L, T* dst, int tid) {
  constexpr int P = KMAX / 8, RS = 256 / P, LDK = KMAX + 8;
  const int p = tid % P, r0 = tid / P;
#pragma unroll
  for (int i = 0; i < kChunkSize / RS; ++i) {
    const int r = r0 + RS * i;
    const bool ok = r < L;
    mma::cp_async16(dst + r * LDK + 8 * p, src + (ok ? r : 0) * stride + 8 * p, ok);
  }
}
// The reverse for rows r < L: tile rows into dst + r * stride, 16-byte pieces, the same thread mapping.
template <typename T, int KMAX>
__device__ __forceinline__ void tile_rows_store(const T* tile, T* dst, int64_t stride, int L, int tid) {
  constexpr int P = KMAX / 8, RS = 256 / P, LDK = KMAX + 8;
  const int p = tid % P, r0 = tid / P;
#pragma unroll
  for (int i = 0; i < kChunkSize / RS; ++i) {
    const int r = r0 + RS * i;
    if (r < L)
      *reinterpret_cast<uint4*>(dst + r * stride + 8 * p) = *reinterpret_cast<const uint4*>(tile + r * LDK + 8 * p);
  }
}

// Steps of the B2a kernels (store_state_dG_terms: this file's and chunk_grads_state_coalesced_kernel's;
// exact_state_dot: the latter's, this file's has the same steps inline).
// <h_c, dh_{c+1}> from the fp32 initial_state / dht on a sequence's first / last chunk (as the fused
// kernel: 16-bit copies of those arbitrary states lose most of dg's largest term there): the thread's
// share (key rows key0, key0 + 8, columns 2 tig + 8 m + {0, 1}) replaces hdh there.
template <typename T>
__device__ __forceinline__ void exact_state_dot(const ChunkedArgs& a, const ChunkInfo& ci, int64_t c, int64_t hv,
                                                const T* hc, const T* dhc, int64_t V, int key0, int tig, float& hdh) {
  const int64_t n = ci.seq;
  const bool exact_h = a.h0.p && c == a.seq_first_chunk[n], exact_dh = a.dht.p && c == a.seq_first_chunk[n + 1] - 1;
  if (!(exact_h || exact_dh)) return;
  const float* h0 = static_cast<const float*>(a.h0.p);
  const float* dht = static_cast<const float*>(a.dht.p);
  hdh = 0.f;
  for (int col = 2 * tig; col < V; col += 8)
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int key = key0 + 8 * r8;
#pragma unroll
      for (int p2 = 0; p2 < 2; ++p2) {
        const float x = exact_h ? h0[off4(a.h0, n, hv, key, col + p2)] : to_f<T>(hc[key * V + col + p2]);
        const float y = exact_dh ? dht[off4(a.dht, n, hv, key, col + p2)] : to_f<T>(dhc[key * V + col + p2]);
        hdh += x * y;
      }
    }
}
// dG's state terms by one warp (lane l: rows l and l + 32) from the per-warp column partials pq, pk
// ([KS][C]) of the raw dots, the row norms and the per-warp hdh sums: s_i = k_i.dk_s_i, dG_i = q_i.dq_s_i
// - s_i (normalized q, k: the raw dots times rstd), dG_{L-1} += sum_{i < L} s_i + exp(G_last) <h, dh>.
template <int KS>
__device__ __forceinline__ void store_state_dG_terms(const ChunkedArgs& a, const float* pq, const float* pk,
                                                     const float* rq, const float* rk, const float* hsum8, int L,
                                                     int64_t row0, int64_t hv, float gl, int lane) {
  constexpr int C = kChunkSize;
  float sq[2], sk[2], ssum = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + 32 * h;
    float x = 0.f, y = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) {
      x += pq[w * C + i];
      y += pk[w * C + i];
    }
    sq[h] = x * rq[i];
    sk[h] = y * rk[i];
    if (i < L) ssum += sk[h];
  }
  ssum = group_sum<32>(ssum);
  float hsum = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) hsum += hsum8[w];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = lane + 32 * h;
    if (i < L) a.dG_state[(row0 + i) * a.HV + hv] = sq[h] - sk[h] + (i == L - 1 ? ssum + expf(gl) * hsum : 0.f);
  }
}

// ---------------------------------------------------------------------------------------------
// B2a: shared memory. q, k raw (for the rstd and the dG dots), two stages of two 32-column slice
// tiles (pass 1: do, dv_new; pass 2: v_new in tile 0), three [C][K] staging tiles of the outputs in T
// (dq_s, dk_s, dw: written element by element from the transposed accumulators, copied out in 16-byte
// row pieces), per-row factors, and the dG dots' per-warp column partials. Pitches +8 elements
// (conflict-free ldmatrix rows, 16-byte aligned).
// The B2a kernels' float arrays from f on (GradsStateSmem, GradsStateCoalescedSmem): rq, rk, eG, kd [C];
// the dG dots' per-warp column partials pq, pk [KS][C]; hdh per warp hsum [8].
template <int KMAX>
__device__ __forceinline__ void place_state_floats(float* f, float*& rq, float*& rk, float*& eG, float*& kd, float*& pq,
                                                   float*& pk, float*& hsum) {
  constexpr int C = kChunkSize, KS = KMAX / 16;
  rq = f;
  rk = rq + C;
  eG = rk + C;
  kd = eG + C;
  pq = kd + C;
  pk = pq + KS * C;
  hsum = pk + KS * C;
}
template <typename T, int KMAX>
struct GradsStateSmem {
  static constexpr int C = kChunkSize, VS = 32, KS = KMAX / 16;
  static constexpr int LDK = KMAX + 8, LDS = VS + 8;
  static constexpr int64_t kKeyTile = sizeof(T) * C * LDK;
  static constexpr int64_t kSliceTile = sizeof(T) * C * LDS;
  static_assert(kKeyTile % 16 == 0 && kSliceTile % 16 == 0, "16-byte aligned tiles");
  // floats: rq, rk, eG, kd [C]; dot partials q, k [KS][C]; hdh per warp [8].
  static constexpr int64_t bytes() { return 5 * kKeyTile + 4 * kSliceTile + sizeof(float) * ((4 + 2 * KS) * C + 8); }
  unsigned char* raw;
  T *q, *k, *out_q, *out_k, *out_w;
  float *rq, *rk, *eG, *kd, *pq, *pk, *hsum;
  __device__ explicit GradsStateSmem(unsigned char* r) : raw(r) {
    q = reinterpret_cast<T*>(raw);
    k = reinterpret_cast<T*>(raw + kKeyTile);
    out_q = reinterpret_cast<T*>(raw + 2 * kKeyTile + 4 * kSliceTile);
    out_k = reinterpret_cast<T*>(raw + 3 * kKeyTile + 4 * kSliceTile);
    out_w = reinterpret_cast<T*>(raw + 4 * kKeyTile + 4 * kSliceTile);
    place_state_floats<KMAX>(reinterpret_cast<float*>(raw + 5 * kKeyTile + 4 * kSliceTile), rq, rk, eG, kd, pq, pk, hsum);
  }
  // Slice stage b (0 / 1), tile m (0: do or v_new, 1: dv_new), [C][LDS].
  __device__ T* slice(int b, int m) const {
    return reinterpret_cast<T*>(raw + 2 * kKeyTile + (2 * b + m) * kSliceTile);
  }
};

template <typename T, int KMAX, int kItems = 1>
__global__ void __launch_bounds__(256 * kItems, 2 / kItems) chunk_grads_state_kernel(ChunkedArgs a) {
  using S = GradsStateSmem<T, KMAX>;
  constexpr int C = kChunkSize, THREADS = 256, VS = S::VS, LDK = S::LDK, LDS = S::LDS;
  constexpr int KS = KMAX / 16, CG = 8 / KS, NTV = 8 / CG;  // key strips, column groups, 8-row tiles
  static_assert(KS * CG == 8 && NTV % 2 == 0, "K = 64 or 128 over 8 warps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int item = kItems == 1 ? 0 : static_cast<int>(threadIdx.x >> 8);
  S sm(smem_raw + item * S::bytes());
  const int64_t c = blockIdx.x, hv = blockIdx.y * kItems + item, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = kItems == 1 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x & 255), lane = tid & 31, wp = tid >> 5, grp = lane >> 2, tig = lane & 3;
  // Key role: warp (kst, cgp) owns key rows [16 kst, +16) and chunk rows [n0k, n0k + 8 NTV).
  const int kst = wp % KS, cgp = wp / KS, n0k = cgp * 8 * NTV;
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, HV = a.HV;
  const int NS = static_cast<int>(V / VS);
  const GradsFrags<T> fr(lane);
  auto erow = [&](int e) { return grp + 8 * (e >> 1); };
  auto ecol = [&](int e) { return 2 * tig + (e & 1); };

  const T* hc = static_cast<const T*>(a.h16) + (c * HV + hv) * a.K * V;   // h_c [K][V]
  const T* dhc = static_cast<const T*>(a.dh16) + (c * HV + hv) * a.K * V;  // dL/dh_{c+1} [K][V]
  // Slice copies: thread tid copies row pr = tid / 4, 16-byte piece pp = tid % 4 of each tile (rows
  // past L zero-filled, their sources pointed at row 0). Pass 1: do, dv_new; pass 2: v_new.
  static_assert(C * VS / 8 == THREADS, "one 16-byte piece per thread and tile");
  const int pr = tid >> 2, pp = tid & 3;
  const bool pr_ok = pr < L;
  const int pr_src = pr_ok ? pr : 0;
  const T* vn_src = static_cast<const T*>(a.v_new) + ((row0 + pr_src) * HV + hv) * V + 8 * pp;
  const T* dvn_src = static_cast<const T*>(a.dv_new16) + ((row0 + pr_src) * HV + hv) * V + 8 * pp;
  const T* do_src = static_cast<const T*>(a.dout.p) + off3(a.dout, ci.b, ci.t0 + pr_src, hv) + 8 * pp;
  const int p_at = pr * LDS + 8 * pp;
  auto issue_slice = [&](int s, int b, int pass) {
    const int64_t col0 = static_cast<int64_t>(s) * VS;
    if (pass == 2) {
      mma::cp_async16(sm.slice(b, 0) + p_at, vn_src + col0, pr_ok);
    } else {
      mma::cp_async16(sm.slice(b, 1) + p_at, dvn_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 0) + p_at, do_src + col0, pr_ok);
    }
    mma::cp_async_commit();
  };
  // A fragment (rows [16 kst, +16), columns [col, +16)) of a [K][V] state in T: register m holds row
  // grp + 8 (m % 2), columns col + 2 tig + 8 (m / 2) + {0, 1}: one 32-bit load each.
  const int64_t frag_at = (16 * kst + grp) * V + 2 * tig;
  auto load_state_frag = [&](const T* st, int64_t col, uint32_t(&x)[4]) {
    const T* p = st + frag_at + col;
#pragma unroll
    for (int m = 0; m < 4; ++m) x[m] = *reinterpret_cast<const uint32_t*>(p + 8 * (m & 1) * V + 8 * (m >> 1));
  };

  uint32_t hr[2][4];  // h fragments of the current pass-1 slice (16-column steps k2 = 0, 1)
  load_state_frag(hc, 0, hr[0]);
  load_state_frag(hc, 16, hr[1]);
  // ---- Prologue: q, k and slice 0 by cp.async; per-row gate factors.
  {
    rows16_async<T>(a.q, ci, head, KMAX, sm.q, LDK, tid);
    rows16_async<T>(a.k, ci, head, KMAX, sm.k, LDK, tid);
    issue_slice(0, 0, 1);
    if (tid < C) {
      const float g = (a.G && tid < L) ? a.G[(row0 + tid) * HV + hv] : 0.f;
      const float g_last = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
      sm.eG[tid] = expf(g);
      sm.kd[tid] = expf(g_last - g);  // arguments <= 0 for gates g <= 0
    }
    mma::cp_async_wait<0>();
    __syncthreads();
    const float rq = row_rstd<T, KMAX>(sm.q, LDK, a.l2norm, tid);
    const float rk = row_rstd<T, KMAX>(sm.k, LDK, a.l2norm, tid);
    if ((tid & 3) == 0) {
      sm.rq[tid >> 2] = rq;
      sm.rk[tid >> 2] = rk;
    }
    // (read after pass 2's barriers)
  }
  const float gl = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
  // One element (chunk row i, key channel d) of a state part of dq (which = 0) / dk (1): into its
  // staging tile (copied into the user's gradient at the end).
  auto store_qk = [&](int which, int i, int d, float x) { (which ? sm.out_k : sm.out_q)[i * LDK + d] = from_f<T>(x); };
  // Per-column (chunk row) partial dots sum_d x[i][d] y[i][d] of this warp's 16 key channels, with x
  // the raw q / k tile: into dst[kst][i] (column sums over the 8 lanes of a column).
  auto column_dots = [&](const T* x, const float(&y)[NTV][4], float* dst) {
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt) {
      float p[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
        p[e & 1] += to_f<T>(x[i * LDK + d]) * y[nt][e];
      }
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const float s = mma::column_sum(p[q2]);
        if (grp == 0) dst[kst * C + n0k + 8 * nt + 2 * tig + q2] = s;
      }
    }
  };

  // ---- Pass 1: Y^T = h do^T, Z^T = h dv_new^T over V slices (a barrier per slice; slice s + 1's
  // copies and h fragments in flight during slice s). The last step issues pass 2's first v_new slice.
  {
    float accY[NTV][4], accZ[NTV][4];
    mma::zero_acc(accY);
    mma::zero_acc(accZ);
    for (int s = 0; s < NS; ++s) {
      const int b = s & 1;
      const int64_t col0 = static_cast<int64_t>(s) * VS;
      mma::cp_async_wait<0>();
      __syncthreads();  // slice s landed; every warp is done with stage b ^ 1
      if (s + 1 < NS)
        issue_slice(s + 1, b ^ 1, 1);
      else
        issue_slice(0, b ^ 1, 2);
      const T* sdo = sm.slice(b, 0);
      const T* sdv = sm.slice(b, 1);
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
#pragma unroll
        for (int np = 0; np < NTV / 2; ++np) {
          uint32_t bd[4], bh[4];
          fr.ldb(bd, sdo, LDS, 16 * k2, n0k + 16 * np);
          fr.ldb(bh, sdv, LDS, 16 * k2, n0k + 16 * np);
          fr.mma2(accY[2 * np], accY[2 * np + 1], hr[k2], bd);
          fr.mma2(accZ[2 * np], accZ[2 * np + 1], hr[k2], bh);
        }
        // hr[k2] refilled with the next slice's fragment once used (in flight over the barrier).
        if (s + 1 < NS) load_state_frag(hc, col0 + VS + 16 * k2, hr[k2]);
      }
    }
    // dq_s = scale exp(G_i) Y, dw = -Z (element: key channel d, chunk row i); rows >= L not stored.
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
        accY[nt][e] *= a.scale * sm.eG[i];
        store_qk(0, i, d, accY[nt][e]);
        sm.out_w[i * LDK + d] = from_f<T>(-accZ[nt][e]);
      }
    column_dots(sm.q, accY, sm.pq);
  }

  // ---- Pass 2: X^T = dh v_new^T and <h_c, dh_{c+1}> (a barrier per slice; dh / h fragments two
  // slices deep in registers: NS is even).
  {
    float accX[NTV][4];
    mma::zero_acc(accX);
    float hdh = 0.f;
    uint32_t p2d[2][2][4], p2h[2][2][4];  // [buffer][16-column step][register]
    auto load_pass2 = [&](int s, uint32_t(&d)[2][4], uint32_t(&h)[2][4]) {
      const int64_t col0 = static_cast<int64_t>(s) * VS;
      load_state_frag(dhc, col0, d[0]);
      load_state_frag(dhc, col0 + 16, d[1]);
      if (cgp == 0) {  // each (key channel, value column) once: the first column group's warps
        load_state_frag(hc, col0, h[0]);
        load_state_frag(hc, col0 + 16, h[1]);
      }
    };
    auto step = [&](int s, const uint32_t(&d)[2][4], const uint32_t(&h)[2][4]) {
      const int b = s & 1;
      mma::cp_async_wait<0>();
      __syncthreads();
      if (s + 1 < NS) issue_slice(s + 1, b ^ 1, 2);
      const T* svn = sm.slice(b, 0);
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        uint32_t bv[NTV / 2][4];
#pragma unroll
        for (int np = 0; np < NTV / 2; ++np) fr.ldb(bv[np], svn, LDS, 16 * k2, n0k + 16 * np);
#pragma unroll
        for (int np = 0; np < NTV / 2; ++np) fr.mma2(accX[2 * np], accX[2 * np + 1], d[k2], bv[np]);
        if (cgp == 0)
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            float h0, h1, d0, d1;
            mma::unpack_floats<T>(h[k2][m], h0, h1);
            mma::unpack_floats<T>(d[k2][m], d0, d1);
            hdh += h0 * d0 + h1 * d1;
          }
      }
    };
    load_pass2(0, p2d[0], p2h[0]);
    for (int s = 0; s < NS; s += 2) {
      load_pass2(s + 1, p2d[1], p2h[1]);
      step(s, p2d[0], p2h[0]);
      if (s + 2 < NS) load_pass2(s + 2, p2d[0], p2h[0]);
      step(s + 1, p2d[1], p2h[1]);
    }
    // dk_s = exp(G_last - G_i) X.
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * kst + erow(e), i = n0k + 8 * nt + ecol(e);
        accX[nt][e] *= sm.kd[i];
        store_qk(1, i, d, accX[nt][e]);
      }
    column_dots(sm.k, accX, sm.pk);
    // <h_c, dh_{c+1}> from the fp32 initial_state / dht on a sequence's first / last chunk: the steps of
    // exact_state_dot, inline (called under cgp == 0, the flags' loads move into the branch and this
    // kernel's SASS changes: predicates and order, same instruction count).
    const int64_t n = ci.seq;
    const bool exact_h = a.h0.p && c == a.seq_first_chunk[n], exact_dh = a.dht.p && c == a.seq_first_chunk[n + 1] - 1;
    if (cgp == 0 && (exact_h || exact_dh)) {
      const float* h0 = static_cast<const float*>(a.h0.p);
      const float* dht = static_cast<const float*>(a.dht.p);
      hdh = 0.f;
      for (int col = 2 * tig; col < V; col += 8)
#pragma unroll
        for (int r8 = 0; r8 < 2; ++r8) {
          const int key = 16 * kst + grp + 8 * r8;
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const float x = exact_h ? h0[off4(a.h0, n, hv, key, col + p)] : to_f<T>(hc[key * V + col + p]);
            const float y = exact_dh ? dht[off4(a.dht, n, hv, key, col + p)] : to_f<T>(dhc[key * V + col + p]);
            hdh += x * y;
          }
        }
    }
    hdh = group_sum<32>(hdh);
    if (lane == 0) sm.hsum[wp] = cgp == 0 ? hdh : 0.f;
  }
  __syncthreads();  // dot partials, hdh, staging tiles complete

  // ---- The staged outputs, rows < L: dq_s, dk_s into the user's dq, dk, dw into dv's first K columns;
  // 16-byte pieces (row e / (K / 8), channels 8 (e % (K / 8)) + [0, 8)).
  {
    constexpr int P = KMAX / 8;
    auto copy_out = [&](const T* tile, const View& o, int64_t idx) {
      T* dst = static_cast<T*>(o.p);
      for (int e = tid; e < L * P; e += THREADS) {
        const int r = e / P, pc = e % P;
        *reinterpret_cast<uint4*>(dst + off3(o, ci.b, ci.t0 + r, idx) + 8 * pc) =
            *reinterpret_cast<const uint4*>(tile + r * LDK + 8 * pc);
      }
    };
    copy_out(sm.out_q, a.dq_out, head);
    copy_out(sm.out_k, a.dk_out, head);
    copy_out(sm.out_w, a.dv_out, hv);
  }

  // ---- dG's state terms (warp 0).
  if (wp == 0 && a.dG_state) store_state_dG_terms<KS>(a, sm.pq, sm.pk, sm.rq, sm.rk, sm.hsum, L, row0, hv, gl, lane);
}

// ---------------------------------------------------------------------------------------------
// B2b: shared memory. q, k raw, dw (T, from B2a), A hi / lo, region R (two stages of four 16-column
// slice tiles: do, v_new, v, dv_new; after pass 1: S hi / lo then tmp hi / lo, dA hi / lo then S2
// hi / lo), per-row factors and fixed partial-sum slots. kVS = 32 (the session-11 kernels, kVersion >= 5):
// two stages of four 32-column slice tiles (40 KiB: the region grows by 4 KiB), and the partial-sum
// slots (first written after pass 1) in the region's tail past the 4 P tiles, so the total stays under
// 113 KiB.
template <typename T, int KMAX, int kVS = 16>
struct GradsLocalSmem {
  static constexpr int C = kChunkSize, VS = kVS;
  static constexpr int LDK = KMAX + 8, LDP = C + 8, LDS = VS + 8;
  static constexpr int64_t kKeyTile = sizeof(T) * C * LDK;
  static constexpr int64_t kPTile = sizeof(T) * C * LDP;
  static constexpr int64_t kSliceTile = sizeof(T) * C * LDS;
  static constexpr int64_t kRegion = std::max<int64_t>(8 * kSliceTile, 4 * kPTile);
  static_assert(kKeyTile % 16 == 0 && kPTile % 16 == 0 && kSliceTile % 16 == 0, "16-byte aligned tiles");
  // floats [C] each: G, beta, rq, rk, irq, irk, eG, dG; slots [kParts][C]: 0, 1 dG row terms of the
  // row-role warps with hf = 0 / 1; 2, 3 dbeta likewise; 4 .. 7 dG column terms of rs = 0 .. 3;
  // 8, 9 <q_raw, dq> over K half hf; 10, 11 <k_raw, dk> likewise.
  static constexpr int kArrays = 8, kParts = 12;
  static constexpr bool kPartsInRegion = kVS == 32;
  static_assert(!kPartsInRegion || 4 * kPTile + int64_t(sizeof(float)) * kParts * C <= kRegion, "slots fit");
  static constexpr int64_t bytes() {
    return 3 * kKeyTile + 2 * kPTile + kRegion + sizeof(float) * (kArrays + (kPartsInRegion ? 0 : kParts)) * C;
  }
  static_assert(bytes() <= 113 * 1024, "two blocks per SM");
  unsigned char* raw;
  T *q, *k, *dw, *A_hi, *A_lo;
  float *G, *beta, *rq, *rk, *irq, *irk, *eG, *dG, *part;
  __device__ explicit GradsLocalSmem(unsigned char* r) : raw(r) {
    q = reinterpret_cast<T*>(raw);
    k = reinterpret_cast<T*>(raw + kKeyTile);
    dw = reinterpret_cast<T*>(raw + 2 * kKeyTile);
    A_hi = reinterpret_cast<T*>(raw + 3 * kKeyTile);
    A_lo = reinterpret_cast<T*>(raw + 3 * kKeyTile + kPTile);
    G = reinterpret_cast<float*>(raw + 3 * kKeyTile + 2 * kPTile + kRegion);
    beta = G + C;
    rq = beta + C;
    rk = rq + C;
    irq = rk + C;
    irk = irq + C;
    eG = irk + C;
    dG = eG + C;
    part = kPartsInRegion ? reinterpret_cast<float*>(region() + 4 * kPTile) : dG + C;
  }
  __device__ unsigned char* region() const { return raw + 3 * kKeyTile + 2 * kPTile; }
  // Slice stage b, tile m: 0 do, 1 v_new, 2 v, 3 dv_new, each [C][LDS].
  __device__ T* slice(int b, int m) const { return reinterpret_cast<T*>(region() + (4 * b + m) * kSliceTile); }
  // After pass 1: m = 0, 1 S (then tmp) hi / lo; 2, 3 dA (then S2) hi / lo, each [C][LDP].
  __device__ T* ptile(int m) const { return reinterpret_cast<T*>(region() + m * kPTile); }
};

// kVersion 1: session 7 (any V >= K; every V != K case and FLASHGRAD_CHUNKED_B2_SPLIT=v1 run it).
// kVersion 5, 6 (session 11, V == K, kItems = 1; chunked_grads_split_variants.cuh, docs "GDN B2,
// session 11"), what they share (kV11): q / k / dw / dk_s row copies by tile_rows_async (one 64-bit
// multiply per row instead of a division and an off3 per piece), pass 1 over 32-column slices in two
// stages, unrolled (the slice count is known), paired element reads of the [C][K] tiles, B2a's dq part
// loaded at mid's end. 5 (the default where V == K from run 11.3 to session 12); 6 (the default since
// session 12): 5 with the row norms after pass 1's first products (run 12.2: B2b 0.894 -> 0.878 ms). (Versions 2 - 4 were steps to 5, 7 = 6 without
// the early dq load timed no faster than 5; retired in session 12.)
template <typename T, int KMAX, int kItems = 1, int kVersion = 1>
__global__ void __launch_bounds__(256 * kItems, 2 / kItems) chunk_grads_local_kernel(ChunkedArgs a) {
  static_assert(kVersion == 1 || ((kVersion == 5 || kVersion == 6) && kItems == 1), "versions 1, 5, 6");
  constexpr bool kV11 = kVersion != 1;  // the session-11 kernels (V == K)
  using S = GradsLocalSmem<T, KMAX, kV11 ? 32 : 16>;
  constexpr int C = kChunkSize, VS = S::VS, LDK = S::LDK, LDP = S::LDP, LDS = S::LDS;
  constexpr int NKH = KMAX / 16;  // 8-column tiles of a K half
  // kV11: B2a's dq part loaded at mid's end; kVersion 6: the row norms after pass 1's second slice (q, k in their own copy group).
  constexpr bool kEarlyDqState = kV11, kLateNorms = kVersion == 6;
  static_assert(8 * S::kSliceTile <= S::kRegion, "two slice stages");
  static_assert(!kLateNorms || KMAX / 32 >= 2, "kLateNorms: the row norms at slice 1");
  static_assert(NKH % 2 == 0, "K = 64 or 128");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int item = kItems == 1 ? 0 : static_cast<int>(threadIdx.x >> 8);
  S sm(smem_raw + item * S::bytes());
  const int64_t c = blockIdx.x, hv = blockIdx.y * kItems + item, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = kItems == 1 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x & 255), lane = tid & 31, wp = tid >> 5, grp = lane >> 2, tig = lane & 3;
  // Row role (as the fused kernel): hf = wp / 4, strip rs = wp % 4 (hf = 0) or 3 - wp % 4 (hf = 1), so
  // the two warps of a scheduler (wp, wp + 4) carry ~ equal triangular work.
  const int hf = wp >> 2, rs = hf == 0 ? (wp & 3) : 3 - (wp & 3);
  const int r0 = 16 * rs + grp;  // the thread's accumulator rows r0, r0 + 8
  const int d0 = hf * (KMAX / 2);  // K-column products: columns [d0, d0 + K / 2)
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, HV = a.HV;
  // kV11 (V == K): the slice count is known, pass 1 unrolled (stages and offsets fixed).
  const int NS = kV11 ? KMAX / VS : static_cast<int>(V / VS);
  const float scale = a.scale;
  const GradsFrags<T> fr(lane);
  auto erow = [&](int e) { return grp + 8 * (e >> 1); };
  auto ecol = [&](int e) { return 2 * tig + (e & 1); };
  auto view_rows = [&](const View& x, int64_t idx) { return static_cast<T*>(x.p) + off3(x, ci.b, ci.t0, idx); };
  // Element (r, de + odd) of a [C][LDK] tile of T as float (de even); kV11 reads the pair (de, de + 1)
  // as one 32-bit word (the pair's other element, read next, is the same load).
  auto tile_elem = [&](const T* tile, int r, int de, int odd) -> float {
    if constexpr (kV11) {
      float x0, x1;
      mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(tile + r * LDK + de), x0, x1);
      return odd ? x1 : x0;
    } else {
      return to_f<T>(tile[r * LDK + de + odd]);
    }
  };
  // x[e] split into hi / lo T tiles of pitch LDP at rows r0' + grp (+ 8), columns c0 + 2 tig + {0, 1}.
  auto store_tile_split = [&](T* hi, T* lo, int rr0, int c0, const float(&x)[4]) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      uint32_t ph, pl;
      mma::split_pair<T>(x[2 * h2], x[2 * h2 + 1], ph, pl);
      const int at = (rr0 + grp + 8 * h2) * LDP + c0 + 2 * tig;
      *reinterpret_cast<uint32_t*>(hi + at) = ph;
      *reinterpret_cast<uint32_t*>(lo + at) = pl;
    }
  };

  // Slice copies (16 columns = two 16-byte pieces per row and tile): threads 0..127 copy do and
  // v_new, 128..255 v and dv_new; row pr = (tid % 128) / 2, piece pp = tid % 2. (32 columns,
  // kV11: row pr = tid / 4, piece pp = tid % 4 of all four tiles.)
  const int pr = VS == 32 ? tid >> 2 : (tid & 127) >> 1, pp = VS == 32 ? tid & 3 : tid & 1, second = tid >> 7;
  const bool pr_ok = pr < L;
  const int pr_src = pr_ok ? pr : 0;
  const T* vn_src = static_cast<const T*>(a.v_new) + ((row0 + pr_src) * HV + hv) * V + 8 * pp;
  const T* dvn_src = static_cast<const T*>(a.dv_new16) + ((row0 + pr_src) * HV + hv) * V + 8 * pp;
  const T* do_src = static_cast<const T*>(a.dout.p) + off3(a.dout, ci.b, ci.t0 + pr_src, hv) + 8 * pp;
  const T* v_src = static_cast<const T*>(a.v.p) + off3(a.v, ci.b, ci.t0 + pr_src, hv) + 8 * pp;
  const int p_at = pr * LDS + 8 * pp;
  auto issue_slice = [&](int s, int b) {
    const int64_t col0 = static_cast<int64_t>(s) * VS;
    if (VS == 32) {
      mma::cp_async16(sm.slice(b, 1) + p_at, vn_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 0) + p_at, do_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 3) + p_at, dvn_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 2) + p_at, v_src + col0, pr_ok);
    } else if (second == 0) {
      mma::cp_async16(sm.slice(b, 1) + p_at, vn_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 0) + p_at, do_src + col0, pr_ok);
    } else {
      mma::cp_async16(sm.slice(b, 3) + p_at, dvn_src + col0, pr_ok);
      mma::cp_async16(sm.slice(b, 2) + p_at, v_src + col0, pr_ok);
    }
    mma::cp_async_commit();
  };

  // Rows' L2-norm factors (and their inverses) of q and k into shared memory: in the prologue, or with
  // kLateNorms after pass 1's second slice's products (the first's until session 20, when q and k moved
  // to their own copy group), so that their shared loads and shuffles wait beside those mmas (ncu, v4:
  // 8.5% of the stall samples at the prologue's norms).
  auto row_norms = [&]() {
    const float rq = row_rstd<T, KMAX>(sm.q, LDK, a.l2norm, tid);
    const float rk = row_rstd<T, KMAX>(sm.k, LDK, a.l2norm, tid);
    if ((tid & 3) == 0) {
      const int r = tid >> 2;
      sm.rq[r] = rq;
      sm.rk[r] = rk;
      sm.irq[r] = 1.f / rq;
      sm.irk[r] = 1.f / rk;
    }
  };

  // ---- Prologue: q, k, dw (B2a's, in dv's first K columns: read here, before pass 1 writes dv) and
  // slice 0 by cp.async; A (hi / lo, lower triangle, rows < L), G, beta, dG (B2a's terms). The loads into
  // registers are issued first, one of G / beta / dG per thread of warps 0 - 5 (row tid % 64), so that
  // every global latency of the prologue overlaps the others and the copies' issue (ncu, run 20.1: A's
  // loads issued after the copies and warps 0 - 1's three dependent G, beta, dG loads, each behind its
  // branch, while the other warps waited at the barrier, held ~20 % of the kernel's stall samples).
  {
    float4 y[4];  // A's pieces (chunked_grads_a_tiles.cuh)
    load_a_pieces(a.A, row0, hv, HV, L, tid, y);
    const int lr = tid & (C - 1), lwhich = tid / C;  // row lr's G (lwhich 0), beta (1), dG (2); 3: none
    const bool lr_ok = lr < L;
    // The loaded value's bits (load_raw: beta's 16-bit T unconverted), converted after the copies'
    // issue (ptxas kept a conversion beside its load, in the load's branch, so the warp waited for the
    // load there: run 20.2's ncu, 1.1 % of the samples).
    uint32_t lraw = 0u;
    if (lwhich == 0) {
      if (a.G && lr_ok) lraw = raw_bits(a.G[(row0 + lr) * HV + hv]);
    } else if (lwhich == 1) {
      if (lr_ok) lraw = load_raw<T>(a.beta, off3(a.beta, ci.b, ci.t0 + lr, hv));
    } else if (lwhich == 2) {
      if (a.dG_state && lr_ok) lraw = raw_bits(a.dG_state[(row0 + lr) * HV + hv]);
    }
    // kLateNorms: q and k in a second cp.async group, first read by the row norms at slice 1, so the
    // prologue's wait covers dw, slice 0 and A only (48 of 80 KiB at K = 128). dw stays in the first:
    // pass 1 writes dv's first columns from slice 0 on.
    if (kV11) {
      if constexpr (!kLateNorms) {
        tile_rows_async<T, KMAX>(view_rows(a.q, head), a.q.s1, L, sm.q, tid);
        tile_rows_async<T, KMAX>(view_rows(a.k, head), a.k.s1, L, sm.k, tid);
      }
      tile_rows_async<T, KMAX>(view_rows(a.dv_out, hv), a.dv_out.s1, L, sm.dw, tid);
    } else {
      rows16_async<T>(a.q, ci, head, KMAX, sm.q, LDK, tid);
      rows16_async<T>(a.k, ci, head, KMAX, sm.k, LDK, tid);
      rows16_async<T>(a.dv_out, ci, hv, KMAX, sm.dw, LDK, tid);
    }
    issue_slice(0, 0);  // (commits the group)
    if constexpr (kLateNorms) {
      tile_rows_async<T, KMAX>(view_rows(a.q, head), a.q.s1, L, sm.q, tid);
      tile_rows_async<T, KMAX>(view_rows(a.k, head), a.k.s1, L, sm.k, tid);
      mma::cp_async_commit();
    }
    store_a_split<T>(y, sm.A_hi, sm.A_lo, LDP, tid);
    if (lwhich == 0) {
      const float G = __uint_as_float(lraw);
      sm.G[lr] = G;
      sm.eG[lr] = expf(G);
    } else if (lwhich == 1) {
      sm.beta[lr] = raw_to_f32<T>(a.beta.f32, lraw);
    } else if (lwhich == 2) {
      sm.dG[lr] = __uint_as_float(lraw);  // B2a's dG terms (added last)
    }
    if constexpr (kLateNorms)
      mma::cp_async_wait<1>();  // (q, k may still be in flight)
    else
      mma::cp_async_wait<0>();
    __syncthreads();  // (also: dw is in shared memory before any thread writes dv)
    if constexpr (!kLateNorms) row_norms();
    // (first read after pass 1's barriers)
  }

  // ---- Pass 1 over V slices of VS columns (16; kV11: 32; a barrier per slice, the next slice's copies
  // in flight): dP = do v_new^T, du = dv_new v^T (kept for mid); dUb = A^T dv_new for rows of the strip,
  // columns [8 hf, +8) of the slice (kV11: [16 hf, +16)) -> dv, dbeta.
  float accP[4][4], accU[4][4];
  mma::zero_acc(accP);
  mma::zero_acc(accU);
  // Per-thread sums until the end: dG / dbeta terms of rows r0, r0 + 8 (this thread's columns), dG
  // column terms of columns 32 hf + 8 nt + 2 tig + p.
  float rowG[2] = {0.f, 0.f}, rowB[2] = {0.f, 0.f}, colG[4][2] = {};
  // The row-role sums into their fixed slots: quad sums (the 4 lanes of a row) and column sums (the 8
  // lanes of a column), each slot written by one fixed lane, then the registers zeroed; dG and dbeta
  // per row are summed from the slots in a fixed order after the last barriers (no float atomics).
  // K = 128 (kFlushRowSumsTwice): called at mid's end (add = false: the slots are stored) and at S6's
  // end (added to), so that these 12 registers are not held from pass 1 to the end (they were, and two
  // of them spilled at 128 registers: run 21.1, B2b 0.836 -> 0.828 ms at B8 T4096). K = 64 (no spill):
  // once, after S6b, as before (flushing twice there made it 0.526 -> 0.545 ms). The slots (past the
  // region's 4 P tiles, or past dG) are written after pass 1 only, and not by S3 - S6.
  constexpr bool kFlushRowSumsTwice = KMAX == 128;
  auto flush_row_sums = [&](bool add) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float g = mma::quad_sum(rowG[h]), be = mma::quad_sum(rowB[h]);
      if (tig == 0) {
        float* sg = &sm.part[hf * C + r0 + 8 * h];
        float* sb = &sm.part[(2 + hf) * C + r0 + 8 * h];
        *sg = add ? *sg + g : g;
        *sb = add ? *sb + be : be;
      }
      rowG[h] = 0.f;
      rowB[h] = 0.f;
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        const float g = mma::column_sum(colG[nt][q2]);
        if (grp == 0) {
          float* sc = &sm.part[(4 + rs) * C + 32 * hf + 8 * nt + 2 * tig + q2];
          *sc = add ? *sc + g : g;
        }
        colG[nt][q2] = 0.f;
      }
  };
  const int64_t dvo_row[2] = {off3(a.dv_out, ci.b, ci.t0 + r0, hv), off3(a.dv_out, ci.b, ci.t0 + r0 + 8, hv)};
  // kV11: one 32-column slice (two 16-column steps k2 of dP, du); dUb for rows of the strip and
  // columns [16 hf, +16) of the slice (both 8-column tiles of the .trans B fragment).
  auto pass1_wide = [&](const T* sdo, const T* svn, const T* sv, const T* sdv, int64_t col0) {
#pragma unroll
    for (int k2 = 0; k2 < VS / 16; ++k2) {
      uint32_t ado[4], adv[4];
      fr.lda(ado, sdo, LDS, 16 * rs, 16 * k2);
      fr.lda(adv, sdv, LDS, 16 * rs, 16 * k2);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        if (2 * hf + np > rs) continue;  // column blocks right of the diagonal block are never used
        uint32_t bvn[4], bv[4];
        fr.ldb(bvn, svn, LDS, 16 * k2, 32 * hf + 16 * np);
        fr.ldb(bv, sv, LDS, 16 * k2, 32 * hf + 16 * np);
        fr.mma2(accU[2 * np], accU[2 * np + 1], adv, bv);
        fr.mma2(accP[2 * np], accP[2 * np + 1], ado, bvn);
      }
    }
    float acc[2][4] = {}, accl[2][4] = {};
    for (int kq = rs; kq < 4; ++kq) {
      uint32_t ah[4], al[4], bd[4];
      fr.lda_t(ah, sm.A_hi, LDP, 16 * rs, 16 * kq);
      fr.lda_t(al, sm.A_lo, LDP, 16 * rs, 16 * kq);
      fr.ldb_t(bd, sdv, LDS, 16 * kq, 16 * hf);
      fr.mma2(acc[0], acc[1], ah, bd);
      fr.mma2(accl[0], accl[1], al, bd);
    }
    float rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = r0 + 8 * h, n = 16 * hf + 8 * nt + 2 * tig;
        const float x0 = acc[nt][2 * h] + accl[nt][2 * h], x1 = acc[nt][2 * h + 1] + accl[nt][2 * h + 1];
        if (j < L) {
          const float bj = sm.beta[j];
          *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dv_out.p) + dvo_row[h] + col0 + n) =
              mma::pack_floats<T>(bj * x0, bj * x1);  // (inner stride 1: split_grads_applies)
        }
        float v0, v1;
        mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(sv + j * LDS + n), v0, v1);
        rsum[h] += v0 * x0 + v1 * x1;
      }
    rowB[0] += rsum[0];
    rowB[1] += rsum[1];
  };
  // b: slice s's stage.
  constexpr int kUnrollPass1 = kV11 ? KMAX / VS : 1;
#pragma unroll kUnrollPass1
  for (int s = 0; s < NS; ++s) {
    const int b = s & 1;
    const int64_t col0 = static_cast<int64_t>(s) * VS;
    if (s > 0) {  // (slice 0: the prologue's wait and barrier; stage 1 is not read before slice 0's issue)
      mma::cp_async_wait<0>();
      __syncthreads();  // slice s landed (kLateNorms, s = 1: q and k too); every warp is done with stage b ^ 1
    }
    if (s + 1 < NS) issue_slice(s + 1, b ^ 1);
    const T* sdo = sm.slice(b, 0);
    const T* svn = sm.slice(b, 1);
    const T* sv = sm.slice(b, 2);
    const T* sdv = sm.slice(b, 3);
    if constexpr (VS == 32) {
      pass1_wide(sdo, svn, sv, sdv, col0);
      if constexpr (kLateNorms)
        if (s == 1) row_norms();  // (q, k landed at slice 1's wait)
      continue;
    }
    {
      uint32_t ado[4], adv[4];
      fr.lda(ado, sdo, LDS, 16 * rs, 0);
      fr.lda(adv, sdv, LDS, 16 * rs, 0);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        if (2 * hf + np > rs) continue;  // column blocks right of the diagonal block are never used
        uint32_t bvn[4], bv[4];
        fr.ldb(bvn, svn, LDS, 0, 32 * hf + 16 * np);
        fr.ldb(bv, sv, LDS, 0, 32 * hf + 16 * np);
        fr.mma2(accU[2 * np], accU[2 * np + 1], adv, bv);
        fr.mma2(accP[2 * np], accP[2 * np + 1], ado, bvn);
      }
    }
    {
      // dUb[j][n] = sum_i A_ij dv_new[i][n]; A_ij = 0 for i < j: chunk steps kq >= rs.
      float acc[4] = {0.f, 0.f, 0.f, 0.f}, accl[4] = {0.f, 0.f, 0.f, 0.f};
      for (int kq = rs; kq < 4; ++kq) {
        uint32_t ah[4], al[4], bd[4];
        fr.lda_t(ah, sm.A_hi, LDP, 16 * rs, 16 * kq);
        fr.lda_t(al, sm.A_lo, LDP, 16 * rs, 16 * kq);
        fr.ldb_t(bd, sdv, LDS, 16 * kq, 0);  // both 8-column tiles; this warp uses tile hf
        const uint32_t bsel[2] = {hf ? bd[2] : bd[0], hf ? bd[3] : bd[1]};  // (no runtime index: registers)
        mma::mma16816<T>(acc, ah, bsel);
        mma::mma16816<T>(accl, al, bsel);
      }
      float rsum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = r0 + 8 * h, n = 8 * hf + 2 * tig;
        const float x0 = acc[2 * h] + accl[2 * h], x1 = acc[2 * h + 1] + accl[2 * h + 1];
        if (j < L) {
          const float bj = sm.beta[j];
          const int64_t at = dvo_row[h] + (col0 + n) * a.dv_out.s3;
          *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dv_out.p) + at) = mma::pack_floats<T>(bj * x0, bj * x1);
        }
        rsum[h] += to_f<T>(sv[j * LDS + n]) * x0 + to_f<T>(sv[j * LDS + n + 1]) * x1;
      }
      rowB[0] += rsum[0];
      rowB[1] += rsum[1];
    }
  }
  __syncthreads();  // every warp is done with the slices: the region takes S, dA

  // kEarlyDqState: B2a's state part of dq at the thread's elements (rows r0 + 8 h, channels d0 + 8 nt + 2 tig
  // + {0, 1}; as S3a's load_pair) loaded at mid's end, in flight through its barrier.
  uint32_t dqs_early[NKH][2];

  T* S_hi = sm.ptile(0);  // S, then tmp
  T* S_lo = sm.ptile(1);
  T* dA_hi = sm.ptile(2);  // dA, then S2
  T* dA_lo = sm.ptile(3);
  // ---- Mid: QK = q_raw k_raw^T, WK = dw k_raw^T -> S = (dP o Gam) rq_i rk_j, dA, dG terms of dP o P.
  {
    float accQ[4][4], accW[4][4];
    mma::zero_acc(accQ);
    mma::zero_acc(accW);
#pragma unroll
    for (int kq = 0; kq < KMAX / 16; ++kq) {
      uint32_t aq[4], aw[4];
      fr.lda(aq, sm.q, LDK, 16 * rs, 16 * kq);
      fr.lda(aw, sm.dw, LDK, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        if (2 * hf + np > rs) continue;
        uint32_t bk[4];
        fr.ldb(bk, sm.k, LDK, 16 * kq, 32 * hf + 16 * np);
        fr.mma2(accW[2 * np], accW[2 * np + 1], aw, bk);
        fr.mma2(accQ[2 * np], accQ[2 * np + 1], aq, bk);
      }
    }
    float rsum[2] = {0.f, 0.f};
    const float Gi[2] = {sm.G[r0], sm.G[r0 + 8]}, rqi[2] = {sm.rq[r0], sm.rq[r0 + 8]};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int j0 = 32 * hf + 8 * nt + 2 * tig;
      const float2 Gj = *reinterpret_cast<const float2*>(&sm.G[j0]), rkj = *reinterpret_cast<const float2*>(&sm.rk[j0]),
                   bj = *reinterpret_cast<const float2*>(&sm.beta[j0]), ej = *reinterpret_cast<const float2*>(&sm.eG[j0]);
      float svs[4], das[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + 8 * (e >> 1), j = j0 + (e & 1);
        const float G_j = (e & 1) ? Gj.y : Gj.x, rk_j = (e & 1) ? rkj.y : rkj.x, b_j = (e & 1) ? bj.y : bj.x,
                    e_j = (e & 1) ? ej.y : ej.x;
        float sv = 0.f, da = 0.f;
        if (i < L && j <= i) {
          // (j <= i: the exponent is <= 0; decay_exp_ftz: ex2.approx.ftz, ~2 ulp, 3 instructions for expf's ~8)
          const float gam = decay_exp_ftz(Gi[e >> 1] - G_j), rqk = rqi[e >> 1] * rk_j;
          const float dpg = scale * accP[nt][e] * gam;  // (dP o Gam)_ij
          const float dPP = dpg * accQ[nt][e] * rqk;    // (dP o P)_ij
          rsum[e >> 1] += dPP;
          colG[nt][e & 1] -= dPP;
          da = b_j * (accU[nt][e] + e_j * rk_j * accW[nt][e]);
          sv = dpg * rqk;
        }
        svs[e] = sv;
        das[e] = da;
      }
      store_tile_split(S_hi, S_lo, 16 * rs, 32 * hf + 8 * nt, svs);
      store_tile_split(dA_hi, dA_lo, 16 * rs, 32 * hf + 8 * nt, das);
    }
    rowG[0] += rsum[0];
    rowG[1] += rsum[1];
  }
  if constexpr (kFlushRowSumsTwice) flush_row_sums(false);
  if constexpr (kEarlyDqState) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T* row = static_cast<const T*>(a.dq_out.p) + off3(a.dq_out, ci.b, ci.t0 + r0 + 8 * h, head);
#pragma unroll
      for (int nt = 0; nt < NKH; ++nt)
        dqs_early[nt][h] =
            r0 + 8 * h < L ? *reinterpret_cast<const uint32_t*>(row + d0 + 8 * nt + 2 * tig) : 0u;
    }
  }
  __syncthreads();

  // The pair (r, d), (r, d + 1) (d even) of the user's dq / dk as one 32-bit word of two T (rows of
  // those views: two row pointers per thread, rows r0 and r0 + 8, formed where used); rows >= L are
  // never touched.
  auto rows_of = [&](const View& o, T* (&rows)[2]) {
    rows[0] = static_cast<T*>(o.p) + off3(o, ci.b, ci.t0 + r0, head);
    rows[1] = static_cast<T*>(o.p) + off3(o, ci.b, ci.t0 + r0 + 8, head);
  };
  auto load_pair = [&](T* (&rows)[2], int h, int d) -> uint32_t {
    return r0 + 8 * h < L ? *reinterpret_cast<const uint32_t*>(rows[h] + d) : 0u;
  };
  auto store_pair = [&](T* (&rows)[2], int h, int d, float x0, float x1) {
    *reinterpret_cast<uint32_t*>(rows[h] + d) = mma::pack_floats<T>(x0, x1);
  };
  // ---- S3a: dq_i += (sum_j S_ij k_raw_j) / rq_i (S_ij = 0 for j > i: chunk steps kq <= rs); with
  // direct outputs plus B2a's state part (read back), and this K half's share of <q_raw_i, dq_i>.
  float dq[NKH][4];
  {
    // B2a's state part of the thread's elements (rows r0 + 8 h, channels d0 + 8 nt + 2 tig + {0, 1}),
    // in flight during the products.
    uint32_t dqs[NKH][2];
    if constexpr (kEarlyDqState) {
#pragma unroll
      for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) dqs[nt][h] = dqs_early[nt][h];
    } else {
      T* dq_row[2];
      rows_of(a.dq_out, dq_row);
#pragma unroll
      for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) dqs[nt][h] = load_pair(dq_row, h, d0 + 8 * nt + 2 * tig);
    }
    mma::zero_acc(dq);
    for (int kq = 0; kq <= rs; ++kq) {
      uint32_t sh[4], sl[4], bk[NKH / 2][4];
      fr.lda(sh, S_hi, LDP, 16 * rs, 16 * kq);
      fr.lda(sl, S_lo, LDP, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.ldb_t(bk[np], sm.k, LDK, 16 * kq, d0 + 16 * np);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(dq[2 * np], dq[2 * np + 1], sh, bk[np]);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(dq[2 * np], dq[2 * np + 1], sl, bk[np]);
    }
    const float f[2] = {sm.irq[r0], sm.irq[r0 + 8]};
    float dot[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + 8 * (e >> 1), d = d0 + 8 * nt + ecol(e);
        float s0, s1;
        mma::unpack_floats<T>(dqs[nt][e >> 1], s0, s1);
        dq[nt][e] = dq[nt][e] * f[e >> 1] + ((e & 1) ? s1 : s0);
        dot[e >> 1] += tile_elem(sm.q, r, d - (e & 1), e & 1) * dq[nt][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = mma::quad_sum(dot[h]);
      if (tig == 0) sm.part[(8 + hf) * C + r0 + 8 * h] = x;
    }
  }
  __syncthreads();  // dq's dot shares complete; S is still read below (S3b), tmp waits for the next barrier
  // dq through the L2-norm backward: dx = rstd (dy - xn <xn, dy>), xn = x_raw rstd (dx = dy without it).
  {
    float rstd[2], dotn[2];
    T* dq_row2[2];
    rows_of(a.dq_out, dq_row2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      rstd[h] = sm.rq[r];
      dotn[h] = (sm.part[8 * C + r] + sm.part[9 * C + r]) * rstd[h];  // <xn, dy>
    }
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h, d = d0 + 8 * nt + 2 * tig;
        if (r < L) {
          float dx[2];
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const float g = dq[nt][2 * h + p];
            dx[p] = a.l2norm ? rstd[h] * (g - dotn[h] * rstd[h] * tile_elem(sm.q, r, d, p)) : g;
          }
          store_pair(dq_row2, h, d, dx[0], dx[1]);
        }
      }
  }

  // ---- S3b: dk_j += (sum_i S_ij q_raw_i) / rk_j (i >= j: kq >= rs), summed in registers (dkr) to
  // the end; dWb = A^T dw -> dk_r += beta_r e_r dWb_r, dbeta_r += (e k o dWb)_r, dG_r += beta_r (...).
  float dkr[NKH][4];
  {
    float acc[NKH][4];
    mma::zero_acc(acc);
    for (int kq = rs; kq < 4; ++kq) {
      uint32_t sh[4], sl[4], bq[NKH / 2][4];
      fr.lda_t(sh, S_hi, LDP, 16 * rs, 16 * kq);
      fr.lda_t(sl, S_lo, LDP, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.ldb_t(bq[np], sm.q, LDK, 16 * kq, d0 + 16 * np);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], sh, bq[np]);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], sl, bq[np]);
    }
    const float irk[2] = {sm.irk[r0], sm.irk[r0 + 8]};
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dkr[nt][e] = acc[nt][e] * irk[e >> 1];
    mma::zero_acc(acc);
    for (int kq = rs; kq < 4; ++kq) {
      uint32_t ah[4], al[4], bw[NKH / 2][4];
      fr.lda_t(ah, sm.A_hi, LDP, 16 * rs, 16 * kq);
      fr.lda_t(al, sm.A_lo, LDP, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.ldb_t(bw[np], sm.dw, LDK, 16 * kq, d0 + 16 * np);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], ah, bw[np]);
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], al, bw[np]);
    }
    float rsum[2] = {0.f, 0.f};
    const float er[2] = {sm.eG[r0], sm.eG[r0 + 8]}, br[2] = {sm.beta[r0], sm.beta[r0 + 8]};
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + 8 * (e >> 1), d = d0 + 8 * nt + ecol(e);
        dkr[nt][e] += br[e >> 1] * er[e >> 1] * acc[nt][e];
        rsum[e >> 1] += tile_elem(sm.k, r, d - (e & 1), e & 1) * acc[nt][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = rsum[h] * er[h] * sm.rk[r0 + 8 * h];
      rowB[h] += x;
      rowG[h] += br[h] * x;
    }
  }
  __syncthreads();  // S no longer read: tmp takes its place; dw no longer read: B2a's dk part takes its place
  // B2a's state part of dk (rows < L, zeros past) by cp.async into dw's tile, in flight through S5 and S6.
  rows16_async<T>(a.dk_out, ci, head, KMAX, sm.dw, LDK, tid);
  mma::cp_async_commit();

  // ---- S5: tmp = dA A^T (dA_ij = 0 for j > i: kq <= rs), as hi / lo where S was.
  {
    float acc[4][4];
    mma::zero_acc(acc);
    for (int kq = 0; kq <= rs; ++kq) {
      uint32_t ah[4], al[4], bh[2][4], bl[2][4];
      fr.lda(ah, dA_hi, LDP, 16 * rs, 16 * kq);
      fr.lda(al, dA_lo, LDP, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        fr.ldb(bh[np], sm.A_hi, LDP, 16 * kq, 32 * hf + 16 * np);
        fr.ldb(bl[np], sm.A_lo, LDP, 16 * kq, 32 * hf + 16 * np);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], ah, bh[np]);
#pragma unroll
      for (int np = 0; np < 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], ah, bl[np]);
#pragma unroll
      for (int np = 0; np < 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], al, bh[np]);
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) store_tile_split(S_hi, S_lo, 16 * rs, 32 * hf + 8 * nt, acc[nt]);
  }
  __syncthreads();  // tmp complete; dA no longer read: S2 takes its place
  T* tmp_hi = S_hi;
  T* tmp_lo = S_lo;
  T* S2_hi = dA_hi;
  T* S2_lo = dA_lo;

  // ---- S6: dM = -StrictLower(A^T tmp), KK = k_raw k_raw^T -> S2 = (dKk o Gam) rk_i rk_j, dbeta += rowsum
  // (dM o Kk), dG += rowsum - colsum of dKk o Kk.
  {
    float accM[4][4], accK[4][4];
    mma::zero_acc(accM);
    mma::zero_acc(accK);
    const int nps = std::min(2, rs - 2 * hf + 1);  // column blocks 2 hf + np <= rs only
    for (int kq = rs; kq < 4; ++kq) {  // (A^T)_im = A_mi = 0 for m < i
      uint32_t ah[4], al[4], bh[2][4], bl[2][4];
      fr.lda_t(ah, sm.A_hi, LDP, 16 * rs, 16 * kq);
      fr.lda_t(al, sm.A_lo, LDP, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < 2; ++np)
        if (np < nps) {
          fr.ldb_t(bh[np], tmp_hi, LDP, 16 * kq, 32 * hf + 16 * np);
          fr.ldb_t(bl[np], tmp_lo, LDP, 16 * kq, 32 * hf + 16 * np);
        }
#pragma unroll
      for (int np = 0; np < 2; ++np)
        if (np < nps) fr.mma2(accM[2 * np], accM[2 * np + 1], ah, bh[np]);
#pragma unroll
      for (int np = 0; np < 2; ++np)
        if (np < nps) fr.mma2(accM[2 * np], accM[2 * np + 1], ah, bl[np]);
#pragma unroll
      for (int np = 0; np < 2; ++np)
        if (np < nps) fr.mma2(accM[2 * np], accM[2 * np + 1], al, bh[np]);
    }
#pragma unroll
    for (int kq = 0; kq < KMAX / 16; ++kq) {
      uint32_t ak[4];
      fr.lda(ak, sm.k, LDK, 16 * rs, 16 * kq);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        if (2 * hf + np > rs) continue;
        uint32_t bk[4];
        fr.ldb(bk, sm.k, LDK, 16 * kq, 32 * hf + 16 * np);
        fr.mma2(accK[2 * np], accK[2 * np + 1], ak, bk);
      }
    }
    const float Gi[2] = {sm.G[r0], sm.G[r0 + 8]}, rki[2] = {sm.rk[r0], sm.rk[r0 + 8]},
                bi[2] = {sm.beta[r0], sm.beta[r0 + 8]};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int j0 = 32 * hf + 8 * nt + 2 * tig;
      const float2 Gj = *reinterpret_cast<const float2*>(&sm.G[j0]), rkj = *reinterpret_cast<const float2*>(&sm.rk[j0]);
      float outs[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + 8 * (e >> 1), j = j0 + (e & 1);
        float out = 0.f;
        if (i < L && j < i) {
          const float gam = decay_exp_ftz(Gi[e >> 1] - ((e & 1) ? Gj.y : Gj.x)),  // (j < i: exponent <= 0)
                      rkk = rki[e >> 1] * ((e & 1) ? rkj.y : rkj.x);
          const float Kk = accK[nt][e] * rkk * gam, dM = -accM[nt][e], dKk = bi[e >> 1] * dM;
          rowB[e >> 1] += dM * Kk;
          rowG[e >> 1] += dKk * Kk;
          colG[nt][e & 1] -= dKk * Kk;
          out = dKk * gam * rkk;
        }
        outs[e] = out;
      }
      store_tile_split(S2_hi, S2_lo, 16 * rs, 32 * hf + 8 * nt, outs);
    }
  }
  if constexpr (kFlushRowSumsTwice) flush_row_sums(true);  // S6 made their last terms
  mma::cp_async_wait<0>();
  __syncthreads();  // S2 complete; B2a's dk part landed (in dw's tile)

  // ---- S6b: dk_r += (sum_j S2_rj k_raw_j + sum_i S2_ir k_raw_i) / rk_r (S2 strictly lower); with direct
  // outputs plus B2a's state part and this K half's share of <k_raw_r, dk_r>.
  {
    float acc[NKH][4];
    mma::zero_acc(acc);
    for (int kq = 0; kq < 4; ++kq) {
      uint32_t bk[NKH / 2][4];
#pragma unroll
      for (int np = 0; np < NKH / 2; ++np) fr.ldb_t(bk[np], sm.k, LDK, 16 * kq, d0 + 16 * np);
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        // pass 0: S2's rows of the strip (columns kq <= rs); pass 1: S2^T's (rows kq >= rs).
        if (pass == 0 ? kq > rs : kq < rs) continue;
        uint32_t sh[4], sl[4];
        if (pass == 0) {
          fr.lda(sh, S2_hi, LDP, 16 * rs, 16 * kq);
          fr.lda(sl, S2_lo, LDP, 16 * rs, 16 * kq);
        } else {
          fr.lda_t(sh, S2_hi, LDP, 16 * rs, 16 * kq);
          fr.lda_t(sl, S2_lo, LDP, 16 * rs, 16 * kq);
        }
#pragma unroll
        for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], sh, bk[np]);
#pragma unroll
        for (int np = 0; np < NKH / 2; ++np) fr.mma2(acc[2 * np], acc[2 * np + 1], sl, bk[np]);
      }
    }
    const float irk[2] = {sm.irk[r0], sm.irk[r0 + 8]};
    float dot[2] = {0.f, 0.f};
    const T* dks = sm.dw;  // B2a's state part of dk (copied in after S3b)
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + 8 * (e >> 1), d = d0 + 8 * nt + ecol(e);
        dkr[nt][e] += acc[nt][e] * irk[e >> 1] + tile_elem(dks, r, d - (e & 1), e & 1);
        dot[e >> 1] += tile_elem(sm.k, r, d - (e & 1), e & 1) * dkr[nt][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = mma::quad_sum(dot[h]);
      if (tig == 0) sm.part[(10 + hf) * C + r0 + 8 * h] = x;
    }
  }
  if constexpr (!kFlushRowSumsTwice) flush_row_sums(false);
  __syncthreads();  // the row-role sums' and dk dots' slots complete
  {  // dk through the L2-norm backward (as dq above)
    float rstd[2], dotn[2];
    T* dk_row[2];
    rows_of(a.dk_out, dk_row);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      rstd[h] = sm.rk[r];
      dotn[h] = (sm.part[10 * C + r] + sm.part[11 * C + r]) * rstd[h];
    }
#pragma unroll
    for (int nt = 0; nt < NKH; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h, d = d0 + 8 * nt + 2 * tig;
        if (r < L) {
          float dx[2];
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const float g = dkr[nt][2 * h + p];
            dx[p] = a.l2norm ? rstd[h] * (g - dotn[h] * rstd[h] * tile_elem(sm.k, r, d, p)) : g;
          }
          store_pair(dk_row, h, d, dx[0], dx[1]);
        }
      }
  }
  if (tid < C) {
    const int i = tid;
    float g = 0.f;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      if (m == 2 || m == 3) continue;  // dbeta's rows
      g += sm.part[m * C + i];
    }
    g += sm.dG[i];  // B2a's terms, read in the prologue (this thread's own slot)
    sm.dG[i] = i < L ? g : 0.f;
    if (i < L) store_elem<T>(a.dbeta_out, off3(a.dbeta_out, ci.b, ci.t0 + i, hv), sm.part[2 * C + i] + sm.part[3 * C + i]);
  }
  __syncthreads();
  // dg = reverse cumsum of dG inside the chunk (warp 0: lane l holds rows 62 - 2 l, 63 - 2 l; an
  // inclusive prefix sum of the pair sums over the lanes is the sum of rows >= 62 - 2 l).
  if (wp == 0 && a.dg_out.p != nullptr) {
    const int i0 = 62 - 2 * lane, i1 = 63 - 2 * lane;
    const float x0 = sm.dG[i0], x1 = sm.dG[i1];
    float sum = x0 + x1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float t = __shfl_up_sync(0xffffffffu, sum, o);
      if (lane >= o) sum += t;
    }
    if (i0 < L) store_elem<T>(a.dg_out, off3(a.dg_out, ci.b, ci.t0 + i0, hv), sum);
    if (i1 < L) store_elem<T>(a.dg_out, off3(a.dg_out, ci.b, ci.t0 + i1, hv), sum - x0);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule

// Session 11's kernels where V == K (the default v5; FLASHGRAD_CHUNKED_B2_SPLIT, read per call: split_variant).
#include "chunked_grads_state_coalesced.cuh"
#include "chunked_grads_split_variants.cuh"
