// How the emulated e4m3 tensor-core instructions (mma.sync m16n8k32, wgmma m64nNk32) accumulate:
// by default a model of Hopper's reduced-precision accumulation, measured by DeepSeek-V3 (the
// products aligned to the largest one's exponent and cut to 14 bits) and SageAttention2 (the
// accumulator input keeps 13 mantissa bits, the low 10 dropped); an environment variable of the
// harness turns it off (exact products, summed as each instruction's emulation says).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/host_dtype.h"

bool g_hopper_accumulator = true;

// c + the k products (each exact in double: products of e4m3 values are), as Hopper adds them.
inline float hopper_e4m3_accumulate(float c, const double* prod, int k) {
  double big = 0;
  for (int i = 0; i < k; ++i) big = std::max(big, std::fabs(prod[i]));
  double sum = 0;
  if (big > 0) {
    const double unit = std::ldexp(1.0, std::ilogb(big) - 13);
    for (int i = 0; i < k; ++i) sum += std::trunc(prod[i] / unit) * unit;
  }
  const float cin = flashgrad::host::bits_to_float(flashgrad::host::float_to_bits(c) & ~0x3ffu);
  return static_cast<float>(double(cin) + sum);
}

// exact_env=1 turns the model off; prints which accumulation runs ("e4m3 <instruction> accumulator: ...").
inline void configure_e4m3_accumulator(const char* exact_env, const char* instruction) {
  if (const char* e = std::getenv(exact_env)) g_hopper_accumulator = std::string(e) != "1";
  std::printf("e4m3 %s accumulator: %s\n", instruction,
              g_hopper_accumulator ? "Hopper model (14-bit aligned products, 13-bit C)" : "exact");
}
