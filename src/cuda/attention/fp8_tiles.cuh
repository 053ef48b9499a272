// Device building blocks of the FP8 attention kernels: the e4m3 tensor-core product
// (mma.sync m16n8k32, fp32 accumulate), ldmatrix loads of 8-bit swizzled tiles and their cp.async
// copies from global memory. Layouts and index math: fp8_fragments.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_fragments.cuh"
#include "tile_primitives.cuh"

namespace flashgrad::cuda_attn::fp8 {

// c += A B for A 16x32 and B 32x8 in e4m3 (fragments as in fp8_fragments.cuh).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment (16 rows x 32 bytes at row0, col0) of an 8-bit tile (lo built rows_then_cols).
template <int ROW_BYTES>
__device__ __forceinline__ void load_a8(uint32_t (&a)[4], uint32_t tile, const Fp8LaneOffsets<ROW_BYTES>& lo,
                                        int row0, int col0) {
  ldmatrix_x4(a, tile + lo.at(row0, col0));
}
// B fragments of n-tiles n0.., n0 + 8.. at k0..k0 + 31 of a tile storing B as [n][k] (lo built
// cols_then_rows): b[0], b[1] for the first n-tile, b[2], b[3] for the second.
template <int ROW_BYTES>
__device__ __forceinline__ void load_b8(uint32_t (&b)[4], uint32_t tile, const Fp8LaneOffsets<ROW_BYTES>& lo,
                                        int n0, int k0) {
  ldmatrix_x4(b, tile + lo.at(n0, k0));
}

// Copies rows [0, valid_rows) of a ROWS x ROW_BYTES global tile of bytes (row stride in bytes) into
// a swizzled 8-bit tile; rows past valid_rows become zeros.
template <int ROWS, int ROW_BYTES, int THREADS>
__device__ __forceinline__ void load_tile8_async(uint8_t* tile, const uint8_t* global, int64_t row_stride,
                                                 int valid_rows, int tid) {
  constexpr int kChunksPerRow = ROW_BYTES / 16;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int c = tid; c < kChunks; c += THREADS) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const bool valid = r < valid_rows;
    const uint8_t* src = valid ? global + static_cast<int64_t>(r) * row_stride + ch * 16 : global;
    cp_async_16(smem_address(tile + r * ROW_BYTES + (swizzled_chunk<ROW_BYTES>(r, ch) << 4)), src, valid);
  }
}

}  // namespace flashgrad::cuda_attn::fp8
