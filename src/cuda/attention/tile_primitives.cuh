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

// ldmatrix addressing with the lane-dependent part hoisted out of the loops.
// Every x4 load reads four 8x8 pieces; lane l addresses row l % 8 of piece l / 8. Two arrangements
// of the pieces cover all operands (row0 a multiple of 8, col0 a multiple of 16):
//   kRowsThenCols: pieces (+0,+0) (+8,+0) (+0,+8) (+8,+8) in (row, col): an A fragment of a
//                  row-major tile, or B fragments of a [k][n] tile via the transposing load;
//   kColsThenRows: pieces (+0,+0) (+0,+8) (+8,+0) (+8,+8): B fragments of an [n][k] tile for two
//                  n-tiles, or an A fragment of a tile that stores the operand transposed.
// Since row0 % 8 == 0, the swizzle XOR only sees the lane's row r = l % 8 and the low 3 bits of the
// chunk index; col0's chunk index is even, so those low bits take 4 values: the 4 byte offsets are
// computed once per lane and a load's address is base + off[(col0 / 16) % 4] + a constant.
enum PieceOrder { kRowsThenCols, kColsThenRows };

template <int COLS>
struct LaneOffsets {
  uint32_t off[4];
  __device__ __forceinline__ LaneOffsets(int lane, PieceOrder order) {
    const int piece = lane >> 3, r = lane & 7;
    const int row = r + (order == kRowsThenCols ? (piece & 1) : (piece >> 1)) * 8;
    const int chunk = order == kRowsThenCols ? (piece >> 1) : (piece & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) off[i] = (row * COLS + (((2 * i + chunk) ^ r) << 3)) * 2;
  }
  // Shared-memory byte address of the lane's row for the 16 x 16 block at (row0, col0).
  __device__ __forceinline__ uint32_t at(uint32_t base, int row0, int col0) const {
    return base + (row0 * COLS + (col0 & ~63)) * 2 + off[(col0 >> 4) & 3];
  }
};

// A fragment of rows row0.., cols col0.. of a row-major tile (lo: kRowsThenCols).
template <int COLS>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, const LaneOffsets<COLS>& lo,
                                       int row0, int col0) {
  ldmatrix_x4(a, lo.at(tile, row0, col0));
}
// A fragment of M (rows row0.., cols col0..) from a tile storing M^T (lo: kColsThenRows).
template <int COLS>
__device__ __forceinline__ void load_a_from_transposed(uint32_t (&a)[4], uint32_t tile,
                                                       const LaneOffsets<COLS>& lo, int row0, int col0) {
  ldmatrix_x4_trans(a, lo.at(tile, col0, row0));
}
// B fragments of n-tiles n0.., n0+8.. at k0.. from a tile storing B as [n][k], e.g. K for Q K^T
// (lo: kColsThenRows): b[0], b[1] for the first n-tile, b[2], b[3] for the second.
template <int COLS>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], uint32_t tile, const LaneOffsets<COLS>& lo,
                                          int n0, int k0) {
  ldmatrix_x4(b, lo.at(tile, n0, k0));
}
// B fragments of n-tiles n0.., n0+8.. at k0.. from a tile storing B as [k][n], e.g. V for P V
// (lo: kRowsThenCols, transposing load).
template <int COLS>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], uint32_t tile, const LaneOffsets<COLS>& lo,
                                          int k0, int n0) {
  ldmatrix_x4_trans(b, lo.at(tile, k0, n0));
}

// 2^x on the SFU (ex2.approx: 2 ulp; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
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
