// Host launchers of chunk_state_from_vnew_kernel and chunk_state_from_vnew_seg_kernel
// (chunked_state_from_vnew.cuh; declared in chunked_stages.h), bf16 and fp16, K = 64 and 128.
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

// The session-12 kernel's chunks in flight per block: 4 where the blocks fit the SMs about twice or
// less (few long chains: each block's loop over its chunks is the time, and it waits on its copies),
// else 2 (more blocks resident per SM: 41 against 83 KiB at K = 128). FLASHGRAD_CHUNKED_FROM_VNEW_STAGES
// =2 / 4 forces one (read per call, to time both in one process); for the pipelined kernel, 4 forces
// 4 and anything else gives 3.
inline int from_vnew_stages(const ChunkedArgs& a) {
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_STAGES")) {
    if (std::string(env) == "2") return 2;
    if (std::string(env) == "4") return 4;
  }
  return a.num_seqs * a.HV * (a.V / 16) <= 2 * sm_count() ? 4 : 2;
}

// The pipelined, segmented kernel (session 13; chunk_state_from_vnew_seg_kernel). Segments P: where
// one block per (sequence, value head, 16 columns) leaves room on the SMs (few long sequences), each
// sequence's chunks are split so that the blocks of pass 2 about fill them once (occupancy query),
// bounded by the workspace (`ws_floats` floats: S and log D of P segments per chain, pass 1) and by
// the chunks per sequence. FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS=n forces n (tests of the segmented
// path at small sizes, timing).
template <typename T, int KMAX, int STAGES>
void launch_state_from_vnew_seg(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  using S = FromVnewSmem<T, KMAX, STAGES>;
  constexpr int64_t bytes = S::bytes();
  auto* pass1 = chunk_state_from_vnew_seg_kernel<T, KMAX, STAGES, false>;
  auto* pass2 = chunk_state_from_vnew_seg_kernel<T, KMAX, STAGES, true>;
  set_smem(pass1, bytes);
  set_smem(pass2, bytes);
  const int64_t chains = a.num_seqs * a.HV * (a.V / S::BV);
  int per_sm = 0;
  FLASHGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pass2, kFromVnewThreads,
                                                                     static_cast<size_t>(bytes)));
  int64_t P = std::max<int64_t>(1, static_cast<int64_t>(std::max(per_sm, 1)) * sm_count() / chains);
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS")) P = std::max(1, std::atoi(env));
  const int64_t chunks_per_seq = (a.num_chunks + a.num_seqs - 1) / a.num_seqs;
  P = std::min<int64_t>({P, std::max<int64_t>(chunks_per_seq, 1), ws_floats / (a.num_seqs * a.HV * (a.K * a.V + 1))});
  P = std::max<int64_t>(P, 1);
  const auto blocks_x = static_cast<unsigned>(a.num_seqs * P);
  const dim3 grid(blocks_x, static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / S::BV));
  if (P > 1) {
    pass1<<<grid, kFromVnewThreads, bytes, s>>>(a, static_cast<int>(P), ws);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  pass2<<<grid, kFromVnewThreads, bytes, s>>>(a, static_cast<int>(P), P > 1 ? ws : nullptr);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_chunk_state_from_vnew(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  check_chunked_args("chunked delta rule (states from v_new)", dtype_of<T>(), a);
  // Runs for empty sequences too: their final state is the initial state.
  if (a.num_seqs == 0 || a.HV == 0) return;
  const char* kernel = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_KERNEL");
  if (kernel && std::string(kernel) == "1") {  // the session-12 kernel
    if (from_vnew_stages(a) == 4)
      a.K == 64 ? launch_state_from_vnew_fixed<T, 64, 4>(a, s) : launch_state_from_vnew_fixed<T, 128, 4>(a, s);
    else
      a.K == 64 ? launch_state_from_vnew_fixed<T, 64, 2>(a, s) : launch_state_from_vnew_fixed<T, 128, 2>(a, s);
    return;
  }
  // 3 chunks in shared memory (the one in use, the next one, one in flight); 4 by
  // FLASHGRAD_CHUNKED_FROM_VNEW_STAGES=4.
  if (from_vnew_stages(a) == 4)
    a.K == 64 ? launch_state_from_vnew_seg<T, 64, 4>(a, ws, ws_floats, s)
              : launch_state_from_vnew_seg<T, 128, 4>(a, ws, ws_floats, s);
  else
    a.K == 64 ? launch_state_from_vnew_seg<T, 64, 3>(a, ws, ws_floats, s)
              : launch_state_from_vnew_seg<T, 128, 3>(a, ws, ws_floats, s);
}

template void launch_chunk_state_from_vnew<__nv_bfloat16>(const ChunkedArgs&, float*, int64_t, cudaStream_t);
template void launch_chunk_state_from_vnew<__half>(const ChunkedArgs&, float*, int64_t, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
