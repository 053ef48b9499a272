// One instance of the FP8 wgmma forward kernel, for reading its SASS (tools/fp8w_hot_path.py):
//   nvcc -std=c++20 -O3 --expt-relaxed-constexpr --extended-lambda -gencode=arch=compute_90a,code=sm_90a \
//     -Xptxas -v -Iinclude -Isrc -Isrc/cuda/attention -DFP8W_D=128 -c tools/fp8w_one_instance.cu -o k.o
// FP8W_D: head dim (64, 128, 256); FP8W_LEAN: true (default) / false (session 4's stream).
// Overlapped schedule, no ping-pong. (FP8W_POLY went with the polynomial exp2, retired in session 20.)
#include "cuda/attention/fp8_wgmma_forward_kernel.cuh"

#ifndef FP8W_D
#define FP8W_D 128
#endif
#ifndef FP8W_LEAN
#define FP8W_LEAN true
#endif

namespace fw = flashgrad::cuda_attn::fp8w;
template __global__ void fw::fp8_attention_forward_wgmma_kernel<FP8W_D, false, fw::kOverlap, FP8W_LEAN>(
    const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
    const flashgrad::cuda_attn::Fp8KernelParams, const fw::Fp8wMapAxes, int);
