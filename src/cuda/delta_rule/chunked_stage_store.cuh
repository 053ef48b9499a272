// Stores of the chunk-entry states h_c by the warps that hold h^T in mma accumulators: stage 2
// (chunked_state.cuh) and the states rebuilt from v_new (chunked_state_from_vnew.cuh); and the fused
// forward's kept v_new (chunked_state.cuh), through the same kind of warp-private shared tile.
#pragma once

#include "chunked_mma_ldmatrix.cuh"  // pack_floats, stmatrix_x4_trans
#include "chunked_stages.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// h_c of chunk c (global chunk index), value head hv, into the intermediates: T when the backward
// asked for 16-bit storage (a.h16), else fp32 (a.h); layout [num_chunks, HV, K, V]. The warp's
// accumulator element e of tile nk is key channel kc0 + 8 nk + 2 tig + (e & 1) and value column
// col0 + vc0 + grp + 8 (e >> 1) (h^T's rows are value columns, so a lane holds no two neighbours
// of one of h's rows: one store per element).
template <typename T, int NK>
__device__ __forceinline__ void store_state_tiles(const ChunkedArgs& a, int64_t c, int64_t hv, int64_t col0, int vc0,
                                                  int kc0, int grp, int tig, const float (&hT)[NK][4]) {
  auto vcol = [&](int e) { return vc0 + grp + 8 * (e >> 1); };
  auto tcol = [&](int e) { return 2 * tig + (e & 1); };
  const int64_t at = (c * a.HV + hv) * a.K * a.V + col0;
  if (a.h16) {
    T* hc = static_cast<T*>(a.h16) + at;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = from_f<T>(hT[nk][e]);
  } else {
    float* hc = a.h + at;
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) hc[(kc0 + 8 * nk + tcol(e)) * a.V + vcol(e)] = hT[nk][e];
  }
}

// A warp's NT mma accumulator tiles acc[t] (16 x 8: element e at tile row grp + 8 (e >> 1), column
// 2 tig + (e & 1)), rounded to T and written transposed into `stage`: tile t's column b goes to stage
// row 8 t + b, its rows to positions [0, 16) (stage + r ld: 16 T per row, 16-byte aligned rows). Per
// pair of tiles one stmatrix .x4 .trans (matrices m = 2 (t % 2) + h: tile 2 i + m / 2, rows 8 h + [0, 8);
// lane l gives stored row 8 (2 i + m / 2) + l % 8 at position 8 h for m = l / 8) from one packed
// conversion per two elements: 3 instructions per pair of elements fewer than 2-byte shared stores
// (run 14.3's ncu: the fused forward's staged v_new cost it ~190 instructions per warp and chunk).
template <typename T, int NT>
__device__ __forceinline__ void stage_acc_tiles_transposed(const float (&acc)[NT][4], T* stage, int ld, int lane) {
  static_assert(NT % 2 == 0, "tiles in pairs (one stmatrix .x4 per pair)");
  const int m = lane >> 3;
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    uint32_t r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      r[q] = mma::pack_floats<T>(acc[2 * i + (q >> 1)][2 * (q & 1)], acc[2 * i + (q >> 1)][2 * (q & 1) + 1]);
    mma::stmatrix_x4_trans(r, stage + (8 * (2 * i + (m >> 1)) + (lane & 7)) * ld + 8 * (m & 1));
  }
}

// A warp's NK accumulator tiles of a state's transpose (h^T or dh^T: tile nk's element e at value column
// grp + 8 (e >> 1) of the warp's 16, key channel 8 nk + 2 tig + (e & 1) of its channels), rounded to T,
// to rows [0, 8 NK) of `at` (channel r at at + r pitch, 16 T per row; 16-byte aligned) through the
// warp-private tile `stage` ([8 NK][16] T): stmatrix (stage_acc_tiles_transposed), then 16-byte
// stores, piece p = lane + 32 i being row p / 2, columns 8 (p % 2) + [0, 8), so each row's 32 bytes
// go out together.
template <typename T, int NK>
__device__ __forceinline__ void store_channel_tiles_staged(T* at, int64_t pitch, int lane, const float (&acc)[NK][4],
                                                           T* stage) {
  static_assert(NK % 2 == 0, "whole 16-byte pieces per lane");
  __syncwarp();  // the previous reads of `stage` are done
  stage_acc_tiles_transposed<T, NK>(acc, stage, 16, lane);  // (session 14: was 2-byte shared stores)
  __syncwarp();
#pragma unroll
  for (int i = 0; i < NK / 2; ++i) {
    const int p = lane + 32 * i, r = p >> 1, half = p & 1;
    *reinterpret_cast<uint4*>(at + r * pitch + 8 * half) = *reinterpret_cast<const uint4*>(stage + r * 16 + 8 * half);
  }
}

// store_state_tiles for the 16-bit states through a warp-private shared tile (session 13; the states
// from v_new, chunked_state_from_vnew.cuh): run 13.3's ncu put that kernel at 65% of L2 throughput
// with its 2-byte scattered stores (each warp store instruction writes four 16-byte pieces of four
// rows, half sectors). Here the warp's 8 NK channels x 16 columns (channels kc0 + [0, 8 NK)) go out by
// store_channel_tiles_staged (a whole sector of h_c's row per 32 bytes). fp32 states (a.h) take
// store_state_tiles.
template <typename T, int NK>
__device__ __forceinline__ void store_state_tiles_staged(const ChunkedArgs& a, int64_t c, int64_t hv, int64_t col0,
                                                         int vc0, int kc0, int lane, const float (&hT)[NK][4],
                                                         T* stage) {
  if (!a.h16) {
    const int grp = lane >> 2, tig = lane & 3;
    store_state_tiles<T, NK>(a, c, hv, col0, vc0, kc0, grp, tig, hT);
    return;
  }
  store_channel_tiles_staged<T, NK>(static_cast<T*>(a.h16) + (c * a.HV + hv) * a.K * a.V + kc0 * a.V + col0 + vc0,
                                    a.V, lane, hT, stage);
}

// A warp's NT accumulator tiles of 8 rows each, transposed as the chains hold v_new^T and o^T
// (accumulator p[j8][e]: row 8 j8 + 2 tig + (e & 1), value column grp + 8 (e >> 1) of the warp's 16),
// to rows [0, min(len, 8 NT)) of `at` (row r at at + r pitch, 16 T per row), through the warp-private
// shared tile `stage` (row r at stage + r ld, 16 T; 16-byte aligned rows): one chunk's v_new (NT = 8:
// the fused forward, B1's dv_new) or a quarter of the fused forward's o (NT = 2, session 22: it was
// stored one element at a time, ~20 instructions of 64-bit index arithmetic each, ~650 of the kernel's
// ~2770 per warp and chunk). store_acc_rows writes each element alone (2-byte stores, four 16-byte half sectors
// per instruction); here stmatrix into shared memory (stage_acc_tiles_transposed: the accumulators'
// columns are v_new's rows), then 16-byte global stores: per instruction 16 rows' whole 32-byte
// pieces (session 14; the fused forward's kept v_new cost it +0.04 ms at B8 T4096, run 13.6).
// Piece q = lane + 32 i (i < NT / 2): sub = q % 8, g = q / 8; row 8 (g / 2) + 2 (sub / 2) + g % 2,
// half sub % 2 (columns 8 half + [0, 8)): the 8 lanes of a quarter warp read rows r, r + 2, r + 4,
// r + 6, which with ld = 264 (132 words, 4 banks per row) cover 32 distinct banks; each stmatrix
// matrix's 8 rows x 16 bytes (4 banks apart) are conflict-free too.
// `at` must be 16-byte aligned (the caller checks; store_acc_rows otherwise).
template <typename T, int NT>
__device__ __forceinline__ void store_acc_rows_staged(T* at, int64_t pitch, int len, int lane, const float (&p)[NT][4],
                                                      T* stage, int ld) {
  static_assert(NT % 2 == 0, "whole 16-byte pieces per lane");
  __syncwarp();  // every lane is done reading what `stage` held (the caller's operand there)
  stage_acc_tiles_transposed<T, NT>(p, stage, ld, lane);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    const int q = lane + 32 * i, sub = q & 7, g = q >> 3;
    const int r = 8 * (g >> 1) + 2 * (sub >> 1) + (g & 1), half = sub & 1;
    if (r < len)
      *reinterpret_cast<uint4*>(at + r * pitch + 8 * half) = *reinterpret_cast<const uint4*>(stage + r * ld + 8 * half);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
