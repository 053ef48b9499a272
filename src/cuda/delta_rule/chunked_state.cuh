// Chunked stage 2 ("state"), one block of WARPS warps per (sequence, value head, slice of
// BV = 16 WARPS value columns), running over the sequence's chunks in order:
//   store h_c (the chunk-entry state: fp32, or T for the backward's 16-bit mode);  v_new = u - w h_c;
//   h_{c+1} = exp(G_{L-1}) h_c + k^T (v_new * exp(G_{L-1} - G) * rstd_k)
// (rstd_k: the in-kernel L2 norm of k's rows, 1 without it). Starts from initial_state (or zeros)
// and writes the final state (when asked).
//
// Transposed, so that nothing but the chunk's inputs passes through shared memory: warp wp owns
// value columns [16 wp, 16 wp + 16) of the slice and holds h^T (16 x K, fp32) in mma accumulators
// (tile nk: key channels [8 nk, 8 nk + 8)). Per chunk, all in registers of the warp:
//   v_new^T (16 x 64) = u^T - h^T w^T       A = h^T (accumulators -> A fragments, hi + lo),
//                                           B = w^T (ldmatrix of w's rows);
//   h^T = exp(G_{L-1}) h^T + v'^T k          A = v'^T = v_new^T scaled per column j (hi + lo),
//                                           B = k (ldmatrix.trans of k's raw rows).
// hi + lo (chunked_mma_ldmatrix.cuh) keeps the fp32 operands h and v' at ~16 bits through two
// mmas; w is T already (stage 1 stores it so), k is the raw input (exact in T), its L2 norm folded
// into the column scale in fp32. So h keeps fp32-like accuracy as the previous (shared-memory,
// scalar-fragment) version did; v_new is stored in T for stage 3.
//
// Per chunk the block copies w [64 x K], k [64 x K] (raw rows) and u [64 x BV] into shared memory
// with cp.async, one chunk ahead (two stages), so the serial chain over chunks waits on its mmas,
// not on loads. Rows past the chunk's length are zero-filled (u = w = 0 there, so v_new = 0).
// Two barriers per chunk: (A) chunk c's tiles have landed and every warp is done with chunk c - 1's
// buffers (which the prefetch of c + 1 then overwrites); (C) the per-row scales are written. Where
// stage 1 gives the row scales (ChunkedArgs::colscale; the channel-split body, session 16) they are
// loaded a chunk ahead with G and written before (A): no k row norms on the chain and no barrier (C).
#pragma once

#include "chunked_channel_split.cuh"
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_output.cuh"  // store_split
#include "chunked_rows.cuh"
#include "chunked_scaled_p.cuh"  // p_tile_deal, p_tiles_products, store_p_tiles
#include "chunked_stage_store.cuh"
#include "chunked_stage_sync.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Value columns per block of backward stage B1 and of the KDA state stages (not of stage 2 below,
// whose slice is 16 x its warps).
constexpr int kStateCols = 32;

template <typename T, int KMAX, int WARPS, bool kOutput, int KSPLIT = 1>
struct StateSmem {
  // WARPS / KSPLIT groups of 16 value columns; KSPLIT warps share a group, each with K / KSPLIT
  // key channels of its state.
  static constexpr int C = kChunkSize, BV = 16 * WARPS / KSPLIT;
  // Row pitches: +8 (16-bit) / +4 (fp32) elements, so that the 8 rows an ldmatrix (or the 4 x 8
  // pattern of u's reads) touches start in different banks; rows stay 16-byte aligned.
  static constexpr int LDK = KMAX + 8, LDU = BV + 4, LDP = C + 8;
  static constexpr int kKeyTiles = kOutput ? 3 : 2;  // w, k (and q)
  static constexpr int64_t kTileBytes = sizeof(T) * C * LDK;
  static constexpr int64_t kStageBytes = kKeyTiles * kTileBytes + sizeof(float) * C * LDU;
  static constexpr int64_t kPBytes = kOutput ? 2 * sizeof(T) * C * LDP : 0;
  // kOutput: each thread's 32 values of (h^T q^T) * rowscale, parked between the two halves of o.
  static constexpr int64_t kParkBytes = kOutput ? sizeof(float) * 32 * 32 * WARPS : 0;
  // G and colscale per stage (two each: with a.colscale given, the unfused body writes chunk c's before
  // barrier (A) and has no barrier (C), so chunk c - 1's may still be read then), then with kOutput
  // rowscale, pscale, rstd_k.
  static constexpr int kRowArrays = kOutput ? 7 : 4;
  // KSPLIT > 1: each thread's 32 partial sums of h^T w^T, exchanged with its group's other warps.
  static constexpr int64_t kSwapBytes = KSPLIT > 1 ? sizeof(float) * 32 * 32 * WARPS : 0;
  static_assert(kTileBytes % 16 == 0 && kStageBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned tiles");
  // Stage s (= chunk parity) of the double buffer, by address arithmetic (an array of pointers
  // indexed by the runtime parity would live in local memory):
  //   w(s) [C][LDK] w rows of the chunk; k(s) [C][LDK] k rows, raw (not normalized);
  //   q(s) [C][LDK] q rows, raw (kOutput); u(s) [C][LDU] u rows, the slice's BV columns.
  unsigned char* raw;
  T* P;             // [C][LDP] scale * P (kOutput), hi part
  T* P_lo;          // [C][LDP] lo part
  float* G;         // [2][C] cumulative gate of the chunk (zeros past L), by stage
  float* colscale;  // [2][C] exp(G_{L-1} - G_j) rstd_kj, 0 for j >= L, by stage
  float* rowscale;  // [C] scale exp(G_i) rstd_qi (kOutput)
  float* pscale;    // [C] scale rstd_qi (kOutput)
  float* rstd_k;    // [C] (kOutput)

  float4* park;     // [8][THREADS] (kOutput): thread tid's i-th float4 at park[i * THREADS + tid]

  float4* swap;     // [8][THREADS] (KSPLIT > 1): thread tid's i-th float4 at swap[i * THREADS + tid]

  static constexpr int64_t bytes() {
    return 2 * kStageBytes + kPBytes + kParkBytes + kSwapBytes + sizeof(float) * kRowArrays * C;
  }
  __device__ explicit StateSmem(unsigned char* r) : raw(r) {
    P = reinterpret_cast<T*>(raw + 2 * kStageBytes);
    P_lo = P + C * LDP;
    park = reinterpret_cast<float4*>(raw + 2 * kStageBytes + kPBytes);
    swap = reinterpret_cast<float4*>(raw + 2 * kStageBytes + kPBytes + kParkBytes);
    G = reinterpret_cast<float*>(raw + 2 * kStageBytes + kPBytes + kParkBytes + kSwapBytes);
    colscale = G + 2 * C;
    rowscale = colscale + 2 * C;
    pscale = rowscale + C;
    rstd_k = pscale + C;
  }
  __device__ T* w(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* k(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kTileBytes); }
  __device__ T* q(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + 2 * kTileBytes); }
  __device__ float* u(int s) const {
    return reinterpret_cast<float*>(raw + s * kStageBytes + kKeyTiles * kTileBytes);
  }
};

// kOutput: stage 3 fused in (chunked_stages.h, launch_chunk_state_with_output; the forward only):
// h is not stored, nor v_new unless the caller keeps it for the backward (a.keep_v_new; without it the
// backward recomputes stage 2 unfused); o and the final state are. Per chunk also
//   o^T = (h^T q^T) * (scale exp(G_i) rstd_qi per column i) + v_new^T (scale P)^T,
// with P = Lower(q k^T exp(G_i - G_j)) formed once per chunk by the block (its 20 nonzero
// 16 x 8 tiles dealt to the warps by p_tile_deal) into shared memory as hi + lo. h^T (hi + lo) is
// the A operand of h^T q^T, whose scaled result each thread parks in shared memory (its own 32
// slots) until v_new^T (fp32, hi + lo) is known as the A operand of the P product; so o needs
// neither h_c nor v_new from memory, and h^T, v_new^T and o^T are never all in registers (213
// registers at K = 128). Only with 8 warps (the whole 64-row P by 8 warps).
//
// KSPLIT == 2 (for few long sequences, where each block's serial chain is the time): two warps
// share each 16 value columns, warp wp holding key channels [K/2 (wp / groups), +K/2) of h^T; their
// halves of h^T w^T are summed through shared memory (one more barrier per chunk), the state update
// splits by channel without exchange. Each warp's mmas per chunk halve. (Four quarters, as B1 takes
// them, were no faster here: run 10.3, chunked_launch_impl.cuh.)
// kSingle (the forward's fused kernel by default, session 7): the fp32 operands h^T, v_new^T and
// scale P enter each product as one T fragment (hi only: round to nearest), not hi + lo, as fla's
// kernels take h and P in 16 bits: half the mmas on the serial chain. h itself stays in fp32
// accumulators, so the rounding does not compound over chunks. The unfused kernel (the backward's
// recomputation, the forward on few long sequences) keeps hi + lo: run 9.2 timed it with kSingle and
// it saved nothing there (not mma-bound). FLASHGRAD_CHUNKED_FWD_SPLIT=1 (chunked_launch_impl.cuh)
// runs the hi + lo fused kernel instead, to time and compare both in one process. The unfused body
// takes kSingle too: in the chains kernel by default (chunked_state_chains.cuh), in its own kernel
// with FLASHGRAD_CHUNKED_STATE_PRODUCTS=single (an experiment: chunked_launch_impl.cuh).
#ifndef FLASHGRAD_CHUNKED_FWD_SINGLE_DEFAULT  // host emulation: -D...=0 checks the hi + lo kernel
#define FLASHGRAD_CHUNKED_FWD_SINGLE_DEFAULT 1
#endif
// The stage's body: block barriers at named barrier kBar (chunked_stage_sync.cuh; 0 in its own kernel).
template <typename T, int KMAX, int WARPS, bool kOutput, int KSPLIT, bool kSingle, int kBar>
__device__ __forceinline__ void chunk_state_body(const ChunkedArgs& a, unsigned char* smem_raw) {
  using S = StateSmem<T, KMAX, WARPS, kOutput, KSPLIT>;
  constexpr int C = kChunkSize, THREADS = 32 * WARPS, BV = S::BV, LDK = S::LDK, LDU = S::LDU, LDP = S::LDP,
                KH = KMAX / KSPLIT, NK = KH / 8, NG = WARPS / KSPLIT;
  static_assert(!kOutput || WARPS == 8, "the fused output forms P with 8 warps");
  static_assert(KSPLIT == 1 || (KSPLIT == 2 && !kOutput), "the channel split: unfused, two halves");
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * BV;
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  const int vc0 = 16 * (wp % NG);  // the warp's first value column inside the slice
  const int kc0 = KH * (wp / NG);  // its first key channel (0 without the split)
  // Accumulator element e of a tile: value column vc0 + grp + 8 (e / 2) (the tile's row),
  // column 2 tig + e % 2 of the tile (a key channel of h^T, a chunk row of v_new^T / o^T).
  auto vcol = [&](int e) { return vc0 + grp + 8 * (e >> 1); };
  auto tcol = [&](int e) { return 2 * tig + (e & 1); };
  // ldmatrix lane addresses inside a 16 x 16 block of a row-major tile: non-trans B fragments of
  // two 8-column tiles (rows +0 / +8 by lane / 16, columns +0 / +8 by (lane / 8) % 2), and .trans
  // B fragments (rows by (lane / 8) % 2, columns by lane / 16).
  const int nb_r = 8 * (lane >> 4) + (lane & 7), nb_c = 8 * ((lane >> 3) & 1);
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);

  float hT[NK][4];
#pragma unroll
  for (int nk = 0; nk < NK; ++nk)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      hT[nk][e] = a.h0.p ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, kc0 + 8 * nk + tcol(e),
                                                                   col0 + vcol(e))]
                         : 0.f;

  const T* w = static_cast<const T*>(a.w);
  T* v_new = static_cast<T*>(a.v_new);
  // The kept v_new's 16-byte stores need its base 16-byte aligned (columns col0 + vc0 are multiples
  // of 16, rows V % 128 == 0 elements apart); a caller's tensor at an odd offset takes 2-byte stores.
  const bool vn_aligned = (reinterpret_cast<uintptr_t>(v_new) & 15) == 0;
  const bool k_vec = key_rows_vectorizable(a.k), q_vec = kOutput && key_rows_vectorizable(a.q);
  // kOutput: o in T with 16-byte rows (every caller's contiguous output) goes out staged, 16 bytes per
  // lane and quarter (store_acc_rows_staged of its two 8-row tiles); else one element at a time.
  const bool o_staged = kOutput && !a.o.f32 && key_rows_vectorizable(a.o);
  const int64_t c_begin = a.seq_first_chunk[n], c_end = a.seq_first_chunk[n + 1];

  // Stage 1's row scales (ChunkedArgs::colscale) where given, for the channel-split body (few long
  // sequences): no k row norms and no barrier (C) per chunk. Run 16.4 timed it there at B1 T32768
  // 1.086 -> 0.865 ms per call, but 0.155 -> 0.170 ms in the four-warp shape at B8 T4096 K=V=64 (not
  // understood yet), so the other shapes form the norms as before; the fused output needs them for P.
  const bool pre = !kOutput && KSPLIT > 1 && a.colscale != nullptr;
  // Issues the copies of chunk ci into stage s (one cp.async group) and returns G of row tid (tid < 64);
  // with `pre`, sets cs to its colscale.
  auto prefetch = [&](const ChunkInfo& ci, int s, float& cs) {
    const int64_t row0 = chunk_row0(ci, a.T);
    intermediate_stepped_async<T, KMAX, THREADS>(w, row0, a.HV, hv, a.K, 0, ci.len, sm.w(s), LDK);
    view_rows_stepped_async<T, KMAX, THREADS>(a.k, ci, head, k_vec, sm.k(s), LDK);
    if constexpr (kOutput) view_rows_stepped_async<T, KMAX, THREADS>(a.q, ci, head, q_vec, sm.q(s), LDK);
    intermediate_stepped_async<float, BV, THREADS>(a.u, row0, a.HV, hv, a.V, col0, ci.len, sm.u(s), LDU);
    mma::cp_async_commit();
    cs = (pre && tid < ci.len) ? a.colscale[(row0 + tid) * a.HV + hv] : 0.f;
    return (a.G && tid < ci.len) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
  };

  // The chunk plan's entries are read two chunks ahead (ci_next: the one the next prefetch
  // copies), so no chunk waits on that load.
  ChunkInfo ci_cur{}, ci_next{};
  float g_next = 0.f, cs_next = 0.f;
  if (c_begin < c_end) {
    ci_cur = a.chunks[c_begin];
    g_next = prefetch(ci_cur, 0, cs_next);
    if (c_begin + 1 < c_end) ci_next = a.chunks[c_begin + 1];
  }
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int s = static_cast<int>((c - c_begin) & 1);
    const ChunkInfo ci = ci_cur;
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);

    // (A) chunk c's tiles and G (and with `pre` colscale) in place; every warp is done with chunk
    // c - 1's tiles (and with c - 2's G and colscale, the other stage's).
    float* const G_s = sm.G + s * C;
    float* const cs_s = sm.colscale + s * C;
    if (tid < C) {
      G_s[tid] = g_next;
      if (pre) cs_s[tid] = cs_next;
    }
    mma::cp_async_wait<0>();
    stage_sync<kBar, THREADS>();
    if (c + 1 < c_end) {
      g_next = prefetch(ci_next, s ^ 1, cs_next);
      ci_cur = ci_next;
      if (c + 2 < c_end) ci_next = a.chunks[c + 2];
    }

    // kOutput: this warp's tiles of q k^T (raw rows; scaled after the next barrier), dealt by
    // p_tile_deal (chunked_scaled_p.cuh: 5 tiles per scheduler, <= 3 per warp).
    float praw[3][4] = {};
    const PTileDeal pdeal = p_tile_deal(wp);
    if constexpr (kOutput) p_tiles_products<T, KMAX>(sm.q(s), sm.k(s), LDK, pdeal, lane, praw);

    // (C) per-row scales: of the state update, exp(G_{L-1} - G_j) with j <= L - 1 (<= 1 for
    // g <= 0) times k's row rstd; of the output, scale exp(G_i) rstd_qi and scale rstd_qi.
    const float G_last = G_s[L - 1];
    if (!pre) {
      constexpr int kLanes = THREADS / C;
      const float rstd = tile_row_rstd<T, KMAX, THREADS>(sm.k(s), LDK, a.l2norm);
      float rq = 1.f;
      if constexpr (kOutput) rq = tile_row_rstd<T, KMAX, THREADS>(sm.q(s), LDK, a.l2norm);
      if (tid % kLanes == 0) {
        const int j = tid / kLanes;
        cs_s[j] = j < L ? expf(G_last - G_s[j]) * rstd : 0.f;
        if constexpr (kOutput) {
          sm.rstd_k[j] = rstd;
          sm.pscale[j] = a.scale * rq;
          sm.rowscale[j] = a.scale * rq * expf(G_s[j]);
        }
      }
      stage_sync<kBar, THREADS>();
    }

    if constexpr (kOutput) {
      // scale P_ij = scale rstd_qi rstd_kj exp(G_i - G_j) (q k^T)_ij for j <= i < L (exp bounded
      // by 1), else 0; to shared memory (hi + lo unless kSingle; chunked_scaled_p.cuh).
      store_p_tiles<T, !kSingle>(praw, pdeal, sm.pscale, sm.rstd_k, G_s, L, sm.P, sm.P_lo, LDP);
      stage_sync<kBar, THREADS>();
    }

    // h_c to the intermediates (its slice's columns); not with the fused output, whose o was all
    // that needed them in the forward (the backward recomputes stage 2 unfused).
    // In T when the backward asked for 16-bit storage (a.h16; only the mma B2 reads it), else fp32.
    if constexpr (!kOutput) store_state_tiles<T, NK>(a, c, hv, col0, vc0, kc0, grp, tig, hT);

    if constexpr (kOutput) {
      // First part of o^T: (h^T q^T) * rowscale (per column i), in four quarters of 16 chunk rows,
      // parked in shared memory (this thread's own slots) until v_new^T is known: so h^T, v_new^T
      // and o^T are never all in registers at once.
#pragma unroll 1  // the quarters one after the other: unrolled, their accumulators would overlap
      for (int oh = 0; oh < 4; ++oh) {
        float o[2][4] = {}, olo[2][4] = {};  // hi and lo products apart: four independent chains
#pragma unroll
        for (int ks = 0; ks < KMAX / 16; ++ks) {
          uint32_t ah[4], al[4];
          mma::acc_to_a_split<T>(hT[2 * ks], hT[2 * ks + 1], ah, al);
          uint32_t bq[1][4];
          mma::ldmatrix_x4<false>(bq[0], sm.q(s) + (16 * oh + nb_r) * LDK + 16 * ks + nb_c);
          mma::mma_tiles<T, 1>(o, ah, bq);
          if constexpr (!kSingle) mma::mma_tiles<T, 1>(olo, al, bq);
        }
#pragma unroll
        for (int i4 = 0; i4 < 2; ++i4) {
          const float2 r = *reinterpret_cast<const float2*>(&sm.rowscale[16 * oh + 8 * i4 + 2 * tig]);
          sm.park[(2 * oh + i4) * THREADS + tid] =
              make_float4((o[i4][0] + olo[i4][0]) * r.x, (o[i4][1] + olo[i4][1]) * r.y,
                          (o[i4][2] + olo[i4][2]) * r.x, (o[i4][3] + olo[i4][3]) * r.y);
        }
      }
    }

    // v_new^T = u^T - h^T w^T: p[j8] covers chunk rows [8 j8, 8 j8 + 8).
    float p[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < KH / 16; ++ks) {
      uint32_t ah[4], al[4];
      mma::acc_to_a_split<T>(hT[2 * ks], hT[2 * ks + 1], ah, al);
      // Tiles: (rows 16 jp + [0, 8), channels 16 ks + [0, 8)), (same rows, + 8 channels),
      // (rows + 8, channels), (rows + 8, channels + 8): B fragments of chunk-row tiles 2 jp, 2 jp + 1.
      uint32_t b[4][4];
#pragma unroll
      for (int jp = 0; jp < 4; ++jp)
        mma::ldmatrix_x4<false>(b[jp], sm.w(s) + (16 * jp + nb_r) * LDK + kc0 + 16 * ks + nb_c);
      // All hi products, then all lo ones: an mma on the accumulator of the one just issued waits
      // for it, so each accumulator's two mmas are 8 mmas apart.
      mma::mma_tiles<T, 4>(p, ah, b);
      if constexpr (!kSingle) mma::mma_tiles<T, 4>(p, al, b);
    }
    // The channel parts' sums (chunked_channel_split.cuh); the next chunk's barrier (A) orders the
    // exchange slots' next writes.
    if constexpr (KSPLIT > 1) sum_channel_parts<KSPLIT, THREADS, NG, kBar>(p, sm.swap, tid);
    const float* us = sm.u(s);
#pragma unroll
    for (int j8 = 0; j8 < 8; ++j8)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 8 * j8 + tcol(e);
        p[j8][e] = us[j * LDU + vcol(e)] - p[j8][e];
      }
    // v_new (T) for rows j < L (the fused kernel: when kept). The fused kernel stages it in this
    // warp's columns of u(s) (read only by this warp, just above, and not again until the next
    // chunk's barrier (A) orders the prefetch that refills stage s): 64 rows x 32 bytes in the first
    // half of each row's 64-byte slice (LDU = 132 floats: 16-byte aligned rows).
    T* const vn_at = v_new + (row0 * a.HV + hv) * a.V + col0 + vcol(0);
    if constexpr (kOutput) {
      if (a.keep_v_new) {
        if (vn_aligned)
          store_acc_rows_staged(vn_at - grp, a.HV * a.V, L, lane, p, reinterpret_cast<T*>(sm.u(s) + vc0), 2 * LDU);
        else
          store_acc_rows(vn_at, a.HV * a.V, L, tig, p);
      }
    } else if (kc0 == 0) {
      store_acc_rows(vn_at, a.HV * a.V, L, tig, p);
    }

    if constexpr (kOutput) {
      // o^T = parked part + v_new^T (scale P)^T, by quarters; P^T's blocks (j block js, i block oh)
      // with js <= oh only (P is lower triangular). Stored for rows i < L. o_at: o's row t0 of this
      // warp's 16 value columns.
      T* const o_at = o_staged ? static_cast<T*>(a.o.p) + off4(a.o, ci.b, ci.t0, hv, col0 + vc0) : nullptr;
#pragma unroll 1
      for (int oh = 0; oh < 4; ++oh) {
        float o[2][4], olo[2][4] = {};
#pragma unroll
        for (int i4 = 0; i4 < 2; ++i4) {
          const float4 x = sm.park[(2 * oh + i4) * THREADS + tid];
          o[i4][0] = x.x;
          o[i4][1] = x.y;
          o[i4][2] = x.z;
          o[i4][3] = x.w;
        }
#pragma unroll
        for (int js = 0; js < 4; ++js) {
          if (js > oh) continue;
          uint32_t vh[4], vl[4];
          mma::acc_to_a_split<T>(p[2 * js], p[2 * js + 1], vh, vl);
          uint32_t bh[1][4], bl[1][4];
          mma::ldmatrix_x4<false>(bh[0], sm.P + (16 * oh + nb_r) * LDP + 16 * js + nb_c);
          mma::mma_tiles<T, 1>(o, vh, bh);  // hi hi
          if constexpr (!kSingle) {
            mma::ldmatrix_x4<false>(bl[0], sm.P_lo + (16 * oh + nb_r) * LDP + 16 * js + nb_c);
            mma::mma_tiles<T, 1>(olo, vl, bh);  // lo hi
            mma::mma_tiles<T, 1>(o, vh, bl);    // hi lo
          }
        }
#pragma unroll
        for (int i4 = 0; i4 < 2; ++i4)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i4][e] += olo[i4][e];
        if (o_staged) {
          // Through the second half of this warp's 64-byte slice of u(s)'s rows 0 - 15 (the kept
          // v_new's staging above uses the first half; only this warp reads those columns).
          store_acc_rows_staged(o_at + 16 * oh * a.o.s1, a.o.s1, L - 16 * oh, lane, o,
                                reinterpret_cast<T*>(sm.u(s) + vc0) + 16, 2 * LDU);
          continue;
        }
#pragma unroll
        for (int i4 = 0; i4 < 2; ++i4)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 16 * oh + 8 * i4 + tcol(e);
            if (i < L) store_elem<T>(a.o, off4(a.o, ci.b, ci.t0 + i, hv, col0 + vcol(e)), o[i4][e]);
          }
      }
    }

    // h^T = exp(G_{L-1}) h^T + (v_new^T * colscale) k.
    const float decay = expf(G_last);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hT[nk][e] *= decay;
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      const float2 s0 = *reinterpret_cast<const float2*>(&cs_s[16 * js + 2 * tig]);
      const float2 s1 = *reinterpret_cast<const float2*>(&cs_s[16 * js + 8 + 2 * tig]);
      const float f0[2] = {s0.x, s0.y}, f1[2] = {s1.x, s1.y};
      uint32_t ah[4], al[4];
      mma::acc_to_a_split<T>(p[2 * js], p[2 * js + 1], f0, f1, ah, al);
#pragma unroll
      for (int np = 0; np < NK / 2; np += 2) {
        // Tiles (.trans): (chunk rows 16 js + [0, 8), channels 16 np + [0, 8)), (rows + 8, same
        // channels), (rows, channels + 8), (rows + 8, channels + 8): B fragments of h^T tiles
        // 2 np, 2 np + 1; two such at once (hi products, then lo ones: 4 mmas apart).
        uint32_t b[2][4];
#pragma unroll
        for (int q = 0; q < 2; ++q)
          mma::ldmatrix_x4<true>(b[q], sm.k(s) + (16 * js + tb_r) * LDK + kc0 + 16 * (np + q) + tb_c);
        mma::mma_tiles<T, 2>(hT, ah, b, 2 * np);
        if constexpr (!kSingle) mma::mma_tiles<T, 2>(hT, al, b, 2 * np);
      }
    }
  }

  if (a.ht.p) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) ht[off4(a.ht, n, hv, kc0 + 8 * nk + tcol(e), col0 + vcol(e))] = hT[nk][e];
  }
}

// The stage's own kernel: the body on the whole block (barrier 0 = __syncthreads).
template <typename T, int KMAX, int WARPS, bool kOutput, int KSPLIT = 1,
          bool kSingle = kOutput && FLASHGRAD_CHUNKED_FWD_SINGLE_DEFAULT>
__global__ void __launch_bounds__(32 * WARPS, 1) chunk_state_kernel(ChunkedArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  chunk_state_body<T, KMAX, WARPS, kOutput, KSPLIT, kSingle, 0>(a, smem_raw);
}

}  // namespace flashgrad::cuda_detail::delta_rule
