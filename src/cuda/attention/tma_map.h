// TMA tensor maps of the attention tensors, shared by the Hopper (wgmma) forward and backward.
//
// Each [B, S, H, D] (padded) or [T, H, D] (varlen, one batch) 16-bit view becomes a 4-D tensor map
// (D, heads, rows, batch) -- heads and rows swapped when the rows are the smaller stride, which TMA
// wants first -- with a box of 64 columns (128 bytes, the SWIZZLE_128B span) x box_rows rows x 1
// head x 1 batch. Coordinates past a dimension read as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn {

// cuTensorMapEncodeTiled, looked up once in the driver the CUDA runtime already loaded (no link
// against libcuda); nullptr when the driver lacks it. For maps other than the 16-bit ones below
// (the FP8 kernels' 8-bit operands and their transposed V).
using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
TensorMapEncoder tensor_map_encoder();

// Fills `map` and `rows_inner` (1: rows on tensor-map axis 1, heads on axis 2; 0: swapped) and returns
// true, or returns false when TMA cannot describe the view (base or a stride not 16-byte aligned,
// a stride past 2^40 bytes, no driver entry point).
bool make_tma_map_16bit(CUtensorMap* map, const void* base, const RowMajorStrides& st, int64_t rows, int64_t heads,
                        int64_t batches, int head_dim, bool bf16, int box_rows, int* rows_inner);

// The map of the backward's fp32 dQ accumulator (dq_accum_map.h) with the driver's encoder.
bool make_tma_map_dq_accum(CUtensorMap* map, float* base, int64_t rows, int64_t heads, int head_dim, int box_rows);

}  // namespace flashgrad::cuda_attn
