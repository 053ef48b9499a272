// Host side of the chunked stages: the chunk plan, what the stages take, scratch sizes.
#include <string>

#include "chunked_stages.h"

namespace flashgrad::cuda_detail::delta_rule {

ChunkPlanHost make_chunk_plan(int64_t B, int64_t T, const std::vector<int64_t>& cu_seqlens) {
  ChunkPlanHost p;
  auto add_sequence = [&](int64_t b, int64_t t0, int64_t len) {
    const int64_t n = static_cast<int64_t>(p.seq_b.size());
    p.seq_first_chunk.push_back(static_cast<int64_t>(p.chunks.size()));
    p.seq_b.push_back(b);
    p.seq_t0.push_back(t0);
    p.seq_len.push_back(len);
    for (int64_t s = 0; s < len; s += kChunkSize) {  // chunks never straddle sequences
      const int64_t l = len - s < kChunkSize ? len - s : kChunkSize;
      p.chunks.push_back(ChunkInfo{b, t0 + s, n, static_cast<int32_t>(l), 0});
    }
  };
  if (cu_seqlens.empty()) {
    for (int64_t b = 0; b < B; ++b) add_sequence(b, 0, T);
  } else {
    for (std::size_t n = 0; n + 1 < cu_seqlens.size(); ++n)
      add_sequence(0, cu_seqlens[n], cu_seqlens[n + 1] - cu_seqlens[n]);
  }
  p.seq_first_chunk.push_back(static_cast<int64_t>(p.chunks.size()));
  if (cu_seqlens.empty() && T > 0 && static_cast<int64_t>(p.chunks.size()) < (int64_t{1} << 31))
    p.uniform_chunks = (T + kChunkSize - 1) / kChunkSize;
  return p;
}

std::string chunked_stages_support(DType dtype, int64_t K, int64_t V, bool per_channel_gate) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    return std::string("the chunked kernels take bfloat16 or float16 inputs, got ") + dtype_name(dtype);
  if (K != 64 && K != 128)
    return "the chunked kernels take K = 64 or 128, got K = " + std::to_string(K);
  if (V <= 0 || V % 64 != 0 || V > 256)
    return "the chunked kernels take V = 64, 128, 192 or 256, got V = " + std::to_string(V);
  if (per_channel_gate)
    return "the chunked kernels do not take per-channel (KDA) gates yet";
  return {};
}

ChunkedScratchSizes chunked_scratch_sizes(int64_t rows, int64_t num_chunks, int64_t HV, int64_t K, int64_t V,
                                          bool gate) {
  ChunkedScratchSizes s;
  s.G = gate ? rows * HV : 0;
  s.A = rows * HV * kChunkSize;
  s.w = rows * HV * K;
  s.u = rows * HV * V;
  s.v_new = rows * HV * V;
  s.h = num_chunks * HV * K * V;
  return s;
}

}  // namespace flashgrad::cuda_detail::delta_rule
