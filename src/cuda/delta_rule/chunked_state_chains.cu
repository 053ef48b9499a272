// Host launcher of the backward's B0 + (stage 2 beside B1) (chunked_state_chains.cuh), both dtypes.
#include "chunked_launch_impl.cuh"
#include "chunked_state_chains.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T>
void launch_chunk_state_chains(const ChunkedArgs& a, cudaStream_t s) {
  const char* stage = "chunked delta rule (state chains)";
  check_chunked_args(stage, dtype_of<T>(), a);
  if (a.K != 128 || a.V % 16 != 0 || !a.h16 || !a.dout.p || !a.dh16 || !a.dv_new16)
    throw_invalid_argument(stage, "scratch", "K = 128, V a multiple of 16, 16-bit h, dh and dv_new");
  if (a.dh16 == a.u || a.dv_new16 == a.w)
    throw_invalid_argument(stage, "scratch", "dh and dv_new need their own buffers (stage 2 reads u and w meanwhile)");
  if (a.num_seqs == 0 || a.HV == 0) return;
  // B0: dv_local = do^T (scale P) of every chunk into dv_new's buffer, which B1 reads and overwrites.
  if (a.num_chunks > 0) launch_dv_local<T, 128>(a, s);
  using L = StateChainsLayout<T>;
  const auto kernel = state_chains_exact_wanted() ? chunk_state_chains_kernel<T, false> : chunk_state_chains_kernel<T>;
  set_smem(kernel, L::bytes());
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / 16));
  kernel<<<grid, dim3(128, 2), L::bytes(), s>>>(a);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template void launch_chunk_state_chains<__nv_bfloat16>(const ChunkedArgs&, cudaStream_t);
template void launch_chunk_state_chains<__half>(const ChunkedArgs&, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
