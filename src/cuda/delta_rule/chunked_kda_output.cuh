// KDA chunked stage 3 ("output"), one block of 128 threads per (chunk, value head, slice of 64
// value columns):
//   o = scale [(q o exp(G)) h_c + P v_new],  P = Lower_incl(sum_d q_id k_jd exp(G_id - G_jd)).
// P comes from stage 1 (packed in A's upper triangle, chunked_kda.h); both products run on tensor
// cores with q o exp(G), h_c and P split hi + lo (v_new is stored in T). Warp wp owns output rows
// [16 wp, 16 wp + 16).
// kSingle (the default since run 11.3; FLASHGRAD_CHUNKED_KDA_OUTPUT=split keeps hi + lo): q o exp(G),
// h_c and P rounded to T once (single-fragment operands, as fla's chunk_gla_fwd_kernel_o takes bf16 q, h and
// A): no lo tiles (47 instead of 89 KiB at K = 128: four blocks per SM instead of two) and a third
// of the mmas. fla's output kernel runs in 0.127 ms at B4 T4096 H16 K=V=128 (run 11.2), this one in
// 0.45.
#pragma once

#include <cstdlib>
#include <string>

#include "chunked_kda_decay.cuh"  // decay_exp
#include "chunked_kda_mma.cuh"
#include "chunked_tiles.cuh"  // key_rows_vectorizable

namespace flashgrad::cuda_detail::delta_rule {

// The output kernel's single-fragment products (kSingle below), for the launcher and the host
// emulation: the default since run 11.3 (H200, B4 T4096 H16 K=V=128 bf16: kda_output_kernel 0.454 ->
// 0.318 ms per call; KDA GPU tests pass, worst 0.59 of a bar; o moves by 2.7e-3 rel RMS from hi + lo,
// which FLASHGRAD_CHUNKED_KDA_OUTPUT=split keeps; read per call).
inline bool kda_output_single_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_KDA_OUTPUT");
  return !(env && std::string(env) == "split");
}

// Row j of the A intermediate of stage 1, which holds P_ij (j <= i < L) of chunk rows i, j at column i.
__device__ __forceinline__ const float* kda_packed_P_row(const float* A, int64_t row0, int64_t hv, int64_t HV, int j) {
  return A + ((row0 + j) * HV + hv) * kChunkSize;
}

// K = V = 128: 89 KiB (two blocks per SM). Rows of hs / vn (LDV = 72 elements, 144 bytes) stay
// 16-byte aligned for the vector stores.
template <typename T, int KMAX, bool kSingle = false>
struct KdaOutputSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDV = kOutputCols + 8, LDP = C + 8, kParts = kSingle ? 1 : 2;
  T *qs, *qs_lo;  // [C][LDK] q o exp(G) (qs_lo, hs_lo, P_lo: not with kSingle)
  T *hs, *hs_lo;  // [KMAX][LDV] h_c slice
  T *P, *P_lo;    // [C][LDP]
  T* vn;          // [C][LDV] v_new slice
  static constexpr int64_t bytes() {
    return sizeof(T) * (kParts * C * LDK + kParts * KMAX * LDV + kParts * C * LDP + C * LDV);
  }
  __device__ explicit KdaOutputSmem(unsigned char* raw) {
    qs = reinterpret_cast<T*>(raw);
    qs_lo = kSingle ? nullptr : qs + C * LDK;
    hs = qs + kParts * C * LDK;
    hs_lo = kSingle ? nullptr : hs + KMAX * LDV;
    P = hs + kParts * KMAX * LDV;
    P_lo = kSingle ? nullptr : P + C * LDP;
    vn = P + kParts * C * LDP;
  }
};

// One value x into a T tile at `hi` (and its remainder at `lo` unless kSingle).
template <typename T, bool kSingle>
__device__ __forceinline__ void kda_output_store(float x, T* hi, T* lo) {
  if constexpr (kSingle)
    *hi = from_f<T>(x);
  else
    store_split<T>(x, hi, lo);
}
// A pair (x0, x1) as packed T words: hi (and lo unless kSingle).
template <typename T, bool kSingle>
__device__ __forceinline__ void kda_output_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kSingle)
    hi = mma::pack_floats<T>(x0, x1);
  else
    mma::split_pair<T>(x0, x1, hi, lo);
}

template <typename T, int KMAX, bool kSingle = false>
__global__ void __launch_bounds__(kChunkThreads, kSingle ? 4 : 1) kda_output_kernel(ChunkedArgs a) {
  using S = KdaOutputSmem<T, KMAX, kSingle>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDV = S::LDV, LDP = S::LDP, NT = kOutputCols / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  const int64_t c = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kOutputCols;
  const ChunkInfo ci = chunk_info(a, c);
  const int L = ci.len, tid = threadIdx.x, wp = tid / 32;
  const int64_t row0 = chunk_row0(ci, a.T);

  // q o exp(G) (exp(G_rd) <= 1; rows past L are zero).
  const float* Gc = a.G + (row0 * a.HV + hv) * a.K;  // row r: + r * HV K
  const int64_t g_stride = a.HV * a.K;
  auto G_at = [&](int r, int d) { return r < L ? Gc[r * g_stride + d] : 0.f; };
  if (key_rows_vectorizable(a.q) && !a.q.f32) {
    // 16-byte loads (session 10): thread tid takes the 8-channel piece seg = tid % (K / 8) of rows
    // tid / (K / 8) + (128 / (K / 8)) p, every pass's q piece and G (two float4) in flight before the
    // first is used; the same values as kda_key_rows' element loads below (same sums for the norm).
    constexpr int kLanes = KMAX / 8, kRowsPerPass = kChunkThreads / kLanes, kPasses = C / kRowsPerPass;
    const int lr = tid / kLanes, seg = tid % kLanes;
    const T* qrow0 = static_cast<const T*>(a.q.p) + off3(a.q, ci.b, ci.t0, head) + 8 * seg;
    uint4 qv[kPasses];
    float4 g0[kPasses], g1[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = p * kRowsPerPass + lr;
      const bool ok = r < L;
      qv[p] = ok ? *reinterpret_cast<const uint4*>(qrow0 + r * a.q.s1) : make_uint4(0u, 0u, 0u, 0u);
      const float4* gp = reinterpret_cast<const float4*>(Gc + r * g_stride + 8 * seg);
      g0[p] = ok ? gp[0] : make_float4(0.f, 0.f, 0.f, 0.f);
      g1[p] = ok ? gp[1] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = p * kRowsPerPass + lr;
      float x[8];
      const uint32_t w[4] = {qv[p].x, qv[p].y, qv[p].z, qv[p].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) mma::unpack_floats<T>(w[j], x[2 * j], x[2 * j + 1]);
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += x[i] * x[i];
      const float rstd = a.l2norm ? 1.0f / sqrtf(group_sum<kLanes>(ss) + kL2NormEps) : 1.f;
      const float g[8] = {g0[p].x, g0[p].y, g0[p].z, g0[p].w, g1[p].x, g1[p].y, g1[p].z, g1[p].w};
      uint4 hi, lo;
      uint32_t* h4 = &hi.x;
      uint32_t* l4 = &lo.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float v0 = r < L ? x[2 * j] * rstd * decay_exp(g[2 * j]) : 0.f;
        const float v1 = r < L ? x[2 * j + 1] * rstd * decay_exp(g[2 * j + 1]) : 0.f;
        kda_output_pair<T, kSingle>(v0, v1, h4[j], l4[j]);
      }
      *reinterpret_cast<uint4*>(sm.qs + r * LDK + 8 * seg) = hi;
      if constexpr (!kSingle) *reinterpret_cast<uint4*>(sm.qs_lo + r * LDK + 8 * seg) = lo;
    }
  } else {
    kda_key_rows<T, KMAX>(a.q, ci, head, a.l2norm, G_at, [&](int r, int d, float x, float g) {
      kda_output_store<T, kSingle>(r < L ? x * decay_exp(g) : 0.f, &sm.qs[r * LDK + d],
                                   kSingle ? nullptr : &sm.qs_lo[r * LDK + d]);
    });
  }
  // h_c's slice, P and v_new by 16-byte loads (session 10; the session-6 kernel loaded them element by
  // element, 4 bytes or 2 at a time): per thread 16 + 8 float4 and 4 uint4, each batch's loads issued
  // before its stores. The shared contents are those of the element-wise version (split_pair rounds
  // as store_split: hi = T(x), lo = T(x - hi)).
  constexpr int OC = kOutputCols, THR = kChunkThreads;
  // h_c[kr][col0 + 4 c4 ..] (fp32 [K][V] per (chunk, value head)): piece e = tid + THR m, row kr = e / 16,
  // c4 = e % 16 (16 float4 per 64-column row).
  const float* hc = a.h + (c * a.HV + hv) * a.K * a.V + col0;
  constexpr int kHPieces = KMAX * OC / 4 / THR, kHBatch = 8;
#pragma unroll 1
  for (int m0 = 0; m0 < kHPieces; m0 += kHBatch) {
    float4 x[kHBatch];
#pragma unroll
    for (int u = 0; u < kHBatch; ++u) {
      const int e = tid + THR * (m0 + u);
      x[u] = *reinterpret_cast<const float4*>(hc + (e >> 4) * a.V + 4 * (e & 15));
    }
#pragma unroll
    for (int u = 0; u < kHBatch; ++u) {
      const int e = tid + THR * (m0 + u), at = (e >> 4) * LDV + 4 * (e & 15);
      uint2 hi, lo;
      kda_output_pair<T, kSingle>(x[u].x, x[u].y, hi.x, lo.x);
      kda_output_pair<T, kSingle>(x[u].z, x[u].w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(sm.hs + at) = hi;
      if constexpr (!kSingle) *reinterpret_cast<uint2*>(sm.hs_lo + at) = lo;
    }
  }
  // P_ij (j <= i < L) from A's row j (kda_packed_P_row: P_ij at [i]): piece e = tid + THR m, j = e / 16,
  // columns i = 4 (e % 16) + [0, 4); rows j >= L are not read (they may lie past the tensor's end).
  {
    constexpr int kPPieces = C * C / 4 / THR;
    float4 x[kPPieces];
#pragma unroll
    for (int m = 0; m < kPPieces; ++m) {
      const int e = tid + THR * m, j = e >> 4, i0 = 4 * (e & 15);
      x[m] = j < L ? *reinterpret_cast<const float4*>(kda_packed_P_row(a.A, row0, hv, a.HV, j) + i0)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int m = 0; m < kPPieces; ++m) {
      const int e = tid + THR * m, j = e >> 4, i0 = 4 * (e & 15);
      const float p[4] = {x[m].x, x[m].y, x[m].z, x[m].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = i0 + q;
        kda_output_store<T, kSingle>(i < L && j <= i ? p[q] : 0.f, &sm.P[i * LDP + j],
                                     kSingle ? nullptr : &sm.P_lo[i * LDP + j]);
      }
    }
  }
  // v_new[row0 + r][hv][col0 + 8 c8 ..] (T, stored by stage 2): piece e = tid + THR m, r = e / 8, c8 = e % 8.
  {
    const T* v_new = static_cast<const T*>(a.v_new) + hv * a.V + col0;
    constexpr int kVPieces = C * OC / 8 / THR;
    uint4 x[kVPieces];
#pragma unroll
    for (int m = 0; m < kVPieces; ++m) {
      const int e = tid + THR * m, r = e >> 3;
      x[m] = r < L ? *reinterpret_cast<const uint4*>(v_new + (row0 + r) * a.HV * a.V + 8 * (e & 7))
                   : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int m = 0; m < kVPieces; ++m) {
      const int e = tid + THR * m;
      *reinterpret_cast<uint4*>(sm.vn + (e >> 3) * LDV + 8 * (e & 7)) = x[m];
    }
  }
  __syncthreads();

  float acc[NT][4] = {};
  if constexpr (kSingle) {
    // (q o exp(G)) h_c over the K channels, then P v_new over the chunk rows kb <= wp (P lower).
    for (int kk = 0; kk < KMAX; kk += 16) {
      uint32_t af[4];
      kda_mma::ldm_a(sm.qs, LDK, 16 * wp, kk, af);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];
        kda_mma::ldm_b_pair(sm.hs, LDV, kk, 16 * np, bf);
        const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
        mma::mma16816<T>(acc[2 * np], af, b0);
        mma::mma16816<T>(acc[2 * np + 1], af, b1);
      }
    }
    for (int kb = 0; kb <= wp; ++kb) {
      uint32_t af[4];
      kda_mma::ldm_a(sm.P, LDP, 16 * wp, 16 * kb, af);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];
        kda_mma::ldm_b_pair(sm.vn, LDV, 16 * kb, 16 * np, bf);
        const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
        mma::mma16816<T>(acc[2 * np], af, b0);
        mma::mma16816<T>(acc[2 * np + 1], af, b1);
      }
    }
  } else {
    kda_mma::rows_times_split<T, NT>(sm.qs, sm.qs_lo, LDK, sm.hs, sm.hs_lo, LDV, 0, KMAX, acc);
    kda_mma::lower_times_split<T, NT>(sm.P, sm.P_lo, LDP, sm.vn, static_cast<const T*>(nullptr), LDV, 0, acc);
  }
  // o in T with 4-byte column pairs (every contiguous output): each lane's element pairs (columns
  // 8 nt + 2 tig + {0, 1} of rows 16 wp + grp (+8)) as one 32-bit store from two row pointers formed
  // once. Per element (off4's four 64-bit multiply-adds, a branch, a 2-byte store) the store took
  // ~20 instructions, ~640 per thread (session 22, the fused GDN forward's o store measured alike).
  const bool o_pairs = column_pairs_storable(a.o);
  if (o_pairs) {
    const int r0 = 16 * wp + mma::grp();
    T* const o_row0 = static_cast<T*>(a.o.p) + off4(a.o, ci.b, ci.t0 + r0, hv, col0 + 2 * mma::tig());
    T* const o_row8 = o_row0 + 8 * a.o.s1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (r0 < L)
        *reinterpret_cast<uint32_t*>(o_row0 + 8 * nt) = mma::pack_floats<T>(a.scale * acc[nt][0], a.scale * acc[nt][1]);
      if (r0 + 8 < L)
        *reinterpret_cast<uint32_t*>(o_row8 + 8 * nt) = mma::pack_floats<T>(a.scale * acc[nt][2], a.scale * acc[nt][3]);
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * wp + mma::acc_row(e), col = 8 * nt + mma::acc_col(e);
      if (i < L) store_elem<T>(a.o, off4(a.o, ci.b, ci.t0 + i, hv, col0 + col), a.scale * acc[nt][e]);
    }
}

}  // namespace flashgrad::cuda_detail::delta_rule
