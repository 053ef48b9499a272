// Kernels of the FP8 attention's small passes around the main kernels (launched by fp8_prepass.cu):
//  - transpose_v: vt, the copy of v8 with keys contiguous that the forward's P V product reads as
//    its K-major B operand (ldmatrix cannot transpose 8-bit data), keys permuted inside each group
//    of 16 to match P's A fragment (fp8_fragments.cuh). One CTA per (64 keys of a sequence, kv head).
//  - backward pre-pass 1, one warp per (query row, head): the row's amax(|dO|) merged into the
//    (sequence, head) amax with an integer atomicMax (the bits of non-negative floats order as
//    integers), and q16, the row of q in 16 bits.
//  - backward pre-pass 2: dO8 = e4m3(dO / descale_do) once the amaxes are complete, and Delta =
//    rowsum(deq(dO8) * O) folded into shift = Delta - dLSE - z lse, lse in log2 units.
//  - k16: the rows of k in 16 bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "fp8_fragments.cuh"
#include "fp8_kernel_params.h"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn::fp8 {

constexpr float kLog2eF = 1.4426950408889634f;
constexpr int kTransposeKeys = kVtPadKeys;  // keys per transpose CTA

__device__ __forceinline__ float e4m3_value(uint8_t x) {
  __nv_fp8_e4m3 v;
  v.__x = x;
  return static_cast<float>(v);
}

// Sequence of scratch row r (0 <= r < total_q) and its row within the token dimension / batch.
__device__ __forceinline__ int sequence_of_row(const AttentionKernelParams& p, int64_t r) {
  if (p.cu_seqlens_q == nullptr) return p.seqlen_q == 0 ? 0 : static_cast<int>(r / p.seqlen_q);
  int lo = 0, hi = p.num_seqs - 1;  // last n with cu[n] <= r (empty sequences are skipped over)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.cu_seqlens_q[mid] <= r) lo = mid; else hi = mid - 1;
  }
  return lo;
}
__device__ __forceinline__ void split_row(const AttentionKernelParams& p, int64_t r, int64_t& batch, int64_t& row) {
  if (p.cu_seqlens_q != nullptr || p.seqlen_q == 0) {
    batch = 0;
    row = r;
  } else {
    batch = r / p.seqlen_q;
    row = r % p.seqlen_q;
  }
}

template <int D>
__global__ void transpose_v_kernel(const Fp8KernelParams fp, int key_blocks) {
  const AttentionKernelParams& p = fp.base;
  // [kTransposeKeys][D + 4] bytes (+4: the rows do not all start in the same bank).
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto tile = reinterpret_cast<uint8_t (*)[D + 4]>(smem_raw);
  const int seq = blockIdx.x / key_blocks, kb = blockIdx.x % key_blocks, hk = blockIdx.y;
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int64_t k_row0 = varlen ? p.cu_seqlens_k[seq] : 0;
  const int len_k = varlen ? p.cu_seqlens_k[seq + 1] - static_cast<int>(k_row0) : p.seqlen_k;
  const int j0 = kb * kTransposeKeys;
  if (j0 >= len_k) return;  // columns past round_up(len_k, 64) are never read
  const int64_t batch = varlen ? 0 : seq;
  // Load 64 keys x D bytes (4-byte words); keys past the sequence are zeros.
  for (int w = threadIdx.x; w < kTransposeKeys * D / 4; w += blockDim.x) {
    const int j = w / (D / 4), c = (w % (D / 4)) * 4;
    uint32_t x = 0;
    if (j0 + j < len_k)
      x = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.v) + batch * p.v_st.batch +
                                             (k_row0 + j0 + j) * p.v_st.row + hk * p.v_st.head + c);
    *reinterpret_cast<uint32_t*>(&tile[j][c]) = x;
  }
  __syncthreads();
  // Column position q of each group of 16 takes key 16 (q / 16) + key_at_position(q % 16).
  uint8_t* out = fp.vt + static_cast<int64_t>(hk) * D * fp.vt_cols +
                 vt_col0(varlen, seq, p.seqlen_k, k_row0) + j0;
  for (int w = threadIdx.x; w < D * (kTransposeKeys / 16); w += blockDim.x) {
    const int d = w / (kTransposeKeys / 16), grp = w % (kTransposeKeys / 16);
    uint32_t words[4];
#pragma unroll
    for (int q4 = 0; q4 < 4; ++q4) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        word |= static_cast<uint32_t>(tile[16 * grp + key_at_position(4 * q4 + b)][d]) << (8 * b);
      words[q4] = word;
    }
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(d) * fp.vt_cols + 16 * grp) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Pass 1, one warp per (row, head): the row's amax(|dO|) merged into its (sequence, head) amax, and
// q16 (the row of q in 16 bits).
template <typename T>
__global__ void fp8_prepass_rows_kernel(const Fp8KernelParams fp, int head_dim) {
  const AttentionKernelParams& p = fp.base;
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= p.total_q * p.heads_q) return;
  const int64_t r = warp_id / p.heads_q;
  const int h = static_cast<int>(warp_id % p.heads_q);
  int64_t b, row;
  split_row(p, r, b, row);
  const T* d = static_cast<const T*>(p.dout) + b * p.dout_st.batch + row * p.dout_st.row + h * p.dout_st.head;
  const uint8_t* q = static_cast<const uint8_t*>(p.q) + b * p.q_st.batch + row * p.q_st.row + h * p.q_st.head;
  T* q16 = static_cast<T*>(fp.q16) + (r * p.heads_q + h) * head_dim;
  float amax = 0.f;
  for (int c = lane * 2; c < head_dim; c += 64) {
    amax = fmaxf(amax, fmaxf(fabsf(ElementOps<T>::to_float(d[c])), fabsf(ElementOps<T>::to_float(d[c + 1]))));
    *reinterpret_cast<uint32_t*>(q16 + c) = ElementOps<T>::pack(e4m3_value(q[c]), e4m3_value(q[c + 1]));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (lane == 0 && amax > 0.f)
    atomicMax(reinterpret_cast<int*>(fp.dout_amax + static_cast<int64_t>(sequence_of_row(p, r)) * p.heads_q + h),
              __float_as_int(amax));
}

// Pass 2, one warp per (row, head), once the amaxes are complete: dO8 = e4m3(dO / descale_do)
// (round-to-nearest-even, saturating), and Delta = rowsum(deq(dO8) * O) in fp32 with
// deq(dO8) = dO8 descale_do, the dO that the dP product sees. With Delta from the same dO as dP,
// sum_j dS_ij = sum_j P_ij (dP_ij - Delta_i) stays 0 as for exact softmax gradients; Delta from the
// 16-bit dO leaves P_ij (quantization error of dO . v_j) in every dS_ij, which dominates dq and dk
// where attention is peaked (host recipe, rel RMS against fp32: dq 7.5% -> 3.1% at q, k std 2.5;
// 13.8% -> 2.9% under candidate isolation, whose single-key rows have zero true gradient).
// Then shift = Delta - dLSE - z lse and lse in log2 units, as attention_backward_prepass.cu; fully
// masked rows (lse = -inf) get lse_log2 = +inf and shift = 0.
template <typename T>
__global__ void fp8_quantize_dout_kernel(const Fp8KernelParams fp, int head_dim) {
  const AttentionKernelParams& p = fp.base;
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= p.total_q * p.heads_q) return;
  const int64_t r = warp_id / p.heads_q;
  const int h = static_cast<int>(warp_id % p.heads_q);
  int64_t b, row;
  split_row(p, r, b, row);
  const T* o = static_cast<const T*>(p.out) + b * p.out_st.batch + row * p.out_st.row + h * p.out_st.head;
  const T* d = static_cast<const T*>(p.dout) + b * p.dout_st.batch + row * p.dout_st.row + h * p.dout_st.head;
  const float ds = descale_from_amax(fp.dout_amax[static_cast<int64_t>(sequence_of_row(p, r)) * p.heads_q + h]);
  uint8_t* out8 = fp.dout8 + (r * p.heads_q + h) * head_dim;
  float sum = 0.f;  // sum dO8 * O; Delta = sum * descale_do
  for (int c = lane * 4; c < head_dim; c += 128) {
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = ElementOps<T>::to_float(d[c + e]) / ds;
    const uint32_t packed = pack_e4m3x4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<uint32_t*>(out8 + c) = packed;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      sum += e4m3_value(static_cast<uint8_t>(packed >> (8 * e))) * ElementOps<T>::to_float(o[c + e]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane != 0) return;
  const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + row * p.lse_row_stride];
  const int64_t out_idx = static_cast<int64_t>(h) * p.total_q + r;
  if (lse == -INFINITY) {
    p.lse_log2[out_idx] = INFINITY;
    p.delta_shift[out_idx] = 0.f;
    return;
  }
  float dlse = p.z_loss_weight * lse;
  if (p.dlse != nullptr) dlse += p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + row * p.dlse_row_stride];
  p.lse_log2[out_idx] = lse * kLog2eF;
  p.delta_shift[out_idx] = sum * ds - dlse;
}

// k16 [total_k, Hk, D]: one warp per (key row, kv head).
template <typename T>
__global__ void fp8_widen_k_kernel(const Fp8KernelParams fp, int64_t total_k, int head_dim) {
  const AttentionKernelParams& p = fp.base;
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= total_k * p.heads_k) return;
  const int64_t r = warp_id / p.heads_k;
  const int hk = static_cast<int>(warp_id % p.heads_k);
  int64_t b = 0, row = r;
  if (p.cu_seqlens_k == nullptr && p.seqlen_k > 0) {
    b = r / p.seqlen_k;
    row = r % p.seqlen_k;
  }
  const uint8_t* k = static_cast<const uint8_t*>(p.k) + b * p.k_st.batch + row * p.k_st.row + hk * p.k_st.head;
  T* k16 = static_cast<T*>(fp.k16) + (r * p.heads_k + hk) * head_dim;
  for (int c = lane * 2; c < head_dim; c += 64)
    *reinterpret_cast<uint32_t*>(k16 + c) = ElementOps<T>::pack(e4m3_value(k[c]), e4m3_value(k[c + 1]));
}

template <int D>
constexpr int transpose_smem_bytes() { return kTransposeKeys * (D + 4); }

}  // namespace flashgrad::cuda_attn::fp8
