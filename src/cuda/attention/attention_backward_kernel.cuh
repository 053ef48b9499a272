// Softmax attention backward, main pass (FlashAttention-2 scheme on mma.sync tensor cores).
//
// One CTA = one block of kBlockN keys of one (sequence, kv head), 16 keys per warp (8 warps, or 4
// at D = 256). It walks every (query head of the kv head's group, query block of 64) whose tile
// the mask does not rule out, and per tile computes, in registers:
//   S^T  = K Q^T                 P^T = exp2(S^T log2e - lse log2e)     (0 where masked)
//   dP^T = V dO^T                dS^T = P^T * (dP^T - shift) * softcap'(S)
//   dV  += P^T dO                dK  += dS^T Q
// where shift = rowsum(dO * O) - dLSE - z * lse (the pre-pass). dK / dV stay in registers over the
// whole group (GQA sums without atomics) and are written once, dK times the softmax scale.
// dQ = scale * dS K: by default dS^T goes through shared memory and each warp adds one 16-row x
// (D / kDqColParts) piece of dS K into an fp32 buffer with atomics; in deterministic mode this
// kernel skips dQ and attention_dq_kernel computes it in a fixed order.
//
// With D = 256 the two 16 x 256 fp32 accumulators do not fit beside S and dP in 255 registers, so
// the kernel makes two passes over the queries (dV first, then dK and dQ), recomputing S.
#pragma once

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "sequence_and_mask.cuh"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn {

template <int D>
struct BackwardConfig {
  // 8 warps (128 keys) share each Q / dO tile up to D = 128, which halves the Q / dO traffic and
  // the dq atomics per key; at D = 256 two 128 x 256 K / V tiles would not fit in shared memory.
  static constexpr int kWarps = D > 128 ? 4 : 8;
  static constexpr int kBlockN = 16 * kWarps;  // keys per CTA, 16 per warp
  static constexpr int kBlockM = 64;           // queries per step
  static constexpr int kThreads = 32 * kWarps;
  // dq = dS K: the BM / 16 row tiles x kDqColParts column parts of D, one per warp.
  static constexpr int kDqColParts = kWarps / (kBlockM / 16);
  static constexpr bool kSplitPasses = D > 128;
  // K, V, 2 x (Q, dO), dS^T, 2 x (lse, shift)
  static constexpr int kSmemBytes =
      (2 * kBlockN * D + 4 * kBlockM * D + kBlockN * kBlockM) * 2 + 4 * kBlockM * 4;
};

// 4-byte cp.async with zero fill (for the per-row lse / shift values).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

struct BackwardSmem {
  void* k;
  void* v;
  void* q[2];
  void* dout[2];
  void* ds;
  float* lse[2];
  float* shift[2];
};

template <typename T, int D>
__device__ __forceinline__ BackwardSmem carve_backward_smem(unsigned char* raw) {
  using Cfg = BackwardConfig<D>;
  BackwardSmem s;
  T* base = reinterpret_cast<T*>(raw);
  s.k = base;
  s.v = base + Cfg::kBlockN * D;
  T* qs = base + 2 * Cfg::kBlockN * D;
  s.q[0] = qs;
  s.q[1] = qs + Cfg::kBlockM * D;
  s.dout[0] = qs + 2 * Cfg::kBlockM * D;
  s.dout[1] = qs + 3 * Cfg::kBlockM * D;
  s.ds = qs + 4 * Cfg::kBlockM * D;
  float* f = reinterpret_cast<float*>(static_cast<T*>(s.ds) + Cfg::kBlockN * Cfg::kBlockM);
  s.lse[0] = f;
  s.lse[1] = f + Cfg::kBlockM;
  s.shift[0] = f + 2 * Cfg::kBlockM;
  s.shift[1] = f + 3 * Cfg::kBlockM;
  return s;
}

// The (query head in group, query block) work items of one key block, in order, skipping tiles
// with no allowed pair. Item index = head_in_group * num_mb + mb.
struct QueryWalk {
  int num_mb, num_items;
  __device__ __forceinline__ int next(const MaskView& mask, int it, int n0, int n1, int bm,
                                      int& cls) const {
    for (; it < num_items; ++it) {
      const int mb = it % num_mb;
      cls = mask.classify(mb * bm, (mb + 1) * bm, n0, n1);
      if (cls != kTileEmpty) return it;
    }
    return -1;
  }
};

template <typename T, int D>
__device__ __forceinline__ void issue_query_block_loads(const AttentionKernelParams& p,
                                                        const BackwardSmem& sm, int buf,
                                                        const SequenceView& sv, int h, int m0,
                                                        int tid) {
  using Cfg = BackwardConfig<D>;
  constexpr int BM = Cfg::kBlockM;
  const T* q = static_cast<const T*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h);
  const T* dout =
      static_cast<const T*>(p.dout) + row_offset(p.dout_st, sv.q_batch, sv.q_row0, m0, h);
  load_tile_async<BM, D, Cfg::kThreads>(static_cast<T*>(sm.q[buf]), q, p.q_st.row, sv.len_q - m0, tid);
  load_tile_async<BM, D, Cfg::kThreads>(static_cast<T*>(sm.dout[buf]), dout, p.dout_st.row,
                                        sv.len_q - m0, tid);
  if (tid < BM) {
    const bool valid = m0 + tid < sv.len_q;
    const int64_t idx = static_cast<int64_t>(h) * p.total_q + sv.scratch_row0 + m0 + (valid ? tid : 0);
    cp_async_4(smem_address(sm.lse[buf] + tid), p.lse_log2 + idx, valid);
    cp_async_4(smem_address(sm.shift[buf] + tid), p.delta_shift + idx, valid);
  }
}

// One (query head, query block) tile of the walk below. kGeneral: per-element mask and softcap.
template <bool kGeneral, typename T, int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ void backward_query_tile(const AttentionKernelParams& p,
                                                    const BackwardSmem& sm, int buf,
                                                    const SequenceView& sv, const MaskView& mask,
                                                    int h, int n0, int m0,
                                                    float (&acc_dv)[D / 8][4],
                                                    float (&acc_dk)[D / 8][4]) {
  using Cfg = BackwardConfig<D>;
  using Ops = ElementOps<T>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, MT = BM / 8, DT = D / 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int key_in_warp = warp * 16;
  const bool with_dq = kDoDK && !p.deterministic;
  const LaneOffsets<D> rc(lane, kRowsThenCols), cr(lane, kColsThenRows);
  const uint32_t sK = smem_address(sm.k), sV = smem_address(sm.v);
  const uint32_t sQ = smem_address(sm.q[buf]), sdO = smem_address(sm.dout[buf]);
  const float* sLse = sm.lse[buf];
  const float* sShift = sm.shift[buf];

  // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BM queries.
  float acc_s[MT][4], acc_dp[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    load_a<D>(a, sK, rc, key_in_warp, kk * 16);
#pragma unroll
    for (int np = 0; np < MT / 2; ++np) {
      uint32_t b[4];
      load_b_nk<D>(b, sQ, cr, np * 16, kk * 16);
      Ops::mma(acc_s[2 * np], a, b[0], b[1]);
      Ops::mma(acc_s[2 * np + 1], a, b[2], b[3]);
    }
    if constexpr (kDoDK) {
      load_a<D>(a, sV, rc, key_in_warp, kk * 16);
#pragma unroll
      for (int np = 0; np < MT / 2; ++np) {
        uint32_t b[4];
        load_b_nk<D>(b, sdO, cr, np * 16, kk * 16);
        Ops::mma(acc_dp[2 * np], a, b[0], b[1]);
        Ops::mma(acc_dp[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // Element (key jj, query ii) of the warp's fragments: jj = g (+8 for e >= 2), ii = 8 nt + 2t (+1).
  const float scale_log2 = p.scale * kLog2e;
  // Queries that may see this thread's two keys (g, g + 8), relative to m0 + 2t.
  int q_lo[2] = {0, 0}, q_hi[2] = {0, 0};
  bool ranged = true;
  if constexpr (kGeneral) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ranged = mask.key_queries(n0 + key_in_warp + g + 8 * r, q_lo[r], q_hi[r]) && ranged;
      q_lo[r] -= m0 + 2 * t;
      q_hi[r] -= m0 + 2 * t;
    }
  }
#pragma unroll
  for (int nt = 0; nt < MT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ii = nt * 8 + 2 * t + (e & 1);
      float pr, factor = 1.f;
      if constexpr (kGeneral) {
        const float s = apply_softcap(p.softcap_method, p.softcap, acc_s[nt][e] * p.scale, factor);
        pr = fast_exp2(s * kLog2e - sLse[ii]);
        const int r = e >> 1, ir = nt * 8 + (e & 1);  // query - m0 - 2t
        bool ok = ir >= q_lo[r] && ir < q_hi[r];
        if (!ranged) {
          const int i = m0 + ii, j = n0 + key_in_warp + g + 8 * r;
          ok = i < sv.len_q && j < sv.len_k && mask.allowed(i, j);
        }
        if (!ok) pr = 0.f;
      } else {
        pr = fast_exp2(acc_s[nt][e] * scale_log2 - sLse[ii]);
      }
      acc_s[nt][e] = pr;
      if constexpr (kDoDK) acc_dp[nt][e] = pr * (acc_dp[nt][e] - sShift[ii]) * factor;
    }
  }

  // dV += P^T dO and dK += dS^T Q: A fragments straight from the registers above.
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) {
    uint32_t a_p[4], a_ds[4];
    a_p[0] = Ops::pack(acc_s[2 * kq][0], acc_s[2 * kq][1]);
    a_p[1] = Ops::pack(acc_s[2 * kq][2], acc_s[2 * kq][3]);
    a_p[2] = Ops::pack(acc_s[2 * kq + 1][0], acc_s[2 * kq + 1][1]);
    a_p[3] = Ops::pack(acc_s[2 * kq + 1][2], acc_s[2 * kq + 1][3]);
    a_ds[0] = Ops::pack(acc_dp[2 * kq][0], acc_dp[2 * kq][1]);
    a_ds[1] = Ops::pack(acc_dp[2 * kq][2], acc_dp[2 * kq][3]);
    a_ds[2] = Ops::pack(acc_dp[2 * kq + 1][0], acc_dp[2 * kq + 1][1]);
    a_ds[3] = Ops::pack(acc_dp[2 * kq + 1][2], acc_dp[2 * kq + 1][3]);
    if constexpr (kDoDV) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        load_b_kn<D>(b, sdO, rc, kq * 16, dp * 16);
        Ops::mma(acc_dv[2 * dp], a_p, b[0], b[1]);
        Ops::mma(acc_dv[2 * dp + 1], a_p, b[2], b[3]);
      }
    }
    if constexpr (kDoDK) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        load_b_kn<D>(b, sQ, rc, kq * 16, dp * 16);
        Ops::mma(acc_dk[2 * dp], a_ds, b[0], b[1]);
        Ops::mma(acc_dk[2 * dp + 1], a_ds, b[2], b[3]);
      }
      if (with_dq) {
        // dS^T (bf16/fp16, as the product rounds it) into shared memory, [key][query].
        T* sdS = static_cast<T*>(sm.ds);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int nt = 2 * kq + half;
          const int ii = nt * 8 + 2 * t;
          const int jj = key_in_warp + g;
          *reinterpret_cast<uint32_t*>(sdS + swizzled_offset<BM>(jj, ii)) = a_ds[half * 2];
          *reinterpret_cast<uint32_t*>(sdS + swizzled_offset<BM>(jj + 8, ii)) =
              a_ds[half * 2 + 1];
        }
      }
    }
  }

  if constexpr (kDoDK) {
    if (with_dq) {
      __syncthreads();
      // dQ rows [16 rt, 16 rt + 16) x columns of part cp of this query block: dS (from dS^T) K.
      constexpr int kPairsPerPart = DT / 2 / Cfg::kDqColParts;
      const int rt = warp % (BM / 16), cp = warp / (BM / 16);
      const LaneOffsets<BM> cr_ds(lane, kColsThenRows);
      const uint32_t sdS = smem_address(sm.ds);
      uint32_t a[BN / 16][4];
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) load_a_from_transposed<BM>(a[kk], sdS, cr_ds, rt * 16, kk * 16);
      const int i0 = m0 + rt * 16 + g;
      float* dq_row0 = p.dq_accum + ((sv.scratch_row0 + i0) * p.heads_q + h) * static_cast<int64_t>(D);
      const int64_t row8 = 8LL * p.heads_q * D;
#pragma unroll
      for (int dpl = 0; dpl < kPairsPerPart; ++dpl) {
        const int dp = cp * kPairsPerPart + dpl;
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t b[4];
          load_b_kn<D>(b, sK, rc, kk * 16, dp * 16);
          Ops::mma(acc[0], a[kk], b[0], b[1]);
          Ops::mma(acc[1], a[kk], b[2], b[3]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int col = dp * 16 + half * 8 + 2 * t;
          if (i0 < sv.len_q) {
            atomicAdd(dq_row0 + col, acc[half][0]);
            atomicAdd(dq_row0 + col + 1, acc[half][1]);
          }
          if (i0 + 8 < sv.len_q) {
            atomicAdd(dq_row0 + row8 + col, acc[half][2]);
            atomicAdd(dq_row0 + row8 + col + 1, acc[half][3]);
          }
        }
      }
    }
  }
}

// One walk over the query tiles of this key block, accumulating dV (kDoDV) and/or dK and dQ
// (kDoDK). acc_dv / acc_dk may alias when only one of them is used.
template <typename T, int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ void backward_key_block_walk(const AttentionKernelParams& p,
                                                        const BackwardSmem& sm,
                                                        const SequenceView& sv,
                                                        const MaskView& mask, int hk, int n0,
                                                        float (&acc_dv)[D / 8][4],
                                                        float (&acc_dk)[D / 8][4]) {
  using Cfg = BackwardConfig<D>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int tid = threadIdx.x;
  const int group = p.heads_q / p.heads_k;
  const bool short_path_ok = p.softcap_method == kSoftcapOff;

  QueryWalk walk{(sv.len_q + BM - 1) / BM, 0};
  walk.num_items = walk.num_mb * group;
  int cls = kTileEmpty;
  int it = walk.next(mask, 0, n0, n0 + BN, BM, cls);
  if (it >= 0)
    issue_query_block_loads<T, D>(p, sm, 0, sv, hk * group + it / walk.num_mb,
                                  (it % walk.num_mb) * BM, tid);
  cp_async_commit();
  int buf = 0;

  while (it >= 0) {
    __syncthreads();  // the other buffer and dS^T are free again
    int next_cls = kTileEmpty;
    const int next = walk.next(mask, it + 1, n0, n0 + BN, BM, next_cls);
    if (next >= 0)
      issue_query_block_loads<T, D>(p, sm, buf ^ 1, sv, hk * group + next / walk.num_mb,
                                    (next % walk.num_mb) * BM, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int h = hk * group + it / walk.num_mb;
    const int m0 = (it % walk.num_mb) * BM;
    if (cls == kTileFull && short_path_ok)
      backward_query_tile<false, T, D, kDoDV, kDoDK>(p, sm, buf, sv, mask, h, n0, m0, acc_dv, acc_dk);
    else
      backward_query_tile<true, T, D, kDoDV, kDoDK>(p, sm, buf, sv, mask, h, n0, m0, acc_dv, acc_dk);
    it = next;
    cls = next_cls;
    buf ^= 1;
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Writes a warp's 16 x D fp32 accumulator rows (keys n0 + 16 warp + ...) times `mul` into dst.
template <typename T, int D>
__device__ __forceinline__ void store_key_rows(T* dst, int64_t row_stride, int rows_left,
                                               const float (&acc)[D / 8][4], float mul) {
  using Ops = ElementOps<T>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= rows_left) continue;
    T* drow = dst + static_cast<int64_t>(row) * row_stride;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(drow + dt * 8 + 2 * t) =
          Ops::pack(acc[dt][2 * r] * mul, acc[dt][2 * r + 1] * mul);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(BackwardConfig<D>::kThreads)
    attention_backward_kernel(const AttentionKernelParams p, int num_n_blocks) {
  using Cfg = BackwardConfig<D>;
  constexpr int BN = Cfg::kBlockN, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BackwardSmem sm = carve_backward_smem<T, D>(smem_raw);

  const int seq = blockIdx.x / num_n_blocks;
  const int nb = static_cast<int>(blockIdx.x % num_n_blocks);
  const int hk = blockIdx.y;
  const SequenceView sv = sequence_view(p, seq);
  const int n0 = nb * BN;
  if (n0 >= sv.len_k) return;
  const MaskView mask = mask_view(p, sv, seq);
  const int tid = threadIdx.x, warp = tid >> 5;

  const T* k = static_cast<const T*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, n0, hk);
  const T* v = static_cast<const T*>(p.v) + row_offset(p.v_st, sv.k_batch, sv.k_row0, n0, hk);
  load_tile_async<BN, D, Cfg::kThreads>(static_cast<T*>(sm.k), k, p.k_st.row, sv.len_k - n0, tid);
  load_tile_async<BN, D, Cfg::kThreads>(static_cast<T*>(sm.v), v, p.v_st.row, sv.len_k - n0, tid);
  cp_async_commit();

  const int key0 = n0 + warp * 16;  // this warp's first key
  const int rows_left = sv.len_k - key0;
  T* dk = static_cast<T*>(p.dk) + row_offset(p.dk_st, sv.k_batch, sv.k_row0, key0, hk);
  T* dv = static_cast<T*>(p.dv) + row_offset(p.dv_st, sv.k_batch, sv.k_row0, key0, hk);

  if constexpr (Cfg::kSplitPasses) {
    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    backward_key_block_walk<T, D, true, false>(p, sm, sv, mask, hk, n0, acc, acc);
    store_key_rows<T, D>(dv, p.dv_st.row, rows_left, acc, 1.f);
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    backward_key_block_walk<T, D, false, true>(p, sm, sv, mask, hk, n0, acc, acc);
    store_key_rows<T, D>(dk, p.dk_st.row, rows_left, acc, p.scale);
  } else {
    float acc_dv[DT][4], acc_dk[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[i][e] = acc_dk[i][e] = 0.f;
    backward_key_block_walk<T, D, true, true>(p, sm, sv, mask, hk, n0, acc_dv, acc_dk);
    store_key_rows<T, D>(dv, p.dv_st.row, rows_left, acc_dv, 1.f);
    store_key_rows<T, D>(dk, p.dk_st.row, rows_left, acc_dk, p.scale);
  }
}

}  // namespace flashgrad::cuda_attn
