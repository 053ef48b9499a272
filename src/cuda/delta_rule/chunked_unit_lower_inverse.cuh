// (I + M)^{-1} for the chunk's 64 x 64 strictly lower M on CUDA cores (fp32 in shared memory, 128
// threads), as the KDA stage 1 kernels use it (chunked_kda_prepare.cuh, chunked_kda_prepare_compact.cuh;
// the GDN stage 1, chunked_prepare_compact.cuh, inverts on tensor cores). Both are blocked by 16 x 16
// blocks: the four diagonal blocks by forward substitution (one thread per column), then block rows
// I = 1..3: A_IJ = -A_II sum_{J <= m < I} M_Im A_mJ, m over 16-blocks.
#pragma once

#include "chunked_rows.cuh"  // kChunkThreads

namespace flashgrad::cuda_detail::delta_rule {

// As = (I + M)^{-1} for the 64 x 64 strictly lower M (both fp32 in shared memory, ld LDM).
template <int LDM>
__device__ __forceinline__ void invert_unit_lower64(const float* M, float* As, float* tmp) {
  const int tid = threadIdx.x;
  for (int e = tid; e < 64 * 64; e += kChunkThreads) As[(e / 64) * LDM + e % 64] = 0.f;
  __syncthreads();
  // Diagonal blocks: thread (block bI, column jj) runs forward substitution down its column:
  // A_jj = 1, A_ij = -sum_{m=j}^{i-1} M_im A_mj for i in the block.
  if (tid < 64) {
    const int j = tid, end = (j / 16) * 16 + 16;
    As[j * LDM + j] = 1.f;
    for (int i = j + 1; i < end; ++i) {
      float s = 0.f;
      for (int m = j; m < i; ++m) s += M[i * LDM + m] * As[m * LDM + j];
      As[i * LDM + j] = -s;
    }
  }
  __syncthreads();
  // Block rows I = 1..3, rows [16 I, 16 I + 16), columns c < 16 I:
  //   tmp[r][c] = sum_{m = c}^{16 I - 1} M[16 I + r][m] A[m][c]   (A[m][c] = 0 for m < c)
  //   A[16 I + r][c] = -sum_{m' = 0}^{r} A[16 I + r][16 I + m'] tmp[m'][c]
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, width = 16 * I;
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = c; m < r0; ++m) s += M[(r0 + r) * LDM + m] * As[m * LDM + c];
      tmp[r * 48 + c] = s;
    }
    __syncthreads();
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = 0; m <= r; ++m) s += As[(r0 + r) * LDM + r0 + m] * tmp[m * 48 + c];
      As[(r0 + r) * LDM + c] = -s;
    }
    __syncthreads();
  }
}

// acc += x * v, component-wise.
__device__ __forceinline__ void fma4(float x, const float4& v, float4& acc) {
  acc.x = fmaf(x, v.x, acc.x);
  acc.y = fmaf(x, v.y, acc.y);
  acc.z = fmaf(x, v.z, acc.z);
  acc.w = fmaf(x, v.w, acc.w);
}

// As = (I + M)^{-1} for the 64 x 64 strictly lower M (fp32 in shared memory, pitch LDM % 4 == 0;
// 128 threads), the same blocked algorithm as invert_unit_lower64 with fewer shared-memory
// accesses: the diagonal blocks' forward substitution keeps its column in registers (thread
// (block bI, column jj) of the first 64), and the block rows are computed in strips of 4 columns
// (one float4 load of A or tmp per 4 FMAs).
template <int LDM>
__device__ __forceinline__ void invert_unit_lower64_blocked(const float* M, float* As, float* tmp) {
  static_assert(LDM % 4 == 0, "float4 rows");
  const int tid = threadIdx.x;
  if (tid < 64) {
    // Column jj of diagonal block bI: x_i = [i == jj] - sum_{m < i} M_im x_m (x_m = 0 for m < jj).
    const int r0 = 16 * (tid / 16), jj = tid % 16;
    const float* Mb = M + r0 * LDM + r0;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) acc = fmaf(Mb[i * LDM + m], x[m], acc);
      x[i] = i == jj ? 1.f : -acc;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) As[(r0 + i) * LDM + r0 + jj] = x[i];
  } else {
    // Blocks above the diagonal are zero (w and u read whole 16 x 16 blocks; A is stored whole).
    for (int e = tid - 64; e < 6 * 64; e += 64) {  // 6 blocks x 64 float4
      const int blk = e / 64, q = e % 64;          // blk: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
      const int I = blk < 3 ? 0 : (blk < 5 ? 1 : 2), J = blk < 3 ? blk + 1 : (blk < 5 ? blk - 1 : 3);
      *reinterpret_cast<float4*>(&As[(16 * I + q / 4) * LDM + 16 * J + 4 * (q % 4)]) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();
  // Block rows I = 1..3, rows [16 I, 16 I + 16), columns c < 16 I, in strips (r, c4 .. c4 + 3):
  //   tmp[r][c] = sum_{m = 0}^{16 I - 1} M[16 I + r][m] A[m][c]
  //   A[16 I + r][c] = -sum_{m' = 0}^{15} A[16 I + r][16 I + m'] tmp[m'][c]
  // Both sums run over fixed ranges (the terms outside the triangles are exact zeros: A[m][c] = 0
  // for m < c, in the zeroed blocks above the diagonal and the diagonal blocks' upper halves;
  // A_II[r][m'] = 0 for m' > r), so the loops unroll fully and each strip's loads issue ahead of
  // its FMAs (the variable-length loops this replaces waited on every shared load: ncu, session 6).
  // Two accumulator sets halve each strip's FMA chain.
#pragma unroll
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, strips = r0 / 4;  // strips per row
    for (int e = tid; e < 16 * strips; e += kChunkThreads) {
      const int r = e / strips, c4 = 4 * (e % strips);
      const float* mrow = M + (r0 + r) * LDM;
      float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;
#pragma unroll
      for (int m = 0; m < r0; m += 4) {
        const float4 mv = *reinterpret_cast<const float4*>(mrow + m);
        fma4(mv.x, *reinterpret_cast<const float4*>(&As[(m + 0) * LDM + c4]), acc0);
        fma4(mv.y, *reinterpret_cast<const float4*>(&As[(m + 1) * LDM + c4]), acc1);
        fma4(mv.z, *reinterpret_cast<const float4*>(&As[(m + 2) * LDM + c4]), acc0);
        fma4(mv.w, *reinterpret_cast<const float4*>(&As[(m + 3) * LDM + c4]), acc1);
      }
      *reinterpret_cast<float4*>(&tmp[r * 48 + c4]) =
          make_float4(acc0.x + acc1.x, acc0.y + acc1.y, acc0.z + acc1.z, acc0.w + acc1.w);
    }
    __syncthreads();
    for (int e = tid; e < 16 * strips; e += kChunkThreads) {
      const int r = e / strips, c4 = 4 * (e % strips);
      const float* arow = As + (r0 + r) * LDM + r0;
      float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;
#pragma unroll
      for (int m = 0; m < 16; m += 4) {
        const float4 av = *reinterpret_cast<const float4*>(arow + m);
        fma4(av.x, *reinterpret_cast<const float4*>(&tmp[(m + 0) * 48 + c4]), acc0);
        fma4(av.y, *reinterpret_cast<const float4*>(&tmp[(m + 1) * 48 + c4]), acc1);
        fma4(av.z, *reinterpret_cast<const float4*>(&tmp[(m + 2) * 48 + c4]), acc0);
        fma4(av.w, *reinterpret_cast<const float4*>(&tmp[(m + 3) * 48 + c4]), acc1);
      }
      *reinterpret_cast<float4*>(&As[(r0 + r) * LDM + c4]) =
          make_float4(-(acc0.x + acc1.x), -(acc0.y + acc1.y), -(acc0.z + acc1.z), -(acc0.w + acc1.w));
    }
    __syncthreads();
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
