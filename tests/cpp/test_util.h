// Helpers shared by the C++ tests: host tensors of any dtype with optional padded (non-contiguous)
// strides, random fills with a fresh seed per run, dtype conversion, and bitwise comparison.
//
// Seeds: every run draws a new seed (printed once, so a failure can be replayed); set
// FLASHGRAD_TEST_SEED=<n> to replay it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "core/host_dtype.h"
#include "flashgrad/tensor.h"

namespace flashgrad::test {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FLASHGRAD_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10)
                           : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    std::cout << "[flashgrad tests] random seed " << s << " (replay: FLASHGRAD_TEST_SEED=" << s << ")\n";
    return s;
  }();
  return seed;
}

// A generator for one test: the run's seed mixed with a per-call counter, so tests draw different
// numbers but one seed replays the whole run.
inline std::mt19937_64 make_rng() {
  static uint64_t counter = 0;
  std::seed_seq seq{test_seed(), ++counter};
  return std::mt19937_64(seq);
}

inline bool is_float_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16 || t == DType::e4m3;
}

// Unit roundoff 2^-p of a floating dtype with p significand bits (half the spacing of its numbers
// in [1, 2)): the relative error of one round-to-nearest into that dtype.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::bf16: return 0x1p-8;
    case DType::f16: return 0x1p-11;
    case DType::f32: return 0x1p-24;
    case DType::f64: return 0x1p-53;
    case DType::e4m3: return 0x1p-4;
    default: return 0;
  }
}

// A host tensor that owns its storage. `pad` (optional, one entry per dim) adds unused elements
// to each dim's physical extent, so the view's strides are those of a larger row-major array and
// the view is not contiguous (the last stride stays 1). Padding elements hold NaN (or -1 for
// integers), so a backend that reads them produces NaN.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> pad = {})
      : dtype_(dtype), shape_(std::move(shape)) {
    const size_t r = shape_.size();
    pad.resize(r, 0);
    strides_.assign(r, 1);
    int64_t running = 1;
    for (size_t d = r; d-- > 0;) {
      strides_[d] = running;
      running *= shape_[d] + pad[d];
    }
    const size_t bytes = static_cast<size_t>(running) * dtype_size(dtype);
    storage_.assign((bytes + 7) / 8 + 1, 0.0);  // doubles: 8-byte aligned for every dtype
    physical_ = running;
    for (int64_t x = 0; x < physical_; ++x) set_physical(x, std::nan(""));
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }

  TensorView view() const {
    TensorView v;
    v.data = const_cast<double*>(storage_.data());
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    for (int d = 0; d < v.rank; ++d) {
      v.shape[d] = shape_[d];
      v.stride[d] = strides_[d];
    }
    return v;
  }

  // Element offset of the logical row-major index `flat`.
  int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (size_t d = shape_.size(); d-- > 0;) {
      off += (flat % shape_[d]) * strides_[d];
      flat /= shape_[d];
    }
    return off;
  }

  double get(int64_t flat) const { return get_physical(offset(flat)); }
  void set(int64_t flat, double value) { set_physical(offset(flat), value); }

  std::vector<double> to_doubles() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
    return out;
  }
  void fill(double value) {
    for (int64_t i = 0; i < numel(); ++i) set(i, value);
  }
  void assign(const std::vector<double>& values) {
    for (int64_t i = 0; i < numel(); ++i) set(i, values[i]);
  }
  // Uniform in [lo, hi), rounded to the dtype.
  void fill_uniform(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set(i, dist(rng));
  }

  // Raw bytes of logical element `flat` (for bitwise comparisons).
  const unsigned char* element_bytes(int64_t flat) const {
    return reinterpret_cast<const unsigned char*>(storage_.data()) + offset(flat) * dtype_size(dtype_);
  }

 private:
  double get_physical(int64_t off) const {
    if (dtype_ == DType::i32) return static_cast<const int32_t*>(data())[off];
    if (dtype_ == DType::i64) return static_cast<double>(static_cast<const int64_t*>(data())[off]);
    return host::load<double>(data(), dtype_, off);
  }
  void set_physical(int64_t off, double value) {
    if (dtype_ == DType::i32) {
      static_cast<int32_t*>(data())[off] = std::isnan(value) ? -1 : static_cast<int32_t>(value);
    } else if (dtype_ == DType::i64) {
      static_cast<int64_t*>(data())[off] = std::isnan(value) ? -1 : static_cast<int64_t>(value);
    } else {
      host::store<double>(data(), dtype_, off, value);
    }
  }

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, strides_;
  int64_t physical_ = 0;
  std::vector<double> storage_;
};

// The same logical values in another dtype (rounded once).
inline HostTensor converted(const HostTensor& t, DType dtype) {
  HostTensor out(dtype, t.shape());
  out.assign(t.to_doubles());
  return out;
}

// An int32 tensor of the given values, shape [values.size()] unless `shape` is given.
inline HostTensor int32_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  HostTensor t(DType::i32, shape);
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}

// True when every logical element has the same bytes in both tensors (same dtype and shape).
inline bool same_bits(const HostTensor& a, const HostTensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const size_t size = dtype_size(a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(a.element_bytes(i), b.element_bytes(i), size) != 0) return false;
  return true;
}

// Largest |a_i - b_i| and largest |b_i| over logical elements.
struct MaxDiff {
  double diff = 0, ref_max = 0;
  int64_t where = -1;
};
inline MaxDiff max_abs_diff(const std::vector<double>& a, const std::vector<double>& ref) {
  MaxDiff m;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - ref[i]);
    if (!(d <= m.diff)) {  // also catches NaN
      m.diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
      m.where = static_cast<int64_t>(i);
    }
    m.ref_max = std::max(m.ref_max, std::fabs(ref[i]));
  }
  return m;
}

}  // namespace flashgrad::test
