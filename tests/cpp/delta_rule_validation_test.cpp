// One test per validation rule of the delta-rule entry points: the call throws flashgrad::Error
// naming the argument, and every output stays exactly as poisoned (NaN) before the call.
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <limits>
#include <string>

#include "delta_rule_test_util.h"
#include "flashgrad/status.h"

namespace flashgrad::test {
namespace {

// A valid GDN call (float32, B = 2, GVA) with all outputs poisoned; tests break one rule each.
struct Call {
  DeltaData d;
  DeltaForward f;
  DeltaGrads g;
  DeltaRuleParams p;
  DeltaRuleForwardOutputs out;
  DeltaRuleBackwardInputs in;
  DeltaRuleGrads grads;
  std::deque<HostTensor> extra;  // tensors a mutation creates (kept alive for the call)

  explicit Call(DeltaCase c) : d(c, rng()) {
    p = d.params();
    f.o = HostTensor(c.dtype, {c.B, c.T, c.HV, c.V});
    f.final_state = HostTensor(c.state_dtype(), d.state_shape());
    f.r = HostTensor(DType::f32, {c.B, c.T, c.HV, c.V});
    out.o = f.o.view();
    out.final_state = f.final_state.view();
    out.saved_r = f.r.view();
    g = make_grads(d);
    grads = grad_views(d, g);
    in = backward_inputs(d);
  }
  static std::mt19937_64& rng() {
    static std::mt19937_64 r = make_rng();
    return r;
  }
  TensorView make(DType dt, std::vector<int64_t> shape) {
    extra.emplace_back(dt, shape);
    extra.back().fill(0.5);
    return extra.back().view();
  }
};

DeltaCase base_case() {
  DeltaCase c;
  c.B = 2;
  c.T = 5;
  c.H = 1;
  c.HV = 2;
  c.K = 4;
  c.V = 3;
  c.gate = GateKind::scalar;
  c.dtype = DType::f32;
  c.gate_dtype = DType::f32;
  c.precision = Precision::fp32;
  return c;
}

bool all_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isnan(t.get(i))) return false;
  return true;
}

enum class Which { forward, backward, both };

// Applies `mutate` to a fresh valid call, runs the entry point(s) and expects an Error about `arg`.
void expect_rejected(const std::string& arg, const std::function<void(Call&)>& mutate, Which which = Which::both,
                     DeltaCase c = base_case()) {
  for (int pass = 0; pass < 2; ++pass) {
    if ((pass == 0 && which == Which::backward) || (pass == 1 && which == Which::forward)) continue;
    Call call(c);
    mutate(call);
    try {
      if (pass == 0)
        delta_rule_forward(call.p, call.out);
      else
        delta_rule_backward(call.p, call.in, call.grads);
      ADD_FAILURE() << (pass ? "backward" : "forward") << " accepted a call breaking a rule of '" << arg << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos) << e.what();
    }
    for (const HostTensor* t : {&call.f.o, &call.f.final_state, &call.f.r, &call.g.dq, &call.g.dk, &call.g.dv,
                                &call.g.dg, &call.g.dbeta, &call.g.dh0})
      EXPECT_TRUE(all_nan(*t)) << "an output was written although the call was rejected (" << arg << ")";
  }
}

TEST(DeltaRuleValidation, BaselineCallIsAccepted) {
  Call call(base_case());
  delta_rule_forward(call.p, call.out);
  delta_rule_backward(call.p, call.in, call.grads);
  EXPECT_TRUE(all_finite(call.f.o) && all_finite(call.g.dg));
}

// ---- ranks and shapes ---------------------------------------------------------------------------
TEST(DeltaRuleValidation, QRank) {
  expect_rejected("q", [](Call& c) { c.p.q = c.make(DType::f32, {2, 5, 4}); });
}
TEST(DeltaRuleValidation, QMissing) {
  expect_rejected("q", [](Call& c) { c.p.q = TensorView(); });
}
TEST(DeltaRuleValidation, KShape) {
  expect_rejected("k", [](Call& c) { c.p.k = c.make(DType::f32, {2, 5, 1, 3}); });
}
TEST(DeltaRuleValidation, VBatchOrTime) {
  expect_rejected("v", [](Call& c) { c.p.v = c.make(DType::f32, {2, 6, 2, 3}); });
}
TEST(DeltaRuleValidation, ValueHeadsNotMultipleOfHeads) {
  DeltaCase cs = base_case();
  cs.H = 2;
  cs.HV = 2;
  expect_rejected("v", [](Call& c) {
    c.p.v = c.make(DType::f32, {2, 5, 3, 3});  // HV = 3, H = 2
  }, Which::forward, cs);
}
TEST(DeltaRuleValidation, GRank) {
  expect_rejected("g", [](Call& c) { c.p.g = c.make(DType::f32, {2, 5}); });
}
TEST(DeltaRuleValidation, GScalarShape) {
  expect_rejected("g", [](Call& c) { c.p.g = c.make(DType::f32, {2, 5, 1}); });
}
TEST(DeltaRuleValidation, GPerChannelShape) {
  expect_rejected("g", [](Call& c) { c.p.g = c.make(DType::f32, {2, 5, 2, 3}); }, Which::forward);
}
TEST(DeltaRuleValidation, BetaMissing) {
  expect_rejected("beta", [](Call& c) { c.p.beta = TensorView(); });
}
TEST(DeltaRuleValidation, BetaShape) {
  expect_rejected("beta", [](Call& c) { c.p.beta = c.make(DType::f32, {2, 5, 2, 1}); });
}
TEST(DeltaRuleValidation, InitialStateShape) {
  expect_rejected("initial_state", [](Call& c) { c.p.initial_state = c.make(DType::f32, {2, 2, 3, 4}); });
}
TEST(DeltaRuleValidation, InitialStateCountWithVarlen) {
  DeltaCase cs = base_case();
  cs.B = 1;
  cs.cu_seqlens = {0, 2, 5};
  expect_rejected("initial_state", [](Call& c) { c.p.initial_state = c.make(DType::f32, {1, 2, 4, 3}); },
                  Which::both, cs);
}

// ---- dtypes and devices -------------------------------------------------------------------------
TEST(DeltaRuleValidation, QDtypeNotFloating) {
  expect_rejected("q", [](Call& c) { c.p.q = c.make(DType::i32, {2, 5, 1, 4}); });
}
TEST(DeltaRuleValidation, QDtypeFp8) {
  expect_rejected("q", [](Call& c) { c.p.q = c.make(DType::e4m3, {2, 5, 1, 4}); });
}
TEST(DeltaRuleValidation, KDtypeMix) {
  expect_rejected("k", [](Call& c) { c.p.k = c.make(DType::bf16, {2, 5, 1, 4}); });
}
TEST(DeltaRuleValidation, VDtypeMix) {
  expect_rejected("v", [](Call& c) { c.p.v = c.make(DType::f16, {2, 5, 2, 3}); });
}
TEST(DeltaRuleValidation, GDtypeNeitherF32NorQ) {
  expect_rejected("g", [](Call& c) { c.p.g = c.make(DType::bf16, {2, 5, 2}); });
}
TEST(DeltaRuleValidation, BetaDtypeNeitherF32NorQ) {
  expect_rejected("beta", [](Call& c) { c.p.beta = c.make(DType::f64, {2, 5, 2}); });
}
TEST(DeltaRuleValidation, InitialStateDtype) {
  expect_rejected("initial_state", [](Call& c) { c.p.initial_state = c.make(DType::bf16, {2, 2, 4, 3}); });
}
TEST(DeltaRuleValidation, DeviceMix) {
  expect_rejected("v", [](Call& c) { c.p.v.device = Device::cuda; });
  expect_rejected("beta", [](Call& c) { c.p.beta.device = Device::cuda; });
  expect_rejected("o", [](Call& c) { c.out.o.device = Device::cuda; }, Which::forward);
  expect_rejected("dq", [](Call& c) { c.grads.dq.device = Device::cuda; }, Which::backward);
}

// ---- cu_seqlens ---------------------------------------------------------------------------------
DeltaCase varlen_case() {
  DeltaCase c = base_case();
  c.B = 1;
  c.cu_seqlens = {0, 2, 5};
  return c;
}
TEST(DeltaRuleValidation, CuSeqlensRequiresBatchOne) {
  expect_rejected("cu_seqlens", [](Call& c) {
    c.extra.push_back(int32_tensor({0, 2, 5}));
    c.p.cu_seqlens = c.extra.back().view();
  });
}
TEST(DeltaRuleValidation, CuSeqlensBadValues) {
  const std::vector<std::vector<int64_t>> bad = {{1, 2, 5}, {0, 3, 2, 5}, {0, 2, 6}, {0, 2, 4}, {0}};
  for (const auto& values : bad) {
    expect_rejected("cu_seqlens", [&](Call& c) {
      c.extra.push_back(int32_tensor(values));
      c.p.cu_seqlens = c.extra.back().view();
      c.p.initial_state = TensorView();
    }, Which::both, varlen_case());
  }
}
TEST(DeltaRuleValidation, CuSeqlensDtypeAndRank) {
  expect_rejected("cu_seqlens", [](Call& c) { c.p.cu_seqlens = c.make(DType::f32, {3}); }, Which::both, varlen_case());
  expect_rejected("cu_seqlens", [](Call& c) { c.p.cu_seqlens = c.make(DType::i32, {3, 1}); }, Which::both,
                  varlen_case());
}

// ---- outputs ------------------------------------------------------------------------------------
TEST(DeltaRuleValidation, OutputShapes) {
  expect_rejected("o", [](Call& c) { c.out.o = c.make(DType::f32, {2, 5, 1, 3}); }, Which::forward);
  expect_rejected("final_state", [](Call& c) { c.out.final_state = c.make(DType::f32, {2, 2, 3, 4}); },
                  Which::forward);
  expect_rejected("saved_r", [](Call& c) { c.out.saved_r = c.make(DType::f32, {2, 5, 2, 4}); }, Which::forward);
  expect_rejected("dq", [](Call& c) { c.grads.dq = c.make(DType::f32, {2, 5, 2, 4}); }, Which::backward);
  expect_rejected("dk", [](Call& c) { c.grads.dk = c.make(DType::f32, {2, 4, 1, 4}); }, Which::backward);
  expect_rejected("dv", [](Call& c) { c.grads.dv = c.make(DType::f32, {2, 5, 2, 4}); }, Which::backward);
  expect_rejected("dg", [](Call& c) { c.grads.dg = c.make(DType::f32, {2, 5, 2, 4}); }, Which::backward);
  expect_rejected("dbeta", [](Call& c) { c.grads.dbeta = c.make(DType::f32, {2, 5, 1}); }, Which::backward);
  expect_rejected("dh0", [](Call& c) { c.grads.dh0 = c.make(DType::f32, {1, 2, 4, 3}); }, Which::backward);
}
TEST(DeltaRuleValidation, OutputDtypes) {
  expect_rejected("o", [](Call& c) { c.out.o = c.make(DType::bf16, {2, 5, 2, 3}); }, Which::forward);
  expect_rejected("final_state", [](Call& c) { c.out.final_state = c.make(DType::f16, {2, 2, 4, 3}); },
                  Which::forward);
  expect_rejected("saved_r", [](Call& c) { c.out.saved_r = c.make(DType::bf16, {2, 5, 2, 3}); }, Which::forward);
  expect_rejected("dq", [](Call& c) { c.grads.dq = c.make(DType::f64, {2, 5, 1, 4}); }, Which::backward);
  expect_rejected("dbeta", [](Call& c) { c.grads.dbeta = c.make(DType::bf16, {2, 5, 2}); }, Which::backward);
}
// saved_r is float32 even for 16-bit inputs: a bf16 r put KDA's dg over its accuracy bar on the H200.
TEST(DeltaRuleValidation, SavedRSixteenBitRefusedForSixteenBitInputs) {
  DeltaCase c = base_case();
  c.dtype = DType::bf16;
  expect_rejected("saved_r", [](Call& call) { call.out.saved_r = call.make(DType::bf16, {2, 5, 2, 3}); },
                  Which::forward, c);
  expect_rejected("saved_r", [](Call& call) { call.in.saved_r = call.make(DType::bf16, {2, 5, 2, 3}); },
                  Which::backward, c);
}
// saved_v_new: only where the backend keeps v_new (the CUDA chunked path); the CPU backend keeps none,
// so it refuses the tensor (naming it) in both passes and in the workspace query, whatever its shape.
TEST(DeltaRuleValidation, SavedVNewRefusedWhereNotKept) {
  DeltaCase c = base_case();
  c.dtype = DType::bf16;
  {
    Call call(c);
    EXPECT_FALSE(delta_rule_keeps_v_new(call.p));
    try {
      (void)delta_rule_workspace_bytes(call.p, Pass::backward, true);
      ADD_FAILURE() << "delta_rule_workspace_bytes(with_saved_v_new = true) on the CPU did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "with_saved_v_new") << e.what();
    }
  }
  expect_rejected("saved_v_new", [](Call& call) {
    call.out.saved_r = TensorView();
    call.out.saved_v_new = call.make(DType::bf16, {2, 5, 2, 3});
  }, Which::forward, c);
  expect_rejected("saved_v_new", [](Call& call) { call.in.saved_v_new = call.make(DType::bf16, {2, 5, 2, 3}); },
                  Which::backward, c);
}
TEST(DeltaRuleValidation, OutputMissing) {
  expect_rejected("o", [](Call& c) { c.out.o = TensorView(); }, Which::forward);
  expect_rejected("dv", [](Call& c) { c.grads.dv = TensorView(); }, Which::backward);
  expect_rejected("dg", [](Call& c) { c.grads.dg = TensorView(); }, Which::backward);
}
TEST(DeltaRuleValidation, GateGradientWithoutGate) {
  expect_rejected("dg", [](Call& c) { c.p.g = TensorView(); }, Which::backward);
}
TEST(DeltaRuleValidation, OutputAliasesInput) {
  expect_rejected("o", [](Call& c) { c.out.o.data = c.p.v.data; }, Which::forward);
  expect_rejected("dv", [](Call& c) { c.grads.dv.data = c.in.dout.data; }, Which::backward);
  expect_rejected("dbeta", [](Call& c) { c.grads.dbeta.data = c.p.beta.data; }, Which::backward);
}
TEST(DeltaRuleValidation, OutputsMustNotMapTwoElementsToOneAddress) {
  expect_rejected("o", [](Call& c) { c.out.o.stride[1] = 0; }, Which::forward);  // broadcast over T
  expect_rejected("final_state", [](Call& c) { c.out.final_state.stride[2] = 1; }, Which::forward);
  expect_rejected("dq", [](Call& c) { c.grads.dq.stride[0] = 0; }, Which::backward);
}
TEST(DeltaRuleValidation, BackwardInputs) {
  expect_rejected("dout", [](Call& c) { c.in.dout = c.make(DType::f32, {2, 5, 2, 4}); }, Which::backward);
  expect_rejected("dout", [](Call& c) { c.in.dout = c.make(DType::f16, {2, 5, 2, 3}); }, Which::backward);
  expect_rejected("dht", [](Call& c) { c.in.dht = c.make(DType::f32, {2, 2, 3, 3}); }, Which::backward);
  expect_rejected("dht", [](Call& c) { c.in.dht = c.make(DType::bf16, {2, 2, 4, 3}); }, Which::backward);
  expect_rejected("saved_r", [](Call& c) { c.in.saved_r = c.make(DType::f32, {2, 5, 2, 2}); }, Which::backward);
}

// ---- memory layout, pointers, scalars -----------------------------------------------------------
TEST(DeltaRuleValidation, NonContiguousLastDim) {
  expect_rejected("q", [](Call& c) {
    c.p.q = c.make(DType::f32, {2, 5, 1, 8});
    c.p.q.shape[3] = 4;
    c.p.q.stride[3] = 2;
  });
  expect_rejected("o", [](Call& c) {
    c.out.o = c.make(DType::f32, {2, 5, 2, 6});
    c.out.o.shape[3] = 3;
    c.out.o.stride[3] = 2;
  }, Which::forward);
}
TEST(DeltaRuleValidation, NullPointers) {
  expect_rejected("k", [](Call& c) { c.p.k.data = nullptr; });
  expect_rejected("beta", [](Call& c) { c.p.beta.data = nullptr; });
  expect_rejected("initial_state", [](Call& c) { c.p.initial_state.data = nullptr; });
  expect_rejected("o", [](Call& c) { c.out.o.data = nullptr; }, Which::forward);
  expect_rejected("dk", [](Call& c) { c.grads.dk.data = nullptr; }, Which::backward);
}
TEST(DeltaRuleValidation, MisalignedPointer) {
  expect_rejected("v", [](Call& c) { c.p.v.data = static_cast<char*>(c.p.v.data) + 1; });
}
TEST(DeltaRuleValidation, ScaleNotFinite) {
  expect_rejected("scale", [](Call& c) { c.p.scale = std::numeric_limits<float>::infinity(); });
  expect_rejected("scale", [](Call& c) { c.p.scale = -std::numeric_limits<float>::infinity(); });
}
TEST(DeltaRuleValidation, ExecutionOptions) {
  expect_rejected("exec.num_threads", [](Call& c) { c.p.exec.num_threads = -1; });
  expect_rejected("exec.precision", [](Call& c) { c.p.exec.precision = static_cast<Precision>(5); });
}
TEST(DeltaRuleValidation, NegativeStride) {
  expect_rejected("k", [](Call& c) { c.p.k.stride[1] = -c.p.k.stride[1]; });
}
TEST(DeltaRuleValidation, OutputAliasesCuSeqlens) {
  expect_rejected("o", [](Call& c) { c.out.o.data = c.p.cu_seqlens.data; }, Which::forward, varlen_case());
  expect_rejected("dbeta", [](Call& c) { c.grads.dbeta.data = c.p.cu_seqlens.data; }, Which::backward,
                  varlen_case());
}
TEST(DeltaRuleValidation, UnknownAlgorithm) {
  expect_rejected("algorithm", [](Call& c) { c.p.algorithm = static_cast<DeltaRuleAlgorithm>(7); });
}
TEST(DeltaRuleValidation, WorkspaceTooSmall) {
  Call call(base_case());
  call.p.algorithm = DeltaRuleAlgorithm::recurrent;
  const std::size_t need = delta_rule_workspace_bytes(call.p, Pass::backward);
  std::vector<double> buf(need / 8);
  try {
    delta_rule_backward(call.p, call.in, call.grads, Workspace{buf.data(), need / 2});
    ADD_FAILURE() << "a workspace of half the queried size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace") << e.what();
  }
  for (const HostTensor* t : {&call.g.dq, &call.g.dk, &call.g.dv, &call.g.dg, &call.g.dbeta, &call.g.dh0})
    EXPECT_TRUE(all_nan(*t));
}

}  // namespace
}  // namespace flashgrad::test
