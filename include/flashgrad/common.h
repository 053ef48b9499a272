// flashgrad: small types shared by every op family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace flashgrad {

// Caller-provided scratch memory on the op's device. When `data` is null the backend allocates
// what it needs itself (and frees it before returning); the *_workspace_bytes queries say how much
// to pass to avoid that allocation.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Arithmetic precision of the CPU reference. fp32 accumulates in float (the default, matching
// what the GPU kernels promise); fp64 computes everything in double (finite-difference checks).
// The CUDA backend accepts only fp32.
enum class Precision : int32_t { fp32, fp64 };

// Which pass a workspace query is about.
enum class Pass : int32_t { forward, backward };

// Marker for "use the default softmax / readout scale" (1/sqrt(head dim)).
inline constexpr float kDefaultScale = std::numeric_limits<float>::quiet_NaN();

// Options common to all entry points that pick where and how a call runs.
struct ExecutionOptions {
  int num_threads = 0;        // CPU reference workers; 0 = std::thread::hardware_concurrency()
  void* stream = nullptr;     // cudaStream_t for the CUDA backend; null = the default stream
  Precision precision = Precision::fp32;
};

}  // namespace flashgrad
