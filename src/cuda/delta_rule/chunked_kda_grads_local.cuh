// Split KDA B2, second kernel (session 10, FLASHGRAD_CHUNKED_KDA_B2=split): the per-channel decayed
// sums of kda_grads_kernel (chunked_kda_grads.cuh, same notation) and dUb, finishing what
// kda_grads_state_kernel (chunked_kda_grads_state.cuh) began. One block of 8 warps per (chunk, value
// head), grid chunks x HV, 110 KiB of shared memory: two blocks per SM.
//
//   dP = scale Lower_incl(do v_new^T) (over V, fragments from global memory), dM read back from dv's
//   first 64 columns (the first kernel put it there);
//   per slice of 64 key channels (G, q, k tiles [64][64]; chunked_kda_grads_decayed.cuh):
//     ak + ck = kda_cols_sum(dP, q, dM, beta k): dk = ak + ck, dG = -k o (ak + ck);
//     aq, bm = kda_rows_pair(dP, dM, k) (bm into q's tile, q read again from global memory):
//     dq += aq;  dk += beta bm;  dG += q o aq + beta k o bm;  dbeta += rowsum(k o bm);
//     dg = reverse cumsum over rows of (dG + the first kernel's dG_s);
//   then A into dP's space and dUb = A^T dv_new: dv = beta dUb (overwriting dM: every read of it
//   was before the slice loop's first barrier), dbeta += v . dUb.
// Thread ownership of the slice's elementwise terms: element (r, d) = e = tid + 256 m (m < 16),
// r = e / 64, d = e % 64; its dk and dG partial sums stay in registers over the two passes.
#pragma once

#include "chunked_kda_grads_decayed.cuh"
#include "chunked_kda_grads_slices.cuh"

namespace flashgrad::cuda_detail::delta_rule {

struct KdaGradsLocalSmem {
  static constexpr int C = kChunkSize, KS = kKdaSliceK, LDM = C + 1;
  float *dP, *dM;            // [C][LDM]; dP's space holds A after the slices
  float *G, *q, *k, *out;    // [C][KS]; G in log2 units (kda_gate_slice)
  float* stage;              // kKdaDecayedStageFloats: the decayed sums' staging
  float *beta, *dbeta, *rq, *rk;  // [C]
  static constexpr int64_t bytes() { return sizeof(float) * (2 * C * LDM + 4 * C * KS + kKdaDecayedStageFloats + 4 * C); }
  __device__ explicit KdaGradsLocalSmem(unsigned char* raw) {
    dP = reinterpret_cast<float*>(raw);
    dM = dP + C * LDM;
    G = dM + C * LDM;
    q = G + C * KS;
    k = q + C * KS;
    out = k + C * KS;
    stage = out + C * KS;
    beta = stage + kKdaDecayedStageFloats;
    dbeta = beta + C;
    rq = dbeta + C;
    rk = rq + C;
  }
};
static_assert(KdaGradsLocalSmem::bytes() <= 113 * 1024, "two blocks per SM");

// kSplit: the decayed sums' tensor-core parts with hi + lo operands (FLASHGRAD_CHUNKED_KDA_B2=split_exact)
// or rounded once to T (the default).
template <typename T, int KMAX, bool kSplit>
__global__ void __launch_bounds__(kKdaSplitThreads, 2) kda_grads_local_kernel(ChunkedArgs a) {
  using S = KdaGradsLocalSmem;
  constexpr int C = kChunkSize, KS = kKdaSliceK, LDM = S::LDM, NE = C * KS / kKdaSplitThreads;
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
  float* dv0 = a.dv + (row0 * HV + hv) * V;                                             // row r: + r * HV V
  const bool pairs_do = (reinterpret_cast<uintptr_t>(do_base) & 3) == 0 && a.dout.s1 % 2 == 0;
  // dq / dk: the first kernel stored (H == HV) or atomically added (GVA) the state parts; this one adds
  // its parts atomically in both cases.
  float* dq_row0 = a.dq_acc + (row0 * a.H + head) * K;  // row r, channel d: + r * H K + d
  float* dk_row0 = a.dk_acc + (row0 * a.H + head) * K;
  float* dg_row0 = a.dg + (row0 * HV + hv) * K;  // row r, channel d: + r * HV K + d
  const int64_t qk_stride = a.H * K, dg_stride = HV * K;

  if (tid < C) {
    sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dbeta[tid] = 0.f;
  }
  // dM from dv's first 64 columns (rows past L: 0).
  kda_load_square(dv0, HVV, L, sm.dM, LDM, [](int, int, float x) { return x; });
  {
    // dP = scale Lower_incl(do v_new^T) (warp: rows 16 rs.., columns n0 + 8 nt..).
    float acc[4][4] = {};
    if (pairs_do)
      kda_mma::rows_times_rows_global<T, true>(do_base, a.dout.s1, vn_base, HVV, V, L, acc);
    else
      kda_mma::rows_times_rows_global<T, false>(do_base, a.dout.s1, vn_base, HVV, V, L, acc);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * rs + mma::acc_row(e), j = n0 + 8 * nt + mma::acc_col(e);
        sm.dP[i * LDM + j] = i < L && j <= i ? scale * acc[nt][e] : 0.f;
      }
  }
  kda_row_rstd<T, KMAX>(a.q, ci, head, a.l2norm, sm.rq);  // (after dP: fewer registers live at once)
  kda_row_rstd<T, KMAX>(a.k, ci, head, a.l2norm, sm.rk);
  __syncthreads();  // dM read (dv is free from here on), dP, beta, rstd in place

  auto qx = [&](int r, int d) { return sm.q[r * KS + d]; };
  auto kx = [&](int r, int d) { return sm.k[r * KS + d]; };
  auto beta_k = [&](int r, int d) { return sm.beta[r] * sm.k[r * KS + d]; };
  const T* q_rows = static_cast<const T*>(a.q.p) + off3(a.q, ci.b, ci.t0, head);  // row r: + r * s1
#pragma unroll 1
  for (int c0 = 0; c0 < KMAX; c0 += KS) {
    kda_gate_slice<KMAX>(a.G, ci, row0, hv, HV, c0, sm.G);
    kda_key_slice<T>(a.q, ci, head, c0, sm.rq, sm.q);
    kda_key_slice<T>(a.k, ci, head, c0, sm.rk, sm.k);
    __syncthreads();
    float dk[NE], dG[NE];  // element e = tid + 256 m: row e / 64 = tid / 64 + 4 m, channel tid % 64
    const int d = tid % KS, r0 = tid / KS;
    // Global rows r0, r0 + 4, ...: pointers stepped by 4 rows (no per-element 64-bit products).
    const int64_t sq = 4 * a.q.s1, sqk = 4 * qk_stride, sdg = 4 * dg_stride;
    // The first kernel's dG_s of this thread's elements, loaded here so that the latency hides behind
    // the cols pass.
    {
      const float* pdg = dg_row0 + r0 * dg_stride + c0 + d;
#pragma unroll
      for (int m = 0; m < NE; ++m, pdg += sdg) {
        dG[m] = r0 + 4 * m < L ? *pdg : 0.f;
        dk[m] = 0.f;
      }
    }
    // ak + ck: dk = ak + ck, dG -= k o (ak + ck).
    kda_cols_sum<T, kSplit>(sm.dP, sm.dM, LDM, qx, beta_k, sm.G, sm.out, sm.stage);
#pragma unroll
    for (int m = 0; m < NE; ++m) {
      const int e = (r0 + 4 * m) * KS + d;
      const float s = sm.out[e];
      dk[m] += s;
      dG[m] -= sm.k[e] * s;
    }
    __syncthreads();  // out's and q's readers are done: the pair below writes aq into out, bm into q's tile
    // aq, bm: dq += aq, dG += q o aq + beta k o bm, dk += beta bm, dbeta += rowsum(k o bm) (a warp's
    // 32 lanes share row r); q from global memory again (its tile now holds bm).
    kda_rows_pair<T, kSplit>(sm.dP, sm.dM, LDM, kx, sm.G, sm.out, sm.q, sm.stage);
    {
      // q's loads first (no store between them, so they are in flight together), then the updates;
      // dq and dk get this kernel's parts by atomic adds (fire-and-forget reductions, nothing to wait
      // on), onto the first kernel's stores (H == HV) or adds (GVA).
      const T* pq = q_rows + r0 * a.q.s1 + c0 + d;
      float* pdq = dq_row0 + r0 * qk_stride + c0 + d;
      float* pdk = dk_row0 + r0 * qk_stride + c0 + d;
      float qv[NE];
#pragma unroll
      for (int m = 0; m < NE; ++m) qv[m] = r0 + 4 * m < L ? to_f<T>(pq[m * sq]) : 0.f;
#pragma unroll
      for (int m = 0; m < NE; ++m, pdq += sqk, pdk += sqk) {
        const int r = r0 + 4 * m, e = r * KS + d;
        const float aq = sm.out[e], bm = sm.q[e], kr = sm.k[e], br = sm.beta[r];
        dk[m] += br * bm;
        dG[m] += qv[m] * sm.rq[r] * aq + br * kr * bm;
        const float ts = group_sum<32>(kr * bm);
        if ((tid & 31) == 0 && r < L) atomicAdd(&sm.dbeta[r], ts);
        if (r < L) {
          atomicAdd(pdq, aq);
          atomicAdd(pdk, dk[m]);
        }
        sm.out[e] = r < L ? dG[m] : 0.f;  // the same thread read out[e] above
      }
    }
    __syncthreads();
    // dg = reverse cumsum over the chunk's rows, one thread per channel.
    if (tid < KS) {
      float acc = 0.f;
#pragma unroll 8
      for (int i = L - 1; i >= 0; --i) {
        acc += sm.out[i * KS + tid];
        dg_row0[i * dg_stride + c0 + tid] = acc;
      }
    }
    __syncthreads();  // the slice tiles and out are free
  }

  // dUb = A^T dv_new (A into dP's space), 64 value columns at a time, as kda_grads_kernel's phase D:
  // dv = beta dUb, dbeta += v . dUb.
  // dv_new's 64 columns of each pass are staged first (coalesced float4 loads, all in flight at once)
  // where the slice tiles were, [64][68] (pitch 68: the B-fragment rows 2 tig apart hit distinct
  // banks), so that the product reads shared memory instead of waiting on global loads per step.
  constexpr int LDV = 68;
  static_assert(C * LDV <= 4 * C * KS, "dv_new's pass fits in the slice tiles");
  float* dvs = sm.G;
  kda_load_A(a.A, row0, hv, HV, L, sm.dP, LDM);
  for (int64_t cv = 0; cv < V; cv += 64) {
    if (cv) __syncthreads();  // the previous pass's readers of dvs are done
    {
      float4 x[4];  // piece p = tid + 256 u: row p / 16, columns 4 (p % 16) ..
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = tid + kKdaSplitThreads * u, i = p / 16;
        x[u] = i < L ? *reinterpret_cast<const float4*>(dvn_base + i * HVV + cv + 4 * (p % 16))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = tid + kKdaSplitThreads * u;
        *reinterpret_cast<float4*>(dvs + (p / 16) * LDV + 4 * (p % 16)) = x[u];
      }
    }
    __syncthreads();  // dvs (and, the first time, A) in place
    float vv[4][4];  // v at this thread's accumulator elements, loaded ahead (0 past L)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 16 * rs + mma::acc_row(e), n = n0 + 8 * nt + mma::acc_col(e);
        vv[nt][e] = j < L ? to_f<T>(v_base[j * a.v.s1 + cv + n]) : 0.f;
      }
    float acc[4][4] = {};
    kda_mma::warp_fp32_product<T, 4>([&](int r, int i) { return sm.dP[i * LDM + r]; },
                                     [&](int i, int n) { return dvs[i * LDV + n]; }, 16 * rs, n0, 16 * rs, C, acc);
    kda_mma::kda_store_dv_add_dbeta(dv0, HVV, cv, rs, n0, L, sm.beta, vv, acc, sm.dbeta);
  }
  __syncthreads();
  // dbeta = the first kernel's WY part + ours.
  if (tid < L) a.dbeta[(row0 + tid) * HV + hv] += sm.dbeta[tid];
}

}  // namespace flashgrad::cuda_detail::delta_rule
