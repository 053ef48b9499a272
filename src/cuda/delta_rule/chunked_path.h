// The chunked (chunk 64, UT/WY, tensor-core) path behind flashgrad::cuda::delta_rule_forward /
// delta_rule_backward when `algorithm = chunked` and the stages take the problem
// (bf16/f16, K in {64, 128}, V a multiple of 64 up to 256): GDN and the plain rule through
// chunked_stages.h, KDA (per-channel gates) through chunked_kda.h. Everything else (other K,
// float32, fp64, a forward asked for saved_r) runs the fused recurrent kernels, which compute the
// same function.
//
// Memory: the forward keeps nothing for the backward (no per-step or per-chunk state survives the
// call); the backward recomputes stages 1-2 (G, A, w, u, v_new and the chunk-entry states h) and
// runs B1 (dh per chunk, dv_new, dh0) and B2 (dq, dk, dv, dbeta, dg). Scratch sizes are in
// chunked_path.cu (ChunkedScratch).
#pragma once

#include <cuda_runtime.h>

#include "core/problems.h"
#include "flashgrad/common.h"
#include "flashgrad/delta_rule.h"

namespace flashgrad::cuda_detail::delta_rule {

// Whether the chunked kernels run this call (forward: `wants_saved_r` = the caller asked for r,
// which only the recurrent forward writes).
bool chunked_path_takes(const DeltaRuleParams& p, const DeltaRuleProblem& pr, bool wants_saved_r);

// Scratch bytes of a call; `kept_v_new`: the caller passes saved_v_new (no scratch for v_new).
std::size_t chunked_forward_scratch_bytes(const DeltaRuleProblem& pr, DType dtype, bool kept_v_new);
std::size_t chunked_backward_scratch_bytes(const DeltaRuleProblem& pr, DType dtype, bool kept_v_new);

void chunked_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out,
                     Workspace ws, cudaStream_t stream);
void chunked_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                      const DeltaRuleGrads& grads, Workspace ws, cudaStream_t stream);

}  // namespace flashgrad::cuda_detail::delta_rule
