// Backward of the CPU reference against central finite differences in float64.
//
// The scalar checked is the loss whose gradient the backward computes:
//   L = sum_i <O_i, dO_i> + sum_i lse_i * dLSE_i + (w / 2) * sum_i lse_i^2   (w = z_loss_weight)
// over rows with a finite lse (fully masked rows carry no gradient). L is evaluated with the naive
// forward of attention_case.h (independent of the library); the analytic gradient comes from the
// library's backward with float64 tensors. Every element of q, k and v is perturbed, so the cases
// are small: FD costs 2 naive forwards per element.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "attention_case.h"

namespace flashgrad::test {
namespace {

struct GradCheckOptions {
  bool with_dlse = true;
  float z_loss_weight = 0.0f;
};

double loss(const AttnCase& c, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& dout,
            const std::vector<double>& dlse, double w) {
  const NaiveForward f = naive_forward(c, q, k, v);
  double total = 0;
  for (size_t x = 0; x < f.out.size(); ++x) total += f.out[x] * dout[x];
  for (size_t x = 0; x < f.lse.size(); ++x)
    if (std::isfinite(f.lse[x])) total += f.lse[x] * dlse[x] + 0.5 * w * f.lse[x] * f.lse[x];
  return total;
}

// Runs forward + backward through the API and compares every gradient element with
// (L(x + h) - L(x - h)) / 2h. Returns the worst error relative to max(1, |numeric|).
double check_gradients(const AttnConfig& cfg_in, const GradCheckOptions& opt) {
  AttnConfig cfg = cfg_in;
  cfg.dtype = DType::f64;
  auto rng = make_rng();
  AttnCase c = make_case(cfg, rng);
  // soft_sign's second derivative jumps at s_raw = 0, and a central difference straddling that
  // kink is off by O(h). A perturbation moves a score by < scale * |k| * h ~ 4e-5 here, so cases
  // with an allowed raw score within 1e-3 of 0 are redrawn (about 1 draw in 10).
  if (cfg.softcap > 0 && cfg.softcap_method == SoftcapMethod::soft_sign)
    for (int attempt = 0; attempt < 100; ++attempt) {
      if (naive_forward(c, c.q.to_doubles(), c.k.to_doubles(), c.v.to_doubles()).min_abs_raw_score > 1e-3)
        break;
      c = make_case(cfg, rng);
    }
  const ForwardResult fwd = run_forward(c);
  HostTensor dout = c.random_dout(DType::f64, rng);
  HostTensor dlse = c.random_dlse(DType::f64, rng);
  if (!opt.with_dlse) dlse.fill(0.0);  // the loss then has no lse term; the API gets no dlse
  const Gradients g = run_backward(c, fwd, dout, opt.with_dlse ? &dlse : nullptr, opt.z_loss_weight);

  std::vector<double> vals[3] = {c.q.to_doubles(), c.k.to_doubles(), c.v.to_doubles()};
  const HostTensor* grads[3] = {&g.dq, &g.dk, &g.dv};
  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<double> dO = dout.to_doubles(), dL = dlse.to_doubles();
  const double h = 1e-5;
  double worst = 0;
  for (int t = 0; t < 3; ++t) {
    for (size_t x = 0; x < vals[t].size(); ++x) {
      const double keep = vals[t][x];
      vals[t][x] = keep + h;
      const double up = loss(c, vals[0], vals[1], vals[2], dO, dL, opt.z_loss_weight);
      vals[t][x] = keep - h;
      const double down = loss(c, vals[0], vals[1], vals[2], dO, dL, opt.z_loss_weight);
      vals[t][x] = keep;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grads[t]->get(static_cast<int64_t>(x));
      const double err = std::fabs(analytic - numeric) / std::max(1.0, std::fabs(numeric));
      if (!(err <= worst)) worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      EXPECT_LE(err, 1e-7) << names[t] << " element " << x << ": analytic " << analytic
                           << ", finite difference " << numeric;
    }
  }
  return worst;
}

// Central differences with h = 1e-5 in double have truncation error ~h^2 and rounding error
// ~1e-16 / h, i.e. ~1e-10 here; a wrong formula is off by O(1e-2) or more.
void expect_gradients(const AttnConfig& cfg, GradCheckOptions opt = {}) {
  const double worst = check_gradients(cfg, opt);
  EXPECT_LE(worst, 1e-7);
  std::cout << "  worst relative FD error " << worst << "\n";
}

AttnConfig small(MaskKind mask) {
  AttnConfig cfg;
  cfg.batch = 2;
  cfg.sq = 6;
  cfg.sk = 8;
  cfg.hq = 4;
  cfg.hk = 2;
  cfg.d = 3;
  cfg.dv = 2;
  cfg.mask = mask;
  cfg.threads = 2;
  cfg.input_range = 1.5;
  return cfg;
}

TEST(AttentionBackward, NoMask) { expect_gradients(small(MaskKind::none)); }

TEST(AttentionBackward, Causal) { expect_gradients(small(MaskKind::causal)); }

TEST(AttentionBackward, SlidingWindow) {
  AttnConfig cfg = small(MaskKind::sliding_window);
  cfg.window_left = 2;
  cfg.window_right = 1;
  expect_gradients(cfg);
  cfg.window_left = -1;
  cfg.window_right = 0;  // causal written as a window
  expect_gradients(cfg);
}

TEST(AttentionBackward, PrefixLm) {
  AttnConfig cfg = small(MaskKind::prefix_lm);
  cfg.prefix = {4, 1};
  expect_gradients(cfg);
}

TEST(AttentionBackward, CandidateIsolation) {
  AttnConfig cfg = small(MaskKind::candidate_isolation);
  cfg.sq = cfg.sk = 8;
  cfg.bounds = {0, 4, 4, 7, 3, 8, 0, 2};  // row 7 of sequence 0 and row 2 of sequence 1 see nothing
  expect_gradients(cfg);
}

TEST(AttentionBackward, SoftcapTanh) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.scale = 1.5f;
  cfg.softcap = 1.3f;  // scores reach ~5: well inside the nonlinear part of the cap
  cfg.softcap_method = SoftcapMethod::tanh;
  expect_gradients(cfg);
}

TEST(AttentionBackward, SoftcapSoftSign) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.scale = 1.5f;
  cfg.softcap = 1.3f;
  cfg.softcap_method = SoftcapMethod::soft_sign;
  expect_gradients(cfg);
}

TEST(AttentionBackward, GqaRatios) {
  for (int64_t hk : {4, 2, 1}) {
    AttnConfig cfg = small(MaskKind::causal);
    cfg.hk = hk;
    SCOPED_TRACE(::testing::Message() << "Hq = 4, Hk = " << hk);
    expect_gradients(cfg);
  }
}

TEST(AttentionBackward, VarlenWithEmptySequences) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.varlen = true;
  cfg.lens_q = {3, 0, 4, 2, 0};
  cfg.lens_k = {5, 2, 0, 4, 0};  // sequence 2 has queries but no keys
  expect_gradients(cfg);
}

TEST(AttentionBackward, DlseAndZLoss) {
  GradCheckOptions opt;
  opt.z_loss_weight = 0.37f;
  expect_gradients(small(MaskKind::causal), opt);
  opt.with_dlse = false;  // z-loss alone
  expect_gradients(small(MaskKind::none), opt);
}

TEST(AttentionBackward, OutputGradientOnly) {
  GradCheckOptions opt;
  opt.with_dlse = false;
  expect_gradients(small(MaskKind::none), opt);
}

TEST(AttentionBackward, OddLengths) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.batch = 1;
  cfg.sq = 37;
  cfg.sk = 53;
  cfg.hq = 2;
  cfg.hk = 1;
  expect_gradients(cfg);
}

TEST(AttentionBackward, FullyMaskedRowsHaveZeroGradientAndNoNaN) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.sq = 9;
  cfg.sk = 5;  // a_i = i - 4: rows 0..3 see nothing
  GradCheckOptions opt;
  opt.z_loss_weight = 0.5f;  // w * lse = -inf on those rows must not leak
  expect_gradients(cfg, opt);

  cfg.dtype = DType::f32;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult fwd = run_forward(c);
  HostTensor dout = c.random_dout(DType::f32, rng);
  HostTensor dlse = c.random_dlse(DType::f32, rng);
  const Gradients g = run_backward(c, fwd, dout, &dlse, 0.5f);
  for (const HostTensor* t : {&g.dq, &g.dk, &g.dv})
    for (double x : t->to_doubles()) ASSERT_TRUE(std::isfinite(x));
  for (int64_t n = 0; n < c.num_seqs; ++n)
    for (int64_t h = 0; h < cfg.hq; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t e = 0; e < cfg.d; ++e) EXPECT_EQ(g.dq.get(c.q_index(n, i, h, e, cfg.d)), 0.0);
}

// Low-precision inputs against the fp64 backward (checked above) on the same rounded inputs.
// Error sources: the gradient's own rounding (half an ulp of the dtype), fp32 accumulation, and
// O / lse stored in the dtype (Delta = <dO, O> from the rounded O), each O(ulp) relative to the
// largest gradient element. Bound: 4 dtype ulps + 256 float ulps of the largest element.
TEST(AttentionBackward, LowPrecisionInputsAgreeWithDouble) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    AttnConfig cfg = small(MaskKind::causal);
    cfg.sq = 37;
    cfg.sk = 53;
    cfg.d = 16;
    cfg.dv = 8;
    cfg.dtype = dt;
    auto rng = make_rng();
    const AttnCase c = make_case(cfg, rng);
    const ForwardResult fwd = run_forward(c);
    HostTensor dout = c.random_dout(dt, rng);
    HostTensor dlse = c.random_dlse(DType::f32, rng);
    const Gradients g = run_backward(c, fwd, dout, &dlse, 0.1f);

    AttnCase d = c;  // the same values in float64
    d.cfg.dtype = DType::f64;
    d.q = converted(c.q, DType::f64);
    d.k = converted(c.k, DType::f64);
    d.v = converted(c.v, DType::f64);
    const ForwardResult dfwd = run_forward(d);
    const HostTensor dlse64 = converted(dlse, DType::f64);
    const Gradients ref = run_backward(d, dfwd, converted(dout, DType::f64), &dlse64, 0.1f);
    const double ulp = unit_roundoff(dt);
    const std::pair<const HostTensor*, const HostTensor*> pairs[] = {
        {&g.dq, &ref.dq}, {&g.dk, &ref.dk}, {&g.dv, &ref.dv}};
    const char* names[] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; ++t) {
      const MaxDiff m = max_abs_diff(pairs[t].first->to_doubles(), pairs[t].second->to_doubles());
      EXPECT_LE(m.diff, (4 * ulp + 256 * 0x1p-24) * m.ref_max)
          << names[t] << " element " << m.where << " (largest |ref| " << m.ref_max << ")";
    }
  }
}

// fp8 inputs: gradients with respect to the dequantized q, k, v, in bf16. The float32 backward
// on the dequantized inputs, fed the same (bf16) out and dout, gives the same bits once rounded.
TEST(AttentionBackward, Fp8InputsGiveGradientsOfTheDequantizedInputs) {
  AttnConfig cfg = small(MaskKind::sliding_window);
  cfg.window_left = 3;
  cfg.window_right = 1;
  cfg.input_range = 3.0;
  auto rng = make_rng();
  const Fp8Case f = make_fp8_case(cfg, rng);
  const AttentionParams p = f.params();
  ForwardResult fwd{f.c.make(DType::bf16, f.c.q_like(cfg.dv)), f.c.make(DType::f32, f.c.lse_shape())};
  attention_forward(p, fwd.out.view(), fwd.lse.view());
  HostTensor dout = f.c.random_dout(DType::bf16, rng);
  HostTensor dq = f.c.make(DType::bf16, f.c.q_like(cfg.d)), dk = f.c.make(DType::bf16, f.c.k_like(cfg.d)),
             dv = f.c.make(DType::bf16, f.c.k_like(cfg.dv));
  AttentionBackwardInputs in;
  in.out = fwd.out.view();
  in.lse = fwd.lse.view();
  in.dout = dout.view();
  attention_backward(p, in, dq.view(), dk.view(), dv.view());

  const AttnCase d = f.dequantized();
  const ForwardResult fwd32{converted(fwd.out, DType::f32), fwd.lse};
  const Gradients ref = run_backward(d, fwd32, converted(dout, DType::f32), nullptr, 0.0f);
  EXPECT_TRUE(same_bits(dq, converted(ref.dq, DType::bf16)));
  EXPECT_TRUE(same_bits(dk, converted(ref.dk, DType::bf16)));
  EXPECT_TRUE(same_bits(dv, converted(ref.dv, DType::bf16)));
}

TEST(AttentionBackward, SameBitsForOneAndManyThreads) {
  AttnConfig cfg = small(MaskKind::prefix_lm);
  cfg.dtype = DType::bf16;
  cfg.batch = 3;
  cfg.sq = 23;
  cfg.sk = 29;
  cfg.hq = 8;
  cfg.hk = 2;
  cfg.prefix = {5, 0, 40};
  auto rng = make_rng();
  AttnCase c = make_case(cfg, rng);
  const ForwardResult fwd = run_forward(c);
  HostTensor dout = c.random_dout(DType::bf16, rng);
  c.cfg.threads = 1;
  const Gradients one = run_backward(c, fwd, dout, nullptr, 0.2f);
  for (int threads : {2, 4, 0}) {
    c.cfg.threads = threads;
    const Gradients many = run_backward(c, fwd, dout, nullptr, 0.2f);
    EXPECT_TRUE(same_bits(one.dq, many.dq)) << threads << " threads";
    EXPECT_TRUE(same_bits(one.dk, many.dk)) << threads << " threads";
    EXPECT_TRUE(same_bits(one.dv, many.dv)) << threads << " threads";
  }
}

TEST(AttentionBackward, WorkspaceGivenOrAllocatedGivesSameBits) {
  AttnConfig cfg = small(MaskKind::causal);
  cfg.dtype = DType::f32;
  cfg.threads = 2;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult fwd = run_forward(c);
  HostTensor dout = c.random_dout(DType::f32, rng);
  const std::size_t bytes = attention_workspace_bytes(c.params(), Pass::backward);
  // 2 workers, each: K, dK [8, 3], V, dV [8, 2], q and dq rows [3], dout and out rows [2] floats.
  const std::size_t per_worker = ((2 * 8 * 5 + 2 * 3 + 2 * 2) * 4 + 63) / 64 * 64;
  EXPECT_EQ(bytes, 2 * per_worker + 64);
  std::vector<unsigned char> ws(bytes, 0xff);
  const Gradients allocated = run_backward(c, fwd, dout, nullptr, 0.0f);
  const Gradients given = run_backward(c, fwd, dout, nullptr, 0.0f, Workspace{ws.data(), bytes});
  EXPECT_TRUE(same_bits(allocated.dq, given.dq));
  EXPECT_TRUE(same_bits(allocated.dk, given.dk));
  EXPECT_TRUE(same_bits(allocated.dv, given.dv));
}

}  // namespace
}  // namespace flashgrad::test
