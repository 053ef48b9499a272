// Host launchers of the chunked stages (declared in chunked_stages.h); included once per dtype
// by chunked_instances_*.cu. Only K = 64 and K = 128 are instantiated (KMAX = K exactly).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>

#include "chunked_grads.cuh"
#include "chunked_grads_mma.cuh"
#include "chunked_grads_split.cuh"
#include "finish_kernels.cuh"
#include "chunked_output.cuh"
#include "chunked_prepare_compact.cuh"
#include "chunked_stages.h"
#include "chunked_state.cuh"
#include "chunked_state_backward.cuh"
#include "chunked_state_backward_wgmma.cuh"
#include "chunked_state_wgmma.cuh"
#include "chunked_dv_local.cuh"
#include "chunked_state_backward_transposed.cuh"
#include "cuda/common/cuda_check.h"
#include "flashgrad/status.h"

namespace flashgrad::cuda_detail::delta_rule {

// Refuses what the stages do not take (see chunked_stages_support), naming the argument, and a
// missing intermediate the stage uses (`uses`).
inline void check_chunked_args(const char* stage, DType dtype, const ChunkedArgs& a, StageUses uses = {}) {
  const std::string why = chunked_stages_support(dtype, a.K, a.V, false);
  if (!why.empty()) throw_unsupported(stage, "q", why);
  // Intermediates the stages share (A is optional: only the tests and B2 read it).
  if (!a.w || (uses.u && !a.u) || (uses.v_new && !a.v_new) || (uses.h && !a.h && !a.h16) || !a.chunks ||
      !a.seq_first_chunk || (a.g.p && !a.G))
    throw_invalid_argument(stage, "scratch", std::string("w, ") + (uses.u ? "u, " : "") + (uses.v_new ? "v_new, " : "") +
                                                 (uses.h ? "h, " : "") + "the chunk plan and (with a gate) G must be allocated");
  if (a.h && a.h16) throw_invalid_argument(stage, "scratch", "h is either fp32 (h) or 16-bit (h16), not both");
  if (a.HV > 65535 || a.V / kStateCols > 65535 || a.num_chunks > 0x7fffffff || a.num_seqs > 0x7fffffff)
    throw_unsupported(stage, "v", "too many value heads, chunks or sequences for one launch");
}

// Opts the kernel into `bytes` of dynamic shared memory (above 48 KiB needs the attribute).
template <typename Kernel>
void set_smem(Kernel kernel, int64_t bytes) {
  FLASHGRAD_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::f16;
}

inline int sm_count() {
  int dev = 0, sms = 0;
  FLASHGRAD_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Stage 1's blocks loop over (chunk, value head) items: as many blocks as fit at once, at most one
// per item. `kernel` takes `bytes` of dynamic shared memory.
template <typename Kernel>
void launch_prepare_looping(Kernel kernel, int64_t bytes, const ChunkedArgs& a, cudaStream_t s) {
  set_smem(kernel, bytes);
  int per_sm = 0;
  FLASHGRAD_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kChunkThreads, static_cast<size_t>(bytes)));
  const int64_t items = a.num_chunks * a.HV;
  const int64_t blocks = std::min<int64_t>(items, static_cast<int64_t>(std::max(per_sm, 1)) * sm_count());
  kernel<<<static_cast<unsigned>(blocks), kChunkThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// Stage 1 (chunked_prepare_compact.cuh): three blocks per SM at K = V = 128, 3 x 75 KiB of the SM's
// 228 (all of it as shared memory).
template <typename T, int KMAX>
void launch_prepare_fixed(const ChunkedArgs& a, cudaStream_t s) {
  const auto kernel = chunk_prepare_compact_kernel<T, KMAX>;
  FLASHGRAD_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  launch_prepare_looping(kernel, PrepareCompactSmem<T, KMAX>::bytes(a.V), a, s);
}

template <typename T, int KMAX, int WARPS, bool kOutput = false, int KSPLIT = 1, bool kSingle = false>
void launch_state_fixed(const ChunkedArgs& a, cudaStream_t s) {
  using S = StateSmem<T, KMAX, WARPS, kOutput, KSPLIT>;
  constexpr int64_t bytes = S::bytes();
  set_smem(chunk_state_kernel<T, KMAX, WARPS, kOutput, KSPLIT, kSingle>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / S::BV));
  chunk_state_kernel<T, KMAX, WARPS, kOutput, KSPLIT, kSingle><<<grid, 32 * WARPS, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// Stage 2's block shape by how many (sequence, value head) chains there are: 4 warps x 16 value
// columns when V / 64 slices per chain give at least one block per SM; else 2 warps x 16 columns
// (twice the blocks); else (few long sequences) 2 warps sharing 16 columns with half the key
// channels each (chunk_state_kernel's KSPLIT: four times the blocks of the first shape, and each
// warp's chain of mmas per chunk halved).
// FLASHGRAD_CHUNKED_STATE_WARPS=8 (an experiment, session 6, off by default): 8 warps x 16 columns
// instead of four_warps where V % 128 == 0 (one block per 128 columns: w, k tiles copied once for
// twice the warps), to time against four_warps in one process.
// (Stage 2 in channel quarters, 4 warps of 32 channels per 16 value columns, was timed in run 10.3:
// no faster than the halves at B1 T32768 H16, 1.233 -> 1.248 ms, slower at B2 T16384, 0.716 -> 0.986;
// the launcher keeps the halves. B1's quarters did win: state_backward_channel_parts.)
enum class StateShape { four_warps, two_warps, channel_split, eight_warps };
inline StateShape state_shape(const ChunkedArgs& a) {
  const int64_t chains = a.num_seqs * a.HV, sms = sm_count();
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE_WARPS");
  if (env && std::string(env) == "8" && a.V % 128 == 0 && chains * (a.V / 64) >= sms) return StateShape::eight_warps;
  if (chains * (a.V / 64) >= sms) return StateShape::four_warps;
  if (chains * (a.V / 32) >= sms) return StateShape::two_warps;
  return StateShape::channel_split;
}

// Whether the forward runs stage 3 fused into stage 2: fused_output_wanted (chunked_stages.h), the
// rule the forward's scratch is sized by; a forward given no h buffer at all (the scratch sized for the
// fused path, chunked_path.cu) takes it wherever V allows.
inline bool fused_output_wanted(const ChunkedArgs& a) {
  if (a.V % 128 != 0 || !a.o.p) return false;
  if (!a.h && !a.h16) return true;
  return fused_output_wanted(a.num_seqs, a.HV, a.V, sm_count());
}

// Stage 3 reads h_c in fp32 (a.h: hi + lo products) or, kSingle, in T (a.h16: single products).
template <typename T, int KMAX, bool kSingle>
void launch_output_fixed(const ChunkedArgs& a, cudaStream_t s) {
  const int64_t bytes = OutputSmem<T, KMAX>::bytes(a.V);
  set_smem(chunk_output_kernel<T, KMAX, kSingle>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV));  // V: a loop inside
  chunk_output_kernel<T, KMAX, kSingle><<<grid, kChunkThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// (legacy_backward_wanted, mma_grads_wanted: chunked_stages.h)

// Transposed B1: 8 warps (128 value columns per block) when V allows and the (sequence, value
// head, slice) blocks still cover most SMs, else 4 warps (64 columns, twice the blocks):
// state_backward_warps (chunked_stages.h).
// Single-fragment products unless state_backward_split_wanted() (chunked_stages.h).
template <typename T, int KMAX, int WARPS, bool kSplit, bool kLocal = false, int KSPLIT = 1>
void launch_state_backward_transposed_as(const ChunkedArgs& a, cudaStream_t s) {
  using S = StateBackwardTSmem<T, KMAX, WARPS, kLocal, KSPLIT>;
  constexpr int64_t bytes = S::bytes();
  const auto kernel = chunk_state_backward_transposed_kernel<T, KMAX, WARPS, kSplit, kLocal, KSPLIT>;
  set_smem(kernel, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / S::BV));
  kernel<<<grid, 32 * WARPS, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}
template <typename T, int KMAX, int WARPS>
void launch_state_backward_transposed(const ChunkedArgs& a, cudaStream_t s) {
  if (state_backward_split_wanted())
    launch_state_backward_transposed_as<T, KMAX, WARPS, true>(a, s);
  else
    launch_state_backward_transposed_as<T, KMAX, WARPS, false>(a, s);
}

// B0 + B1 with kLocal (state_backward_local_wanted, chunked_stages.h): dv_local for every chunk into
// dv_new's own buffer (chunked_dv_local.cuh), then B1 in 4-warp blocks without P on its serial chain,
// with the key channels split over 2 or 4 warps per 16 value columns where
// state_backward_channel_parts says so (parts: 1, 2 or 4; 4 at K = 128 only).
// B0 alone: dv_local = do^T (scale P) of every chunk into dv_new's 16-bit buffer (grid chunks x HV);
// also run ahead of the chains kernel (chunked_state_chains.cu).
template <typename T, int KMAX>
void launch_dv_local(const ChunkedArgs& a, cudaStream_t s) {
  const int64_t bytes = DvLocalSmem<T, KMAX>::bytes(a.V);
  set_smem(chunk_dv_local_kernel<T, KMAX>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV));
  chunk_dv_local_kernel<T, KMAX><<<grid, kDvLocalThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}
// Three stages: two chunks' copies in flight while one is in use (a chunk's work is shorter than a
// DRAM round trip here).
constexpr int kStateWgmmaStages = 3;

// The wgmma chains (stage 2, B1): one warpgroup per (sequence, value head, BV value columns).
template <int BV, typename Kernel>
void launch_wgmma_chain(Kernel kernel, int64_t bytes, const ChunkedArgs& a, cudaStream_t s) {
  set_smem(kernel, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / BV));
  kernel<<<grid, 128, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// B1 on wgmma (chunked_state_backward_wgmma.cuh, session 17): BV value columns per block of one
// warpgroup (state_backward_wgmma_cols, chunked_stages.h, says where and how wide).
// FLASHGRAD_CHUNKED_WGMMA_ISSUE=0 / 1 / 2 (read per call): the chains' issue (kWgmmaIssue,
// chunked_wgmma_state.cuh) where the others are instantiated, K = 128 with 16 value columns; -1 otherwise.
inline int wgmma_issue_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_WGMMA_ISSUE");
  return env ? std::atoi(env) : -1;
}
template <typename T, int KMAX, int BV>
void launch_state_backward_wgmma(const ChunkedArgs& a, cudaStream_t s) {
  constexpr int ST = kStateWgmmaStages;
  using S = StateBackwardWgmmaSmem<T, KMAX, BV, ST>;
  if constexpr (KMAX == 128 && BV == 16) {
    const int issue = wgmma_issue_wanted();
    if (issue == 0)
      return launch_wgmma_chain<BV>(chunk_state_backward_wgmma_kernel<T, KMAX, BV, ST, 0>, S::bytes(), a, s);
    if (issue == 1)
      return launch_wgmma_chain<BV>(chunk_state_backward_wgmma_kernel<T, KMAX, BV, ST, 1>, S::bytes(), a, s);
  }
  launch_wgmma_chain<BV>(chunk_state_backward_wgmma_kernel<T, KMAX, BV, ST>, S::bytes(), a, s);
}
// Whether B1's wgmma kernel can read this call's arguments: k, q and the slice's dout by 16-byte rows,
// stage 1's and B0's row scales given, dv_local (and so dv_new) in its own 16-bit buffer.
// (A slice of dout starts bv elements, a multiple of 16 bytes, after another: dout's test covers it.)
inline bool state_backward_wgmma_fits(const ChunkedArgs& a, int bv) {
  return (a.K == 64 || a.K == 128) && a.V % bv == 0 && key_rows_vectorizable(a.k) && key_rows_vectorizable(a.q) &&
         key_rows_vectorizable(a.dout) && a.colscale && a.rowscale && a.dv_new16 && a.dv_new16 != a.w;
}

template <typename T, int KMAX>
void launch_dv_local_then_state_backward(const ChunkedArgs& a, cudaStream_t s, int parts) {
  launch_dv_local<T, KMAX>(a, s);
  const int64_t chains = a.num_seqs * a.HV;
  const int bv = state_backward_wgmma_cols(chains, a.K, a.V, sm_count());
  if (bv != 0 && state_backward_wgmma_fits(a, bv))
    return bv == 32 ? launch_state_backward_wgmma<T, KMAX, 32>(a, s) : launch_state_backward_wgmma<T, KMAX, 16>(a, s);
  if constexpr (KMAX == 128) {
    if (parts == 4) return launch_state_backward_transposed_as<T, KMAX, 4, false, true, 4>(a, s);
  }
  if (parts >= 2)
    launch_state_backward_transposed_as<T, KMAX, 4, false, true, 2>(a, s);
  else
    launch_state_backward_transposed_as<T, KMAX, 4, false, true>(a, s);
}

template <typename T, int KMAX>
void launch_state_backward_fixed(const ChunkedArgs& a, cudaStream_t s) {
  if (legacy_backward_wanted() && (a.dh16 || a.dv_new16))
    throw_invalid_argument("chunked delta rule (state backward)", "scratch",
                           "the legacy B1 writes fp32 dh and dv_new only");
  if (!legacy_backward_wanted()) {
    const int64_t chains = a.num_seqs * a.HV, sms = sm_count();
    // dv_local needs dv_new in its own 16-bit buffer (not w's region) and single-fragment products.
    if (a.dv_new16 && a.dv_new16 != a.w && !state_backward_split_wanted() &&
        state_backward_local_wanted(chains, a.V, sms)) {
      launch_dv_local_then_state_backward<T, KMAX>(a, s, state_backward_channel_parts(chains, a.K, a.V, sms));
      return;
    }
    const int warps = state_backward_warps(chains, a.V, sms);
    if (a.dv_new16 && a.dv_new16 == a.w && !(a.K == a.V && 16 * warps == a.V))
      throw_invalid_argument("chunked delta rule (state backward)", "scratch",
                             "dv_new may share w's memory only with K == V and one block per chain");
    if (warps == 8)
      launch_state_backward_transposed<T, KMAX, 8>(a, s);
    else
      launch_state_backward_transposed<T, KMAX, 4>(a, s);
    return;
  }
  constexpr int64_t bytes = StateBackwardSmem<T, KMAX>::bytes();
  set_smem(chunk_state_backward_kernel<T, KMAX>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV),
                  static_cast<unsigned>(a.V / kStateCols));
  chunk_state_backward_kernel<T, KMAX><<<grid, kChunkThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_chunk_prepare(const ChunkedArgs& a, cudaStream_t s) {
  // (u optional: the backward's kept-v_new path has no reader of it; v_new, h: written later)
  check_chunked_args("chunked delta rule (prepare)", dtype_of<T>(), a, StageUses{false, false, false});
  if (a.num_chunks == 0 || a.HV == 0) return;
  if (a.K == 64)
    launch_prepare_fixed<T, 64>(a, s);
  else
    launch_prepare_fixed<T, 128>(a, s);
}

// Stage 2 on wgmma (chunked_state_wgmma.cuh, session 16): FLASHGRAD_CHUNKED_STATE_WGMMA=16, 32 or 64 forces
// that many value columns per block, =0 the mma.sync kernels (read per call so one process can time them
// side by side). By default (kStateWgmmaByDefault, since session 17) where the mma.sync kernel would
// split the channels (few long sequences): 16 columns where those blocks fit in one wave, else 32. H200,
// chunk GDN bf16 K=V=128 H16, stage 2 per call, mma.sync -> wgmma 32 / 16: B1 T32768 0.871 -> 0.796 /
// **0.623 ms** (run 17.2), B2 T16384 0.673 -> **0.441** (run 17.1; 16 columns slower there, two waves:
// forward 1.149 -> 1.349 in run 17.2). At the two-warp shape (B4 T8192) 0.527 -> 0.490 / 0.720 (run
// 17.2), but K = V = 64 at B8 (the same shape) lost at 32 columns (0.161 -> 0.166, run 16.3): not taken
// there. Taken where K is 64 or 128, V a multiple of the slice, k readable by 16-byte rows and stage 1's
// row scales given (a.colscale); else 0 (not taken).
constexpr bool kStateWgmmaByDefault = true;
inline int state_wgmma_default_cols(const ChunkedArgs& a) {
  if (!kStateWgmmaByDefault || state_shape(a) != StateShape::channel_split) return 0;
  return a.num_seqs * a.HV * (a.V / 16) <= sm_count() ? 16 : 32;
}
inline int state_wgmma_cols(const ChunkedArgs& a) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE_WGMMA");
  const int bv = env ? std::atoi(env) : state_wgmma_default_cols(a);
  if (bv != 16 && bv != 32 && bv != 64) return 0;
  if (!(a.K == 64 || a.K == 128) || a.V % bv != 0 || !key_rows_vectorizable(a.k) || !a.colscale) return 0;
  return bv;
}
template <typename T, int KMAX, int BV>
void launch_state_wgmma_fixed(const ChunkedArgs& a, cudaStream_t s) {
  constexpr int ST = kStateWgmmaStages;
  using S = StateWgmmaSmem<T, KMAX, BV, ST>;
  if constexpr (KMAX == 128 && BV == 16) {
    const int issue = wgmma_issue_wanted();
    if (issue == 0) return launch_wgmma_chain<BV>(chunk_state_wgmma_kernel<T, KMAX, BV, ST, 0>, S::bytes(), a, s);
    if (issue == 1) return launch_wgmma_chain<BV>(chunk_state_wgmma_kernel<T, KMAX, BV, ST, 1>, S::bytes(), a, s);
  }
  launch_wgmma_chain<BV>(chunk_state_wgmma_kernel<T, KMAX, BV, ST>, S::bytes(), a, s);
}
template <typename T>
bool launch_state_wgmma(const ChunkedArgs& a, cudaStream_t s) {
  const int bv = state_wgmma_cols(a);
  if (bv == 0) return false;
  if (a.K == 64) {
    if (bv == 16) launch_state_wgmma_fixed<T, 64, 16>(a, s);
    else bv == 32 ? launch_state_wgmma_fixed<T, 64, 32>(a, s) : launch_state_wgmma_fixed<T, 64, 64>(a, s);
  } else {
    if (bv == 16) launch_state_wgmma_fixed<T, 128, 16>(a, s);
    else bv == 32 ? launch_state_wgmma_fixed<T, 128, 32>(a, s) : launch_state_wgmma_fixed<T, 128, 64>(a, s);
  }
  return true;
}

// Stage 2 unfused (the forward on few long sequences, and the backward's recomputation), hi + lo
// products: single-fragment ones (kSingle, FLASHGRAD_CHUNKED_STATE_PRODUCTS=single in session 9) saved
// nothing in run 9.2 (B8 T4096 0.520 -> 0.513 ms, B1 T32768 1.768 -> 1.861), so they stay the fused
// forward's alone. Session 11 timed them again: single-fragment products are now the default of the
// channel-split shape (state_products_single, chunked_stages.h).
template <typename T>
void launch_chunk_state(const ChunkedArgs& a, cudaStream_t s) {
  check_chunked_args("chunked delta rule (state)", dtype_of<T>(), a);
  // Runs for empty sequences too: their final state is the initial state.
  if (a.num_seqs == 0 || a.HV == 0) return;
  if (launch_state_wgmma<T>(a, s)) return;
  const StateShape shape = state_shape(a);
  const bool single = state_products_single(shape == StateShape::channel_split);
  switch (shape) {
    case StateShape::four_warps:
      if (single)
        a.K == 64 ? launch_state_fixed<T, 64, 4, false, 1, true>(a, s) : launch_state_fixed<T, 128, 4, false, 1, true>(a, s);
      else
        a.K == 64 ? launch_state_fixed<T, 64, 4>(a, s) : launch_state_fixed<T, 128, 4>(a, s);
      break;
    case StateShape::two_warps:
      a.K == 64 ? launch_state_fixed<T, 64, 2>(a, s) : launch_state_fixed<T, 128, 2>(a, s);
      break;
    case StateShape::channel_split:
      if (single)
        a.K == 64 ? launch_state_fixed<T, 64, 2, false, 2, true>(a, s)
                  : launch_state_fixed<T, 128, 2, false, 2, true>(a, s);
      else
        a.K == 64 ? launch_state_fixed<T, 64, 2, false, 2>(a, s) : launch_state_fixed<T, 128, 2, false, 2>(a, s);
      break;
    case StateShape::eight_warps:
      a.K == 64 ? launch_state_fixed<T, 64, 8>(a, s) : launch_state_fixed<T, 128, 8>(a, s);
      break;
  }
}

template <typename T>
bool launch_chunk_state_with_output(const ChunkedArgs& a, cudaStream_t s) {
  if (!fused_output_wanted(a)) return false;
  // (no h: the fused kernel writes none; v_new only when the forward keeps it)
  check_chunked_args("chunked delta rule (state and output)", dtype_of<T>(), a, StageUses{true, a.keep_v_new, false});
  if (a.num_seqs == 0 || a.HV == 0) return true;
  // Single-fragment products (chunk_state_kernel's kSingle) unless FLASHGRAD_CHUNKED_FWD_SPLIT=1
  // (read per call): the hi + lo kernel of session 6, for same-process comparisons.
  const char* env = std::getenv("FLASHGRAD_CHUNKED_FWD_SPLIT");
  const bool split = env && std::string(env) == "1";
  if (a.K == 64)
    split ? launch_state_fixed<T, 64, 8, true, 1, false>(a, s) : launch_state_fixed<T, 64, 8, true, 1, true>(a, s);
  else
    split ? launch_state_fixed<T, 128, 8, true, 1, false>(a, s) : launch_state_fixed<T, 128, 8, true, 1, true>(a, s);
  return true;
}

template <typename T>
void launch_chunk_output(const ChunkedArgs& a, cudaStream_t s) {
  check_chunked_args("chunked delta rule (output)", dtype_of<T>(), a);
  if (a.num_chunks == 0 || a.HV == 0) return;
  const bool single = a.h16 != nullptr;  // (check_chunked_args: h or h16, not both)
  if (a.K == 64)
    single ? launch_output_fixed<T, 64, true>(a, s) : launch_output_fixed<T, 64, false>(a, s);
  else
    single ? launch_output_fixed<T, 128, true>(a, s) : launch_output_fixed<T, 128, false>(a, s);
}

template <typename T>
void launch_chunk_state_backward(const ChunkedArgs& a, cudaStream_t s) {
  const char* stage = "chunked delta rule (state backward)";
  check_chunked_args(stage, dtype_of<T>(), a);
  if (!a.dout.p || !(a.dh || a.dh16) || !(a.dv_new || a.dv_new16))
    throw_invalid_argument(stage, "scratch", "dout, dh and dv_new must be given");
  if (a.num_seqs == 0 || a.HV == 0) return;  // empty sequences still write dh0 = dht
  if (a.K == 64)
    launch_state_backward_fixed<T, 64>(a, s);
  else
    launch_state_backward_fixed<T, 128>(a, s);
}

template <typename T, int KMAX, int WARPS>
void launch_grads_warps(const ChunkedArgs& a, cudaStream_t s) {
  constexpr int64_t bytes = GradsSmem<KMAX>::bytes();
  set_smem(chunk_grads_kernel<T, KMAX, WARPS>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV));
  chunk_grads_kernel<T, KMAX, WARPS><<<grid, 32 * WARPS, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}
// B2 on bf16 / fp16 tensor cores with ldmatrix fragments (chunked_grads_mma.cuh, session 5).
// kHalf (session 6): 3 = h, dh and dv_new in 16 bits (a.h16 set), 0 = all fp32.
template <typename T, int KMAX, int kHalf>
void launch_grads_mma_half(const ChunkedArgs& a, cudaStream_t s) {
  constexpr int64_t bytes = GradsMmaSmem<T, KMAX>::bytes();
  set_smem(chunk_grads_mma_kernel<T, KMAX, kHalf>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV));
  chunk_grads_mma_kernel<T, KMAX, kHalf><<<grid, 256, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}
// B2 as two kernels (chunked_grads_split.cuh, session 7): B2a (h / dh products; writes dq_s, dk_s,
// dw into dv's first K columns, dG_state), then B2b (chunk-local products and the outputs).
// kItems = 1: one (chunk, value head) per 8-warp block; 2 (FLASHGRAD_CHUNKED_B2=split2, even HV): value
// heads 2 y, 2 y + 1 in one 16-warp block.
template <typename T, int KMAX, int kItems>
void launch_grads_split_items(const ChunkedArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.num_chunks), static_cast<unsigned>(a.HV / kItems));
  if constexpr (kItems == 1) {
    // The variant FLASHGRAD_CHUNKED_B2_SPLIT picks where V == K (chunked_grads_split_variants.cuh), else v1.
    const SplitVariant variant = a.V == KMAX ? split_variant() : SplitVariant::kV1;
    for_split_kernels<T, KMAX>(variant, [&](auto kernel, int64_t bytes, int threads) {
      set_smem(kernel, bytes);
      kernel<<<grid, threads, bytes, s>>>(a);
      FLASHGRAD_CUDA_CHECK_LAUNCH();
    });
  } else {
    constexpr int64_t bytes_a = kItems * GradsStateSmem<T, KMAX>::bytes(),
                      bytes_b = kItems * GradsLocalSmem<T, KMAX>::bytes();
    set_smem(chunk_grads_state_kernel<T, KMAX, kItems>, bytes_a);
    chunk_grads_state_kernel<T, KMAX, kItems><<<grid, 256 * kItems, bytes_a, s>>>(a);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
    set_smem(chunk_grads_local_kernel<T, KMAX, kItems>, bytes_b);
    chunk_grads_local_kernel<T, KMAX, kItems><<<grid, 256 * kItems, bytes_b, s>>>(a);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
}
template <typename T, int KMAX>
void launch_grads_split(const ChunkedArgs& a, cudaStream_t s) {
  if (a.HV % 2 == 0 && split_grads_paired_wanted())
    launch_grads_split_items<T, KMAX, 2>(a, s);
  else
    launch_grads_split_items<T, KMAX, 1>(a, s);
}
// Whether the split B2 can run these arguments (see split_grads_wanted): 16-bit intermediates, direct
// outputs with H == HV (dq_out), V >= K, dG_state with a gate, and every view it reads or writes by
// rows of 16-byte pieces (unit inner stride, 16-byte aligned base and strides: its kernels carry no
// element-by-element fallbacks; the fused B2 takes the rest).
inline bool split_grads_applies(const ChunkedArgs& a) {
  if (!(a.h16 && a.dv_out.p && a.dq_out.p && a.dk_out.p && a.V >= a.K && (!a.g.p || a.dG_state))) return false;
  for (const View* x : {&a.q, &a.k, &a.v, &a.dout, &a.dv_out, &a.dq_out, &a.dk_out})
    if (!key_rows_vectorizable(*x)) return false;
  return split_grads_wanted();
}
template <typename T, int KMAX>
void launch_grads_mma(const ChunkedArgs& a, cudaStream_t s) {
  if (split_grads_applies(a))
    launch_grads_split<T, KMAX>(a, s);
  else if (a.h16)
    launch_grads_mma_half<T, KMAX, 3>(a, s);
  else
    launch_grads_mma_half<T, KMAX, 0>(a, s);
}
template <typename T, int KMAX>
void launch_grads_fixed(const ChunkedArgs& a, cudaStream_t s) {
  // The TF32 B2s read fp32 intermediates and write the accumulators only.
  const bool mma = !legacy_backward_wanted() && mma_grads_wanted();
  if (!mma && (a.h16 || a.dv_out.p))
    throw_invalid_argument("chunked delta rule (grads)", "scratch",
                           "16-bit intermediates and direct outputs need the mma B2 (FLASHGRAD_CHUNKED_B2=mma)");
  if (legacy_backward_wanted())
    launch_grads_warps<T, KMAX, 4>(a, s);
  else if (mma_grads_wanted())
    launch_grads_mma<T, KMAX>(a, s);
  else
    launch_grads_warps<T, KMAX, 8>(a, s);
}

template <typename T>
void launch_chunk_grads(const ChunkedArgs& a, cudaStream_t s) {
  const char* stage = "chunked delta rule (grads)";
  check_chunked_args(stage, dtype_of<T>(), a);
  // Intermediates: fp32 (h, dh, dv_new) or all three in 16 bits (h16, dh16, dv_new16). Outputs: the
  // accumulators, or direct (dv_out, dbeta_out, dg_out; with H == HV also dq_out, dk_out).
  const bool half = a.h16 != nullptr, direct = a.dv_out.p != nullptr, direct_qk = a.dq_out.p != nullptr;
  const bool inter_ok = half ? (a.dh16 && a.dv_new16) : (a.h && a.dh && a.dv_new);
  const bool out_ok = (direct ? (a.dbeta_out.p && (!a.g.p || a.dg_out.p)) : (a.dv && a.dbeta && (!a.g.p || a.dg))) &&
                      (direct_qk ? (direct && a.dk_out.p && a.H == a.HV) : (a.dq_acc && a.dk_acc));
  if (!a.dout.p || !a.A || !inter_ok || !out_ok)
    throw_invalid_argument(stage, "scratch",
                           "dout, A, dh, dv_new (all fp32 or all 16-bit) and the outputs (dq_acc, dk_acc, dv, dbeta, "
                           "dg, or direct: dv_out, dbeta_out, dg_out, and dq_out, dk_out only with H == HV) must be given");
  if (a.num_chunks == 0 || a.HV == 0) return;
  if (a.K == 64)
    launch_grads_fixed<T, 64>(a, s);
  else
    launch_grads_fixed<T, 128>(a, s);
}

template <typename T>
void launch_chunk_dv_finish(const ChunkedArgs& a, View dv, int64_t batch, cudaStream_t s) {
  const int64_t n = batch * a.T * a.HV * a.V;
  if (n == 0) return;
  if (!a.dv || !dv.p) throw_invalid_argument("chunked delta rule (dv finish)", "dv", "must be given");
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  // [B, T, HV, V] with inner = V; no per-sequence constant.
  gate_grad_finish_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, s>>>(dv, a.dv, nullptr, nullptr, 0, batch,
                                                                          a.T, a.HV, a.V);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// dq, dk with direct outputs and GVA (H < HV): B2 added each group's value heads into dq_acc, dk_acc
// (fp32 [rows, H, K]); the L2-norm backward and the rounding into the views dq, dk ([B, T, H, K]).
template <typename T>
void launch_chunk_qk_finish(const ChunkedArgs& a, View dq, View dk, int64_t batch, cudaStream_t s) {
  const int64_t rows = batch * a.T * a.H;
  if (rows == 0) return;
  if (!a.dq_acc || !a.dk_acc || !dq.p || !dk.p)
    throw_invalid_argument("chunked delta rule (dq, dk finish)", "dq", "accumulators and views must be given");
  // One warp per row, 8 rows per block, at most 65536 blocks (a grid-stride loop covers the rest).
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, 65536));
  qk_grad_finish_kernel<T><<<blocks, 256, 0, s>>>(a.q, dq, a.dq_acc, batch, a.T, a.H, a.K, a.l2norm);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
  qk_grad_finish_kernel<T><<<blocks, 256, 0, s>>>(a.k, dk, a.dk_acc, batch, a.T, a.H, a.K, a.l2norm);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

#define FLASHGRAD_CHUNKED_INSTANTIATE(T)                                  \
  template void launch_chunk_prepare<T>(const ChunkedArgs&, cudaStream_t); \
  template void launch_chunk_state<T>(const ChunkedArgs&, cudaStream_t);   \
  template bool launch_chunk_state_with_output<T>(const ChunkedArgs&, cudaStream_t); \
  template void launch_chunk_output<T>(const ChunkedArgs&, cudaStream_t);  \
  template void launch_chunk_state_backward<T>(const ChunkedArgs&, cudaStream_t); \
  template void launch_chunk_grads<T>(const ChunkedArgs&, cudaStream_t);           \
  template void launch_chunk_dv_finish<T>(const ChunkedArgs&, View, int64_t, cudaStream_t); \
  template void launch_chunk_qk_finish<T>(const ChunkedArgs&, View, View, int64_t, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
