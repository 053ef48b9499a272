// The tensor map of the backward's fp32 dQ accumulator dq_accum [rows, heads, head_dim] (rows =
// scratch rows: B * Sq padded, Tq varlen), for the TMA tensor reductions of wgmma_dq_staging.cuh:
// a 3-D map (head_dim, heads, rows) with a box of 32 columns (128 bytes, the SWIZZLE_128B span)
// x 1 head x box_rows rows. The encoder is a parameter (cuTensorMapEncodeTiled on the device path,
// a recording stand-in in the FP8 backward's host emulation), so both run this logic.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashgrad::cuda_attn {

// False when TMA cannot describe it (no encoder, base not 16-byte aligned, rows past 2^31 - 1:
// the kernels' row coordinate is an int, head_dim not a multiple of 32).
template <typename Encode>
inline bool make_dq_accum_map(Encode encode, CUtensorMap* map, float* base, int64_t rows, int64_t heads, int head_dim,
                              int box_rows) {
  if (encode == nullptr || base == nullptr || reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  if (rows <= 0 || rows >= (int64_t{1} << 31) || heads <= 0 || head_dim <= 0 || head_dim % 32 != 0) return false;
  // Element (d, h, r) at base + (r * heads + h) * head_dim + d; strides in bytes of dims 1 and 2.
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 4,
                                 static_cast<cuuint64_t>(heads) * static_cast<cuuint64_t>(head_dim) * 4};
  if (strides[1] >= (cuuint64_t{1} << 40)) return false;
  const cuuint32_t box[3] = {32, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace flashgrad::cuda_attn
