// Host side of the wgmma backward: the TMA tensor maps of q, k, v, dO, the grid, the launch.
// Grid: x = sequence * key blocks (key block fastest, so under a causal mask the heaviest blocks,
// the first ones, start first), y = kv head. 128 keys per CTA (64 at D = 256), one CTA per SM
// (~200 KB of shared memory).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/common/cuda_check.h"
#include "tma_map.h"
#include "wgmma_backward.h"
#include "wgmma_backward_kernel.cuh"

namespace flashgrad::cuda_attn {
namespace {

// FLASHGRAD_ATTN_BWD_LAGGED_DQ=1 (read at every call): the lagged-dQ schedule at D <= 128
// (wgmma_backward_kernel.cuh), off until an H200 run shows it correct and faster.
bool lagged_dq() {
  const char* env = std::getenv("FLASHGRAD_ATTN_BWD_LAGGED_DQ");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

template <typename T, int D, bool kLagDq>
void launch_variant(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv, const CUtensorMap& mdo,
                    const CUtensorMap& mdq, const AttentionKernelParams& p, const WgmmaBackwardAxes& axes, cudaStream_t stream) {
  using Cfg = WgmmaBackwardConfig<D>;
  const int nblocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  if (nblocks == 0 || p.num_seqs == 0 || p.heads_k == 0) return;
  auto kernel = attention_backward_wgmma_kernel<T, D, kLagDq>;
  FLASHGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.num_seqs) * nblocks), static_cast<unsigned>(p.heads_k));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(mq, mk, mv, mdo, mdq, p, axes, nblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv, const CUtensorMap& mdo,
            const CUtensorMap& mdq, const AttentionKernelParams& p, const WgmmaBackwardAxes& axes, cudaStream_t stream) {
  if constexpr (D <= 128)
    if (lagged_dq()) return launch_variant<T, D, true>(mq, mk, mv, mdo, mdq, p, axes, stream);
  launch_variant<T, D, false>(mq, mk, mv, mdo, mdq, p, axes, stream);
}

}  // namespace

bool launch_backward_wgmma(const AttentionKernelParams& p, int head_dim, bool bf16, int64_t rows_k,
                           cudaStream_t stream) {
  const char* env = std::getenv("FLASHGRAD_ATTN_BACKWARD");
  if (env != nullptr && std::strcmp(env, "legacy") == 0) return false;
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  // grid.x = sequences x key blocks must fit the 2^31 - 1 limit; grid.y (kv heads) 65535.
  const int key_rows = head_dim == 256 ? WgmmaBackwardConfig<256>::kBlockN : WgmmaBackwardConfig<128>::kBlockN;
  const int64_t nblocks = (p.seqlen_k + key_rows - 1) / key_rows;
  if (static_cast<int64_t>(p.num_seqs) * nblocks > 0x7fffffff || p.heads_k > 65535) return false;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t batches = varlen ? 1 : p.num_seqs;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  if (batches == 0 || rows_q == 0 || rows_k == 0) return false;
  CUtensorMap mq, mk, mv, mdo, mdq;
  WgmmaBackwardAxes axes;
  const int kQRows = head_dim == 64    ? WgmmaBackwardConfig<64>::kBlockM
                     : head_dim == 128 ? WgmmaBackwardConfig<128>::kBlockM
                                       : WgmmaBackwardConfig<256>::kBlockM;
  const int kKRows = key_rows;
  static_assert(WgmmaBackwardConfig<64>::kBlockN == WgmmaBackwardConfig<128>::kBlockN, "one key box at D <= 128");
  if (!make_tma_map_16bit(&mq, p.q, p.q_st, rows_q, p.heads_q, batches, head_dim, bf16, kQRows, &axes.q_rows_inner) ||
      !make_tma_map_16bit(&mdo, p.dout, p.dout_st, rows_q, p.heads_q, batches, head_dim, bf16, kQRows,
                          &axes.do_rows_inner) ||
      !make_tma_map_16bit(&mk, p.k, p.k_st, rows_k, p.heads_k, batches, head_dim, bf16, kKRows, &axes.k_rows_inner) ||
      !make_tma_map_16bit(&mv, p.v, p.v_st, rows_k, p.heads_k, batches, head_dim, bf16, kKRows, &axes.v_rows_inner))
    return false;
  // The dQ accumulator's map (without the deterministic pass: the kernel adds staged tiles through
  // it); unused otherwise, so left zeroed.
  std::memset(&mdq, 0, sizeof mdq);
  if (!p.deterministic && !make_tma_map_dq_accum(&mdq, p.dq_accum, p.total_q, p.heads_q, head_dim, kQRows))
    return false;
  if (head_dim == 64)
    bf16 ? launch<__nv_bfloat16, 64>(mq, mk, mv, mdo, mdq, p, axes, stream)
         : launch<__half, 64>(mq, mk, mv, mdo, mdq, p, axes, stream);
  else if (head_dim == 256)
    bf16 ? launch<__nv_bfloat16, 256>(mq, mk, mv, mdo, mdq, p, axes, stream)
         : launch<__half, 256>(mq, mk, mv, mdo, mdq, p, axes, stream);
  else
    bf16 ? launch<__nv_bfloat16, 128>(mq, mk, mv, mdo, mdq, p, axes, stream)
         : launch<__half, 128>(mq, mk, mv, mdo, mdq, p, axes, stream);
  return true;
}

}  // namespace flashgrad::cuda_attn
