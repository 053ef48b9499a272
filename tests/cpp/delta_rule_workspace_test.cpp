// Memory of the recurrent backward: per worker O(K*V) plus r/dr and (HV == H) dk's first part
// for the steps of the item it is on; with GVA also two tensors of k per value head (the dk, dq
// partials summed over a q/k head's value heads). Never proportional to T*K*V. And
// caller-provided workspace gives the same bits as the backend's own.
#include <gtest/gtest.h>

#include <vector>

#include "delta_rule_test_util.h"

namespace flashgrad::test {
namespace {

DeltaRuleParams shape_only_params(std::vector<HostTensor>& keep, int64_t T, int64_t H, int64_t HV, int64_t K,
                                  int64_t V, int threads) {
  // The query reads only shapes, but validation wants real (allocated) tensors; `keep` owns them.
  keep.clear();
  keep.emplace_back(DType::f32, std::vector<int64_t>{1, T, H, K});
  keep.emplace_back(DType::f32, std::vector<int64_t>{1, T, H, K});
  keep.emplace_back(DType::f32, std::vector<int64_t>{1, T, HV, V});
  keep.emplace_back(DType::f32, std::vector<int64_t>{1, T, HV});
  keep.emplace_back(DType::f32, std::vector<int64_t>{1, T, HV});
  DeltaRuleParams p;
  p.q = keep[0].view();
  p.k = keep[1].view();
  p.v = keep[2].view();
  p.g = keep[3].view();
  p.beta = keep[4].view();
  p.algorithm = DeltaRuleAlgorithm::recurrent;
  p.exec.num_threads = threads;
  return p;
}

TEST(DeltaRuleWorkspace, RecurrentBackwardIsOKVPerWorkerNotTKV) {
  const int64_t T = 4096, H = 2, HV = 4, K = 64, V = 64;  // GVA: two value heads per q/k head
  const int workers = 2;
  std::vector<HostTensor> keep;
  const DeltaRuleParams p = shape_only_params(keep, T, H, HV, K, V, workers);
  const std::size_t bwd = delta_rule_workspace_bytes(p, Pass::backward);
  const std::size_t fwd = delta_rule_workspace_bytes(p, Pass::forward);
  const std::size_t f = sizeof(float);
  // Per worker: S and dS (2*K*V), a few K- and V-vectors, r/dr of one item's steps [T, V];
  // shared: the dk, dq partials [T, HV, K]; 64 bytes of alignment slack.
  const std::size_t per_worker_bound = (2 * K * V + 8 * (K + V) + T * V) * f;
  const std::size_t shared_bound = T * HV * 2 * K * f;
  EXPECT_LE(bwd, workers * per_worker_bound + shared_bound + 64);
  // Materialized per-step states would be T*HV*K*V floats: 25x more than this here.
  EXPECT_LT(bwd, T * HV * K * V * f / 16);
  // The forward needs no T-sized buffer at all.
  EXPECT_LE(fwd, workers * (K * V + 8 * (K + V)) * f + 64);

  // Growth with T is exactly the partials and each worker's r/dr rows.
  const DeltaRuleParams p2 = shape_only_params(keep, 2 * T, H, HV, K, V, workers);
  EXPECT_EQ(delta_rule_workspace_bytes(p2, Pass::backward) - bwd, T * (2 * HV * K + workers * V) * f);
  EXPECT_EQ(delta_rule_workspace_bytes(p2, Pass::forward), fwd);
  std::cout << "  T=4096 H=2 HV=4 K=V=64, 2 workers: backward workspace " << bwd << " bytes, forward " << fwd
            << " bytes; per-step states would take " << T * HV * K * V * f << " bytes\n";
}

// Without GVA nothing is shared: each worker keeps r/dr and dk's first part for the steps of the
// item it is on (dq and dk of a step are finished in pass 2 and written directly), so the
// workspace does not grow with the number of heads or sequences.
TEST(DeltaRuleWorkspace, RecurrentBackwardWithoutGvaIsPerWorkerOnly) {
  const int64_t T = 4096, H = 4, K = 64, V = 64;
  const int workers = 2;
  std::vector<HostTensor> keep;
  const DeltaRuleParams p = shape_only_params(keep, T, H, H, K, V, workers);
  const std::size_t bwd = delta_rule_workspace_bytes(p, Pass::backward);
  const std::size_t f = sizeof(float);
  const std::size_t per_worker_bound = (2 * K * V + 8 * (K + V) + T * (V + K)) * f;
  EXPECT_LE(bwd, workers * per_worker_bound + 64);
  const DeltaRuleParams p2 = shape_only_params(keep, 2 * T, H, H, K, V, workers);
  EXPECT_EQ(delta_rule_workspace_bytes(p2, Pass::backward) - bwd, workers * T * (V + K) * f);
  const DeltaRuleParams p8 = shape_only_params(keep, T, 2 * H, 2 * H, K, V, workers);
  EXPECT_EQ(delta_rule_workspace_bytes(p8, Pass::backward), bwd);  // twice the heads, same memory
  std::cout << "  T=4096 H=HV=4 K=V=64, 2 workers: backward workspace " << bwd << " bytes\n";
}

// With packed sequences the per-item rows are sized by the longest sequence, not the total.
TEST(DeltaRuleWorkspace, RecurrentBackwardVarlenSizedByLongestSequence) {
  const int64_t T = 1000, H = 2, K = 8, V = 4;
  const int workers = 2;
  std::vector<HostTensor> keep;
  DeltaRuleParams p = shape_only_params(keep, T, H, H, K, V, workers);
  const HostTensor cu = int32_tensor({0, 300, 300, 1000});  // longest: 700 steps
  p.cu_seqlens = cu.view();
  const std::size_t f = sizeof(float);
  const std::size_t packed = delta_rule_workspace_bytes(p, Pass::backward);
  const DeltaRuleParams single = shape_only_params(keep, 700, H, H, K, V, workers);
  EXPECT_EQ(packed, delta_rule_workspace_bytes(single, Pass::backward));
  EXPECT_LT(packed, workers * T * (V + K) * f);
}

void expect_caller_workspace_gives_same_bits(int64_t H, int64_t HV) {
  auto rng = make_rng();
  DeltaCase c;
  c.B = 2;
  c.T = 70;
  c.H = H;
  c.HV = HV;
  c.K = 8;
  c.V = 6;
  c.gate = GateKind::per_channel;
  c.l2norm = true;
  c.dtype = DType::bf16;
  c.gate_dtype = DType::f32;
  c.precision = Precision::fp32;
  c.threads = 2;
  DeltaData d(c, rng);
  const DeltaRuleParams p = d.params();
  const DeltaForward f_own = run_forward(d, p);
  const DeltaGrads g_own = run_backward(d, p);

  const std::size_t fb = delta_rule_workspace_bytes(p, Pass::forward);
  const std::size_t bb = delta_rule_workspace_bytes(p, Pass::backward);
  // Deliberately misaligned start (4 bytes past an 8-byte boundary): the backend aligns it up.
  std::vector<double> buf(std::max(fb, bb) / 8 + 2, std::nan(""));
  Workspace ws_f{reinterpret_cast<char*>(buf.data()) + 4, fb};
  Workspace ws_b{reinterpret_cast<char*>(buf.data()) + 4, bb};
  DeltaForward f;
  f.o = HostTensor(c.dtype, {c.B, c.T, c.HV, c.V});
  f.final_state = HostTensor(DType::f32, d.state_shape());
  DeltaRuleForwardOutputs out;
  out.o = f.o.view();
  out.final_state = f.final_state.view();
  delta_rule_forward(p, out, ws_f);
  DeltaGrads g = make_grads(d);
  delta_rule_backward(p, backward_inputs(d), grad_views(d, g), ws_b);
  EXPECT_TRUE(same_bits(f.o, f_own.o));
  EXPECT_TRUE(same_bits(f.final_state, f_own.final_state));
  for (const GradPair& x : grad_pairs(g, g_own, c.gate)) EXPECT_TRUE(same_bits(x.a, x.b)) << x.name;
}

TEST(DeltaRuleWorkspace, CallerWorkspaceGivesSameBitsGva) { expect_caller_workspace_gives_same_bits(1, 2); }
TEST(DeltaRuleWorkspace, CallerWorkspaceGivesSameBitsWithoutGva) { expect_caller_workspace_gives_same_bits(2, 2); }

}  // namespace
}  // namespace flashgrad::test
