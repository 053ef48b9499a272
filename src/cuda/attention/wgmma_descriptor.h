// The shared-memory matrix descriptor of a wgmma operand in the 128-byte swizzle (layout type 1 in
// bits 62-63; start address, leading and stride byte offsets in 16-byte units, PTX ISA "Matrix
// Descriptor"): one definition for the kernels (wgmma_primitives.cuh's smem_desc) and the host models
// that emulate them (emulation_common/wgmma.h for the attention, delta_rule/chunked_emulation/
// emulator_sm90.h for the delta rule), so that the emulations decode exactly what the kernels encode.
// No inline PTX: it compiles for the device and for the host alike.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHGRAD_WGMMA_DESC_HD __host__ __device__
#else
#define FLASHGRAD_WGMMA_DESC_HD
#endif

namespace flashgrad::wgmma_descriptor {

FLASHGRAD_WGMMA_DESC_HD inline constexpr uint64_t swizzle128_desc(uint32_t addr, uint32_t lbo_bytes,
                                                                  uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

}  // namespace flashgrad::wgmma_descriptor

#undef FLASHGRAD_WGMMA_DESC_HD
