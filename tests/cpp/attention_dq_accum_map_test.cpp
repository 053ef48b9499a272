// make_dq_accum_map (src/cuda/attention/dq_accum_map.h): the tensor map through which the Hopper
// backwards add their staged dQ tiles to the fp32 accumulator [rows, heads, head_dim]. Checked here
// with a recording encoder (no GPU, no driver): the dimensions, byte strides, box and swizzle it
// asks for, and the views it must refuse (the kernels then fall back or report). A wrong stride or
// box here would add dQ into the wrong rows on the GPU; the GPU tests would see that only as an
// accuracy failure, this test names the field.
#include <gtest/gtest.h>

#if __has_include(<cuda.h>)
#include <cuda.h>

#include <cstdint>
#include <vector>

#include "cuda/attention/dq_accum_map.h"

namespace flashgrad::test {
namespace {

struct Recorded {
  int calls = 0;
  CUtensorMapDataType type{};
  cuuint32_t rank = 0;
  void* base = nullptr;
  std::vector<cuuint64_t> dims, strides;
  std::vector<cuuint32_t> box;
  CUtensorMapSwizzle swizzle{};
};
Recorded g_rec;

CUresult record(CUtensorMap*, CUtensorMapDataType type, cuuint32_t rank, void* base, const cuuint64_t* dims,
                const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t*, CUtensorMapInterleave,
                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  g_rec.calls++;
  g_rec.type = type;
  g_rec.rank = rank;
  g_rec.base = base;
  g_rec.dims.assign(dims, dims + rank);
  g_rec.strides.assign(strides, strides + rank - 1);
  g_rec.box.assign(box, box + rank);
  g_rec.swizzle = swizzle;
  return CUDA_SUCCESS;
}

using Encode = decltype(&record);

TEST(AttentionDqAccumMap, DescribesRowsHeadsColumnsWithSwizzledBoxes) {
  alignas(16) static float accum[64];
  g_rec = {};
  CUtensorMap map;
  // 5000 rows x 48 heads x 128 columns, boxes of 64 rows (hd128's query tile).
  ASSERT_TRUE(cuda_attn::make_dq_accum_map(&record, &map, accum, 5000, 48, 128, 64));
  ASSERT_EQ(g_rec.calls, 1);
  EXPECT_EQ(g_rec.type, CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
  EXPECT_EQ(g_rec.rank, 3u);
  EXPECT_EQ(g_rec.base, static_cast<void*>(accum));
  // Element (d, h, r) at (r * heads + h) * head_dim + d: dims innermost first.
  EXPECT_EQ(g_rec.dims, (std::vector<cuuint64_t>{128, 48, 5000}));
  EXPECT_EQ(g_rec.strides, (std::vector<cuuint64_t>{128 * 4, 48 * 128 * 4}));
  // 32 floats = 128 bytes, the SWIZZLE_128B span the staging layout assumes; one head; box_rows rows.
  EXPECT_EQ(g_rec.box, (std::vector<cuuint32_t>{32, 1, 64}));
  EXPECT_EQ(g_rec.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
}

TEST(AttentionDqAccumMap, StridesPast32Bits) {
  alignas(16) static float accum[4];
  g_rec = {};
  CUtensorMap map;
  // 2^30 rows x 8 heads x 256 columns: the row stride is 8 KiB, the tensor 8 TiB (never touched).
  ASSERT_TRUE(cuda_attn::make_dq_accum_map(&record, &map, accum, int64_t{1} << 30, 8, 256, 128));
  EXPECT_EQ(g_rec.dims[2], cuuint64_t{1} << 30);
  EXPECT_EQ(g_rec.strides[1], cuuint64_t{8} * 256 * 4);
}

TEST(AttentionDqAccumMap, RefusesWhatTheKernelsCannotAddThrough) {
  alignas(16) static float accum[8];
  CUtensorMap map;
  g_rec = {};
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(static_cast<Encode>(nullptr), &map, accum, 100, 4, 128, 64))
      << "no encoder";
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(&record, &map, static_cast<float*>(nullptr), 100, 4, 128, 64))
      << "no accumulator (deterministic mode allocates none)";
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(&record, &map, accum + 1, 100, 4, 128, 64)) << "base not 16-byte aligned";
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(&record, &map, accum, int64_t{1} << 31, 4, 128, 64))
      << "rows past the kernels' int row coordinate";
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(&record, &map, accum, 0, 4, 128, 64)) << "no rows";
  EXPECT_FALSE(cuda_attn::make_dq_accum_map(&record, &map, accum, 100, 4, 80, 64)) << "head_dim not whole boxes";
  EXPECT_EQ(g_rec.calls, 0) << "a refused view never reaches the encoder";
}

}  // namespace
}  // namespace flashgrad::test

#else  // no CUDA headers on this machine: nothing to build the map types from

TEST(AttentionDqAccumMap, NeedsCudaHeaders) { GTEST_SKIP() << "cuda.h not found: the TMA map types are CUDA's"; }

#endif
