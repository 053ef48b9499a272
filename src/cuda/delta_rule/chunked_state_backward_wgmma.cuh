// Chunked backward stage B1 ("state backward") on Hopper warpgroup MMA (session 17; the default local B1
// at few chains with 16 or 32 value columns per block, FLASHGRAD_CHUNKED_B1_WGMMA=16 / 32 / 0:
// state_backward_wgmma_cols in chunked_stages.h; run 17.2 at B1 T32768 H16: 1.400 -> 0.787 ms), for the local B1
// (dv_local formed ahead by chunked_dv_local.cuh, ChunkedArgs::colscale given by stage 1). Computes what
// chunk_state_backward_transposed_kernel<..., kLocal = true> computes, per (sequence, value head, slice of
// BV value columns), over the sequence's chunks in reverse. With dh = dL/dh_{c+1} (dht for the last chunk):
//   store dh (chunk c's entry of the intermediates);
//   dv_new = (k_raw dh) * colscale_j + dv_local            (rows j < L; colscale_j = exp(G_last - G_j) rstd_kj)
//   dh     = exp(G_last) dh + q_raw^T (do * rowscale_i) - w^T dv_new,   rowscale_i = scale rstd_qi exp(G_i)
// and dh0 at the end. dv_local's rows (dv_new16, written by B0) are read and overwritten with dv_new.
//
// Why: the mma.sync kernel's chain (4 warps sharing 16 value columns in channel quarters) runs ~2.7 us
// per chunk at B1 T32768 H16 K = V = 128 (1.385 ms, run 16.4): the same shape of work as stage 2's chain,
// which chunked_state_wgmma.cuh runs on wgmma at 1.55 us per chunk (0.795 ms). One warpgroup holds dh
// [K x BV] in wgmma accumulators (tile mt: key channels [64 mt, +64)) and does a chunk as two groups:
//   (1) dv_new [64 x BV] = k [64 x K] dh [K x BV]: m64nBVk16 x K / 16; A = k (K-major, as stored), B = dh
//       (MN-major, written to shared memory in T once per chunk: Hs);
//   (2) dh [K x BV] += q^T [K x 64] do' [64 x BV] + w^T [K x 64] (-dv_new) [64 x BV]: m64nBVk16 x 8 per
//       64 key channels; A = q^T, w^T (MN-major: their rows are the contraction), B = do' (Ds) and
//       -dv_new (Vs), both MN-major, written by the threads in T.
// Rounding as the mma.sync kernel's single-fragment default: dh, do * rowscale and dv_new enter their
// products rounded to T once; dh stays fp32 in the accumulators.
//
// Shared memory (1024-byte aligned tiles, 128-byte swizzle: rows of 64 elements, 16-byte chunk c of row r
// at chunk c ^ (r % 8), as chunked_state_wgmma.cuh): STAGES stages of {k, q, w: [64 rows][K] as K / 64
// panels of [64][64]; do and dv_local: the slice's [64][BV + 8] T, unswizzled; G and colscale of the rows
// [64] fp32, rowscale [64] fp32; the chunk's first row and length}, then Hs [K][64], Ds [64][64], Vs [64][64]. Copies run
// STAGES - 1 chunks ahead (cp.async, rows >= L zero-filled: do = dv_local = colscale = 0 there, so dv_new
// = 0 and the products see zero rows). Per chunk: barrier (A) after chunk c's copies have landed and dh
// is in Hs (every thread done with chunk c + 1); barrier (B) after do' and -dv_new are in Ds / Vs.
// rowscale_i comes from B0 (ChunkedArgs::rowscale), which forms q's row norms anyway: run 17.1's first
// version formed them here from the swizzled q tile, and with the L2 norm in the kernel was slower than
// the mma.sync kernel at B1 T32768 (1.562 vs 1.408 ms; ncu 970 instructions per warp and chunk).
//
// The order inside a chunk (session 18, as chunked_state_wgmma.cuh's): the next chunk's copies and dh's
// store to the intermediates are issued after (1)'s wgmmas, dv_local's loads and dh's decay come before
// (1)'s wait in the source (ptxas keeps the decay behind the wait: it touches (2)'s accumulators) (runs 18.3 / 18.4: 0.783 -> 0.735 ms at B1 T32768, 0.578 -> 0.530 at B2 T16384, outputs
// bitwise equal; the gain came with dv_local's loads moved).
//
// Accumulator element e = 4 i + 2 r + q of an m64nN tile (warp wg, lane = 4 g + t): row 16 wg + g + 8 r,
// column 8 i + 2 t + q (wgmma_primitives.cuh).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_state_wgmma.cuh"  // swizzled()
#include "chunked_tiles.cuh"
#include "chunked_wgmma_primitives.cuh"
#include "chunked_wgmma_state.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int BV, int STAGES>
struct StateBackwardWgmmaSmem {
  static constexpr int C = kChunkSize, KP = KMAX / 64, LDD = BV + 8;
  static constexpr int64_t kPanel = 64 * 128;       // [64 rows][64 elements] of T
  static constexpr int64_t kKeyTile = KP * kPanel;  // k, q or w: [64 rows][KMAX]
  static constexpr int64_t kSliceBytes = sizeof(T) * C * LDD;
  // A stage: k, q, w, do, dv_local, G, colscale and rowscale of the chunk's rows [64] (fp32), then the
  // chunk's first row and length (int64 x 2, written by thread 0 with the copies).
  static constexpr int64_t kOffQ = kKeyTile, kOffW = 2 * kKeyTile, kOffDo = 3 * kKeyTile, kOffDl = kOffDo + kSliceBytes,
                           kOffG = kOffDl + kSliceBytes, kOffCs = kOffG + sizeof(float) * C,
                           kOffRs = kOffCs + sizeof(float) * C, kOffInfo = kOffRs + sizeof(float) * C;
  static constexpr int64_t kStageBytes = (kOffInfo + 16 + 1023) / 1024 * 1024;
  static constexpr int64_t kHsBytes = KMAX * 128, kTileBytes = 64 * 128;
  static constexpr int64_t kOffHs = STAGES * kStageBytes, kOffDs = kOffHs + kHsBytes, kOffVs = kOffDs + kTileBytes;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes in the kernel.
  static constexpr int64_t bytes() { return 1024 + kOffVs + kTileBytes; }
};

// kIssue (session 23): how the products are issued (kWgmmaIssue, chunked_wgmma_state.cuh).
template <typename T, int KMAX, int BV, int STAGES, int kIssue = kWgmmaIssue>
__global__ void __launch_bounds__(128, 1) chunk_state_backward_wgmma_kernel(ChunkedArgs a) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
  using S = StateBackwardWgmmaSmem<T, KMAX, BV, STAGES>;
  constexpr int C = kChunkSize, KP = S::KP, LDD = S::LDD, KC = KMAX / 8;  // KC: 16-byte chunks per key row
  static_assert(BV == 16 || BV == 32, "16 or 32 value columns per block (64 would not fit three stages at K = 128)");
  static_assert(S::bytes() <= 227 * 1024, "sm_90 allows 227 KiB of shared memory per block");
  static_assert(STAGES >= 2, "a chunk in use and one in flight at least");
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  // Aligned up by an offset from the shared array itself (as chunked_state_wgmma.cuh: LDS / STS stay).
  const uint32_t smem_raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn));
  unsigned char* const smem = smem_dyn + ((1024 - (smem_raw_s & 1023)) & 1023);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * BV, HV = a.HV, V = a.V, K = a.K;
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 5, g = lane >> 2, t = lane & 3;
  const T* const w = static_cast<const T*>(a.w);
  T* const dv_new = static_cast<T*>(a.dv_new16);
  const int64_t c_first = a.seq_first_chunk[n], c_last = a.seq_first_chunk[n + 1] - 1;

  // dL/dh: tile mt = key channels [64 mt, +64) x the slice's BV columns.
  float dh[KP][BV / 2];
  load_chain_state<KP, BV>(dh, a.dht, n, hv, col0, wg, g, t);

  // The copies' fixed parts. Key rows (k, q, w): this thread copies 16-byte chunk kc of rows kr + KS i
  // (i < C KC / 128; KS = 128 / KC, a multiple of 8, so every row it copies has the same swizzle); the
  // slice's rows (do, dv_local): 16-byte piece sc of rows sr + SS i (i < C BV / 1024).
  constexpr int KS = 128 / KC, NK = C / KS, SC = BV / 8, SS = 128 / SC, NS = C / SS;
  const int kr = tid / KC, kc = tid % KC, sr = tid / SC, sc = tid % SC;
  const uint32_t key_at = static_cast<uint32_t>((kc / 8) * S::kPanel) + swizzled(kr, kc);
  const int64_t w_step = KS * HV * K, k_step = KS * a.k.s1, q_step = KS * a.q.s1, d_step = SS * a.dout.s1,
                dl_step = SS * HV * V;
  const T* const dsrc0 = static_cast<const T*>(a.dout.p) + col0 + 8 * sc;
  auto prefetch = [&](const ChunkInfo& ci, int st) {
    unsigned char* base = smem + st * S::kStageBytes;
    const int64_t row0 = chunk_row0(ci, a.T);
    const int L = ci.len;
    const T* wsrc = w + ((row0 + kr) * HV + hv) * K + 8 * kc;
    const T* ksrc = static_cast<const T*>(a.k.p) + off3(a.k, ci.b, ci.t0 + kr, head) + 8 * kc;
    const T* qsrc = static_cast<const T*>(a.q.p) + off3(a.q, ci.b, ci.t0 + kr, head) + 8 * kc;
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      const bool ok = kr + KS * i < L;
      // (rows >= L: zero-filled, their addresses computed but not read)
      mma::cp_async16(base + key_at + i * KS * 128, ksrc + i * k_step, ok);
      mma::cp_async16(base + S::kOffQ + key_at + i * KS * 128, qsrc + i * q_step, ok);
      mma::cp_async16(base + S::kOffW + key_at + i * KS * 128, wsrc + i * w_step, ok);
    }
    const T* dsrc = dsrc0 + off3(a.dout, ci.b, ci.t0 + sr, hv);
    const T* lsrc = dv_new + ((row0 + sr) * HV + hv) * V + col0 + 8 * sc;
    T* ddst = reinterpret_cast<T*>(base + S::kOffDo) + sr * LDD + 8 * sc;
    T* ldst = reinterpret_cast<T*>(base + S::kOffDl) + sr * LDD + 8 * sc;
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const bool ok = sr + SS * i < L;
      mma::cp_async16(ddst + i * SS * LDD, dsrc + i * d_step, ok);
      mma::cp_async16(ldst + i * SS * LDD, lsrc + i * dl_step, ok);
    }
    if (tid < C) {
      const bool ok = a.G && tid < L;
      mma::cp_async4(reinterpret_cast<float*>(base + S::kOffG) + tid, ok ? a.G + (row0 + tid) * HV + hv : a.colscale,
                     ok);
      mma::cp_async4(reinterpret_cast<float*>(base + S::kOffCs) + tid, a.colscale + (row0 + tid) * HV + hv, tid < L);
      mma::cp_async4(reinterpret_cast<float*>(base + S::kOffRs) + tid, a.rowscale + (row0 + tid) * HV + hv, tid < L);
    }
    if (tid == 0) {
      int64_t* info = reinterpret_cast<int64_t*>(base + S::kOffInfo);
      info[0] = row0;
      info[1] = L;
    }
  };

  // Chunks c_last, c_last - 1, ... c_last - STAGES + 2 in flight before the loop; the plan's entry of the
  // next chunk to copy is read one chunk ahead (ci_ahead), so no copy waits on it.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (c_last - s >= c_first) prefetch(a.chunks[c_last - s], s);
    mma::cp_async_commit();
  }
  ChunkInfo ci_ahead{};
  if (c_last - (STAGES - 1) >= c_first) ci_ahead = a.chunks[c_last - (STAGES - 1)];
  const uint32_t hs_s = smem_s + S::kOffHs, ds_s = smem_s + S::kOffDs, vs_s = smem_s + S::kOffVs;
  const uint64_t hs_desc = sm90::smem_desc(hs_s, S::kHsBytes, 1024), ds_desc = sm90::smem_desc(ds_s, S::kTileBytes, 1024),
                 vs_desc = sm90::smem_desc(vs_s, S::kTileBytes, 1024);
  // This thread's places in Hs / Ds / Vs (rows 16 wg + g + 8 r (+ 64 mt), pairs of columns 8 i + 2 t) and
  // its chunk rows (vrow, vrow + 8).
  const uint32_t hs_at = static_cast<uint32_t>((16 * wg + g) * 128 + 4 * t);
  const int vrow = 16 * wg + g;
  const int Vi = static_cast<int>(V), row_step = static_cast<int>(HV * V);  // (K V and HV V fit in int)
  // Stage st holds chunk c; stage sn is the next to fill (chunk c - STAGES + 1).
  int st = 0, sn = STAGES - 1;
  for (int64_t c = c_last; c >= c_first; --c, st = st + 1 == STAGES ? 0 : st + 1, sn = sn + 1 == STAGES ? 0 : sn + 1) {
    unsigned char* const base = smem + st * S::kStageBytes;
    const uint32_t k_s = smem_s + st * S::kStageBytes, q_s = k_s + S::kOffQ, w_s = k_s + S::kOffW;
    const float* const G_s = reinterpret_cast<const float*>(base + S::kOffG);

    // dL/dh_{c+1}: to the intermediates (fp32, or T with the backward's 16-bit storage) and, in T, to Hs.
    // Element offsets from this thread's first (key channel vrow, columns 2 t): channels 64 mt + 8 r,
    // columns 8 i.
    // (to the intermediates after (1) is issued)
    const int64_t h_at = (c * HV + hv) * K * V + col0 + static_cast<int64_t>(vrow) * V + 2 * t;
    stage_chain_state_tile<T, KP, BV>(dh, smem + S::kOffHs, hs_at, g);
    mma::cp_async_wait<STAGES - 2>();  // chunk c's copies (this thread's) landed
    // (A) chunk c's tiles, G, colscale and Hs in place; every thread is done with chunk c + 1.
    sm90::fence_proxy_async_shared();
    __syncthreads();
    // The copies of chunk c - STAGES + 1 into the stage chunk c + 1 left (after (1) is issued).
    auto next_copies = [&]() {
      const int64_t cn = c - (STAGES - 1);
      if (cn >= c_first) {
        prefetch(ci_ahead, sn);
        if (cn - 1 >= c_first) ci_ahead = a.chunks[cn - 1];
      }
      mma::cp_async_commit();
    };
    const int64_t row0 = reinterpret_cast<const int64_t*>(base + S::kOffInfo)[0];
    const int L = static_cast<int>(reinterpret_cast<const int64_t*>(base + S::kOffInfo)[1]);

    // (1) k dh (issue_rows_times_state, chunked_wgmma_state.cuh).
    float acc[kProductAccumulators<kIssue>][BV / 2];
    issue_rows_times_state<T, KMAX, BV, kIssue>(acc, k_s, hs_s, hs_desc, S::kHsBytes);
    {  // (in (1)'s shadow)
      next_copies();
      store_chain_state_rows<T, KP, BV>(dh, a.dh16, a.dh, h_at, Vi);
    }

    // Meanwhile: do' = do * rowscale (B0's, 0 past L) into Ds, and the decay.
    const float* const rs_s = reinterpret_cast<const float*>(base + S::kOffRs);
    const float rs[2] = {rs_s[vrow], rs_s[vrow + 8]};
    {
      const T* const do_s = reinterpret_cast<const T*>(base + S::kOffDo);
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2) {
        const int r = (e >> 1) & 1, i = e >> 2;
        float x0, x1;
        mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(do_s + (vrow + 8 * r) * LDD + 8 * i + 2 * t), x0, x1);
        *reinterpret_cast<uint32_t*>(smem + S::kOffDs + hs_at + 8 * r * 128 + (((i ^ g) & 7) << 4)) =
            mma::pack_floats<T>(x0 * rs[r], x1 * rs[r]);
      }
    }
    const float* const cs_s = reinterpret_cast<const float*>(base + S::kOffCs);
    const float cs[2] = {cs_s[vrow], cs_s[vrow + 8]};
    const float decay = expf(G_s[L - 1]);
    // dv_local's pairs at this thread's elements, and dh's decay (dh is stored by now).
    const T* const dl_s = reinterpret_cast<const T*>(base + S::kOffDl);
    uint32_t dl[BV / 4];
    auto load_dl = [&]() {
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2)
        dl[e / 2] = *reinterpret_cast<const uint32_t*>(dl_s + (vrow + 8 * ((e >> 1) & 1)) * LDD + 8 * (e >> 2) + 2 * t);
    };
    auto decay_state = [&]() {
#pragma unroll
      for (int mt = 0; mt < KP; ++mt)
#pragma unroll
        for (int e = 0; e < BV / 2; ++e) dh[mt][e] *= decay;
    };
    {  // (in (1)'s shadow)
      load_dl();
      decay_state();
    }
    sm90::wgmma_wait<0>();
    finish_rows_times_state<BV>(acc);

    // dv_new = acc colscale + dv_local: stored in T for rows < L (over dv_local's elements); -dv_new into Vs.
    T* const dvn_at = dv_new + ((row0 + vrow) * HV + hv) * V + col0 + 2 * t;
#pragma unroll
    for (int e = 0; e < BV / 2; e += 2) {
      const int r = (e >> 1) & 1, i = e >> 2;
      float l0, l1;
      mma::unpack_floats<T>(dl[e / 2], l0, l1);
      const float d0 = acc[0][e] * cs[r] + l0, d1 = acc[0][e + 1] * cs[r] + l1;
      if (vrow + 8 * r < L)
        *reinterpret_cast<uint32_t*>(dvn_at + 8 * r * row_step + 8 * i) = mma::pack_floats<T>(d0, d1);
      *reinterpret_cast<uint32_t*>(smem + S::kOffVs + hs_at + 8 * r * 128 + (((i ^ g) & 7) << 4)) =
          mma::pack_floats<T>(-d0, -d1);
    }
    // (B) do' in Ds, -dv_new in Vs.
    sm90::fence_proxy_async_shared();
    __syncthreads();

    // (2) dh += q^T do' + w^T (-dv_new) (kIssue 2: the tiles mt inner). Step x < 8 of tile mt: q's k steps
    // 0 - 3 (q's panel mt, rows 16 kk; Ds's rows 16 kk), then w's (w's panel mt; Vs).
    const uint64_t q_desc = sm90::smem_desc(q_s, S::kPanel, 1024), w_desc = sm90::smem_desc(w_s, S::kPanel, 1024);
    sm90::wgmma_fence();
#pragma unroll
    for (int y = 0; y < KP * 2 * (C / 16); ++y) {
      const int mt = kIssue == 2 ? y % KP : y / (2 * (C / 16)), x = kIssue == 2 ? y / KP : y % (2 * (C / 16));
      const int kk = x % (C / 16);
      const bool from_q = x < C / 16;
      const uint32_t a_off = mt * S::kPanel + kk * 16 * 128, b_off = kk * 16 * 128;
      const uint64_t ad = operand_desc<kIssue>(from_q ? q_desc : w_desc, from_q ? q_s : w_s, a_off, S::kPanel);
      const uint64_t bd = operand_desc<kIssue>(from_q ? ds_desc : vs_desc, from_q ? ds_s : vs_s, b_off, S::kTileBytes);
      sm90::wgmma_ss_tt<T, BV>(dh[mt], ad, bd, 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < KP; ++mt) sm90::pin_registers(dh[mt]);
  }
  mma::cp_async_wait<0>();  // (empty groups only by now; nothing may be in flight at exit)

  store_chain_state<KP, BV>(dh, a.dh0, n, hv, col0, wg, g, t);
}

}  // namespace flashgrad::cuda_detail::delta_rule
