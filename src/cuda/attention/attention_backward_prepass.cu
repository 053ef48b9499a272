// The backward's small passes around the main kernel:
//  - pre-pass, one warp per (query row, head): Delta = rowsum(dO * O) in fp32, folded with dLSE and
//    the z-loss into shift = Delta - dLSE - z * lse (so dS = P (dP - shift)), and lse in log2 units.
//    Fully masked rows (lse = -inf) get lse_log2 = +inf (P = exp2(s - inf) = 0) and shift = 0, so
//    no inf * 0 reaches their gradient.
//  - dq convert: dq = scale * dq_accum rounded once into dq's dtype and strides.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_launch.h"
#include "cuda/common/cuda_check.h"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn {
namespace {

constexpr float kLog2eHost = 1.4426950408889634f;

// Scratch row r (0 <= r < total_q) as (batch, row within the tensor's token dimension).
__device__ __forceinline__ void split_row(const AttentionKernelParams& p, int64_t r, int64_t& batch,
                                          int64_t& row) {
  if (p.cu_seqlens_q != nullptr || p.seqlen_q == 0) {
    batch = 0;
    row = r;
  } else {
    batch = r / p.seqlen_q;
    row = r % p.seqlen_q;
  }
}

template <typename T>
__global__ void prepass_kernel(const AttentionKernelParams p, int head_dim) {
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= p.total_q * p.heads_q) return;
  const int64_t r = warp_id / p.heads_q;
  const int h = static_cast<int>(warp_id % p.heads_q);
  int64_t b, row;
  split_row(p, r, b, row);
  const T* o = static_cast<const T*>(p.out) + b * p.out_st.batch + row * p.out_st.row + h * p.out_st.head;
  const T* d = static_cast<const T*>(p.dout) + b * p.dout_st.batch + row * p.dout_st.row + h * p.dout_st.head;
  float sum = 0.f;
  for (int c = lane * 2; c < head_dim; c += 64)
    sum += ElementOps<T>::to_float(o[c]) * ElementOps<T>::to_float(d[c]) +
           ElementOps<T>::to_float(o[c + 1]) * ElementOps<T>::to_float(d[c + 1]);
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
  if (p.dlse != nullptr)
    dlse += p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + row * p.dlse_row_stride];
  p.lse_log2[out_idx] = lse * kLog2eHost;
  p.delta_shift[out_idx] = sum - dlse;
}

template <typename T>
__global__ void dq_convert_kernel(const AttentionKernelParams p, int head_dim) {
  const int64_t pairs = p.total_q * p.heads_q * head_dim / 2;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < pairs;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = 2 * x;
    const int c = static_cast<int>(e % head_dim);
    const int64_t rh = e / head_dim;
    const int h = static_cast<int>(rh % p.heads_q);
    const int64_t r = rh / p.heads_q;
    int64_t b, row;
    split_row(p, r, b, row);
    const float2 acc = *reinterpret_cast<const float2*>(p.dq_accum + e);
    T* dst = static_cast<T*>(p.dq) + b * p.dq_st.batch + row * p.dq_st.row + h * p.dq_st.head + c;
    *reinterpret_cast<uint32_t*>(dst) = ElementOps<T>::pack(acc.x * p.scale, acc.y * p.scale);
  }
}

int blocks_for(int64_t threads, int per_block) {
  const int64_t b = (threads + per_block - 1) / per_block;
  return static_cast<int>(b < (1LL << 30) ? b : (1LL << 30));
}

}  // namespace

void launch_backward_prepass(const AttentionKernelParams& p, int head_dim, bool bf16,
                             cudaStream_t stream) {
  const int64_t threads = p.total_q * p.heads_q * 32;
  if (threads == 0) return;
  const int grid = blocks_for(threads, 256);
  if (bf16)
    prepass_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, head_dim);
  else
    prepass_kernel<__half><<<grid, 256, 0, stream>>>(p, head_dim);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

void launch_dq_convert(const AttentionKernelParams& p, int head_dim, bool bf16, cudaStream_t stream) {
  const int64_t pairs = p.total_q * p.heads_q * head_dim / 2;
  if (pairs == 0) return;
  const int grid = blocks_for(pairs, 256) < 132 * 16 ? blocks_for(pairs, 256) : 132 * 16;
  if (bf16)
    dq_convert_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, head_dim);
  else
    dq_convert_kernel<__half><<<grid, 256, 0, stream>>>(p, head_dim);
  FLASHGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace flashgrad::cuda_attn
