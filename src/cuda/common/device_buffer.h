// Scratch memory for CUDA kernels: either the caller's Workspace, or a stream-ordered allocation
// freed when the buffer goes out of scope. Carves aligned sub-buffers off one block.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_check.h"
#include "flashgrad/common.h"

namespace flashgrad::cuda_detail {

inline std::size_t align_up(std::size_t n, std::size_t a = 256) { return (n + a - 1) / a * a; }

class ScratchBuffer {
 public:
  ScratchBuffer(Workspace ws, std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (ws.data != nullptr && ws.bytes >= bytes) {
      base_ = static_cast<char*>(ws.data);
    } else {
      FLASHGRAD_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&owned_), bytes, stream));
      base_ = owned_;
    }
  }
  ~ScratchBuffer() {
    if (owned_) cudaFreeAsync(owned_, stream_);  // destructor: cannot throw
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // Next `bytes` (256-byte aligned) of the block.
  template <typename T>
  T* take(std::size_t bytes) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += align_up(bytes);
    return p;
  }

 private:
  cudaStream_t stream_;
  char* base_ = nullptr;
  char* owned_ = nullptr;
  std::size_t offset_ = 0;
};

}  // namespace flashgrad::cuda_detail
