// The mma.sync PTX emulations' names for a harness whose kernels include the 16-bit / mma.sync
// headers (rewritten by rewrite_asm.py) but must never run that PTX: each call aborts.
#pragma once

#include <cstdint>

#include "cuda/attention/emulation_common/thread_model.h"

inline void emu_cp_async(uint32_t, const void*, int, int) { emu_fail("unexpected call of cp.async"); }
inline void emu_ldmatrix_x4(uint32_t (&)[4], uint32_t, bool) { emu_fail("unexpected call of ldmatrix"); }
template <typename T>
void emu_mma_16816(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {
  emu_fail("unexpected call of mma.m16n8k16");
}
inline void emu_mma_e4m3(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {
  emu_fail("unexpected call of mma.m16n8k32");
}
