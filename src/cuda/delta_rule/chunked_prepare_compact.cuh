// Chunked GDN stage 1 ("prepare"), blocks of 128 threads (4 warps) looping over (chunk, value head)
// items:
//   G = cumsum(g) inside the chunk,  M_ij = beta_i exp(G_i - G_j) k_i.k_j (i > j),
//   A = (I + M)^{-1},  w = A (beta exp(G) k),  u = A (beta v).
// Writes G, A (fp32), w (T) and u (fp32) to the intermediates (layouts: chunked_stages.h).
//
// The raw rows of k and v (exact in T) are copied to shared memory with cp.async; with the in-kernel
// L2 norm, k's row rstd is applied in fp32 outside the products:
//   k k^T:  M_ij = beta_i exp(G_i - G_j) rstd_i rstd_j (k_raw k_raw^T)_ij  (exact T products,
//           fp32 accumulation: A and B fragments by ldmatrix from k's rows);
//   w = (A diag(s)) k_raw with s_j = beta_j exp(G_j) rstd_j,  u = (A diag(beta)) v_raw:
//           the fp32 factor A diag(.) is the A operand, split into hi = T(x) and lo = T(x - hi) in
//           registers (two mmas), the raw rows the B operand (ldmatrix.trans), so w and u keep
//           ~fp32 accuracy before w's storage in T.
// The inverse: the diagonal 16 x 16 blocks one warp each, the rest on tensor cores in 3xTF32
// (invert_unit_lower64_tc).
//
// This compact form (session 8) replaced the session-6 kernel as stage 1 after run 9.1 (H200,
// 2026-11-30: 0.542 -> 0.316 ms per call at B8 T4096 H16 K=V=128, gradients within 5e-5 rel RMS of
// the old kernel's; the old kernel and a variant with the CUDA-core inverse, 0.385 ms, were then
// removed). It takes 74 KiB of shared memory at K = V = 128 instead of the old kernel's 106 KiB, so
// three blocks of 4 warps fit per SM instead of two, with fewer instructions and shared-memory
// round trips per item.
//
// What differs from the session-6 kernel (ncu, session 6: 29% issue active at 8 warps per SM,
// short-scoreboard stalls 27% on the shared loads of M's store and of the A operands' splits;
// executed instructions per item: copies 17%, M 22%, inverse 28%, w and u 29%):
//   - A is formed in the place of M (block row I of M is last read by the step that overwrites it
//     with A's; the diagonal blocks are read before they are overwritten) - one 17 KiB matrix less;
//   - one v tile instead of two: the next item's v rows are copied after this item's u (the last
//     reader), and land during the next item's k k^T and inverse; k keeps two stages (the next
//     item's rows arrive while this one computes, as before);
//   - the copies bump one row pointer per thread (rows_async) instead of forming a 64-bit offset
//     per 16-byte piece;
//   - k k^T by 16 x 16 blocks in strips balanced over the warps (rows by warp gave warp 3 four
//     blocks and warp 0 one), each block behind a warp-uniform branch (they were predicated off,
//     every warp issuing all four);
//   - M's store: each thread reads its two rows' factors once (G, beta rstd) and its columns'
//     (G, rstd) as float2, forms every element without branches (ex2.approx.ftz) and selects, writes
//     element pairs and skips the tiles right of its diagonal block (the inverse never reads them);
//     it was five scalar shared loads and a branch per element;
//   - the inverse: the diagonal blocks one warp each (invert_diagonal_blocks_by_warp), the rest on
//     tensor cores in 3xTF32 (invert_unit_lower64_tc) instead of CUDA-core block rows;
//   - w and u: each warp loads its five 16 x 16 tiles of A (WarpATiles: row blocks p, 3 - p) once
//     per product as float2 pairs and splits them into hi / lo once, then reuses the fragments for
//     every 32-column pass (w: K / 64 passes, u: V / 64); the old kernel reloaded and re-split the
//     tiles for each pass of u. The mmas run in the old order (kb ascending, hi then lo), so w and
//     u are the old sums of the same A.
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_mma_tf32.cuh"
#include "chunked_rows.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// G = inclusive prefix sum of g over the chunk's 64 rows, in registers (threads 0..63 call it, warps 0
// and 1 whole): x is g of row tid, x_low (warp 1) g of row tid - 32. Warp 0 scans rows 0..31; warp 1
// scans rows 32..63 and, by the same shuffles, rows 0..31, whose lane-31 sum is warp 0's total bit for
// bit, and adds it (the shared-memory form this replaced wrote the scans, and warp 1 added G[31]
// after a barrier: three barriers per item, and the first shuffle waited on a shared load; ncu, run
// 21.2: 7 % of the kernel's stall samples in that scan). Returns G of row tid.
__device__ __forceinline__ float chunk_cumsum64_rows(float x, float x_low) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, o), y_low = __shfl_up_sync(0xffffffffu, x_low, o);
    if (lane >= o) {
      x += y;
      x_low += y_low;
    }
  }
  const float low_total = __shfl_sync(0xffffffffu, x_low, 31);
  return threadIdx.x >= 32 ? x + low_total : x;
}

// view_rows_async (chunked_tiles.cuh) for 16-byte-copyable rows (vec) of P = width / 8 pieces with
// P a power of two <= 128: thread tid copies piece p = tid % P of rows tid / P + (128 / P) i, bumping
// its source pointer by 128 / P rows per step instead of forming every row's 64-bit offset (SASS:
// ~150 -> ~40 instructions per thread and 64 x 128 tile). Rows >= len are zero-filled (their copy
// reads nothing and points at row 0). Otherwise (not vec, or V = 192) view_rows_async.
template <typename T>
__device__ __forceinline__ void rows_async(const View& x, const ChunkInfo& ci, int64_t idx, int width, bool vec,
                                           T* dst, int ld) {
  const int P = width / 8;
  if (!vec || (P & (P - 1)) != 0 || P > kChunkThreads) {
    view_rows_async<T, kChunkThreads>(x, ci, idx, width, vec, dst, ld);
    return;
  }
  const int tid = threadIdx.x, p = tid & (P - 1), r0 = tid / P, step = kChunkThreads / P;
  const T* row0 = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0, idx) + 8 * p;
  const T* src = row0 + r0 * x.s1;
  const int64_t bump = step * x.s1;
  for (int r = r0; r < kChunkSize; r += step, src += bump) {
    const bool ok = r < ci.len;
    mma::cp_async16(dst + r * ld + 8 * p, ok ? src : row0, ok);
  }
}

// Shared memory: A (M before the inverse), the inverse's scratch, the per-row arrays, k's raw rows
// twice (the next item's copies land while this one computes), v's raw rows once. K = V = 128:
// 17 + 5 + 1 + 34 + 17 = 74 KiB (three blocks per SM take 3 x 75 of the SM's 228 KiB).
template <typename T, int KMAX>
struct PrepareCompactSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDM = C + 4;
  static constexpr int64_t kKeyBytes = sizeof(T) * C * LDK, kMatBytes = sizeof(float) * C * LDM;
  static constexpr int LDX = 40;  // pitch of the tensor-core inverse's X (== 8 mod 32: conflict-free B fragments)
  static constexpr int kScratchFloats = 32 * LDX;
  static constexpr int64_t kFixedBytes = kMatBytes + sizeof(float) * (kScratchFloats + 4 * C) + 2 * kKeyBytes;
  static_assert(kFixedBytes % 16 == 0 && kKeyBytes % 16 == 0, "16-byte aligned tiles");
  float* A;     // [C][LDM] StrictLower(beta_i exp(G_i - G_j) k_i.k_j), then (I + M)^{-1} in place
  float* tmp;   // scratch: [32][LDX] X of invert_unit_lower64_tc
  float* G;     // [C]
  float* beta;  // [C] (0 past L)
  float* rstd;  // [C] k's row rstd (1 without the L2 norm)
  float* ws;    // [C] beta_j exp(G_j) rstd_j: w's column factor of A
  unsigned char* keys;  // 2 x [C][LDK] k rows, raw
  T* v;                 // [C][V + 8] v rows, raw

  __host__ __device__ static int ldv(int64_t V) { return static_cast<int>(V) + 8; }
  __host__ __device__ static int64_t bytes(int64_t V) { return kFixedBytes + sizeof(T) * C * ldv(V); }
  __device__ explicit PrepareCompactSmem(unsigned char* raw) {
    A = reinterpret_cast<float*>(raw);
    tmp = A + C * LDM;
    G = tmp + kScratchFloats;
    beta = G + C;
    rstd = beta + C;
    ws = rstd + C;
    keys = reinterpret_cast<unsigned char*>(ws + C);
    v = reinterpret_cast<T*>(keys + 2 * kKeyBytes);
  }
  __device__ T* k(int s) const { return reinterpret_cast<T*>(keys + s * kKeyBytes); }
};

// Column c of (I + Mb)^{-1} for the N x N unit-lower block Mb (strict lower part read; fp32 in
// shared memory, pitch LDM) by forward substitution in registers: x_i = [i == c] - sum_{m < i}
// Mb_im x_m (x_m = 0 for m < c).
template <int N, int LDM>
__device__ __forceinline__ void unit_lower_inverse_column(const float* Mb, int c, float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float acc = 0.f;
#pragma unroll
    for (int m = 0; m < i; ++m) acc = fmaf(Mb[i * LDM + m], x[m], acc);
    x[i] = i == c ? 1.f : -acc;
  }
}

// The diagonal 16 x 16 blocks D_I of A = (I + M)^{-1} in place of M's, one warp per block (warp I,
// rows and columns b = 16 I + [0, 16)), by the 2 x 2 formula on 8 x 8 halves:
//   D_I = [[d0, 0], [-d1 m10 d0, d1]],  d0, d1 = the inverses of the unit lower 8 x 8 diagonal halves,
// m10 = M's lower-left 8 x 8 of the block. Lanes 0 - 15 (half h = lane / 8, column c = lane % 8) run
// the forward substitution of d_h's column c in registers (lanes 16 - 31 repeat it, unused); then
// every lane forms two elements (row r = lane / 4, columns 2 (lane % 4) + {0, 1}) of Y = m10 d0, which
// goes over m10, and of -d1 Y, which goes over Y. Each warp reads and writes only its own block
// (__syncwarp between a read and the write over it); the threads also zero the six blocks above the
// diagonal (never part of M: its store skips them; A is stored whole). 28 + 16 + 16 FMAs per lane at
// most, against the 120 of a 16-row substitution by column on half the block's threads (the CUDA-core
// inverse's diagonal blocks, chunked_unit_lower_inverse.cuh). Ends with a barrier.
template <int LDM>
__device__ __forceinline__ void invert_diagonal_blocks_by_warp(float* As) {
  static_assert(LDM % 4 == 0, "float4 rows");
  const int tid = threadIdx.x, lane = tid & 31, b = 16 * (tid / 32);
#pragma unroll
  for (int i = 0; i < 3; ++i) {  // 6 blocks x 64 float4: e = tid + 128 i, blk = e / 64, q = e % 64
    const int blk = (tid >> 6) + 2 * i, q = tid & 63;  // blk: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    const int I = (blk >= 3) + (blk >= 5), J = blk + 1 - 2 * (blk >= 3) - (blk >= 5);
    *reinterpret_cast<float4*>(&As[(16 * I + (q >> 2)) * LDM + 16 * J + 4 * (q & 3)]) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float* D = As + b * LDM + b;  // the warp's block
  // d_h, column c: x_i = [i == c] - sum_{m < i} M_im x_m over the 8 x 8 half at (8 h, 8 h).
  const int h = (lane >> 3) & 1, c = lane & 7;
  float x[8];
  unit_lower_inverse_column<8, LDM>(D + 8 * h * LDM + 8 * h, c, x);
  __syncwarp();  // the diagonal halves of M are read
  if (lane < 16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      D[(8 * h + i) * LDM + 8 * h + c] = x[i];
      if (h == 0) D[i * LDM + 8 + c] = 0.f;  // D's upper-right 8 x 8
    }
  }
  __syncwarp();
  // Y[r][cc] = sum_{m < 8} m10[r][m] d0[m][cc] (d0's upper half is 0), cc = 2 (lane % 4) + {0, 1}.
  const int r = lane >> 2, c2 = 2 * (lane & 3);
  float y0 = 0.f, y1 = 0.f;
  {
    const float4 m_lo = *reinterpret_cast<const float4*>(D + (8 + r) * LDM);
    const float4 m_hi = *reinterpret_cast<const float4*>(D + (8 + r) * LDM + 4);
    const float mr[8] = {m_lo.x, m_lo.y, m_lo.z, m_lo.w, m_hi.x, m_hi.y, m_hi.z, m_hi.w};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float2 d = *reinterpret_cast<const float2*>(D + m * LDM + c2);
      y0 = fmaf(mr[m], d.x, y0);
      y1 = fmaf(mr[m], d.y, y1);
    }
  }
  __syncwarp();  // m10 is read: Y goes in its place
  *reinterpret_cast<float2*>(D + (8 + r) * LDM + c2) = make_float2(y0, y1);
  __syncwarp();
  // -d1 Y: row r of d1 (its upper half is 0) times Y's columns.
  float z0 = 0.f, z1 = 0.f;
  {
    const float4 d_lo = *reinterpret_cast<const float4*>(D + (8 + r) * LDM + 8);
    const float4 d_hi = *reinterpret_cast<const float4*>(D + (8 + r) * LDM + 12);
    const float dr[8] = {d_lo.x, d_lo.y, d_lo.z, d_lo.w, d_hi.x, d_hi.y, d_hi.z, d_hi.w};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float2 yv = *reinterpret_cast<const float2*>(D + (8 + m) * LDM + c2);
      z0 = fmaf(dr[m], yv.x, z0);
      z1 = fmaf(dr[m], yv.y, z1);
    }
  }
  __syncwarp();  // Y is read
  *reinterpret_cast<float2*>(D + (8 + r) * LDM + c2) = make_float2(-z0, -z1);
  __syncthreads();
}

// 3xTF32 products for the tensor-core inverse (mma.m16n8k8 .tf32; layouts in chunked_mma_tf32.cuh):
// an fp32 operand x is split into hi = tf32(x) and lo = tf32(x - hi), and a b is summed as
// lo_a hi_b + hi_a lo_b + hi_a hi_b (the small terms first; lo_a lo_b, ~2^-22 relative, dropped),
// so each product keeps ~21 of fp32's 24 bits instead of tf32's 11.
namespace tc3 {
// tf32(x) for finite x: round to nearest (ties away from zero) at 10 mantissa bits by integer
// arithmetic, as cvt.rna.tf32.f32 (and the emulator's model of it) does for finite values, in two
// instructions instead of cvt's NaN / inf checks (ptxas: ~5 per conversion). Operands here are
// finite (the inverse of a unit lower triangular matrix with finite entries).
__device__ __forceinline__ uint32_t round_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  hi = round_tf32(x);
  lo = round_tf32(x - __uint_as_float(hi));  // x - hi is exact
}
// A fragment (16 x 8) of the fp32 row-major X at rows r0 + [0, 16), columns k0 + [0, 8), by one
// ldmatrix .x4: an 8 x 8 tile of 16-bit elements is an 8 x 4 tile of fp32, and lane l's register m
// is tile m's row l / 4, 32-bit column l % 4 - the tf32 A layout (a0 = (g, t), a1 = (g + 8, t),
// a2 = (g, t + 4), a3 = (g + 8, t + 4)) for tiles (rows +0, cols +0), (+8, +0), (+0, +4), (+8, +4).
// Rows 16-byte aligned (ld % 4 == 0, k0 % 4 == 0).
__device__ __forceinline__ void frag_a(const float* X, int ld, int r0, int k0, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const int lane = threadIdx.x & 31;
  uint32_t r[4];
  mma::ldmatrix_x4<false>(r, X + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + k0 + 4 * (lane >> 4));
#pragma unroll
  for (int i = 0; i < 4; ++i) split(__uint_as_float(r[i]), hi[i], lo[i]);
}
// B fragment (8 x 8) of the fp32 row-major Y at rows k0 + [0, 8), columns n0 + [0, 8):
// b0 = Y[k0 + t][n0 + g], b1 = Y[k0 + t + 4][n0 + g].
__device__ __forceinline__ void frag_b(const float* Y, int ld, int k0, int n0, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const int g = mma::grp(), t = mma::tig();
  split(Y[(k0 + t) * ld + n0 + g], hi[0], lo[0]);
  split(Y[(k0 + t + 4) * ld + n0 + g], hi[1], lo[1]);
}
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                    const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  mma::mma1688_tf32(d, al, bh);
  mma::mma1688_tf32(d, ah, bl);
  mma::mma1688_tf32(d, ah, bh);
}
// dst[(r0 + g (+ 8)) * ld + n0 + 2 t + {0, 1}] = f * acc (the C layout), as float2 pairs.
__device__ __forceinline__ void store_acc(float* dst, int ld, int r0, int n0, const float (&acc)[4], float f) {
  const int g = mma::grp(), t = mma::tig();
  *reinterpret_cast<float2*>(dst + (r0 + g) * ld + n0 + 2 * t) = make_float2(f * acc[0], f * acc[1]);
  *reinterpret_cast<float2*>(dst + (r0 + g + 8) * ld + n0 + 2 * t) = make_float2(f * acc[2], f * acc[3]);
}
}  // namespace tc3

// A = (I + M)^{-1} in place of the 64 x 64 strictly lower M (fp32 in shared memory, pitch
// LDM % 4 == 0; 128 threads), the off-diagonal blocks on tensor cores (3xTF32, tc3) by the 2 x 2
// block formula (I + M)^{-1} = [[A11, 0], [-A22 M21 A11, A22]] on 32 x 32 halves, each half's
// inverse by the same formula on 16 x 16 blocks (D_I = the diagonal blocks):
//   1. D_0 .. D_3 (invert_diagonal_blocks_by_warp: one warp each; the warps also zero the upper blocks);
//   2. A_10 = -D_1 (M_10 D_0) on warp 2 and A_32 = -D_3 (M_32 D_2) on warp 3 (Y = M D in X's rows
//      [0, 16) / [16, 32) as the second product's B operand; each warp is the only reader of its
//      M block, so it overwrites it after a __syncwarp);
//   3. X = M21 A11 (M's rows 32 - 63, columns 0 - 31; 32 x 32 into the scratch, pitch LDX);
//   4. A21 = -A22 X over M21 (whose reads ended at the barrier after step 3).
// Warp w takes rows 16 (w % 2) + [0, 16) of X and A21, column tiles j0 = w / 2 and j1 = 2 + w / 2
// (8 columns each); every product skips the k-steps of zero blocks (A11's column tile j has
// nonzeros in rows >= 8 j only; A22's row block R in columns < 16 R + 16 only). Four barriers, the
// diagonal blocks' one included (the CUDA-core inverse, invert_unit_lower64_blocked: seven). Ends
// with a barrier.
template <int LDM, int LDX>
__device__ __forceinline__ void invert_unit_lower64_tc(float* As, float* X) {
  static_assert(LDX % 4 == 0 && LDX % 32 == 8, "16-byte rows; conflict-free B fragments");
  const int wp = threadIdx.x / 32;
  invert_diagonal_blocks_by_warp<LDM>(As);
  uint32_t ah[4], al[4], bh[2], bl[2];
  if (wp >= 2) {
    // Step 2: A_{I+1,I} = -D_{I+1} (M_{I+1,I} D_I), I = 0 (warp 2) or 2 (warp 3).
    const int c = wp == 2 ? 0 : 32, r = c + 16;  // M_{I+1,I} at rows r + [0, 16), columns c + [0, 16)
    float* Y = X + (wp - 2) * 16 * LDX;          // [16][LDX], this warp's
    float y[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      tc3::frag_a(As, LDM, r, c + 8 * ks, ah, al);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (ks < j) continue;  // D_I's rows [0, 8) x columns [8, 16): zero
        tc3::frag_b(As, LDM, c + 8 * ks, c + 8 * j, bh, bl);
        tc3::mma(y[j], ah, al, bh, bl);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) tc3::store_acc(Y, LDX, 0, 8 * j, y[j], 1.f);
    __syncwarp();
    float z[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      tc3::frag_a(As, LDM, r, r + 8 * ks, ah, al);  // D_{I+1}
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        tc3::frag_b(Y, LDX, 8 * ks, 8 * j, bh, bl);
        tc3::mma(z[j], ah, al, bh, bl);
      }
    }
    __syncwarp();  // the warp's reads of M_{I+1,I} are done
#pragma unroll
    for (int j = 0; j < 2; ++j) tc3::store_acc(As, LDM, r, c + 8 * j, z[j], -1.f);
  }
  __syncthreads();
  // Step 3: X = M21 A11 (rows 16 R of X = M's rows 32 + 16 R), column tiles j0, j1.
  const int R = wp & 1, j0 = wp >> 1, j1 = 2 + (wp >> 1);
  {
    float x0[4] = {}, x1[4] = {};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks < j0) continue;  // j0 <= j1: the zero k-steps of both tiles
      tc3::frag_a(As, LDM, 32 + 16 * R, 8 * ks, ah, al);
      tc3::frag_b(As, LDM, 8 * ks, 8 * j0, bh, bl);
      tc3::mma(x0, ah, al, bh, bl);
      if (ks < j1) continue;
      tc3::frag_b(As, LDM, 8 * ks, 8 * j1, bh, bl);
      tc3::mma(x1, ah, al, bh, bl);
    }
    tc3::store_acc(X, LDX, 16 * R, 8 * j0, x0, 1.f);
    tc3::store_acc(X, LDX, 16 * R, 8 * j1, x1, 1.f);
  }
  __syncthreads();
  // Step 4: A21 = -A22 X: rows 32 + 16 R of A, k over A22's columns 32 + [0, 16 R + 16).
  {
    float z0[4] = {}, z1[4] = {};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks > 2 * R + 1) continue;  // R is warp-uniform
      tc3::frag_a(As, LDM, 32 + 16 * R, 32 + 8 * ks, ah, al);
      tc3::frag_b(X, LDX, 8 * ks, 8 * j0, bh, bl);
      tc3::mma(z0, ah, al, bh, bl);
      tc3::frag_b(X, LDX, 8 * ks, 8 * j1, bh, bl);
      tc3::mma(z1, ah, al, bh, bl);
    }
    tc3::store_acc(As, LDM, 32 + 16 * R, 8 * j0, z0, -1.f);
    tc3::store_acc(As, LDM, 32 + 16 * R, 8 * j1, z1, -1.f);
  }
  __syncthreads();
}

// The five 16 x 16 tiles of A a warp multiplies in w and u, as hi / lo A fragments of (A diag(s)).
// A is lower triangular by 16-blocks, so row block rb takes rb + 1 block products; warp wp takes row
// blocks p = wp / 2 and 3 - p (5 products either way) on its half of the output columns (with one
// block of rows per warp, the warp of row block 3 did four times the products of row block 0's, and
// every warp waited for it at the next barrier: ncu, session 6):
//   slot 0: (p, 0);  slots 1, 2, 3: (3 - p, 0), (3 - p, 1), (3 - p, 2);
//   slot 4: p = 0: (3, 3) (row block 3's diagonal), p = 1: (1, 1) (row block 1's diagonal).
// (Row block p = 0 takes only tile (0, 0); p = 1 takes (1, 0) and (1, 1); row block 3 - p takes
// 4 - p tiles: five in all either way.)
struct WarpATiles {
  uint32_t hi[5][4], lo[5][4];
};

template <typename T, int LDM>
__device__ __forceinline__ void split_warp_tiles(const float* As, const float* s, int p, WarpATiles& f) {
  const int g = mma::grp(), t = mma::tig();
  const int rbs[5] = {p, 3 - p, 3 - p, 3 - p, p == 0 ? 3 : 1}, kbs[5] = {0, 0, 1, 2, p == 0 ? 3 : 1};
#pragma unroll
  for (int n = 0; n < 5; ++n) {
    const int c0 = 16 * kbs[n] + 2 * t;  // this thread's columns c0, c0 + 1, c0 + 8, c0 + 9
    const float* x0 = As + (16 * rbs[n] + g) * LDM + c0;  // row g of the tile; x0 + 8 LDM: row g + 8
    const float2 a00 = *reinterpret_cast<const float2*>(x0), a01 = *reinterpret_cast<const float2*>(x0 + 8);
    const float2 a10 = *reinterpret_cast<const float2*>(x0 + 8 * LDM);
    const float2 a11 = *reinterpret_cast<const float2*>(x0 + 8 * LDM + 8);
    const float2 s0 = *reinterpret_cast<const float2*>(s + c0), s1 = *reinterpret_cast<const float2*>(s + c0 + 8);
    const float c_lo[4] = {a00.x, a00.y, a10.x, a10.y};  // accumulator-shaped: cols c0, c0 + 1
    const float c_hi[4] = {a01.x, a01.y, a11.x, a11.y};  // cols c0 + 8, c0 + 9
    const float f0[2] = {s0.x, s0.y}, f1[2] = {s1.x, s1.y};
    mma::acc_to_a_split<T>(c_lo, c_hi, f0, f1, f.hi[n], f.lo[n]);
  }
}

// acc[i][nt] += (A diag(s))[row block rb_i] Y[:, col0 + 8 nt + [0, 8)] for nt < 4 (rb_0 = p,
// rb_1 = 3 - p), from the warp's split tiles; Y row-major T (pitch ldy) by ldmatrix.trans, rows
// 16 kb + [0, 16) loaded once per kb for both row blocks. Per accumulator the mmas run in kb order,
// hi before lo.
template <typename T>
__device__ __forceinline__ void warp_tiles_times_cols(float (&acc)[2][4][4], const WarpATiles& f, int p, const T* Y,
                                                      int ldy, int col0) {
  const int lane = threadIdx.x & 31;
  const T* yrow = Y + (8 * ((lane >> 3) & 1) + (lane & 7)) * ldy + col0 + 8 * (lane >> 4);
  auto load_b = [&](int kb, uint32_t (&b)[2][4]) {
    mma::ldmatrix_x4<true>(b[0], yrow + 16 * kb * ldy);
    mma::ldmatrix_x4<true>(b[1], yrow + 16 * kb * ldy + 16);
  };
  auto product = [&](float (&c)[4][4], int n, const uint32_t (&b)[2][4]) {
    mma::mma_tiles<T, 2>(c, f.hi[n], b);
    mma::mma_tiles<T, 2>(c, f.lo[n], b);
  };
  uint32_t b[2][4];
  load_b(0, b);
  product(acc[0], 0, b);
  product(acc[1], 1, b);
  load_b(1, b);
  if (p == 1) product(acc[0], 4, b);  // (1, 1)
  product(acc[1], 2, b);
  load_b(2, b);
  product(acc[1], 3, b);
  if (p == 0) {  // p is warp-uniform
    load_b(3, b);
    product(acc[1], 4, b);  // (3, 3)
  }
}

// Each block loops over (chunk, value head) items blockIdx.x, + gridDim.x, ... (item = chunk * HV +
// value head). Copies in flight (cp.async groups, committed in this order, one group each even when
// empty, so that every wait below counts the same groups):
//   before the loop: k(first), v(first);  top of item n: k(n + 1);  end of item n: v(n + 1).
// So at the top of item n the groups k(n), v(n) are the newest two (wait<1>: k(n) is in), and
// before the inverse v(n), k(n + 1) are (wait<1>: v(n) is in).
template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads, 3) chunk_prepare_compact_kernel(ChunkedArgs a) {
  using S = PrepareCompactSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDM = S::LDM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const S sm(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, wp = tid / 32;
  const int ldv = S::ldv(a.V);
  const bool k_vec = key_rows_vectorizable(a.k), v_vec = key_rows_vectorizable(a.v);
  // The block's items (chunk c, value head hv) = (item / HV, item % HV) for item = blockIdx.x, +
  // gridDim.x, ...: carried from item to item by the grid's stride (step_c chunks and step_hv heads,
  // a carry when hv passes HV) instead of divided out per item. The 64-bit divisions (item / HV, item
  // % HV, hv / group, three places per item) were ~20 % of the copy-issue segments' instructions (ncu,
  // run 21.3: branchy division code in both).
  const int64_t HV = a.HV, step_c = gridDim.x / HV, step_hv = gridDim.x % HV;
  const int group = static_cast<int>(a.HV / a.H);
  struct Item {
    int64_t c, hv;
  };
  auto next_item = [&](Item it) {
    it.c += step_c;
    it.hv += step_hv;
    if (it.hv >= HV) {
      it.hv -= HV;
      ++it.c;
    }
    return it;
  };

  // item's k rows into stage s (one group), and the bits of g and beta of row tid (zeros past the
  // chunk's length) into gn, bn, and (warp 1) of g of row tid - 32 into gl, for the next item's scan;
  // without an item, an empty group. The bits are converted at the next item's top, not here (a
  // conversion next to its load made the warp wait for the load inside this call: ncu, run 21.2,
  // 4 % of the kernel's stall samples).
  auto issue_k = [&](Item it, int s, uint32_t& gn, uint32_t& bn, uint32_t& gl) {
    gn = bn = gl = 0u;
    if (it.c < a.num_chunks) {
      const int64_t hv = it.hv, head = static_cast<int>(hv) / group;
      const ChunkInfo ci = chunk_info(a, it.c);
      rows_async<T>(a.k, ci, head, KMAX, k_vec, sm.k(s), LDK);
      if (tid < ci.len) {
        const int64_t tok = ci.t0 + tid;
        bn = load_raw<T>(a.beta, off3(a.beta, ci.b, tok, hv));
        if (a.g.p) gn = load_raw<T>(a.g, off3(a.g, ci.b, tok, hv));
      }
      if (a.g.p && tid >= 32 && tid < C && tid - 32 < ci.len) gl = load_raw<T>(a.g, off3(a.g, ci.b, ci.t0 + tid - 32, hv));
    }
    mma::cp_async_commit();
  };
  auto issue_v = [&](Item it) {
    if (it.c < a.num_chunks) {
      const ChunkInfo ci = chunk_info(a, it.c);
      rows_async<T>(a.v, ci, it.hv, static_cast<int>(a.V), v_vec, sm.v, ldv);
    }
    mma::cp_async_commit();
  };

  uint32_t gn = 0u, bn = 0u, gl = 0u;
  int s = 0;
  const Item first{blockIdx.x / HV, blockIdx.x % HV};
  issue_k(first, 0, gn, bn, gl);
  issue_v(first);
  for (Item cur = first; cur.c < a.num_chunks; cur = next_item(cur), s ^= 1) {
    const int64_t hv = cur.hv;
    const ChunkInfo ci = chunk_info(a, cur.c);
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    const T* ks = sm.k(s);

    // This item's G = cumsum(g), beta and k rows in place (the previous item is done: barrier at the
    // loop's end); then the next item's k copies into the other stage.
    float G_row = 0.f;
    if (tid < C) {
      G_row = chunk_cumsum64_rows(raw_to_f32<T>(a.g.f32, gn), raw_to_f32<T>(a.g.f32, gl));
      sm.G[tid] = G_row;
      sm.beta[tid] = raw_to_f32<T>(a.beta.f32, bn);
    }
    mma::cp_async_wait<1>();  // k(item) is in; v(item) may still be in flight
    __syncthreads();
    issue_k(next_item(cur), s ^ 1, gn, bn, gl);

    if (a.G && tid < L) a.G[(row0 + tid) * a.HV + hv] = G_row;
    {
      const float rstd = tile_row_rstd<T, KMAX, kChunkThreads>(ks, LDK, a.l2norm);
      constexpr int kLanes = kChunkThreads / C;
      if (tid % kLanes == 0) {
        const int j = tid / kLanes;
        sm.rstd[j] = rstd;
        sm.ws[j] = sm.beta[j] * expf(sm.G[j]) * rstd;  // beta = 0 past L
        // The state update's row scale for the serial stages (ChunkedArgs::colscale).
        if (a.colscale && j < L) a.colscale[(row0 + j) * a.HV + hv] = expf(sm.G[L - 1] - sm.G[j]) * rstd;
      }
    }
    __syncthreads();

    // M = StrictLower(beta_i exp(G_i - G_j) rstd_i rstd_j (k k^T)_ij) into A's place, by 16 x 16
    // blocks (rb, cb), cb <= rb (the blocks right of the diagonal are never read), in strips of nb
    // blocks (rb, cb0 .. cb0 + nb - 1) balanced over the warps with the inverse's work below (steps
    // 2 - 4 of invert_unit_lower64_tc put more on warps 2 - 3 and on odd warps):
    //   warp 0: (2, 0 - 2);  warp 1: (1, 0 - 1) and (0, 0);  warp 2: (3, 0 - 1);  warp 3: (3, 2 - 3).
    // (With rows by warp, warp 3 took four blocks and warp 0 one, and a block's warp w always runs
    // on SM sub-partition w, so every block's heaviest warp shared one sub-partition.) Each block
    // sits behind a warp-uniform branch: the session-6 loop predicated the blocks off, so every
    // warp issued all four blocks' ldmatrix / mma (SASS: ~360 instructions per warp).
    // Thread: rows i = 16 rb + g + 8 half, columns j = 16 cb0 + 8 nt + 2 t + {0, 1}.
    {
      const int g = mma::grp(), c2 = 2 * mma::tig();
      const int strips = wp == 1 ? 2 : 1;
      for (int st = 0; st < strips; ++st) {
        const int rb = wp == 0 ? 2 : (wp == 1 ? 1 - st : 3), cb0 = wp == 3 ? 2 : 0;
        const int nb = wp == 0 ? 3 : (wp == 1 && st == 1 ? 1 : 2);
        float acc[6][4] = {};
        const T* arow = ks + (16 * rb + (lane & 15)) * LDK + 8 * (lane >> 4);
        const T* brow = ks + (16 * cb0 + 8 * (lane >> 4) + (lane & 7)) * LDK + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int jb = 0; jb < 3; ++jb) {
          if (jb >= nb) break;  // warp-uniform
#pragma unroll
          for (int kk = 0; kk < KMAX / 16; ++kk) {
            uint32_t af[4], b[4];  // A: tiles (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8);
            mma::ldmatrix_x4<false>(af, arow + 16 * kk);  // B: k rows 16 (cb0 + jb) + [0, 16) as B^T,
            mma::ldmatrix_x4<false>(b, brow + 16 * jb * LDK + 16 * kk);  // column tiles 2 jb, 2 jb + 1
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma::mma16816<T>(acc[2 * jb], af, b0);
            mma::mma16816<T>(acc[2 * jb + 1], af, b1);
          }
        }
        float Gi[2], fi[2];
        bool live[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rb + g + 8 * half;
          Gi[half] = sm.G[i];
          fi[half] = sm.beta[i] * sm.rstd[i];
          live[half] = i < L;
        }
#pragma unroll
        for (int nt = 0; nt < 6; ++nt) {
          if (nt >= 2 * nb) break;  // warp-uniform
          const int j = 16 * cb0 + 8 * nt + c2;
          const float2 Gj = *reinterpret_cast<const float2*>(sm.G + j);
          const float2 rj = *reinterpret_cast<const float2*>(sm.rstd + j);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = 16 * rb + g + 8 * half;
            // Formed for every element and then selected (no branches): exp(G_i - G_j) is bounded by
            // 1 for i > j and g <= 0; where i <= j or i >= L it may be anything, even inf, and is dropped.
            const float v0 = fi[half] * rj.x * acc[nt][2 * half] * decay_exp_ftz(Gi[half] - Gj.x);
            const float v1 = fi[half] * rj.y * acc[nt][2 * half + 1] * decay_exp_ftz(Gi[half] - Gj.y);
            *reinterpret_cast<float2*>(sm.A + i * LDM + j) =
                make_float2(live[half] && i > j ? v0 : 0.f, live[half] && i > j + 1 ? v1 : 0.f);
          }
        }
      }
    }
    mma::cp_async_wait<1>();  // v(item) is in (k(item + grid) may still be in flight)
    __syncthreads();
    invert_unit_lower64_tc<LDM, S::LDX>(sm.A, sm.tmp);  // ends with a barrier

    // A to the intermediates (rows < L; columns >= L are 0 there), 16 bytes per store: thread tid
    // takes columns 4 q + [0, 4) (q = tid % 16) of rows tid / 16 + 8 i, i < 8 (a warp writes two
    // rows' 256 contiguous bytes per step; A's row (token row0 + r, head hv) starts at float
    // ((row0 + r) HV + hv) C, 256-byte aligned; sm.A's pitch LDM = 68 keeps the float4 reads
    // aligned and conflict-free). It was one float per store with the 64-bit index formed per
    // element: 88 instructions per 4 elements, a fifth of the backward launch's instructions (ncu,
    // run 21.3); the forward writes no A.
    if (a.A) {
      static_assert(LDM % 4 == 0 && C == 64 && kChunkThreads == 128, "A's 16-byte store pattern");
      const int q = tid & 15, r0 = tid >> 4;
      float* dst = a.A + ((row0 + r0) * HV + hv) * C + 4 * q;
      const int64_t step = 8 * HV * C;
#pragma unroll
      for (int i = 0; i < 8; ++i, dst += step) {
        const int r = r0 + 8 * i;
        if (r < L) *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(sm.A + r * LDM + 4 * q);
      }
    }

    // w = (A diag(ws)) k and u = (A diag(beta)) v, 64 columns per pass: warp wp writes row blocks
    // p, 3 - p (rows 16 rb + g, + 8) of columns c0 + 32 h + [0, 32).
    const int p = wp >> 1, h = wp & 1, g = mma::grp(), c2 = 2 * mma::tig();
    const int rows[2][2] = {{16 * p + g, 16 * p + g + 8}, {16 * (3 - p) + g, 16 * (3 - p) + g + 8}};
    WarpATiles f;
    split_warp_tiles<T, LDM>(sm.A, sm.ws, p, f);
    T* w = static_cast<T*>(a.w);
#pragma unroll
    for (int c0 = 0; c0 < KMAX; c0 += 64) {
      float acc[2][4][4] = {};
      warp_tiles_times_cols<T>(acc, f, p, ks, LDK, c0 + 32 * h);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = rows[i][half];
          if (row >= L) continue;
          T* wrow = w + ((row0 + row) * a.HV + hv) * a.K + c0 + 32 * h + c2;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            *reinterpret_cast<uint32_t*>(wrow + 8 * nt) =
                mma::pack_floats<T>(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
        }
    }
    // u (not wanted, a.u null, by a backward that reads a kept v_new: stage 2, u's reader, does not run).
    if (a.u) split_warp_tiles<T, LDM>(sm.A, sm.beta, p, f);
    for (int c0 = 0; a.u && c0 < a.V; c0 += 64) {
      float acc[2][4][4] = {};
      warp_tiles_times_cols<T>(acc, f, p, sm.v, ldv, c0 + 32 * h);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = rows[i][half];
          if (row >= L) continue;
          float* urow = a.u + ((row0 + row) * a.HV + hv) * a.V + c0 + 32 * h + c2;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            *reinterpret_cast<float2*>(urow + 8 * nt) = make_float2(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
        }
    }
    __syncthreads();  // A, G, beta, k's stage s and v are free for the next items
    issue_v(next_item(cur));
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
