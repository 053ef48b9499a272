// (Since session 15 the launcher runs chunked_state_from_vnew_wide.cuh, the same recurrence with wide
// warp tiles; this "chain" kernel runs with FLASHGRAD_CHUNKED_FROM_VNEW=chain, and the wide kernel
// uses its shared-memory stages and segment cut.)
//
// The chunk-entry states h_c rebuilt from v_new (sessions 12-13): what the backward runs instead of
// stage 2's serial recomputation when the forward kept v_new (saved_v_new, chunked_path.cu), and, with
// FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1 (chunked_stages.h), after it as a check.
//
// Why: stage 2 (chunked_state.cuh) is a serial chain over a sequence's chunks because
// v_new = u - w h_c needs the state entering the chunk. Given v_new (which is beta_t r_t of the design
// doc, delta_rule.md: (I + M)(beta r) = beta (v - exp(G) k h_c) row by row), the rest of the
// recurrence,
//   h_{c+1} = exp(G_{L-1}) h_c + (k exp(G_{L-1} - G) rstd_k)^T v_new,
// has increments that do not depend on h: each chunk's product is independent and only the decayed
// sum is serial (stage 2's per chunk is h -> v_new -> h).
//
// Blocks of WV x 4 warps over 16 WV value columns of one (sequence or segment, value head): warp wp
// holds h^T for value columns vc0 = 16 (wp / 4) + [0, 16) of the block's and key channels
// kc0 = KW (wp % 4) + [0, KW), KW = K / 4, in mma accumulators (tile nk: channels kc0 + 8 nk + [0, 8)).
// Per chunk, from shared memory (cp.async, 3 stages): k's raw rows [64 x K] and v_new's rows
// [64 x 16 WV] (T);
//   inc = (v_new^T * colscale) k          A = v_new^T scaled per chunk row j (hi + lo), B = k (ldmatrix.trans)
//   h^T = exp(G_{L-1}) h^T + inc
// with colscale_j = exp(G_{L-1} - G_j) rstd_kj for j < L (0 past L), as stage 2.
//  - inc goes into fresh registers, hi and lo products in two accumulators (4 dependent mmas each), and
//    the update comes after the next chunk's colscale and this chunk's h_c store: nothing waits on the
//    products until the chunk's last instructions (run 12.4's profile of the first kernel: 22% of the
//    stalls were h_c's store waiting on an 8-deep chain into h^T);
//  - one barrier per chunk: colscale one chunk ahead (chunk c + 1's rows have landed when chunk c
//    starts) in two buffers, the next copies issued after the barrier;
//  - segments: h_{c+1} = d_c h_c + inc_c is linear, so each sequence's chunks can be split in P
//    segments. With S_p = the state segment p's recurrence reaches from zero and D_p = the product of
//    its chunks' d_c, the state entering segment p is H_p = D_{p-1} H_{p-1} + S_{p-1}, H_0 = h0. Pass 1
//    (kStore false; segments 0 .. P-2) runs each segment from zero and writes S_p and log D_p; pass 2
//    (kStore) forms H_p from them (p terms) and runs the segment again, storing every h_c (and the last
//    segment the final state). One segment: pass 2 alone, from h0. Workspace of pass 1 (fp32): S [N, P,
//    HV, K, V], then log D [N, P, HV] (the launcher puts it in u's region, dead at that point);
//  - h_c's 16-bit stores staged per warp and written as whole 32-byte row pieces
//    (store_state_tiles_staged: run 13.3's ncu put the 2-byte scattered stores at 65% of L2 throughput).
// Session 12's first version (one warp group of 16 columns, two barriers per chunk, no segments) ran
// 0.79 ms at B1 T32768 H16 K=V=128; this one 2 x 0.313 (4 segments) and 0.348 at B8 T4096
// (docs/perf/delta_rule.md, "Session 13").
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stage_store.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kFromVnewThreads = 128;  // per 16 value columns (WV of them per block)
// Elements of one warp's h_c staging tile ([32 channels][16 columns] at most).
constexpr int kFromVnewStageElems = 32 * 16;

// STAGES chunks in shared memory (the one in use, the next one, STAGES - 2 in flight): the loop's
// products are few and independent of the state, so what a chunk waits on is its copies' memory
// latency (run 12.1: ~2.1 us per chunk with one chunk ahead at B1 T32768).
template <typename T, int KMAX, int STAGES, int BV_>
struct FromVnewSmem {
  static constexpr int C = kChunkSize, BV = BV_;  // value columns per block
  // +8 elements per row: the 8 rows an ldmatrix reads start in different banks (48- and 272-byte rows).
  static constexpr int LDK = KMAX + 8, LDV = BV + 8;
  static constexpr int64_t kKBytes = sizeof(T) * C * LDK, kVBytes = sizeof(T) * C * LDV, kGBytes = sizeof(float) * C;
  static constexpr int64_t kStageBytes = kKBytes + kVBytes + kGBytes;
  static_assert(kKBytes % 16 == 0 && kVBytes % 16 == 0, "16-byte aligned tiles");
  unsigned char* raw;
  float* colscale;   // [C] exp(G_{L-1} - G_j) rstd_kj, 0 for j >= L
  float* colscale2;  // [C] the second buffer (the next chunk's colscale)
  int* len;          // [STAGES] the chunk length of each stage
  static constexpr int64_t bytes() { return STAGES * kStageBytes + 2 * sizeof(float) * C + 16 * ((STAGES + 3) / 4); }
  __device__ explicit FromVnewSmem(unsigned char* r) : raw(r) {
    colscale = reinterpret_cast<float*>(raw + STAGES * kStageBytes);
    colscale2 = colscale + C;
    len = reinterpret_cast<int*>(colscale2 + C);
  }
  // Stage s: k(s) [C][LDK] k's raw rows; v(s) [C][LDV] v_new's rows, the slice's columns; G(s) [C] the
  // cumulative gate (zeros past L).
  __device__ T* k(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* v(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kKBytes); }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(raw + s * kStageBytes + kKBytes + kVBytes); }
};

// Segment p of a sequence with chunks [first, first + count): chunks [first + count p / P,
// first + count (p + 1) / P) (empty where count < P).
__device__ __forceinline__ void segment_chunks(int64_t first, int64_t count, int p, int P, int64_t& c0,
                                               int64_t& c1) {
  c0 = first + count * p / P;
  c1 = first + count * (p + 1) / P;
}

// The pieces both rebuild kernels share (this chain kernel and chunked_state_from_vnew_wide.cuh's).
//
// Chunk ci's rows into stage s of `sm` (FromVnewSmem), one cp.async group: k's raw rows (key head
// `head`), v_new's columns [col0, col0 + BV) of value head hv, G's rows by 4-byte copies (they are HV
// apart; zeros without a gate) and the chunk length. THREADS threads of the block call it.
template <typename T, int KMAX, int THREADS, typename Smem>
__device__ __forceinline__ void from_vnew_prefetch(const ChunkedArgs& a, const ChunkInfo& ci, int64_t head, int64_t hv,
                                                   int64_t col0, bool k_vec, const Smem& sm, int s) {
  const int tid = threadIdx.x;
  const int64_t row0 = chunk_row0(ci, a.T);
  view_rows_stepped_async<T, KMAX, THREADS>(a.k, ci, head, k_vec, sm.k(s), Smem::LDK);
  intermediate_stepped_async<T, Smem::BV, THREADS>(static_cast<const T*>(a.v_new), row0, a.HV, hv, a.V, col0, ci.len,
                                                   sm.v(s), Smem::LDV);
  if (tid < kChunkSize) {
    if (a.G)
      mma::cp_async4(sm.G(s) + tid, a.G + (row0 + (tid < ci.len ? tid : 0)) * a.HV + hv, tid < ci.len);
    else
      sm.G(s)[tid] = 0.f;
  }
  if (tid == 0) sm.len[s] = ci.len;
  mma::cp_async_commit();
}

// The row scales of the chunk in stage s into out[j]: exp(offset + G_{L-1} - G_j) rstd_kj for j < L,
// 0 past L (offset 0: the chain's colscale; the wide pass 1's suffix sum). THREADS threads call it.
template <typename T, int KMAX, int THREADS, typename Smem>
__device__ __forceinline__ void from_vnew_row_scales(const Smem& sm, int s, float offset, bool l2norm, float* out) {
  constexpr int kLanes = THREADS / kChunkSize;
  const int tid = threadIdx.x, L = sm.len[s];
  const float* G = sm.G(s);
  const float rstd = tile_row_rstd<T, KMAX, THREADS>(sm.k(s), Smem::LDK, l2norm);
  if (tid % kLanes == 0) {
    const int j = tid / kLanes;
    out[j] = j < L ? expf(offset + G[L - 1] - G[j]) * rstd : 0.f;
  }
}

// The A fragment (hi, and with kSplit lo) of row block js of v_new^T scaled per chunk row: A[m][kk] =
// v[16 js + kk][vc0 + m] scale[16 js + kk] from the stage's v_new tile (ldmatrix .trans; lane l gives
// the address of row (l % 8) + 8 (l / 16), column vc0 + 8 ((l / 8) % 2) of the 16 x 16 block, va_r and
// va_c below: tiles (rows 0-7, columns 0-7) -> a0, (0-7, 8-15) -> a1, (8-15, 0-7) -> a2, (8-15, 8-15) -> a3).
template <typename T, bool kSplit>
__device__ __forceinline__ void from_vnew_scaled_a(const T* v, int ldv, int va_r, int va_c, const float* scale, int js,
                                                   int tig, uint32_t (&ah)[4], uint32_t (&al)[4]) {
  uint32_t raw4[4];
  mma::ldmatrix_x4<true>(raw4, v + (16 * js + va_r) * ldv + va_c);
  float c0[4], c1[4];
  mma::unpack_floats<T>(raw4[0], c0[0], c0[1]);
  mma::unpack_floats<T>(raw4[1], c0[2], c0[3]);
  mma::unpack_floats<T>(raw4[2], c1[0], c1[1]);
  mma::unpack_floats<T>(raw4[3], c1[2], c1[3]);
  const float2 f0 = *reinterpret_cast<const float2*>(&scale[16 * js + 2 * tig]);
  const float2 f1 = *reinterpret_cast<const float2*>(&scale[16 * js + 8 + 2 * tig]);
  const float s0[2] = {f0.x, f0.y}, s1[2] = {f1.x, f1.y};
  mma::acc_to_a<T, kSplit>(c0, c1, s0, s1, ah, al);
}

// kSingle (session 14; the default at 64 columns per block from run 14.3 to session 15, since then
// FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single, hi + lo being the default: chunked_state_from_vnew.cu
// says why): the scaled v_new^T enters the products as one T fragment (round to nearest), not hi + lo:
// half the mmas and no lo split, as the fused forward's kSingle products (chunked_state.cuh). h^T stays
// in fp32 accumulators, but each term's rounding (2^-9 relative in bf16) adds up where the states grow
// (no decay): 4.9e-3 rel RMS on a final state after 8 chunks in the host emulation, 7e-6 with hi + lo.
template <typename T, int KMAX, int STAGES, int WV, bool kStore, bool kSingle = false>
__global__ void __launch_bounds__(kFromVnewThreads * WV) chunk_state_from_vnew_seg_kernel(ChunkedArgs a, int P,
                                                                                          float* seg) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using S = FromVnewSmem<T, KMAX, STAGES, 16 * WV>;
  constexpr int C = kChunkSize, THREADS = kFromVnewThreads * WV, LDK = S::LDK, LDV = S::LDV, KW = KMAX / 4,
                NK = KW / 8, NB = NK / 2;
  static_assert(NK % 2 == 0, "whole 16-channel B fragments per warp");
  static_assert(STAGES >= 3, "chunk c + 1's rows in shared memory while chunk c is in use, one more in flight");
  S sm(smem_raw);
  // The warp's staging tile for h_c's 16-byte stores (store_state_tiles_staged), after the stages.
  T* const stage = reinterpret_cast<T*>(smem_raw + S::bytes()) + (threadIdx.x / 32) * kFromVnewStageElems;
  // Chunk c's colscale in buffer (c - c_begin) & 1 (a select, not an indexed array: that went to the stack).
  auto cs_buf = [&](int i) { return (i & 1) ? sm.colscale2 : sm.colscale; };
  const int p = static_cast<int>(blockIdx.x % P);
  const int64_t n = blockIdx.x / P, hv = blockIdx.y, head = hv / (a.HV / a.H);
  // The block's value columns [col0, col0 + 16 WV); warp wp: key channel quarter wp % 4, value
  // columns vc0 + [0, 16) of the block's (vc0 = 16 (wp / 4)).
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * S::BV;
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  const int kc0 = KW * (wp % 4), vc0 = 16 * (wp / 4);  // the warp's first key channel and value column
  // .trans B fragments inside a 16 x 16 block of k (chunked_state.cuh's tb_r, tb_c); the A fragments
  // of v_new^T by .trans loads of v_new's rows: lane l gives the address of row (l % 8) + 8 (l / 16),
  // column 8 ((l / 8) % 2) of the warp's 16 x 16 block (tiles: (rows j 0-7, columns 0-7) -> a0, (0-7,
  // 8-15) -> a1, (8-15, 0-7) -> a2, (8-15, 8-15) -> a3 of A[m][kk] = v_new[16 js + kk][m]).
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);
  const int va_r = (lane & 7) + 8 * (lane >> 4), va_c = vc0 + 8 * ((lane >> 3) & 1);
  // The warp's element e of tile nk: key channel kc0 + 8 nk + 2 tig + (e & 1), value column
  // col0 + vc0 + grp + 8 (e >> 1).
  auto kch = [&](int nk, int e) { return kc0 + 8 * nk + 2 * tig + (e & 1); };
  auto vcol = [&](int e) { return col0 + vc0 + grp + 8 * (e >> 1); };
  // Pass 1's workspace (unused with one segment, where `seg` may be null).
  const int64_t KV = a.K * a.V;
  auto seg_sum_at = [&](int q, int nk, int e) {  // S_q's element of this lane
    return seg + ((n * P + q) * a.HV + hv) * KV + kch(nk, e) * a.V + vcol(e);
  };
  auto seg_logd_at = [&](int q) { return seg + a.num_seqs * P * a.HV * KV + (n * P + q) * a.HV + hv; };

  if constexpr (!kStore) {
    if (p == P - 1) return;  // the last segment's end state is pass 2's (no one reads S_{P-1})
  }
  // The state entering the segment: zero in pass 1; H_p in pass 2.
  float hT[NK][4];
#pragma unroll
  for (int nk = 0; nk < NK; ++nk)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      hT[nk][e] = (kStore && a.h0.p) ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, kch(nk, e), vcol(e))] : 0.f;
  if constexpr (kStore) {
    for (int q = 0; q < p; ++q) {
      const float d = expf(*seg_logd_at(q));
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 4; ++e) hT[nk][e] = d * hT[nk][e] + *seg_sum_at(q, nk, e);
    }
  }

  const bool k_vec = key_rows_vectorizable(a.k);
  int64_t c_begin, c_end;
  segment_chunks(a.seq_first_chunk[n], a.seq_first_chunk[n + 1] - a.seq_first_chunk[n], p, P, c_begin, c_end);
  auto prefetch = [&](int64_t c, int s) {
    from_vnew_prefetch<T, KMAX, THREADS>(a, a.chunks[c], head, hv, col0, k_vec, sm, s);
  };
  // colscale_j = exp(G_{L-1} - G_j) rstd_kj (0 for j >= L) of the chunk in stage s, into cs.
  auto colscale = [&](int s, float* cs) { from_vnew_row_scales<T, KMAX, THREADS>(sm, s, 0.f, a.l2norm, cs); };

  // Chunks c_begin .. c_begin + STAGES - 2 in flight (empty groups where the segment has fewer, so
  // that every wait counts the same groups), then chunk c_begin's colscale.
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (c_begin + i < c_end)
      prefetch(c_begin + i, i);
    else
      mma::cp_async_commit();
  }
  if (c_begin < c_end) {
    mma::cp_async_wait<STAGES - 2>();
    __syncthreads();
    colscale(0, cs_buf(0));
  }
  float log_d = 0.f;  // pass 1: log D_p, the sum of the chunks' G_{L-1}
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int i = static_cast<int>(c - c_begin), s = i % STAGES, s1 = (i + 1) % STAGES;
    // Groups committed: chunks up to c + STAGES - 2; all but the last STAGES - 3 done = chunk c + 1
    // has landed (this thread's copies; the barrier makes everyone's visible). The barrier also
    // publishes chunk c's colscale and says every warp is done with chunk c - 1 (its stage and
    // colscale buffer are free).
    mma::cp_async_wait<STAGES - 3>();
    __syncthreads();
    if (c + STAGES - 1 < c_end)
      prefetch(c + STAGES - 1, (i + STAGES - 1) % STAGES);
    else
      mma::cp_async_commit();

    // inc = (v_new^T colscale) k over the chunk's 4 row blocks, hi and lo in separate accumulators
    // (inc_lo stays zero with kSingle).
    const float* cs = cs_buf(i);
    float inc_hi[NK][4], inc_lo[NK][4];
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) inc_hi[nk][e] = inc_lo[nk][e] = 0.f;
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t ah[4], al[4];
      from_vnew_scaled_a<T, !kSingle>(sm.v(s), LDV, va_r, va_c, cs, js, tig, ah, al);
      uint32_t b[NB][4];
#pragma unroll
      for (int q = 0; q < NB; ++q)
        mma::ldmatrix_x4<true>(b[q], sm.k(s) + (16 * js + tb_r) * LDK + kc0 + 16 * q + tb_c);
      mma::mma_tiles<T, NB>(inc_hi, ah, b);
      if constexpr (!kSingle) mma::mma_tiles<T, NB>(inc_lo, al, b);
    }
    // Chunk c + 1's colscale (its rows are in stage s1), beside the products.
    if (c + 1 < c_end) colscale(s1, cs_buf(i + 1));
    if constexpr (kStore) store_state_tiles_staged<T, NK>(a, c, hv, col0, vc0, kc0, lane, hT, stage);  // h_c
    const float g_last = sm.G(s)[sm.len[s] - 1];
    log_d += g_last;
    const float decay = expf(g_last);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hT[nk][e] = decay * hT[nk][e] + (inc_hi[nk][e] + inc_lo[nk][e]);
  }
  mma::cp_async_wait<0>();  // (only empty groups can remain; no copy outlives the block)

  if constexpr (!kStore) {
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) *seg_sum_at(p, nk, e) = hT[nk][e];
    if (blockIdx.z == 0 && tid == 0) *seg_logd_at(p) = log_d;
  } else if (a.ht.p && p == P - 1) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) ht[off4(a.ht, n, hv, kch(nk, e), vcol(e))] = hT[nk][e];
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
