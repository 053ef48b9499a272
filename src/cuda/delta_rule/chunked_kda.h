// Internal interface of the chunked (chunk 64, UT/WY) stages for KDA: per-channel gates
// g [B, T, HV, K] (float32 or the input dtype). Same stage list, grids, argument block
// (ChunkedArgs) and intermediates as the GDN / plain-rule stages in chunked_stages.h, except that
// everything gate-shaped has a key-channel axis.
//
// Notation (src/reference/delta_rule/chunked.h), per (sequence, value head) and chunk of L <= 64
// rows i, j, key channel d:
//   G_id  = g_0d + ... + g_id (per channel)
//   M_ij  = beta_i sum_d k_id k_jd exp(G_id - G_jd)  (i > j),  A = (I + M)^{-1}
//   w     = A (beta exp(G) o k),  u = A (beta v)
//   v_new = u - w h_c,  h_{c+1} = diag(exp(G_{L-1})) h_c + (k o exp(G_{L-1} - G))^T v_new
//   o     = scale [(q o exp(G)) h_c + Lower_incl(sum_d q_id k_jd exp(G_id - G_jd)) v_new]
//
// The decayed key products (M, and P = the o formula's lower matrix) are not one matrix product;
// stage 1 forms both (chunked_kda_decay.cuh) from 16-row sub-chunks: diagonal 16 x 16 blocks one
// term at a time in fp32; off-diagonal blocks (rows in sub-chunk I > column sub-chunk J) through
// the reference row r = 16 I, exp(G_id - G_jd) = exp(G_id - G_rd) exp(G_rd - G_jd), both factors
// <= 1 (j < r <= i and g <= 0), as one tensor-core product of pre-scaled tiles. A strong decay
// underflows to 0 and never overflows. (The default stage-1 kernel since session 7,
// chunked_kda_prepare_compact.cuh, forms the same products in half the shared memory, in its
// session-13 form since run 13.3, the session-7 form selectable by FLASHGRAD_CHUNKED_KDA_PREPARE=s7;
// the session-6 one, chunked_kda_prepare.cuh, stays selectable: FLASHGRAD_CHUNKED_KDA_PREPARE=old.)
// Everything else (w, u, w h, kd^T v_new, (q o exp(G)) h, P v_new, and the backward's B1
// products) runs on tensor cores (mma.sync, hi + lo operand splits as the GDN stages).
//
// Intermediates (layouts as chunked_stages.h, row = b * T + t):
//   G     float [rows, HV, K]        cumulative per-channel log decay inside each chunk
//   A     float [rows, HV, 64]       row i of the chunk: A_ij for j < i (A's unit diagonal and zero
//                                    upper triangle are implicit) and P_ji for j >= i, i.e. P^T
//                                    packed into the upper triangle (P_ji = 0 for j >= L). Stage 1
//                                    writes P once; stage 3 and B1 read it (B1 runs over a
//                                    sequence's chunks one after another: no recomputation there).
//   w, u, v_new, h, dh, dv_new       as chunked_stages.h
//   dg    float [rows, HV, K]        (B2) per-channel gate gradient
//   dq_acc, dk_acc, dv, dbeta        as chunked_stages.h
// kda_scratch_sizes() gives the element counts (G is K times GDN's).
//
// Stages: 1 prepare (chunks x HV), 2 state (sequences x HV x V/64, transposed), 3 output (chunks x HV
// x V/64; single-fragment products by default since session 11, FLASHGRAD_CHUNKED_KDA_OUTPUT=split for
// hi + lo), B1 state backward (sequences x HV x V/64, transposed), B2 grads in two kernels (chunks x HV,
// 256 threads each, key channels in 64-channel slices: chunked_kda_grads_state.cuh with the products
// of h / dh (by default the session-11 staged form: the three products of a slice in one pass, the
// chunk's dv_new / do / v_new rows staged in shared memory; FLASHGRAD_CHUNKED_KDA_B2=split runs the
// session-10 form, =staged_prefetch the staged one with the L2 prefetch of the next slice's states, the
// default until session 12), dA, dWb, dM;
// then the per-channel decayed sums, dUb and dg: by default since session 12 chunked_kda_grads_local2.cuh
// (16-bit dP / dM tiles read by ldmatrix, swizzled slice tiles, cp.async slice loads; run 12.2: 1.68 ->
// 0.77 ms at B4 T4096 H16 K=V=128), FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old the session-10
// chunked_kda_grads_local.cuh (which =split_exact always runs); =fused runs the one-kernel
// chunked_kda_grads.cuh). Scope: bf16 / fp16, K in {64, 128}, V in {64, 128, 192, 256}.
//
// Checked by the host emulation of these sources (chunked_emulation/kda_harness.cc, every stage and
// end to end within the GPU test's bars) and on the H200 by tests/cpp/delta_rule_chunked_kda_gpu_test.cu
// (every GPU check runs it with the defaults; the GPU jobs also with the variables above).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

// Empty when the KDA stages take this problem; otherwise why not (names K or V).
std::string kda_stages_support(DType dtype, int64_t K, int64_t V);

// Element counts of the KDA intermediates (G per channel), and of dg.
ChunkedScratchSizes kda_scratch_sizes(int64_t rows, int64_t num_chunks, int64_t HV, int64_t K, int64_t V);
inline int64_t kda_dg_size(int64_t rows, int64_t HV, int64_t K) { return rows * HV * K; }

// Stage launchers (T = __nv_bfloat16 or __half); each checks its arguments and its launch.
// a.g must be given (per-channel, [B, T, HV, K]); a.G and (B2) a.dg are [rows, HV, K].
template <typename T>
void launch_kda_prepare(const ChunkedArgs& a, cudaStream_t stream);
template <typename T>
void launch_kda_state(const ChunkedArgs& a, cudaStream_t stream);
template <typename T>
void launch_kda_output(const ChunkedArgs& a, cudaStream_t stream);
// B1: needs G, A (P), w (stage 1); writes dh per chunk, dv_new, dh0.
template <typename T>
void launch_kda_state_backward(const ChunkedArgs& a, cudaStream_t stream);
// B2: needs A, G (stage 1), h, v_new (stage 2), dh, dv_new (B1); dq_acc, dk_acc zeroed.
template <typename T>
void launch_kda_grads(const ChunkedArgs& a, cudaStream_t stream);

template <typename T>
void launch_kda_forward(const ChunkedArgs& a, cudaStream_t stream) {
  launch_kda_prepare<T>(a, stream);
  launch_kda_state<T>(a, stream);
  launch_kda_output<T>(a, stream);
}

}  // namespace flashgrad::cuda_detail::delta_rule
