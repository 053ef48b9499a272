// The dQ tile of the Hopper attention backwards (wgmma_backward_kernel.cuh, bf16 / fp16, and
// fp8_wgmma_backward_kernel.cuh, e4m3) on its way from the consumers' wgmma accumulators to the
// fp32 accumulator dq_accum [rows, Hq, D] in global memory:
//   1. each consumer thread stores its fragment into the shared staging tile (stage_dq_tile);
//   2. one thread of the reducer warp adds the whole tile to dq_accum with D / 32 TMA tensor
//      reductions (reduce_dq_tile; cp.reduce.async.bulk.tensor through the map of dq_accum_map.h).
// Why TMA tensor reductions: the per-row bulk reduction used before takes its addresses in uniform
// registers, so a warp issues its 32 rows one lane at a time; at hd 64 (128 rows per tile) the
// consumers then waited ~45% of their time for the staging buffer (ncu, H200).
//
// Staging layout (the map's box with its 128-byte swizzle): D / 32 boxes of [BM rows][32 floats],
// box b at byte b * BM * 128, row r at + r * 128, the 16-byte chunk c of a row (its floats
// 4c .. 4c + 3) at chunk c ^ (r % 8). Boxes start on 1024-byte boundaries (the swizzle atom).
// No inline PTX here: the FP8 kernel's host emulation compiles this file as it is.
#pragma once

#include <cstdint>

#include "wgmma_primitives.cuh"

namespace flashgrad::cuda_attn {

template <int BM>
struct DqStaging {
  static constexpr int kBoxBytes = BM * 128;  // one box: BM rows x 32 floats
  static constexpr int bytes(int head_dim) { return BM * head_dim * 4; }
};

// Stores a thread's kCols / 2 accumulator values of dQ (times `scale`) into the staging tile at
// shared address `stage` (1024-byte aligned). The accumulator layout is wgmma's m64nNk16
// D fragment: value 4 i + 2 r + c at row qrow + 8 r, column col0 + 8 i + 2 t + c, with
// qrow % 8 == g (qrow = 64-row panel + 16 warp + g). Column col = col0 + 8 i + 2 t sits in box
// col0 / 32 + i / 4 (col0 and kCols multiples of 32), chunk (col % 32) / 4 = 2 (i % 4) + t / 2,
// stored at chunk (2 (i % 4) + t / 2) ^ g = (2 (i % 4)) ^ ((t / 2) ^ g) (the two terms have
// disjoint bits), float 2 (t % 2) of the chunk. The lane's part of the offset is computed once and
// the i-dependent chunk bits XORed in (+ 1024 for r and whole boxes leave bits 4 - 6 alone). A warp
// store is 8 rows x 8 chunks: two wavefronts, the minimum for 256 bytes. Rows at or past rows_left
// (past the sequence: the box add lands on them, and they may be the next sequence's rows) get zeros.
template <int BM, int kCols>
__device__ __forceinline__ void stage_dq_tile(uint32_t stage, const float (&dq)[kCols / 2], int col0, int qrow, int g,
                                              int t, int rows_left, float scale) {
  static_assert(kCols % 32 == 0 || kCols == 32, "whole 32-column boxes");
  constexpr int kBox = DqStaging<BM>::kBoxBytes;
  const uint32_t lane_off = (col0 / 32) * kBox + qrow * 128 + (((t >> 1) ^ g) << 4) + (t & 1) * 8;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = qrow + 8 * r < rows_left;
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) {
      const uint32_t off = (lane_off + (i / 4) * kBox + r * 1024) ^ ((2 * (i % 4)) << 4);
      sm90::st_shared_v2_f32(stage + off, valid ? dq[4 * i + 2 * r] * scale : 0.f,
                             valid ? dq[4 * i + 2 * r + 1] * scale : 0.f);
    }
  }
}

// dq_accum[row .. row + BM - 1, head, 0 .. D - 1] += the staging tile at shared address sDq, then
// waits until TMA has read the tile (the caller may then hand the buffer back). One thread.
// Rows past dq_accum's extent are skipped by TMA.
template <int BM, int D>
__device__ __forceinline__ void reduce_dq_tile(const CUtensorMap* map, uint32_t sDq, int row, int head) {
#pragma unroll
  for (int b = 0; b < D / 32; ++b)
    sm90::tma_reduce_add_3d(map, sDq + b * DqStaging<BM>::kBoxBytes, 32 * b, head, row);
  sm90::bulk_commit();
  sm90::bulk_wait_read_all();
}

// Head dim 256 (the kernels' kSplitD): no room for a staging tile, so warpgroup cw (columns
// [128 cw, 128 cw + 128) of dQ) stages its half in the four 64-row panels of the tile's 16-bit Q / dO
// slot that only its own dK / dV products read: columns [0, 64) of the half (accumulator values
// 0 .. 31) in Q panels 2 cw, 2 cw + 1, columns [64, 128) (values 32 .. 63) in dO panels 2 cw, 2 cw + 1
// (one box per panel: kBoxBytes must be the panel size). Each consumer thread stages, fences and
// arrives on half_full[cw]; the reducer thread waits for both halves, adds them and then frees the
// slot itself.
template <int BM>
__device__ __forceinline__ void stage_dq_half_in_slot(uint32_t q_slot, uint32_t do_slot, const float (&dq)[64], int cw,
                                                      int qrow, int g, int t, int rows_left, float scale) {
  constexpr int kPanel = DqStaging<BM>::kBoxBytes;
  stage_dq_tile<BM, 64>(q_slot + 2 * cw * kPanel, *reinterpret_cast<const float(*)[32]>(dq), 0, qrow, g, t, rows_left,
                        scale);
  stage_dq_tile<BM, 64>(do_slot + 2 * cw * kPanel, *reinterpret_cast<const float(*)[32]>(dq + 32), 0, qrow, g, t,
                        rows_left, scale);
}

// The reducer's side (one thread): for cw = 0, 1, wait for half_full[cw] (8-byte mbarriers side by
// side, phase `parity`), then add its four boxes to dq_accum[row .., head, 128 cw + 32 b ..]; then
// wait until TMA has read them.
template <int BM>
__device__ __forceinline__ void reduce_dq_halves_in_slot(const CUtensorMap* map, uint32_t q_slot, uint32_t do_slot,
                                                         uint32_t bar_half_full, uint32_t parity, int row, int head) {
  constexpr int kPanel = DqStaging<BM>::kBoxBytes;
  for (int cw = 0; cw < 2; ++cw) {
    sm90::mbar_wait(bar_half_full + 8 * cw, parity);
#pragma unroll
    for (int b = 0; b < 4; ++b)
      sm90::tma_reduce_add_3d(map, (b < 2 ? q_slot : do_slot) + (2 * cw + b % 2) * kPanel, 128 * cw + 32 * b, head,
                              row);
  }
  sm90::bulk_commit();
  sm90::bulk_wait_read_all();
}

}  // namespace flashgrad::cuda_attn
