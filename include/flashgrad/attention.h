// flashgrad: softmax attention, forward and backward (contract: docs/attention.md).
//
// Layouts (the last dimension is always contiguous; other strides are free):
//   padded:  q [B, Sq, Hq, D]   k [B, Sk, Hk, D]   v [B, Sk, Hk, Dv]  -> out [B, Sq, Hq, Dv], lse [B, Hq, Sq]
//   varlen:  q [Tq, Hq, D]      k [Tk, Hk, D]      v [Tk, Hk, Dv]     -> out [Tq, Hq, Dv],    lse [Hq, Tq]
//            with cu_seqlens_q / cu_seqlens_k int32 [N+1] (0 = c[0] <= c[1] <= ... <= c[N] = Tq / Tk).
// GQA/MQA: Hq % Hk == 0; query head h reads kv head h / (Hq / Hk).
// Masks are bottom-right aligned: query i of a sequence sits at key position a_i = i + Sk - Sq.
#pragma once

#include "flashgrad/common.h"
#include "flashgrad/tensor.h"

namespace flashgrad {

enum class MaskKind : int32_t {
  none,                 // every key
  causal,               // j <= a_i
  sliding_window,       // a_i - window_left <= j <= a_i + window_right (-1: unbounded side)
  prefix_lm,            // j <= a_i, or (a_i < P and j < P); P = prefix_lengths[n]
  candidate_isolation,  // (j in history and i in history or candidates) or (i in candidates and j == i)
};

enum class SoftcapMethod : int32_t {
  tanh,       // s = c * tanh(s / c)
  soft_sign,  // s = s / (1 + |s| / c)
};

const char* mask_name(MaskKind m);
const char* softcap_method_name(SoftcapMethod m);

struct AttentionParams {
  TensorView q, k, v;

  // Packed variable length: both present (int32 [N+1]) or both absent.
  TensorView cu_seqlens_q, cu_seqlens_k;
  // Varlen only: upper bounds of the sequence lengths (kernels size their grids with them).
  // 0 means "compute from cu_seqlens" (costs a device-to-host copy on the CUDA backend).
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;

  float scale = kDefaultScale;  // default 1/sqrt(D)

  MaskKind mask = MaskKind::none;
  int64_t window_left = -1, window_right = -1;  // sliding_window only; -1 = unbounded
  TensorView prefix_lengths;    // prefix_lm: int32 [N] (N = B, or number of sequences)
  TensorView candidate_bounds;  // candidate_isolation: int32 [N, 4] = h0, h1, c0, c1 (absolute)

  float softcap = 0.0f;  // 0 = off
  SoftcapMethod softcap_method = SoftcapMethod::tanh;

  // FP8 (q, k, v in e4m3): fp32 [B, Hk] descales (true value = stored * descale).
  TensorView descale_q, descale_k, descale_v;

  // Backward: bitwise-identical dq/dk/dv on every run.
  bool deterministic = false;

  ExecutionOptions exec;
};

// out: [B, Sq, Hq, Dv] / [Tq, Hq, Dv] in q's dtype (bf16 for e4m3 inputs).
// lse: optional, float32 [B, Hq, Sq] / [Hq, Tq] (natural log; -inf on fully masked rows).
void attention_forward(const AttentionParams& p, const TensorView& out, const TensorView& lse,
                       Workspace workspace = {});

struct AttentionBackwardInputs {
  TensorView out;   // the forward's output
  TensorView lse;   // the forward's lse (required)
  TensorView dout;  // same shape and dtype as out
  TensorView dlse;  // optional, float32, shape of lse
  float z_loss_weight = 0.0f;  // adds z_loss_weight * lse_i to dlse_i inside the backward
};

// dq, dk, dv: shapes of q, k, v in their dtype (bf16 for e4m3 inputs).
void attention_backward(const AttentionParams& p, const AttentionBackwardInputs& in,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        Workspace workspace = {});

// Scratch bytes the chosen backend needs for this pass (0 when none).
std::size_t attention_workspace_bytes(const AttentionParams& p, Pass pass);

}  // namespace flashgrad
