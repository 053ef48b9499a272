// Softmax attention backward for Hopper: wgmma tensor cores fed by TMA, warp-specialized.
//
// One CTA = one block of kBlockN = 128 keys (64 at D = 256) of one (sequence, kv head); it walks the
// (query head of the group, query block of kBlockM = 64, or 128 at D = 64) tiles the mask does not
// rule out (QueryWalk, as the mma.sync backward), keeping dK and dV of its keys in registers over
// the whole walk (GQA sums without atomics). Three warpgroups of 128 threads:
//   warpgroup 0, the producer, three busy warps:
//     warp 0 (one thread): TMA loads: K and V of the key block once, then Q and dO of each tile
//       into a ring of kStages slots ("q full" mbarriers count the bytes; "q empty" ones are
//       released by the consumers);
//     warp 1: the tile's kBlockM lse (log2 units) and shift = rowsum(dO * O) - dLSE - z lse values
//       into shared memory beside the slot (+inf / 0 for rows past the sequence: P = 0 there);
//     warp 2: the dQ reduction: once the consumers have put the tile's dQ (fp32, kBlockM x D) into
//       the shared staging tile (wgmma_dq_staging.cuh; at D = 256 into their panels of the tile's
//       Q / dO slot), D / 32 TMA tensor reduce-adds into the fp32 dq accumulator in global memory
//       (no per-element atomics, no per-row ops), then frees the staging buffer (or the slot);
//   warpgroups 1 and 2, the consumers: each owns 64 of the block's keys (at D = 256: all 64 keys
//     and half of the head dim, see WgmmaBackwardConfig::kSplitD). Per tile, with wgmma
//     (M = 64 keys per warpgroup, accumulators in registers):
//       S^T  = K Q^T          (A = K, B = Q, both K-major from shared memory; N = kBlockM queries)
//       dP^T = V dO^T         (same shapes)
//       P^T  = exp2(S^T scale log2e - lse)     dS^T = P^T (dP^T - shift) softcap'(S)
//       dV  += P^T dO         (A = P^T from registers, B = dO MN-major: K dim = queries)
//       dK  += dS^T Q         (A = dS^T from registers, B = Q MN-major)
//       dS^T -> shared memory (bf16 / fp16, 128 keys x kBlockM queries, two buffers); once both
//       warpgroups' halves are there (a 256-thread barrier; or mbarriers with kLagDq, below):
//       dQ = dS K, this warpgroup's half: D/2 columns at D = 128, 64 of the 128 queries at D = 64
//                             (A = dS read transposed from dS^T, B = K MN-major; K dim = 128 keys)
//     dK (times the softmax scale) and dV are written once at the end.
// In deterministic mode the kernel skips dQ; attention_dq_kernel computes it in a fixed order.
//
// Shared-memory tiles use the TMA 128-byte swizzle (wgmma_primitives.cuh): rows of 64 16-bit
// elements, 16-byte chunk c of row r at chunk c ^ (r % 8), 1024-byte aligned atoms. The consumers
// write dS^T in that same layout so wgmma can read it back through a descriptor.
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention_backward_kernel.cuh"
#include "wgmma_backward_scores.cuh"
#include "wgmma_dq_staging.cuh"
#include "wgmma_forward_kernel.cuh"
#include "wgmma_primitives.cuh"

namespace flashgrad::cuda_attn {

template <int D>
struct WgmmaBackwardConfig {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  // kSplitD (D = 256): dK and dV of 64 keys x 256 columns do not fit one warpgroup's registers, so
  // the CTA takes 64 keys and each consumer warpgroup owns half of the head dim (128 columns of dK,
  // dV and dQ); both compute the same S^T and dP^T (the one product the halves cannot split
  // without a shared-memory exchange: 4 of the 14 products per tile are this duplicate). A 64 x 256
  // fp32 dQ staging tile would not fit beside the 2-slot Q / dO ring, so each warpgroup stages its
  // 64 x 128 dQ half in the Q / dO slot the tile came in, in the four 64-row panels only it still
  // reads (Q and dO columns [col0, col0 + 128): its dK / dV operands; both warpgroups' S^T / dP^T
  // reads of the slot are over by the dS^T barrier), and the reducer warp frees the slot after
  // adding them by TMA (float2 atomics from registers before: ncu showed 19% of warp samples
  // throttled on the global-memory queue).
  static constexpr bool kSplitD = D == 256;
  static constexpr int kBlockN = kSplitD ? 64 : 128;  // keys per CTA
  static constexpr int kColsPerWg = kSplitD ? D / 2 : D;  // columns of dK / dV per warpgroup
  // Queries per tile: 64, or 128 at D = 64, where the products per tile are half as large and the
  // per-tile fixed work (exp, dS^T store, barrier, dQ staging, handshakes) would dominate; S^T and
  // dP^T then take 64 registers each beside dK and dV's 32.
  static constexpr int kBlockM = D == 64 ? 128 : 64;
  static constexpr int kStages = 2;    // Q / dO / lse / shift ring
  static constexpr int kThreads = 384;
  static constexpr int kPanels = D / 64;  // 128-byte column panels per tile row
  static constexpr int kKVBytes = kBlockN * D * 2;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kPanelBytesKV = kBlockN * 128;
  static constexpr int kPanelBytesQ = kBlockM * 128;
  // dS^T as kBlockM / 64 panels of [128 keys][64 queries] (128-byte rows).
  static constexpr int kDSPanelBytes = kBlockN * 128;
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;
  // dQ staging: the swizzled boxes of wgmma_dq_staging.cuh, added to dq_accum by TMA reductions.
  static constexpr int kDqBoxBytes = DqStaging<kBlockM>::kBoxBytes;
  static constexpr int kDqBytes = kSplitD ? 0 : DqStaging<kBlockM>::bytes(D);
  // Layout from a 1024-byte aligned base: K, V, Q ring, dO ring, dS^T x 2, dQ staging, lse ring,
  // shift ring, mbarriers.
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kKVBytes;
  static constexpr int kOffQ = 2 * kKVBytes;
  static constexpr int kOffDO = kOffQ + kStages * kQBytes;
  static constexpr int kOffDS = kOffDO + kStages * kQBytes;
  static constexpr int kOffDq = kOffDS + 2 * kDSBytes;
  static constexpr int kOffLse = kOffDq + kDqBytes;
  static constexpr int kOffShift = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffBar = kOffShift + kStages * kBlockM * 4;
  // kv full, q full x ST, lse full x ST, q empty x ST, dq full, dq empty, dS^T full x 2, dS^T empty x 2
  static constexpr int kNumBars = 3 + 3 * kStages + 4;
  static constexpr int kSmemBytes = kOffBar + 8 * kNumBars + 1024;
  static_assert(kOffDS % 1024 == 0 && kDSBytes % 1024 == 0, "dS^T buffers on swizzle-atom boundaries");
  static_assert(kOffDq % 1024 == 0 && kDqBoxBytes % 1024 == 0, "dQ staging boxes on swizzle-atom boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 / H200 block may have");
  // setmaxnreg split of the registers the CTA launched with (168 per thread x 384, what
  // __launch_bounds__(384, 1) gives): an increase beyond that pool never completes (the first D = 64
  // version asked for 240 x 256 + 32 x 128 and hung). 240 per consumer thread, 24 per producer
  // thread (exactly the pool): at D = 64 the 128-query tiles' S^T, dP^T, dK, dV alone are 192; at
  // D = 128 / 256 the two-phase score step keeps P^T in fp32 beside dP^T (232 / 40 spilled 96 / 68
  // bytes; now 28 / 0, outside the score step).
  static constexpr int kConsumerRegs = 240;
  static constexpr int kProducerRegs = 24;
  static_assert(kConsumerRegs * 256 + kProducerRegs * 128 <= 168 * 384, "more registers than the CTA launched with");
};

struct WgmmaBackwardAxes {
  int q_rows_inner = 1, k_rows_inner = 1, v_rows_inner = 1, do_rows_inner = 1;
};

// The tile of walk item `it`: query head and first query row.
struct BackwardTile {
  int h, m0;
};
__device__ __forceinline__ BackwardTile backward_tile(const QueryWalk& walk, int it, int hk, int group, int bm) {
  return {hk * group + it / walk.num_mb, (it % walk.num_mb) * bm};
}

// kLagDq (D <= 128, opt-in: FLASHGRAD_ATTN_BWD_LAGGED_DQ=1): dQ of tile j is computed during tile
// j + 1, after that tile's dV / dK products are issued, instead of right after a barrier that both
// warpgroups reach every tile. The dS^T buffers are handed over by mbarriers instead ("dS^T full":
// both warpgroups' halves written; "dS^T empty": both have read it), so the warpgroups may drift up
// to a tile apart, and warpgroup 2 starts half a tile behind warpgroup 1 (after the latter's first
// scores): one's exp / dS work then runs beside the other's products instead of at the same time.
template <typename T, int D, bool kLagDq>
__global__ void __launch_bounds__(384, 1)
    attention_backward_wgmma_kernel(const __grid_constant__ CUtensorMap map_q,
                                    const __grid_constant__ CUtensorMap map_k,
                                    const __grid_constant__ CUtensorMap map_v,
                                    const __grid_constant__ CUtensorMap map_do,
                                    const __grid_constant__ CUtensorMap map_dq, const AttentionKernelParams p,
                                    const WgmmaBackwardAxes axes, int num_n_blocks) {
  using Cfg = WgmmaBackwardConfig<D>;
  using Ops = ElementOps<T>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, ST = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem0 = (smem_address(smem_raw) + 1023u) & ~1023u;
  unsigned char* base = smem_raw + (smem0 - smem_address(smem_raw));
  const uint32_t sK = smem0 + Cfg::kOffK, sV = smem0 + Cfg::kOffV;
  const uint32_t sQ = smem0 + Cfg::kOffQ, sDO = smem0 + Cfg::kOffDO;  // slot s at + s * kQBytes
  const uint32_t sDS = smem0 + Cfg::kOffDS;                            // buffer b at + b * kDSBytes
  const uint32_t sDq = smem0 + Cfg::kOffDq;
  float* lse_s = reinterpret_cast<float*>(base + Cfg::kOffLse);      // [ST][BM]
  float* shift_s = reinterpret_cast<float*>(base + Cfg::kOffShift);  // [ST][BM]
  const uint32_t bar_kv_full = smem0 + Cfg::kOffBar;
  const uint32_t bar_q_full = bar_kv_full + 8;        // x ST
  const uint32_t bar_ls_full = bar_q_full + 8 * ST;   // x ST
  const uint32_t bar_q_empty = bar_ls_full + 8 * ST;  // x ST
  const uint32_t bar_dq_full = bar_q_empty + 8 * ST;
  const uint32_t bar_dq_empty = bar_dq_full + 8;
  const uint32_t bar_ds_full = bar_dq_empty + 8;   // x 2 (kLagDq)
  const uint32_t bar_dq_half_full = bar_ds_full;   // x 2 (kSplitD: warpgroup cw's dQ half staged)
  const uint32_t bar_ds_empty = bar_ds_full + 16;  // x 2 (kLagDq)
  static_assert(!kLagDq || !Cfg::kSplitD, "the lagged dQ is for D <= 128");

  const int seq = blockIdx.x / num_n_blocks;
  const int nb = static_cast<int>(blockIdx.x % num_n_blocks);
  const int hk = blockIdx.y;
  const SequenceView sv = sequence_view(p, seq);
  const int n0 = nb * BN;
  if (n0 >= sv.len_k) return;  // the whole CTA, before any barrier
  const MaskView mask = mask_view(p, sv, seq);
  const int group = p.heads_q / p.heads_k;
  QueryWalk walk{(sv.len_q + BM - 1) / BM, 0};
  walk.num_items = walk.num_mb * group;
  const bool with_dq = !p.deterministic;

  const int tid = threadIdx.x;
  if (tid == 0) {
    sm90::mbar_init(bar_kv_full, 1);
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      sm90::mbar_init(bar_q_full + 8 * s, 1);
      sm90::mbar_init(bar_ls_full + 8 * s, 32);  // every lane of the lse warp
      // Every consumer thread arrives: an arrival releases only its own thread's earlier shared
      // reads (of lse / shift), which the lse warp's next stores into the slot must follow.
      // kSplitD with dQ: + the reducer warp, once TMA has read the dQ halves staged in the slot.
      sm90::mbar_init(bar_q_empty + 8 * s, Cfg::kSplitD && with_dq ? 257 : 256);
    }
    sm90::mbar_init(bar_dq_full, 8);
    sm90::mbar_init(bar_dq_empty, 1);
    for (int b = 0; b < 2; ++b) {
      // kLagDq: every consumer thread, after its dS^T stores; kSplitD: warpgroup b's threads,
      // after their dQ staging stores.
      sm90::mbar_init(bar_ds_full + 8 * b, Cfg::kSplitD ? 128 : 256);
      sm90::mbar_init(bar_ds_empty + 8 * b, 256);  // every consumer thread, after its dQ read it
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  int cls = kTileEmpty;
  const int first = walk.next(mask, 0, n0, n0 + BN, BM, cls);
  const int warpgroup = tid / 128, lane = tid & 31;

  if (warpgroup == 0) {
    // ---- producer ----
    sm90::regs_decrease<Cfg::kProducerRegs>();
    const int warp = tid / 32;
    if (first < 0) return;  // nothing to load; the consumers write zeros
    if (warp == 0) {
      if (lane != 0) return;
      sm90::tma_prefetch_map(&map_q);
      sm90::tma_prefetch_map(&map_k);
      sm90::tma_prefetch_map(&map_v);
      sm90::tma_prefetch_map(&map_do);
      if (with_dq) sm90::tma_prefetch_map(&map_dq);
      const int qb = static_cast<int>(sv.q_batch), kb = static_cast<int>(sv.k_batch);
      const int k_row = static_cast<int>(sv.k_row0) + n0;
      sm90::mbar_arrive_expect_tx(bar_kv_full, 2 * Cfg::kKVBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c) {
        tma_tile(sK + c * Cfg::kPanelBytesKV, &map_k, bar_kv_full, axes.k_rows_inner, 64 * c, k_row, hk, kb);
        tma_tile(sV + c * Cfg::kPanelBytesKV, &map_v, bar_kv_full, axes.v_rows_inner, 64 * c, k_row, hk, kb);
      }
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const BackwardTile tile = backward_tile(walk, it, hk, group, BM);
        const int slot = j % ST;
        const int q_row = static_cast<int>(sv.q_row0) + tile.m0;
        sm90::mbar_wait(bar_q_empty + 8 * slot, ((j / ST) & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(bar_q_full + 8 * slot, 2 * Cfg::kQBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kPanels; ++c) {
          tma_tile(sQ + slot * Cfg::kQBytes + c * Cfg::kPanelBytesQ, &map_q, bar_q_full + 8 * slot,
                   axes.q_rows_inner, 64 * c, q_row, tile.h, qb);
          tma_tile(sDO + slot * Cfg::kQBytes + c * Cfg::kPanelBytesQ, &map_do, bar_q_full + 8 * slot,
                   axes.do_rows_inner, 64 * c, q_row, tile.h, qb);
        }
      }
    } else if (warp == 1) {
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const BackwardTile tile = backward_tile(walk, it, hk, group, BM);
        const int slot = j % ST;
        sm90::mbar_wait(bar_q_empty + 8 * slot, ((j / ST) & 1) ^ 1);
#pragma unroll
        for (int part = 0; part < BM / 32; ++part) {
          const int r = lane + 32 * part;
          const bool valid = tile.m0 + r < sv.len_q;
          const int64_t idx = static_cast<int64_t>(tile.h) * p.total_q + sv.scratch_row0 + tile.m0 + r;
          lse_s[slot * BM + r] = valid ? p.lse_log2[idx] : INFINITY;
          shift_s[slot * BM + r] = valid ? p.delta_shift[idx] : 0.f;
        }
        sm90::mbar_arrive(bar_ls_full + 8 * slot);  // release: the stores above are visible
      }
    } else if (warp == 2 && with_dq && !Cfg::kSplitD) {
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const BackwardTile tile = backward_tile(walk, it, hk, group, BM);
        sm90::mbar_wait(bar_dq_full, j & 1);
        if (lane == 0) {  // rows scratch_row0 + m0 .. of head h (past the sequence: staged zeros)
          reduce_dq_tile<BM, D>(&map_dq, sDq, static_cast<int>(sv.scratch_row0) + tile.m0, tile.h);
          sm90::mbar_arrive(bar_dq_empty);  // TMA has read the staging tile
        }
        __syncwarp();
      }
      if (lane == 0) sm90::bulk_wait_all();
    } else if (warp == 2 && with_dq) {  // kSplitD: the two dQ halves staged in the tile's Q / dO slot
      static_assert(DqStaging<BM>::kBoxBytes == Cfg::kPanelBytesQ, "a dQ box is one 64-row panel");
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const BackwardTile tile = backward_tile(walk, it, hk, group, BM);
        if (lane == 0) {
          const int slot = j % ST, row = static_cast<int>(sv.scratch_row0) + tile.m0;
          reduce_dq_halves_in_slot<BM>(&map_dq, sQ + slot * Cfg::kQBytes, sDO + slot * Cfg::kQBytes, bar_dq_half_full,
                                       j & 1, row, tile.h);
          sm90::mbar_arrive(bar_q_empty + 8 * slot);  // the slot may be refilled
        }
        __syncwarp();
      }
      if (lane == 0) sm90::bulk_wait_all();
    }
    return;
  }

  // ---- consumers ----
  sm90::regs_increase<Cfg::kConsumerRegs>();
  // Consumer warpgroup cw owns keys [64 cw, 64 cw + 64) of the block and all D columns, or (kSplitD)
  // all 64 keys and columns [col0, col0 + 128).
  const int cw = warpgroup - 1;
  constexpr int DC = Cfg::kColsPerWg;
  const int col0 = Cfg::kSplitD ? cw * DC : 0;
  const int warp_in_wg = (tid / 32) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int key_row = (Cfg::kSplitD ? 0 : cw * 64) + warp_in_wg * 16 + g;  // first key in the block; second +8
  const bool short_path_ok = p.softcap_method == kSoftcapOff;

  float dv[DC / 2], dk[DC / 2];
#pragma unroll
  for (int i = 0; i < DC / 2; ++i) dv[i] = dk[i] = 0.f;

  // dQ = dS K of one tile from dS^T buffer ds_buf, this warpgroup's share of it:
  //   BM = 64 (D = 128): the 64 queries x columns [64 cw, 64 cw + 64) (a K panel of its own);
  //   BM = 128 (D = 64): queries [64 cw, 64 cw + 64) (dS^T panel cw) x all 64 columns, so each
  //   warpgroup issues 8 m64n64 products instead of 16 m64n32 ones.
  // Waits for every product in flight (dV / dK too), releases the Q / dO slot `slot` (if >= 0) and,
  // with kLagDq, the dS^T buffer, then puts dQ into the staging buffer for the reducer warp once
  // it has read the previous item's (the item_j-th staging). (not kSplitD)
  constexpr bool kRowsPerWg = BM == 128;
  constexpr int kDqCols = kRowsPerWg ? D : D / 2;
  static_assert(Cfg::kSplitD || kDqCols == 64, "one 64-column K panel per warpgroup");
  auto dq_product_and_stage = [&](uint32_t ds_buf, int ds_index, int item_j, int slot, int rows_left) {
    const int dq_panel = kRowsPerWg ? cw : 0;  // dS^T panel = 64-query M tile
    const int dq_col0 = kRowsPerWg ? 0 : cw * kDqCols;
    float dq[kDqCols / 2];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a = ds_buf + dq_panel * Cfg::kDSPanelBytes + kk * 16 * 128;
      const uint32_t b = sK + (dq_col0 / 64) * Cfg::kPanelBytesKV + kk * 16 * 128;
      sm90::wgmma_ss_tt<T, kDqCols>(dq, sm90::smem_desc(a, Cfg::kDSPanelBytes, 1024),
                                    sm90::smem_desc(b, Cfg::kPanelBytesKV, 1024), kk > 0);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::pin_registers(dv);
    sm90::pin_registers(dk);
    sm90::pin_registers(dq);
    if (slot >= 0) sm90::mbar_arrive(bar_q_empty + 8 * slot);  // done with Q, dO, lse, shift
    if constexpr (kLagDq) sm90::mbar_arrive(bar_ds_empty + 8 * ds_index);
    sm90::mbar_wait(bar_dq_empty, (item_j & 1) ^ 1);
    stage_dq_tile<BM, kDqCols>(sDq, dq, dq_col0, dq_panel * 64 + warp_in_wg * 16 + g, g, t4, rows_left,
                               1.f);
    sm90::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar_dq_full);
  };

  if (first >= 0) {
    sm90::mbar_wait(bar_kv_full, 0);
    if constexpr (kLagDq)
      if (cw == 1) sm90::named_barrier_sync(2, 256);  // start after warpgroup 1's first scores
    int j = 0;
    int prev_m0 = 0;  // kLagDq: first query row of the previous tile, whose dQ is staged a tile late
    for (int it = first; it >= 0; ++j) {
      const BackwardTile tile = backward_tile(walk, it, hk, group, BM);
      const int slot = j % ST;
      const uint32_t phase = (j / ST) & 1;
      const uint32_t q_slot = sQ + slot * Cfg::kQBytes, do_slot = sDO + slot * Cfg::kQBytes;
      sm90::mbar_wait(bar_q_full + 8 * slot, phase);

      // S^T = K Q^T and dP^T = V dO^T: two groups, so P^T can start while dP^T still runs.
      float s[BM / 2], dp[BM / 2];
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t a = sK + (kk / 4) * Cfg::kPanelBytesKV + (Cfg::kSplitD ? 0 : cw * 64 * 128) + (kk % 4) * 32;
        const uint32_t b = q_slot + (kk / 4) * Cfg::kPanelBytesQ + (kk % 4) * 32;
        sm90::wgmma_ss<T, BM>(s, sm90::smem_desc(a, 16, 1024), sm90::smem_desc(b, 16, 1024), kk > 0);
      }
      sm90::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t a = sV + (kk / 4) * Cfg::kPanelBytesKV + (Cfg::kSplitD ? 0 : cw * 64 * 128) + (kk % 4) * 32;
        const uint32_t b = do_slot + (kk / 4) * Cfg::kPanelBytesQ + (kk % 4) * 32;
        sm90::wgmma_ss<T, BM>(dp, sm90::smem_desc(a, 16, 1024), sm90::smem_desc(b, 16, 1024), kk > 0);
      }
      sm90::wgmma_commit();
      sm90::mbar_wait(bar_ls_full + 8 * slot, phase);
      const float* lse = lse_s + slot * BM;
      const float* shift = shift_s + slot * BM;
      uint32_t pa[BM / 16][4], pds[BM / 16][4];  // P^T and dS^T as 16-bit A fragments
      bool scored = false;
      if constexpr (BM == 64) {
        if (short_path_ok) {
          // Two phases (wgmma_backward_scores.cuh): P^T while dP^T still runs, then dS^T.
          sm90::wgmma_wait<1>();
          sm90::pin_registers(s);
          if (cls == kTileFull)
            backward_probs<kBwdScoresFull, BM, Ops>(s, pa, lse, p.scale, sv, mask, n0 + key_row, tile.m0, t4);
          else
            backward_probs<kBwdScoresMasked, BM, Ops>(s, pa, lse, p.scale, sv, mask, n0 + key_row, tile.m0, t4);
          sm90::wgmma_wait<0>();
          sm90::pin_registers(dp);
          backward_dscores<BM, Ops>(s, dp, pds, shift, 1.f, t4);
          scored = true;
        }
      }
      if (!scored) {
        sm90::wgmma_wait<0>();
        sm90::pin_registers(s);
        sm90::pin_registers(dp);
        if (!short_path_ok)
          backward_scores<kBwdScoresSoftcap, BM, Ops>(s, dp, pa, pds, lse, shift, p.scale, 1.f, p, sv, mask,
                                                      n0 + key_row, tile.m0, t4);
        else if (cls == kTileFull)
          backward_scores<kBwdScoresFull, BM, Ops>(s, dp, pa, pds, lse, shift, p.scale, 1.f, p, sv, mask,
                                                   n0 + key_row, tile.m0, t4);
        else
          backward_scores<kBwdScoresMasked, BM, Ops>(s, dp, pa, pds, lse, shift, p.scale, 1.f, p, sv, mask,
                                                     n0 + key_row, tile.m0, t4);
      }
      if constexpr (kLagDq)
        if (cw == 0 && j == 0) sm90::named_barrier_arrive(2, 256);
      // dV += P^T dO, dK += dS^T Q (B read MN-major: the K dim, queries, is the row dim), columns
      // from col0: panel col0 / 64 of the dO / Q tile.
      const uint32_t col_bytes = (col0 / 64) * Cfg::kPanelBytesQ;
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs<T, DC>(dv, pa[kk], sm90::smem_desc(do_slot + col_bytes + kk * 16 * 128, Cfg::kPanelBytesQ, 1024),
                              1);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs<T, DC>(dk, pds[kk], sm90::smem_desc(q_slot + col_bytes + kk * 16 * 128, Cfg::kPanelBytesQ, 1024),
                              1);
      sm90::wgmma_commit();

      if (with_dq) {
        // dS^T into buffer j % 2 as [query panel of 64][key][query] with the 128-byte swizzle: key row
        // R = key_row (+8), queries 8 i + 2t (+1) sit in panel i / 8, 16-byte chunk i % 8 of the row,
        // stored at chunk (i % 8) ^ (R % 8) = (i % 8) ^ g. The buffer was last read by the dQ products
        // of tile j - 2, which both warpgroups had waited for before the barrier of tile j - 1.
        // kSplitD: both warpgroups hold the same dS^T; each writes the rows of two of its warps.
        const uint32_t ds_buf = sDS + (j & 1) * Cfg::kDSBytes;
        // kLagDq: buffer j % 2 was last read by both warpgroups' dQ of tile j - 2 (completion
        // (j - 2) / 2 of its "empty" barrier; a fresh barrier passes parity 1 at once).
        if constexpr (kLagDq) sm90::mbar_wait(bar_ds_empty + 8 * (j & 1), ((j >> 1) & 1) ^ 1);
        if (!Cfg::kSplitD || warp_in_wg / 2 == cw) {
#pragma unroll
          for (int i = 0; i < BM / 8; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const uint32_t addr = ds_buf + (i / 8) * Cfg::kDSPanelBytes + (key_row + 8 * r) * 128 +
                                    (((i % 8) ^ g) << 4) + 4 * t4;
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pds[i / 2][2 * (i & 1) + r]) : "memory");
            }
          }
        }
        sm90::fence_proxy_async_shared();
        if constexpr (kLagDq)
          sm90::mbar_arrive(bar_ds_full + 8 * (j & 1));
        else
          sm90::named_barrier_sync(1, 256);  // both warpgroups' halves of dS^T are in place

        if constexpr (Cfg::kSplitD) {
          // dV / dK first (frees P^T, dS^T and the slot), then dQ[64 queries x 128 columns from col0]
          // = dS K over the block's 64 keys, staged in this warpgroup's panels of the slot for the
          // reducer warp's TMA adds (see WgmmaBackwardConfig::kSplitD).
          sm90::wgmma_wait<0>();
          sm90::pin_registers(dv);
          sm90::pin_registers(dk);
          sm90::pin_fragments(pa, pds);
          float dq[DC / 2];
          sm90::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
            const uint32_t a = ds_buf + kk * 16 * 128;
            const uint32_t b = sK + (col0 / 64) * Cfg::kPanelBytesKV + kk * 16 * 128;
            sm90::wgmma_ss_tt<T, DC>(dq, sm90::smem_desc(a, Cfg::kDSPanelBytes, 1024),
                                     sm90::smem_desc(b, Cfg::kPanelBytesKV, 1024), kk > 0);
          }
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          sm90::pin_registers(dq);
          stage_dq_half_in_slot<BM>(q_slot, do_slot, dq, cw, warp_in_wg * 16 + g, g, t4, sv.len_q - tile.m0, 1.f);
          sm90::fence_proxy_async_shared();
          sm90::mbar_arrive(bar_dq_half_full + 8 * cw);
          sm90::mbar_arrive(bar_q_empty + 8 * slot);  // done with Q, dO, lse, shift (and the staging stores)
          it = walk.next(mask, it + 1, n0, n0 + BN, BM, cls);
          continue;
        }

        if constexpr (kLagDq) {
          if (j > 0) {  // dQ of the previous tile, whose dS^T both warpgroups wrote (completion (j-1)/2)
            const int pj = j - 1;
            sm90::mbar_wait(bar_ds_full + 8 * (pj & 1), (pj >> 1) & 1);
            dq_product_and_stage(sDS + (pj & 1) * Cfg::kDSBytes, pj & 1, pj, slot, sv.len_q - prev_m0);
          } else {
            sm90::wgmma_wait<0>();
            sm90::pin_registers(dv);
            sm90::pin_registers(dk);
            sm90::mbar_arrive(bar_q_empty + 8 * slot);
          }
        } else {
          dq_product_and_stage(ds_buf, j & 1, j, slot, sv.len_q - tile.m0);
        }
        sm90::pin_fragments(pa, pds);  // the tensor cores read them until the wait above
      } else {
        sm90::wgmma_wait<0>();
        sm90::pin_registers(dv);
        sm90::pin_registers(dk);
        sm90::pin_fragments(pa, pds);
        sm90::mbar_arrive(bar_q_empty + 8 * slot);
      }
      prev_m0 = tile.m0;
      // Found after the tile, not before: nothing of the walk stays live through the products.
      it = walk.next(mask, it + 1, n0, n0 + BN, BM, cls);
    }
    if constexpr (kLagDq) {
      if (with_dq) {  // the last tile's dQ (j tiles were done)
        const int pj = j - 1;
        sm90::mbar_wait(bar_ds_full + 8 * (pj & 1), (pj >> 1) & 1);
        dq_product_and_stage(sDS + (pj & 1) * Cfg::kDSBytes, pj & 1, pj, -1, sv.len_q - prev_m0);
      }
    }
  }

  // dV and dK (times the softmax scale) of this thread's keys key_row and key_row + 8.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + key_row + 8 * r;
    if (key >= sv.len_k) continue;
    T* dv_row = static_cast<T*>(p.dv) + row_offset(p.dv_st, sv.k_batch, sv.k_row0, key, hk);
    T* dk_row = static_cast<T*>(p.dk) + row_offset(p.dk_st, sv.k_batch, sv.k_row0, key, hk);
#pragma unroll
    for (int dt = 0; dt < DC / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(dv_row + col0 + dt * 8 + 2 * t4) = Ops::pack(dv[4 * dt + 2 * r], dv[4 * dt + 2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dk_row + col0 + dt * 8 + 2 * t4) =
          Ops::pack(dk[4 * dt + 2 * r] * p.scale, dk[4 * dt + 2 * r + 1] * p.scale);
    }
  }
}

}  // namespace flashgrad::cuda_attn
