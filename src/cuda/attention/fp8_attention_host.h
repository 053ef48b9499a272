// The FP8 (e4m3) path of the CUDA attention backend, called by attention_cuda.cpp once it has
// checked the call and filled the 16-bit kernels' parameters (q, k, v then point to e4m3 data).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention_kernel_params.h"
#include "core/problems.h"
#include "fp8_kernel_params.h"

namespace flashgrad::cuda {

void fp8_attention_forward(const AttentionParams& p, const AttentionProblem& pr,
                           const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                           cudaStream_t stream);
void fp8_attention_backward(const AttentionParams& p, const AttentionProblem& pr,
                            const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                            cudaStream_t stream);
std::size_t fp8_attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr, Pass pass);

// Points f at the call's descale_q / descale_k / descale_v ([N, Hk] fp32, free strides); shared by
// the mma.sync and wgmma FP8 paths.
void set_fp8_descales(cuda_attn::Fp8KernelParams& f, const AttentionParams& p);

}  // namespace flashgrad::cuda
