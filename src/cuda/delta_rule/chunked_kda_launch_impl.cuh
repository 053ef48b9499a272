// Host launchers of the KDA chunked stages (declared in chunked_kda.h); included once per dtype by
// chunked_kda_instances_*.cu. K = 64 and K = 128 are instantiated (KMAX = K exactly).
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "chunked_kda.h"
#include "chunked_kda_grads.cuh"
#include "chunked_kda_grads_local.cuh"
#include "chunked_kda_grads_local2.cuh"
#include "chunked_kda_grads_state.cuh"
#include "chunked_kda_grads_legacy.cuh"
#include "chunked_kda_output.cuh"
#include "chunked_kda_prepare.cuh"
#include "chunked_kda_prepare_compact.cuh"
#include "chunked_kda_state_backward_transposed.cuh"
#include "chunked_kda_state_transposed.cuh"
#include "chunked_launch_impl.cuh"  // set_smem, dtype_of
#include "cuda/common/cuda_check.h"
#include "flashgrad/status.h"

namespace flashgrad::cuda_detail::delta_rule {

// Refuses what the KDA stages do not take, naming the argument.
inline void check_kda_args(const char* stage, DType dtype, const ChunkedArgs& a) {
  const std::string why = kda_stages_support(dtype, a.K, a.V);
  if (!why.empty()) throw_unsupported(stage, "q", why);
  if (!a.g.p) throw_invalid_argument(stage, "g", "the KDA stages need the per-channel gate [B, T, HV, K]");
  if (!a.G || !a.A || !a.w || !a.u || !a.v_new || !a.h || !a.chunks || !a.seq_first_chunk)
    throw_invalid_argument(stage, "scratch", "G, A (it carries P), w, u, v_new, h and the chunk plan must be allocated");
  if (a.HV > 65535 || a.V / kStateCols > 65535 || a.num_chunks > 0x7fffffff || a.num_seqs > 0x7fffffff)
    throw_unsupported(stage, "v", "too many value heads, chunks or sequences for one launch");
}

// One kernel instantiation with its shared-memory layout `Smem`, grid and block size.
template <typename Smem, int Threads = kChunkThreads, typename Kernel>
void launch_kda_kernel(Kernel kernel, dim3 grid, const ChunkedArgs& a, cudaStream_t s) {
  constexpr int64_t smem_bytes = Smem::bytes();
  static_assert(smem_bytes <= 227 * 1024, "sm_90 allows 227 KiB of shared memory per block");
  set_smem(kernel, smem_bytes);
  // All of the SM's 228 KiB as shared memory (the kernels use no L1-heavy loads), so that B1, stage 2
  // and stage 3 fit two blocks per SM.
  FLASHGRAD_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  kernel<<<grid, Threads, smem_bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// FLASHGRAD_CHUNKED_KDA=legacy (read at every launch) selects the session-5 kernels of the stages
// changed in session 6 (B2; stage 1's diagonal blocks), so that one GPU process can time and compare
// both. (It also selected stage 2 without its L2 prefetch, until that kernel was removed after run
// 9.1: stage 2 is the transposed kernel either way.)
inline bool kda_legacy_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA");
  return v && std::strcmp(v, "legacy") == 0;
}

inline dim3 kda_chunk_grid(const ChunkedArgs& a, int64_t slices = 1) {
  return dim3(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV), static_cast<unsigned>(slices));
}
inline dim3 kda_seq_grid(const ChunkedArgs& a) {
  return dim3(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / kStateCols));
}

// FLASHGRAD_CHUNKED_KDA_PREPARE=old (read at every launch) selects the session-6 stage 1
// (kda_prepare_kernel, 203 KiB, one block per SM) instead of the compact one (session 7), so that
// one GPU process can time and compare both. FLASHGRAD_CHUNKED_KDA=legacy takes precedence (the
// session-5 stage 1).
inline bool kda_prepare_old_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_PREPARE");
  return v && std::strcmp(v, "old") == 0;
}
// The compact stage 1's variant (chunked_kda_prepare_compact.cuh, kVar; read at every launch):
// unset, the session-13 kernel (kVar = 4, the default since run 13.3: G scaled by log2 e and the
// decays by ex2.approx.ftz, the in-half pairs two units per pass, the off-diagonal channel loop
// unrolled by 2, v two pieces ahead, beta's and v's loads converted at their use);
// FLASHGRAD_CHUNKED_KDA_PREPARE=s7, the session-7 compact kernel (kVar = 0) it replaced, so that one
// GPU process can time and compare both (=old: the session-6 kernel, kda_prepare_old_requested).
inline int kda_prepare_variant_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_PREPARE");
  if (v && std::strcmp(v, "s7") == 0) return 0;
  return 4;
}
template <typename T, int K>
void launch_kda_prepare_compact(const ChunkedArgs& a, cudaStream_t s) {
  const int var = kda_prepare_variant_requested();
  launch_kda_kernel<KdaPrepareCompactSmem<T, K>>(var == 0 ? kda_prepare_compact_kernel<T, K, 0>
                                                          : kda_prepare_compact_kernel<T, K, 4>,
                                                 kda_chunk_grid(a), a, s);
}

template <typename T>
void launch_kda_prepare(const ChunkedArgs& a, cudaStream_t s) {
  check_kda_args("chunked KDA (prepare)", dtype_of<T>(), a);
  if (a.num_chunks == 0 || a.HV == 0) return;
  const bool legacy = kda_legacy_requested();
  if (!legacy && !kda_prepare_old_requested()) {
    if (a.K == 64)
      launch_kda_prepare_compact<T, 64>(a, s);
    else
      launch_kda_prepare_compact<T, 128>(a, s);
    return;
  }
  if (a.K == 64)
    launch_kda_kernel<KdaPrepareSmem<T, 64>>(legacy ? kda_prepare_kernel<T, 64, false> : kda_prepare_kernel<T, 64>,
                                             kda_chunk_grid(a), a, s);
  else
    launch_kda_kernel<KdaPrepareSmem<T, 128>>(
        legacy ? kda_prepare_kernel<T, 128, false> : kda_prepare_kernel<T, 128>, kda_chunk_grid(a), a, s);
}

// FLASHGRAD_CHUNKED_KDA_STATE (read at every launch) picks stage 2's operand splits, so that one GPU
// process can time and compare them: unset, the transposed, pipelined kernel of session 8
// (chunked_kda_state_transposed.cuh) with single-fragment products (h rounded to T as fla does);
// =split, that kernel with every operand hi + lo (0.367 against 0.330 ms per call at B4 T4096 H16
// K=V=128, run 9.1). Both store the same intermediates (h fp32, v_new in T). Run 9.1 (H200,
// 2026-11-30: 1.289 -> 0.330 ms per call) made the transposed kernel the default; the session-6
// kernel it replaced (kda_state_kernel, 4 warps per 32 value columns, hi + lo operands: o and the
// gradients within 1e-3 rel RMS of the default's, ht 2.2e-3) was then removed.
enum class KdaStateKernel { transposed, transposed_split };
inline KdaStateKernel kda_state_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_STATE");
  if (v && std::strcmp(v, "split") == 0) return KdaStateKernel::transposed_split;
  return KdaStateKernel::transposed;
}

// The transposed stage 2: blocks of 8 warps, 64 value columns each (V is a multiple of 64).
constexpr int kKdaStateWarps = 8;
template <typename T, int KMAX, int SPLIT>
void launch_kda_state_transposed(const ChunkedArgs& a, cudaStream_t s) {
  using Smem = KdaStateTSmem<T, KMAX, kKdaStateWarps, SPLIT>;
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / Smem::BV));
  launch_kda_kernel<Smem, Smem::THREADS>(kda_state_transposed_kernel<T, KMAX, kKdaStateWarps, SPLIT>, grid, a, s);
}

template <typename T>
void launch_kda_state(const ChunkedArgs& a, cudaStream_t s) {
  check_kda_args("chunked KDA (state)", dtype_of<T>(), a);
  if (a.num_seqs == 0 || a.HV == 0) return;  // empty sequences still write ht = h0
  constexpr int kAll = kKdaSplitH | kKdaSplitVnew | kKdaSplitKd;
  const bool split = kda_state_requested() == KdaStateKernel::transposed_split;
  if (a.K == 64)
    split ? launch_kda_state_transposed<T, 64, kAll>(a, s)
          : launch_kda_state_transposed<T, 64, FLASHGRAD_KDA_STATE_SPLIT_DEFAULT>(a, s);
  else
    split ? launch_kda_state_transposed<T, 128, kAll>(a, s)
          : launch_kda_state_transposed<T, 128, FLASHGRAD_KDA_STATE_SPLIT_DEFAULT>(a, s);
}

// (kda_output_single_wanted: chunked_kda_output.cuh)
template <typename T>
void launch_kda_output(const ChunkedArgs& a, cudaStream_t s) {
  check_kda_args("chunked KDA (output)", dtype_of<T>(), a);
  if (a.num_chunks == 0 || a.HV == 0) return;
  const dim3 grid = kda_chunk_grid(a, a.V / kOutputCols);
  const bool single = kda_output_single_wanted();
  if (a.K == 64)
    single ? launch_kda_kernel<KdaOutputSmem<T, 64, true>>(kda_output_kernel<T, 64, true>, grid, a, s)
           : launch_kda_kernel<KdaOutputSmem<T, 64>>(kda_output_kernel<T, 64>, grid, a, s);
  else
    single ? launch_kda_kernel<KdaOutputSmem<T, 128, true>>(kda_output_kernel<T, 128, true>, grid, a, s)
           : launch_kda_kernel<KdaOutputSmem<T, 128>>(kda_output_kernel<T, 128>, grid, a, s);
}

// B1 is the transposed, pipelined kernel of session 9 (chunked_kda_state_backward_transposed.cuh: dh^T
// in accumulators, 8 warps per 64 value columns, single-fragment products as fla), the default since
// run 9.3 (H200, 2026-11-30: 2.207 -> 0.427 ms per call at B4 T4096 H16 K=V=128, KDA backward 9.45 ->
// 7.66 ms; gradients within 2.7e-3 rel RMS of the session-6 kernel's, which it replaced).
// FLASHGRAD_CHUNKED_KDA_B1=transposed_split (read at every launch) multiplies dh, P and dv_new hi + lo.
// Both store dh and dv_new in fp32, and dh0.
inline bool kda_b1_split_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_B1");
  return v && std::strcmp(v, "transposed_split") == 0;
}

// The transposed B1: blocks of 8 warps, 64 value columns each (V is a multiple of 64).
constexpr int kKdaStateBackwardWarps = 8;
template <typename T, int KMAX, bool kSplit>
void launch_kda_state_backward_transposed(const ChunkedArgs& a, cudaStream_t s) {
  using Smem = KdaStateBackwardTSmem<T, KMAX, kKdaStateBackwardWarps>;
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / Smem::BV));
  launch_kda_kernel<Smem, Smem::THREADS>(kda_state_backward_transposed_kernel<T, KMAX, kKdaStateBackwardWarps, kSplit>,
                                         grid, a, s);
}

template <typename T>
void launch_kda_state_backward(const ChunkedArgs& a, cudaStream_t s) {
  const char* stage = "chunked KDA (state backward)";
  check_kda_args(stage, dtype_of<T>(), a);
  if (!a.dout.p || !a.dh || !a.dv_new) throw_invalid_argument(stage, "scratch", "dout, dh and dv_new must be given");
  if (a.num_seqs == 0 || a.HV == 0) return;  // empty sequences still write dh0 = dht
  const bool split = kda_b1_split_requested();
  if (a.K == 64)
    split ? launch_kda_state_backward_transposed<T, 64, true>(a, s)
          : launch_kda_state_backward_transposed<T, 64, false>(a, s);
  else
    split ? launch_kda_state_backward_transposed<T, 128, true>(a, s)
          : launch_kda_state_backward_transposed<T, 128, false>(a, s);
}

// B2 is two kernels of two blocks per SM each by default (session 10, helper kdab2:
// chunked_kda_grads_state.cuh, then chunked_kda_grads_local.cuh; the first hands the second dM
// through dv's first 64 columns and the state parts of dq, dk, dg, dbeta through those outputs), with
// the fp32 operands of the products with the states (h, dh, dv_new) and of the decayed sums'
// tensor-core parts rounded once to T (as fla and the default B1). Since session 11 (helper kdab2s)
// the first kernel runs its `staged` form by default (kda_state_slice_products_staged: the chunk rows
// of the products staged in shared memory, conflict-free swizzled tiles, cp.async slice loads):
// H200, B4 T4096 H16 K=V=128, run 11.2: 0.99 ms per call against 1.95 (backward 5.87 -> 4.95 ms),
// gradients within 7e-6 rel RMS. FLASHGRAD_CHUNKED_KDA_B2 (read at every launch) = split runs
// the session-10 first kernel (run 10.4: 1.94 ms; the two kernels 3.62 ms per call against 5.37 for
// kda_grads_kernel); = split_exact splits the operands hi + lo as kda_grads_kernel does (within 4e-5
// of it, ~3% slower than split); = fused runs kda_grads_kernel (one block per SM, 225 KiB at
// K = 128). FLASHGRAD_CHUNKED_KDA=legacy takes precedence (the session-5 kernel).
// = staged_prefetch: the staged form with L2 prefetches of the next slice's states (kPrefetch); the
// default until session 12, when run 11.4 had timed it 0.076 ms slower (0.906 against 0.830 ms per call;
// docs/perf/delta_rule.md, "KDA B2 state kernel, session 11"). = staged_noprefetch names the default.
enum class KdaB2Kernel { staged, staged_prefetch, split, split_exact, fused };
inline KdaB2Kernel kda_b2_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_B2");
  if (v && std::strcmp(v, "split") == 0) return KdaB2Kernel::split;
  if (v && std::strcmp(v, "staged_prefetch") == 0) return KdaB2Kernel::staged_prefetch;
  if (v && std::strcmp(v, "split_exact") == 0) return KdaB2Kernel::split_exact;
  if (v && std::strcmp(v, "fused") == 0) return KdaB2Kernel::fused;
  return KdaB2Kernel::staged;
}

// The second B2 kernel runs in its session-12 form (helper kdaloc; chunked_kda_grads_local2.cuh: dP /
// dM as 16-bit tiles read by ldmatrix, staging with fixed offsets, swizzled slice tiles, cp.async
// slice loads; the same outputs up to fp32 summation order) where the operands are rounded (every
// variant but =split_exact): run 12.2, B4 T4096 H16 K=V=128 bf16, 1.681 -> 0.770 ms per call, KDA
// backward 4.714 -> 3.803 ms, GPU tests and sanitizers pass. FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old (read
// at every launch) runs the session-10 kernel (chunked_kda_grads_local.cuh).
inline bool kda_b2_local_new_requested() {
  const char* v = std::getenv("FLASHGRAD_CHUNKED_KDA_B2_LOCAL");
  return !(v && std::strcmp(v, "old") == 0);
}

template <typename T, int KMAX, bool kSplit, bool kStaged = false, bool kPrefetch = false>
void launch_kda_grads_split(const ChunkedArgs& a, cudaStream_t s) {
  launch_kda_kernel<KdaGradsStateSmem<T, kStaged>, kKdaSplitThreads>(
      kda_grads_state_kernel<T, KMAX, kSplit, kStaged, kPrefetch>, kda_chunk_grid(a), a, s);
  if (!kSplit && kda_b2_local_new_requested())
    launch_kda_kernel<KdaGradsLocal2Smem<T>, kKdaSplitThreads>(kda_grads_local2_kernel<T, KMAX>, kda_chunk_grid(a), a, s);
  else
    launch_kda_kernel<KdaGradsLocalSmem, kKdaSplitThreads>(kda_grads_local_kernel<T, KMAX, kSplit>,
                                                           kda_chunk_grid(a), a, s);
}

template <typename T, int KMAX>
void launch_kda_grads_split_as(KdaB2Kernel b2, const ChunkedArgs& a, cudaStream_t s) {
  if (b2 == KdaB2Kernel::split_exact)
    launch_kda_grads_split<T, KMAX, true>(a, s);
  else if (b2 == KdaB2Kernel::staged)
    launch_kda_grads_split<T, KMAX, false, true>(a, s);
  else if (b2 == KdaB2Kernel::staged_prefetch)
    launch_kda_grads_split<T, KMAX, false, true, true>(a, s);
  else
    launch_kda_grads_split<T, KMAX, false>(a, s);
}

template <typename T>
void launch_kda_grads(const ChunkedArgs& a, cudaStream_t s) {
  const char* stage = "chunked KDA (grads)";
  check_kda_args(stage, dtype_of<T>(), a);
  if (!a.dout.p || !a.dh || !a.dv_new || !a.A || !a.dq_acc || !a.dk_acc || !a.dv || !a.dbeta || !a.dg)
    throw_invalid_argument(stage, "scratch", "dout, A, dh, dv_new, dq_acc, dk_acc, dv, dbeta and dg must be given");
  if (a.num_chunks == 0 || a.HV == 0) return;
  const bool legacy = kda_legacy_requested();
  const KdaB2Kernel b2 = legacy ? KdaB2Kernel::fused : kda_b2_requested();
  if (b2 != KdaB2Kernel::fused) {
    a.K == 64 ? launch_kda_grads_split_as<T, 64>(b2, a, s) : launch_kda_grads_split_as<T, 128>(b2, a, s);
    return;
  }
  if (a.K == 64)
    launch_kda_kernel<KdaGradsSmem<64>, kGradsThreads>(legacy ? kda_grads_legacy_kernel<T, 64> : kda_grads_kernel<T, 64>,
                                                       kda_chunk_grid(a), a, s);
  else
    launch_kda_kernel<KdaGradsSmem<128>, kGradsThreads>(
        legacy ? kda_grads_legacy_kernel<T, 128> : kda_grads_kernel<T, 128>, kda_chunk_grid(a), a, s);
}

#define FLASHGRAD_CHUNKED_KDA_INSTANTIATE(T)                                    \
  template void launch_kda_prepare<T>(const ChunkedArgs&, cudaStream_t);        \
  template void launch_kda_state<T>(const ChunkedArgs&, cudaStream_t);          \
  template void launch_kda_output<T>(const ChunkedArgs&, cudaStream_t);         \
  template void launch_kda_state_backward<T>(const ChunkedArgs&, cudaStream_t); \
  template void launch_kda_grads<T>(const ChunkedArgs&, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
