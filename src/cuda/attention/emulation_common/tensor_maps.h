// cuTensorMapEncodeTiled on the host: the emulated map keeps what the map code asked for inside the
// CUtensorMap (base, dims, byte strides, box, swizzle span), for the emulated TMA (tma.h) to
// follow; plus the shared-memory address swizzle that TMA writes and wgmma reads.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

struct EmuMap {
  const uint8_t* base;
  int rank;
  int swizzle;  // bytes of the swizzle span: 128, 64, 32, or 0
  int elem;     // bytes per element: 1 (UINT8: the operand maps) or 4 (FLOAT32: the dQ accumulator)
  int64_t dims[5];
  int64_t strides[5];  // bytes; strides[0] = elem
  uint32_t box[5];
};
static_assert(sizeof(EmuMap) <= sizeof(CUtensorMap), "the emulated map must fit in a CUtensorMap");

int g_maps_refused = 0;  // how many encodes failed the checks below (the harness reports it)

// The checks cuTensorMapEncodeTiled makes that matter here, then the map recorded.
CUresult emu_encode(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base, const cuuint64_t* dims,
                    const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* elem_strides,
                    CUtensorMapInterleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion,
                    CUtensorMapFloatOOBfill) {
  EmuMap m{};
  const int span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                   : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                   : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32
                                                          : 0;
  const int elem = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 1;
  bool ok = (type == CU_TENSOR_MAP_DATA_TYPE_UINT8 || type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32) && rank >= 1 &&
            rank <= 5 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0 &&
            (span == 0 || box[0] * elem <= static_cast<cuuint32_t>(span));
  for (cuuint32_t i = 0; ok && i < rank; ++i) {
    ok = dims[i] >= 1 && dims[i] < (cuuint64_t{1} << 32) && box[i] >= 1 && box[i] <= 256 && elem_strides[i] == 1;
    if (i + 1 < rank) ok = ok && strides[i] % 16 == 0 && strides[i] < (cuuint64_t{1} << 40);
  }
  if (!ok) {
    ++g_maps_refused;
    return CUDA_ERROR_INVALID_VALUE;
  }
  m.base = static_cast<const uint8_t*>(base);
  m.rank = static_cast<int>(rank);
  m.swizzle = span;
  m.elem = elem;
  m.strides[0] = elem;
  for (int i = 0; i < m.rank; ++i) {
    m.dims[i] = static_cast<int64_t>(dims[i]);
    m.box[i] = box[i];
    if (i > 0) m.strides[i] = static_cast<int64_t>(strides[i - 1]);
  }
  std::memset(map, 0, sizeof(CUtensorMap));
  std::memcpy(map, &m, sizeof(m));
  return CUDA_SUCCESS;
}

// Shared-memory address swizzle of a span (address bits 4.. XOR bits 7..), as TMA writes and wgmma
// reads (128 B: 3 bits, 64 B: 2, 32 B: 1).
inline uint32_t swizzle_address(uint32_t a, int span) {
  switch (span) {
    case 128: return a ^ (((a >> 7) & 7u) << 4);
    case 64: return a ^ (((a >> 7) & 3u) << 4);
    case 32: return a ^ (((a >> 7) & 1u) << 4);
    default: return a;
  }
}
