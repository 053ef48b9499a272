// Benchmark of the CUDA gated delta rule through the public C++ API (flashgrad::delta_rule_*).
// Times forward and backward separately with CUDA events (warm-up, then the median of repeats),
// reports ms, tokens/s, the peak extra memory (the stream-ordered pool's high-water mark during
// the calls plus the saved r), the memory-traffic floor (bytes / 4.25 TB/s) and the ratio against
// fla's numbers from shared/design/anchors.md (anchor values measured earlier on the same kind of
// H200, not re-run here).
//
// Usage: delta_rule_bench [--reps N] [--quick] [--rows 0,3]   (prints a Markdown table to stdout)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashgrad/delta_rule.h"
#include "flashgrad/status.h"

namespace {

using flashgrad::DType;
using flashgrad::TensorView;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

struct Buf {
  void* p = nullptr;
  DType dt = DType::bf16;
  std::vector<int64_t> shape;
  std::size_t bytes = 0;
  Buf() = default;
  Buf(DType d, std::vector<int64_t> s) : dt(d), shape(std::move(s)) {
    int64_t n = 1;
    for (auto x : shape) n *= x;
    bytes = static_cast<std::size_t>(n) * flashgrad::dtype_size(d);
    CHECK(cudaMalloc(&p, bytes));
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept { *this = std::move(o); }
  Buf& operator=(Buf&& o) noexcept {
    std::swap(p, o.p);
    dt = o.dt;
    shape = o.shape;
    bytes = o.bytes;
    return *this;
  }
  ~Buf() {
    if (p) cudaFree(p);
  }
  TensorView view() const {
    TensorView t;
    t.data = p;
    t.dtype = dt;
    t.device = flashgrad::Device::cuda;
    t.rank = static_cast<int>(shape.size());
    int64_t st = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.stride[i] = st;
      st *= shape[i];
    }
    return t;
  }
};

__global__ void fill_kernel(void* p, bool bf16, int64_t n, uint64_t seed, int kind) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float u = (static_cast<float>(x >> 40) + 0.5f) / 16777216.0f;
    float y = (u - 0.5f) * 3.4f;                               // kind 0: roughly unit variance
    if (kind == 1) y = -logf(1.f + expf(-(y + 3.f))) / 4.f;    // gate: logsigmoid / 4
    if (kind == 2) y = 1.f / (1.f + expf(-y));                 // beta in (0, 1)
    if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(y);
    else static_cast<float*>(p)[i] = y;
  }
}
void fill(Buf& b, uint64_t seed, int kind) {
  int64_t n = static_cast<int64_t>(b.bytes / flashgrad::dtype_size(b.dt));
  fill_kernel<<<2048, 256>>>(b.p, b.dt == DType::bf16, n, seed, kind);
  CHECK(cudaGetLastError());
}

struct Row {
  const char* name;
  flashgrad::GateKind gate;
  flashgrad::DeltaRuleAlgorithm algo;
  int64_t B, T, H, K, V;
  double fla_fwd_ms, fla_bwd_ms;  // anchors.md (0: none)
};

double median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

template <typename F>
double time_ms(F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

// High-water mark of the device's default stream-ordered pool while f runs (the backend's
// scratch comes from there when no workspace is passed).
template <typename F>
std::size_t pool_peak(F&& f) {
  cudaMemPool_t pool;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t zero = 0;
  CHECK(cudaMemPoolTrimTo(pool, 0));
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  f();
  CHECK(cudaDeviceSynchronize());
  uint64_t used = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used));
  return used;
}

void run_row(const Row& r, int reps) {
  const int64_t HV = r.H, N = r.B, tokens = r.B * r.T;
  const bool kda = r.gate == flashgrad::GateKind::per_channel;
  Buf q(DType::bf16, {r.B, r.T, r.H, r.K}), k(DType::bf16, {r.B, r.T, r.H, r.K}), v(DType::bf16, {r.B, r.T, HV, r.V});
  Buf g = kda ? Buf(DType::f32, {r.B, r.T, HV, r.K}) : Buf(DType::f32, {r.B, r.T, HV});
  Buf beta(DType::bf16, {r.B, r.T, HV}), h0(DType::f32, {N, HV, r.K, r.V});
  Buf o(DType::bf16, {r.B, r.T, HV, r.V}), ht(DType::f32, {N, HV, r.K, r.V}), saved(DType::bf16, {r.B, r.T, HV, r.V});
  Buf dout(DType::bf16, {r.B, r.T, HV, r.V}), dht(DType::f32, {N, HV, r.K, r.V});
  Buf dq(DType::bf16, {r.B, r.T, r.H, r.K}), dk(DType::bf16, {r.B, r.T, r.H, r.K}), dv(DType::bf16, {r.B, r.T, HV, r.V});
  Buf dg = kda ? Buf(DType::f32, {r.B, r.T, HV, r.K}) : Buf(DType::f32, {r.B, r.T, HV});
  Buf dbeta(DType::bf16, {r.B, r.T, HV}), dh0(DType::f32, {N, HV, r.K, r.V});
  fill(q, 1, 0); fill(k, 2, 0); fill(v, 3, 0); fill(g, 4, 1); fill(beta, 5, 2); fill(h0, 6, 0);
  fill(dout, 7, 0); fill(dht, 8, 0);
  CHECK(cudaDeviceSynchronize());

  flashgrad::DeltaRuleParams p;
  p.q = q.view(); p.k = k.view(); p.v = v.view(); p.g = g.view(); p.beta = beta.view();
  p.initial_state = h0.view(); p.use_qk_l2norm_in_kernel = true; p.algorithm = r.algo;
  flashgrad::DeltaRuleForwardOutputs out;
  out.o = o.view(); out.final_state = ht.view(); out.saved_r = saved.view();
  flashgrad::DeltaRuleBackwardInputs in;
  in.dout = dout.view(); in.dht = dht.view(); in.saved_r = saved.view();
  flashgrad::DeltaRuleGrads gr;
  gr.dq = dq.view(); gr.dk = dk.view(); gr.dv = dv.view(); gr.dg = dg.view(); gr.dbeta = dbeta.view();
  gr.dh0 = dh0.view();

  auto fwd = [&] { flashgrad::delta_rule_forward(p, out); };
  auto bwd = [&] { flashgrad::delta_rule_backward(p, in, gr); };
  const std::size_t fwd_pool = pool_peak(fwd), bwd_pool = pool_peak(bwd);
  const double fwd_ms = time_ms(fwd, 1, reps), bwd_ms = time_ms(bwd, 1, reps);
  const double mib = 1.0 / (1024.0 * 1024.0);
  const double extra_mib = (saved.bytes + std::max(fwd_pool, bwd_pool)) * mib;

  // Traffic floors: every input read once, every output written once.
  const double in_fwd = q.bytes + k.bytes + v.bytes + g.bytes + beta.bytes + h0.bytes;
  const double out_fwd = o.bytes + ht.bytes + saved.bytes;
  const double in_bwd = in_fwd + dout.bytes + dht.bytes + saved.bytes - h0.bytes + h0.bytes;
  const double out_bwd = dq.bytes + dk.bytes + dv.bytes + dg.bytes + dbeta.bytes + dh0.bytes;
  const double floor_fwd = (in_fwd + out_fwd) / 4.25e12 * 1e3, floor_bwd = (in_bwd + out_bwd) / 4.25e12 * 1e3;
  auto ratio = [](double fla, double ours) {
    char b[32];
    if (fla <= 0) return std::string("-");
    std::snprintf(b, sizeof b, "%.2fx", fla / ours);
    return std::string(b);
  };
  std::printf("| %s | %s | %lld %lld %lld | %lld/%lld | %.3f | %.3f | %.2e | %.1f | %.3f / %.3f | %s / %s | %s / %s |\n",
              r.name, r.algo == flashgrad::DeltaRuleAlgorithm::chunked ? "chunked (runs recurrent kernels)" : "recurrent",
              (long long)r.B, (long long)r.T, (long long)r.H, (long long)r.K, (long long)r.V, fwd_ms, bwd_ms,
              tokens / (fwd_ms * 1e-3), extra_mib, floor_fwd, floor_bwd,
              r.fla_fwd_ms > 0 ? std::to_string(r.fla_fwd_ms).substr(0, 5).c_str() : "-",
              r.fla_bwd_ms > 0 ? std::to_string(r.fla_bwd_ms).substr(0, 5).c_str() : "none",
              ratio(r.fla_fwd_ms, fwd_ms).c_str(), ratio(r.fla_bwd_ms, bwd_ms).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool quick = false;
  std::string only;  // --rows 0,3: run only these row indices
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::printf("device: %s (%d SMs), CUDA runtime %d, driver %d; bf16 inputs, f32 gates, L2 norm in kernel,\n"
              "initial and final state; median of %d repeats after 1 warm-up\n\n",
              prop.name, prop.multiProcessorCount, rt, drv, reps);
  std::printf("| op | algorithm | B T H | K/V | fwd ms | bwd ms | fwd tokens/s | peak extra MiB | floor fwd/bwd ms | fla fwd/bwd ms (anchor) | fla/ours fwd / bwd |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  using G = flashgrad::GateKind;
  using A = flashgrad::DeltaRuleAlgorithm;
  const std::vector<Row> rows = {
      {"recurrent GDN", G::scalar, A::recurrent, 4, 4096, 16, 128, 128, 7.204, 0},
      {"chunk GDN", G::scalar, A::chunked, 8, 4096, 16, 128, 128, 0.933, 2.409},
      {"chunk GDN", G::scalar, A::chunked, 1, 32768, 16, 128, 128, 1.281, 3.502},
      {"chunk KDA", G::per_channel, A::chunked, 4, 4096, 16, 128, 128, 0.939, 3.947},
      {"chunk GDN K=V=64", G::scalar, A::chunked, 8, 4096, 16, 64, 64, 1.036, 3.281},
      {"decode GDN (T=1)", G::scalar, A::recurrent, 64, 1, 16, 128, 128, 0, 0},
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (quick && r.T * r.B > 16384) continue;
    if (!only.empty() && only.find("," + std::to_string(i) + ",") == std::string::npos) continue;
    try {
      run_row(r, reps);
    } catch (const flashgrad::Error& e) {
      std::printf("| %s | error: %s |\n", r.name, e.what());
    }
  }
  return 0;
}
