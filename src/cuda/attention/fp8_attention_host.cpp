// FP8 (e4m3) attention on the CUDA backend: workspace layout and launch order (docs/fp8.md).
//   forward:  transpose_v (vt) -> forward kernel
//   backward: zero dq_accum and amax -> pre-pass (Delta/shift/lse_log2, amax, q16; then dO8; k16)
//             -> main kernel (dk, dv, dq_accum) -> dq = scale dq_accum (the 16-bit dq convert);
//             deterministic: the main kernel skips dq and the dq kernel writes it (no dq_accum)
// Workspace, each piece 256-byte aligned, in this order:
//   forward:  vt     uint8 [Hk, D, vt_cols]             (fp8_fragments.cuh: vt_columns)
//   backward: lse_log2, delta_shift float [Hq, total_q]; dq_accum float [total_q, Hq, D] (none
//             when deterministic);
//             dout_amax float [N, Hq]; dout8 uint8 [total_q, Hq, D]; q16 [total_q, Hq, D] and
//             k16 [total_k, Hk, D] in the output dtype.
#include "fp8_attention_host.h"

#include <string>

#include "attention_launch.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "fp8_fragments.cuh"
#include "fp8_launch.h"
#include "fp8_wgmma_backward.h"

namespace flashgrad::cuda {
namespace {

using cuda_attn::Fp8KernelParams;
using cuda_detail::align_up;

std::size_t vt_bytes(const AttentionProblem& pr) {
  const int64_t cols = cuda_attn::fp8::vt_columns(pr.varlen, pr.num_seqs, pr.seqlen_k, pr.total_k);
  return align_up(static_cast<std::size_t>(pr.heads_k * pr.head_dim * cols));
}

struct BackwardSizes {
  std::size_t lse, dq_accum, amax, dout8, q16, k16;
  std::size_t total() const { return 2 * lse + dq_accum + amax + dout8 + q16 + k16; }
};

BackwardSizes backward_sizes(const AttentionParams& p, const AttentionProblem& pr) {
  const auto q_elems = static_cast<std::size_t>(pr.total_q * pr.heads_q * pr.head_dim);
  BackwardSizes s;
  s.lse = align_up(static_cast<std::size_t>(pr.heads_q * pr.total_q) * sizeof(float));
  s.dq_accum = p.deterministic ? 0 : align_up(q_elems * sizeof(float));
  s.amax = align_up(static_cast<std::size_t>(pr.num_seqs * pr.heads_q) * sizeof(float));
  s.dout8 = align_up(q_elems);
  s.q16 = align_up(q_elems * 2);
  s.k16 = align_up(static_cast<std::size_t>(pr.total_k * pr.heads_k * pr.head_dim) * 2);
  return s;
}

using Fp8Launcher = void (*)(const Fp8KernelParams&, cudaStream_t);
Fp8Launcher pick(int64_t head_dim, Fp8Launcher hd64, Fp8Launcher hd128, Fp8Launcher hd256) {
  return head_dim == 64 ? hd64 : head_dim == 128 ? hd128 : hd256;
}

}  // namespace

void set_fp8_descales(cuda_attn::Fp8KernelParams& f, const AttentionParams& p) {
  f.descale_q = p.descale_q.ptr<const float>();
  f.descale_k = p.descale_k.ptr<const float>();
  f.descale_v = p.descale_v.ptr<const float>();
  f.dq_st_n = p.descale_q.stride[0];
  f.dq_st_h = p.descale_q.stride[1];
  f.dk_st_n = p.descale_k.stride[0];
  f.dk_st_h = p.descale_k.stride[1];
  f.dv_st_n = p.descale_v.stride[0];
  f.dv_st_h = p.descale_v.stride[1];
}

void fp8_attention_forward(const AttentionParams& p, const AttentionProblem& pr,
                           const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                           cudaStream_t stream) {
  Fp8KernelParams f;
  f.base = k;
  f.out_bf16 = out_bf16;
  set_fp8_descales(f, p);
  f.vt_cols = cuda_attn::fp8::vt_columns(pr.varlen, pr.num_seqs, pr.seqlen_k, pr.total_k);
  const std::size_t bytes = vt_bytes(pr);
  cuda_detail::ScratchBuffer scratch(ws, bytes, stream);
  f.vt = scratch.take<uint8_t>(bytes);
  const int hd = static_cast<int>(pr.head_dim);
  cuda_attn::launch_fp8_transpose_v(f, hd, stream);
  pick(pr.head_dim, cuda_attn::launch_fp8_forward_hd64, cuda_attn::launch_fp8_forward_hd128,
       cuda_attn::launch_fp8_forward_hd256)(f, stream);
}

void fp8_attention_backward(const AttentionParams& p, const AttentionProblem& pr,
                            const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                            cudaStream_t stream) {
  Fp8KernelParams f;
  f.base = k;
  f.out_bf16 = out_bf16;
  set_fp8_descales(f, p);
  f.total_k = pr.total_k;
  const BackwardSizes s = backward_sizes(p, pr);
  cuda_detail::ScratchBuffer scratch(ws, s.total(), stream);
  f.base.lse_log2 = scratch.take<float>(s.lse);
  f.base.delta_shift = scratch.take<float>(s.lse);
  f.base.dq_accum = scratch.take<float>(s.dq_accum);
  f.dout_amax = scratch.take<float>(s.amax);
  f.dout8 = scratch.take<uint8_t>(s.dout8);
  f.q16 = scratch.take<void>(s.q16);
  f.k16 = scratch.take<void>(s.k16);
  // dq_accum (empty when deterministic) and dout_amax are adjacent: one memset zeroes both.
  FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(f.base.dq_accum, 0, s.dq_accum + s.amax, stream));
  const int hd = static_cast<int>(pr.head_dim);
  cuda_attn::launch_fp8_backward_prepass(f, hd, stream);
  // The wgmma main pass where it covers the case, unless FLASHGRAD_ATTN_FP8_BACKWARD=mma (fp8_wgmma_backward.h).
  if (!cuda_attn::launch_fp8_backward_wgmma(f, pr, stream))
    pick(pr.head_dim, cuda_attn::launch_fp8_backward_main_hd64, cuda_attn::launch_fp8_backward_main_hd128,
         cuda_attn::launch_fp8_backward_main_hd256)(f, stream);
  if (p.deterministic)
    pick(pr.head_dim, cuda_attn::launch_fp8_backward_dq_hd64, cuda_attn::launch_fp8_backward_dq_hd128,
         cuda_attn::launch_fp8_backward_dq_hd256)(f, stream);
  else
    cuda_attn::launch_dq_convert(f.base, hd, out_bf16, stream);
}

std::size_t fp8_attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr, Pass pass) {
  return pass == Pass::forward ? vt_bytes(pr) : backward_sizes(p, pr).total();
}

}  // namespace flashgrad::cuda
