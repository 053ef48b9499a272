// Host side of the KDA chunked stages: what they take and their scratch sizes (chunked_kda.h).
#include <string>

#include "chunked_kda.h"

namespace flashgrad::cuda_detail::delta_rule {

std::string kda_stages_support(DType dtype, int64_t K, int64_t V) {
  // Same dtype, K and V range as the GDN stages (their check, with the gate question left out).
  return chunked_stages_support(dtype, K, V, false);
}

ChunkedScratchSizes kda_scratch_sizes(int64_t rows, int64_t num_chunks, int64_t HV, int64_t K, int64_t V) {
  ChunkedScratchSizes s = chunked_scratch_sizes(rows, num_chunks, HV, K, V, true);
  s.G = rows * HV * K;  // per-channel cumulative gate
  return s;
}

}  // namespace flashgrad::cuda_detail::delta_rule
