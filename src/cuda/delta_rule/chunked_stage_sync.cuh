// The block barrier of a serial stage's body (stage 2, chunked_state.cuh; B1,
// chunked_state_backward_transposed.cuh). In the stage's own kernel the body owns the whole block and
// synchronizes with __syncthreads() (kBar == 0). Where two bodies share one block, each on its own
// warps (chunked_state_chains.cuh: stage 2's recomputation beside B1, so that the two independent
// serial chains of the backward hold one SM together), each body waits at its own named barrier kBar
// (1..15) counting only its kThreads threads, so neither waits for the other's warps.
#pragma once

namespace flashgrad::cuda_detail::delta_rule {

template <int kBar, int kThreads>
__device__ __forceinline__ void stage_sync() {
  static_assert(kBar >= 0 && kBar < 16 && kThreads % 32 == 0, "hardware barriers 0..15, whole warps");
  if constexpr (kBar == 0) {
    __syncthreads();
  } else {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
    // The host emulation (chunked_emulation/emulator.h) supplies one std::barrier per id.
    emu_named_barrier(kBar);
#else
    // bar.sync orders the participating threads' shared-memory accesses as __syncthreads does.
    asm volatile("bar.sync %0, %1;" ::"n"(kBar), "n"(kThreads) : "memory");
#endif
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
