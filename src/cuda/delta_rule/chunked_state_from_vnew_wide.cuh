// The chunk-entry states rebuilt from v_new with wide warp tiles (session 15): both passes of
// chunk_state_from_vnew_seg_kernel (chunked_state_from_vnew.cuh; the "chain" kernel) with each warp
// holding 16 value columns x all K key channels of h^T instead of 16 x K / 4, and pass 1 without a
// chunk-to-chunk recurrence.
//
// Why: the chain kernel spends ~550 instructions per warp and chunk on 16 mmas (16 warps per 64 value
// columns; run 13.3's ncu: 42% issue, the copies, the column scales, the staged stores and the loop
// around a small product), and runs ~0.28 ms per pass at B1 T32768 H16 K=V=128 and 0.31 ms at B8
// T4096 whatever the occupancy. Here a warp issues 64 mmas per chunk (K = 128) around about the same
// per-chunk overhead, and k's rows are copied once per 128 value columns (8 warps) where V allows.
// Runs 15.1 - 15.4 (docs/perf/delta_rule.md, "Session 15"): 0.216 ms at B8 T4096 (pass 2, hi + lo),
// 0.141 + 0.212 ms at B1 T32768 (pass 1 + pass 2).
//
// The recurrence (chunked_state_from_vnew.cuh): h_{c+1} = exp(G_{c,L-1}) h_c + (v_new_c^T colscale_c) k_c,
// colscale_cj = exp(G_{c,L-1} - G_cj) rstd_cj (0 past the chunk's length L).
//
// Pass 1 (kStore = false): the state S each sub-segment of chunks [c0, c1) reaches from zero, and
// log D = sum_c G_{c,L-1}. From zero the recurrence unrolls to
//   S = sum_c exp(suffix_c) (v_new_c^T colscale_c) k_c,   suffix_c = sum_{c < c' < c1} G_{c',L-1} (<= 0),
// one product over all the sub-segment's rows with the row scale exp(suffix_c + G_{c,L-1} - G_cj) rstd_cj
// (<= rstd: the log decays are <= 0), so the warps walk the chunks last to first with suffix a running
// sum and nothing carried from chunk to chunk but the accumulators.
// Sub-segments: pass 2's P segments (segment_chunks with P parts) are each cut in R sub-segments
// (segment_chunks with P R parts: part p R starts where segment p does, count p R / (P R) = count p / P),
// so that pass 1 has enough blocks to fill the SMs. Workspace (fp32): S [N, P R, HV, K, V], then log D
// [N, P R, HV] (the chain kernel's pass 1 writes the same with R = 1). The last segment's sub-segments
// are never read (its end state is pass 2's), so their blocks return at once.
//
// Pass 2 (kStore): segment p starts from H_p, folded from the sub-segment sums before it
// (H = exp(log D_q) H + S_q, q < p R, from h0), and walks its chunks first to last: store h_c (16-bit
// through the warp's staging tile, store_state_tiles_staged; fp32 directly), h *= exp(G_{c,L-1}),
// h += (v_new_c^T colscale_c) k_c; the last segment writes the final state.
//
// Blocks of WARPS warps over 16 WARPS value columns of one (sequence, (sub-)segment, value head): warp
// wp holds h^T (or S^T) for value columns col0 + 16 wp + [0, 16) and every key channel in mma
// accumulators (tile nk: channels 8 nk + [0, 8)). Per chunk, from shared memory (cp.async, STAGES
// chunks: the one in use, the next, STAGES - 2 in flight; FromVnewSmem's layout): k's raw rows
// [64 x K], v_new's rows [64 x 16 WARPS] (T) and G's rows. The products: A = v_new^T scaled per chunk
// row j, B = k (ldmatrix.trans); A with kSplit (the launcher's default) as hi + lo, T(x) and T(x - hi):
// twice the mmas, the scaled v_new kept to ~16 bits instead of rounded to T; else one 16-bit fragment
// (its rounding adds up where the states grow: chunked_state_from_vnew.cu). The row
// scales one chunk ahead in two buffers, so one barrier per chunk.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stage_store.cuh"
#include "chunked_state_from_vnew.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Shared memory: the chain kernel's stages (FromVnewSmem) at 16 WARPS value columns, then (pass 2
// with 16-bit states) each warp's staging tile of h_c ([K][16] T). STAGES: the launcher's 3 (one chunk
// in flight while one is in use and the next has landed; run 15.2 timed 4 and 5 in pass 2: no faster).
template <typename T, int KMAX, int STAGES, int WARPS>
struct FromVnewWideSmem {
  using Stages = FromVnewSmem<T, KMAX, STAGES, 16 * WARPS>;
  static constexpr int64_t kStageTileElems = KMAX * 16;
  static constexpr int64_t bytes(bool store) {
    return Stages::bytes() + (store ? static_cast<int64_t>(sizeof(T)) * kStageTileElems * WARPS : 0);
  }
};

// Pass 1: grid (N P R, HV, V / (16 WARPS)), blockIdx.x = n P R + q (sub-segment q). Pass 2: grid
// (N P, HV, V / (16 WARPS)), blockIdx.x = n P + p. seg: the workspace above (null with P = 1). The
// two passes are the kernels chunk_from_vnew_sums_kernel and chunk_state_from_vnew_wide_kernel below
// (two names, so that profiles tell them apart).
// kIncFirst (pass 2 at 8 warps with hi + lo, the launcher's default since run 15.4;
// FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_INC=0 turns it off): each chunk's products go into fresh
// accumulators first, then h_c is stored and h = exp(G_{L-1}) h + inc, so the store's shared round trip
// (stmatrix, LDS, then STG waiting on it) runs beside the products instead of ahead of them (64 more
// registers at K = 128; run 15.4: 0.225 -> 0.216 ms at B8). Without it the store comes first and the
// products accumulate into h.
template <typename T, int KMAX, int STAGES, int WARPS, bool kStore, bool kSplit, bool kIncFirst = false>
__device__ __forceinline__ void state_from_vnew_wide(const ChunkedArgs& a, int P, int R, float* seg) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using S = typename FromVnewWideSmem<T, KMAX, STAGES, WARPS>::Stages;
  constexpr int C = kChunkSize, THREADS = 32 * WARPS, LDK = S::LDK, LDV = S::LDV, NK = KMAX / 8, NB = NK / 2;
  static_assert(STAGES >= 3, "chunk i + 1's rows in shared memory while chunk i is in use, one more in flight");
  static_assert(NB % 2 == 0, "B fragments in two halves of the key channels");
  const int64_t PR = static_cast<int64_t>(P) * R;
  const int parts = kStore ? P : static_cast<int>(PR);  // (sub-)segments per sequence in this pass
  const int part = static_cast<int>(blockIdx.x % parts);
  if (!kStore && part >= (P - 1) * R) return;  // the last segment's: nobody reads them
  S sm(smem_raw);
  auto rs_buf = [&](int i) { return (i & 1) ? sm.colscale2 : sm.colscale; };
  const int64_t n = blockIdx.x / parts, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * S::BV;
  const int tid = threadIdx.x, lane = tid & 31, grp = lane >> 2, tig = lane & 3, wp = tid / 32;
  const int vc0 = 16 * wp;  // the warp's first value column in the block's
  // ldmatrix lane addresses as the chain kernel's (B: .trans 16 x 16 blocks of k; A: .trans loads of
  // v_new's rows, A[m][kk] = v_new[16 js + kk][vc0 + m]).
  const int tb_r = 8 * ((lane >> 3) & 1) + (lane & 7), tb_c = 8 * (lane >> 4);
  const int va_r = (lane & 7) + 8 * (lane >> 4), va_c = vc0 + 8 * ((lane >> 3) & 1);
  // The warp's element e of tile nk: key channel 8 nk + 2 tig + (e & 1), value column
  // col0 + vc0 + grp + 8 (e >> 1).
  auto kch = [&](int nk, int e) { return 8 * nk + 2 * tig + (e & 1); };
  auto vcol = [&](int e) { return col0 + vc0 + grp + 8 * (e >> 1); };
  const int64_t KV = a.K * a.V;
  auto seg_sum = [&](int q) { return seg + ((n * PR + q) * a.HV + hv) * KV; };        // S_q
  auto seg_logd = [&](int q) { return seg + a.num_seqs * PR * a.HV * KV + (n * PR + q) * a.HV + hv; };

  // The state entering the part: zero in pass 1; H_p in pass 2.
  float h[NK][4];
#pragma unroll
  for (int nk = 0; nk < NK; ++nk)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      h[nk][e] = (kStore && a.h0.p) ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, kch(nk, e), vcol(e))] : 0.f;
  if constexpr (kStore) {
    for (int q = 0; q < part * R; ++q) {
      const float d = expf(*seg_logd(q));
      const float* sq = seg_sum(q);
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[nk][e] = d * h[nk][e] + sq[kch(nk, e) * a.V + vcol(e)];
    }
  }

  const bool k_vec = key_rows_vectorizable(a.k);
  int64_t c_begin, c_end;
  segment_chunks(a.seq_first_chunk[n], a.seq_first_chunk[n + 1] - a.seq_first_chunk[n], part, parts, c_begin, c_end);
  const int count = static_cast<int>(c_end - c_begin);
  // Iteration i's chunk: first to last in pass 2, last to first in pass 1.
  auto chunk_of = [&](int i) { return kStore ? c_begin + i : c_end - 1 - i; };
  // Chunk i's rows into stage s; `ci` = a.chunks[chunk_of(i)], read one iteration earlier (below), so
  // that the copies' addresses do not wait on a global load after the barrier.
  auto prefetch = [&](const ChunkInfo& ci, int s) {
    from_vnew_prefetch<T, KMAX, THREADS>(a, ci, head, hv, col0, k_vec, sm, s);
  };
  // rs_j = exp(suffix + G_{L-1} - G_j) rstd_kj (0 for j >= L) of the chunk in stage s, into rs
  // (suffix: 0 in pass 2; pass 1: the sum of G_{L-1} over the sub-segment's later chunks).
  auto rowscale = [&](int s, float suffix, float* rs) {
    from_vnew_row_scales<T, KMAX, THREADS>(sm, s, suffix, a.l2norm, rs);
  };

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < count)
      prefetch(a.chunks[chunk_of(i)], i);
    else
      mma::cp_async_commit();
  }
  // The chunk the loop's first prefetch copies (iteration i copies chunk i + STAGES - 1).
  ChunkInfo next_ci{};
  if (STAGES - 1 < count) next_ci = a.chunks[chunk_of(STAGES - 1)];
  if (count > 0) {
    mma::cp_async_wait<STAGES - 2>();
    __syncthreads();
    rowscale(0, 0.f, rs_buf(0));
  }
  // Pass 2: the warp's staging tile for h_c's 16-bit stores, after the stages.
  T* const stage = reinterpret_cast<T*>(smem_raw + S::bytes()) +
                   static_cast<int64_t>(wp) * FromVnewWideSmem<T, KMAX, STAGES, WARPS>::kStageTileElems;
  float suffix = 0.f;  // pass 1: the sum of G_{L-1} over the chunks done so far (the later ones)
  for (int i = 0; i < count; ++i) {
    const int s = i % STAGES, s1 = (i + 1) % STAGES;
    // Groups committed: iterations up to i + STAGES - 2; all but the last STAGES - 3 done = chunk
    // i + 1 has landed. The barrier publishes chunk i's row scales and says every warp is done with
    // chunk i - 1 (its stage and row-scale buffer are free).
    mma::cp_async_wait<STAGES - 3>();
    __syncthreads();
    if (i + STAGES - 1 < count)
      prefetch(next_ci, (i + STAGES - 1) % STAGES);
    else
      mma::cp_async_commit();
    if (i + STAGES < count) next_ci = a.chunks[chunk_of(i + STAGES)];  // used next iteration

    const float g_last = sm.G(s)[sm.len[s] - 1];
    if constexpr (kStore && !kIncFirst) {
      store_state_tiles_staged<T, NK>(a, chunk_of(i), hv, col0, vc0, 0, lane, h, stage);  // h_c
      const float decay = expf(g_last);
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[nk][e] *= decay;
    }
    // The products' accumulators: h itself, or with kIncFirst the chunk's increment.
    float inc[NK][4];
    if constexpr (kIncFirst) {
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 4; ++e) inc[nk][e] = 0.f;
    }
    float(&acc)[NK][4] = kIncFirst ? inc : h;
    const float* rs = rs_buf(i);
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t ah[4], al[4];  // (al: kSplit only)
      from_vnew_scaled_a<T, kSplit>(sm.v(s), LDV, va_r, va_c, rs, js, tig, ah, al);
      // B in two halves of the key channels (NB / 2 ldmatrix each): fewer live registers.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t b[NB / 2][4];
#pragma unroll
        for (int qb = 0; qb < NB / 2; ++qb)
          mma::ldmatrix_x4<true>(b[qb], sm.k(s) + (16 * js + tb_r) * LDK + 16 * (half * NB / 2 + qb) + tb_c);
        mma::mma_tiles<T, NB / 2>(acc, ah, b, half * NB);
        if constexpr (kSplit) mma::mma_tiles<T, NB / 2>(acc, al, b, half * NB);
      }
    }
    if constexpr (kStore && kIncFirst) {
      store_state_tiles_staged<T, NK>(a, chunk_of(i), hv, col0, vc0, 0, lane, h, stage);  // h_c
      const float decay = expf(g_last);
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[nk][e] = decay * h[nk][e] + inc[nk][e];
    }
    if constexpr (!kStore) suffix += g_last;
    // Chunk i + 1's row scales (its rows are in stage s1), after this chunk's products were issued.
    if (i + 1 < count) rowscale(s1, suffix, rs_buf(i + 1));
  }
  mma::cp_async_wait<0>();  // (only empty groups can remain; no copy outlives the block)

  if constexpr (!kStore) {
    float* const sum = seg_sum(part);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[kch(nk, e) * a.V + vcol(e)] = h[nk][e];
    if (blockIdx.z == 0 && tid == 0) *seg_logd(part) = suffix;
  } else if (a.ht.p && part == P - 1) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) ht[off4(a.ht, n, hv, kch(nk, e), vcol(e))] = h[nk][e];
  }
}

// Pass 1: the sub-segment sums.
template <typename T, int KMAX, int STAGES, int WARPS, bool kSplit>
__global__ void __launch_bounds__(32 * WARPS) chunk_from_vnew_sums_kernel(ChunkedArgs a, int P, int R, float* seg) {
  state_from_vnew_wide<T, KMAX, STAGES, WARPS, false, kSplit>(a, P, R, seg);
}
// Pass 2: the states h_c (and the final state).
template <typename T, int KMAX, int STAGES, int WARPS, bool kSplit, bool kIncFirst = false>
__global__ void __launch_bounds__(32 * WARPS) chunk_state_from_vnew_wide_kernel(ChunkedArgs a, int P, int R, float* seg) {
  state_from_vnew_wide<T, KMAX, STAGES, WARPS, true, kSplit, kIncFirst>(a, P, R, seg);
}

}  // namespace flashgrad::cuda_detail::delta_rule
