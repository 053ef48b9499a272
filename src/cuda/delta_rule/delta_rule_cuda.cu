// flashgrad::cuda delta-rule entry points (src/core/backends.h): turn the validated views into
// kernel arguments, allocate scratch, launch.
//
// Algorithms. algorithm = recurrent runs the fused recurrent kernels (recurrent_*.cuh).
// algorithm = chunked runs the tensor-core chunked stages (chunked_path.h) where they take the
// problem (bf16/f16, K 64/128, V a multiple of 64 up to 256, GDN, KDA or the plain rule, no
// saved_r asked of the forward); elsewhere (float32, other K) the recurrent kernels, which
// compute the same function.
//
// Scratch memory of the recurrent path (from the caller's Workspace when large enough, else
// stream-ordered allocation; the chunked path's is described in chunked_path.cu):
//   forward:  the device copy of cu_seqlens (int64, N + 1);
//   backward: that, fp32 accumulators for dq, dk [B, T, H, K], dbeta [B, T, HV], dg (g's size),
//             the gate constant [N, HV(, K)], and, only when the caller passed no saved_r, an fp32
//             r [B, T, HV, V] recomputed by a forward pass.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/backends.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "flashgrad/status.h"
#include "chunked_path.h"
#include "recurrent_launch.cuh"
#include "views.h"

namespace flashgrad::cuda {
namespace {

namespace dr = cuda_detail::delta_rule;

using dr::view_of;

dr::Gate gate_of(GateKind g) {
  switch (g) {
    case GateKind::scalar: return dr::Gate::scalar;
    case GateKind::per_channel: return dr::Gate::per_channel;
    default: return dr::Gate::none;
  }
}

// What the CUDA backend does not take (valid calls that the CPU reference does take).
void check_supported(const char* op, const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  if (p.q.dtype != DType::bf16 && p.q.dtype != DType::f16 && p.q.dtype != DType::f32)
    throw_unsupported(op, "q", std::string("the CUDA backend takes bfloat16, float16 or float32 inputs, got ") +
                                   dtype_name(p.q.dtype));
  if (p.exec.precision != Precision::fp32)
    throw_unsupported(op, "exec.precision", "the CUDA backend computes in fp32 only (fp64 is CPU-only)");
  if (pr.key_dim > dr::kMaxKeyDim)
    throw_unsupported(op, "q", "the CUDA backend takes key dimensions K <= 256, got K = " +
                                   std::to_string(pr.key_dim));
  if (pr.value_heads > 65535 || (pr.value_dim + 7) / 8 > 65535 || pr.num_seqs > 0x7fffffff)
    throw_unsupported(op, "v", "too many value heads (> 65535) or sequences for one launch");
}

// Makes the tensors' device current for the call and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FLASHGRAD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) FLASHGRAD_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // destructor: cannot throw
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

std::size_t cu_bytes(const DeltaRuleProblem& pr) {
  return pr.varlen ? cuda_detail::align_up(sizeof(int64_t) * pr.cu_seqlens.size()) : 0;
}

// Copies the host copy of cu_seqlens (int64) to scratch; null for a padded batch.
const int64_t* upload_cu_seqlens(cuda_detail::ScratchBuffer& scratch, const DeltaRuleProblem& pr,
                                 cudaStream_t stream) {
  if (!pr.varlen) return nullptr;
  const std::size_t bytes = sizeof(int64_t) * pr.cu_seqlens.size();
  auto* d = scratch.take<int64_t>(bytes);
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so the vector may die after.
  FLASHGRAD_CUDA_CHECK(cudaMemcpyAsync(d, pr.cu_seqlens.data(), bytes, cudaMemcpyHostToDevice, stream));
  return d;
}

// Whether every lane's run of 8 consecutive elements along the last dim (K) of `t` is 16-byte
// aligned: K % 8 == 0, an aligned base, and every outer stride a multiple of 16 bytes.
bool runs_are_vectors(const TensorView& t, int64_t K) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  if (K % 8 != 0 || (8 * es) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < t.rank; ++d)
    if ((t.stride[d] * es) % 16 != 0) return false;
  return true;
}

dr::RecurrentArgs base_args(const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  dr::RecurrentArgs a;
  dr::set_inputs_and_sizes(a, p, pr);
  a.qk_vec = runs_are_vectors(p.q, pr.key_dim) && runs_are_vectors(p.k, pr.key_dim);
  a.g_vec = pr.gate == GateKind::per_channel && p.g.dtype == DType::f32 && runs_are_vectors(p.g, pr.key_dim);
  return a;
}

template <typename F>
void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::bf16: f(__nv_bfloat16{}); break;
    case DType::f16: f(__half{}); break;
    default: f(float{}); break;
  }
}

struct BackwardSizes {
  int64_t qk, beta, g, gconst, r, rstd;  // elements (rstd: one of q's, k's 1 / ||x|| per row; 0 without the L2 norm)
  std::size_t bytes(const DeltaRuleProblem& pr, bool with_r) const {
    using cuda_detail::align_up;
    return cu_bytes(pr) + align_up(8 * qk) + align_up(4 * beta) + align_up(4 * g) + align_up(4 * gconst) +
           2 * align_up(4 * rstd) + (with_r ? align_up(4 * r) : 0);
  }
};

BackwardSizes backward_sizes(const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  BackwardSizes s;
  const int64_t tokens = pr.batch * pr.seq_len;
  const int64_t inner = pr.gate == GateKind::per_channel ? pr.key_dim : 1;
  s.qk = tokens * pr.heads * pr.key_dim;
  s.beta = tokens * pr.value_heads;
  s.g = pr.gate == GateKind::none ? 0 : tokens * pr.value_heads * inner;
  s.gconst = pr.gate == GateKind::none ? 0 : pr.num_seqs * pr.value_heads * inner;
  s.r = tokens * pr.value_heads * pr.value_dim;
  s.rstd = p.use_qk_l2norm_in_kernel ? tokens * pr.heads : 0;
  return s;
}

}  // namespace

void delta_rule_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out,
                        Workspace ws) {
  const char* op = "delta_rule_forward";
  check_supported(op, p, pr);
  const DeviceGuard device(p.q.device_index);
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  if (dr::chunked_path_takes(p, pr, out.saved_r.present())) {
    dr::chunked_forward(p, pr, out, ws, stream);
    return;
  }
  cuda_detail::ScratchBuffer scratch(ws, cu_bytes(pr), stream);
  dr::RecurrentArgs a = base_args(p, pr);
  a.cu_seqlens = upload_cu_seqlens(scratch, pr, stream);
  a.o = view_of(out.o);
  a.r = view_of(out.saved_r);
  a.ht = view_of(out.final_state);
  const dr::Gate gate = gate_of(pr.gate);
  by_dtype(p.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    dr::launch_recurrent<T>(dr::RecurrentStage::forward, a, pr.num_seqs, gate, stream);
  });
}

void delta_rule_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                         const DeltaRuleGrads& grads, Workspace ws) {
  const char* op = "delta_rule_backward";
  check_supported(op, p, pr);
  const DeviceGuard device(p.q.device_index);
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  // The chunked backward recomputes what it needs from the inputs (a saved r is not used; a kept
  // v_new is).
  if (dr::chunked_path_takes(p, pr, false)) {
    dr::chunked_backward(p, pr, in, grads, ws, stream);
    return;
  }
  const BackwardSizes sz = backward_sizes(p, pr);
  const bool recompute_r = !in.saved_r.present();
  cuda_detail::ScratchBuffer scratch(ws, sz.bytes(pr, recompute_r), stream);

  dr::RecurrentArgs a = base_args(p, pr);
  a.cu_seqlens = upload_cu_seqlens(scratch, pr, stream);
  // dq, dk interleaved (RecurrentArgs::dqk_acc): 2 x 4 x qk bytes, as two separate arrays took.
  a.dqk_acc = scratch.take<float2>(8 * sz.qk);
  a.dbeta_acc = scratch.take<float>(4 * sz.beta);
  a.dg_acc = sz.g ? scratch.take<float>(4 * sz.g) : nullptr;
  a.dg_const = sz.gconst ? scratch.take<float>(4 * sz.gconst) : nullptr;
  for (auto [ptr, n] : {std::pair<float*, int64_t>{&a.dqk_acc->x, 2 * sz.qk}, {a.dbeta_acc, sz.beta},
                        {a.dg_acc, sz.g}, {a.dg_const, sz.gconst}})
    if (ptr && n) FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(ptr, 0, 4 * static_cast<std::size_t>(n), stream));

  const dr::Gate gate = gate_of(pr.gate);
  by_dtype(p.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (recompute_r) {  // the caller saved no r: one forward pass writes it (fp32, contiguous)
      dr::RecurrentArgs f = a;  // (no q_rstd / k_rstd yet: the forward norms in-kernel)
      f.r.p = scratch.take<float>(4 * sz.r);
      f.r.f32 = true;
      f.r.s3 = 1;
      f.r.s2 = pr.value_dim;
      f.r.s1 = pr.value_heads * pr.value_dim;
      f.r.s0 = pr.seq_len * f.r.s1;
      dr::launch_recurrent<T>(dr::RecurrentStage::forward, f, pr.num_seqs, gate, stream);
      a.r = f.r;
    } else {
      a.r = view_of(in.saved_r);
    }
    if (sz.rstd) {  // the L2 norm's 1 / ||q||, 1 / ||k|| per row, once for both passes
      float* q_rstd = scratch.take<float>(4 * sz.rstd);
      float* k_rstd = scratch.take<float>(4 * sz.rstd);
      dr::launch_qk_rstd<T>(a, q_rstd, k_rstd, pr.batch, stream);
      a.q_rstd = q_rstd;
      a.k_rstd = k_rstd;
    }
    a.dout = view_of(in.dout);
    a.dht = view_of(in.dht);
    a.dv = view_of(grads.dv);
    a.dh0 = view_of(grads.dh0);
    dr::launch_recurrent<T>(dr::RecurrentStage::backward_pass1, a, pr.num_seqs, gate, stream);
    dr::launch_recurrent<T>(dr::RecurrentStage::backward_pass2, a, pr.num_seqs, gate, stream);
    dr::launch_finish<T>(a, view_of(grads.dq), view_of(grads.dk), view_of(grads.dbeta), view_of(grads.dg),
                         pr.batch, pr.num_seqs, gate, stream);
  });
}

// The chunked path for GDN and the plain delta rule keeps v_new (chunked_path.h); KDA's stages do not
// take it yet, nor does the recurrent path (it saves r instead).
bool delta_rule_keeps_v_new(const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  check_supported("delta_rule_keeps_v_new", p, pr);
  return pr.gate != GateKind::per_channel && dr::chunked_path_takes(p, pr, false);
}

std::size_t delta_rule_workspace_bytes(const DeltaRuleParams& p, const DeltaRuleProblem& pr, Pass pass,
                                       bool with_saved_v_new) {
  check_supported("delta_rule_workspace_bytes", p, pr);
  // The forward's answer assumes no saved_r is asked for (with one, the recurrent forward runs
  // and needs less).
  if (dr::chunked_path_takes(p, pr, false))
    return pass == Pass::forward ? dr::chunked_forward_scratch_bytes(pr, p.q.dtype, with_saved_v_new)
                                 : dr::chunked_backward_scratch_bytes(pr, p.q.dtype, with_saved_v_new);
  if (pass == Pass::forward) return cu_bytes(pr);
  // Upper bound: includes the r buffer needed when the backward gets no saved_r.
  return backward_sizes(p, pr).bytes(pr, true);
}

}  // namespace flashgrad::cuda
