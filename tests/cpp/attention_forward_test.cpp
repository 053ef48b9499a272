// Forward of the CPU reference against the naive direct formula (attention_case.h), for every
// layout, mask, softcap method and GQA ratio; plus fully masked rows and workspace handling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_case.h"

namespace flashgrad::test {
namespace {

// fp64 reference vs the naive formula: both are exact up to double rounding.
void expect_forward_matches_naive(const AttnConfig& cfg) {
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult r = run_forward(c);
  const NaiveForward ref = naive_forward(c, c.q.to_doubles(), c.k.to_doubles(), c.v.to_doubles());
  const MaxDiff out = max_abs_diff(r.out.to_doubles(), ref.out);
  EXPECT_LE(out.diff, 1e-12) << "out, worst element " << out.where;
  const std::vector<double> lse = r.lse.to_doubles();
  for (size_t x = 0; x < lse.size(); ++x) {
    if (std::isinf(ref.lse[x])) {
      EXPECT_EQ(lse[x], ref.lse[x]) << "lse element " << x << " should be -inf (fully masked row)";
    } else {
      EXPECT_NEAR(lse[x], ref.lse[x], 1e-12) << "lse element " << x;
    }
  }
}

AttnConfig base(MaskKind mask) {
  AttnConfig cfg;
  cfg.batch = 2;
  cfg.sq = 9;
  cfg.sk = 13;
  cfg.hq = 4;
  cfg.hk = 2;
  cfg.d = 5;
  cfg.dv = 3;
  cfg.mask = mask;
  cfg.threads = 2;
  return cfg;
}

TEST(AttentionForward, NoMaskMatchesNaive) { expect_forward_matches_naive(base(MaskKind::none)); }

TEST(AttentionForward, CausalMatchesNaiveForSqLessAndGreaterThanSk) {
  AttnConfig cfg = base(MaskKind::causal);
  expect_forward_matches_naive(cfg);
  cfg.sq = 13;
  cfg.sk = 9;  // the first 4 rows see no key
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, SlidingWindowMatchesNaive) {
  AttnConfig cfg = base(MaskKind::sliding_window);
  for (auto [wl, wr] : {std::pair<int64_t, int64_t>{2, 1}, {-1, 3}, {0, -1}, {4, 0}, {0, 0}}) {
    cfg.window_left = wl;
    cfg.window_right = wr;
    SCOPED_TRACE(::testing::Message() << "window (" << wl << ", " << wr << ")");
    expect_forward_matches_naive(cfg);
  }
}

TEST(AttentionForward, PrefixLmMatchesNaive) {
  AttnConfig cfg = base(MaskKind::prefix_lm);
  cfg.prefix = {0, 6};
  expect_forward_matches_naive(cfg);
  cfg.sq = 13;  // Sq == Sk, and a prefix longer than the sequence
  cfg.prefix = {4, 20};
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, CandidateIsolationMatchesNaive) {
  AttnConfig cfg = base(MaskKind::candidate_isolation);
  cfg.sq = cfg.sk = 11;
  // Sequence 0: history [0, 6), candidates [6, 10), row 10 sees nothing. Sequence 1: candidates
  // first, then history, with a gap row 3.
  cfg.bounds = {0, 6, 6, 10, 4, 11, 0, 3};
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, SoftcapBothMethodsMatchNaive) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.scale = 1.7f;
  cfg.input_range = 2.0;
  cfg.softcap = 2.5f;
  for (SoftcapMethod m : {SoftcapMethod::tanh, SoftcapMethod::soft_sign}) {
    cfg.softcap_method = m;
    SCOPED_TRACE(softcap_method_name(m));
    expect_forward_matches_naive(cfg);
  }
}

TEST(AttentionForward, GqaRatiosAndMqa) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.hq = 8;
  for (int64_t hk : {8, 4, 2, 1}) {
    cfg.hk = hk;
    SCOPED_TRACE(::testing::Message() << "Hq = 8, Hk = " << hk);
    expect_forward_matches_naive(cfg);
  }
}

TEST(AttentionForward, VarlenWithEmptySequences) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.varlen = true;
  // Empty query side, empty key side (rows fully masked), both empty, and ordinary sequences.
  cfg.lens_q = {5, 0, 4, 0, 7};
  cfg.lens_k = {8, 3, 0, 0, 7};
  expect_forward_matches_naive(cfg);
  cfg.mask = MaskKind::none;
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, OddLengthsAndNonContiguousStrides) {
  AttnConfig cfg = base(MaskKind::sliding_window);
  cfg.sq = 37;
  cfg.sk = 53;
  cfg.window_left = 9;
  cfg.window_right = 4;
  cfg.padded_strides = true;
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, ExplicitScale) {
  AttnConfig cfg = base(MaskKind::none);
  cfg.scale = -0.37f;  // any finite value, negative included
  expect_forward_matches_naive(cfg);
}

TEST(AttentionForward, LseIsOptional) {
  auto rng = make_rng();
  const AttnCase c = make_case(base(MaskKind::causal), rng);
  const ForwardResult with_lse = run_forward(c);
  HostTensor out = c.make(c.out_dtype(), c.q_like(c.cfg.dv));
  attention_forward(c.params(), out.view(), TensorView{});
  EXPECT_TRUE(same_bits(out, with_lse.out));
}

TEST(AttentionForward, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.sq = 10;
  cfg.sk = 4;  // a_i = i - 6: rows 0..5 see no key
  cfg.dtype = DType::f32;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult r = run_forward(c);
  for (int64_t n = 0; n < c.num_seqs; ++n)
    for (int64_t h = 0; h < cfg.hq; ++h)
      for (int64_t i = 0; i < cfg.sq; ++i) {
        const double lse = r.lse.get(c.lse_index(n, h, i));
        if (i < 6) {
          EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
          for (int64_t e = 0; e < cfg.dv; ++e) EXPECT_EQ(r.out.get(c.q_index(n, i, h, e, cfg.dv)), 0.0);
        } else {
          EXPECT_TRUE(std::isfinite(lse));
        }
      }
}

TEST(AttentionForward, Fp32AndHalfInputsAgreeWithDouble) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    AttnConfig cfg = base(MaskKind::causal);
    cfg.sq = 37;
    cfg.sk = 53;
    cfg.d = 16;
    cfg.dv = 8;
    cfg.dtype = dt;
    auto rng = make_rng();
    const AttnCase c = make_case(cfg, rng);
    const ForwardResult r = run_forward(c);
    // The exact answer for the same (already rounded) inputs.
    const NaiveForward ref = naive_forward(c, c.q.to_doubles(), c.k.to_doubles(), c.v.to_doubles());
    // Output rounding is half an ulp of the dtype; fp32 accumulation over <= 53 keys adds a few
    // float ulps. Bound: 2 output ulps + 64 float ulps, relative to the largest value.
    const double ulp = unit_roundoff(dt);
    const MaxDiff out = max_abs_diff(r.out.to_doubles(), ref.out);
    EXPECT_LE(out.diff, (2 * ulp + 64 * 0x1p-24) * out.ref_max) << "out, element " << out.where;
    const MaxDiff lse = max_abs_diff(r.lse.to_doubles(), ref.lse);
    EXPECT_LE(lse.diff, 64 * 0x1p-24 * lse.ref_max) << "lse (float32), element " << lse.where;
  }
}

TEST(AttentionForward, Fp64PrecisionModeOnFloatInputs) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.dtype = DType::f32;
  cfg.precision = Precision::fp64;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const ForwardResult r = run_forward(c);
  const NaiveForward ref = naive_forward(c, c.q.to_doubles(), c.k.to_doubles(), c.v.to_doubles());
  // Computed in double, rounded once to float: within half a float ulp (plus double noise).
  const std::vector<double> out = r.out.to_doubles();
  for (size_t x = 0; x < out.size(); ++x)
    EXPECT_LE(std::fabs(out[x] - ref.out[x]), std::fabs(ref.out[x]) * 0x1p-24 * 1.0001 + 1e-300)
        << "element " << x;
}

TEST(AttentionForward, Fp8InputsDequantizeWithDescales) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.input_range = 3.0;
  auto rng = make_rng();
  const Fp8Case f = make_fp8_case(cfg, rng);
  HostTensor out = f.c.make(DType::bf16, f.c.q_like(cfg.dv));
  HostTensor lse = f.c.make(DType::f32, f.c.lse_shape());
  attention_forward(f.params(), out.view(), lse.view());
  // Dequantize-then-fp32 is the documented semantics: the same bits after rounding to bf16.
  const ForwardResult ref = run_forward(f.dequantized());
  EXPECT_TRUE(same_bits(out, converted(ref.out, DType::bf16)));
  EXPECT_TRUE(same_bits(lse, ref.lse));
}

TEST(AttentionForward, WorkspaceGivenOrAllocatedGivesSameBits) {
  AttnConfig cfg = base(MaskKind::causal);
  cfg.dtype = DType::f32;
  cfg.threads = 3;
  auto rng = make_rng();
  const AttnCase c = make_case(cfg, rng);
  const std::size_t bytes = attention_workspace_bytes(c.params(), Pass::forward);
  // 3 workers, each: K [13, 5] + V [13, 3] + scores [13] + q row [5] + out row [3] floats,
  // rounded up to 64 bytes, plus 64 bytes of alignment slack.
  const std::size_t per_worker = ((13 * 8 + 13 + 5 + 3) * 4 + 63) / 64 * 64;
  EXPECT_EQ(bytes, 3 * per_worker + 64);
  std::vector<unsigned char> ws(bytes + 1, 0xff);
  const ForwardResult allocated = run_forward(c);
  const ForwardResult given = run_forward(c, Workspace{ws.data() + 1, bytes});  // misaligned base
  const ForwardResult too_small = run_forward(c, Workspace{ws.data(), 16});
  EXPECT_TRUE(same_bits(allocated.out, given.out));
  EXPECT_TRUE(same_bits(allocated.lse, given.lse));
  EXPECT_TRUE(same_bits(allocated.out, too_small.out));
}

TEST(AttentionForward, SameBitsForOneAndManyThreads) {
  AttnConfig cfg = base(MaskKind::sliding_window);
  cfg.window_left = 5;
  cfg.window_right = 2;
  cfg.dtype = DType::bf16;
  cfg.batch = 3;
  cfg.sq = 31;
  cfg.sk = 29;
  cfg.hq = 6;
  cfg.hk = 3;
  auto rng = make_rng();
  AttnCase c = make_case(cfg, rng);
  c.cfg.threads = 1;
  const ForwardResult one = run_forward(c);
  for (int threads : {2, 5, 0}) {
    c.cfg.threads = threads;
    const ForwardResult many = run_forward(c);
    EXPECT_TRUE(same_bits(one.out, many.out)) << threads << " threads";
    EXPECT_TRUE(same_bits(one.lse, many.lse)) << threads << " threads";
  }
}

}  // namespace
}  // namespace flashgrad::test
