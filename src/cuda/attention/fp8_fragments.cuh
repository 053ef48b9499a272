// Index math of the FP8 (e4m3) attention kernels: the fragment layouts of
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, the swizzled shared-memory tiles of 8-bit
// rows that ldmatrix reads, the key order inside the transposed V copy, and packing P into an e4m3
// A fragment. Plain C++ with host-and-device functions, so that the CPU test
// tests/cpp/attention_fp8_fragments_test.cpp checks exactly what the kernels use.
//
// m16n8k32 with e4m3 inputs (PTX ISA, "Matrix Fragments for mma.m16n8k32"), g = lane / 4,
// t = lane % 4; each 32-bit register holds 4 e4m3 values, byte b (b = 0..3, lowest first) at
// column (A) / row (B) 4t + b:
//   A 16x32 (row-major): a0 = (row g, cols 4t..4t+3)   a1 = (g+8, 4t..)  a2 = (g, 16+4t..)  a3 = (g+8, 16+4t..)
//   B 32x8  (k x n):     b0 = (k 4t..4t+3, n g)         b1 = (k 16+4t.., n g)
//   C 16x8  (fp32):      c0,c1 = (g, 2t..2t+1)          c2,c3 = (g+8, 2t..2t+1)   (as m16n8k16)
// ldmatrix (b16) reading an 8x8 piece of 16-bit values gives lane l the two values at (row l / 4,
// 16-bit cols 2(l % 4), +1), i.e. bytes 4t..4t+3 of row g when the piece is 8 rows x 16 bytes of
// e4m3: exactly a0 / b0 above. So A and B fragments of operands stored with the reduction dim
// contiguous (Q, K, V, dO and the transposed V copy) load with plain, non-transposing ldmatrix.x4.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHGRAD_FP8_HD __host__ __device__ __forceinline__
#else
#define FLASHGRAD_FP8_HD inline
#endif

namespace flashgrad::cuda_attn::fp8 {

// The largest e4m3 value: P (<= 1) is stored as e4m3(P * 448) so that it uses the format's range.
constexpr float kE4m3Max = 448.0f;
constexpr float kLog2E4m3Max = 8.807354922057604f;  // log2(448) = 6 + log2(7)

// ---- m16n8k32 fragment ownership (documentation and the host test) ------------------------------
// Register r (0..3), byte b of lane `lane` of an A fragment holds A[row][col]:
FLASHGRAD_FP8_HD void a_element(int lane, int r, int b, int& row, int& col) {
  row = (lane >> 2) + 8 * (r & 1);
  col = 4 * (lane & 3) + b + 16 * (r >> 1);
}
// Register r (0..1), byte b of a B fragment holds B[k][n]:
FLASHGRAD_FP8_HD void b_element(int lane, int r, int b, int& k, int& n) {
  k = 4 * (lane & 3) + b + 16 * r;
  n = lane >> 2;
}
// Accumulator element e (0..3) holds C[row][col]:
FLASHGRAD_FP8_HD void c_element(int lane, int e, int& row, int& col) {
  row = (lane >> 2) + 8 * (e >> 1);
  col = 2 * (lane & 3) + (e & 1);
}

// ---- P as an A fragment: key order inside groups of 16 ------------------------------------------
// After S = Q K^T over 32 keys (four m16n8 accumulator tiles nt = 0..3), lane (g, t) holds for row
// g the keys 8 nt + 2t + {0, 1}. The k32 A fragment of P wants, in register a0, the four
// consecutive k positions 4t..4t+3. Rather than shuffle values between lanes, a0 takes the four
// values the lane already has from tiles nt = 0, 1:  positions 4t + i (i = 0..3) carry keys
//   key(4t + i) = 2t + (i & 1) + 8 (i >> 1)            (tile i >> 1, column 2t + (i & 1))
// and a2 those of tiles 2, 3 (positions 16 + 4t + i = keys 16 + key(4t + i)); a1 / a3 the same for
// row g + 8. P V sums over keys, so the product is unchanged when V's rows are stored in the same
// order: the transposed V copy keeps, at position p of every group of 16 keys, key key_at(p).
FLASHGRAD_FP8_HD int key_at_position(int p) {  // p in [0, 16)
  return 2 * (p >> 2) + (p & 1) + 8 * ((p >> 1) & 1);
}
FLASHGRAD_FP8_HD int position_of_key(int j) {  // j in [0, 16); inverse of key_at_position
  return 4 * ((j & 7) >> 1) + (j & 1) + 2 * (j >> 3);
}

// Byte i (i = 0..3) of an e4m3 register packed from four floats, lowest byte first.
#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  // cvt.rn.satfinite.e4m3x2.f32 d, a, b puts e4m3(a) in the upper byte of d, e4m3(b) in the lower.
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
#endif

// The A fragment of e4m3(scale * P) for the 32 keys of accumulator tiles s[0..3] (rows g, g + 8 of
// one 16-row tile). PackFn(x0, x1, x2, x3) -> uint32_t packs four floats (device: cvt; the host
// test: the host e4m3 converter), so kernel and test share this mapping. P8 = e4m3(448 P): scale =
// 448, or 1 when the values already are 448 P (the forward folds the factor into its exp2).
template <typename PackFn>
FLASHGRAD_FP8_HD void p_to_a_fragment(const float (&s0)[4], const float (&s1)[4], const float (&s2)[4],
                                      const float (&s3)[4], uint32_t (&a)[4], PackFn pack, float scale = kE4m3Max) {
  a[0] = pack(s0[0] * scale, s0[1] * scale, s1[0] * scale, s1[1] * scale);
  a[1] = pack(s0[2] * scale, s0[3] * scale, s1[2] * scale, s1[3] * scale);
  a[2] = pack(s2[0] * scale, s2[1] * scale, s3[0] * scale, s3[1] * scale);
  a[3] = pack(s2[2] * scale, s2[3] * scale, s3[2] * scale, s3[3] * scale);
}

// ---- the transposed V copy ------------------------------------------------------------------------
// vt [Hk, Dv, Tk_pad] e4m3: row (kv head hk, dim d) holds the keys of every sequence, sequence n's
// keys starting at column col0(n), key j of the sequence at column col0(n) + 16 (j / 16) +
// position_of_key(j % 16). Columns of a sequence between its length and the next multiple of
// kVtPadKeys are zero (the pre-pass writes them), so a tile of up to kVtPadKeys keys never reads
// another sequence's keys or uninitialized bytes.
//   padded (B sequences of Sk keys): col0(n) = n * round_up(Sk, 64), Tk_pad = B * round_up(Sk, 64)
//   varlen (cu_seqlens_k):           col0(n) = round_up(cu[n], 64) + 64 n, Tk_pad = round_up(Tk, 64) + 64 N
// Varlen: col0(n + 1) - col0(n) = round_up(cu[n+1], 64) - round_up(cu[n], 64) + 64 is a multiple of
// 64 that is >= len_n - 63 + 64, hence >= round_up(len_n, 64): sequences never overlap.
constexpr int kVtPadKeys = 64;
FLASHGRAD_FP8_HD int64_t round_up_keys(int64_t x) { return (x + kVtPadKeys - 1) / kVtPadKeys * kVtPadKeys; }
FLASHGRAD_FP8_HD int64_t vt_col0(bool varlen, int64_t n, int64_t seqlen_k, int64_t cu_k_n) {
  return varlen ? round_up_keys(cu_k_n) + kVtPadKeys * n : n * round_up_keys(seqlen_k);
}
FLASHGRAD_FP8_HD int64_t vt_columns(bool varlen, int64_t num_seqs, int64_t seqlen_k, int64_t total_k) {
  return varlen ? round_up_keys(total_k) + kVtPadKeys * num_seqs : num_seqs * round_up_keys(seqlen_k);
}

// ---- swizzled tiles of 8-bit rows -----------------------------------------------------------------
// A tile of rows of ROW_BYTES bytes (32, 64, 128 or 256), stored in 16-byte chunks. ldmatrix reads
// one chunk from each of 8 consecutive rows (row0 a multiple of 8); the 8 chunks must fall in 8
// different 16-byte bank groups of the 128-byte bank line. Rows of >= 128 bytes: chunk c of row r is
// stored at chunk c ^ (r % 8). Shorter rows pack R = 128 / ROW_BYTES rows per bank line, so rows r
// and r + R collide: chunk c is stored at c ^ ((r / R) % C), C = ROW_BYTES / 16 chunks per row.
// (32-byte rows: c ^ ((r / 4) % 2); 64-byte rows: c ^ ((r / 2) % 4).)
template <int ROW_BYTES>
FLASHGRAD_FP8_HD int swizzled_chunk(int row, int chunk) {
  static_assert(ROW_BYTES == 32 || ROW_BYTES == 64 || ROW_BYTES == 128 || ROW_BYTES == 256,
                "8-bit tiles have rows of 32, 64, 128 or 256 bytes");
  if constexpr (ROW_BYTES >= 128) {
    return chunk ^ (row & 7);
  } else {
    constexpr int kRowsPerLine = 128 / ROW_BYTES, kChunks = ROW_BYTES / 16;
    return chunk ^ ((row / kRowsPerLine) % kChunks);
  }
}
// Byte offset of (row, byte col) in the tile.
template <int ROW_BYTES>
FLASHGRAD_FP8_HD int swizzled_byte(int row, int col) {
  return row * ROW_BYTES + (swizzled_chunk<ROW_BYTES>(row, col >> 4) << 4) + (col & 15);
}

// Byte offset, in an 8-bit tile, of the row that lane `lane` addresses in an ldmatrix.x4 over the
// 16 rows x 32 bytes at (row0, col0) (row0 a multiple of 8, col0 of 16). Pieces (8 rows x 16 bytes)
// in the register order of the fragments they become:
//   rows_then_cols (A of a row-major operand): (+0, +0) (+8, +0) (+0, +16) (+8, +16) -> a0 a1 a2 a3
//   cols_then_rows (B of two n-tiles stored [n][k]): (+0, +0) (+0, +16) (+8, +0) (+8, +16)
//                                                   -> b0 b1 of n-tile 0, b0 b1 of n-tile 1
template <int ROW_BYTES>
FLASHGRAD_FP8_HD int ldmatrix_lane_byte(int lane, bool rows_then_cols, int row0, int col0) {
  const int piece = lane >> 3;
  const int dr = rows_then_cols ? (piece & 1) * 8 : (piece >> 1) * 8;
  const int dc = rows_then_cols ? (piece >> 1) * 16 : (piece & 1) * 16;
  return swizzled_byte<ROW_BYTES>(row0 + dr + (lane & 7), col0 + dc);
}

// ldmatrix_lane_byte with the lane-dependent part computed once (as LaneOffsets does for 16-bit
// tiles). For row0 % 8 == 0 the swizzle of row row0 + x equals that of row x (>= 128-byte rows:
// (row0 + x) % 8 = x % 8; 64-byte rows: (row0 / 2) % 4 = 0; 32-byte rows: (row0 / 4) % 2 = 0), and
// for col0 % 32 == 0 the XOR touches only the low 3 bits of the chunk index, i.e. the byte offset
// within the 128 bytes containing col0. So at(row0, col0) = row0 * ROW_BYTES + (col0 & ~127) +
// off[(col0 / 32) % 4], off[i] being the lane's offset for (0, 32 i).
template <int ROW_BYTES>
struct Fp8LaneOffsets {
  int off[4];
  FLASHGRAD_FP8_HD Fp8LaneOffsets(int lane, bool rows_then_cols) {
    for (int i = 0; i < 4; ++i)
      off[i] = 32 * i < ROW_BYTES ? ldmatrix_lane_byte<ROW_BYTES>(lane, rows_then_cols, 0, 32 * i) : 0;
  }
  FLASHGRAD_FP8_HD int at(int row0, int col0) const {
    return row0 * ROW_BYTES + (col0 & ~127) + off[(col0 >> 5) & 3];
  }
};

}  // namespace flashgrad::cuda_attn::fp8
