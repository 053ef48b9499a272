// Pieces of the KDA stage 1 variant of session 13 (FLASHGRAD_CHUNKED_KDA_PREPARE=v2, opt-in;
// kda_prepare_compact_kernel<T, KMAX, true>, chunked_kda_prepare_compact.cuh): the exps of gate
// differences by ex2.approx.ftz on a log2-scaled G, and the diagonal blocks' in-half pairs with two
// units per warp pass.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "chunked_kda_decay.cuh"  // decay_exp
#include "chunked_kda_gate_rows.cuh"  // (recurrent_common.cuh: exp2_ftz, kLog2e)
#include "recurrent_common.cuh"  // View, to_f

namespace flashgrad::cuda_detail::delta_rule {

// Stage 1's exps of gate differences. kExp2 = false (the default kernel): G in shared memory is the
// natural-log cumulative gate and decay_exp (__expf: FMUL by log2 e, then ex2.approx.f32, whose
// denormal-result handling costs an FSETP and two predicated FMULs in SASS: 5 instructions). kExp2
// (FLASHGRAD_CHUNKED_KDA_PREPARE=v2): G in shared memory is stored scaled by log2 e once (the
// intermediate G keeps natural units), so e^(G_a - G_b) = 2^(G'_a - G'_b) is one ex2.approx.ftz
// (2 instructions with the subtraction). Flushing results below 2^-126 to zero only drops terms
// below 1e-38 of the products' unit-size ones; the argument is <= 0 (both factors <= 1) as before.
template <bool kExp2>
__device__ __forceinline__ float stage1_exp(float x) {
  if constexpr (!kExp2) {
    return decay_exp(x);
  } else {
    return exp2_ftz(x);  // (recurrent_common.cuh)
  }
}

// raw_bits, raw_to_f32, load_raw: recurrent_common.cuh (GDN stage 1 uses them too).

// One level of a reduce-scatter within 16-lane groups: of the 2 HS values v[0 .. 2 HS), a lane
// keeps the upper half when its lane bit X is set (the lower one otherwise) plus its partner's
// (lane ^ X) copy of that half, in v[0 .. HS). Compile-time indices (registers, no stack).
template <int HS, int X>
__device__ __forceinline__ void reduce_scatter16_level(float (&v)[64], int lane) {
  static_assert(X < 16, "within a 16-lane group");
  const bool up = (lane & X) != 0;
#pragma unroll
  for (int i = 0; i < HS; ++i) {
    const float send = up ? v[i] : v[i + HS], keep = up ? v[i + HS] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, X);
  }
}

// kda_decayed_in_half_lanes' contract (chunked_kda_prepare_compact.cuh: the in-half pairs of the
// diagonal blocks, 64 register sums per unit of 8 rows, P^T / M into `out` with the row factors on
// the totals; G as stored, exps by stage1_exp<kExp2>) with both of a warp's units in one pass: the
// lanes 16 h + l (h = 0, 1) take unit u = wp + 4 h (rows [8 u, 8 u + 8)) and its channel pairs
// d = 2 l + 32 s' (s' = (s + h) mod S over the S = KMAX / 32 steps s: the two half-warps read k / q
// words 16 apart, i.e. in different banks: their rows differ by 32 pitches of 68 words); the sums
// over the 16 lanes are a reduce-scatter in 4 levels (xor 8, 4, 2, 1; two units' sums in one set of
// shuffles instead of two sets of 5 levels), after which lane l of a half holds the totals of
// v[4 l .. 4 l + 3]. The decayed k of row c down the rows a > c is a running product,
// kc_a = kc_{a-1} f_a with f_t = e^(G_t - G_{t-1}) <= 1 (one FMUL per pair instead of two).
// No barrier.
template <int KMAX, bool kExp2, typename QP, typename KP>
__device__ __forceinline__ void kda_decayed_in_half_pairs16(QP&& qraw, KP&& kraw, const float* qrs, const float* mrs,
                                                            const float* krs, const float* G, int ldg, float* out,
                                                            int ldo) {
  static_assert(KMAX % 32 == 0, "whole channel-pair passes of 16 lanes");
  constexpr int S = KMAX / 32;
  const int wp = threadIdx.x / 32, lane = threadIdx.x & 31, h = lane >> 4, l = lane & 15;
  const int r0 = 8 * (wp + 4 * h);
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = 0.f;
#pragma unroll 1
  for (int s = 0; s < S; ++s) {
    const int d = 2 * l + 32 * ((s + h) % S);
    float2 gg[8], kk[8], qq[8];
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      gg[a] = *reinterpret_cast<const float2*>(&G[(r0 + a) * ldg + d]);
      kk[a] = kraw(r0 + a, d);
      qq[a] = qraw(r0 + a, d);
    }
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
      auto pick = [ch](const float2& x) { return ch == 0 ? x.x : x.y; };
      float f[8];
#pragma unroll
      for (int t = 1; t < 8; ++t) f[t] = stage1_exp<kExp2>(pick(gg[t]) - pick(gg[t - 1]));
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        float kc = pick(kk[c]);
#pragma unroll
        for (int a = c; a < 8; ++a) {
          if (a > c) kc *= f[a];
          v[a * (a + 1) / 2 + c] += pick(qq[a]) * kc;
          if (a > c) v[36 + a * (a - 1) / 2 + c] += pick(kk[a]) * kc;
        }
      }
    }
  }
  reduce_scatter16_level<32, 8>(v, lane);
  reduce_scatter16_level<16, 4>(v, lane);
  reduce_scatter16_level<8, 2>(v, lane);
  reduce_scatter16_level<4, 1>(v, lane);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int idx = 4 * l + e;
    if (idx < 36) {  // P_{r0 + a, r0 + c} at out[r0 + c][r0 + a], idx = a (a + 1) / 2 + c
      int a = 0;
      while ((a + 1) * (a + 2) / 2 <= idx) ++a;
      const int c = idx - a * (a + 1) / 2;
      out[(r0 + c) * ldo + r0 + a] = v[e] * qrs[r0 + a] * krs[r0 + c];
    } else {  // M_{r0 + a, r0 + c} at out[r0 + a][r0 + c], idx - 36 = a (a - 1) / 2 + c
      const int t = idx - 36;
      int a = 1;
      while ((a + 1) * a / 2 <= t) ++a;
      const int c = t - a * (a - 1) / 2;
      out[(r0 + a) * ldo + r0 + c] = v[e] * mrs[r0 + a] * krs[r0 + c];
    }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
