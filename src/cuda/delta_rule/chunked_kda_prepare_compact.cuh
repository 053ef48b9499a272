// KDA chunked stage 1 ("prepare"), compact variant (session 7; its session-13 form kVar = 4 the
// default since run 13.3, kVar = 0 the session-7 form, =s7): the outputs of
// kda_prepare_kernel (chunked_kda_prepare.cuh: G, A with P^T packed into its upper triangle, w, u)
// in 107 KiB of shared memory at K = 128 instead of 203 KiB, so that two blocks (8 warps) share an
// SM. (ncu of the wide kernel, session 6: 4 warps per SM, issue active 15%, most cycles waiting on
// global loads and on dependent instructions that no other warp could cover.)
//
// Phases of one block (128 threads, one (chunk, value head)), barriers between them:
//   1. q, k rows by cp.async as their 16-bit input values, in flight while beta and the gate load;
//      the gate summed per channel in registers (kda_cumulative_gate_registers); per row the L2-norm
//      factors of q and k and M's factor beta * rstd_k.
//   2. M = diag(beta) [K K^T decayed] (strict lower) and P = [Q K^T decayed] (P^T in the upper
//      triangle) from the raw values, the row factors applied to the totals:
//      in-half pairs of the diagonal blocks in fp32 (kda_decayed_in_half_lanes), the quadrants
//      between the halves (kda_decayed_quadrant_pairs) and the off-diagonal tiles
//      (kda_decayed_offdiag_registers) on tensor cores, fragments formed in registers.
//   3. A = (I + M)^{-1} (the blocked CUDA-core inverse); v's first 64 columns load meanwhile.
//   4. A (and P) to the intermediate; A's 16-bit hi / lo copies over q; w's operand
//      beta e^G o k over M / A / tmp; w = A (beta e^G o k) and u = A (beta v), balanced over the
//      warps (lower_times_split_balanced), the beta v pieces over G.
// FLASHGRAD_CHUNKED_KDA_PREPARE=old selects the wide kernel, =s7 this kernel's session-7 form
// (chunked_kda_launch_impl.cuh), for the same-process comparison.
#pragma once

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"
#include "chunked_kda_prepare_v2.cuh"  // stage1_exp, kda_decayed_in_half_pairs16 (=v2)
#include "chunked_unit_lower_inverse.cuh"  // invert_unit_lower64_blocked
#include "chunked_tiles.cuh"    // key_tile_async, tile_row_rstd

namespace flashgrad::cuda_detail::delta_rule {

// Regions (bytes at K = 128, T 16-bit): G 34816 | k 17408 | q 18432 | M 17408 | A 17408 | tmp 3072
// | rstd 768 | beta 256 = 109568 (107 KiB; two blocks need <= 113 KiB each).
//   k, q: [C][LDK] input values (rows past L zero); rstd[0][r] k's, rstd[1][r] q's L2-norm factor,
//   rstd[2][r] = beta_r rstd[0][r] (M's row factor: M = diag(beta) K K^T decayed; 0 past L).
//   q's region later holds a_hi, a_lo ([C][LDA] each, after the decayed products);
//   M .. tmp later hold wb, wb_lo ([C][LDK] each: beta exp(G) o k, after A is stored);
//   G later holds ub, ub_lo ([C][LDU] each: beta v, after wb is formed).
// LDG = KMAX + 8: the fragment loads read G as float2 at (row g, columns 2 t..) of a lane (g, t),
// conflict-free with a pitch of 8 mod 32 words.
template <typename T, int KMAX>
struct KdaPrepareCompactSmem {
  static constexpr int C = kChunkSize, LDG = KMAX + 8, LDK = KMAX + 8, LDM = C + 4, LDA = C + 8, LDU = 64 + 8;
  static constexpr int64_t kGBytes = sizeof(float) * C * LDG;
  static constexpr int64_t kKBytes = sizeof(T) * C * LDK;
  static constexpr int64_t kQBytes = kKBytes > 2 * sizeof(T) * C * LDA ? kKBytes : 2 * sizeof(T) * C * LDA;
  static constexpr int64_t kMBytes = sizeof(float) * C * LDM;
  static constexpr int64_t kTmpBytes = sizeof(float) * 16 * 48;
  static_assert(2 * sizeof(T) * C * LDK <= 2 * kMBytes + kTmpBytes, "wb, wb_lo fit over M, A and tmp");
  static_assert(2 * sizeof(T) * C * LDU <= kGBytes, "ub, ub_lo fit over G");
  static_assert(kGBytes % 16 == 0 && kKBytes % 16 == 0 && kQBytes % 16 == 0 && kMBytes % 16 == 0, "16-byte regions");
  float* G;       // [C][LDG]
  T* k;           // [C][LDK]
  T* q;           // [C][LDK]
  float* M;       // [C][LDM] M (strict lower triangle), P^T (upper triangle and diagonal)
  float* A;       // [C][LDM]
  float* tmp;     // [16][48] (the inverse's scratch)
  float* rstd;    // [3][C]
  float* beta;    // [C]
  T *a_hi, *a_lo;  // over q
  T *wb, *wb_lo;   // over M, A, tmp
  T *ub, *ub_lo;   // over G
  static constexpr int64_t bytes() {
    return kGBytes + kKBytes + kQBytes + 2 * kMBytes + kTmpBytes + sizeof(float) * 4 * C;
  }
  __device__ explicit KdaPrepareCompactSmem(unsigned char* raw) {
    G = reinterpret_cast<float*>(raw);
    k = reinterpret_cast<T*>(raw + kGBytes);
    q = reinterpret_cast<T*>(raw + kGBytes + kKBytes);
    M = reinterpret_cast<float*>(raw + kGBytes + kKBytes + kQBytes);
    A = M + C * LDM;
    tmp = A + C * LDM;
    rstd = tmp + 16 * 48;
    beta = rstd + 3 * C;
    a_hi = q;
    a_lo = q + C * LDA;
    wb = reinterpret_cast<T*>(M);
    wb_lo = wb + C * LDK;
    ub = reinterpret_cast<T*>(G);
    ub_lo = ub + C * LDU;
  }
};

// One level of kda_decayed_in_half_lanes' reduce-scatter: of the 2 HS values v[0 .. 2 HS), a lane
// keeps the half selected by its lane bit HS / 2 (upper when set) plus its partner's copy of that
// half (shuffle across HS / 2 lanes), in v[0 .. HS). Compile-time indices (registers, no stack).
template <int HS>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[64], int lane) {
  const bool up = (lane & (HS / 2)) != 0;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    const float send = up ? v[i] : v[i + HS], keep = up ? v[i + HS] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, HS / 2);
  }
}

// The in-half pairs of stage 1's diagonal blocks (kda_decayed_mp's contract and its kHalves
// split, chunked_kda_decay.cuh: fp32, M and P sharing each decay), by warp and channel instead of a
// thread per pair (whose 128-term chains of dependent FMAs on scalar shared loads left 2.25 pairs
// per thread, 3 on warp 0): unit u = rows [8 u, 8 u + 8) (block u / 2, half u % 2), units wp and
// wp + 4 per warp; lane l takes the channel pairs d = 2 l + 64 s, d + 1 (one float2 of G and one
// 32-bit word of k and of q per row and pair), and adds every term of the half into 64 register
// sums:
//   v[a (a + 1) / 2 + c]       += q_a k_c e^(G_a - G_c)   (P, the 36 pairs c <= a)
//   v[36 + a (a - 1) / 2 + c]  += k_a k_c e^(G_a - G_c)   (M, the 28 pairs c < a)
// (a, c: rows of the half; q, k the 16-bit input values: the row factors multiply the totals,
// P_ac by qrs[a] krs[c], M_ac by mrs[a] krs[c]). The decays are products of the rows' factors
// f_t = e^(G_t - G_{t-1}), t = c + 1 .. a: 7 exps per channel instead of 28, and no product can
// overflow (every factor <= 1; underflow only where the true decay does). The sums over the
// lanes are a reduce-scatter (5 shuffle levels: at level n the lanes with bit 4 - n set keep the
// upper half of the remaining values and add their partner's), after which lane l holds the
// totals of v[2 l] and v[2 l + 1].
// kraw / qraw(r, d) return the raw pair (x(r, d), x(r, d + 1)) for even d. No barrier.
template <int KMAX, typename QP, typename KP>
__device__ __forceinline__ void kda_decayed_in_half_lanes(QP&& qraw, KP&& kraw, const float* qrs, const float* mrs,
                                                          const float* krs, const float* G, int ldg, float* out,
                                                          int ldo) {
  static_assert(KMAX % 64 == 0, "whole channel-pair passes");
  const int wp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll 1
  for (int u = wp; u < 8; u += 4) {
    const int r0 = 8 * u;
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) v[i] = 0.f;
#pragma unroll 1
    for (int s = 0; s < KMAX / 64; ++s) {
      const int d = 2 * lane + 64 * s;
      float2 gg[8], kk[8], qq[8];
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        gg[a] = *reinterpret_cast<const float2*>(&G[(r0 + a) * ldg + d]);
        kk[a] = kraw(r0 + a, d);
        qq[a] = qraw(r0 + a, d);
      }
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
        auto pick = [ch](const float2& x) { return ch == 0 ? x.x : x.y; };
        float f[8];
#pragma unroll
        for (int t = 1; t < 8; ++t) f[t] = decay_exp(pick(gg[t]) - pick(gg[t - 1]));
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          float e = 1.f;
#pragma unroll
          for (int a = c; a < 8; ++a) {
            e = a == c ? 1.f : (a == c + 1 ? f[a] : e * f[a]);
            const float kc = a == c ? pick(kk[c]) : pick(kk[c]) * e;
            v[a * (a + 1) / 2 + c] += pick(qq[a]) * kc;
            if (a > c) v[36 + a * (a - 1) / 2 + c] += pick(kk[a]) * kc;
          }
        }
      }
    }
    reduce_scatter_level<32>(v, lane);
    reduce_scatter_level<16>(v, lane);
    reduce_scatter_level<8>(v, lane);
    reduce_scatter_level<4>(v, lane);
    reduce_scatter_level<2>(v, lane);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int idx = 2 * lane + h;
      if (idx < 36) {  // P_{r0 + a, r0 + c} at out[r0 + c][r0 + a]
        int a = 0;
        while ((a + 1) * (a + 2) / 2 <= idx) ++a;
        const int c = idx - a * (a + 1) / 2;
        out[(r0 + c) * ldo + r0 + a] = v[h] * qrs[r0 + a] * krs[r0 + c];
      } else {  // M_{r0 + a, r0 + c} at out[r0 + a][r0 + c]
        const int t = idx - 36;
        int a = 1;
        while ((a + 1) * a / 2 <= t) ++a;
        const int c = t - a * (a - 1) / 2;
        out[(r0 + a) * ldo + r0 + c] = v[h] * mrs[r0 + a] * krs[r0 + c];
      }
    }
  }
}

// The 8 x 8 quadrant between the halves of diagonal block wp (as kda_decayed_mp's kHalves
// quadrant, chunked_kda_decay.cuh: rows i = m + a of the upper half, m = 16 wp + 8,
// columns j = 16 wp + jj of the lower one, through the reference row m, one 16 x 8 mma tile with k
// rows 0 - 7 and q rows 8 - 15), its fragments from pairs: a lane's two A rows are k and q of the
// same row i, so they share their exps; G as float2, q / k as 32-bit words (kpair / qpair and the
// row factors as in kda_decayed_offdiag_registers). No barrier.
template <typename T, int KMAX, bool kExp2 = false, typename QP, typename KP>
__device__ __forceinline__ void kda_decayed_quadrant_pairs(QP&& qpair, KP&& kpair, const float* qrs, const float* mrs,
                                                           const float* krs, const float* G, int ldg, float* out,
                                                           int ldo) {
  const int wp = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  const int j0 = 16 * wp, m = j0 + 8, i = m + g, j = j0 + g;  // this lane's A row (k, q) and B column
  auto g2 = [&](int r, int d) { return *reinterpret_cast<const float2*>(&G[r * ldg + d]); };
  float acc[4] = {};
#pragma unroll 2
  for (int kk = 0; kk < KMAX; kk += 16) {
    uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns d, d + 1: A registers 2h (k row i), 2h + 1 (q row i); B register h
      const int d = kk + t2 + 8 * h;
      const float2 gi = g2(i, d), gm = g2(m, d), gj = g2(j, d), ki = kpair(i, d), qi = qpair(i, d), kj = kpair(j, d);
      const float e0 = stage1_exp<kExp2>(gi.x - gm.x), e1 = stage1_exp<kExp2>(gi.y - gm.y);
      mma::split_pair<T>(ki.x * e0, ki.y * e1, ah[2 * h], al[2 * h]);
      mma::split_pair<T>(qi.x * e0, qi.y * e1, ah[2 * h + 1], al[2 * h + 1]);
      mma::split_pair<T>(kj.x * stage1_exp<kExp2>(gm.x - gj.x), kj.y * stage1_exp<kExp2>(gm.y - gj.y), bh[h], bl[h]);
    }
    mma::mma16816<T>(acc, ah, bh);
    mma::mma16816<T>(acc, al, bh);
    mma::mma16816<T>(acc, ah, bl);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // rows < 8: M_{m + row, j}; rows >= 8: P_{m + row - 8, j} at out[j][..]
    const int row = mma::acc_row(e), jj = j0 + mma::acc_col(e), ii = m + (row & 7);
    if (row < 8)
      out[ii * ldo + jj] = acc[e] * mrs[ii] * krs[jj];
    else
      out[jj * ldo + ii] = acc[e] * qrs[ii] * krs[jj];
  }
}

// A float or 16-bit element as float (the loaders below are written once for both storage types).
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return to_f<__nv_bfloat16>(x); }
__device__ __forceinline__ float to_f32(__half x) { return to_f<__half>(x); }

// kda_load_cumulative_gate's contract (chunked_kda_decay.cuh: G[r * ldg + d] = g_0d + .. + g_rd
// for r < 64, rows >= L summing zeros; G_out rows < L written) without the trip through shared
// memory: thread d < KMAX loads its channel's 64 gates into registers (all in flight at once;
// consecutive threads read consecutive channels of a row, so each row's loads coalesce), sums them
// in row order (the same fp32 sums) and writes G and G_out. No barrier.
template <typename T, int KMAX, bool kExp2 = false>
__device__ __forceinline__ void kda_cumulative_gate_registers(const View& g, const ChunkInfo& ci, int64_t hv,
                                                              float* G, int ldg, float* G_out, int64_t row0,
                                                              int64_t HV) {
  static_assert(KMAX <= kChunkThreads, "a thread per channel");
  const int d = threadIdx.x;
  if (d >= KMAX) return;
  // Row pointers bumped by the row strides, and no per-row predicates in whole chunks (L = 64, the
  // common case): base + r * s1 under a row predicate cost ~10 integer instructions per row in SASS.
  const int64_t s1 = g.s1, so = HV * KMAX;
  const int L = ci.len;
  float x[kChunkSize];
  auto load = [&](auto* p) {  // p: this channel's element of row 0 (float or T)
    if (L == kChunkSize) {
#pragma unroll
      for (int r = 0; r < kChunkSize; ++r, p += s1) x[r] = to_f32(*p);
    } else {
#pragma unroll
      for (int r = 0; r < kChunkSize; ++r, p += s1) x[r] = r < L ? to_f32(*p) : 0.f;
    }
  };
  const int64_t e0 = off4(g, ci.b, ci.t0, hv, 0) + d;
  if (g.f32)  // (load_elem's dtype test, once instead of per row)
    load(static_cast<const float*>(g.p) + e0);
  else
    load(static_cast<const T*>(g.p) + e0);
  float* o = G_out + (row0 * HV + hv) * KMAX + d;  // row r: + r * HV KMAX
  float acc = 0.f;
  if (L == kChunkSize) {
#pragma unroll
    for (int r = 0; r < kChunkSize; ++r, o += so) {
      acc += x[r];
      G[r * ldg + d] = kExp2 ? acc * kLog2e : acc;  // (stage1_exp)
      *o = acc;
    }
  } else {
#pragma unroll
    for (int r = 0; r < kChunkSize; ++r, o += so) {
      acc += x[r];
      G[r * ldg + d] = kExp2 ? acc * kLog2e : acc;  // (stage1_exp)
      if (r < L) *o = acc;
    }
  }
}

// The off-diagonal 16 x 8 tiles of stage 1's M and P (kda_decayed_mp's contract, chunked_kda_decay.cuh):
// row sub-chunk I (rows [r0, r0 + 16), r0 = 16 I), column tile nt (columns [8 nt, 8 nt + 8),
// all < r0), through the reference row r0 (j < r0 <= i, both factors <= 1):
//   M_ij = sum_d (k_id e^(G_id - G_r0,d)) (k_jd e^(G_r0,d - G_jd)),  P_ij the same with q_i,
// one mma tile each for M and P, the A (x) and B (y) fragments formed in registers from G and the
// rows (split hi + lo: three mmas per step, close to fp32), the exps of x shared by M and P.
// The 12 tiles by warp, each warp on one sub-chunk so that its x fragments serve all its tiles:
// warp 0 I = 3 tiles 0 - 2, warp 1 I = 3 tiles 3 - 5, warp 2 I = 2 tiles 0 - 3, warp 3 I = 1 tiles
// 0 - 1 (per 16-column step: one x and 3 / 3 / 4 / 2 y fragments; a tile per job formed x for every
// tile, 3 jobs per warp).
// kpair / qpair(i, d) return the raw input pair (x(i, d), x(i, d + 1)) for even d (0 past L); the
// row factors multiply the tiles' totals: P_ij by qrs[i] krs[j], M_ij by mrs[i] krs[j] (the
// kernel's mrs = beta krs: M comes out as diag(beta) M). G [64][ldg] fp32 in shared memory
// with an even ldg (float2 loads; rows past L hold G_{L-1}). Writes only these tiles of `out` (M
// at out[i][j], P^T at out[j][i]); no barrier.
template <typename T, int KMAX, bool kExp2 = false, int kUnroll = 1, typename QP, typename KP>
__device__ __forceinline__ void kda_decayed_offdiag_registers(QP&& qpair, KP&& kpair, const float* qrs,
                                                              const float* mrs, const float* krs, const float* G,
                                                              int ldg, float* out, int ldo) {
  const int wp = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  const int I = wp < 2 ? 3 : 4 - wp, nt0 = wp == 1 ? 3 : 0, ntl = wp < 2 ? 3 : (wp == 2 ? 4 : 2);  // warp-uniform
  const int r0 = 16 * I, ra = r0 + g, rb = ra + 8;  // this lane's A rows
  auto g2 = [&](int r, int d) { return *reinterpret_cast<const float2*>(&G[r * ldg + d]); };
  float accm[4][4] = {}, accp[4][4] = {};
#pragma unroll kUnroll
  for (int kk = 0; kk < KMAX; kk += 16) {
    uint32_t kh[4], kl[4], qh[4], ql[4];
    float2 gr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns d, d + 1 of A registers 2h (row ra), 2h + 1 (row rb)
      const int d = kk + t2 + 8 * h;
      const float2 ga = g2(ra, d), gb = g2(rb, d);
      gr[h] = g2(r0, d);
      const float ea0 = stage1_exp<kExp2>(ga.x - gr[h].x), ea1 = stage1_exp<kExp2>(ga.y - gr[h].y);
      const float eb0 = stage1_exp<kExp2>(gb.x - gr[h].x), eb1 = stage1_exp<kExp2>(gb.y - gr[h].y);
      const float2 ka = kpair(ra, d), kb = kpair(rb, d), qa = qpair(ra, d), qb = qpair(rb, d);
      mma::split_pair<T>(ka.x * ea0, ka.y * ea1, kh[2 * h], kl[2 * h]);
      mma::split_pair<T>(kb.x * eb0, kb.y * eb1, kh[2 * h + 1], kl[2 * h + 1]);
      mma::split_pair<T>(qa.x * ea0, qa.y * ea1, qh[2 * h], ql[2 * h]);
      mma::split_pair<T>(qb.x * eb0, qb.y * eb1, qh[2 * h + 1], ql[2 * h + 1]);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (t >= ntl) break;
      const int j = 8 * (nt0 + t) + g;  // this lane's B column
      uint32_t bh[2], bl[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // B register h: rows (channels) d, d + 1
        const int d = kk + t2 + 8 * h;
        const float2 gj = g2(j, d), kj = kpair(j, d);
        mma::split_pair<T>(kj.x * stage1_exp<kExp2>(gr[h].x - gj.x), kj.y * stage1_exp<kExp2>(gr[h].y - gj.y),
                           bh[h], bl[h]);
      }
      mma::mma16816<T>(accm[t], kh, bh);
      mma::mma16816<T>(accp[t], qh, bh);
      mma::mma16816<T>(accm[t], kl, bh);
      mma::mma16816<T>(accp[t], ql, bh);
      mma::mma16816<T>(accm[t], kh, bl);
      mma::mma16816<T>(accp[t], qh, bl);
    }
  }
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    if (t >= ntl) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + mma::acc_row(e), jj = 8 * (nt0 + t) + mma::acc_col(e);
      out[i * ldo + jj] = accm[t][e] * mrs[i] * krs[jj];
      out[jj * ldo + i] = accp[t][e] * qrs[i] * krs[jj];
    }
  }
}

// acc[b][nt] += L[16 rb_b + (0..15), :] Y[:, col0 + 8 nt + (0..7)] for a 64 x 64 lower-triangular
// L (16-bit hi + lo, row-major, ld lda) and Y (hi + lo, ld ldb): column blocks kb <= rb_b only.
// Balanced over the 4 warps: warp wp takes row blocks rb_0 = p and rb_1 = 3 - p (p = wp / 2) on
// output columns [col0, col0 + 8 NTH), col0 = 8 NTH (wp % 2): five 16 x 16 block products per
// warp (with a row block per warp, kda_mma::lower_times_split, the last warp did four times the
// first one's and the others waited at the next barrier). Each kb's B fragments are loaded once
// for both row blocks; three mmas per tile and step (hi hi + lo hi + hi lo).
template <typename T, int NTH>
__device__ __forceinline__ void lower_times_split_balanced(const T* Lh, const T* Ll, int lda, const T* Yh,
                                                           const T* Yl, int ldb, float (&acc)[2][NTH][4]) {
  static_assert(NTH % 2 == 0, "tile pairs");
  const int wp = threadIdx.x / 32, p = wp / 2, col0 = 8 * NTH * (wp % 2);
#pragma unroll 1
  for (int kb = 0; kb <= 3 - p; ++kb) {
    uint32_t bh[NTH / 2][4], bl[NTH / 2][4];
#pragma unroll
    for (int np = 0; np < NTH / 2; ++np) {
      kda_mma::ldm_b_pair(Yh, ldb, 16 * kb, col0 + 16 * np, bh[np]);
      kda_mma::ldm_b_pair(Yl, ldb, 16 * kb, col0 + 16 * np, bl[np]);
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int rb = b == 0 ? p : 3 - p;
      if (kb > rb) continue;
      uint32_t ah[4], al[4];
      kda_mma::ldm_a(Lh, lda, 16 * rb, 16 * kb, ah);
      kda_mma::ldm_a(Ll, lda, 16 * rb, 16 * kb, al);
#pragma unroll
      for (int np = 0; np < NTH / 2; ++np)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t b_h[2] = {bh[np][2 * h], bh[np][2 * h + 1]}, b_l[2] = {bl[np][2 * h], bl[np][2 * h + 1]};
          mma::mma16816<T>(acc[b][2 * np + h], ah, b_h);
          mma::mma16816<T>(acc[b][2 * np + h], al, b_h);
          mma::mma16816<T>(acc[b][2 * np + h], ah, b_l);
        }
    }
  }
}

// kVar: 0 the session-7 kernel (FLASHGRAD_CHUNKED_KDA_PREPARE=s7); 2 (session 13's v2; kExp2:
// stage1_exp, G in shared memory scaled by log2 e, the decays by ex2.approx.ftz; the in-half pairs
// by kda_decayed_in_half_pairs16); 3: v2, the off-diagonal tiles' channel loop unrolled by 2 (the
// next step's loads and exps can overlap the current step's mmas), and both of the first two v
// pieces loaded before the inverse (kPrefetchV: the second piece's global loads were issued only
// during the first piece's product, too short to cover them); 4 (the default since run 13.3): v3
// with beta's and v's global loads kept as raw bits until their use (kRawLoads: their conversions
// had made the warps wait for the loads before the gate's loads were issued and before the
// inverse; ncu, run 13.1). Run 13.2 (B4 T4096 H16 K = V = 128 bf16): 0.569 / 0.534 / 0.532 /
// 0.50 ms per call for kVar 0 / 2 / 3 / 4.
template <typename T, int KMAX, int kVar = 0>
__global__ void __launch_bounds__(kChunkThreads, 2) kda_prepare_compact_kernel(ChunkedArgs a) {
  constexpr bool kExp2 = kVar >= 2, kPrefetchV = kVar >= 3, kRawLoads = kVar >= 4;
  constexpr int kOffdiagUnroll = kVar >= 3 ? 2 : 1;
  using S = KdaPrepareCompactSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDG = S::LDG, LDK = S::LDK, LDA = S::LDA, LDM = S::LDM, LDU = S::LDU;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const ChunkInfo ci = chunk_info(a, blockIdx.x);
  const int64_t hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  // k and q rows by cp.async (element copies when a view is not 16-byte vectorizable), in flight
  // while beta and the gate are loaded and summed; then each row's L2-norm factor.
  key_tile_async<T, KMAX, kChunkThreads>(a.k, ci, head, key_rows_vectorizable(a.k), sm.k, LDK);
  key_tile_async<T, KMAX, kChunkThreads>(a.q, ci, head, key_rows_vectorizable(a.q), sm.q, LDK);
  mma::cp_async_commit();
  if constexpr (kRawLoads) {
    // (v4) beta's load without a branch (rows past L read row L - 1 and store 0; every chunk has
    // L >= 1) and its bits converted after the gate's loads are issued (load_raw).
    const int rb = tid % C < L ? tid % C : L - 1;
    const uint32_t beta_raw = load_raw<T>(a.beta, off3(a.beta, ci.b, ci.t0 + rb, hv));
    kda_cumulative_gate_registers<T, KMAX, kExp2>(a.g, ci, hv, sm.G, LDG, a.G, row0, a.HV);
    if (tid < C) sm.beta[tid] = tid < L ? raw_to_f32<T>(a.beta.f32, beta_raw) : 0.f;
  } else {
    if (tid < C) sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    kda_cumulative_gate_registers<T, KMAX, kExp2>(a.g, ci, hv, sm.G, LDG, a.G, row0, a.HV);
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  {
    const float rk = tile_row_rstd<T, KMAX, kChunkThreads>(sm.k, LDK, a.l2norm);  // row tid / 2
    const float rq = tile_row_rstd<T, KMAX, kChunkThreads>(sm.q, LDK, a.l2norm);
    if (tid % 2 == 0) {
      const int r = tid / 2;
      sm.rstd[r] = rk, sm.rstd[C + r] = rq, sm.rstd[2 * C + r] = sm.beta[r] * rk;
    }
  }
  __syncthreads();

  // Element pairs (d, d + 1), d even, of the rows as their raw input values: the products below
  // apply the row factors (L2 norm; beta for M and w's operand) to their totals.
  const float* krs = sm.rstd;
  const float* qrs = sm.rstd + C;
  const float* mrs = sm.rstd + 2 * C;
  auto raw_pair = [](const T* X) {
    float x0, x1;
    mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(X), x0, x1);
    return make_float2(x0, x1);
  };

  // M (strict lower triangle of sm.M) and P^T (its upper triangle and diagonal): the diagonal
  // blocks' in-half pairs in fp32, their quadrants and the off-diagonal tiles on tensor cores from
  // register fragments (disjoint parts of sm.M: no barrier between them). M's rows carry beta
  // (mrs: M = diag(beta) K K^T decayed, rows past L zero) as the inverse needs them.
  auto qraw = [&](int r, int d) { return raw_pair(&sm.q[r * LDK + d]); };
  auto kraw = [&](int r, int d) { return raw_pair(&sm.k[r * LDK + d]); };
  if constexpr (kExp2)
    kda_decayed_in_half_pairs16<KMAX, kExp2>(qraw, kraw, qrs, mrs, krs, sm.G, LDG, sm.M, LDM);
  else
    kda_decayed_in_half_lanes<KMAX>(qraw, kraw, qrs, mrs, krs, sm.G, LDG, sm.M, LDM);
  kda_decayed_quadrant_pairs<T, KMAX, kExp2>(qraw, kraw, qrs, mrs, krs, sm.G, LDG, sm.M, LDM);
  kda_decayed_offdiag_registers<T, KMAX, kExp2, kOffdiagUnroll>(qraw, kraw, qrs, mrs, krs, sm.G, LDG, sm.M, LDM);
  __syncthreads();
  // The first 64 columns of v into registers (u's first piece), in flight during the inverse.
  // A piece's elements of thread tid: columns 2 (tid % 32) and + 1 (vv[2 m], vv[2 m + 1]) of rows
  // tid / 32 + 4 m (pointer bumped by four rows per m, as the gate's rows).
  constexpr int kVPairs = C * 32 / kChunkThreads;
  const int64_t v_elem0 = off4(a.v, ci.b, ci.t0, hv, 0) + (tid / 32) * a.v.s1 + 2 * (tid % 32), v_step = 4 * a.v.s1;
  // (kRawLoads, v4: the elements' bits, converted at their use, vval; else their values)
  using VReg = std::conditional_t<kRawLoads, uint32_t, float>;
  VReg vv[2 * kVPairs];
  VReg vn[kPrefetchV ? 2 * kVPairs : 1];  // (kPrefetchV) the next piece
  auto vval = [&](VReg x) -> float {
    if constexpr (kRawLoads)
      return raw_to_f32<T>(a.v.f32, x);
    else
      return x;
  };
  auto fetch_v = [&](auto& dst, int c0) {  // dst: vv or vn
    auto rows = [&](auto* p) {  // p: this thread's first element of the piece's row tid / 32
      auto get = [&](auto x) -> VReg {
        if constexpr (kRawLoads)
          return raw_bits(x);
        else
          return to_f32(x);
      };
      if (L == C) {  // whole chunk: no row predicates
#pragma unroll
        for (int m = 0; m < kVPairs; ++m, p += v_step) dst[2 * m] = get(p[0]), dst[2 * m + 1] = get(p[1]);
      } else {
#pragma unroll
        for (int m = 0; m < kVPairs; ++m, p += v_step) {
          const bool ok = tid / 32 + 4 * m < L;
          dst[2 * m] = ok ? get(p[0]) : VReg(0);
          dst[2 * m + 1] = ok ? get(p[1]) : VReg(0);
        }
      }
    };
    if (a.v.f32)
      rows(static_cast<const float*>(a.v.p) + v_elem0 + c0);
    else if constexpr (kRawLoads)
      rows(static_cast<const uint16_t*>(a.v.p) + v_elem0 + c0);
    else
      rows(static_cast<const T*>(a.v.p) + v_elem0 + c0);
  };
  fetch_v(vv, 0);
  if constexpr (kPrefetchV)
    if (64 < a.V) fetch_v(vn, 64);
  invert_unit_lower64_blocked<LDM>(sm.M, sm.A, sm.tmp);  // ends with a barrier

  // Intermediates' chunk rows: row i at + i * HV * (C, K, V) (addresses formed once).
  float* A0 = a.A + (row0 * a.HV + hv) * C;
  T* w0 = static_cast<T*>(a.w) + (row0 * a.HV + hv) * a.K;
  float* u0 = a.u + (row0 * a.HV + hv) * a.V;
  // Row i < L of the intermediate: A_ij for j < i, P_ji = sm.M[i][j] for j >= i (chunked_kda.h);
  // A as hi + lo over q (q's last readers were the decayed products, before the inverse's barriers).
  // Two columns per step (float2 loads and stores; the intermediate's rows are 8-byte aligned):
  // thread tid keeps columns j, j + 1 (j = 2 (tid % 32)) and takes rows tid / 32 + 4 m (row
  // offsets bumped, not recomputed).
  {
    const int j = 2 * (tid % 32);
    float* a_out = A0 + (tid / 32) * a.HV * C + j;
    const int64_t a_step = 4 * a.HV * C;
#pragma unroll 4
    for (int m = 0; m < C / 4; ++m, a_out += a_step) {
      const int i = tid / 32 + 4 * m;
      const float2 x = *reinterpret_cast<const float2*>(&sm.A[i * LDM + j]);
      const float2 pm = *reinterpret_cast<const float2*>(&sm.M[i * LDM + j]);
      if (i < L) *reinterpret_cast<float2*>(a_out) = make_float2(j < i ? x.x : pm.x, j + 1 < i ? x.y : pm.y);
      mma::split_pair<T>(x.x, x.y, *reinterpret_cast<uint32_t*>(&sm.a_hi[i * LDA + j]),
                         *reinterpret_cast<uint32_t*>(&sm.a_lo[i * LDA + j]));
    }
  }
  __syncthreads();  // M, A and tmp are free
  // beta e^G o k as hi + lo (e^G <= 1) over M, A and tmp: mrs[r] e^G_rd k_rd with the raw k and
  // mrs = beta rstd_k. Thread tid keeps the channel pair d, d + 1 (d = 2 (tid % (KMAX / 2))) and
  // takes every (128 / (KMAX / 2))-th row (float2 G, 32-bit k and wb words).
  {
    constexpr int kPairs = KMAX / 2, kRowStep = kChunkThreads / kPairs;
    const int d = 2 * (tid % kPairs);
#pragma unroll 4
    for (int r = tid / kPairs; r < C; r += kRowStep) {
      const float2 gv = *reinterpret_cast<const float2*>(&sm.G[r * LDG + d]), kv = raw_pair(&sm.k[r * LDK + d]);
      const float mr = mrs[r];
      mma::split_pair<T>(mr * stage1_exp<kExp2>(gv.x) * kv.x, mr * stage1_exp<kExp2>(gv.y) * kv.y,
                         *reinterpret_cast<uint32_t*>(&sm.wb[r * LDK + d]),
                         *reinterpret_cast<uint32_t*>(&sm.wb_lo[r * LDK + d]));
    }
  }
  __syncthreads();  // G is free

  // Stores of a balanced product's tiles (lower_times_split_balanced's row blocks and columns):
  // put2(offset, x0, x1) for the element pairs (row i, columns c, c + 1) of this lane, offset =
  // i * row_stride + c (the row offsets formed once per row, not per element).
  const int p = wp / 2, half = wp % 2;
  auto for_each_out = [&](auto&& acc, int nth, int64_t row_stride, auto&& put2) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {  // accumulator rows grp (e = 0, 1) and grp + 8 (e = 2, 3)
        const int i = 16 * (b == 0 ? p : 3 - p) + mma::grp() + 8 * hr;
        if (i >= L) continue;
        const int64_t ro = i * row_stride + 8 * half * nth + 2 * mma::tig();
#pragma unroll
        for (int nt = 0; nt < nth; ++nt) put2(ro + 8 * nt, acc[b][nt][2 * hr], acc[b][nt][2 * hr + 1]);
      }
  };
  // (kRawLoads, v4) beta of this thread's rows of the u pieces (tid / 32 + 4 m), read once here,
  // under w's product, instead of per piece right before their use.
  float brs[kRawLoads ? kVPairs : 1];
  if constexpr (kRawLoads) {
#pragma unroll
    for (int m = 0; m < kVPairs; ++m) brs[m] = sm.beta[tid / 32 + 4 * m];
  }
  // w = A wb (pairs as one 32-bit word: w's rows have an even length K).
  {
    constexpr int NTH = KMAX / 16;
    float acc[2][NTH][4] = {};
    lower_times_split_balanced<T, NTH>(sm.a_hi, sm.a_lo, LDA, sm.wb, sm.wb_lo, LDK, acc);
    for_each_out(acc, NTH, a.HV * a.K, [&](int64_t o, float x0, float x1) {
      *reinterpret_cast<uint32_t*>(&w0[o]) = mma::pack_floats<T>(x0, x1);
    });
  }

  // u = A (beta v), 64 value columns at a time, the pieces over G; the next piece's v values are
  // loaded during the current piece's product.
  for (int c0 = 0; c0 < a.V; c0 += 64) {
    if (c0 > 0) __syncthreads();  // the previous piece's readers are done
#pragma unroll
    for (int m = 0; m < kVPairs; ++m) {  // pairs as 32-bit words
      const int r = tid / 32 + 4 * m, col = 2 * (tid % 32);
      const float br = kRawLoads ? brs[kRawLoads ? m : 0] : sm.beta[r];
      mma::split_pair<T>(br * vval(vv[2 * m]), br * vval(vv[2 * m + 1]),
                         *reinterpret_cast<uint32_t*>(&sm.ub[r * LDU + col]),
                         *reinterpret_cast<uint32_t*>(&sm.ub_lo[r * LDU + col]));
    }
    __syncthreads();
    if constexpr (kPrefetchV) {  // vv = the next piece (loaded a piece earlier); vn = the one after
#pragma unroll
      for (int i = 0; i < 2 * kVPairs; ++i) vv[i] = vn[i];
      if (c0 + 128 < a.V) fetch_v(vn, c0 + 128);
    } else if (c0 + 64 < a.V) {
      fetch_v(vv, c0 + 64);
    }
    float acc[2][4][4] = {};
    lower_times_split_balanced<T, 4>(sm.a_hi, sm.a_lo, LDA, sm.ub, sm.ub_lo, LDU, acc);
    for_each_out(acc, 4, a.HV * a.V, [&](int64_t o, float x0, float x1) {
      *reinterpret_cast<float2*>(&u0[o + c0]) = make_float2(x0, x1);
    });
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
