// The Hopper FP8 (e4m3) backward main pass on wgmma + TMA (fp8_wgmma_backward_kernel.cuh), behind the
// same Fp8KernelParams as the mma.sync FP8 backward (fp8_backward_kernel.cuh), after the same
// pre-pass. fp8_attention_host.cpp offers it each backward call first.
#pragma once

#include <cuda_runtime.h>

#include "core/problems.h"
#include "fp8_kernel_params.h"

namespace flashgrad::cuda_attn {

// Launches the wgmma FP8 backward main pass (dK, dV, and dQ into f.base.dq_accum unless
// deterministic) and returns true, or returns false, launching nothing, when it does not apply:
//   - FLASHGRAD_ATTN_FP8_BACKWARD=mma or =legacy (read at every call, so one process can time both
//     kernels; this one is the default since the H200 checked it),
//   - head dim other than 128 and 256 (256 off with FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD256=0; 64 only
//     with FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD64=1, until its speed is measured),
//   - an empty problem, a view TMA cannot describe, or more key blocks than one grid holds.
bool launch_fp8_backward_wgmma(const Fp8KernelParams& f, const AttentionProblem& pr, cudaStream_t stream);

}  // namespace flashgrad::cuda_attn
