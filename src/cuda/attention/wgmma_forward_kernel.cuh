// Softmax attention forward for Hopper: wgmma tensor cores fed by TMA, warp-specialized.
//
// One tile = 128 query rows of one (sequence, query head); a CTA of 3 warpgroups (128 threads each)
// runs one tile, or several (see the tile list below):
//   warpgroup 0, the producer: one thread issues TMA loads: the Q tile once, then K and V tiles of
//     the key blocks the mask does not rule out, into a ring of kStages (2-4) slots each, gated by
//     "empty" mbarriers the consumers release and completing on "full" mbarriers (byte counts);
//   warpgroups 1 and 2, the consumers: each owns 64 query rows. Per key block: S = Q K^T by
//     wgmma m64nBNk16 from shared memory (kBlockN = 128 keys; 64 at D = 256), the mask / softcap on tiles that
//     need it, online softmax in registers (running max and sum in log2 units, as the mma.sync
//     kernel), P rounded to 16 bits in registers as the A operand of O += P V (wgmma with A in
//     registers, V read MN-major through the descriptor), O in fp32 registers.
// The producer gives registers back (setmaxnreg) so each consumer thread can hold S (BN / 2
// floats), O (D / 2 floats) and P (BN / 4 words).
//
// Intra-warpgroup overlap: S(j+1) = Q K(j+1)^T and O += P(j) V(j) are issued together; the
// softmax of block j+1 runs on the CUDA cores while P(j) V(j) is still on the tensor cores.
//
// Key blocks are visited in increasing order, with the same tile classification (skip / full /
// partial) and per-element rule (MaskView::query_keys) as the mma.sync kernel, at the CTA's
// 128-row granularity. Rows past the sequence in a tile (TMA reads the next sequence's tokens in
// varlen, zeros past the tensor end) are masked for keys and never written for queries.
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "wgmma_primitives.cuh"

namespace flashgrad::cuda_attn {

// Which tensor-map axis (1 or 2) holds the rows; the other one holds the heads. The host orders
// them by increasing stride (TMA wants it), so a [B, H, S, D]-strided view swaps them.
struct WgmmaMapAxes {
  int q_rows_inner = 1, k_rows_inner = 1, v_rows_inner = 1;
};

template <int D>
struct WgmmaForwardConfig {
  static constexpr int kBlockM = 128;  // two consumer warpgroups of 64 rows
  // Keys per block: 128, or 64 at D = 256, where O alone takes 128 fp32 registers per thread.
  static constexpr int kBlockN = D == 256 ? 64 : 128;
  // K / V ring depth: as deep as 227 KB of shared memory allows (one CTA per SM either way), so
  // the producer runs further ahead of the consumers: 4 at D = 64 (144 KB), 3 at D = 128
  // (225 KB), 2 at D = 256 (192 KB).
  static constexpr int kStages = D == 64 ? 4 : D == 128 ? 3 : 2;
  static constexpr int kPanels = D / 64;  // 128-byte column panels per tile row
  static constexpr int kThreads = 384;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  static constexpr int kPanelBytesQ = kBlockM * 128;
  static constexpr int kPanelBytesKV = kBlockN * 128;
  // Q, K ring, V ring, then the mbarriers; +1024 to align the base to the swizzle atom.
  static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKVBytes;
  // mbarriers: Q full / empty, K and V full / empty per slot, tile-index full / empty x 2; then the
  // two tile-index slots (dynamic scheduling).
  static constexpr int kTileSlotOffset = kBarrierOffset + 8 * (2 + 4 * kStages + 4);
  static constexpr int kSmemBytes = kTileSlotOffset + 2 * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 / H200 block may have");
  static constexpr int kConsumerRegs = 232;
  static constexpr int kProducerRegs = 40;
};

// TMA coordinates of (column d0, row, head, batch) for a map whose rows sit on axis 1 or 2.
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int rows_inner,
                                         int d0, int row, int head, int batch) {
  if (rows_inner)
    sm90::tma_load_4d(dst, map, bar, d0, row, head, batch);
  else
    sm90::tma_load_4d(dst, map, bar, d0, head, row, batch);
}

// How a key block's scores are prepared: the full-tile short path (raw S, scale folded into the
// exponent), masked (scale, then -inf outside the per-row key range), or masked and softcapped.
// Three paths so that the common diagonal tile does not carry the softcap code (tanh, divisions:
// ~80 instructions per element) through the instruction cache.
enum WgmmaScoreMode : int { kScoresFull = 0, kScoresMasked = 1, kScoresSoftcap = 2 };

// S (scaled, masked, softcapped as the mode says) -> P = exp2(S - max), online-softmax update of
// this thread's two rows (g and g + 8 of its warp's 16); `rescale` receives the factor O must be
// multiplied by (done by the caller once the previous P V has left the tensor cores). On the short
// path (full tile, no softcap, positive scale) S is raw and the scale folds into the exponent, as
// in the mma.sync kernel.
template <int kMode, int BN>
__device__ __forceinline__ void wgmma_softmax_block(float (&s)[BN / 2], float (&row_max)[2], float (&row_sum)[2],
                                                    float (&rescale)[2], const AttentionKernelParams& p,
                                                    const MaskView& mask, int row0, int n0, int t) {
  constexpr bool kGeneral = kMode != kScoresFull;
  const float scale_log2 = p.scale * kLog2e;
  if constexpr (kGeneral) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int lo, hi, diag;
      mask.query_keys(row0 + 8 * r, lo, hi, diag);
      lo -= n0 + 2 * t;  // keys relative to this thread's first column
      hi -= n0 + 2 * t;
      diag -= n0 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float x = s[4 * nt + 2 * r + c];
          if constexpr (kMode == kScoresSoftcap) {
            float unused;
            x = apply_softcap(p.softcap_method, p.softcap, x * p.scale, unused) * kLog2e;
          } else {
            x *= scale_log2;
          }
          const int jr = nt * 8 + c;
          if (!((jr >= lo && jr < hi) || jr == diag)) x = -INFINITY;
          s[4 * nt + 2 * r + c] = x;
        }
      }
    }
  }
  const float mul = kGeneral ? 1.f : scale_log2;
  // Max and sum over a row's BN / 4 elements in this thread as 4 interleaved partial chains: with
  // only two consumer warps per scheduler, one dependent chain of BN / 8 steps would stall on
  // latency.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
      part[nt % 4] = fmaxf(part[nt % 4], fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
    float mx = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
    mx = fmaxf(quad_max(mx) * mul, row_max[r]);
    // A row with nothing allowed yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
    const float base = mx == -INFINITY ? 0.f : mx;
    rescale[r] = fast_exp2(row_max[r] - base);
    row_max[r] = mx;
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[4 * nt + 2 * r] = fast_exp2(s[4 * nt + 2 * r] * mul - base);
      s[4 * nt + 2 * r + 1] = fast_exp2(s[4 * nt + 2 * r + 1] * mul - base);
      sum[nt % 4] += s[4 * nt + 2 * r] + s[4 * nt + 2 * r + 1];
    }
    row_sum[r] = row_sum[r] * rescale[r] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
  }
}

// One query tile of the CTA's work list: which (sequence, row block, head), and what the mask says.
struct WgmmaTile {
  int seq, m0, h, hk;
  SequenceView sv;
  MaskView mask;
  int num_nb;
  bool live;  // m0 < len_q (varlen row blocks past a short sequence do nothing)
};

// Tile t of the flattened grid: t = head * (num_seqs * num_m_blocks) + seq * num_m_blocks + r,
// row block mb = num_m_blocks - 1 - r (heaviest first under a causal mask). Consecutive tiles share
// the head, so the CTAs running at one time read the same K / V out of L2.
template <int BM, int BN>
__device__ __forceinline__ WgmmaTile wgmma_tile(const AttentionKernelParams& p, int num_m_blocks, int64_t t) {
  WgmmaTile w;
  const int64_t per_head = static_cast<int64_t>(p.num_seqs) * num_m_blocks;
  w.h = static_cast<int>(t / per_head);
  const int64_t x = t % per_head;
  w.seq = static_cast<int>(x / num_m_blocks);
  w.m0 = (num_m_blocks - 1 - static_cast<int>(x % num_m_blocks)) * BM;
  w.hk = w.h / (p.heads_q / p.heads_k);
  w.sv = sequence_view(p, w.seq);
  w.live = w.m0 < w.sv.len_q;
  w.mask = mask_view(p, w.sv, w.seq);
  w.num_nb = (w.sv.len_k + BN - 1) / BN;
  return w;
}

// Without a tile counter each CTA runs tile blockIdx.x (the grid covers all tiles). With one (a
// persistent grid of about one CTA per SM), the CTA starts at tile blockIdx.x and then takes
// gridDim.x + atomicAdd(counter, 1) until past the end: dynamic scheduling, so causal tiles of
// unequal length balance across SMs. The producer thread draws the next index once it has issued
// the current tile's loads and hands it to the consumers through a 2-slot shared-memory ring
// (tile full / empty mbarriers). Producer and consumers then make the same decisions per tile
// (live, key blocks) and count K / V blocks and Q loads across tiles, so the rings' slots and
// mbarrier phases continue from one tile to the next: the producer loads the next tile's Q as soon
// as both consumer warpgroups have issued their last Q K^T ("q empty"), and its first K / V while
// they finish P V and the epilogue.
//
// kPingpong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and 2),
// so one's softmax runs while the other's products occupy the tensor cores (FA3's inter-warpgroup
// schedule). Each warpgroup waits for its turn (bar.sync on its own barrier: its 128 threads plus
// the other's 128 arrivals) before issuing, and hands the turn over (bar.arrive on the other's)
// after. Per tile, warpgroup 1 goes first: warpgroup 2 arrives on barrier 1 once at the tile's
// start and skips its hand-over at its last issue point, so every barrier generation completes.
template <typename T, int D, bool kPingpong>
__global__ void __launch_bounds__(384, 1)
    attention_forward_wgmma_kernel(const __grid_constant__ CUtensorMap map_q,
                                   const __grid_constant__ CUtensorMap map_k,
                                   const __grid_constant__ CUtensorMap map_v,
                                   const AttentionKernelParams p, const WgmmaMapAxes axes,
                                   int num_m_blocks, int64_t num_tiles, int* tile_counter) {
  using Cfg = WgmmaForwardConfig<D>;
  using Ops = ElementOps<T>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, ST = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem0 = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = smem0;
  const uint32_t sK = sQ + Cfg::kQBytes;  // slot s at sK + s * kKVBytes
  const uint32_t sV = sK + ST * Cfg::kKVBytes;
  const uint32_t bar_q_full = smem0 + Cfg::kBarrierOffset;  // 8 bytes per mbarrier
  const uint32_t bar_q_empty = bar_q_full + 8;
  const uint32_t bar_k_full = bar_q_empty + 8, bar_v_full = bar_k_full + 8 * ST;
  const uint32_t bar_k_empty = bar_v_full + 8 * ST, bar_v_empty = bar_k_empty + 8 * ST;
  const uint32_t bar_tile_full = bar_v_empty + 8 * ST, bar_tile_empty = bar_tile_full + 16;  // x 2 each
  int64_t* tile_slots = reinterpret_cast<int64_t*>(smem_raw + (smem0 - smem_address(smem_raw)) +
                                                   Cfg::kTileSlotOffset);

  const int tid = threadIdx.x;
  if (tid == 0) {
    sm90::mbar_init(bar_q_full, 1);
    sm90::mbar_init(bar_q_empty, 8);  // one arrival per consumer warp
    for (int s = 0; s < 2; ++s) {
      sm90::mbar_init(bar_tile_full + 8 * s, 1);
      sm90::mbar_init(bar_tile_empty + 8 * s, 8);
    }
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      sm90::mbar_init(bar_k_full + 8 * s, 1);
      sm90::mbar_init(bar_v_full + 8 * s, 1);
      sm90::mbar_init(bar_k_empty + 8 * s, 8);
      sm90::mbar_init(bar_v_empty + 8 * s, 8);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  const int warpgroup = tid / 128;
  if (warpgroup == 0) {
    // ---- producer ----
    sm90::regs_decrease<Cfg::kProducerRegs>();
    if (tid != 0) return;
    sm90::tma_prefetch_map(&map_q);
    sm90::tma_prefetch_map(&map_k);
    sm90::tma_prefetch_map(&map_v);
    int it = 0;      // K / V blocks loaded so far (ring position)
    int q_loads = 0;  // Q tiles loaded so far
    int64_t t = blockIdx.x;
    for (int k = 0;; ++k) {
      if (k > 0) t = tile_counter != nullptr ? atomicAdd(tile_counter, 1) + int64_t{gridDim.x} : num_tiles;
      if (tile_counter != nullptr) {  // hand the tile index to the consumers (2-slot ring)
        sm90::mbar_wait(bar_tile_empty + 8 * (k & 1), ((k >> 1) & 1) ^ 1);
        tile_slots[k & 1] = t;
        sm90::mbar_arrive(bar_tile_full + 8 * (k & 1));  // release: the store above is visible
      }
      if (t >= num_tiles) break;
      const WgmmaTile w = wgmma_tile<BM, BN>(p, num_m_blocks, t);
      if (!w.live) continue;
      int cls = kTileEmpty;
      int nb = next_key_block<BN>(w.mask, 0, w.num_nb, w.m0, w.m0 + BM, cls);
      // With no key block to visit the consumers write zeros without waiting for anything, so
      // nothing is loaded (no copy may still be landing when the CTA exits).
      if (nb < 0) continue;
      const int qb = static_cast<int>(w.sv.q_batch), kb = static_cast<int>(w.sv.k_batch);
      const int q_row = static_cast<int>(w.sv.q_row0) + w.m0, k_row0 = static_cast<int>(w.sv.k_row0);
      sm90::mbar_wait(bar_q_empty, (q_loads & 1) ^ 1);
      sm90::mbar_arrive_expect_tx(bar_q_full, Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c)
        tma_tile(sQ + c * Cfg::kPanelBytesQ, &map_q, bar_q_full, axes.q_rows_inner, 64 * c, q_row, w.h, qb);
      ++q_loads;
      for (; nb >= 0; nb = next_key_block<BN>(w.mask, nb + 1, w.num_nb, w.m0, w.m0 + BM, cls), ++it) {
        const int slot = it % ST;
        const uint32_t phase = (it / ST) & 1;
        const int row = k_row0 + nb * BN;
        sm90::mbar_wait(bar_k_empty + 8 * slot, phase ^ 1);
        sm90::mbar_arrive_expect_tx(bar_k_full + 8 * slot, Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_tile(sK + slot * Cfg::kKVBytes + c * Cfg::kPanelBytesKV, &map_k, bar_k_full + 8 * slot,
                   axes.k_rows_inner, 64 * c, row, w.hk, kb);
        sm90::mbar_wait(bar_v_empty + 8 * slot, phase ^ 1);
        sm90::mbar_arrive_expect_tx(bar_v_full + 8 * slot, Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c)
          tma_tile(sV + slot * Cfg::kKVBytes + c * Cfg::kPanelBytesKV, &map_v, bar_v_full + 8 * slot,
                   axes.v_rows_inner, 64 * c, row, w.hk, kb);
      }
    }
    return;
  }

  // ---- consumers ----
  sm90::regs_increase<Cfg::kConsumerRegs>();
  const int cw = warpgroup - 1;  // 64-row half of the tile
  const int lane = tid & 31, warp_in_wg = (tid / 32) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int row_in_block = cw * 64 + warp_in_wg * 16 + g;  // this thread's first row; second is +8
  auto wait_turn = [&] {
    if constexpr (kPingpong) sm90::named_barrier_sync(1 + cw, 256);
  };
  auto pass_turn = [&](bool last) {
    if constexpr (kPingpong)
      if (!(last && cw == 1)) sm90::named_barrier_arrive(2 - cw, 256);
  };
  // P as 16-bit A fragments: 16 keys = two 8-column accumulator chunks.
  auto pack_p = [](const float (&sc)[BN / 2], uint32_t (&a)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      a[kk][0] = Ops::pack(sc[8 * kk + 0], sc[8 * kk + 1]);
      a[kk][1] = Ops::pack(sc[8 * kk + 2], sc[8 * kk + 3]);
      a[kk][2] = Ops::pack(sc[8 * kk + 4], sc[8 * kk + 5]);
      a[kk][3] = Ops::pack(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };
  auto pin_words = [](uint32_t (&a)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[kk][i])::"memory");
  };
  const bool short_path_ok = p.softcap_method == kSoftcapOff && p.scale > 0.f;

  int it = 0;       // K / V blocks consumed so far (ring position), as the producer counts them
  int q_loads = 0;  // Q tiles consumed so far
  for (int k = 0;; ++k) {
    int64_t tile = k == 0 ? int64_t{blockIdx.x} : num_tiles;
    if (tile_counter != nullptr) {  // the producer's pick
      sm90::mbar_wait(bar_tile_full + 8 * (k & 1), (k >> 1) & 1);
      tile = *reinterpret_cast<volatile int64_t*>(&tile_slots[k & 1]);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(bar_tile_empty + 8 * (k & 1));
    }
    if (tile >= num_tiles) break;
    const WgmmaTile w = wgmma_tile<BM, BN>(p, num_m_blocks, tile);
    if (!w.live) continue;
    const int m0 = w.m0;

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    // S = Q K^T of one slot, issued (not waited for).
    auto issue_qk = [&](float (&s)[BN / 2], int slot) {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t a = sQ + (kk / 4) * Cfg::kPanelBytesQ + cw * 64 * 128 + (kk % 4) * 32;
        const uint32_t b = sK + slot * Cfg::kKVBytes + (kk / 4) * Cfg::kPanelBytesKV + (kk % 4) * 32;
        sm90::wgmma_ss<T, BN>(s, sm90::smem_desc(a, 16, 1024), sm90::smem_desc(b, 16, 1024), kk > 0);
      }
      sm90::wgmma_commit();
    };
    auto softmax = [&](float (&sc)[BN / 2], float (&rescale)[2], int tile_cls, int block) {
      const int row0 = m0 + row_in_block, n0 = block * BN;
      if (tile_cls == kTileFull && short_path_ok)
        wgmma_softmax_block<kScoresFull, BN>(sc, row_max, row_sum, rescale, p, w.mask, row0, n0, t4);
      else if (p.softcap_method == kSoftcapOff)
        wgmma_softmax_block<kScoresMasked, BN>(sc, row_max, row_sum, rescale, p, w.mask, row0, n0, t4);
      else
        wgmma_softmax_block<kScoresSoftcap, BN>(sc, row_max, row_sum, rescale, p, w.mask, row0, n0, t4);
    };

    // Pipeline per key block j (P(j) already in registers):
    //   issue S(j+1) = Q K(j+1)^T; issue O += P(j) V(j);
    //   wait for S(j+1) (wgmma groups complete in issue order), softmax(j+1) on the CUDA cores while
    //   P(j) V(j) runs; wait for it, then rescale O by block j+1's max and pack P(j+1).
    int cls = kTileEmpty;
    int nb = next_key_block<BN>(w.mask, 0, w.num_nb, m0, m0 + BM, cls);
    float s[BN / 2];
    uint32_t pa[BN / 16][4];
    // O += P(j) V(j) of one slot, issued (not waited for); V(slot) has landed.
    auto issue_pv = [&](int slot) {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint32_t b = sV + slot * Cfg::kKVBytes + kk * 16 * 128;
        sm90::wgmma_rs<T, D>(o, pa[kk], sm90::smem_desc(b, Cfg::kPanelBytesKV, 1024), 1);
      }
      sm90::wgmma_commit();
    };
    if (nb >= 0) {
      sm90::mbar_wait(bar_q_full, q_loads & 1);
      sm90::mbar_wait(bar_k_full + 8 * (it % ST), (it / ST) & 1);
      if constexpr (kPingpong)
        if (cw == 1) sm90::named_barrier_arrive(1, 256);  // warpgroup 1 issues first
      wait_turn();
      issue_qk(s, it % ST);
      pass_turn(false);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(s);
      if (lane == 0) sm90::mbar_arrive(bar_k_empty + 8 * (it % ST));  // this warp is done with K
      float rescale[2];
      softmax(s, rescale, cls, nb);  // O is still zero: no rescale needed
      pack_p(s, pa);

      int next_cls = kTileEmpty;
      int next = next_key_block<BN>(w.mask, nb + 1, w.num_nb, m0, m0 + BM, next_cls);
      while (next >= 0) {  // steady state: block `it` has a successor
        const int slot = it % ST, nslot = (it + 1) % ST;
        sm90::mbar_wait(bar_k_full + 8 * nslot, ((it + 1) / ST) & 1);
        sm90::mbar_wait(bar_v_full + 8 * slot, (it / ST) & 1);
        wait_turn();
        issue_qk(s, nslot);
        issue_pv(slot);
        pass_turn(false);
        sm90::wgmma_wait<1>();  // S(j+1) done; P(j) V(j) may still run
        sm90::pin_registers(s);
        if (lane == 0) sm90::mbar_arrive(bar_k_empty + 8 * nslot);
        softmax(s, rescale, next_cls, next);
        sm90::wgmma_wait<0>();
        sm90::pin_registers(o);
        pin_words(pa);  // the tensor cores read P from these registers until now
        if (lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[4 * dt + 0] *= rescale[0];
          o[4 * dt + 1] *= rescale[0];
          o[4 * dt + 2] *= rescale[1];
          o[4 * dt + 3] *= rescale[1];
        }
        pack_p(s, pa);
        nb = next;
        next = next_key_block<BN>(w.mask, nb + 1, w.num_nb, m0, m0 + BM, next_cls);
        ++it;
      }
      // Every Q K^T of this tile is done: the producer may load the next tile's Q.
      if (lane == 0) sm90::mbar_arrive(bar_q_empty);
      ++q_loads;
      // The last block's P V.
      const int slot = it % ST;
      sm90::mbar_wait(bar_v_full + 8 * slot, (it / ST) & 1);
      wait_turn();
      issue_pv(slot);
      pass_turn(true);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(o);
      pin_words(pa);
      if (lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
      ++it;
    }

    // Epilogue: O / l, lse = (m + log2 l) ln 2; a row with l = 0 (nothing allowed) gives 0 and -inf.
    T* out = static_cast<T*>(p.out) + row_offset(p.out_st, w.sv.q_batch, w.sv.q_row0, m0, w.h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[r]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int i = row_in_block + 8 * r;
      if (m0 + i >= w.sv.len_q) continue;
      T* orow = out + static_cast<int64_t>(i) * p.out_st.row;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const uint32_t packed = Ops::pack(o[4 * dt + 2 * r] * inv, o[4 * dt + 2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t4) = packed;
      }
      if (p.lse != nullptr && t4 == 0) {
        const float lse = l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
        p.lse[w.sv.q_batch * p.lse_batch_stride + static_cast<int64_t>(w.h) * p.lse_head_stride +
              (w.sv.q_row0 + m0 + i) * p.lse_row_stride] = lse;
      }
    }
  }
}

}  // namespace flashgrad::cuda_attn
