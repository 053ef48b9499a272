// GPU tests of the chunked KDA stages (per-channel gates; src/cuda/delta_rule/chunked_kda.h), stage
// by stage against the CPU chunked reference's intermediates (src/reference/delta_rule/chunked.h,
// float64 on the same rounded inputs, one (sequence, value head) at a time), then end to end
// against flashgrad's CPU backend (fp32 recurrence, forward and backward). The stages are not yet
// dispatched by the public API; these tests call their launchers directly.
//
// Bars (relative RMS, rms(gpu - ref) / rms(ref), over every (sequence, value head) of a case):
//   stage 1: G (per channel) <= 1e-5, StrictLower(A), P (packed in A's upper triangle), w, u <= 5e-3
//   stage 2: h (entry states after the first) <= 5e-3, v_new, final state <= 5e-3; the first
//            chunk's entry state equals the initial state exactly
//   stage 3: o <= 5e-3
//   B1: dh (per chunk), dv_new, dh0 <= 8e-3
//   B2: dq, dk (before the L2-norm backward, summed over a group's value heads), dv <= 8e-3;
//       dbeta, dg (per channel) <= 2e-2
//   end to end (CPU recurrent fp32; the L2-norm backward of the GPU's dq, dk done on the host):
//       o, final state <= 5e-3; dq, dk, dv, dh0 <= 8e-3; dbeta, dg <= 2e-2 (the design doc's bars)
// Inputs as fla tests KDA: g = logsigmoid(x) / n per (token, head, channel) with n = 0.1 (strong
// decay, g down to about -20 per step), 1 or 10, 10% exact zeros, float32 or the input dtype;
// beta in (0, 1); non-zero initial state and dht (or none); HV = 2H; K != V; T not a multiple of
// 64; varlen with uneven lengths and an empty sequence. Every output and intermediate is poisoned
// with NaN (all-ones bytes) before the launches.
//
// Run on the GPU machine: ./tests/cpp/flashgrad_gpu_tests --gtest_filter='DeltaRuleChunkedKda*'
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/host_dtype.h"
#include "cuda/delta_rule/chunked_kda.h"
#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"
#include "chunked_gpu_test_util.h"
#include "gpu_test_util.h"
#include "reference/delta_rule/chunked.h"

namespace {

using flashgrad::test::round_to;
using namespace flashgrad::test::chunked;
namespace dr = flashgrad::cuda_detail::delta_rule;
namespace ref = flashgrad::reference::delta_rule;
using flashgrad::DType;
using flashgrad::TensorView;

// ---- a case and its host inputs -----------------------------------------------------------------
struct Case {
  std::string name;
  DType dtype = DType::bf16;
  int64_t B = 2, T = 64, H = 2, HV = 4, K = 128, V = 128;
  std::vector<int64_t> seq_lens;  // non-empty: varlen (B = 1)
  bool l2norm = true;
  bool g_f32 = true;      // g stored as float32 (else in the input dtype)
  bool states = true;     // initial_state and dht given (else null views, zeros in the references)
  float gate_div = 1.0f;  // g = logsigmoid(x) / gate_div
  uint64_t seed = 1;

  int64_t N() const { return seq_lens.empty() ? B : static_cast<int64_t>(seq_lens.size()); }
  int64_t Bt() const { return seq_lens.empty() ? B : 1; }
  int64_t Tt() const {
    if (seq_lens.empty()) return T;
    int64_t s = 0;
    for (int64_t l : seq_lens) s += l;
    return s;
  }
  std::vector<int64_t> cu() const {
    std::vector<int64_t> c;
    if (seq_lens.empty()) return c;
    c.push_back(0);
    for (int64_t l : seq_lens) c.push_back(c.back() + l);
    return c;
  }
  DType g_dtype() const { return g_f32 ? DType::f32 : dtype; }
};

struct Inputs {  // values rounded to their storage dtype; layouts as the op's tensors
  std::vector<float> q, k, v, g, beta, h0, dout, dht;
};

Inputs make_inputs(const Case& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int64_t rows = c.Bt() * c.Tt();
  Inputs x;
  auto fill = [&](std::vector<float>& dst, int64_t n, DType dt) {
    dst.resize(n);
    for (auto& e : dst) e = round_to(dt, nd(rng));
  };
  fill(x.q, rows * c.H * c.K, c.dtype);
  fill(x.k, rows * c.H * c.K, c.dtype);
  if (!c.l2norm) {  // fla's tests normalize k outside the op when the op does not
    for (int64_t r = 0; r < rows * c.H; ++r) {
      double ss = 0;
      for (int64_t e = 0; e < c.K; ++e) ss += double(x.k[r * c.K + e]) * x.k[r * c.K + e];
      for (int64_t e = 0; e < c.K; ++e) x.k[r * c.K + e] = round_to(c.dtype, x.k[r * c.K + e] / std::sqrt(ss));
    }
  }
  fill(x.v, rows * c.HV * c.V, c.dtype);
  x.g.resize(rows * c.HV * c.K);
  for (auto& e : x.g) {
    const float s = nd(rng);
    const float ls = std::min(s, 0.f) - std::log1p(std::exp(-std::fabs(s)));  // logsigmoid
    e = round_to(c.g_dtype(), ud(rng) < 0.1f ? 0.f : ls / c.gate_div);
  }
  x.beta.resize(rows * c.HV);
  for (auto& e : x.beta) e = round_to(c.dtype, 1.f / (1.f + std::exp(-nd(rng))));
  fill(x.h0, c.N() * c.HV * c.K * c.V, DType::f32);
  fill(x.dout, rows * c.HV * c.V, c.dtype);
  fill(x.dht, c.N() * c.HV * c.K * c.V, DType::f32);
  if (!c.states) {
    std::fill(x.h0.begin(), x.h0.end(), 0.f);
    std::fill(x.dht.begin(), x.dht.end(), 0.f);
  }
  return x;
}

// ---- comparisons: chunked_gpu_test_util.h (DevBuf, view_of, Pairs, expect_close) ----------------

// The CPU chunked reference's inputs for (sequence n, value head j), in float64.
ref::HeadInputs<double> head_inputs(const Case& c, const Inputs& x, int64_t row0, int64_t len, int64_t n,
                                    int64_t j) {
  const int64_t K = c.K, V = c.V, h = j / (c.HV / c.H);
  ref::HeadInputs<double> hi;
  hi.T = len, hi.K = K, hi.V = V;
  hi.scale = 1.0 / std::sqrt(double(K));
  hi.q.resize(len * K), hi.k.resize(len * K), hi.v.resize(len * V), hi.g.resize(len * K);
  hi.q_rstd.assign(len, 1.0), hi.k_rstd.assign(len, 1.0), hi.beta.resize(len);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t row = row0 + t;
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<float>& src = pass == 0 ? x.q : x.k;
      std::vector<double>& dst = pass == 0 ? hi.q : hi.k;
      double ss = 0;
      for (int64_t d = 0; d < K; ++d) ss += double(src[(row * c.H + h) * K + d]) * src[(row * c.H + h) * K + d];
      const double rstd = c.l2norm ? 1.0 / std::sqrt(ss + 1e-6) : 1.0;
      for (int64_t d = 0; d < K; ++d) dst[t * K + d] = src[(row * c.H + h) * K + d] * rstd;
    }
    for (int64_t e = 0; e < V; ++e) hi.v[t * V + e] = x.v[(row * c.HV + j) * V + e];
    for (int64_t d = 0; d < K; ++d) hi.g[t * K + d] = x.g[(row * c.HV + j) * K + d];
    hi.beta[t] = x.beta[row * c.HV + j];
  }
  hi.h0.resize(K * V);
  for (int64_t i = 0; i < K * V; ++i) hi.h0[i] = x.h0[(n * c.HV + j) * K * V + i];
  return hi;
}

struct CpuResult {
  std::vector<float> o, ht, dq, dk, dv, dg, dbeta, dh0;
};

// flashgrad's CPU backend (recurrent, fp32) on the same rounded inputs: forward and backward.
bool cpu_reference(const Case& c, const Inputs& x, CpuResult* R, std::string* why) {
  Inputs m = x;
  std::vector<int64_t> cu = c.cu();
  const int64_t B = c.Bt(), T = c.Tt(), N = c.N();
  auto cpu = [](std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return TensorView(v.data(), DType::f32, shape);
  };
  flashgrad::DeltaRuleParams p;
  p.q = cpu(m.q, {B, T, c.H, c.K});
  p.k = cpu(m.k, {B, T, c.H, c.K});
  p.v = cpu(m.v, {B, T, c.HV, c.V});
  p.g = cpu(m.g, {B, T, c.HV, c.K});
  p.beta = cpu(m.beta, {B, T, c.HV});
  if (c.states) p.initial_state = cpu(m.h0, {N, c.HV, c.K, c.V});
  if (!cu.empty()) p.cu_seqlens = TensorView(cu.data(), DType::i64, {N + 1});
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.algorithm = flashgrad::DeltaRuleAlgorithm::recurrent;
  p.exec.precision = flashgrad::Precision::fp32;
  R->o.assign(B * T * c.HV * c.V, 0.f);
  R->ht.assign(N * c.HV * c.K * c.V, 0.f);
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = cpu(R->o, {B, T, c.HV, c.V});
  out.final_state = cpu(R->ht, {N, c.HV, c.K, c.V});
  R->dq.assign(m.q.size(), 0.f), R->dk.assign(m.k.size(), 0.f), R->dv.assign(m.v.size(), 0.f);
  R->dg.assign(m.g.size(), 0.f), R->dbeta.assign(m.beta.size(), 0.f), R->dh0.assign(R->ht.size(), 0.f);
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = cpu(m.dout, {B, T, c.HV, c.V});
  if (c.states) in.dht = cpu(m.dht, {N, c.HV, c.K, c.V});
  flashgrad::DeltaRuleGrads gr;
  gr.dq = cpu(R->dq, {B, T, c.H, c.K});
  gr.dk = cpu(R->dk, {B, T, c.H, c.K});
  gr.dv = cpu(R->dv, {B, T, c.HV, c.V});
  gr.dg = cpu(R->dg, {B, T, c.HV, c.K});
  gr.dbeta = cpu(R->dbeta, {B, T, c.HV});
  if (c.states) gr.dh0 = cpu(R->dh0, {N, c.HV, c.K, c.V});
  try {
    flashgrad::delta_rule_forward(p, out);
    flashgrad::delta_rule_backward(p, in, gr);
  } catch (const flashgrad::Error& e) {
    *why = e.what();
    return false;
  }
  return true;
}

template <typename T>
void launch_stage(int stage, const dr::ChunkedArgs& a) {
  if (stage == 1) dr::launch_kda_prepare<T>(a, nullptr);
  if (stage == 2) dr::launch_kda_state<T>(a, nullptr);
  if (stage == 3) dr::launch_kda_output<T>(a, nullptr);
  if (stage == 4) dr::launch_kda_state_backward<T>(a, nullptr);
  if (stage == 5) dr::launch_kda_grads<T>(a, nullptr);
}

// Runs the five KDA stages on the GPU, compares each stage's outputs with the CPU chunked
// reference, then o, the final state and every gradient with the CPU backend.
void run_case(const Case& c) {
  const Inputs x = make_inputs(c);
  const int64_t B = c.Bt(), T = c.Tt(), N = c.N(), H = c.H, HV = c.HV, K = c.K, V = c.V;
  const int64_t rows = B * T;
  const dr::ChunkPlanHost plan = dr::make_chunk_plan(B, T, c.cu());
  const int64_t NC = static_cast<int64_t>(plan.chunks.size());

  DevBuf q(c.dtype, rows * H * K), k(c.dtype, rows * H * K), v(c.dtype, rows * HV * V), beta(c.dtype, rows * HV);
  DevBuf g(c.g_dtype(), rows * HV * K), h0(DType::f32, N * HV * K * V), o(c.dtype, rows * HV * V),
      ht(DType::f32, N * HV * K * V);
  q.upload(x.q), k.upload(x.k), v.upload(x.v), beta.upload(x.beta), h0.upload(x.h0), g.upload(x.g);
  DevBuf chunks(DType::i64, NC * static_cast<int64_t>(sizeof(dr::ChunkInfo) / 8)), first(DType::i64, N + 1);
  CUDA_OK(cudaMemcpy(chunks.p, plan.chunks.data(), sizeof(dr::ChunkInfo) * NC, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(first.p, plan.seq_first_chunk.data(), 8 * (N + 1), cudaMemcpyHostToDevice));
  const dr::ChunkedScratchSizes sz = dr::kda_scratch_sizes(rows, NC, HV, K, V);
  DevBuf G(DType::f32, sz.G), A(DType::f32, sz.A), w(c.dtype, sz.w), u(DType::f32, sz.u), vn(c.dtype, sz.v_new),
      h(DType::f32, sz.h);
  DevBuf dout(c.dtype, rows * HV * V), dht(DType::f32, N * HV * K * V), dh0(DType::f32, N * HV * K * V),
      dh(DType::f32, sz.h), dvn(DType::f32, sz.v_new);
  dout.upload(x.dout), dht.upload(x.dht);
  DevBuf dq_acc(DType::f32, rows * H * K), dk_acc(DType::f32, rows * H * K), dvb(DType::f32, rows * HV * V),
      dbb(DType::f32, rows * HV), dgb(DType::f32, dr::kda_dg_size(rows, HV, K));
  CUDA_OK(cudaMemset(dq_acc.p, 0, dq_acc.bytes()));
  CUDA_OK(cudaMemset(dk_acc.p, 0, dk_acc.bytes()));
  for (const DevBuf* b : {&q, &k, &v, &beta, &g, &h0, &o, &ht, &chunks, &first, &G, &A, &w, &u, &vn, &h, &dout,
                          &dht, &dh0, &dh, &dvn, &dq_acc, &dk_acc, &dvb, &dbb, &dgb})
    ASSERT_TRUE(b->p != nullptr || b->n == 0) << "cudaMalloc failed";

  dr::ChunkedArgs a;
  a.q = view_of(q, {B, T, H, K});
  a.k = view_of(k, {B, T, H, K});
  a.v = view_of(v, {B, T, HV, V});
  a.g = view_of(g, {B, T, HV, K});
  a.beta = view_of(beta, {B, T, HV});
  if (c.states) a.h0 = view_of(h0, {N, HV, K, V});
  a.o = view_of(o, {B, T, HV, V});
  a.ht = view_of(ht, {N, HV, K, V});
  a.chunks = static_cast<const dr::ChunkInfo*>(chunks.p);
  a.seq_first_chunk = static_cast<const int64_t*>(first.p);
  a.num_chunks = NC, a.num_seqs = N;
  a.uniform_chunks = plan.uniform_chunks;  // (as the path: uniform batches' entries computed, varlen's read)
  a.G = G.f32(), a.A = A.f32(), a.w = w.p, a.u = u.f32(), a.v_new = vn.p, a.h = h.f32();
  a.T = T, a.H = H, a.HV = HV, a.K = K, a.V = V;
  a.scale = static_cast<float>(1.0 / std::sqrt(double(K)));
  a.l2norm = c.l2norm;
  a.dout = view_of(dout, {B, T, HV, V});
  if (c.states) a.dht = view_of(dht, {N, HV, K, V});
  a.dh0 = view_of(dh0, {N, HV, K, V});
  a.dh = dh.f32(), a.dv_new = dvn.f32();
  a.dq_acc = dq_acc.f32(), a.dk_acc = dk_acc.f32(), a.dv = dvb.f32(), a.dbeta = dbb.f32(), a.dg = dgb.f32();

  for (int stage = 1; stage <= 5; ++stage) {
    if (c.dtype == DType::bf16)
      ASSERT_NO_THROW(launch_stage<__nv_bfloat16>(stage, a)) << "stage " << stage;
    else
      ASSERT_NO_THROW(launch_stage<__half>(stage, a)) << "stage " << stage;
    CUDA_OK(cudaDeviceSynchronize());
  }
  const std::vector<double> Gd = G.download(), Ad = A.download(), wd = w.download(), ud = u.download(),
                            vnd = vn.download(), hd = h.download(), od = o.download(), htd = ht.download(),
                            dhd = dh.download(), dvnd = dvn.download(), dh0d = dh0.download(),
                            dqd = dq_acc.download(), dkd = dk_acc.download(), dvd = dvb.download(),
                            dbd = dbb.download(), dgd = dgb.download();

  Pairs pG, pA, pP, pw, pu, pvn, ph, pht, po, pdh, pdvn, pdh0, pdq, pdk, pdv, pdb, pdg;
  std::vector<double> rdq(rows * H * K, 0.0), rdk(rows * H * K, 0.0);  // reference, summed over groups
  double h_entry_mismatch = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = plan.seq_b[n], t0 = plan.seq_t0[n], len = plan.seq_len[n], c0 = plan.seq_first_chunk[n];
    const int64_t row0 = b * T + t0;
    for (int64_t j = 0; j < HV; ++j) {
      const ref::HeadInputs<double> hi = head_inputs(c, x, row0, len, n, j);
      std::vector<double> dO(len * V), dHT(K * V);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < V; ++e) dO[t * V + e] = x.dout[((row0 + t) * HV + j) * V + e];
      for (int64_t e = 0; e < K * V; ++e) dHT[e] = x.dht[(n * HV + j) * K * V + e];
      ref::ChunkedForwardTrace<double> f;
      ref::ChunkedBackwardTrace<double> bt;
      ref::chunked_backward_head(hi, dO, dHT, f, bt);  // runs the forward too (fills f)
      for (int64_t cc = 0; cc < f.num_chunks; ++cc)
        for (int64_t e = 0; e < K * V; ++e) {
          pdh.add(dhd[((c0 + cc) * HV + j) * K * V + e], bt.dh[(cc + 1) * K * V + e]);
          const double got = hd[((c0 + cc) * HV + j) * K * V + e], want = f.h[cc * K * V + e];
          if (cc == 0)
            h_entry_mismatch = std::max(h_entry_mismatch, std::isnan(got) ? 1e300 : std::fabs(got - want));
          else
            ph.add(got, want);
        }
      for (int64_t e = 0; e < K * V; ++e) {
        pdh0.add(dh0d[(n * HV + j) * K * V + e], bt.dh[e]);
        pht.add(htd[(n * HV + j) * K * V + e], f.h[f.num_chunks * K * V + e]);
      }
      const int64_t qk_head = j / (HV / H);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = row0 + t, ci = t / 64, i = t % 64;
        for (int64_t d = 0; d < K; ++d) {
          rdq[(row * H + qk_head) * K + d] += bt.dq[t * K + d];
          rdk[(row * H + qk_head) * K + d] += bt.dk[t * K + d];
          pG.add(Gd[(row * HV + j) * K + d], f.G[t * K + d]);
          pw.add(wd[(row * HV + j) * K + d], f.w[t * K + d]);
          pdg.add(dgd[(row * HV + j) * K + d], bt.dg[t * K + d]);
        }
        for (int64_t jj = 0; jj < i; ++jj) pA.add(Ad[(row * HV + j) * 64 + jj], f.A[(ci * 64 + i) * 64 + jj]);
        for (int64_t jj = 0; jj <= i; ++jj) {  // P_{i,jj}, packed at row jj, column i (chunked_kda.h)
          const int64_t tj = ci * 64 + jj;
          double p = 0;
          for (int64_t d = 0; d < K; ++d)
            p += hi.q[t * K + d] * hi.k[tj * K + d] * std::exp(f.G[t * K + d] - f.G[tj * K + d]);
          pP.add(Ad[((row0 + tj) * HV + j) * 64 + i], p);
        }
        for (int64_t e = 0; e < V; ++e) {
          const int64_t at = (row * HV + j) * V + e;
          pu.add(ud[at], f.u[t * V + e]);
          pvn.add(vnd[at], f.v_new[t * V + e]);
          po.add(od[at], f.o[t * V + e]);
          pdvn.add(dvnd[at], bt.dv_new[t * V + e]);
          pdv.add(dvd[at], bt.dv[t * V + e]);
        }
        pdb.add(dbd[row * HV + j], bt.dbeta[t]);
      }
    }
  }
  expect_close("G", pG, 1e-5, c.name);
  expect_close("A (strict)", pA, 5e-3, c.name);
  expect_close("P (packed)", pP, 5e-3, c.name);
  expect_close("w", pw, 5e-3, c.name);
  expect_close("u", pu, 5e-3, c.name);
  expect_close("h (c >= 1)", ph, 5e-3, c.name);
  EXPECT_EQ(h_entry_mismatch, 0.0) << c.name << ": the first chunk's entry state is not the initial state";
  expect_close("v_new", pvn, 5e-3, c.name);
  expect_close("final h", pht, 5e-3, c.name);
  expect_close("o", po, 5e-3, c.name);
  expect_close("dh", pdh, 8e-3, c.name);
  expect_close("dv_new", pdvn, 8e-3, c.name);
  expect_close("dh0", pdh0, 8e-3, c.name);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row0 = plan.seq_b[n] * T + plan.seq_t0[n];
    for (int64_t t = 0; t < plan.seq_len[n]; ++t)
      for (int64_t e = 0; e < H * K; ++e) {
        const int64_t at = (row0 + t) * H * K + e;
        pdq.add(dqd[at], rdq[at]);
        pdk.add(dkd[at], rdk[at]);
      }
  }
  expect_close("dq (pre-norm)", pdq, 8e-3, c.name);
  expect_close("dk (pre-norm)", pdk, 8e-3, c.name);
  expect_close("dv", pdv, 8e-3, c.name);
  expect_close("dbeta", pdb, 2e-2, c.name);
  expect_close("dg", pdg, 2e-2, c.name);

  // End to end against flashgrad's CPU backend (recurrent, fp32).
  CpuResult R;
  std::string why;
  ASSERT_TRUE(cpu_reference(c, x, &R, &why)) << "CPU delta_rule_forward / backward failed: " << why;
  const std::vector<double> dq_gpu = c.l2norm ? l2norm_backward_rows(x.q, dqd, K) : dqd;
  const std::vector<double> dk_gpu = c.l2norm ? l2norm_backward_rows(x.k, dkd, K) : dkd;
  auto vs_cpu = [&](const char* what, const std::vector<double>& got, const std::vector<float>& want, double bar) {
    Pairs p;
    for (std::size_t i = 0; i < want.size(); ++i) p.add(got[i], want[i]);
    expect_close(what, p, bar, c.name);
  };
  vs_cpu("o vs CPU", od, R.o, 5e-3);
  vs_cpu("ht vs CPU", htd, R.ht, 5e-3);
  vs_cpu("dq vs CPU", dq_gpu, R.dq, 8e-3);
  vs_cpu("dk vs CPU", dk_gpu, R.dk, 8e-3);
  vs_cpu("dv vs CPU", dvd, R.dv, 8e-3);
  vs_cpu("dbeta vs CPU", dbd, R.dbeta, 2e-2);
  vs_cpu("dg vs CPU", dgd, R.dg, 2e-2);
  if (c.states) vs_cpu("dh0 vs CPU", dh0d, R.dh0, 8e-3);
}

// ---- tests that need no GPU (the launchers refuse before touching the device) ------------------
TEST(DeltaRuleChunkedKdaPlan, RefusesWhatTheStagesDoNotTake) {
  EXPECT_TRUE(dr::kda_stages_support(DType::bf16, 128, 128).empty());
  EXPECT_TRUE(dr::kda_stages_support(DType::f16, 64, 256).empty());
  EXPECT_NE(dr::kda_stages_support(DType::f32, 64, 64).find("bfloat16 or float16"), std::string::npos);
  EXPECT_NE(dr::kda_stages_support(DType::bf16, 256, 64).find("K = 256"), std::string::npos);
  EXPECT_NE(dr::kda_stages_support(DType::bf16, 64, 96).find("V = 96"), std::string::npos);
  dr::ChunkedArgs a;  // K, V fine but no gate: refused with the argument's name
  a.K = 64, a.V = 64;
  try {
    dr::launch_kda_prepare<__nv_bfloat16>(a, nullptr);
    ADD_FAILURE() << "launch_kda_prepare took a call without a gate";
  } catch (const flashgrad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'g'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dr::kda_scratch_sizes(100, 2, 4, 128, 64).G, 100 * 4 * 128);
}

// ---- GPU cases ---------------------------------------------------------------------------------------
TEST(DeltaRuleChunkedKdaGpu, Bf16K128AllLengths) {
  REQUIRE_GPU();
  for (int64_t T : {1, 63, 64, 75, 500}) {
    Case c;
    c.name = "kda bf16 K=V=128 T=" + std::to_string(T);
    c.T = T;
    c.B = T == 500 ? 1 : 2;
    c.gate_div = T == 75 ? 0.1f : (T == 500 ? 10.f : 1.f);  // strong and weak decay
    c.seed = 2000 + T;
    run_case(c);
  }
}

TEST(DeltaRuleChunkedKdaGpu, F16StrongDecayGateInInputDtype) {
  REQUIRE_GPU();
  for (int64_t T : {63, 500}) {
    Case c;
    c.name = "kda f16 K=V=64 n=0.1 g f16 T=" + std::to_string(T);
    c.dtype = DType::f16;
    c.T = T, c.B = 1, c.K = 64, c.V = 64;
    c.gate_div = 0.1f;
    c.g_f32 = false;
    c.seed = 2100 + T;
    run_case(c);
  }
}

TEST(DeltaRuleChunkedKdaGpu, KeyNotValue) {
  REQUIRE_GPU();
  struct Shape {
    DType dt;
    int64_t K, V;
  };
  for (const Shape s : {Shape{DType::bf16, 64, 128}, Shape{DType::f16, 128, 64}, Shape{DType::bf16, 64, 256},
                        Shape{DType::f16, 128, 192}}) {
    Case c;
    c.name = std::string("kda ") + (s.dt == DType::bf16 ? "bf16" : "f16") + " K=" + std::to_string(s.K) +
             " V=" + std::to_string(s.V) + " T=200";
    c.dtype = s.dt;
    c.B = 1, c.T = 200, c.K = s.K, c.V = s.V;
    c.gate_div = 0.1f;
    c.seed = 2200 + s.K + s.V;
    run_case(c);
  }
}

TEST(DeltaRuleChunkedKdaGpu, VarlenUnevenLengths) {
  REQUIRE_GPU();
  for (int64_t K : {64, 128}) {
    Case c;
    c.name = "varlen kda bf16 K=" + std::to_string(K) + " V=128";
    c.B = 1, c.K = K, c.V = 128;
    c.seq_lens = {1, 63, 136, 0, 300, 75, 64};
    c.gate_div = 0.1f;
    c.seed = 2300 + K;
    run_case(c);
  }
}

TEST(DeltaRuleChunkedKdaGpu, NoStatesNoNormF16) {
  REQUIRE_GPU();
  Case c;
  c.name = "kda f16 K=V=128 T=130 no h0/dht, no norm";
  c.dtype = DType::f16;
  c.B = 1, c.T = 130;
  c.states = false;
  c.l2norm = false;
  c.seed = 2400;
  run_case(c);
}

}  // namespace
