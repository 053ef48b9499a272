// The KDA chunked stages (forward 1-3, backward B1, B2) for __nv_bfloat16 inputs, K = 64 and 128 (one
// dtype per file so that the builds run in parallel).
#include "chunked_kda_launch_impl.cuh"

namespace flashgrad::cuda_detail::delta_rule {
FLASHGRAD_CHUNKED_KDA_INSTANTIATE(__nv_bfloat16)
}  // namespace flashgrad::cuda_detail::delta_rule
