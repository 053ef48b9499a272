// Chunked stage 2 ("state") on Hopper warpgroup MMA (session 16; the default at few long sequences since
// session 17 with 16 or 32 value columns per block, FLASHGRAD_CHUNKED_STATE_WGMMA=16 / 32 / 64 / 0:
// state_wgmma_cols in chunked_launch_impl.cuh). Computes what chunk_state_kernel
// (chunked_state.cuh, unfused) computes, per (sequence, value head, slice of BV value columns), over the
// sequence's chunks in order:
//   store h_c;  v_new = u - w h_c (stored in T);  h_{c+1} = exp(G_{L-1}) h_c + k^T (v_new * colscale),
//   colscale_j = exp(G_{L-1} - G_j) rstd_kj for rows j < L, 0 past them.
//
// Why: that kernel's chain runs ~2 us per chunk at B1 T32768 H16 K = V = 128 (1.06 ms for 512 chunks;
// 128 blocks of 2 warps, each warp a few dozen mma.sync per chunk between ldmatrix, fragment
// conversions and two barriers), so the few-long-sequences forward is its serial chain. Here one
// warpgroup (4 warps) does a chunk's two products as two wgmma groups read straight from shared memory:
//   (1) v_new [64 rows x BV] = w [64 x K] h [K x BV]:  m64nBVk16, K / 16 steps; A = w (K-major), B = h
//       (MN-major: the contraction K is h's row index), h written to shared memory as T once per chunk;
//   (2) h [K x BV] += k^T [K x 64] v' [64 x BV]:       m64nBVk16, 4 steps per 64 key channels; A = k^T
//       (MN-major: k's rows are the contraction), B = v' (MN-major), v' = v_new * colscale in T.
// The state h stays in the accumulators of (2) in fp32 (tile mt: key channels [64 mt, +64)); only its
// copy for (1) and v' are rounded to T, as the channel-split kernel's default single-fragment products
// (chunked_stages.h, state_products_single) round them.
//
// Shared memory (1024-byte aligned tiles, the 128-byte swizzle of wgmma_primitives.cuh: rows of 64
// elements, 16-byte chunk c of row r at chunk c ^ (r % 8)): STAGES stages of {w, k: [64 rows][K] as
// K / 64 panels of [64][64]; u: [64][BV + 4] fp32, unswizzled; G and colscale of the rows (stage 1's,
// ChunkedArgs::colscale: the launcher takes this kernel only where it is given); the chunk's first row
// and length}, Hs [K rows][64] (h as (1)'s B), Vs [64][64] (v' as (2)'s B). Copies run STAGES - 1
// chunks ahead (cp.async, rows >= L zero-filled: u = w = colscale = 0 there, so v_new = 0 and v' = 0).
// Each thread copies the same 16-byte piece of rows a multiple of 8 apart, so its addresses are set
// once and a chunk's copies cost a few instructions each. Per chunk: barrier (A) after chunk c's copies
// have landed and h_c is in Hs (and every thread is done with chunk c - 1); barrier (B) after v' is in
// Vs. (Run 16.2's first version formed k's row norms here, 1533 instructions per warp and chunk with
// the copies' address arithmetic; run 16.3's second, from each thread's own pieces, 1077; run 16.4's,
// with stage 1's row scales, 764: 0.795 ms at B1 T32768 H16 K=V=128 with 32 columns, against the
// channel-split kernel's 0.865. Session 17: 16 columns (m64n16k16, twice the blocks) 0.623 ms there
// (run 17.2); at many chains (two waves and more) the mma.sync kernels stay: the launcher's rule.)
//
// The order inside a chunk (session 18): the chunk's work that (1) does not wait for, the next chunk's
// copies and h_c's store to the intermediates, is issued after (1)'s wgmmas, and u's loads and the
// state's decay come before (1)'s wait in the source (ptxas keeps the decay, which touches (2)'s
// accumulators, behind that wait all the same: docs/perf/delta_rule.md, session 18), so that they run in
// (1)'s shadow instead of on the chain's dependent path (run 18.2 showed that path, not the warps' instruction count, sets a chunk's time; runs
// 18.3 / 18.4 timed this order against session 17's: 0.612 -> 0.58-0.59 ms at B1 T32768, outputs bitwise
// equal).
//
// Accumulator element e = 4 i + 2 r + q of an m64nN tile (warp wg, lane = 4 g + t): row 16 wg + g + 8 r,
// column 8 i + 2 t + q (wgmma_primitives.cuh).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"
#include "chunked_wgmma_primitives.cuh"
#include "chunked_wgmma_state.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int BV, int STAGES>
struct StateWgmmaSmem {
  static constexpr int C = kChunkSize, KP = KMAX / 64, LDU = BV + 4;
  static constexpr int64_t kPanel = 64 * 128;          // [64 rows][64 elements] of T
  static constexpr int64_t kKeyTile = KP * kPanel;     // w or k: [64 rows][KMAX]
  static constexpr int64_t kUBytes = sizeof(float) * C * LDU;
  // A stage: w, k, u, G and colscale of the chunk's rows [64] (fp32), then the chunk's first row and
  // length (int64 x 2, written by thread 0 with the copies).
  static constexpr int64_t kOffU = 2 * kKeyTile, kOffG = kOffU + kUBytes, kOffCs = kOffG + sizeof(float) * C,
                           kOffInfo = kOffCs + sizeof(float) * C;
  static constexpr int64_t kStageBytes = (kOffInfo + 16 + 1023) / 1024 * 1024;
  static constexpr int64_t kHsBytes = KMAX * 128, kVsBytes = 64 * 128;
  static constexpr int64_t kOffHs = STAGES * kStageBytes, kOffVs = kOffHs + kHsBytes;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes in the kernel.
  static constexpr int64_t bytes() { return 1024 + kOffVs + kVsBytes; }
};

// Byte offset of 16-byte chunk `chunk` (of 8 elements) of row r in a swizzled tile of 128-byte rows.
__device__ __forceinline__ uint32_t swizzled(int r, int chunk) {
  return static_cast<uint32_t>(r * 128 + (((chunk & 7) ^ (r & 7)) << 4));
}

// STAGES chunks of copies in the ring: the one in use and STAGES - 1 in flight (one cp.async group per
// chunk, an empty one past the sequence's end so that "chunk c landed" is always wait<STAGES - 2>).
// kIssue (session 23): how the products are issued (kWgmmaIssue, chunked_wgmma_state.cuh).
template <typename T, int KMAX, int BV, int STAGES, int kIssue = kWgmmaIssue>
__global__ void __launch_bounds__(128, 1) chunk_state_wgmma_kernel(ChunkedArgs a) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
  using S = StateWgmmaSmem<T, KMAX, BV, STAGES>;
  constexpr int C = kChunkSize, KP = S::KP, LDU = S::LDU, KC = KMAX / 8;  // KC: 16-byte chunks per key row
  static_assert(BV == 16 || BV == 32 || BV == 64, "16, 32 or 64 value columns per block");
  static_assert(S::bytes() <= 227 * 1024, "sm_90 allows 227 KiB of shared memory per block");
  static_assert(STAGES >= 2, "a chunk in use and one in flight at least");
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  // Aligned up by an offset from the shared array itself (not through an integer round trip), so that
  // the compiler keeps every access below in the shared window (LDS / STS, not generic LD / ST).
  const uint32_t smem_raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn));
  unsigned char* const smem = smem_dyn + ((1024 - (smem_raw_s & 1023)) & 1023);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * BV, HV = a.HV, V = a.V, K = a.K;
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 5, g = lane >> 2, t = lane & 3;
  const T* const w = static_cast<const T*>(a.w);
  const T* const kv = static_cast<const T*>(a.k.p);
  T* const v_new = static_cast<T*>(a.v_new);
  const bool vn_pairs = (reinterpret_cast<uintptr_t>(v_new) & 3) == 0;  // else 2-byte stores
  const int64_t c_begin = a.seq_first_chunk[n], c_end = a.seq_first_chunk[n + 1];

  // The state: tile mt = key channels [64 mt, +64) x the slice's BV columns.
  float h[KP][BV / 2];
  load_chain_state<KP, BV>(h, a.h0, n, hv, col0, wg, g, t);

  // The copies' fixed parts. Key rows (w, k): this thread copies 16-byte chunk kc of rows kr + KS i
  // (i < C KC / 128; KS = 128 / KC, a multiple of 8, so every row it copies has the same swizzle);
  // u: 16-byte piece uc of rows ur + US i (i < C BV / 512).
  constexpr int KS = 128 / KC, NK = C / KS, UC = BV / 4, US = 128 / UC, NU = C / US;
  const int kr = tid / KC, kc = tid % KC, ur = tid / UC, uc = tid % UC;
  const uint32_t key_at = static_cast<uint32_t>((kc / 8) * S::kPanel) + swizzled(kr, kc);
  const int64_t w_step = KS * HV * K, k_step = KS * a.k.s1, u_step = US * HV * V;
  auto prefetch = [&](const ChunkInfo& ci, int st) {
    unsigned char* base = smem + st * S::kStageBytes;
    const int64_t row0 = chunk_row0(ci, a.T);
    const int L = ci.len;
    const T* wsrc = w + ((row0 + kr) * HV + hv) * K + 8 * kc;
    const T* ksrc = kv + off3(a.k, ci.b, ci.t0 + kr, head) + 8 * kc;
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      const bool ok = kr + KS * i < L;
      // (rows >= L: zero-filled, their addresses computed but not read)
      mma::cp_async16(base + key_at + i * KS * 128, wsrc + i * w_step, ok);
      mma::cp_async16(base + S::kKeyTile + key_at + i * KS * 128, ksrc + i * k_step, ok);
    }
    const float* usrc = a.u + ((row0 + ur) * HV + hv) * V + col0 + 4 * uc;
    float* udst = reinterpret_cast<float*>(base + S::kOffU) + ur * LDU + 4 * uc;
#pragma unroll
    for (int i = 0; i < NU; ++i) {
      const bool ok = ur + US * i < L;
      mma::cp_async16(udst + i * US * LDU, usrc + i * u_step, ok);
    }
    if (tid < C) {
      const bool ok = a.G && tid < L;
      mma::cp_async4(reinterpret_cast<float*>(base + S::kOffG) + tid, ok ? a.G + (row0 + tid) * HV + hv : a.u, ok);
      mma::cp_async4(reinterpret_cast<float*>(base + S::kOffCs) + tid, a.colscale + (row0 + tid) * HV + hv, tid < L);
    }
    if (tid == 0) {
      int64_t* info = reinterpret_cast<int64_t*>(base + S::kOffInfo);
      info[0] = row0;
      info[1] = L;
    }
  };

  // Chunks c_begin .. c_begin + STAGES - 2 in flight before the loop; the plan's entry of the next
  // chunk to copy is read one chunk ahead (ci_ahead), so no copy waits on it.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (c_begin + s < c_end) prefetch(a.chunks[c_begin + s], s);
    mma::cp_async_commit();
  }
  ChunkInfo ci_ahead{};
  if (c_begin + STAGES - 1 < c_end) ci_ahead = a.chunks[c_begin + STAGES - 1];
  const uint32_t hs_s = smem_s + S::kOffHs, vs_s = smem_s + S::kOffVs;
  const uint64_t hs_desc = sm90::smem_desc(hs_s, S::kHsBytes, 1024), vs_desc = sm90::smem_desc(vs_s, S::kVsBytes, 1024);
  // This thread's places in Hs (rows 16 wg + g + 8 r + 64 mt, pairs of columns 8 i + 2 t) and its rows
  // of v_new (16 wg + g + 8 r).
  const uint32_t hs_at = static_cast<uint32_t>((16 * wg + g) * 128 + 4 * t);
  const int vrow = 16 * wg + g;
  const int Vi = static_cast<int>(V), row_step = static_cast<int>(HV * V);  // (K V and HV V fit in int)
  // Stage st holds chunk c; stage sn is the next to fill (chunk c + STAGES - 1).
  int st = 0, sn = STAGES - 1;
  for (int64_t c = c_begin; c < c_end; ++c, st = st + 1 == STAGES ? 0 : st + 1, sn = sn + 1 == STAGES ? 0 : sn + 1) {
    unsigned char* const base = smem + st * S::kStageBytes;
    const uint32_t w_s = smem_s + st * S::kStageBytes, k_s = w_s + S::kKeyTile;
    const float* const u_s = reinterpret_cast<const float*>(base + S::kOffU);
    const float* const G_s = reinterpret_cast<const float*>(base + S::kOffG);

    // h_c in T to Hs, and to the intermediates (fp32, or T for the backward's 16-bit mode; after (1)
    // is issued). Element offsets from this thread's first (row vrow, columns 2 t): rows 64 mt + 8 r,
    // columns 8 i.
    const int64_t h_at = (c * HV + hv) * K * V + col0 + static_cast<int64_t>(vrow) * V + 2 * t;
    stage_chain_state_tile<T, KP, BV>(h, smem + S::kOffHs, hs_at, g);
    mma::cp_async_wait<STAGES - 2>();  // chunk c's copies (this thread's) landed
    // (A) chunk c's w, k, u, G, colscale and Hs in place; every thread is done with chunk c - 1.
    sm90::fence_proxy_async_shared();
    __syncthreads();
    // The copies of chunk c + STAGES - 1 into the stage chunk c - 1 left (after (1) is issued).
    auto next_copies = [&]() {
      const int64_t cn = c + STAGES - 1;
      if (cn < c_end) {
        prefetch(ci_ahead, sn);
        if (cn + 1 < c_end) ci_ahead = a.chunks[cn + 1];
      }
      mma::cp_async_commit();
    };
    const int64_t row0 = reinterpret_cast<const int64_t*>(base + S::kOffInfo)[0];
    const int L = static_cast<int>(reinterpret_cast<const int64_t*>(base + S::kOffInfo)[1]);

    // (1) v_new's product w h_c (issue_rows_times_state, chunked_wgmma_state.cuh).
    float acc[kProductAccumulators<kIssue>][BV / 2];
    issue_rows_times_state<T, KMAX, BV, kIssue>(acc, w_s, hs_s, hs_desc, S::kHsBytes);
    {  // (in (1)'s shadow)
      next_copies();
      store_chain_state_rows<T, KP, BV>(h, a.h16, a.h, h_at, Vi);
    }
    // Meanwhile: the state update's row scales of this thread's rows (stage 1's, 0 past L) and the decay.
    const float* const cs_s = reinterpret_cast<const float*>(base + S::kOffCs);
    const float cs[2] = {cs_s[vrow], cs_s[vrow + 8]};
    const float decay = expf(G_s[L - 1]);
    // u's pairs at this thread's elements, and the state's decay (h_c is stored by now).
    float2 uu[BV / 4];
    auto load_u = [&]() {
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2)
        uu[e / 2] = *reinterpret_cast<const float2*>(u_s + (vrow + 8 * ((e >> 1) & 1)) * LDU + 8 * (e >> 2) + 2 * t);
    };
    auto decay_state = [&]() {
#pragma unroll
      for (int mt = 0; mt < KP; ++mt)
#pragma unroll
        for (int e = 0; e < BV / 2; ++e) h[mt][e] *= decay;
    };
    {  // (in (1)'s shadow)
      load_u();
      decay_state();
    }
    sm90::wgmma_wait<0>();
    finish_rows_times_state<BV>(acc);

    // v_new = u - w h_c: stored in T for rows < L; v' = v_new colscale into Vs.
    T* const vn_at = v_new + ((row0 + vrow) * HV + hv) * V + col0 + 2 * t;
    float vv[BV / 2];
#pragma unroll
    for (int e = 0; e < BV / 2; e += 2) {
      vv[e] = uu[e / 2].x - acc[0][e];
      vv[e + 1] = uu[e / 2].y - acc[0][e + 1];
    }
    if (vn_pairs) {
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2) {
        const int r = (e >> 1) & 1;
        if (vrow + 8 * r < L)
          *reinterpret_cast<uint32_t*>(vn_at + 8 * r * row_step + 8 * (e >> 2)) = mma::pack_floats<T>(vv[e], vv[e + 1]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < BV / 2; ++e) {
        const int r = (e >> 1) & 1;
        if (vrow + 8 * r < L) vn_at[8 * r * row_step + 8 * (e >> 2) + (e & 1)] = from_f<T>(vv[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < BV / 2; e += 2) {
      const int r = (e >> 1) & 1, i = e >> 2;
      *reinterpret_cast<uint32_t*>(smem + S::kOffVs + hs_at + 8 * r * 128 + (((i ^ g) & 7) << 4)) =
          mma::pack_floats<T>(vv[e] * cs[r], vv[e + 1] * cs[r]);
    }
    // (B) v' in Vs.
    sm90::fence_proxy_async_shared();
    __syncthreads();

    // (2) h += k^T v' (kIssue 2: the tiles mt inner). Tile mt, k step kk: k's panel mt, rows 16 kk; Vs's
    // rows 16 kk.
    const uint64_t k_desc = sm90::smem_desc(k_s, S::kPanel, 1024);
    sm90::wgmma_fence();
#pragma unroll
    for (int x = 0; x < KP * (C / 16); ++x) {
      const int mt = kIssue == 2 ? x % KP : x / (C / 16), kk = kIssue == 2 ? x / KP : x % (C / 16);
      const uint32_t a_off = mt * S::kPanel + kk * 16 * 128, b_off = kk * 16 * 128;
      sm90::wgmma_ss_tt<T, BV>(h[mt], operand_desc<kIssue>(k_desc, k_s, a_off, S::kPanel),
                               operand_desc<kIssue>(vs_desc, vs_s, b_off, S::kVsBytes), 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < KP; ++mt) sm90::pin_registers(h[mt]);
  }
  mma::cp_async_wait<0>();  // (empty groups only by now; nothing may be in flight at exit)

  store_chain_state<KP, BV>(h, a.ht, n, hv, col0, wg, g, t);
}

}  // namespace flashgrad::cuda_detail::delta_rule
