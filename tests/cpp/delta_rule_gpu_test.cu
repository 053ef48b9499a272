// GPU tests of the CUDA gated delta rule (GDN, KDA, plain delta rule), forward and backward,
// against flashgrad's CPU backend in fp32 (the recurrence; delta_rule_* on CPU tensors). A float64
// recurrence written here from docs/delta_rule.md's equations is checked against that backend
// (DeltaRuleGpuReference, no GPU needed) and stands in if the backend is a stub.
// Bars: fla's relative RMS, rms(x - ref) / rms(ref):
//   o, final_state <= 0.005; dq, dk, dv, dh0 <= 0.008; dbeta, dg <= 0.02.
// Inputs as fla tests them: g = logsigmoid(x) / n (n from 0.1 to 10) with some g exactly 0,
// beta in (0, 1), a non-zero initial state, random dout and dht. Every output is poisoned with
// NaN before each call, so an element the kernels forget fails the comparison.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/host_dtype.h"
#include "cuda/delta_rule/chunked_stages.h"
#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"
#include "gpu_test_util.h"

namespace {

using flashgrad::test::EnvSet;
using flashgrad::test::round_to;

using flashgrad::DType;
using flashgrad::GateKind;
using flashgrad::TensorView;




// ---- the problem and its host data ---------------------------------------------------------
struct Case {
  std::string name;
  DType dtype = DType::bf16;
  int64_t B = 1, T = 64, H = 2, HV = 2, K = 64, V = 64;
  GateKind gate = GateKind::scalar;
  std::vector<int64_t> seq_lens;  // non-empty: varlen (B must be 1)
  bool cu_int64 = false;
  bool gate_f32 = true, beta_f32 = false;  // g / beta storage: float32 or the inputs' dtype
  DType saved_r = DType::f32;              // f32, the inputs' dtype, or i32 = "pass none"
  bool l2norm = true;
  bool h0 = true;
  float gate_div = 1.0f;  // g = logsigmoid(x) / gate_div
  int64_t pad = 0;        // strided q, k, v, dout, o, r, dq, dk, dv: rows padded by this many elements
  flashgrad::DeltaRuleAlgorithm algorithm = flashgrad::DeltaRuleAlgorithm::recurrent;
  bool keep_v_new = false;  // pass saved_v_new (chunked algorithm, GDN / plain): forward writes it, backward reads it
  bool exact_workspace = false;  // each call gets exactly delta_rule_workspace_bytes of workspace (GuardedWorkspace)
  uint64_t seed = 1;

  int64_t N() const { return seq_lens.empty() ? B : static_cast<int64_t>(seq_lens.size()); }
  int64_t Ttot() const {
    if (seq_lens.empty()) return T;
    int64_t s = 0;
    for (int64_t l : seq_lens) s += l;
    return s;
  }
  int64_t g_inner() const { return gate == GateKind::per_channel ? K : 1; }
};

struct HostData {  // values already rounded to their storage dtype
  std::vector<float> q, k, v, g, beta, h0, dout, dht;
  std::vector<int64_t> cu;  // [N+1]
};

HostData make_data(const Case& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int64_t Bt = c.B * c.Ttot();
  HostData d;
  auto fill = [&](std::vector<float>& x, int64_t n, DType dt, float mul) {
    x.resize(n);
    for (auto& e : x) e = round_to(dt, nd(rng) * mul);
  };
  fill(d.q, Bt * c.H * c.K, c.dtype, 1.f);
  fill(d.k, Bt * c.H * c.K, c.dtype, 1.f);
  if (!c.l2norm) {  // fla's tests normalize k outside the op when the op does not
    for (int64_t r = 0; r < Bt * c.H; ++r) {
      double ss = 0;
      for (int64_t e = 0; e < c.K; ++e) ss += double(d.k[r * c.K + e]) * d.k[r * c.K + e];
      for (int64_t e = 0; e < c.K; ++e) d.k[r * c.K + e] = round_to(c.dtype, d.k[r * c.K + e] / std::sqrt(ss));
    }
  }
  fill(d.v, Bt * c.HV * c.V, c.dtype, 1.f);
  if (c.gate != GateKind::none) {
    d.g.resize(Bt * c.HV * c.g_inner());
    for (auto& e : d.g) {
      const float x = nd(rng);
      const float ls = std::min(x, 0.f) - std::log1p(std::exp(-std::fabs(x)));  // logsigmoid
      e = ud(rng) < 0.1f ? 0.f : round_to(c.gate_f32 ? DType::f32 : c.dtype, ls / c.gate_div);
    }
  }
  d.beta.resize(Bt * c.HV);
  for (auto& e : d.beta) e = round_to(c.beta_f32 ? DType::f32 : c.dtype, 1.f / (1.f + std::exp(-nd(rng))));
  if (c.h0) fill(d.h0, c.N() * c.HV * c.K * c.V, DType::f32, 1.f);
  fill(d.dout, Bt * c.HV * c.V, c.dtype, 1.f);
  fill(d.dht, c.N() * c.HV * c.K * c.V, DType::f32, 1.f);
  d.cu.push_back(0);
  if (c.seq_lens.empty())
    for (int64_t b = 0; b < c.B; ++b) d.cu.push_back(d.cu.back() + c.T);
  else
    for (int64_t l : c.seq_lens) d.cu.push_back(d.cu.back() + l);
  return d;
}

// ---- float64 reference: recurrence, two-pass backward, closed-form dg (docs/delta_rule.md) ----
struct RefOut {
  std::vector<double> o, ht, dq, dk, dv, dg, dbeta, dh0;
};

// Token row of sequence n step t in the [B, T] layout: padded rows are b * T + t; varlen packs.
RefOut reference(const Case& c, const HostData& d) {
  const int64_t K = c.K, V = c.V, H = c.H, HV = c.HV, N = c.N(), G = HV / H;
  const int64_t Tt = c.Ttot();
  const double scale = 1.0 / std::sqrt(double(K));
  RefOut R;
  R.o.assign(c.B * Tt * HV * V, 0);
  R.ht.assign(N * HV * K * V, 0);
  R.dq.assign(c.B * Tt * H * K, 0);
  R.dk.assign(c.B * Tt * H * K, 0);
  R.dv.assign(c.B * Tt * HV * V, 0);
  R.dg.assign(c.B * Tt * HV * c.g_inner(), 0);
  R.dbeta.assign(c.B * Tt * HV, 0);
  R.dh0.assign(N * HV * K * V, 0);
  auto work = [&](int64_t n, int64_t j) {
    const int64_t h = j / G;
    const int64_t row0 = c.seq_lens.empty() ? n * Tt : d.cu[n];  // first token row
    const int64_t len = c.seq_lens.empty() ? Tt : d.cu[n + 1] - d.cu[n];
    std::vector<double> q(len * K), k(len * K), rq(len), rk(len), dec(len * K), gl(len * K), v(len * V),
        r(len * V), beta(len), dv(len * V), dqn(len * K), dkn(len * K), P(len * K);
    for (int64_t t = 0; t < len; ++t) {
      const int64_t row = row0 + t;
      double sq = 0, sk = 0;
      for (int64_t e = 0; e < K; ++e) {
        q[t * K + e] = d.q[(row * H + h) * K + e];
        k[t * K + e] = d.k[(row * H + h) * K + e];
        sq += q[t * K + e] * q[t * K + e];
        sk += k[t * K + e] * k[t * K + e];
      }
      rq[t] = c.l2norm ? 1 / std::sqrt(sq + 1e-6) : 1;
      rk[t] = c.l2norm ? 1 / std::sqrt(sk + 1e-6) : 1;
      for (int64_t e = 0; e < K; ++e) {
        q[t * K + e] *= rq[t];
        k[t * K + e] *= rk[t];
        const double g = c.gate == GateKind::none ? 0
                         : c.gate == GateKind::scalar ? d.g[row * HV + j]
                                                      : d.g[(row * HV + j) * K + e];
        gl[t * K + e] = g;
        dec[t * K + e] = std::exp(g);
      }
      for (int64_t e = 0; e < V; ++e) v[t * V + e] = d.v[(row * HV + j) * V + e];
      beta[t] = d.beta[row * HV + j];
    }
    std::vector<double> S(K * V), h0(K * V, 0), dht(K * V);
    for (int64_t i = 0; i < K * V; ++i) {
      if (c.h0) h0[i] = d.h0[(n * HV + j) * K * V + i];
      dht[i] = d.dht[(n * HV + j) * K * V + i];
    }
    // forward
    S = h0;
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) S[a * V + b] *= dec[t * K + a];
      for (int64_t b = 0; b < V; ++b) {
        double p = 0;
        for (int64_t a = 0; a < K; ++a) p += S[a * V + b] * k[t * K + a];
        r[t * V + b] = v[t * V + b] - p;
      }
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) S[a * V + b] += k[t * K + a] * beta[t] * r[t * V + b];
      for (int64_t b = 0; b < V; ++b) {
        double p = 0;
        for (int64_t a = 0; a < K; ++a) p += S[a * V + b] * q[t * K + a];
        R.o[((row0 + t) * HV + j) * V + b] = scale * p;
      }
    }
    for (int64_t i = 0; i < K * V; ++i) R.ht[(n * HV + j) * K * V + i] = S[i];
    const std::vector<double> ST = S;
    // pass 1, reverse
    std::vector<double> dS = dht, du(V);
    for (int64_t t = len - 1; t >= 0; --t) {
      const int64_t row = row0 + t;
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) dS[a * V + b] += scale * q[t * K + a] * d.dout[(row * HV + j) * V + b];
      double db = 0;
      for (int64_t b = 0; b < V; ++b) {
        double p = 0;
        for (int64_t a = 0; a < K; ++a) p += dS[a * V + b] * k[t * K + a];
        du[b] = p;
        dv[t * V + b] = beta[t] * p;
        db += p * r[t * V + b];
      }
      R.dbeta[row * HV + j] = db;
      for (int64_t a = 0; a < K; ++a) {
        double p = 0;
        for (int64_t b = 0; b < V; ++b) p += dS[a * V + b] * beta[t] * r[t * V + b];
        dkn[t * K + a] = p;
      }
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) dS[a * V + b] = dec[t * K + a] * (dS[a * V + b] - k[t * K + a] * dv[t * V + b]);
    }
    for (int64_t i = 0; i < K * V; ++i) R.dh0[(n * HV + j) * K * V + i] = dS[i];
    // pass 2, forward
    S = h0;
    for (int64_t t = 0; t < len; ++t) {
      const int64_t row = row0 + t;
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) S[a * V + b] *= dec[t * K + a];
      for (int64_t a = 0; a < K; ++a) {
        double p = 0;
        for (int64_t b = 0; b < V; ++b) p += S[a * V + b] * dv[t * V + b];
        P[t * K + a] = p;
        dkn[t * K + a] -= p;
      }
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) S[a * V + b] += k[t * K + a] * beta[t] * r[t * V + b];
      for (int64_t a = 0; a < K; ++a) {
        double p = 0;
        for (int64_t b = 0; b < V; ++b) p += S[a * V + b] * d.dout[(row * HV + j) * V + b];
        dqn[t * K + a] = scale * p;
      }
    }
    for (int64_t t = 0; t < len; ++t)
      for (int64_t e = 0; e < V; ++e) R.dv[((row0 + t) * HV + j) * V + e] = dv[t * V + e];
    // gate gradient: reverse cumulative sum of the per-step terms + the final-state term
    if (c.gate == GateKind::scalar) {
      double acc = 0;
      for (int64_t i = 0; i < K * V; ++i) acc += ST[i] * dht[i];
      for (int64_t t = len - 1; t >= 0; --t) {
        double qdq = 0, kdk = 0, vdv = 0;
        for (int64_t a = 0; a < K; ++a) {
          qdq += q[t * K + a] * dqn[t * K + a];
          kdk += k[t * K + a] * dkn[t * K + a];
        }
        for (int64_t b = 0; b < V; ++b) vdv += v[t * V + b] * dv[t * V + b];
        acc += qdq - kdk + 2 * (beta[t] * R.dbeta[(row0 + t) * HV + j] - vdv);
        R.dg[(row0 + t) * HV + j] = acc;
      }
    } else if (c.gate == GateKind::per_channel) {
      for (int64_t a = 0; a < K; ++a) {
        double acc = 0;
        for (int64_t b = 0; b < V; ++b) acc += ST[a * V + b] * dht[a * V + b];
        for (int64_t t = len - 1; t >= 0; --t) {
          acc += q[t * K + a] * dqn[t * K + a] - k[t * K + a] * dkn[t * K + a] - 2 * k[t * K + a] * P[t * K + a];
          R.dg[((row0 + t) * HV + j) * K + a] = acc;
        }
      }
    }
    // L2-norm backward per value head (linear in dy, so summing heads afterwards is the same)
    for (int64_t t = 0; t < len; ++t) {
      for (int pass = 0; pass < 2; ++pass) {
        const double* y = pass == 0 ? &q[t * K] : &k[t * K];
        double* dy = pass == 0 ? &dqn[t * K] : &dkn[t * K];
        const double rs = pass == 0 ? rq[t] : rk[t];
        if (c.l2norm) {
          double dot = 0;
          for (int64_t a = 0; a < K; ++a) dot += dy[a] * y[a];
          for (int64_t a = 0; a < K; ++a) dy[a] = rs * (dy[a] - dot * y[a]);
        }
      }
    }
    return std::make_pair(std::move(dqn), std::move(dkn));
  };
  // Parallel over (sequence, value head); dq / dk summed over a group's value heads afterwards,
  // in a fixed order.
  const int64_t jobs = N * HV;
  std::vector<std::pair<std::vector<double>, std::vector<double>>> qk(jobs);
  const unsigned nthreads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 32));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < nthreads; ++w)
    pool.emplace_back([&, w] {
      for (int64_t job = w; job < jobs; job += nthreads) qk[job] = work(job / HV, job % HV);
    });
  for (auto& th : pool) th.join();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row0 = c.seq_lens.empty() ? n * Tt : d.cu[n];
    const int64_t len = c.seq_lens.empty() ? Tt : d.cu[n + 1] - d.cu[n];
    for (int64_t j = 0; j < HV; ++j) {
      const auto& [dqn, dkn] = qk[n * HV + j];
      const int64_t h = j / G;
      for (int64_t t = 0; t < len; ++t)
        for (int64_t a = 0; a < K; ++a) {
          R.dq[((row0 + t) * H + h) * K + a] += dqn[t * K + a];
          R.dk[((row0 + t) * H + h) * K + a] += dkn[t * K + a];
        }
    }
  }
  return R;
}

// ---- device tensors -------------------------------------------------------------------------
// A device tensor, optionally with `pad` unused elements after each last-dim row (a strided view
// like a slice of a fused projection). Padding is poisoned too, so a kernel that reads it fails.
struct DevTensor {
  void* ptr = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t pad = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  int64_t inner() const { return shape.empty() ? 1 : shape.back(); }
  int64_t phys(int64_t i) const { return i / inner() * (inner() + pad) + i % inner(); }
  std::size_t bytes() const {
    return static_cast<std::size_t>(numel() / std::max<int64_t>(inner(), 1) * (inner() + pad)) *
           flashgrad::dtype_size(dtype);
  }
  DevTensor() = default;
  DevTensor(DType dt, std::vector<int64_t> s, int64_t pad_ = 0) : dtype(dt), shape(std::move(s)), pad(pad_) {
    if (cudaMalloc(&ptr, std::max<std::size_t>(bytes(), 1)) != cudaSuccess) ptr = nullptr;
  }
  DevTensor(const DevTensor&) = delete;
  DevTensor& operator=(const DevTensor&) = delete;
  DevTensor(DevTensor&& o) noexcept { *this = std::move(o); }
  DevTensor& operator=(DevTensor&& o) noexcept {
    std::swap(ptr, o.ptr);
    dtype = o.dtype;
    shape = o.shape;
    pad = o.pad;
    return *this;
  }
  ~DevTensor() {
    if (ptr) cudaFree(ptr);
  }
  TensorView view() const {
    TensorView t;
    t.data = ptr;
    t.dtype = dtype;
    t.device = flashgrad::Device::cuda;
    t.device_index = 0;
    t.rank = static_cast<int>(shape.size());
    int64_t st = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.stride[i] = st;
      st *= shape[i] + (i == t.rank - 1 ? pad : 0);
    }
    return t;
  }
  void poison() { cudaMemset(ptr, 0xff, bytes()); }  // all-ones: NaN in f32, f16 and bf16
  void upload(const std::vector<float>& x) {
    std::vector<uint8_t> buf(bytes(), 0xff);
    for (int64_t i = 0; i < numel(); ++i) flashgrad::host::store<float>(buf.data(), dtype, phys(i), x[i]);
    cudaMemcpy(ptr, buf.data(), bytes(), cudaMemcpyHostToDevice);
  }
  std::vector<double> download() const {
    std::vector<uint8_t> buf(bytes());
    cudaMemcpy(buf.data(), ptr, bytes(), cudaMemcpyDeviceToHost);
    std::vector<double> x(numel());
    for (int64_t i = 0; i < numel(); ++i) x[i] = flashgrad::host::load<double>(buf.data(), dtype, phys(i));
    return x;
  }
};

// A caller's workspace of exactly `bytes`, followed by a guard of kGuard bytes; all of it filled with
// kFill first. A pass that writes past the bytes it asked for (delta_rule_workspace_bytes) changes the
// guard.
struct GuardedWorkspace {
  static constexpr std::size_t kGuard = 1 << 16;
  static constexpr int kFill = 0xa5;
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit GuardedWorkspace(std::size_t b) : bytes(b) {
    if (cudaMalloc(&ptr, b + kGuard) != cudaSuccess) ptr = nullptr;
    if (ptr) cudaMemset(ptr, kFill, b + kGuard);
  }
  GuardedWorkspace(const GuardedWorkspace&) = delete;
  GuardedWorkspace& operator=(const GuardedWorkspace&) = delete;
  ~GuardedWorkspace() {
    if (ptr) cudaFree(ptr);
  }
  flashgrad::Workspace ws() const { return {ptr, bytes}; }
  bool guard_intact() const {
    std::vector<uint8_t> g(kGuard);
    if (cudaMemcpy(g.data(), static_cast<char*>(ptr) + bytes, kGuard, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    return std::all_of(g.begin(), g.end(), [](uint8_t x) { return x == kFill; });
  }
};

double rel_rms(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));  // NaN in got -> NaN -> fails every bar
}

void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref, double bar,
                  const std::string& name) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double e = rel_rms(got, ref);
  std::printf("  %-28s %-6s rel_rms %.2e (bar %g)\n", name.c_str(), what, e, bar);
  EXPECT_TRUE(e <= bar) << name << ": " << what << " relative RMS error " << e << " > " << bar;
}

// ---- flashgrad's CPU backend as the reference ------------------------------------------------
// The GPU results are compared with flashgrad::delta_rule_forward / backward on CPU tensors
// (float32 copies of the same rounded inputs, recurrent algorithm, fp32 compute as the bars
// assume). The test's own float64 recurrence (reference() above) is checked against that backend
// in DeltaRuleGpuReference below; it stands in only if the CPU backend is unavailable (a stub).
bool cpu_backend_reference(const Case& c, const HostData& d, flashgrad::Precision prec, RefOut* R,
                           std::string* why) {
  const int64_t Tt = c.Ttot(), N = c.N();
  auto cpu = [](std::vector<float>& x, std::initializer_list<int64_t> shape) {
    return TensorView(x.data(), DType::f32, shape);
  };
  HostData m = d;  // mutable copies for the views
  std::vector<int64_t> cu = d.cu;
  flashgrad::DeltaRuleParams p;
  p.q = cpu(m.q, {c.B, Tt, c.H, c.K});
  p.k = cpu(m.k, {c.B, Tt, c.H, c.K});
  p.v = cpu(m.v, {c.B, Tt, c.HV, c.V});
  if (c.gate == GateKind::scalar) p.g = cpu(m.g, {c.B, Tt, c.HV});
  if (c.gate == GateKind::per_channel) p.g = cpu(m.g, {c.B, Tt, c.HV, c.K});
  p.beta = cpu(m.beta, {c.B, Tt, c.HV});
  if (c.h0) p.initial_state = cpu(m.h0, {N, c.HV, c.K, c.V});
  if (!c.seq_lens.empty()) p.cu_seqlens = TensorView(cu.data(), DType::i64, {N + 1});
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.algorithm = flashgrad::DeltaRuleAlgorithm::recurrent;
  p.exec.precision = prec;
  std::vector<float> o(c.B * Tt * c.HV * c.V), ht(N * c.HV * c.K * c.V), r(o.size());
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = cpu(o, {c.B, Tt, c.HV, c.V});
  out.final_state = cpu(ht, {N, c.HV, c.K, c.V});
  out.saved_r = cpu(r, {c.B, Tt, c.HV, c.V});
  std::vector<float> dq(m.q.size()), dk(m.k.size()), dv(m.v.size()), dg(m.g.size()), db(m.beta.size()),
      dh0(ht.size());
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = cpu(m.dout, {c.B, Tt, c.HV, c.V});
  in.dht = cpu(m.dht, {N, c.HV, c.K, c.V});
  in.saved_r = out.saved_r;
  flashgrad::DeltaRuleGrads gr;
  gr.dq = cpu(dq, {c.B, Tt, c.H, c.K});
  gr.dk = cpu(dk, {c.B, Tt, c.H, c.K});
  gr.dv = cpu(dv, {c.B, Tt, c.HV, c.V});
  if (c.gate == GateKind::scalar) gr.dg = cpu(dg, {c.B, Tt, c.HV});
  if (c.gate == GateKind::per_channel) gr.dg = cpu(dg, {c.B, Tt, c.HV, c.K});
  gr.dbeta = cpu(db, {c.B, Tt, c.HV});
  if (c.h0) gr.dh0 = cpu(dh0, {N, c.HV, c.K, c.V});
  try {
    flashgrad::delta_rule_forward(p, out);
    flashgrad::delta_rule_backward(p, in, gr);
  } catch (const flashgrad::Error& e) {
    *why = e.what();
    return false;
  }
  auto dbl = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  R->o = dbl(o);
  R->ht = dbl(ht);
  R->dq = dbl(dq);
  R->dk = dbl(dk);
  R->dv = dbl(dv);
  R->dg = dbl(dg);
  R->dbeta = dbl(db);
  R->dh0 = dbl(dh0);
  return true;
}

// The reference the GPU bars are measured against: the CPU backend in fp32, else (stub build)
// the test's float64 recurrence, saying so.
RefOut reference_for_gpu(const Case& c, const HostData& d) {
  RefOut R;
  std::string why;
  if (cpu_backend_reference(c, d, flashgrad::Precision::fp32, &R, &why)) return R;
  std::printf("  note: CPU backend unavailable (%s); using the test's float64 recurrence\n", why.c_str());
  return reference(c, d);
}

void compare_with_cpu_backend(const Case& c) {
  const HostData d = make_data(c);
  const RefOut R = reference(c, d);
  RefOut C;
  std::string why;
  if (!cpu_backend_reference(c, d, flashgrad::Precision::fp64, &C, &why))
    GTEST_SKIP() << "CPU reference unavailable: " << why;
  // float32 storage of the CPU results bounds the agreement at ~1e-7.
  expect_close("o", C.o, R.o, 1e-5, c.name);
  expect_close("ht", C.ht, R.ht, 1e-5, c.name);
  expect_close("dq", C.dq, R.dq, 1e-5, c.name);
  expect_close("dk", C.dk, R.dk, 1e-5, c.name);
  expect_close("dv", C.dv, R.dv, 1e-5, c.name);
  expect_close("dbeta", C.dbeta, R.dbeta, 1e-5, c.name);
  if (c.gate != GateKind::none) expect_close("dg", C.dg, R.dg, 1e-5, c.name);
  if (c.h0) expect_close("dh0", C.dh0, R.dh0, 1e-5, c.name);
}

// Runs forward + backward on the GPU through the public API and compares everything.
void run_case(const Case& c) {
  const HostData d = make_data(c);
  const RefOut R = reference_for_gpu(c, d);
  const int64_t Tt = c.Ttot(), N = c.N();
  const DType gdt = c.gate_f32 ? DType::f32 : c.dtype, bdt = c.beta_f32 ? DType::f32 : c.dtype;

  const int64_t pd = c.pad;
  DevTensor q(c.dtype, {c.B, Tt, c.H, c.K}, pd), k(c.dtype, {c.B, Tt, c.H, c.K}, pd),
      v(c.dtype, {c.B, Tt, c.HV, c.V}, pd);
  DevTensor beta(bdt, {c.B, Tt, c.HV}), dout(c.dtype, {c.B, Tt, c.HV, c.V}, pd);
  DevTensor g;
  if (c.gate == GateKind::scalar) g = DevTensor(gdt, {c.B, Tt, c.HV});
  if (c.gate == GateKind::per_channel) g = DevTensor(gdt, {c.B, Tt, c.HV, c.K});
  DevTensor h0, dht(DType::f32, {N, c.HV, c.K, c.V});
  if (c.h0) h0 = DevTensor(DType::f32, {N, c.HV, c.K, c.V});
  DevTensor cu(c.cu_int64 ? DType::i64 : DType::i32, {N + 1});
  q.upload(d.q);
  k.upload(d.k);
  v.upload(d.v);
  beta.upload(d.beta);
  dout.upload(d.dout);
  dht.upload(d.dht);
  if (g.ptr) g.upload(d.g);
  if (h0.ptr) h0.upload(d.h0);
  {
    if (c.cu_int64) cudaMemcpy(cu.ptr, d.cu.data(), 8 * d.cu.size(), cudaMemcpyHostToDevice);
    else {
      std::vector<int32_t> c32(d.cu.begin(), d.cu.end());
      cudaMemcpy(cu.ptr, c32.data(), 4 * c32.size(), cudaMemcpyHostToDevice);
    }
  }

  flashgrad::DeltaRuleParams p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  if (g.ptr) p.g = g.view();
  p.beta = beta.view();
  if (h0.ptr) p.initial_state = h0.view();
  if (!c.seq_lens.empty()) p.cu_seqlens = cu.view();
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.algorithm = c.algorithm;

  DevTensor o(c.dtype, {c.B, Tt, c.HV, c.V}, pd), ht(DType::f32, {N, c.HV, c.K, c.V});
  const bool save_r = c.saved_r != DType::i32;
  DevTensor r;
  if (save_r) r = DevTensor(c.saved_r, {c.B, Tt, c.HV, c.V}, pd);
  o.poison();
  ht.poison();
  if (r.ptr) r.poison();
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = o.view();
  out.final_state = ht.view();
  if (r.ptr) out.saved_r = r.view();
  DevTensor vn;  // dense: saved_v_new must be contiguous
  if (c.keep_v_new) {
    ASSERT_TRUE(flashgrad::delta_rule_keeps_v_new(p)) << c.name << ": these params keep no v_new";
    vn = DevTensor(c.dtype, {c.B, Tt, c.HV, c.V});
    vn.poison();
    out.saved_v_new = vn.view();
  }
  std::unique_ptr<GuardedWorkspace> fws;
  if (c.exact_workspace) {
    fws = std::make_unique<GuardedWorkspace>(
        flashgrad::delta_rule_workspace_bytes(p, flashgrad::Pass::forward, out.saved_v_new.data != nullptr));
    ASSERT_NE(fws->ptr, nullptr) << c.name << ": cudaMalloc of the forward's workspace";
  }
  ASSERT_NO_THROW(flashgrad::delta_rule_forward(p, out, fws ? fws->ws() : flashgrad::Workspace{}));
  CUDA_OK(cudaDeviceSynchronize());
  if (fws) EXPECT_TRUE(fws->guard_intact()) << c.name << ": the forward wrote past its workspace";

  DevTensor dq(c.dtype, {c.B, Tt, c.H, c.K}, pd), dk(c.dtype, {c.B, Tt, c.H, c.K}, pd),
      dv(c.dtype, {c.B, Tt, c.HV, c.V}, pd);
  DevTensor dbeta(bdt, {c.B, Tt, c.HV}), dh0(DType::f32, {N, c.HV, c.K, c.V}), dg;
  if (g.ptr) dg = DevTensor(gdt, g.shape);
  for (DevTensor* t : {&dq, &dk, &dv, &dbeta, &dh0, &dg})
    if (t->ptr) t->poison();
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = dout.view();
  in.dht = dht.view();
  if (r.ptr) in.saved_r = r.view();
  if (vn.ptr) in.saved_v_new = vn.view();
  flashgrad::DeltaRuleGrads gr;
  gr.dq = dq.view();
  gr.dk = dk.view();
  gr.dv = dv.view();
  if (dg.ptr) gr.dg = dg.view();
  gr.dbeta = dbeta.view();
  if (c.h0) gr.dh0 = dh0.view();
  std::unique_ptr<GuardedWorkspace> bws;
  if (c.exact_workspace) {
    bws = std::make_unique<GuardedWorkspace>(
        flashgrad::delta_rule_workspace_bytes(p, flashgrad::Pass::backward, in.saved_v_new.data != nullptr));
    ASSERT_NE(bws->ptr, nullptr) << c.name << ": cudaMalloc of the backward's workspace";
  }
  ASSERT_NO_THROW(flashgrad::delta_rule_backward(p, in, gr, bws ? bws->ws() : flashgrad::Workspace{}));
  CUDA_OK(cudaDeviceSynchronize());
  if (bws) EXPECT_TRUE(bws->guard_intact()) << c.name << ": the backward wrote past its workspace";

  expect_close("o", o.download(), R.o, 0.005, c.name);
  expect_close("ht", ht.download(), R.ht, 0.005, c.name);
  expect_close("dq", dq.download(), R.dq, 0.008, c.name);
  expect_close("dk", dk.download(), R.dk, 0.008, c.name);
  expect_close("dv", dv.download(), R.dv, 0.008, c.name);
  expect_close("dbeta", dbeta.download(), R.dbeta, 0.02, c.name);
  if (dg.ptr) expect_close("dg", dg.download(), R.dg, 0.02, c.name);
  if (c.h0) expect_close("dh0", dh0.download(), R.dh0, 0.008, c.name);
}

TEST(DeltaRuleGpuReference, TestRecurrenceMatchesCpuBackend) {
  for (GateKind gk : {GateKind::scalar, GateKind::per_channel, GateKind::none}) {
    Case c;
    c.name = std::string("cpu-check gate ") + std::to_string(static_cast<int>(gk));
    c.dtype = DType::f32;
    c.gate = gk;
    c.B = 1, c.H = 1, c.HV = 2, c.K = 12, c.V = 10;
    c.seq_lens = {5, 0, 17, 9};
    c.gate_div = 0.5f;
    c.seed = 900 + static_cast<int>(gk);
    compare_with_cpu_backend(c);
  }
}

// ---- the cases --------------------------------------------------------------------------------
const int64_t kTs[] = {1, 63, 64, 75, 500, 1500, 4096};

TEST(DeltaRuleGpu, GdnBf16GroupedValueHeadsAllLengths) {
  REQUIRE_GPU();
  for (int64_t T : kTs) {
    Case c;
    c.name = "gdn bf16 T=" + std::to_string(T);
    c.B = 2, c.T = T, c.H = 2, c.HV = 4, c.K = 128, c.V = 128;
    c.gate_div = T == 500 ? 0.1f : (T == 1500 ? 10.f : 1.f);
    c.seed = 100 + T;
    run_case(c);
  }
}

TEST(DeltaRuleGpu, KdaBf16KeyNotValue) {
  REQUIRE_GPU();
  for (int64_t T : {1, 63, 75, 500, 1500}) {
    Case c;
    c.name = "kda bf16 T=" + std::to_string(T);
    c.gate = GateKind::per_channel;
    c.B = 2, c.T = T, c.H = 1, c.HV = 2, c.K = 128, c.V = 64;
    c.gate_div = T == 75 ? 0.1f : 1.f;
    c.gate_f32 = T % 2 == 1;
    c.seed = 200 + T;
    run_case(c);
  }
}

TEST(DeltaRuleGpu, PlainDeltaRuleF16) {
  REQUIRE_GPU();
  for (int64_t T : {1, 64, 500}) {
    Case c;
    c.name = "delta f16 T=" + std::to_string(T);
    c.dtype = DType::f16;
    c.gate = GateKind::none;
    c.B = 2, c.T = T, c.H = 2, c.HV = 2, c.K = 64, c.V = 128;
    c.l2norm = false;
    c.saved_r = DType::f32;
    c.seed = 300 + T;
    run_case(c);
  }
}

TEST(DeltaRuleGpu, GdnF16OddSizesStrongDecay) {
  REQUIRE_GPU();
  Case c;
  c.name = "gdn f16 K100 V72";
  c.dtype = DType::f16;
  c.B = 1, c.T = 300, c.H = 2, c.HV = 4, c.K = 100, c.V = 72;
  c.gate_div = 0.1f;
  c.gate_f32 = false, c.beta_f32 = true;
  c.saved_r = DType::i32;  // no saved r: the backward recomputes it
  c.seed = 401;
  run_case(c);
}

TEST(DeltaRuleGpu, KdaF16NoInitialStateNoNorm) {
  REQUIRE_GPU();
  Case c;
  c.name = "kda f16 K64 V128";
  c.dtype = DType::f16;
  c.gate = GateKind::per_channel;
  c.B = 2, c.T = 200, c.H = 2, c.HV = 2, c.K = 64, c.V = 128;
  c.h0 = false;
  c.l2norm = false;
  c.saved_r = DType::f32;
  c.seed = 402;
  run_case(c);
}

TEST(DeltaRuleGpu, Head256AndFloat32) {
  REQUIRE_GPU();
  Case c;
  c.name = "gdn bf16 K=V=256";
  c.B = 1, c.T = 75, c.H = 1, c.HV = 2, c.K = 256, c.V = 256;
  c.seed = 403;
  run_case(c);
  Case f;
  f.name = "kda f32 K32 V48";
  f.dtype = DType::f32;
  f.gate = GateKind::per_channel;
  f.B = 2, f.T = 130, f.H = 1, f.HV = 3, f.K = 32, f.V = 48;
  f.seed = 404;
  run_case(f);
}

TEST(DeltaRuleGpu, VarlenUnevenLengths) {
  REQUIRE_GPU();
  const std::vector<int64_t> lens = {1, 63, 136, 0, 511, 75, 714};
  for (GateKind gk : {GateKind::scalar, GateKind::per_channel, GateKind::none}) {
    Case c;
    c.name = std::string("varlen ") + (gk == GateKind::scalar ? "gdn" : gk == GateKind::per_channel ? "kda" : "delta");
    c.gate = gk;
    c.B = 1, c.H = 2, c.HV = 4, c.K = 128, c.V = 64;
    c.seq_lens = lens;
    c.cu_int64 = gk == GateKind::per_channel;
    c.gate_div = 0.1f;
    c.seed = 500 + static_cast<int>(gk);
    run_case(c);
  }
}

TEST(DeltaRuleGpu, StridedViews) {
  REQUIRE_GPU();
  // pad 8: rows stay 16-byte aligned (vector loads); pad 3: they do not (element loads).
  for (int64_t pad : {8, 3}) {
    for (GateKind gk : {GateKind::scalar, GateKind::per_channel}) {
      Case c;
      c.name = "strided pad " + std::to_string(pad) + (gk == GateKind::scalar ? " gdn" : " kda");
      c.gate = gk;
      c.B = 2, c.T = 90, c.H = 1, c.HV = 2, c.K = 64, c.V = 32;
      c.pad = pad;
      c.saved_r = DType::f32;
      c.seed = 700 + pad + static_cast<int>(gk);
      run_case(c);
    }
  }
}

// The GDN / plain-rule cases of the chunked path, named "<prefix> ...": every length of the issue
// (GVA, K = V = 128; seeds seed0 + T), and its features (f16 plain rule with K != V and no norm, strong
// decay without an initial state with g / beta in other dtypes, varlen with an empty sequence;
// seeds seed0 + 11, + 12, + 20 + gate). ChunkedAlgorithmMatches runs them as they are, the
// ChunkedKeptVNew* tests with the forward's v_new kept.
std::vector<Case> chunked_length_cases(const std::string& prefix, uint64_t seed0) {
  std::vector<Case> cases;
  for (int64_t T : kTs) {
    Case c;
    c.name = prefix + " gdn bf16 GVA T=" + std::to_string(T);
    c.B = 2, c.T = T, c.H = 2, c.HV = 4, c.K = 128, c.V = 128;
    c.gate_div = T == 500 ? 0.1f : (T == 1500 ? 10.f : 1.f);
    c.seed = seed0 + T;
    cases.push_back(c);
  }
  return cases;
}
std::vector<Case> chunked_feature_cases(const std::string& prefix, uint64_t seed0) {
  std::vector<Case> cases;
  {
    Case c;
    c.name = prefix + " delta f16 K64 V128 no norm";
    c.dtype = DType::f16;
    c.gate = GateKind::none;
    c.B = 2, c.T = 130, c.H = 2, c.HV = 2, c.K = 64, c.V = 128;
    c.l2norm = false;
    c.seed = seed0 + 11;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = prefix + " gdn f16 K128 V64 strong decay no h0";
    c.dtype = DType::f16;
    c.B = 1, c.T = 300, c.H = 1, c.HV = 2, c.K = 128, c.V = 64;
    c.gate_div = 0.1f;
    c.h0 = false;
    c.gate_f32 = false, c.beta_f32 = true;
    c.seed = seed0 + 12;
    cases.push_back(c);
  }
  for (GateKind gk : {GateKind::scalar, GateKind::none}) {
    Case c;
    c.name = prefix + " varlen " + (gk == GateKind::scalar ? "gdn" : "delta");
    c.gate = gk;
    c.B = 1, c.H = 2, c.HV = 4, c.K = 64, c.V = 64;
    c.seq_lens = {1, 63, 136, 0, 511, 75, 714};
    c.cu_int64 = gk == GateKind::none;
    c.gate_div = 0.1f;
    c.seed = seed0 + 20 + static_cast<int>(gk);
    cases.push_back(c);
  }
  return cases;
}

// algorithm = chunked without a saved r runs the tensor-core chunked path (chunked_path.h) for
// bf16/f16, K 64/128, V a multiple of 64, GDN, KDA and the plain rule; these cases go through it end to
// end (the public API) with the same bars. With a saved r asked for, the recurrent kernels run.
TEST(DeltaRuleGpu, ChunkedAlgorithmMatches) {
  REQUIRE_GPU();
  auto chunked = [](Case c) {
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;  // no saved r: the chunked path
    run_case(c);
  };
  for (const Case& c : chunked_length_cases("chunked", 600)) chunked(c);
  for (const Case& c : chunked_feature_cases("chunked", 600)) chunked(c);
  for (int64_t T : {1, 63, 64, 75, 500}) {  // KDA: the per-channel chunked stages (chunked_kda.h)
    Case c;
    c.name = "chunked kda bf16 GVA T=" + std::to_string(T);
    c.gate = GateKind::per_channel;
    c.B = 2, c.T = T, c.H = 1, c.HV = 2, c.K = 128, c.V = 64;
    c.gate_div = T == 75 ? 0.1f : 1.f;
    c.gate_f32 = T % 2 == 1;
    c.seed = 640 + T;
    chunked(c);
  }
  {
    Case c;
    c.name = "chunked kda f16 varlen K64 V128";
    c.dtype = DType::f16;
    c.gate = GateKind::per_channel;
    c.B = 1, c.H = 2, c.HV = 2, c.K = 64, c.V = 128;
    c.seq_lens = {75, 0, 130, 1};
    c.gate_div = 0.1f;
    c.seed = 650;
    chunked(c);
  }
  for (int64_t pad : {8, 3}) {
    Case c;
    c.name = "chunked strided pad " + std::to_string(pad);
    c.B = 2, c.T = 90, c.H = 1, c.HV = 2, c.K = 64, c.V = 64;
    c.pad = pad;
    c.seed = 630 + pad;
    chunked(c);
  }
}

// The forward keeps v_new (saved_v_new) and the backward rebuilds the chunk states from it
// (chunked_state_from_vnew.cuh, in segments where the chains are few) instead of re-running stage 2:
// the same bars, every length of the issue, GVA, K != V, the plain rule, no initial state, varlen.
void run_kept_v_new(Case c) {
  c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
  c.saved_r = DType::i32;
  c.keep_v_new = true;
  run_case(c);
}
TEST(DeltaRuleGpu, ChunkedKeptVNewLengths) {
  REQUIRE_GPU();
  for (const Case& c : chunked_length_cases("kept v_new", 1600)) run_kept_v_new(c);
}
// (small cases: the GPU check's compute-sanitizer runs this one)
TEST(DeltaRuleGpu, ChunkedKeptVNewMatches) {
  REQUIRE_GPU();
  for (const Case& c : chunked_feature_cases("kept v_new", 1600)) run_kept_v_new(c);
}

// The fused state + output forward (the default at many chains, B8 T4096 H16 and up, which these
// small cases do not reach) stores the kept v_new from its own single-fragment products, through a
// shared tile as 16-byte stores (store_acc_rows_staged, session 14): forced on here
// (FLASHGRAD_CHUNKED_FUSED_OUTPUT=1, read per call) for the kept cases whose V it takes (V % 128 == 0).
// (small cases: the GPU check's compute-sanitizer runs this one)
TEST(DeltaRuleGpu, ChunkedKeptVNewFusedForward) {
  REQUIRE_GPU();
  const EnvSet force_fused("FLASHGRAD_CHUNKED_FUSED_OUTPUT", "1");
  std::vector<Case> cases;
  for (const Case& c : chunked_length_cases("kept v_new, fused forward", 2600))
    if (c.T == 1 || c.T == 75 || c.T == 500) cases.push_back(c);
  for (const Case& c : chunked_feature_cases("kept v_new, fused forward", 2600))
    if (c.V % 128 == 0) cases.push_back(c);
  ASSERT_EQ(cases.size(), 4u);
  for (const Case& c : cases) run_kept_v_new(c);
}

// The forward's workspace holds what its path writes (chunked_path.cu, session 18): stage 1's G, row
// scales, w and u always; h_c in T and (unless kept) v_new on the unfused path; neither on the fused
// state + output path (many chains); A on neither (only the backward reads it). Until session 18 every
// forward also took A (fp32 [rows, HV, 64]), fp32 h and v_new: at B8 T4096 H16 K=V=128 1078 MB, now
// 406. Each case runs with exactly the bytes delta_rule_workspace_bytes reports and a filled guard
// after them (run_case's exact_workspace), its results checked against the reference as every case's.
TEST(DeltaRuleGpu, ChunkedForwardWorkspaceByPath) {
  REQUIRE_GPU();
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  for (bool fused : {true, false})
    for (bool kept : {false, true}) {
      Case c;
      c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
      c.saved_r = DType::i32;  // no saved r: the chunked path
      c.K = c.V = 128;
      if (fused) {  // enough chains for the fused rule: 4 B HV >= 3 SMs; T = 130: a partial last chunk
        c.H = c.HV = 16, c.T = 130;
        c.B = (3 * sms + 4 * c.HV - 1) / (4 * c.HV);
      } else {
        c.B = 1, c.H = c.HV = 2, c.T = 500;
      }
      c.keep_v_new = kept;
      c.exact_workspace = true;
      c.seed = 5100 + 2 * fused + kept;
      c.name = std::string("chunked gdn ") + (fused ? "fused" : "unfused") + " forward" + (kept ? ", kept v_new" : "") +
               " B=" + std::to_string(c.B);
      ASSERT_EQ(flashgrad::cuda_detail::delta_rule::fused_output_wanted(c.B, c.HV, c.V, sms), fused)
          << c.name << ": the launcher's rule no longer picks this path at these sizes";
      // Upper bound of what the path writes (bytes), with room for the chunk plan and 256-byte alignment.
      const std::size_t rows = c.B * c.T, chunks = c.B * ((c.T + 63) / 64), hv = c.HV;
      const std::size_t stage1 = rows * hv * (4 + 4 + 2 * c.K + 4 * c.V);  // G, row scales, w (T), u (fp32)
      const std::size_t h_t = chunks * hv * c.K * c.V * 2, v_new = rows * hv * c.V * 2;
      const std::size_t bound = stage1 + (fused ? 0 : h_t + (kept ? 0 : v_new)) + 64 * 1024;
      // (the size query's params: tensors of the case's shapes)
      DevTensor q(c.dtype, {c.B, c.T, c.H, c.K}), k(c.dtype, {c.B, c.T, c.H, c.K}), v(c.dtype, {c.B, c.T, c.HV, c.V}),
          g(DType::f32, {c.B, c.T, c.HV}), beta(c.dtype, {c.B, c.T, c.HV}), h0(DType::f32, {c.B, c.HV, c.K, c.V});
      flashgrad::DeltaRuleParams p;
      p.q = q.view(), p.k = k.view(), p.v = v.view(), p.g = g.view(), p.beta = beta.view();
      p.initial_state = h0.view();
      p.use_qk_l2norm_in_kernel = true;
      p.algorithm = c.algorithm;
      const std::size_t fwd = flashgrad::delta_rule_workspace_bytes(p, flashgrad::Pass::forward, kept);
      std::printf("  %-28s forward workspace %zu bytes, bound %zu (stage 1's %zu)\n", c.name.c_str(), fwd, bound,
                  stage1);
      EXPECT_LE(fwd, bound) << c.name << ": the forward's workspace holds more than its path writes";
      EXPECT_GE(fwd, stage1) << c.name << ": the forward's workspace lacks room for stage 1's outputs";
      run_case(c);
    }
}

// The rebuild's shapes that the launcher's own choices do not all reach at these sizes (its P and R
// follow the SM count): the wide kernel (chunked_state_from_vnew_wide.cuh, session 15) with 3
// segments of 3 sub-segments, with 4 warps per block and 2 segments, and the chain kernel of sessions
// 13-14 (FLASHGRAD_CHUNKED_FROM_VNEW=chain, 3 segments), on a long GVA case (24 chunks per sequence,
// pass 1 summing several chunks per sub-segment) and the varlen cases (empty and one-chunk sequences:
// empty sub-segments). The settings are read per call and unset again however the test ends.
TEST(DeltaRuleGpu, ChunkedKeptVNewRebuildShapes) {
  REQUIRE_GPU();
  struct Env {
    std::vector<std::string> names;
    void set(const char* name, const char* value) { setenv(name, value, 1); names.emplace_back(name); }
    ~Env() { for (const auto& n : names) unsetenv(n.c_str()); }
  };
  std::vector<Case> cases;
  for (const Case& c : chunked_length_cases("kept v_new, rebuild shapes", 3600))
    if (c.T == 1500) cases.push_back(c);
  for (const Case& c : chunked_feature_cases("kept v_new, rebuild shapes", 3600))
    if (!c.seq_lens.empty()) cases.push_back(c);
  ASSERT_EQ(cases.size(), 3u);
  const std::vector<std::vector<std::pair<const char*, const char*>>> settings = {
      {{"FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS", "3"}, {"FLASHGRAD_CHUNKED_FROM_VNEW_SUBSEGMENTS", "3"}},
      {{"FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS", "2"}, {"FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_WARPS", "4"}},
      {{"FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS", "3"}, {"FLASHGRAD_CHUNKED_FROM_VNEW", "chain"}}};
  for (const auto& setting : settings) {
    Env env;
    std::string label;
    for (const auto& [name, value] : setting) {
      env.set(name, value);
      label += std::string(" ") + name + "=" + value;
    }
    SCOPED_TRACE(label);
    for (Case c : cases) {
      c.name += label;
      run_kept_v_new(c);
    }
  }
}

// Enough (sequence, value head) chains that the backward's B1 runs one block per chain, so dv_new
// goes into w's region (dv_new_in_w_allowed: the default since run 9.1; the test unsets
// FLASHGRAD_CHUNKED_DVNEW_IN_W, which can turn it off): K = V = 64 (4 warps), K = V = 128 with >=
// 3/4 of the SMs' worth of 4-chain groups (8 warps).
TEST(DeltaRuleGpu, ChunkedDvNewInWRegion) {
  REQUIRE_GPU();
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  unsetenv("FLASHGRAD_CHUNKED_DVNEW_IN_W");
  for (int64_t K : {64, 128}) {
    Case c;
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;  // no saved r: the chunked path
    c.H = K == 64 ? 4 : 2, c.HV = 4, c.K = K, c.V = K, c.T = 130;
    c.B = (K == 64 ? sms : (3 * sms + 3) / 4) / c.HV + 1;
    c.gate_div = K == 64 ? 0.1f : 1.f;
    c.dtype = K == 64 ? DType::f16 : DType::bf16;
    c.seed = 660 + K;
    c.name = "chunked gdn dv_new in w K=V=" + std::to_string(K) + " B=" + std::to_string(c.B);
    ASSERT_TRUE(flashgrad::cuda_detail::delta_rule::dv_new_in_w_allowed(c.B * c.HV, K, K, sms))
        << c.name << ": these sizes no longer put dv_new in w's region; the test would not cover it";
    run_case(c);
  }
}

// K = V = 128 with H == HV: the shape where the backward's B2 runs split (chunked_grads_split.cuh,
// its default variant at V == K, writing dq, dk directly: split_grads_applies in
// chunked_launch_impl.cuh needs H == HV), as the benchmark's rows do; the other K = 128 cases here are
// GVA (H < HV), which take the fused B2. bf16 and fp16, with and without the kept v_new, varlen with an
// empty and a one-row sequence. (Added in session 15 after a review found the gap; passes on the H200
// since run 16.1.)
std::vector<Case> heads_equal_k128_cases() {
  std::vector<Case> cases;
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c;
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;  // no saved r: the chunked path
    c.dtype = dt;
    c.B = 2, c.T = 500, c.H = 2, c.HV = 2, c.K = 128, c.V = 128;
    c.gate_div = dt == DType::bf16 ? 1.f : 0.1f;
    c.seed = 3700 + static_cast<int>(dt == DType::f16);
    c.name = std::string("chunked gdn H=HV K=V=128 ") + (dt == DType::bf16 ? "bf16" : "f16") + " T=500";
    cases.push_back(c);
  }
  {
    Case c;
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;
    c.B = 1, c.H = 2, c.HV = 2, c.K = 128, c.V = 128;
    c.seq_lens = {300, 0, 1, 129};
    c.gate_div = 0.1f;
    c.seed = 3710;
    c.name = "chunked gdn H=HV K=V=128 varlen";
    cases.push_back(c);
  }
  return cases;
}
TEST(DeltaRuleGpu, ChunkedHeadsEqualValueHeadsK128) {
  REQUIRE_GPU();
  const std::vector<Case> cases = heads_equal_k128_cases();
  for (const Case& c : cases) run_case(c);
  for (Case c : cases) {
    c.name = "kept v_new, " + c.name;
    run_kept_v_new(c);
  }
}

// B2a on wgmma (chunked_grads_state_wgmma.cuh, session 19; the split B2's default since then, set here
// as FLASHGRAD_CHUNKED_B2_SPLIT=wg so that the tests keep covering it whatever the default): the split
// B2's K = V = 128, H == HV cases above (bf16 and fp16 T = 500, varlen with an empty, a one-row and a
// 129-row sequence: partial chunks), plus T = 75 of the plain rule (no gate) without an initial state
// or the L2 norm (rq = rk = 1, no exact <h0, dh> term) and T = 200 B = 3 with a strong decay, without
// and with the kept v_new; ChunkedB2aWgmmaK64: the same cases at K = V = 64 (one warpgroup per item;
// seeds + 50). Two tests so that the GPU check's sanitizer can take each alone. The setting is unset
// again however a test ends.
std::vector<Case> b2a_wgmma_cases(int64_t K) {
  std::vector<Case> cases = heads_equal_k128_cases();
  {
    Case c = cases.front();
    c.T = 75, c.h0 = false, c.l2norm = false, c.gate = GateKind::none, c.seed = 3720;
    c.name = "chunked gdn H=HV K=V=128 T=75 no h0, norm or gate";
    cases.push_back(c);
    c.T = 200, c.h0 = true, c.l2norm = true, c.gate = GateKind::scalar, c.gate_div = 0.1f, c.B = 3, c.seed = 3721;
    c.dtype = DType::f16;  // (bf16 at this decay: one emulation case had dbeta over its bar, a tail; delta_rule.md "Session 19")
    c.name = "chunked gdn H=HV K=V=128 f16 T=200 B=3 strong decay";
    cases.push_back(c);
  }
  for (Case& c : cases) {
    c.name = "B2a wgmma, " + c.name;
    if (K == 128) continue;
    c.K = c.V = K, c.seed += 50;
    const auto at = c.name.find("K=V=128");
    if (at != std::string::npos) c.name.replace(at, 7, "K=V=" + std::to_string(K));
  }
  return cases;
}
void run_b2a_wgmma(int64_t K) {
  const EnvSet variant("FLASHGRAD_CHUNKED_B2_SPLIT", "wg");
  for (Case c : b2a_wgmma_cases(K)) {
    run_case(c);
    c.name = "kept v_new, " + c.name;
    run_kept_v_new(c);
  }
}
TEST(DeltaRuleGpu, ChunkedB2aWgmma) {
  REQUIRE_GPU();
  run_b2a_wgmma(128);
}
TEST(DeltaRuleGpu, ChunkedB2aWgmmaK64) {
  REQUIRE_GPU();
  run_b2a_wgmma(64);
}
// Stage 2's kernels other than the default at these sizes (few chains: the wgmma stage 2 with 16 value
// columns per block since session 17, which every other chunked test here runs): chunked_state_wgmma.cuh
// with 64 and 32 columns, and the mma.sync channel-split kernel (FLASHGRAD_CHUNKED_STATE_WGMMA=0), read
// per call: the forward's unfused stage 2 (these sizes do not reach the fused one) and the backward's
// recomputation of it, over every length (GVA, K = V = 128, T from 1 to 4096) and feature case of the
// chunked path (K != V both ways, no norm, strong decay without an initial state, varlen with an empty
// sequence), without and with the kept v_new. The setting is unset again however the test ends.
TEST(DeltaRuleGpu, ChunkedStateWgmma) {
  REQUIRE_GPU();
  std::vector<Case> cases = chunked_length_cases("wgmma stage 2", 4800);
  for (const Case& c : chunked_feature_cases("wgmma stage 2", 4800)) cases.push_back(c);
  for (const char* cols : {"64", "32", "0"}) {
    const EnvSet width("FLASHGRAD_CHUNKED_STATE_WGMMA", cols);
    SCOPED_TRACE(std::string("FLASHGRAD_CHUNKED_STATE_WGMMA=") + cols);
    for (Case c : cases) {
      c.name += std::string(cols) == "0" ? std::string(", mma.sync stage 2") : std::string(", ") + cols + " columns";
      c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
      c.saved_r = DType::i32;  // no saved r: the chunked path
      run_case(c);
      c.name = "kept v_new, " + c.name;
      run_kept_v_new(c);
    }
  }
}

// B1 on wgmma (chunked_state_backward_wgmma.cuh, session 17; FLASHGRAD_CHUNKED_B1_WGMMA=32 or 16 value
// columns per block, read per call; 16 is the default at these sizes) and the mma.sync local B1 it
// replaced there (=0): the local B1 (few chains, as every case here), over every length
// and feature case of the chunked path and K = V = 128 with H == HV (varlen with an empty and a one-row
// sequence), with the kept v_new (the backward rebuilds the states, then B0 and B1) and without it
// (stage 2 again, then B0 and B1: the chains kernel, which would run both in one launch at K = 128, is
// turned off). dv_new in w's region is turned off too (K = V = 64 would put it there, where this
// kernel is not taken). Each case asserts that the launcher's rule takes the local B1 and the asked
// width at its sizes, so the test cannot pass without running that kernel. Settings unset at the end.
TEST(DeltaRuleGpu, ChunkedB1Wgmma) {
  REQUIRE_GPU();
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const EnvSet no_chains("FLASHGRAD_CHUNKED_STATE_CHAINS", "0"), no_dvn_in_w("FLASHGRAD_CHUNKED_DVNEW_IN_W", "0");
  std::vector<Case> cases = chunked_length_cases("wgmma B1", 5800);
  for (const Case& c : chunked_feature_cases("wgmma B1", 5800)) cases.push_back(c);
  {
    Case c;
    c.B = 1, c.H = 2, c.HV = 2, c.K = 128, c.V = 128;
    c.seq_lens = {300, 0, 1, 129};
    c.gate_div = 0.1f;
    c.seed = 5810;
    c.name = "wgmma B1 gdn H=HV K=V=128 varlen";
    cases.push_back(c);
  }
  namespace dr = flashgrad::cuda_detail::delta_rule;
  for (const char* cols : {"32", "16", "0"}) {
    const EnvSet width("FLASHGRAD_CHUNKED_B1_WGMMA", cols);
    SCOPED_TRACE(std::string("FLASHGRAD_CHUNKED_B1_WGMMA=") + cols);
    for (Case c : cases) {
      const int64_t chains = (c.seq_lens.empty() ? c.B : static_cast<int64_t>(c.seq_lens.size())) * c.HV;
      ASSERT_TRUE(dr::state_backward_local_wanted(chains, c.V, sms) &&
                  dr::state_backward_wgmma_cols(chains, c.K, c.V, sms) == std::atoi(cols))
          << c.name << ": the launcher would not take the wgmma B1 at these sizes";
      c.name += std::string(cols) == "0" ? std::string(", mma.sync local B1") : std::string(", ") + cols + " columns";
      c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
      c.saved_r = DType::i32;  // no saved r: the chunked path
      run_case(c);
      c.name = "kept v_new, " + c.name;
      run_kept_v_new(c);
    }
  }
}

// The forward's unfused stages 2 and 3 pass h_c in T by default since session 17 (output_h16_wanted,
// chunked_stages.h: stage 3's single-fragment products, as the fused forward's); every chunked test here
// runs that default at its sizes. FLASHGRAD_CHUNKED_OUTPUT_H16=0 keeps the fp32 h_c with hi + lo
// products: run here end to end on a long GVA case, the K != V cases and varlen (the stage test
// DeltaRuleChunkedGpu checks that kernel's output against the CPU reference's too). Unset at the end.
TEST(DeltaRuleGpu, ChunkedOutputFp32State) {
  REQUIRE_GPU();
  const EnvSet fp32_state("FLASHGRAD_CHUNKED_OUTPUT_H16", "0");
  std::vector<Case> cases;
  for (const Case& c : chunked_length_cases("fp32 h_c output", 7800))
    if (c.T == 1500) cases.push_back(c);
  for (const Case& c : chunked_feature_cases("fp32 h_c output", 7800)) cases.push_back(c);
  for (Case c : cases) {
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;  // no saved r: the chunked path
    run_kept_v_new(c);
  }
}

// The chains kernel (stage 2 again and B1 in one launch, chunked_state_chains.cuh), off by default since
// session 17 (the wgmma stage 2 and B1 are faster where it would run), stays a choice:
// FLASHGRAD_CHUNKED_STATE_CHAINS=1 on the K = V = 128 length cases without the kept v_new (the path that
// reaches it), asserting that the rule takes it at their sizes. Unset at the end.
TEST(DeltaRuleGpu, ChunkedStateChainsOptIn) {
  REQUIRE_GPU();
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const EnvSet chains("FLASHGRAD_CHUNKED_STATE_CHAINS", "1");
  for (Case c : chunked_length_cases("chains kernel", 6800)) {
    if (c.T != 1 && c.T != 75 && c.T != 1500) continue;
    ASSERT_TRUE(flashgrad::cuda_detail::delta_rule::state_chains_wanted(c.B * c.HV, c.K, c.V, sms))
        << c.name << ": the chains kernel would not run at these sizes";
    c.algorithm = flashgrad::DeltaRuleAlgorithm::chunked;
    c.saved_r = DType::i32;  // no saved r, no kept v_new: stage 2 and B1 again in the backward
    run_case(c);
  }
}

// ---- past 2^31 elements ------------------------------------------------------------------------
// v, o, dout, dv hold B*T*HV*V = 270000 * 64 * 128 > 2^31 elements (fla's fused recurrent kernel
// crashes at such sizes). Inputs are generated on the device; the first and the last sequence
// (whose elements sit past 2^31) are compared with the float64 recurrence.
__device__ float hash_uniform(uint64_t x) {  // splitmix64 -> (0, 1)
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
}
// kind 0: normal; 1: logsigmoid(normal) / 2 with 10% exact zeros; 2: sigmoid(normal).
__global__ void fill_random(void* p, bool bf16, int64_t n, uint64_t seed, int kind) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t key = seed * 0x100000001b3ull + static_cast<uint64_t>(i) * 2;
    const float u1 = hash_uniform(key), u2 = hash_uniform(key + 1);
    float x = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if (kind == 1) x = hash_uniform(key ^ 0x5555) < 0.1f ? 0.f : (fminf(x, 0.f) - log1pf(expf(-fabsf(x)))) / 2.f;
    if (kind == 2) x = 1.f / (1.f + expf(-x));
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
    else
      static_cast<float*>(p)[i] = x;
  }
}
void fill(DevTensor& t, uint64_t seed, int kind) {
  fill_random<<<4096, 256>>>(t.ptr, t.dtype == DType::bf16, t.numel(), seed, kind);
}
std::vector<float> download_range(const DevTensor& t, int64_t first, int64_t count) {
  const std::size_t es = flashgrad::dtype_size(t.dtype);
  std::vector<uint8_t> buf(count * es);
  cudaMemcpy(buf.data(), static_cast<const char*>(t.ptr) + first * es, buf.size(), cudaMemcpyDeviceToHost);
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = flashgrad::host::load<float>(buf.data(), t.dtype, i);
  return x;
}

TEST(DeltaRuleGpu, PastTwoToThe31Elements) {
  REQUIRE_GPU();
  const int64_t H = 16, HV = 64, K = 64, V = 128;
  std::vector<int64_t> lens = {100};
  int64_t total = 100;
  while (total < 270000 - 150 - 2100) { lens.push_back(2100); total += 2100; }
  lens.push_back(270000 - 150 - total);
  lens.push_back(150);
  total = 270000;
  const int64_t N = static_cast<int64_t>(lens.size());
  ASSERT_GT(total * HV * V, int64_t(1) << 31);
  std::vector<int64_t> cu_h = {0};
  for (int64_t l : lens) cu_h.push_back(cu_h.back() + l);
  ASSERT_GT((cu_h[N - 1]) * HV * V, int64_t(1) << 31);  // the last sequence starts past 2^31

  DevTensor q(DType::bf16, {1, total, H, K}), k(DType::bf16, {1, total, H, K}), v(DType::bf16, {1, total, HV, V});
  DevTensor g(DType::f32, {1, total, HV}), beta(DType::bf16, {1, total, HV}), h0(DType::f32, {N, HV, K, V});
  DevTensor dout(DType::bf16, {1, total, HV, V}), dht(DType::f32, {N, HV, K, V}), cu(DType::i64, {N + 1});
  DevTensor o(DType::bf16, {1, total, HV, V}), r(DType::f32, {1, total, HV, V}), ht(DType::f32, {N, HV, K, V});
  DevTensor dq(DType::bf16, {1, total, H, K}), dk(DType::bf16, {1, total, H, K}), dv(DType::bf16, {1, total, HV, V});
  DevTensor dg(DType::f32, {1, total, HV}), dbeta(DType::bf16, {1, total, HV}), dh0(DType::f32, {N, HV, K, V});
  for (DevTensor* t : {&q, &k, &v, &g, &beta, &h0, &dout, &dht, &cu, &o, &r, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0})
    ASSERT_NE(t->ptr, nullptr) << "cudaMalloc failed for " << t->bytes() << " bytes";
  fill(q, 1, 0); fill(k, 2, 0); fill(v, 3, 0); fill(g, 4, 1); fill(beta, 5, 2); fill(h0, 6, 0);
  fill(dout, 7, 0); fill(dht, 8, 0);
  CUDA_OK(cudaMemcpy(cu.ptr, cu_h.data(), 8 * cu_h.size(), cudaMemcpyHostToDevice));
  // Both algorithms: recurrent with a saved r, chunked (tensor-core stages) without one, and chunked
  // with the forward's v_new kept (saved_v_new: bf16 in r's memory, which that mode does not use).
  for (const int mode : {0, 1, 2}) {
  const bool chunked = mode >= 1, kept = mode == 2;
  SCOPED_TRACE(kept ? "algorithm chunked, v_new kept" : (chunked ? "algorithm chunked" : "algorithm recurrent"));
  for (DevTensor* t : {&o, &r, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0}) t->poison();
  TensorView vn = r.view();  // [1, total, HV, V] dense
  vn.dtype = DType::bf16;

  flashgrad::DeltaRuleParams p;
  p.q = q.view(); p.k = k.view(); p.v = v.view(); p.g = g.view(); p.beta = beta.view();
  p.initial_state = h0.view(); p.cu_seqlens = cu.view(); p.use_qk_l2norm_in_kernel = true;
  p.algorithm = chunked ? flashgrad::DeltaRuleAlgorithm::chunked : flashgrad::DeltaRuleAlgorithm::recurrent;
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = o.view(); out.final_state = ht.view(); out.saved_r = chunked ? TensorView() : r.view();
  if (kept) out.saved_v_new = vn;
  ASSERT_NO_THROW(flashgrad::delta_rule_forward(p, out));
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = dout.view(); in.dht = dht.view(); in.saved_r = chunked ? TensorView() : r.view();
  if (kept) in.saved_v_new = vn;
  flashgrad::DeltaRuleGrads gr;
  gr.dq = dq.view(); gr.dk = dk.view(); gr.dv = dv.view(); gr.dg = g.ptr ? dg.view() : TensorView();
  gr.dbeta = dbeta.view(); gr.dh0 = dh0.view();
  ASSERT_NO_THROW(flashgrad::delta_rule_backward(p, in, gr));
  CUDA_OK(cudaDeviceSynchronize());

  for (int64_t n : {int64_t(0), N - 1}) {
    const int64_t bos = cu_h[n], len = lens[n];
    Case c;
    c.name = std::string(kept ? "chunked kept v_new" : (chunked ? "chunked" : "recurrent")) + " 2^31 seq " +
             std::to_string(n);
    c.B = 1, c.H = H, c.HV = HV, c.K = K, c.V = V, c.seq_lens = {len};
    HostData d;
    d.q = download_range(q, bos * H * K, len * H * K);
    d.k = download_range(k, bos * H * K, len * H * K);
    d.v = download_range(v, bos * HV * V, len * HV * V);
    d.g = download_range(g, bos * HV, len * HV);
    d.beta = download_range(beta, bos * HV, len * HV);
    d.h0 = download_range(h0, n * HV * K * V, HV * K * V);
    d.dout = download_range(dout, bos * HV * V, len * HV * V);
    d.dht = download_range(dht, n * HV * K * V, HV * K * V);
    d.cu = {0, len};
    const RefOut R = reference_for_gpu(c, d);
    auto got = [](const DevTensor& t, int64_t first, int64_t count) {
      const std::vector<float> f = download_range(t, first, count);
      return std::vector<double>(f.begin(), f.end());
    };
    expect_close("o", got(o, bos * HV * V, len * HV * V), R.o, 0.005, c.name);
    expect_close("ht", got(ht, n * HV * K * V, HV * K * V), R.ht, 0.005, c.name);
    expect_close("dq", got(dq, bos * H * K, len * H * K), R.dq, 0.008, c.name);
    expect_close("dk", got(dk, bos * H * K, len * H * K), R.dk, 0.008, c.name);
    expect_close("dv", got(dv, bos * HV * V, len * HV * V), R.dv, 0.008, c.name);
    expect_close("dbeta", got(dbeta, bos * HV, len * HV), R.dbeta, 0.02, c.name);
    expect_close("dg", got(dg, bos * HV, len * HV), R.dg, 0.02, c.name);
    expect_close("dh0", got(dh0, n * HV * K * V, HV * K * V), R.dh0, 0.008, c.name);
  }
  }  // algorithms
}

// ---- what the CUDA backend refuses (no GPU needed: refused before any CUDA call) ---------------
TEST(DeltaRuleCuda, UnsupportedCallsFailClearly) {
  // Fake, distinct, aligned device addresses: nothing may be dereferenced before the refusal.
  auto fake = [](uintptr_t slot, DType dt, std::initializer_list<int64_t> shape) {
    TensorView t(reinterpret_cast<void*>(slot << 32), dt, shape);
    t.device = flashgrad::Device::cuda;
    return t;
  };
  struct Bad {
    const char* what;
    DType dt;
    int64_t K;
    flashgrad::Precision prec;
    const char* arg;
  };
  for (const Bad& b : {Bad{"float64 inputs", DType::f64, 64, flashgrad::Precision::fp32, "q"},
                       Bad{"K > 256", DType::bf16, 300, flashgrad::Precision::fp32, "q"},
                       Bad{"fp64 compute", DType::bf16, 64, flashgrad::Precision::fp64, "exec.precision"}}) {
    flashgrad::DeltaRuleParams p;
    p.q = fake(1, b.dt, {1, 8, 2, b.K});
    p.k = fake(2, b.dt, {1, 8, 2, b.K});
    p.v = fake(3, b.dt, {1, 8, 2, 16});
    p.beta = fake(4, b.dt, {1, 8, 2});
    p.exec.precision = b.prec;
    flashgrad::DeltaRuleForwardOutputs out;
    out.o = fake(5, b.dt, {1, 8, 2, 16});
    try {
      flashgrad::delta_rule_forward(p, out);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const flashgrad::Error& e) {
      EXPECT_EQ(e.kind(), flashgrad::ErrorKind::unsupported) << b.what << ": " << e.what();
      EXPECT_EQ(e.argument(), b.arg) << b.what << ": " << e.what();
      std::printf("  %s -> %s\n", b.what, e.what());
    }
  }
}

}  // namespace
