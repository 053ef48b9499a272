// What the host hands the attention kernels: raw pointers, int64 strides (elements) and the resolved
// problem. Plain data, shared by the host launcher (attention_cuda.cpp) and the kernels.
#pragma once

#include <cstdint>

namespace flashgrad::cuda_attn {

enum MaskCode : int { kMaskNone = 0, kMaskCausal, kMaskWindow, kMaskPrefix, kMaskCandidate };
enum SoftcapCode : int { kSoftcapOff = 0, kSoftcapTanh, kSoftcapSoftSign };

// Strides of one [B, S, H, D] (padded) or [T, H, D] (varlen, batch stride 0) tensor.
struct RowMajorStrides {
  int64_t batch = 0, row = 0, head = 0;
};

struct AttentionKernelParams {
  // ---- forward inputs / outputs ----
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional in the forward
  RowMajorStrides q_st, k_st, v_st, out_st;
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  // ---- problem ----
  const int32_t* cu_seqlens_q = nullptr;  // device, varlen only
  const int32_t* cu_seqlens_k = nullptr;
  int num_seqs = 0;
  int seqlen_q = 0, seqlen_k = 0;  // padded lengths, or varlen maxima (grid sizing)
  int64_t total_q = 0;             // rows of the scratch arrays (B*Sq or Tq)
  int heads_q = 0, heads_k = 0;
  float scale = 0.f;

  int mask = kMaskNone;
  int64_t window_left = -1, window_right = -1;
  const int32_t* prefix_lengths = nullptr;  // device [N]
  const int32_t* candidate_bounds = nullptr;  // device [N, 4]
  int64_t candidate_row_stride = 4;

  int softcap_method = kSoftcapOff;
  float softcap = 0.f;

  // ---- backward ----
  const void* dout = nullptr;
  RowMajorStrides dout_st;
  const float* dlse = nullptr;  // optional, strides as lse's
  int64_t dlse_batch_stride = 0, dlse_head_stride = 0, dlse_row_stride = 0;
  float z_loss_weight = 0.f;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  RowMajorStrides dq_st, dk_st, dv_st;
  // Scratch, contiguous: [Hq, total_q] floats, and [total_q, Hq, D] fp32 for the dq accumulation.
  float* lse_log2 = nullptr;    // lse * log2(e); +inf on fully masked rows (so exp2(s - it) = 0)
  float* delta_shift = nullptr;  // rowsum(dO * O) - dLSE - z * lse; 0 on fully masked rows
  float* dq_accum = nullptr;
  bool deterministic = false;
};

}  // namespace flashgrad::cuda_attn
