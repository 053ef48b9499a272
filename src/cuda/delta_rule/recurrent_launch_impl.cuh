// Definitions of the launchers declared in recurrent_launch.cuh; included once per dtype by
// recurrent_instances_*.cu.
#pragma once

#include <algorithm>

#include "flashgrad/status.h"
#include "cuda/common/cuda_check.h"
#include "finish_kernels.cuh"
#include "recurrent_backward.cuh"
#include "recurrent_forward.cuh"
#include "recurrent_launch.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, Gate G>
void launch_recurrent_fixed(RecurrentStage stage, const RecurrentArgs& a, int64_t num_seqs, cudaStream_t s) {
  constexpr int L = KMAX / kRowsPerThread;
  constexpr int kCols = kThreads / L;  // value columns per block
  // x: sequences (up to 2^31 - 1), y: value heads, z: column slices.
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(a.HV),
                  static_cast<unsigned>((a.V + kCols - 1) / kCols));
  switch (stage) {
    case RecurrentStage::forward:
      recurrent_forward_kernel<T, KMAX, G><<<grid, kThreads, 0, s>>>(a);
      break;
    case RecurrentStage::backward_pass1:
      recurrent_backward_pass1_kernel<T, KMAX, G><<<grid, kThreads, 0, s>>>(a);
      break;
    case RecurrentStage::backward_pass2:
      recurrent_backward_pass2_kernel<T, KMAX, G><<<grid, kThreads, 0, s>>>(a);
      break;
  }
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int KMAX>
void launch_recurrent_gate(RecurrentStage stage, const RecurrentArgs& a, int64_t num_seqs, Gate gate,
                           cudaStream_t s) {
  switch (gate) {
    case Gate::none: launch_recurrent_fixed<T, KMAX, Gate::none>(stage, a, num_seqs, s); break;
    case Gate::scalar: launch_recurrent_fixed<T, KMAX, Gate::scalar>(stage, a, num_seqs, s); break;
    case Gate::per_channel: launch_recurrent_fixed<T, KMAX, Gate::per_channel>(stage, a, num_seqs, s); break;
  }
}

// The kernels address step t of a sequence as one 32-bit multiply-add (TokenPtr): the token index
// and every per-token stride in bytes must fit in int32 (the accumulators' too: dqk_acc's rows are
// float2, H x K x 8 bytes per token; dg_acc's HV x K x 4). Contiguous tensors are far inside that
// (a token's stride is heads x dim elements); a view strided past it is refused, not overflowed.
template <typename T>
void check_token_strides(const RecurrentArgs& a) {
  constexpr int64_t kMax = 0x7fffffff;
  auto fits = [&](const View& x) { return !x.p || (x.s1 >= 0 && x.s1 * (x.f32 ? 4 : int64_t(sizeof(T))) <= kMax); };
  const bool ok = a.T <= kMax && fits(a.q) && fits(a.k) && fits(a.v) && fits(a.g) && fits(a.beta) && fits(a.o) &&
                  fits(a.r) && fits(a.dout) && fits(a.dv) && a.H * a.K * 8 <= kMax && a.HV * a.K * 4 <= kMax;
  if (!ok)
    throw_unsupported("delta_rule (recurrent CUDA kernels)", "q",
                      "sequences longer than 2^31 - 1 tokens or a per-token stride above 2^31 - 1 bytes");
}

template <typename T>
void launch_recurrent(RecurrentStage stage, const RecurrentArgs& a, int64_t num_seqs, Gate gate,
                      cudaStream_t s) {
  if (num_seqs == 0 || a.HV == 0 || a.V == 0) return;
  check_token_strides<T>(a);
  if (stage != RecurrentStage::forward && a.l2norm && (!a.q_rstd || !a.k_rstd))
    throw_invalid_argument("delta_rule (recurrent CUDA kernels)", "q_rstd",
                           "the backward passes with the in-kernel L2 norm need launch_qk_rstd's rows");
  if (a.K <= 64)
    launch_recurrent_gate<T, 64>(stage, a, num_seqs, gate, s);
  else if (a.K <= 128)
    launch_recurrent_gate<T, 128>(stage, a, num_seqs, gate, s);
  else
    launch_recurrent_gate<T, 256>(stage, a, num_seqs, gate, s);
}

inline unsigned grid_for(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65536)));
}

template <typename T>
void launch_qk_rstd(const RecurrentArgs& a, float* q_rstd, float* k_rstd, int64_t batch, cudaStream_t s) {
  const int64_t rows = batch * a.T * a.H;
  if (rows == 0) return;
  qk_rstd_kernel<T><<<grid_for(rows, 8), 256, 0, s>>>(a.q, q_rstd, batch, a.T, a.H, a.K);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
  qk_rstd_kernel<T><<<grid_for(rows, 8), 256, 0, s>>>(a.k, k_rstd, batch, a.T, a.H, a.K);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_finish(const RecurrentArgs& a, View dq, View dk, View dbeta, View dg, int64_t batch,
                   int64_t num_seqs, Gate gate, cudaStream_t s) {
  const int64_t qk_rows = batch * a.T * a.H;
  if (qk_rows > 0 && a.dqk_acc) {  // the recurrent backward: interleaved pairs, rstd precomputed
    if (a.l2norm && (!a.q_rstd || !a.k_rstd))
      throw_invalid_argument("delta_rule (recurrent finish)", "q_rstd", "the L2-norm backward needs launch_qk_rstd's rows");
    qk_pair_grad_finish_kernel<T><<<grid_for(qk_rows, 8), 256, 0, s>>>(
        a.q, a.k, dq, dk, a.dqk_acc, a.l2norm ? a.q_rstd : nullptr, a.l2norm ? a.k_rstd : nullptr, batch, a.T, a.H, a.K);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  } else if (qk_rows > 0) {
    qk_grad_finish_kernel<T><<<grid_for(qk_rows, 8), 256, 0, s>>>(a.q, dq, a.dq_acc, batch, a.T, a.H, a.K, a.l2norm);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
    qk_grad_finish_kernel<T><<<grid_for(qk_rows, 8), 256, 0, s>>>(a.k, dk, a.dk_acc, batch, a.T, a.H, a.K, a.l2norm);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  const int64_t beta_n = batch * a.T * a.HV;
  if (beta_n > 0) {
    gate_grad_finish_kernel<T><<<grid_for(beta_n, 256), 256, 0, s>>>(dbeta, a.dbeta_acc, nullptr, nullptr, num_seqs,
                                                                      batch, a.T, a.HV, 1);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  if (gate != Gate::none && beta_n > 0) {
    const int64_t inner = gate == Gate::per_channel ? a.K : 1;
    gate_grad_finish_kernel<T><<<grid_for(beta_n * inner, 256), 256, 0, s>>>(
        dg, a.dg_acc, a.dg_const, a.cu_seqlens, num_seqs, batch, a.T, a.HV, inner);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
}

#define FLASHGRAD_DELTA_RULE_INSTANTIATE(T)                                                        \
  template void launch_recurrent<T>(RecurrentStage, const RecurrentArgs&, int64_t, Gate, cudaStream_t); \
  template void launch_qk_rstd<T>(const RecurrentArgs&, float*, float*, int64_t, cudaStream_t);  \
  template void launch_finish<T>(const RecurrentArgs&, View, View, View, View, int64_t, int64_t, Gate,  \
                                 cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
