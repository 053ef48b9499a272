// Chunked backward stage B2 ("grads"), one block of 128 threads per (chunk, value head): the
// per-chunk gradients of src/reference/delta_rule/chunked_backward.cpp (ChunkBackward: state
// update, output, prediction, WY products, inverse, key products, gates) for GDN and the plain
// rule, given h_c and v_new (stage 2), dh_{c+1} and dv_new (B1) and A (stage 1).
//
// CORRECTNESS-FIRST VERSION: fp32 on CUDA cores, one thread per output element, the [64, V] and
// [K, V] operands read straight from global memory (L2), q, k, A and the per-chunk matrices in
// shared memory (210 KiB at K = 128: one block per SM). The tensor-core version is the next step
// (docs/perf/delta_rule.md has the products in matrix form).
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
// Row sums over threads use shared-memory float atomics (their order, and so the last bits of
// dbeta and dg, may vary between runs; dq and dk are summed over value heads by global atomics).
#pragma once

#include "chunked_rows.cuh"
#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

template <int KMAX>
struct GradsSmem {
  static constexpr int C = kChunkSize, LDM = C + 1;
  static constexpr int kDwFloats = C * (KMAX > LDM ? KMAX : LDM);  // dw [C][KMAX] or tmp [C][LDM]
  float* q;    // [C][KMAX] normalized q
  float* k;    // [C][KMAX] normalized k
  float* dq;   // [C][KMAX]
  float* dk;   // [C][KMAX]
  float* dw;   // [C][KMAX] dw, later (aliased) tmp = dA A^T [C][LDM]
  float* tmp;
  float* A;    // [C][LDM]
  float* dA;   // [C][LDM] dA, later dKk o Gam
  float* dPG;  // [C][LDM] dP o Gam, later dM
  float* G;    // [C]
  float* beta;  // [C]
  float* dG;   // [C]
  float* dbeta;  // [C]
  static constexpr int64_t bytes() {
    return sizeof(float) * (4 * C * KMAX + kDwFloats + 3 * C * LDM + 4 * C);
  }
  __device__ explicit GradsSmem(unsigned char* raw) {
    q = reinterpret_cast<float*>(raw);
    k = q + C * KMAX;
    dq = k + C * KMAX;
    dk = dq + C * KMAX;
    dw = dk + C * KMAX;
    tmp = dw;
    A = dw + kDwFloats;
    dA = A + C * LDM;
    dPG = dA + C * LDM;
    G = dPG + C * LDM;
    beta = G + C;
    dG = beta + C;
    dbeta = dG + C;
  }
};

template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_grads_kernel(ChunkedArgs a) {
  using S = GradsSmem<KMAX>;
  constexpr int C = kChunkSize, LDM = S::LDM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const ChunkInfo ci = a.chunks[c];
  const int L = ci.len, tid = threadIdx.x;
  const int64_t row0 = chunk_row0(ci, a.T), V = a.V, K = a.K;
  const float scale = a.scale;
  const T* vn = static_cast<const T*>(a.v_new);
  const float* dvn = a.dv_new;
  const float* h = a.h + (c * a.HV + hv) * K * V;    // h_c [K][V]
  const float* dhn = a.dh + (c * a.HV + hv) * K * V;  // dL/dh_{c+1} [K][V]
  auto vn_at = [&](int i, int64_t col) { return to_f<T>(vn[((row0 + i) * a.HV + hv) * V + col]); };
  auto dvn_at = [&](int i, int64_t col) { return dvn[((row0 + i) * a.HV + hv) * V + col]; };
  auto do_at = [&](int i, int64_t col) { return load_elem<T>(a.dout, off4(a.dout, ci.b, ci.t0 + i, hv, col)); };
  auto v_at = [&](int i, int64_t col) { return load_elem<T>(a.v, off4(a.v, ci.b, ci.t0 + i, hv, col)); };

  // S0: inputs of the chunk; zeroed accumulators.
  if (tid < C) {
    const bool ok = tid < L;
    sm.G[tid] = (a.G && ok) ? a.G[(row0 + tid) * a.HV + hv] : 0.f;
    sm.beta[tid] = ok ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dG[tid] = 0.f;
    sm.dbeta[tid] = 0.f;
  }
  for_each_key_row<T, KMAX>(a.q, ci, head, a.l2norm, [&](int r, int d, float x) { sm.q[r * KMAX + d] = x; });
  for_each_key_row<T, KMAX>(a.k, ci, head, a.l2norm, [&](int r, int d, float x) { sm.k[r * KMAX + d] = x; });
  for (int e = tid; e < C * KMAX; e += kChunkThreads) sm.dq[e] = sm.dk[e] = 0.f;
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    sm.A[i * LDM + j] = i < L ? a.A[((row0 + i) * a.HV + hv) * C + j] : 0.f;
  }
  __syncthreads();
  const float gl = sm.G[L - 1];

  // S1: state update (X), output through h (dq, dG), prediction (dw); dG_last's <h, dh_{c+1}>.
  {
    float last = 0.f;  // this thread's share of dG_{L-1}
    for (int e = tid; e < L * KMAX; e += kChunkThreads) {
      const int i = e / KMAX, d = e % KMAX;
      float X = 0.f, Y = 0.f, Z = 0.f;
      for (int64_t col = 0; col < V; ++col) {
        const float hd = h[d * V + col];
        X += vn_at(i, col) * dhn[d * V + col];
        Y += do_at(i, col) * hd;
        Z += dvn_at(i, col) * hd;
      }
      const float kd = expf(gl - sm.G[i]);  // i <= L - 1
      sm.dk[i * KMAX + d] += X * kd;
      const float s = X * kd * sm.k[i * KMAX + d];
      const float qg = scale * expf(sm.G[i]) * Y;
      sm.dq[i * KMAX + d] += qg;
      sm.dw[i * KMAX + d] = -Z;
      atomicAdd(&sm.dG[i], qg * sm.q[i * KMAX + d] - s);
      last += s;
    }
    const float el = expf(gl);
    for (int64_t e = tid; e < K * V; e += kChunkThreads) last += el * h[e] * dhn[e];
    atomicAdd(&sm.dG[L - 1], last);
  }
  __syncthreads();

  // S2: dP o Gam (j <= i) and its gate terms; dA (j <= i).
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    float dpg = 0.f, da = 0.f;
    if (i < L && j <= i) {
      float dP = 0.f, du_ub = 0.f;
      for (int64_t col = 0; col < V; ++col) {
        const float dvi = dvn_at(i, col);
        dP += do_at(i, col) * vn_at(j, col);
        du_ub += dvi * v_at(j, col);
      }
      dP *= scale;
      const float gam = expf(sm.G[i] - sm.G[j]), wj = sm.beta[j] * expf(sm.G[j]);
      float qk = 0.f, dw_wb = 0.f;
      for (int d = 0; d < KMAX; ++d) {
        qk += sm.q[i * KMAX + d] * sm.k[j * KMAX + d];
        dw_wb += sm.dw[i * KMAX + d] * sm.k[j * KMAX + d];
      }
      dpg = dP * gam;
      const float dPP = dpg * qk;  // dP_ij P_ij
      atomicAdd(&sm.dG[i], dPP);
      atomicAdd(&sm.dG[j], -dPP);
      da = sm.beta[j] * du_ub + wj * dw_wb;
    }
    sm.dPG[i * LDM + j] = dpg;
    sm.dA[i * LDM + j] = da;
  }
  __syncthreads();

  // S3: dq += (dP o Gam) k, dk += (dP o Gam)^T q;  S4: dUb, dWb and what they feed.
  for (int e = tid; e < L * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;
    float aq = 0.f, ak = 0.f, dwb = 0.f;
    for (int j = 0; j <= r; ++j) aq += sm.dPG[r * LDM + j] * sm.k[j * KMAX + d];
    for (int i = r; i < L; ++i) {
      ak += sm.dPG[i * LDM + r] * sm.q[i * KMAX + d];
      dwb += sm.A[i * LDM + r] * sm.dw[i * KMAX + d];
    }
    const float er = expf(sm.G[r]);
    sm.dq[r * KMAX + d] += aq;
    sm.dk[r * KMAX + d] += ak + sm.beta[r] * er * dwb;
    const float t = er * sm.k[r * KMAX + d] * dwb;  // (e k o dWb)_rd
    atomicAdd(&sm.dbeta[r], t);
    atomicAdd(&sm.dG[r], sm.beta[r] * t);
  }
  for (int64_t e = tid; e < L * V; e += kChunkThreads) {
    const int j = static_cast<int>(e / V);
    const int64_t col = e % V;
    float dub = 0.f;
    for (int i = j; i < L; ++i) dub += sm.A[i * LDM + j] * dvn_at(i, col);
    a.dv[((row0 + j) * a.HV + hv) * V + col] = sm.beta[j] * dub;
    atomicAdd(&sm.dbeta[j], v_at(j, col) * dub);
  }
  __syncthreads();

  // S5: dM = -StrictLower(A^T dA A^T): tmp = dA A^T (where dw was), then dM (where dP o Gam was).
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, m = e % C;
    float s = 0.f;
    if (i < L && m < L)
      for (int j = 0; j <= (i < m ? i : m); ++j) s += sm.dA[i * LDM + j] * sm.A[m * LDM + j];
    sm.tmp[i * LDM + m] = s;
  }
  __syncthreads();
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    if (i < L && j < i)
      for (int m = i; m < L; ++m) s += sm.A[m * LDM + i] * sm.tmp[m * LDM + j];
    sm.dPG[i * LDM + j] = -s;  // dM
  }
  __syncthreads();

  // S6: key products: dKk o Gam (where dA was) and the dbeta, dG terms.
  for (int e = tid; e < C * C; e += kChunkThreads) {
    const int i = e / C, j = e % C;
    float out = 0.f;
    if (i < L && j < i) {
      float kk = 0.f;
      for (int d = 0; d < KMAX; ++d) kk += sm.k[i * KMAX + d] * sm.k[j * KMAX + d];
      const float gam = expf(sm.G[i] - sm.G[j]), Kk = kk * gam, dM = sm.dPG[i * LDM + j];
      const float dKk = sm.beta[i] * dM;
      atomicAdd(&sm.dbeta[i], dM * Kk);
      atomicAdd(&sm.dG[i], dKk * Kk);
      atomicAdd(&sm.dG[j], -dKk * Kk);
      out = dKk * gam;
    }
    sm.dA[i * LDM + j] = out;
  }
  __syncthreads();
  for (int e = tid; e < L * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;
    float s = 0.f;
    for (int j = 0; j < r; ++j) s += sm.dA[r * LDM + j] * sm.k[j * KMAX + d];
    for (int i = r + 1; i < L; ++i) s += sm.dA[i * LDM + r] * sm.k[i * KMAX + d];
    sm.dk[r * KMAX + d] += s;
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
  for (int e = tid; e < L * KMAX; e += kChunkThreads) {
    const int r = e / KMAX, d = e % KMAX;
    const int64_t at = ((row0 + r) * a.H + head) * K + d;
    atomicAdd(&a.dq_acc[at], sm.dq[r * KMAX + d]);
    atomicAdd(&a.dk_acc[at], sm.dk[r * KMAX + d]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
