// Host side of the wgmma forward: one TMA tensor map per operand and call, the grid, the launch.
//
// Each [B, S, H, D] (padded) or [T, H, D] (varlen, one batch) view becomes a 4-D tensor map
// (D, heads, rows, batch) -- heads and rows swapped when the rows are the smaller stride -- with a
// box of 64 columns (128 bytes, the SWIZZLE_128B span) x 1 head x 128 rows x 1 batch. Coordinates
// past a dimension read as zeros, so the last tile of a padded sequence needs no clipping; varlen
// tiles past a sequence read the next sequence's tokens, which the kernel masks.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "tma_map.h"
#include "wgmma_forward.h"
#include "wgmma_forward_kernel.cuh"

namespace flashgrad::cuda_attn {
namespace {

// Multiprocessors of the current device (cached per device).
int sm_count() {
  static int counts[64] = {};
  int dev = 0;
  FLASHGRAD_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 64) dev = 63;
  if (counts[dev] == 0) FLASHGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev));
  return counts[dev];
}

// Defaults of the two variant switches (environment, read at every call): "0" / "1" override
// them, so the bench and the tests can run every combination whatever the default is. Ping-pong
// stays off (no gain on the H200: tools/gpu-extra/fwdsched.sh).
constexpr bool kPingpongByDefault = false;
// 1 (one CTA per SM, tiles from a counter) at D <= 128, 0 (one CTA per tile) at D = 256: the H200
// run of 2026-11-30 02:08 (docs/perf/attention.md) measured the persistent grid 2-5% faster at
// D <= 128 and 0-15% slower at D = 256.
template <int D>
constexpr int64_t kPersistentByDefault = D <= 128 ? 1 : 0;

// The integer value of a switch, or `fallback` when it is not set.
int64_t env_int(const char* name, int64_t fallback) {
  const char* env = std::getenv(name);
  return env == nullptr || *env == '\0' ? fallback : std::atoll(env);
}

// One CTA per SM drawing tiles from a counter (the default at D <= 128, or FLASHGRAD_ATTN_WGMMA_PERSISTENT=1, or
// more tiles than a grid holds; heaviest first, dynamically balanced), which overlaps each tile's Q and first
// K / V loads with the previous tile's last P V and epilogue, or one CTA per tile (=0; D = 256 by default).
// FLASHGRAD_ATTN_WGMMA_PERSISTENT=N >= 2 caps the grid at N CTAs (tests use it to give every CTA
// several tiles on small problems).
template <typename T, int D, bool kPingpong>
void launch_variant(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                    const AttentionKernelParams& p, const WgmmaMapAxes& axes, Workspace ws, cudaStream_t stream) {
  using Cfg = WgmmaForwardConfig<D>;
  const int mblocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (mblocks == 0 || p.num_seqs == 0) return;
  auto kernel = attention_forward_wgmma_kernel<T, D, kPingpong>;
  // Every call, as the mma.sync launchers do: the attribute is per device.
  FLASHGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const int64_t tiles = static_cast<int64_t>(p.num_seqs) * mblocks * p.heads_q;
  int64_t ctas = tiles;
  const int64_t cap = env_int("FLASHGRAD_ATTN_WGMMA_PERSISTENT", kPersistentByDefault<D>);
  if (cap >= 2)
    ctas = std::min<int64_t>(tiles, cap);
  else if (cap == 1 || tiles > 0x7fffffff)
    ctas = std::min<int64_t>(tiles, sm_count());
  // Fewer CTAs than tiles: the tiles after the first grid's are handed out by a counter, an int of
  // the caller's workspace (or a stream-ordered allocation, freed after the launch in stream order:
  // both are legal inside CUDA-graph capture), zeroed on the stream before the launch.
  cuda_detail::ScratchBuffer scratch(ws, ctas < tiles ? sizeof(int) : 0, stream);
  int* counter = nullptr;
  if (ctas < tiles) {
    counter = scratch.take<int>(sizeof(int));
    FLASHGRAD_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  }
  kernel<<<dim3(static_cast<unsigned>(ctas)), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(mq, mk, mv, p, axes,
                                                                                      mblocks, tiles, counter);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// FLASHGRAD_ATTN_WGMMA_PINGPONG=1 turns on the consumer warpgroups' turn-taking, =0 off (read at
// every call so the bench can time both in one process).
template <typename T, int D>
void launch(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv, const AttentionKernelParams& p,
            const WgmmaMapAxes& axes, Workspace ws, cudaStream_t stream) {
  if (env_int("FLASHGRAD_ATTN_WGMMA_PINGPONG", kPingpongByDefault ? 1 : 0) == 1)
    launch_variant<T, D, true>(mq, mk, mv, p, axes, ws, stream);
  else
    launch_variant<T, D, false>(mq, mk, mv, p, axes, ws, stream);
}

}  // namespace

bool launch_forward_wgmma(const AttentionKernelParams& p, int head_dim, bool bf16, int64_t rows_k, Workspace ws,
                          cudaStream_t stream) {
  const char* env = std::getenv("FLASHGRAD_ATTN_FORWARD");
  if (env != nullptr && std::strcmp(env, "legacy") == 0) return false;
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t batches = varlen ? 1 : p.num_seqs;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  if (batches == 0 || rows_q == 0 || rows_k == 0) return false;
  CUtensorMap mq, mk, mv;
  WgmmaMapAxes axes;
  const int key_rows = head_dim == 256 ? WgmmaForwardConfig<256>::kBlockN : WgmmaForwardConfig<128>::kBlockN;
  if (!make_tma_map_16bit(&mq, p.q, p.q_st, rows_q, p.heads_q, batches, head_dim, bf16, 128, &axes.q_rows_inner) ||
      !make_tma_map_16bit(&mk, p.k, p.k_st, rows_k, p.heads_k, batches, head_dim, bf16, key_rows, &axes.k_rows_inner) ||
      !make_tma_map_16bit(&mv, p.v, p.v_st, rows_k, p.heads_k, batches, head_dim, bf16, key_rows, &axes.v_rows_inner))
    return false;
  if (head_dim == 64)
    bf16 ? launch<__nv_bfloat16, 64>(mq, mk, mv, p, axes, ws, stream)
         : launch<__half, 64>(mq, mk, mv, p, axes, ws, stream);
  else if (head_dim == 256)  // one variant: FA3 too keeps the turn-taking for D <= 128
    bf16 ? launch_variant<__nv_bfloat16, 256, false>(mq, mk, mv, p, axes, ws, stream)
         : launch_variant<__half, 256, false>(mq, mk, mv, p, axes, ws, stream);
  else
    bf16 ? launch<__nv_bfloat16, 128>(mq, mk, mv, p, axes, ws, stream)
         : launch<__half, 128>(mq, mk, mv, p, axes, ws, stream);
  return true;
}

}  // namespace flashgrad::cuda_attn
