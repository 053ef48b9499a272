// Work inside one library call that may run beside the caller's stream: a fork / join by events.
// The caller's stream records `fork` and a side stream waits for it; the side stream runs its part
// and records `join`, which the caller's stream waits for before anything that reads the side's
// results (join(), or the destructor: side work is never left unjoined, also when a launch throws).
// So everything the call did is ordered before the caller's next work on its stream, and scratch
// freed on the caller's stream after the call is safe. One non-blocking side stream per device,
// created on first use and kept for the process (stream capture records the fork and the join as
// graph edges).
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "cuda_check.h"

namespace flashgrad::cuda_detail {

inline cudaStream_t side_stream_of_current_device() {
  static std::mutex mutex;
  static cudaStream_t streams[64] = {};
  int dev = 0;
  FLASHGRAD_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mutex);
  if (dev < 0 || dev >= 64) throw_invalid_argument("stream fork", "device", "device index must be below 64");
  if (!streams[dev]) FLASHGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[dev], cudaStreamNonBlocking));
  return streams[dev];
}

class StreamFork {
 public:
  explicit StreamFork(cudaStream_t main) : main_(main), side_(side_stream_of_current_device()) {
    FLASHGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    FLASHGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    FLASHGRAD_CUDA_CHECK(cudaEventRecord(fork_, main_));
    FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  }
  cudaStream_t side() const { return side_; }
  void join() {
    if (joined_) return;
    joined_ = true;
    FLASHGRAD_CUDA_CHECK(cudaEventRecord(join_, side_));
    FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(main_, join_, 0));
  }
  ~StreamFork() {
    if (!joined_) {  // destructor: cannot throw; order the side work before the caller's next work
      cudaEventRecord(join_, side_);
      cudaStreamWaitEvent(main_, join_, 0);
    }
    cudaEventDestroy(fork_);  // (released once the recorded work completes)
    cudaEventDestroy(join_);
  }
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

 private:
  cudaStream_t main_, side_;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool joined_ = false;
};

}  // namespace flashgrad::cuda_detail
