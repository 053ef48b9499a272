// Host side of the FP8 wgmma backward: the switch, the tensor maps (fp8_wgmma_backward_maps.h), the
// launch. Grid: x = sequence * key blocks (key block fastest), y = kv head; one CTA per SM
// (~212 KB of shared memory at hd 128, ~197 KB at hd 256, ~115 KB at hd 64).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/common/cuda_check.h"
#include "fp8_wgmma_backward.h"
#include "fp8_wgmma_backward_kernel.cuh"
#include "fp8_wgmma_backward_maps.h"
#include "tma_map.h"

namespace flashgrad::cuda_attn {
namespace {

using fp8wb::Fp8WgmmaBackwardAxes;
using fp8wb::Fp8WgmmaBackwardConfig;
using fp8wb::Fp8WgmmaBackwardMaps;

template <typename T, int D, bool kLag = false>
void launch(const Fp8WgmmaBackwardMaps& maps, const Fp8KernelParams& f, const Fp8WgmmaBackwardAxes& axes,
            int nblocks, cudaStream_t stream) {
  using Cfg = Fp8WgmmaBackwardConfig<D, kLag>;
  auto kernel = fp8wb::fp8_attention_backward_wgmma_kernel<T, D, kLag>;
  FLASHGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(f.base.num_seqs) * nblocks),
                  static_cast<unsigned>(f.base.heads_k));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, f, axes, nblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool launch_fp8_backward_wgmma(const Fp8KernelParams& f, const AttentionProblem& pr, cudaStream_t stream) {
  // The default at hd 128 and 256 since the H200 run of 2026-11-30 (every AttentionFp8* case passed
  // with it, racecheck clean; 426 / 288 TFLOP/s against the mma.sync kernel's 165 / 92 at B2 H16
  // S8192); FLASHGRAD_ATTN_FP8_BACKWARD=mma (or legacy) selects the mma.sync kernel.
  const char* env = std::getenv("FLASHGRAD_ATTN_FP8_BACKWARD");
  if (env != nullptr && (std::strcmp(env, "mma") == 0 || std::strcmp(env, "legacy") == 0)) return false;
  // hd 256 may be turned off alone (FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD256=0). hd 64 (64-byte e4m3 rows,
  // SWIZZLE_64B: its tests passed on the H200, its speed is not measured yet) needs
  // FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD64=1.
  auto is = [](const char* name, const char* value) {
    const char* e = std::getenv(name);
    return e != nullptr && std::strcmp(e, value) == 0;
  };
  const int hd = static_cast<int>(pr.head_dim);
  if (hd != 128 && !(hd == 256 && !is("FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD256", "0")) &&
      !(hd == 64 && is("FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD64", "1")))
    return false;
  const int block_n = hd == 256 ? Fp8WgmmaBackwardConfig<256>::kBlockN : Fp8WgmmaBackwardConfig<128>::kBlockN;
  const int block_m = Fp8WgmmaBackwardConfig<128>::kBlockM;
  static_assert(Fp8WgmmaBackwardConfig<64>::kBlockN == Fp8WgmmaBackwardConfig<128>::kBlockN, "one key box at D <= 128");
  static_assert(Fp8WgmmaBackwardConfig<64>::kBlockM == Fp8WgmmaBackwardConfig<128>::kBlockM &&
                    Fp8WgmmaBackwardConfig<128>::kBlockM == Fp8WgmmaBackwardConfig<256>::kBlockM,
                "one query box");
  const int64_t nblocks = (pr.seqlen_k + block_n - 1) / block_n;
  if (nblocks == 0 || pr.num_seqs == 0 || pr.heads_k == 0 || pr.total_q == 0 || pr.total_k == 0) return false;
  if (pr.num_seqs * nblocks > 0x7fffffff || pr.heads_k > 65535) return false;
  const int64_t batches = pr.varlen ? 1 : pr.num_seqs;
  const int64_t rows_q = pr.varlen ? pr.total_q : pr.seqlen_q;
  const int64_t rows_k = pr.varlen ? pr.total_k : pr.seqlen_k;
  Fp8WgmmaBackwardMaps maps;
  Fp8WgmmaBackwardAxes axes;
  const fp8wb::MapSet set{&maps.q8, &maps.k8, &maps.v8, &maps.do8, &maps.q16, &maps.do16, &maps.k16,
                          &axes.q8, &axes.k8, &axes.v8, &axes.do8, &axes.q16, &axes.do16, &axes.k16,
                          &maps.dq};
  if (!fp8wb::make_backward_maps(tensor_map_encoder(), f, rows_q, rows_k, batches, hd, block_m, block_n, set))
    return false;
  const int nb = static_cast<int>(nblocks);
  // The lagged-dQ schedule (hd 128): FLASHGRAD_ATTN_FP8_WGMMA_BWD_LAG=1; off (timed on the H200: 428
  // vs 426 TFLOP/s non-causal, 340 vs 350 causal).
  const bool lag = is("FLASHGRAD_ATTN_FP8_WGMMA_BWD_LAG", "1");
  if (hd == 64)
    f.out_bf16 ? launch<__nv_bfloat16, 64>(maps, f, axes, nb, stream) : launch<__half, 64>(maps, f, axes, nb, stream);
  else if (hd == 128 && lag)
    f.out_bf16 ? launch<__nv_bfloat16, 128, true>(maps, f, axes, nb, stream)
               : launch<__half, 128, true>(maps, f, axes, nb, stream);
  else if (hd == 128)
    f.out_bf16 ? launch<__nv_bfloat16, 128>(maps, f, axes, nb, stream) : launch<__half, 128>(maps, f, axes, nb, stream);
  else
    f.out_bf16 ? launch<__nv_bfloat16, 256>(maps, f, axes, nb, stream) : launch<__half, 256>(maps, f, axes, nb, stream);
  return true;
}

}  // namespace flashgrad::cuda_attn
