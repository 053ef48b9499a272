// KDA chunked backward stage B2 ("grads"), one block of 256 threads per (chunk, value head): the
// per-chunk gradients of src/reference/delta_rule/chunked_backward.cpp (ChunkBackward) with
// per-channel gates, given h_c, v_new (stage 2), dh_{c+1}, dv_new (B1), A and G (stage 1).
//
// The contractions over V (dP, X, Y, Z, dA below) and over K (dw Wb^T) run on tensor cores
// (kda_mma::contract_rows, operands split hi + lo unless exact in T) through a staging area that
// is A's shared array until A is needed (phase D). Since session 6 the chunk-local 64 x 64
// products (dWb = A^T dw, dUb, dA A^T, A^T tmp) and the cross-sub-chunk parts of the per-channel
// decayed sums (aq, ak, bm, ck: chunked_kda_decay.cuh's kda_decayed_rows_mma / cols_mma) run on
// tensor cores too, their fp32 shared operands split hi + lo in registers
// (kda_mma::warp_fp32_product); inside a 16-row sub-chunk the decayed terms stay fp32, one exp
// each. The elementwise phases own element (row r, channel d) of dk, dG and dw by one thread
// (e = tid + 256 m, r = e / K, d = e % K), so those accumulators need no atomics.
// Shared memory at K = 128: q, k, G, dk, dG, dw (6 x 32 KiB) + A and one 64 x 64 matrix: 225 KiB.
//
// Notation (one chunk, rows i, j, r < L, channel d, Gam_ijd = exp(G_id - G_jd) for j <= i,
// gl_d = G_{L-1,d}, e_rd = exp(G_rd); dG is dL/dG, per channel):
//   A. dP_ij = scale do_i . v_new_j (j <= i)
//   B. X = v_new dh_{c+1}^T, Y = do h_c^T, Z = dv_new h_c^T  (64 x K each; dh_{c+1}, h_c are K x V)
//      aq_rd = sum_{j<=r} dP_rj k_jd Gam_rjd,   ak_rd = sum_{i>=r} dP_ir q_id Gam_ird
//      dq = scale Y e + aq;  dk = X exp(gl - G) + ak;  dw = -Z
//      dG = q o dq - s - k o ak,  s_rd = X_rd k_rd exp(gl_d - G_rd);  dG_{L-1,d} += sum_r s_rd
//      + exp(gl_d) <h_c[d], dh_{c+1}[d]> (added in G)
//   C. dA = Lower_incl(dv_new (beta v)^T + dw Wb^T),  Wb = beta e o k
//   D. dWb = A^T dw:  dk += beta e dWb,  dbeta += rowsum(e k dWb),  dG += beta e k dWb
//      dUb = A^T dv_new:  dv = beta dUb,  dbeta += v . dUb
//   E. dM = -StrictLower(A^T dA A^T)
//   F. bm_rd = sum_{j<r} dM_rj k_jd Gam_rjd,  ck_rd = sum_{i>r} beta_i dM_ir k_id Gam_ird
//      dk += beta bm + ck,  dG += k o (beta bm - ck),  dbeta += rowsum(k o bm)
//   G. dg = reverse cumsum of dG over the chunk's rows (per channel)
// Every exponent is a difference G_id - G_jd with i >= j (<= 0). dbeta uses shared float
// atomics (its last bits may vary between runs); dq, dk are added over value heads by global
// atomics under GVA (H < HV) and stored otherwise.
#pragma once

#include <type_traits>

#include "chunked_kda_decay.cuh"
#include "chunked_kda_mma.cuh"
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

template <int KMAX>
struct KdaGradsSmem {
  static constexpr int C = kChunkSize, LDM = C + 1;
  float *q, *k, *G, *dk, *dG, *dw;  // [C][KMAX] each; q's space later holds Wb, then tmp = dA A^T [C][C]
  float* A;                         // [C][LDM]
  float* mat;                       // [C][LDM] dP, then dA, then dM
  float *beta, *dbeta;              // [C]
  float* sl;                        // [KMAX] dG_{L-1} terms
  static constexpr int64_t bytes() { return sizeof(float) * (6 * C * KMAX + 2 * C * LDM + 2 * C + KMAX); }
  __device__ explicit KdaGradsSmem(unsigned char* raw) {
    q = reinterpret_cast<float*>(raw);
    k = q + C * KMAX;
    G = k + C * KMAX;
    dk = G + C * KMAX;
    dG = dk + C * KMAX;
    dw = dG + C * KMAX;
    A = dw + C * KMAX;
    mat = A + C * LDM;
    beta = mat + C * LDM;
    dbeta = beta + C;
    sl = dbeta + C;
  }
};

// Threads of a B2 block: 8 warps (the kernel is latency-bound at one block per SM: 225 KiB of
// shared memory). The products split as kda_mma::contract_rows says: warp w owns rows
// [16 (w % 4), +16) and 8-column tiles [4 (w / 4), +4) of a 64-column block.
constexpr int kGradsThreads = 256;

// Hands each element this warp owns of a 16 x 64 accumulator block (rows 16 (w % 4).., columns
// n0 + 8 nt..) to put(row, column, value).
template <typename Put>
__device__ __forceinline__ void store_acc64(const float (&acc)[8][4], int n0, Put&& put) {
  const int wp = (threadIdx.x / 32) % 4, half = threadIdx.x / 128;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt / 4 != half) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) put(16 * wp + mma::acc_row(e), n0 + 8 * nt + mma::acc_col(e), acc[nt][e]);
  }
}

// Hands each element of the calling warp's 16 x 32 accumulator block (rows 16 (w % 4).., columns
// 32 (w / 4) + 8 nt..: kda_mma::rows_times_rows_global's layout) to put(row, column, value).
template <typename Put>
__device__ __forceinline__ void store_acc32(const float (&acc)[4][4], Put&& put) {
  const int rs = (threadIdx.x / 32) % 4, n0 = 32 * (threadIdx.x / 128);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) put(16 * rs + mma::acc_row(e), n0 + 8 * nt + mma::acc_col(e), acc[nt][e]);
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kGradsThreads) kda_grads_kernel(ChunkedArgs a) {
  using S = KdaGradsSmem<KMAX>;
  constexpr int C = kChunkSize, LDM = S::LDM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = threadIdx.x;
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, K = a.K;
  const float scale = a.scale;
  const T* vn = static_cast<const T*>(a.v_new);
  const float* h = a.h + (c * a.HV + hv) * K * V;    // h_c [K][V]
  const float* dhn = a.dh + (c * a.HV + hv) * K * V;  // dL/dh_{c+1} [K][V]
  const T* do_base = static_cast<const T*>(a.dout.p) + off4(a.dout, ci.b, ci.t0, hv, 0);  // row r: + r * s1
  const T* vn_base = vn + (row0 * a.HV + hv) * V;            // row r: + r * HV V
  const float* dvn_base = a.dv_new + (row0 * a.HV + hv) * V;  // row r: + r * HV V
  const T* v_base = static_cast<const T*>(a.v.p) + off4(a.v, ci.b, ci.t0, hv, 0);  // row r: + r * s1
  // do / v element pairs (c, c + 1), c even, can be read as one 32-bit word when the rows start
  // 4-byte aligned (even row strides and offsets; the intermediates always are).
  const bool pairs_do = (reinterpret_cast<uintptr_t>(do_base) & 3) == 0 && a.dout.s1 % 2 == 0;
  const bool pairs_v = (reinterpret_cast<uintptr_t>(v_base) & 3) == 0 && a.v.s1 % 2 == 0;
  // dq, dk rows: summed over the value heads of a key head (global atomics) under GVA; with H == HV
  // this block is their only writer (the accumulators are zeroed), so a plain store does.
  const bool gva = a.H != a.HV;
  auto add_or_store = [gva](float* p, float x) {
    if (gva)
      atomicAdd(p, x);
    else
      *p = x;
  };
  // dq / dk rows of the chunk: row r at + r * H K (addresses formed once, not per element).
  float* dq_row0 = a.dq_acc + (row0 * a.H + head) * K;
  float* dk_row0 = a.dk_acc + (row0 * a.H + head) * K;
  const int64_t qk_stride = a.H * K;
  auto v_at = [&](int i, int64_t col) { return to_f<T>(v_base[i * a.v.s1 + col]); };  // last dim contiguous

  // Inputs of the chunk; zeroed accumulators.
  if (tid < C) {
    sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dbeta[tid] = 0.f;
  }
  if (tid < KMAX) sm.sl[tid] = 0.f;
  kda_read_gate<KMAX, kGradsThreads>(a.G, ci, row0, hv, a.HV, sm.G, KMAX);
  if (tid < kChunkThreads) {  // kda_key_rows' layout is for 4 warps (warp-uniform condition)
    auto none = [](int, int) { return 0.f; };
    kda_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, none, [&](int r, int d, float x, float) { sm.q[r * KMAX + d] = x; });
  } else {  // the other 4 warps load k meanwhile
    auto none = [](int, int) { return 0.f; };
    kda_key_rows_from<T, KMAX>(kChunkThreads, a.k, ci, head, a.l2norm, none,
                                [&](int r, int d, float x, float) { sm.k[r * KMAX + d] = x; });
  }
  __syncthreads();

  // A. dP = scale Lower_incl(do v_new^T), fragments straight from global memory. The decayed
  // sums stage through A's array (A itself is loaded at the end of phase C).
  {
    float acc[4][4] = {};
    if (pairs_do)
      kda_mma::rows_times_rows_global<T, true>(do_base, a.dout.s1, vn_base, a.HV * V, V, L, acc);
    else
      kda_mma::rows_times_rows_global<T, false>(do_base, a.dout.s1, vn_base, a.HV * V, V, L, acc);
    store_acc32(acc, [&](int i, int j, float x) { sm.mat[i * LDM + j] = i < L && j <= i ? scale * x : 0.f; });
  }
  __syncthreads();
  auto qx = [&](int r, int d) { return sm.q[r * KMAX + d]; };
  auto kx = [&](int r, int d) { return sm.k[r * KMAX + d]; };
  float* stagef = sm.A;  // 16 * KMAX floats for the decayed sums

  // B.1 aq (into dw's array), Y = do h^T (into dG's); dq = scale e o Y + aq, dG = q o dq.
  kda_decayed_rows_mma<T, KMAX>(sm.mat, LDM, kx, sm.G, true, sm.dw, stagef);
  if (pairs_do)
    kda_mma::state_times_rows<T, KMAX, true>(h, V, do_base, a.dout.s1, L, 1.f, sm.dG);
  else
    kda_mma::state_times_rows<T, KMAX, false>(h, V, do_base, a.dout.s1, L, 1.f, sm.dG);
  __syncthreads();
  for (int e = tid; e < C * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    float dG = 0.f;
    if (r < L) {
      const float dq = scale * sm.dG[e] * decay_exp(sm.G[e]) + sm.dw[e];
      dG = sm.q[e] * dq;
      add_or_store(dq_row0 + r * qk_stride + d, dq);
    }
    sm.dG[e] = dG;
  }
  __syncthreads();
  // B.2 ak (into dw's array), X = v_new dh_{c+1}^T (into dk's); dk = X o exp(gl - G) + ak,
  //     dG -= s + k o ak with s = X o k o exp(gl - G), and dG_{L-1} += sum_r s (sl).
  kda_decayed_cols_mma<T, KMAX>(sm.mat, LDM, qx, sm.G, true, sm.dw, stagef);
  // (v_new: our layout, 4-byte aligned pairs.) The same pass returns <dh_{c+1}[d], h_c[d]> for this
  // lane's two channels (hdot; nonzero in one lane per channel).
  float hdot[2];
  kda_mma::state_times_rows<T, KMAX, true>(dhn, V, vn_base, a.HV * V, L, 1.f, sm.dk, h, hdot);
  __syncthreads();
  {
    // A thread's channel d = tid % KMAX is the same for all its elements (256 % KMAX == 0): sum
    // its s terms in a register and add them to sl once (shared float atomics on one address
    // serialize).
    float s_sum = 0.f;
    for (int e = tid; e < C * KMAX; e += kGradsThreads) {
      const int r = e / KMAX, d = e % KMAX;
      float dk = 0.f;
      if (r < L) {
        const float X = sm.dk[e], ak = sm.dw[e];
        const float kdx = decay_exp(sm.G[(L - 1) * KMAX + d] - sm.G[e]);  // r <= L - 1
        const float s = X * kdx * sm.k[e];
        dk = X * kdx + ak;
        sm.dG[e] -= s + sm.k[e] * ak;
        s_sum += s;
      }
      sm.dk[e] = dk;
    }
    atomicAdd(&sm.sl[tid % KMAX], s_sum);
  }
  // exp(gl_d) <h_c[d], dh_{c+1}[d]> into sl: channels 16 (w % (K / 16)) + grp (+ 8), from the X pass.
  {
    const int d0 = 16 * ((tid / 32) % (KMAX / 16)) + mma::grp();
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (hdot[i] != 0.f) atomicAdd(&sm.sl[d0 + 8 * i], decay_exp(sm.G[(L - 1) * KMAX + d0 + 8 * i]) * hdot[i]);
  }
  // B.3 dw = -dv_new h^T (into dw's array once ak's readers are done).
  __syncthreads();
  kda_mma::state_times_rows<T, KMAX, true>(h, V, dvn_base, a.HV * V, L, -1.f, sm.dw);
  __syncthreads();

  // C. Wb = beta e o k where q was (q is done); then dA (where dP was).
  for (int e = tid; e < C * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    sm.q[e] = sm.beta[r] * decay_exp(sm.G[r * KMAX + d]) * sm.k[e];
  }
  __syncthreads();
  {
    // dv_new v^T (v exact, dv_new split), times beta_j per column; then + dw Wb^T (shared fp32).
    float acc[4][4] = {};
    if (pairs_v)
      kda_mma::rows_times_rows_global<T, true>(dvn_base, a.HV * V, v_base, a.v.s1, V, L, acc);
    else
      kda_mma::rows_times_rows_global<T, false>(dvn_base, a.HV * V, v_base, a.v.s1, V, L, acc);
    const int rs = (tid / 32) % 4, n0 = 32 * (tid / 128);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] *= sm.beta[n0 + 8 * nt + mma::acc_col(e)];
    kda_mma::warp_fp32_product<T, 4>([&](int r, int d) { return sm.dw[r * KMAX + d]; },
                                     [&](int d, int j) { return sm.q[j * KMAX + d]; }, 16 * rs, n0, 0, KMAX, acc);
    store_acc32(acc, [&](int i, int j, float x) { sm.mat[i * LDM + j] = i < L && j <= i ? x : 0.f; });
  }
  // A from stage 1 (the staging area is free). Stage 1 packs P^T into A's upper triangle
  // (chunked_kda.h): keep the strict lower part, with the unit diagonal.
  batched_copy<C * C, kGradsThreads>(
      [&](int e) {
        const int i = e / C, j = e % C;  // rows past L are not read (the last chunk's may lie past the array)
        return i < L ? (j < i ? a.A[((row0 + i) * a.HV + hv) * C + j] : (j == i ? 1.f : 0.f)) : 0.f;
      },
      [&](int e, float x) { sm.A[(e / C) * LDM + e % C] = x; });
  __syncthreads();

  // D. dWb = A^T dw and what it feeds; dUb = A^T dv_new -> dv, dbeta.
  // dWb_rd = sum_{i >= r} A_ir dw_id on tensor cores (warp: row strip rs = w % 4, channel half
  // w / 4; A_ir = 0 for i < r and for i >= L, so the k range starts at the strip's first row).
  {
    constexpr int NT = KMAX / 16;
    const int rs = (tid / 32) % 4, n0 = (tid / 128) * (KMAX / 2);
    float acc[NT][4] = {};
    kda_mma::warp_fp32_product<T, NT>([&](int r, int i) { return sm.A[i * LDM + r]; },
                                      [&](int i, int d) { return sm.dw[i * KMAX + d]; }, 16 * rs, n0, 16 * rs, C,
                                      acc);
    float tsum[2] = {0.f, 0.f};  // rows grp, grp + 8 of the strip: sum over this thread's channels
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * rs + mma::acc_row(e), d = n0 + 8 * nt + mma::acc_col(e), at = r * KMAX + d;
        const float ex = decay_exp(sm.G[at]), kr = sm.k[at], dwb = acc[nt][e], be = sm.beta[r] * ex;  // beta 0 past L
        sm.dk[at] += be * dwb;
        sm.dG[at] += be * kr * dwb;
        tsum[e >> 1] += ex * kr * dwb;  // (e k o dWb)_rd; k is 0 past L
      }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {  // over the 4 lanes of a row, then one atomic per row and half
      tsum[h2] += __shfl_xor_sync(0xffffffffu, tsum[h2], 1);
      tsum[h2] += __shfl_xor_sync(0xffffffffu, tsum[h2], 2);
      const int r = 16 * rs + mma::grp() + 8 * h2;
      if (mma::tig() == 0 && r < L) atomicAdd(&sm.dbeta[r], tsum[h2]);
    }
  }
  // dUb = A^T dv_new on tensor cores, 64 value columns at a time (warp: rows 16 rs.., columns
  // n0 + 8 nt..; A_ir = 0 for i < r, so the k range starts at the strip), dv_new straight from
  // global memory (split in registers).
  {
    const int rs = (tid / 32) % 4, n0 = 32 * (tid / 128);
    const int64_t HVV = a.HV * V;
    float* dv0 = a.dv + (row0 * a.HV + hv) * V;  // row j: + j * HV V
    for (int64_t c0 = 0; c0 < V; c0 += 64) {
      float vv[4][4];  // v at this thread's accumulator elements, loaded ahead (0 past L)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 16 * rs + mma::acc_row(e), n = n0 + 8 * nt + mma::acc_col(e);
          vv[nt][e] = j < L ? v_at(j, c0 + n) : 0.f;
        }
      float acc[4][4] = {};
      const float* dvc = dvn_base + c0;
      kda_mma::warp_fp32_product<T, 4>([&](int r, int i) { return sm.A[i * LDM + r]; },
                                       [&](int i, int n) { return i < L ? dvc[i * HVV + n] : 0.f; }, 16 * rs, n0,
                                       16 * rs, C, acc);
      // dv, and v . dUb into dbeta's shared row sums.
      kda_mma::kda_store_dv_add_dbeta(dv0, HVV, c0, rs, n0, L, sm.beta, vv, acc, sm.dbeta);
    }
  }
  __syncthreads();

  // E. tmp = dA A^T (where q / Wb was, [C][C]), then dM = -A^T tmp, strictly lower (where dA was),
  // on tensor cores: warp w takes row strip rs = w % 4 and columns [32 (w / 4), +32). dA is zero in
  // rows past L and above the diagonal, A in rows past L and above its (unit) diagonal, so the
  // full products are the masked ones: tmp's k range (j <= i) ends after the strip, dM's (m >= i)
  // starts at the strip.
  float* tmp = sm.q;  // C * C <= C * KMAX
  {
    const int rs = (tid / 32) % 4, n0 = 32 * (tid / 128);
    float acc[4][4] = {};
    kda_mma::warp_fp32_product<T, 4>([&](int i, int j) { return sm.mat[i * LDM + j]; },
                                     [&](int j, int m) { return sm.A[m * LDM + j]; }, 16 * rs, n0, 0, 16 * rs + 16,
                                     acc);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        tmp[(16 * rs + mma::acc_row(e)) * C + n0 + 8 * nt + mma::acc_col(e)] = acc[nt][e];
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
    kda_mma::warp_fp32_product<T, 4>([&](int i, int m) { return sm.A[m * LDM + i]; },
                                     [&](int m, int j) { return tmp[m * C + j]; }, 16 * rs, n0, 16 * rs, C, acc);
    // (The barrier after tmp's stores also ends every read of dA, which dM overwrites now.)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * rs + mma::acc_row(e), j = n0 + 8 * nt + mma::acc_col(e);
        sm.mat[i * LDM + j] = i < L && j < i ? -acc[nt][e] : 0.f;
      }
  }
  __syncthreads();

  // F. Key products: bm (into q's array, free since E), ck (into dw's); dk, dG, dbeta.
  kda_decayed_rows_mma<T, KMAX>(sm.mat, LDM, kx, sm.G, false, sm.q, stagef);
  auto beta_k = [&](int i, int d) { return sm.beta[i] * sm.k[i * KMAX + d]; };
  kda_decayed_cols_mma<T, KMAX>(sm.mat, LDM, beta_k, sm.G, false, sm.dw, stagef);
  for (int e = tid; e < L * KMAX; e += kGradsThreads) {
    const int r = e / KMAX;
    const float bm = sm.q[e], ck = sm.dw[e], kr = sm.k[e];
    sm.dk[e] += sm.beta[r] * bm + ck;
    sm.dG[e] += kr * (sm.beta[r] * bm - ck);
    const float ts = group_sum<32>(kr * bm);  // a warp's 32 lanes share row r
    if ((tid & 31) == 0) atomicAdd(&sm.dbeta[r], ts);
  }
  __syncthreads();

  // G. Outputs: dg = reverse cumsum of dG (one thread per channel), dbeta, dk.
  if (tid < KMAX) {
    float acc = sm.sl[tid];
    float* dg = a.dg + (row0 * a.HV + hv) * K + tid;  // row i: + i * HV K
    const int64_t dg_stride = a.HV * K;
#pragma unroll 8
    for (int i = L - 1; i >= 0; --i) {
      acc += sm.dG[i * KMAX + tid];
      dg[i * dg_stride] = acc;
    }
  }
  if (tid < L) a.dbeta[(row0 + tid) * a.HV + hv] = sm.dbeta[tid];
  for (int e = tid; e < L * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    add_or_store(dk_row0 + r * qk_stride + d, sm.dk[e]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
