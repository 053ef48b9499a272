// The Hopper FP8 (e4m3) forward on wgmma + TMA (fp8_wgmma_forward_kernel.cuh), beside the mma.sync
// FP8 forward of fp8_attention_host.cpp. attention_cuda.cpp offers it every e4m3 forward call first.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "attention_kernel_params.h"
#include "core/problems.h"

namespace flashgrad::cuda {

// Runs the FP8 forward on the wgmma kernel (its transposed V copy, then the kernel) and returns
// true; or returns false, launching nothing, when it does not apply:
//   - the environment says FLASHGRAD_ATTN_FP8_FORWARD=mma or =legacy (read at every call, so one
//     process can time both kernels; this kernel is the default since the H200 showed it correct
//     and 3.6-4.7x faster than the mma.sync one),
//   - head dim other than 64 / 128 / 256, or 64 with FLASHGRAD_ATTN_FP8_WGMMA_HD64=0 (kHd64ByDefault
//     in fp8_wgmma_forward.cu: on since session 6, 3x the mma.sync kernel in H200 run 6.1),
//   - a q / k view TMA cannot describe (base or a stride not 16-byte aligned, a stride past 2^40),
//   - more query tiles than one grid holds.
// Its V^T copy is padded to 128 keys per sequence, which can need more than
// fp8_attention_workspace_bytes gives; the scratch then comes from a stream-ordered allocation.
// Workspace of that forward: the V^T copy padded to 128 keys per sequence (at most 64 columns per
// sequence more than the mma.sync forward's copy), so attention_workspace_bytes can cover both.
std::size_t fp8_wgmma_forward_workspace_bytes(const AttentionProblem& pr);

bool fp8_wgmma_attention_forward(const AttentionParams& p, const AttentionProblem& pr,
                                 const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                                 cudaStream_t stream);

}  // namespace flashgrad::cuda
