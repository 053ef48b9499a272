// Grid shapes and launches of the FP8 forward and backward main kernels for one head dim; the
// fp8_attention_hd*.cu files instantiate these.
#pragma once

#include "attention_launch_impl.cuh"
#include "fp8_backward_kernel.cuh"
#include "fp8_dq_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_launch.h"

namespace flashgrad::cuda_attn::fp8 {

template <int D>
void launch_forward(const Fp8KernelParams& p, cudaStream_t stream) {
  using Cfg = Fp8ForwardConfig<D>;
  const int mblocks = (p.base.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (mblocks == 0 || p.base.num_seqs == 0) return;
  auto kernel = fp8_attention_forward_kernel<D>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.base.num_seqs, mblocks, p.base.heads_q), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, mblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_backward_main(const Fp8KernelParams& p, cudaStream_t stream) {
  using Cfg = Fp8BackwardConfig<D>;
  const int nblocks = (p.base.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  if (nblocks == 0 || p.base.num_seqs == 0) return;
  auto kernel = fp8_attention_backward_kernel<T, D>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.base.num_seqs, nblocks, p.base.heads_k), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, nblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_backward_dq(const Fp8KernelParams& p, cudaStream_t stream) {
  using Cfg = Fp8DqConfig<D>;
  const int mblocks = (p.base.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (mblocks == 0 || p.base.num_seqs == 0) return;
  auto kernel = fp8_attention_dq_kernel<T, D>;
  allow_large_smem(kernel, Cfg::kSmemBytes);
  kernel<<<attention_grid(p.base.num_seqs, mblocks, p.base.heads_q), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, mblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace flashgrad::cuda_attn::fp8

// Defines launch_fp8_forward_hd<D>, launch_fp8_backward_main_hd<D> and launch_fp8_backward_dq_hd<D>.
#define FLASHGRAD_FP8_ATTENTION_LAUNCHERS(D)                                                    \
  namespace flashgrad::cuda_attn {                                                              \
  void launch_fp8_forward_hd##D(const Fp8KernelParams& p, cudaStream_t s) {                     \
    fp8::launch_forward<D>(p, s);                                                               \
  }                                                                                             \
  void launch_fp8_backward_main_hd##D(const Fp8KernelParams& p, cudaStream_t s) {               \
    p.out_bf16 ? fp8::launch_backward_main<__nv_bfloat16, D>(p, s)                              \
               : fp8::launch_backward_main<__half, D>(p, s);                                    \
  }                                                                                             \
  void launch_fp8_backward_dq_hd##D(const Fp8KernelParams& p, cudaStream_t s) {                 \
    p.out_bf16 ? fp8::launch_backward_dq<__nv_bfloat16, D>(p, s)                                \
               : fp8::launch_backward_dq<__half, D>(p, s);                                      \
  }                                                                                             \
  }
