// flashgrad::cuda attention entry points: the validated call (AttentionParams + resolved
// AttentionProblem) becomes an AttentionKernelParams, then the kernels for its head dim run on the
// caller's stream. What the kernels cannot do yet is refused here with ErrorKind::unsupported,
// naming the argument, before anything is written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/backends.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "attention_kernel_params.h"
#include "attention_launch.h"
#include "fp8_attention_host.h"
#include "fp8_wgmma_forward.h"
#include "wgmma_backward.h"
#include "wgmma_forward.h"

namespace flashgrad::cuda {
namespace {

using cuda_attn::AttentionKernelParams;
using cuda_attn::RowMajorStrides;

// Switches to the tensors' device for the duration of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FLASHGRAD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) FLASHGRAD_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// cp.async copies 16-byte row chunks: base pointer 16-byte aligned, row/head/batch strides a
// multiple of 16 bytes (8 elements of 16-bit dtypes, 16 of e4m3).
void require_16_byte_rows(const char* op, const TensorView& t, const char* arg) {
  const int64_t elems = t.dtype == DType::e4m3 ? 16 : 8;
  bool ok = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d + 1 < t.rank; ++d) ok = ok && (t.stride[d] % elems == 0 || t.shape[d] == 1);
  if (!ok)
    throw_unsupported(op, arg,
                      "the CUDA backend needs a 16-byte aligned base pointer and strides that are "
                      "multiples of " + std::to_string(elems) + " elements (got " + t.describe() + ")");
}

void check_supported(const char* op, const AttentionParams& p, const AttentionProblem& pr) {
  if (p.q.dtype != DType::bf16 && p.q.dtype != DType::f16 && p.q.dtype != DType::e4m3)
    throw_unsupported(op, "q", std::string("the CUDA attention kernels take bfloat16, float16 or float8_e4m3fn, not ") +
                                   dtype_name(p.q.dtype));
  if (pr.head_dim != pr.head_dim_v)
    throw_unsupported(op, "v", "the CUDA attention kernels need v's head dim equal to q's (got D = " +
                                   std::to_string(pr.head_dim) + ", Dv = " +
                                   std::to_string(pr.head_dim_v) + ")");
  if (pr.head_dim != 64 && pr.head_dim != 128 && pr.head_dim != 256)
    throw_unsupported(op, "q", "the CUDA attention kernels support head dims 64, 128 and 256 (got " +
                                   std::to_string(pr.head_dim) + ")");
  if (p.exec.precision != Precision::fp32)
    throw_unsupported(op, "exec.precision", "the CUDA backend computes in fp32 only");
  if (pr.total_q >= (int64_t{1} << 31) || pr.total_k >= (int64_t{1} << 31))
    throw_unsupported(op, "q", "the CUDA kernels index tokens of one call with 32-bit integers");
  const TensorView* index_views[] = {&p.cu_seqlens_q, &p.cu_seqlens_k, &p.prefix_lengths,
                                     &p.candidate_bounds};
  const char* index_names[] = {"cu_seqlens_q", "cu_seqlens_k", "prefix_lengths", "candidate_bounds"};
  for (int i = 0; i < 4; ++i) {
    const TensorView& t = *index_views[i];
    if (t.present() && (t.dtype != DType::i32 || t.stride[t.rank - 1] != 1))
      throw_unsupported(op, index_names[i], "the CUDA backend reads int32 with a contiguous last dim");
  }
  require_16_byte_rows(op, p.q, "q");
  require_16_byte_rows(op, p.k, "k");
  require_16_byte_rows(op, p.v, "v");
}

// batch / row / head strides of a [B, S, H, D] or [T, H, D] view.
RowMajorStrides strides_of(const TensorView& t, bool varlen) {
  RowMajorStrides s;
  if (varlen) {
    s.row = t.stride[0];
    s.head = t.stride[1];
  } else {
    s.batch = t.stride[0];
    s.row = t.stride[1];
    s.head = t.stride[2];
  }
  return s;
}

// [B, H, S] or [H, T] float views (lse, dlse).
void lse_strides(const TensorView& t, bool varlen, int64_t& batch, int64_t& head, int64_t& row) {
  if (varlen) {
    batch = 0;
    head = t.stride[0];
    row = t.stride[1];
  } else {
    batch = t.stride[0];
    head = t.stride[1];
    row = t.stride[2];
  }
}

int cuda_attn_mask_code(MaskKind m) {
  switch (m) {
    case MaskKind::none: return cuda_attn::kMaskNone;
    case MaskKind::causal: return cuda_attn::kMaskCausal;
    case MaskKind::sliding_window: return cuda_attn::kMaskWindow;
    case MaskKind::prefix_lm: return cuda_attn::kMaskPrefix;
    case MaskKind::candidate_isolation: return cuda_attn::kMaskCandidate;
  }
  return cuda_attn::kMaskNone;
}

AttentionKernelParams common_params(const AttentionParams& p, const AttentionProblem& pr) {
  AttentionKernelParams k;
  k.q = p.q.data;
  k.k = p.k.data;
  k.v = p.v.data;
  k.q_st = strides_of(p.q, pr.varlen);
  k.k_st = strides_of(p.k, pr.varlen);
  k.v_st = strides_of(p.v, pr.varlen);
  if (pr.varlen) {
    k.cu_seqlens_q = p.cu_seqlens_q.ptr<const int32_t>();
    k.cu_seqlens_k = p.cu_seqlens_k.ptr<const int32_t>();
  }
  k.num_seqs = static_cast<int>(pr.num_seqs);
  k.seqlen_q = static_cast<int>(pr.seqlen_q);
  k.seqlen_k = static_cast<int>(pr.seqlen_k);
  k.total_q = pr.total_q;
  k.heads_q = static_cast<int>(pr.heads_q);
  k.heads_k = static_cast<int>(pr.heads_k);
  k.scale = pr.scale;
  k.mask = cuda_attn_mask_code(p.mask);
  if (p.mask == MaskKind::sliding_window) {
    k.window_left = p.window_left;
    k.window_right = p.window_right;
  } else if (p.mask == MaskKind::prefix_lm) {
    k.prefix_lengths = p.prefix_lengths.ptr<const int32_t>();
  } else if (p.mask == MaskKind::candidate_isolation) {
    k.candidate_bounds = p.candidate_bounds.ptr<const int32_t>();
    k.candidate_row_stride = p.candidate_bounds.rank == 2 ? p.candidate_bounds.stride[0] : 4;
  }
  if (p.softcap > 0.f) {
    k.softcap = p.softcap;
    k.softcap_method = p.softcap_method == SoftcapMethod::tanh ? cuda_attn::kSoftcapTanh
                                                               : cuda_attn::kSoftcapSoftSign;
  }
  return k;
}

struct BackwardScratch {
  std::size_t lse_bytes, dq_bytes;
};

BackwardScratch backward_scratch(const AttentionParams& p, const AttentionProblem& pr) {
  BackwardScratch s;
  s.lse_bytes = cuda_detail::align_up(static_cast<std::size_t>(pr.heads_q * pr.total_q) * sizeof(float));
  s.dq_bytes = p.deterministic
                   ? 0
                   : cuda_detail::align_up(static_cast<std::size_t>(pr.total_q * pr.heads_q * pr.head_dim) *
                                           sizeof(float));
  return s;
}

using Launcher = void (*)(const AttentionKernelParams&, bool, cudaStream_t);

Launcher pick(int64_t head_dim, Launcher hd64, Launcher hd128, Launcher hd256) {
  return head_dim == 64 ? hd64 : head_dim == 128 ? hd128 : hd256;
}

}  // namespace

void attention_forward(const AttentionParams& p, const AttentionProblem& pr, const TensorView& out,
                       const TensorView& lse, Workspace ws) {
  const char* op = "attention_forward";
  check_supported(op, p, pr);
  require_16_byte_rows(op, out, "out");
  DeviceGuard guard(p.q.device_index);
  AttentionKernelParams k = common_params(p, pr);
  k.out = out.data;
  k.out_st = strides_of(out, pr.varlen);
  if (lse.present()) {
    k.lse = lse.ptr<float>();
    lse_strides(lse, pr.varlen, k.lse_batch_stride, k.lse_head_stride, k.lse_row_stride);
  }
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  if (p.q.dtype == DType::e4m3) {
    // The Hopper wgmma FP8 forward where it applies (it declines, launching nothing, otherwise, or
    // with FLASHGRAD_ATTN_FP8_FORWARD=mma); the mma.sync FP8 forward serves the rest.
    if (fp8_wgmma_attention_forward(p, pr, k, out.dtype == DType::bf16, ws, stream)) return;
    return fp8_attention_forward(p, pr, k, out.dtype == DType::bf16, ws, stream);
  }
  // The Hopper wgmma kernel where it applies (it declines, launching nothing, otherwise).
  if (cuda_attn::launch_forward_wgmma(k, static_cast<int>(pr.head_dim), p.q.dtype == DType::bf16,
                                      pr.varlen ? pr.total_k : pr.seqlen_k, ws, stream))
    return;
  pick(pr.head_dim, cuda_attn::launch_forward_hd64, cuda_attn::launch_forward_hd128,
       cuda_attn::launch_forward_hd256)(k, p.q.dtype == DType::bf16, stream);
}

void attention_backward(const AttentionParams& p, const AttentionProblem& pr,
                        const AttentionBackwardInputs& in, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, Workspace ws) {
  const char* op = "attention_backward";
  check_supported(op, p, pr);
  require_16_byte_rows(op, in.dout, "dout");
  require_16_byte_rows(op, dq, "dq");
  require_16_byte_rows(op, dk, "dk");
  require_16_byte_rows(op, dv, "dv");
  DeviceGuard guard(p.q.device_index);
  AttentionKernelParams k = common_params(p, pr);
  k.out = in.out.data;
  k.out_st = strides_of(in.out, pr.varlen);
  k.lse = in.lse.ptr<float>();
  lse_strides(in.lse, pr.varlen, k.lse_batch_stride, k.lse_head_stride, k.lse_row_stride);
  k.dout = in.dout.data;
  k.dout_st = strides_of(in.dout, pr.varlen);
  if (in.dlse.present()) {
    k.dlse = in.dlse.ptr<const float>();
    lse_strides(in.dlse, pr.varlen, k.dlse_batch_stride, k.dlse_head_stride, k.dlse_row_stride);
  }
  k.z_loss_weight = in.z_loss_weight;
  k.dq = dq.data;
  k.dk = dk.data;
  k.dv = dv.data;
  k.dq_st = strides_of(dq, pr.varlen);
  k.dk_st = strides_of(dk, pr.varlen);
  k.dv_st = strides_of(dv, pr.varlen);
  k.deterministic = p.deterministic;

  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  if (p.q.dtype == DType::e4m3)
    return fp8_attention_backward(p, pr, k, in.out.dtype == DType::bf16, ws, stream);
  const BackwardScratch sizes = backward_scratch(p, pr);
  cuda_detail::ScratchBuffer scratch(ws, 2 * sizes.lse_bytes + sizes.dq_bytes, stream);
  k.lse_log2 = scratch.take<float>(sizes.lse_bytes);
  k.delta_shift = scratch.take<float>(sizes.lse_bytes);
  if (sizes.dq_bytes > 0) {
    k.dq_accum = scratch.take<float>(sizes.dq_bytes);
    FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(k.dq_accum, 0, sizes.dq_bytes, stream));
  }
  const bool bf16 = p.q.dtype == DType::bf16;
  const int hd = static_cast<int>(pr.head_dim);
  cuda_attn::launch_backward_prepass(k, hd, bf16, stream);
  // The Hopper wgmma main pass where it applies (it declines, launching nothing, otherwise).
  if (!cuda_attn::launch_backward_wgmma(k, hd, bf16, pr.varlen ? pr.total_k : pr.seqlen_k, stream))
    pick(pr.head_dim, cuda_attn::launch_backward_main_hd64, cuda_attn::launch_backward_main_hd128,
         cuda_attn::launch_backward_main_hd256)(k, bf16, stream);
  if (p.deterministic)
    pick(pr.head_dim, cuda_attn::launch_backward_dq_hd64, cuda_attn::launch_backward_dq_hd128,
         cuda_attn::launch_backward_dq_hd256)(k, bf16, stream);
  else
    cuda_attn::launch_dq_convert(k, hd, bf16, stream);
}

std::size_t attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr, Pass pass) {
  if (p.q.dtype == DType::e4m3)  // the forward's V^T copy: enough for the mma.sync and the wgmma kernel
    return std::max(fp8_attention_workspace_bytes(p, pr, pass),
                    pass == Pass::forward ? fp8_wgmma_forward_workspace_bytes(pr) : std::size_t{0});
  if (pass == Pass::forward) return 256;  // the persistent wgmma forward's tile counter (one int)
  const BackwardScratch s = backward_scratch(p, pr);
  return 2 * s.lse_bytes + s.dq_bytes;
}

}  // namespace flashgrad::cuda
