// What the host hands the FP8 (e4m3) attention kernels: the 16-bit kernels' parameters (q, k, v
// point to e4m3 data; out, dout, dq, dk, dv are bf16 or fp16) plus the descales and the
// workspace arrays of the FP8 recipe (docs/fp8.md). Plain data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn {

struct Fp8KernelParams {
  AttentionKernelParams base;
  bool out_bf16 = true;  // out / dout / dq / dk / dv: bf16, else fp16

  // descale_x[n * st_n + hk * st_h] (fp32 [N, Hk]; true value = e4m3 value * descale).
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  int64_t dq_st_n = 0, dq_st_h = 0, dk_st_n = 0, dk_st_h = 0, dv_st_n = 0, dv_st_h = 0;

  // Transposed V copy (workspace): vt[(hk * D + d) * vt_cols + column], the column layout of
  // fp8_fragments.cuh (vt_col0, position_of_key).
  uint8_t* vt = nullptr;
  int64_t vt_cols = 0;

  // ---- backward workspace ----
  // amax(|dO|) per (sequence, query head) [N, Hq] (zeroed before the pre-pass), from which
  // descale_do = amax / 448 (1 when amax = 0); dO8 = e4m3(dO / descale_do), [total_q, Hq, D].
  float* dout_amax = nullptr;
  uint8_t* dout8 = nullptr;
  // q and k as 16-bit values (out's dtype; exact copies of the e4m3 values) for the products that
  // stay 16-bit: [total_q, Hq, D] and [total_k, Hk, D].
  void* q16 = nullptr;
  void* k16 = nullptr;
  int64_t total_k = 0;  // rows of k16 (B*Sk or Tk)
};

__host__ __device__ __forceinline__ float descale_from_amax(float amax) {
  return amax > 0.f ? amax / 448.f : 1.f;
}

}  // namespace flashgrad::cuda_attn
