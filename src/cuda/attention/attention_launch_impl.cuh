// Grid shapes and launches of the forward, backward and dq kernels for one (dtype, head dim); the
// per-head-dim .cu files instantiate these.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_backward_kernel.cuh"
#include "attention_dq_kernel.cuh"
#include "attention_forward_kernel.cuh"
#include "attention_launch.h"
#include "cuda/common/cuda_check.h"

namespace flashgrad::cuda_attn {

// Grid x = sequences x row blocks (x allows 2^31 - 1 blocks; y = heads <= 65535).
inline dim3 attention_grid(int num_seqs, int blocks_per_seq, int heads) {
  return dim3(static_cast<unsigned>(static_cast<int64_t>(num_seqs) * blocks_per_seq),
              static_cast<unsigned>(heads));
}

template <typename Kernel>
void allow_large_smem(Kernel kernel, int bytes) {
  FLASHGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// Forward: 4 warps of 2 row tiles (128 query rows) per CTA up to D = 128; 4 warps of one row tile
// (64 rows) at D = 256, where the 16 x 256 fp32 output accumulator already takes 128 registers.
constexpr int kForwardWarps = 4;
template <int D>
constexpr int forward_mtiles() { return D > 128 ? 1 : 2; }

template <typename T, int D>
void launch_forward(const AttentionKernelParams& p, cudaStream_t stream) {
  using Cfg = ForwardConfig<D, kForwardWarps, forward_mtiles<D>()>;
  const int mblocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (mblocks == 0 || p.num_seqs == 0) return;
  auto kernel = attention_forward_kernel<T, D, kForwardWarps, forward_mtiles<D>()>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.num_seqs, mblocks, p.heads_q), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, mblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_backward_main(const AttentionKernelParams& p, cudaStream_t stream) {
  using Cfg = BackwardConfig<D>;
  const int nblocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  if (nblocks == 0 || p.num_seqs == 0) return;
  auto kernel = attention_backward_kernel<T, D>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.num_seqs, nblocks, p.heads_k), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, nblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_backward_dq(const AttentionKernelParams& p, cudaStream_t stream) {
  using Cfg = DqConfig<D>;
  const int mblocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (mblocks == 0 || p.num_seqs == 0) return;
  auto kernel = attention_dq_kernel<T, D>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.num_seqs, mblocks, p.heads_q), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, mblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace flashgrad::cuda_attn

// Defines launch_<pass>_hd<D>(p, bf16, stream) for one head dim.
#define FLASHGRAD_ATTENTION_LAUNCHERS(D)                                                        \
  namespace flashgrad::cuda_attn {                                                              \
  void launch_forward_hd##D(const AttentionKernelParams& p, bool bf16, cudaStream_t s) {        \
    bf16 ? launch_forward<__nv_bfloat16, D>(p, s) : launch_forward<__half, D>(p, s);            \
  }                                                                                             \
  void launch_backward_main_hd##D(const AttentionKernelParams& p, bool bf16, cudaStream_t s) {  \
    bf16 ? launch_backward_main<__nv_bfloat16, D>(p, s) : launch_backward_main<__half, D>(p, s); \
  }                                                                                             \
  void launch_backward_dq_hd##D(const AttentionKernelParams& p, bool bf16, cudaStream_t s) {    \
    bf16 ? launch_backward_dq<__nv_bfloat16, D>(p, s) : launch_backward_dq<__half, D>(p, s);    \
  }                                                                                             \
  }
