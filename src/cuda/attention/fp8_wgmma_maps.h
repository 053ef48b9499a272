// Tensor maps of the FP8 wgmma forward, host side: which dims, strides and boxes describe q, k (4-D)
// and the transposed V copy (3-D) for TMA. The encoder is a parameter: cuTensorMapEncodeTiled on
// the device path (fp8_wgmma_forward.cu), a recording stand-in in the host emulation
// (fp8_wgmma_emulation/), so both run this same logic.
//
// q / k: each [B, S, H, D] (padded) or [T, H, D] (varlen, one batch) e4m3 view becomes a 4-D map
// (D, heads, rows, batch) -- heads and rows swapped when the rows are the smaller stride, as TMA
// wants increasing strides -- with a box of 128 columns (128 bytes: the SWIZZLE_128B span) x 1 head
// x 128 rows x 1 batch; a D = 256 row is two such boxes (column panels); D = 64 rows are one box of
// 64 bytes with SWIZZLE_64B. Coordinates past a dimension read as zeros; varlen tiles past a
// sequence read the next sequence's tokens, which the kernel masks.
// vt: [Hk, D, vt_cols] bytes as a 3-D map (vt_cols, D, Hk), box 128 columns x D rows x 1.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention_kernel_params.h"

namespace flashgrad::cuda_attn::fp8w {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A dimension of extent 1 is never stepped along, so any valid stride describes it.
inline int64_t map_usable_stride(int64_t stride, int64_t extent, int64_t fallback) {
  return extent == 1 ? fallback : stride;
}
inline bool map_stride_ok(int64_t s) { return s > 0 && s % 16 == 0 && s < (int64_t{1} << 40); }

// The 4-D map of an e4m3 q or k view (strides in elements = bytes); false when TMA cannot describe
// it. *rows_inner: 1 when the rows are axis 1 (heads axis 2), 0 when swapped.
inline bool make_rows_map(EncodeTiled encode, CUtensorMap* map, const void* base, const RowMajorStrides& st,
                          int64_t rows, int64_t heads, int64_t batches, int head_dim, int* rows_inner) {
  if (encode == nullptr || reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  const int64_t head_st = map_usable_stride(st.head, heads, head_dim);
  const int64_t row_st = map_usable_stride(st.row, rows, heads * head_dim);
  const int64_t batch_st = map_usable_stride(st.batch, batches, rows * heads * head_dim);
  if (!map_stride_ok(head_st) || !map_stride_ok(row_st) || !map_stride_ok(batch_st)) return false;
  *rows_inner = row_st < head_st ? 1 : 0;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(*rows_inner ? rows : heads),
                              static_cast<cuuint64_t>(*rows_inner ? heads : rows), static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(*rows_inner ? row_st : head_st),
                                 static_cast<cuuint64_t>(*rows_inner ? head_st : row_st),
                                 static_cast<cuuint64_t>(batch_st)};
  const int row_bytes = head_dim < 128 ? head_dim : 128;
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(row_bytes), static_cast<cuuint32_t>(*rows_inner ? 128 : 1),
                             static_cast<cuuint32_t>(*rows_inner ? 1 : 128), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

inline bool make_vt_map(EncodeTiled encode, CUtensorMap* map, const uint8_t* vt, int64_t vt_cols, int head_dim,
                        int64_t heads_k, int box_keys) {
  if (encode == nullptr || reinterpret_cast<std::uintptr_t>(vt) % 16 != 0 || !map_stride_ok(vt_cols)) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(vt_cols), static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(heads_k)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(vt_cols), static_cast<cuuint64_t>(vt_cols * head_dim)};
  if (strides[1] >= (uint64_t{1} << 40)) return false;
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_keys), static_cast<cuuint32_t>(head_dim), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(vt), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace flashgrad::cuda_attn::fp8w
