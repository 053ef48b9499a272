// Per-worker scratch memory of the reference attention passes.
//
// Each worker keeps one (sequence, kv head)'s keys and values converted to the compute type, plus,
// in the backward, their gradient accumulators and a few rows:
//   forward:  K [Sk, D], V [Sk, Dv], scores [Sk], q row [D], out row [Dv]
//   backward: K, V, dK [Sk, D], dV [Sk, Dv], q row, dq row [D], dout row, out row [Dv]
// That is O(Sk * (D + Dv)) per worker, never O(Sq * Sk). Sk is the longest key sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/problems.h"
#include "precision.h"

namespace flashgrad::reference::attn {

struct ScratchPlan {
  int workers = 1;
  int64_t items = 0;                 // forward: N * Hq; backward: N * Hk
  std::size_t bytes_per_worker = 0;  // rounded up to kAlign
  static constexpr std::size_t kAlign = 64;
  // What a caller must pass as Workspace to avoid an allocation (slack for aligning the base).
  std::size_t total_bytes() const {
    return bytes_per_worker == 0 ? 0 : static_cast<std::size_t>(workers) * bytes_per_worker + kAlign;
  }
};

ScratchPlan plan_scratch(const AttentionParams& p, const AttentionProblem& pr, Pass pass);

// The scratch memory of one call: the caller's workspace when it is large enough, else owned.
class Scratch {
 public:
  Scratch(const ScratchPlan& plan, Workspace ws);
  template <typename T>
  T* worker(int w) const {
    return reinterpret_cast<T*>(base_ + static_cast<std::size_t>(w) * plan_.bytes_per_worker);
  }

 private:
  ScratchPlan plan_;
  std::unique_ptr<unsigned char[]> owned_;
  unsigned char* base_ = nullptr;
};

}  // namespace flashgrad::reference::attn
