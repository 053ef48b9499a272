// The CUDA half of src/core/backends.h's backend:: functions.
#include "core/backends.h"
#include "cuda_check.h"

namespace flashgrad::backend {

bool cuda_built() { return true; }

void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes, int device_index, void* stream) {
  int previous = 0;
  FLASHGRAD_CUDA_CHECK(cudaGetDevice(&previous));
  FLASHGRAD_CUDA_CHECK(cudaSetDevice(device_index));
  auto s = static_cast<cudaStream_t>(stream);
  FLASHGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FLASHGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
  FLASHGRAD_CUDA_CHECK(cudaSetDevice(previous));
}

}  // namespace flashgrad::backend
