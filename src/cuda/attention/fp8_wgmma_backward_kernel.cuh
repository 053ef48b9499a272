// FP8 (e4m3) softmax attention backward for Hopper: the bf16 wgmma backward's pipeline
// (wgmma_backward_kernel.cuh) with the recipe of docs/fp8.md: the two score products on the e4m3
// tensor cores, the three gradient products in 16 bits.
//
// One CTA = one block of kBlockN = 128 keys (64 at D = 256) of one (sequence, kv head), walking the
// (query head of the group, query block of kBlockM = 64) tiles the mask does not rule out
// (QueryWalk), dK and dV of its keys in registers over the whole walk. Three warpgroups of 128
// threads:
//   warpgroup 0, the producer:
//     warp 0 (one thread): TMA: k8, v8 and k16 of the key block once; per tile q8 and dO8 into the
//       8-bit ring (2 slots), q16 and dO16 into the 16-bit ring (2 slots; 1 at D = 256) ("full"
//       mbarriers count bytes, "empty" ones are released by every consumer thread: the 8-bit slot
//       once S^T / dP^T are done and lse / shift read, the 16-bit slot once dV / dK are done);
//     warp 1: the tile's lse (log2 units), shift = Delta - dLSE - z lse (the pre-pass's, Delta
//       from deq(dO8)) and dP's scale descale_dO(h) descale_v into shared memory beside the 8-bit
//       slot;
//     warp 2: the dQ reduction: D / 32 TMA tensor reduce-adds of the staged tile into dq_accum
//       (wgmma_dq_staging.cuh), which then free the staging buffer (D = 256: the 16-bit slot);
//   warpgroups 1 and 2, the consumers, 64 keys each (D = 256: all 64 keys, half of the head dim
//   each, as the bf16 kernel's kSplitD; both compute the same S^T and dP^T). Per tile:
//       S^T  = k8 q8^T      e4m3 wgmma m64n64k32 (A = k8, B = q8, both K-major as stored)
//       dP^T = v8 dO8^T     e4m3 wgmma (A = v8, B = dO8)
//       s = S^T descale_q descale_k scale (softcap, masks);  P^T = exp2(s log2e - lse)
//       dS^T = P^T (dP^T descale_dO descale_v - shift) softcap'
//       dV  += P^T dO16     16-bit wgmma, A = P^T rounded to 16 bits in registers, B = dO MN-major
//       dK  += dS^T q16     16-bit wgmma, A = dS^T in registers, B = q16 MN-major
//       dS^T -> shared memory (16-bit, swizzled), then dQ = dS k16 (A = dS read transposed from
//             dS^T, B = k16 MN-major), times descale_k: D <= 128: 64 x D/2 per warpgroup staged in
//             fp32 for the reducer warp; D = 256: 64 x 128 per warpgroup staged in its four
//             panels of the 16-bit slot (no room for a staging tile; only its own dV / dK read
//             them). dq = scale dq_accum afterwards, as on the mma.sync path.
//     dK (times scale descale_q) and dV are written once at the end.
// In deterministic mode the kernel skips dQ; fp8_dq_kernel.cuh computes it in a fixed order.
//
// Shared memory holds e4m3 and 16-bit tiles, all in the TMA 128-byte swizzle with 128-byte rows
// ("panels"): an e4m3 row of D bytes is D / 128 panels (a k32 step = 32 bytes inside one, as a k16
// step of 16-bit data, so the K-major descriptors are the bf16 kernel's), a 16-bit row D / 64 panels
// of 64 columns; at D = 64 the e4m3 rows are 64 bytes with the 64-byte swizzle (as the FP8
// forward's Q / K tiles there). The tensor maps describe every tensor as bytes (fp8_wgmma_backward_maps.h).
//
// One dS^T buffer (the shared-memory budget): before a tile's dS^T stores, named barrier 2 makes
// sure both warpgroups' dQ products of the previous tile (which read the buffer) have completed.
//
// This header holds no inline PTX (it is all in wgmma_primitives.cuh / fp8_wgmma_primitives.cuh), so
// the host emulation (fp8_wgmma_backward_emulation/) compiles it unchanged.
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention_backward_kernel.cuh"
#include "attention_forward_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_kernel_params.h"
#include "fp8_wgmma_primitives.cuh"
#include "sequence_and_mask.cuh"
#include "wgmma_backward_scores.cuh"
#include "wgmma_dq_staging.cuh"
#include "wgmma_primitives.cuh"

namespace flashgrad::cuda_attn::fp8wb {

// kLag: the lagged-dQ schedule (see the kernel), D = 128 only.
template <int D, bool kLag = false>
struct Fp8WgmmaBackwardConfig {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(!kLag || D == 128, "the lagged dQ schedule is for D = 128");
  static constexpr bool kSplitD = D == 256;           // see the header comment
  static constexpr int kBlockN = kSplitD ? 64 : 128;  // keys per CTA
  static constexpr int kBlockM = 64;                  // queries per tile
  static constexpr int kColsPerWg = kSplitD ? D / 2 : D;  // columns of dK / dV per warpgroup
  static constexpr int kThreads = 384;
  // e4m3 rows: D / 128 panels of 128 bytes (SWIZZLE_128B); at D = 64 one panel of 64-byte rows
  // (SWIZZLE_64B: 8-row groups of 512 bytes), as the FP8 forward's Q / K tiles.
  static constexpr int kRowBytes8 = D < 128 ? D : 128;
  static constexpr int kPanels8 = D / kRowBytes8;
  static constexpr int kSteps8 = kRowBytes8 / 32;  // k32 steps per e4m3 panel row
  static constexpr int kKey8PanelBytes = kBlockN * kRowBytes8;
  static constexpr int kQ8PanelBytes = kBlockM * kRowBytes8;
  static constexpr int kPanels16 = D / 64;  // of a 16-bit row
  // Key side: k8, v8 [BN][D] bytes, k16 [BN][D] 16-bit; a panel is BN rows of 128 bytes.
  static constexpr int kKeyPanelBytes = kBlockN * 128;  // 16-bit panels
  static constexpr int kKey8Bytes = kBlockN * D;
  static constexpr int kKey16Bytes = kBlockN * D * 2;
  // Query side: an 8-bit slot holds q8, dO8 [BM][D] bytes; a 16-bit slot q16, dO16 [BM][D].
  static constexpr int kQPanelBytes = kBlockM * 128;  // 16-bit panels
  static constexpr int kQ8Bytes = kBlockM * D;
  static constexpr int kQ16Bytes = kBlockM * D * 2;
  static constexpr int kStages8 = 2;
  // D = 256: 64 KB per slot; kLag: its second dS^T buffer takes the room of a second slot.
  static constexpr int kStages16 = kSplitD || kLag ? 1 : 2;
  static constexpr int kSlot8Bytes = 2 * kQ8Bytes;    // q8 at 0, dO8 at kQ8Bytes
  static constexpr int kSlot16Bytes = 2 * kQ16Bytes;  // q16 at 0, dO16 at kQ16Bytes
  // dS^T: [BN keys][64 queries] 16-bit, one panel.
  static constexpr int kDSPanelBytes = kBlockN * 128;
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;
  static constexpr int kDSBuffers = kLag ? 2 : 1;
  // dQ staging (D <= 128): the swizzled boxes of wgmma_dq_staging.cuh, added by TMA reductions.
  static constexpr int kDqBytes = kSplitD ? 0 : DqStaging<kBlockM>::bytes(D);
  static constexpr int kOffK8 = 0;
  static constexpr int kOffV8 = kKey8Bytes;
  static constexpr int kOffK16 = 2 * kKey8Bytes;
  static constexpr int kOffRing8 = kOffK16 + kKey16Bytes;
  static constexpr int kOffRing16 = kOffRing8 + kStages8 * kSlot8Bytes;
  static constexpr int kOffDS = kOffRing16 + kStages16 * kSlot16Bytes;
  static constexpr int kOffDq = kOffDS + kDSBuffers * kDSBytes;
  static constexpr int kOffLse = kOffDq + kDqBytes;                     // [kStages8][BM] floats
  static constexpr int kOffShift = kOffLse + kStages8 * kBlockM * 4;    // [kStages8][BM]
  static constexpr int kOffDpScale = kOffShift + kStages8 * kBlockM * 4;  // [kStages8] (16 bytes)
  static constexpr int kOffBar = kOffDpScale + 16;
  // kv full; q8 full, lse full, q8 empty x kStages8; q16 full, q16 empty x kStages16; dq full, dq empty;
  // kLag: dS^T full, dS^T empty x 2; kSplitD: dQ half staged x 2 (in the dS^T-full places)
  static constexpr int kNumBars = 3 + 3 * kStages8 + 2 * kStages16 + (kLag ? 4 : kSplitD ? 2 : 0);
  static constexpr int kSmemBytes = kOffBar + 8 * kNumBars + 1024;
  static_assert(kOffRing8 % 1024 == 0 && kOffRing16 % 1024 == 0 && kOffDS % 1024 == 0 && kQ8Bytes % 1024 == 0 &&
                    kKey8Bytes % 1024 == 0 && kDSBytes % 1024 == 0,
                "TMA / wgmma tiles on swizzle-atom boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 / H200 block may have");
  static_assert(kOffDq % 1024 == 0, "dQ staging boxes on swizzle-atom boundaries");
  // setmaxnreg split of the 168 x 384 registers the CTA launches with (wgmma_backward_kernel.cuh):
  // 240 / 24, as the bf16 kernel, for the two-phase score step (232 / 40 spilled 100-116 bytes).
  static constexpr int kConsumerRegs = 240;
  static constexpr int kProducerRegs = 24;
  static_assert(kConsumerRegs * 256 + kProducerRegs * 128 <= 168 * 384, "more registers than the CTA launched with");
};

// Which tensor-map axis holds the rows (1) or the heads (0) per tensor (the maps swap them when the
// rows are the smaller stride).
struct Fp8WgmmaBackwardAxes {
  int q8 = 1, k8 = 1, v8 = 1, do8 = 1, q16 = 1, do16 = 1, k16 = 1;
};

struct Fp8WgmmaBackwardMaps {
  CUtensorMap q8, k8, v8, do8, q16, do16, k16;
  CUtensorMap dq;  // the fp32 dQ accumulator (dq_accum_map.h); zeroed when unused (deterministic)
};

__device__ __forceinline__ void tma_rows(uint32_t dst, const CUtensorMap* map, uint32_t bar, int rows_inner, int c0,
                                         int row, int head, int batch) {
  if (rows_inner)
    sm90::tma_load_4d(dst, map, bar, c0, row, head, batch);
  else
    sm90::tma_load_4d(dst, map, bar, c0, head, row, batch);
}

// Descriptor of a K-major e4m3 operand: 128-byte swizzled rows (SBO 1024 = 8 rows), or at D = 64
// 64-byte swizzled rows (layout type 2 in bits 62-63, SBO 512 = 8 rows); addresses in 16 bytes.
template <int kRowBytes>
__device__ __forceinline__ uint64_t e4m3_desc(uint32_t addr) {
  if constexpr (kRowBytes == 128)
    return sm90::smem_desc(addr, 16, 1024);
  else
    return (sm90::smem_desc(addr, 16, 512) & ~(uint64_t{3} << 62)) | (uint64_t{2} << 62);
}

// P^T and dS^T from the e4m3 products' raw S^T and dP^T: backward_scores (wgmma_backward_scores.cuh)
// with qk_scale = descale_q descale_k scale and dp_scale = descale_dO(h) descale_v.

// kLag (D = 128, opt-in: FLASHGRAD_ATTN_FP8_WGMMA_BWD_LAG=1; the bf16 kernel's lagged-dQ schedule):
// dQ of tile j is computed during tile j + 1, after that tile's dV / dK products are issued, instead
// of right after a barrier both warpgroups reach every tile. Two dS^T buffers handed over by
// mbarriers ("dS^T full": both warpgroups' halves written; "dS^T empty": both have read it), so
// the warpgroups may drift up to a tile apart; warpgroup 2 starts after warpgroup 1's first scores,
// so one's exp / dS work runs beside the other's products instead of at the same time. The second
// dS^T buffer costs the 16-bit ring its second slot.
template <typename T, int D, bool kLag>
__global__ void __launch_bounds__(384, 1)
    fp8_attention_backward_wgmma_kernel(const __grid_constant__ Fp8WgmmaBackwardMaps maps,
                                        const __grid_constant__ Fp8KernelParams fp, const Fp8WgmmaBackwardAxes axes,
                                        int num_n_blocks) {
  using Cfg = Fp8WgmmaBackwardConfig<D, kLag>;
  using Ops = ElementOps<T>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, S8 = Cfg::kStages8, S16 = Cfg::kStages16;
  constexpr int DC = Cfg::kColsPerWg;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem0 = (smem_address(smem_raw) + 1023u) & ~1023u;
  unsigned char* base = smem_raw + (smem0 - smem_address(smem_raw));
  const uint32_t sK8 = smem0 + Cfg::kOffK8, sV8 = smem0 + Cfg::kOffV8, sK16 = smem0 + Cfg::kOffK16;
  const uint32_t sRing8 = smem0 + Cfg::kOffRing8;    // slot s at + s * kSlot8Bytes
  const uint32_t sRing16 = smem0 + Cfg::kOffRing16;  // slot s at + s * kSlot16Bytes
  const uint32_t sDS = smem0 + Cfg::kOffDS;
  const uint32_t sDq = smem0 + Cfg::kOffDq;
  float* lse_s = reinterpret_cast<float*>(base + Cfg::kOffLse);      // [S8][BM]
  float* shift_s = reinterpret_cast<float*>(base + Cfg::kOffShift);  // [S8][BM]
  float* dps_s = reinterpret_cast<float*>(base + Cfg::kOffDpScale);  // [S8]
  unsigned char* ds_s = base + Cfg::kOffDS;                          // dS^T, generic view
  const uint32_t bar_kv_full = smem0 + Cfg::kOffBar;
  const uint32_t bar_q8_full = bar_kv_full + 8;         // x S8
  const uint32_t bar_ls_full = bar_q8_full + 8 * S8;    // x S8
  const uint32_t bar_q8_empty = bar_ls_full + 8 * S8;   // x S8
  const uint32_t bar_q16_full = bar_q8_empty + 8 * S8;  // x S16
  const uint32_t bar_q16_empty = bar_q16_full + 8 * S16;  // x S16
  const uint32_t bar_dq_full = bar_q16_empty + 8 * S16;
  const uint32_t bar_dq_empty = bar_dq_full + 8;
  const uint32_t bar_ds_full = bar_dq_empty + 8;   // x 2 (kLag)
  const uint32_t bar_dq_half_full = bar_ds_full;   // x 2 (kSplitD: warpgroup cw's dQ half staged)
  const uint32_t bar_ds_empty = bar_ds_full + 16;  // x 2 (kLag)

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
    for (int s = 0; s < S8; ++s) {
      sm90::mbar_init(bar_q8_full + 8 * s, 1);
      sm90::mbar_init(bar_ls_full + 8 * s, 32);   // every lane of the lse warp
      sm90::mbar_init(bar_q8_empty + 8 * s, 256);  // every consumer thread (its own reads of lse / shift)
    }
#pragma unroll
    for (int s = 0; s < S16; ++s) {
      sm90::mbar_init(bar_q16_full + 8 * s, 1);
      // kSplitD with dQ: + the reducer warp, once TMA has read the dQ halves staged in the slot.
      sm90::mbar_init(bar_q16_empty + 8 * s, Cfg::kSplitD && with_dq ? 257 : 256);
    }
    sm90::mbar_init(bar_dq_full, 8);
    sm90::mbar_init(bar_dq_empty, 1);
    if constexpr (kLag) {
      for (int b = 0; b < 2; ++b) {
        sm90::mbar_init(bar_ds_full + 8 * b, 256);   // every consumer thread, after its dS^T stores
        sm90::mbar_init(bar_ds_empty + 8 * b, 256);  // every consumer thread, after its dQ read it
      }
    }
    if constexpr (Cfg::kSplitD)
      for (int b = 0; b < 2; ++b) sm90::mbar_init(bar_dq_half_full + 8 * b, 128);  // warpgroup b's threads
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
      sm90::tma_prefetch_map(&maps.q8);
      sm90::tma_prefetch_map(&maps.do8);
      sm90::tma_prefetch_map(&maps.q16);
      sm90::tma_prefetch_map(&maps.do16);
      if (with_dq) sm90::tma_prefetch_map(&maps.dq);
      const int qb = static_cast<int>(sv.q_batch), kb = static_cast<int>(sv.k_batch);
      const int k_row = static_cast<int>(sv.k_row0) + n0;
      // k16 rows of the workspace [total_k, Hk, D]: (batch * Sk + row) or the varlen token.
      const int k16_row = static_cast<int>(sv.k_batch * p.seqlen_k + sv.k_row0) + n0;
      sm90::mbar_arrive_expect_tx(bar_kv_full, 2 * Cfg::kKey8Bytes + Cfg::kKey16Bytes);
#pragma unroll
      for (int c = 0; c < Cfg::kPanels8; ++c) {
        tma_rows(sK8 + c * Cfg::kKey8PanelBytes, &maps.k8, bar_kv_full, axes.k8, 128 * c, k_row, hk, kb);
        tma_rows(sV8 + c * Cfg::kKey8PanelBytes, &maps.v8, bar_kv_full, axes.v8, 128 * c, k_row, hk, kb);
      }
#pragma unroll
      for (int c = 0; c < Cfg::kPanels16; ++c)
        tma_rows(sK16 + c * Cfg::kKeyPanelBytes, &maps.k16, bar_kv_full, axes.k16, 128 * c, k16_row, hk, 0);
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const int h = hk * group + it / walk.num_mb, m0 = (it % walk.num_mb) * BM;
        const int q_row = static_cast<int>(sv.q_row0) + m0;
        const int ws_row = static_cast<int>(sv.scratch_row0) + m0;  // workspace rows [total_q, Hq, D]
        // The 8-bit slot first (the products that start the tile), then the 16-bit one.
        const int s8 = j % S8, s16 = j % S16;
        const uint32_t d8 = sRing8 + s8 * Cfg::kSlot8Bytes, b8 = bar_q8_full + 8 * s8;
        sm90::mbar_wait(bar_q8_empty + 8 * s8, ((j / S8) & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(b8, Cfg::kSlot8Bytes);
#pragma unroll
        for (int c = 0; c < Cfg::kPanels8; ++c) {
          tma_rows(d8 + c * Cfg::kQ8PanelBytes, &maps.q8, b8, axes.q8, 128 * c, q_row, h, qb);
          tma_rows(d8 + Cfg::kQ8Bytes + c * Cfg::kQ8PanelBytes, &maps.do8, b8, axes.do8, 128 * c, ws_row, h, 0);
        }
        const uint32_t d16 = sRing16 + s16 * Cfg::kSlot16Bytes, b16 = bar_q16_full + 8 * s16;
        sm90::mbar_wait(bar_q16_empty + 8 * s16, ((j / S16) & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(b16, Cfg::kSlot16Bytes);
#pragma unroll
        for (int c = 0; c < Cfg::kPanels16; ++c) {
          tma_rows(d16 + c * Cfg::kQPanelBytes, &maps.q16, b16, axes.q16, 128 * c, ws_row, h, 0);
          tma_rows(d16 + Cfg::kQ16Bytes + c * Cfg::kQPanelBytes, &maps.do16, b16, axes.do16, 128 * c, q_row, h, qb);
        }
      }
    } else if (warp == 1) {
      const float dsv = fp8::load_descale(fp.descale_v, fp.dv_st_n, fp.dv_st_h, seq, hk);
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const int h = hk * group + it / walk.num_mb, m0 = (it % walk.num_mb) * BM;
        const int slot = j % S8;
        sm90::mbar_wait(bar_q8_empty + 8 * slot, ((j / S8) & 1) ^ 1);
#pragma unroll
        for (int part = 0; part < BM / 32; ++part) {
          const int r = lane + 32 * part;
          const bool valid = m0 + r < sv.len_q;
          const int64_t idx = static_cast<int64_t>(h) * p.total_q + sv.scratch_row0 + m0 + r;
          lse_s[slot * BM + r] = valid ? p.lse_log2[idx] : INFINITY;
          shift_s[slot * BM + r] = valid ? p.delta_shift[idx] : 0.f;
        }
        if (lane == 0)
          dps_s[slot] = descale_from_amax(fp.dout_amax[static_cast<int64_t>(seq) * p.heads_q + h]) * dsv;
        sm90::mbar_arrive(bar_ls_full + 8 * slot);  // release: the stores above are visible
      }
    } else if (warp == 2 && with_dq && !Cfg::kSplitD) {
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const int h = hk * group + it / walk.num_mb, m0 = (it % walk.num_mb) * BM;
        sm90::mbar_wait(bar_dq_full, j & 1);
        if (lane == 0) {  // rows scratch_row0 + m0 .. of head h (past the sequence: staged zeros)
          reduce_dq_tile<BM, D>(&maps.dq, sDq, static_cast<int>(sv.scratch_row0) + m0, h);
          sm90::mbar_arrive(bar_dq_empty);  // TMA has read the staging tile
        }
        __syncwarp();
      }
      if (lane == 0) sm90::bulk_wait_all();
    } else if (warp == 2 && with_dq) {  // kSplitD: the two dQ halves staged in the tile's 16-bit slot
      static_assert(DqStaging<BM>::kBoxBytes == Cfg::kQPanelBytes, "a dQ box is one 64-row 16-bit panel");
      int j = 0, c2 = 0;
      for (int it = first; it >= 0; it = walk.next(mask, it + 1, n0, n0 + BN, BM, c2), ++j) {
        const int h = hk * group + it / walk.num_mb, m0 = (it % walk.num_mb) * BM;
        if (lane == 0) {
          const int s16 = j % S16, row = static_cast<int>(sv.scratch_row0) + m0;
          reduce_dq_halves_in_slot<BM>(&maps.dq, sRing16 + s16 * Cfg::kSlot16Bytes,
                                       sRing16 + s16 * Cfg::kSlot16Bytes + Cfg::kQ16Bytes, bar_dq_half_full, j & 1, row,
                                       h);
          sm90::mbar_arrive(bar_q16_empty + 8 * s16);  // the slot may be refilled
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
  const int col0 = Cfg::kSplitD ? cw * DC : 0;
  const int key_base = Cfg::kSplitD ? 0 : cw * 64;  // first key row of the warpgroup's A operands
  const int warp_in_wg = (tid / 32) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int key_row = key_base + warp_in_wg * 16 + g;  // first key in the block; second +8
  const bool short_path_ok = p.softcap_method == kSoftcapOff;
  const float dsq = fp8::load_descale(fp.descale_q, fp.dq_st_n, fp.dq_st_h, seq, hk);
  const float dsk = fp8::load_descale(fp.descale_k, fp.dk_st_n, fp.dk_st_h, seq, hk);
  const float qk_scale = dsq * dsk * p.scale;

  float dv[DC / 2], dk[DC / 2];
#pragma unroll
  for (int i = 0; i < DC / 2; ++i) dv[i] = dk[i] = 0.f;

  // dQ[64 queries x D/2 columns of this warpgroup] = dS k16 over the block's 128 keys from dS^T
  // buffer ds_buf (A = dS read transposed from dS^T, B = k16's panel cw, both MN-major), times
  // descale_k. Waits for every product in flight (dV / dK too), releases the 16-bit slot `slot16`
  // (if >= 0) and, with kLag, dS^T buffer ds_index; then stages dQ for the reducer warp once it has
  // read item item_j - 1's. (not kSplitD)
  constexpr int kDqCols = D / 2;
  auto dq_product_and_stage = [&](uint32_t ds_buf, int ds_index, int item_j, int slot16, int rows_left) {
    // Column cw * D/2 of k16: a panel of its own at D = 128, 64 bytes into the 128-byte rows at D = 64.
    const uint32_t dq_b_offset = D == 64 ? cw * 64 : cw * Cfg::kKeyPanelBytes;
    float dq[kDqCols / 2];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      sm90::wgmma_ss_tt<T, kDqCols>(
          dq, sm90::smem_desc(ds_buf + kk * 16 * 128, Cfg::kDSPanelBytes, 1024),
          sm90::smem_desc(sK16 + dq_b_offset + kk * 16 * 128, Cfg::kKeyPanelBytes, 1024), kk > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::pin_registers(dv);
    sm90::pin_registers(dk);
    sm90::pin_registers(dq);
    if (slot16 >= 0) sm90::mbar_arrive(bar_q16_empty + 8 * slot16);  // done with q16, dO16
    if constexpr (kLag) sm90::mbar_arrive(bar_ds_empty + 8 * ds_index);
    sm90::mbar_wait(bar_dq_empty, (item_j & 1) ^ 1);
    // Rows at or past rows_left = len_q - m0 are staged as zeros (wgmma_dq_staging.cuh).
    stage_dq_tile<BM, kDqCols>(sDq, dq, cw * kDqCols, warp_in_wg * 16 + g, g, t4, rows_left, dsk);
    sm90::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar_dq_full);
  };

  if (first >= 0) {
    sm90::mbar_wait(bar_kv_full, 0);
    if constexpr (kLag)
      if (cw == 1) sm90::named_barrier_sync_id<2>(256);  // start after warpgroup 1's first scores
    int j = 0;
    int prev_m0 = 0;  // kLag: first query row of the previous tile, whose dQ is staged a tile late
    for (int it = first; it >= 0; ++j) {
      const int m0 = (it % walk.num_mb) * BM;
      const int s8 = j % S8, s16 = j % S16;
      const uint32_t q8_slot = sRing8 + s8 * Cfg::kSlot8Bytes, do8_slot = q8_slot + Cfg::kQ8Bytes;
      const uint32_t q16_slot = sRing16 + s16 * Cfg::kSlot16Bytes, do16_slot = q16_slot + Cfg::kQ16Bytes;
      sm90::mbar_wait(bar_q8_full + 8 * s8, (j / S8) & 1);

      // S^T = k8 q8^T and dP^T = v8 dO8^T (e4m3; k32 step kk: panel kk / kSteps8, 32 bytes per step
      // inside the panel's rows): two groups, so P^T can start while dP^T still runs.
      float s[BM / 2], dp[BM / 2];
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk)
        sm90::wgmma_e4m3_ss<BM>(
            s,
            e4m3_desc<Cfg::kRowBytes8>(sK8 + (kk / Cfg::kSteps8) * Cfg::kKey8PanelBytes +
                                       key_base * Cfg::kRowBytes8 + (kk % Cfg::kSteps8) * 32),
            e4m3_desc<Cfg::kRowBytes8>(q8_slot + (kk / Cfg::kSteps8) * Cfg::kQ8PanelBytes + (kk % Cfg::kSteps8) * 32),
            kk > 0);
      sm90::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk)
        sm90::wgmma_e4m3_ss<BM>(
            dp,
            e4m3_desc<Cfg::kRowBytes8>(sV8 + (kk / Cfg::kSteps8) * Cfg::kKey8PanelBytes +
                                       key_base * Cfg::kRowBytes8 + (kk % Cfg::kSteps8) * 32),
            e4m3_desc<Cfg::kRowBytes8>(do8_slot + (kk / Cfg::kSteps8) * Cfg::kQ8PanelBytes + (kk % Cfg::kSteps8) * 32),
            kk > 0);
      sm90::wgmma_commit();
      sm90::mbar_wait(bar_ls_full + 8 * s8, (j / S8) & 1);
      const float* lse = lse_s + s8 * BM;
      const float* shift = shift_s + s8 * BM;
      uint32_t pa[BM / 16][4], pds[BM / 16][4];  // P^T and dS^T as 16-bit A fragments
      if (short_path_ok) {
        // Two phases (wgmma_backward_scores.cuh): P^T while dP^T still runs, then dS^T.
        sm90::wgmma_wait<1>();
        sm90::pin_registers(s);
        if (cls == kTileFull)
          backward_probs<kBwdScoresFull, BM, Ops>(s, pa, lse, qk_scale, sv, mask, n0 + key_row, m0, t4);
        else
          backward_probs<kBwdScoresMasked, BM, Ops>(s, pa, lse, qk_scale, sv, mask, n0 + key_row, m0, t4);
        sm90::wgmma_wait<0>();
        sm90::pin_registers(dp);
        backward_dscores<BM, Ops>(s, dp, pds, shift, dps_s[s8], t4);
      } else {
        sm90::wgmma_wait<0>();
        sm90::pin_registers(s);
        sm90::pin_registers(dp);
        backward_scores<kBwdScoresSoftcap, BM, Ops>(s, dp, pa, pds, lse, shift, qk_scale, dps_s[s8], p, sv, mask,
                                                    n0 + key_row, m0, t4);
      }
      sm90::mbar_arrive(bar_q8_empty + 8 * s8);  // done with q8, dO8, lse, shift, dP's scale
      if constexpr (kLag)
        if (cw == 0 && j == 0) sm90::named_barrier_arrive_id<2>(256);

      // dV += P^T dO16, dK += dS^T q16 over this warpgroup's columns from col0 (B MN-major: the K
      // dim, queries, is the row dim; 64-column panels kQPanelBytes apart).
      const uint32_t col_bytes = (col0 / 64) * Cfg::kQPanelBytes;
      sm90::mbar_wait(bar_q16_full + 8 * s16, (j / S16) & 1);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs<T, DC>(dv, pa[kk],
                              sm90::smem_desc(do16_slot + col_bytes + kk * 16 * 128, Cfg::kQPanelBytes, 1024), 1);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        sm90::wgmma_rs<T, DC>(dk, pds[kk],
                              sm90::smem_desc(q16_slot + col_bytes + kk * 16 * 128, Cfg::kQPanelBytes, 1024), 1);
      sm90::wgmma_commit();

      if (with_dq) {
        // The dS^T buffer: kLag: buffer j % 2, last read by both warpgroups' dQ of tile j - 2
        // (completion (j - 2) / 2 of its "empty" barrier; a fresh barrier passes parity 1 at once);
        // otherwise the one buffer, which the previous tile's dQ products (both warpgroups) have read.
        const int ds_index = kLag ? (j & 1) : 0;
        if constexpr (kLag)
          sm90::mbar_wait(bar_ds_empty + 8 * ds_index, ((j >> 1) & 1) ^ 1);
        else if (j > 0)
          sm90::named_barrier_sync_id<2>(256);
        // dS^T as [key][query] with the 128-byte swizzle: key row R = key_row (+8), queries
        // 8 i + 2t (+1) in 16-byte chunk i of the row, stored at chunk i ^ (R % 8) = i ^ g.
        // kSplitD: both warpgroups hold the same dS^T; each writes the rows of two of its warps.
        if (!Cfg::kSplitD || warp_in_wg / 2 == cw) {
          unsigned char* ds_w = ds_s + ds_index * Cfg::kDSBytes;
#pragma unroll
          for (int i = 0; i < BM / 8; ++i)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              *reinterpret_cast<uint32_t*>(ds_w + (key_row + 8 * r) * 128 + ((i ^ g) << 4) + 4 * t4) =
                  pds[i / 2][2 * (i & 1) + r];
        }
        sm90::fence_proxy_async_shared();
        if constexpr (kLag)
          sm90::mbar_arrive(bar_ds_full + 8 * ds_index);
        else
          sm90::named_barrier_sync_id<1>(256);  // both warpgroups' parts of dS^T are in place

        if constexpr (Cfg::kSplitD) {
          // dV / dK first (frees P^T and dS^T), then dQ[64 queries x 128 columns from col0] = dS k16
          // over the block's 64 keys, times descale_k, staged in this warpgroup's panels of the 16-bit
          // slot (only its own dV / dK products read them) for the reducer warp's TMA adds, which
          // free the slot; the bf16 kernel's scheme (WgmmaBackwardConfig::kSplitD).
          sm90::wgmma_wait<0>();
          sm90::pin_registers(dv);
          sm90::pin_registers(dk);
          sm90::pin_fragments(pa, pds);
          float dq[DC / 2];
          sm90::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            sm90::wgmma_ss_tt<T, DC>(dq, sm90::smem_desc(sDS + kk * 16 * 128, Cfg::kDSPanelBytes, 1024),
                                     sm90::smem_desc(sK16 + (col0 / 64) * Cfg::kKeyPanelBytes + kk * 16 * 128,
                                                     Cfg::kKeyPanelBytes, 1024),
                                     kk > 0);
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          sm90::pin_registers(dq);
          stage_dq_half_in_slot<BM>(q16_slot, do16_slot, dq, cw, warp_in_wg * 16 + g, g, t4, sv.len_q - m0, dsk);
          sm90::fence_proxy_async_shared();
          sm90::mbar_arrive(bar_dq_half_full + 8 * cw);
          sm90::mbar_arrive(bar_q16_empty + 8 * s16);  // done with q16, dO16 (and the staging stores)
        } else if constexpr (kLag) {
          if (j > 0) {  // dQ of the previous tile, whose dS^T both warpgroups wrote (completion (j-1)/2)
            const int pj = j - 1;
            sm90::mbar_wait(bar_ds_full + 8 * (pj & 1), (pj >> 1) & 1);
            dq_product_and_stage(sDS + (pj & 1) * Cfg::kDSBytes, pj & 1, pj, s16, sv.len_q - prev_m0);
          } else {
            sm90::wgmma_wait<0>();
            sm90::pin_registers(dv);
            sm90::pin_registers(dk);
            sm90::mbar_arrive(bar_q16_empty + 8 * s16);
          }
          sm90::pin_fragments(pa, pds);  // the tensor cores read them until the wait above
        } else {
          dq_product_and_stage(sDS, 0, j, s16, sv.len_q - m0);
          sm90::pin_fragments(pa, pds);  // the tensor cores read them until the wait above
        }
      } else {
        sm90::wgmma_wait<0>();
        sm90::pin_registers(dv);
        sm90::pin_registers(dk);
        sm90::pin_fragments(pa, pds);
        sm90::mbar_arrive(bar_q16_empty + 8 * s16);
      }
      prev_m0 = m0;
      // Found after the tile, not before: nothing of the walk stays live through the products.
      it = walk.next(mask, it + 1, n0, n0 + BN, BM, cls);
    }
    if constexpr (kLag) {
      if (with_dq) {  // the last tile's dQ (j tiles were done, j >= 1)
        const int pj = j - 1;
        sm90::mbar_wait(bar_ds_full + 8 * (pj & 1), (pj >> 1) & 1);
        dq_product_and_stage(sDS + (pj & 1) * Cfg::kDSBytes, pj & 1, pj, -1, sv.len_q - prev_m0);
      }
    }
  }

  // dV and dK (times scale descale_q) of this thread's keys key_row and key_row + 8, columns from col0.
  const float dk_scale = p.scale * dsq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + key_row + 8 * r;
    if (key >= sv.len_k) continue;
    T* dv_row = static_cast<T*>(p.dv) + row_offset(p.dv_st, sv.k_batch, sv.k_row0, key, hk) + col0;
    T* dk_row = static_cast<T*>(p.dk) + row_offset(p.dk_st, sv.k_batch, sv.k_row0, key, hk) + col0;
#pragma unroll
    for (int dt = 0; dt < DC / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(dv_row + dt * 8 + 2 * t4) = Ops::pack(dv[4 * dt + 2 * r], dv[4 * dt + 2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dk_row + dt * 8 + 2 * t4) =
          Ops::pack(dk[4 * dt + 2 * r] * dk_scale, dk[4 * dt + 2 * r + 1] * dk_scale);
    }
  }
}

}  // namespace flashgrad::cuda_attn::fp8wb
