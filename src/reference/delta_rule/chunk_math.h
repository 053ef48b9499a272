// Small helpers shared by the chunked forward and backward (chunked.h has the notation).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "chunked.h"

namespace flashgrad::reference::delta_rule {

// Steps [begin, begin + len) of chunk c of a T-step sequence.
struct ChunkRange {
  int64_t begin, len;
};
inline ChunkRange chunk_range(int64_t c, int64_t T) { return {c * kChunk, std::min(kChunk, T - c * kChunk)}; }

// sum_d a_d b_d exp(Gi_d - Gj_d): the decayed dot product of a row i and a row j <= i. The
// exponent is a difference of cumulative gates of one chunk, never exp(Gi) * exp(-Gj) (which
// overflows for strong per-channel decay).
template <typename Real>
Real decayed_dot(const Real* a, const Real* b, const Real* Gi, const Real* Gj, int64_t K) {
  Real acc = 0;
  for (int64_t d = 0; d < K; ++d) acc += a[d] * b[d] * std::exp(Gi[d] - Gj[d]);
  return acc;
}

}  // namespace flashgrad::reference::delta_rule
