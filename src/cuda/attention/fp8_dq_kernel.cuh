// FP8 (e4m3) attention, deterministic dQ (the backward with deterministic = true): the 16-bit
// attention_dq_kernel.cuh's scheme with the FP8 recipe's products. One CTA per (sequence, query
// head, block of 64 queries), 4 warps of 16 rows, walking the allowed key blocks in increasing
// order with dQ in fp32 registers:
//   S  = q8 k8^T (e4m3),  P = exp2(s log2e - lse log2e),  s = S descale_q descale_k scale (softcap)
//   dP = dO8 v8^T (e4m3) descale_do descale_v,  dS = P (dP - shift) softcap'
//   dQ += dS k16 (16-bit);  dq = dQ scale descale_k, rounded once.
// The summation order is fixed by the loop, so dq is bitwise repeatable; the main kernel then skips
// its dq atomics (p.deterministic).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_kernel_params.h"
#include "fp8_tiles.cuh"
#include "sequence_and_mask.cuh"

namespace flashgrad::cuda_attn::fp8 {

template <int D>
struct Fp8DqConfig {
  static constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;
  // q8, dO8 [BM][D], k8, v8 [BN][D] (e4m3) and k16 [BN][D] (16-bit).
  static constexpr int kSmemBytes = (2 * kBlockM + 4 * kBlockN) * D;
};

template <typename T, int D>
__global__ void __launch_bounds__(128) fp8_attention_dq_kernel(const Fp8KernelParams fp, int num_m_blocks) {
  using Cfg = Fp8DqConfig<D>;
  using Ops = ElementOps<T>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, NT = BN / 8, DT = D / 8, TH = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint8_t* sQ8 = smem_raw;
  uint8_t* sdO8 = sQ8 + BM * D;
  uint8_t* sK8 = sdO8 + BM * D;
  uint8_t* sV8 = sK8 + BN * D;
  T* sK16 = reinterpret_cast<T*>(sV8 + BN * D);
  const uint32_t uQ8 = smem_address(sQ8), udO8 = smem_address(sdO8), uK8 = smem_address(sK8),
                 uV8 = smem_address(sV8), uK16 = smem_address(sK16);

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
  const int row_in_warp = warp * 16;
  const LaneOffsets<D> rc(lane, kRowsThenCols);
  const Fp8LaneOffsets<D> rows8(lane, true), cols8(lane, false);

  const float dsq = load_descale(fp.descale_q, fp.dq_st_n, fp.dq_st_h, seq, hk);
  const float dsk = load_descale(fp.descale_k, fp.dk_st_n, fp.dk_st_h, seq, hk);
  const float dsv = load_descale(fp.descale_v, fp.dv_st_n, fp.dv_st_h, seq, hk);
  const float qk_scale = dsq * dsk * p.scale;
  const float dp_scale = descale_from_amax(fp.dout_amax[static_cast<int64_t>(seq) * p.heads_q + h]) * dsv;

  // q8 from the input, dO8 from the pre-pass ([total_q, Hq, D]); k8, v8 from the inputs, k16 from
  // the pre-pass ([total_k, Hk, D]).
  const int64_t ws_row = (sv.scratch_row0 + m0) * p.heads_q + h;
  load_tile8_async<BM, D, TH>(sQ8, static_cast<const uint8_t*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h),
                              p.q_st.row, sv.len_q - m0, tid);
  load_tile8_async<BM, D, TH>(sdO8, fp.dout8 + ws_row * D, static_cast<int64_t>(p.heads_q) * D, sv.len_q - m0, tid);
  const uint8_t* k8 = static_cast<const uint8_t*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, 0, hk);
  const uint8_t* v8 = static_cast<const uint8_t*>(p.v) + row_offset(p.v_st, sv.k_batch, sv.k_row0, 0, hk);
  const T* k16 = static_cast<const T*>(fp.k16) + ((sv.k_batch * p.seqlen_k + sv.k_row0) * p.heads_k + hk) * D;
  const int64_t k16_stride = static_cast<int64_t>(p.heads_k) * D;

  const int num_nb = (sv.len_k + BN - 1) / BN;
  int cls = kTileEmpty;
  int nb = next_key_block<BN>(mask, 0, num_nb, m0, m0 + BM, cls);
  if (nb >= 0) {
    const int rows = sv.len_k - nb * BN;
    load_tile8_async<BN, D, TH>(sK8, k8 + static_cast<int64_t>(nb) * BN * p.k_st.row, p.k_st.row, rows, tid);
    load_tile8_async<BN, D, TH>(sV8, v8 + static_cast<int64_t>(nb) * BN * p.v_st.row, p.v_st.row, rows, tid);
    load_tile_async<BN, D, TH>(sK16, k16 + static_cast<int64_t>(nb) * BN * k16_stride, k16_stride, rows, tid);
  }
  cp_async_commit();

  float row_lse[2], row_shift[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + row_in_warp + g + 8 * r;
    const int64_t idx = static_cast<int64_t>(h) * p.total_q + sv.scratch_row0 + i;
    row_lse[r] = i < sv.len_q ? p.lse_log2[idx] : INFINITY;
    row_shift[r] = i < sv.len_q ? p.delta_shift[idx] : 0.f;
  }

  float acc_dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) acc_dq[i][0] = acc_dq[i][1] = acc_dq[i][2] = acc_dq[i][3] = 0.f;

  while (nb >= 0) {
    cp_async_wait<0>();
    __syncthreads();
    float acc_s[NT][4], acc_dp[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
      uint32_t a[4], a2[4];
      load_a8<D>(a, uQ8, rows8, row_in_warp, kk * 32);
      load_a8<D>(a2, udO8, rows8, row_in_warp, kk * 32);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        load_b8<D>(b, uK8, cols8, np * 16, kk * 32);
        mma_e4m3(acc_s[2 * np], a, b[0], b[1]);
        mma_e4m3(acc_s[2 * np + 1], a, b[2], b[3]);
        load_b8<D>(b, uV8, cols8, np * 16, kk * 32);
        mma_e4m3(acc_dp[2 * np], a2, b[0], b[1]);
        mma_e4m3(acc_dp[2 * np + 1], a2, b[2], b[3]);
      }
    }
    __syncthreads();  // k8(nb), v8(nb) are no longer read: fetch the next ones while dS k16 runs
    int next_cls = kTileEmpty;
    const int next = next_key_block<BN>(mask, nb + 1, num_nb, m0, m0 + BM, next_cls);
    if (next >= 0) {
      const int rows = sv.len_k - next * BN;
      load_tile8_async<BN, D, TH>(sK8, k8 + static_cast<int64_t>(next) * BN * p.k_st.row, p.k_st.row, rows, tid);
      load_tile8_async<BN, D, TH>(sV8, v8 + static_cast<int64_t>(next) * BN * p.v_st.row, p.v_st.row, rows, tid);
    }
    cp_async_commit();

    const int n0 = nb * BN;
    int k_lo[2], k_hi[2], k_diag[2];  // keys of this thread's rows, relative to n0 + 2t
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mask.query_keys(m0 + row_in_warp + g + 8 * r, k_lo[r], k_hi[r], k_diag[r]);
      k_lo[r] -= n0 + 2 * t;
      k_hi[r] -= n0 + 2 * t;
      k_diag[r] -= n0 + 2 * t;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float factor;
        const float s = apply_softcap(p.softcap_method, p.softcap, acc_s[nt][e] * qk_scale, factor);
        float pr = fast_exp2(s * kLog2e - row_lse[r]);
        if (cls == kTilePartial) {
          const int jr = nt * 8 + (e & 1);  // key - n0 - 2t
          if (!((jr >= k_lo[r] && jr < k_hi[r]) || jr == k_diag[r])) pr = 0.f;
        }
        acc_dp[nt][e] = pr * (acc_dp[nt][e] * dp_scale - row_shift[r]) * factor;
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = Ops::pack(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      a[1] = Ops::pack(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      a[2] = Ops::pack(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      a[3] = Ops::pack(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        load_b_kn<D>(b, uK16, rc, kk * 16, dp * 16);
        Ops::mma(acc_dq[2 * dp], a, b[0], b[1]);
        Ops::mma(acc_dq[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // k16(nb) is no longer read
    if (next >= 0)
      load_tile_async<BN, D, TH>(sK16, k16 + static_cast<int64_t>(next) * BN * k16_stride, k16_stride,
                                 sv.len_k - next * BN, tid);
    cp_async_commit();
    nb = next;
    cls = next_cls;
  }
  cp_async_wait<0>();

  const float mul = p.scale * dsk;
  T* dq = static_cast<T*>(p.dq) + row_offset(p.dq_st, sv.q_batch, sv.q_row0, m0, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_in_warp + g + 8 * r;
    if (m0 + i >= sv.len_q) continue;
    T* drow = dq + static_cast<int64_t>(i) * p.dq_st.row;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(drow + dt * 8 + 2 * t) = Ops::pack(acc_dq[dt][2 * r] * mul, acc_dq[dt][2 * r + 1] * mul);
  }
}

}  // namespace flashgrad::cuda_attn::fp8
