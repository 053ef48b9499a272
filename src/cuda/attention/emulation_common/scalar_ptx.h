// The scalar PTX of the attention kernels' headers, emulated on the host: ex2.approx (as exp2: the
// hardware's approximation is not modelled) and the e4m3 packing of fp8_fragments.cuh
// (cvt.rn.satfinite.e4m3x2, whose device version only nvcc compiles); and the value of a 16-bit
// operand, for the emulated tensor-core instructions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/host_dtype.h"
#include "fp8_fragments.cuh"  // the rewritten copy (namespace flashgrad::cuda_attn_emulated)

inline float emu_exp2(float x) { return std::exp2(x); }

// The value of the bf16 or f16 (T) bits h.
template <typename T>
float half_value(uint16_t h) {
  T x;
  std::memcpy(&x, &h, 2);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

namespace flashgrad::cuda_attn_emulated::fp8 {
inline uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  return uint32_t{host::float_to_e4m3(x0)} | uint32_t{host::float_to_e4m3(x1)} << 8 |
         uint32_t{host::float_to_e4m3(x2)} << 16 | uint32_t{host::float_to_e4m3(x3)} << 24;
}
}  // namespace flashgrad::cuda_attn_emulated::fp8

namespace flashgrad::cuda_attn_emulated::sm90 {
// fp8_wgmma_primitives.cuh's max3_bits: the largest bit pattern, read as int32, of three floats.
inline int max3_bits(float a, float b, float c) {
  const int x = static_cast<int>(host::float_to_bits(a)), y = static_cast<int>(host::float_to_bits(b)),
            z = static_cast<int>(host::float_to_bits(c));
  return std::max(std::max(x, y), z);
}
inline int max3_bits(int a, float b, float c) { return std::max(a, max3_bits(b, c, c)); }
}  // namespace flashgrad::cuda_attn_emulated::sm90
