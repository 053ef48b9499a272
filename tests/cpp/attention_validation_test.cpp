// One test per validation rule of softmax attention (docs/attention.md, "Validation"). Each test
// breaks one rule of an otherwise valid call and checks that
//   - flashgrad::Error of kind invalid_argument is thrown,
//   - it names the argument (Error::argument() and the message prefix) and the rule (a fragment),
//   - nothing was written: the NaN-poisoned outputs keep their exact bits.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "attention_case.h"
#include "flashgrad/status.h"

namespace flashgrad::test {
namespace {

class AttentionValidation : public ::testing::Test {
 protected:
  void SetUp() override { build(AttnConfig{}); }

  void build(AttnConfig cfg) {
    cfg.dtype = cfg.dtype == DType::f64 ? DType::f32 : cfg.dtype;
    auto rng = make_rng();
    c = make_case(cfg, rng);
    p = c.params();
    out = c.make(c.out_dtype(), c.q_like(cfg.dv));
    lse = c.make(DType::f32, c.lse_shape());
    // Valid forward results and incoming gradients for the backward.
    fwd = run_forward(c);
    dout = c.random_dout(c.out_dtype(), rng);
    dlse = c.random_dlse(DType::f32, rng);
    dq = c.make(c.out_dtype(), c.q_like(cfg.d));
    dk = c.make(c.out_dtype(), c.k_like(cfg.d));
    dv = c.make(c.out_dtype(), c.k_like(cfg.dv));
    bwd.out = fwd.out.view();
    bwd.lse = fwd.lse.view();
    bwd.dout = dout.view();
    bwd.dlse = dlse.view();
    out_view = out.view();
    lse_view = lse.view();
    dq_view = dq.view();
    dk_view = dk.view();
    dv_view = dv.view();
  }

  static bool all_nan(const HostTensor& t) {
    for (double x : t.to_doubles())
      if (!std::isnan(x)) return false;
    return true;
  }

  // Calls `call`, expects the rejection, then checks that every output is still poisoned.
  void expect_rejected(const std::function<void()>& call, const std::string& op, const std::string& arg,
                       const std::string& rule_fragment) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one about argument '" << arg << "' (" << rule_fragment << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("flashgrad: " + op + ": argument '" + arg + "': ", 0), 0u) << msg;
      EXPECT_NE(msg.find(rule_fragment), std::string::npos) << msg << "\n  (wanted: " << rule_fragment << ")";
    }
    for (const HostTensor* t : {&out, &lse, &dq, &dk, &dv})
      EXPECT_TRUE(all_nan(*t)) << "an output was written although the call was rejected";
  }

  void forward_rejects(const std::string& arg, const std::string& rule) {
    expect_rejected([&] { attention_forward(p, out_view, lse_view); }, "attention_forward", arg, rule);
  }
  void backward_rejects(const std::string& arg, const std::string& rule) {
    expect_rejected([&] { attention_backward(p, bwd, dq_view, dk_view, dv_view); },
                    "attention_backward", arg, rule);
  }
  // Input rules apply to both passes (and the workspace query).
  void both_reject(const std::string& arg, const std::string& rule) {
    forward_rejects(arg, rule);
    backward_rejects(arg, rule);
    expect_rejected([&] { attention_workspace_bytes(p, Pass::forward); }, "attention_workspace_bytes",
                    arg, rule);
  }

  AttnCase c;
  AttentionParams p;
  HostTensor out, lse, dout, dlse, dq, dk, dv;
  ForwardResult fwd;
  AttentionBackwardInputs bwd;
  TensorView out_view, lse_view, dq_view, dk_view, dv_view;
};

AttnConfig varlen_config() {
  AttnConfig cfg;
  cfg.varlen = true;
  cfg.lens_q = {3, 0, 4};
  cfg.lens_k = {5, 2, 4};
  return cfg;
}

// The valid baseline really is valid (otherwise every rejection test below proves nothing).
TEST_F(AttentionValidation, BaselineCallsSucceed) {
  attention_forward(p, out_view, lse_view);
  attention_backward(p, bwd, dq_view, dk_view, dv_view);
  EXPECT_FALSE(all_nan(out));
  EXPECT_FALSE(all_nan(dq));
  build(varlen_config());
  attention_forward(p, out_view, lse_view);
  attention_backward(p, bwd, dq_view, dk_view, dv_view);
  EXPECT_FALSE(all_nan(dk));
}

// ---- ranks and sizes ---------------------------------------------------------------------

TEST_F(AttentionValidation, QRankMustBe3Or4) {
  p.q.rank = 2;
  both_reject("q", "must have rank 3 or 4");
}

TEST_F(AttentionValidation, Rank3NeedsCuSeqlens) {
  p.q = TensorView(p.q.data, p.q.dtype, {10, 4, 3});
  both_reject("q", "needs cu_seqlens_q and cu_seqlens_k");
}

TEST_F(AttentionValidation, PackedLayoutNeedsRank3) {
  build(varlen_config());
  p.q = TensorView(p.q.data, p.q.dtype, {1, 7, 4, 3});
  both_reject("q", "must have rank 3 [Tq, Hq, D] with cu_seqlens");
}

TEST_F(AttentionValidation, KRankMustMatchQ) {
  p.k = TensorView(p.k.data, p.k.dtype, {14, 2, 3});
  both_reject("k", "must have rank 4");
}

TEST_F(AttentionValidation, BatchSizesMustMatch) {
  p.k.shape[0] = 1;
  both_reject("k", "batch size must match q");
}

TEST_F(AttentionValidation, KeyLengthsMustMatchBetweenKAndV) {
  p.v.shape[1] = 6;
  both_reject("v", "sequence length must match k");
}

TEST_F(AttentionValidation, KvHeadCountsMustMatch) {
  p.v.shape[2] = 1;
  both_reject("v", "number of heads must match k");
}

TEST_F(AttentionValidation, KvHeadsMustDivideQueryHeads) {
  p.k.shape[2] = p.v.shape[2] = 3;  // Hq = 4 (rejected before any element is read)
  both_reject("k", "must divide the number of query heads");
}

TEST_F(AttentionValidation, HeadDimsOfQAndKMustMatch) {
  p.k.shape[3] = 2;
  both_reject("k", "head dim must match q");
}

TEST_F(AttentionValidation, AtLeastOneHead) {
  p.q.shape[2] = 0;  // an empty q: no data is read, the size rule still applies
  both_reject("q", "must have at least one head");
}

TEST_F(AttentionValidation, HeadDimAtLeastOne) {
  p.v.shape[3] = 0;
  both_reject("v", "head dim must be >= 1");
}

// ---- dtypes and devices -------------------------------------------------------------------

TEST_F(AttentionValidation, UnsupportedInputDtype) {
  p.q.dtype = p.k.dtype = p.v.dtype = DType::i32;
  both_reject("q", "dtype must be one of");
}

TEST_F(AttentionValidation, QKVDtypesMustMatch) {
  p.v.dtype = DType::f16;
  both_reject("v", "dtype must match q (float32)");
}

TEST_F(AttentionValidation, Fp8NeedsDescales) {
  p.q.dtype = p.k.dtype = p.v.dtype = DType::e4m3;
  both_reject("descale_q", "is required for float8_e4m3fn inputs");
}

TEST_F(AttentionValidation, Fp8DescaleShapeIsBatchByKvHeads) {
  p.q.dtype = p.k.dtype = p.v.dtype = DType::e4m3;
  HostTensor good(DType::f32, {2, 2}), bad(DType::f32, {2, 4});
  p.descale_q = good.view();
  p.descale_k = bad.view();
  p.descale_v = good.view();
  both_reject("descale_k", "must have shape [2, 2]");
}

TEST_F(AttentionValidation, Fp8DescaleDtypeIsFloat32) {
  p.q.dtype = p.k.dtype = p.v.dtype = DType::e4m3;
  HostTensor good(DType::f32, {2, 2}), bad(DType::f16, {2, 2});
  p.descale_q = good.view();
  p.descale_k = good.view();
  p.descale_v = bad.view();
  both_reject("descale_v", "dtype must be one of {float32}");
}

TEST_F(AttentionValidation, DescalesOnlyWithFp8) {
  HostTensor ds(DType::f32, {2, 2});
  p.descale_q = ds.view();
  both_reject("descale_q", "only used with float8_e4m3fn inputs");
}

TEST_F(AttentionValidation, Fp8OutputIs16Bit) {
  p.q.dtype = p.k.dtype = p.v.dtype = DType::e4m3;  // out stays float32
  HostTensor ds(DType::f32, {2, 2});
  ds.fill(0.5);
  p.descale_q = p.descale_k = p.descale_v = ds.view();
  forward_rejects("out", "dtype must be bfloat16 or float16 for float8_e4m3fn inputs");
}

TEST_F(AttentionValidation, InputsOnOneDevice) {
  p.k.device = Device::cuda;
  both_reject("k", "must be on the same device as q");
}

TEST_F(AttentionValidation, OutputsOnTheInputsDevice) {
  out_view.device = Device::cuda;
  forward_rejects("out", "must be on the same device as q");
}

// ---- pointers and strides -----------------------------------------------------------------

TEST_F(AttentionValidation, NullDataPointer) {
  p.v.data = nullptr;
  both_reject("v", "null data pointer");
}

TEST_F(AttentionValidation, MisalignedDataPointer) {
  p.q.data = static_cast<char*>(p.q.data) + 2;
  both_reject("q", "not aligned to its element size");
}

TEST_F(AttentionValidation, LastDimensionMustBeContiguous) {
  p.k.stride[3] = 2;
  both_reject("k", "contiguous in its last dimension");
}

TEST_F(AttentionValidation, OutputLastDimensionMustBeContiguous) {
  dv_view.stride[3] = 3;
  backward_rejects("dv", "contiguous in its last dimension");
}

TEST_F(AttentionValidation, NegativeStrides) {
  p.q.stride[1] = -p.q.stride[1];
  both_reject("q", "negative stride in dim 1");
}

// ---- cu_seqlens and max_seqlen ------------------------------------------------------------

TEST_F(AttentionValidation, CuSeqlensBothOrNeither) {
  build(varlen_config());
  p.cu_seqlens_k = TensorView{};
  both_reject("cu_seqlens_k", "both or neither");
}

TEST_F(AttentionValidation, CuSeqlensMustBeInt32) {
  build(varlen_config());
  HostTensor cu(DType::i64, {4});
  cu.assign({0, 3, 3, 7});
  p.cu_seqlens_q = cu.view();
  both_reject("cu_seqlens_q", "dtype must be one of {int32}");
}

TEST_F(AttentionValidation, CuSeqlensRankOne) {
  build(varlen_config());
  const HostTensor cu = int32_tensor({0, 3, 3, 7}, {2, 2});
  p.cu_seqlens_q = cu.view();
  both_reject("cu_seqlens_q", "must have rank 1");
}

TEST_F(AttentionValidation, CuSeqlensOnTheInputsDevice) {
  build(varlen_config());
  p.cu_seqlens_k.device = Device::cuda;
  both_reject("cu_seqlens_k", "must be on the same device as q");
}

TEST_F(AttentionValidation, CuSeqlensMustNotBeEmpty) {
  build(varlen_config());
  HostTensor cu(DType::i32, {0});
  p.cu_seqlens_q = cu.view();
  both_reject("cu_seqlens_q", "must have length N+1 >= 1");
}

TEST_F(AttentionValidation, CuSeqlensLengthsMustAgree) {
  build(varlen_config());
  const HostTensor cu = int32_tensor({0, 5, 11});
  p.cu_seqlens_k = cu.view();
  both_reject("cu_seqlens_k", "same length as cu_seqlens_q (N+1 = 4)");
}

TEST_F(AttentionValidation, CuSeqlensStartAtZero) {
  build(varlen_config());
  const HostTensor cu = int32_tensor({1, 3, 3, 7});
  p.cu_seqlens_q = cu.view();
  both_reject("cu_seqlens_q", "must start at 0");
}

TEST_F(AttentionValidation, CuSeqlensNonDecreasing) {
  build(varlen_config());
  const HostTensor cu = int32_tensor({0, 6, 5, 11});
  p.cu_seqlens_k = cu.view();
  both_reject("cu_seqlens_k", "must be non-decreasing (entry 2 = 5 < entry 1 = 6)");
}

TEST_F(AttentionValidation, CuSeqlensEndAtTokenCount) {
  build(varlen_config());
  const HostTensor cu = int32_tensor({0, 3, 3, 6});
  p.cu_seqlens_q = cu.view();
  both_reject("cu_seqlens_q", "must end at the number of tokens Tq = 7");
}

TEST_F(AttentionValidation, MaxSeqlenAtLeastLongestSequence) {
  build(varlen_config());
  p.max_seqlen_k = 4;  // sequence 0 has 5 keys
  both_reject("max_seqlen_k", "must be >= the longest sequence (5)");
}

TEST_F(AttentionValidation, MaxSeqlenNotNegative) {
  p.max_seqlen_q = -1;
  both_reject("max_seqlen_q", "must be >= 0");
}

// ---- scale, masks, softcap ----------------------------------------------------------------

TEST_F(AttentionValidation, ScaleMustBeFinite) {
  p.scale = std::numeric_limits<float>::infinity();
  both_reject("scale", "must be finite");
}

TEST_F(AttentionValidation, UnknownMaskKind) {
  p.mask = static_cast<MaskKind>(9);
  both_reject("mask", "unknown mask kind value 9");
}

TEST_F(AttentionValidation, WindowBelowMinusOne) {
  p.mask = MaskKind::sliding_window;
  p.window_left = 3;
  p.window_right = -2;
  both_reject("window_right", "must be >= 0, or -1 for unbounded, got -2");
}

TEST_F(AttentionValidation, WindowOnlyWithSlidingWindowMask) {
  p.mask = MaskKind::causal;
  p.window_left = 3;
  both_reject("window_left", "only used with mask sliding_window (mask is causal)");
}

TEST_F(AttentionValidation, PrefixLengthsRequiredForPrefixLm) {
  p.mask = MaskKind::prefix_lm;
  both_reject("prefix_lengths", "is required with mask prefix_lm");
}

TEST_F(AttentionValidation, PrefixLengthsOnePerSequence) {
  p.mask = MaskKind::prefix_lm;
  const HostTensor prefix = int32_tensor({1, 2, 3});
  p.prefix_lengths = prefix.view();
  both_reject("prefix_lengths", "must have shape [2]");
}

TEST_F(AttentionValidation, PrefixLengthsNotNegative) {
  p.mask = MaskKind::prefix_lm;
  const HostTensor prefix = int32_tensor({2, -1});
  p.prefix_lengths = prefix.view();
  both_reject("prefix_lengths", "must be >= 0, got -1 for sequence 1");
}

TEST_F(AttentionValidation, PrefixLengthsOnlyWithPrefixLm) {
  const HostTensor prefix = int32_tensor({2, 1});
  p.prefix_lengths = prefix.view();
  both_reject("prefix_lengths", "only used with mask prefix_lm");
}

class CandidateValidation : public AttentionValidation {
 protected:
  void SetUp() override {
    AttnConfig cfg;
    cfg.sq = cfg.sk = 8;
    build(cfg);
    p.mask = MaskKind::candidate_isolation;
  }
  void with_bounds(std::vector<int64_t> b) {
    bounds = int32_tensor(b, {2, 4});
    p.candidate_bounds = bounds.view();
  }
  HostTensor bounds;
};

TEST_F(CandidateValidation, BoundsRequired) {
  both_reject("candidate_bounds", "is required with mask candidate_isolation");
}

TEST_F(CandidateValidation, BoundsShapeIsSequencesByFour) {
  bounds = int32_tensor({0, 4, 4, 8}, {1, 4});
  p.candidate_bounds = bounds.view();
  both_reject("candidate_bounds", "must have shape [2, 4]");
}

TEST_F(CandidateValidation, HistoryStartAfterEnd) {
  with_bounds({0, 4, 4, 8, 5, 3, 0, 2});
  both_reject("candidate_bounds", "0 <= h0 <= h1 <= sequence length (sequence 1");
}

TEST_F(CandidateValidation, HistoryPastTheSequence) {
  with_bounds({0, 9, 4, 4, 0, 4, 4, 8});
  both_reject("candidate_bounds", "0 <= h0 <= h1 <= sequence length (sequence 0");
}

TEST_F(CandidateValidation, CandidatesOutOfRange) {
  with_bounds({0, 4, 4, 8, 0, 4, -1, 0});
  both_reject("candidate_bounds", "0 <= c0 <= c1 <= sequence length");
}

TEST_F(CandidateValidation, HistoryAndCandidatesDisjoint) {
  with_bounds({0, 5, 4, 8, 0, 4, 4, 8});
  both_reject("candidate_bounds", "must not overlap");
}

TEST_F(CandidateValidation, NeedsEqualQueryAndKeyLengths) {
  AttnConfig cfg;  // Sq = 5, Sk = 7
  build(cfg);
  p.mask = MaskKind::candidate_isolation;
  with_bounds({0, 3, 3, 5, 0, 3, 3, 5});
  both_reject("q", "equal query and key lengths per sequence; sequence 0 has Sq = 5, Sk = 7");
}

// Index tensors on a CUDA device are copied to the host as one block, so they must be contiguous.
// Validation rejects a padded [2, 4] view before any copy (so this runs without a GPU: no device
// memory is touched).
TEST_F(CandidateValidation, BoundsOnCudaMustBeContiguous) {
  bounds = int32_tensor({0, 4, 4, 8, 0, 0, 0, 0, 0, 4, 4, 8, 0, 0, 0, 0}, {2, 8});
  p.candidate_bounds = TensorView(bounds.view().data, DType::i32, {2, 4}, {8, 1}, Device::cuda);
  for (TensorView* t : {&p.q, &p.k, &p.v}) t->device = Device::cuda;
  expect_rejected([&] { attention_workspace_bytes(p, Pass::forward); }, "attention_workspace_bytes",
                  "candidate_bounds", "must be contiguous when on a CUDA device");
}

TEST_F(CandidateValidation, BoundsOnlyWithCandidateMask) {
  with_bounds({0, 4, 4, 8, 0, 4, 4, 8});
  p.mask = MaskKind::none;
  both_reject("candidate_bounds", "only used with mask candidate_isolation");
}

TEST_F(AttentionValidation, SoftcapNegative) {
  p.softcap = -1.0f;
  both_reject("softcap", "must be a finite number >= 0");
}

TEST_F(AttentionValidation, SoftcapNaN) {
  p.softcap = std::nanf("");
  both_reject("softcap", "must be a finite number >= 0");
}

TEST_F(AttentionValidation, UnknownSoftcapMethod) {
  p.softcap = 5.0f;
  p.softcap_method = static_cast<SoftcapMethod>(7);
  both_reject("softcap_method", "unknown softcap method value 7");
}

TEST_F(AttentionValidation, UnknownPrecision) {
  p.exec.precision = static_cast<Precision>(3);
  both_reject("exec.precision", "unknown precision value 3");
}

TEST_F(AttentionValidation, NegativeThreadCount) {
  p.exec.num_threads = -2;
  both_reject("exec.num_threads", "must be >= 0");
}

// ---- forward outputs ----------------------------------------------------------------------

TEST_F(AttentionValidation, OutShape) {
  out_view.shape[3] = 3;
  forward_rejects("out", "must have shape [2, 5, 4, 2] ([B, Sq, Hq, Dv])");
}

TEST_F(AttentionValidation, OutDtype) {
  out_view.dtype = DType::bf16;
  forward_rejects("out", "dtype must be float32 (the dtype of q)");
}

TEST_F(AttentionValidation, LseShape) {
  lse_view = TensorView(lse_view.data, DType::f32, {2, 5, 4});
  forward_rejects("lse", "must have shape [2, 4, 5] ([B, Hq, Sq])");
}

TEST_F(AttentionValidation, LseShapeVarlen) {
  build(varlen_config());
  lse_view = TensorView(lse_view.data, DType::f32, {7, 4});
  forward_rejects("lse", "must have shape [4, 7] ([Hq, Tq])");
}

TEST_F(AttentionValidation, LseDtypeFloat32UnlessInputsAreFloat64) {
  HostTensor lse64 = c.make(DType::f64, c.lse_shape());
  lse_view = lse64.view();
  forward_rejects("lse", "dtype must be one of {float32}, got float64");
}

TEST_F(AttentionValidation, OutMustNotOverlapInputs) {
  out_view.data = p.q.data;  // q [2, 5, 4, 3] float32 holds more than out [2, 5, 4, 2]
  forward_rejects("out", "must not overlap the memory of input 'q'");
}

// Outputs whose elements share memory would be written by several work items at once.
TEST_F(AttentionValidation, OutputsMustNotMapTwoElementsToOneAddress) {
  out_view.stride[1] = 0;  // a broadcast (expanded) view: every query row at one address
  forward_rejects("out", "must not map two elements to one address");
  out_view = out.view();
  lse_view.stride[1] = 2;  // [2, 4, 5]: each head's 5 positions start 2 after the previous head's
  forward_rejects("lse", "must not map two elements to one address");
  dk_view.stride[2] = 2;  // dk [2, 7, 2, 3]: head 1's row starts inside head 0's row of 3
  backward_rejects("dk", "must not map two elements to one address");
}

TEST_F(AttentionValidation, LseMustNotOverlapOut) {
  lse_view.data = out_view.data;
  forward_rejects("lse", "must not overlap the memory of input 'out'");
}

// ---- backward arguments -------------------------------------------------------------------

TEST_F(AttentionValidation, BackwardNeedsOut) {
  bwd.out = TensorView{};
  backward_rejects("out", "is required");
}

TEST_F(AttentionValidation, BackwardNeedsLse) {
  bwd.lse = TensorView{};
  backward_rejects("lse", "is required by the backward");
}

TEST_F(AttentionValidation, DoutShape) {
  bwd.dout.shape[1] = 4;
  backward_rejects("dout", "must have shape [2, 5, 4, 2] (the shape of out");
}

TEST_F(AttentionValidation, DoutDtypeMatchesOut) {
  HostTensor d16 = c.make(DType::f16, c.q_like(2));
  bwd.dout = d16.view();
  backward_rejects("dout", "dtype must match out (float32)");
}

TEST_F(AttentionValidation, DlseShape) {
  bwd.dlse.shape[2] = 4;
  backward_rejects("dlse", "must have shape [2, 4, 5] (the shape of lse");
}

TEST_F(AttentionValidation, ZLossWeightFinite) {
  bwd.z_loss_weight = std::numeric_limits<float>::quiet_NaN();
  backward_rejects("z_loss_weight", "must be finite");
  bwd.z_loss_weight = std::numeric_limits<float>::infinity();
  backward_rejects("z_loss_weight", "must be finite");
}

TEST_F(AttentionValidation, GradientShapes) {
  dk_view.shape[1] = 5;
  backward_rejects("dk", "must have shape [2, 7, 2, 3] (the shape of k)");
}

TEST_F(AttentionValidation, GradientDtypes) {
  dq_view.dtype = DType::f16;
  backward_rejects("dq", "dtype must match q (float32)");
}

TEST_F(AttentionValidation, GradientsMustNotOverlapInputs) {
  dv_view.data = bwd.dout.data;  // same shape and dtype as dout
  backward_rejects("dv", "must not overlap the memory of input 'dout'");
}

TEST_F(AttentionValidation, GradientsMustNotOverlapEachOther) {
  dv_view.data = dk_view.data;
  backward_rejects("dk", "must not overlap");
}

}  // namespace
}  // namespace flashgrad::test
