// Host-side conversions between flashgrad's storage dtypes and float/double.
//
// The CPU reference reads inputs of any floating dtype into its compute type (float or double)
// and rounds results once, to nearest-even, into the output dtype. Written out here (not taken
// from a framework) so the core has no dependency.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashgrad/tensor.h"

namespace flashgrad::host {

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// bfloat16 is the top half of a float32.
inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t b = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}
inline uint16_t float_to_f16(float f) {
  const uint32_t b = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  const float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 6.103515625e-05f) {  // subnormal range: units of 2^-24, rounded to nearest even
    const float units = a * 16777216.0f;  // exact (power-of-two scaling)
    float r = std::nearbyint(units);      // default rounding mode is to-nearest-even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  uint32_t m = b & 0x7fffffffu;
  // Re-bias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits, nearest even.
  m += 0xfffu + ((m >> 13) & 1u);
  m -= (112u << 23);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(m >> 13));
}

// float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; 0x7f / 0xff are NaN; max 448.
inline float e4m3_to_float(uint8_t x) {
  const float sign = (x & 0x80u) ? -1.0f : 1.0f;
  const int exp = (x >> 3) & 0xf;
  const int man = x & 0x7;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(1.0f + man / 8.0f, exp - 7);
}
inline uint8_t float_to_e4m3(float f) {  // saturating, round to nearest even
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = f < 0 ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < std::ldexp(1.0f, -6)) {  // subnormals: units of 2^-9
    const float r = std::nearbyint(a * 512.0f);
    return sign | static_cast<uint8_t>(r);  // r == 8 becomes the smallest normal, encoded 0x08
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float scaled = std::nearbyint((m * 2.0f - 1.0f) * 8.0f);  // 3 mantissa bits
  int exp = e - 1 + 7;
  if (scaled >= 8.0f) { scaled = 0; ++exp; }
  if (exp > 15 || (exp == 15 && scaled > 6)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(exp << 3) | static_cast<uint8_t>(scaled);
}

// Read element `offset` (in elements) of a floating-point buffer as T (float or double).
template <typename T>
inline T load(const void* base, DType dt, int64_t offset) {
  switch (dt) {
    case DType::f32: return static_cast<T>(static_cast<const float*>(base)[offset]);
    case DType::f64: return static_cast<T>(static_cast<const double*>(base)[offset]);
    case DType::bf16: return static_cast<T>(bf16_to_float(static_cast<const uint16_t*>(base)[offset]));
    case DType::f16: return static_cast<T>(f16_to_float(static_cast<const uint16_t*>(base)[offset]));
    case DType::e4m3: return static_cast<T>(e4m3_to_float(static_cast<const uint8_t*>(base)[offset]));
    default: return T(0);
  }
}

// Round `value` once into element `offset` of a floating-point buffer.
template <typename T>
inline void store(void* base, DType dt, int64_t offset, T value) {
  switch (dt) {
    case DType::f32: static_cast<float*>(base)[offset] = static_cast<float>(value); break;
    case DType::f64: static_cast<double*>(base)[offset] = static_cast<double>(value); break;
    case DType::bf16: static_cast<uint16_t*>(base)[offset] = float_to_bf16(static_cast<float>(value)); break;
    case DType::f16: static_cast<uint16_t*>(base)[offset] = float_to_f16(static_cast<float>(value)); break;
    case DType::e4m3: static_cast<uint8_t*>(base)[offset] = float_to_e4m3(static_cast<float>(value)); break;
    default: break;
  }
}

// Reads the n contiguous elements starting at element `offset` into dst, converted to T. The
// references read whole rows this way (the last dim of every tensor is contiguous).
template <typename T>
inline void load_n(const void* base, DType dt, int64_t offset, int64_t n, T* dst) {
  for (int64_t e = 0; e < n; ++e) dst[e] = load<T>(base, dt, offset + e);
}

// Rounds the n values of src once into the contiguous elements starting at element `offset`.
template <typename T>
inline void store_n(void* base, DType dt, int64_t offset, int64_t n, const T* src) {
  for (int64_t e = 0; e < n; ++e) store<T>(base, dt, offset + e, src[e]);
}

// Integer tensors (cu_seqlens, bounds): read as int64.
inline int64_t load_index(const void* base, DType dt, int64_t offset) {
  return dt == DType::i64 ? static_cast<const int64_t*>(base)[offset]
                          : static_cast<int64_t>(static_cast<const int32_t*>(base)[offset]);
}

}  // namespace flashgrad::host
