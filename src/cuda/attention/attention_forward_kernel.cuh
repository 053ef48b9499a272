// Softmax attention forward (FlashAttention-2 scheme on mma.sync tensor cores).
//
// One CTA = one block of kBlockM queries of one (sequence, query head); each warp owns 16 query rows.
// It walks the key blocks that the mask does not rule out entirely, computing S = Q K^T in
// registers, an online softmax (running max m and sum l per row, in log2 units), and O += P V,
// with P taken straight from the S accumulators. K and V tiles stream through shared memory with
// cp.async: V(j) loads while S(j) is computed, K(j+1) while P(j) V(j) is.
#pragma once

#include <cmath>

#include "sequence_and_mask.cuh"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

#ifndef FLASHGRAD_ATTN_FWD_WIDE_BLOCK_N
#define FLASHGRAD_ATTN_FWD_WIDE_BLOCK_N 32
#endif

// kWarps warps, each owning kMTiles x 16 query rows: two row tiles per warp let every K / V
// fragment loaded from shared memory feed twice as many mma's (ldmatrix bandwidth, not the tensor
// cores, limits one tile per warp); at D = 256 the 16 x 256 accumulator leaves room for one.
template <int D, int kWarps, int kMTiles>
struct ForwardConfig {
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kBlockM = kRowsPerWarp * kWarps;
  // Keys per step: 64, or FLASHGRAD_ATTN_FWD_WIDE_BLOCK_N (default 32) when two row tiles of a
  // 128-wide head would not fit in registers beside a 64-key S tile (the macro is a tuning knob
  // for tools/dev experiments).
  static constexpr int kBlockN = (kMTiles == 2 && D >= 128) ? FLASHGRAD_ATTN_FWD_WIDE_BLOCK_N : 64;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSmemElems = (kBlockM + 2 * kBlockN) * D;
  static constexpr int kSmemBytes = kSmemElems * 2;
};

// Next key block at or after `nb` that has any allowed pair with queries [m0, m1); -1 if none.
template <int kBlockN>
__device__ __forceinline__ int next_key_block(const MaskView& mask, int nb, int num_nb, int m0,
                                              int m1, int& cls) {
  for (; nb < num_nb; ++nb) {
    cls = mask.classify(m0, m1, nb * kBlockN, (nb + 1) * kBlockN);
    if (cls != kTileEmpty) return nb;
  }
  return -1;
}

// Per-thread state of the forward walk over key blocks: for each row tile, the output accumulator
// and the running max / partial sum of rows g and g + 8.
template <int D, int kMTiles>
struct ForwardState {
  float acc_o[kMTiles][D / 8][4];
  float row_max[kMTiles][2];  // log2 units
  float row_sum[kMTiles][2];  // this thread's partial sums
};

// One key block: S = Q K^T, softmax update, O += P V; prefetches the next K block in between.
// kGeneral: the tile needs per-element masking or a softcap (diagonal / edge tiles, softcap runs);
// the common full tile takes the short path so the hot loop stays small in the instruction cache.
template <bool kGeneral, typename T, int D, int kWarps, int kMTiles>
__device__ __forceinline__ void forward_key_block(
    ForwardState<D, kMTiles>& st, const AttentionKernelParams& p, const SequenceView& sv,
    const MaskView& mask, uint32_t uQ, uint32_t uK, uint32_t uV, T* sK, const T* k,
    const LaneOffsets<D>& rc, const LaneOffsets<D>& cr, int m0, int nb, int num_nb, int& next,
    int& next_cls) {
  using Cfg = ForwardConfig<D, kWarps, kMTiles>;
  using Ops = ElementOps<T>;
  constexpr int BN = Cfg::kBlockN, NT = BN / 8, DT = D / 8, MT = kMTiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row_in_warp = warp * Cfg::kRowsPerWarp;

  // S = Q K^T for this warp's rows x BN keys.
  float acc_s[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < NT; ++i) acc_s[mt][i][0] = acc_s[mt][i][1] = acc_s[mt][i][2] = acc_s[mt][i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a<D>(a[mt], uQ, rc, row_in_warp + mt * 16, kk * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_nk<D>(b, uK, cr, np * 16, kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Ops::mma(acc_s[mt][2 * np], a[mt], b[0], b[1]);
        Ops::mma(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }

  // Scores in log2 units (softcapped, masked to -inf where not allowed).
  const float scale_log2 = p.scale * kLog2e;
  if constexpr (kGeneral) {
    // Keys relative to this block's first key, so the per-element test is on small ints.
    const int n0 = nb * BN;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int lo, hi, diag;
        mask.query_keys(m0 + row_in_warp + mt * 16 + g + 8 * r, lo, hi, diag);
        lo -= n0 + 2 * t;
        hi -= n0 + 2 * t;
        diag -= n0 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float s = acc_s[mt][nt][2 * r + c];
            if (p.softcap_method != kSoftcapOff) {
              float unused;
              s = apply_softcap(p.softcap_method, p.softcap, s * p.scale, unused) * kLog2e;
            } else {
              s *= scale_log2;
            }
            const int jr = nt * 8 + c;  // key - n0 - 2t
            if (!((jr >= lo && jr < hi) || jr == diag)) s = -INFINITY;
            acc_s[mt][nt][2 * r + c] = s;
          }
        }
      }
    }
  }

  // Online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3) of each row tile. On the short path
  // the scale is folded into the exponent: p = 2^(s * scale_log2 - max * scale_log2).
  const float mul = kGeneral ? 1.f : scale_log2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]));
      mx = fmaxf(quad_max(mx) * mul, st.row_max[mt][r]);
      // A row with nothing allowed yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      const float base = mx == -INFINITY ? 0.f : mx;
      const float rescale = fast_exp2(st.row_max[mt][r] - base);
      st.row_max[mt][r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc_s[mt][nt][2 * r] = fast_exp2(acc_s[mt][nt][2 * r] * mul - base);
        acc_s[mt][nt][2 * r + 1] = fast_exp2(acc_s[mt][nt][2 * r + 1] * mul - base);
        sum += acc_s[mt][nt][2 * r] + acc_s[mt][nt][2 * r + 1];
      }
      st.row_sum[mt][r] = st.row_sum[mt][r] * rescale + sum;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        st.acc_o[mt][dt][2 * r] *= rescale;
        st.acc_o[mt][dt][2 * r + 1] *= rescale;
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads();  // V(nb) landed; every warp is done reading K(nb)
  next = next_key_block<BN>(mask, nb + 1, num_nb, m0, m0 + Cfg::kBlockM, next_cls);
  if (next >= 0)
    load_tile_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(next) * BN * p.k_st.row,
                                          p.k_st.row, sv.len_k - next * BN, tid);
  cp_async_commit();

  // O += P V, P from the S accumulators (two n-tiles = one A fragment of 16 keys).
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = Ops::pack(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
      a[mt][1] = Ops::pack(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
      a[mt][2] = Ops::pack(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
      a[mt][3] = Ops::pack(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      uint32_t b[4];
      load_b_kn<D>(b, uV, rc, kk * 16, dp * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Ops::mma(st.acc_o[mt][2 * dp], a[mt], b[0], b[1]);
        Ops::mma(st.acc_o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <typename T, int D, int kWarps, int kMTiles>
__global__ void __launch_bounds__(32 * kWarps)
    attention_forward_kernel(const AttentionKernelParams p, int num_m_blocks) {
  using Cfg = ForwardConfig<D, kWarps, kMTiles>;
  using Ops = ElementOps<T>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, DT = D / 8, MT = kMTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;
  T* sV = sK + BN * D;
  const uint32_t uQ = smem_address(sQ), uK = smem_address(sK), uV = smem_address(sV);

  // Heaviest query blocks (the last ones under a causal mask) are scheduled first.
  const int seq = blockIdx.x / num_m_blocks;
  const int mb = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int h = blockIdx.y;
  const int hk = h / (p.heads_q / p.heads_k);
  const SequenceView sv = sequence_view(p, seq);
  const int m0 = mb * BM;
  if (m0 >= sv.len_q) return;
  const MaskView mask = mask_view(p, sv, seq);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const LaneOffsets<D> rc(lane, kRowsThenCols), cr(lane, kColsThenRows);

  const T* q = static_cast<const T*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h);
  const T* k = static_cast<const T*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, 0, hk);
  const T* v = static_cast<const T*>(p.v) + row_offset(p.v_st, sv.k_batch, sv.k_row0, 0, hk);

  load_tile_async<BM, D, Cfg::kThreads>(sQ, q, p.q_st.row, sv.len_q - m0, tid);
  const int num_nb = (sv.len_k + BN - 1) / BN;
  int cls = kTileEmpty;
  int nb = next_key_block<BN>(mask, 0, num_nb, m0, m0 + BM, cls);
  if (nb >= 0)
    load_tile_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(nb) * BN * p.k_st.row,
                                          p.k_st.row, sv.len_k - nb * BN, tid);
  cp_async_commit();

  ForwardState<D, MT> st;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < DT; ++i)
      st.acc_o[mt][i][0] = st.acc_o[mt][i][1] = st.acc_o[mt][i][2] = st.acc_o[mt][i][3] = 0.f;
    st.row_max[mt][0] = st.row_max[mt][1] = -INFINITY;
    st.row_sum[mt][0] = st.row_sum[mt][1] = 0.f;
  }
  // The short path assumes no softcap and a positive scale (max(s) * scale = max(s * scale)).
  const bool short_path_ok = p.softcap_method == kSoftcapOff && p.scale > 0.f;

  while (nb >= 0) {
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async<BN, D, Cfg::kThreads>(sV, v + static_cast<int64_t>(nb) * BN * p.v_st.row,
                                          p.v_st.row, sv.len_k - nb * BN, tid);
    cp_async_commit();
    int next = -1, next_cls = kTileEmpty;
    if (cls == kTileFull && short_path_ok)
      forward_key_block<false, T, D, kWarps, MT>(st, p, sv, mask, uQ, uK, uV, sK, k, rc, cr, m0, nb,
                                                 num_nb, next, next_cls);
    else
      forward_key_block<true, T, D, kWarps, MT>(st, p, sv, mask, uQ, uK, uV, sK, k, rc, cr, m0, nb,
                                                num_nb, next, next_cls);
    nb = next;
    cls = next_cls;
  }
  cp_async_wait<0>();

  // Epilogue: O / l, lse = (m + log2 l) ln 2; a row with l = 0 (nothing allowed) gives 0 and -inf.
  T* out = static_cast<T*>(p.out) + row_offset(p.out_st, sv.q_batch, sv.q_row0, m0, h);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(st.row_sum[mt][r]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int i = warp * Cfg::kRowsPerWarp + mt * 16 + g + 8 * r;  // row inside the block
      if (m0 + i >= sv.len_q) continue;
      T* orow = out + static_cast<int64_t>(i) * p.out_st.row;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const uint32_t packed = Ops::pack(st.acc_o[mt][dt][2 * r] * inv, st.acc_o[mt][dt][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) = packed;
      }
      if (p.lse != nullptr && t == 0) {
        const float lse = l > 0.f ? (st.row_max[mt][r] + log2f(l)) * kLn2 : -INFINITY;
        p.lse[sv.q_batch * p.lse_batch_stride + static_cast<int64_t>(h) * p.lse_head_stride +
              (sv.q_row0 + m0 + i) * p.lse_row_stride] = lse;
      }
    }
  }
}

}  // namespace flashgrad::cuda_attn
