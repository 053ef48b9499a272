// Per-sequence geometry and the mask rules of docs/attention.md, on the device (MaskView also
// compiles for the host, where attention_gpu_test.cu checks it against the CPU reference's rule).
//
// Positions are within one sequence: query i (0 <= i < len_q), key j (0 <= j < len_k). Masks are
// bottom-right aligned: query i stands at key position a = i + len_k - len_q.
#pragma once

#include <cstdint>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn {

struct SequenceView {
  int len_q = 0, len_k = 0;
  int64_t q_row0 = 0;        // first query row inside the q tensor's token dimension (varlen) or 0
  int64_t k_row0 = 0;        // same for k / v
  int64_t scratch_row0 = 0;  // first row of this sequence in the [.., total_q] scratch arrays
  int64_t q_batch = 0, k_batch = 0;  // batch index for the batch strides (0 in varlen)
};

__device__ __forceinline__ SequenceView sequence_view(const AttentionKernelParams& p, int n) {
  SequenceView s;
  if (p.cu_seqlens_q != nullptr) {
    const int q0 = p.cu_seqlens_q[n], q1 = p.cu_seqlens_q[n + 1];
    const int k0 = p.cu_seqlens_k[n], k1 = p.cu_seqlens_k[n + 1];
    s.len_q = q1 - q0;
    s.len_k = k1 - k0;
    s.q_row0 = q0;
    s.k_row0 = k0;
    s.scratch_row0 = q0;
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
    s.q_batch = s.k_batch = n;
    s.scratch_row0 = static_cast<int64_t>(n) * p.seqlen_q;
  }
  return s;
}

// Element offset of (row, head) of a [B, S, H, D] / [T, H, D] tensor for this sequence.
__device__ __forceinline__ int64_t row_offset(const RowMajorStrides& st, int64_t batch, int64_t row0,
                                              int64_t row, int64_t head) {
  return batch * st.batch + (row0 + row) * st.row + head * st.head;
}

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

enum TileClass : int { kTileEmpty = 0, kTilePartial = 1, kTileFull = 2 };

struct MaskView {
  int kind = kMaskNone;
  int offset = 0;  // len_k - len_q
  int len_q = 0, len_k = 0;
  int64_t wl = -1, wr = -1;
  int prefix = 0;
  int h0 = 0, h1 = 0, c0 = 0, c1 = 0;

  // Whether query i may attend to key j (both inside the sequence).
  __host__ __device__ __forceinline__ bool allowed(int i, int j) const {
    const int a = i + offset;
    switch (kind) {
      case kMaskCausal: return j <= a;
      case kMaskWindow:
        return (wl < 0 || static_cast<int64_t>(j) >= a - wl) &&
               (wr < 0 || static_cast<int64_t>(j) <= a + wr);
      case kMaskPrefix: return j <= a || (a < prefix && j < prefix);
      case kMaskCandidate: {
        const bool i_hist = i >= h0 && i < h1, i_cand = i >= c0 && i < c1;
        const bool j_hist = j >= h0 && j < h1;
        return (j_hist && (i_hist || i_cand)) || (i_cand && j == i);
      }
      default: return true;
    }
  }

  // The keys query row i may see, as [lo, hi) plus one extra key `diag` (-1 if none; only the
  // candidate-isolation diagonal uses it). Rows past len_q see nothing. Per-element tests on partial
  // tiles then cost two or three compares instead of the full rule.
  __host__ __device__ __forceinline__ void query_keys(int i, int& lo, int& hi, int& diag) const {
    diag = -1;
    lo = 0;
    hi = i < len_q ? len_k : 0;
    if (i >= len_q) return;
    const int64_t a = i + offset;
    switch (kind) {
      case kMaskCausal: hi = static_cast<int>(imin64(len_k, a + 1)); break;
      case kMaskWindow:
        if (wl >= 0) lo = static_cast<int>(imax64(0, a - wl));
        if (wr >= 0) hi = static_cast<int>(imin64(len_k, a + wr + 1));
        break;
      case kMaskPrefix:
        hi = static_cast<int>(imin64(len_k, imax64(a + 1, a < prefix ? prefix : 0)));
        break;
      case kMaskCandidate: {
        const bool i_hist = i >= h0 && i < h1, i_cand = i >= c0 && i < c1;
        lo = h0;
        hi = (i_hist || i_cand) ? h1 : h0;
        diag = i_cand ? i : -1;
        break;
      }
      default: break;
    }
  }

  // The queries that may see key j, as [lo, hi); false when no single range describes them
  // (candidate isolation: history keys are seen by two row ranges), then use allowed().
  __host__ __device__ __forceinline__ bool key_queries(int j, int& lo, int& hi) const {
    lo = 0;
    hi = j < len_k ? len_q : 0;
    if (j >= len_k) return true;
    const int64_t jo = static_cast<int64_t>(j) - offset;  // query index whose a equals j
    switch (kind) {
      case kMaskCausal: lo = static_cast<int>(imax64(0, imin64(jo, len_q))); break;
      case kMaskWindow:  // a - wl <= j <= a + wr  <=>  j - wr <= a <= j + wl
        if (wr >= 0) lo = static_cast<int>(imax64(0, imin64(jo - wr, len_q)));
        if (wl >= 0) hi = static_cast<int>(imax64(0, imin64(jo + wl + 1, len_q)));
        break;
      case kMaskPrefix:  // keys in the prefix are seen by every row (a < P or a >= j)
        if (j >= prefix) lo = static_cast<int>(imax64(0, imin64(jo, len_q)));
        break;
      case kMaskCandidate: return false;
      default: break;
    }
    return true;
  }

  // Whether a tile of queries [m0, m1) x keys [n0, n1) (not clipped to the lengths) has no allowed
  // pair (skip it), only allowed pairs inside the sequence (no per-element test), or some of each.
  __host__ __device__ __forceinline__ int classify(int m0, int m1, int n0, int n1) const {
    const int m_last = imin(m1, len_q) - 1, n_last = imin(n1, len_k) - 1;
    if (m_last < m0 || n_last < n0) return kTileEmpty;
    const bool inside = m1 <= len_q && n1 <= len_k;
    const int a0 = m0 + offset, a1 = m_last + offset;
    switch (kind) {
      case kMaskNone: return inside ? kTileFull : kTilePartial;
      case kMaskCausal:
        if (n0 > a1) return kTileEmpty;
        return (inside && n_last <= a0) ? kTileFull : kTilePartial;
      case kMaskWindow: {
        // Row a allows [a - wl, a + wr]; both ends grow with a, so the union over the tile's rows
        // is [lo(a0), hi(a1)] and the intersection is [lo(a1), hi(a0)].
        const int64_t lo0 = wl < 0 ? INT64_MIN / 2 : a0 - wl, lo1 = wl < 0 ? INT64_MIN / 2 : a1 - wl;
        const int64_t hi0 = wr < 0 ? INT64_MAX / 2 : a0 + wr, hi1 = wr < 0 ? INT64_MAX / 2 : a1 + wr;
        if (n0 > hi1 || n_last < lo0) return kTileEmpty;
        return (inside && n0 >= lo1 && n_last <= hi0) ? kTileFull : kTilePartial;
      }
      case kMaskPrefix: {
        const bool causal_any = n0 <= a1;
        const bool prefix_any = a0 < prefix && n0 < prefix;
        if (!causal_any && !prefix_any) return kTileEmpty;
        const bool all_causal = n_last <= a0;
        const bool all_prefix = a1 < prefix && n_last < prefix;
        return (inside && (all_causal || all_prefix)) ? kTileFull : kTilePartial;
      }
      case kMaskCandidate: {
        // Rows in history or candidates see the history keys; candidate rows also see themselves.
        const bool rows_see_history =
            (h0 < h1 && m0 < h1 && m_last >= h0) || (c0 < c1 && m0 < c1 && m_last >= c0);
        const bool keys_in_history = h0 < h1 && n0 < h1 && n_last >= h0;
        const int d0 = imax(imax(m0, n0), c0), d1 = imin(imin(m_last, n_last), c1 - 1);
        if (!(rows_see_history && keys_in_history) && d0 > d1) return kTileEmpty;
        return kTilePartial;
      }
    }
    return kTilePartial;
  }
};

__device__ __forceinline__ MaskView mask_view(const AttentionKernelParams& p, const SequenceView& s,
                                              int n) {
  MaskView m;
  m.kind = p.mask;
  m.offset = s.len_k - s.len_q;
  m.len_q = s.len_q;
  m.len_k = s.len_k;
  m.wl = p.window_left;
  m.wr = p.window_right;
  if (p.mask == kMaskPrefix) m.prefix = p.prefix_lengths[n];
  if (p.mask == kMaskCandidate) {
    const int32_t* b = p.candidate_bounds + n * p.candidate_row_stride;
    m.h0 = b[0];
    m.h1 = b[1];
    m.c0 = b[2];
    m.c1 = b[3];
  }
  return m;
}

// Softcap applied to a scaled score s; `factor` receives d(capped)/d(s) for the backward.
__device__ __forceinline__ float apply_softcap(int method, float cap, float s, float& factor) {
  if (method == kSoftcapTanh) {
    const float t = tanhf(s / cap);
    factor = 1.f - t * t;  // = 1 - (capped / c)^2
    return cap * t;
  }
  if (method == kSoftcapSoftSign) {
    const float d = 1.f + fabsf(s) / cap;
    factor = 1.f / (d * d);
    return s / d;
  }
  factor = 1.f;
  return s;
}

}  // namespace flashgrad::cuda_attn
