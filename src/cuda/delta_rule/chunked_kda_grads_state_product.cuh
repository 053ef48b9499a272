// The products of the split KDA B2's first kernel (chunked_kda_grads_state.cuh) with the states, for
// one 64-channel slice: out[r * 64 + d] = sign * sum_{c < V} X[r][c] S[d][c] (r < 64, d < 64), X the
// chunk's rows (do, v_new in T, or dv_new in fp32; rows >= L read as 0), S rows [c0, c0 + 64) of an
// fp32 K x V state (h_c or dh_{c+1}, global, row-major). The same transposed scheme as
// kda_mma::state_times_rows (chunked_kda_mma.cuh), whose KMAX = 64 instance this generalizes by
// kSplit:
//   kSplit = true:  the fp32 operands (S, and X when fp32) split hi + lo (2 or 3 mmas per tile), as
//                   kda_grads_kernel does;
//   kSplit = false: every operand rounded once to T, one mma per tile (as fla, and as the default
//                   B1 and stage 2 of chunked_kda.h): about half the instructions of the product
//                   (SASS count, session 10), a rounding of h / dh / dv_new (2^-9 relative) instead.
// Warp w (8 warps): channels [16 (w % 4), +16) of the slice, row tiles [32 (w / 4), +32) (NT = 4);
// out^T = S X^T, so each warp loads its own 16 state rows straight into A fragments and X's rows
// into B fragments, one 16-column step ahead of the mmas. No barrier: the caller has one before
// others read `out`. With S2 (another state, same layout) the call also returns <S[d], S2[d]> over
// all V for this lane's channels d0 + grp (dot[0]) and d0 + grp + 8 (dot[1]) (valid in lanes with
// tig == 0 of warps 0..3, 0 elsewhere), from the fp32 values.
#pragma once

#include <type_traits>

#include "chunked_kda_grads_slices.cuh"  // kda_swz_at
#include "chunked_kda_mma.cuh"  // kda_mma::pair_exact
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, bool kSplit, bool PAIRS, typename E>
__device__ __forceinline__ void kda_state_slice_product(const float* S, int64_t V, const E* x, int64_t xstride,
                                                        int L, float sign, float* out, const float* S2 = nullptr,
                                                        float* dot = nullptr) {
  constexpr int KS = 64, NT = 4;
  constexpr bool XS = std::is_same_v<E, float>;  // fp32 rows (dv_new)
  const int w = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  const int d0 = 16 * (w % 4), nt0 = NT * (w / 4);
  const float* s0 = S + static_cast<int64_t>(d0 + g) * V + t2;  // state rows d0 + g and d0 + g + 8
  const float* s1 = s0 + 8 * V;
  // This lane's B-fragment row of tile nt is 8 (nt0 + nt) + g: one base pointer stepped by 8 rows per
  // tile at each fetch (registers), loads masked past L.
  const E* xb = x + (8 * nt0 + g) * xstride + t2;
  const int64_t xstep = 8 * xstride;
  bool xok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xok[nt] = 8 * (nt0 + nt) + g < L;
  using XPair = std::conditional_t<XS, float2, uint32_t>;
  const bool with_dot = S2 != nullptr;  // block-uniform
  const float* u0 = with_dot ? S2 + (s0 - S) : nullptr;
  const float* u1 = with_dot ? S2 + (s1 - S) : nullptr;
  float dsum[2] = {0.f, 0.f};
  // The raw operands of one 16-column step, in two register sets: the loads run two steps ahead of
  // the mmas (one step of 4 - 12 mmas did not cover a load's latency: ncu run 10.1, long scoreboard).
  struct Raw {
    float2 sv[4], tv[4];
    XPair xv[NT][2];
  };
  auto fetch = [&](Raw& R, int64_t c) {  // the raw operands of the 16 columns [c, c + 16)
    R.sv[0] = *reinterpret_cast<const float2*>(s0 + c), R.sv[1] = *reinterpret_cast<const float2*>(s1 + c);
    R.sv[2] = *reinterpret_cast<const float2*>(s0 + c + 8), R.sv[3] = *reinterpret_cast<const float2*>(s1 + c + 8);
    if (with_dot) {
      R.tv[0] = *reinterpret_cast<const float2*>(u0 + c), R.tv[1] = *reinterpret_cast<const float2*>(u1 + c);
      R.tv[2] = *reinterpret_cast<const float2*>(u0 + c + 8), R.tv[3] = *reinterpret_cast<const float2*>(u1 + c + 8);
    }
    const E* p = xb + c;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt, p += xstep)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (XS)
          R.xv[nt][h] = xok[nt] ? *reinterpret_cast<const float2*>(p + 8 * h) : make_float2(0.f, 0.f);
        else
          R.xv[nt][h] = kda_mma::pair_exact<T, PAIRS>(p + 8 * h, xok[nt]);
      }
  };
  float acc[NT][4] = {};
  // One step: R's operands into fragments, R refilled with the columns [c_next, + 16) (if < V), mmas.
  auto step = [&](Raw& R, int64_t c_next) {
    uint32_t ah[4], al[4], bh[NT][2], bl[NT][2];
    // A (16 x 16): (g, t2..), (g + 8, t2..), (g, t2 + 8..), (g + 8, t2 + 8..); B (16 x 8): rows t2..,
    // t2 + 8.. of column g.
#pragma unroll
    for (int i = 0; i < 4; ++i) mma::round_pair<T, kSplit>(R.sv[i].x, R.sv[i].y, ah[i], al[i]);
    if (with_dot)  // rows grp (i = 0, 2) and grp + 8 (i = 1, 3)
#pragma unroll
      for (int i = 0; i < 4; ++i) dsum[i & 1] += R.sv[i].x * R.tv[i].x + R.sv[i].y * R.tv[i].y;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (XS)
          mma::round_pair<T, kSplit>(R.xv[nt][h].x, R.xv[nt][h].y, bh[nt][h], bl[nt][h]);
        else
          bh[nt][h] = R.xv[nt][h];
      }
    if (c_next < V) fetch(R, c_next);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma::mma16816<T>(acc[nt], ah, bh[nt]);
      if constexpr (kSplit) {
        mma::mma16816<T>(acc[nt], al, bh[nt]);
        if constexpr (XS) mma::mma16816<T>(acc[nt], ah, bl[nt]);
      }
    }
  };
  Raw ra, rb;
  fetch(ra, 0);
  fetch(rb, 16);  // V is a multiple of 64: the steps come in pairs
#pragma unroll 1
  for (int64_t c = 0; c < V; c += 32) {
    step(ra, c + 32);
    step(rb, c + 48);
  }
  if (with_dot) {  // over the 4 lanes (tig) of a row
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 1);
      dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 2);
      dot[i] = nt0 == 0 && mma::tig() == 0 ? dsum[i] : 0.f;
    }
  }
  // acc[nt][e] is out^T at (channel d0 + acc_row(e), row 8 (nt0 + nt) + acc_col(e)).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[(8 * (nt0 + nt) + mma::acc_col(e)) * KS + d0 + mma::acc_row(e)] = sign * acc[nt][e];
}

// Two products with the same state in one pass (the A fragments of S loaded and rounded once):
// out1 = sign1 * X1 S^T with fp32 rows X1 (dv_new), out2 = X2 S^T with 16-bit rows X2 (do; PAIRS2:
// 32-bit pair loads). Same warp layout and contract as kda_state_slice_product. The first kernel's
// dw = -dv_new h^T and Y = do h^T: h is read once per slice instead of twice, and each 16-column
// step has twice the mmas behind its loads (the kernel was long-scoreboard bound, ncu run 10.1).
template <typename T, bool kSplit, bool PAIRS2>
__device__ __forceinline__ void kda_state_slice_product2(const float* S, int64_t V, const float* x1,
                                                         int64_t x1stride, float sign1, const T* x2,
                                                         int64_t x2stride, int L, float* out1, float* out2) {
  constexpr int KS = 64, NT = 4;
  const int w = threadIdx.x / 32, g = mma::grp(), t2 = 2 * mma::tig();
  const int d0 = 16 * (w % 4), nt0 = NT * (w / 4);
  const float* s0 = S + static_cast<int64_t>(d0 + g) * V + t2;  // state rows d0 + g and d0 + g + 8
  const float* s1 = s0 + 8 * V;
  // This lane's B-fragment row of tile nt is rb + 8 nt: one base pointer per operand, stepped by 8 rows
  // per tile at each fetch (not four pointers held across the loop: registers), loads masked past L.
  const int rb = 8 * nt0 + g;
  const float* x1b = x1 + rb * x1stride + t2;
  const T* x2b = x2 + rb * x2stride + t2;
  const int64_t x1step = 8 * x1stride, x2step = 8 * x2stride;
  bool xok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xok[nt] = rb + 8 * nt < L;
  float2 sv[4], v1[NT][2];
  uint32_t v2[NT][2];
  auto fetch = [&](int64_t c) {  // the raw operands of the 16 columns [c, c + 16)
    sv[0] = *reinterpret_cast<const float2*>(s0 + c), sv[1] = *reinterpret_cast<const float2*>(s1 + c);
    sv[2] = *reinterpret_cast<const float2*>(s0 + c + 8), sv[3] = *reinterpret_cast<const float2*>(s1 + c + 8);
    const float* p1 = x1b + c;
    const T* p2 = x2b + c;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt, p1 += x1step, p2 += x2step)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v1[nt][h] = xok[nt] ? *reinterpret_cast<const float2*>(p1 + 8 * h) : make_float2(0.f, 0.f);
        v2[nt][h] = kda_mma::pair_exact<T, PAIRS2>(p2 + 8 * h, xok[nt]);
      }
  };
  float acc1[NT][4] = {}, acc2[NT][4] = {};
  fetch(0);
#pragma unroll 1
  for (int64_t c = 0; c < V; c += 16) {
    uint32_t ah[4], al[4], b1h[NT][2], b1l[NT][2], b2[NT][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) mma::round_pair<T, kSplit>(sv[i].x, sv[i].y, ah[i], al[i]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma::round_pair<T, kSplit>(v1[nt][h].x, v1[nt][h].y, b1h[nt][h], b1l[nt][h]);
        b2[nt][h] = v2[nt][h];
      }
    if (c + 16 < V) fetch(c + 16);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma::mma16816<T>(acc1[nt], ah, b1h[nt]);
      mma::mma16816<T>(acc2[nt], ah, b2[nt]);
      if constexpr (kSplit) {
        mma::mma16816<T>(acc1[nt], al, b1h[nt]);
        mma::mma16816<T>(acc1[nt], ah, b1l[nt]);
        mma::mma16816<T>(acc2[nt], al, b2[nt]);
      }
    }
  }
  // acc[nt][e] is out^T at (channel d0 + acc_row(e), row 8 (nt0 + nt) + acc_col(e)).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int at = (8 * (nt0 + nt) + mma::acc_col(e)) * KS + d0 + mma::acc_row(e);
      out1[at] = sign1 * acc1[nt][e];
      out2[at] = acc2[nt][e];
    }
}

// ---------------------------------------------------------------------------------------------
// The staged variant (session 11, FLASHGRAD_CHUNKED_KDA_B2=staged; operands rounded to T): the
// three products of a slice in one pass, dw = -dv_new h_s^T, Y = do h_s^T, X = v_new dh_s^T, with
// the chunk's rows staged in shared memory.
//
// Why (ncu, run 10.4, kda_grads_state_kernel): L1 throughput 86% of peak with issue active 23%;
// the products above load every operand straight into fragments, so each warp-wide load touches 8
// rows (8 lines, 8 L1 wavefronts for 128 - 256 bytes), and the rows of dv_new / do / v_new are
// loaded by the 4 warps of a row half each, per slice: ~44k L1 tag lookups per block out of
// ~95k L1 wavefronts in all. Here the rows come through shared memory (coalesced 16-byte loads,
// read back 8 bytes per lane without bank conflicts), and h, dh (each read once, by 16-byte loads)
// feed 12 mmas per 16-column step.
//
// Column order inside a 16-column step: the contraction order is free, so lane (grp, tig) takes
// columns c + 4 tig .. c + 4 tig + 3 of its rows for the fragment elements k = 2 tig, 2 tig + 1,
// 2 tig + 8, 2 tig + 9 (in that order) of both A (state rows) and B (chunk rows): one float4 per
// state row and one 8-byte shared load per chunk row and operand.
//
// Staged layout: up to kKdaStagePiece (128) columns per piece, row r of an operand at stage + 128 r
// (whatever the piece's width pw, so that the loads' offsets are immediates), its 16-column unit u
// at position u ^ (r & 3) (so the 4 rows of a half-warp's 8-byte loads fall in 4 different 32-byte
// bank groups; pw / 16 is a multiple of 4); rows >= L are zeros.
constexpr int kKdaStagePiece = 128;
__device__ __forceinline__ int kda_staged_at(int r, int c) {  // element offset of (r, c)
  return r * kKdaStagePiece + ((((c >> 4) ^ (r & 3)) << 4) | (c & 15));
}

// Stages rows r < 64, columns [p0, p0 + pw) of the three operands into st_vn, st_do, st_dvn (T),
// one 16-byte chunk (8 columns) per thread and pass: thread tid takes chunk j = q % (pw / 8) of row
// q / (pw / 8), q = tid + 256 i (consecutive threads: consecutive chunks of one row). ALIGNED16 (the
// rows of do and v_new allow 16-byte accesses): do and v_new by cp.async (zero fill past L; one
// committed group), else by element loads. dv_new (fp32) is rounded to T here, two chunks' loads in
// flight per round (four spilled at 128 registers). Ends with this thread's copies committed, not
// waited for; no barrier.
template <typename T, bool ALIGNED16>
__device__ __forceinline__ void kda_stage_rows(const float* dvn, int64_t dvn_stride, const T* dout, int64_t do_stride,
                                               const T* vn, int64_t vn_stride, int L, int64_t p0, int pw, T* st_dvn,
                                               T* st_do, T* st_vn) {
  constexpr int NTHR = 256;
  const int cpr = pw / 8, n = 64 * cpr;  // chunks per row, per operand
#pragma unroll 1
  for (int q0 = 0; q0 < n; q0 += 2 * NTHR) {  // n is a multiple of 512
    float4 va[2], vb[2];
    int at[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int q = q0 + u * NTHR + static_cast<int>(threadIdx.x), r = q / cpr, j = q % cpr;
      const bool ok = r < L;
      const int64_t c = p0 + 8 * j, ro = ok ? r : 0;
      at[u] = kda_staged_at(r, 8 * j);
      va[u] = vb[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (ok) {
        va[u] = *reinterpret_cast<const float4*>(dvn + r * dvn_stride + c);
        vb[u] = *reinterpret_cast<const float4*>(dvn + r * dvn_stride + c + 4);
      }
      if constexpr (ALIGNED16) {
        mma::cp_async16(st_do + at[u], dout + ro * do_stride + c, ok);
        mma::cp_async16(st_vn + at[u], vn + ro * vn_stride + c, ok);
      } else {
        uint4 vo = make_uint4(0u, 0u, 0u, 0u), vv = vo;
        if (ok) {
          const T* po = dout + r * do_stride + c;
          const T* pv = vn + r * vn_stride + c;
          vo = make_uint4(mma::pack2<T>(po[0], po[1]), mma::pack2<T>(po[2], po[3]), mma::pack2<T>(po[4], po[5]),
                          mma::pack2<T>(po[6], po[7]));
          vv = make_uint4(mma::pack2<T>(pv[0], pv[1]), mma::pack2<T>(pv[2], pv[3]), mma::pack2<T>(pv[4], pv[5]),
                          mma::pack2<T>(pv[6], pv[7]));
        }
        *reinterpret_cast<uint4*>(st_do + at[u]) = vo;
        *reinterpret_cast<uint4*>(st_vn + at[u]) = vv;
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
      *reinterpret_cast<uint4*>(st_dvn + at[u]) =
          make_uint4(mma::pack_floats<T>(va[u].x, va[u].y), mma::pack_floats<T>(va[u].z, va[u].w),
                     mma::pack_floats<T>(vb[u].x, vb[u].y), mma::pack_floats<T>(vb[u].z, vb[u].w));
  }
  if constexpr (ALIGNED16) mma::cp_async_commit();
}

// One slice's three products (kSplit = false only), into swizzled tiles (kda_swz_at(r, d), written
// r * 64 + d here): dw[r * 64 + d] = -sum_c dv_new[r][c] hs[d][c],
// Y[..] = sum_c do[r][c] hs[d][c], X[..] = sum_c v_new[r][c] dhs[d][c] (r < 64 chunk rows, 0 past
// L; d < 64 slice channels, hs / dhs rows c0 + d of h_c / dh_{c+1}), and dot as
// kda_state_slice_product's (<hs[d], dhs[d]> in lanes tig == 0 of warps 0..3). Warp layout as above
// (warp w: channels 16 (w % 4).., rows 32 (w / 4)..). `stage` (3 x 64 x kKdaStagePiece T, 48 KiB)
// may alias dw / Y / X: the results are written after a barrier that follows the last read of it.
// Barriers inside; the caller's previous readers of stage / dw / Y / X must have passed a barrier.
// Every cp.async this thread committed before the call has landed when it returns (cp_async_wait<0>
// before the staging barrier).
template <typename T, bool ALIGNED16>
__device__ __forceinline__ void kda_state_slice_products_staged(const float* hs, const float* dhs, int64_t V,
                                                                const float* dvn, int64_t dvn_stride, const T* dout,
                                                                int64_t do_stride, const T* vn, int64_t vn_stride,
                                                                int L, T* stage, float* dw, float* Y, float* X,
                                                                float (&dot)[2]) {
  constexpr int NT = 4, SP = 64 * kKdaStagePiece;  // SP: elements per staged operand
  const int w = threadIdx.x / 32, g = mma::grp(), tg = mma::tig();
  const int d0 = 16 * (w % 4), nt0 = NT * (w / 4);
  // State rows d0 + g and d0 + g + 8 of hs and dhs, columns 4 tig..: pointers stepped by 16 columns
  // per fetch (the fetches run through the columns in order, across the pieces).
  const float* ph0 = hs + static_cast<int64_t>(d0 + g) * V + 4 * tg;
  const float* pe0 = dhs + static_cast<int64_t>(d0 + g) * V + 4 * tg;
  const float* ph1 = ph0 + 8 * V;
  const float* pe1 = pe0 + 8 * V;
  T* st_dvn = stage;
  T* st_do = stage + SP;
  T* st_vn = stage + 2 * SP;
  struct Raw {
    float4 h0, h1, e0, e1;  // columns c + 4 tig .. + 3 of state rows g, g + 8 of hs and dhs
  };
  auto fetch = [&](Raw& R) {
    R.h0 = *reinterpret_cast<const float4*>(ph0), R.h1 = *reinterpret_cast<const float4*>(ph1);
    R.e0 = *reinterpret_cast<const float4*>(pe0), R.e1 = *reinterpret_cast<const float4*>(pe1);
    ph0 += 16, ph1 += 16, pe0 += 16, pe1 += 16;
  };
  float aw[NT][4] = {}, ay[NT][4] = {}, ax[NT][4] = {}, dsum[2] = {0.f, 0.f};
  // This lane's chunk rows 8 (nt0 + nt) + g: the same (r & 3) = g & 3 for every nt.
  const int rbase = (8 * nt0 + g) * kKdaStagePiece + 4 * tg, sw = g & 3;
  // One step: R's values into fragments (and the dot), R refilled with the next fetch's columns
  // (refill: a constant at each call), then 3 x NT mmas with the staged rows' 8-byte pieces of unit
  // `unit` (the piece's columns 16 unit..).
  auto step = [&](Raw& R, int unit, bool refill) {
    uint32_t ah[4], ad[4];
    ah[0] = mma::pack_floats<T>(R.h0.x, R.h0.y), ah[1] = mma::pack_floats<T>(R.h1.x, R.h1.y);
    ah[2] = mma::pack_floats<T>(R.h0.z, R.h0.w), ah[3] = mma::pack_floats<T>(R.h1.z, R.h1.w);
    ad[0] = mma::pack_floats<T>(R.e0.x, R.e0.y), ad[1] = mma::pack_floats<T>(R.e1.x, R.e1.y);
    ad[2] = mma::pack_floats<T>(R.e0.z, R.e0.w), ad[3] = mma::pack_floats<T>(R.e1.z, R.e1.w);
    dsum[0] += R.h0.x * R.e0.x + R.h0.y * R.e0.y + R.h0.z * R.e0.z + R.h0.w * R.e0.w;
    dsum[1] += R.h1.x * R.e1.x + R.h1.y * R.e1.y + R.h1.z * R.e1.z + R.h1.w * R.e1.w;
    if (refill) fetch(R);
    const int off = rbase + ((unit ^ sw) << 4);  // + 8 rows per tile
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int o = off + 8 * kKdaStagePiece * nt;
      const uint2 bw = *reinterpret_cast<const uint2*>(st_dvn + o);
      const uint2 by = *reinterpret_cast<const uint2*>(st_do + o);
      const uint2 bx = *reinterpret_cast<const uint2*>(st_vn + o);
      const uint32_t fw[2] = {bw.x, bw.y}, fy[2] = {by.x, by.y}, fx[2] = {bx.x, bx.y};
      mma::mma16816<T>(aw[nt], ah, fw);
      mma::mma16816<T>(ay[nt], ah, fy);
      mma::mma16816<T>(ax[nt], ad, fx);
    }
  };
#pragma unroll 1
  for (int64_t p0 = 0; p0 < V; p0 += kKdaStagePiece) {
    const int pw = V - p0 < kKdaStagePiece ? static_cast<int>(V - p0) : kKdaStagePiece;  // a multiple of 64
    Raw ra, rb2;
    if (p0 > 0) __syncthreads();  // the previous piece's readers are done
    kda_stage_rows<T, ALIGNED16>(dvn, dvn_stride, dout, do_stride, vn, vn_stride, L, p0, pw, st_dvn, st_do, st_vn);
    fetch(ra);  // columns p0.., p0 + 16..: in flight during the copies' wait and the barrier
    fetch(rb2);
    mma::cp_async_wait<0>();  // this thread's copies, including any the caller committed before the call
    __syncthreads();
    const int last = pw / 16 - 2;  // the last pair of steps fetches nothing (the piece's columns end)
#pragma unroll 1
    for (int unit = 0; unit < last; unit += 2) {
      step(ra, unit, true);
      step(rb2, unit + 1, true);
    }
    step(ra, last, false);
    step(rb2, last + 1, false);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // over the 4 lanes (tig) of a row
    dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 1);
    dsum[i] += __shfl_xor_sync(0xffffffffu, dsum[i], 2);
    dot[i] = nt0 == 0 && tg == 0 ? dsum[i] : 0.f;
  }
  __syncthreads();  // every warp's last read of `stage` (which dw / Y / X may alias)
  // acc[nt][e] is out^T at (channel d0 + acc_row(e), row 8 (nt0 + nt) + acc_col(e)).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int at = kda_swz_at(8 * (nt0 + nt) + mma::acc_col(e), d0 + mma::acc_row(e));
      dw[at] = -aw[nt][e];
      Y[at] = ay[nt][e];
      X[at] = ax[nt][e];
    }
}

// dA's V part in the staged kernel: acc += X Y^T over ncols columns, X = dv_new rows (fp32, split
// hi + lo), Y = v rows (T, exact), rows >= L read as 0; kda_mma::rows_times_rows_global's warp
// layout (warp w: rows 16 (w % 4) + acc_row, columns 32 (w / 4) + 8 nt + acc_col) and result, with
// the staged products' column order (lane tig: columns c + 4 tig..c + 4 tig + 3 for the k indices
// 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9), so that each warp-wide load carries 16 (X) or 8 (Y)
// bytes per lane over its 8 rows: half the loads and L1 lookups of the 8- / 4-byte fragment loads
// (~6k lookups per block there, as many as all of h and dh). Y's rows must be 8-byte aligned.
// Loads four 16-column steps ahead (four register sets, 64 registers: the kernel's prologue holds
// little else; one step ahead, each step waited for its loads); ncols a multiple of 64. No barrier.
template <typename T>
__device__ __forceinline__ void kda_dvn_v_product(const float* x, int64_t xs, const T* y, int64_t ys, int64_t ncols,
                                                  int L, float (&acc)[4][4]) {
  const int w = threadIdx.x / 32, g = mma::grp(), c4 = 4 * mma::tig(), rs = w % 4, hf = w / 4;
  const int ra = 16 * rs + g, rb = ra + 8;
  const bool oka = ra < L, okb = rb < L;
  const float* xa = x + (oka ? ra : 0) * xs + c4;
  const float* xb = x + (okb ? rb : 0) * xs + c4;
  const T* y0 = y + (32 * hf + g) * ys + c4;  // tile nt: row 32 hf + 8 nt + g
  const int64_t y8 = 8 * ys;
  bool yok[4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) yok[nt] = 32 * hf + 8 * nt + g < L;
  struct Raw {
    float4 xa, xb;
    uint2 y[4];
  };
  auto fetch = [&](Raw& R, int64_t c) {
    R.xa = oka ? *reinterpret_cast<const float4*>(xa + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    R.xb = okb ? *reinterpret_cast<const float4*>(xb + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    const T* p = y0 + c;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt, p += y8) R.y[nt] = yok[nt] ? *reinterpret_cast<const uint2*>(p) : make_uint2(0u, 0u);
  };
  // One step: R's values into fragments, R refilled with the columns c_next.. (if < ncols), 8 mmas.
  auto step = [&](Raw& R, int64_t c_next) {
    uint32_t ah[4], al[4], b[4][2];
    mma::split_pair<T>(R.xa.x, R.xa.y, ah[0], al[0]);
    mma::split_pair<T>(R.xb.x, R.xb.y, ah[1], al[1]);
    mma::split_pair<T>(R.xa.z, R.xa.w, ah[2], al[2]);
    mma::split_pair<T>(R.xb.z, R.xb.w, ah[3], al[3]);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) b[nt][0] = R.y[nt].x, b[nt][1] = R.y[nt].y;
    if (c_next < ncols) fetch(R, c_next);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      mma::mma16816<T>(acc[nt], ah, b[nt]);
      mma::mma16816<T>(acc[nt], al, b[nt]);
    }
  };
  Raw r0, r1, r2, r3;
  fetch(r0, 0), fetch(r1, 16), fetch(r2, 32), fetch(r3, 48);
#pragma unroll 1
  for (int64_t c = 0; c < ncols; c += 64) {
    step(r0, c + 64);
    step(r1, c + 80);
    step(r2, c + 96);
    step(r3, c + 112);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
