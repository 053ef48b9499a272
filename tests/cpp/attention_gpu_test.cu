// CUDA softmax attention (forward and backward) against the CPU reference, by the 2x rule of
// docs/attention.md:  max|X - X_ref32| <= r * max|X_lowp - X_ref32| + atol  for X in
// {out, lse, dq, dk, dv}, r = 2 (3 with softcap), atol = 2 * max|rd(rd(x + 0.3) - 0.3) - x| with rd
// the rounding to the input dtype.
//
// X_ref32: flashgrad's CPU reference in fp32 on the same (already rounded) inputs.
// X_lowp:  a plain implementation here that rounds what a framework's bf16/fp16 attention rounds
//          (every matmul output and elementwise result: S, the capped S, P, O, dP, dS, Delta, dq,
//          dk, dv), accumulating in fp32 - what "torch attention in bf16" does, written out on the
//          CPU so the test needs no framework. Masks come from the reference's SequenceMask.
// Every case draws fresh random inputs, poisons all outputs with NaN before each call, and checks
// every element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/attention_validation.h"
#include "core/host_dtype.h"
#include "cuda/attention/sequence_and_mask.cuh"
#include "flashgrad/attention.h"
#include "flashgrad/status.h"
#include "gpu_test_util.h"
#include "reference/attention/mask.h"

namespace flashgrad::gpu_test {
namespace {

using flashgrad::test::round_to;




uint16_t encode(DType dt, float x) {
  return dt == DType::bf16 ? host::float_to_bf16(x) : host::float_to_f16(x);
}
float decode(DType dt, uint16_t h) {
  return dt == DType::bf16 ? host::bf16_to_float(h) : host::f16_to_float(h);
}

// ---- a test problem ----------------------------------------------------------------------------
struct Config {
  std::string name;
  DType dtype = DType::bf16;
  int d = 128;
  int hq = 2, hk = 2;
  int batch = 2, sq = 128, sk = 128;  // padded
  std::vector<int> lens_q, lens_k;    // varlen when non-empty
  MaskKind mask = MaskKind::none;
  int64_t wl = -1, wr = -1;
  std::vector<int> prefix;  // prefix_lm, one per sequence
  std::vector<int> bounds;  // candidate_isolation, 4 per sequence
  float softcap = 0.f;
  SoftcapMethod method = SoftcapMethod::tanh;
  bool with_dlse = false;
  float z_loss = 0.f;
  bool deterministic = false;
  bool packed_qkv = false;  // q, k, v are head slices of one [B, S, Hq + 2 Hk, D] buffer
};

struct Geometry {
  bool varlen;
  int n;            // sequences
  int64_t tq, tk;   // tokens
  std::vector<int> cu_q, cu_k;
  int max_q, max_k;
};

Geometry geometry(const Config& c) {
  Geometry g;
  g.varlen = !c.lens_q.empty();
  if (g.varlen) {
    g.n = static_cast<int>(c.lens_q.size());
    g.cu_q = {0};
    g.cu_k = {0};
    for (int i = 0; i < g.n; ++i) {
      g.cu_q.push_back(g.cu_q.back() + c.lens_q[i]);
      g.cu_k.push_back(g.cu_k.back() + c.lens_k[i]);
    }
    g.tq = g.cu_q.back();
    g.tk = g.cu_k.back();
    g.max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
    g.max_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  } else {
    g.n = c.batch;
    g.tq = int64_t{c.batch} * c.sq;
    g.tk = int64_t{c.batch} * c.sk;
    g.max_q = c.sq;
    g.max_k = c.sk;
  }
  return g;
}

// Shapes of the token-major tensors and of lse.
std::vector<int64_t> token_shape(const Config& c, const Geometry& g, bool is_q, int heads) {
  if (g.varlen) return {is_q ? g.tq : g.tk, heads, c.d};
  return {c.batch, is_q ? c.sq : c.sk, heads, c.d};
}
std::vector<int64_t> lse_shape(const Config& c, const Geometry& g) {
  if (g.varlen) return {c.hq, g.tq};
  return {c.batch, c.hq, c.sq};
}

TensorView view(void* data, DType dt, const std::vector<int64_t>& shape, Device dev,
                const std::vector<int64_t>& strides = {}) {
  TensorView t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.rank = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = strides.empty() ? s : strides[i];
    s *= shape[i];
  }
  return t;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// Host arrays of one case (inputs already rounded to the dtype, kept as float).
struct HostCase {
  Config cfg;
  Geometry geo;
  std::vector<float> q, k, v, dout, dlse;
  std::vector<int32_t> cu_q, cu_k, prefix, bounds;
};

HostCase make_case(const Config& c, std::mt19937& rng) {
  HostCase h;
  h.cfg = c;
  h.geo = geometry(c);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(n);
    for (auto& e : x) e = round_to(c.dtype, normal(rng));
  };
  fill(h.q, numel(token_shape(c, h.geo, true, c.hq)));
  fill(h.k, numel(token_shape(c, h.geo, false, c.hk)));
  fill(h.v, numel(token_shape(c, h.geo, false, c.hk)));
  fill(h.dout, numel(token_shape(c, h.geo, true, c.hq)));
  if (c.with_dlse) {
    h.dlse.resize(numel(lse_shape(c, h.geo)));
    for (auto& e : h.dlse) e = normal(rng);
  }
  h.cu_q.assign(h.geo.cu_q.begin(), h.geo.cu_q.end());
  h.cu_k.assign(h.geo.cu_k.begin(), h.geo.cu_k.end());
  h.prefix.assign(c.prefix.begin(), c.prefix.end());
  h.bounds.assign(c.bounds.begin(), c.bounds.end());
  return h;
}

AttentionParams base_params(const Config& c) {
  AttentionParams p;
  p.mask = c.mask;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.softcap = c.softcap;
  p.softcap_method = c.method;
  p.deterministic = c.deterministic;
  return p;
}

// ---- CPU: the fp32 reference ---------------------------------------------------------------------
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

AttentionParams cpu_params(HostCase& h) {
  const Config& c = h.cfg;
  AttentionParams p = base_params(c);
  p.deterministic = false;
  p.q = view(h.q.data(), DType::f32, token_shape(c, h.geo, true, c.hq), Device::cpu);
  p.k = view(h.k.data(), DType::f32, token_shape(c, h.geo, false, c.hk), Device::cpu);
  p.v = view(h.v.data(), DType::f32, token_shape(c, h.geo, false, c.hk), Device::cpu);
  if (h.geo.varlen) {
    p.cu_seqlens_q = view(h.cu_q.data(), DType::i32, {h.geo.n + 1}, Device::cpu);
    p.cu_seqlens_k = view(h.cu_k.data(), DType::i32, {h.geo.n + 1}, Device::cpu);
    p.max_seqlen_q = h.geo.max_q;
    p.max_seqlen_k = h.geo.max_k;
  }
  if (!h.prefix.empty()) p.prefix_lengths = view(h.prefix.data(), DType::i32, {h.geo.n}, Device::cpu);
  if (!h.bounds.empty())
    p.candidate_bounds = view(h.bounds.data(), DType::i32, {h.geo.n, 4}, Device::cpu);
  return p;
}

Outputs run_reference(HostCase& h) {
  const Config& c = h.cfg;
  AttentionParams p = cpu_params(h);
  Outputs r;
  r.out.resize(h.q.size());
  r.lse.resize(numel(lse_shape(c, h.geo)));
  const TensorView out = view(r.out.data(), DType::f32, token_shape(c, h.geo, true, c.hq), Device::cpu);
  const TensorView lse = view(r.lse.data(), DType::f32, lse_shape(c, h.geo), Device::cpu);
  attention_forward(p, out, lse);
  r.dq.resize(h.q.size());
  r.dk.resize(h.k.size());
  r.dv.resize(h.v.size());
  AttentionBackwardInputs in;
  in.out = out;
  in.lse = lse;
  in.dout = view(h.dout.data(), DType::f32, token_shape(c, h.geo, true, c.hq), Device::cpu);
  if (c.with_dlse) in.dlse = view(h.dlse.data(), DType::f32, lse_shape(c, h.geo), Device::cpu);
  in.z_loss_weight = c.z_loss;
  attention_backward(p, in, view(r.dq.data(), DType::f32, token_shape(c, h.geo, true, c.hq), Device::cpu),
                     view(r.dk.data(), DType::f32, token_shape(c, h.geo, false, c.hk), Device::cpu),
                     view(r.dv.data(), DType::f32, token_shape(c, h.geo, false, c.hk), Device::cpu));
  return r;
}

// ---- CPU: the low-precision "framework" emulation -------------------------------------------------
Outputs run_lowp(HostCase& h) {
  const Config& c = h.cfg;
  const DType dt = c.dtype;
  AttentionParams p = cpu_params(h);
  const AttentionProblem pr = validate_attention_inputs("lowp", p);
  const int D = c.d, group = c.hq / c.hk;
  Outputs r;
  r.out.assign(h.q.size(), 0.f);
  r.lse.assign(numel(lse_shape(c, h.geo)), -INFINITY);
  r.dq.assign(h.q.size(), 0.f);
  std::vector<float> dk32(h.k.size(), 0.f), dv32(h.v.size(), 0.f);
  auto rd = [&](float x) { return round_to(dt, x); };
  auto qrow = [&](int64_t n, int64_t i, int head) {  // element offset of a q-like row
    return ((h.geo.varlen ? 0 : n * c.sq) + pr.q_begin(n) + i) * c.hq * D + int64_t{head} * D;
  };
  auto krow = [&](int64_t n, int64_t j, int head) {
    return ((h.geo.varlen ? 0 : n * c.sk) + pr.k_begin(n) + j) * c.hk * D + int64_t{head} * D;
  };
  auto lse_at = [&](int64_t n, int64_t i, int head) {
    return h.geo.varlen ? int64_t{head} * h.geo.tq + pr.q_begin(n) + i
                        : (n * c.hq + head) * c.sq + i;
  };
  for (int64_t n = 0; n < pr.num_seqs; ++n) {
    const reference::attn::SequenceMask mask(p, pr, n);
    const int64_t lq = pr.q_len(n), lk = pr.k_len(n);
    for (int head = 0; head < c.hq; ++head) {
      const int kh = head / group;
      for (int64_t i = 0; i < lq; ++i) {
        const float* qi = &h.q[qrow(n, i, head)];
        std::vector<float> s(lk, -INFINITY), factor(lk, 1.f), pr_(lk, 0.f);
        float mx = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          if (!mask.allowed(i, j)) continue;
          const float* kj = &h.k[krow(n, j, kh)];
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += qi[d] * kj[d];
          float x = rd(rd(dot) * pr.scale);
          if (c.softcap > 0.f) {
            if (c.method == SoftcapMethod::tanh) {
              x = rd(c.softcap * std::tanh(x / c.softcap));
              factor[j] = 1.f - (x / c.softcap) * (x / c.softcap);
            } else {
              const float den = 1.f + std::fabs(x) / c.softcap;
              factor[j] = 1.f / (den * den);
              x = rd(x / den);
            }
          }
          s[j] = x;
          mx = std::max(mx, x);
        }
        if (mx == -INFINITY) continue;  // fully masked: out 0, lse -inf, no gradient
        float sum = 0.f;
        for (int64_t j = 0; j < lk; ++j) sum += std::exp(s[j] - mx);
        const float lse = mx + std::log(sum);
        r.lse[lse_at(n, i, head)] = lse;
        for (int64_t j = 0; j < lk; ++j) pr_[j] = rd(std::exp(s[j] - mx) / sum);
        float* oi = &r.out[qrow(n, i, head)];
        for (int d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j) acc += pr_[j] * h.v[krow(n, j, kh) + d];
          oi[d] = rd(acc);
        }
        // Backward of this row.
        const float* doi = &h.dout[qrow(n, i, head)];
        float delta = 0.f;
        for (int d = 0; d < D; ++d) delta += doi[d] * oi[d];
        delta = rd(delta);
        float dl = c.z_loss * lse;
        if (c.with_dlse) dl += h.dlse[lse_at(n, i, head)];
        std::vector<float> dsrow(lk, 0.f);
        for (int64_t j = 0; j < lk; ++j) {
          if (pr_[j] == 0.f && s[j] == -INFINITY) continue;
          const float* vj = &h.v[krow(n, j, kh)];
          float dp = 0.f;
          for (int d = 0; d < D; ++d) dp += doi[d] * vj[d];
          dsrow[j] = rd(pr_[j] * (rd(dp) - delta + dl) * factor[j]);
          for (int d = 0; d < D; ++d) {
            dv32[krow(n, j, kh) + d] += pr_[j] * doi[d];
            dk32[krow(n, j, kh) + d] += dsrow[j] * qi[d];
          }
        }
        float* dqi = &r.dq[qrow(n, i, head)];
        for (int d = 0; d < D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < lk; ++j) acc += dsrow[j] * h.k[krow(n, j, kh) + d];
          dqi[d] = rd(acc * pr.scale);
        }
      }
    }
  }
  r.dk.resize(dk32.size());
  r.dv.resize(dv32.size());
  for (size_t x = 0; x < dk32.size(); ++x) r.dk[x] = rd(dk32[x] * pr.scale);
  for (size_t x = 0; x < dv32.size(); ++x) r.dv[x] = rd(dv32[x]);
  return r;
}

// ---- GPU run -------------------------------------------------------------------------------------
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    if (count > 0 && cudaMalloc(&ptr, count * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  void upload(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() { if (n) cudaMemset(ptr, 0xff, n * sizeof(T)); }  // NaN in bf16, fp16 and fp32
};

std::vector<uint16_t> encode_all(DType dt, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = encode(dt, x[i]);
  return h;
}
std::vector<float> decode_all(DType dt, const std::vector<uint16_t>& x) {
  std::vector<float> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = decode(dt, x[i]);
  return h;
}

struct GpuRun {
  Outputs first;
  std::vector<uint16_t> dq_bits, dk_bits, dv_bits;          // first backward
  std::vector<uint16_t> dq_bits2, dk_bits2, dv_bits2;       // second backward (same inputs)
};

// q, k, v on the device, optionally as head slices of one packed buffer (row stride
// (Hq + 2 Hk) D): exercises free row strides.
GpuRun run_gpu(HostCase& h, bool twice) {
  const Config& c = h.cfg;
  const Geometry& g = h.geo;
  const DType dt = c.dtype;
  const auto qs = token_shape(c, g, true, c.hq), ks = token_shape(c, g, false, c.hk);
  const auto ls = lse_shape(c, g);

  std::vector<uint16_t> qh = encode_all(dt, h.q), kh = encode_all(dt, h.k), vh = encode_all(dt, h.v);
  DeviceArray<uint16_t> dq_(qh.size()), dk_(kh.size()), dv_(vh.size()), out_(qh.size()), dout_(qh.size());
  DeviceArray<float> lse_(numel(ls)), dlse_(h.dlse.size());
  DeviceArray<int32_t> cuq(h.cu_q.size()), cuk(h.cu_k.size()), pre(h.prefix.size()), bnd(h.bounds.size());
  cuq.upload(h.cu_q);
  cuk.upload(h.cu_k);
  pre.upload(h.prefix);
  bnd.upload(h.bounds);
  dout_.upload(encode_all(dt, h.dout));
  dlse_.upload(h.dlse);

  AttentionParams p = base_params(c);
  const int heads_all = c.hq + 2 * c.hk;
  DeviceArray<uint16_t> packed(c.packed_qkv ? numel(qs) / c.hq * heads_all : 0);
  DeviceArray<uint16_t> qd(c.packed_qkv ? 0 : qh.size()), kd(c.packed_qkv ? 0 : kh.size()),
      vd(c.packed_qkv ? 0 : vh.size());
  if (c.packed_qkv) {
    // [B, S, Hq + 2Hk, D]: q heads first, then k, then v.
    const int64_t rows = numel(qs) / (int64_t{c.hq} * c.d);
    std::vector<uint16_t> all(rows * heads_all * c.d);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&all[r * heads_all * c.d], &qh[r * c.hq * c.d], c.hq * c.d * 2);
      std::memcpy(&all[(r * heads_all + c.hq) * c.d], &kh[r * c.hk * c.d], c.hk * c.d * 2);
      std::memcpy(&all[(r * heads_all + c.hq + c.hk) * c.d], &vh[r * c.hk * c.d], c.hk * c.d * 2);
    }
    packed.upload(all);
    const int64_t rs = int64_t{heads_all} * c.d;
    std::vector<int64_t> st = {c.sq * rs, rs, c.d, 1};
    p.q = view(packed.ptr, dt, qs, Device::cuda, st);
    p.k = view(packed.ptr + c.hq * c.d, dt, ks, Device::cuda, st);
    p.v = view(packed.ptr + (c.hq + c.hk) * c.d, dt, ks, Device::cuda, st);
  } else {
    qd.upload(qh);
    kd.upload(kh);
    vd.upload(vh);
    p.q = view(qd.ptr, dt, qs, Device::cuda);
    p.k = view(kd.ptr, dt, ks, Device::cuda);
    p.v = view(vd.ptr, dt, ks, Device::cuda);
  }
  if (g.varlen) {
    p.cu_seqlens_q = view(cuq.ptr, DType::i32, {g.n + 1}, Device::cuda);
    p.cu_seqlens_k = view(cuk.ptr, DType::i32, {g.n + 1}, Device::cuda);
    p.max_seqlen_q = g.max_q;
    p.max_seqlen_k = g.max_k;
  }
  if (!h.prefix.empty()) p.prefix_lengths = view(pre.ptr, DType::i32, {g.n}, Device::cuda);
  if (!h.bounds.empty()) p.candidate_bounds = view(bnd.ptr, DType::i32, {g.n, 4}, Device::cuda);

  const TensorView out = view(out_.ptr, dt, qs, Device::cuda);
  const TensorView lse = view(lse_.ptr, DType::f32, ls, Device::cuda);
  out_.poison();
  lse_.poison();
  attention_forward(p, out, lse);
  AttentionBackwardInputs in;
  in.out = out;
  in.lse = lse;
  in.dout = view(dout_.ptr, dt, qs, Device::cuda);
  if (c.with_dlse) in.dlse = view(dlse_.ptr, DType::f32, ls, Device::cuda);
  in.z_loss_weight = c.z_loss;
  GpuRun r;
  for (int rep = 0; rep < (twice ? 2 : 1); ++rep) {
    dq_.poison();
    dk_.poison();
    dv_.poison();
    attention_backward(p, in, view(dq_.ptr, dt, qs, Device::cuda), view(dk_.ptr, dt, ks, Device::cuda),
                       view(dv_.ptr, dt, ks, Device::cuda));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    (rep == 0 ? r.dq_bits : r.dq_bits2) = dq_.download();
    (rep == 0 ? r.dk_bits : r.dk_bits2) = dk_.download();
    (rep == 0 ? r.dv_bits : r.dv_bits2) = dv_.download();
  }
  r.first.out = decode_all(dt, out_.download());
  r.first.lse = lse_.download();
  r.first.dq = decode_all(dt, r.dq_bits);
  r.first.dk = decode_all(dt, r.dk_bits);
  r.first.dv = decode_all(dt, r.dv_bits);
  return r;
}

// ---- the 2x rule -----------------------------------------------------------------------------------
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // also equal infinities (lse of fully masked rows)
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

void expect_2x_rule(const char* what, const std::vector<float>& gpu, const std::vector<float>& ref,
                    const std::vector<float>& lowp, DType rounding, double r) {
  ASSERT_EQ(gpu.size(), ref.size());
  const double err = max_diff(gpu, ref), base = max_diff(lowp, ref);
  double atol = 0;
  for (float x : ref) {
    if (!std::isfinite(x)) continue;
    const float xr = rounding == DType::f32 ? x : round_to(rounding, x);
    const float back = rounding == DType::f32 ? (x + 0.3f) - 0.3f
                                              : round_to(rounding, round_to(rounding, xr + 0.3f) - 0.3f);
    atol = std::max(atol, 2.0 * std::fabs(double(back) - double(x)));
  }
  EXPECT_LE(err, r * base + atol) << what << ": max|gpu - ref32| = " << err
                                  << ", max|lowp - ref32| = " << base << ", atol = " << atol;
  std::printf("    %-4s max|gpu-ref| %.3e  max|lowp-ref| %.3e  atol %.1e\n", what, err, base, atol);
}

void check_case(const Config& c) {
  std::mt19937 rng(std::random_device{}());
  HostCase h = make_case(c, rng);
  const Outputs ref = run_reference(h);
  const Outputs low = run_lowp(h);
  const GpuRun gpu = run_gpu(h, c.deterministic);
  const double r = c.softcap > 0.f ? 3.0 : 2.0;
  std::printf("  case %s\n", c.name.c_str());
  expect_2x_rule("out", gpu.first.out, ref.out, low.out, c.dtype, r);
  expect_2x_rule("lse", gpu.first.lse, ref.lse, low.lse, DType::f32, r);
  expect_2x_rule("dq", gpu.first.dq, ref.dq, low.dq, c.dtype, r);
  expect_2x_rule("dk", gpu.first.dk, ref.dk, low.dk, c.dtype, r);
  expect_2x_rule("dv", gpu.first.dv, ref.dv, low.dv, c.dtype, r);
  if (c.deterministic) {
    EXPECT_TRUE(gpu.dq_bits == gpu.dq_bits2) << "deterministic dq differs between two runs";
    EXPECT_TRUE(gpu.dk_bits == gpu.dk_bits2) << "deterministic dk differs between two runs";
    EXPECT_TRUE(gpu.dv_bits == gpu.dv_bits2) << "deterministic dv differs between two runs";
  }
}

Config named(const std::string& name, Config c) {
  c.name = name;
  return c;
}

// ---- cases ---------------------------------------------------------------------------------------
TEST(AttentionGpu, HeadDimsAndDtypes) {
  REQUIRE_GPU();
  for (int d : {64, 128, 256}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      Config c;
      c.d = d;
      c.dtype = dt;
      c.sq = 130;
      c.sk = 130;
      check_case(named("none d" + std::to_string(d) + " " + dtype_name(dt), c));
    }
  }
}

TEST(AttentionGpu, OddLengthsCausalAndNone) {
  REQUIRE_GPU();
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    for (auto [sq, sk] : {std::pair{37, 53}, std::pair{37, 113}, std::pair{113, 37}, std::pair{200, 200}}) {
      Config c;
      c.mask = m;
      c.sq = sq;
      c.sk = sk;
      c.d = 64;
      check_case(named(std::string(mask_name(m)) + " Sq=" + std::to_string(sq) + " Sk=" +
                           std::to_string(sk), c));
    }
  }
}

TEST(AttentionGpu, SlidingWindow) {
  REQUIRE_GPU();
  for (auto [wl, wr] : {std::pair<int64_t, int64_t>{16, 8}, {70, 0}, {-1, 5}, {0, -1}, {0, 0}}) {
    Config c;
    c.mask = MaskKind::sliding_window;
    c.wl = wl;
    c.wr = wr;
    c.sq = 150;
    c.sk = 170;
    check_case(named("window " + std::to_string(wl) + "," + std::to_string(wr), c));
  }
}

TEST(AttentionGpu, PrefixLm) {
  REQUIRE_GPU();
  Config c;
  c.mask = MaskKind::prefix_lm;
  c.batch = 3;
  c.sq = 140;
  c.sk = 140;
  c.prefix = {0, 70, 140};
  check_case(named("prefix_lm", c));
  c.sq = 100;
  c.sk = 160;
  c.prefix = {5, 130, 100};
  check_case(named("prefix_lm Sq<Sk", c));
}

TEST(AttentionGpu, CandidateIsolation) {
  REQUIRE_GPU();
  Config c;
  c.mask = MaskKind::candidate_isolation;
  c.batch = 3;
  c.sq = 200;
  c.sk = 200;
  c.bounds = {0, 120, 120, 200,   // history then candidates
              10, 60, 150, 190,   // gaps: rows outside both see nothing
              0, 0, 0, 200};      // no history: candidates see only themselves
  check_case(named("candidate_isolation", c));
}

TEST(AttentionGpu, Softcap) {
  REQUIRE_GPU();
  for (SoftcapMethod m : {SoftcapMethod::tanh, SoftcapMethod::soft_sign}) {
    Config c;
    c.softcap = 2.0f;
    c.method = m;
    c.mask = MaskKind::causal;
    c.sq = 97;
    c.sk = 140;
    check_case(named(std::string("softcap ") + softcap_method_name(m), c));
  }
}

TEST(AttentionGpu, GqaAndMqa) {
  REQUIRE_GPU();
  Config c;
  c.hq = 8;
  c.hk = 2;
  c.sq = 77;
  c.sk = 130;
  c.mask = MaskKind::causal;
  check_case(named("gqa 8/2 causal", c));
  c.hq = 4;
  c.hk = 1;
  c.mask = MaskKind::none;
  c.d = 256;
  check_case(named("mqa 4/1 d256", c));
}

TEST(AttentionGpu, VarlenWithEmptySequences) {
  REQUIRE_GPU();
  Config c;
  c.lens_q = {37, 0, 130, 5, 64};
  c.lens_k = {53, 0, 130, 0, 64};
  c.hq = 4;
  c.hk = 2;
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    c.mask = m;
    check_case(named(std::string("varlen ") + mask_name(m), c));
  }
  c.mask = MaskKind::prefix_lm;
  c.prefix = {10, 0, 64, 3, 64};
  check_case(named("varlen prefix_lm", c));
}

TEST(AttentionGpu, LseGradientAndZLoss) {
  REQUIRE_GPU();
  Config c;
  c.with_dlse = true;
  c.z_loss = 0.5f;
  c.mask = MaskKind::causal;
  c.sq = 90;
  c.sk = 60;  // rows 0..29 see nothing: dlse / z-loss must not leak into them
  check_case(named("dlse + z_loss, fully masked rows", c));
}

TEST(AttentionGpu, DeterministicIsBitwiseRepeatable) {
  REQUIRE_GPU();
  for (int d : {64, 128, 256}) {
    Config c;
    c.deterministic = true;
    c.d = d;
    c.hq = 4;
    c.hk = 2;
    c.sq = 150;
    c.sk = 190;
    c.mask = d == 128 ? MaskKind::causal : MaskKind::none;
    check_case(named("deterministic d" + std::to_string(d), c));
  }
}

// The wgmma backward (default for head dims 64 / 128) over longer walks: several key blocks per
// CTA row, many query tiles per key block (the 2-slot Q / dO ring and the dQ staging handshake go
// through many phases), GQA groups, both dtypes; lengths off the 64 / 128 tile sizes.
TEST(AttentionGpu, BackwardLongWalks) {
  REQUIRE_GPU();
  Config c;
  c.batch = 1;
  c.hq = 4;
  c.hk = 2;
  c.sq = 700;
  c.sk = 650;
  c.mask = MaskKind::causal;
  check_case(named("gqa 4/2 causal d128 bf16 Sq=700 Sk=650", c));
  c.d = 64;
  c.dtype = DType::f16;
  c.mask = MaskKind::none;
  c.sq = 333;
  c.sk = 517;
  check_case(named("gqa 4/2 none d64 f16 Sq=333 Sk=517", c));
  // varlen at D = 64 (128-query tiles running into the next sequence, empty sequences), causal.
  c.lens_q = {300, 0, 129, 5, 200};
  c.lens_k = {300, 0, 260, 0, 64};
  c.mask = MaskKind::causal;
  check_case(named("varlen gqa 4/2 causal d64 f16", c));
  // D = 256: 64-key blocks, the head dim split between the consumer warpgroups, dQ by atomics.
  c.lens_q.clear();
  c.lens_k.clear();
  c.d = 256;
  c.dtype = DType::bf16;
  c.sq = 300;
  c.sk = 333;
  check_case(named("gqa 4/2 causal d256 bf16 Sq=300 Sk=333", c));
  c.mask = MaskKind::none;
  c.softcap = 20.f;
  check_case(named("gqa 4/2 softcap d256 bf16 Sq=300 Sk=333", c));
}

// The mma.sync backward stays reachable (FLASHGRAD_ATTN_BACKWARD=legacy, and for head dim 256):
// one causal GQA and one varlen case through it, so the fallback keeps its coverage.
TEST(AttentionGpu, LegacyBackwardFallback) {
  REQUIRE_GPU();
  const flashgrad::test::EnvSet legacy_backward("FLASHGRAD_ATTN_BACKWARD", "legacy");
  Config c;
  c.hq = 4;
  c.hk = 2;
  c.sq = 150;
  c.sk = 190;
  c.mask = MaskKind::causal;
  check_case(named("legacy backward gqa causal d128", c));
  c.d = 64;
  c.lens_q = {37, 0, 130, 5, 64};
  c.lens_k = {53, 0, 130, 0, 64};
  c.mask = MaskKind::none;
  check_case(named("legacy backward varlen d64", c));
  c.lens_q.clear();
  c.lens_k.clear();
  c.d = 256;
  c.mask = MaskKind::causal;
  check_case(named("legacy backward causal d256 (two passes)", c));
}

TEST(AttentionGpu, PackedQkvStrides) {
  REQUIRE_GPU();
  Config c;
  c.packed_qkv = true;
  c.hq = 4;
  c.hk = 2;
  c.sq = c.sk = 100;
  c.mask = MaskKind::causal;
  check_case(named("packed qkv (row stride (Hq + 2Hk) D)", c));
}

TEST(AttentionGpu, UnsupportedHeadDimNamesTheArgument) {
  REQUIRE_GPU();
  DeviceArray<uint16_t> buf(2 * 16 * 2 * 96), out(2 * 16 * 2 * 96);
  DeviceArray<float> lse(2 * 2 * 16);
  AttentionParams p;
  p.q = p.k = p.v = view(buf.ptr, DType::bf16, {2, 16, 2, 96}, Device::cuda);
  try {
    attention_forward(p, view(out.ptr, DType::bf16, {2, 16, 2, 96}, Device::cuda),
                      view(lse.ptr, DType::f32, {2, 2, 16}, Device::cuda));
    ADD_FAILURE() << "head dim 96 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
    EXPECT_EQ(e.argument(), "q") << e.what();
  }
}

// ---- the kernels' mask logic on the host ------------------------------------------------------------
// The kernels skip tiles by MaskView::classify and test partial tiles with per-row / per-key ranges.
// Here (host only, no GPU needed) both are checked exhaustively against the CPU reference's
// SequenceMask::allowed on random sequences: element rule, row ranges and key ranges exactly;
// tile classes soundly (empty = no allowed pair, full = every pair allowed) and tightly (a tile with
// no allowed pair is always classified empty, so no mask does work on masked-out tiles).
TEST(AttentionMaskTiles, MatchTheReferenceRule) {
  std::mt19937 rng(std::random_device{}());
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const MaskKind kinds[] = {MaskKind::none, MaskKind::causal, MaskKind::sliding_window,
                            MaskKind::prefix_lm, MaskKind::candidate_isolation};
  const int codes[] = {cuda_attn::kMaskNone, cuda_attn::kMaskCausal, cuda_attn::kMaskWindow,
                       cuda_attn::kMaskPrefix, cuda_attn::kMaskCandidate};
  const std::pair<int, int> blocks[] = {{128, 32}, {128, 64}, {64, 64}, {64, 128}, {16, 16}};
  int64_t mismatches = 0;
  for (int trial = 0; trial < 1500 && mismatches == 0; ++trial) {
    const int kind = trial % 5;
    const int lq = uni(0, 200);
    const int lk = kinds[kind] == MaskKind::candidate_isolation ? lq : uni(0, 200);
    AttentionParams p;
    p.mask = kinds[kind];
    AttentionProblem pr;
    pr.num_seqs = 1;
    pr.seqlen_q = lq;
    pr.seqlen_k = lk;
    cuda_attn::MaskView mv;
    mv.kind = codes[kind];
    mv.offset = lk - lq;
    mv.len_q = lq;
    mv.len_k = lk;
    if (p.mask == MaskKind::sliding_window) {
      const int pick[] = {-1, 0, 1, uni(0, 40), uni(0, 400)};
      p.window_left = mv.wl = pick[uni(0, 4)];
      p.window_right = mv.wr = pick[uni(0, 4)];
    }
    if (p.mask == MaskKind::prefix_lm) {
      mv.prefix = uni(0, lk + 5);
      pr.prefix_lengths = {mv.prefix};
    }
    if (p.mask == MaskKind::candidate_isolation) {
      // Disjoint [h0, h1) and [c0, c1) in either order, possibly empty, with gaps.
      std::vector<int> cut = {uni(0, lq), uni(0, lq), uni(0, lq), uni(0, lq)};
      std::sort(cut.begin(), cut.end());
      const bool history_first = uni(0, 1) == 1;
      mv.h0 = history_first ? cut[0] : cut[2];
      mv.h1 = history_first ? cut[1] : cut[3];
      mv.c0 = history_first ? cut[2] : cut[0];
      mv.c1 = history_first ? cut[3] : cut[1];
      pr.candidate_bounds = {mv.h0, mv.h1, mv.c0, mv.c1};
    }
    const reference::attn::SequenceMask ref(p, pr, 0);
    auto ref_allowed = [&](int i, int j) { return i >= 0 && j >= 0 && i < lq && j < lk && ref.allowed(i, j); };
    const std::string where = std::string(mask_name(p.mask)) + " Sq=" + std::to_string(lq) +
                              " Sk=" + std::to_string(lk) + " wl=" + std::to_string(mv.wl) +
                              " wr=" + std::to_string(mv.wr) + " P=" + std::to_string(mv.prefix) +
                              " h=[" + std::to_string(mv.h0) + "," + std::to_string(mv.h1) + ") c=[" +
                              std::to_string(mv.c0) + "," + std::to_string(mv.c1) + ")";
    for (int i = 0; i < lq + 3; ++i) {
      int lo, hi, diag;
      mv.query_keys(i, lo, hi, diag);
      for (int j = 0; j < lk + 3; ++j) {
        const bool want = ref_allowed(i, j);
        const bool by_range = (j >= lo && j < hi) || j == diag;
        if (i < lq && j < lk && mv.allowed(i, j) != want) {
          ++mismatches;
          ADD_FAILURE() << where << ": MaskView::allowed(" << i << ", " << j << ") = " << !want;
        }
        if (by_range != want) ++mismatches;
        EXPECT_EQ(by_range, want) << where << ": row range of query " << i << " at key " << j;
        if (mismatches) break;
      }
      if (mismatches) break;
    }
    for (int j = 0; j < lk + 3 && mismatches == 0; ++j) {
      int lo, hi;
      if (!mv.key_queries(j, lo, hi)) continue;
      for (int i = 0; i < lq + 3; ++i) {
        const bool want = ref_allowed(i, j), by_range = i >= lo && i < hi;
        if (by_range != want) ++mismatches;
        EXPECT_EQ(by_range, want) << where << ": key range of key " << j << " at query " << i;
        if (mismatches) break;
      }
    }
    for (auto [bm, bn] : blocks) {
      for (int m0 = 0; m0 < lq && mismatches == 0; m0 += bm) {
        for (int n0 = 0; n0 < lk; n0 += bn) {
          bool any = false, all = m0 + bm <= lq && n0 + bn <= lk;
          for (int i = m0; i < m0 + bm; ++i)
            for (int j = n0; j < n0 + bn; ++j) {
              const bool a = ref_allowed(i, j);
              any = any || a;
              if (i < lq && j < lk) all = all && a;
            }
          const int cls = mv.classify(m0, m0 + bm, n0, n0 + bn);
          const bool bad = (cls == cuda_attn::kTileEmpty) != !any || (cls == cuda_attn::kTileFull && !all);
          if (bad) ++mismatches;
          EXPECT_FALSE(bad) << where << ": tile [" << m0 << "," << m0 + bm << ") x [" << n0 << ","
                            << n0 + bn << ") classified " << cls << ", any allowed " << any
                            << ", all allowed " << all;
          if (mismatches) break;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- past 2^31 elements ------------------------------------------------------------------------
// Fills x[i] = rd(uniform(-2, 2)) from a hash of (seed, i): gigabytes of inputs without a host copy.
__global__ void fill_hashed(uint16_t* x, int64_t n, uint32_t seed, bool bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 4.f - 2.f;
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(u);
      x[i] = *reinterpret_cast<const uint16_t*>(&b);
    } else {
      const __half b = __float2half_rn(u);
      x[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
  }
}

// q, out, dout, dq have B * S * H * D = 8193 * 128 * 16 * 128 = 2^31 + 2^18 elements, so element
// offsets of the last batches overflow int32. Forward and backward run over the whole problem; the
// first, a middle and the last batch are checked against the CPU reference by the 2x rule.
TEST(AttentionGpu, PastTwoToThe31Elements) {
  REQUIRE_GPU();
  const int B = 8193, S = 128, H = 16, D = 128;
  const int64_t n = int64_t{B} * S * H * D;
  ASSERT_GT(n, int64_t{1} << 31);
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < static_cast<size_t>(n) * 2 * 8 + static_cast<size_t>(n) * 4 + (size_t{2} << 30))
    GTEST_SKIP() << "needs about " << (n * 20 >> 30) << " GiB of device memory, " << (free_bytes >> 30) << " free";
  const DType dt = DType::bf16;
  DeviceArray<uint16_t> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n);
  DeviceArray<float> lse(int64_t{B} * H * S);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && out.ptr && dout.ptr && dq.ptr && dk.ptr && dv.ptr && lse.ptr);
  const uint32_t seed = std::random_device{}();
  fill_hashed<<<4096, 256>>>(q.ptr, n, seed, true);
  fill_hashed<<<4096, 256>>>(k.ptr, n, seed + 1, true);
  fill_hashed<<<4096, 256>>>(v.ptr, n, seed + 2, true);
  fill_hashed<<<4096, 256>>>(dout.ptr, n, seed + 3, true);
  out.poison();
  lse.poison();
  dq.poison();
  dk.poison();
  dv.poison();
  AttentionParams p;
  p.mask = MaskKind::causal;
  const std::vector<int64_t> shape = {B, S, H, D};
  p.q = view(q.ptr, dt, shape, Device::cuda);
  p.k = view(k.ptr, dt, shape, Device::cuda);
  p.v = view(v.ptr, dt, shape, Device::cuda);
  const TensorView o = view(out.ptr, dt, shape, Device::cuda);
  const TensorView l = view(lse.ptr, DType::f32, {B, H, S}, Device::cuda);
  attention_forward(p, o, l);
  AttentionBackwardInputs in;
  in.out = o;
  in.lse = l;
  in.dout = view(dout.ptr, dt, shape, Device::cuda);
  attention_backward(p, in, view(dq.ptr, dt, shape, Device::cuda), view(dk.ptr, dt, shape, Device::cuda),
                     view(dv.ptr, dt, shape, Device::cuda));
  CUDA_OK(cudaDeviceSynchronize());

  const int64_t per_batch = int64_t{S} * H * D;
  auto slice = [&](const DeviceArray<uint16_t>& a, int b) {
    std::vector<uint16_t> h(per_batch);
    cudaMemcpy(h.data(), a.ptr + b * per_batch, per_batch * 2, cudaMemcpyDeviceToHost);
    return decode_all(dt, h);
  };
  for (int b : {0, B / 2, B - 1}) {
    Config c;
    c.name = "batch " + std::to_string(b) + " of " + std::to_string(B);
    c.batch = 1;
    c.sq = c.sk = S;
    c.hq = c.hk = H;
    c.d = D;
    c.mask = MaskKind::causal;
    HostCase h;
    h.cfg = c;
    h.geo = geometry(c);
    h.q = slice(q, b);
    h.k = slice(k, b);
    h.v = slice(v, b);
    h.dout = slice(dout, b);
    const Outputs ref = run_reference(h);
    const Outputs low = run_lowp(h);
    Outputs gpu;
    gpu.out = slice(out, b);
    gpu.dq = slice(dq, b);
    gpu.dk = slice(dk, b);
    gpu.dv = slice(dv, b);
    gpu.lse.resize(int64_t{H} * S);
    cudaMemcpy(gpu.lse.data(), lse.ptr + b * int64_t{H} * S, gpu.lse.size() * 4, cudaMemcpyDeviceToHost);
    std::printf("  case %s (element offset %lld)\n", c.name.c_str(), static_cast<long long>(b * per_batch));
    expect_2x_rule("out", gpu.out, ref.out, low.out, dt, 2.0);
    expect_2x_rule("lse", gpu.lse, ref.lse, low.lse, DType::f32, 2.0);
    expect_2x_rule("dq", gpu.dq, ref.dq, low.dq, dt, 2.0);
    expect_2x_rule("dk", gpu.dk, ref.dk, low.dk, dt, 2.0);
    expect_2x_rule("dv", gpu.dv, ref.dv, low.dv, dt, 2.0);
  }
}

}  // namespace
}  // namespace flashgrad::gpu_test
