// The fused recurrent kernels and their finishing kernels for float inputs (one dtype per file so
// that the kernel builds run in parallel).
#include "recurrent_launch_impl.cuh"

namespace flashgrad::cuda_detail::delta_rule {
FLASHGRAD_DELTA_RULE_INSTANTIATE(float)
}  // namespace flashgrad::cuda_detail::delta_rule
