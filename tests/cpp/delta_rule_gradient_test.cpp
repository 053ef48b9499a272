// Every gradient of the delta-rule family (dq, dk, dv, dg, dbeta, dh0) against central finite
// differences of the fp64 loss sum(o * do) + sum(final_state * dht), for both algorithms, all
// three gate kinds, with and without the in-kernel L2 norm, GVA, varlen, odd lengths.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "delta_rule_test_util.h"

namespace flashgrad::test {
namespace {

struct GradCase {
  std::string name;
  DeltaCase c;
};
void PrintTo(const GradCase& g, std::ostream* os) { *os << g.name; }

// Central differences at `samples` random elements of input `x` (all of them when fewer),
// compared with the analytic gradient `grad`. Returns the worst |fd - analytic| / max(1, max|analytic|).
double fd_check(DeltaData& d, HostTensor& x, const HostTensor& grad, const char* name, int samples,
                std::mt19937_64& rng) {
  const double eps = 1e-5;
  std::vector<int64_t> idx;
  if (x.numel() <= samples) {
    for (int64_t i = 0; i < x.numel(); ++i) idx.push_back(i);
  } else {
    std::uniform_int_distribution<int64_t> pick(0, x.numel() - 1);
    for (int s = 0; s < samples; ++s) idx.push_back(pick(rng));
  }
  double grad_max = 1.0;
  for (int64_t i = 0; i < grad.numel(); ++i) grad_max = std::max(grad_max, std::fabs(grad.get(i)));
  double worst = 0;
  for (int64_t i : idx) {
    const double x0 = x.get(i);
    x.set(i, x0 + eps);
    const double lp = loss_of(d, run_forward(d));
    x.set(i, x0 - eps);
    const double lm = loss_of(d, run_forward(d));
    x.set(i, x0);
    const double fd = (lp - lm) / (2 * eps);
    const double err = std::fabs(fd - grad.get(i)) / grad_max;
    EXPECT_LT(err, 1e-7) << name << "[" << i << "]: finite difference " << fd << " vs analytic " << grad.get(i);
    worst = std::max(worst, err);
  }
  return worst;
}

class DeltaRuleGradient : public ::testing::TestWithParam<GradCase> {};

TEST_P(DeltaRuleGradient, MatchesFiniteDifferences) {
  auto rng = make_rng();
  DeltaData d(GetParam().c, rng);
  const DeltaGrads g = run_backward(d);
  const bool chunked = d.c.algorithm == DeltaRuleAlgorithm::chunked;
  const int samples = chunked ? 48 : 160;
  double worst = 0;
  worst = std::max(worst, fd_check(d, d.q, g.dq, "dq", samples, rng));
  worst = std::max(worst, fd_check(d, d.k, g.dk, "dk", samples, rng));
  worst = std::max(worst, fd_check(d, d.v, g.dv, "dv", samples, rng));
  worst = std::max(worst, fd_check(d, d.beta, g.dbeta, "dbeta", samples, rng));
  if (d.c.gate != GateKind::none) worst = std::max(worst, fd_check(d, d.g, g.dg, "dg", samples, rng));
  if (d.c.initial_state) worst = std::max(worst, fd_check(d, d.h0, g.dh0, "dh0", samples, rng));
  EXPECT_TRUE(all_finite(g.dq) && all_finite(g.dk) && all_finite(g.dv) && all_finite(g.dbeta));
  std::cout << "  [" << GetParam().name << "] worst |fd - analytic| / max(1, |grad|) = " << worst << "\n";
}

std::vector<GradCase> gradient_cases() {
  std::vector<GradCase> cases;
  const std::pair<GateKind, const char*> gates[] = {
      {GateKind::none, "delta"}, {GateKind::scalar, "gdn"}, {GateKind::per_channel, "kda"}};
  for (auto alg : {DeltaRuleAlgorithm::recurrent, DeltaRuleAlgorithm::chunked}) {
    const std::string a = alg == DeltaRuleAlgorithm::recurrent ? "recurrent" : "chunked";
    for (auto [gate, gname] : gates) {
      for (bool l2 : {false, true}) {
        DeltaCase c;
        c.B = alg == DeltaRuleAlgorithm::chunked ? 1 : 2;
        c.T = 75;  // not a multiple of the chunk size 64
        c.H = 1;
        c.HV = 2;  // GVA: two value heads read one q/k head
        c.K = 4;
        c.V = 6;
        c.gate = gate;
        c.l2norm = l2;
        c.algorithm = alg;
        cases.push_back({a + "_" + gname + (l2 ? "_l2norm" : ""), c});
      }
      // HV == H with the L2 norm: the recurrent backward finishes dq, dk per step without the
      // per-value-head partials of GVA (a separate code path).
      DeltaCase e;
      e.B = 2;
      e.T = 67;
      e.H = 2;
      e.HV = 2;
      e.K = 5;
      e.V = 3;
      e.gate = gate;
      e.l2norm = true;
      e.algorithm = alg;
      cases.push_back({a + "_" + gname + "_l2norm_hv_eq_h", e});
      // Varlen with uneven lengths (one empty, one past a chunk boundary), per-sequence states.
      DeltaCase v;
      v.B = 1;
      v.T = 90;
      v.H = 2;
      v.HV = 4;
      v.K = 5;
      v.V = 4;
      v.gate = gate;
      v.cu_seqlens = {0, 7, 7, 77, 90};
      v.l2norm = gate == GateKind::per_channel;
      v.algorithm = alg;
      cases.push_back({a + "_" + gname + "_varlen", v});
    }
    // Strong decay (g down to about -20 and below), and K != V the other way round.
    for (auto gate : {GateKind::scalar, GateKind::per_channel}) {
      DeltaCase s;
      s.T = 70;
      s.K = 6;
      s.V = 3;
      s.gate = gate;
      s.g_scale = 10;
      s.algorithm = alg;
      cases.push_back({a + (gate == GateKind::scalar ? "_gdn" : "_kda") + "_strong_decay", s});
    }
    // No initial state, no dht, explicit scale, HV = 4H.
    DeltaCase z;
    z.T = 66;
    z.H = 1;
    z.HV = 4;
    z.K = 4;
    z.V = 4;
    z.initial_state = false;
    z.dht = false;
    z.scale = 0.37f;
    z.algorithm = alg;
    cases.push_back({a + "_gdn_no_state_scale", z});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, DeltaRuleGradient, ::testing::ValuesIn(gradient_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& param) { return param.param.name; });

}  // namespace
}  // namespace flashgrad::test
