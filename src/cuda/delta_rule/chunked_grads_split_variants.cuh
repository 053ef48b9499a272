// The split B2's kernel variants (session 11, helper gdnb2s; docs/perf/delta_rule.md "GDN B2, session 11
// (helper gdnb2s)"): which B2a / B2b pair runs, chosen in one place for the launcher
// (chunked_launch_impl.cuh) and the host emulation (chunked_emulation/harness.cc).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "chunked_grads_split.cuh"
#include "chunked_grads_state_wgmma.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Which kernels the split B2 runs where V == K (FLASHGRAD_CHUNKED_B2_SPLIT, read per call so that one
// process can time them all): unset = kSplitDefault ("wg" since session 19); "wg" = B2a on wgmma
// (chunk_grads_state_wgmma_kernel, chunked_grads_state_wgmma.cuh; K = V = 64 or 128) and B2b
// chunk_grads_local_kernel<.., kVersion = 6>; "v6" = the same B2b after B2a by
// chunk_grads_state_coalesced_kernel (mma.sync, resident tiles, whole-sector state loads; the default
// from session 12 to 19); "v5" = v6's B2a, B2b with kVersion = 5 (32-column slices, pass 1 unrolled,
// dq's state part loaded a phase earlier; the default from run 11.3 to session 12); "v1" = the session-7
// kernels (which also run every V != K case). ("wge", wg with q's and k's pairs loaded before the
// copies' waits, was timed in run 20.1 no faster than wg (B2a 0.544 against 0.542 ms at B8, 0.539
// against 0.530 at T32768): retired in session 20. Session 11's "resident", "v2", "v3", "v4" were
// measured slower than v5 in runs 11.2 / 11.3, "v7" (v6 without the early dq load) no faster in run
// 12.0: retired in session 12. Those names, as any other value, give the default.)
enum class SplitVariant { kV1, kV5, kV6, kWg };
// The default where V == K: wg since session 19 (run 19.1, B8 T4096 H16 K = V = 128 bf16, B2a per call
// against v6's: 0.625 -> 0.540 ms, B1 T32768 0.616 -> 0.525; gradients within 3.3e-6 rel RMS of v6's;
// the chunked GDN GPU tests pass with it). v6 from session 12 (B2b per call against v5: run 12.0
// K = V = 128 0.893 -> 0.879 ms; run 12.2 K = V = 128 0.894 -> 0.878, K = V = 64 0.613 -> 0.580).
// v5 was the default from run 11.3 (B2 against v1: K = V = 128 1.848 -> 1.520 ms, 64 1.056 -> 0.890).
constexpr SplitVariant kSplitDefault = SplitVariant::kWg;
inline SplitVariant split_variant() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2_SPLIT");
  const std::string v = env ? env : "";
  if (v == "v1") return SplitVariant::kV1;
  if (v == "v5") return SplitVariant::kV5;
  if (v == "v6") return SplitVariant::kV6;
  if (v == "wg") return SplitVariant::kWg;
  return kSplitDefault;
}

// B2a, then B2b of a variant (one item per block) as f(kernel, dynamic shared bytes, threads per block):
// the launcher launches them on a chunks x HV grid, the emulation runs them. Variants other than kV1
// need V == K.
template <typename T, int KMAX, typename F>
void for_split_kernels(SplitVariant v, F&& f) {
  if (v == SplitVariant::kV1) {
    f(chunk_grads_state_kernel<T, KMAX, 1>, GradsStateSmem<T, KMAX>::bytes(), 256);
    f(chunk_grads_local_kernel<T, KMAX, 1>, GradsLocalSmem<T, KMAX>::bytes(), 256);
    return;
  }
  using W = GradsStateWgmmaSmem<T, KMAX>;
  if (v == SplitVariant::kWg) {
    f(chunk_grads_state_wgmma_kernel<T, KMAX>, W::bytes(), W::kThreads);
  } else {
    f(chunk_grads_state_coalesced_kernel<T, KMAX>, GradsStateCoalescedSmem<T, KMAX>::bytes(), 256);
  }
  constexpr int64_t kLocal = GradsLocalSmem<T, KMAX, 32>::bytes();
  if (v == SplitVariant::kV5)
    f(chunk_grads_local_kernel<T, KMAX, 1, 5>, kLocal, 256);
  else
    f(chunk_grads_local_kernel<T, KMAX, 1, 6>, kLocal, 256);
}

}  // namespace flashgrad::cuda_detail::delta_rule
