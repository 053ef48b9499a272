#include "scratch.h"

#include <algorithm>

#include "core/backends.h"
#include "core/parallel.h"

namespace flashgrad::reference::attn {

ScratchPlan plan_scratch(const AttentionParams& p, const AttentionProblem& pr, Pass pass) {
  ScratchPlan plan;
  const bool fwd = pass == Pass::forward;
  plan.items = pr.num_seqs * (fwd ? pr.heads_q : pr.heads_k);
  plan.workers = resolve_num_threads(p.exec.num_threads, plan.items);
  if (plan.items == 0) return plan;

  int64_t longest_k = 0;  // the actual longest key sequence (max_seqlen_k may be looser)
  for (int64_t n = 0; n < pr.num_seqs; ++n) longest_k = std::max(longest_k, pr.k_len(n));
  const int64_t d = pr.head_dim, dv = pr.head_dim_v;
  const int64_t elems = fwd ? longest_k * (d + dv) + longest_k + d + dv
                            : 2 * longest_k * (d + dv) + 2 * d + 2 * dv;
  const std::size_t bytes = static_cast<std::size_t>(elems) * (computes_in_double(p) ? 8 : 4);
  plan.bytes_per_worker = (bytes + ScratchPlan::kAlign - 1) / ScratchPlan::kAlign * ScratchPlan::kAlign;
  return plan;
}

Scratch::Scratch(const ScratchPlan& plan, Workspace ws) : plan_(plan) {
  const std::size_t need = plan.total_bytes();
  if (need == 0) return;
  unsigned char* raw = static_cast<unsigned char*>(ws.data);
  if (raw == nullptr || ws.bytes < need) {
    owned_ = std::make_unique<unsigned char[]>(need);
    raw = owned_.get();
  }
  // Align the base so every worker's slice starts on a kAlign boundary (bytes_per_worker is a
  // multiple of kAlign); total_bytes() includes the kAlign bytes of slack this may skip.
  const auto addr = reinterpret_cast<std::uintptr_t>(raw);
  base_ = raw + (ScratchPlan::kAlign - addr % ScratchPlan::kAlign) % ScratchPlan::kAlign;
}

}  // namespace flashgrad::reference::attn

namespace flashgrad::reference {

std::size_t attention_workspace_bytes(const AttentionParams& p, const AttentionProblem& pr,
                                      Pass pass) {
  return attn::plan_scratch(p, pr, pass).total_bytes();
}

}  // namespace flashgrad::reference
