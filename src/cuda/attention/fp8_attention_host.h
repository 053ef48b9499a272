// The FP8 (e4m3) path of the CUDA attention backend, called by attention_cuda.cpp once it has
// checked the call and filled the 16-bit kernels' parameters (q, k, v then point to e4m3 data).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention_kernel_params.h"
#include "core/problems.h"

namespace flashgrad::cuda {

void fp8_attention_forward(const AttentionParams& p, const AttentionProblem& pr,
                           const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                           cudaStream_t stream);
void fp8_attention_backward(const AttentionParams& p, const AttentionProblem& pr,
                            const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                            cudaStream_t stream);
std::size_t fp8_attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr, Pass pass);

}  // namespace flashgrad::cuda
