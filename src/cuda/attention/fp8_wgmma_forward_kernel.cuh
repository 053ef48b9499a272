// FP8 (e4m3) softmax attention forward for Hopper: the bf16 wgmma forward's pipeline
// (wgmma_forward_kernel.cuh: TMA, 1 producer + 2 consumer warpgroups, setmaxnreg, S(j+1) issued
// beside P(j) V(j)) with both products on the e4m3 tensor cores (wgmma m64nNk32) and the FP8 recipe
// of the mma.sync FP8 forward (fp8_forward_kernel.cuh, docs/fp8.md):
//   S   = q8 k8^T (fp32),  s = S descale_q descale_k scale, softcap and mask in fp32;
//   online softmax in fp32, running max m and running sum l of the unquantized 448 p~;
//   O  += e4m3(448 p~) vt8,  vt8 = V^T with keys permuted in groups of 16 (fp8_wgmma_vt.cuh);
//   out = O descale_v / l (l carries the factor 448), lse = m + log l (-inf and out = 0 on empty rows).
//
// One CTA = 128 query rows of one (sequence, query head), 384 threads:
//   warpgroup 0, producer (one thread): TMA loads of the Q tile, then per key block the mask does
//     not rule out (128 keys: the 128-byte SWIZZLE_128B row of V^T) a K tile [128 keys][D] and a
//     V^T tile [D][128 keys], into a ring of kStages slots ("full" / "empty" mbarriers);
//   warpgroups 1, 2, consumers, 64 query rows each. A key block is consumed as kSub sub-blocks of
//     kBlockN keys (128 at D = 64 / 128; 64 at D = 256, where O alone takes 128 registers per thread):
//     S = wgmma(Q, K sub-block) from shared memory, softmax in registers, P8 packed into the
//     8-bit A registers, P V = wgmma(P8 registers, V^T sub-block, K-major from shared memory).
//
// Two-level accumulation of P V (the recipe's requirement on Hopper: docs/perf/attention_fp8_kernels.md):
// the e4m3 tensor cores keep about 13 mantissa bits of the accumulator C they are given, so O summed
// over hundreds of key blocks inside the tensor core would drift by up to 2^-13 of itself per step.
// Each sub-block's P V is summed from zero by the tensor cores (1 to 4 k32 steps) into `ob`, then
// folded into O in fp32: O = O * rescale + ob, one FFMA per element in place of the bf16 kernel's
// FMUL rescale. The fold of block j uses block j's rescale (exp2(m(j-1) - m(j))), kept one
// iteration, because block j+1's softmax runs while P(j) V(j) is on the tensor cores.
// At D = 256, ob holds one N chunk of kPvChunk head-dim columns: the chunks after the first are
// issued and folded one after the other (their latency is not hidden behind a softmax).
//
// Key blocks are visited in increasing order with the bf16 kernels' tile classification (skip /
// full / partial at the CTA's 128 x 128 granularity) and per-row key ranges (MaskView).
#pragma once

#include <cuda.h>

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "fp8_fragments.cuh"
#include "fp8_kernel_params.h"
#include "fp8_wgmma_primitives.cuh"
#include "fp8_wgmma_vt.cuh"
#include "sequence_and_mask.cuh"
#include "wgmma_primitives.cuh"

namespace flashgrad::cuda_attn::fp8w {

// Which tensor-map axis (1 or 2) holds the rows of q / k; the other holds the heads (the host
// orders them by increasing stride, as TMA wants).
struct Fp8wMapAxes {
  int q_rows_inner = 1, k_rows_inner = 1;
  // Not an axis but a launch option carried along: whether the producer sleeps in its waits for
  // empty ring slots (sm90::mbar_wait_suspend; kLean only). 0 spins as session 4 did, so both can be
  // timed on one instance (FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP).
  int producer_sleep = 1;
  // Also a launch option (session 6; every schedule): 1 = warpgroup 2 starts its first S only
  // once warpgroup 1 has packed its first P (named barrier 3), so the two run half a block apart
  // from the start instead of in step (FLASHGRAD_ATTN_FP8_WGMMA_STAGGER). In step, both wait for
  // their S together (the tensor cores busy, MUFU idle), then run their exponentials together (MUFU
  // saturated, the tensor cores idle once P V is done); apart, one's exponentials can run beside the
  // other's products. Nothing holds them apart afterwards except ping-pong's turns, if on.
  int stagger = 0;
};

#ifndef FLASHGRAD_FP8W_PV_CHUNK_256
#define FLASHGRAD_FP8W_PV_CHUNK_256 64
#endif

// How a consumer warpgroup orders its products:
//   kOverlap (default): S(j+1) issued beside P(j) V(j), the softmax of j+1 runs while P V does;
//     two-level P V accumulation (above);
//   kSerial: no overlap inside a warpgroup (S, softmax, P V one after the other; the two warpgroups
//     overlap each other, in turns with kPingpong). S is dead while P V runs, so D = 256 affords
//     128-key blocks and 128-column P V chunks; two-level accumulation;
//   kOneLevel: kOverlap's schedule with O accumulated inside the tensor cores across key blocks (the
//     bf16 kernel's scheme: O rescaled in fp32 between blocks, no ob; 64-key steps at D = 256).
//     NOT the recipe's numerics (the ~13-bit accumulator input, see above): for measuring what the
//     two-level accumulation costs;
//   kOverlapPvPipe (D = 256; session 5): kOverlap with P V in 8 chunks of 32 head-dim columns in two
//     alternating accumulators (ob[2][16], the registers of kOverlap's one 64-column ob): chunk c + 1
//     runs on the tensor cores while chunk c is folded, where kOverlap issues, waits for and folds
//     its chunks 1-3 one after the other. Same numerics as kOverlap;
//   kSerialPvPipe (D = 256; session 5): kSerial (128-key blocks) with P V in 4 chunks of 64 columns
//     in two alternating 32-register accumulators (kSerial's one 128-column ob), pipelined as in
//     kOverlapPvPipe: chunk c + 1 runs while chunk c is folded, where kSerial waits for each of its
//     two chunks in turn. (Chunk 1 in the S registers instead, dead after the pack, does not fit:
//     S, ob and O of 128 are live together, 436 B spill.) Same numerics as kSerial.
//   kEarlyS (D = 64 / 128; session 6): kOverlap's overlap with the fold moved off the path from the
//     softmax to the next S: per item j, issue S(j+1); fold P(j-1) V(j-1) (done, waited for in the
//     previous round) into O while S(j+1) runs; issue P(j) V(j); wait for S(j+1); softmax(j+1) while
//     P(j) V(j) runs; wait for it; pack P(j+1). kOverlap issues S(j+1) only after the fold of j, so
//     the 64 fold FFMA per block sit between the wait for P(j) V(j) and the next S with the tensor
//     cores idle. Same registers at the peak (S + O + ob + P), same numerics.
enum Fp8wSchedule : int { kOverlap = 0, kSerial = 1, kOneLevel = 2, kOverlapPvPipe = 3, kSerialPvPipe = 4, kEarlyS = 5 };

template <int D, int kSchedule = kOverlap>
struct Fp8wForwardConfig {
  static_assert(D == 64 || D == 128 || D == 256, "the FP8 wgmma forward covers head dims 64, 128 and 256");
  static constexpr int kBlockM = 128;    // two consumer warpgroups of 64 rows
  static constexpr int kLoadN = 128;     // keys per TMA block (one 128-byte V^T row)
  // Keys per S / softmax / P V step: 64 where S, O and ob (or O alone at 128 per thread) would not fit
  // beside 128-key S registers.
  static constexpr bool kSerialLike = kSchedule == kSerial || kSchedule == kSerialPvPipe;
  static constexpr int kBlockN = D == 256 && !kSerialLike ? 64 : 128;
  static constexpr int kSub = kLoadN / kBlockN;
  // Head-dim columns per P V accumulator chunk (registers: S kBlockN / 2, O D / 2, ob kPvChunk / 2);
  // kOneLevel: all D columns straight into O.
  static constexpr int kPvChunk256 =
      kSchedule == kSerial ? 128 : kSchedule == kOverlapPvPipe ? 32 : kSchedule == kSerialPvPipe ? 64
                                                                                           : FLASHGRAD_FP8W_PV_CHUNK_256;
  static constexpr int kPvChunk = kSchedule == kOneLevel ? D : D == 256 ? kPvChunk256 : D;
  // Accumulators of P V chunks in flight at once (kOverlapPvPipe, kSerialPvPipe at D = 256: two).
  static constexpr int kPvBuffers = (kSchedule == kOverlapPvPipe || kSchedule == kSerialPvPipe) && D == 256 ? 2 : 1;
  static constexpr int kPvChunks = D / kPvChunk;
  // Q / K tiles: rows of 128 bytes (SWIZZLE_128B) in D / 128 column panels; at D = 64 one panel of
  // 64-byte rows (SWIZZLE_64B: chunk c of row r at c ^ ((r / 2) % 4), 8-row groups of 512 bytes).
  static constexpr int kRowBytes = D < 128 ? D : 128;
  static constexpr int kPanels = D / kRowBytes;
  static constexpr int kStepsPerRow = kRowBytes / 32;  // k32 steps per panel row
  static constexpr int kStages = D == 64 ? 8 : D == 128 ? 5 : 3;
  static constexpr int kThreads = 384;
  static constexpr int kPanelBytes = 128 * kRowBytes;  // 128 rows (Q and K panels)
  static constexpr int kQBytes = kBlockM * D;
  static constexpr int kKBytes = kLoadN * D;
  static constexpr int kVtBytes = D * kLoadN;
  static constexpr int kBarrierOffset = kQBytes + kStages * (kKBytes + kVtBytes);
  // mbarriers: Q full, then K full, V full, K empty, V empty per slot; +1024 to align the base.
  static constexpr int kSmemBytes = kBarrierOffset + 8 * (1 + 4 * kStages) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an H100 / H200 block may have");
  static constexpr int kConsumerRegs = 240;
  static constexpr int kProducerRegs = 24;
};

__device__ __forceinline__ void fp8w_tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int rows_inner,
                                              int d0, int row, int head, int batch) {
  if (rows_inner)
    sm90::tma_load_4d(dst, map, bar, d0, row, head, batch);
  else
    sm90::tma_load_4d(dst, map, bar, d0, head, row, batch);
}

// The V^T box of key columns [col, col + 128) of kv head hk: all D rows.
__device__ __forceinline__ void fp8w_tma_vt(uint32_t dst, const CUtensorMap* map, uint32_t bar, int col, int hk) {
  sm90::tma_load_3d(dst, map, bar, col, 0, hk);
}

// Descriptor of a K-major Q / K operand: 128-byte swizzled rows (SBO 1024 = 8 rows), or at D = 64
// 64-byte swizzled rows (layout type 2, SBO 512 = 8 rows); addresses in 16 bytes.
template <int kRowBytes>
__device__ __forceinline__ uint64_t fp8w_qk_desc(uint32_t addr) {
  if constexpr (kRowBytes == 128)
    return sm90::smem_desc(addr, 16, 1024);
  else
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{512 >> 4} << 32) |
           (uint64_t{2} << 62);
}

enum Fp8wScoreMode : int { kFp8wFull = 0, kFp8wMasked = 1, kFp8wSoftcap = 2 };

// S (raw q8 k8^T sums) -> 448 p~ = exp2(s log2e - m + log2 448) in place, online-softmax update of
// this thread's rows g and g + 8; `rescale` = exp2(m_old - m_new) for O. Short path (full tile, no
// softcap, qk_scale > 0): the scale folds into the exponent. General: s = softcap(S qk_scale),
// -inf outside the row's key range [lo, hi) (and diag).
// kLean (session 5, the default; false = session 4's instruction stream, for timing both in one
// process): the partial max / sum chains start from their first elements instead of -inf / 0
// (fmaxf(-inf, x) and 0 + x cannot be folded away by the compiler: NaN and -0 semantics), 16
// instructions fewer per block.
// kIntMax (session 13; full tiles of the short path): the max over the quad of row r's scores in the
// block (r = 0: row g, r = 1: row g + 8; unscaled), from the scores' bit patterns read as int32, with
// 3-input integer maxima (sm90::max3_bits: VIMNMX3): 16 instructions per thread and row where the
// float tree takes 31 FMNMX (sm_90 has no 3-input FMNMX). For floats >= +0 the int32 order of the
// bits is the float order, and every negative float (and -0) reads as a negative int32. So if the
// largest int m is >= 0, the row has a score >= +0 and m is the bits of its largest score; if m < 0,
// every score of the row's block is negative (or -0) and m is the bits of the most negative one, not
// the max. Precondition (the caller's): the row's running max row_max >= 0. Then the new max
// fmaxf(max mul, row_max) is the same either way: for a block max < 0 it is row_max (mul > 0 on the
// short path), and (most negative score) mul < 0 <= row_max gives row_max too. NaN scores (from NaN
// inputs only) may be taken as the max here where FMNMX drops them; the row's exponentials are NaN
// either way.
template <int BN>
__device__ __forceinline__ float fp8w_block_max_bits(const float (&s)[BN / 2], int r) {
  static_assert(BN == 128, "kIntMax: 128-key blocks (32 scores per thread and row)");
  // Score v (0..31) of row r: s[4 (v / 2) + 2 r + v % 2] (key 8 (v / 2) + 2 t + v % 2).
  auto at = [&](int v) { return s[4 * (v / 2) + 2 * r + v % 2]; };
  int l1[10];  // scores 3i .. 3i + 2
#pragma unroll
  for (int i = 0; i < 10; ++i) l1[i] = sm90::max3_bits(at(3 * i), at(3 * i + 1), at(3 * i + 2));
  int l2[4];  // l1 in threes, the last with scores 30, 31
#pragma unroll
  for (int i = 0; i < 3; ++i) l2[i] = imax(imax(l1[3 * i], l1[3 * i + 1]), l1[3 * i + 2]);
  l2[3] = sm90::max3_bits(l1[9], at(30), at(31));
  int m = imax(imax(l2[0], l2[1]), imax(l2[2], l2[3]));
  // Over the quad (the row's 4 threads), through float shuffles of the bits.
  m = imax(m, __float_as_int(__shfl_xor_sync(0xffffffffu, __int_as_float(m), 1)));
  m = imax(m, __float_as_int(__shfl_xor_sync(0xffffffffu, __int_as_float(m), 2)));
  return __int_as_float(m);
}

// Whether every running max of the warp's rows is >= +0 (fp8w_block_max_bits's precondition): one
// vote on the sign bits (-0 counts as negative: the float tree then, which is always right).
__device__ __forceinline__ bool fp8w_int_max_ok(const float (&row_max)[2]) {
  return __all_sync(0xffffffffu, (__float_as_int(row_max[0]) | __float_as_int(row_max[1])) >= 0);
}

template <int kMode, int BN, bool kLean = false, bool kIntMax = false>
__device__ __forceinline__ void fp8w_softmax_block(float (&s)[BN / 2], float (&row_max)[2], float (&row_sum)[2],
                                                   float (&rescale)[2], const AttentionKernelParams& p,
                                                   float qk_scale, const MaskView& mask, int row0, int n0, int t) {
  constexpr bool kGeneral = kMode != kFp8wFull;
  const float scale_log2 = qk_scale * kLog2e;
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
          if constexpr (kMode == kFp8wSoftcap) {
            float unused;
            x = apply_softcap(p.softcap_method, p.softcap, x * qk_scale, unused) * kLog2e;
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
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // This thread's max of row r's scores.
    auto thread_max = [&] {
      float mx;
      if constexpr (kLean) {
        // 4 interleaved partial chains (two consumer warps per scheduler cannot hide one long chain),
        // each starting at its first pair.
        float part[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[4 * k + 2 * r], s[4 * k + 2 * r + 1]);
#pragma unroll
        for (int nt = 4; nt < BN / 8; ++nt)
          part[nt % 4] = fmaxf(part[nt % 4], fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
        mx = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
      } else {
        float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
          part[nt % 4] = fmaxf(part[nt % 4], fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
        mx = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
      }
      return mx;
    };
    float mx;
    if constexpr (kIntMax && !kGeneral) {
      // The caller has checked row_max >= 0 for the whole warp (fp8w_int_max_ok).
      mx = fmaxf(fp8w_block_max_bits<BN>(s, r) * mul, row_max[r]);
    } else {
      mx = fmaxf(quad_max(thread_max()) * mul, row_max[r]);
    }
    // A row with nothing allowed yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
    // (kIntMax, full tiles: every score is allowed and finite, so mx is finite: no test.)
    const float base = kIntMax && !kGeneral ? mx : mx == -INFINITY ? 0.f : mx;
    rescale[r] = fast_exp2(row_max[r] - base);
    row_max[r] = mx;
    // P8 = e4m3(448 p~): no multiply per element.
    const float base448 = base - fp8::kLog2E4m3Max;
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[4 * nt + 2 * r] = fast_exp2(s[4 * nt + 2 * r] * mul - base448);
      s[4 * nt + 2 * r + 1] = fast_exp2(s[4 * nt + 2 * r + 1] * mul - base448);
      if (kLean && nt < 4)
        sum[nt] = s[4 * nt + 2 * r] + s[4 * nt + 2 * r + 1];  // each chain starts at its first pair
      else
        sum[nt % 4] += s[4 * nt + 2 * r] + s[4 * nt + 2 * r + 1];
    }
    row_sum[r] = row_sum[r] * rescale[r] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
  }
}

// P8 A registers of k32 step ks from the S accumulators: chunks 4 ks .. 4 ks + 3 (8 keys each) of
// rows g (elements 0, 1) and g + 8 (elements 2, 3); register 0 = row g, positions 4t..4t+3 = keys
// 2t, 2t+1 (chunk 4 ks), 8+2t, 9+2t (chunk 4 ks + 1): fp8::p_to_a_fragment's order, which vt8's
// key permutation undoes.
template <int BN>
__device__ __forceinline__ void fp8w_pack_p(const float (&s)[BN / 2], uint32_t (&a)[BN / 32][4]) {
#pragma unroll
  for (int ks = 0; ks < BN / 32; ++ks) {
    const float* c = s + 16 * ks;
    a[ks][0] = fp8::pack_e4m3x4(c[0], c[1], c[4], c[5]);
    a[ks][1] = fp8::pack_e4m3x4(c[2], c[3], c[6], c[7]);
    a[ks][2] = fp8::pack_e4m3x4(c[8], c[9], c[12], c[13]);
    a[ks][3] = fp8::pack_e4m3x4(c[10], c[11], c[14], c[15]);
  }
}

// A descriptor whose start address is `units` * 16 bytes further on. The start address is the
// descriptor's low field, bits 0-13 = (addr & 0x3FFFF) >> 4; every shared address the kernel forms
// stays below 2^18 bytes (the 227 KB window), so the field never carries into bit 14 and a 32-bit
// add on the low word is exact. Keeping the high word (SBO, layout type) as it is lets the compiler
// hold it once: one uniform add per wgmma operand instead of rebuilding the descriptor from the
// address (and, mask, shift, or: five dependent uniform instructions per operand in session 4).
__device__ __forceinline__ uint64_t fp8w_desc_add(uint64_t desc, uint32_t units) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + units);
}

// End of the run of key blocks (of LN keys) that are kTileFull for the CTA's query rows [m0, m1),
// computed once, so that the hot loop steps through them without MaskView::classify (about 30
// instructions and two indirect branches per block on the mask kind). 0 where no such closed form
// is used (window, prefix-LM, candidate masks; rows past the sequence): every block then takes
// next_key_block. Block nb (keys [nb LN, (nb + 1) LN)) is full, by classify, iff the rows are
// inside (m1 <= len_q), its keys are inside ((nb + 1) LN <= len_k, i.e. nb < len_k / LN) and the
// mask allows every pair: always for kMaskNone; for kMaskCausal iff its last key (nb + 1) LN - 1 is
// at most the first row's last key a0 = m0 + offset, i.e. nb + 1 <= (a0 + 1) / LN (a0 + 1 >= 0).
// Full blocks are never empty. Every block below the returned end is full.
template <int LN>
__device__ __forceinline__ int fp8w_full_run_end(const MaskView& mask, int m0, int m1) {
  if (m1 > mask.len_q) return 0;
  const int inside = mask.len_k / LN;
  if (mask.kind == kMaskNone) return inside;
  if (mask.kind == kMaskCausal) {
    const int a1 = m0 + mask.offset + 1;  // a0 + 1
    return a1 <= 0 ? 0 : imin(inside, a1 / LN);
  }
  return 0;
}

__device__ __forceinline__ float fp8w_descale(const float* d, int64_t st_n, int64_t st_h, int n, int hk) {
  return d[static_cast<int64_t>(n) * st_n + static_cast<int64_t>(hk) * st_h];
}

// Tile t of the grid: t = head * (num_seqs * num_m_blocks) + seq * num_m_blocks + r, row block
// num_m_blocks - 1 - r (heaviest first under a causal mask); consecutive CTAs share the head (K / V
// stay in L2).
struct Fp8wTile {
  int seq, m0, h, hk, num_nb;
  SequenceView sv;
  MaskView mask;
};
__device__ __forceinline__ Fp8wTile fp8w_tile(const AttentionKernelParams& p, int num_m_blocks, int64_t t) {
  Fp8wTile w;
  const int64_t per_head = static_cast<int64_t>(p.num_seqs) * num_m_blocks;
  w.h = static_cast<int>(t / per_head);
  const int64_t x = t % per_head;
  w.seq = static_cast<int>(x / num_m_blocks);
  w.m0 = (num_m_blocks - 1 - static_cast<int>(x % num_m_blocks)) * 128;
  w.hk = w.h / (p.heads_q / p.heads_k);
  w.sv = sequence_view(p, w.seq);
  w.mask = mask_view(p, w.sv, w.seq);
  w.num_nb = (w.sv.len_k + 127) / 128;
  return w;
}

// kPingpong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and 2, as
// the bf16 kernel's variant), so one's softmax runs while the other's products occupy the tensor
// cores. Each warpgroup waits for its turn (bar.sync on its own barrier: its 128 threads plus the
// other's 128 arrivals) before issuing and hands the turn over (bar.arrive on the other's) after;
// warpgroup 1 goes first: warpgroup 2 arrives on barrier 1 once at the start and skips its last
// hand-over, so every barrier generation completes. The D = 256 chunks after the first are issued
// outside the turns.
// kSchedule: see Fp8wForwardConfig; kSerial with kPingpong is FA3's inter-warpgroup schedule alone.
// kLean (session 5; default true): the consumer loop's instruction count cut (descriptors built once
// and advanced by fp8w_desc_add, full key blocks stepped through without classify, ring slot and
// phase kept incrementally, max / sum chains without -inf / 0 starts); the same products, schedule
// and numerics. false: session 4's instruction stream, for timing both.
// kEarlyTest (session 12; kEarlyS only): the loop top's two data waits (K of the next block, V of
// this one) and the next block's lookup move a round ahead. ncu of run 12.1 (hd 128 default): the
// branches after the two SYNCS try_waits hold ~3.5 % of the consumer warps' stall samples (long
// scoreboard: the SYNCS round trip, though the data is there), the loop's exit test on the next
// block another ~1.3 % (uniform-datapath latency), all on the warp's path from its pack to its next
// S. Here, once S(j+1) is in, the round also finds block j+2 and tests (mbarrier test_wait, which
// never waits) whether K(j+2) and V(j+1) are in; the next round waits only where a test said no.
// kIntMax (session 13; kLean, 128-key blocks): full tiles of the short path take their row max from
// the scores' bit patterns with 3-input integer maxima (fp8w_block_max_bits: 16 instead of 31
// instructions per thread and row) where every running max of the warp is >= 0 (one vote per block,
// before the softmax: fp8w_int_max_ok), the float tree otherwise (the first block, and rows whose
// scores were all negative so far). Same numerics (the new max is the same number; see
// fp8w_block_max_bits).
template <int D, bool kPingpong, int kSchedule = kOverlap, bool kLean = true, bool kEarlyTest = false,
          bool kIntMax = false>
__global__ void __launch_bounds__(384, 1)
    fp8_attention_forward_wgmma_kernel(const __grid_constant__ CUtensorMap map_q,
                                       const __grid_constant__ CUtensorMap map_k,
                                       const __grid_constant__ CUtensorMap map_vt, const Fp8KernelParams fp,
                                       const Fp8wMapAxes axes, int num_m_blocks) {
  using Cfg = Fp8wForwardConfig<D, kSchedule>;
  constexpr bool kOne = kSchedule == kOneLevel;
  constexpr bool kPipe = Cfg::kPvBuffers == 2;
  constexpr bool kEarly = kSchedule == kEarlyS;
  static_assert(!kEarly || (Cfg::kSub == 1 && Cfg::kPvChunks == 1), "kEarlyS: D = 64 / 128 (one P V chunk per block)");
  static_assert(!kEarlyTest || (kEarly && !kPingpong && kLean), "kEarlyTest: the kEarlyS schedule without ping-pong");
  static_assert(!kIntMax || (kLean && Cfg::kBlockN == 128),
                "kIntMax: the lean stream's softmax over 128-key blocks");
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, LN = Cfg::kLoadN, BN = Cfg::kBlockN, SUB = Cfg::kSub, ST = Cfg::kStages;
  constexpr int NC = Cfg::kPvChunk, CH = Cfg::kPvChunks;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem0 = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = smem0;
  const uint32_t sK = sQ + Cfg::kQBytes;  // slot s at sK + s * kKBytes
  const uint32_t sVt = sK + ST * Cfg::kKBytes;
  const uint32_t bar_q_full = smem0 + Cfg::kBarrierOffset;
  const uint32_t bar_k_full = bar_q_full + 8, bar_v_full = bar_k_full + 8 * ST;
  const uint32_t bar_k_empty = bar_v_full + 8 * ST, bar_v_empty = bar_k_empty + 8 * ST;

  const int tid = threadIdx.x;
  if (tid == 0) {
    sm90::mbar_init(bar_q_full, 1);
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      sm90::mbar_init(bar_k_full + 8 * s, 1);
      sm90::mbar_init(bar_v_full + 8 * s, 1);
      sm90::mbar_init(bar_k_empty + 8 * s, 8);  // one arrival per consumer warp
      sm90::mbar_init(bar_v_empty + 8 * s, 8);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  const Fp8wTile w = fp8w_tile(p, num_m_blocks, blockIdx.x);
  if (w.m0 >= w.sv.len_q) return;  // varlen row blocks past a short sequence
  const int m0 = w.m0;
  const int warpgroup = tid / 128;

  if (warpgroup == 0) {
    // ---- producer ----
    sm90::regs_decrease<Cfg::kProducerRegs>();
    if (tid != 0) return;
    int cls = kTileEmpty;
    int nb = next_key_block<LN>(w.mask, 0, w.num_nb, m0, m0 + BM, cls);
    // Nothing to visit: the consumers write zeros without waiting, so nothing may be in flight.
    if (nb < 0) return;
    sm90::tma_prefetch_map(&map_q);
    sm90::tma_prefetch_map(&map_k);
    sm90::tma_prefetch_map(&map_vt);
    const int qb = static_cast<int>(w.sv.q_batch), kb = static_cast<int>(w.sv.k_batch);
    const int q_row = static_cast<int>(w.sv.q_row0) + m0, k_row0 = static_cast<int>(w.sv.k_row0);
    const int vt_c0 = static_cast<int>(vt_col0(p.cu_seqlens_k != nullptr, w.seq, p.seqlen_k, w.sv.k_row0));
    sm90::mbar_arrive_expect_tx(bar_q_full, Cfg::kQBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kPanels; ++c)
      fp8w_tma_tile(sQ + c * Cfg::kPanelBytes, &map_q, bar_q_full, axes.q_rows_inner, Cfg::kRowBytes * c, q_row,
                    w.h, qb);
    // kLean: the blocks below full_end follow each other without classify, as in the consumers.
    const int full_end = kLean ? fp8w_full_run_end<LN>(w.mask, m0, m0 + BM) : 0;
    for (int it = 0; nb >= 0; ++it) {
      const int slot = it % ST;
      const uint32_t phase = (it / ST) & 1;
      if (kLean && axes.producer_sleep)
        sm90::mbar_wait_suspend(bar_k_empty + 8 * slot, phase ^ 1);
      else
        sm90::mbar_wait(bar_k_empty + 8 * slot, phase ^ 1);
      sm90::mbar_arrive_expect_tx(bar_k_full + 8 * slot, Cfg::kKBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kPanels; ++c)
        fp8w_tma_tile(sK + slot * Cfg::kKBytes + c * Cfg::kPanelBytes, &map_k, bar_k_full + 8 * slot,
                      axes.k_rows_inner, Cfg::kRowBytes * c, k_row0 + nb * LN, w.hk, kb);
      if (kLean && axes.producer_sleep)
        sm90::mbar_wait_suspend(bar_v_empty + 8 * slot, phase ^ 1);
      else
        sm90::mbar_wait(bar_v_empty + 8 * slot, phase ^ 1);
      sm90::mbar_arrive_expect_tx(bar_v_full + 8 * slot, Cfg::kVtBytes);
      fp8w_tma_vt(sVt + slot * Cfg::kVtBytes, &map_vt, bar_v_full + 8 * slot, vt_c0 + nb * LN, w.hk);
      nb = nb + 1 < full_end ? nb + 1 : next_key_block<LN>(w.mask, nb + 1, w.num_nb, m0, m0 + BM, cls);
    }
    return;
  }

  // ---- consumers ----
  sm90::regs_increase<Cfg::kConsumerRegs>();
  // 64-row half of the tile. kLean: broadcast from lane 0 so that ptxas knows it is warp-uniform:
  // the Q descriptor derived from it then lives in uniform registers (session 4: a regular register
  // pair, IADD3 + MOV + 2 R2UR before every S wgmma).
  const int cw = kLean ? __shfl_sync(0xffffffffu, warpgroup - 1, 0) : warpgroup - 1;
  const int lane = tid & 31, warp_in_wg = (tid / 32) & 3;
  const int t4 = lane & 3;
  const int row_in_block = cw * 64 + warp_in_wg * 16 + (lane >> 2);  // this thread's first row; second +8
  const float qk_scale = fp8w_descale(fp.descale_q, fp.dq_st_n, fp.dq_st_h, w.seq, w.hk) *
                         fp8w_descale(fp.descale_k, fp.dk_st_n, fp.dk_st_h, w.seq, w.hk) * p.scale;
  const bool short_path_ok = p.softcap_method == kSoftcapOff && qk_scale > 0.f;
  // The class whose tiles take the short softmax: kTileFull when short_path_ok, else none (-1); one
  // compare per block instead of re-deriving short_path_ok (kLean; ptxas rematerializes the bool).
  const int full_short_cls = short_path_ok ? kTileFull : -1;
  auto wait_turn = [&] {
    if constexpr (kPingpong) {
      if (cw == 0)
        sm90::named_barrier_sync_id<1>(256);
      else
        sm90::named_barrier_sync_id<2>(256);
    }
  };
  auto pass_turn = [&](bool last) {
    if constexpr (kPingpong) {
      if (cw == 0)
        sm90::named_barrier_arrive_id<2>(256);
      else if (!last)
        sm90::named_barrier_arrive_id<1>(256);
    }
  };

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  float s[BN / 2];
  float ob[Cfg::kPvBuffers][kOne ? 1 : NC / 2];  // ob[b]: P V chunks c with c % kPvBuffers == b
  uint32_t pa[BN / 32][4];

  // kLean: the descriptors of this warpgroup's Q rows, of K slot 0 and of V^T slot 0 (uniform
  // registers), advanced by fp8w_desc_add (offsets in 16-byte units) to the operand each wgmma reads.
  constexpr int RB = Cfg::kRowBytes, SR = Cfg::kStepsPerRow;
  const uint64_t q_desc = fp8w_qk_desc<RB>(sQ + cw * 64 * RB);
  const uint64_t k_desc = fp8w_qk_desc<RB>(sK);
  const uint64_t vt_desc = sm90::smem_desc(sVt, 16, 1024);

  // S = Q K^T of sub-block `sub` of a slot, issued (not waited for). k32 step kk reads bytes
  // [32 (kk % SR), +32) of the rows of panel kk / SR, in Q and K alike.
  auto issue_qk = [&](int slot, int sub) {
    sm90::wgmma_fence();
    if constexpr (kLean) {
      // K slot `slot`, sub-block `sub`: rows sub BN .. sub BN + BN - 1 of the slot's 128-row panels.
      const uint64_t kd = fp8w_desc_add(k_desc, slot * (Cfg::kKBytes >> 4) + sub * (BN * RB >> 4));
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        const uint32_t step = ((kk / SR) * Cfg::kPanelBytes + (kk % SR) * 32) >> 4;
        sm90::wgmma_e4m3_ss<BN>(s, fp8w_desc_add(q_desc, step), fp8w_desc_add(kd, step), kk > 0);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        const uint32_t a = sQ + (kk / SR) * Cfg::kPanelBytes + cw * 64 * RB + (kk % SR) * 32;
        const uint32_t b = sK + slot * Cfg::kKBytes + (kk / SR) * Cfg::kPanelBytes + sub * BN * RB + (kk % SR) * 32;
        sm90::wgmma_e4m3_ss<BN>(s, fp8w_qk_desc<RB>(a), fp8w_qk_desc<RB>(b), kk > 0);
      }
    }
    sm90::wgmma_commit();
  };
  // ob = P8 (sub-block `sub`) V^T rows [NC c, NC (c + 1)), summed from zero; issued, not waited for.
  // V^T rows are head dims (128 bytes of keys each); the sub-block's k32 steps are 32-byte steps
  // along the row. kOneLevel: O += P8 V^T over all D columns.
  auto issue_pv = [&](int slot, int sub, int c) {
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 32; ++ks) {
      // V^T slot `slot`, rows (head dims) [NC c, NC (c + 1)) of 128 bytes, keys of k32 step
      // sub BN / 32 + ks at byte 32 (sub BN / 32 + ks) of each row.
      uint64_t vd;
      if constexpr (kLean) {
        vd = fp8w_desc_add(vt_desc, slot * (Cfg::kVtBytes >> 4) + c * (NC * 128 >> 4) + (sub * (BN / 32) + ks) * 2);
      } else {
        const uint32_t b = sVt + slot * Cfg::kVtBytes + c * NC * 128 + (sub * (BN / 32) + ks) * 32;
        vd = sm90::smem_desc(b, 16, 1024);
      }
      if constexpr (kOne)
        sm90::wgmma_e4m3_rs<D>(o, pa[ks], vd, 1);
      else
        sm90::wgmma_e4m3_rs<NC>(ob[c % Cfg::kPvBuffers], pa[ks], vd, ks > 0);
    }
    sm90::wgmma_commit();
  };
  // O chunk c = O chunk c * rescale + ob[c % kPvBuffers] (rows g: elements 0, 1; g + 8: 2, 3 of each
  // 8-column group).
  // kOneLevel: O (all of it) *= rescale, once its P V has left the tensor cores.
  auto fold = [&](int c, const float (&rs)[2]) {
    if constexpr (kOne) {
      sm90::pin_registers(o);
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[4 * i + 0] *= rs[0];
        o[4 * i + 1] *= rs[0];
        o[4 * i + 2] *= rs[1];
        o[4 * i + 3] *= rs[1];
      }
    } else {
      float(&acc)[NC / 2] = ob[c % Cfg::kPvBuffers];
      sm90::pin_registers(acc);
#pragma unroll
      for (int i = 0; i < NC / 8; ++i) {
        float* oc = o + c * (NC / 2) + 4 * i;
        oc[0] = fmaf(oc[0], rs[0], acc[4 * i + 0]);
        oc[1] = fmaf(oc[1], rs[0], acc[4 * i + 1]);
        oc[2] = fmaf(oc[2], rs[1], acc[4 * i + 2]);
        oc[3] = fmaf(oc[3], rs[1], acc[4 * i + 3]);
      }
    }
  };
  auto pin_p = [&] {
#pragma unroll
    for (int ks = 0; ks < BN / 32; ++ks) sm90::pin_words(pa[ks]);
  };
  // kPipe: chunks 0 and 1 of P(j) V(j) are in flight (issued in that order, after anything else
  // still pending is waited for by the caller's earlier waits); folds every chunk with rs, issuing
  // chunk c + 2 into the accumulator chunk c has just left. wgmma groups complete in issue order, so
  // with chunks c and c + 1 pending, wait_group 1 means chunk c is done.
  auto fold_chunks_pipelined = [&](int slot, int sub, const float (&rs)[2]) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (c + 1 < CH)
        sm90::wgmma_wait<1>();
      else
        sm90::wgmma_wait<0>();
      fold(c, rs);
      if (c + 2 < CH) issue_pv(slot, sub, c + 2);
    }
  };
  auto softmax = [&](float (&rescale)[2], int tile_cls, int block, int sub) {
    const int row0 = m0 + row_in_block, n0 = block * LN + sub * BN;
    if constexpr (kIntMax) {
      // Every running max of the warp >= 0 (after the first block, for scores of both signs).
      if (tile_cls == full_short_cls && fp8w_int_max_ok(row_max)) {
        fp8w_softmax_block<kFp8wFull, BN, true, true>(s, row_max, row_sum, rescale, p, qk_scale, w.mask, row0, n0,
                                                      t4);
        return;
      }
    }
    if (kLean ? tile_cls == full_short_cls : tile_cls == kTileFull && short_path_ok)
      fp8w_softmax_block<kFp8wFull, BN, kLean>(s, row_max, row_sum, rescale, p, qk_scale, w.mask, row0, n0, t4);
    else if (p.softcap_method == kSoftcapOff)
      fp8w_softmax_block<kFp8wMasked, BN, kLean>(s, row_max, row_sum, rescale, p, qk_scale, w.mask, row0, n0, t4);
    else
      fp8w_softmax_block<kFp8wSoftcap, BN, kLean>(s, row_max, row_sum, rescale, p, qk_scale, w.mask, row0, n0, t4);
  };

  // The key block after nb and its class; kLean: blocks below full_end by the closed form.
  const int full_end = kLean ? fp8w_full_run_end<LN>(w.mask, m0, m0 + BM) : 0;
  auto next_block = [&](int nb, int& next_cls) {
    if (kLean && nb + 1 < full_end) {
      next_cls = kTileFull;
      return nb + 1;
    }
    return next_key_block<LN>(w.mask, nb + 1, w.num_nb, m0, m0 + BM, next_cls);
  };
  // The overlapped schedules' first key block: Q and K(0) in, the turn order set up (ping-pong:
  // warpgroup 1 issues first; staggered start: warpgroup 2 waits, after its ping-pong arrival, which
  // warpgroup 1's first turn needs, until warpgroup 1 has packed its first P), S(0) issued and done.
  auto first_scores = [&]() {
    sm90::mbar_wait(bar_q_full, 0);
    sm90::mbar_wait(bar_k_full, 0);
    if constexpr (kPingpong)
      if (cw == 1) sm90::named_barrier_arrive_id<1>(256);
    if (axes.stagger && cw == 1) sm90::named_barrier_sync_id<3>(256);
    wait_turn();
    issue_qk(0, 0);
    pass_turn(false);
    sm90::wgmma_wait<0>();
    sm90::pin_registers(s);
  };
  int cls = kTileEmpty;
  int nb = next_key_block<LN>(w.mask, 0, w.num_nb, m0, m0 + BM, cls);
  if (Cfg::kSerialLike && nb >= 0) {
    // Per item: S, softmax, P V (its chunks in turn), each waited for before the next; O = O rescale
    // + ob with this item's own rescale. Turns (kPingpong): one for S, one for P V's first chunk.
    sm90::mbar_wait(bar_q_full, 0);
    if constexpr (kPingpong)
      if (cw == 1) sm90::named_barrier_arrive_id<1>(256);  // warpgroup 1 issues first
    // Staggered start (as in the overlapped schedules below): warpgroup 2 waits until warpgroup 1
    // has packed its first P; warpgroup 1 arrives once, after that pack.
    if (axes.stagger && cw == 1) sm90::named_barrier_sync_id<3>(256);
    bool stagger_arrive = axes.stagger && cw == 0;
    float rs[2];
    for (int it = 0;; ++it) {
      const int slot = it % ST;
      const uint32_t phase = (it / ST) & 1;
      int n_cls = kTileEmpty;
      const int n_nb = next_block(nb, n_cls);
#pragma unroll 1
      for (int sub = 0; sub < SUB; ++sub) {
        sm90::mbar_wait(bar_k_full + 8 * slot, phase);
        wait_turn();
        issue_qk(slot, sub);
        pass_turn(false);
        sm90::wgmma_wait<0>();
        sm90::pin_registers(s);
        if (sub == SUB - 1 && lane == 0) sm90::mbar_arrive(bar_k_empty + 8 * slot);
        softmax(rs, cls, nb, sub);
        fp8w_pack_p<BN>(s, pa);
        if (stagger_arrive) {
          sm90::named_barrier_arrive_id<3>(256);
          stagger_arrive = false;
        }
        sm90::mbar_wait(bar_v_full + 8 * slot, phase);
        wait_turn();
        issue_pv(slot, sub, 0);
        if constexpr (kPipe) issue_pv(slot, sub, 1);
        pass_turn(n_nb < 0 && sub == SUB - 1);
        if constexpr (kPipe) {
          fold_chunks_pipelined(slot, sub, rs);
        } else {
#pragma unroll
          for (int c = 0; c < CH; ++c) {
            if (c > 0) issue_pv(slot, sub, c);
            sm90::wgmma_wait<0>();
            fold(c, rs);
          }
        }
        pin_p();
        if (sub == SUB - 1 && lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
      }
      if (n_nb < 0) break;
      nb = n_nb;
      cls = n_cls;
    }
  } else if (kEarly && nb >= 0) {
    // kEarlyS (one item per key block, one P V chunk). Entering round j: P(j) packed in pa (its
    // rescale in rs_p), ob holds P(j-1) V(j-1), done but not folded (its rescale in rs_ob; zeros
    // with rescale 1 before the first round, so the first fold is a no-op on O = 0).
    int slot = 0;
    uint32_t phase = 0;
    first_scores();
    if (lane == 0) sm90::mbar_arrive(bar_k_empty);  // this warp is done with K(0)
    float rs_p[2], rs_ob[2] = {1.f, 1.f};
    softmax(rs_p, cls, nb, 0);  // O is zero: rs_p (0 or 1) multiplies zeros
    fp8w_pack_p<BN>(s, pa);
    if (axes.stagger && cw == 0) sm90::named_barrier_arrive_id<3>(256);
#pragma unroll
    for (int i = 0; i < NC / 2; ++i) ob[0][i] = 0.f;
    // kEarlyTest: the next round's block and class (found a round ahead), and whether its K and V
    // were in when tested.
    int e_nb = 0, e_cls = kTileEmpty;
    bool k_ready = false, v_ready = false;
    if constexpr (kEarlyTest) e_nb = next_block(nb, e_cls);
    for (;;) {
      int n_cls = kTileEmpty;
      int n_nb;
      if constexpr (kEarlyTest) {
        n_nb = e_nb;
        n_cls = e_cls;
      } else {
        n_nb = next_block(nb, n_cls);
      }
      if (n_nb < 0) break;
      const int n_slot = slot + 1 == ST ? 0 : slot + 1;
      const uint32_t n_phase = n_slot == 0 ? phase ^ 1u : phase;
      if (!kEarlyTest || !k_ready) sm90::mbar_wait(bar_k_full + 8 * n_slot, n_phase);
      wait_turn();
      issue_qk(n_slot, 0);
      // V(j) is long there; waiting for it here also ends the basic block, so that ptxas cannot
      // hoist the fold's FFMA between the QGMMA of S (it did: S's k steps 2-4 then waited for them).
      // (kEarlyTest: the branch around the wait ends it as well.)
      if (!kEarlyTest || !v_ready) sm90::mbar_wait(bar_v_full + 8 * slot, phase);
      fold(0, rs_ob);  // P(j-1) V(j-1), beside S(j+1) on the tensor cores
      issue_pv(slot, 0, 0);
      pass_turn(false);
      sm90::wgmma_wait<1>();  // S(j+1) done; P(j) V(j) may still run
      sm90::pin_registers(s);
      if (lane == 0) sm90::mbar_arrive(bar_k_empty + 8 * n_slot);
      // kEarlyTest: the round after this one, block e_nb (found here, beside the softmax).
      if constexpr (kEarlyTest) e_nb = next_block(n_nb, e_cls);
      float rs_n[2];
      softmax(rs_n, n_cls, n_nb, 0);
      sm90::wgmma_wait<0>();
      sm90::pin_registers(ob[0]);
      pin_p();  // the tensor cores read P(j) from these registers until now
      if (lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
      if constexpr (kEarlyTest) {
        // Whether K(j+2) (slot after n_slot) and V(j+1) (n_slot) are in, asked before the pack so that
        // the SYNCS round trip runs beside it; the next round's top only reads the answers.
        const int e_slot = n_slot + 1 == ST ? 0 : n_slot + 1;
        const uint32_t e_phase = e_slot == 0 ? n_phase ^ 1u : n_phase;
        // (Asked even when there is no block j+2: the answer is then never read, and no branch
        // around the test splits the block, which made ptxas read the first answer at once.)
        k_ready = sm90::mbar_test(bar_k_full + 8 * e_slot, e_phase);
        v_ready = sm90::mbar_test(bar_v_full + 8 * n_slot, n_phase);
      }
      fp8w_pack_p<BN>(s, pa);
      rs_ob[0] = rs_p[0];
      rs_ob[1] = rs_p[1];
      rs_p[0] = rs_n[0];
      rs_p[1] = rs_n[1];
      nb = n_nb;
      cls = n_cls;
      slot = n_slot;
      phase = n_phase;
    }
    // The last block: fold the one before it, then its own P V.
    fold(0, rs_ob);
    sm90::mbar_wait(bar_v_full + 8 * slot, phase);
    wait_turn();
    issue_pv(slot, 0, 0);
    pass_turn(true);
    sm90::wgmma_wait<0>();
    fold(0, rs_p);
    pin_p();
    if (lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
  } else if (nb >= 0) {
    // Items are (key block nb, sub-block sub); `it` counts key blocks (ring position) as the
    // producer does. Per item j (P(j) in registers, rescale(j) kept in rs_prev):
    //   issue S(j+1); issue P(j) V(j) chunk 0; wait for S(j+1); softmax(j+1) -> rs_next while chunk
    //   0 runs; wait; fold chunk 0 with rs_prev; the other chunks issued and folded in turn; pack
    //   P(j+1).
    // Ring position of the current item's key block: slot = it % ST, phase = (it / ST) & 1 (kLean:
    // advanced incrementally with the block; else recomputed from it, as session 4 did).
    int it = 0, sub = 0, slot = 0;
    uint32_t phase = 0;
    first_scores();
    if (SUB == 1 && lane == 0) sm90::mbar_arrive(bar_k_empty);  // this warp is done with K(0)
    float rs_prev[2], rs_next[2];
    softmax(rs_prev, cls, nb, 0);  // O is zero: rs_prev (0 or 1) multiplies zeros
    fp8w_pack_p<BN>(s, pa);
    if (axes.stagger && cw == 0) sm90::named_barrier_arrive_id<3>(256);

    for (;;) {
      // The next item: the next sub-block of this key block, or the next key block's first.
      int n_nb = nb, n_sub = sub + 1, n_it = it, n_cls = cls, n_slot = slot;
      uint32_t n_phase = phase;
      if (n_sub == SUB) {
        n_sub = 0;
        n_nb = next_block(nb, n_cls);
        n_it = it + 1;
        if (n_nb < 0) break;
        if constexpr (kLean) {
          n_slot = slot + 1 == ST ? 0 : slot + 1;
          n_phase = n_slot == 0 ? phase ^ 1u : phase;
        }
      }
      if constexpr (!kLean) {
        slot = it % ST;
        phase = (it / ST) & 1;
        n_slot = n_it % ST;
        n_phase = (n_it / ST) & 1;
      }
      sm90::mbar_wait(bar_k_full + 8 * n_slot, n_phase);
      sm90::mbar_wait(bar_v_full + 8 * slot, phase);
      wait_turn();
      issue_qk(n_slot, n_sub);
      issue_pv(slot, sub, 0);
      if constexpr (kPipe) issue_pv(slot, sub, 1);
      pass_turn(false);
      // S(j+1) done; P(j) V(j) (its first chunk, or kPipe's first two) may still run.
      if constexpr (kPipe)
        sm90::wgmma_wait<2>();
      else
        sm90::wgmma_wait<1>();
      sm90::pin_registers(s);
      if (n_sub == SUB - 1 && lane == 0) sm90::mbar_arrive(bar_k_empty + 8 * n_slot);
      softmax(rs_next, n_cls, n_nb, n_sub);
      if constexpr (kPipe) {
        fold_chunks_pipelined(slot, sub, rs_prev);
      } else {
        sm90::wgmma_wait<0>();
        // Two-level: O (in block j-1's max) * rescale(j) + P(j) V(j). One-level: O (P(j) V(j) added
        // in the tensor cores, in block j's max) * rescale(j+1), ready for P(j+1) V(j+1).
        fold(0, kOne ? rs_next : rs_prev);
#pragma unroll
        for (int c = 1; c < CH; ++c) {
          issue_pv(slot, sub, c);
          sm90::wgmma_wait<0>();
          fold(c, rs_prev);
        }
      }
      pin_p();  // the tensor cores read P(j) from these registers until now
      if (sub == SUB - 1 && lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
      rs_prev[0] = rs_next[0];
      rs_prev[1] = rs_next[1];
      fp8w_pack_p<BN>(s, pa);
      nb = n_nb;
      sub = n_sub;
      it = n_it;
      cls = n_cls;
      slot = n_slot;
      phase = n_phase;
    }
    // The last item's P V (its sub-block is the last of its key block).
    sm90::mbar_wait(bar_v_full + 8 * slot, phase);
    wait_turn();
    issue_pv(slot, sub, 0);
    if constexpr (kPipe) issue_pv(slot, sub, 1);
    pass_turn(true);
    if constexpr (kPipe) {
      fold_chunks_pipelined(slot, sub, rs_prev);
    } else {
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        if (c > 0) issue_pv(slot, sub, c);
        sm90::wgmma_wait<0>();
        if constexpr (kOne)
          sm90::pin_registers(o);  // the last block's P V: no rescale after it
        else
          fold(c, rs_prev);
      }
    }
    pin_p();
    if (lane == 0) sm90::mbar_arrive(bar_v_empty + 8 * slot);
  }

  // Epilogue: out = O descale_v / l (l = 448 sum p~, O = sum P8 v8); lse = (m + log2 l - log2 448)
  // ln 2; rows with l = 0 (nothing allowed) give 0 and -inf.
  const float dsv = fp8w_descale(fp.descale_v, fp.dv_st_n, fp.dv_st_h, w.seq, w.hk);
  const int64_t out_base = row_offset(p.out_st, w.sv.q_batch, w.sv.q_row0, m0, w.h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    const float inv = l > 0.f ? dsv / l : 0.f;
    const int i = row_in_block + 8 * r;
    if (m0 + i >= w.sv.len_q) continue;
    uint16_t* orow = static_cast<uint16_t*>(p.out) + out_base + static_cast<int64_t>(i) * p.out_st.row;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const float x0 = o[4 * dt + 2 * r] * inv, x1 = o[4 * dt + 2 * r + 1] * inv;
      const uint32_t packed =
          fp.out_bf16 ? ElementOps<__nv_bfloat16>::pack(x0, x1) : ElementOps<__half>::pack(x0, x1);
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t4) = packed;
    }
    if (p.lse != nullptr && t4 == 0) {
      const float lse = l > 0.f ? (row_max[r] + log2f(l) - fp8::kLog2E4m3Max) * kLn2 : -INFINITY;
      p.lse[w.sv.q_batch * p.lse_batch_stride + static_cast<int64_t>(w.h) * p.lse_head_stride +
            (w.sv.q_row0 + m0 + i) * p.lse_row_stride] = lse;
    }
  }
}

}  // namespace flashgrad::cuda_attn::fp8w
