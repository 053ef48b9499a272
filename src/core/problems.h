// Resolved problem descriptions: what validation learned about a call (sizes, defaults filled in,
// host copies of the small index tensors). Backends take these plus the user's views, so no
// backend re-derives a shape or re-reads cu_seqlens.
#pragma once

#include <cstdint>
#include <vector>

#include "flashgrad/attention.h"
#include "flashgrad/delta_rule.h"

namespace flashgrad {

struct AttentionProblem {
  bool varlen = false;
  int64_t num_seqs = 0;            // B (padded) or N (varlen)
  int64_t seqlen_q = 0, seqlen_k = 0;  // padded: Sq, Sk; varlen: max lengths (grid sizing)
  int64_t total_q = 0, total_k = 0;    // padded: B*Sq, B*Sk; varlen: Tq, Tk
  int64_t heads_q = 0, heads_k = 0;
  int64_t head_dim = 0, head_dim_v = 0;
  float scale = 0.0f;  // resolved (default 1/sqrt(D) filled in)
  // Host copies (empty when absent): cu_seqlens [N+1], prefix lengths [N], bounds [N*4].
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds;

  // Row offset of sequence n's first query / key inside the token dimension, and its lengths.
  // Padded: q row (n, i) is q[n, i]; varlen: q row (n, i) is q[cu_seqlens_q[n] + i].
  int64_t q_begin(int64_t n) const { return varlen ? cu_seqlens_q[n] : 0; }
  int64_t k_begin(int64_t n) const { return varlen ? cu_seqlens_k[n] : 0; }
  int64_t q_len(int64_t n) const { return varlen ? cu_seqlens_q[n + 1] - cu_seqlens_q[n] : seqlen_q; }
  int64_t k_len(int64_t n) const { return varlen ? cu_seqlens_k[n + 1] - cu_seqlens_k[n] : seqlen_k; }
};

struct DeltaRuleProblem {
  GateKind gate = GateKind::none;
  bool varlen = false;
  int64_t batch = 0;     // B (1 with cu_seqlens)
  int64_t num_seqs = 0;  // N = B, or len(cu_seqlens) - 1
  int64_t seq_len = 0;   // T (the tensor's time dimension; the total with cu_seqlens)
  int64_t heads = 0, value_heads = 0;  // H, HV
  int64_t key_dim = 0, value_dim = 0;  // K, V
  float scale = 0.0f;                  // resolved (default K^-0.5)
  bool has_initial_state = false;
  std::vector<int64_t> cu_seqlens;  // host copy, [N+1] (empty when absent)

  // Sequence n occupies batch row batch_of(n), time steps [t_begin(n), t_begin(n) + t_len(n)).
  int64_t batch_of(int64_t n) const { return varlen ? 0 : n; }
  int64_t t_begin(int64_t n) const { return varlen ? cu_seqlens[n] : 0; }
  int64_t t_len(int64_t n) const { return varlen ? cu_seqlens[n + 1] - cu_seqlens[n] : seq_len; }
};

}  // namespace flashgrad
