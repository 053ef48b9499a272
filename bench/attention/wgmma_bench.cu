// Forward attention timing, Hopper wgmma kernel against the mma.sync ("legacy") kernel, in one
// process: each row runs through the public attention_forward as plain wgmma (both switches "0"),
// with FLASHGRAD_ATTN_WGMMA_PINGPONG=1 ("pp"), with FLASHGRAD_ATTN_WGMMA_PERSISTENT=1 ("pers"), with
// both, and with FLASHGRAD_ATTN_FORWARD=legacy (all read at every call). Prints TFLOP/s, the ratio
// plain / legacy, the best variant's ratio to the cuDNN anchor of docs anchors.md (measured
// separately on this H200 with torch SDPA, not in this run) and max|default - legacy| over out as a
// sanity check at full size.
//
// FLOPs: 4 * B * H * S * S * D, halved when causal (Sq == Sk), as anchors.md counts them.
// Timing: CUDA events around each call, 3 warm-up calls, median of 10.
// usage: wgmma_bench [--quick] [--no-variants]   (--quick: the hd128 S8192 rows only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flashgrad/attention.h"

namespace {

#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Uniform in [-1, 1) from a hash of the index (no host transfer for multi-GB inputs).
__global__ void fill_hashed(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    x[i] = __float2bfloat16_rn(static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f);
  }
}

struct Row {
  int b, h, s, d;
  bool causal;
  double cudnn_fwd;  // anchors.md, TFLOP/s
};

flashgrad::TensorView dev_view(void* p, flashgrad::DType dt, std::vector<int64_t> shape) {
  flashgrad::TensorView t;
  t.data = p;
  t.dtype = dt;
  t.device = flashgrad::Device::cuda;
  t.rank = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

template <typename F>
double median_ms(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 10; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashgrad;
  bool quick = false, variants = true;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    variants = variants && std::strcmp(argv[i], "--no-variants") != 0;
  }
  std::vector<Row> rows = {
      {2, 16, 8192, 128, true, 560}, {2, 16, 8192, 128, false, 621}, {8, 16, 2048, 128, true, 486},
      {8, 16, 2048, 128, false, 637}, {4, 16, 4096, 64, true, 398},  {4, 16, 4096, 64, false, 451},
      {2, 16, 8192, 256, true, 605},  {2, 16, 8192, 256, false, 649},
  };
  if (quick) rows.resize(2);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("wgmma forward bench on %s, bf16\n", prop.name);
  std::printf("| B H S D | causal | wgmma plain TFLOP/s | +pp | +pers | +pp+pers | legacy | plain/legacy | best/cuDNN anchor | max|plain-legacy| |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const int64_t n = int64_t{r.b} * r.s * r.h * r.d;
    __nv_bfloat16 *q, *k, *v, *o;
    float* lse;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, n * 2));
    CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&lse, int64_t{r.b} * r.h * r.s * 4));
    fill_hashed<<<2048, 256>>>(q, n, 1);
    fill_hashed<<<2048, 256>>>(k, n, 2);
    fill_hashed<<<2048, 256>>>(v, n, 3);
    AttentionParams p;
    p.mask = r.causal ? MaskKind::causal : MaskKind::none;
    const std::vector<int64_t> shape = {r.b, r.s, r.h, r.d};
    p.q = dev_view(q, DType::bf16, shape);
    p.k = dev_view(k, DType::bf16, shape);
    p.v = dev_view(v, DType::bf16, shape);
    const TensorView out = dev_view(o, DType::bf16, shape), lv = dev_view(lse, DType::f32, {r.b, r.h, r.s});
    auto call = [&] { attention_forward(p, out, lv); };
    const double flops = 4.0 * r.b * r.h * double(r.s) * r.s * r.d * (r.causal ? 0.5 : 1.0);

    // Every variant switch set explicitly ("0" / "1"), so the columns keep their meaning whatever
    // the library's defaults are.
    unsetenv("FLASHGRAD_ATTN_FORWARD");
    setenv("FLASHGRAD_ATTN_WGMMA_PINGPONG", "0", 1);
    setenv("FLASHGRAD_ATTN_WGMMA_PERSISTENT", "0", 1);
    const double ms_new = median_ms(call);
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> o_new(n), o_old(n);
    CK(cudaMemcpy(o_new.data(), o, n * 2, cudaMemcpyDeviceToHost));
    // Variants: {pingpong, persistent}.
    double ms_var[3] = {INFINITY, INFINITY, INFINITY};
    const int flags[3][2] = {{1, 0}, {0, 1}, {1, 1}};
    for (int vi = 0; vi < 3 && variants; ++vi) {
      setenv("FLASHGRAD_ATTN_WGMMA_PINGPONG", flags[vi][0] ? "1" : "0", 1);
      setenv("FLASHGRAD_ATTN_WGMMA_PERSISTENT", flags[vi][1] ? "1" : "0", 1);
      ms_var[vi] = median_ms(call);
      CK(cudaDeviceSynchronize());
    }
    unsetenv("FLASHGRAD_ATTN_WGMMA_PINGPONG");
    unsetenv("FLASHGRAD_ATTN_WGMMA_PERSISTENT");
    setenv("FLASHGRAD_ATTN_FORWARD", "legacy", 1);
    const double ms_old = median_ms(call);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o_old.data(), o, n * 2, cudaMemcpyDeviceToHost));
    unsetenv("FLASHGRAD_ATTN_FORWARD");
    double diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(bf16_bits_to_float(o_new[i])) - bf16_bits_to_float(o_old[i]));
      if (!(d <= diff)) diff = std::isnan(d) ? INFINITY : d;
    }
    const double tf_new = flops / ms_new * 1e-9, tf_old = flops / ms_old * 1e-9;
    double tf_var[3], best = tf_new;
    for (int vi = 0; vi < 3; ++vi) best = std::max(best, tf_var[vi] = flops / ms_var[vi] * 1e-9);
    std::printf("| %d %d %d %d | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2fx | %.2fx | %.1e |\n", r.b, r.h, r.s,
                r.d, r.causal ? "yes" : "no", tf_new, tf_var[0], tf_var[1], tf_var[2], tf_old, tf_new / tf_old,
                best / r.cudnn_fwd, diff);
    std::fflush(stdout);
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(o));
    CK(cudaFree(lse));
  }
  return 0;
}
