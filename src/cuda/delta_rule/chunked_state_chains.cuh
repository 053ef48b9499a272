// The backward's two serial chains of chunks in one launch (session 11; state_chains_wanted in
// chunked_stages.h says where): stage 2's recomputation (chunked_state.cuh: h_c and v_new, over the
// chunks in order) and B1 (chunked_state_backward_transposed.cuh: dh and dv_new, over the chunks in
// reverse) read nothing the other writes, and at few long sequences each alone leaves its SM's
// schedulers ~70% idle (one warp each, latency-bound). Run side by side on two streams (session 10)
// they slowed each other: the block scheduler is free to put two stage-2 blocks on one SM, and a B1
// block that no longer fits beside them waits for a second wave. Here one block carries both, on
// separate warps, so every SM holds exactly one block of each:
//   threadIdx.y == 0 (warps 0-3): B1, local (B0's dv_local added; chunked_dv_local.cuh ran first),
//     key channels in quarters (KSPLIT 4: each warp 32 of K = 128 channels of 16 value columns);
//   threadIdx.y == 1, threadIdx.x < 64 (warps 4-5): stage 2 unfused, channel halves (KSPLIT 2:
//     each warp 64 channels of the same 16 value columns); warps 6-7 leave at once.
// Both use blockIdx as their own kernels do (x: sequence, y: value head, z: 16-column slice) and
// threadIdx.x as their thread index; each synchronizes at its own named barrier (1: B1 over 128
// threads, 2: stage 2 over 64; chunked_stage_sync.cuh). Shared memory: B1's layout, then stage 2's.
// Measured (H200, runs 11.1-11.3, B1 T32768 H16 K=V=128): the two chains 1.23 + 1.53 ms -> 2.34 ms in
// one launch (with kStateSingle), less than hoped: both hot loops (~2650 + ~2000 static instructions)
// run on one SM and evict each other from its instruction cache (ncu: 16% of the stall samples wait for
// instructions, a stall neither kernel has alone). docs/perf/delta_rule.md, "Session 11".
#pragma once

#include "chunked_state.cuh"
#include "chunked_state_backward_transposed.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T>
struct StateChainsLayout {
  static constexpr int KMAX = 128, kB1Warps = 4, kB1Split = 4, kStateWarps = 2, kStateSplit = 2;
  using B1 = StateBackwardTSmem<T, KMAX, kB1Warps, /*kLocal=*/true, kB1Split>;
  using S2 = StateSmem<T, KMAX, kStateWarps, /*kOutput=*/false, kStateSplit>;
  static_assert(B1::BV == 16 && S2::BV == 16, "one grid for both: 16 value columns per block");
  static constexpr int64_t kStateOffset = (B1::bytes() + 127) / 128 * 128;
  static constexpr int64_t bytes() { return kStateOffset + S2::bytes(); }
  static_assert(bytes() <= 227 * 1024, "both layouts in one SM's shared memory");
};

// kStateSingle (the default since run 11.2; FLASHGRAD_CHUNKED_STATE_CHAINS=exact keeps hi + lo): stage
// 2's products with single-fragment operands (h^T, v_new^T rounded to T, as the fused forward and fla
// take them): fewer instructions on its chain and less code beside B1's (run 11.2 at B1 T32768: 2.490
// -> 2.343 ms; the recomputed h and v_new then differ from the forward's hi + lo ones by the rounding:
// gradients within 1.1e-3 rel RMS of the exact pair's).
// (Run 11.2 also timed B1 in channel halves on warps 0-1 beside stage 2 on warps 2-3, so that each
// sub-partition ran one chain's code: slower, 2.780 ms, with 34% of the stall samples waiting for
// instructions against 16%: the instruction misses are not per sub-partition. Removed.)
template <typename T, bool kStateSingle = true>
__global__ void __launch_bounds__(256, 1) chunk_state_chains_kernel(ChunkedArgs a) {
  using L = StateChainsLayout<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (threadIdx.y == 0)
    chunk_state_backward_transposed_body<T, L::KMAX, L::kB1Warps, /*kSplit=*/false, /*kLocal=*/true, L::kB1Split,
                                         /*kBar=*/1>(a, smem_raw);
  else if (threadIdx.x < 32 * L::kStateWarps)
    chunk_state_body<T, L::KMAX, L::kStateWarps, /*kOutput=*/false, L::kStateSplit, kStateSingle, /*kBar=*/2>(
        a, smem_raw + L::kStateOffset);
}

}  // namespace flashgrad::cuda_detail::delta_rule
