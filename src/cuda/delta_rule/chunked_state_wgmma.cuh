// Chunked stage 2 ("state") on Hopper warpgroup MMA (session 16; opt-in, FLASHGRAD_CHUNKED_STATE_WGMMA=32 or
// 64 value columns per block, chunked_launch_impl.cuh). Computes what chunk_state_kernel
// (chunked_state.cuh, unfused) computes, per (sequence, value head, slice of BV value columns), over the
// sequence's chunks in order:
//   store h_c;  v_new = u - w h_c (stored in T);  h_{c+1} = exp(G_{L-1}) h_c + k^T (v_new * colscale),
//   colscale_j = exp(G_{L-1} - G_j) rstd_kj for rows j < L, 0 past them.
//
// Why: that kernel's chain runs ~2 us per chunk at B1 T32768 H16 K = V = 128 (1.06 ms for 512 chunks;
// 128 blocks of 2 warps, each warp a few dozen mma.sync per chunk between ldmatrix, fragment
// conversions and two barriers), so the few-long-sequences forward is its serial chain. Here one
// warpgroup (4 warps) does a chunk's two products as two wgmma groups read straight from shared memory:
//   (1) v_new [64 rows x BV] = w [64 x K] h [K x BV]:  m64nBVk16, K / 16 steps; A = w (K-major), B = h
//       (MN-major: the contraction K is h's row index), h written to shared memory as T once per chunk;
//   (2) h [K x BV] += k^T [K x 64] v' [64 x BV]:       m64nBVk16, 4 steps per 64 key channels; A = k^T
//       (MN-major: k's rows are the contraction), B = v' (MN-major), v' = v_new * colscale in T.
// The state h stays in the accumulators of (2) in fp32 (tile mt: key channels [64 mt, +64)); only its
// copy for (1) and v' are rounded to T, as the channel-split kernel's default single-fragment products
// (chunked_stages.h, state_products_single) round them.
//
// Shared memory (1024-byte aligned tiles, the 128-byte swizzle of wgmma_primitives.cuh: rows of 64
// elements, 16-byte chunk c of row r at chunk c ^ (r % 8)): two stages of {w, k: [64 rows][K] as K / 64
// panels of [64][64]; u: [64][BV + 4] fp32, unswizzled}, Hs [K rows][64] (h as (1)'s B), Vs [64][64] (v'
// as (2)'s B), colscale [64]. The next chunk's w, k, u are copied (cp.async, rows >= L zero-filled: u = w
// = 0 there, so v_new = 0) while this chunk computes. Per chunk: barrier (A) after chunk c's copies have
// landed, h_c is in Hs and colscale is written (and every thread is done with chunk c - 1's stage,
// which the next copies overwrite); barrier (B) after v' is in Vs.
//
// Accumulator element e = 4 i + 2 r + q of an m64nN tile (warp wg, lane = 4 g + t): row 16 wg + g + 8 r,
// column 8 i + 2 t + q (wgmma_primitives.cuh).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_stages.h"
#include "chunked_tiles.cuh"
#include "cuda/attention/wgmma_primitives.cuh"

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int BV>
struct StateWgmmaSmem {
  static constexpr int C = kChunkSize, KP = KMAX / 64, LDU = BV + 4;
  static constexpr int64_t kPanel = 64 * 128;          // [64 rows][64 elements] of T
  static constexpr int64_t kKeyTile = KP * kPanel;     // w or k: [64 rows][KMAX]
  static constexpr int64_t kUBytes = sizeof(float) * C * LDU;
  static constexpr int64_t kStageBytes = (2 * kKeyTile + kUBytes + 1023) / 1024 * 1024;
  static constexpr int64_t kHsBytes = KMAX * 128, kVsBytes = 64 * 128;
  static constexpr int64_t kOffHs = 2 * kStageBytes, kOffVs = kOffHs + kHsBytes, kOffScale = kOffVs + kVsBytes;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes in the kernel.
  static constexpr int64_t bytes() { return 1024 + kOffScale + sizeof(float) * C; }
};

// Byte offset of 16-byte chunk `chunk` (of 8 elements) of row r in a swizzled tile of 128-byte rows.
__device__ __forceinline__ uint32_t swizzled(int r, int chunk) {
  return static_cast<uint32_t>(r * 128 + (((chunk & 7) ^ (r & 7)) << 4));
}

template <typename T, int KMAX, int BV>
__global__ void __launch_bounds__(128, 1) chunk_state_wgmma_kernel(ChunkedArgs a) {
  namespace sm90 = ::flashgrad::cuda_attn::sm90;
  using S = StateWgmmaSmem<T, KMAX, BV>;
  constexpr int C = kChunkSize, KP = S::KP, LDU = S::LDU, KC = KMAX / 8;  // KC: 16-byte chunks per key row
  static_assert(BV == 32 || BV == 64, "32 or 64 value columns per block");
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_dyn) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float* const colscale = reinterpret_cast<float*>(smem + S::kOffScale);

  const int64_t n = blockIdx.x, hv = blockIdx.y, head = hv / (a.HV / a.H);
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * BV, HV = a.HV, V = a.V, K = a.K;
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 5, g = lane >> 2, t = lane & 3;
  const T* const w = static_cast<const T*>(a.w);
  const T* const kv = static_cast<const T*>(a.k.p);
  T* const v_new = static_cast<T*>(a.v_new);
  const bool vn_pairs = (reinterpret_cast<uintptr_t>(v_new) & 3) == 0;  // else 2-byte stores
  const int64_t c_begin = a.seq_first_chunk[n], c_end = a.seq_first_chunk[n + 1];

  // The state: tile mt = key channels [64 mt, +64) x the slice's BV columns.
  float h[KP][BV / 2];
#pragma unroll
  for (int mt = 0; mt < KP; ++mt)
#pragma unroll
    for (int e = 0; e < BV / 2; ++e) {
      const int ch = 64 * mt + 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
      h[mt][e] = a.h0.p ? static_cast<const float*>(a.h0.p)[off4(a.h0, n, hv, ch, col0 + col)] : 0.f;
    }

  // Copies of chunk ci into stage st (one cp.async group); returns G of row tid / 2 (0 past L) and,
  // in g_last, G of the chunk's last row.
  auto prefetch = [&](const ChunkInfo& ci, int st, float& g_last) {
    unsigned char* base = smem + st * S::kStageBytes;
    const int64_t row0 = chunk_row0(ci, a.T);
    const int L = ci.len;
#pragma unroll
    for (int i = 0; i < C * KC / 128; ++i) {
      const int p = tid + 128 * i, r = p / KC, ck = p % KC;
      const bool ok = r < L;
      const int rs = ok ? r : 0;
      const uint32_t at = static_cast<uint32_t>((ck / 8) * S::kPanel) + swizzled(r, ck);
      mma::cp_async16(base + at, w + ((row0 + rs) * HV + hv) * K + 8 * ck, ok);
      mma::cp_async16(base + S::kKeyTile + at, kv + off3(a.k, ci.b, ci.t0 + rs, head) + 8 * ck, ok);
    }
    float* u_s = reinterpret_cast<float*>(base + 2 * S::kKeyTile);
#pragma unroll
    for (int i = 0; i < C * BV / 4 / 128; ++i) {
      const int p = tid + 128 * i, r = p / (BV / 4), ck = p % (BV / 4);
      const bool ok = r < L;
      mma::cp_async16(u_s + r * LDU + 4 * ck, a.u + ((row0 + (ok ? r : 0)) * HV + hv) * V + col0 + 4 * ck, ok);
    }
    mma::cp_async_commit();
    g_last = a.G ? a.G[(row0 + L - 1) * HV + hv] : 0.f;
    const int j = tid >> 1;
    return (a.G && j < L) ? a.G[(row0 + j) * HV + hv] : 0.f;
  };

  ChunkInfo ci_cur{}, ci_next{};
  float g_row = 0.f, g_last = 0.f;
  if (c_begin < c_end) {
    ci_cur = a.chunks[c_begin];
    g_row = prefetch(ci_cur, 0, g_last);
    if (c_begin + 1 < c_end) ci_next = a.chunks[c_begin + 1];
  }
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int st = static_cast<int>((c - c_begin) & 1);
    const ChunkInfo ci = ci_cur;
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    const float G_last = g_last, G_j = g_row;
    unsigned char* const base = smem + st * S::kStageBytes;
    const uint32_t w_s = smem_s + st * S::kStageBytes, k_s = w_s + S::kKeyTile;
    const float* const u_s = reinterpret_cast<const float*>(base + 2 * S::kKeyTile);
    const uint32_t hs_s = smem_s + S::kOffHs, vs_s = smem_s + S::kOffVs;

    // h_c: to the intermediates (fp32, or T for the backward's 16-bit mode) and, in T, to Hs.
    {
      const int64_t at = (c * HV + hv) * K * V + col0;
#pragma unroll
      for (int mt = 0; mt < KP; ++mt)
#pragma unroll
        for (int e = 0; e < BV / 2; e += 2) {
          const int ch = 64 * mt + 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t;
          const uint32_t pair = mma::pack_floats<T>(h[mt][e], h[mt][e + 1]);
          *reinterpret_cast<uint32_t*>(smem + S::kOffHs + swizzled(ch, col >> 3) + 2 * (col & 7)) = pair;
          if (a.h16)
            *reinterpret_cast<uint32_t*>(static_cast<T*>(a.h16) + at + ch * V + col) = pair;
          else
            *reinterpret_cast<float2*>(a.h + at + ch * V + col) = make_float2(h[mt][e], h[mt][e + 1]);
        }
    }
    // colscale of row j = tid / 2 (two threads per row, half of k's row each).
    mma::cp_async_wait<0>();
    {
      const int j = tid >> 1, half = tid & 1;
      float ss = 0.f;
      if (a.l2norm) {
#pragma unroll
        for (int q = 0; q < KC / 2; ++q) {
          const int ck = half * (KC / 2) + q;
          const uint4 x = *reinterpret_cast<const uint4*>(base + S::kKeyTile + (ck / 8) * S::kPanel + swizzled(j, ck));
          const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            float lo, hi;
            mma::unpack_floats<T>(xs[m], lo, hi);
            ss += lo * lo + hi * hi;
          }
        }
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      }
      const float rstd = a.l2norm ? 1.0f / sqrtf(ss + kL2NormEps) : 1.f;
      if (half == 0) colscale[j] = j < L ? expf(G_last - G_j) * rstd : 0.f;
    }
    // (A) chunk c's w, k, u, Hs and colscale in place; every thread is done with chunk c - 1.
    sm90::fence_proxy_async_shared();
    __syncthreads();
    if (c + 1 < c_end) {
      g_row = prefetch(ci_next, st ^ 1, g_last);
      ci_cur = ci_next;
      if (c + 2 < c_end) ci_next = a.chunks[c + 2];
    }

    // (1) v_new's product w h_c.
    float acc[BV / 2];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KMAX / 16; ++kk) {
      const uint32_t ad = w_s + (kk / 4) * S::kPanel + (kk % 4) * 32;
      const uint32_t bd = hs_s + kk * 16 * 128;
      sm90::wgmma_ss_kt<T, BV>(acc, sm90::smem_desc(ad, 16, 1024), sm90::smem_desc(bd, S::kHsBytes, 1024), kk > 0);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::pin_registers(acc);

    // v_new = u - w h_c: stored in T for rows < L; v' = v_new colscale into Vs.
    T* const vn_at = v_new + (row0 * HV + hv) * V + col0;
#pragma unroll
    for (int e = 0; e < BV / 2; e += 2) {
      const int row = 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t;
      const float2 u = *reinterpret_cast<const float2*>(u_s + row * LDU + col);
      const float v0 = u.x - acc[e], v1 = u.y - acc[e + 1];
      if (row < L) {
        T* const dst = vn_at + row * HV * V + col;
        if (vn_pairs) {
          *reinterpret_cast<uint32_t*>(dst) = mma::pack_floats<T>(v0, v1);
        } else {
          dst[0] = from_f<T>(v0);
          dst[1] = from_f<T>(v1);
        }
      }
      const float cs = colscale[row];
      *reinterpret_cast<uint32_t*>(smem + S::kOffVs + swizzled(row, col >> 3) + 2 * (col & 7)) =
          mma::pack_floats<T>(v0 * cs, v1 * cs);
    }
    const float decay = expf(G_last);
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int e = 0; e < BV / 2; ++e) h[mt][e] *= decay;
    // (B) v' in Vs.
    sm90::fence_proxy_async_shared();
    __syncthreads();

    // (2) h += k^T v'.
    sm90::wgmma_fence();
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) {
        const uint32_t ad = k_s + mt * S::kPanel + kk * 16 * 128;
        const uint32_t bd = vs_s + kk * 16 * 128;
        sm90::wgmma_ss_tt<T, BV>(h[mt], sm90::smem_desc(ad, S::kPanel, 1024), sm90::smem_desc(bd, S::kVsBytes, 1024),
                                 1);
      }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < KP; ++mt) sm90::pin_registers(h[mt]);
  }

  if (a.ht.p) {
    float* ht = static_cast<float*>(a.ht.p);
#pragma unroll
    for (int mt = 0; mt < KP; ++mt)
#pragma unroll
      for (int e = 0; e < BV / 2; ++e) {
        const int ch = 64 * mt + 16 * wg + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
        ht[off4(a.ht, n, hv, ch, col0 + col)] = h[mt][e];
      }
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
