// Host-side launchers of the FP8 (e4m3) attention kernels. One translation unit per head dim
// (fp8_attention_hd*.cu: forward, backward main and deterministic dq kernels) plus fp8_prepass.cu (the transposed V
// copy and the backward's pre-pass).
#pragma once

#include <cuda_runtime.h>

#include "fp8_kernel_params.h"

namespace flashgrad::cuda_attn {

// vt = the transposed, key-permuted copy of v that the forward's P V product reads.
void launch_fp8_transpose_v(const Fp8KernelParams& p, int head_dim, cudaStream_t stream);

// Backward pre-pass: lse_log2, delta_shift (as the 16-bit pre-pass), amax(|dO|) per (sequence,
// head) then dO8, and the 16-bit copies q16, k16. p.dout_amax must be zeroed first.
void launch_fp8_backward_prepass(const Fp8KernelParams& p, int head_dim, cudaStream_t stream);

void launch_fp8_forward_hd64(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_forward_hd128(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_forward_hd256(const Fp8KernelParams& p, cudaStream_t stream);

// dk, dv and the fp32 dq accumulation (dq = scale * accumulation: launch_dq_convert).
void launch_fp8_backward_main_hd64(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_backward_main_hd128(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_backward_main_hd256(const Fp8KernelParams& p, cudaStream_t stream);

// Deterministic dq (p.base.deterministic; writes p.base.dq directly).
void launch_fp8_backward_dq_hd64(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_backward_dq_hd128(const Fp8KernelParams& p, cudaStream_t stream);
void launch_fp8_backward_dq_hd256(const Fp8KernelParams& p, cudaStream_t stream);

}  // namespace flashgrad::cuda_attn
