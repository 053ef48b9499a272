// The score step of the Hopper attention backwards (wgmma_backward_kernel.cuh, bf16 / fp16, and
// fp8_wgmma_backward_kernel.cuh, e4m3): S^T and dP^T accumulators -> P^T and dS^T as 16-bit A
// fragments. No inline PTX here, so the FP8 kernel's host emulation compiles it as it is.
#pragma once

#include <cstdint>

#include "attention_forward_kernel.cuh"
#include "sequence_and_mask.cuh"

namespace flashgrad::cuda_attn {

// P^T and dS^T of one warpgroup's 64 keys x BM queries from S^T (s) and dP^T (dp), straight into
// 16-bit A fragments (pa, pds: 16 queries = two 8-column accumulator chunks per k step), each chunk
// packed as soon as it is computed so that the fp32 scores die early (at D = 64, BM = 128, S^T and
// dP^T alone take 128 registers). Accumulator element e = 4 i + 2 r + c sits at key row
// 16 warp + g + 8 r of the warpgroup's 64 and query column 8 i + 2 t + c of the tile; it lands in
// word pa[i / 2][2 (i % 2) + r], half c. Three modes (BackwardScoreMode), each inlined only where
// its tiles need it: full tiles without softcap (raw S, scale folded into the exponent), masked
// tiles without softcap (the same, then P = 0 outside the mask), and softcap (per element tanh /
// soft_sign and mask). The masked mode is separate from the softcap one because a causal walk
// alternates full and diagonal tiles: with the softcap code inlined into the diagonal tiles' path
// the loop no longer fit the instruction cache (ncu, hd64 causal: 19% of warp samples stalled on
// "no instruction"). qk_scale turns the raw S^T into
// scaled scores and dp_scale the raw dP^T into dP: the softmax scale and 1 for 16-bit inputs, with
// the e4m3 descales folded in for FP8 (descale_q descale_k scale, descale_dO descale_v).
enum BackwardScoreMode : int { kBwdScoresFull = 0, kBwdScoresMasked = 1, kBwdScoresSoftcap = 2 };

// The element loop of backward_scores. kRangeOnly: the mask of both key rows is a query range
// [q_lo, q_hi) (relative to m0 + 2t; MaskView::key_queries said so), checked by two compares per
// element; otherwise (masked mode) every element asks MaskView::allowed, or (softcap mode) picks
// one of the two at run time. Kept as separate unrolled copies so the causal diagonal tiles run a
// short straight-line loop, not one that jumps over the general code of every element.
template <int kMode, bool kRangeOnly, int BM, typename Ops>
__device__ __forceinline__ void backward_scores_loop(const float (&s)[BM / 2], const float (&dp)[BM / 2],
                                                     uint32_t (&pa)[BM / 16][4], uint32_t (&pds)[BM / 16][4],
                                                     const float* lse, const float* shift, float qk_scale,
                                                     float dp_scale, const AttentionKernelParams& p,
                                                     const SequenceView& sv, const MaskView& mask, int key0, int m0,
                                                     int t, const int (&q_lo)[2], const int (&q_hi)[2], bool ranged) {
  const float scale_log2 = qk_scale * kLog2e;
#pragma unroll
  for (int i = 0; i < BM / 8; ++i) {
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
    const float2 sh = *reinterpret_cast<const float2*>(shift + 8 * i + 2 * t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float pr2[2], ds2[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * i + 2 * r + c;
        const float lq = c ? l.y : l.x, shq = c ? sh.y : sh.x;
        float pr, factor = 1.f;
        if constexpr (kMode == kBwdScoresSoftcap) {
          const float x = apply_softcap(p.softcap_method, p.softcap, s[e] * qk_scale, factor);
          pr = fast_exp2(x * kLog2e - lq);
        } else {
          pr = fast_exp2(s[e] * scale_log2 - lq);
        }
        if constexpr (kMode != kBwdScoresFull) {
          const int ir = 8 * i + c;  // query - m0 - 2t
          const int qi = m0 + 8 * i + 2 * t + c, kj = key0 + 8 * r;
          bool ok;
          if constexpr (kRangeOnly)
            ok = ir >= q_lo[r] && ir < q_hi[r];
          else if constexpr (kMode == kBwdScoresMasked)
            ok = qi < sv.len_q && kj < sv.len_k && mask.allowed(qi, kj);
          else
            ok = ranged ? ir >= q_lo[r] && ir < q_hi[r] : qi < sv.len_q && kj < sv.len_k && mask.allowed(qi, kj);
          if (!ok) pr = 0.f;
        }
        pr2[c] = pr;
        ds2[c] = pr * (dp[e] * dp_scale - shq) * factor;
      }
      pa[i / 2][2 * (i % 2) + r] = Ops::pack(pr2[0], pr2[1]);
      pds[i / 2][2 * (i % 2) + r] = Ops::pack(ds2[0], ds2[1]);
    }
  }
}

template <int kMode, int BM, typename Ops>
__device__ __forceinline__ void backward_scores(const float (&s)[BM / 2], const float (&dp)[BM / 2],
                                                uint32_t (&pa)[BM / 16][4], uint32_t (&pds)[BM / 16][4],
                                                const float* lse, const float* shift, float qk_scale,
                                                float dp_scale, const AttentionKernelParams& p, const SequenceView& sv,
                                                const MaskView& mask, int key0, int m0, int t) {
  int q_lo[2] = {0, 0}, q_hi[2] = {0, 0};  // queries that may see key0 (+8), relative to m0 + 2t
  bool ranged = true;
  if constexpr (kMode != kBwdScoresFull) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ranged = mask.key_queries(key0 + 8 * r, q_lo[r], q_hi[r]) && ranged;
      q_lo[r] -= m0 + 2 * t;
      q_hi[r] -= m0 + 2 * t;
    }
  }
  if (kMode == kBwdScoresMasked && ranged)
    backward_scores_loop<kMode, true, BM, Ops>(s, dp, pa, pds, lse, shift, qk_scale, dp_scale, p, sv, mask, key0, m0,
                                               t, q_lo, q_hi, ranged);
  else
    backward_scores_loop<kMode, false, BM, Ops>(s, dp, pa, pds, lse, shift, qk_scale, dp_scale, p, sv, mask, key0,
                                                m0, t, q_lo, q_hi, ranged);
}

// The same step in two phases, for tiles of BM = 64 queries (hd 128 / 256, and every FP8 tile),
// where the registers allow P^T to stay in fp32 between them (at BM = 128 they do not):
//   backward_probs, as soon as the S^T product is done (dP^T's may still run on the tensor
//   cores): s <- P^T in place (same formula and mask as backward_scores' full / masked modes) and
//   pa <- P^T packed;
//   backward_dscores, once dP^T is done: pds <- dS^T = P^T (dP^T dp_scale - shift), packed.
// So the exponentials overlap the dP^T product instead of waiting for it. Not for softcap (its
// derivative factor would have to live between the phases): backward_scores serves it.
template <int kMode, bool kRangeOnly, int BM, typename Ops>
__device__ __forceinline__ void backward_probs_loop(float (&s)[BM / 2], uint32_t (&pa)[BM / 16][4], const float* lse,
                                                    float scale_log2, const SequenceView& sv, const MaskView& mask,
                                                    int key0, int m0, int t, const int (&q_lo)[2],
                                                    const int (&q_hi)[2]) {
#pragma unroll
  for (int i = 0; i < BM / 8; ++i) {
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * i + 2 * r + c;
        float pr = fast_exp2(s[e] * scale_log2 - (c ? l.y : l.x));
        if constexpr (kMode == kBwdScoresMasked) {
          bool ok;
          if constexpr (kRangeOnly) {
            const int ir = 8 * i + c;  // query - m0 - 2t
            ok = ir >= q_lo[r] && ir < q_hi[r];
          } else {
            const int qi = m0 + 8 * i + 2 * t + c, kj = key0 + 8 * r;
            ok = qi < sv.len_q && kj < sv.len_k && mask.allowed(qi, kj);
          }
          if (!ok) pr = 0.f;
        }
        s[e] = pr;
      }
      pa[i / 2][2 * (i % 2) + r] = Ops::pack(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
    }
  }
}

template <int kMode, int BM, typename Ops>
__device__ __forceinline__ void backward_probs(float (&s)[BM / 2], uint32_t (&pa)[BM / 16][4], const float* lse,
                                               float qk_scale, const SequenceView& sv, const MaskView& mask, int key0,
                                               int m0, int t) {
  static_assert(kMode != kBwdScoresSoftcap, "softcap: backward_scores");
  const float scale_log2 = qk_scale * kLog2e;
  int q_lo[2] = {0, 0}, q_hi[2] = {0, 0};  // queries that may see key0 (+8), relative to m0 + 2t
  bool ranged = true;
  if constexpr (kMode == kBwdScoresMasked) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ranged = mask.key_queries(key0 + 8 * r, q_lo[r], q_hi[r]) && ranged;
      q_lo[r] -= m0 + 2 * t;
      q_hi[r] -= m0 + 2 * t;
    }
  }
  if constexpr (kMode == kBwdScoresFull)
    backward_probs_loop<kMode, true, BM, Ops>(s, pa, lse, scale_log2, sv, mask, key0, m0, t, q_lo, q_hi);
  else if (ranged)
    backward_probs_loop<kMode, true, BM, Ops>(s, pa, lse, scale_log2, sv, mask, key0, m0, t, q_lo, q_hi);
  else
    backward_probs_loop<kMode, false, BM, Ops>(s, pa, lse, scale_log2, sv, mask, key0, m0, t, q_lo, q_hi);
}

template <int BM, typename Ops>
__device__ __forceinline__ void backward_dscores(const float (&prob)[BM / 2], const float (&dp)[BM / 2],
                                                 uint32_t (&pds)[BM / 16][4], const float* shift, float dp_scale,
                                                 int t) {
#pragma unroll
  for (int i = 0; i < BM / 8; ++i) {
    const float2 sh = *reinterpret_cast<const float2*>(shift + 8 * i + 2 * t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int e = 4 * i + 2 * r;
      pds[i / 2][2 * (i % 2) + r] =
          Ops::pack(prob[e] * (dp[e] * dp_scale - sh.x), prob[e + 1] * (dp[e + 1] * dp_scale - sh.y));
    }
  }
}

}  // namespace flashgrad::cuda_attn
