// Host side of the FP8 wgmma forward: the switch, the tensor maps (fp8_wgmma_maps.h), the
// transposed V copy, the launch.
#include <cuda.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "fp8_attention_host.h"
#include "fp8_wgmma_forward.h"
#include "fp8_wgmma_forward_kernel.cuh"
#include "fp8_wgmma_maps.h"
#include "tma_map.h"

namespace flashgrad::cuda {
namespace {

using cuda_attn::Fp8KernelParams;
using cuda_attn::fp8w::Fp8wForwardConfig;
using cuda_attn::fp8w::Fp8wMapAxes;

using cuda_attn::fp8w::EncodeTiled;


template <int D>
void launch_transpose(const Fp8KernelParams& f, cudaStream_t stream) {
  const int key_blocks = (f.base.seqlen_k + cuda_attn::fp8w::kVtBoxKeys - 1) / cuda_attn::fp8w::kVtBoxKeys;
  if (key_blocks == 0 || f.base.num_seqs == 0) return;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(f.base.num_seqs) * key_blocks),
                  static_cast<unsigned>(f.base.heads_k));
  cuda_attn::fp8w::fp8w_transpose_v_kernel<D>
      <<<grid, 256, cuda_attn::fp8w::vt_transpose_smem_bytes<D>(), stream>>>(f, key_blocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

template <int D, bool kPingpong, int kSchedule, bool kLean = true, bool kEarlyTest = false, bool kIntMax = false>
void launch_kernel(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mvt, const Fp8KernelParams& f,
                   const Fp8wMapAxes& axes, int mblocks, int64_t tiles, cudaStream_t stream) {
  using Cfg = Fp8wForwardConfig<D, kSchedule>;
  auto kernel =
      cuda_attn::fp8w::fp8_attention_forward_wgmma_kernel<D, kPingpong, kSchedule, kLean, kEarlyTest, kIntMax>;
  FLASHGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  kernel<<<dim3(static_cast<unsigned>(tiles)), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(mq, mk, mvt, f, axes,
                                                                                         mblocks);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

// The variants' defaults, one constant each (per head dim for the schedule and the P V pipeline),
// so that flipping one after an H200 run is a one-line change that keeps every path reachable: the
// switches below take "1" / "0" to override them (read at every call; the bench's variants set what
// they change). Session 6, H200 run 6.1 (commit 71959c5, B2 H16 S8192, TFLOP/s none / causal):
//   hd 256: serial + pipelined P V chunks (bench spv) 1069 / 893, serial 1056 / 878, overlapped 857 /
//           717 -> kSerial with kPvPipeByDefault<256>;
//   hd 128: overlapped 805 / 655, serial 731 / 603 -> kOverlap;
//   hd 64:  serial 484 / 386, overlapped 468 / 373, the mma.sync FP8 forward 160 / 129 (every FP8
//           GPU test passed with hd 64 on this kernel in run 4) -> on this kernel, kSerial, then
//           (run 6.3, below) overlapped with the staggered start.
// The overlapped schedule everywhere (the defaults before session 6) is SERIAL=0 with STAGGER=0 and
// PV_PIPE=0 (bench variant ov).
constexpr bool kHd64ByDefault = true;
template <int D>
constexpr bool kPingpongByDefault = false;
// Session 6, H200 run 6.3 (B2 H16 S8192, TFLOP/s none / causal): the staggered start (bench st,
// overlapped schedule) hd 128 829 / 666 against 804 / 651 (overlapped, in step), hd 64 506 / 404
// against serial 484 / 387 -> on at hd 64 / 128 (hd 64 now overlapped). kEarlyS alone was slower (749
// at hd 128: both warpgroups' S queue first, so they start their softmax together), ping-pong too
// (767; with the stagger 821).
// Session 7: run 6.4's fp8w bench (same process, B2 H16 S8192 non-causal / causal) timed the stagger
// at hd 256 too (serial + PV pipe + stagger, "wst") at 1072 / 906 against 1049 / 896, and the early S
// with the stagger ("esst") at hd 128 841 / 669 against 821 / 672, hd 64 518 / 412 against 506 / 403;
// their GPU tests passed (fp8w_{esst,wst}_tests) -> both on by default.
template <int D>
constexpr bool kStaggerByDefault = true;
template <int D>
constexpr bool kEarlySByDefault = D <= 128;
template <int D>
constexpr int kScheduleByDefault = D == 256 ? cuda_attn::fp8w::kSerial : cuda_attn::fp8w::kOverlap;
// hd 256's pipelined P V chunks, the default with the serial schedule only (with the overlapped one
// they were slower in run 6.1: 838 against 857); PV_PIPE=1 / 0 overrides it for either schedule.
template <int D>
constexpr bool kPvPipeByDefault = D == 256;
// Session 12: kEarlyS's loop-top data waits tested a round ahead (the kernel's kEarlyTest), hd 64 / 128
// without ping-pong. H200 run 12.2 (same process, B2 H16 S8192, TFLOP/s none / causal): hd 128 868 /
// 680 against 838 / 659, hd 64 543 / 421 against 516 / 408, output bitwise the same, AttentionFp8Gpu.*
// passed with it -> the default since run 12.3; FLASHGRAD_ATTN_FP8_WGMMA_EARLY_TEST=0 keeps the kEarlyS
// loop as before.
constexpr bool kEarlyTestByDefault = true;
// Session 13: the full tiles' row max from the scores' bit patterns with 3-input integer maxima (the
// kernel's kIntMax, same numerics), in the default schedules (hd 64 / 128 kEarlyS with kEarlyTest,
// hd 256 kSerialPvPipe). H200 run 13.1, first version (a vote and a branch per row): hd 128 797 / 646
// against 867 / 686 TFLOP/s (none / causal), hd 64 -9..-13 %. Run 13.2, one vote per block (commit
// 2bf4947; same process, B2 H16 S8192, none / causal): hd 128 892 / 702 against 860 / 685 (default
// timed twice: 860 / 848), hd 64 557 / 432 against 542 / 424, hd 256 1093 / 910 against 1078 / 893;
// output bitwise the default's, AttentionFp8Gpu.* passed with it -> the default from run 13.3 on
// (lead's OK); FLASHGRAD_ATTN_FP8_WGMMA_INT_MAX=0 keeps the float row max.
constexpr bool kIntMaxByDefault = true;
// Retired in session 20: opt-in variants that no default used and that the H200 timed slower
// (docs/perf/attention_fp8_wgmma.md), the polynomial exp2 (POLY_EXP; session 5, run 4: -13 % at
// hd 128), the row max taken off the exponentials' path (SPEC_MAX, kSpecMax; run 12.1: -7 %) and
// the warpgroups' exponentials in turns (EXP_TURN, kExpTurn; run 12.3: -14 %). Their switches are
// no longer read.

// 1 or 0 when the switch says "1" or "0", else `fallback`.
bool env_switch(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (env != nullptr && std::strcmp(env, "1") == 0) return true;
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  return fallback;
}

// FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG: the consumer warpgroups take turns issuing;
// FLASHGRAD_ATTN_FP8_WGMMA_SERIAL: no overlap inside a warpgroup (S, softmax, P V in sequence;
// 128-key blocks at D = 256); FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL (unless SERIAL): O accumulated in
// the tensor cores across key blocks -- not the recipe's numerics, for measuring what the two-level
// accumulation costs (Fp8wSchedule); FLASHGRAD_ATTN_FP8_WGMMA_LEAN=0: the overlapped schedule
// without ping-pong on session 4's instruction stream (the kernel's kLean = false: same products and
// numerics, the consumer loop before session 5 cut its instruction count), to time old against new
// in one process;
// FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP=0: the producer spins in its empty-slot waits (session 4)
// instead of sleeping in them (Fp8wMapAxes::producer_sleep; with kLean only);
// FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE=1 (hd 256, without ping-pong): P V in chunks through two
// alternating accumulators, each chunk's fold beside the next chunk's products (Fp8wSchedule
// kOverlapPvPipe: 32-column chunks of the overlapped schedule; kSerialPvPipe: 64-column chunks of
// the serial one); FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S=1 (hd 64 / 128, overlapped schedule, with or
// without ping-pong): Fp8wSchedule kEarlyS, S(j+1) issued before the fold of P(j-1) V(j-1).
template <int D>
void launch_variant(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mvt, const Fp8KernelParams& f,
                    const Fp8wMapAxes& axes, int mblocks, int64_t tiles, cudaStream_t stream) {
  using cuda_attn::fp8w::kOneLevel;
  using cuda_attn::fp8w::kOverlap;
  using cuda_attn::fp8w::kSerial;
  const bool pingpong = env_switch("FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG", kPingpongByDefault<D>);
  const bool serial = env_switch("FLASHGRAD_ATTN_FP8_WGMMA_SERIAL", kScheduleByDefault<D> == kSerial);
  const bool one_level = env_switch("FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL", kScheduleByDefault<D> == kOneLevel);
  const int schedule = serial ? kSerial : one_level ? kOneLevel : kOverlap;
  if (schedule == kOverlap && !pingpong && !env_switch("FLASHGRAD_ATTN_FP8_WGMMA_LEAN", true))
    return launch_kernel<D, false, kOverlap, false>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
  // FLASHGRAD_ATTN_FP8_WGMMA_INT_MAX (session 13; default on): kIntMax in the default schedules (below).
  const bool int_max = !pingpong && env_switch("FLASHGRAD_ATTN_FP8_WGMMA_INT_MAX", kIntMaxByDefault);
  if constexpr (D <= 128)
    if (schedule == kOverlap && env_switch("FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S", kEarlySByDefault<D>)) {
      // FLASHGRAD_ATTN_FP8_WGMMA_EARLY_TEST (session 12; default on): kEarlyTest.
      if (!pingpong && env_switch("FLASHGRAD_ATTN_FP8_WGMMA_EARLY_TEST", kEarlyTestByDefault))
        return int_max ? launch_kernel<D, false, cuda_attn::fp8w::kEarlyS, true, true, true>(mq, mk, mvt, f, axes,
                                                                                            mblocks, tiles, stream)
                       : launch_kernel<D, false, cuda_attn::fp8w::kEarlyS, true, true>(mq, mk, mvt, f, axes, mblocks,
                                                                                      tiles, stream);
      return pingpong ? launch_kernel<D, true, cuda_attn::fp8w::kEarlyS>(mq, mk, mvt, f, axes, mblocks, tiles, stream)
                      : launch_kernel<D, false, cuda_attn::fp8w::kEarlyS>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
    }
  if constexpr (D == 256)
    if (!pingpong && env_switch("FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE", kPvPipeByDefault<D> && schedule == kSerial)) {
      if (schedule == kOverlap)
        return launch_kernel<D, false, cuda_attn::fp8w::kOverlapPvPipe>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
      if (schedule == kSerial)
        return int_max ? launch_kernel<D, false, cuda_attn::fp8w::kSerialPvPipe, true, false, true>(
                             mq, mk, mvt, f, axes, mblocks, tiles, stream)
                       : launch_kernel<D, false, cuda_attn::fp8w::kSerialPvPipe>(mq, mk, mvt, f, axes, mblocks, tiles,
                                                                                stream);
    }
  if (schedule == kSerial)
    pingpong ? launch_kernel<D, true, kSerial>(mq, mk, mvt, f, axes, mblocks, tiles, stream)
             : launch_kernel<D, false, kSerial>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
  else if (schedule == kOneLevel)
    pingpong ? launch_kernel<D, true, kOneLevel>(mq, mk, mvt, f, axes, mblocks, tiles, stream)
             : launch_kernel<D, false, kOneLevel>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
  else
    pingpong ? launch_kernel<D, true, kOverlap>(mq, mk, mvt, f, axes, mblocks, tiles, stream)
             : launch_kernel<D, false, kOverlap>(mq, mk, mvt, f, axes, mblocks, tiles, stream);
}

}  // namespace

std::size_t fp8_wgmma_forward_workspace_bytes(const AttentionProblem& pr) {
  const int64_t cols = cuda_attn::fp8w::vt_columns(pr.varlen, pr.num_seqs, pr.seqlen_k, pr.total_k);
  return cuda_detail::align_up(static_cast<std::size_t>(pr.heads_k * pr.head_dim * cols));
}

bool fp8_wgmma_attention_forward(const AttentionParams& p, const AttentionProblem& pr,
                                 const cuda_attn::AttentionKernelParams& k, bool out_bf16, Workspace ws,
                                 cudaStream_t stream) {
  // Default since the H200 run of 2026-11-29 (every AttentionFp8* case passed on it, 3.6-4.7x the
  // mma.sync forward); FLASHGRAD_ATTN_FP8_FORWARD=mma (or legacy) selects the mma.sync kernel.
  const char* env = std::getenv("FLASHGRAD_ATTN_FP8_FORWARD");
  if (env != nullptr && (std::strcmp(env, "mma") == 0 || std::strcmp(env, "legacy") == 0)) return false;
  const int hd = static_cast<int>(pr.head_dim);
  // hd 64 (64-byte Q / K rows, SWIZZLE_64B): FLASHGRAD_ATTN_FP8_WGMMA_HD64=1 / 0 over kHd64ByDefault;
  // the mma.sync kernel serves it otherwise.
  if (hd != 128 && hd != 256 && !(hd == 64 && env_switch("FLASHGRAD_ATTN_FP8_WGMMA_HD64", kHd64ByDefault)))
    return false;
  const int64_t mblocks = (pr.seqlen_q + 127) / 128;
  const int64_t tiles = pr.num_seqs * mblocks * pr.heads_q;
  if (tiles > 0x7fffffff) return false;
  // Empty problems (no query tile, or no keys at all: out = 0, lse = -inf) stay with the mma.sync
  // kernel, which handles them; TMA maps need non-empty tensors.
  if (tiles == 0 || pr.total_k == 0 || pr.total_q == 0) return false;
  const int64_t batches = pr.varlen ? 1 : pr.num_seqs;
  const int64_t rows_q = pr.varlen ? pr.total_q : pr.seqlen_q;
  const int64_t rows_k = pr.varlen ? pr.total_k : pr.seqlen_k;
  CUtensorMap mq, mk, mvt;
  Fp8wMapAxes axes;
  axes.producer_sleep = env_switch("FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP", true) ? 1 : 0;
  // Warpgroup 2 starts after warpgroup 1's first softmax (Fp8wMapAxes::stagger; session 6: the
  // default at hd 64 / 128, kStaggerByDefault).
  const bool stagger_default = hd == 64 ? kStaggerByDefault<64> : hd == 128 ? kStaggerByDefault<128> : kStaggerByDefault<256>;
  axes.stagger = env_switch("FLASHGRAD_ATTN_FP8_WGMMA_STAGGER", stagger_default) ? 1 : 0;
  const EncodeTiled encode = cuda_attn::tensor_map_encoder();  // shared lookup (tma_map.h)
  if (!cuda_attn::fp8w::make_rows_map(encode, &mq, k.q, k.q_st, rows_q, pr.heads_q, batches, hd, &axes.q_rows_inner) ||
      !cuda_attn::fp8w::make_rows_map(encode, &mk, k.k, k.k_st, rows_k, pr.heads_k, batches, hd, &axes.k_rows_inner))
    return false;

  Fp8KernelParams f;
  f.base = k;
  f.out_bf16 = out_bf16;
  set_fp8_descales(f, p);
  f.vt_cols = cuda_attn::fp8w::vt_columns(pr.varlen, pr.num_seqs, pr.seqlen_k, pr.total_k);
  const std::size_t bytes = fp8_wgmma_forward_workspace_bytes(pr);
  cuda_detail::ScratchBuffer scratch(ws, bytes, stream);
  f.vt = scratch.take<uint8_t>(bytes);
  if (!cuda_attn::fp8w::make_vt_map(encode, &mvt, f.vt, f.vt_cols, hd, pr.heads_k, cuda_attn::fp8w::kVtBoxKeys))
    return false;  // nothing launched yet
  if (hd == 64) {
    launch_transpose<64>(f, stream);
    launch_variant<64>(mq, mk, mvt, f, axes, static_cast<int>(mblocks), tiles, stream);
  } else if (hd == 128) {
    launch_transpose<128>(f, stream);
    launch_variant<128>(mq, mk, mvt, f, axes, static_cast<int>(mblocks), tiles, stream);
  } else {
    launch_transpose<256>(f, stream);
    launch_variant<256>(mq, mk, mvt, f, axes, static_cast<int>(mblocks), tiles, stream);
  }
  return true;
}

}  // namespace flashgrad::cuda
