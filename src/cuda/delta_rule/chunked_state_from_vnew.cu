// Host launcher of the states rebuilt from v_new (launch_chunk_state_from_vnew, declared in
// chunked_stages.h), bf16 and fp16, K = 64 and 128: the wide kernels (chunked_state_from_vnew_wide.cuh,
// the default since session 15) or the chain kernel (chunk_state_from_vnew_seg_kernel,
// chunked_state_from_vnew.cuh; FLASHGRAD_CHUNKED_FROM_VNEW=chain).
#include "chunked_launch_impl.cuh"
#include "chunked_state_from_vnew.cuh"
#include "chunked_state_from_vnew_wide.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// The chain kernel: 3 stages, WV x 16 value columns per block (4 warps each). Run 13.1 (16 columns per block): ~0.55 ms per pass at B8
// T4096 and at B1 T32768 in 8 segments whatever the occupancy: bound by the copies, k's rows being
// read once per 16 columns (8 times per chain at V = 128). WV = 4 reads them once per 64.
// Segments P: where the blocks leave room on the SMs (few long sequences), each sequence's chunks are
// split so that pass 2's blocks about fill them once (occupancy query), bounded by the workspace
// (`ws_floats` floats: S and log D of P segments per chain, pass 1) and by the chunks per sequence.
// FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS=n forces n, FLASHGRAD_CHUNKED_FROM_VNEW_WV=1 / 2 / 4 the width
// (read per call: tests of the segmented path at small sizes, timing).
template <typename T, int KMAX, int WV, bool kSingle = false>
void launch_state_from_vnew_seg(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  constexpr int STAGES = 3, THREADS = kFromVnewThreads * WV;
  using S = FromVnewSmem<T, KMAX, STAGES, 16 * WV>;
  // + the warps' h_c staging tiles (store_state_tiles_staged)
  constexpr int64_t bytes = S::bytes() + static_cast<int64_t>(sizeof(T)) * kFromVnewStageElems * 4 * WV;
  auto* pass1 = chunk_state_from_vnew_seg_kernel<T, KMAX, STAGES, WV, false, kSingle>;
  auto* pass2 = chunk_state_from_vnew_seg_kernel<T, KMAX, STAGES, WV, true, kSingle>;
  set_smem(pass1, bytes);
  set_smem(pass2, bytes);
  const int64_t chains = a.num_seqs * a.HV * (a.V / S::BV);
  int per_sm = 0;
  FLASHGRAD_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pass2, THREADS, static_cast<size_t>(bytes)));
  int64_t P = std::max<int64_t>(1, static_cast<int64_t>(std::max(per_sm, 1)) * sm_count() / chains);
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS")) P = std::max(1, std::atoi(env));
  const int64_t chunks_per_seq = (a.num_chunks + a.num_seqs - 1) / a.num_seqs;
  P = std::min<int64_t>({P, std::max<int64_t>(chunks_per_seq, 1), ws_floats / (a.num_seqs * a.HV * (a.K * a.V + 1))});
  P = std::max<int64_t>(P, 1);
  const dim3 grid(static_cast<unsigned>(a.num_seqs * P), static_cast<unsigned>(a.HV),
                  static_cast<unsigned>(a.V / S::BV));
  if (P > 1) {
    pass1<<<grid, THREADS, bytes, s>>>(a, static_cast<int>(P), ws);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  pass2<<<grid, THREADS, bytes, s>>>(a, static_cast<int>(P), P > 1 ? ws : nullptr);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// 64 value columns per block where V allows (every V the chunked stages take is a multiple of 64).
inline int from_vnew_width(const ChunkedArgs& a) {
  int wv = a.V % 64 == 0 ? 4 : (a.V % 32 == 0 ? 2 : 1);
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_WV")) {
    const int want = std::atoi(env);
    if ((want == 1 || want == 2 || want == 4) && a.V % (16 * want) == 0) wv = want;
  }
  return wv;
}

// The products' A operand: hi + lo (the scaled v_new kept to ~16 bits), unless
// FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single (read per call): one 16-bit fragment, half the mmas.
// Single was the default from run 14.3 (H200: per pass 0.318 -> 0.293 ms at B1 T32768 with the chain
// kernel; gradients within 8.4e-4 rel RMS of hi + lo) to session 15, when the host emulation's
// comparison with a float64 rebuild from the same inputs showed what it costs where the states grow:
// on the plain rule over 8 chunks without decay the rebuilt final state is 4.9e-3 rel RMS off with
// single products and 7e-6 with hi + lo, the h_c 5.02e-3 off the reference (bar 5e-3) against 4.09e-3.
inline bool from_vnew_single_products() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS");
  return env && std::string(env) == "single";
}

template <typename T, int KMAX>
void launch_state_from_vnew_seg_width(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  switch (from_vnew_width(a)) {
    case 4:
      if (from_vnew_single_products())
        launch_state_from_vnew_seg<T, KMAX, 4, true>(a, ws, ws_floats, s);
      else
        launch_state_from_vnew_seg<T, KMAX, 4>(a, ws, ws_floats, s);
      break;
    case 2: launch_state_from_vnew_seg<T, KMAX, 2>(a, ws, ws_floats, s); break;
    default: launch_state_from_vnew_seg<T, KMAX, 1>(a, ws, ws_floats, s); break;
  }
}

// The wide kernels (chunked_state_from_vnew_wide.cuh, session 15): WARPS x 16 value columns per block,
// each warp all K key channels; STAGES chunks in shared memory in pass 2, 3 in pass 1. Segments P:
// as the chain's, pass 2's blocks about filling the SMs once (occupancy query), bounded by the chunks
// per sequence and the workspace. Pass 1 (P > 1) cuts each segment but the last in R sub-segments:
// the R of fewest chunk steps per SM, waves x (chunks per sub-segment + 2) (the 2: a block's pipeline
// fill), R <= 32, within the workspace (S and log D of P R sub-segments per chain). (Run 15.1 took the
// R that filled the SMs once rounded up: 1.27 waves at B1 T32768.) FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS=n
// forces P, FLASHGRAD_CHUNKED_FROM_VNEW_SUBSEGMENTS=n forces R (tests, timing; the bounds still apply).
template <typename T, int KMAX, int WARPS, int STAGES, bool kSplit, bool kIncFirst = false>
void launch_state_from_vnew_wide(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  constexpr int THREADS = 32 * WARPS, BV = 16 * WARPS;
  const auto pass1 = chunk_from_vnew_sums_kernel<T, KMAX, 3, WARPS, kSplit>;
  const auto pass2 = chunk_state_from_vnew_wide_kernel<T, KMAX, STAGES, WARPS, kSplit, kIncFirst>;
  constexpr int64_t bytes1 = FromVnewWideSmem<T, KMAX, 3, WARPS>::bytes(false),
                    bytes2 = FromVnewWideSmem<T, KMAX, STAGES, WARPS>::bytes(true);
  set_smem(pass1, bytes1);
  set_smem(pass2, bytes2);
  const int64_t slices = a.num_seqs * a.HV * (a.V / BV), sms = sm_count();
  const int64_t chunks_per_seq = std::max<int64_t>((a.num_chunks + a.num_seqs - 1) / a.num_seqs, 1);
  const int64_t per_segment_floats = a.num_seqs * a.HV * (a.K * a.V + 1);
  auto fill = [&](auto kernel, int64_t bytes) {  // blocks that fit on the SMs at once
    int per_sm = 0;
    FLASHGRAD_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, static_cast<size_t>(bytes)));
    return static_cast<int64_t>(std::max(per_sm, 1)) * sms;
  };
  int64_t P = std::max<int64_t>(1, fill(pass2, bytes2) / slices);
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS")) P = std::max(1, std::atoi(env));
  P = std::max<int64_t>(1, std::min<int64_t>({P, chunks_per_seq, ws_floats / per_segment_floats}));
  int64_t R = 1;
  if (P > 1) {
    const int64_t per_r = slices * (P - 1), fill1 = fill(pass1, bytes1);
    const int64_t r_max = std::max<int64_t>(1, std::min<int64_t>(32, ws_floats / (per_segment_floats * P)));
    int64_t best = -1;
    for (int64_t r = 1; r <= r_max; ++r) {
      const int64_t steps = (per_r * r + fill1 - 1) / fill1 * ((chunks_per_seq + P * r - 1) / (P * r) + 2);
      if (best < 0 || steps < best) best = steps, R = r;
    }
    if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_SUBSEGMENTS"))
      R = std::min<int64_t>(r_max, std::max(1, std::atoi(env)));
    const dim3 grid1(static_cast<unsigned>(a.num_seqs * P * R), static_cast<unsigned>(a.HV),
                     static_cast<unsigned>(a.V / BV));
    pass1<<<grid1, THREADS, bytes1, s>>>(a, static_cast<int>(P), static_cast<int>(R), ws);
    FLASHGRAD_CUDA_CHECK_LAUNCH();
  }
  const dim3 grid2(static_cast<unsigned>(a.num_seqs * P), static_cast<unsigned>(a.HV), static_cast<unsigned>(a.V / BV));
  pass2<<<grid2, THREADS, bytes2, s>>>(a, static_cast<int>(P), static_cast<int>(R), P > 1 ? ws : nullptr);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// The wide kernel unless FLASHGRAD_CHUNKED_FROM_VNEW=chain (read per call: the chain kernel of
// sessions 13-14). Its width: 8 warps (128 value columns) where V % 128 == 0, else 4;
// FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_WARPS=4 forces 4 (timing).
inline bool from_vnew_wide() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW");
  return !(env && std::string(env) == "chain");
}
inline int from_vnew_wide_warps(const ChunkedArgs& a) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_WARPS");
  return a.V % 128 == 0 && !(env && std::string(env) == "4") ? 8 : 4;
}
template <typename T, int KMAX>
void launch_state_from_vnew_any(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  // 3 stages: run 15.2 timed 4 and 5 at 8 warps (one block per SM either way) no faster (pass 2 at B8
  // T4096 0.207 / 0.209 / 0.218 ms): the copies, issued one iteration ahead, are not what it waits on.
  // Products: FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS as for the chain (from_vnew_single_products).
  if (!from_vnew_wide()) return launch_state_from_vnew_seg_width<T, KMAX>(a, ws, ws_floats, s);
  const bool single = from_vnew_single_products();
  if (from_vnew_wide_warps(a) == 4)
    return single ? launch_state_from_vnew_wide<T, KMAX, 4, 3, false>(a, ws, ws_floats, s)
                  : launch_state_from_vnew_wide<T, KMAX, 4, 3, true>(a, ws, ws_floats, s);
  if (single) return launch_state_from_vnew_wide<T, KMAX, 8, 3, false>(a, ws, ws_floats, s);
  // Pass 2's products into fresh accumulators (kIncFirst) unless FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_INC=0
  // (read per call; 8 warps, hi + lo; run 15.4: 0.225 -> 0.216 ms at B8 T4096, 0.229 -> 0.212 at T32768).
  const char* inc = std::getenv("FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_INC");
  if (inc && std::string(inc) == "0") return launch_state_from_vnew_wide<T, KMAX, 8, 3, true>(a, ws, ws_floats, s);
  launch_state_from_vnew_wide<T, KMAX, 8, 3, true, true>(a, ws, ws_floats, s);
}

template <typename T>
void launch_chunk_state_from_vnew(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t s) {
  check_chunked_args("chunked delta rule (states from v_new)", dtype_of<T>(), a);
  // Runs for empty sequences too: their final state is the initial state.
  if (a.num_seqs == 0 || a.HV == 0) return;
  a.K == 64 ? launch_state_from_vnew_any<T, 64>(a, ws, ws_floats, s)
            : launch_state_from_vnew_any<T, 128>(a, ws, ws_floats, s);
}

template void launch_chunk_state_from_vnew<__nv_bfloat16>(const ChunkedArgs&, float*, int64_t, cudaStream_t);
template void launch_chunk_state_from_vnew<__half>(const ChunkedArgs&, float*, int64_t, cudaStream_t);

}  // namespace flashgrad::cuda_detail::delta_rule
