// Host side of the TMA tensor maps (tma_map.h).
#include "tma_map.h"

#include "dq_accum_map.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace flashgrad::cuda_attn {

TensorMapEncoder tensor_map_encoder() {
  static TensorMapEncoder fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<TensorMapEncoder>(f);
  }();
  return fn;
}

namespace {

// A dimension of extent 1 is never stepped along, so any valid stride describes it.
int64_t usable_stride(int64_t stride, int64_t extent, int64_t fallback) {
  return extent == 1 ? fallback : stride;
}

}  // namespace

// The map of one operand; false when TMA cannot describe the view.
bool make_tma_map_16bit(CUtensorMap* map, const void* base, const RowMajorStrides& st, int64_t rows, int64_t heads,
                        int64_t batches, int head_dim, bool bf16, int box_rows, int* rows_inner) {
  const TensorMapEncoder encode = tensor_map_encoder();
  if (encode == nullptr || reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  const int64_t head_st = usable_stride(st.head, heads, head_dim) * 2;
  const int64_t row_st = usable_stride(st.row, rows, heads * head_dim) * 2;
  const int64_t batch_st = usable_stride(st.batch, batches, rows * heads * head_dim) * 2;
  for (int64_t s : {head_st, row_st, batch_st})
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
  *rows_inner = row_st < head_st ? 1 : 0;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(*rows_inner ? rows : heads),
                              static_cast<cuuint64_t>(*rows_inner ? heads : rows), static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(*rows_inner ? row_st : head_st),
                                 static_cast<cuuint64_t>(*rows_inner ? head_st : row_st),
                                 static_cast<cuuint64_t>(batch_st)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(*rows_inner ? box_rows : 1),
                             static_cast<cuuint32_t>(*rows_inner ? 1 : box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                            const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool make_tma_map_dq_accum(CUtensorMap* map, float* base, int64_t rows, int64_t heads, int head_dim, int box_rows) {
  return make_dq_accum_map(tensor_map_encoder(), map, base, rows, heads, head_dim, box_rows);
}

}  // namespace flashgrad::cuda_attn
