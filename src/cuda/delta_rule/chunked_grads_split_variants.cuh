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
// process can time them all): unset = kSplitDefault (v6 since session 12); "v1" = the session-7
// kernels (which also run every V != K case); "v5" = B2a by chunk_grads_state_coalesced_kernel
// (resident tiles, whole-sector state loads), B2b chunk_grads_local_kernel<.., kVersion = 5> (32-column
// slices, pass 1 unrolled, dq's state part loaded a phase earlier; the default from run 11.3 to session
// 12); "v6" = v5 with B2b's row norms after pass 1's first products (kVersion = 6). (Session 11's
// "resident", "v2", "v3", "v4" were measured slower than v5 in runs 11.2 / 11.3, "v7" (v6 without the
// early dq load) no faster in run 12.0: retired in session 12; those names, as any other value, give
// the default.) "wg" (session 19, opt-in until timed) = v6 with B2a on wgmma
// (chunk_grads_state_wgmma_kernel, chunked_grads_state_wgmma.cuh) where K = V = 128; K = V = 64 keeps
// the coalesced B2a (wgmma at N = 32 not instantiated).
enum class SplitVariant { kV1, kV5, kV6, kWg };
// The default where V == K: v6 since session 12 (B8 T4096 H16 bf16, B2b per call against v5: run 12.0
// K = V = 128 0.893 -> 0.879 ms; run 12.2 K = V = 128 0.894 -> 0.878, K = V = 64 0.613 -> 0.580; the
// chunked GDN GPU tests pass with it (run 12.2); gradients as v5's, within 2.0e-5 relative RMS of v1's).
// v5 was the default from run 11.3 (B2 against v1: K = V = 128 1.848 -> 1.520 ms, 64 1.056 -> 0.890).
constexpr SplitVariant kSplitDefault = SplitVariant::kV6;
inline SplitVariant split_variant() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2_SPLIT");
  const std::string v = env ? env : "";
  if (v == "v1") return SplitVariant::kV1;
  if (v == "v5") return SplitVariant::kV5;
  if (v == "v6") return SplitVariant::kV6;
  if (v == "wg") return SplitVariant::kWg;
  return kSplitDefault;
}

// B2a, then B2b of a variant (one item per block) as f(kernel, dynamic shared bytes): the launcher
// launches them on a chunks x HV grid of 256 threads, the emulation runs them. Variants other than kV1
// need V == K.
template <typename T, int KMAX, typename F>
void for_split_kernels(SplitVariant v, F&& f) {
  if (v == SplitVariant::kV1) {
    f(chunk_grads_state_kernel<T, KMAX, 1>, GradsStateSmem<T, KMAX>::bytes());
    f(chunk_grads_local_kernel<T, KMAX, 1>, GradsLocalSmem<T, KMAX>::bytes());
    return;
  }
  if constexpr (KMAX == 128) {
    if (v == SplitVariant::kWg)
      f(chunk_grads_state_wgmma_kernel<T, KMAX>, GradsStateWgmmaSmem<T, KMAX>::bytes());
    else
      f(chunk_grads_state_coalesced_kernel<T, KMAX>, GradsStateCoalescedSmem<T, KMAX>::bytes());
  } else {
    f(chunk_grads_state_coalesced_kernel<T, KMAX>, GradsStateCoalescedSmem<T, KMAX>::bytes());
  }
  constexpr int64_t kLocal = GradsLocalSmem<T, KMAX, 32>::bytes();
  if (v == SplitVariant::kV6 || v == SplitVariant::kWg)
    f(chunk_grads_local_kernel<T, KMAX, 1, 6>, kLocal);
  else
    f(chunk_grads_local_kernel<T, KMAX, 1, 5>, kLocal);
}

}  // namespace flashgrad::cuda_detail::delta_rule
