// The chunk-entry states h_c rebuilt from v_new (an experiment of session 12, opt-in:
// FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1, chunked_stages.h).
//
// Why: stage 2 (chunked_state.cuh) is a serial chain over a sequence's chunks because
// v_new = u - w h_c needs the state entering the chunk. Given v_new (which is beta_t r_t of the design
// doc, delta_rule.md: (I + M)(beta r) = beta (v - exp(G) k h_c) row by row), the rest of the
// recurrence,
//   h_{c+1} = exp(G_{L-1}) h_c + (k exp(G_{L-1} - G) rstd_k)^T v_new,
// has increments that do not depend on h: each chunk's product is independent and only the decayed
// sum is serial, so a block's loop carries no product chain (stage 2's per chunk is h -> v_new -> h).
// A forward that kept v_new would let the backward skip stage 2's recomputation for this kernel
// (docs/perf/delta_rule.md, "Session 12 (lead)"); here, first, the kernel itself: where the switch
// is on, the backward runs it after stage 2 and B1 / B2 read the states it wrote.
//
// One block of 4 warps per (sequence, value head, 16 value columns); warp wp holds h^T (16 value
// columns x the key channels [KW wp, KW wp + KW), KW = K / 4) in mma accumulators, as stage 2's
// warps do (tile nk: channels KW wp + 8 nk + [0, 8)). Per chunk, from shared memory (cp.async,
// STAGES - 1 chunks ahead): k's raw rows [64 x K] and v_new's rows [64 x 16] (T);
//   h^T = exp(G_{L-1}) h^T + (v_new^T * colscale) k        A = v_new^T scaled per chunk row j (hi + lo),
//                                                         B = k (ldmatrix.trans of its rows),
// with colscale_j = exp(G_{L-1} - G_j) rstd_kj for j < L (0 past L), as stage 2.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stage_store.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kFromVnewThreads = 128;

// STAGES chunks in flight (cp.async, STAGES - 1 ahead of the one in use): the loop's products are
// few and independent of the state, so what a chunk waits on is its copies' memory latency (run
// 12.1: ~2.1 us per chunk with one chunk ahead at B1 T32768, against ~0.5 us of instructions).
template <typename T, int KMAX, int STAGES>
struct FromVnewSmem {
  static constexpr int C = kChunkSize, BV = 16;
  // +8 elements per row: the 8 rows an ldmatrix reads start in different banks (48- and 272-byte rows).
  static constexpr int LDK = KMAX + 8, LDV = BV + 8;
  static constexpr int64_t kKBytes = sizeof(T) * C * LDK, kVBytes = sizeof(T) * C * LDV, kGBytes = sizeof(float) * C;
  static constexpr int64_t kStageBytes = kKBytes + kVBytes + kGBytes;
  static_assert(kKBytes % 16 == 0 && kVBytes % 16 == 0, "16-byte aligned tiles");
  unsigned char* raw;
  float* colscale;  // [C] exp(G_{L-1} - G_j) rstd_kj, 0 for j >= L
  int* len;         // [STAGES] the chunk length of each stage
  static constexpr int64_t bytes() { return STAGES * kStageBytes + sizeof(float) * C + 16 * ((STAGES + 3) / 4); }
  __device__ explicit FromVnewSmem(unsigned char* r) : raw(r) {
    colscale = reinterpret_cast<float*>(raw + STAGES * kStageBytes);
    len = reinterpret_cast<int*>(colscale + C);
  }
  // Stage s: k(s) [C][LDK] k's raw rows; v(s) [C][LDV] v_new's rows, the slice's columns; G(s) [C] the
  // cumulative gate (zeros past L).
  __device__ T* k(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* v(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kKBytes); }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(raw + s * kStageBytes + kKBytes + kVBytes); }
};

template <typename T, int KMAX, int STAGES>
__global__ void __launch_bounds__(kFromVnewThreads) chunk_state_from_vnew_kernel(ChunkedArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using S = FromVnewSmem<T, KMAX, STAGES>;
  constexpr int C = kChunkSize, THREADS = kFromVnewThreads, LDK = S::LDK, LDV = S::LDV, KW = KMAX / 4, NK = KW / 8,
                NB = NK / 2;
  static_assert(NK % 2 == 0, "whole 16-channel B fragments per warp");
  static_assert(STAGES >= 2, "at least one chunk ahead");
  S sm(smem_raw);
  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * S::BV;
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  const int kc0 = KW * wp;  // the warp's first key channel
  // .trans B fragments inside a 16 x 16 block (chunked_state.cuh's tb_r, tb_c); the A fragments of
  // v_new^T by .trans loads of v_new's rows: lane l gives the address of row (l % 8) + 8 (l / 16),
  // column 8 ((l / 8) % 2) of the 16 x 16 block (tiles: (rows j 0-7, columns 0-7) -> a0, (0-7, 8-15)
  // -> a1, (8-15, 0-7) -> a2, (8-15, 8-15) -> a3 of A[m][kk] = v_new[16 js + kk][m]).
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);
  const int va_r = (lane & 7) + 8 * (lane >> 4), va_c = 8 * ((lane >> 3) & 1);

  float hT[NK][4];
#pragma unroll
  for (int nk = 0; nk < NK; ++nk)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      hT[nk][e] = a.h0.p ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, kc0 + 8 * nk + 2 * tig + (e & 1),
                                                                   col0 + grp + 8 * (e >> 1))]
                         : 0.f;

  const T* v_new = static_cast<const T*>(a.v_new);
  const bool k_vec = key_rows_vectorizable(a.k);
  const int64_t c_begin = a.seq_first_chunk[n], c_end = a.seq_first_chunk[n + 1];
  // Chunk ci's copies into stage s, one cp.async group (G's rows by 4-byte copies: they are HV apart).
  auto prefetch = [&](const ChunkInfo& ci, int s) {
    const int64_t row0 = chunk_row0(ci, a.T);
    view_rows_stepped_async<T, KMAX, THREADS>(a.k, ci, head, k_vec, sm.k(s), LDK);
    intermediate_stepped_async<T, S::BV, THREADS>(v_new, row0, a.HV, hv, a.V, col0, ci.len, sm.v(s), LDV);
    if (tid < C) {
      if (a.G)
        mma::cp_async4(sm.G(s) + tid, a.G + (row0 + (tid < ci.len ? tid : 0)) * a.HV + hv, tid < ci.len);
      else
        sm.G(s)[tid] = 0.f;
    }
    if (tid == 0) sm.len[s] = ci.len;
    mma::cp_async_commit();
  };

  // Chunks c_begin .. c_begin + STAGES - 2 in flight before the loop (an empty group where the
  // sequence has fewer, so that every iteration's wait counts the same groups); ci_next: the chunk
  // the loop's next prefetch copies.
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (c_begin + i < c_end)
      prefetch(a.chunks[c_begin + i], i);
    else
      mma::cp_async_commit();
  }
  ChunkInfo ci_next{};
  if (c_begin + STAGES - 1 < c_end) ci_next = a.chunks[c_begin + STAGES - 1];
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int s = static_cast<int>((c - c_begin) % STAGES);
    // (A) chunk c's group has landed (the STAGES - 2 issued after it may still fly); every warp is
    // done with chunk c - 1, whose stage the prefetch below refills with chunk c + STAGES - 1.
    mma::cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (c + STAGES - 1 < c_end) {
      prefetch(ci_next, static_cast<int>((c + STAGES - 1 - c_begin) % STAGES));
      if (c + STAGES < c_end) ci_next = a.chunks[c + STAGES];
    } else {
      mma::cp_async_commit();
    }
    // (C) colscale from k's raw rows (their L2 norm with it) and G.
    const int L = sm.len[s];
    const float* G = sm.G(s);
    const float G_last = G[L - 1];
    {
      constexpr int kLanes = THREADS / C;
      const float rstd = tile_row_rstd<T, KMAX, THREADS>(sm.k(s), LDK, a.l2norm);
      if (tid % kLanes == 0) {
        const int j = tid / kLanes;
        sm.colscale[j] = j < L ? expf(G_last - G[j]) * rstd : 0.f;
      }
    }
    __syncthreads();

    store_state_tiles<T, NK>(a, c, hv, col0, 0, kc0, grp, tig, hT);  // h_c, before this chunk's update

    const float decay = expf(G_last);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hT[nk][e] *= decay;
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t raw4[4];
      mma::ldmatrix_x4<true>(raw4, sm.v(s) + (16 * js + va_r) * LDV + va_c);
      float c0[4], c1[4];  // v_new^T as two 16 x 8 accumulator-layout tiles (chunk rows 16 js + [0, 8), + 8)
      mma::unpack_floats<T>(raw4[0], c0[0], c0[1]);
      mma::unpack_floats<T>(raw4[1], c0[2], c0[3]);
      mma::unpack_floats<T>(raw4[2], c1[0], c1[1]);
      mma::unpack_floats<T>(raw4[3], c1[2], c1[3]);
      const float2 s0 = *reinterpret_cast<const float2*>(&sm.colscale[16 * js + 2 * tig]);
      const float2 s1 = *reinterpret_cast<const float2*>(&sm.colscale[16 * js + 8 + 2 * tig]);
      const float f0[2] = {s0.x, s0.y}, f1[2] = {s1.x, s1.y};
      uint32_t ah[4], al[4];
      mma::acc_to_a_split<T>(c0, c1, f0, f1, ah, al);
      uint32_t b[NB][4];
#pragma unroll
      for (int q = 0; q < NB; ++q)
        mma::ldmatrix_x4<true>(b[q], sm.k(s) + (16 * js + tb_r) * LDK + kc0 + 16 * q + tb_c);
      mma::mma_tiles<T, NB>(hT, ah, b);  // hi products, then lo ones (NB mmas apart)
      mma::mma_tiles<T, NB>(hT, al, b);
    }
  }
  mma::cp_async_wait<0>();  // (only empty groups can remain; no copy outlives the block)

  if (a.ht.p) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        ht[off4(a.ht, n, hv, kc0 + 8 * nk + 2 * tig + (e & 1), col0 + grp + 8 * (e >> 1))] = hT[nk][e];
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
