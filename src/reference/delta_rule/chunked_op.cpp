// The whole delta-rule op through the chunked algorithm: (sequence, value head) slices gathered
// from the user's tensors, run by chunked_forward_head / chunked_backward_head, scattered back.
#include <algorithm>

#include "chunked.h"
#include "core/parallel.h"
#include "step_io.h"

namespace flashgrad::reference::delta_rule {

template <typename Real>
void chunked_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleForwardOutputs& out) {
  const int64_t HV = pr.value_heads, V = pr.value_dim, K = pr.key_dim;
  const int workers = resolve_num_threads(p.exec.num_threads, pr.num_seqs * HV);
  parallel_for(pr.num_seqs * HV, workers, [&](int64_t item, int) {
    const int64_t n = item / HV, j = item % HV;
    const HeadCursor c = HeadCursor::make(pr, n, j);
    const HeadInputs<Real> x = gather_head_inputs<Real>(p, pr, n, j);
    ChunkedForwardTrace<Real> f;
    chunked_forward_head(x, f);
    for (int64_t t = 0; t < c.len; ++t) {
      store_row<Real>(out.o, c.b, c.t0 + t, j, V, &f.o[t * V]);
      if (out.saved_r.present()) store_row<Real>(out.saved_r, c.b, c.t0 + t, j, V, &f.r[t * V]);
    }
    if (out.final_state.present()) store_state<Real>(out.final_state, n, j, K, V, &f.h[f.num_chunks * K * V]);
  });
}

template <typename Real>
void chunked_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleBackwardInputs& in,
                      const DeltaRuleGrads& grads) {
  const int64_t H = pr.heads, HV = pr.value_heads, group = HV / H, V = pr.value_dim, K = pr.key_dim;
  const int workers = resolve_num_threads(p.exec.num_threads, pr.num_seqs * H);
  // One item per (sequence, q/k head): its value heads run in order and their dq, dk add up in
  // that order, so the result does not depend on the number of workers.
  parallel_for(pr.num_seqs * H, workers, [&](int64_t item, int) {
    const int64_t n = item / H, h = item % H;
    const HeadCursor c0 = HeadCursor::make(pr, n, h * group);
    const int64_t T = c0.len;
    std::vector<Real> dq_sum(T * K, 0), dk_sum(T * K, 0), dout(T * V), dht(K * V);
    HeadInputs<Real> x;
    for (int64_t j = h * group; j < (h + 1) * group; ++j) {
      const HeadCursor c = HeadCursor::make(pr, n, j);
      x = gather_head_inputs<Real>(p, pr, n, j);
      for (int64_t t = 0; t < T; ++t) load_row<Real>(in.dout, c.b, c.t0 + t, j, V, false, &dout[t * V]);
      if (in.dht.present())
        load_state<Real>(in.dht, n, j, K, V, dht.data());
      else
        std::fill(dht.begin(), dht.end(), Real(0));
      ChunkedForwardTrace<Real> f;
      ChunkedBackwardTrace<Real> b;
      chunked_backward_head(x, dout, dht, f, b);
      for (int64_t i = 0; i < T * K; ++i) {
        dq_sum[i] += b.dq[i];
        dk_sum[i] += b.dk[i];
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t tt = c.t0 + t;
        store_row<Real>(grads.dv, c.b, tt, j, V, &b.dv[t * V]);
        host::store<Real>(grads.dbeta.data, grads.dbeta.dtype, offset3(grads.dbeta, c.b, tt, j), b.dbeta[t]);
        if (pr.gate == GateKind::per_channel) {
          store_row<Real>(grads.dg, c.b, tt, j, K, &b.dg[t * K]);
        } else if (pr.gate == GateKind::scalar) {
          Real acc = 0;
          for (int64_t d = 0; d < K; ++d) acc += b.dg[t * K + d];
          host::store<Real>(grads.dg.data, grads.dg.dtype, offset3(grads.dg, c.b, tt, j), acc);
        }
      }
      if (grads.dh0.present()) store_state<Real>(grads.dh0, n, j, K, V, b.dh.data());
    }
    // L2-norm backward (rstd is the same for every value head of the group), then store.
    for (int64_t t = 0; t < T; ++t) {
      if (p.use_qk_l2norm_in_kernel) {
        l2norm_backward<Real>(&x.q[t * K], x.q_rstd[t], K, &dq_sum[t * K]);
        l2norm_backward<Real>(&x.k[t * K], x.k_rstd[t], K, &dk_sum[t * K]);
      }
      store_row<Real>(grads.dq, c0.b, c0.t0 + t, h, K, &dq_sum[t * K]);
      store_row<Real>(grads.dk, c0.b, c0.t0 + t, h, K, &dk_sum[t * K]);
    }
  });
}

template void chunked_forward<float>(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleForwardOutputs&);
template void chunked_forward<double>(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleForwardOutputs&);
template void chunked_backward<float>(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleBackwardInputs&,
                                      const DeltaRuleGrads&);
template void chunked_backward<double>(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleBackwardInputs&,
                                       const DeltaRuleGrads&);

}  // namespace flashgrad::reference::delta_rule
