// Every CUDA call and launch in flashgrad is checked; a failure becomes flashgrad::Error
// (ErrorKind::backend_failure) naming the call, the file:line and the driver's error text.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashgrad/status.h"

namespace flashgrad::cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(ErrorKind::backend_failure, "",
              std::string("flashgrad: CUDA call failed: ") + call + " at " + file + ":" +
                  std::to_string(line) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace flashgrad::cuda_detail

#define FLASHGRAD_CUDA_CHECK(call)                                                  \
  do {                                                                              \
    cudaError_t flashgrad_err_ = (call);                                            \
    if (flashgrad_err_ != cudaSuccess)                                              \
      ::flashgrad::cuda_detail::throw_cuda_error(flashgrad_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: catches bad launch configurations (not asynchronous faults).
#define FLASHGRAD_CUDA_CHECK_LAUNCH() FLASHGRAD_CUDA_CHECK(cudaGetLastError())
