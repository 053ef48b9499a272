// Split KDA B2, first kernel (session 10; since session 11 in its staged form by default, kStaged
// below; FLASHGRAD_CHUNKED_KDA_B2=split runs the session-10 form): everything of
// kda_grads_kernel (chunked_kda_grads.cuh, whose notation this uses) except the per-channel decayed
// sums aq, ak, bm, ck, which the second kernel (chunked_kda_grads_local.cuh) forms.
//
// Why: kda_grads_kernel holds fp32 [64][K] tiles of q, k, G, dk, dG, dw at once (225 KiB at K = 128),
// so one block of 8 warps runs per SM and the kernel is latency-bound (ncu, session 6: issue active
// 22%). Here both kernels walk the key channels in slices of 64 ([64][64] tiles, 16 KiB) and keep at
// most ~113 KiB of shared memory and 128 registers, two blocks (16 warps) per SM.
//
// One block of 8 warps per (chunk, value head), grid chunks x HV. Per slice s (channels c0 = 64 s ..):
//   dw_s = -dv_new h_s^T and Y_s = do h_s^T in one pass over h, X_s = v_new dh_s^T
//   (chunked_kda_grads_state_product.cuh: h / dh rows of the slice straight from global memory into
//   fragments, hi + lo or rounded once by kSplit),
//   <h[d], dh[d]> on X's pass;
//   dA += dw_s Wb_s^T (Wb = beta e o k, formed in the loader), summed over the slices in a shared
//   tile (dA is the one quantity that sums over all K);
//   dq_s = scale e Y (stored by a coalesced pass, which leaves q o dq_s in Y's tile);
//   dWb_s = A^T dw_s, and at its fragment elements (r, d) the state and WY terms of the slice:
//     dk_s = X exp(gl - G) + beta e dWb;
//     dG_s = q o dq_s - X k exp(gl - G) + beta e k dWb;  dbeta += rowsum(e k dWb);
//     sl_d = sum_r X k exp(gl - G) + exp(gl_d) <h[d], dh[d]>  (added to dG's last row L - 1; its sum
//     is formed in the dq pass).
// After the slices: dA = Lower_incl(dv_new (beta v)^T + dw Wb^T), dM = -StrictLower(A^T dA A^T).
// Writes (the second kernel reads them back, block for block):
//   dq_acc, dk_acc: dq_s, dk_s (stored; added atomically under GVA);
//   dg:   dG_s (with sl in row L - 1), the "state" part of dG before the reverse cumsum;
//   (dk_s and dG_s are formed at dWb's fragment elements into shared tiles, then stored coalesced.)
//   dbeta: the WY part rowsum(e k dWb);
//   dv:   dM row i in columns [0, 64) of dv's row i (V >= 64). dv is written for good only by the
//         second kernel, after its block has read dM (same (chunk, value head)): no extra scratch.
// Rows past L: G repeats row L - 1, k, X, Y, dw, A are 0, so no term there is nonzero and nothing is
// stored. 106 KiB of shared memory (K = 128 or 64).
//
// The staged form (kStaged, session 11, the default; docs/perf/delta_rule.md "KDA B2 state kernel,
// session 11"): the same outputs, with
//   - the three products of a slice in one pass, the chunk rows of dv_new (rounded to T), do, v_new
//     staged in shared memory over the dw / Y / X tiles and h / dh read by 16-byte loads
//     (kda_state_slice_products_staged), the next slice's h / dh prefetched into L2 (kPrefetch);
//   - the slice tiles swizzled by row (kda_swz_at, kda_swz16_at), A / dA at pitches 68 / 72, so that
//     every fragment-layout pass is free of bank conflicts (ncu run 10.4: the session-10 form was
//     bound by L1 wavefronts, 74% of its shared wavefronts excessive);
//   - G, k, A and the staged do / v_new by cp.async; dA's V part and the row norms by 16-byte loads;
//   - dA += dw Wb^T in a 2 x 4 warp layout, dWb and dA with their k loops unrolled;
//   - X exp(gl - G) formed once, in the dq pass.
// 108.5 KiB of shared memory. H200, B4 T4096 H16 K=V=128: 1.94 -> 0.90 ms per call (run 11.3).
#pragma once

#include <type_traits>

#include "chunked_kda_grads_slices.cuh"
#include "chunked_kda_grads_state_product.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// k is kept raw in T (exact; normalized on read with rk), which leaves room for dA's own tile: dA's
// K part is summed over the slices in shared memory, not in 16 registers held across the slice
// loop (the fused dw / Y product needs them).
// kPad (the staged variant): A at pitch 68 and dA at pitch 72, so that their fragment-layout reads and
// (float2) updates hit 32 different banks (at 65 the products with A saw 4-way conflicts: ncu run 10.4).
template <typename T, bool kPad = false>
struct KdaGradsStateSmem {
  static constexpr int C = kChunkSize, KS = kKdaSliceK, LDA = kPad ? C + 4 : C + 1, LDM = kPad ? C + 8 : C + 1;
  float *G, *dw, *Y, *X;  // [C][KS]: the slice's G (log2 units: kda_gate_slice), dw, Y, X
  T* k;                   // [C][KS]: the slice's k as stored (0 past L)
  float *A, *mat;         // [C][LDA]: A; [C][LDM]: dA (unmasked: the V part, then + dw Wb^T per slice)
  float* tmp;             // after the slices: dA A^T [C][C] in dw's space
  float *beta, *rq, *rk, *dbeta;  // [C]
  float* sl;                      // [2][KS]: slice s sums into sl + KS (s % 2) (see the slice loop)
  static constexpr int64_t bytes() {
    return sizeof(float) * (4 * C * KS + C * LDA + C * LDM + 4 * C + 2 * KS) + sizeof(T) * C * KS;
  }
  __device__ explicit KdaGradsStateSmem(unsigned char* raw) {
    G = reinterpret_cast<float*>(raw);
    dw = G + C * KS;
    Y = dw + C * KS;
    X = Y + C * KS;
    A = X + C * KS;
    mat = A + C * LDA;
    beta = mat + C * LDM;
    rq = beta + C;
    rk = rq + C;
    dbeta = rk + C;
    sl = dbeta + C;
    k = reinterpret_cast<T*>(sl + 2 * KS);  // 16-byte aligned: every float array above is a multiple of 16 bytes
    tmp = dw;
  }
};
static_assert(KdaGradsStateSmem<__nv_bfloat16>::bytes() <= 113 * 1024 &&
                  KdaGradsStateSmem<__nv_bfloat16, true>::bytes() <= 113 * 1024,
              "two blocks per SM");

// kSplit: the state products with hi + lo operands (FLASHGRAD_CHUNKED_KDA_B2=split_exact) or rounded
// once to T (chunked_kda_grads_state_product.cuh). kStaged (session 11, the default; rounded operands
// only): the three products in one pass with the chunk's rows of dv_new, do, v_new staged in shared
// memory over the dw / Y / X tiles (kda_state_slice_products_staged), swizzled tiles, cp.async slice
// loads (docs/perf/delta_rule.md, "KDA B2 state kernel, session 11").
// kPrefetch (staged only; off by default since session 12, FLASHGRAD_CHUNKED_KDA_B2=staged_prefetch turns
// it on: run 11.4 timed it 0.076 ms slower per call): the h / dh rows of the next slice prefetched into L2
// (kda_prefetch_l2).
template <typename T, int KMAX, bool kSplit, bool kStaged = false, bool kPrefetch = false>
__global__ void __launch_bounds__(kKdaSplitThreads, 2) kda_grads_state_kernel(ChunkedArgs a) {
  using S = KdaGradsStateSmem<T, kStaged>;
  constexpr int C = kChunkSize, KS = kKdaSliceK, LDA = S::LDA, LDM = S::LDM;
  // Element (r, d) of the slice tiles G, dw, Y, X (and of tmp after the slices) and of k: row-major,
  // or swizzled in the staged variant (kda_swz_at: conflict-free fragment-layout passes).
  auto ti = [](int r, int d) {
    if constexpr (kStaged)
      return kda_swz_at(r, d);
    else
      return r * KS + d;
  };
  auto tk = [](int r, int d) {
    if constexpr (kStaged)
      return kda_swz16_at(r, d);
    else
      return r * KS + d;
  };
  static_assert(KMAX % KS == 0, "whole slices");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = threadIdx.x, rs = (tid / 32) % 4, n0 = 32 * (tid / 128);
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, K = a.K, HV = a.HV, HVV = a.HV * a.V;
  const float scale = a.scale;
  const T* vn_base = static_cast<const T*>(a.v_new) + (row0 * HV + hv) * V;  // row r: + r * HV V
  const T* do_base = static_cast<const T*>(a.dout.p) + off4(a.dout, ci.b, ci.t0, hv, 0);  // row r: + r * s1
  const T* v_base = static_cast<const T*>(a.v.p) + off4(a.v, ci.b, ci.t0, hv, 0);       // row r: + r * s1
  const float* dvn_base = a.dv_new + (row0 * HV + hv) * V;                              // row r: + r * HV V
  const float* h = a.h + (c * HV + hv) * K * V;    // h_c [K][V]
  const float* dhn = a.dh + (c * HV + hv) * K * V;  // dL/dh_{c+1} [K][V]
  const bool pairs_do = (reinterpret_cast<uintptr_t>(do_base) & 3) == 0 && a.dout.s1 % 2 == 0;
  const bool pairs_v = (reinterpret_cast<uintptr_t>(v_base) & 3) == 0 && a.v.s1 % 2 == 0;
  static_assert(!(kStaged && kSplit), "the staged products round their operands to T");
  // The staged products' 16-byte loads of do and v_new rows (V is a multiple of 64).
  const bool rows16 = (reinterpret_cast<uintptr_t>(do_base) & 15) == 0 && a.dout.s1 % 8 == 0 &&
                      (reinterpret_cast<uintptr_t>(vn_base) & 15) == 0;
  const bool k_rows16 = kStaged && kda_key_rows16<T>(a.k, ci, head);  // k's slice by cp.async
  const bool gva = a.H != a.HV;
  auto add_or_store = [gva](float* p, float x) {
    if (gva)
      atomicAdd(p, x);
    else
      *p = x;
  };
  // Row r, channel d of dq / dk at + r * H K + d; of dg at + r * HV K + d.
  float* dq_row0 = a.dq_acc + (row0 * a.H + head) * K;
  float* dk_row0 = a.dk_acc + (row0 * a.H + head) * K;
  float* dg_row0 = a.dg + (row0 * HV + hv) * K;
  const int64_t qk_stride = a.H * K, dg_stride = HV * K;
  const T* q_rows = static_cast<const T*>(a.q.p) + off3(a.q, ci.b, ci.t0, head);  // row r: + r * s1

  if constexpr (kPrefetch) {  // the first slice's h / dh rows into L2 while the prologue runs
    kda_prefetch_l2(h, KS * V);
    kda_prefetch_l2(dhn, KS * V);
  }
  if constexpr (kStaged) {  // A by cp.async, in flight with the row norms' loads
    kda_load_A_async(a.A, row0, hv, HV, L, sm.A, LDA);
    mma::cp_async_commit();
  }
  if (tid < C) {
    sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dbeta[tid] = 0.f;
  }
  if (tid < 2 * KS) sm.sl[tid] = 0.f;
  if (kStaged && kda_key_rows16<T>(a.q, ci, head))
    kda_row_rstd16<T, KMAX>(a.q, ci, head, a.l2norm, sm.rq);
  else
    kda_row_rstd<T, KMAX>(a.q, ci, head, a.l2norm, sm.rq);
  if (k_rows16)
    kda_row_rstd16<T, KMAX>(a.k, ci, head, a.l2norm, sm.rk);
  else
    kda_row_rstd<T, KMAX>(a.k, ci, head, a.l2norm, sm.rk);
  if constexpr (kStaged) {
    mma::cp_async_wait<0>();
    kda_load_A_fix(L, sm.A, LDA);
  } else {
    kda_load_A(a.A, row0, hv, HV, L, sm.A, LDA);
  }
  __syncthreads();

  // dA's V part, dv_new (beta v)^T: v exact in T, dv_new split; beta_j per column. The warp's
  // 16 x 32 block: rows 16 rs.., columns n0 + 8 nt.. (rows_times_rows_global's layout).
  {
    float acc[4][4] = {};
    if (kStaged && (reinterpret_cast<uintptr_t>(v_base) & 7) == 0 && a.v.s1 % 4 == 0)
      kda_dvn_v_product<T>(dvn_base, HVV, v_base, a.v.s1, V, L, acc);
    else if (pairs_v)
      kda_mma::rows_times_rows_global<T, true>(dvn_base, HVV, v_base, a.v.s1, V, L, acc);
    else
      kda_mma::rows_times_rows_global<T, false>(dvn_base, HVV, v_base, a.v.s1, V, L, acc);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // mat's element (i, j) has this one owner in every pass below
        const int i = 16 * rs + mma::acc_row(e), j = n0 + 8 * nt + mma::acc_col(e);
        sm.mat[i * LDM + j] = acc[nt][e] * sm.beta[j];
      }
  }

  auto kx = [&](int r, int d) { return to_f<T>(sm.k[tk(r, d)]); };  // raw k (times rk[r]: normalized)
  // The coalesced passes' elements (r0 + 4 m, d), r0 = tid / 64 < 4: in the swizzled tiles the row's
  // swizzle alternates with m's parity, so two bases and constant offsets (else the compiler keeps 16
  // hoisted offsets, spilled).
  auto coalesced_at = [&](int r0, int d) {
    const int e = ti(r0, d), o = ti(r0 + 4, d) - 4 * KS;
    return [=](int m) {
      if constexpr (kStaged)
        return (m & 1 ? o : e) + 4 * KS * m;
      else
        return ti(r0 + 4 * m, d);
    };
  };
#pragma unroll 1
  for (int c0 = 0; c0 < KMAX; c0 += KS) {
    // sl of this slice: its buffer was last read by the store pass of slice s - 2, two barriers ago.
    float* sl = sm.sl + KS * ((c0 / KS) % 2);
    if (c0 >= 2 * KS && tid < KS) sl[tid] = 0.f;
    if constexpr (kStaged) {
      // By cp.async, in flight with the staged products' loads (they wait for these copies too); G to
      // log2 units after the products (first read after the barrier that follows them).
      kda_gate_slice_async<KMAX>(a.G, ci, row0, hv, HV, c0, sm.G);
      if (k_rows16)
        kda_key_slice_async<T>(a.k, ci, head, c0, sm.k);
      else
        kda_key_slice_each<T>(a.k, ci, head, c0, [&](int r, int d, T v) { sm.k[tk(r, d)] = v; });
      mma::cp_async_commit();
    } else {
      kda_gate_slice<KMAX>(a.G, ci, row0, hv, HV, c0, sm.G);
      kda_key_slice_raw<T>(a.k, ci, head, c0, sm.k);
    }
    // The products with the states (no barrier inside; each thread writes its own fragment elements).
    const float* hs = h + static_cast<int64_t>(c0) * V;  // rows c0.. of h_c and dh_{c+1}
    const float* dhs = dhn + static_cast<int64_t>(c0) * V;
    float hdot[2];  // <dh[d], h[d]> for channels c0 + 16 (w % 4) + grp (+ 8); nonzero in one lane per channel
    if constexpr (kStaged) {
      // The staging area is dw / Y / X (48 KiB, contiguous), free since the previous slice's last barrier.
      static_assert(3 * C * kKdaStagePiece * sizeof(T) <= 3 * C * KS * sizeof(float), "staging within dw, Y, X");
      T* stage = reinterpret_cast<T*>(sm.dw);
      if (rows16)
        kda_state_slice_products_staged<T, true>(hs, dhs, V, dvn_base, HVV, do_base, a.dout.s1, vn_base, HVV, L, stage,
                                                 sm.dw, sm.Y, sm.X, hdot);
      else
        kda_state_slice_products_staged<T, false>(hs, dhs, V, dvn_base, HVV, do_base, a.dout.s1, vn_base, HVV, L,
                                                  stage, sm.dw, sm.Y, sm.X, hdot);
    } else {
      if (pairs_do)
        kda_state_slice_product2<T, kSplit, true>(hs, V, dvn_base, HVV, -1.f, do_base, a.dout.s1, L, sm.dw, sm.Y);
      else
        kda_state_slice_product2<T, kSplit, false>(hs, V, dvn_base, HVV, -1.f, do_base, a.dout.s1, L, sm.dw, sm.Y);
      kda_state_slice_product<T, kSplit, true>(dhs, V, vn_base, HVV, L, 1.f, sm.X, hs, hdot);
    }
    // q's slice for the dq pass below (thread: channel tid % 64 of rows tid / 64 + 4 m; coalesced): in
    // the staged form loaded here, in flight during the barrier (run 11.2: the dq pass waited on them).
    constexpr int NE = C * KS / kKdaSplitThreads;
    float qv[NE];
    auto load_q = [&] {
      const int d = tid % KS, r0 = tid / KS;
      const T* pq = q_rows + r0 * a.q.s1 + c0 + d;  // rows r0, r0 + 4, ...: stepped pointers
      const int64_t sq = 4 * a.q.s1;
#pragma unroll
      for (int m = 0; m < NE; ++m) qv[m] = r0 + 4 * m < L ? to_f<T>(pq[m * sq]) : 0.f;
    };
    if constexpr (kStaged) {
      load_q();
      kda_gate_slice_to_log2(sm.G);  // this thread's copies landed inside the products
      if (kPrefetch && c0 + KS < KMAX) {  // the next slice's h / dh rows into L2 during the other passes
        kda_prefetch_l2(hs + KS * V, KS * V);
        kda_prefetch_l2(dhs + KS * V, KS * V);
      }
    }
    __syncthreads();

    // dq_s = scale e o Y, stored (thread: channel tid % 64 of rows tid / 64 + 4 m, coalesced q
    // loads); Y <- q o dq_s, dG's first term, for the pass below.
    {
      const int d = tid % KS, r0 = tid / KS;
      float* pdq = dq_row0 + r0 * qk_stride + c0 + d;
      const int64_t sqk = 4 * qk_stride;
      if constexpr (!kStaged) load_q();  // q's loads first, all in flight together (no store between them)
      // The same pass sums this thread's s_rd = X_rd k_rd exp(gl_d - G_rd) of channel d for sl (X, k are
      // 0 past L), one shared atomic per thread.
      const float gl = sm.G[ti(L - 1, d)];
      const auto at_m = coalesced_at(r0, d);
      float s_sum = 0.f, dqv[NE];
#pragma unroll
      for (int m = 0; m < NE; ++m, pdq += sqk) {
        const int r = r0 + 4 * m, at = at_m(m);
        const float g = sm.G[at], dq = scale * exp2_ftz(g) * sm.Y[at];
        if constexpr (kStaged)
          dqv[m] = dq;  // stored below, the GVA test out of the loop
        else if (r < L)
          add_or_store(pdq, dq);
        sm.Y[at] = qv[m] * sm.rq[r] * dq;  // 0 past L (qv)
        if constexpr (kStaged) {
          // X <- X exp(gl - G), the only form of X the per-element pass uses (its exp not formed twice).
          const float xk = sm.X[at] * exp2_ftz(gl - g);
          sm.X[at] = xk;
          s_sum += xk * kx(r, d) * sm.rk[r];
        } else {
          s_sum += sm.X[at] * kx(r, d) * sm.rk[r] * exp2_ftz(gl - g);
        }
      }
      atomicAdd(&sl[d], s_sum);
      if constexpr (kStaged) {
        float* p = dq_row0 + r0 * qk_stride + c0 + d;
        if (gva) {
#pragma unroll
          for (int m = 0; m < NE; ++m)
            if (r0 + 4 * m < L) atomicAdd(p + m * sqk, dqv[m]);
        } else {
#pragma unroll
          for (int m = 0; m < NE; ++m)
            if (r0 + 4 * m < L) p[m * sqk] = dqv[m];
        }
      }
    }

    // dA += dw_s Wb_s^T over the slice's channels (Wb_jd = beta_j exp(G_jd) k_jd, 0 past L).
    if constexpr (kStaged) {
      // Warp w: dA's rows 32 (w / 4).. (2 row tiles) and columns 16 (w % 4).. (2 column tiles): each
      // A (dw) fragment split hi + lo in 4 warps and each B element exp(G_jd) k_jd formed in 2 (the
      // 4 x 2 layout above: 2 and 4 with beta_j rk_j; 8 x 1: 8 and 1, ~1/5 of the slice's
      // instructions); beta_j rk_j scales the sums. A and B pairs by float2 / 32-bit loads.
      float acc[2][2][4] = {};
      const int w = tid / 32, g = mma::grp(), t2 = 2 * mma::tig(), m0 = 32 * (w / 4), j0 = 16 * (w % 4);
      // Every row this lane reads (m0 + 16 mt + g (+ 8), j0 + 8 nt + g) has the swizzle s(g) (rows
      // differ by multiples of 8), so channel block q (channels 8 q..) of such a row sits at
      // 8 q ^ s(g) (k: 8 q ^ 8 g): the k loop unrolled, those offsets are 8 values formed once and
      // the rows immediates (the loop with runtime offsets spent ~70 integer instructions per step).
      const int sg = kda_swz_at(g, 0) - g * KS;
      const float* dwb = sm.dw + (m0 + g) * KS + t2;  // A rows m0 + g + 16 mt (+ 8)
      const float* gb = sm.G + (j0 + g) * KS + t2;    // B rows j0 + g + 8 nt
      const T* kb = sm.k + (j0 + g) * KS + t2;
#pragma unroll
      for (int kk = 0; kk < KS; kk += 16) {
        uint32_t bh[2][2], bl[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {  // B rows (channels) kk + t2 + 8 h2 + {0, 1}, column j
            const int q8 = kk + 8 * h2;
            const float2 g2 = *reinterpret_cast<const float2*>(gb + 8 * nt * KS + (q8 ^ sg));
            float k0, k1;
            mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(kb + 8 * nt * KS + (q8 ^ (8 * g))), k0, k1);
            mma::split_pair<T>(exp2_ftz(g2.x) * k0, exp2_ftz(g2.y) * k1, bh[nt][h2], bl[nt][h2]);
          }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t ah[4], al[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // A: rows m0 + 16 mt + g (+ 8: i odd), channels kk + t2 (+ 8: i >= 2)
            const float2 x2 = *reinterpret_cast<const float2*>(dwb + (16 * mt + 8 * (i & 1)) * KS +
                                                               ((kk + 8 * (i >> 1)) ^ sg));
            mma::split_pair<T>(x2.x, x2.y, ah[i], al[i]);
          }
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            mma::mma16816<T>(acc[mt][nt], ah, bh[nt]);
            mma::mma16816<T>(acc[mt][nt], al, bh[nt]);
            mma::mma16816<T>(acc[mt][nt], ah, bl[nt]);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int jc = j0 + 8 * nt + t2;  // this lane's accumulator columns jc, jc + 1
        const float s0 = sm.beta[jc] * sm.rk[jc], s1 = sm.beta[jc + 1] * sm.rk[jc + 1];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {  // rows m0 + 16 mt + g + 8 h2: one float2 (LDM even)
            float2* p = reinterpret_cast<float2*>(&sm.mat[(m0 + 16 * mt + g + 8 * h2) * LDM + jc]);
            float2 v = *p;
            v.x += acc[mt][nt][2 * h2] * s0, v.y += acc[mt][nt][2 * h2 + 1] * s1;
            *p = v;
          }
      }
    } else {
      float acc[4][4] = {};
      kda_mma::warp_fp32_product<T, 4>([&](int r, int d) { return sm.dw[ti(r, d)]; },
                                       [&](int d, int j) { return sm.beta[j] * sm.rk[j] * exp2_ftz(sm.G[ti(j, d)]) * kx(j, d); },
                                       16 * rs, n0, 0, KS, acc);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sm.mat[(16 * rs + mma::acc_row(e)) * LDM + n0 + 8 * nt + mma::acc_col(e)] += acc[nt][e];
    }

    // dWb_s = A^T dw_s (warp: rows 16 rs.., channels n0 + 8 nt..; A_ir = 0 for i < r, so the k range
    // starts at the strip), then every slice output at the warp's fragment elements.
    float acc[4][4] = {};
    if constexpr (kStaged) {
      // warp_fp32_product's result with the k loop unrolled (steps kk < 16 rs skipped: warp-uniform)
      // and fixed offsets: A^T's element (r, i) at A[i * LDA + r] (rows i = kk + t2 + e (+ 8)); dw's
      // element (i, d) of channel d = n0 + 8 nt + g at row i * 64 + (d ^ s(i)), s(i) = s(t2 + e).
      const int g = mma::grp(), t2 = 2 * mma::tig();
      const float* ab = sm.A + t2 * LDA + 16 * rs + g;
      int boff[2][4];  // dw's offset of (t2 + e, n0 + 8 nt + g)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) boff[e][nt] = kda_swz_at(t2 + e, n0 + 8 * nt + g);
#pragma unroll
      for (int kk = 0; kk < C; kk += 16) {
        if (kk < 16 * rs) continue;
        uint32_t ah[4], al[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // rows 16 rs + g (+ 8: i odd), k kk + t2 (+ 8: i >= 2) + {0, 1}
          const float* p = ab + (kk + 8 * (i >> 1)) * LDA + 8 * (i & 1);
          mma::split_pair<T>(p[0], p[LDA], ah[i], al[i]);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // k rows kk + 8 h + t2 + {0, 1}
            const float* p = sm.dw + (kk + 8 * h) * KS;
            mma::split_pair<T>(p[boff[0][nt]], p[boff[1][nt]], bh[h], bl[h]);
          }
          mma::mma16816<T>(acc[nt], ah, bh);
          mma::mma16816<T>(acc[nt], al, bh);
          mma::mma16816<T>(acc[nt], ah, bl);
        }
      }
    } else {
      kda_mma::warp_fp32_product<T, 4>([&](int r, int i) { return sm.A[i * LDA + r]; },
                                       [&](int i, int d) { return sm.dw[ti(i, d)]; }, 16 * rs, n0, 16 * rs, C, acc);
    }
    __syncthreads();  // q o dq_s in Y
    float tsum[2] = {0.f, 0.f};     // rows grp, grp + 8: sum of e k dWb over this thread's channels
    const int ra = 16 * rs + mma::grp();  // this lane's rows ra, ra + 8
    if constexpr (kStaged) {
      // The same per element pair (d, d + 1) = n0 + 8 nt + 2 tig (+ 1) with float2 loads / stores: in
      // the swizzled tiles a pair of row r sits at r * 64 + n0 + 2 tig + (8 nt ^ s(r)), and s(ra + 8) =
      // s(ra); k's pair (one 32-bit word) at d ^ 8 (r & 7). X holds X exp(gl - G) (the dq pass).
      const int sr = kda_swz_at(ra, 0) - ra * KS;
      const int ct = n0 + 2 * mma::tig();
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int off = ct + ((8 * nt) ^ sr);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = ra + 8 * h2, at = r * KS + off;
          float k0, k1;
          mma::unpack_floats<T>(*reinterpret_cast<const uint32_t*>(&sm.k[tk(r, ct + 8 * nt)]), k0, k1);
          const float2 g2 = *reinterpret_cast<const float2*>(&sm.G[at]), x2 = *reinterpret_cast<const float2*>(&sm.X[at]);
          float2 y2 = *reinterpret_cast<const float2*>(&sm.Y[at]), w2;
          const float rk = sm.rk[r], bt = sm.beta[r];
          auto one = [&](float g, float kraw, float xk, float dwb, float& y, float& wout) {
            const float ex = exp2_ftz(g), kr = kraw * rk, be = bt * ex;
            tsum[h2] += ex * kr * dwb;
            wout = xk + be * dwb;
            y = y - xk * kr + be * kr * dwb;
          };
          one(g2.x, k0, x2.x, acc[nt][2 * h2], y2.x, w2.x);
          one(g2.y, k1, x2.y, acc[nt][2 * h2 + 1], y2.y, w2.y);
          *reinterpret_cast<float2*>(&sm.dw[at]) = w2;
          *reinterpret_cast<float2*>(&sm.Y[at]) = y2;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = ra + 8 * (e >> 1), d = n0 + 8 * nt + mma::acc_col(e), at = ti(r, d);
          const float g = sm.G[at], ex = exp2_ftz(g), kr = kx(r, d) * sm.rk[r], dwb = acc[nt][e], be = sm.beta[r] * ex;
          const float kdx = exp2_ftz(sm.G[ti(L - 1, d)] - g);  // r <= L - 1 wherever X != 0
          const float Xv = sm.X[at], s = Xv * kdx * kr;
          tsum[e >> 1] += ex * kr * dwb;
          // dk_s into dw's tile (free: its readers passed the barrier above), dG_s over Y's element
          // (read just above by this thread): stored by the coalesced pass after the slice's barrier.
          sm.dw[at] = Xv * kdx + be * dwb;
          sm.Y[at] = sm.Y[at] - s + be * kr * dwb;
        }
    }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {  // over the 4 lanes of a row, then one shared atomic per row and warp
      tsum[h2] += __shfl_xor_sync(0xffffffffu, tsum[h2], 1);
      tsum[h2] += __shfl_xor_sync(0xffffffffu, tsum[h2], 2);
      const int r = 16 * rs + mma::grp() + 8 * h2;
      if (mma::tig() == 0 && r < L) atomicAdd(&sm.dbeta[r], tsum[h2]);
    }
    {
      const int d0 = 16 * ((tid / 32) % 4) + mma::grp();
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (hdot[i] != 0.f) atomicAdd(&sl[d0 + 8 * i], exp2_ftz(sm.G[ti(L - 1, d0 + 8 * i)]) * hdot[i]);
    }
    __syncthreads();  // dk_s, dG_s, sl complete
    {
      // dk_s and dG_s (with sl in row L - 1) out, coalesced: thread tid stores channel tid % 64 of rows
      // tid / 64 + 4 m, row pointers stepped by 4 rows.
      const int d = tid % KS, r0 = tid / KS;
      float* pdk = dk_row0 + r0 * qk_stride + c0 + d;
      float* pdg = dg_row0 + r0 * dg_stride + c0 + d;
      const int64_t sqk = 4 * qk_stride, sdg = 4 * dg_stride;
      const float sld = sl[d];
      const auto at_m = coalesced_at(r0, d);
      if constexpr (kStaged) {
        // The GVA test out of the loop (per element it cost a constant load, a compare and two branches).
        auto pass = [&](auto atomic) {
#pragma unroll 4
          for (int m = 0; m < C * KS / kKdaSplitThreads; ++m, pdk += sqk, pdg += sdg) {
            const int r = r0 + 4 * m, at = at_m(m);
            if (r < L) {
              if constexpr (decltype(atomic)::value)
                atomicAdd(pdk, sm.dw[at]);
              else
                *pdk = sm.dw[at];
              *pdg = sm.Y[at] + (r == L - 1 ? sld : 0.f);
            }
          }
        };
        if (gva)
          pass(std::true_type{});
        else
          pass(std::false_type{});
      } else {
#pragma unroll 4
        for (int m = 0; m < C * KS / kKdaSplitThreads; ++m, pdk += sqk, pdg += sdg) {
          const int r = r0 + 4 * m, at = at_m(m);
          if (r < L) {
            add_or_store(pdk, sm.dw[at]);
            *pdg = sm.Y[at] + (r == L - 1 ? sld : 0.f);
          }
        }
      }
    }
    __syncthreads();  // the slice tiles are free
  }
  if (tid < L) a.dbeta[(row0 + tid) * HV + hv] = sm.dbeta[tid];  // the atomics ended before the last barrier

  // dM = -StrictLower(A^T (dA A^T)) on tensor cores as in kda_grads_kernel's phase E, dA masked on
  // read (Lower_incl, rows < L): tmp = dA A^T (k range j <= i ends after the strip), dM's k range
  // (m >= i) starts at the strip. (The slice loop's last barrier follows its additions to mat.)
  {
    float acc[4][4] = {};
    kda_mma::warp_fp32_product<T, 4>([&](int i, int j) { return i < L && j <= i ? sm.mat[i * LDM + j] : 0.f; },
                                     [&](int j, int m) { return sm.A[m * LDA + j]; }, 16 * rs, n0, 0, 16 * rs + 16,
                                     acc);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sm.tmp[ti(16 * rs + mma::acc_row(e), n0 + 8 * nt + mma::acc_col(e))] = acc[nt][e];
  }
  __syncthreads();
  {
    float acc[4][4] = {};
    kda_mma::warp_fp32_product<T, 4>([&](int i, int m) { return sm.A[m * LDA + i]; },
                                     [&](int m, int j) { return sm.tmp[ti(m, j)]; }, 16 * rs, n0, 16 * rs, C, acc);
    float* dv0 = a.dv + (row0 * HV + hv) * V;  // row i: + i * HV V; dM in columns [0, 64)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * rs + mma::acc_row(e), j = n0 + 8 * nt + mma::acc_col(e);
        if (i < L) dv0[i * HVV + j] = j < i ? -acc[nt][e] : 0.f;
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
