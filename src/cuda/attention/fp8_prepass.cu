// Launches of the FP8 attention's pre-passes (kernels: fp8_prepass_kernels.cuh).
#include "cuda/common/cuda_check.h"
#include "fp8_launch.h"
#include "fp8_prepass_kernels.cuh"

namespace flashgrad::cuda_attn {
namespace {

using namespace fp8;

int blocks_for(int64_t threads, int per_block) {
  const int64_t b = (threads + per_block - 1) / per_block;
  return static_cast<int>(b < (1LL << 30) ? b : (1LL << 30));
}

}  // namespace

void launch_fp8_transpose_v(const Fp8KernelParams& p, int head_dim, cudaStream_t stream) {
  const int key_blocks = (p.base.seqlen_k + kTransposeKeys - 1) / kTransposeKeys;
  if (key_blocks == 0 || p.base.num_seqs == 0) return;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.base.num_seqs) * key_blocks),
                  static_cast<unsigned>(p.base.heads_k));
  if (head_dim == 64)
    transpose_v_kernel<64><<<grid, 256, transpose_smem_bytes<64>(), stream>>>(p, key_blocks);
  else if (head_dim == 128)
    transpose_v_kernel<128><<<grid, 256, transpose_smem_bytes<128>(), stream>>>(p, key_blocks);
  else
    transpose_v_kernel<256><<<grid, 256, transpose_smem_bytes<256>(), stream>>>(p, key_blocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

void launch_fp8_backward_prepass(const Fp8KernelParams& p, int head_dim, cudaStream_t stream) {
  const int64_t q_threads = p.base.total_q * p.base.heads_q * 32;
  if (q_threads > 0) {
    const int grid = blocks_for(q_threads, 256);
    if (p.out_bf16) {
      fp8_prepass_rows_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, head_dim);
      FLASHGRAD_CUDA_CHECK_LAUNCH();
      fp8_quantize_dout_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, head_dim);
    } else {
      fp8_prepass_rows_kernel<__half><<<grid, 256, 0, stream>>>(p, head_dim);
      FLASHGRAD_CUDA_CHECK_LAUNCH();
      fp8_quantize_dout_kernel<__half><<<grid, 256, 0, stream>>>(p, head_dim);
    }
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  const int64_t k_threads = p.total_k * p.base.heads_k * 32;
  if (k_threads > 0) {
    const int grid = blocks_for(k_threads, 256);
    if (p.out_bf16)
      fp8_widen_k_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, p.total_k, head_dim);
    else
      fp8_widen_k_kernel<__half><<<grid, 256, 0, stream>>>(p, p.total_k, head_dim);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace flashgrad::cuda_attn
