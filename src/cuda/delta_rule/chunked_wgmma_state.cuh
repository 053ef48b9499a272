// The state of the delta rule's wgmma chains (chunked_state_wgmma.cuh: h, forward;
// chunked_state_backward_wgmma.cuh: dL/dh, backward) as one warpgroup holds it: [K x BV] fp32 in KP = K / 64
// wgmma accumulator tiles, tile mt = key channels [64 mt, +64). Accumulator element e = 4 i + 2 r + q of a
// tile (warp wg, lane = 4 g + t): key channel 64 mt + 16 wg + g + 8 r, value column 8 i + 2 t + q
// (wgmma_primitives.cuh). What both kernels do with it:
//   load_chain_state / store_chain_state: from the initial state (h0, dht) or zeros / to the final one
//     (ht, dh0), once per chain;
//   stage_chain_state_tile / store_chain_state_rows: in T to a swizzled [K][64] tile in shared memory (the
//     B operand of the chain's first product) / to the per-chunk intermediates (T or fp32), once per chunk.
#pragma once

#include <cstdint>

#include "chunked_mma_ldmatrix.cuh"
#include "chunked_stages.h"
#include "chunked_wgmma_primitives.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// How the wgmma chains issue their products (session 23; the kernels' kIssue). Per chunk a chain issues
// 16 - 24 wgmmas of m64n16k16 (~8 cycles of tensor work each at BV = 16) on its serial path, and ptxas
// built each operand's descriptor from the address anew (mask, shift, or, two R2UR: ~14 instructions per
// wgmma between consecutive issues). kIssue:
//   0: session 18's (descriptors from addresses, one accumulator per product's tile, tiles outer);
//   1: each operand's descriptor formed once per chunk (per kernel for the fixed tiles) and stepped by
//      wgmma_descriptor::desc_advance (one add);
//   2: 1, and consecutive wgmmas into different accumulators (product (1) split over two, summed after
//      the wait; (2) with the key-channel tiles inner), so that none waits on the one just issued.
// (Four chains per product, run 23.4, were no faster than 2's two: 0.552 against 0.543 ms.)
// FLASHGRAD_CHUNKED_WGMMA_ISSUE=0 / 1 / 2 (read per call) picks one at K = 128, BV = 16
// (chunked_launch_impl.cuh), to time them in one process; elsewhere the default.
constexpr int kWgmmaIssue = 2;
// The descriptor of the operand `off` bytes into the tile at shared address base (descriptor desc, leading
// byte offset lbo): kIssue >= 1 steps desc by one add, 0 builds it from the address (session 18's).
template <int kIssue>
__device__ __forceinline__ uint64_t operand_desc(uint64_t desc, uint32_t base, uint32_t off, uint32_t lbo) {
  return kIssue >= 1 ? wgmma_descriptor::desc_advance(desc, off)
                     : ::flashgrad::cuda_attn::sm90::smem_desc(base + off, lbo, 1024);
}
// The accumulators of product (1) (kIssue 2: two, taking alternate k steps; else one).
template <int kIssue>
inline constexpr int kProductAccumulators = kIssue == 2 ? 2 : 1;

// Product (1) of both chains, issued and committed, not waited for: acc = A Hs with A [64 rows][KMAX]
// K-major in KMAX / 64 panels of [64][64] at shared address a_s (w in the forward, k in B1) and Hs [KMAX][BV]
// MN-major at hs_s (its rows hs_bytes apart as the leading byte offset; hs_desc = its descriptor). k step kk:
// A's panel kk / 4, +32 bytes per kk % 4; Hs's rows 16 kk; into acc[kk % NA]. kIssue as kWgmmaIssue.
template <typename T, int KMAX, int BV, int kIssue, int NA = kProductAccumulators<kIssue>>
__device__ __forceinline__ void issue_rows_times_state(float (&acc)[NA][BV / 2], uint32_t a_s, uint32_t hs_s,
                                                       uint64_t hs_desc, uint32_t hs_bytes) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
  constexpr uint32_t kPanel = 64 * 128;
  const uint64_t a_desc = sm90::smem_desc(a_s, 16, 1024);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KMAX / 16; ++kk) {
    const uint32_t a_off = (kk / 4) * kPanel + (kk % 4) * 32, b_off = kk * 16 * 128;
    sm90::wgmma_ss_kt<T, BV>(acc[kk % NA], operand_desc<kIssue>(a_desc, a_s, a_off, 16),
                             operand_desc<kIssue>(hs_desc, hs_s, b_off, hs_bytes), kk >= NA);
  }
  sm90::wgmma_commit();
}
// After product (1)'s wait: its accumulators pinned and summed into acc[0].
template <int BV, int NA>
__device__ __forceinline__ void finish_rows_times_state(float (&acc)[NA][BV / 2]) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
#pragma unroll
  for (int i = 0; i < NA; ++i) sm90::pin_registers(acc[i]);
#pragma unroll
  for (int i = 1; i < NA; ++i)
#pragma unroll
    for (int e = 0; e < BV / 2; ++e) acc[0][e] += acc[i][e];
}

// s = x[n, hv, :, col0 + :] (an fp32 view, by value), or zeros where x is absent.
template <int KP, int BV>
__device__ __forceinline__ void load_chain_state(float (&s)[KP][BV / 2], View x, int64_t n, int64_t hv, int64_t col0,
                                                 int wg, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < KP; ++mt)
#pragma unroll
    for (int e = 0; e < BV / 2; ++e) {
      const int ch = 64 * mt + 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
      s[mt][e] = x.p ? static_cast<const float*>(x.p)[off4(x, n, hv, ch, col0 + col)] : 0.f;
    }
}

// x[n, hv, :, col0 + :] = s where x is given (an fp32 view). (By reference here and by value in
// load_chain_state: the forms whose SASS equals the kernels' code before this header, session 17.)
template <int KP, int BV>
__device__ __forceinline__ void store_chain_state(const float (&s)[KP][BV / 2], const View& x, int64_t n,
                                                  int64_t hv, int64_t col0, int wg, int g, int t) {
  if (x.p) {
    float* out = static_cast<float*>(x.p);
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int e = 0; e < BV / 2; ++e) {
        const int ch = 64 * mt + 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
        out[off4(x, n, hv, ch, col0 + col)] = s[mt][e];
      }
  }
}

// s in T into the swizzled tile at `tile` (this thread's pairs at byte offset `at` = (16 wg + g) * 128 + 4 t
// of the tile, rows + 64 mt + 8 r, 16-byte chunk i at i ^ g): the B operand of the chain's first product.
template <typename T, int KP, int BV>
__device__ __forceinline__ void stage_chain_state_tile(const float (&s)[KP][BV / 2], unsigned char* tile, uint32_t at,
                                                       int g) {
#pragma unroll
  for (int mt = 0; mt < KP; ++mt)
#pragma unroll
    for (int e = 0; e < BV / 2; e += 2) {
      const int rr = 64 * mt + 8 * ((e >> 1) & 1), i = e >> 2;
      *reinterpret_cast<uint32_t*>(tile + at + rr * 128 + (((i ^ g) & 7) << 4)) =
          mma::pack_floats<T>(s[mt][e], s[mt][e + 1]);
    }
}

// s to the per-chunk intermediates: in T at h16 + off if h16 is given, else in fp32 at h + off, where off
// is this thread's first element (key channel 16 wg + g, column 2 t) of the chunk's [K][V] state; V their
// row pitch.
template <typename T, int KP, int BV>
__device__ __forceinline__ void store_chain_state_rows(const float (&s)[KP][BV / 2], void* h16, float* h, int64_t off,
                                                       int V) {
  if (h16) {
    T* const hp = static_cast<T*>(h16) + off;
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2)
        *reinterpret_cast<uint32_t*>(hp + (64 * mt + 8 * ((e >> 1) & 1)) * V + 8 * (e >> 2)) =
            mma::pack_floats<T>(s[mt][e], s[mt][e + 1]);
  } else {
    float* const hp = h + off;
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int e = 0; e < BV / 2; e += 2)
        *reinterpret_cast<float2*>(hp + (64 * mt + 8 * ((e >> 1) & 1)) * V + 8 * (e >> 2)) =
            make_float2(s[mt][e], s[mt][e + 1]);
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
