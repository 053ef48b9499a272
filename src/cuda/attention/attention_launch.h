// Host-side launchers of the attention kernels, one translation unit per (pass, head dim) so the
// CUDA build compiles in parallel and each file instantiates only bf16 and fp16.
#pragma once

#include <cuda_runtime.h>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn {

// out, lse = softmax(q k^T) v over the problem in `p`.
void launch_forward_hd64(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_forward_hd128(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_forward_hd256(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);

// dk, dv (and the fp32 dq accumulation unless p.deterministic), after the pre-pass.
void launch_backward_main_hd64(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_backward_main_hd128(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_backward_main_hd256(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);

// Deterministic dq (writes p.dq directly).
void launch_backward_dq_hd64(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_backward_dq_hd128(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);
void launch_backward_dq_hd256(const AttentionKernelParams& p, bool bf16, cudaStream_t stream);

// Pre-pass: p.lse_log2 and p.delta_shift from out, dout, lse, dlse, z_loss_weight.
void launch_backward_prepass(const AttentionKernelParams& p, int head_dim, bool bf16,
                             cudaStream_t stream);
// dq = scale * dq_accum, rounded into p.dq's dtype.
void launch_dq_convert(const AttentionKernelParams& p, int head_dim, bool bf16, cudaStream_t stream);

}  // namespace flashgrad::cuda_attn
