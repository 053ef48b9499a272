// Chunked backward stage B1 ("state backward"), transposed like stage 2 (chunked_state.cuh): one
// block of WARPS warps per (sequence, value head, slice of BV = 16 WARPS value columns), over the
// sequence's chunks in reverse. With dh = dL/dh_{c+1} (dht for the last chunk), per chunk
//   dv_new = kd dh + (scale P)^T do,       kd = k exp(G_last - G) (rows of the normalized k)
//   dh_c   = exp(G_last) dh + (scale exp(G) q)^T do - w^T dv_new,   P = Lower(q k^T exp(G_i - G_j))
// (chunked_state_backward.cuh, the legacy version, derives them). Writes dh per chunk and dv_new
// (fp32, or T with the backward's 16-bit storage: ChunkedArgs::dh16, dv_new16) and dh0. Needs the forward's G and w (stage 1).
//
// Warp wp owns value columns [16 wp, +16) of the slice and holds dh^T (16 x K, fp32) in mma
// accumulators (tile nk: key channels [8 nk, +8)). Per chunk, in the warp's registers:
//   dv_new^T (16 x 64) = (dh^T k_raw^T) * colscale_j + do^T (scale P)
//       A = dh^T (accumulators, hi + lo), B = k's raw rows (ldmatrix); colscale_j =
//       exp(G_last - G_j) rstd_kj (0 for j >= L) on the fp32 result; A = do^T (ldmatrix.trans of
//       do's rows, exact in T), B = scale P (hi + lo in shared memory, ldmatrix.trans);
//   dh^T = exp(G_last) dh^T + (do^T * rowscale_i) q_raw - dv_new^T w
//       A = do^T times rowscale_i = scale exp(G_i) rstd_qi per column (fp32, split hi + lo),
//       B = q's raw rows (ldmatrix.trans); A = dv_new^T (accumulators, hi + lo, negated),
//       B = w (ldmatrix.trans).
// kSplit makes every product above hi + lo: the fp32 operand (dh^T, scale P, do^T * rowscale,
// dv_new^T) is rounded to T and its remainder multiplied too, so the products are fp32-accurate at
// twice the mmas. kSplit = false (the default since run 9.2: chunked_stages.h) rounds those operands
// to T once, as fla's backward does (its dh, dv and A enter bf16 dot products): half the mmas
// (456 -> 244 mma.m16n8k16 per warp and chunk at K = 128), P_lo unused. That bought 14%, not the 2x
// of the mma count: ncu (run 9.2, B8 T4096, 8 warps, one block per SM) shows the kernel latency-
// bound, issue active 27%, stalls at the barriers (P's triangular items leave warps idle), on
// fixed-latency dependencies and on scoreboards; the P formation and the row scales (segments 1-2,
// ~58% of the stall samples) are the part of the loop that does not depend on dh.
// The block forms scale P once per chunk: work items it = (16-row block it % 4, column half it / 4)
// of P's lower triangle, 8 / WARPS per warp (chunked_state.cuh's fused output does the same with
// 8 warps).
//
// KSPLIT == 2 (with kLocal; few long sequences, where each block's serial chain is the time, session
// 10): two warps share each 16 value columns, warp wp holding key channels [K/2 (wp / groups), +K/2)
// of dh^T; their halves of dh^T k^T are summed through shared memory (one more barrier per chunk),
// then both hold dv_new^T whole and update their own channels of dh^T without exchange: each warp's
// mmas per chunk halve (96 at K = 128) and a block covers 32 value columns (twice the blocks).
// KSPLIT == 4 (K = 128): four warps of 32 channels per 16 value columns (48 mmas per warp and chunk).
// q, k (raw rows), w and the slice's do rows arrive by cp.async one chunk ahead (two stages); rows
// past the chunk's length are zero-filled. Barriers per chunk: (A) chunk c's tiles have landed and
// every warp is done with the previous chunk's buffers; (C) the row scales are written; (P) scale P
// is written (the warps form it after (C), so its fp32 products never wait in registers). Every
// read of G, the row scales and P precedes the next chunk's (A).
#pragma once

#include "chunked_channel_split.cuh"
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_output.cuh"  // store_split
#include "chunked_rows.cuh"
#include "chunked_scaled_p.cuh"
#include "chunked_stage_store.cuh"  // store_channel_tiles_staged, store_acc_rows_staged
#include "chunked_stage_sync.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int WARPS, bool kLocal = false, int KSPLIT = 1>
struct StateBackwardTSmem {
  // WARPS / KSPLIT groups of 16 value columns; KSPLIT warps share a group, each with K / KSPLIT key
  // channels of dh^T.
  static constexpr int C = kChunkSize, BV = 16 * WARPS / KSPLIT;
  // Row pitches +8 elements: the 8 rows of an ldmatrix start in different banks, rows 16-byte aligned.
  static constexpr int LDK = KMAX + 8, LDD = BV + 8, LDP = C + 8;
  static constexpr int64_t kTileBytes = sizeof(T) * C * LDK;
  // w, k, q, do (and with kLocal the slice's dv_local rows, [C][LDD] after do).
  static constexpr int64_t kStageBytes = 3 * kTileBytes + (kLocal ? 2 : 1) * sizeof(T) * C * LDD;
  static constexpr int64_t kPBytes = kLocal ? 0 : 2 * sizeof(T) * C * LDP;
  // KSPLIT > 1: each thread's 32 partial sums of dh^T k^T, exchanged with its group's other warps.
  static constexpr int64_t kSwapBytes = KSPLIT > 1 ? sizeof(float) * 32 * 32 * WARPS : 0;
  // kStagedStores (the 8-warp kernel of many sequences, the default at B8 T4096): each warp's private
  // tile for its 16-bit dh and dv_new stores (store_channel_tiles_staged: [KMAX][16] T; then
  // store_acc_rows_staged: [64][24] T, 48-byte rows so that its stmatrix rows and 16-byte reads
  // spread over the banks), 4 KiB per warp at K = 128. The 4-warp and channel-split variants keep
  // their per-element stores: only the 8-warp kernel was measured with the tiles (run 22.2), and the
  // others' extra shared memory (16 KiB per block) is untried.
  static constexpr bool kStagedStores = WARPS == 8 && !kLocal && KSPLIT == 1;
  static constexpr int kDvStageLd = 24;
  static constexpr int kStoreStageElems = KMAX * 16 > C * kDvStageLd ? KMAX * 16 : C * kDvStageLd;
  static constexpr int64_t kStoreStageBytes = kStagedStores ? sizeof(T) * kStoreStageElems * WARPS : 0;
  static_assert(kTileBytes % 16 == 0 && kStageBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned tiles");
  unsigned char* raw;
  T* P;             // [C][LDP] scale P, hi part
  T* P_lo;          // [C][LDP] lo part
  float* G;         // [C] cumulative gate (zeros past L)
  float* colscale;  // [C] exp(G_last - G_j) rstd_kj, 0 for j >= L
  float* rowscale;  // [C] scale exp(G_i) rstd_qi, 0 for i >= L
  float* pscale;    // [C] scale rstd_qi
  float* rstd_k;    // [C]
  float4* swap;     // [8][THREADS] (KSPLIT > 1): thread tid's i-th float4 at swap[i * THREADS + tid]
  T* store_stage;   // [WARPS][kStoreStageElems] (kStagedStores)
  static constexpr int64_t bytes() {
    return 2 * kStageBytes + kPBytes + kSwapBytes + kStoreStageBytes + sizeof(float) * 5 * C;
  }
  __device__ explicit StateBackwardTSmem(unsigned char* r) : raw(r) {
    P = reinterpret_cast<T*>(raw + 2 * kStageBytes);
    P_lo = P + C * LDP;
    swap = reinterpret_cast<float4*>(raw + 2 * kStageBytes + kPBytes);
    store_stage = reinterpret_cast<T*>(raw + 2 * kStageBytes + kPBytes + kSwapBytes);
    G = reinterpret_cast<float*>(raw + 2 * kStageBytes + kPBytes + kSwapBytes + kStoreStageBytes);
    colscale = G + C;
    rowscale = colscale + C;
    pscale = rowscale + C;
    rstd_k = pscale + C;
  }
  // Stage s of the double buffer: w(s), k(s), q(s) [C][LDK] raw rows; dout(s) [C][LDD] the slice.
  __device__ T* w(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* k(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kTileBytes); }
  __device__ T* q(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + 2 * kTileBytes); }
  __device__ T* dout(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + 3 * kTileBytes); }
  __device__ T* dv_local(int s) const { return dout(s) + C * LDD; }
};

namespace mma {
// The A fragment `a` (16-bit T pairs) with column c's elements multiplied by that column's factor
// (columns 2 tig + {0, 1} by s0, 8 + 2 tig + {0, 1} by s1), in fp32, rounded to T (hi), and with
// kSplit the remainder as lo.
template <typename T, bool kSplit>
__device__ __forceinline__ void scale_a(const uint32_t (&a)[4], const float2 s0, const float2 s1, uint32_t (&hi)[4],
                                        uint32_t (&lo)[4]) {
  float x0, x1;
  unpack_floats<T>(a[0], x0, x1);  // row grp, columns 2 tig + {0, 1}
  round_pair<T, kSplit>(x0 * s0.x, x1 * s0.y, hi[0], lo[0]);
  unpack_floats<T>(a[1], x0, x1);  // row grp + 8
  round_pair<T, kSplit>(x0 * s0.x, x1 * s0.y, hi[1], lo[1]);
  unpack_floats<T>(a[2], x0, x1);  // row grp, columns 8 + 2 tig + {0, 1}
  round_pair<T, kSplit>(x0 * s1.x, x1 * s1.y, hi[2], lo[2]);
  unpack_floats<T>(a[3], x0, x1);
  round_pair<T, kSplit>(x0 * s1.x, x1 * s1.y, hi[3], lo[3]);
}
}  // namespace mma

// The stage's body: block barriers at named barrier kBar (chunked_stage_sync.cuh; 0 in its own kernel).
template <typename T, int KMAX, int WARPS, bool kSplit, bool kLocal, int KSPLIT, int kBar>
__device__ __forceinline__ void chunk_state_backward_transposed_body(const ChunkedArgs& a, unsigned char* smem_raw) {
  using S = StateBackwardTSmem<T, KMAX, WARPS, kLocal, KSPLIT>;
  static_assert(WARPS == 4 || WARPS == 8, "8 P items over the warps, 64 rows over the threads");
  static_assert(!kLocal || !kSplit, "dv_local (T) is added to single-fragment products");
  static_assert(KSPLIT == 1 || (kLocal && (KSPLIT == 2 || (KSPLIT == 4 && KMAX == 128))),
                "the channel split: with dv_local, two halves, or four quarters of 32 channels");
  constexpr int C = kChunkSize, THREADS = 32 * WARPS, BV = S::BV, LDK = S::LDK, LDD = S::LDD, LDP = S::LDP,
                KH = KMAX / KSPLIT, NK = KH / 8, NG = WARPS / KSPLIT;
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * BV;
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  // The warp's first value column inside the slice and its first key channel (0 without the split;
  // spelled apart so that the compiler knows it).
  const int vc0 = KSPLIT == 1 ? 16 * wp : 16 * (wp % NG);
  const int kc0 = KSPLIT == 1 ? 0 : KH * (wp / NG);
  // Accumulator element e of a tile: value column vc0 + grp + 8 (e / 2) (the tile's row), column
  // 2 tig + e % 2 of the tile (a key channel of dh^T, a chunk row of dv_new^T).
  auto vcol = [&](int e) { return vc0 + grp + 8 * (e >> 1); };
  auto tcol = [&](int e) { return 2 * tig + (e & 1); };
  // ldmatrix lane addresses inside a 16 x 16 block of a row-major tile (chunked_state.cuh): nb_*
  // for non-trans B fragments of two 8-column tiles and for .trans A fragments (rows +8 by
  // lane / 16, columns +8 by (lane / 8) % 2); tb_* for .trans B fragments.
  const int nb_r = 8 * (lane >> 4) + (lane & 7), nb_c = 8 * ((lane >> 3) & 1);
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);

  float dhT[NK][4];
#pragma unroll
  for (int nk = 0; nk < NK; ++nk)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dhT[nk][e] =
          a.dht.p ? static_cast<const float*>(a.dht.p)[off4(a.dht, n, hv, kc0 + 8 * nk + tcol(e), col0 + vcol(e))]
                  : 0.f;

  const T* w = static_cast<const T*>(a.w);
  const bool k_vec = key_rows_vectorizable(a.k), q_vec = key_rows_vectorizable(a.q);
  // The slice's columns of dout: the same view from column col0 (still vectorizable: col0 is a
  // multiple of 32 elements).
  View dslice = a.dout;
  dslice.p = static_cast<T*>(a.dout.p) + col0 * a.dout.s3;
  const bool d_vec = key_rows_vectorizable(dslice);
  const int64_t c_first = a.seq_first_chunk[n], c_last = a.seq_first_chunk[n + 1] - 1;

  // With kLocal (no P here) and stage 1's row scales given (ChunkedArgs::colscale), colscale comes
  // from them: no k row norms per chunk on the chain (session 16).
  constexpr int kLanes = THREADS / C;
  const bool pre = kLocal && a.colscale != nullptr;
  // Issues chunk c's copies into stage s (one cp.async group); returns G of row tid (tid < 64) and,
  // with `pre`, sets cs to the colscale of row tid / kLanes.
  auto prefetch = [&](const ChunkInfo& ci, int s, float& cs) {
    const int64_t row0 = chunk_row0(ci, a.T);
    intermediate_stepped_async<T, KMAX, THREADS>(w, row0, a.HV, hv, a.K, 0, ci.len, sm.w(s), LDK);
    view_rows_stepped_async<T, KMAX, THREADS>(a.k, ci, head, k_vec, sm.k(s), LDK);
    view_rows_stepped_async<T, KMAX, THREADS>(a.q, ci, head, q_vec, sm.q(s), LDK);
    view_rows_stepped_async<T, BV, THREADS>(dslice, ci, hv, d_vec, sm.dout(s), LDD);
    if constexpr (kLocal)  // dv_local's rows of the slice, where B1 then writes dv_new (same elements)
      intermediate_stepped_async<T, BV, THREADS>(static_cast<const T*>(a.dv_new16), row0, a.HV, hv, a.V, col0,
                                                ci.len, sm.dv_local(s), LDD);
    mma::cp_async_commit();
    const int jr = tid / kLanes;
    cs = (pre && jr < ci.len) ? a.colscale[(row0 + jr) * a.HV + hv] : 0.f;
    return (a.G && tid < ci.len) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
  };

  // The chunk plan's entries are read two chunks ahead (ci_next: the one the next prefetch copies),
  // as stage 2 does, so that neither the prefetch's addresses nor the chunk's length wait on that
  // global load (run 10.1's ncu: ~20% of B1's stall samples at B1 T32768 were these waits).
  ChunkInfo ci_cur{}, ci_next{};
  float g_next = 0.f, cs_next = 0.f;
  if (c_last >= c_first) {
    ci_cur = a.chunks[c_last];
    g_next = prefetch(ci_cur, 0, cs_next);
    if (c_last > c_first) ci_next = a.chunks[c_last - 1];
  }
  for (int64_t c = c_last; c >= c_first; --c) {
    const int s = static_cast<int>((c_last - c) & 1);
    const ChunkInfo ci = ci_cur;
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);

    // (A) chunk c's tiles and G in place; every warp is done with chunk c + 1.
    if (tid < C) sm.G[tid] = g_next;
    const float cs_cur = cs_next;  // (pre) chunk c's colscale of row tid / kLanes
    mma::cp_async_wait<0>();
    stage_sync<kBar, THREADS>();
    if (c > c_first) {
      g_next = prefetch(ci_next, s ^ 1, cs_next);
      ci_cur = ci_next;
      if (c - 2 >= c_first) ci_next = a.chunks[c - 2];
    }
    const T* ks = sm.k(s);
    const T* qs = sm.q(s);
    const T* ws = sm.w(s);
    const T* ds = sm.dout(s);

    // (C) per-row scales, from the raw tiles (exp arguments <= 0 for a gate g <= 0: the factors
    // are bounded by 1).
    const float G_last = sm.G[L - 1];
    {
      const float rk = pre ? 1.f : tile_row_rstd<T, KMAX, THREADS>(ks, LDK, a.l2norm);
      const float rq = tile_row_rstd<T, KMAX, THREADS>(qs, LDK, a.l2norm);
      if (tid % kLanes == 0) {
        const int j = tid / kLanes;
        const bool in = j < L;
        sm.colscale[j] = in ? (pre ? cs_cur : expf(G_last - sm.G[j]) * rk) : 0.f;
        sm.rowscale[j] = in ? a.scale * rq * expf(sm.G[j]) : 0.f;
        sm.pscale[j] = a.scale * rq;
        sm.rstd_k[j] = rk;
      }
    }
    stage_sync<kBar, THREADS>();

    // scale P_ij = scale rstd_qi rstd_kj exp(G_i - G_j) (q k^T)_ij for j <= i < L, else 0, into
    // shared memory (hi + lo with kSplit), this warp's items (chunked_scaled_p.cuh says which).
    if constexpr (!kLocal)  // (with kLocal, chunked_dv_local.cuh formed P and its product ahead)
      form_scaled_p<T, KMAX, WARPS, kSplit>(qs, ks, LDK, sm.pscale, sm.rstd_k, sm.G, L, sm.P, sm.P_lo, LDP, lane, wp,
                                            nb_r, nb_c);

    // dL/dh_{c+1} to the intermediates (the slice's columns).
    // (In T with 16-bit storage, a.dh16; else fp32.)
    {
      const int64_t at = (c * a.HV + hv) * a.K * a.V + col0;
      if (a.dh16 && S::kStagedStores) {
        store_channel_tiles_staged<T, NK>(static_cast<T*>(a.dh16) + at + vc0, a.V, lane, dhT,
                                          sm.store_stage + wp * S::kStoreStageElems);
      } else if (a.dh16) {
        T* dhc = static_cast<T*>(a.dh16) + at;
#pragma unroll
        for (int nk = 0; nk < NK; ++nk)
#pragma unroll
          for (int e = 0; e < 4; ++e) dhc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = from_f<T>(dhT[nk][e]);
      } else {
        float* dhc = a.dh + at;
#pragma unroll
        for (int nk = 0; nk < NK; ++nk)
#pragma unroll
          for (int e = 0; e < 4; ++e) dhc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = dhT[nk][e];
      }
    }

    // dv_new^T, first part: (dh^T k_raw^T) * colscale_j; p[j8]: chunk rows [8 j8, +8).
    float p[8][4] = {};
#pragma unroll
    for (int kq = 0; kq < KH / 16; ++kq) {
      uint32_t ah[4], al[4];
      mma::acc_to_a<T, kSplit>(dhT[2 * kq], dhT[2 * kq + 1], ah, al);
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t b[4];
        mma::ldmatrix_x4<false>(b, ks + (16 * jp + nb_r) * LDK + kc0 + 16 * kq + nb_c);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma::mma16816<T>(p[2 * jp], ah, b0);
        if constexpr (kSplit) mma::mma16816<T>(p[2 * jp], al, b0);
        mma::mma16816<T>(p[2 * jp + 1], ah, b1);
        if constexpr (kSplit) mma::mma16816<T>(p[2 * jp + 1], al, b1);
      }
    }
    // The channel parts' sums (chunked_channel_split.cuh); the next chunk's barrier (A) orders the
    // exchange slots' next writes.
    if constexpr (KSPLIT > 1) sum_channel_parts<KSPLIT, THREADS, NG, kBar>(p, sm.swap, tid);
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8) {
      const float2 cs = *reinterpret_cast<const float2*>(&sm.colscale[8 * j8 + 2 * tig]);
      p[j8][0] *= cs.x;
      p[j8][1] *= cs.y;
      p[j8][2] *= cs.x;
      p[j8][3] *= cs.y;
    }
    if constexpr (kLocal) {
      // + dv_local^T: ldmatrix.trans of its [64][BV] rows gives, per 16-row block js, the A-fragment
      // layout, which is that of the accumulator pair p[2 js], p[2 js + 1] (value column grp (+8),
      // chunk rows 16 js + 2 tig + {0, 1} (+8)).
      const T* dl = sm.dv_local(s);
#pragma unroll
      for (int js = 0; js < C / 16; ++js) {
        uint32_t f[4];
        mma::ldmatrix_x4<true>(f, dl + (16 * js + nb_r) * LDD + vc0 + nb_c);
        float x0, x1;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          mma::unpack_floats<T>(f[r], x0, x1);
          float* acc = p[2 * js + (r >> 1)] + 2 * (r & 1);
          acc[0] += x0;
          acc[1] += x1;
        }
      }
    }
    const float decay = expf(G_last);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) dhT[nk][e] *= decay;
    if constexpr (!kLocal) stage_sync<kBar, THREADS>();  // (P) scale P is in shared memory

    // Per 16-row block is of the chunk (the k dimension of both products): A = do^T's columns
    // [16 is, +16) (ldmatrix.trans); dv_new^T += do^T (scale P) over P's rows is (nonzero column
    // blocks jp <= is only), dh^T += (do^T * rowscale) q_raw.
#pragma unroll
    for (int is = 0; is < C / 16; ++is) {
      uint32_t ad[4];
      mma::ldmatrix_x4<true>(ad, ds + (16 * is + nb_r) * LDD + vc0 + nb_c);
      if constexpr (!kLocal) accumulate_dot_p<T, kSplit>(p, ad, is, sm.P, sm.P_lo, LDP, tb_r, tb_c);
      const float2 r0 = *reinterpret_cast<const float2*>(&sm.rowscale[16 * is + 2 * tig]);
      const float2 r1 = *reinterpret_cast<const float2*>(&sm.rowscale[16 * is + 8 + 2 * tig]);
      uint32_t sh[4], sl[4];
      mma::scale_a<T, kSplit>(ad, r0, r1, sh, sl);
#pragma unroll
      for (int np = 0; np < NK / 2; ++np) {
        uint32_t b[4];
        mma::ldmatrix_x4<true>(b, qs + (16 * is + tb_r) * LDK + kc0 + 16 * np + tb_c);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma::mma16816<T>(dhT[2 * np], sh, b0);
        if constexpr (kSplit) mma::mma16816<T>(dhT[2 * np], sl, b0);
        mma::mma16816<T>(dhT[2 * np + 1], sh, b1);
        if constexpr (kSplit) mma::mma16816<T>(dhT[2 * np + 1], sl, b1);
      }
    }

    // dv_new (fp32, or T into a.dv_new16) for rows j < L (rows past L are zero: do, colscale and P
    // vanish there).
    if (kc0 == 0) {  // (with the channel split, both warps of a group hold the whole dv_new^T)
      const int64_t at = (row0 * a.HV + hv) * a.V + col0 + vcol(0), pitch = a.HV * a.V;
      if (a.dv_new16 && S::kStagedStores)  // (at - grp: column vc0, 16-byte aligned: V % 64 == 0)
        store_acc_rows_staged(static_cast<T*>(a.dv_new16) + at - grp, pitch, L, lane, p,
                              sm.store_stage + wp * S::kStoreStageElems, S::kDvStageLd);
      else if (a.dv_new16)
        store_acc_rows(static_cast<T*>(a.dv_new16) + at, pitch, L, tig, p);
      else
        store_acc_rows(a.dv_new + at, pitch, L, tig, p);
    }

    // dh^T -= dv_new^T w.
    const float fneg[2] = {-1.f, -1.f};
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t ah[4], al[4];
      mma::acc_to_a<T, kSplit>(p[2 * js], p[2 * js + 1], fneg, fneg, ah, al);
#pragma unroll
      for (int np = 0; np < NK / 2; ++np) {
        uint32_t b[4];
        mma::ldmatrix_x4<true>(b, ws + (16 * js + tb_r) * LDK + kc0 + 16 * np + tb_c);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma::mma16816<T>(dhT[2 * np], ah, b0);
        if constexpr (kSplit) mma::mma16816<T>(dhT[2 * np], al, b0);
        mma::mma16816<T>(dhT[2 * np + 1], ah, b1);
        if constexpr (kSplit) mma::mma16816<T>(dhT[2 * np + 1], al, b1);
      }
    }
  }

  if (a.dh0.p) {
    float* dh0 = static_cast<float*>(a.dh0.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) dh0[off4(a.dh0, n, hv, kc0 + 8 * nk + tcol(e), col0 + vcol(e))] = dhT[nk][e];
  }
}

// The stage's own kernel: the body on the whole block (barrier 0 = __syncthreads).
template <typename T, int KMAX, int WARPS, bool kSplit = false, bool kLocal = false, int KSPLIT = 1>
__global__ void __launch_bounds__(32 * WARPS, 1) chunk_state_backward_transposed_kernel(ChunkedArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  chunk_state_backward_transposed_body<T, KMAX, WARPS, kSplit, kLocal, KSPLIT, 0>(a, smem_raw);
}

}  // namespace flashgrad::cuda_detail::delta_rule
