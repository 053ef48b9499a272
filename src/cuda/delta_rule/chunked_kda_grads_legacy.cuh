// KDA B2 as of session 5 (commit 8586cdc), kept selectable for one GPU comparison with the session-6
// kernel (chunked_kda_grads.cuh): FLASHGRAD_CHUNKED_KDA=legacy (read per launch,
// chunked_kda_launch_impl.cuh). Same contract, shared memory layout and grid; the chunk-local
// 64 x 64 products (A^T dw, dA A^T, A^T tmp) and the decayed sums' cross-sub-chunk parts are
// per-element fp32 loops here. To be removed once the new kernel has passed the GPU tests.
#pragma once

#include "chunked_kda_grads.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX>
__global__ void __launch_bounds__(kGradsThreads) kda_grads_legacy_kernel(ChunkedArgs a) {
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
  auto vn_at = [&](int i, int64_t col) { return to_f<T>(vn[((row0 + i) * a.HV + hv) * V + col]); };
  auto dvn_at = [&](int i, int64_t col) { return a.dv_new[((row0 + i) * a.HV + hv) * V + col]; };
  auto do_at = [&](int i, int64_t col) { return load_elem<T>(a.dout, off4(a.dout, ci.b, ci.t0 + i, hv, col)); };
  auto v_at = [&](int i, int64_t col) { return load_elem<T>(a.v, off4(a.v, ci.b, ci.t0 + i, hv, col)); };

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

  // A. dP = scale Lower_incl(do v_new^T). Staging of the products and of the decayed sums: A's
  // array (A itself is loaded at the end of phase C).
  static_assert(kda_mma::contract_stage_bytes<T, 8>() <= sizeof(float) * C * LDM, "staging fits in A's array");
  static_assert(kda_mma::contract_stage_bytes<T, 8>() <= sizeof(float) * C * KMAX, "and in q's");
  T* stage = reinterpret_cast<T*>(sm.A);
  auto do_rows = [&](int r, int64_t col) { return r < L ? do_at(r, col) : 0.f; };
  auto vn_rows = [&](int r, int64_t col) { return r < L ? vn_at(r, col) : 0.f; };
  auto dvn_rows = [&](int r, int64_t col) { return r < L ? dvn_at(r, col) : 0.f; };
  {
    float acc[8][4] = {};
    kda_mma::contract_rows<T, 8, false, false, kGradsThreads>(do_rows, vn_rows, V, stage, acc);
    store_acc64(acc, 0, [&](int i, int j, float x) { sm.mat[i * LDM + j] = i < L && j <= i ? scale * x : 0.f; });
  }
  __syncthreads();
  auto qx = [&](int r, int d) { return sm.q[r * KMAX + d]; };
  auto kx = [&](int r, int d) { return sm.k[r * KMAX + d]; };
  float* stagef = sm.A;  // 16 * KMAX floats for the decayed sums
  auto h_rows = [&](int n, int64_t col) { return h[n * V + col]; };
  auto dhn_rows = [&](int n, int64_t col) { return dhn[n * V + col]; };
  // out = sign * X Y^T (X: 64 rows over V, Y: KMAX rows over V; 64 channels at a time).
  auto contract_into = [&](auto&& xr, auto&& yr, auto split_x, float sign, float* out) {
    for (int n0 = 0; n0 < KMAX; n0 += 64) {
      float acc[8][4] = {};
      auto y0 = [&](int n, int64_t col) { return yr(n0 + n, col); };
      kda_mma::contract_rows<T, 8, decltype(split_x)::value, true, kGradsThreads>(xr, y0, V, stage, acc);
      store_acc64(acc, n0, [&](int r, int d, float v) { out[r * KMAX + d] = sign * v; });
    }
    __syncthreads();
  };
  using exact = std::false_type;
  using split = std::true_type;

  // B.1 aq (into dw's array), Y = do h^T (into dG's); dq = scale e o Y + aq, dG = q o dq.
  kda_decayed_rows<KMAX, kGradsThreads>(sm.mat, LDM, kx, sm.G, true, sm.dw, stagef);
  contract_into(do_rows, h_rows, exact{}, 1.f, sm.dG);
  for (int e = tid; e < C * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    float dG = 0.f;
    if (r < L) {
      const float dq = scale * sm.dG[e] * expf(sm.G[e]) + sm.dw[e];
      dG = sm.q[e] * dq;
      atomicAdd(&a.dq_acc[((row0 + r) * a.H + head) * K + d], dq);
    }
    sm.dG[e] = dG;
  }
  __syncthreads();
  // B.2 ak (into dw's array), X = v_new dh_{c+1}^T (into dk's); dk = X o exp(gl - G) + ak,
  //     dG -= s + k o ak with s = X o k o exp(gl - G), and dG_{L-1} += sum_r s (sl).
  kda_decayed_cols<KMAX, kGradsThreads>(sm.mat, LDM, qx, sm.G, true, sm.dw, stagef);
  contract_into(vn_rows, dhn_rows, exact{}, 1.f, sm.dk);
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
        const float kdx = expf(sm.G[(L - 1) * KMAX + d] - sm.G[e]);  // r <= L - 1
        const float s = X * kdx * sm.k[e];
        dk = X * kdx + ak;
        sm.dG[e] -= s + sm.k[e] * ak;
        s_sum += s;
      }
      sm.dk[e] = dk;
    }
    atomicAdd(&sm.sl[tid % KMAX], s_sum);
  }
  // exp(gl_d) <h_c[d], dh_{c+1}[d]>: warps over consecutive columns of one channel (V % 32 == 0),
  // 8 loads in flight per thread (K V is a multiple of 8 * 256).
  for (int64_t e0 = tid; e0 < K * V; e0 += 8 * kGradsThreads) {
    float x[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) x[u] = h[e0 + u * kGradsThreads] * dhn[e0 + u * kGradsThreads];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float s = group_sum<32>(x[u]);
      const int d = static_cast<int>((e0 + u * kGradsThreads) / V);
      if ((tid & 31) == 0) atomicAdd(&sm.sl[d], expf(sm.G[(L - 1) * KMAX + d]) * s);
    }
  }
  // B.3 dw = -dv_new h^T (contract_into begins with a barrier: ak's readers are done).
  contract_into(dvn_rows, h_rows, split{}, -1.f, sm.dw);

  // C. Wb = beta e o k where q was (q is done); then dA (where dP was).
  for (int e = tid; e < C * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    sm.q[e] = sm.beta[r] * expf(sm.G[r * KMAX + d]) * sm.k[e];
  }
  __syncthreads();
  {
    float acc[8][4] = {};
    auto bv_rows = [&](int j, int64_t col) { return j < L ? sm.beta[j] * v_at(j, col) : 0.f; };
    auto dw_rows = [&](int r, int64_t d) { return sm.dw[r * KMAX + d]; };
    auto wb_rows = [&](int j, int64_t d) { return sm.q[j * KMAX + d]; };
    kda_mma::contract_rows<T, 8, true, true, kGradsThreads>(dvn_rows, bv_rows, V, stage, acc);
    kda_mma::contract_rows<T, 8, true, true, kGradsThreads>(dw_rows, wb_rows, KMAX, stage, acc);
    store_acc64(acc, 0, [&](int i, int j, float x) { sm.mat[i * LDM + j] = i < L && j <= i ? x : 0.f; });
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
  for (int e = tid; e < L * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    float dwb = 0.f;
    for (int i = r; i < L; ++i) dwb += sm.A[i * LDM + r] * sm.dw[i * KMAX + d];
    const float t = expf(sm.G[r * KMAX + d]) * sm.k[r * KMAX + d] * dwb;  // (e k o dWb)_rd
    sm.dk[e] += sm.beta[r] * expf(sm.G[r * KMAX + d]) * dwb;
    sm.dG[e] += sm.beta[r] * t;
    const float ts = group_sum<32>(t);  // a warp's 32 lanes share row r (K % 32 == 0)
    if ((tid & 31) == 0) atomicAdd(&sm.dbeta[r], ts);
  }
  // dUb = A^T dv_new on tensor cores, 64 value columns at a time; staged where q / Wb was (free
  // since C; E's tmp comes after).
  {
    T* stage_q = reinterpret_cast<T*>(sm.q);
    auto at_rows = [&](int r, int64_t i) { return sm.A[i * LDM + r]; };  // (A^T)_ri = A_ir
    for (int64_t c0 = 0; c0 < V; c0 += 64) {
      // v at this thread's accumulator elements (store_acc64's layout), loaded ahead.
      const int wq = (tid / 32) % 4, half = tid / 128;
      float vv[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 16 * wq + mma::acc_row(e), n = 8 * nt + mma::acc_col(e);
          vv[nt][e] = nt / 4 == half && j < L ? v_at(j, c0 + n) : 0.f;
        }
      float acc[8][4] = {};
      auto dvn_cols = [&](int n, int64_t i) { return i < L ? dvn_at(static_cast<int>(i), c0 + n) : 0.f; };
      kda_mma::contract_rows<T, 8, true, true, kGradsThreads>(at_rows, dvn_cols, C, stage_q, acc);
      // dv; v . dUb summed over this thread's columns of its two rows (grp, grp + 8), then over the
      // 4 lanes of a row (xor 1, 2), one shared atomic per row and lane quad.
      float vd[2] = {0.f, 0.f};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt / 4 != half) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 16 * wq + mma::acc_row(e), n = 8 * nt + mma::acc_col(e);
          if (j < L) a.dv[((row0 + j) * a.HV + hv) * V + c0 + n] = sm.beta[j] * acc[nt][e];
          vd[e >> 1] += vv[nt][e] * acc[nt][e];  // vv is 0 past L
        }
      }
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        vd[h2] += __shfl_xor_sync(0xffffffffu, vd[h2], 1);
        vd[h2] += __shfl_xor_sync(0xffffffffu, vd[h2], 2);
        const int j = 16 * wq + mma::grp() + 8 * h2;
        if (mma::tig() == 0 && j < L) atomicAdd(&sm.dbeta[j], vd[h2]);
      }
    }
  }
  __syncthreads();

  // E. tmp = dA A^T (where q / Wb was, [C][C]), then dM = -A^T tmp, strictly lower (where dA was).
  float* tmp = sm.q;  // C * C <= C * KMAX
  for (int e = tid; e < C * C; e += kGradsThreads) {
    const int i = e / C, m = e % C;
    float s = 0.f;
    if (i < L && m < L)
      for (int j = 0; j <= (i < m ? i : m); ++j) s += sm.mat[i * LDM + j] * sm.A[m * LDM + j];
    tmp[i * C + m] = s;
  }
  __syncthreads();
  for (int e = tid; e < C * C; e += kGradsThreads) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    if (i < L && j < i)
      for (int m = i; m < L; ++m) s += sm.A[m * LDM + i] * tmp[m * C + j];
    sm.mat[i * LDM + j] = -s;
  }
  __syncthreads();

  // F. Key products: bm (into q's array, free since E), ck (into dw's); dk, dG, dbeta.
  kda_decayed_rows<KMAX, kGradsThreads>(sm.mat, LDM, kx, sm.G, false, sm.q, stagef);
  auto beta_k = [&](int i, int d) { return sm.beta[i] * sm.k[i * KMAX + d]; };
  kda_decayed_cols<KMAX, kGradsThreads>(sm.mat, LDM, beta_k, sm.G, false, sm.dw, stagef);
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
#pragma unroll 8
    for (int i = L - 1; i >= 0; --i) {
      acc += sm.dG[i * KMAX + tid];
      a.dg[((row0 + i) * a.HV + hv) * K + tid] = acc;
    }
  }
  if (tid < L) a.dbeta[(row0 + tid) * a.HV + hv] = sm.dbeta[tid];
  for (int e = tid; e < L * KMAX; e += kGradsThreads) {
    const int r = e / KMAX, d = e % KMAX;
    atomicAdd(&a.dk_acc[((row0 + r) * a.H + head) * K + d], sm.dk[e]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
