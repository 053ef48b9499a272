// Logit soft-capping and its derivative (docs/attention.md, "Forward" and "Backward").
//   tanh:      s = c * tanh(s_raw / c)        ds/ds_raw = 1 - (s / c)^2
//   soft_sign: s = s_raw / (1 + |s_raw| / c)  ds/ds_raw = 1 / (1 + |s_raw| / c)^2
// c == 0 turns capping off (s = s_raw, derivative 1).
#pragma once

#include <cmath>

#include "flashgrad/attention.h"

namespace flashgrad::reference::attn {

template <typename T>
struct Softcap {
  T c = 0;
  SoftcapMethod method = SoftcapMethod::tanh;

  T apply(T s_raw) const {
    if (c == T(0)) return s_raw;
    if (method == SoftcapMethod::tanh) return c * std::tanh(s_raw / c);
    return s_raw / (T(1) + std::fabs(s_raw) / c);
  }
  // Derivative of apply() at s_raw, given s = apply(s_raw).
  T derivative(T s_raw, T s) const {
    if (c == T(0)) return T(1);
    if (method == SoftcapMethod::tanh) {
      const T t = s / c;
      return T(1) - t * t;
    }
    const T d = T(1) + std::fabs(s_raw) / c;
    return T(1) / (d * d);
  }
};

}  // namespace flashgrad::reference::attn
