// Launchers of the fused recurrent kernels: pick the padded key size KMAX (64, 128, 256) and the
// gate kind at run time, and launch one instantiation. Explicitly instantiated per dtype in
// recurrent_instances_*.cu (one file per dtype so that the builds run in parallel).
#pragma once

#include <cuda_runtime.h>

#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

enum class RecurrentStage { forward, backward_pass1, backward_pass2 };

// Largest key dimension the recurrent kernels take (KPT = 8 rows per lane, 32 lanes per column).
constexpr int64_t kMaxKeyDim = 256;

// Launches `stage` for all (sequence, value head, column slice) blocks; checks the launch.
template <typename T>
void launch_recurrent(RecurrentStage stage, const RecurrentArgs& a, int64_t num_seqs, Gate gate,
                      cudaStream_t stream);

// 1 / ||x|| of every q and k row [batch, a.T, a.H] into q_rstd / k_rstd (finish_kernels.cuh,
// qk_rstd_kernel): the backward passes' L2 norm, computed once.
template <typename T>
void launch_qk_rstd(const RecurrentArgs& a, float* q_rstd, float* k_rstd, int64_t batch, cudaStream_t stream);

// dq, dk (from dq_acc / dk_acc), dbeta, dg: see finish_kernels.cuh. `g_inner` = 1 (GDN) or K (KDA);
// dg is skipped without a gate.
template <typename T>
void launch_finish(const RecurrentArgs& a, View dq, View dk, View dbeta, View dg, int64_t batch,
                   int64_t num_seqs, Gate gate, cudaStream_t stream);

}  // namespace flashgrad::cuda_detail::delta_rule
