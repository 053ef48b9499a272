// Internal interface of the chunked (chunk 64, UT/WY, tensor-core) delta-rule stages.
// Verified stage by stage on the H200 (tests/cpp/delta_rule_chunked_gpu_test.cu, 2026-11-29) and
// on a CPU emulation of their source (chunked_emulation/); called by chunked_path.cu when
// `algorithm = chunked` and chunked_stages_support() takes the problem.
//
// Notation as src/reference/delta_rule/chunked.h, per (sequence, value head hv) and chunk c of
// L <= 64 steps (local rows i, j):
//   G_i   = g_0 + ... + g_i (cumulative log decay inside the chunk; 0 without a gate)
//   M_ij  = beta_i exp(G_i - G_j) k_i.k_j  (i > j),  A = (I + M)^{-1}
//   w     = A (beta exp(G) k),  u = A (beta v)
//   v_new = u - w h_c,  h_{c+1} = exp(G_{L-1}) h_c + (k exp(G_{L-1} - G))^T v_new
//   o     = scale [exp(G) (q h_c) + Lower(q k^T exp(G_i - G_j)) v_new]
//
// Stages (each a kernel with the host launcher declared below):
//   1. prepare (grid: chunks x HV): G, A, w, u.
//   2. state   (grid: sequences x HV x V/32): v_new and the chunk-entry states h, final state.
//   3. output  (grid: chunks x HV x V/64): o.
//   B1. state backward (grid: sequences x HV x V/32): dh (per chunk), dv_new, dh0.
//   B2. gradients (grid: chunks x HV): dq, dk (pre-norm, summed over a group), dv, dbeta, dg.
//
// Intermediates are contiguous float/T arrays indexed by the token row `row = b * T + t`
// (padded batch: b < B, t < T; varlen: b = 0, t = packed token), so chunks of different
// sequences never share rows:
//   G     float [rows, HV]          (only with a gate)
//   A     float [rows, HV, 64]      row i of its chunk's A (columns >= L are 0)
//   w     T     [rows, HV, K]
//   u     float [rows, HV, V]
//   v_new T     [rows, HV, V]
//   h     float [num_chunks, HV, K, V]   state entering chunk c (global chunk index, see ChunkInfo)
// The backward adds dh [num_chunks, HV, K, V] (dL/dh_{c+1}) and dv_new [rows, HV, V] (B1), and
// dq_acc, dk_acc [rows, H, K], dv [rows, HV, V], dbeta, dg [rows, HV] (B2), all float.
// Offsets are int64 throughout.
//
// Scope of this first version: bf16 / fp16 inputs, K in {64, 128}, V in {64, 128, 192, 256}, GDN
// (scalar gate) and the plain delta rule. KDA (per-channel gates) is refused by
// chunked_stages_support(): its decayed key products exp(G_id - G_jd) are not one matrix product;
// it has its own stages (chunked_kda.h), and chunked_path.cu picks between the two.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashgrad/tensor.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kChunkSize = 64;

// One chunk of one sequence: its batch row b, first token t0 (inside that batch row), length L
// (1..64) and sequence index n. 32 bytes, read once per block.
struct ChunkInfo {
  int64_t b;
  int64_t t0;
  int64_t seq;
  int32_t len;
  int32_t unused;
};

// Chunks of every sequence, sequence by sequence: sequence n owns chunks
// [seq_first_chunk[n], seq_first_chunk[n + 1]). Empty sequences own none.
struct ChunkPlanHost {
  std::vector<ChunkInfo> chunks;
  std::vector<int64_t> seq_first_chunk;  // [N + 1]
  std::vector<int64_t> seq_b, seq_t0, seq_len;  // [N]
  // Chunks per sequence when every sequence is a whole batch row (no cu_seqlens, T > 0, fewer than
  // 2^31 chunks): chunk c is then chunk c % n of batch row c / n, and kernels compute its entry
  // (chunk_info, chunked_rows.cuh) instead of reading it. 0 otherwise (varlen): they read `chunks`.
  int64_t uniform_chunks = 0;
};

// From the padded length T and batch B, or (when `cu_seqlens` is non-empty, B == 1) the host
// copy of cu_seqlens [N + 1].
ChunkPlanHost make_chunk_plan(int64_t B, int64_t T, const std::vector<int64_t>& cu_seqlens);

struct ChunkedArgs {
  // The user's tensors (strided views; see recurrent_common.cuh).
  View q, k, v, g, beta;  // g.p null: plain delta rule
  View h0;                // [N, HV, K, V] float32, null: zeros
  View o, ht;             // stage 3 output, stage 2 final state (ht may be null)
  // The chunk plan, on the device.
  const ChunkInfo* chunks = nullptr;
  const int64_t* seq_first_chunk = nullptr;  // [N + 1]
  int64_t num_chunks = 0, num_seqs = 0;
  int64_t uniform_chunks = 0;  // the plan's (ChunkPlanHost::uniform_chunks); 0: read `chunks`
  // Intermediates (layouts in the header comment), on the device.
  float* G = nullptr;
  // [rows, HV] (GDN / plain rule; null for KDA): colscale_j = exp(G_{L-1} - G_j) rstd_kj of row j of its
  // chunk (L the chunk's length), written by stage 1 beside G; stage 2 and B1 read it instead of
  // forming k's row norms on their serial chains every chunk (session 16). Null: they form them.
  float* colscale = nullptr;
  // [rows, HV] (the 16-bit backward, GDN / plain rule): rowscale_i = scale rstd_qi exp(G_i) of row i < L of
  // its chunk, written by B0 (chunked_dv_local.cuh), which forms q's row norms anyway, for B1 on wgmma
  // (session 17), which then forms none on its serial chain. Null: B0 does not write it.
  float* rowscale = nullptr;
  float* A = nullptr;
  void* w = nullptr;
  float* u = nullptr;
  void* v_new = nullptr;
  float* h = nullptr;
  // Backward (stage B1 only so far; see chunked_state_backward.cuh).
  View dout, dht, dh0;       // dout [B, T, HV, V] (T); dht, dh0 [N, HV, K, V] float32 (each may be null)
  float* dh = nullptr;       // [num_chunks, HV, K, V]: dL/dh_{c+1}, the gradient of the state leaving chunk c
  float* dv_new = nullptr;   // [rows, HV, V]: dL/dv_new
  // Backward stage B2 (chunked_grads.cuh), fp32: dq, dk summed over the value heads of a group
  // (zeroed before, atomically added), before the L2-norm backward; dv, dbeta, dg per value head.
  float* dq_acc = nullptr;   // [rows, H, K]
  float* dk_acc = nullptr;   // [rows, H, K]
  float* dv = nullptr;       // [rows, HV, V]
  float* dbeta = nullptr;    // [rows, HV]
  float* dg = nullptr;       // [rows, HV] (only with a gate)
  // 16-bit storage (session 6; the path's default, FLASHGRAD_CHUNKED_STATE16=0 turns it off): when
  // set, stage 2 stores h and B1 stores dh and dv_new here, in T, instead of in h / dh / dv_new
  // (float; then null); only the mma B2 reads them (chunk_grads_mma_kernel, kHalf). Layouts as above.
  void* h16 = nullptr;       // [num_chunks, HV, K, V] T
  void* dh16 = nullptr;      // [num_chunks, HV, K, V] T
  void* dv_new16 = nullptr;  // [rows, HV, V] T
  // Direct outputs of the mma B2 (session 6): when dv_out is set, B2 writes dv, dbeta and dg into
  // these views (the user's gradients, rounded) instead of dv / dbeta / dg above; when dq_out is
  // set too (only with H == HV: each block then has the whole of its rows' dq, dk), it also does
  // the L2-norm backward of dq, dk and writes them (dq_acc, dk_acc unused).
  View dq_out, dk_out, dv_out, dbeta_out, dg_out;
  // Split B2 (session 7, chunked_grads_split.cuh): dG's state terms per (row, value head), written by
  // its first kernel and added by the second (fp32 [rows, HV]; needed with a gate only).
  float* dG_state = nullptr;
  int64_t T = 0, H = 0, HV = 0, K = 0, V = 0;
  float scale = 1.0f;
  bool l2norm = false;
  // Forward: the fused state + output kernel stores v_new too (into v_new: the caller's saved_v_new);
  // the unfused stage 2 always does.
  bool keep_v_new = false;
};

// Backward stages B1 and B2: "new" = B1 transposed (chunked_state_backward_transposed.cuh) and B2
// with 8 warps; "legacy" = as in session 3 (B1 with 4 warps per 32 value columns and hi / lo
// operands in shared memory, B2 with 4 warps), to compare with and to fall back on until the H200
// has confirmed the new ones. FLASHGRAD_CHUNKED_BACKWARD=legacy / new picks one (read per call).
constexpr bool kNewBackwardByDefault = true;  // the emulation's whole set passes (14 cases)
inline bool legacy_backward_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_BACKWARD");
  if (env && std::string(env) == "legacy") return true;
  if (env && std::string(env) == "new") return false;
  return !kNewBackwardByDefault;
}

// Which B2 the new backward runs: the ldmatrix kernel ("mma", the default) or the session-4 8-warp TF32
// one ("v8"), by FLASHGRAD_CHUNKED_B2 (read per call, so one process can time both). The legacy
// backward (FLASHGRAD_CHUNKED_BACKWARD=legacy) keeps its 4-warp TF32 B2.
constexpr bool kMmaGradsByDefault = true;  // the emulation's whole set passes with it
inline bool mma_grads_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2");
  if (env && std::string(env) == "v8") return false;
  if (env && std::string(env) == "mma") return true;
  return kMmaGradsByDefault;
}

// Whether the mma B2 runs as two kernels (chunked_grads_split.cuh: B2a the products with h / dh, B2b
// the chunk-local ones, 16 warps per SM) instead of the fused one, where the split applies (16-bit
// intermediates, direct outputs with H == HV, V >= K, 16-byte-row views, dG_state with a gate:
// split_grads_applies): the default since run 7.3 (B8 T4096 H16 bf16: B2 2.10 -> 1.84 ms at K=V=128,
// 1.27 -> 1.03 at K=V=64); FLASHGRAD_CHUNKED_B2=fused (or mma) keeps the fused kernel. split2 (an
// experiment): two value heads per 16-warp block instead of one per 8-warp block. Read per call, so one
// process can time them all.
constexpr bool kSplitGradsByDefault = true;
// Stage 1 writes the state update's row scales for stage 2 and B1 (ChunkedArgs::colscale; session 16,
// the default); FLASHGRAD_CHUNKED_COLSCALE=0 (read per call) leaves them to those kernels, as before,
// to compare both in one process.
inline bool stage1_colscale_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_COLSCALE");
  return !(env && std::string(env) == "0");
}
inline bool split_grads_paired_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2");
  return env && std::string(env) == "split2";
}
inline bool split_grads_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2");
  if (env && (std::string(env) == "split" || std::string(env) == "split2")) return true;
  if (env && (std::string(env) == "fused" || std::string(env) == "mma" || std::string(env) == "v8")) return false;
  return kSplitGradsByDefault;
}

// Warps per block of the transposed B1 (16 value columns each; chunked_launch_impl.cuh), by the
// number of (sequence, value head) chains and the SM count: 8 (128 columns) when V allows and the
// (chain, slice) blocks still cover most SMs, else 4 (64 columns, twice the blocks; V is a multiple
// of 64, chunked_plan.cu). Run 9.1 (H200, 2026-11-30, b1warps.sh) timed 2 / 4 / 8 warps in one process:
// B1 T32768 H16 K=V=128 (16 chains) 6.83 / 5.09 / 5.75 ms, B8 T4096 (128 chains) 3.39 / 1.32 / 0.74 ms,
// so 2-warp blocks (the old rule's choice for few chains) lost everywhere and are gone.
// FLASHGRAD_CHUNKED_B1_WARPS=4 / 8 forces the count where V allows it (to time them in one process).
inline int state_backward_warps(int64_t chains, int64_t V, int64_t sms) {
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_B1_WARPS")) {
    const int w = std::atoi(env);
    if ((w == 4 || w == 8) && V % (16 * w) == 0) return w;
  }
  if (V % 128 == 0 && 4 * chains * (V / 128) >= 3 * sms) return 8;
  return 4;
}

// Whether B1's products are hi + lo (chunk_state_backward_transposed_kernel's kSplit): no unless
// FLASHGRAD_CHUNKED_B1_PRODUCTS=split (read per call). Single-fragment products (fla's backward rounds
// the same operands to bf16) are the default since run 9.2 (H200, 2026-11-30): B1 0.742 -> 0.641 ms at
// B8 T4096 H16 K=V=128, 5.08 -> 4.48 ms at B1 T32768, 0.502 -> 0.467 ms at K=V=64; gradients move by
// <= 2.4e-3 rel RMS against hi + lo (dv, dbeta; dh0 1.9e-3), the GPU tests' worst case is 0.54 of its
// bar, memcheck and racecheck clean.
inline bool state_backward_split_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B1_PRODUCTS");
  return env && std::string(env) == "split";
}

// Whether B1 runs without P on its serial chain (B0 + B1 kLocal, chunked_dv_local.cuh): the
// state-independent part of dv_new (do^T scale P) formed for all chunks at once ahead of B1, which
// then runs in blocks of 4 warps and only adds it. By default where the rule picks 4-warp blocks (few
// chains: B1's serial chain is the time); the launcher also needs dv_new in its own 16-bit buffer (not
// w's region) and single-fragment products. FLASHGRAD_CHUNKED_B1_LOCAL=0 turns it off, =1 forces it
// wherever those hold (read per call). Run 9.3 (H200, 2026-11-30), chunk GDN K=V=128 bf16: B1 T32768
// H16 B0 + B1 0.264 + 2.960 ms against B1 4.345 (backward 8.56 -> 7.47 ms), B2 T16384 0.263 + 1.484
// against 2.153 (5.53 -> 5.13 ms); 2-warp blocks (also timed) were slower than 4 (3.47 / 1.73 ms).
inline bool state_backward_local_wanted(int64_t chains, int64_t V, int64_t sms) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B1_LOCAL");
  if (env && std::string(env) == "0") return false;
  if (V % 64 != 0) return false;
  if (env && std::string(env) == "1") return true;
  return state_backward_warps(chains, V, sms) == 4;
}

// Whether the local B1 (kLocal above) also splits the key channels (chunk_state_backward_transposed_kernel's
// KSPLIT == 2): two warps per 16 value columns, each holding half of dh^T's channels, their partial sums
// of dh^T k^T exchanged through shared memory (one more barrier per chunk), so each warp's serial chain
// of mmas per chunk halves, and blocks of 32 value columns (twice the blocks). By default where the
// 4-warp local blocks (V / 64 per chain) leave SMs idle; FLASHGRAD_CHUNKED_B1_KSPLIT=0 / 1 forces it off
// / on (read per call), to time both in one process; =4 (K = 128 only) splits them in four quarters
// (blocks of 4 warps on 16 value columns, four times the blocks of the unsplit local B1), the default
// where those blocks still fit in one wave (chains * V / 16 <= SMs). Returns the number of channel
// parts: 1, 2 or 4. Run 10.3 (H200, 2026-11-30, chunk GDN bf16 K=V=128): B1 at B1 T32768 H16 (128
// quarter blocks) halves 1.728 -> quarters 1.532 ms; at B2 T16384 (256 quarter blocks: two waves)
// 0.859 -> 1.544, so quarters only within one wave.
inline int state_backward_channel_parts(int64_t chains, int64_t K, int64_t V, int64_t sms) {
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_B1_KSPLIT")) {
    const std::string e(env);
    if (e == "4") return K == 128 ? 4 : 2;
    return e == "1" || e == "2" ? 2 : 1;
  }
  if (K == 128 && chains * (V / 16) <= sms) return 4;
  return chains * (V / 64) < sms ? 2 : 1;
}

// Value columns per block of the local B1 on wgmma (chunk_state_backward_wgmma_kernel, session 17), or 0
// for the mma.sync kernels. FLASHGRAD_CHUNKED_B1_WGMMA=16 / 32 forces that width, =0 turns it off (read
// per call, so one process can time them side by side). By default (kB1WgmmaByDefault; the launcher
// takes it only where the local B1 runs, state_backward_local_wanted): 16 columns where those blocks fit
// in one wave (chains * V / 16 <= SMs), else 32 columns at K = 128 where they fit in two. Run 17.2 (H200,
// chunk GDN bf16 K=V=128 H16, B1 per call, mma.sync local -> wgmma 32 / 16 columns): B1 T32768 1.400 ->
// 1.172 / **0.787 ms** (128 blocks at 16), B2 T16384 0.811 -> **0.578** / 0.785 (256 blocks at 16: two
// waves), B4 T8192 0.808 -> **0.583** / 1.131; gradients within 2.5e-6 rel RMS. Run 17.1: at K = V = 64,
// B8 (256 blocks of 32) the wgmma B1 lost (0.268 vs 0.217), hence K = 128 for the two-wave case.
constexpr bool kB1WgmmaByDefault = true;
inline int state_backward_wgmma_cols(int64_t chains, int64_t K, int64_t V, int64_t sms) {
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_B1_WGMMA")) {
    const int bv = std::atoi(env);
    return bv == 16 || bv == 32 ? bv : 0;
  }
  if (!kB1WgmmaByDefault) return 0;
  if (chains * (V / 16) <= sms) return 16;
  return K == 128 && chains * (V / 32) <= 2 * sms ? 32 : 0;
}

// Whether stage 2's own (unfused) kernel takes single-fragment products (chunk_state_kernel's kSingle:
// h^T, v_new^T rounded to T in the products, as the fused forward and fla take them; h itself stays in
// fp32 accumulators). Run 11.3 (H200, 2026-11-30, chunk GDN bf16): the channel-split shape (few long
// sequences) B1 T32768 H16 K=V=128 1.201 -> 1.052 ms, forward 1.991 -> 1.840 ms (o 7.4e-4 rel RMS from
// hi + lo; the chunked GPU tests pass, worst 0.60 of a bar); the four-warp shape no faster (B8 T4096
// K=V=64 0.163 ms both ways). So: the default of the channel-split shape only.
// FLASHGRAD_CHUNKED_STATE_PRODUCTS=single / split (read per call) forces them on / off for both.
inline bool state_products_single(bool channel_split) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE_PRODUCTS");
  if (env && std::string(env) == "single") return true;
  if (env && std::string(env) == "split") return false;
  return channel_split;
}

// Whether the 16-bit backward runs its stage-2 recomputation and B1 in one launch
// (chunked_state_chains.cuh, session 11): the two serial chains of chunks are independent (B1 reads
// neither h, v_new nor u), and at few long sequences each holds one block per SM at ~20-30% issue
// active. One block per (sequence, value head, 16 value columns) carries stage 2's two channel-split
// warps and B1's four channel-quarter warps, so the two chains share every SM by construction (run
// 10.4 put them on two streams instead: the block scheduler doubled stage-2 blocks up on some SMs,
// whose B1 blocks then waited for a second wave, and B1 went 1.53 -> 2.74 ms). Where: K = 128 and the
// quarter blocks fit one wave (chains * V / 16 <= SMs: B1's quarter rule), with the local B1
// (B0 first; state_backward_local_wanted) and single-fragment B1 products. Costs dh its own buffer
// (it otherwise reuses u's region, which stage 2 reads while B1 writes dh): rows' states, 268 MB at
// B1 T32768 H16 K=V=128. FLASHGRAD_CHUNKED_STATE_CHAINS=0 (read per call) turns it off, =1 / =exact on.
// On by default since run 11.1 (H200, 2026-11-30, chunk GDN bf16 K=V=128, one process): B1 T32768 H16
// stage 2 + B1 1.232 + 1.527 ms -> 2.499 ms in one launch, backward 5.344 -> 5.013 ms; B1 T8192 0.709
// -> 0.631 ms, 1.491 -> 1.392 ms; gradients bit-identical; the chunked GPU tests pass with it.
// Off by default since session 17: where it would run (chains * V / 16 <= SMs) the wgmma stage 2 and
// B1 take 16-column blocks and run apart in 0.623 + 0.787 ms at B1 T32768 (run 17.2), against the
// chains kernel's 2.499 (run 11.1), with dh back in u's region (268 MB less); FLASHGRAD_CHUNKED_STATE_CHAINS=1
// turns it on (DeltaRuleGpu.ChunkedStateChainsOptIn keeps it tested). Only the backward without a kept
// v_new reaches it (the PyTorch and JAX functions keep v_new).
constexpr bool kStateChainsByDefault = false;
// The chains kernel's stage 2 with single-fragment products (the default since run 11.2:
// chunked_state_chains.cuh) unless FLASHGRAD_CHUNKED_STATE_CHAINS=exact (hi + lo). (Stage 2's own
// kernel has its own switch: state_products_single above.)
inline bool state_chains_exact_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE_CHAINS");
  return env && std::string(env) == "exact";
}
// Whether the backward rebuilds the chunk-entry states from v_new after stage 2's recomputation
// (chunked_state_from_vnew.cuh): FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1, read per call, off by default.
// An experiment (session 12) that checks and times the kernel which a forward-kept v_new would let the
// backward run instead of stage 2 (B1 and B2 then read the states it wrote). It needs stage 2 in its
// own launch, so it turns the chains launch below off.
inline bool states_from_vnew_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATES_FROM_VNEW");
  return env && std::string(env) == "1";
}
inline bool state_chains_wanted(int64_t chains, int64_t K, int64_t V, int64_t sms) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE_CHAINS");
  const bool on = (env ? std::string(env) != "0" : kStateChainsByDefault) && !states_from_vnew_wanted();
  return on && K == 128 && V % 16 == 0 && chains * (V / 16) <= sms && !state_backward_split_wanted() &&
         state_backward_local_wanted(chains, V, sms);
}

// dv_new in w's region (on by default since run 9.1; FLASHGRAD_CHUNKED_DVNEW_IN_W=0 turns it off,
// read per call): the 16-bit backward puts dv_new in w's region when that is race-free: K == V (the
// same [rows, HV, 16-bit] layout) and one B1 block per (sequence, value head) (16 x
// state_backward_warps == V), so w's rows of a chunk are read (cp.async, waited for at the top of
// that chunk's iteration) by the block that then writes dv_new over them, and by no other kernel
// after B1 (the split B2 does not read w). Saves rows x HV x V 16-bit elements (128 MiB at B8 T4096
// H16 K=V=128: run 6.4 measured 1557 -> 1429 MiB peak). Run 9.1 passed DeltaRuleGpu.ChunkedDvNewInWRegion
// and the chunked GPU tests, memcheck and racecheck with it.
inline bool dv_new_in_w_allowed(int64_t chains, int64_t K, int64_t V, int64_t sms) {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_DVNEW_IN_W");
  if (env && std::string(env) == "0") return false;
  return K == V && 16 * state_backward_warps(chains, V, sms) == V;
}

// Whether the chunked GDN backward stores h, dh and dv_new in 16 bits and has B2 write the
// gradients itself (ChunkedArgs::h16, dv_out, dq_out): on unless FLASHGRAD_CHUNKED_STATE16=0, and
// only with the new backward's mma B2 (the legacy and v8 stages read fp32 intermediates). Read per
// call, so one process can time both.
inline bool chunked_state16_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_STATE16");
  if (env && std::string(env) == "0") return false;
  return !legacy_backward_wanted() && mma_grads_wanted();
}

// Empty when the stages take this problem; otherwise why not.
std::string chunked_stages_support(DType dtype, int64_t K, int64_t V, bool per_channel_gate);

// Element counts of the intermediates for `rows` token rows (B * T).
struct ChunkedScratchSizes {
  int64_t G, A, w, u, v_new, h;
};
ChunkedScratchSizes chunked_scratch_sizes(int64_t rows, int64_t num_chunks, int64_t HV, int64_t K, int64_t V,
                                          bool gate);

// Stage launchers (T = __nv_bfloat16 or __half); each checks its launch.
template <typename T>
void launch_chunk_prepare(const ChunkedArgs& a, cudaStream_t stream);
template <typename T>
void launch_chunk_state(const ChunkedArgs& a, cudaStream_t stream);
template <typename T>
void launch_chunk_output(const ChunkedArgs& a, cudaStream_t stream);

// Backward stage B1 (grid: sequences x HV x V/32): the reverse pass over chunks, writing dh,
// dv_new and dh0. Needs the forward's G and w (stage 1). The rest of the backward (dq, dk, dv,
// dbeta, dg per chunk) is not written yet.
template <typename T>
void launch_chunk_state_backward(const ChunkedArgs& a, cudaStream_t stream);

// Backward stages B0, then stage 2's recomputation and B1 in one launch (state_chains_wanted;
// chunked_state_chains.cuh): h, v_new, dh (not in u's region), dv_new (its own buffer) and dh0.
template <typename T>
void launch_chunk_state_chains(const ChunkedArgs& a, cudaStream_t stream);

// The chunk-entry states h (or h16) and, with ht, the final state rebuilt from v_new, k, G and h0
// (grid: sequences x segments x HV x V/16; chunked_state_from_vnew.cuh). Needs stage 1's G and stage
// 2's v_new; `ws` (ws_floats floats) is the segmented pass's workspace (fp32; may alias any buffer
// dead during the call).
template <typename T>
void launch_chunk_state_from_vnew(const ChunkedArgs& a, float* ws, int64_t ws_floats, cudaStream_t stream);

// Backward stage B2 (grid: chunks x HV): per-chunk dq, dk, dv, dbeta, dg on CUDA cores in fp32
// (a correctness-first version, not tensor cores). Needs A (stage 1), h and v_new (stage 2), dh and
// dv_new (B1); dq_acc and dk_acc zeroed.
template <typename T>
void launch_chunk_grads(const ChunkedArgs& a, cudaStream_t stream);

// dv: B2's fp32 [rows, HV, V] accumulator rounded into the caller's view `dv` ([B, T, HV, V]).
template <typename T>
void launch_chunk_dv_finish(const ChunkedArgs& a, View dv, int64_t batch, cudaStream_t stream);

// dq, dk from B2's accumulators (direct outputs with GVA): the L2-norm backward and rounding into
// the views dq, dk ([B, T, H, K]).
template <typename T>
void launch_chunk_qk_finish(const ChunkedArgs& a, View dq, View dk, int64_t batch, cudaStream_t stream);

// Stage 2 with stage 3 fused in (writes o and the final state; h is left unwritten, and v_new unless
// a.keep_v_new, which only the forward may do) when it suits the problem (chunked_launch_impl.cuh,
// fused_output_wanted); returns false, launching nothing, otherwise.
template <typename T>
bool launch_chunk_state_with_output(const ChunkedArgs& a, cudaStream_t stream);

// Which of the intermediates u, v_new and h a stage launcher needs allocated (check_chunked_args; w,
// the chunk plan and, with a gate, G every stage needs). Stage 1 needs none of the three (it writes u
// where given: a backward reading a kept v_new has no reader of u); the fused state + output kernel
// writes no h, and v_new only when the forward keeps it.
struct StageUses {
  bool u = true, v_new = true, h = true;
};

// Whether the forward runs stage 3 fused into stage 2 (chunked_state.cuh, kOutput): blocks of 8
// warps (128 value columns), so V % 128 == 0, and by default only with enough (sequence, value
// head, slice) blocks to cover most SMs: its serial chunk loop does twice stage 2's work, while
// stage 3 alone is chunk-parallel and does better on few long sequences.
// FLASHGRAD_CHUNKED_FUSED_OUTPUT=0 / 1 forces it off / on (where V allows; read per call).
// On since the H200 run of 2026-11-30: B8 T4096 H16 K=V=128 forward 1.34 ms fused vs 1.48 unfused;
// B1 T32768 (64 blocks, under the grid rule) stays unfused (fused: 5.98 ms vs 2.59). The fused path
// passed DeltaRuleGpu.Chunked* there with FLASHGRAD_CHUNKED_FUSED_OUTPUT=1. The forward's scratch is
// sized by this rule (chunked_path.cu: no h, and no v_new unless kept, where it holds).
constexpr bool kFusedOutputByDefault = true;
inline bool fused_output_wanted(int64_t num_seqs, int64_t HV, int64_t V, int64_t sms) {
  if (V % 128 != 0) return false;
  if (const char* env = std::getenv("FLASHGRAD_CHUNKED_FUSED_OUTPUT")) return std::string(env) == "1";
  return kFusedOutputByDefault && 4 * num_seqs * HV * (V / 128) >= 3 * sms;
}

// Whether the forward's unfused stages 2 and 3 pass h_c in T (stage 2 rounds it once; stage 3 takes
// single-fragment products: chunk_output_kernel's kSingle) instead of fp32 with hi + lo products: the
// precision of the fused state + output kernel (the forward's default at many chains) and of fla's
// forward, at half the bytes of h. On by default since session 17 (kOutputH16ByDefault);
// FLASHGRAD_CHUNKED_OUTPUT_H16=0 / 1 (read per call) turns it off / on.
constexpr bool kOutputH16ByDefault = true;
inline bool output_h16_wanted() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_OUTPUT_H16");
  return env ? std::string(env) == "1" : kOutputH16ByDefault;
}

// The three stages in order (the whole chunked forward). The caller's scratch says which path runs:
// no h buffer: the fused state + output kernel (fused_output_wanted); h16: stages 2 and 3 with h_c in
// T; h (fp32): in T through its first half when output_h16_wanted, else in fp32.
template <typename T>
void launch_chunked_forward(const ChunkedArgs& a, cudaStream_t stream) {
  launch_chunk_prepare<T>(a, stream);
  if (launch_chunk_state_with_output<T>(a, stream)) return;
  ChunkedArgs b = a;
  if (a.h && output_h16_wanted()) {
    b.h16 = a.h;
    b.h = nullptr;
  }
  launch_chunk_state<T>(b, stream);
  launch_chunk_output<T>(b, stream);
}

}  // namespace flashgrad::cuda_detail::delta_rule
