// Shared by the chunked delta-rule GPU tests (delta_rule_chunked_gpu_test.cu for GDN / plain,
// delta_rule_chunked_kda_gpu_test.cu for KDA): device buffers poisoned with NaN, contiguous views
// as the stages see them, relative-RMS comparisons over every (sequence, head), and the L2-norm
// backward done on the host (the stages' dq, dk come before it).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/host_dtype.h"
#include "cuda/delta_rule/recurrent_common.cuh"
#include "flashgrad/tensor.h"

namespace flashgrad::test::chunked {

// Device memory of `n` elements of `dtype`, poisoned (all-ones bytes: NaN in f32, f16 and bf16)
// when made, so an element no kernel writes fails its comparison.
struct DevBuf {
  void* p = nullptr;
  DType dtype = DType::f32;
  int64_t n = 0;
  DevBuf() = default;
  DevBuf(DType dt, int64_t count) : dtype(dt), n(count) {
    if (cudaMalloc(&p, std::max<std::size_t>(bytes(), 1)) != cudaSuccess) p = nullptr;
    poison();
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept { *this = std::move(o); }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    dtype = o.dtype;
    n = o.n;
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  std::size_t bytes() const { return static_cast<std::size_t>(n) * dtype_size(dtype); }
  void poison() {
    if (p) cudaMemset(p, 0xff, bytes());
  }
  void upload(const std::vector<float>& x) {
    std::vector<uint8_t> buf(bytes());
    for (int64_t i = 0; i < n; ++i) host::store<float>(buf.data(), dtype, i, x[i]);
    cudaMemcpy(p, buf.data(), bytes(), cudaMemcpyHostToDevice);
  }
  std::vector<double> download() const {
    std::vector<uint8_t> buf(bytes());
    cudaMemcpy(buf.data(), p, bytes(), cudaMemcpyDeviceToHost);
    std::vector<double> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = host::load<double>(buf.data(), dtype, i);
    return x;
  }
  float* f32() const { return static_cast<float*>(p); }
};

// A contiguous row-major view (rank <= 4) as the kernels see it.
inline cuda_detail::delta_rule::View view_of(const DevBuf& b, std::initializer_list<int64_t> shape) {
  cuda_detail::delta_rule::View v;
  v.p = b.p;
  v.f32 = b.dtype == DType::f32;
  int64_t s[4] = {0, 0, 0, 1};
  const std::vector<int64_t> sh(shape);
  int64_t st = 1;
  for (int i = static_cast<int>(sh.size()) - 1; i >= 0; --i) {
    s[i] = st;
    st *= sh[i];
  }
  v.s0 = s[0], v.s1 = s[1], v.s2 = s[2], v.s3 = sh.size() == 4 ? s[3] : 1;
  return v;
}

// GPU and reference values of one quantity, gathered over every (sequence, head).
struct Pairs {
  std::vector<double> gpu, ref;
  void add(double g, double r) {
    gpu.push_back(g);
    ref.push_back(r);
  }
};

inline double rel_rms(const Pairs& p) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < p.ref.size(); ++i) {
    num += (p.gpu[i] - p.ref[i]) * (p.gpu[i] - p.ref[i]);
    den += p.ref[i] * p.ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));  // a NaN in gpu gives NaN, which fails every bar
}

inline void expect_close(const char* what, const Pairs& p, double bar, const std::string& name) {
  if (p.ref.empty()) {
    std::printf("  %-36s %-12s (no elements in this case)\n", name.c_str(), what);
    return;
  }
  const double e = rel_rms(p);
  std::printf("  %-36s %-12s rel_rms %.2e (bar %g, %zu elements)\n", name.c_str(), what, e, bar, p.ref.size());
  EXPECT_TRUE(e <= bar) << name << ": " << what << " relative RMS error " << e << " > " << bar;
}

// dx = rstd (dy - (dy . y) y) with y = x rstd, rstd = 1 / sqrt(sum x^2 + 1e-6), per row of K.
inline std::vector<double> l2norm_backward_rows(const std::vector<float>& x, const std::vector<double>& dy,
                                                int64_t K) {
  std::vector<double> dx(dy.size());
  for (std::size_t r = 0; r * K < dy.size(); ++r) {
    double ss = 0, dot = 0;
    for (int64_t d = 0; d < K; ++d) ss += double(x[r * K + d]) * x[r * K + d];
    const double rstd = 1.0 / std::sqrt(ss + 1e-6);
    for (int64_t d = 0; d < K; ++d) dot += dy[r * K + d] * x[r * K + d] * rstd;
    for (int64_t d = 0; d < K; ++d) dx[r * K + d] = rstd * (dy[r * K + d] - dot * x[r * K + d] * rstd);
  }
  return dx;
}

}  // namespace flashgrad::test::chunked
