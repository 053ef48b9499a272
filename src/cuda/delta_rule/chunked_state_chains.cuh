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
//     each warp 64 channels of the same 16 value columns); warps 6-7 leave at once
//   (kB1Warps below: the other pairing).
// Both use blockIdx as their own kernels do (x: sequence, y: value head, z: 16-column slice) and
// threadIdx.x as their thread index; each synchronizes at its own named barrier (1: B1 over 128
// threads, 2: stage 2 over 64; chunked_stage_sync.cuh). Shared memory: B1's layout, then stage 2's.
#pragma once

#include "chunked_state.cuh"
#include "chunked_state_backward_transposed.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// kB1Warps: 4 (the default) B1's channel quarters on warps 0-3 (block 128 x 2) and stage 2 on warps
// 4-5, so sub-partitions 0 and 1 run both chains' code; 2 (FLASHGRAD_CHUNKED_STATE_CHAINS=halves, an
// experiment of session 11) B1's channel halves on warps 0-1 and stage 2 on warps 2-3 (block 64 x 2):
// each sub-partition (warp % 4) then runs one chain's code only (run 11.1's ncu of the quarter pairing:
// 16% of the stall samples waiting for instructions), at twice B1's channels per warp.
template <typename T, int kB1Warps = 4>
struct StateChainsLayout {
  static constexpr int KMAX = 128, kB1Split = kB1Warps, kStateWarps = 2, kStateSplit = 2;
  static constexpr int kRowThreads = 32 * kB1Warps;  // blockDim.x; blockDim.y = 2
  using B1 = StateBackwardTSmem<T, KMAX, kB1Warps, /*kLocal=*/true, kB1Split>;
  using S2 = StateSmem<T, KMAX, kStateWarps, /*kOutput=*/false, kStateSplit>;
  static_assert(kB1Warps == 4 || kB1Warps == 2, "B1 in channel quarters or halves");
  static_assert(B1::BV == 16 && S2::BV == 16, "one grid for both: 16 value columns per block");
  static constexpr int64_t kStateOffset = (B1::bytes() + 127) / 128 * 128;
  static constexpr int64_t bytes() { return kStateOffset + S2::bytes(); }
  static_assert(bytes() <= 227 * 1024, "both layouts in one SM's shared memory");
};

// kStateSingle (FLASHGRAD_CHUNKED_STATE_CHAINS=single, an experiment of session 11): stage 2's products
// with single-fragment operands (h^T, v_new^T rounded to T, as the fused forward and fla take them):
// fewer instructions on its chain and less code beside B1's.
template <typename T, int kB1Warps = 4, bool kStateSingle = false>
__global__ void __launch_bounds__(64 * kB1Warps, 1) chunk_state_chains_kernel(ChunkedArgs a) {
  using L = StateChainsLayout<T, kB1Warps>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (threadIdx.y == 0)
    chunk_state_backward_transposed_body<T, L::KMAX, kB1Warps, /*kSplit=*/false, /*kLocal=*/true, L::kB1Split,
                                         /*kBar=*/1>(a, smem_raw);
  else if (threadIdx.x < 32 * L::kStateWarps)
    chunk_state_body<T, L::KMAX, L::kStateWarps, /*kOutput=*/false, L::kStateSplit, kStateSingle, /*kBar=*/2>(
        a, smem_raw + L::kStateOffset);
}

}  // namespace flashgrad::cuda_detail::delta_rule
