// CPU reference backward of softmax attention (docs/attention.md, "Backward").
//
// Work item = (sequence n, kv head g). The item owns dk and dv of that kv head, so it sums the
// contributions of the whole query-head group (GQA) in the compute type T and rounds once at the
// end; it also owns dq of the group's query heads. No two items write the same element: no
// atomics, and the same bits for any number of workers. Per query row i of query head h:
//   Delta_i = <dO_i, O_i>                       (from the stored output)
//   dl_i    = dLSE_i + z_loss_weight * lse_i
//   p_ij    = exp(s_ij - lse_i)                 (s recomputed, lse from the forward)
//   dS_ij   = p_ij * (<dO_i, v_j> - Delta_i + dl_i) * softcap'(s_raw_ij)
//   dq_i    = scale * sum_j dS_ij k_j,  dk_j += scale * dS_ij q_i,  dv_j += p_ij dO_i
// Rows whose stored lse is -inf (fully masked) contribute nothing and get dq_i = 0.
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
struct BackwardPass {
  const AttentionParams& p;
  const AttentionProblem& pr;
  Rows q, k, v, out, dout, lse, dlse, dq, dk, dv;
  T z_loss_weight;
  Descale descale_q{&p.descale_q}, descale_k{&p.descale_k}, descale_v{&p.descale_v};
  Softcap<T> cap{static_cast<T>(p.softcap), p.softcap_method};
  T scale = softmax_scale<T>(p, pr);

  // This worker's scratch for one item (layout in scratch.h).
  struct Buffers {
    T *k, *v, *dk, *dv;  // [sk, d], [sk, dv], [sk, d], [sk, dv]
    T *q, *dq;           // [d]: the current query row and its (unscaled) gradient
    T *dout, *out;       // [dv]
  };

  Buffers carve(T* buf, int64_t sk) const {
    const int64_t d = pr.head_dim, dv_dim = pr.head_dim_v;
    Buffers b;
    b.k = buf;
    b.v = b.k + sk * d;
    b.dk = b.v + sk * dv_dim;
    b.dv = b.dk + sk * d;
    b.q = b.dv + sk * dv_dim;
    b.dq = b.q + d;
    b.dout = b.dq + d;
    b.out = b.dout + dv_dim;
    return b;
  }

  // One (sequence n, kv head g).
  void run(int64_t n, int64_t g, T* buf) const {
    const int64_t sq = pr.q_len(n), sk = pr.k_len(n);
    const int64_t d = pr.head_dim, dv_dim = pr.head_dim_v;
    const int64_t group = pr.heads_q / pr.heads_k;
    const Buffers b = carve(buf, sk);

    const T dsk = descale_k.at<T>(n, g), dsv = descale_v.at<T>(n, g);
    for (int64_t j = 0; j < sk; ++j) {
      load_row(k, k.offset(n, pr.k_begin(n) + j, g), d, dsk, b.k + j * d);
      load_row(v, v.offset(n, pr.k_begin(n) + j, g), dv_dim, dsv, b.v + j * dv_dim);
    }
    for (int64_t x = 0; x < sk * d; ++x) b.dk[x] = 0;
    for (int64_t x = 0; x < sk * dv_dim; ++x) b.dv[x] = 0;

    // The group's query heads in a fixed order: dk/dv sum them in the same order every run.
    const SequenceMask mask(p, pr, n);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t token = pr.q_begin(n) + i;
        for (int64_t e = 0; e < d; ++e) b.dq[e] = 0;
        const T row_lse = lse.load<T>(lse.offset(n, token, h));
        if (row_lse != -std::numeric_limits<T>::infinity())
          accumulate_row(n, g, h, i, row_lse, mask, b);
        store_row(dq, dq.offset(n, token, h), d, scale, b.dq);
      }
    }

    for (int64_t j = 0; j < sk; ++j) {
      store_row(dk, dk.offset(n, pr.k_begin(n) + j, g), d, T(1), b.dk + j * d);
      store_row(dv, dv.offset(n, pr.k_begin(n) + j, g), dv_dim, T(1), b.dv + j * dv_dim);
    }
  }

  // Adds query row i (of head h) to b.dq (unscaled), b.dk and b.dv.
  void accumulate_row(int64_t n, int64_t g, int64_t h, int64_t i, T row_lse,
                      const SequenceMask& mask, const Buffers& b) const {
    const int64_t d = pr.head_dim, dv_dim = pr.head_dim_v;
    const int64_t token = pr.q_begin(n) + i;
    load_row(q, q.offset(n, token, h), d, descale_q.at<T>(n, g), b.q);
    load_row(dout, dout.offset(n, token, h), dv_dim, T(1), b.dout);
    load_row(out, out.offset(n, token, h), dv_dim, T(1), b.out);
    T delta = 0;
    for (int64_t e = 0; e < dv_dim; ++e) delta += b.dout[e] * b.out[e];
    T dl = dlse.data != nullptr ? dlse.load<T>(dlse.offset(n, token, h)) : T(0);
    if (z_loss_weight != T(0)) dl += z_loss_weight * row_lse;

    const KeySpan span = mask.key_span(i);
    for (int64_t j = span.begin; j < span.end; ++j) {
      if (!mask.allowed(i, j)) continue;
      const T* kj = b.k + j * d;
      const T* vj = b.v + j * dv_dim;
      T dot = 0;
      for (int64_t e = 0; e < d; ++e) dot += b.q[e] * kj[e];
      const T s_raw = scale * dot;
      const T s = cap.apply(s_raw);
      const T pij = std::exp(s - row_lse);
      T dp = 0;
      for (int64_t e = 0; e < dv_dim; ++e) dp += b.dout[e] * vj[e];
      const T ds = pij * (dp - delta + dl) * cap.derivative(s_raw, s);
      for (int64_t e = 0; e < d; ++e) b.dq[e] += ds * kj[e];
      const T scaled_ds = scale * ds;
      T* dkj = b.dk + j * d;
      T* dvj = b.dv + j * dv_dim;
      for (int64_t e = 0; e < d; ++e) dkj[e] += scaled_ds * b.q[e];
      for (int64_t e = 0; e < dv_dim; ++e) dvj[e] += pij * b.dout[e];
    }
  }
};

template <typename T>
void backward_in(const AttentionParams& p, const AttentionProblem& pr,
                 const AttentionBackwardInputs& in, const TensorView& dq, const TensorView& dk,
                 const TensorView& dv, Workspace ws) {
  const BackwardPass<T> pass{.p = p,
                             .pr = pr,
                             .q = token_rows(p.q),
                             .k = token_rows(p.k),
                             .v = token_rows(p.v),
                             .out = token_rows(in.out),
                             .dout = token_rows(in.dout),
                             .lse = lse_rows(in.lse),
                             .dlse = lse_rows(in.dlse),
                             .dq = token_rows(dq),
                             .dk = token_rows(dk),
                             .dv = token_rows(dv),
                             .z_loss_weight = static_cast<T>(in.z_loss_weight)};
  const ScratchPlan plan = plan_scratch(p, pr, Pass::backward);
  const Scratch scratch(plan, ws);
  parallel_for(plan.items, plan.workers, [&](int64_t item, int worker) {
    pass.run(item / pr.heads_k, item % pr.heads_k, scratch.worker<T>(worker));
  });
}

}  // namespace

void attention_backward(const AttentionParams& p, const AttentionProblem& pr,
                        const AttentionBackwardInputs& in, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, Workspace ws) {
  if (attn::computes_in_double(p))
    backward_in<double>(p, pr, in, dq, dk, dv, ws);
  else
    backward_in<float>(p, pr, in, dq, dk, dv, ws);
}

}  // namespace flashgrad::reference
