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

// The descriptor of the operand `bytes` further on in shared memory: the start address field (bits 0-13,
// address / 16) plus bytes / 16, one integer add instead of swizzle128_desc's masks and shifts (the wgmma
// chains of the delta rule step through their tiles so). Exact while the address stays below 2^18 (every
// shared address on sm_90: 228 KiB), so the field does not carry into the leading byte offset.
// (The add is on the low word alone, so that the compiler sees the high word, the stride byte offset and
// the layout type, unchanged: no 64-bit add with its carry.)
FLASHGRAD_WGMMA_DESC_HD inline constexpr uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

}  // namespace flashgrad::wgmma_descriptor

#undef FLASHGRAD_WGMMA_DESC_HD
