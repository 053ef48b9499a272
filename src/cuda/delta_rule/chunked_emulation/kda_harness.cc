// CPU emulation of the KDA chunked stages (src/cuda/delta_rule/chunked_kda_*.cuh): runs the
// kernels' own source on the host (emulator.h: one std::thread per CUDA thread, mma.sync from the
// PTX fragment layout) and compares every stage's outputs with the CPU chunked reference
// (src/reference/delta_rule/chunked.h, float64, per-channel gates), then o, the final state and
// every gradient with flashgrad's CPU backend (fp32 recurrence), by relative RMS with the bars of
// tests/cpp/delta_rule_chunked_kda_gpu_test.cu. harness.cc says what such an emulation checks and
// what it cannot.
//
// Built by tests/cpp/CMakeLists.txt in CUDA-enabled builds (CTest: DeltaRuleChunkedKda.HostEmulation,
// quick cases). Usage: flashgrad_chunked_kda_emulation [quick|all].
#include "emulator.h"

#include "core/host_dtype.h"
#include "cuda/delta_rule/chunked_kda_grads.cuh"
#include "cuda/delta_rule/chunked_kda_grads_local.cuh"
#include "cuda/delta_rule/chunked_kda_grads_local2.cuh"
#include "cuda/delta_rule/chunked_kda_grads_state.cuh"
#include "cuda/delta_rule/chunked_kda_output.cuh"
#include "cuda/delta_rule/chunked_kda_prepare.cuh"
#include "cuda/delta_rule/chunked_kda_prepare_compact.cuh"
#include "cuda/delta_rule/chunked_kda_state_backward_transposed.cuh"
#include "cuda/delta_rule/chunked_kda_state_transposed.cuh"
#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"
#include "reference/delta_rule/chunked.h"

namespace dr = flashgrad::cuda_detail::delta_rule;
namespace ref = flashgrad::reference::delta_rule;
using flashgrad::DType;

namespace {

// Runs `body` as every block of a (gx, gy, gz) grid of `threads` (128 or 256) threads, one block
// after another, shared memory poisoned with NaN (all-ones bytes) before each block.
template <typename F>
void launch(unsigned gx, unsigned gy, unsigned gz, F&& body, unsigned threads = 128) {
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        std::memset(dr::smem_raw, 0xff, sizeof(dr::smem_raw));
        std::barrier<> blk(threads), w0(32), w1(32), w2(32), w3(32), w4(32), w5(32), w6(32), w7(32);
        g_block_bar = &blk;
        g_warp_bar[0] = &w0, g_warp_bar[1] = &w1, g_warp_bar[2] = &w2, g_warp_bar[3] = &w3;
        g_warp_bar[4] = &w4, g_warp_bar[5] = &w5, g_warp_bar[6] = &w6, g_warp_bar[7] = &w7;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < threads; ++t)
          th.emplace_back([&, t] {
            emu_tid = {t, 0, 0};
            emu_bid = {x, y, z};
            body();
          });
        for (auto& t : th) t.join();
      }
}

float round_to(DType dt, float x) {
  if (dt == DType::bf16) return flashgrad::host::bf16_to_float(flashgrad::host::float_to_bf16(x));
  if (dt == DType::f16) return flashgrad::host::f16_to_float(flashgrad::host::float_to_f16(x));
  return x;
}

struct Buf {  // host stand-in for a device buffer, poisoned with NaN
  DType dt;
  int64_t n;
  std::vector<uint8_t> mem;
  Buf(DType d, int64_t count) : dt(d), n(count), mem(std::max<int64_t>(count, 1) * flashgrad::dtype_size(d), 0xff) {}
  void* p() { return mem.data(); }
  float* f() { return reinterpret_cast<float*>(mem.data()); }
  void up(const std::vector<float>& x) {
    for (int64_t i = 0; i < n; ++i) flashgrad::host::store<float>(mem.data(), dt, i, x[i]);
  }
  double at(int64_t i) const { return flashgrad::host::load<double>(mem.data(), dt, i); }
};

dr::View vw(Buf& b, std::vector<int64_t> sh) {  // contiguous row-major view
  dr::View v;
  v.p = b.p();
  v.f32 = b.dt == DType::f32;
  int64_t s[4] = {0, 0, 0, 1}, st = 1;
  for (int i = static_cast<int>(sh.size()) - 1; i >= 0; --i) s[i] = st, st *= sh[i];
  v.s0 = s[0], v.s1 = s[1], v.s2 = s[2], v.s3 = sh.size() == 4 ? s[3] : 1;
  return v;
}

struct Pairs {  // relative RMS accumulator; NaN anywhere makes it NaN
  double num = 0, den = 0;
  size_t n = 0;
  bool nan = false;
  void add(double g, double r) {
    if (std::isnan(g)) nan = true;
    num += (g - r) * (g - r), den += r * r, ++n;
  }
  double rel() const { return nan ? NAN : std::sqrt(num / std::max(den, 1e-300)); }
};

struct Case {
  const char* name;
  DType dt;
  int64_t B, T, H, HV, V;
  std::vector<int64_t> lens;  // varlen when non-empty (B = 1)
  float gdiv;                 // g = logsigmoid(x) / gdiv, 10% exact zeros
  bool l2norm, g_f32;         // g stored as float32 (else in the input dtype)
  uint64_t seed;
};

struct Inputs {
  std::vector<float> q, k, v, g, beta, h0, dout, dht;
};

// flashgrad's CPU backend (recurrent, fp32): forward and backward, the end-to-end reference.
struct CpuResult {
  std::vector<float> o, ht, dq, dk, dv, dg, dbeta, dh0;
};
bool cpu_reference(const Case& c, int64_t B, int64_t T, int64_t K, int64_t N, const std::vector<int64_t>& cu_in,
                   Inputs x, CpuResult* R) {
  using flashgrad::TensorView;
  auto cpu = [](std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return TensorView(v.data(), DType::f32, shape);
  };
  std::vector<int64_t> cu = cu_in;
  const int64_t H = c.H, HV = c.HV, V = c.V;
  flashgrad::DeltaRuleParams p;
  p.q = cpu(x.q, {B, T, H, K}), p.k = cpu(x.k, {B, T, H, K}), p.v = cpu(x.v, {B, T, HV, V});
  p.g = cpu(x.g, {B, T, HV, K});
  p.beta = cpu(x.beta, {B, T, HV}), p.initial_state = cpu(x.h0, {N, HV, K, V});
  if (!cu.empty()) p.cu_seqlens = TensorView(cu.data(), DType::i64, {N + 1});
  p.use_qk_l2norm_in_kernel = c.l2norm;
  p.algorithm = flashgrad::DeltaRuleAlgorithm::recurrent;
  p.exec.precision = flashgrad::Precision::fp32;
  R->o.assign(B * T * HV * V, 0.f), R->ht.assign(N * HV * K * V, 0.f);
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = cpu(R->o, {B, T, HV, V}), out.final_state = cpu(R->ht, {N, HV, K, V});
  R->dq.assign(x.q.size(), 0.f), R->dk.assign(x.k.size(), 0.f), R->dv.assign(x.v.size(), 0.f);
  R->dg.assign(x.g.size(), 0.f), R->dbeta.assign(x.beta.size(), 0.f), R->dh0.assign(R->ht.size(), 0.f);
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = cpu(x.dout, {B, T, HV, V}), in.dht = cpu(x.dht, {N, HV, K, V});
  flashgrad::DeltaRuleGrads gr;
  gr.dq = cpu(R->dq, {B, T, H, K}), gr.dk = cpu(R->dk, {B, T, H, K}), gr.dv = cpu(R->dv, {B, T, HV, V});
  gr.dg = cpu(R->dg, {B, T, HV, K}), gr.dbeta = cpu(R->dbeta, {B, T, HV}), gr.dh0 = cpu(R->dh0, {N, HV, K, V});
  try {
    flashgrad::delta_rule_forward(p, out);
    flashgrad::delta_rule_backward(p, in, gr);
  } catch (const flashgrad::Error& e) {
    std::printf("CPU reference failed: %s\n", e.what());
    return false;
  }
  return true;
}

// dx = rstd (dy - (dy . y) y), y = x rstd, per row of K.
std::vector<double> l2norm_backward_rows(const std::vector<float>& x, const std::vector<double>& dy, int64_t K) {
  std::vector<double> dx(dy.size());
  for (std::size_t r = 0; r * K < dy.size(); ++r) {
    double ss = 0, dot = 0;
    for (int64_t d = 0; d < K; ++d) ss += double(x[r * K + d]) * x[r * K + d];
    const double rstd = 1.0 / std::sqrt(ss + 1e-6);
    for (int64_t d = 0; d < K; ++d) dot += dy[r * K + d] * x[r * K + d] * rstd;
    for (int64_t d = 0; d < K; ++d) dx[r * K + d] = rstd * (dy[r * K + d] - dot * x[r * K + d] * rstd);
  }
  return dx;
}

template <typename TT, int KM>
int run(const Case& c) {
  const int64_t K = KM, H = c.H, HV = c.HV, V = c.V;
  const DType dt = c.dt;
  std::vector<int64_t> cu;
  int64_t B = c.B, T = c.T;
  if (!c.lens.empty()) {
    cu.push_back(0);
    for (auto l : c.lens) cu.push_back(cu.back() + l);
    B = 1, T = cu.back();
  }
  const int64_t N = c.lens.empty() ? B : static_cast<int64_t>(c.lens.size()), rows = B * T;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud;
  Inputs x;
  auto fill = [&](std::vector<float>& v, int64_t n, DType d) {
    v.resize(n);
    for (auto& e : v) e = round_to(d, nd(rng));
  };
  fill(x.q, rows * H * K, dt), fill(x.k, rows * H * K, dt), fill(x.v, rows * HV * V, dt);
  x.g.resize(rows * HV * K);
  for (auto& e : x.g) {
    const float s = nd(rng), ls = std::min(s, 0.f) - std::log1p(std::exp(-std::fabs(s)));
    e = round_to(c.g_f32 ? DType::f32 : dt, ud(rng) < 0.1f ? 0.f : ls / c.gdiv);
  }
  if (!c.l2norm)
    for (int64_t r = 0; r < rows * H; ++r) {
      double ss = 0;
      for (int64_t e = 0; e < K; ++e) ss += double(x.k[r * K + e]) * x.k[r * K + e];
      for (int64_t e = 0; e < K; ++e) x.k[r * K + e] = round_to(dt, x.k[r * K + e] / std::sqrt(ss));
    }
  x.beta.resize(rows * HV);
  for (auto& e : x.beta) e = round_to(dt, 1.f / (1.f + std::exp(-nd(rng))));
  fill(x.h0, N * HV * K * V, DType::f32), fill(x.dout, rows * HV * V, dt), fill(x.dht, N * HV * K * V, DType::f32);

  const dr::ChunkPlanHost plan = dr::make_chunk_plan(B, T, cu);
  const int64_t NC = plan.chunks.size(), NCm = std::max<int64_t>(NC, 1);
  Buf bq(dt, x.q.size()), bk(dt, x.k.size()), bv(dt, x.v.size()), bg(c.g_f32 ? DType::f32 : dt, x.g.size()),
      bb(dt, x.beta.size()), bh0(DType::f32, x.h0.size()), bdo(dt, x.dout.size()), bdht(DType::f32, x.dht.size());
  bq.up(x.q), bk.up(x.k), bv.up(x.v), bg.up(x.g), bb.up(x.beta), bh0.up(x.h0), bdo.up(x.dout), bdht.up(x.dht);
  Buf bo(dt, rows * HV * V), bht(DType::f32, N * HV * K * V), G(DType::f32, rows * HV * K),
      A(DType::f32, rows * HV * 64), w(dt, rows * HV * K), u(DType::f32, rows * HV * V), vn(dt, rows * HV * V),
      hh(DType::f32, NCm * HV * K * V), bdh(DType::f32, NCm * HV * K * V), bdvn(DType::f32, rows * HV * V),
      bdh0(DType::f32, N * HV * K * V), bdq(DType::f32, rows * H * K), bdk(DType::f32, rows * H * K),
      bdv(DType::f32, rows * HV * V), bdb(DType::f32, rows * HV), bdg(DType::f32, rows * HV * K);
  const std::vector<float> zeros(rows * H * K, 0.f);
  bdq.up(zeros), bdk.up(zeros);
  dr::ChunkedArgs a;
  a.q = vw(bq, {B, T, H, K}), a.k = vw(bk, {B, T, H, K}), a.v = vw(bv, {B, T, HV, V});
  a.g = vw(bg, {B, T, HV, K}), a.beta = vw(bb, {B, T, HV}), a.h0 = vw(bh0, {N, HV, K, V});
  a.o = vw(bo, {B, T, HV, V}), a.ht = vw(bht, {N, HV, K, V});
  a.chunks = plan.chunks.data(), a.seq_first_chunk = plan.seq_first_chunk.data();
  a.num_chunks = NC, a.num_seqs = N, a.uniform_chunks = plan.uniform_chunks;
  a.G = G.f(), a.A = A.f(), a.w = w.p(), a.u = u.f(), a.v_new = vn.p(), a.h = hh.f();
  a.T = T, a.H = H, a.HV = HV, a.K = K, a.V = V, a.scale = 1.0f / std::sqrt(float(K)), a.l2norm = c.l2norm;
  a.dout = vw(bdo, {B, T, HV, V}), a.dht = vw(bdht, {N, HV, K, V}), a.dh0 = vw(bdh0, {N, HV, K, V});
  a.dh = bdh.f(), a.dv_new = bdvn.f(), a.dq_acc = bdq.f(), a.dk_acc = bdk.f(), a.dv = bdv.f(), a.dbeta = bdb.f();
  a.dg = bdg.f();
  // Stage 1 as the library picks it (chunked_kda_launch_impl.cuh): the compact kernel's session-13
  // form (kVar = 4); FLASHGRAD_CHUNKED_KDA_PREPARE=s7: its session-7 form; =old: the wide one.
  const char* prep = std::getenv("FLASHGRAD_CHUNKED_KDA_PREPARE");
  if (prep && std::strcmp(prep, "old") == 0)
    launch(NC, HV, 1, [&] { dr::kda_prepare_kernel<TT, KM>(a); });
  else if (prep && std::strcmp(prep, "s7") == 0)
    launch(NC, HV, 1, [&] { dr::kda_prepare_compact_kernel<TT, KM, 0>(a); });
  else
    launch(NC, HV, 1, [&] { dr::kda_prepare_compact_kernel<TT, KM, 4>(a); });
  // Stage 2 as the library picks it (chunked_kda_launch_impl.cuh): the transposed kernel, operand
  // splits by FLASHGRAD_KDA_STATE_SPLIT_DEFAULT at compile time; FLASHGRAD_CHUNKED_KDA_STATE=split:
  // all hi + lo.
  const char* st2 = std::getenv("FLASHGRAD_CHUNKED_KDA_STATE");
  constexpr int kAll = dr::kKdaSplitH | dr::kKdaSplitVnew | dr::kKdaSplitKd;
  using S2 = dr::KdaStateTSmem<TT, KM, 8, kAll>;  // the larger layout bounds both
  static_assert(S2::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)), "emulated shared memory");
  if (st2 && std::strcmp(st2, "split") == 0)
    launch(N, HV, V / S2::BV, [&] { dr::kda_state_transposed_kernel<TT, KM, 8, kAll>(a); }, S2::THREADS);
  else
    launch(N, HV, V / S2::BV, [&] { dr::kda_state_transposed_kernel<TT, KM, 8>(a); }, S2::THREADS);
  if (dr::kda_output_single_wanted())  // (as the launcher)
    launch(NC, HV, V / 64, [&] { dr::kda_output_kernel<TT, KM, true>(a); });
  else
    launch(NC, HV, V / 64, [&] { dr::kda_output_kernel<TT, KM>(a); });
  // B1 as the library picks it (chunked_kda_launch_impl.cuh): the transposed kernel (single-fragment
  // products); FLASHGRAD_CHUNKED_KDA_B1=transposed_split: the same with dh, P and dv_new hi + lo.
  const char* b1 = std::getenv("FLASHGRAD_CHUNKED_KDA_B1");
  using SB = dr::KdaStateBackwardTSmem<TT, KM, 8>;
  static_assert(SB::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)), "emulated shared memory");
  if (b1 && std::strcmp(b1, "transposed_split") == 0)
    launch(N, HV, V / SB::BV, [&] { dr::kda_state_backward_transposed_kernel<TT, KM, 8, true>(a); }, SB::THREADS);
  else
    launch(N, HV, V / SB::BV, [&] { dr::kda_state_backward_transposed_kernel<TT, KM, 8, false>(a); }, SB::THREADS);
  // B2 as the library picks it (chunked_kda_launch_impl.cuh): the split kernels (the state kernel over
  // every block, then the local kernel), operands rounded to T, the state kernel in its staged form
  // (session 11); FLASHGRAD_CHUNKED_KDA_B2=split: the session-10 state kernel; =split_exact: hi + lo;
  // =fused: kda_grads_kernel.
  const char* b2 = std::getenv("FLASHGRAD_CHUNKED_KDA_B2");
  const bool b2_fused = b2 && std::strcmp(b2, "fused") == 0, b2_exact = b2 && std::strcmp(b2, "split_exact") == 0;
  const bool b2_staged = !(b2 && std::strcmp(b2, "split") == 0);
  if (b2_fused) {
    launch(NC, HV, 1, [&] { dr::kda_grads_kernel<TT, KM>(a); }, dr::kGradsThreads);
  } else {
    static_assert(dr::KdaGradsStateSmem<TT>::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)) &&
                      dr::KdaGradsStateSmem<TT, true>::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)) &&
                      dr::KdaGradsLocalSmem::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)),
                  "emulated shared memory");
    if (b2_exact) {
      launch(NC, HV, 1, [&] { dr::kda_grads_state_kernel<TT, KM, true>(a); }, dr::kKdaSplitThreads);
      launch(NC, HV, 1, [&] { dr::kda_grads_local_kernel<TT, KM, true>(a); }, dr::kKdaSplitThreads);
    } else {
      if (b2_staged)
        launch(NC, HV, 1, [&] { dr::kda_grads_state_kernel<TT, KM, false, true>(a); }, dr::kKdaSplitThreads);
      else
        launch(NC, HV, 1, [&] { dr::kda_grads_state_kernel<TT, KM, false>(a); }, dr::kKdaSplitThreads);
      // The session-12 local kernel (chunked_kda_grads_local2.cuh) as the library's default;
      // FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old: the session-10 one.
      const char* b2l = std::getenv("FLASHGRAD_CHUNKED_KDA_B2_LOCAL");
      static_assert(dr::KdaGradsLocal2Smem<TT>::bytes() <= static_cast<int64_t>(sizeof(dr::smem_raw)), "emulated shared memory");
      if (b2l && std::strcmp(b2l, "old") == 0)
        launch(NC, HV, 1, [&] { dr::kda_grads_local_kernel<TT, KM, false>(a); }, dr::kKdaSplitThreads);
      else
        launch(NC, HV, 1, [&] { dr::kda_grads_local2_kernel<TT, KM>(a); }, dr::kKdaSplitThreads);
    }
  }

  // Stage by stage against the CPU chunked reference (float64) per (sequence, value head).
  Pairs pG, pA, pP, pw, pu, pvn, ph, pht, po, pdh, pdvn, pdh0, pdq, pdk, pdv, pdb, pdg;
  double h0mis = 0;
  std::vector<double> rdq(rows * H * K, 0.0), rdk(rows * H * K, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t len = plan.seq_len[n], c0 = plan.seq_first_chunk[n], row0 = plan.seq_b[n] * T + plan.seq_t0[n];
    for (int64_t j = 0; j < HV; ++j) {
      const int64_t hd = j / (HV / H);
      ref::HeadInputs<double> hi;
      hi.T = len, hi.K = K, hi.V = V, hi.scale = 1.0 / std::sqrt(double(K));
      hi.q.resize(len * K), hi.k.resize(len * K), hi.v.resize(len * V), hi.g.resize(len * K), hi.beta.resize(len);
      hi.q_rstd.assign(len, 1), hi.k_rstd.assign(len, 1);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = row0 + t;
        for (int pass = 0; pass < 2; ++pass) {
          const std::vector<float>& src = pass ? x.k : x.q;
          std::vector<double>& dst = pass ? hi.k : hi.q;
          double ss = 0;
          for (int64_t d = 0; d < K; ++d) ss += double(src[(row * H + hd) * K + d]) * src[(row * H + hd) * K + d];
          const double rs = c.l2norm ? 1 / std::sqrt(ss + 1e-6) : 1;
          for (int64_t d = 0; d < K; ++d) dst[t * K + d] = src[(row * H + hd) * K + d] * rs;
        }
        for (int64_t e = 0; e < V; ++e) hi.v[t * V + e] = x.v[(row * HV + j) * V + e];
        for (int64_t d = 0; d < K; ++d) hi.g[t * K + d] = x.g[(row * HV + j) * K + d];
        hi.beta[t] = x.beta[row * HV + j];
      }
      hi.h0.resize(K * V);
      for (int64_t i = 0; i < K * V; ++i) hi.h0[i] = x.h0[(n * HV + j) * K * V + i];
      std::vector<double> dO(len * V), dHT(K * V);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < V; ++e) dO[t * V + e] = x.dout[((row0 + t) * HV + j) * V + e];
      for (int64_t i = 0; i < K * V; ++i) dHT[i] = x.dht[(n * HV + j) * K * V + i];
      ref::ChunkedForwardTrace<double> f;
      ref::ChunkedBackwardTrace<double> bt;
      ref::chunked_backward_head(hi, dO, dHT, f, bt);
      for (int64_t cc = 0; cc < f.num_chunks; ++cc)
        for (int64_t e = 0; e < K * V; ++e) {
          pdh.add(bdh.at(((c0 + cc) * HV + j) * K * V + e), bt.dh[(cc + 1) * K * V + e]);
          const double got = hh.at(((c0 + cc) * HV + j) * K * V + e), want = f.h[cc * K * V + e];
          if (cc == 0)
            h0mis = std::max(h0mis, std::isnan(got) ? 1e300 : std::fabs(got - want));
          else
            ph.add(got, want);
        }
      for (int64_t e = 0; e < K * V; ++e) {
        pdh0.add(bdh0.at((n * HV + j) * K * V + e), bt.dh[e]);
        pht.add(bht.at((n * HV + j) * K * V + e), f.h[f.num_chunks * K * V + e]);
      }
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = row0 + t, ci = t / 64, i = t % 64;
        for (int64_t d = 0; d < K; ++d) {
          rdq[(row * H + hd) * K + d] += bt.dq[t * K + d];
          rdk[(row * H + hd) * K + d] += bt.dk[t * K + d];
          pG.add(G.at((row * HV + j) * K + d), f.G[t * K + d]);
          pw.add(w.at((row * HV + j) * K + d), f.w[t * K + d]);
          pdg.add(bdg.at((row * HV + j) * K + d), bt.dg[t * K + d]);
        }
        for (int64_t jj = 0; jj < i; ++jj) pA.add(A.at((row * HV + j) * 64 + jj), f.A[(ci * 64 + i) * 64 + jj]);
        for (int64_t jj = 0; jj <= i; ++jj) {  // P_{i,jj}, packed at row jj, column i
          const int64_t tj = ci * 64 + jj;
          double p = 0;
          for (int64_t d = 0; d < K; ++d)
            p += hi.q[t * K + d] * hi.k[tj * K + d] * std::exp(f.G[t * K + d] - f.G[tj * K + d]);
          pP.add(A.at(((row0 + tj) * HV + j) * 64 + i), p);
        }
        for (int64_t e = 0; e < V; ++e) {
          const int64_t at = (row * HV + j) * V + e;
          pu.add(u.at(at), f.u[t * V + e]), pvn.add(vn.at(at), f.v_new[t * V + e]), po.add(bo.at(at), f.o[t * V + e]);
          pdvn.add(bdvn.at(at), bt.dv_new[t * V + e]), pdv.add(bdv.at(at), bt.dv[t * V + e]);
        }
        pdb.add(bdb.at(row * HV + j), bt.dbeta[t]);
      }
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row0 = plan.seq_b[n] * T + plan.seq_t0[n];
    for (int64_t t = 0; t < plan.seq_len[n]; ++t)
      for (int64_t e = 0; e < H * K; ++e) {
        const int64_t at = (row0 + t) * H * K + e;
        pdq.add(bdq.at(at), rdq[at]), pdk.add(bdk.at(at), rdk[at]);
      }
  }
  std::printf("%-36s G %.2e A %.2e P %.2e w %.2e u %.2e h %.2e v_new %.2e ht %.2e o %.2e\n", c.name, pG.rel(), pA.rel(),
              pP.rel(), pw.rel(), pu.rel(), ph.rel(), pvn.rel(), pht.rel(), po.rel());
  std::printf("%-36s B1: dh %.2e dv_new %.2e dh0 %.2e  B2: dq %.2e dk %.2e dv %.2e dbeta %.2e dg %.2e\n", "",
              pdh.rel(), pdvn.rel(), pdh0.rel(), pdq.rel(), pdk.rel(), pdv.rel(), pdb.rel(), pdg.rel());

  // End to end against the CPU backend.
  CpuResult R;
  Pairs eo, eht, edq, edk, edv, edb, edg, edh0;
  if (cpu_reference(c, B, T, K, N, cu, x, &R)) {
    std::vector<double> dqa(rows * H * K), dka(rows * H * K);
    for (int64_t i = 0; i < rows * H * K; ++i) dqa[i] = bdq.at(i), dka[i] = bdk.at(i);
    const std::vector<double> dqg = c.l2norm ? l2norm_backward_rows(x.q, dqa, K) : dqa;
    const std::vector<double> dkg = c.l2norm ? l2norm_backward_rows(x.k, dka, K) : dka;
    for (size_t i = 0; i < R.o.size(); ++i) eo.add(bo.at(i), R.o[i]), edv.add(bdv.at(i), R.dv[i]);
    for (size_t i = 0; i < R.ht.size(); ++i) eht.add(bht.at(i), R.ht[i]), edh0.add(bdh0.at(i), R.dh0[i]);
    for (size_t i = 0; i < R.dq.size(); ++i) edq.add(dqg[i], R.dq[i]), edk.add(dkg[i], R.dk[i]);
    for (size_t i = 0; i < R.dbeta.size(); ++i) edb.add(bdb.at(i), R.dbeta[i]);
    for (size_t i = 0; i < R.dg.size(); ++i) edg.add(bdg.at(i), R.dg[i]);
  }
  std::printf("%-36s vs CPU recurrent: o %.2e ht %.2e dq %.2e dk %.2e dv %.2e dbeta %.2e dg %.2e dh0 %.2e\n", "",
              eo.rel(), eht.rel(), edq.rel(), edk.rel(), edv.rel(), edb.rel(), edg.rel(), edh0.rel());
  int fails = 0;
  auto bar = [&](const char* what, const Pairs& p, double b) {  // !(x <= b) also catches NaN
    if (p.n && !(p.rel() <= b)) std::printf("  FAIL %s: %.3e > %g\n", what, p.rel(), b), ++fails;
  };
  bar("G", pG, 1e-5), bar("A", pA, 5e-3), bar("P", pP, 5e-3), bar("w", pw, 5e-3), bar("u", pu, 5e-3), bar("h", ph, 5e-3);
  bar("v_new", pvn, 5e-3), bar("final h", pht, 5e-3), bar("o", po, 5e-3);
  bar("dh", pdh, 8e-3), bar("dv_new", pdvn, 8e-3), bar("dh0", pdh0, 8e-3);
  bar("dq", pdq, 8e-3), bar("dk", pdk, 8e-3), bar("dv", pdv, 8e-3), bar("dbeta", pdb, 2e-2), bar("dg", pdg, 2e-2);
  bar("o vs CPU", eo, 5e-3), bar("ht vs CPU", eht, 5e-3), bar("dq vs CPU", edq, 8e-3), bar("dk vs CPU", edk, 8e-3);
  bar("dv vs CPU", edv, 8e-3), bar("dbeta vs CPU", edb, 2e-2), bar("dg vs CPU", edg, 2e-2);
  bar("dh0 vs CPU", edh0, 8e-3);
  if (eo.n == 0) std::printf("  FAIL no CPU reference\n"), ++fails;
  if (h0mis != 0) std::printf("  FAIL first entry state != h0\n"), ++fails;
  return fails;
}

}  // namespace

// quick (default; CTest): four small cases; all: four more with T = 500, varlen, K = 128.
int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "quick";
  using bf16 = __nv_bfloat16;
  int fails = 0;
  const char* b2 = std::getenv("FLASHGRAD_CHUNKED_KDA_B2");
  const std::string b2s = b2 ? b2 : "";
  std::printf("B2: %s\n", b2s == "fused"         ? "kda_grads_kernel (FLASHGRAD_CHUNKED_KDA_B2=fused)"
                          : b2s == "split_exact" ? "split kernels, products hi + lo (FLASHGRAD_CHUNKED_KDA_B2=split_exact)"
                          : b2s == "split"       ? "split kernels, session-10 state kernel (FLASHGRAD_CHUNKED_KDA_B2=split)"
                                                 : "split kernels, state products staged (the default)");
  // name, dtype, B, T, H, HV, V, varlen lengths, gate divisor, l2norm, g in f32, seed
  fails += run<bf16, 64>({"kda bf16 K64 V128 T=75 n=0.1", DType::bf16, 1, 75, 1, 2, 128, {}, 0.1f, true, true, 1});
  fails += run<__half, 64>({"kda f16 K64 V64 B=2 T=70 g f16", DType::f16, 2, 70, 1, 1, 64, {}, 1.f, true, false, 2});
  fails += run<bf16, 128>({"kda bf16 K128 V64 T=64 H=2 HV=4", DType::bf16, 1, 64, 2, 4, 64, {}, 1.f, true, true, 3});
  fails += run<bf16, 64>({"varlen kda bf16 K64 V64 n=0.1", DType::bf16, 1, 0, 1, 2, 64, {1, 63, 0, 70}, 0.1f, true,
                          true, 4});
  if (mode == "all") {
    fails += run<bf16, 64>({"kda bf16 K64 V64 T=500 n=1", DType::bf16, 1, 500, 1, 2, 64, {}, 1.f, true, true, 5});
    fails += run<__half, 128>({"kda f16 K128 V128 T=200 n=0.1", DType::f16, 1, 200, 1, 2, 128, {}, 0.1f, true, true, 6});
    fails += run<bf16, 64>({"kda bf16 K64 V192 T=130 no norm n=10", DType::bf16, 1, 130, 1, 1, 192, {}, 10.f, false,
                            true, 7});
    fails += run<bf16, 128>({"varlen kda bf16 K128 V128 n=0.1", DType::bf16, 1, 0, 1, 2, 128, {1, 63, 136, 0, 75, 64},
                             0.1f, true, true, 8});
  }
  std::printf(fails ? "%d comparisons over their bars\n" : "all comparisons within their bars\n", fails);
  return fails ? 1 : 0;
}
