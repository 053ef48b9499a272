// Shared by the GPU test files (*_gpu_test.cu): whether a device is there (tests skip with the
// reason printed when it is not), a checked CUDA call, and rounding to a 16-bit dtype on the host.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

}  // namespace flashgrad::test

// In a TEST body: skip, printing why, when no device is usable.
#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    std::string why_;                                                                   \
    if (!::flashgrad::test::have_gpu(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
