// KDA B2 local kernel, session 12 form (helper kdaloc; the default for the rounded B2 variants since
// run 12.2, FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old keeps the session-10 kernel): the same outputs as
// kda_grads_local_kernel<T, KMAX, false>
// (chunked_kda_grads_local.cuh: the notation, the phases and the thread ownership of the slice's
// elementwise terms) up to fp32 summation order, with
//   - dP and dM kept as 16-bit tiles (rounded once, as the session-10 kernel rounded them at each
//     fragment load) for the decayed sums' tensor-core parts, plus fp32 copies of their 8 x 8
//     diagonal blocks for the fp32 in-half part (chunked_kda_grads_decayed2.cuh: ldmatrix fragments,
//     staging loops with fixed offsets, staged operands in T);
//   - dbeta's rowsum(k o bm) by a pass over a tile (k o bm written over bm, 4 lanes per row, 16-byte
//     loads) instead of a 32-lane shuffle sum and a shared-memory atomic (a compare-and-swap loop on
//     sm_90) per element row;
//   - the fp32 slice tiles (G, q, k, out, out2) swizzled by row (kda_swz_at; chunked_kda_grads_decayed2.cuh
//     says why), the fragment-layout read-modify-writes by float2;
//   - dUb's operands A and dv_new split hi + lo once where staged (16-bit tiles in the slice tiles'
//     space, free after the slices), fragments by ldmatrix.
// Shared memory 109.75 KiB (the session-10 kernel: 110): two blocks per SM as before.
#pragma once

#include "chunked_kda_grads_decayed2.cuh"
#include "chunked_kda_grads_local.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T>
struct KdaGradsLocal2Smem {
  static constexpr int C = kChunkSize, KS = kKdaSliceK, HP = kKdaHalfPitch;
  float *G, *q, *k, *out, *out2;  // [C][KS]; G in log2 units; later A and dv_new for dUb
  float *dPd, *dMd;        // [8][8][8]: the 8 x 8 diagonal blocks of dP, dM (fp32)
  T *dPh, *dMh;            // [C][HP]: dP, dM rounded to T
  T* stage;                // [kKdaStage2Rows][HP]
  float *beta, *dbeta, *rq, *rk;  // [C]
  static constexpr int64_t bytes() {
    return sizeof(float) * (5 * C * KS + 2 * kKdaDiagFloats + 4 * C) + sizeof(T) * (2 * C * HP + kKdaStage2Rows * HP);
  }
  __device__ explicit KdaGradsLocal2Smem(unsigned char* raw) {
    G = reinterpret_cast<float*>(raw);
    q = G + C * KS;
    k = q + C * KS;
    out = k + C * KS;
    out2 = out + C * KS;
    dPd = out2 + C * KS;
    dMd = dPd + kKdaDiagFloats;
    dPh = reinterpret_cast<T*>(dMd + kKdaDiagFloats);
    dMh = dPh + C * HP;
    stage = dMh + C * HP;
    beta = reinterpret_cast<float*>(stage + kKdaStage2Rows * HP);
    dbeta = beta + C;
    rq = dbeta + C;
    rk = rq + C;
  }
};
static_assert(KdaGradsLocal2Smem<__half>::bytes() <= 113 * 1024, "two blocks per SM");
static_assert((2 * kChunkSize * kKdaHalfPitch + kKdaStage2Rows * kKdaHalfPitch) * 2 % 16 == 0, "16-byte alignment");

// Index of W[i][j] in the compact diagonal blocks (i / 8 == j / 8).
__device__ __forceinline__ int kda_diag_at(int i, int j) { return 64 * (i >> 3) + 8 * (i & 7) + (j & 7); }

// The slice tiles with all loads in flight at once (session-10 loaders, kda_gate_slice /
// kda_key_slice: 8 dependent batches of 2- or 4-byte loads per tile, ~700 SASS instructions per slice
// and warp):
//   G: 16-byte cp.async copies of raw rows (rows past L: row L - 1) into the unswizzled tile, chunk
//      q = tid + 256 i (row q / 16, channels 4 (q % 16)..); kda_gate2_to_log2 scales the same chunks
//      after this thread's copies have landed (no barrier needed in between);
//   q, k: 8-byte loads of 4 T (a warp reads two whole 128-byte rows), chunk q = tid + 256 i (row q / 16,
//      channels 4 (q % 16)..), times the row's rstd, one 16-byte store (a warp's 32 stores are 512
//      contiguous bytes: no bank conflict). Rows past L: 0. Needs 8-byte aligned rows
//      (kda_key_rows8); otherwise kda_key_slice.
template <int KMAX>
__device__ __forceinline__ void kda_gate2_async(const float* G_in, const ChunkInfo& ci, int64_t row0, int64_t hv,
                                                int64_t HV, int c0, float* out) {
#pragma unroll
  for (int i = 0; i < kKdaGateChunks; ++i) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * i, r = q / 16, d = 4 * (q % 16);
    const int rr = r < ci.len ? r : ci.len - 1;
    mma::cp_async16(out + kda_swz_at(r, d), G_in + ((row0 + rr) * HV + hv) * KMAX + c0 + d, true);
  }
  mma::cp_async_commit();
}
__device__ __forceinline__ void kda_gate2_to_log2(float* out) {
  mma::cp_async_wait<0>();
  kda_gate_slice_to_log2(out);
}
template <typename T>
__device__ __forceinline__ bool kda_key_rows8(const View& x, const ChunkInfo& ci, int64_t head) {
  return (reinterpret_cast<uintptr_t>(static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0, head)) & 7) == 0 &&
         x.s1 % 4 == 0;
}
constexpr int kKdaKeyChunks = kChunkSize * kKdaSliceK / 4 / kKdaSplitThreads;  // 4 per thread
template <typename T>
__device__ __forceinline__ void kda_key2_load(const View& x, const ChunkInfo& ci, int64_t head, int c0,
                                              uint2 (&v)[kKdaKeyChunks]) {
  // Row tid / 16 + 16 i: one pointer stepped by 16 rows (fewer 64-bit addresses live across the slices).
  const int r0 = static_cast<int>(threadIdx.x) / 16;
  const T* p = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + r0, head) + c0 + 4 * (threadIdx.x % 16);
  const int64_t step = 16 * x.s1;
#pragma unroll
  for (int i = 0; i < kKdaKeyChunks; ++i, p += step)
    v[i] = r0 + 16 * i < ci.len ? *reinterpret_cast<const uint2*>(p) : make_uint2(0u, 0u);
}
template <typename T>
__device__ __forceinline__ void kda_key2_store(const uint2 (&v)[kKdaKeyChunks], const float* rstd, float* out) {
#pragma unroll
  for (int i = 0; i < kKdaKeyChunks; ++i) {
    const int q = static_cast<int>(threadIdx.x) + kKdaSplitThreads * i, r = q / 16, d = 4 * (q % 16);
    const float s = rstd[r];
    float4 f;
    mma::unpack_floats<T>(v[i].x, f.x, f.y);
    mma::unpack_floats<T>(v[i].y, f.z, f.w);
    f.x *= s, f.y *= s, f.z *= s, f.w *= s;
    *reinterpret_cast<float4*>(out + kda_swz_at(r, d)) = f;
  }
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kKdaSplitThreads, 2) kda_grads_local2_kernel(ChunkedArgs a) {
  using S = KdaGradsLocal2Smem<T>;
  constexpr int C = kChunkSize, KS = kKdaSliceK, HP = kKdaHalfPitch, NE = C * KS / kKdaSplitThreads;
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
  float* dq_row0 = a.dq_acc + (row0 * a.H + head) * K;  // row r, channel d: + r * H K + d
  float* dk_row0 = a.dk_acc + (row0 * a.H + head) * K;
  float* dg_row0 = a.dg + (row0 * HV + hv) * K;  // row r, channel d: + r * HV K + d
  const int64_t qk_stride = a.H * K, dg_stride = HV * K;

  if (tid < C) {
    sm.beta[tid] = tid < L ? load_elem<T>(a.beta, off3(a.beta, ci.b, ci.t0 + tid, hv)) : 0.f;
    sm.dbeta[tid] = 0.f;
  }
  // do and v_new's chunk rows staged in the slice tiles' space by 16-byte cp.async (rows past L
  // zero-filled; [64][V + 8] T each, pitch V + 8: the 8 rows of an ldmatrix phase in distinct banks),
  // so that dP's fragments come by ldmatrix, in one round trip (rows_times_rows_global loaded them
  // straight from global memory, one 16-column step ahead: 8 dependent steps at V = 128). Needs
  // 16-byte aligned do rows; otherwise the global-fragment product.
  const int VP = static_cast<int>(V) + 8, cpr = static_cast<int>(V) / 8;  // T per staged row, 16-byte chunks per row
  T* do_s = reinterpret_cast<T*>(sm.G);
  T* vn_s = do_s + C * VP;
  static_assert(2 * C * (256 + 8) * 2 <= 5 * C * KS * 4, "do and v_new rows (V <= 256) fit in the slice tiles");
  const bool stage_do = (reinterpret_cast<uintptr_t>(do_base) & 15) == 0 && a.dout.s1 % 8 == 0;
  if (stage_do) {
    for (int q = tid; q < C * cpr; q += kKdaSplitThreads) {
      const int r = q / cpr, c8 = 8 * (q - r * cpr);
      const bool ok = r < L;
      mma::cp_async16(do_s + r * VP + c8, do_base + (ok ? r : 0) * a.dout.s1 + c8, ok);
      mma::cp_async16(vn_s + r * VP + c8, vn_base + (ok ? r : 0) * HVV + c8, ok);
    }
    mma::cp_async_commit();
  }
  // dM from dv's first 64 columns (rows past L: 0), 16-byte loads all in flight: rounded into dMh,
  // its diagonal blocks into dMd. Chunk q = tid + 256 u: row q / 16, columns 4 (q % 16)...
  {
    float4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = tid + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
      x[u] = i < L ? *reinterpret_cast<const float4*>(dv0 + i * HVV + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = tid + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
      *reinterpret_cast<uint2*>(sm.dMh + i * HP + j) =
          make_uint2(mma::pack_floats<T>(x[u].x, x[u].y), mma::pack_floats<T>(x[u].z, x[u].w));
      if ((i >> 3) == (j >> 3)) *reinterpret_cast<float4*>(sm.dMd + kda_diag_at(i, j)) = x[u];
    }
  }
  {
    // dP = scale Lower_incl(do v_new^T) (warp: rows 16 rs.., columns n0 + 8 nt..): accumulator pairs
    // (columns j, j + 1 of one row) rounded into dPh, the diagonal blocks into dPd.
    float acc[4][4] = {};
    if (stage_do) {
      mma::cp_async_wait<0>();
      __syncthreads();  // every thread's copies landed
      const int lane = tid % 32;
      // A: do rows 16 rs + (lane & 7) + 8 ((lane >> 3) & 1), columns c + 8 (lane >> 4) (a[0..3]);
      // B (B[k][n] = v_new[n][c + k], non-transposed tiles of v_new rows): tile t = lane / 8 of a pair
      // of column tiles: rows n0 + 8 (2 p + (t >> 1)) + (lane & 7), columns c + 8 (t & 1).
      const T* pa = do_s + (16 * rs + (lane & 7) + 8 * ((lane >> 3) & 1)) * VP + 8 * (lane >> 4);
      const T* pb = vn_s + (n0 + 8 * (lane >> 4) + (lane & 7)) * VP + 8 * ((lane >> 3) & 1);
#pragma unroll 2
      for (int c = 0; c < V; c += 16) {
        uint32_t af[4], b01[4], b23[4];
        mma::ldmatrix_x4<false>(af, pa + c);
        mma::ldmatrix_x4<false>(b01, pb + c);
        mma::ldmatrix_x4<false>(b23, pb + 16 * VP + c);
        const uint32_t b0[2] = {b01[0], b01[1]}, b1[2] = {b01[2], b01[3]}, b2[2] = {b23[0], b23[1]},
                       b3[2] = {b23[2], b23[3]};
        mma::mma16816<T>(acc[0], af, b0);
        mma::mma16816<T>(acc[1], af, b1);
        mma::mma16816<T>(acc[2], af, b2);
        mma::mma16816<T>(acc[3], af, b3);
      }
    } else if (pairs_do) {
      kda_mma::rows_times_rows_global<T, true>(do_base, a.dout.s1, vn_base, HVV, V, L, acc);
    } else {
      kda_mma::rows_times_rows_global<T, false>(do_base, a.dout.s1, vn_base, HVV, V, L, acc);
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int i = 16 * rs + mma::grp() + 8 * h2, j = n0 + 8 * nt + 2 * mma::tig();
        const float v0 = i < L && j <= i ? scale * acc[nt][2 * h2] : 0.f;
        const float v1 = i < L && j + 1 <= i ? scale * acc[nt][2 * h2 + 1] : 0.f;
        *reinterpret_cast<uint32_t*>(sm.dPh + i * HP + j) = mma::pack_floats<T>(v0, v1);
        if ((i >> 3) == (j >> 3)) sm.dPd[kda_diag_at(i, j)] = v0, sm.dPd[kda_diag_at(i, j + 1)] = v1;
      }
  }
  // (after dP: fewer registers live at once) 16-byte loads where the rows allow (one round trip; the
  // 2-byte loads were four), the same sums in another order.
  if (kda_key_rows16<T>(a.q, ci, head) && kda_key_rows16<T>(a.k, ci, head)) {
    kda_row_rstd16<T, KMAX>(a.q, ci, head, a.l2norm, sm.rq);
    kda_row_rstd16<T, KMAX>(a.k, ci, head, a.l2norm, sm.rk);
  } else {
    kda_row_rstd<T, KMAX>(a.q, ci, head, a.l2norm, sm.rq);
    kda_row_rstd<T, KMAX>(a.k, ci, head, a.l2norm, sm.rk);
  }
  __syncthreads();  // dM read (dv is free from here on), dP, beta, rstd in place; do / v_new's readers done

  const bool keys8 = kda_key_rows8<T>(a.q, ci, head) && kda_key_rows8<T>(a.k, ci, head);
#pragma unroll 1
  for (int c0 = 0; c0 < KMAX; c0 += KS) {
    kda_gate2_async<KMAX>(a.G, ci, row0, hv, HV, c0, sm.G);
    if (keys8) {
      uint2 vq[kKdaKeyChunks], vk[kKdaKeyChunks];
      kda_key2_load<T>(a.q, ci, head, c0, vq);
      kda_key2_load<T>(a.k, ci, head, c0, vk);
      kda_key2_store<T>(vq, sm.rq, sm.q);
      kda_key2_store<T>(vk, sm.rk, sm.k);
    } else {
      kda_key_slice_each<T>(a.q, ci, head, c0, [&](int r, int d, T v) { sm.q[kda_swz_at(r, d)] = to_f<T>(v) * sm.rq[r]; });
      kda_key_slice_each<T>(a.k, ci, head, c0, [&](int r, int d, T v) { sm.k[kda_swz_at(r, d)] = to_f<T>(v) * sm.rk[r]; });
    }
    kda_gate2_to_log2(sm.G);
    __syncthreads();
    float dk[NE], dG[NE];  // element e = tid + 256 m: row e / 64 = tid / 64 + 4 m, channel tid % 64
    const int d = tid % KS, r0 = tid / KS;
    const int64_t sqk = 4 * qk_stride, sdg = 4 * dg_stride;
    {
      const float* pdg = dg_row0 + r0 * dg_stride + c0 + d;
#pragma unroll
      for (int m = 0; m < NE; ++m, pdg += sdg) {
        dG[m] = r0 + 4 * m < L ? *pdg : 0.f;
        dk[m] = 0.f;
      }
    }
    // ak + ck: dk = ak + ck, dG -= k o (ak + ck).
    kda_cols_sum2<T>(sm.dPh, sm.dMh, sm.dPd, sm.dMd, sm.q, sm.k, sm.beta, sm.G, sm.out, sm.stage);
#pragma unroll
    for (int m = 0; m < NE; ++m) {
      const int e = kda_swz_at(r0 + 4 * m, d);
      const float s = sm.out[e];
      dk[m] += s;
      dG[m] -= sm.k[e] * s;
    }
    __syncthreads();  // out's readers are done: the pair below writes aq into out, bm into out2
    kda_rows_pair2<T>(sm.dPh, sm.dMh, sm.dPd, sm.dMd, sm.k, sm.G, sm.out, sm.out2, sm.stage);
    {
      float* pdq = dq_row0 + r0 * qk_stride + c0 + d;
      float* pdk = dk_row0 + r0 * qk_stride + c0 + d;
#pragma unroll
      for (int m = 0; m < NE; ++m, pdq += sqk, pdk += sqk) {
        const int r = r0 + 4 * m, e = kda_swz_at(r, d);
        const float aq = sm.out[e], bm = sm.out2[e], kr = sm.k[e], br = sm.beta[r];
        dk[m] += br * bm;
        // (q's tile holds q rstd, the product the session-10 kernel formed from q reloaded from global
        // memory: the same float)
        dG[m] += sm.q[e] * aq + br * kr * bm;
        sm.out2[e] = kr * bm;  // dbeta's terms (0 past L: k is), summed by rows below
        if (r < L) {
          atomicAdd(pdq, aq);
          atomicAdd(pdk, dk[m]);
        }
        sm.out[e] = r < L ? dG[m] : 0.f;  // the same thread read out[e] above
      }
    }
    __syncthreads();
    {
      // dbeta += rowsum(k o bm): row tid / 4, lane part sums the row's physical positions 16 part ..
      // + 16 (4 float4; the swizzle permutes channels inside a row).
      const int r = tid / 4, part = tid % 4;
      const float4* p = reinterpret_cast<const float4*>(sm.out2 + r * KS + 16 * part);
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 x = p[u];
        s += (x.x + x.y) + (x.z + x.w);
      }
      s = group_sum<4>(s);
      if (part == 0) sm.dbeta[r] += s;  // one thread per row (rows past L: 0)
    }
    // dg = reverse cumsum over the chunk's rows (out is 0 past L), by all 8 warps (the session-10
    // kernel's two warps walked the 64 rows one after another while six waited): thread (channel
    // d = tid % 64, quarter p = tid / 64) sums its rows 16 p + 15 .. 16 p from the end, publishes its
    // quarter's total in `stage` (free here), and adds the later quarters' totals.
    {
      const int d = tid % KS, p = tid / KS;
      float* tot = reinterpret_cast<float*>(sm.stage);  // [4][64]
      float v[16], run = 0.f;
#pragma unroll
      for (int i = 15; i >= 0; --i) {
        run += sm.out[kda_swz_at(16 * p + i, d)];
        v[i] = run;
      }
      tot[p * KS + d] = run;
      __syncthreads();
      float later = 0.f;
      for (int q = 3; q > p; --q) later += tot[q * KS + d];
      float* pg = dg_row0 + (16 * p) * dg_stride + c0 + d;
#pragma unroll
      for (int i = 0; i < 16; ++i, pg += dg_stride)
        if (16 * p + i < L) *pg = v[i] + later;
    }
    __syncthreads();  // the slice tiles, out and `stage` are free
  }

  // dUb = A^T dv_new, 64 value columns at a time, both operands hi + lo as the session-10 kernel's
  // warp_fp32_product split them, but split once where they are staged (that product split every
  // fragment element in each of the 2 - 4 warps that read it, from scalar loads): A masked (unit
  // diagonal, zero upper triangle and rows past L) into Ah / Al [64][72] T, dv_new's 64 columns into
  // Dh / Dl; fragments by ldmatrix.trans (A^T's rows are A's columns; dv_new's k pairs are in two rows).
  // All four tiles in the slice tiles' space. Loads: chunk q = tid + 256 u, row q / 16, columns
  // 4 (q % 16).., all in flight at once.
  T* Ah = reinterpret_cast<T*>(sm.G);
  T* Al = Ah + C * HP;
  T* Dh = Al + C * HP;
  T* Dl = Dh + C * HP;
  static_assert(4 * C * kKdaHalfPitch * 2 <= 5 * C * KS * 4, "A and dv_new hi / lo fit in the slice tiles");
  auto split4 = [&](T* hi, T* lo, int i, int j, float4 x) {
    uint32_t h0, l0, h1, l1;
    mma::split_pair<T>(x.x, x.y, h0, l0);
    mma::split_pair<T>(x.z, x.w, h1, l1);
    *reinterpret_cast<uint2*>(hi + i * HP + j) = make_uint2(h0, h1);
    *reinterpret_cast<uint2*>(lo + i * HP + j) = make_uint2(l0, l1);
  };
  {
    const float* Ag = a.A + (row0 * HV + hv) * C;  // row i: + i * HV * 64
    float4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = tid + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
      x[u] = i < L ? *reinterpret_cast<const float4*>(Ag + i * HV * C + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = tid + kKdaSplitThreads * u, i = q / 16, j = 4 * (q % 16);
      auto mask = [&](float v, int jj) { return i < L ? (jj < i ? v : (jj == i ? 1.f : 0.f)) : 0.f; };
      split4(Ah, Al, i, j, make_float4(mask(x[u].x, j), mask(x[u].y, j + 1), mask(x[u].z, j + 2), mask(x[u].w, j + 3)));
    }
  }
  const int lane = tid % 32;
  // A^T fragment (rows r = 16 rs.., k = i): tile t = lane / 8 from A rows k + 8 (t >> 1) + (lane & 7),
  // columns 16 rs + 8 (t & 1). dv_new B fragments, two column tiles per ldmatrix: tile t from rows
  // k + 8 (t & 1) + (lane & 7), columns n0 + 8 (2 p + (t >> 1)).
  const int a_off = (8 * (lane >> 4) + (lane & 7)) * HP + 16 * rs + 8 * ((lane >> 3) & 1);
  const int b_off = (8 * ((lane >> 3) & 1) + (lane & 7)) * HP + n0 + 8 * (lane >> 4);
  for (int64_t cv = 0; cv < V; cv += 64) {
    if (cv) __syncthreads();  // the previous pass's readers of Dh / Dl are done
    {
      float4 x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = tid + kKdaSplitThreads * u, i = p / 16;
        x[u] = i < L ? *reinterpret_cast<const float4*>(dvn_base + i * HVV + cv + 4 * (p % 16))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = tid + kKdaSplitThreads * u;
        split4(Dh, Dl, p / 16, 4 * (p % 16), x[u]);
      }
    }
    float vv[4][4];  // v at this thread's accumulator elements, loaded ahead (0 past L)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 16 * rs + mma::acc_row(e), n = n0 + 8 * nt + mma::acc_col(e);
        vv[nt][e] = j < L ? to_f<T>(v_base[j * a.v.s1 + cv + n]) : 0.f;
      }
    __syncthreads();  // Dh / Dl (and, the first time, Ah / Al) in place
    float acc[4][4] = {};
    // k from 16 rs: A^T's rows r >= 16 rs are zero at k = i < r (A is lower triangular).
#pragma unroll 1
    for (int kk = 16 * rs; kk < C; kk += 16) {
      uint32_t ah[4], al[4];
      mma::ldmatrix_x4<true>(ah, Ah + kk * HP + a_off);
      mma::ldmatrix_x4<true>(al, Al + kk * HP + a_off);
#pragma unroll
      for (int p = 0; p < 2; ++p) {  // column tiles 2 p, 2 p + 1
        uint32_t bh4[4], bl4[4];
        mma::ldmatrix_x4<true>(bh4, Dh + kk * HP + b_off + 16 * p);
        mma::ldmatrix_x4<true>(bl4, Dl + kk * HP + b_off + 16 * p);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t bh[2] = {bh4[2 * h], bh4[2 * h + 1]}, bl[2] = {bl4[2 * h], bl4[2 * h + 1]};
          mma::mma16816<T>(acc[2 * p + h], ah, bh);
          mma::mma16816<T>(acc[2 * p + h], al, bh);
          mma::mma16816<T>(acc[2 * p + h], ah, bl);
        }
      }
    }
    kda_mma::kda_store_dv_add_dbeta(dv0, HVV, cv, rs, n0, L, sm.beta, vv, acc, sm.dbeta);
  }
  __syncthreads();
  // dbeta = the first kernel's WY part + ours.
  if (tid < L) a.dbeta[(row0 + tid) * HV + hv] += sm.dbeta[tid];
}

}  // namespace flashgrad::cuda_detail::delta_rule
