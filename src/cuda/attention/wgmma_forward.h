// The Hopper forward (wgmma + TMA, warp-specialized; wgmma_forward_kernel.cuh), behind the same
// AttentionKernelParams as the mma.sync kernels. attention_cuda.cpp tries it first and falls back
// to launch_forward_hd<D> when it declines.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_kernel_params.h"
#include "flashgrad/common.h"

namespace flashgrad::cuda_attn {

// Launches the wgmma forward and returns true, or returns false (launching nothing) when it does
// not apply: head dim other than 64 / 128 / 256, a view TMA cannot describe (strides or base not 16-byte
// aligned, a stride past 2^40 bytes), or FLASHGRAD_ATTN_FORWARD=legacy in the environment (read at
// every call, so one process can time both kernels). rows_k: the k / v tensors' token extent
// (Sk padded, Tk varlen), which the tensor maps need and AttentionKernelParams does not carry.
// ws: the caller's workspace (attention_workspace_bytes' forward share: the persistent grid's tile
// counter), or empty for a stream-ordered allocation.
bool launch_forward_wgmma(const AttentionKernelParams& p, int head_dim, bool bf16, int64_t rows_k, Workspace ws,
                          cudaStream_t stream);

}  // namespace flashgrad::cuda_attn
