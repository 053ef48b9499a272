// Shared by the GPU test files (*_gpu_test.cu): whether a device is there (tests skip with the
// reason printed when it is not), a checked CUDA call, rounding to a 16-bit dtype on the host, and a
// launcher setting held for a scope.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/host_dtype.h"
#include "flashgrad/tensor.h"

namespace flashgrad::test {

// True when a CUDA device is usable; otherwise `why` says what the runtime answered.
inline bool have_gpu(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount() = 0";
    return false;
  }
  return true;
}

// x rounded to nearest-even in a 16-bit dtype (bf16 / f16); other dtypes leave it as is.
inline float round_to(DType dt, float x) {
  switch (dt) {
    case DType::bf16: return host::bf16_to_float(host::float_to_bf16(x));
    case DType::f16: return host::f16_to_float(host::float_to_f16(x));
    default: return x;
  }
}

// An environment variable (a launcher setting the library reads per call) set for this scope and unset
// when it ends, however the test leaves it (a failed ASSERT returns early).
struct EnvSet {
  const char* name;
  EnvSet(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvSet() { unsetenv(name); }
  EnvSet(const EnvSet&) = delete;
  EnvSet& operator=(const EnvSet&) = delete;
};

}  // namespace flashgrad::test

// In a TEST body: skip, printing why, when no device is usable.
#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    std::string why_;                                                                   \
    if (!::flashgrad::test::have_gpu(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
