// Chunked backward stage B2 ("grads"), one block of 128 threads (4 warps) per (chunk, value
// head): the per-chunk gradients of src/reference/delta_rule/chunked_backward.cpp (ChunkBackward:
// state update, output, prediction, WY products, inverse, key products, gates) for GDN and the
// plain rule, given h_c and v_new (stage 2), dh_{c+1} and dv_new (B1) and A (stage 1).
//
// Every matrix product runs on the tensor cores in TF32 (chunked_mma_tf32.cuh) with fp32
// accumulation; operands live in shared memory as fp32. Products that contract over the value
// dimension V stream [64 x SW] / [K x SW] slices of v_new, dv_new, dout, v, h_c and dh_{c+1}
// through a staging region; products over K or over the chunk read q, k, dw, A, dA, dP from
// shared memory. Warp w owns output rows [16 w, 16 w + 16) of every 64-row product and all of its
// columns, so each output element has one owner thread across all products (the dq, dk, dw
// updates below need no barrier between products).
//
// Notation (one chunk, rows i, j < L, e_i = exp(G_i), Gam_ij = exp(G_i - G_j) for j <= i,
// gl = G_{L-1}; dG is the gradient of the per-row cumulative gate, summed over K):
//   X = v_new dh_{c+1}^T:  dk += diag(exp(gl - G)) X,  s_i = sum_d X_id k_id exp(gl - G_i)
//   dq += scale diag(e) (do h^T),  dG_i += scale e_i (do h^T)_i . q_i
//   dw = -dv_new h^T
//   dP = scale Lower(do v_new^T):  dq += (dP o Gam) k,  dk += (dP o Gam)^T q,  dG += rowsum - colsum of dP o P
//   dA = Lower(dv_new (beta v)^T + dw (beta e k)^T),  dUb = A^T dv_new,  dWb = A^T dw
//   dv = diag(beta) dUb,  dbeta = rowsum(v o dUb) + rowsum(e k o dWb),  dk += diag(beta e) dWb,
//   dG += rowsum(dWb o beta e k)
//   dM = -StrictLower(A^T dA A^T),  dKk = diag(beta) dM:  dbeta += rowsum(dM o Kk),
//   dk += (dKk o Gam) k + (dKk o Gam)^T k,  dG += rowsum - colsum of dKk o Kk
//   dG_i -= s_i;  dG_{L-1} += exp(gl) <h, dh_{c+1}> + sum_i s_i;  dg = reverse cumsum of dG
// Per-row and per-column sums are reduced inside the warp by shuffles, then added to shared memory
// with one float atomic per row or column and warp (their order, and so the last bits of dbeta and
// dg, may vary between runs; dq and dk are summed over value heads by global atomics).
//
// Shared memory (fp32; LDK = K + 4 and LDC = 68 are = 4 mod 32, so the A-fragment reads of 8
// rows x 4 columns hit 32 different banks): q, k, dq, dk, dw [64][LDK]; region R = A, dA, dP
// [64][LDC] each (also the staging area of the V slices before A is loaded); G, beta, dG, dbeta
// [64]. K = 128: 217 KiB (one block per SM).
#pragma once

#include <type_traits>

#include "chunked_kda_mma.cuh"  // kda_key_rows_from
#include "chunked_mma_tf32.cuh"
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <int KMAX>
struct GradsSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 4, LDC = C + 4;
  float* q;    // [C][LDK] normalized q
  float* k;    // [C][LDK] normalized k
  float* dq;   // [C][LDK]
  float* dk;   // [C][LDK]
  float* dw;   // [C][LDK] dw, later (aliased) tmp = dA A^T [C][LDC]
  float* tmp;
  float* A;    // [C][LDC]  } region R (3 C LDC floats); before A is loaded it stages the
  float* dA;   // [C][LDC]  } V slices of the first products
  float* dPG;  // [C][LDC] dP (raw), then dP o Gam, later dM
  float* G;    // [C]
  float* beta;   // [C]
  float* dG;     // [C]
  float* dbeta;  // [C]
  static constexpr int kRegionFloats = 3 * C * LDC;
  static constexpr int64_t bytes() { return sizeof(float) * (5 * C * LDK + kRegionFloats + 4 * C); }
  __device__ explicit GradsSmem(unsigned char* raw) {
    q = reinterpret_cast<float*>(raw);
    k = q + C * LDK;
    dq = k + C * LDK;
    dk = dq + C * LDK;
    dw = dk + C * LDK;
    tmp = dw;
    A = dw + C * LDK;
    dA = A + C * LDC;
    dPG = dA + C * LDC;
    G = dPG + C * LDC;
    beta = G + C;
    dG = beta + C;
    dbeta = dG + C;
  }
};

// Slice widths (value columns per staging step) and their leading dimensions.
constexpr int kGradSliceW = 32, kGradSliceLd = 36;  // passes over V with [K x SW] operands
constexpr int kGradNarrowW = 16, kGradNarrowLd = 20;  // the four-operand pass (dP, du)
constexpr int kGradUbLd = 40;  // dUb's B operand is read down columns: ld = 8 mod 32

// WARPS = 4: the first tensor-core version (one warp per 16-row strip, all columns;
// FLASHGRAD_CHUNKED_BACKWARD=legacy). WARPS = 8: two warps per strip, each owning half of every
// product's columns (part = warp / 4: columns [part N / 2, +N / 2) of an N-column product), so
// twice the warps hide the fragment loads' latency in the one block an SM holds; the ownership
// rule above holds per (strip, half), and the row / column sums are shared-memory atomics either
// way. Loads are spread over all threads; with H == HV, dq and dk are stored, not added.
template <typename T, int KMAX, int WARPS = 4>
__global__ void __launch_bounds__(32 * WARPS, 1) chunk_grads_kernel(ChunkedArgs a) {
  using S = GradsSmem<KMAX>;
  static_assert(WARPS == 4 || WARPS == 8, "one or two warps per 16-row strip");
  constexpr int C = kChunkSize, LDK = S::LDK, LDC = S::LDC, THREADS = 32 * WARPS, SPLIT = WARPS / 4;
  // Accumulator tiles per warp of a 64 x K / 64 x 64 product.
  constexpr int NK = KMAX / 8 / SPLIT, NC = C / 8 / SPLIT;
  constexpr int SW = kGradSliceW, SL = kGradSliceLd, NW = kGradNarrowW, NL = kGradNarrowLd;
  static_assert(C * SL + KMAX * SL <= S::kRegionFloats, "pass X staging must fit region R");
  static_assert(2 * C * SL + KMAX * SL <= S::kRegionFloats, "pass YZ staging must fit region R");
  static_assert(2 * C * kGradUbLd <= 2 * C * LDC, "pass dUb staging must fit dA + dP");
  static_assert(4 * C * NL <= 2 * C * LDC, "pass dP staging must fit dA + dP");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = threadIdx.x, r0 = 16 * ((tid / 32) % 4), part = tid / 128;
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, K = a.K;
  const float scale = a.scale;
  const T* vn = static_cast<const T*>(a.v_new);
  const float* dvn = a.dv_new;
  const float* h = a.h + (c * a.HV + hv) * K * V;    // h_c [K][V]
  const float* dhn = a.dh + (c * a.HV + hv) * K * V;  // dL/dh_{c+1} [K][V]
  // Chunk row i (zero past L) of the [rows, HV, V] tensors, column col.
  auto vn_at = [&](int i, int64_t col) { return i < L ? to_f<T>(vn[((row0 + i) * a.HV + hv) * V + col]) : 0.f; };
  auto dvn_at = [&](int i, int64_t col) { return i < L ? dvn[((row0 + i) * a.HV + hv) * V + col] : 0.f; };
  auto do_at = [&](int i, int64_t col) {
    return i < L ? load_elem<T>(a.dout, off4(a.dout, ci.b, ci.t0 + i, hv, col)) : 0.f;
  };
  auto v_at = [&](int i, int64_t col) {
    return i < L ? load_elem<T>(a.v, off4(a.v, ci.b, ci.t0 + i, hv, col)) : 0.f;
  };
  // store(e, load(e)) for e < count over the block's threads, several loads in flight per thread
  // (batched_copy, chunked_rows.cuh, says why; it assumes 128 threads).
  auto copy = [&](int count, auto&& load, auto&& store) {
    if constexpr (WARPS == 4) {
      batched_copy(count, load, store);
    } else {
      constexpr int kBatch = 16;  // a [128 x 32] or [64 x 64] tile: all of a thread's loads at once
      for (int base = tid; base < count; base += kBatch * THREADS) {
        float buf[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) buf[i] = base + i * THREADS < count ? load(base + i * THREADS) : 0.f;
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (base + i * THREADS < count) store(base + i * THREADS, buf[i]);
      }
    }
  };
  // This warp's share of a product: acc (NT tiles of 8 columns) covers output columns
  // [c0, c0 + 8 NT) with c0 = part * 8 NT; gemm adds sum_kk a_at(r, kk) b_at(kk, c0 + n), each
  // calls f(row, column, value) with the product's column.
  auto gemm = [&](auto& acc, int ksteps, auto&& a_at, auto&& b_at) {
    constexpr int NT = std::extent_v<std::remove_reference_t<decltype(acc)>>;
    const int c0 = part * 8 * NT;
    mma::warp_gemm_tf32(acc, r0, 0, ksteps, a_at, [&](int kk, int n) { return b_at(kk, c0 + n); });
  };
  auto each = [&](const auto& acc, auto&& f) {
    constexpr int NT = std::extent_v<std::remove_reference_t<decltype(acc)>>;
    const int c0 = part * 8 * NT;
    mma::for_each_acc(acc, r0, [&](int r, int n, float x) { f(r, c0 + n, x); });
  };
  // Stages `width` columns from col0 of a 64-row tensor into dst [64][ld] (coalesced along columns).
  auto stage_rows = [&](float* dst, int ld, int width, int64_t col0, auto&& at) {
    copy(
        C * width, [&](int e) { return at(e / width, col0 + e % width); },
        [&](int e, float x) { dst[(e / width) * ld + e % width] = x; });
  };
  // Same for a [K][V] fp32 state (rows d < K).
  auto stage_state = [&](float* dst, int ld, int width, int64_t col0, const float* src) {
    copy(
        KMAX * width, [&](int e) { return src[(e / width) * V + col0 + e % width]; },
        [&](int e, float x) { dst[(e / width) * ld + e % width] = x; });
  };

  // WARPS = 8: the fp32 intermediates (dv_new, h_c, dh_{c+1}) arrive by cp.async, issued before the
  // 16-bit tensors' register copies so that both are in flight together; `staged` waits for them
  // and barriers. (The legacy path copies everything through registers.)
  auto stage_dvn = [&](float* dst, int ld, auto width_c, int64_t col0) {
    constexpr int W = decltype(width_c)::value;
    if constexpr (WARPS == 8)
      intermediate_tile_async<float, W, THREADS>(dvn, row0, a.HV, hv, V, col0, L, dst, ld);
    else
      stage_rows(dst, ld, W, col0, dvn_at);
  };
  auto stage_state_slice = [&](float* dst, int ld, int64_t col0, const float* src) {
    if constexpr (WARPS == 8) {
      for (int rb = 0; rb < KMAX; rb += C)  // 64 state rows per call: src[(rb + r) V + col0 + col]
        intermediate_tile_async<float, SW, THREADS>(src + rb * V, 0, 1, 0, V, col0, C, dst + rb * ld, ld);
    } else {
      stage_state(dst, ld, SW, col0, src);
    }
  };
  auto staged = [&] {
    if constexpr (WARPS == 8) {
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
    }
    __syncthreads();
  };
  using SliceW = std::integral_constant<int, SW>;
  using NarrowW = std::integral_constant<int, NW>;

  // S0: inputs of the chunk; zeroed accumulators.
  if (tid < C) {
    const bool ok = tid < L;
    sm.G[tid] = (a.G && ok) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
    sm.beta[tid] = ok ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dG[tid] = 0.f;
    sm.dbeta[tid] = 0.f;
  }
  if constexpr (WARPS == 8) {
    // q by threads [0, 128) and k by [128, 256) at once, each with up to 4 passes' loads in flight
    // (kda_key_rows_from: for_each_key_row's layout with batched loads).
    const bool is_k = tid >= kChunkThreads;
    float* dst = is_k ? sm.k : sm.q;
    kda_key_rows_from<T, KMAX>(
        is_k ? kChunkThreads : 0, is_k ? a.k : a.q, ci, head, a.l2norm, [](int, int) { return 0.f; },
        [&](int r, int d, float x, float) { dst[r * LDK + d] = x; });
  } else {
    for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) { sm.q[r * LDK + d] = x; });
    for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) { sm.k[r * LDK + d] = x; });
  }
  for (int e = tid; e < C * KMAX; e += THREADS) sm.dq[(e / KMAX) * LDK + e % KMAX] = sm.dk[(e / KMAX) * LDK + e % KMAX] = 0.f;
  __syncthreads();
  const float gl = sm.G[L - 1];

  // S1a: X = v_new dh_{c+1}^T over V slices -> dk, s_i (into dG_i and dG_{L-1}).
  {
    float* vs = sm.A;              // [C][SL] v_new slice
    float* hs = sm.A + C * SL;     // [KMAX][SL] dh_{c+1} slice
    float* hc = hs + KMAX * SL;    // [KMAX][SL] h_c slice (WARPS = 8: <h_c, dh_{c+1}> from here)
    static_assert(C * SL + 2 * KMAX * SL <= S::kRegionFloats, "pass X staging with h_c must fit region R");
    float acc[NK][4];
    mma::zero_acc(acc);
    float hdh = 0.f;  // this thread's share of <h_c, dh_{c+1}> (WARPS = 8)
    for (int64_t col0 = 0; col0 < V; col0 += SW) {
      __syncthreads();
      stage_state_slice(hs, SL, col0, dhn);
      if constexpr (WARPS == 8) stage_state_slice(hc, SL, col0, h);
      stage_rows(vs, SL, SW, col0, vn_at);
      staged();
      gemm(acc, SW / 8, [&](int r, int kk) { return vs[r * SL + kk]; },
                          [&](int kk, int n) { return hs[n * SL + kk]; });
      if constexpr (WARPS == 8)
        for (int e = tid; e < KMAX * SW; e += THREADS) {
          const int at = (e / SW) * SL + e % SW;
          hdh += hc[at] * hs[at];
        }
    }
    float last = 0.f, rs[2] = {0.f, 0.f};
    each(acc, [&](int i, int d, float X) {
      const float kd = expf(gl - sm.G[i]);
      sm.dk[i * LDK + d] += X * kd;
      const float s = i < L ? X * kd * sm.k[i * LDK + d] : 0.f;
      rs[(i - r0) / 8] -= s;
      last += s;
    });
    mma::add_row_sums(sm.dG, r0, rs);
    // <h_c, dh_{c+1}> (the state gradient's share of dG_{L-1}): WARPS = 8 summed from the staged
    // slices above; the legacy path reads it straight from global memory, eight independent partial
    // sums so that eight pairs of loads are in flight per thread.
    const float el = expf(gl);
    if constexpr (WARPS == 8) {
      last += el * hdh;
    } else {
      float psum[8] = {};
      for (int64_t e0 = tid; e0 < K * V; e0 += 8 * THREADS) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int64_t e = e0 + i * THREADS;
          if (e < K * V) psum[i] += h[e] * dhn[e];
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) last += el * psum[i];
    }
    atomicAdd(&sm.dG[L - 1], last);
  }

  // S1b: Y = do h_c^T and Z = dv_new h_c^T over V slices -> dq, dG; dw = -Z.
  {
    float* ds = sm.A;                 // [C][SL] dout slice
    float* us = sm.A + C * SL;        // [C][SL] dv_new slice
    float* hs = sm.A + 2 * C * SL;    // [KMAX][SL] h_c slice
    float accY[NK][4], accZ[NK][4];
    mma::zero_acc(accY);
    mma::zero_acc(accZ);
    for (int64_t col0 = 0; col0 < V; col0 += SW) {
      __syncthreads();
      stage_dvn(us, SL, SliceW{}, col0);
      stage_state_slice(hs, SL, col0, h);
      stage_rows(ds, SL, SW, col0, do_at);
      staged();
      auto h_b = [&](int kk, int n) { return hs[n * SL + kk]; };
      gemm(accY, SW / 8, [&](int r, int kk) { return ds[r * SL + kk]; }, h_b);
      gemm(accZ, SW / 8, [&](int r, int kk) { return us[r * SL + kk]; }, h_b);
    }
    float rs[2] = {0.f, 0.f};
    each(accY, [&](int i, int d, float Y) {
      const float qg = scale * expf(sm.G[i]) * Y;
      sm.dq[i * LDK + d] += qg;
      rs[(i - r0) / 8] += qg * sm.q[i * LDK + d];
    });
    mma::add_row_sums(sm.dG, r0, rs);
    each(accZ, [&](int i, int d, float Z) { sm.dw[i * LDK + d] = -Z; });
  }
  __syncthreads();  // region R free again; dw complete

  // A (lower triangular, rows past L zero) into its slot.
  copy(
      C * C,
      [&](int e) {
        const int i = e / C, j = e % C;
        return (i < L && j <= i) ? a.A[((row0 + i) * a.HV + hv) * C + j] : 0.f;
      },
      [&](int e, float x) { sm.A[(e / C) * LDC + e % C] = x; });

  // S4a: dUb = A^T dv_new over V slices -> dv = diag(beta) dUb, dbeta += rowsum(v o dUb).
  {
    float* us = sm.dA;                 // [C][kGradUbLd] dv_new slice
    float* vs = sm.dA + C * kGradUbLd;  // [C][kGradUbLd] v slice
    constexpr int NS = SW / 8 / SPLIT;
    for (int64_t col0 = 0; col0 < V; col0 += SW) {
      __syncthreads();
      stage_dvn(us, kGradUbLd, SliceW{}, col0);
      stage_rows(vs, kGradUbLd, SW, col0, v_at);
      staged();
      float acc[NS][4];
      mma::zero_acc(acc);
      gemm(acc, C / 8, [&](int r, int kk) { return sm.A[kk * LDC + r]; },
                          [&](int kk, int n) { return us[kk * kGradUbLd + n]; });
      float rs[2] = {0.f, 0.f};  // this thread's rows r0 + grp and r0 + grp + 8
      each(acc, [&](int j, int n, float dub) {
        if (j < L) a.dv[((row0 + j) * a.HV + hv) * V + col0 + n] = sm.beta[j] * dub;
        rs[(j - r0) / 8] += vs[j * kGradUbLd + n] * dub;
      });
      mma::add_row_sums(sm.dbeta, r0, rs);
    }
  }

  // S2a: dP = do v_new^T and du = dv_new v^T (j <= i parts used) over narrow V slices.
  {
    float* ds = sm.dA;               // [C][NL] each: dout, v_new, dv_new, v slices
    float* vns = ds + C * NL;
    float* us = vns + C * NL;
    float* vs = us + C * NL;
    float accP[NC][4], accU[NC][4];
    mma::zero_acc(accP);
    mma::zero_acc(accU);
    for (int64_t col0 = 0; col0 < V; col0 += NW) {
      __syncthreads();
      stage_dvn(us, NL, NarrowW{}, col0);
      if constexpr (WARPS == 8) {
        // The three 16-bit slices together: all of a thread's loads in flight before any store.
        constexpr int kPer = C * NW / THREADS;
        static_assert(C * NW % THREADS == 0, "whole narrow slices per thread");
        float x[3][kPer];
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int e = tid + i * THREADS, r = e / NW;
          const int64_t col = col0 + e % NW;
          x[0][i] = do_at(r, col);
          x[1][i] = vn_at(r, col);
          x[2][i] = v_at(r, col);
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int e = tid + i * THREADS, at = (e / NW) * NL + e % NW;
          ds[at] = x[0][i];
          vns[at] = x[1][i];
          vs[at] = x[2][i];
        }
      } else {
        stage_rows(ds, NL, NW, col0, do_at);
        stage_rows(vns, NL, NW, col0, vn_at);
        stage_rows(vs, NL, NW, col0, v_at);
      }
      staged();
      gemm(accP, NW / 8, [&](int r, int kk) { return ds[r * NL + kk]; },
                          [&](int kk, int n) { return vns[n * NL + kk]; });
      gemm(accU, NW / 8, [&](int r, int kk) { return us[r * NL + kk]; },
                          [&](int kk, int n) { return vs[n * NL + kk]; });
    }
    __syncthreads();  // the slices (in dA, dP) are dead: store the raw products there
    each(accP, [&](int i, int j, float x) { sm.dPG[i * LDC + j] = x; });
    each(accU, [&](int i, int j, float x) { sm.dA[i * LDC + j] = x; });
  }

  // S2b: qk = q k^T and dw k^T over K; with dP, du (same owner thread) -> dP o Gam, dA, gate terms.
  {
    float accQK[NC][4], accWK[NC][4];
    mma::zero_acc(accQK);
    mma::zero_acc(accWK);
    auto k_b = [&](int kk, int n) { return sm.k[n * LDK + kk]; };
    gemm(accQK, KMAX / 8, [&](int r, int kk) { return sm.q[r * LDK + kk]; }, k_b);
    gemm(accWK, KMAX / 8, [&](int r, int kk) { return sm.dw[r * LDK + kk]; }, k_b);
    float rs[2] = {0.f, 0.f}, cs[NC][2] = {};  // dP o P: + row sums, - column sums into dG
#pragma unroll
    for (int nt = 0; nt < NC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + mma::acc_row(e), j = part * 8 * NC + 8 * nt + mma::acc_col(e);
        float dpg = 0.f, da = 0.f;
        if (i < L && j <= i) {
          const float dP = scale * sm.dPG[i * LDC + j];
          const float gam = expf(sm.G[i] - sm.G[j]), wj = sm.beta[j] * expf(sm.G[j]);
          dpg = dP * gam;
          const float dPP = dpg * accQK[nt][e];  // dP_ij P_ij
          rs[e >> 1] += dPP;
          cs[nt][e & 1] -= dPP;
          da = sm.beta[j] * sm.dA[i * LDC + j] + wj * accWK[nt][e];
        }
        sm.dPG[i * LDC + j] = dpg;
        sm.dA[i * LDC + j] = da;
      }
    mma::add_row_sums(sm.dG, r0, rs);
    mma::add_column_sums(sm.dG + part * 8 * NC, cs);
  }
  __syncthreads();

  // S3: dq += (dP o Gam) k;  dk += (dP o Gam)^T q;  dWb = A^T dw -> dk, dbeta, dG.
  {
    float acc[NK][4];
    mma::zero_acc(acc);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.dPG[r * LDC + kk]; },
                        [&](int kk, int n) { return sm.k[kk * LDK + n]; });
    each(acc, [&](int r, int d, float x) { sm.dq[r * LDK + d] += x; });
    mma::zero_acc(acc);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.dPG[kk * LDC + r]; },
                        [&](int kk, int n) { return sm.q[kk * LDK + n]; });
    each(acc, [&](int r, int d, float x) { sm.dk[r * LDK + d] += x; });
    mma::zero_acc(acc);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.A[kk * LDC + r]; },
                        [&](int kk, int n) { return sm.dw[kk * LDK + n]; });
    float rs[2] = {0.f, 0.f};
    each(acc, [&](int r, int d, float dwb) {
      const float er = expf(sm.G[r]);
      sm.dk[r * LDK + d] += sm.beta[r] * er * dwb;
      rs[(r - r0) / 8] += er * sm.k[r * LDK + d] * dwb;  // (e k o dWb)_rd
    });
    const float rb[2] = {sm.beta[r0 + mma::grp()] * rs[0], sm.beta[r0 + mma::grp() + 8] * rs[1]};
    mma::add_row_sums(sm.dbeta, r0, rs);
    mma::add_row_sums(sm.dG, r0, rb);
  }
  __syncthreads();  // dw and dP o Gam are dead

  // S5: tmp = dA A^T (where dw was), then dM = -StrictLower(A^T tmp) (where dP o Gam was).
  {
    float acc[NC][4];
    mma::zero_acc(acc);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.dA[r * LDC + kk]; },
                        [&](int kk, int n) { return sm.A[n * LDC + kk]; });
    each(acc, [&](int i, int m, float x) { sm.tmp[i * LDC + m] = x; });
    __syncthreads();
    mma::zero_acc(acc);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.A[kk * LDC + r]; },
                        [&](int kk, int n) { return sm.tmp[kk * LDC + n]; });
    each(acc, [&](int i, int j, float x) { sm.dPG[i * LDC + j] = (i < L && j < i) ? -x : 0.f; });
  }
  __syncthreads();  // dA is dead

  // S6: key products Kk = (k k^T) o Gam: dKk o Gam (where dA was) and the dbeta, dG terms.
  {
    float acc[NC][4];
    mma::zero_acc(acc);
    auto k_b = [&](int kk, int n) { return sm.k[n * LDK + kk]; };
    gemm(acc, KMAX / 8, [&](int r, int kk) { return sm.k[r * LDK + kk]; }, k_b);
    float rb[2] = {0.f, 0.f}, rg[2] = {0.f, 0.f}, cg[NC][2] = {};
#pragma unroll
    for (int nt = 0; nt < NC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + mma::acc_row(e), j = part * 8 * NC + 8 * nt + mma::acc_col(e);
        float out = 0.f;
        if (i < L && j < i) {
          const float gam = expf(sm.G[i] - sm.G[j]), Kk = acc[nt][e] * gam, dM = sm.dPG[i * LDC + j];
          const float dKk = sm.beta[i] * dM;
          rb[e >> 1] += dM * Kk;
          rg[e >> 1] += dKk * Kk;
          cg[nt][e & 1] -= dKk * Kk;
          out = dKk * gam;
        }
        sm.dA[i * LDC + j] = out;
      }
    mma::add_row_sums(sm.dbeta, r0, rb);
    mma::add_row_sums(sm.dG, r0, rg);
    mma::add_column_sums(sm.dG + part * 8 * NC, cg);
  }
  __syncthreads();
  {  // dk += (dKk o Gam) k + (dKk o Gam)^T k
    float acc[NK][4];
    mma::zero_acc(acc);
    auto k_b = [&](int kk, int n) { return sm.k[kk * LDK + n]; };
    gemm(acc, C / 8, [&](int r, int kk) { return sm.dA[r * LDC + kk]; }, k_b);
    gemm(acc, C / 8, [&](int r, int kk) { return sm.dA[kk * LDC + r]; }, k_b);
    each(acc, [&](int r, int d, float x) { sm.dk[r * LDK + d] += x; });
  }
  __syncthreads();

  // S7: outputs. dg = reverse cumsum of dG inside the chunk (one thread: 64 adds).
  if (tid == 0 && a.dg) {
    float acc = 0.f;
    for (int i = L - 1; i >= 0; --i) {
      acc += sm.dG[i];
      a.dg[(row0 + i) * a.HV + hv] = acc;
    }
  }
  if (tid < L) a.dbeta[(row0 + tid) * a.HV + hv] = sm.dbeta[tid];
  // dq, dk: one value head per key head (WARPS = 8 and H == HV): this block's values are the
  // sums; otherwise added over the group's value heads.
  const bool sole = WARPS == 8 && a.H == a.HV;
  for (int e = tid; e < L * KMAX; e += THREADS) {
    const int r = e / KMAX, d = e % KMAX;
    const int64_t at = ((row0 + r) * a.H + head) * K + d;
    if (sole) {
      a.dq_acc[at] = sm.dq[r * LDK + d];
      a.dk_acc[at] = sm.dk[r * LDK + d];
    } else {
      atomicAdd(&a.dq_acc[at], sm.dq[r * LDK + d]);
      atomicAdd(&a.dk_acc[at], sm.dk[r * LDK + d]);
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
