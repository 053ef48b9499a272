// FP8 (e4m3) softmax attention backward, main pass: the 16-bit backward's scheme
// (attention_backward_kernel.cuh: one CTA per block of keys of one (sequence, kv head), 16 keys per
// warp, walking the query tiles of every query head of the group) with the two score products on
// the e4m3 tensor cores (m16n8k32) and the three gradient products in 16-bit (m16n8k16):
//   S^T  = k8 q8^T                       s = S descale_q descale_k scale, softcap' kept
//   P^T  = exp2(s log2e - lse log2e)     (0 where masked; fp32)
//   dP^T = v8 dO8^T                      dP = that * descale_do(h) * descale_v
//   dS^T = P^T (dP^T - shift) softcap'   (shift = Delta - dLSE - z lse, the pre-pass)
//   dV  += P^T dO          (P rounded to 16 bits, dO the caller's 16-bit dO)
//   dK  += dS^T q16        (q16 = the e4m3 values of q in 16 bits, exact; dK *= scale descale_q)
//   dQ  += dS k16 descale_k (fp32 atomics into dq_accum; dq = scale dq_accum afterwards)
// dO8 = e4m3(dO / descale_do) with descale_do = amax(|dO| of the (sequence, query head)) / 448 is
// written by the pre-pass (fp8_backward_prepass.cu), with q16 and k16.
// At D = 256 the kernel makes two passes over the queries (dV first, then dK and dQ), recomputing
// S, as the 16-bit kernel does; each pass loads only the query tiles it reads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_backward_kernel.cuh"
#include "attention_forward_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_kernel_params.h"
#include "fp8_tiles.cuh"
#include "sequence_and_mask.cuh"

namespace flashgrad::cuda_attn::fp8 {

template <int D>
struct Fp8BackwardConfig {
  static constexpr int kWarps = D > 128 ? 4 : 8;
  static constexpr int kBlockN = 16 * kWarps;  // keys per CTA, 16 per warp
  static constexpr int kBlockM = 64;           // queries per step
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDqColParts = kWarps / (kBlockM / 16);
  static constexpr bool kSplitPasses = D > 128;
  // Key side: k8, v8 (e4m3) and k16. Query side, per buffer: q8, then dO8 and q16 when the pass
  // computes dK / dQ, then dO16 when it computes dV.
  static constexpr int kKeyBytes = 4 * kBlockN * D;
  static constexpr int query_bytes(bool dv, bool dk) { return kBlockM * D * (1 + (dk ? 3 : 0) + (dv ? 2 : 0)); }
  static constexpr int kQueryBufBytes =
      kSplitPasses ? (query_bytes(false, true) > query_bytes(true, false) ? query_bytes(false, true)
                                                                          : query_bytes(true, false))
                   : query_bytes(true, true);
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kSmemBytes = kKeyBytes + 2 * kQueryBufBytes + kDsBytes + 4 * kBlockM * 4;
};

struct Fp8BackwardSmem {
  uint8_t* k8;
  uint8_t* v8;
  void* k16;
  unsigned char* query[2];  // per-buffer query tiles (layout by pass: query_tiles())
  void* ds;
  float* lse[2];
  float* shift[2];
};

template <int D>
__device__ __forceinline__ Fp8BackwardSmem carve_fp8_backward_smem(unsigned char* raw) {
  using Cfg = Fp8BackwardConfig<D>;
  Fp8BackwardSmem s;
  s.k8 = raw;
  s.v8 = raw + Cfg::kBlockN * D;
  s.k16 = raw + 2 * Cfg::kBlockN * D;
  s.query[0] = raw + Cfg::kKeyBytes;
  s.query[1] = s.query[0] + Cfg::kQueryBufBytes;
  s.ds = s.query[1] + Cfg::kQueryBufBytes;
  float* f = reinterpret_cast<float*>(static_cast<unsigned char*>(s.ds) + Cfg::kDsBytes);
  s.lse[0] = f;
  s.lse[1] = f + Cfg::kBlockM;
  s.shift[0] = f + 2 * Cfg::kBlockM;
  s.shift[1] = f + 3 * Cfg::kBlockM;
  return s;
}

// The query tiles of one buffer: q8 [BM][D] e4m3, dO8 [BM][D] e4m3, q16 / dO16 [BM][D] 16-bit.
struct QueryTiles {
  uint8_t* q8;
  uint8_t* do8;
  void* q16;
  void* do16;
};
template <int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ QueryTiles query_tiles(unsigned char* buf) {
  constexpr int BM = Fp8BackwardConfig<D>::kBlockM;
  QueryTiles q;
  q.q8 = buf;
  q.do8 = buf + BM * D;                              // kDoDK only
  q.q16 = buf + 2 * BM * D;                          // kDoDK only
  q.do16 = buf + (kDoDK ? 4 : 1) * BM * D;           // kDoDV only
  return q;
}

template <typename T, int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ void fp8_issue_query_block_loads(const Fp8KernelParams& fp, const Fp8BackwardSmem& sm,
                                                            int buf, const SequenceView& sv, int h, int m0,
                                                            int tid) {
  using Cfg = Fp8BackwardConfig<D>;
  constexpr int BM = Cfg::kBlockM, TH = Cfg::kThreads;
  const AttentionKernelParams& p = fp.base;
  const QueryTiles qt = query_tiles<D, kDoDV, kDoDK>(sm.query[buf]);
  const int rows = sv.len_q - m0;
  // Workspace rows: [total_q, Hq, D], row (scratch_row0 + i, h).
  const int64_t ws_row = (sv.scratch_row0 + m0) * p.heads_q + h;
  const int64_t ws_stride = static_cast<int64_t>(p.heads_q) * D;
  load_tile8_async<BM, D, TH>(qt.q8, static_cast<const uint8_t*>(p.q) + row_offset(p.q_st, sv.q_batch, sv.q_row0, m0, h),
                              p.q_st.row, rows, tid);
  if constexpr (kDoDK) {
    load_tile8_async<BM, D, TH>(qt.do8, fp.dout8 + ws_row * D, ws_stride, rows, tid);
    load_tile_async<BM, D, TH>(static_cast<T*>(qt.q16), static_cast<const T*>(fp.q16) + ws_row * D, ws_stride, rows,
                               tid);
  }
  if constexpr (kDoDV)
    load_tile_async<BM, D, TH>(static_cast<T*>(qt.do16),
                               static_cast<const T*>(p.dout) + row_offset(p.dout_st, sv.q_batch, sv.q_row0, m0, h),
                               p.dout_st.row, rows, tid);
  if (tid < BM) {
    const bool valid = m0 + tid < sv.len_q;
    const int64_t idx = static_cast<int64_t>(h) * p.total_q + sv.scratch_row0 + m0 + (valid ? tid : 0);
    cp_async_4(smem_address(sm.lse[buf] + tid), p.lse_log2 + idx, valid);
    cp_async_4(smem_address(sm.shift[buf] + tid), p.delta_shift + idx, valid);
  }
}

// One (query head, query block) tile. kGeneral: per-element mask and softcap.
template <bool kGeneral, typename T, int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ void fp8_backward_query_tile(const Fp8KernelParams& fp, const Fp8BackwardSmem& sm, int buf,
                                                        const SequenceView& sv, const MaskView& mask, int seq, int h,
                                                        int n0, int m0, float qk_scale, float dsv, float dsk,
                                                        float (&acc_dv)[D / 8][4], float (&acc_dk)[D / 8][4]) {
  using Cfg = Fp8BackwardConfig<D>;
  using Ops = ElementOps<T>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, MT = BM / 8, DT = D / 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int key_in_warp = warp * 16;
  const bool with_dq = kDoDK && !p.deterministic;
  const LaneOffsets<D> rc(lane, kRowsThenCols);
  const Fp8LaneOffsets<D> rows8(lane, true), cols8(lane, false);
  const QueryTiles qt = query_tiles<D, kDoDV, kDoDK>(sm.query[buf]);
  const uint32_t sK8 = smem_address(sm.k8), sV8 = smem_address(sm.v8), sK16 = smem_address(sm.k16);
  const uint32_t sQ8 = smem_address(qt.q8), sdO8 = smem_address(qt.do8);
  const uint32_t sQ16 = smem_address(qt.q16), sdO16 = smem_address(qt.do16);
  const float* sLse = sm.lse[buf];
  const float* sShift = sm.shift[buf];

  // S^T = k8 q8^T and dP^T = v8 dO8^T for this warp's 16 keys x BM queries, 32 dims per step.
  float acc_s[MT][4], acc_dp[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    uint32_t a[4];
    load_a8<D>(a, sK8, rows8, key_in_warp, kk * 32);
#pragma unroll
    for (int np = 0; np < MT / 2; ++np) {
      uint32_t b[4];
      load_b8<D>(b, sQ8, cols8, np * 16, kk * 32);
      mma_e4m3(acc_s[2 * np], a, b[0], b[1]);
      mma_e4m3(acc_s[2 * np + 1], a, b[2], b[3]);
    }
    if constexpr (kDoDK) {
      load_a8<D>(a, sV8, rows8, key_in_warp, kk * 32);
#pragma unroll
      for (int np = 0; np < MT / 2; ++np) {
        uint32_t b[4];
        load_b8<D>(b, sdO8, cols8, np * 16, kk * 32);
        mma_e4m3(acc_dp[2 * np], a, b[0], b[1]);
        mma_e4m3(acc_dp[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // dP's scale: descale of this head's dO8 times v's descale.
  float dp_scale = 0.f;
  if constexpr (kDoDK) dp_scale = descale_from_amax(fp.dout_amax[static_cast<int64_t>(seq) * p.heads_q + h]) * dsv;

  // Element (key jj, query ii) of the warp's fragments: jj = g (+8 for e >= 2), ii = 8 nt + 2t (+1).
  const float qk_scale_log2 = qk_scale * kLog2e;
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
        const float s = apply_softcap(p.softcap_method, p.softcap, acc_s[nt][e] * qk_scale, factor);
        pr = fast_exp2(s * kLog2e - sLse[ii]);
        const int r = e >> 1, ir = nt * 8 + (e & 1);  // query - m0 - 2t
        bool ok = ir >= q_lo[r] && ir < q_hi[r];
        if (!ranged) {
          const int i = m0 + ii, j = n0 + key_in_warp + g + 8 * r;
          ok = i < sv.len_q && j < sv.len_k && mask.allowed(i, j);
        }
        if (!ok) pr = 0.f;
      } else {
        pr = fast_exp2(acc_s[nt][e] * qk_scale_log2 - sLse[ii]);
      }
      acc_s[nt][e] = pr;
      if constexpr (kDoDK) acc_dp[nt][e] = pr * (acc_dp[nt][e] * dp_scale - sShift[ii]) * factor;
    }
  }

  // dV += P^T dO16 and dK += dS^T q16 (16-bit products): A fragments from the registers above.
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
        load_b_kn<D>(b, sdO16, rc, kq * 16, dp * 16);
        Ops::mma(acc_dv[2 * dp], a_p, b[0], b[1]);
        Ops::mma(acc_dv[2 * dp + 1], a_p, b[2], b[3]);
      }
    }
    if constexpr (kDoDK) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        load_b_kn<D>(b, sQ16, rc, kq * 16, dp * 16);
        Ops::mma(acc_dk[2 * dp], a_ds, b[0], b[1]);
        Ops::mma(acc_dk[2 * dp + 1], a_ds, b[2], b[3]);
      }
      if (with_dq) {
        // dS^T (16-bit, as the product rounds it) into shared memory, [key][query].
        T* sdS = static_cast<T*>(sm.ds);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int ii = (2 * kq + half) * 8 + 2 * t;
          const int jj = key_in_warp + g;
          *reinterpret_cast<uint32_t*>(sdS + swizzled_offset<BM>(jj, ii)) = a_ds[half * 2];
          *reinterpret_cast<uint32_t*>(sdS + swizzled_offset<BM>(jj + 8, ii)) = a_ds[half * 2 + 1];
        }
      }
    }
  }

  if constexpr (kDoDK) {
    if (with_dq) {
      __syncthreads();
      // dQ rows [16 rt, 16 rt + 16) x columns of part cp of this query block: dS (from dS^T) k16,
      // times descale_k, added into dq_accum.
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
          load_b_kn<D>(b, sK16, rc, kk * 16, dp * 16);
          Ops::mma(acc[0], a[kk], b[0], b[1]);
          Ops::mma(acc[1], a[kk], b[2], b[3]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int col = dp * 16 + half * 8 + 2 * t;
          if (i0 < sv.len_q) {
            atomicAdd(dq_row0 + col, acc[half][0] * dsk);
            atomicAdd(dq_row0 + col + 1, acc[half][1] * dsk);
          }
          if (i0 + 8 < sv.len_q) {
            atomicAdd(dq_row0 + row8 + col, acc[half][2] * dsk);
            atomicAdd(dq_row0 + row8 + col + 1, acc[half][3] * dsk);
          }
        }
      }
    }
  }
}

// One walk over the query tiles of this key block (double-buffered query tiles).
template <typename T, int D, bool kDoDV, bool kDoDK>
__device__ __forceinline__ void fp8_backward_key_block_walk(const Fp8KernelParams& fp, const Fp8BackwardSmem& sm,
                                                            const SequenceView& sv, const MaskView& mask, int seq,
                                                            int hk, int n0, float qk_scale, float dsv, float dsk,
                                                            float (&acc_dv)[D / 8][4], float (&acc_dk)[D / 8][4]) {
  using Cfg = Fp8BackwardConfig<D>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int tid = threadIdx.x;
  const int group = p.heads_q / p.heads_k;
  const bool short_path_ok = p.softcap_method == kSoftcapOff;

  QueryWalk walk{(sv.len_q + BM - 1) / BM, 0};
  walk.num_items = walk.num_mb * group;
  int cls = kTileEmpty;
  int it = walk.next(mask, 0, n0, n0 + BN, BM, cls);
  if (it >= 0)
    fp8_issue_query_block_loads<T, D, kDoDV, kDoDK>(fp, sm, 0, sv, hk * group + it / walk.num_mb,
                                                    (it % walk.num_mb) * BM, tid);
  cp_async_commit();
  int buf = 0;

  while (it >= 0) {
    __syncthreads();  // the other buffer and dS^T are free again
    int next_cls = kTileEmpty;
    const int next = walk.next(mask, it + 1, n0, n0 + BN, BM, next_cls);
    if (next >= 0)
      fp8_issue_query_block_loads<T, D, kDoDV, kDoDK>(fp, sm, buf ^ 1, sv, hk * group + next / walk.num_mb,
                                                      (next % walk.num_mb) * BM, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int h = hk * group + it / walk.num_mb;
    const int m0 = (it % walk.num_mb) * BM;
    if (cls == kTileFull && short_path_ok)
      fp8_backward_query_tile<false, T, D, kDoDV, kDoDK>(fp, sm, buf, sv, mask, seq, h, n0, m0, qk_scale, dsv, dsk,
                                                         acc_dv, acc_dk);
    else
      fp8_backward_query_tile<true, T, D, kDoDV, kDoDK>(fp, sm, buf, sv, mask, seq, h, n0, m0, qk_scale, dsv, dsk,
                                                        acc_dv, acc_dk);
    it = next;
    cls = next_cls;
    buf ^= 1;
  }
  cp_async_wait<0>();
  __syncthreads();
}

template <typename T, int D>
__global__ void __launch_bounds__(Fp8BackwardConfig<D>::kThreads)
    fp8_attention_backward_kernel(const Fp8KernelParams fp, int num_n_blocks) {
  using Cfg = Fp8BackwardConfig<D>;
  const AttentionKernelParams& p = fp.base;
  constexpr int BN = Cfg::kBlockN, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Fp8BackwardSmem sm = carve_fp8_backward_smem<D>(smem_raw);

  const int seq = blockIdx.x / num_n_blocks;
  const int nb = static_cast<int>(blockIdx.x % num_n_blocks);
  const int hk = blockIdx.y;
  const SequenceView sv = sequence_view(p, seq);
  const int n0 = nb * BN;
  if (n0 >= sv.len_k) return;
  const MaskView mask = mask_view(p, sv, seq);
  const int tid = threadIdx.x, warp = tid >> 5;

  const float dsq = load_descale(fp.descale_q, fp.dq_st_n, fp.dq_st_h, seq, hk);
  const float dsk = load_descale(fp.descale_k, fp.dk_st_n, fp.dk_st_h, seq, hk);
  const float dsv = load_descale(fp.descale_v, fp.dv_st_n, fp.dv_st_h, seq, hk);
  const float qk_scale = dsq * dsk * p.scale;

  // k8, v8 from the inputs; k16 from the pre-pass's copy [total_k, Hk, D].
  const int rows = sv.len_k - n0;
  load_tile8_async<BN, D, Cfg::kThreads>(
      sm.k8, static_cast<const uint8_t*>(p.k) + row_offset(p.k_st, sv.k_batch, sv.k_row0, n0, hk), p.k_st.row, rows, tid);
  load_tile8_async<BN, D, Cfg::kThreads>(
      sm.v8, static_cast<const uint8_t*>(p.v) + row_offset(p.v_st, sv.k_batch, sv.k_row0, n0, hk), p.v_st.row, rows, tid);
  const int64_t k16_row = sv.k_batch * p.seqlen_k + sv.k_row0 + n0;
  load_tile_async<BN, D, Cfg::kThreads>(static_cast<T*>(sm.k16),
                                        static_cast<const T*>(fp.k16) + (k16_row * p.heads_k + hk) * D,
                                        static_cast<int64_t>(p.heads_k) * D, rows, tid);
  cp_async_commit();

  const int key0 = n0 + warp * 16;
  const int rows_left = sv.len_k - key0;
  T* dk = static_cast<T*>(p.dk) + row_offset(p.dk_st, sv.k_batch, sv.k_row0, key0, hk);
  T* dv = static_cast<T*>(p.dv) + row_offset(p.dv_st, sv.k_batch, sv.k_row0, key0, hk);

  if constexpr (Cfg::kSplitPasses) {
    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    fp8_backward_key_block_walk<T, D, true, false>(fp, sm, sv, mask, seq, hk, n0, qk_scale, dsv, dsk, acc, acc);
    store_key_rows<T, D>(dv, p.dv_st.row, rows_left, acc, 1.f);
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    fp8_backward_key_block_walk<T, D, false, true>(fp, sm, sv, mask, seq, hk, n0, qk_scale, dsv, dsk, acc, acc);
    store_key_rows<T, D>(dk, p.dk_st.row, rows_left, acc, p.scale * dsq);
  } else {
    float acc_dv[DT][4], acc_dk[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[i][e] = acc_dk[i][e] = 0.f;
    fp8_backward_key_block_walk<T, D, true, true>(fp, sm, sv, mask, seq, hk, n0, qk_scale, dsv, dsk, acc_dv, acc_dk);
    store_key_rows<T, D>(dv, p.dv_st.row, rows_left, acc_dv, 1.f);
    store_key_rows<T, D>(dk, p.dk_st.row, rows_left, acc_dk, p.scale * dsq);
  }
}

}  // namespace flashgrad::cuda_attn::fp8
