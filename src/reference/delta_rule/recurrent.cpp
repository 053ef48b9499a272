// Recurrent delta rule: forward and two-pass backward per (sequence, value head).
// State S is row-major K x V: S[i * V + c], i a key channel, c a value channel.
#include "recurrent.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "step_io.h"

namespace flashgrad::reference::delta_rule {

namespace {
// Step vectors each worker needs besides its K x V states.
int64_t forward_scratch(int64_t K, int64_t V) { return StepInputs<double>::scratch_size(K, V) + 2 * V; }
int64_t backward_scratch(int64_t K, int64_t V) {
  return StepInputs<double>::scratch_size(K, V) + 4 * V + 3 * K;
}
}  // namespace

RecurrentWorkspace RecurrentWorkspace::make(const DeltaRuleProblem& pr, Pass pass, int workers) {
  const int64_t K = pr.key_dim, V = pr.value_dim;
  RecurrentWorkspace w;
  if (pass == Pass::forward) {
    w.per_worker = K * V + forward_scratch(K, V);
  } else {
    int64_t longest = 0;  // steps of the longest sequence: the per-item buffers' length
    for (int64_t n = 0; n < pr.num_seqs; ++n) longest = std::max(longest, pr.t_len(n));
    const int64_t rows = pr.batch * pr.seq_len * pr.value_heads;  // (b, t, value head) rows
    w.gva = pr.value_heads != pr.heads;
    w.dk_part = 0;
    w.dq_part = w.gva ? rows * K : 0;
    w.workers_begin = w.gva ? 2 * rows * K : 0;
    w.rd = 2 * K * V + backward_scratch(K, V);
    w.dk_item = w.rd + longest * V;
    w.per_worker = w.dk_item + (w.gva ? 0 : longest * K);
  }
  w.total = w.workers_begin + w.per_worker * workers;
  return w;
}

int recurrent_workers(const DeltaRuleParams& p, const DeltaRuleProblem& pr) {
  return resolve_num_threads(p.exec.num_threads, pr.num_seqs * pr.value_heads);
}

// ---- one step of the recurrence, on S in place ----------------------------------------------

namespace {

// S~ = diag(exp(g_t)) S.
template <typename Real>
void decay_state(Real* S, const StepInputs<Real>& x, int64_t K, int64_t V) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t col = 0; col < V; ++col) S[i * V + col] *= x.decay[i];
}

// r = v - S~^T k, then S = S~ + k (beta r)^T.
template <typename Real>
void delta_update(Real* S, const StepInputs<Real>& x, int64_t K, int64_t V, Real* r) {
  for (int64_t col = 0; col < V; ++col) r[col] = x.v[col];
  for (int64_t i = 0; i < K; ++i)
    for (int64_t col = 0; col < V; ++col) r[col] -= S[i * V + col] * x.k[i];
  for (int64_t i = 0; i < K; ++i)
    for (int64_t col = 0; col < V; ++col) S[i * V + col] += x.k[i] * (x.beta * r[col]);
}

}  // namespace

// ---- forward --------------------------------------------------------------------------------

template <typename Real>
void recurrent_forward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                       const DeltaRuleForwardOutputs& out, Real* workspace) {
  const int64_t K = pr.key_dim, V = pr.value_dim, HV = pr.value_heads;
  const int workers = recurrent_workers(p, pr);
  const RecurrentWorkspace ws = RecurrentWorkspace::make(pr, Pass::forward, workers);
  const Real scale = static_cast<Real>(pr.scale);

  parallel_for(pr.num_seqs * HV, workers, [&](int64_t item, int worker) {
    const HeadCursor c = HeadCursor::make(pr, item / HV, item % HV);
    Real* S = workspace + ws.workers_begin + worker * ws.per_worker;
    Real* scratch = S + K * V;
    StepInputs<Real> x;
    x.bind(scratch, K);
    Real* r = scratch + StepInputs<Real>::scratch_size(K, V);
    Real* o = r + V;

    if (pr.has_initial_state)
      load_state<Real>(p.initial_state, c.n, c.j, K, V, S);
    else
      std::fill(S, S + K * V, Real(0));

    for (int64_t t = 0; t < c.len; ++t) {
      x.load(p, pr, c, t);
      decay_state(S, x, K, V);
      delta_update(S, x, K, V, r);
      // o = scale S^T q.
      for (int64_t col = 0; col < V; ++col) o[col] = 0;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t col = 0; col < V; ++col) o[col] += S[i * V + col] * x.q[i];
      for (int64_t col = 0; col < V; ++col) o[col] *= scale;

      store_row<Real>(out.o, c.b, c.t0 + t, c.j, V, o);
      if (out.saved_r.present()) store_row<Real>(out.saved_r, c.b, c.t0 + t, c.j, V, r);
    }
    if (out.final_state.present()) store_state<Real>(out.final_state, c.n, c.j, K, V, S);
  });
}

// ---- backward -------------------------------------------------------------------------------

namespace {

// Row (b, t, value head j) of a [B, T, HV, D] workspace buffer.
inline int64_t part_row(const DeltaRuleProblem& pr, int64_t b, int64_t t, int64_t j) {
  return (b * pr.seq_len + t) * pr.value_heads + j;
}

// GVA: sum the per-value-head partial gradients of each q/k head in value-head order, apply the
// L2-norm backward when the norm is inside the op, and store dq, dk.
template <typename Real>
void reduce_qk_grads(const DeltaRuleParams& p, const DeltaRuleProblem& pr, const DeltaRuleGrads& grads,
                     const Real* dq_part, const Real* dk_part, int workers) {
  const int64_t K = pr.key_dim, H = pr.heads, group = pr.value_heads / pr.heads;
  const int64_t rows = pr.batch * pr.seq_len;  // (b, t) rows
  const int64_t rows_per_item = 64;
  const bool norm = p.use_qk_l2norm_in_kernel;
  parallel_for((rows + rows_per_item - 1) / rows_per_item, workers, [&](int64_t item, int) {
    std::vector<Real> y(K), dy(K);
    const int64_t end = std::min(rows, (item + 1) * rows_per_item);
    for (int64_t row = item * rows_per_item; row < end; ++row) {
      const int64_t b = row / pr.seq_len, t = row % pr.seq_len;
      for (int64_t h = 0; h < H; ++h) {
        for (int which = 0; which < 2; ++which) {
          const Real* part = which == 0 ? dq_part : dk_part;
          const TensorView& x = which == 0 ? p.q : p.k;
          const TensorView& dx = which == 0 ? grads.dq : grads.dk;
          std::fill(dy.begin(), dy.end(), Real(0));
          for (int64_t j = h * group; j < (h + 1) * group; ++j) {
            const Real* src = part + part_row(pr, b, t, j) * K;
            for (int64_t d = 0; d < K; ++d) dy[d] += src[d];
          }
          if (norm) {
            const Real rstd = load_row<Real>(x, b, t, h, K, true, y.data());
            l2norm_backward<Real>(y.data(), rstd, K, dy.data());
          }
          store_row<Real>(dx, b, t, h, K, dy.data());
        }
      }
    }
  });
}

}  // namespace

template <typename Real>
void recurrent_backward(const DeltaRuleParams& p, const DeltaRuleProblem& pr,
                        const DeltaRuleBackwardInputs& in, const DeltaRuleGrads& grads, Real* workspace) {
  const int64_t K = pr.key_dim, V = pr.value_dim, HV = pr.value_heads;
  const int workers = recurrent_workers(p, pr);
  const RecurrentWorkspace ws = RecurrentWorkspace::make(pr, Pass::backward, workers);
  const Real scale = static_cast<Real>(pr.scale);
  const bool has_gate = pr.gate != GateKind::none;
  Real* dk_part = ws.gva ? workspace + ws.dk_part : nullptr;
  Real* dq_part = ws.gva ? workspace + ws.dq_part : nullptr;

  parallel_for(pr.num_seqs * HV, workers, [&](int64_t item, int worker) {
    const HeadCursor c = HeadCursor::make(pr, item / HV, item % HV);
    Real* block = workspace + ws.workers_begin + worker * ws.per_worker;
    Real* S = block;
    Real* dS = S + K * V;
    Real* scratch = dS + K * V;
    StepInputs<Real> x;
    x.bind(scratch, K);
    Real* dout = scratch + StepInputs<Real>::scratch_size(K, V);  // [V]
    Real* r = dout + V;                                            // [V]
    Real* du = r + V;                                              // [V]
    Real* dr = du + V;                                             // [V]
    Real* dg_row = dr + V;                                         // [K] dg of one step
    Real* Sdr = dg_row + K;                                        // [K] S~ dr
    Real* dq_step = Sdr + K;                                       // [K] dq of one step (HV == H: written straight to grads.dq)
    // dg of the first step (rowsum(dh0 * h0), per key channel) and the running sum of the
    // closed-form terms, in double whatever Real is: late steps' dg_t = dg_1 - prefix is a
    // difference of two large sums, and in float its rounding has the same sign at every step,
    // so it added up in sums of dg over time (gate-weight gradients) to ~4e-5 relative.
    std::vector<double> dg_sums(2 * K, 0.0);
    double* dg_total = dg_sums.data();
    double* dg_prefix = dg_total + K;
    // Step t's rows of r/dr and of this value head's dk and dq: r/dr in this worker's block
    // (the item's steps only); dk there too unless GVA, which needs dk and dq partials that
    // outlive the item (row (b, t, j) of the shared [B, T, HV, K] buffers).
    auto rd_row = [&](int64_t t) { return block + ws.rd + t * V; };
    auto dk_row = [&](int64_t t) {
      return ws.gva ? dk_part + part_row(pr, c.b, c.t0 + t, c.j) * K : block + ws.dk_item + t * K;
    };
    auto dq_row = [&](int64_t t) {
      return ws.gva ? dq_part + part_row(pr, c.b, c.t0 + t, c.j) * K : dq_step;
    };
    auto load_h0 = [&](Real* dst) {
      if (pr.has_initial_state)
        load_state<Real>(p.initial_state, c.n, c.j, K, V, dst);
      else
        std::fill(dst, dst + K * V, Real(0));
    };
    // One forward step on S: decay, r = v - S~^T k (into r_out), S += k (beta r)^T. When
    // `Sdr_of` is given, also forms S~ dr_of (a K-vector) from the decayed state.
    auto forward_step = [&](Real* r_out, const Real* Sdr_of) {
      decay_state(S, x, K, V);
      if (Sdr_of) {
        for (int64_t i = 0; i < K; ++i) {
          Real acc = 0;
          for (int64_t col = 0; col < V; ++col) acc += S[i * V + col] * Sdr_of[col];
          Sdr[i] = acc;
        }
      }
      delta_update(S, x, K, V, r_out);
    };

    // Pass 0 (only without saved_r): the forward again, keeping r in rd.
    if (!in.saved_r.present()) {
      load_h0(S);
      for (int64_t t = 0; t < c.len; ++t) {
        x.load(p, pr, c, t);
        forward_step(rd_row(t), nullptr);
      }
    }

    // Pass 1, t = len-1 .. 0, carrying dS = dL/dS_t (starting from dht):
    //   dS += scale q do^T;  du = dS^T k;  dk = dS u (first part);  dr = beta du (= dv);
    //   dbeta = <du, r>;  dS = diag(exp(g)) (dS - k dr^T)  (now dL/dS_{t-1}).
    if (in.dht.present())
      load_state<Real>(in.dht, c.n, c.j, K, V, dS);
    else
      std::fill(dS, dS + K * V, Real(0));
    for (int64_t t = c.len - 1; t >= 0; --t) {
      x.load(p, pr, c, t);
      load_row<Real>(in.dout, c.b, c.t0 + t, c.j, V, false, dout);
      if (in.saved_r.present())
        load_row<Real>(in.saved_r, c.b, c.t0 + t, c.j, V, false, r);
      else
        std::copy(rd_row(t), rd_row(t) + V, r);
      for (int64_t i = 0; i < K; ++i)
        for (int64_t col = 0; col < V; ++col) dS[i * V + col] += scale * x.q[i] * dout[col];
      for (int64_t col = 0; col < V; ++col) du[col] = 0;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t col = 0; col < V; ++col) du[col] += dS[i * V + col] * x.k[i];
      Real* dk1 = dk_row(t);
      for (int64_t i = 0; i < K; ++i) {
        Real acc = 0;
        for (int64_t col = 0; col < V; ++col) acc += dS[i * V + col] * (x.beta * r[col]);
        dk1[i] = acc;
      }
      Real dbeta = 0;
      for (int64_t col = 0; col < V; ++col) {
        dr[col] = x.beta * du[col];
        dbeta += du[col] * r[col];
      }
      store_row<Real>(grads.dv, c.b, c.t0 + t, c.j, V, dr);
      host::store<Real>(grads.dbeta.data, grads.dbeta.dtype, offset3(grads.dbeta, c.b, c.t0 + t, c.j), dbeta);
      std::copy(dr, dr + V, rd_row(t));  // r_t is not needed any more; pass 2 recomputes it
      for (int64_t i = 0; i < K; ++i)
        for (int64_t col = 0; col < V; ++col)
          dS[i * V + col] = x.decay[i] * (dS[i * V + col] - x.k[i] * dr[col]);
    }
    if (grads.dh0.present()) store_state<Real>(grads.dh0, c.n, c.j, K, V, dS);

    // dg of the first step: g_1 only scales h0, so dg_1 = rowsum(dh0 * h0) (summed over rows
    // for GDN). Later steps follow from the closed form of the design doc read forwards:
    //   dg_t = dg_1 - sum_{s < t} term_s,
    //   term_s = q_s*dq_s - k_s*dk_s - 2 k_s*(S~_s dr_s)   (elementwise over K; GDN sums it).
    // (For GDN, 2(beta dbeta - v.dv) = 2 <dr, r - v> = -2 k.(S~ dr), the same term.) Equal to the
    // reverse sum from <S_T, dht>, and needs no per-step storage.
    // Gate values per step: K for KDA, 1 for GDN (channel sums), none for the plain rule.
    const int64_t gate_width = pr.gate == GateKind::per_channel ? K : 1;
    load_h0(S);
    for (int64_t i = 0; i < K; ++i) {
      double acc = 0;
      for (int64_t col = 0; col < V; ++col) acc += double(dS[i * V + col]) * double(S[i * V + col]);
      dg_total[gate_width == 1 ? 0 : i] += acc;
    }

    // Pass 2, t = 0 .. len-1, recomputing S from h0: dk -= S~ dr;  dq = scale S do. With
    // HV == H this value head is the only contributor to q/k head c.h, so step t's dq and dk are
    // final here: L2-norm backward, then one rounding into the outputs (no partials, no sum).
    for (int64_t t = 0; t < c.len; ++t) {
      x.load(p, pr, c, t);
      load_row<Real>(in.dout, c.b, c.t0 + t, c.j, V, false, dout);
      std::copy(rd_row(t), rd_row(t) + V, dr);
      forward_step(r, dr);
      Real* dk_t = dk_row(t);
      for (int64_t i = 0; i < K; ++i) dk_t[i] -= Sdr[i];
      Real* dq_t = dq_row(t);
      for (int64_t i = 0; i < K; ++i) {
        Real acc = 0;
        for (int64_t col = 0; col < V; ++col) acc += S[i * V + col] * dout[col];
        dq_t[i] = scale * acc;
      }
      if (has_gate) {
        for (int64_t i = 0; i < gate_width; ++i) dg_row[i] = static_cast<Real>(dg_total[i] - dg_prefix[i]);
        if (pr.gate == GateKind::per_channel)
          store_row<Real>(grads.dg, c.b, c.t0 + t, c.j, K, dg_row);
        else
          host::store<Real>(grads.dg.data, grads.dg.dtype, offset3(grads.dg, c.b, c.t0 + t, c.j), dg_row[0]);
        for (int64_t i = 0; i < K; ++i)
          dg_prefix[gate_width == 1 ? 0 : i] += double(x.q[i]) * dq_t[i] - double(x.k[i]) * dk_t[i] -
                                                 2.0 * double(x.k[i]) * Sdr[i];
      }
      if (ws.gva) continue;
      if (p.use_qk_l2norm_in_kernel) {  // x.q, x.k hold the normalized rows
        l2norm_backward<Real>(x.q, x.q_rstd, K, dq_t);
        l2norm_backward<Real>(x.k, x.k_rstd, K, dk_t);
      }
      store_row<Real>(grads.dq, c.b, c.t0 + t, c.h, K, dq_t);
      store_row<Real>(grads.dk, c.b, c.t0 + t, c.h, K, dk_t);
    }
  });

  if (ws.gva) reduce_qk_grads<Real>(p, pr, grads, dq_part, dk_part, workers);
}

template void recurrent_forward<float>(const DeltaRuleParams&, const DeltaRuleProblem&,
                                       const DeltaRuleForwardOutputs&, float*);
template void recurrent_forward<double>(const DeltaRuleParams&, const DeltaRuleProblem&,
                                        const DeltaRuleForwardOutputs&, double*);
template void recurrent_backward<float>(const DeltaRuleParams&, const DeltaRuleProblem&,
                                        const DeltaRuleBackwardInputs&, const DeltaRuleGrads&, float*);
template void recurrent_backward<double>(const DeltaRuleParams&, const DeltaRuleProblem&,
                                         const DeltaRuleBackwardInputs&, const DeltaRuleGrads&, double*);

}  // namespace flashgrad::reference::delta_rule
