// Tensor maps of the FP8 wgmma backward, host side (fp8_wgmma_backward_kernel.cuh). The encoder is a
// parameter: cuTensorMapEncodeTiled on the device path (fp8_wgmma_backward.cu), a recording stand-in
// in the host emulation (fp8_wgmma_backward_emulation/), so both run this same logic.
//
// Every tensor -- the e4m3 inputs q8, k8, v8, the 16-bit dO, and the pre-pass's workspace copies
// dO8 (e4m3), q16, k16 (16-bit) -- is described as bytes: a [B, S, H, D] (padded) or [T, H, D]
// (varlen, one batch) view of elem_bytes-byte elements becomes a 4-D UINT8 map (D * elem_bytes
// bytes, rows, heads, batch) -- rows and heads swapped when the rows are the smaller stride, as TMA
// wants increasing strides -- with a box of 128 bytes (the SWIZZLE_128B span: 128 e4m3 values or 64
// 16-bit ones, one "column panel") x box_rows rows x 1 head x 1 batch. A 16-bit row of D = 128 is
// two panels, loaded at byte coordinates 0 and 128. An e4m3 row of D = 64 is one 64-byte box with
// SWIZZLE_64B (as the FP8 forward's Q / K at D = 64). TMA copies bytes, so describing 16-bit data as
// bytes changes nothing in shared memory; coordinates past a dimension read as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "attention_kernel_params.h"
#include "dq_accum_map.h"
#include "fp8_kernel_params.h"
#include "fp8_wgmma_maps.h"

namespace flashgrad::cuda_attn::fp8wb {

using fp8w::EncodeTiled;

// st in elements; false when TMA cannot describe the view (base or a byte stride not 16-byte
// aligned, a stride past 2^40, a row that is neither whole 128-byte panels nor 64 bytes). *rows_inner: 1 when the
// rows are axis 1 (heads axis 2), 0 when swapped.
inline bool make_panel_map(EncodeTiled encode, CUtensorMap* map, const void* base, const RowMajorStrides& st,
                           int elem_bytes, int64_t rows, int64_t heads, int64_t batches, int head_dim, int box_rows,
                           int* rows_inner) {
  const int64_t row_bytes = int64_t{head_dim} * elem_bytes;
  if (encode == nullptr || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || (row_bytes % 128 != 0 && row_bytes != 64))
    return false;
  const int box_bytes = row_bytes < 128 ? 64 : 128;  // 64-byte rows (e4m3 at D = 64): SWIZZLE_64B
  const int64_t head_st = fp8w::map_usable_stride(st.head * elem_bytes, heads, row_bytes);
  const int64_t row_st = fp8w::map_usable_stride(st.row * elem_bytes, rows, heads * row_bytes);
  const int64_t batch_st = fp8w::map_usable_stride(st.batch * elem_bytes, batches, rows * heads * row_bytes);
  if (!fp8w::map_stride_ok(head_st) || !fp8w::map_stride_ok(row_st) || !fp8w::map_stride_ok(batch_st)) return false;
  *rows_inner = row_st <= head_st ? 1 : 0;  // ties: a head extent of 1
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(*rows_inner ? rows : heads),
                              static_cast<cuuint64_t>(*rows_inner ? heads : rows), static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(*rows_inner ? row_st : head_st),
                                 static_cast<cuuint64_t>(*rows_inner ? head_st : row_st),
                                 static_cast<cuuint64_t>(batch_st)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_bytes), static_cast<cuuint32_t>(*rows_inner ? box_rows : 1),
                             static_cast<cuuint32_t>(*rows_inner ? 1 : box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The workspace arrays [rows, heads, D] (dO8, q16: rows = total_q, heads = Hq; k16: total_k, Hk).
inline bool make_workspace_map(EncodeTiled encode, CUtensorMap* map, const void* base, int elem_bytes, int64_t rows,
                               int64_t heads, int head_dim, int box_rows, int* rows_inner) {
  RowMajorStrides st;
  st.head = head_dim;
  st.row = heads * head_dim;
  st.batch = rows * heads * head_dim;
  return make_panel_map(encode, map, base, st, elem_bytes, rows, heads, 1, head_dim, box_rows, rows_inner);
}

// The maps of the kernel (struct Fp8WgmmaBackwardMaps / Fp8WgmmaBackwardAxes of the kernel
// header, passed as their members so that this header needs no device code): q8, dO16 by the
// caller's strides (64-row boxes), k8, v8 (128-row boxes), and the workspace's dO8, q16 (64 rows),
// k16 (128 rows). rows_q / rows_k: the token extent of the q / k tensors (Sq, Sk padded; Tq, Tk
// varlen); batches: B padded, 1 varlen. False when any view is not describable.
struct MapSet {
  CUtensorMap *q8, *k8, *v8, *do8, *q16, *do16, *k16;
  int *q8_rows_inner, *k8_rows_inner, *v8_rows_inner, *do8_rows_inner, *q16_rows_inner, *do16_rows_inner,
      *k16_rows_inner;
  CUtensorMap* dq;  // the dQ accumulator (not deterministic), else zeroed
};
inline bool make_backward_maps(EncodeTiled encode, const Fp8KernelParams& f, int64_t rows_q, int64_t rows_k,
                               int64_t batches, int head_dim, int box_q, int box_k, const MapSet& m) {
  const AttentionKernelParams& p = f.base;
  const int eb16 = 2;
  std::memset(m.dq, 0, sizeof(CUtensorMap));
  if (!p.deterministic && !make_dq_accum_map(encode, m.dq, p.dq_accum, p.total_q, p.heads_q, head_dim, box_q))
    return false;
  return make_panel_map(encode, m.q8, p.q, p.q_st, 1, rows_q, p.heads_q, batches, head_dim, box_q, m.q8_rows_inner) &&
         make_panel_map(encode, m.k8, p.k, p.k_st, 1, rows_k, p.heads_k, batches, head_dim, box_k, m.k8_rows_inner) &&
         make_panel_map(encode, m.v8, p.v, p.v_st, 1, rows_k, p.heads_k, batches, head_dim, box_k, m.v8_rows_inner) &&
         make_panel_map(encode, m.do16, p.dout, p.dout_st, eb16, rows_q, p.heads_q, batches, head_dim, box_q,
                        m.do16_rows_inner) &&
         make_workspace_map(encode, m.do8, f.dout8, 1, p.total_q, p.heads_q, head_dim, box_q, m.do8_rows_inner) &&
         make_workspace_map(encode, m.q16, f.q16, eb16, p.total_q, p.heads_q, head_dim, box_q, m.q16_rows_inner) &&
         make_workspace_map(encode, m.k16, f.k16, eb16, f.total_k, p.heads_k, head_dim, box_k, m.k16_rows_inner);
}

}  // namespace flashgrad::cuda_attn::fp8wb
