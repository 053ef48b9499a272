// Host launcher of chunk_state_from_vnew_kernel (chunked_state_from_vnew.cuh; declared in
// chunked_stages.h), bf16 and fp16, K = 64 and 128.
#include "chunked_launch_impl.cuh"
#include "chunked_state_from_vnew.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int STAGES>
void launch_state_from_vnew_fixed(const ChunkedArgs& a, cudaStream_t s) {
  using S = FromVnewSmem<T, KMAX, STAGES>;
  constexpr int64_t bytes = S::bytes();
  set_smem(chunk_state_from_vnew_kernel<T, KMAX, STAGES>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / S::BV));
  chunk_state_from_vnew_kernel<T, KMAX, STAGES><<<grid, kFromVnewThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// Chunks in flight per block: 4 where the blocks fit the SMs about twice or less (few long chains:
// each block's loop over its chunks is the time, and it waits on its copies), else 2 (more blocks
// resident per SM: 41 against 83 KiB at K = 128). FLASHGRAD_CHUNKED_FROM_VNEW_STAGES=2 / 4 forces one
// (read per call, to time both in one process).
inline int from_vnew_stages(const ChunkedArgs& a) {
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_STAGES")) {
    if (std::string(env) == "2") return 2;
    if (std::string(env) == "4") return 4;
  }
  return a.num_seqs * a.HV * (a.V / 16) <= 2 * sm_count() ? 4 : 2;
}

template <typename T>
void launch_chunk_state_from_vnew(const ChunkedArgs& a, cudaStream_t s) {
  check_chunked_args("chunked delta rule (states from v_new)", dtype_of<T>(), a);
  // Runs for empty sequences too: their final state is the initial state.
  if (a.num_seqs == 0 || a.HV == 0) return;
  if (from_vnew_stages(a) == 4)
    a.K == 64 ? launch_state_from_vnew_fixed<T, 64, 4>(a, s) : launch_state_from_vnew_fixed<T, 128, 4>(a, s);
  else
    a.K == 64 ? launch_state_from_vnew_fixed<T, 64, 2>(a, s) : launch_state_from_vnew_fixed<T, 128, 2>(a, s);
}

template void launch_chunk_state_from_vnew<__nv_bfloat16>(const ChunkedArgs&, cudaStream_t);
template void launch_chunk_state_from_vnew<__half>(const ChunkedArgs&, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
