// FP8 (e4m3) attention beside flashgrad's bf16 attention, same shapes, forward and backward,
// through the public C++ API with caller-provided workspaces (no allocation inside the timing).
// FLOPs as docs/attention.md: forward 4 B Hq Sq Sk D (halved when causal with Sq == Sk),
// backward 2.5 x forward. The fp8 times include the launcher's pre-passes (transposed V copy;
// backward: Delta, dO quantization, 16-bit q / k copies, dq conversion).
// usage: fp8_bench [B H S] (default 2 16 8192), head dims 128 and 256, causal and not.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashgrad/attention.h"
#include "flashgrad/status.h"

namespace {

using namespace flashgrad;

#define CHECK_CUDA(x)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                       \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// Random e4m3 codes with |x| <= 2^3 (exponent field <= 10) or bf16 values in [-2, 2), by a hash.
__global__ void fill_kernel(uint8_t* p, int64_t bytes, uint32_t seed, bool e4m3) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    if (e4m3) {
      const uint8_t sign = (h & 1) << 7, exp = (h >> 1) % 11, man = (h >> 5) & 7;
      p[i] = sign | (exp << 3) | man;
    } else if (i % 2 == 1) {
      p[i] = static_cast<uint8_t>(0x3f + ((h >> 7) & 0x80) - ((h >> 3) & 1));  // bf16 high byte: |x| in ~[0.5, 2)
    } else {
      p[i] = static_cast<uint8_t>(h >> 11);
    }
  }
}

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n, uint32_t seed = 0, bool e4m3 = false, bool fill = true) : bytes(n) {
    CHECK_CUDA(cudaMalloc(&p, n > 0 ? n : 1));
    if (fill) fill_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), static_cast<int64_t>(n), seed, e4m3);
  }
  ~Buffer() { cudaFree(p); }
};

TensorView view(void* data, DType dt, std::vector<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dt;
  t.device = Device::cuda;
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
float time_ms(F&& f, int iters) {
  f();  // warm-up (and first-call attribute setup)
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

struct Result {
  double fwd_tflops, bwd_tflops;
};

Result run(bool fp8, int B, int H, int S, int D, bool causal) {
  const std::vector<int64_t> shape = {B, S, H, D};
  const size_t elems = static_cast<size_t>(B) * S * H * D;
  const size_t in_bytes = elems * (fp8 ? 1 : 2);
  Buffer q(in_bytes, 1, fp8), k(in_bytes, 2, fp8), v(in_bytes, 3, fp8);
  Buffer out(elems * 2, 0, false, false), dout(elems * 2, 4), dq(elems * 2, 0, false, false),
      dk(elems * 2, 0, false, false), dv(elems * 2, 0, false, false);
  Buffer lse(static_cast<size_t>(B) * H * S * 4, 0, false, false);
  std::vector<float> ds_host(static_cast<size_t>(B) * H, 0.125f);
  Buffer ds(ds_host.size() * 4, 0, false, false);
  CHECK_CUDA(cudaMemcpy(ds.p, ds_host.data(), ds_host.size() * 4, cudaMemcpyHostToDevice));

  const DType in_dt = fp8 ? DType::e4m3 : DType::bf16;
  AttentionParams p;
  p.q = view(q.p, in_dt, shape);
  p.k = view(k.p, in_dt, shape);
  p.v = view(v.p, in_dt, shape);
  p.mask = causal ? MaskKind::causal : MaskKind::none;
  if (fp8) p.descale_q = p.descale_k = p.descale_v = view(ds.p, DType::f32, {B, H});
  const TensorView out_v = view(out.p, DType::bf16, shape), lse_v = view(lse.p, DType::f32, {B, H, S});
  Buffer ws_f(attention_workspace_bytes(p, Pass::forward), 0, false, false);
  Buffer ws_b(attention_workspace_bytes(p, Pass::backward), 0, false, false);
  AttentionBackwardInputs in;
  in.out = out_v;
  in.lse = lse_v;
  in.dout = view(dout.p, DType::bf16, shape);
  const float fwd_ms = time_ms([&] { attention_forward(p, out_v, lse_v, {ws_f.p, ws_f.bytes}); }, 5);
  const float bwd_ms = time_ms(
      [&] {
        attention_backward(p, in, view(dq.p, DType::bf16, shape), view(dk.p, DType::bf16, shape),
                           view(dv.p, DType::bf16, shape), {ws_b.p, ws_b.bytes});
      },
      3);
  const double flops = 4.0 * B * H * double(S) * S * D * (causal ? 0.5 : 1.0);
  return {flops / (fwd_ms * 1e-3) / 1e12, 2.5 * flops / (bwd_ms * 1e-3) / 1e12};
}

}  // namespace

int main(int argc, char** argv) {
  int B = 2, H = 16, S = 8192;
  if (argc == 4) {
    B = std::atoi(argv[1]);
    H = std::atoi(argv[2]);
    S = std::atoi(argv[3]);
  }
  std::printf("fp8 (e4m3) vs bf16 attention, B%d H%d S%d, TFLOP/s (fwd 4BHS^2D, /2 causal; bwd 2.5x)\n", B, H, S);
  std::printf("%-5s %-7s | %9s %9s %6s | %9s %9s %6s\n", "hd", "mask", "fp8 fwd", "bf16 fwd", "ratio", "fp8 bwd",
              "bf16 bwd", "ratio");
  for (int D : {128, 256})
    for (bool causal : {false, true}) {
      try {
        const Result f = run(true, B, H, S, D, causal);
        const Result b = run(false, B, H, S, D, causal);
        std::printf("%-5d %-7s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f\n", D, causal ? "causal" : "none",
                    f.fwd_tflops, b.fwd_tflops, f.fwd_tflops / b.fwd_tflops, f.bwd_tflops, b.bwd_tflops,
                    f.bwd_tflops / b.bwd_tflops);
      } catch (const std::exception& e) {
        std::printf("%-5d %-7s | error: %s\n", D, causal ? "causal" : "none", e.what());
      }
    }
  return 0;
}
