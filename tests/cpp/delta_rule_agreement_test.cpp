// Forward and backward agreement of the delta-rule reference: against a direct recurrence written
// in the test, chunked against recurrent in fp64, varlen against separate calls, fp32 and low
// precision against fp64, strong decay, saved_r against recomputation, 1 vs N threads bitwise.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "delta_rule_test_util.h"

namespace flashgrad::test {
namespace {

const GateKind kGates[] = {GateKind::none, GateKind::scalar, GateKind::per_channel};

std::string gate_label(GateKind g) {
  return g == GateKind::none ? "delta" : g == GateKind::scalar ? "gdn" : "kda";
}

// A mid-sized case: several chunks, T not a multiple of 64, GVA, K != V.
DeltaCase mid_case(GateKind gate, bool l2norm, DeltaRuleAlgorithm alg) {
  DeltaCase c;
  c.B = 2;
  c.T = 150;
  c.H = 2;
  c.HV = 4;
  c.K = 16;
  c.V = 12;
  c.gate = gate;
  c.l2norm = l2norm;
  c.algorithm = alg;
  return c;
}

void expect_close(const HostTensor& a, const HostTensor& ref, double tol, const std::string& what) {
  const double e = rel_err(a.to_doubles(), ref.to_doubles());
  EXPECT_LT(e, tol) << what << ": max |a - ref| / max |ref| = " << e;
  std::cout << "  [" << what << "] max |a - ref| / max |ref| = " << e << "\n";
}

// `a` is f32 and each element is `exact` (long double, then double) rounded once to float after an
// fp64 computation: |a - exact| <= 2^-24 |exact| (round to nearest) + 1e-12 max |exact| (fp64 work).
void expect_rounded_from(const HostTensor& a, const std::vector<double>& exact, const std::string& what) {
  ASSERT_EQ(a.dtype(), DType::f32) << what;
  const std::vector<double> x = a.to_doubles();
  ASSERT_EQ(x.size(), exact.size()) << what;
  double max_exact = 0, worst = 0;
  for (double e : exact) max_exact = std::max(max_exact, std::abs(e));
  for (size_t i = 0; i < x.size(); ++i) {
    const double bound = std::ldexp(std::abs(exact[i]), -24) + 1e-12 * max_exact;
    worst = std::max(worst, std::abs(x[i] - exact[i]) / bound);
  }
  EXPECT_LE(worst, 1.0) << what << ": worst |a - exact| / (half ulp + 1e-12 max) = " << worst;
  std::cout << "  [" << what << "] worst |a - exact| / bound = " << worst << "\n";
}

TEST(DeltaRuleForward, MatchesDirectRecurrence) {
  auto rng = make_rng();
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked})
    for (GateKind gate : kGates)
      for (bool l2 : {false, true}) {
        DeltaCase c = mid_case(gate, l2, alg);
        if (gate == GateKind::scalar) c.cu_seqlens = {0, 40, 40, 150}, c.B = 1;  // varlen too
        DeltaData d(c, rng);
        const DeltaForward f = run_forward(d);
        const DirectResult ref = direct_recurrence(d);
        const std::string what = gate_label(gate) + (l2 ? " l2norm" : "") +
                                 (alg == DeltaRuleAlgorithm::chunked ? " chunked" : " recurrent");
        EXPECT_LT(rel_err(f.o.to_doubles(), ref.o), 1e-12) << what << " o";
        EXPECT_LT(rel_err(f.final_state.to_doubles(), ref.final_state), 1e-12) << what << " final_state";
      }
}

// The two algorithms are independent implementations of one function: in fp64 they agree to
// rounding, forward and backward.
TEST(DeltaRuleChunked, AgreesWithRecurrentInFp64) {
  auto rng = make_rng();
  for (GateKind gate : kGates)
    for (bool l2 : {false, true}) {
      DeltaData d(mid_case(gate, l2, DeltaRuleAlgorithm::recurrent), rng);
      DeltaRuleParams pr = d.params(), pc = d.params();
      pc.algorithm = DeltaRuleAlgorithm::chunked;
      const std::string what = gate_label(gate) + (l2 ? " l2norm" : "");
      const DeltaForward fr = run_forward(d, pr), fc = run_forward(d, pc);
      expect_close(fc.o, fr.o, 1e-10, what + " o");
      expect_close(fc.final_state, fr.final_state, 1e-10, what + " final_state");
      const DeltaGrads gr = run_backward(d, pr), gc = run_backward(d, pc);
      for (const GradPair& g : grad_pairs(gc, gr, gate)) expect_close(g.a, g.b, 1e-10, what + " " + g.name);
    }
}

// Copy rows [t0, t1) of a [1, T, ...] tensor into a [1, t1 - t0, ...] tensor, and back.
HostTensor slice_time(const HostTensor& x, int64_t t0, int64_t t1) {
  std::vector<int64_t> shape = x.shape();
  int64_t row = 1;  // elements per time step
  for (size_t d = 2; d < shape.size(); ++d) row *= shape[d];
  shape[1] = t1 - t0;
  HostTensor out(x.dtype(), shape);
  for (int64_t i = 0; i < (t1 - t0) * row; ++i) out.set(i, x.get(t0 * row + i));
  return out;
}
// State slice n of an [N, ...] tensor as [1, ...].
HostTensor slice_seq(const HostTensor& x, int64_t n) {
  std::vector<int64_t> shape = x.shape();
  const int64_t per = x.numel() / shape[0];
  shape[0] = 1;
  HostTensor out(x.dtype(), shape);
  for (int64_t i = 0; i < per; ++i) out.set(i, x.get(n * per + i));
  return out;
}
void expect_rows_equal(const HostTensor& packed, int64_t t0, const HostTensor& single, const std::string& what) {
  int64_t row = 1;  // elements per time step
  for (size_t d = 2; d < single.shape().size(); ++d) row *= single.shape()[d];
  for (int64_t i = 0; i < single.numel(); ++i)
    ASSERT_EQ(packed.get(t0 * row + i), single.get(i)) << what << " element " << i;
}
void expect_state_equal(const HostTensor& packed, int64_t n, const HostTensor& single, const std::string& what) {
  for (int64_t i = 0; i < single.numel(); ++i)
    ASSERT_EQ(packed.get(n * single.numel() + i), single.get(i)) << what << " element " << i;
}

// Packed sequences give exactly what separate calls give (same arithmetic, so bitwise).
TEST(DeltaRuleVarlen, EqualsSeparateCalls) {
  auto rng = make_rng();
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked})
    for (GateKind gate : kGates) {
      DeltaCase c = mid_case(gate, gate == GateKind::per_channel, alg);
      c.B = 1;
      c.T = 203;
      c.cu_seqlens = {0, 37, 37, 150, 203};
      c.dtype = DType::f32;
      c.gate_dtype = DType::f32;
      c.precision = Precision::fp32;
      c.threads = 2;
      DeltaData d(c, rng);
      const DeltaForward f = run_forward(d);
      const DeltaGrads g = run_backward(d);
      for (int64_t n = 0; n + 1 < static_cast<int64_t>(c.cu_seqlens.size()); ++n) {
        const int64_t t0 = c.cu_seqlens[n], t1 = c.cu_seqlens[n + 1];
        DeltaCase cs = c;
        cs.T = t1 - t0;
        cs.cu_seqlens.clear();
        DeltaData s(cs, rng);  // then overwrite with the packed sequence's values
        s.q = slice_time(d.q, t0, t1);
        s.k = slice_time(d.k, t0, t1);
        s.v = slice_time(d.v, t0, t1);
        if (gate != GateKind::none) s.g = slice_time(d.g, t0, t1);
        s.beta = slice_time(d.beta, t0, t1);
        s.dout = slice_time(d.dout, t0, t1);
        s.h0 = slice_seq(d.h0, n);
        s.dht = slice_seq(d.dht, n);
        const DeltaForward fs = run_forward(s);
        const DeltaGrads gs = run_backward(s);
        const std::string what = gate_label(gate) + " sequence " + std::to_string(n);
        expect_rows_equal(f.o, t0, fs.o, what + " o");
        expect_state_equal(f.final_state, n, fs.final_state, what + " final_state");
        for (const GradPair& x : grad_pairs(g, gs, gate)) {
          if (std::string(x.name) == "dh0")  // a state [N, HV, K, V], not time rows
            expect_state_equal(x.a, n, x.b, what + " dh0");
          else
            expect_rows_equal(x.a, t0, x.b, what + " " + x.name);
        }
      }
    }
}

// fp32 compute against fp64 compute on the same inputs. Both round their results into the same
// storage dtype, so with f16 / bf16 storage they differ where fp32's error flips a rounding: at
// most one unit in the last place (2^-11 for f16, 2^-8 for bf16) in relative rms.
TEST(DeltaRulePrecision, Fp32AndLowPrecisionTrackFp64) {
  auto rng = make_rng();
  struct Mode {
    DType dtype;
    double tol;
  };
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked})
    for (GateKind gate : kGates)
      for (Mode m : {Mode{DType::f32, 2e-5}, Mode{DType::f16, 4.9e-4}, Mode{DType::bf16, 3.9e-3}}) {
        DeltaCase c = mid_case(gate, true, alg);
        c.dtype = m.dtype;
        c.gate_dtype = DType::f32;
        c.precision = Precision::fp32;
        c.threads = 2;
        DeltaData d(c, rng);
        DeltaRuleParams p64 = d.params();
        p64.exec.precision = Precision::fp64;
        const DeltaForward f32 = run_forward(d), f64 = run_forward(d, p64);
        const DeltaGrads g32 = run_backward(d), g64 = run_backward(d, p64);
        const std::string what = gate_label(gate) + " " + dtype_name(m.dtype) +
                                 (alg == DeltaRuleAlgorithm::chunked ? " chunked" : " recurrent");
        double worst = 0;
        auto check = [&](const HostTensor& a, const HostTensor& ref, const char* name) {
          const double e = rel_rms(a.to_doubles(), ref.to_doubles());
          EXPECT_LT(e, m.tol) << what << " " << name << ": relative rms " << e;
          worst = std::max(worst, e);
        };
        check(f32.o, f64.o, "o");
        check(f32.final_state, f64.final_state, "final_state");
        for (const GradPair& g : grad_pairs(g32, g64, gate)) check(g.a, g.b, g.name);
        std::cout << "  [" << what << "] worst relative rms vs fp64 compute = " << worst << "\n";
      }
}

// Decays down to exp(-20) per step and below: everything stays finite, fp32 tracks fp64, and the
// two algorithms still agree in fp64.
TEST(DeltaRuleStrongDecay, FiniteAndAccurate) {
  auto rng = make_rng();
  for (GateKind gate : {GateKind::scalar, GateKind::per_channel}) {
    DeltaCase c = mid_case(gate, true, DeltaRuleAlgorithm::recurrent);
    c.T = 300;
    c.g_scale = 10;  // logsigmoid(x) * 10: many steps below -20
    c.gate_dtype = DType::f32;
    DeltaData d(c, rng);
    for (int64_t i = 0; i < d.g.numel(); i += 7) d.g.set(i, -20.0);
    DeltaRuleParams p = d.params();
    const DeltaForward fr = run_forward(d, p);
    const DeltaGrads gr = run_backward(d, p);
    p.algorithm = DeltaRuleAlgorithm::chunked;
    const DeltaForward fc = run_forward(d, p);
    const DeltaGrads gc = run_backward(d, p);
    const std::string what = gate_label(gate);
    expect_close(fc.o, fr.o, 1e-10, what + " o");
    // dg has the gate's dtype, f32 here: each algorithm rounds its fp64 value once, and two values
    // a hair apart can round to neighbouring floats (one ulp, ~3.8e-10 of max |dg| in a CI run).
    // So both are held to the rounding bound around the long-double arbiter instead.
    const std::vector<double> exact_dg = direct_gate_gradient(d);
    expect_rounded_from(gc.dg, exact_dg, what + " chunked dg");
    expect_rounded_from(gr.dg, exact_dg, what + " recurrent dg");
    expect_close(gc.dk, gr.dk, 1e-10, what + " dk");
    expect_close(gc.dh0, gr.dh0, 1e-10, what + " dh0");
    // fp32 compute from the same inputs (converted once to float32).
    DeltaCase c32 = c;
    c32.dtype = DType::f32;
    c32.precision = Precision::fp32;
    DeltaData d32(c32, rng);
    d32.q = converted(d.q, DType::f32);
    d32.k = converted(d.k, DType::f32);
    d32.v = converted(d.v, DType::f32);
    d32.g = converted(d.g, DType::f32);
    d32.beta = converted(d.beta, DType::f32);
    d32.h0 = converted(d.h0, DType::f32);
    d32.dout = converted(d.dout, DType::f32);
    d32.dht = converted(d.dht, DType::f32);
    for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked}) {
      DeltaRuleParams p32 = d32.params();
      p32.algorithm = alg;
      const DeltaForward f = run_forward(d32, p32);
      const DeltaGrads g = run_backward(d32, p32);
      for (const HostTensor* t : {&f.o, &f.final_state, &g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dh0})
        EXPECT_TRUE(all_finite(*t)) << what << ": non-finite output";
      const std::string w = what + (alg == DeltaRuleAlgorithm::chunked ? " chunked fp32" : " recurrent fp32");
      // Bars ~10x the median fp32 error over 240 seeds (chunked, the worse algorithm): o, dq, dk, dbeta
      // median ~2e-6 (max 7e-6); dg median 6.3e-6, max 1.9e-5, and 2.6e-5 once in a 100-run sweep.
      // dg is a difference of sums larger than itself (the recurrent closed form dg_1 - prefix; the
      // chunked reverse cumsum of +-dE terms), so its error is ~3x the others'; accumulating the
      // chunked dG in double changed nothing (the error comes with the terms, from fp32 products).
      EXPECT_LT(rel_rms(f.o.to_doubles(), fr.o.to_doubles()), 2e-5) << w << " o";
      EXPECT_LT(rel_rms(g.dq.to_doubles(), gr.dq.to_doubles()), 2e-5) << w << " dq";
      EXPECT_LT(rel_rms(g.dk.to_doubles(), gr.dk.to_doubles()), 2e-5) << w << " dk";
      EXPECT_LT(rel_rms(g.dg.to_doubles(), gr.dg.to_doubles()), 6e-5) << w << " dg";
      EXPECT_LT(rel_rms(g.dbeta.to_doubles(), gr.dbeta.to_doubles()), 2e-5) << w << " dbeta";
    }
  }
}

// The backward reading the forward's saved r gives what it gives when recomputing r.
TEST(DeltaRuleSavedR, SameGradientsAsRecompute) {
  auto rng = make_rng();
  for (GateKind gate : kGates) {
    DeltaData d(mid_case(gate, false, DeltaRuleAlgorithm::recurrent), rng);
    const DeltaRuleParams p = d.params();
    const DeltaForward f = run_forward(d, p, /*save_r=*/true, DType::f64);
    const DeltaGrads with_r = run_backward(d, p, &f.r);
    const DeltaGrads without = run_backward(d, p);
    for (const GradPair& g : grad_pairs(with_r, without, gate))
      EXPECT_TRUE(same_bits(g.a, g.b)) << gate_label(gate) << " " << g.name;
    // saved_r from the chunked forward: the same r up to rounding.
    DeltaRuleParams pc = p;
    pc.algorithm = DeltaRuleAlgorithm::chunked;
    const DeltaForward fc = run_forward(d, pc, true, DType::f64);
    expect_close(fc.r, f.r, 1e-10, gate_label(gate) + " chunked saved_r");
    EXPECT_TRUE(all_finite(f.r));
  }
}

// Decoding: one step with a state in and out.
TEST(DeltaRuleForward, SingleStepDecode) {
  auto rng = make_rng();
  for (GateKind gate : kGates) {
    DeltaCase c = mid_case(gate, true, DeltaRuleAlgorithm::recurrent);
    c.T = 1;
    DeltaData d(c, rng);
    const DeltaForward f = run_forward(d);
    const DirectResult ref = direct_recurrence(d);
    EXPECT_LT(rel_err(f.o.to_doubles(), ref.o), 1e-13) << gate_label(gate);
    EXPECT_LT(rel_err(f.final_state.to_doubles(), ref.final_state), 1e-13) << gate_label(gate);
  }
}

// No steps at all: the final state is the initial state and dh0 is dht, for both algorithms.
TEST(DeltaRuleForward, ZeroLengthPassesStateThrough) {
  auto rng = make_rng();
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked}) {
    DeltaCase c = mid_case(GateKind::per_channel, true, alg);
    c.T = 0;
    DeltaData d(c, rng);
    const DeltaForward f = run_forward(d);
    const DeltaGrads g = run_backward(d);
    EXPECT_EQ(f.final_state.to_doubles(), d.h0.to_doubles());
    EXPECT_EQ(g.dh0.to_doubles(), d.dht.to_doubles());
  }
}

// 1 and N workers give the same bits (work items never share an output element), with GVA and
// with HV == H (where the recurrent backward reuses each worker's rows from item to item).
TEST(DeltaRuleThreads, OneAndManyWorkersBitwiseEqual) {
  auto rng = make_rng();
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked})
    for (GateKind gate : kGates)
      for (int64_t hv : {4, 2}) {
        DeltaCase c = mid_case(gate, true, alg);
        c.HV = hv;
        c.dtype = DType::bf16;
        c.gate_dtype = DType::f32;
        c.precision = Precision::fp32;
        DeltaData d(c, rng);
        DeltaRuleParams p1 = d.params(), pn = d.params();
        p1.exec.num_threads = 1;
        pn.exec.num_threads = 5;
        const DeltaForward f1 = run_forward(d, p1, true), fn = run_forward(d, pn, true);
        const DeltaGrads g1 = run_backward(d, p1), gn = run_backward(d, pn);
        const std::string what = gate_label(gate) +
                                 (alg == DeltaRuleAlgorithm::chunked ? " chunked" : " recurrent") +
                                 " HV = " + std::to_string(hv);
        EXPECT_TRUE(same_bits(f1.o, fn.o)) << what << " o";
        EXPECT_TRUE(same_bits(f1.final_state, fn.final_state)) << what << " final_state";
        EXPECT_TRUE(same_bits(f1.r, fn.r)) << what << " saved_r";
        for (const GradPair& g : grad_pairs(g1, gn, gate))
          EXPECT_TRUE(same_bits(g.a, g.b)) << what << " " << g.name;
      }
}

}  // namespace
}  // namespace flashgrad::test
