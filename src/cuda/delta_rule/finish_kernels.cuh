// Elementwise kernels that turn the backward's fp32 accumulators into the user's gradients:
//   dq, dk: the L2-norm backward when the norm is inside the op (dx = rstd (dy - (dy.y) y), with
//           y = x rstd recomputed from the raw input), then rounding into q's dtype;
//   dbeta:  rounding;
//   dg:     dg_acc + the per-sequence constant dg_const (see recurrent_backward.cuh), rounding.
// All indices are int64; grids are 1-D over rows with a grid-stride loop.
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// The dq / dk kernels below work one warp per row (b, t, h) of K <= 256 elements, lane handling
// elements lane + 32 i (i < kRowSlots), over a grid-stride loop of rows.
constexpr int kRowSlots = 8;

template <typename Body>
__device__ __forceinline__ void for_each_qk_row(int64_t B, int64_t T_len, int64_t H, Body&& body) {
  const int64_t rows = B * T_len * H;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps_total)
    body(row, row / (H * T_len), (row / H) % T_len, row % H);  // row, b, t, h
}

// x[row] as float into the lane's slots (0 past K).
template <typename T>
__device__ __forceinline__ void load_row(const View& x, int64_t xo, int64_t K, int lane, float (&y)[kRowSlots]) {
#pragma unroll
  for (int i = 0; i < kRowSlots; ++i) {
    const int64_t e = lane + 32 * i;
    y[i] = e < K ? to_f<T>(static_cast<const T*>(x.p)[xo + e]) : 0.f;
  }
}

// ||y||^2 over the warp (every lane gets it).
__device__ __forceinline__ float row_sq_sum(const float (&y)[kRowSlots]) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kRowSlots; ++i) ss += y[i] * y[i];
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return ss;
}

// The L2-norm backward of one row in place, from the raw row x: dx = rstd (dy - (dy.y) y), y = x rstd.
__device__ __forceinline__ void l2norm_backward_row(float (&x)[kRowSlots], float rstd, float (&dy)[kRowSlots]) {
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kRowSlots; ++i) {
    x[i] *= rstd;
    dot += dy[i] * x[i];
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
  for (int i = 0; i < kRowSlots; ++i) dy[i] = rstd * (dy[i] - dot * x[i]);
}

template <typename T>
__device__ __forceinline__ void store_row(const View& dx, int64_t dxo, int64_t K, int lane,
                                          const float (&dy)[kRowSlots]) {
#pragma unroll
  for (int i = 0; i < kRowSlots; ++i) {
    const int64_t e = lane + 32 * i;
    if (e < K) static_cast<T*>(dx.p)[dxo + e] = from_f<T>(dy[i]);
  }
}

// dx from one fp32 accumulator [B, T_len, H, K] (the chunked path with GVA), norm recomputed from x.
template <typename T>
__global__ void __launch_bounds__(256) qk_grad_finish_kernel(View x, View dx, const float* acc, int64_t B,
                                                            int64_t T_len, int64_t H, int64_t K, bool l2norm) {
  const int lane = threadIdx.x % 32;
  for_each_qk_row(B, T_len, H, [&](int64_t row, int64_t b, int64_t t, int64_t h) {
    float dy[kRowSlots];
#pragma unroll
    for (int i = 0; i < kRowSlots; ++i) {
      const int64_t e = lane + 32 * i;
      dy[i] = e < K ? acc[row * K + e] : 0.f;
    }
    if (l2norm) {
      float y[kRowSlots];
      load_row<T>(x, off3(x, b, t, h), K, lane, y);
      l2norm_backward_row(y, 1.0f / sqrtf(row_sq_sum(y) + kL2NormEps), dy);
    }
    store_row<T>(dx, off3(dx, b, t, h), K, lane, dy);
  });
}

// The recurrent backward's dq and dk together: each row's interleaved (dq, dk) accumulator pairs are
// read once (8 bytes per element), and with the in-kernel L2 norm 1 / ||x|| comes from qk_rstd_kernel
// (q_rstd / k_rstd, null without the norm) instead of a second reduction over x.
template <typename T>
__global__ void __launch_bounds__(256) qk_pair_grad_finish_kernel(View q, View k, View dq, View dk, const float2* acc,
                                                                 const float* q_rstd, const float* k_rstd,
                                                                 int64_t B, int64_t T_len, int64_t H, int64_t K) {
  const int lane = threadIdx.x % 32;
  for_each_qk_row(B, T_len, H, [&](int64_t row, int64_t b, int64_t t, int64_t h) {
    float dyq[kRowSlots], dyk[kRowSlots];
#pragma unroll
    for (int i = 0; i < kRowSlots; ++i) {
      const int64_t e = lane + 32 * i;
      const float2 v = e < K ? acc[row * K + e] : make_float2(0.f, 0.f);
      dyq[i] = v.x;
      dyk[i] = v.y;
    }
    if (q_rstd) {  // (k_rstd comes with q_rstd)
      float y[kRowSlots];
      load_row<T>(q, off3(q, b, t, h), K, lane, y);
      l2norm_backward_row(y, q_rstd[row], dyq);
      load_row<T>(k, off3(k, b, t, h), K, lane, y);
      l2norm_backward_row(y, k_rstd[row], dyk);
    }
    store_row<T>(dq, off3(dq, b, t, h), K, lane, dyq);
    store_row<T>(dk, off3(dk, b, t, h), K, lane, dyk);
  });
}

// rstd[row] = 1 / sqrt(||x[row]||^2 + eps) for every row (b, t, h) of q or k, as the kernels' in-kernel
// L2 norm computes it (rsqrtf): taken by the backward passes instead of reducing over K at every step.
template <typename T>
__global__ void __launch_bounds__(256) qk_rstd_kernel(View x, float* rstd, int64_t B, int64_t T_len, int64_t H,
                                                     int64_t K) {
  const int lane = threadIdx.x % 32;
  for_each_qk_row(B, T_len, H, [&](int64_t row, int64_t b, int64_t t, int64_t h) {
    float y[kRowSlots];
    load_row<T>(x, off3(x, b, t, h), K, lane, y);
    const float ss = row_sq_sum(y);
    if (lane == 0) rstd[row] = rsqrtf(ss + kL2NormEps);
  });
}

// dbeta[b, t, hv] = acc; dg[b, t, hv(, k)] = acc + dg_const[n, hv(, k)] (n: the token's sequence).
// `inner` = 1 for beta and GDN's g, K for KDA's g; `with_const` false for dbeta.
template <typename T>
__global__ void __launch_bounds__(256) gate_grad_finish_kernel(View out, const float* acc, const float* dg_const,
                                                              const int64_t* cu_seqlens, int64_t num_seqs,
                                                              int64_t B, int64_t T_len, int64_t HV,
                                                              int64_t inner) {
  const int64_t total = B * T_len * HV * inner;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % inner, hv = (i / inner) % HV, t = (i / (inner * HV)) % T_len,
                  b = i / (inner * HV * T_len);
    float val = acc[i];
    if (dg_const) {
      int64_t n = b;
      if (cu_seqlens) {  // last n with cu_seqlens[n] <= t (skips empty sequences)
        int64_t lo = 0, hi = num_seqs - 1;
        while (lo < hi) {
          const int64_t mid = (lo + hi + 1) / 2;
          if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
        }
        n = lo;
      }
      val += dg_const[(n * HV + hv) * inner + e];
    }
    const int64_t o = inner == 1 ? off3(out, b, t, hv) : off4(out, b, t, hv, e);
    store_elem<T>(out, o, val);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
