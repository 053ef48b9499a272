// FP8 (e4m3) softmax attention forward: the 16-bit forward's scheme (attention_forward_kernel.cuh,
// FlashAttention 2 on mma.sync) with both products on the e4m3 tensor cores (m16n8k32):
//   S   = q8 k8^T (fp32),  s = S descale_q descale_k scale, softcap and mask in fp32;
//   online softmax in fp32 with running max m and running sum l of the unquantized p~ = exp(s - m);
//   O  += e4m3(448 p~) vt8 (fp32), vt8 the transposed V copy of the launcher's pre-pass;
//   out = O descale_v / (448 l), lse = m + log l (natural log; -inf and out = 0 on empty rows).
// P goes from the S accumulators to the A fragment of the second product without leaving the
// registers: four m16n8 tiles of 8 keys make one k32 A fragment, with the key order inside each
// group of 16 permuted (fp8_fragments.cuh, key_at_position); vt stores its keys in that order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_forward_kernel.cuh"
#include "fp8_kernel_params.h"
#include "fp8_tiles.cuh"
#include "sequence_and_mask.cuh"

namespace flashgrad::cuda_attn::fp8 {

// 4 warps; each owns kMTiles x 16 query rows (two tiles up to D = 128, one at D = 256 where the
// 16 x 256 fp32 output accumulator takes 128 registers). 32 keys per step (one k of the P V
// product): with 64, ptxas spills 170 to 760 bytes at every head dim; with 32, 0 / 44 / 40 bytes at
// D = 64 / 128 / 256.
template <int D>
struct Fp8ForwardConfig {
  static constexpr int kMTiles = D > 128 ? 1 : 2;
  static constexpr int kWarps = 4;
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kBlockM = kRowsPerWarp * kWarps;
  static constexpr int kBlockN = 32;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * D;  // q8, k8 [rows][D], vt8 [D][BN]
  static_assert(kBlockN % 32 == 0 && kVtPadKeys % kBlockN == 0, "key block vs the vt padding");
};

template <int D>
struct Fp8ForwardState {
  static constexpr int MT = Fp8ForwardConfig<D>::kMTiles;
  float acc_o[MT][D / 8][4];
  float row_max[MT][2];  // log2 units
  float row_sum[MT][2];  // this thread's partial sums of 448 p~
};

// One key block: S = q8 k8^T, softmax update, O += P8 vt8; prefetches the next K block in between.
// kGeneral: per-element mask, softcap or a non-positive score scale.
template <bool kGeneral, int D>
__device__ __forceinline__ void fp8_forward_key_block(
    Fp8ForwardState<D>& st, const Fp8KernelParams& fp, const SequenceView& sv, const MaskView& mask,
    uint32_t uQ, uint32_t uK, uint32_t uVt, uint8_t* sK, const uint8_t* k, float qk_scale, int m0,
    int nb, int num_nb, int& next, int& next_cls) {
  using Cfg = Fp8ForwardConfig<D>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BN = Cfg::kBlockN, NT = BN / 8, DT = D / 8, MT = Cfg::kMTiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row_in_warp = warp * Cfg::kRowsPerWarp;
  const Fp8LaneOffsets<D> rows_lo(lane, true), cols_lo(lane, false);
  const Fp8LaneOffsets<BN> vt_lo(lane, false);

  // S = q8 k8^T for this warp's rows x BN keys, 32 dims per step.
  float acc_s[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < NT; ++i) acc_s[mt][i][0] = acc_s[mt][i][1] = acc_s[mt][i][2] = acc_s[mt][i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a8<D>(a[mt], uQ, rows_lo, row_in_warp + mt * 16, kk * 32);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b8<D>(b, uK, cols_lo, np * 16, kk * 32);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_e4m3(acc_s[mt][2 * np], a[mt], b[0], b[1]);
        mma_e4m3(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }

  // Scores in log2 units (softcapped, masked to -inf where not allowed), as the 16-bit forward.
  if constexpr (kGeneral) {
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
            float unused;
            const float s = apply_softcap(p.softcap_method, p.softcap, acc_s[mt][nt][2 * r + c] * qk_scale,
                                          unused) * kLog2e;
            const int jr = nt * 8 + c;  // key - n0 - 2t
            acc_s[mt][nt][2 * r + c] = ((jr >= lo && jr < hi) || jr == diag) ? s : -INFINITY;
          }
        }
      }
    }
  }

  // Online softmax of rows g (e = 0, 1) and g + 8 (e = 2, 3); the short path folds the scale into
  // the exponent: p~ = 2^(S qk_scale log2e - m). The registers keep 448 p~ = 2^(.. - m + log2 448)
  // (what P8 rounds, without a multiply per element); l and O then carry the same factor 448.
  const float mul = kGeneral ? 1.f : qk_scale * kLog2e;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]));
      mx = fmaxf(quad_max(mx) * mul, st.row_max[mt][r]);
      const float base = mx == -INFINITY ? 0.f : mx;  // nothing allowed yet: exp2(-inf - 0) = 0
      const float rescale = fast_exp2(st.row_max[mt][r] - base);
      const float base448 = base - kLog2E4m3Max;
      st.row_max[mt][r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc_s[mt][nt][2 * r] = fast_exp2(acc_s[mt][nt][2 * r] * mul - base448);
        acc_s[mt][nt][2 * r + 1] = fast_exp2(acc_s[mt][nt][2 * r + 1] * mul - base448);
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
  __syncthreads();  // vt(nb) landed; every warp is done reading K(nb)
  next = next_key_block<BN>(mask, nb + 1, num_nb, m0, m0 + Cfg::kBlockM, next_cls);
  if (next >= 0)
    load_tile8_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(next) * BN * p.k_st.row, p.k_st.row,
                                           sv.len_k - next * BN, tid);
  cp_async_commit();

  // O += P8 vt8: accumulator tiles 4kk..4kk+3 (32 keys) form one A fragment; vt rows are dims.
  // Two-level accumulation: the e4m3 tensor cores keep only 13 mantissa bits of the accumulator
  // they are given (SageAttention2 measured it on Ada / Hopper; the low 10 bits of C are dropped),
  // so O, summed over every key block of the row, would drift by up to 2^-13 of itself per block.
  // This block's BN keys are summed from zero by the tensor cores and added to O in fp32.
  auto pack = [](float x0, float x1, float x2, float x3) { return pack_e4m3x4(x0, x1, x2, x3); };
  constexpr int KS = BN / 32;
  uint32_t a[KS][MT][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      p_to_a_fragment(acc_s[mt][4 * kk], acc_s[mt][4 * kk + 1], acc_s[mt][4 * kk + 2], acc_s[mt][4 * kk + 3],
                      a[kk][mt], pack, 1.f);  // already 448 p~
#pragma unroll
  for (int dp = 0; dp < DT / 2; ++dp) {
    uint32_t b[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) load_b8<BN>(b[kk], uVt, vt_lo, dp * 16, kk * 32);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float part[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        mma_e4m3(part[0], a[kk][mt], b[kk][0], b[kk][1]);
        mma_e4m3(part[1], a[kk][mt], b[kk][2], b[kk][3]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st.acc_o[mt][2 * dp][e] += part[0][e];
        st.acc_o[mt][2 * dp + 1][e] += part[1][e];
      }
    }
  }
}

__device__ __forceinline__ float load_descale(const float* d, int64_t st_n, int64_t st_h, int n, int hk) {
  return d[static_cast<int64_t>(n) * st_n + static_cast<int64_t>(hk) * st_h];
}

template <int D>
__global__ void __launch_bounds__(Fp8ForwardConfig<D>::kThreads)
    fp8_attention_forward_kernel(const Fp8KernelParams fp, int num_m_blocks) {
  using Cfg = Fp8ForwardConfig<D>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, DT = D / 8, MT = Cfg::kMTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint8_t* sQ = smem_raw;
  uint8_t* sK = sQ + BM * D;
  uint8_t* sVt = sK + BN * D;
  const uint32_t uQ = smem_address(sQ), uK = smem_address(sK), uVt = smem_address(sVt);

  // Heaviest query blocks (the last ones under a causal mask) first.
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

  const float qk_scale = load_descale(fp.descale_q, fp.dq_st_n, fp.dq_st_h, seq, hk) *
                         load_descale(fp.descale_k, fp.dk_st_n, fp.dk_st_h, seq, hk) * p.scale;
  const float dsv = load_descale(fp.descale_v, fp.dv_st_n, fp.dv_st_h, seq, hk);

  const uint8_t* q = static_cast<const uint8_t*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h);
  const uint8_t* k = static_cast<const uint8_t*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, 0, hk);
  // vt rows of this kv head, from this sequence's first column.
  const uint8_t* vt = fp.vt + static_cast<int64_t>(hk) * D * fp.vt_cols +
                      vt_col0(p.cu_seqlens_k != nullptr, seq, p.seqlen_k, sv.k_row0);

  load_tile8_async<BM, D, Cfg::kThreads>(sQ, q, p.q_st.row, sv.len_q - m0, tid);
  const int num_nb = (sv.len_k + BN - 1) / BN;
  int cls = kTileEmpty;
  int nb = next_key_block<BN>(mask, 0, num_nb, m0, m0 + BM, cls);
  if (nb >= 0)
    load_tile8_async<BN, D, Cfg::kThreads>(sK, k + static_cast<int64_t>(nb) * BN * p.k_st.row, p.k_st.row,
                                           sv.len_k - nb * BN, tid);
  cp_async_commit();

  Fp8ForwardState<D> st;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < DT; ++i) st.acc_o[mt][i][0] = st.acc_o[mt][i][1] = st.acc_o[mt][i][2] = st.acc_o[mt][i][3] = 0.f;
    st.row_max[mt][0] = st.row_max[mt][1] = -INFINITY;
    st.row_sum[mt][0] = st.row_sum[mt][1] = 0.f;
  }
  // The short path needs max(S) * c = max(S * c), i.e. c > 0, and no softcap.
  const bool short_path_ok = p.softcap_method == kSoftcapOff && qk_scale > 0.f;

  while (nb >= 0) {
    cp_async_wait<0>();
    __syncthreads();
    // vt tile: D rows (dims) x BN key columns; every column exists (the copy pads to kVtPadKeys).
    load_tile8_async<D, BN, Cfg::kThreads>(sVt, vt + static_cast<int64_t>(nb) * BN, fp.vt_cols, D, tid);
    cp_async_commit();
    int next = -1, next_cls = kTileEmpty;
    if (cls == kTileFull && short_path_ok)
      fp8_forward_key_block<false, D>(st, fp, sv, mask, uQ, uK, uVt, sK, k, qk_scale, m0, nb, num_nb, next,
                                      next_cls);
    else
      fp8_forward_key_block<true, D>(st, fp, sv, mask, uQ, uK, uVt, sK, k, qk_scale, m0, nb, num_nb, next,
                                     next_cls);
    nb = next;
    cls = next_cls;
  }
  cp_async_wait<0>();

  // Epilogue: out = O descale_v / (448 l); lse = (m + log2 l) ln 2; rows with l = 0 give 0, -inf.
  const int64_t out_base = row_offset(p.out_st, sv.q_batch, sv.q_row0, m0, h);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(st.row_sum[mt][r]);
      const float inv = l > 0.f ? dsv / l : 0.f;  // l = 448 sum p~, O = sum P8 v8
      const int i = warp * Cfg::kRowsPerWarp + mt * 16 + g + 8 * r;  // row inside the block
      if (m0 + i >= sv.len_q) continue;
      const int64_t row = out_base + static_cast<int64_t>(i) * p.out_st.row;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const float x0 = st.acc_o[mt][dt][2 * r] * inv, x1 = st.acc_o[mt][dt][2 * r + 1] * inv;
        const uint32_t packed = fp.out_bf16 ? ElementOps<__nv_bfloat16>::pack(x0, x1) : ElementOps<__half>::pack(x0, x1);
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + row + dt * 8 + 2 * t) = packed;
      }
      if (p.lse != nullptr && t == 0) {
        const float lse = l > 0.f ? (st.row_max[mt][r] + log2f(l) - kLog2E4m3Max) * kLn2 : -INFINITY;
        p.lse[sv.q_batch * p.lse_batch_stride + static_cast<int64_t>(h) * p.lse_head_stride +
              (sv.q_row0 + m0 + i) * p.lse_row_stride] = lse;
      }
    }
  }
}

}  // namespace flashgrad::cuda_attn::fp8
