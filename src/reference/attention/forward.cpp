// CPU reference forward of softmax attention (docs/attention.md, "Forward").
//
// Work item = (sequence n, query head h); items are independent, so any number of workers gives
// the same bits. For each query row i the item computes, in the compute type T:
//   s_ij = softcap(scale * <q_i, k_j>)  for the keys j the mask allows
//   lse_i = m + log(sum_j exp(s_ij - m)),  m = max_j s_ij
//   o_i = sum_j exp(s_ij - lse_i) v_j
// and rounds o_i and lse_i once into the outputs. A row without allowed keys gets o_i = 0 and
// lse_i = -inf.
#include <cmath>
#include <limits>

#include "core/backends.h"
#include "core/parallel.h"
#include "layout.h"
#include "mask.h"
#include "precision.h"
#include "scratch.h"
#include "softcap.h"

namespace flashgrad::reference {
namespace {

using namespace attn;

template <typename T>
struct ForwardPass {
  const AttentionParams& p;
  const AttentionProblem& pr;
  Rows q, k, v, out, lse;
  Descale descale_q{&p.descale_q}, descale_k{&p.descale_k}, descale_v{&p.descale_v};
  Softcap<T> cap{static_cast<T>(p.softcap), p.softcap_method};
  T scale = softmax_scale<T>(p, pr);

  // One (sequence, query head); `buf` is this worker's scratch (layout in scratch.h).
  void run(int64_t n, int64_t h, T* buf) const {
    const int64_t sq = pr.q_len(n), sk = pr.k_len(n);
    if (sq == 0) return;
    const int64_t d = pr.head_dim, dv = pr.head_dim_v;
    const int64_t g = h / (pr.heads_q / pr.heads_k);  // kv head of query head h
    T* kbuf = buf;                 // [sk, d]
    T* vbuf = kbuf + sk * d;       // [sk, dv]
    T* scores = vbuf + sk * dv;    // [sk]
    T* qrow = scores + sk;         // [d]
    T* orow = qrow + d;            // [dv]

    const T dsq = descale_q.at<T>(n, g), dsk = descale_k.at<T>(n, g), dsv = descale_v.at<T>(n, g);
    for (int64_t j = 0; j < sk; ++j) {
      load_row(k, k.offset(n, pr.k_begin(n) + j, g), d, dsk, kbuf + j * d);
      load_row(v, v.offset(n, pr.k_begin(n) + j, g), dv, dsv, vbuf + j * dv);
    }

    const SequenceMask mask(p, pr, n);
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t token = pr.q_begin(n) + i;
      load_row(q, q.offset(n, token, h), d, dsq, qrow);
      const KeySpan span = mask.key_span(i);

      // Pass 1: capped scores of the allowed keys and their maximum.
      bool any = false;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = span.begin; j < span.end; ++j) {
        if (!mask.allowed(i, j)) continue;
        T dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += qrow[e] * kbuf[j * d + e];
        scores[j] = cap.apply(scale * dot);
        m = any ? std::max(m, scores[j]) : scores[j];
        any = true;
      }

      // Pass 2: the log-sum-exp, then the probability-weighted values.
      for (int64_t e = 0; e < dv; ++e) orow[e] = 0;
      T row_lse = -std::numeric_limits<T>::infinity();
      if (any) {
        T sum = 0;
        for (int64_t j = span.begin; j < span.end; ++j)
          if (mask.allowed(i, j)) sum += std::exp(scores[j] - m);
        row_lse = m + std::log(sum);
        for (int64_t j = span.begin; j < span.end; ++j) {
          if (!mask.allowed(i, j)) continue;
          const T pij = std::exp(scores[j] - row_lse);
          for (int64_t e = 0; e < dv; ++e) orow[e] += pij * vbuf[j * dv + e];
        }
      }
      store_row(out, out.offset(n, token, h), dv, T(1), orow);
      if (lse.data != nullptr) lse.store<T>(lse.offset(n, token, h), row_lse);
    }
  }
};

template <typename T>
void forward_in(const AttentionParams& p, const AttentionProblem& pr, const TensorView& out,
                const TensorView& lse, Workspace ws) {
  const ForwardPass<T> pass{.p = p,
                            .pr = pr,
                            .q = token_rows(p.q),
                            .k = token_rows(p.k),
                            .v = token_rows(p.v),
                            .out = token_rows(out),
                            .lse = lse_rows(lse)};
  const ScratchPlan plan = plan_scratch(p, pr, Pass::forward);
  const Scratch scratch(plan, ws);
  parallel_for(plan.items, plan.workers, [&](int64_t item, int worker) {
    pass.run(item / pr.heads_q, item % pr.heads_q, scratch.worker<T>(worker));
  });
}

}  // namespace

void attention_forward(const AttentionParams& p, const AttentionProblem& pr, const TensorView& out,
                       const TensorView& lse, Workspace ws) {
  if (attn::computes_in_double(p))
    forward_in<double>(p, pr, out, lse, ws);
  else
    forward_in<float>(p, pr, out, lse, ws);
}

}  // namespace flashgrad::reference
