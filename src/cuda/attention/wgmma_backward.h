// The Hopper backward main pass (wgmma + TMA, warp-specialized; wgmma_backward_kernel.cuh), behind
// the same AttentionKernelParams as the mma.sync kernels. attention_cuda.cpp tries it after the
// pre-pass and falls back to launch_backward_main_hd<D> when it declines.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn {

// Launches the wgmma backward (dK, dV, and dQ into p.dq_accum unless p.deterministic) and returns
// true, or returns false (launching nothing) when it does not apply: head dim other than 64 / 128 / 256,
// a view TMA cannot describe, or FLASHGRAD_ATTN_BACKWARD=legacy in the environment (read at every
// call, so one process can time both kernels). rows_k: the k / v tensors' token extent (Sk padded,
// Tk varlen).
bool launch_backward_wgmma(const AttentionKernelParams& p, int head_dim, bool bf16, int64_t rows_k,
                           cudaStream_t stream);

}  // namespace flashgrad::cuda_attn
