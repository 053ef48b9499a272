// Elementwise kernels that turn the backward's fp32 accumulators into the user's gradients:
//   dq, dk: the L2-norm backward when the norm is inside the op (dx = rstd (dy - (dy.y) y), with
//           y = x rstd recomputed from the raw input), then rounding into q's dtype;
//   dbeta:  rounding;
//   dg:     dg_acc + the per-sequence constant dg_const (see recurrent_backward.cuh), rounding.
// All indices are int64; grids are 1-D over rows with a grid-stride loop.
#pragma once

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// One warp per row (b, t, h) of K elements; lane handles elements lane + 32 i.
template <typename T>
__global__ void __launch_bounds__(256) qk_grad_finish_kernel(View x, View dx, const float* acc, int64_t B,
                                                            int64_t T_len, int64_t H, int64_t K, bool l2norm) {
  constexpr int kMaxPerLane = 8;  // K <= 256
  const int lane = threadIdx.x % 32;
  const int64_t rows = B * T_len * H;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps_total) {
    const int64_t h = row % H, t = (row / H) % T_len, b = row / (H * T_len);
    float dy[kMaxPerLane], y[kMaxPerLane];
    float ss = 0.f, dot = 0.f;
    const int64_t xo = off3(x, b, t, h), dxo = off3(dx, b, t, h);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      dy[i] = e < K ? acc[row * K + e] : 0.f;
      y[i] = (l2norm && e < K) ? to_f<T>(static_cast<const T*>(x.p)[xo + e]) : 0.f;
      ss += y[i] * y[i];
    }
    if (l2norm) {
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float rstd = 1.0f / sqrtf(ss + kL2NormEps);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        y[i] *= rstd;
        dot += dy[i] * y[i];
      }
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) dy[i] = rstd * (dy[i] - dot * y[i]);
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (e < K) static_cast<T*>(dx.p)[dxo + e] = from_f<T>(dy[i]);
    }
  }
}

// The recurrent backward's dq and dk together: one warp per row (b, t, h) reads the row's interleaved
// (dq, dk) accumulator pairs once (8 bytes per element; qk_grad_finish_kernel with stride 2 reads each
// pair twice, once per gradient) and, with the in-kernel L2 norm, takes 1 / ||x|| from qk_rstd_kernel
// (q_rstd / k_rstd) instead of reducing x again: dx = rstd (dy - (dy.y) y), y = x rstd.
template <typename T>
__device__ __forceinline__ void l2norm_backward_row(const View& x, int64_t xo, float rstd, int64_t K, int lane,
                                                    float (&dy)[8]) {
  float y[8], dot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t e = lane + 32 * i;
    y[i] = e < K ? to_f<T>(static_cast<const T*>(x.p)[xo + e]) * rstd : 0.f;
    dot += dy[i] * y[i];
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
  for (int i = 0; i < 8; ++i) dy[i] = rstd * (dy[i] - dot * y[i]);
}
template <typename T>
__global__ void __launch_bounds__(256) qk_pair_grad_finish_kernel(View q, View k, View dq, View dk, const float2* acc,
                                                                 const float* q_rstd, const float* k_rstd,
                                                                 int64_t B, int64_t T_len, int64_t H, int64_t K) {
  constexpr int kMaxPerLane = 8;  // K <= 256
  const int lane = threadIdx.x % 32;
  const int64_t rows = B * T_len * H;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps_total) {
    const int64_t h = row % H, t = (row / H) % T_len, b = row / (H * T_len);
    float dyq[kMaxPerLane], dyk[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      const float2 v = e < K ? acc[row * K + e] : make_float2(0.f, 0.f);
      dyq[i] = v.x;
      dyk[i] = v.y;
    }
    if (q_rstd) {  // the in-kernel L2 norm (k_rstd is given with q_rstd)
      l2norm_backward_row<T>(q, off3(q, b, t, h), q_rstd[row], K, lane, dyq);
      l2norm_backward_row<T>(k, off3(k, b, t, h), k_rstd[row], K, lane, dyk);
    }
    const int64_t dqo = off3(dq, b, t, h), dko = off3(dk, b, t, h);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (e < K) {
        static_cast<T*>(dq.p)[dqo + e] = from_f<T>(dyq[i]);
        static_cast<T*>(dk.p)[dko + e] = from_f<T>(dyk[i]);
      }
    }
  }
}

// rstd[row] = 1 / sqrt(||x[row]||^2 + eps) for every row (b, t, h) of q or k, as the kernels' in-kernel
// L2 norm computes it (rsqrtf): taken by the backward passes instead of reducing over K at every step.
// One warp per row; lane handles elements lane + 32 i.
template <typename T>
__global__ void __launch_bounds__(256) qk_rstd_kernel(View x, float* rstd, int64_t B, int64_t T_len, int64_t H,
                                                     int64_t K) {
  constexpr int kMaxPerLane = 8;  // K <= 256
  const int lane = threadIdx.x % 32;
  const int64_t rows = B * T_len * H;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps_total) {
    const int64_t h = row % H, t = (row / H) % T_len, b = row / (H * T_len);
    const int64_t xo = off3(x, b, t, h);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      const float y = e < K ? to_f<T>(static_cast<const T*>(x.p)[xo + e]) : 0.f;
      ss += y * y;
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) rstd[row] = rsqrtf(ss + kL2NormEps);
  }
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
