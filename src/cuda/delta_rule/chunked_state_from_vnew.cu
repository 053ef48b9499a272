// Host launcher of chunk_state_from_vnew_kernel (chunked_state_from_vnew.cuh; declared in
// chunked_stages.h), bf16 and fp16, K = 64 and 128.
#include "chunked_launch_impl.cuh"
#include "chunked_state_from_vnew.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX>
void launch_state_from_vnew_fixed(const ChunkedArgs& a, cudaStream_t s) {
  constexpr int64_t bytes = FromVnewSmem<T, KMAX>::bytes();
  set_smem(chunk_state_from_vnew_kernel<T, KMAX>, bytes);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV),
                  static_cast<unsigned>(a.V / FromVnewSmem<T, KMAX>::BV));
  chunk_state_from_vnew_kernel<T, KMAX><<<grid, kFromVnewThreads, bytes, s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_chunk_state_from_vnew(const ChunkedArgs& a, cudaStream_t s) {
  check_chunked_args("chunked delta rule (states from v_new)", dtype_of<T>(), a);
  // Runs for empty sequences too: their final state is the initial state.
  if (a.num_seqs == 0 || a.HV == 0) return;
  a.K == 64 ? launch_state_from_vnew_fixed<T, 64>(a, s) : launch_state_from_vnew_fixed<T, 128>(a, s);
}

template void launch_chunk_state_from_vnew<__nv_bfloat16>(const ChunkedArgs&, cudaStream_t);
template void launch_chunk_state_from_vnew<__half>(const ChunkedArgs&, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
