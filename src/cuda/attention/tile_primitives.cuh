// Warp-level building blocks of the attention kernels: tensor-core mma.sync m16n8k16 (bf16/fp16 in,
// fp32 accumulate), ldmatrix loads from swizzled shared memory, and cp.async tile copies.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A 16x16 (row-major): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B 16x8 (k x n):      b0 = (k 2t..2t+1, n g)               b1 = (k 2t+8.., n g)
//   C 16x8 (fp32):       c0,c1 = (g, 2t..2t+1)                c2,c3 = (g+8, 2t..2t+1)
// A C fragment pair of two adjacent n-tiles is exactly an A fragment of the next product (the
// "register reuse" of FlashAttention 2), which is how P and dS feed the second GEMMs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashgrad::cuda_attn {

// ---- element types -----------------------------------------------------------------------------
template <typename T>
struct ElementOps;

template <>
struct ElementOps<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElementOps<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- swizzled shared-memory tiles ----------------------------------------------------------------
// A tile of ROWS x COLS 16-bit elements, COLS a multiple of 64, stored row-major in 16-byte chunks
// whose chunk index is XORed with (row % 8). ldmatrix reads 8 rows at one column chunk; without the
// XOR those 8 addresses fall in the same banks (rows are multiples of 128 bytes apart).
template <int COLS>
__device__ __forceinline__ int swizzled_offset(int row, int col) {
  static_assert(COLS % 64 == 0, "swizzle needs at least 8 chunks of 8 elements per row");
  return row * COLS + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment (16 rows from row0, 16 columns from col0) of a row-major tile: the four 8x8 pieces
// (rows +0/+8) x (cols +0/+8) in the order a0, a1, a2, a3. Lane l addresses piece l / 8, row l % 8.
template <int COLS, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int col0, int lane) {
  const int piece = lane >> 3, r = lane & 7;
  ldmatrix_x4(a, smem_address(tile + swizzled_offset<COLS>(row0 + r + (piece & 1) * 8,
                                                             col0 + (piece >> 1) * 8)));
}

// A fragment of M (16 x 16 from (row0, col0)) when the tile stores M transposed (tile[c][r] = M[r][c]).
template <int COLS, typename T>
__device__ __forceinline__ void load_a_from_transposed(uint32_t (&a)[4], const T* tile, int row0,
                                                       int col0, int lane) {
  const int piece = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(a, smem_address(tile + swizzled_offset<COLS>(col0 + r + (piece >> 1) * 8,
                                                                   row0 + (piece & 1) * 8)));
}

// B fragments for two n-tiles (n0..n0+7, n0+8..n0+15) at k0..k0+15, where the tile stores B
// transposed, i.e. tile[n][k] (K for S = Q K^T): b[0], b[1] for the first n-tile, b[2], b[3] next.
template <int COLS, typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  const int piece = lane >> 3, r = lane & 7;
  ldmatrix_x4(b, smem_address(tile + swizzled_offset<COLS>(n0 + r + (piece >> 1) * 8,
                                                             k0 + (piece & 1) * 8)));
}

// B fragments for two n-tiles when the tile stores B as tile[k][n] (V for O = P V): transposing
// ldmatrix over rows k0.., k0+8.. at columns n0, n0+8.
template <int COLS, typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  const int piece = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(b, smem_address(tile + swizzled_offset<COLS>(k0 + r + (piece & 1) * 8,
                                                                   n0 + (piece >> 1) * 8)));
}

// ---- cp.async ------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Copies rows [0, valid_rows) of a ROWS x COLS global tile (row stride in elements, int64) into a
// swizzled shared tile; rows past valid_rows become zeros (so padding never injects NaN into a
// product). All THREADS threads of the CTA take part.
template <int ROWS, int COLS, int THREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* global, int64_t row_stride,
                                                int valid_rows, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int c = tid; c < kChunks; c += THREADS) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const bool valid = r < valid_rows;
    const T* src = valid ? global + static_cast<int64_t>(r) * row_stride + ch * 8 : global;
    cp_async_16(smem_address(tile + swizzled_offset<COLS>(r, ch * 8)), src, valid);
  }
}

// Sum / max over the 4 lanes (t = 0..3) that share a fragment row.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

}  // namespace flashgrad::cuda_attn
