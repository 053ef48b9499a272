// B2a on Hopper warpgroup MMA (session 19; step S1 of docs/perf/delta_rule_b2_wgmma_plan.md; the split
// B2's default, variant "wg" of chunked_grads_split_variants.cuh): chunk_grads_state_wgmma_kernel
// computes what chunk_grads_state_coalesced_kernel computes, for V == K (64 or 128), per (chunk c,
// value head hv) item, with C = 64 chunk rows i (L valid), key channels d, value columns v:
//   Y  = do h_c^T         (Y[i][d]  = sum_v do[i][v] h_c[d][v])       -> dq_s = scale e^{G_i} Y
//   Z  = dv_new h_c^T                                                  -> dw   = -Z (dv's first K columns)
//   X  = v_new dh^T       (dh = dL/dh_{c+1})                           -> dk_s = e^{G_last - G_i} X
//   dG_state_i = rq_i <q_i, dq_s_i> - rk_i <k_i, dk_s_i>  (+ on row L - 1: sum of the k terms and
//                e^{G_last} <h_c, dh>, exact fp32 h0 / dht on a sequence's first / last chunk)
// (the same outputs and roundings: dq_s, dk_s, dw stored in T, the dots taken on the fp32 values).
//
// Why: the mma.sync kernel (0.61 ms at B8 T4096 H16 K = V = 128, ~2.6 TB/s, 32 % issue active) holds
// h in registers as mma fragments and spends most of its instructions on fragment loads and mma.sync;
// here each product is 8 wgmma m64n64k16 per warpgroup straight from shared memory, so the item's
// instructions are mostly its copies and its epilogue (~176 KiB in, 48 KiB out per item). Runs 19.1 -
// 19.3: 0.625 -> 0.541 ms at B8 T4096 H16 (~3.0 TB/s), 0.263 -> 0.250 at K = V = 64.
//
// Shape: K / 64 warpgroups (K = 128: 256 threads, K = 64: 128); warpgroup wg owns the key channels
// [64 wg, +64), i.e. the N = 64 columns of each product (accumulator tiles Y, Z, X: 32 fp32 each); all
// read the 64 rows of the A operands. K = 128: two blocks per SM (113 KiB of shared memory each);
// K = 64: 41 KiB, four blocks per SM (registers).
// Shared memory (1024-byte aligned, 128-byte swizzle: rows of 64 elements, 16-byte chunk j of row r at
// chunk j ^ (r % 8)): h_c and dh as [K rows d][V = K values v] in K / 64 column panels [K][64] (K x 128
// bytes each), do, dv_new, v_new as [64 rows i][V] in K / 64 panels [64][64] (8 KiB each). Every operand
// is K-major (v contiguous): the wgmma form of both operands K-major (wgmma_ss_n64). k step kk (16
// values of v): panel kk / 4, +32 bytes per kk % 4; warpgroup wg's B rows start 64 wg rows (8 KiB) into
// each panel.
// Copies: cp.async group 1 = h_c, do, dv_new (Y, Z), group 2 = dh, v_new (X); rows i >= L of do,
// dv_new, v_new zero-filled (so Y, Z, X are 0 there; those rows are not stored).
// After the barrier that ends Y / Z, do's tile holds the dot partials of the dG terms (floats).
//
// Accumulator element e = 4 j + 2 r + p of warp wq (of its warpgroup), lane = 4 g + t: chunk row
// 16 wq + g + 8 r, key channel 64 wg + 8 j + 2 t + p (wgmma_primitives.cuh). Stores leave as 4-byte
// pairs (p = 0, 1) straight from the accumulators; the dots' row partials are summed over a quad
// (the 4 lanes t of one g hold a row's 16 channels of the warpgroup), then over the two warpgroups.
#pragma once

#include "chunked_grads_split.cuh"  // exact_state_dot, store_state_dG_terms
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"  // pack_floats, unpack_floats
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_state_wgmma.cuh"  // swizzled()
#include "chunked_wgmma_primitives.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX>
struct GradsStateWgmmaSmem {
  static_assert(KMAX == 64 || KMAX == 128, "K = V = 64 or 128");
  static constexpr int kWarpgroups = KMAX / 64, kThreads = 128 * kWarpgroups, kPanels = KMAX / 64;
  static constexpr int64_t kStatePanel = KMAX * 128;  // [K rows][64 elements] of T
  static constexpr int64_t kRowPanel = 64 * 128;      // [64 rows][64 elements] of T
  static constexpr int64_t kStateTile = kPanels * kStatePanel, kRowTile = kPanels * kRowPanel;
  static constexpr int64_t kOffH = 0, kOffDh = kStateTile, kOffDo = 2 * kStateTile, kOffDvn = kOffDo + kRowTile,
                           kOffVn = kOffDvn + kRowTile, kEnd = kOffVn + kRowTile;
  // Floats in do's tile after Y / Z: dot partials pq, pk (q.dq_s, k.dk_s) and sums of squares sq, sk
  // per warpgroup [2][C]; rq, rk [C]; hdh per warp [8].
  static constexpr int kFloats = 8 * 64 + 2 * 64 + 8;
  static_assert(sizeof(float) * kFloats <= kRowTile, "the floats fit do's tile");
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes in the kernel. K = 128: 113 KiB,
  // two blocks per SM (2 x (113 + 1 reserved) = 228 KiB).
  static constexpr int64_t bytes() { return 1024 + kEnd; }
};

// The item's copies into the buffer at smem: cp.async group 1 = h_c, do, dv_new (Y, Z), group 2 = dh,
// v_new (X), both committed.
template <typename T, int KMAX>
__device__ __forceinline__ void b2a_wgmma_issue(const ChunkedArgs& a, const ChunkInfo& ci, int64_t c, int64_t hv,
                                                unsigned char* smem) {
  using S = GradsStateWgmmaSmem<T, KMAX>;
  constexpr int C = kChunkSize, THREADS = S::kThreads;
  constexpr int64_t V = KMAX;
  const int64_t HV = a.HV;
  const int L = ci.len, tid = static_cast<int>(threadIdx.x);
  const int64_t row0 = chunk_row0(ci, a.T);
  const T* const hc = static_cast<const T*>(a.h16) + (c * HV + hv) * KMAX * V;   // h_c [K][V]
  const T* const dhc = static_cast<const T*>(a.dh16) + (c * HV + hv) * KMAX * V;  // dL/dh_{c+1} [K][V]
  const T* const dout = static_cast<const T*>(a.dout.p) + off3(a.dout, ci.b, ci.t0, hv);
  auto inter_rows = [&](const void* base) { return static_cast<const T*>(base) + (row0 * HV + hv) * V; };
  // Thread: 16-byte chunk j = tid % CJ (CJ = K / 8 chunks per row; panel j / 8, chunk j % 8 of its
  // 64-element row) of rows tid / CJ + RS m (RS = THREADS / CJ = 16 rows per pass at both K); rows 16
  // apart share the swizzle, so one offset serves all of them.
  constexpr int CJ = KMAX / 8, RS = THREADS / CJ;
  static_assert(RS == 16, "16 rows per pass");
  const int cj = tid % CJ, cr = tid / CJ;
  const uint32_t at0 = static_cast<uint32_t>((cj >> 3) * S::kStatePanel) + swizzled(cr, cj);
  const uint32_t at0_rows = static_cast<uint32_t>((cj >> 3) * S::kRowPanel) + swizzled(cr, cj);
  auto copy_state = [&](int64_t off, const T* src) {  // K rows d, always whole
#pragma unroll
    for (int m = 0; m < KMAX / RS; ++m)
      mma::cp_async16(smem + off + at0 + m * RS * 128, src + (cr + RS * m) * V + 8 * cj, true);
  };
  auto copy_rows = [&](int64_t off, const T* src, int64_t stride) {  // 64 chunk rows, rows >= L zero-filled
#pragma unroll
    for (int m = 0; m < C / RS; ++m) {
      const int r = cr + RS * m;
      const bool ok = r < L;
      mma::cp_async16(smem + off + at0_rows + m * RS * 128, src + (ok ? r : 0) * stride + 8 * cj, ok);
    }
  };
  copy_state(S::kOffH, hc);
  copy_rows(S::kOffDo, dout, a.dout.s1);
  copy_rows(S::kOffDvn, inter_rows(a.dv_new16), HV * V);
  mma::cp_async_commit();
  copy_state(S::kOffDh, dhc);
  copy_rows(S::kOffVn, inter_rows(a.v_new), HV * V);
  mma::cp_async_commit();
}

// Item (c, hv) from shared memory at smem (shared address smem_s) after b2a_wgmma_issue committed its
// two cp.async groups: the waits, products, epilogues and the dG step. (The copies and the compute are
// two steps so that a block walking several items could issue one item's copies during another's
// compute: run 19.3 tried one block per SM so, and it was slower.) q's and k's pairs are loaded after
// the products are issued (loading them before the copies' waits, variant "wge", was no faster in run
// 20.1). ci: chunk c's plan entry, read once by the kernel for both steps (each step reading it again
// put a second global round trip after the copies' wait: ncu, run 20.1).
template <typename T, int KMAX>
__device__ __forceinline__ void b2a_wgmma_item(const ChunkedArgs& a, const ChunkInfo& ci, int64_t c, int64_t hv,
                                               unsigned char* smem, uint32_t smem_s) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
  using S = GradsStateWgmmaSmem<T, KMAX>;
  constexpr int C = kChunkSize, THREADS = S::kThreads, KSTEPS = KMAX / 16;
  constexpr int64_t V = KMAX;  // (V == K: the launcher's condition for this variant)
  const int64_t head = hv / (a.HV / a.H), HV = a.HV;
  const int L = ci.len, tid = static_cast<int>(threadIdx.x), lane = tid & 31, wp = tid >> 5, wg = tid >> 7,
            wq = wp & 3, g = lane >> 2, t = lane & 3;
  const int64_t row0 = chunk_row0(ci, a.T);
  const T* const hc = static_cast<const T*>(a.h16) + (c * HV + hv) * KMAX * V;   // h_c [K][V]
  const T* const dhc = static_cast<const T*>(a.dh16) + (c * HV + hv) * KMAX * V;  // dL/dh_{c+1} [K][V]
  auto view_rows = [&](const View& x, int64_t idx) { return static_cast<T*>(x.p) + off3(x, ci.b, ci.t0, idx); };

  // The thread's accumulator rows ri[r] = 16 wq + g + 8 r and their gate factors (G from stage 1).
  const int ri[2] = {16 * wq + g, 16 * wq + g + 8};
  const float gl = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
  float eG[2], kd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float gi = (a.G && ri[r] < L) ? a.G[(row0 + ri[r]) * HV + hv] : 0.f;
    eG[r] = expf(gi);
    kd[r] = expf(gl - gi);  // arguments <= 0 for gates g <= 0
  }
  const int col_base = 64 * wg + 2 * t;  // key channel of element p = 0 of column block j: + 8 j

  // Descriptors: A rows (do, dv_new, v_new) k step kk; B = the warpgroup's 64 state rows, k step kk.
  auto a_desc = [&](int64_t off, int kk) {
    return sm90::smem_desc(smem_s + static_cast<uint32_t>(off + (kk / 4) * S::kRowPanel + (kk % 4) * 32), 16, 1024);
  };
  auto b_desc = [&](int64_t off, int kk) {
    return sm90::smem_desc(
        smem_s + static_cast<uint32_t>(off + (kk / 4) * S::kStatePanel + wg * 64 * 128 + (kk % 4) * 32), 16, 1024);
  };
  // The thread's 16 channel pairs of rows ri[] from a user view (rows >= L: zeros).
  auto load_pairs = [&](const T* rows, int64_t stride, uint32_t (&x)[2][8]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[r][j] = ri[r] < L ? *reinterpret_cast<const uint32_t*>(rows + ri[r] * stride + col_base + 8 * j) : 0u;
  };
  // Row r's sum over the quad (the warpgroup's 64 channels of the row).
  auto quad_sum = [](float x) { return group_sum<4>(x); };

  uint32_t qp[2][8], kp[2][8];  // q's, then k's pairs at the thread's accumulator elements
  mma::cp_async_wait<1>();  // (group 2 may still be in flight)
  sm90::fence_proxy_async_shared();
  __syncthreads();  // h_c, do, dv_new in shared memory

  // ---- Y and Z (one group), then their epilogues.
  float pq[2], sq[2];  // row partials of q.dq_s and q.q over the warpgroup's channels
  {
    float accY[32], accZ[32];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) sm90::wgmma_ss_n64<T>(accY, a_desc(S::kOffDo, kk), b_desc(S::kOffH, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) sm90::wgmma_ss_n64<T>(accZ, a_desc(S::kOffDvn, kk), b_desc(S::kOffH, kk), kk > 0);
    sm90::wgmma_commit();
    load_pairs(view_rows(a.q, head), a.q.s1, qp);
    sm90::wgmma_wait<0>();
    sm90::pin_registers(accY);
    sm90::pin_registers(accZ);
    T* const dq = view_rows(a.dq_out, head);
    T* const dw = view_rows(a.dv_out, hv);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float ys = a.scale * eG[r];
      float p = 0.f, s = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int e = 4 * j + 2 * r;
        const float y0 = accY[e] * ys, y1 = accY[e + 1] * ys;
        float q0, q1;
        mma::unpack_floats<T>(qp[r][j], q0, q1);
        p += q0 * y0 + q1 * y1;
        s += q0 * q0 + q1 * q1;
        if (ri[r] < L) {
          *reinterpret_cast<uint32_t*>(dq + ri[r] * a.dq_out.s1 + col_base + 8 * j) = mma::pack_floats<T>(y0, y1);
          *reinterpret_cast<uint32_t*>(dw + ri[r] * a.dv_out.s1 + col_base + 8 * j) =
              mma::pack_floats<T>(-accZ[e], -accZ[e + 1]);
        }
      }
      pq[r] = quad_sum(p);
      sq[r] = quad_sum(s);
    }
  }

  mma::cp_async_wait<0>();
  sm90::fence_proxy_async_shared();
  __syncthreads();  // dh, v_new landed; both warpgroups are done with do / dv_new (do's tile: floats)

  float* const f = reinterpret_cast<float*>(smem + S::kOffDo);
  float *const fpq = f, *const fpk = f + 2 * C, *const fsq = f + 4 * C, *const fsk = f + 6 * C, *const frq = f + 8 * C,
               *const frk = f + 9 * C, *const fh = f + 10 * C;
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      fpq[wg * C + ri[r]] = pq[r];
      fsq[wg * C + ri[r]] = sq[r];
    }
  }

  // ---- X, and <h_c, dh> while it runs.
  {
    float accX[32];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) sm90::wgmma_ss_n64<T>(accX, a_desc(S::kOffVn, kk), b_desc(S::kOffDh, kk), kk > 0);
    sm90::wgmma_commit();
    load_pairs(view_rows(a.k, head), a.k.s1, kp);
    // <h_c, dh>: h and dh share one layout, so equal byte offsets are equal (d, v): thread tid takes
    // 16-byte chunks tid + THREADS m of both tiles (each element once).
    float hdh = 0.f;
#pragma unroll
    for (int m = 0; m < S::kStateTile / (16 * THREADS); ++m) {
      const int64_t o = 16 * (tid + THREADS * m);
      const uint4 x = *reinterpret_cast<const uint4*>(smem + S::kOffH + o);
      const uint4 y = *reinterpret_cast<const uint4*>(smem + S::kOffDh + o);
      const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float x0, x1, y0, y1;
        mma::unpack_floats<T>(xs[i], x0, x1);
        mma::unpack_floats<T>(ys[i], y0, y1);
        hdh += x0 * y0 + x1 * y1;
      }
    }
    // (first / last chunk of a sequence: the fp32 h0 / dht instead; rows 16 wp + g, + 8 of the K keys,
    // columns 2 t + 8 m: each element once over the K / 16 warps)
    exact_state_dot<T>(a, ci, c, hv, hc, dhc, V, 16 * wp + g, t, hdh);
    hdh = group_sum<32>(hdh);
    if (lane == 0) fh[wp] = hdh;
    if (KMAX == 64 && tid < 4) fh[4 + tid] = 0.f;  // (the dG step sums 8 slots)

    sm90::wgmma_wait<0>();
    sm90::pin_registers(accX);
    T* const dk = view_rows(a.dk_out, head);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float p = 0.f, s = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int e = 4 * j + 2 * r;
        const float x0 = accX[e] * kd[r], x1 = accX[e + 1] * kd[r];
        float k0, k1;
        mma::unpack_floats<T>(kp[r][j], k0, k1);
        p += k0 * x0 + k1 * x1;
        s += k0 * k0 + k1 * k1;
        if (ri[r] < L)
          *reinterpret_cast<uint32_t*>(dk + ri[r] * a.dk_out.s1 + col_base + 8 * j) = mma::pack_floats<T>(x0, x1);
      }
      p = quad_sum(p);
      s = quad_sum(s);
      if (t == 0) {
        fpk[wg * C + ri[r]] = p;
        fsk[wg * C + ri[r]] = s;
      }
    }
  }
  __syncthreads();  // the partials and the per-warp hdh complete

  // ---- dG's state terms (warp 0): the row norms from the sums of squares (as row_rstd), then the
  // split kernels' common step.
  if (wp == 0 && a.dG_state) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = lane + 32 * h;
      float ssq = 0.f, ssk = 0.f;
#pragma unroll
      for (int w = 0; w < S::kWarpgroups; ++w) {
        ssq += fsq[w * C + i];
        ssk += fsk[w * C + i];
      }
      frq[i] = a.l2norm ? 1.0f / sqrtf(ssq + kL2NormEps) : 1.f;
      frk[i] = a.l2norm ? 1.0f / sqrtf(ssk + kL2NormEps) : 1.f;
    }
    __syncwarp();
    store_state_dG_terms<S::kWarpgroups>(a, fpq, fpk, frq, frk, fh, L, row0, hv, gl, lane);
  }
}

// One item per block: grid (chunks, HV).
template <typename T, int KMAX>
__global__ void __launch_bounds__(GradsStateWgmmaSmem<T, KMAX>::kThreads, 256 / KMAX)
    chunk_grads_state_wgmma_kernel(ChunkedArgs a) {
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  // Aligned up by an offset from the shared array itself (as the wgmma chains).
  const uint32_t smem_raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn));
  unsigned char* const smem = smem_dyn + ((1024 - (smem_raw_s & 1023)) & 1023);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const ChunkInfo ci = chunk_info(a, blockIdx.x);
  b2a_wgmma_issue<T, KMAX>(a, ci, blockIdx.x, blockIdx.y, smem);
  b2a_wgmma_item<T, KMAX>(a, ci, blockIdx.x, blockIdx.y, smem, smem_s);
}

}  // namespace flashgrad::cuda_detail::delta_rule
