// FP8 (e4m3) attention forward: the wgmma kernel (FLASHGRAD_ATTN_FP8_FORWARD=wgmma) beside the
// mma.sync FP8 kernel (the default) and flashgrad's bf16 forward, same shapes, one process (the
// switch is read at every call). Also compares the two FP8 kernels' outputs on the timed inputs
// (relative RMS and max |difference| of out, max |difference| of lse): both compute the same recipe,
// so they differ by the accumulation order and P8's running max only (~1e-3 relative, far below
// the recipe's 2% against fp32); a layout bug shows as O(1).
// FLOPs: 4 B H S^2 D, halved when causal.
// usage: fp8_wgmma_bench [B H S] [variant ...] [d64|d128|d256 ...] [none|causal]
// (default 2 16 8192 w, head dims 128 256 64, both masks), variants of the wgmma kernel:
//   w (the library's defaults: since session 6 serial + pipelined P V chunks at hd 256, overlapped
//   with the staggered start at hd 64 / 128), ov (overlapped schedule at every head dim, P V unpipelined:
//   FLASHGRAD_ATTN_FP8_WGMMA_SERIAL=0, the defaults before session 6),
//   pp (ov with FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG=1), s (FLASHGRAD_ATTN_FP8_WGMMA_SERIAL=1), spp
//   (both), o (ov with FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL=1: not the recipe's two-level P V), opp (o
//   and ping-pong), w4 (ov with FLASHGRAD_ATTN_FP8_WGMMA_LEAN=0: session 4's default, its
//   instruction stream before session 5 cut the consumer loop), wspin (w with
//   FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP=0: the producer spinning in its empty-slot waits, as
//   session 4's did), pv (ov with FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE=1: hd 256's P V chunks
//   pipelined; other head dims as ov), spv (s with FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE=1: hd 256's
//   serial P V in 4 pipelined chunks; other head dims as s), pp (above), st (ov with
//   FLASHGRAD_ATTN_FP8_WGMMA_STAGGER=1: warpgroup 2 starts after warpgroup 1's first softmax),
//   ppst (pp and st), es (ov with FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S=1: hd 64 / 128 issue S(j+1)
//   before folding P(j-1) V(j-1); hd 256 as ov), espp / esst / esppst (es with pp / st / both), wst
//   (w with FLASHGRAD_ATTN_FP8_WGMMA_STAGGER=1: the staggered start at hd 256 too); each
//   timed in the order given (a turn-taking bug would trap and end the process). (e, the polynomial
//   exp2, went with the kernel's kPolyExp, retired in session 20.)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "flashgrad/attention.h"
#include "flashgrad/status.h"

namespace {

using namespace flashgrad;

#define CHECK_CUDA(x)                                                 \
  do {                                                                \
    cudaError_t e_ = (x);                                             \
    if (e_ != cudaSuccess) {                                          \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

// Random e4m3 codes with |x| <= 2^3 (exponent field <= 10), or bf16 in ~[-2, 2), by a hash.
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
      p[i] = static_cast<uint8_t>(0x3f + ((h >> 7) & 0x80) - ((h >> 3) & 1));
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
  f();
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

float bf16_to_float(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The kernel a call runs: the mma.sync FP8 kernel (variant empty) or the wgmma one's variant.
void set_switch(const std::string& variant) {
  if (variant.empty())
    setenv("FLASHGRAD_ATTN_FP8_FORWARD", "mma", 1);
  else
    setenv("FLASHGRAD_ATTN_FP8_FORWARD", "wgmma", 1);
  // Every switch unset (the library's defaults: "w"), then the variant's own; the schedule variants
  // set SERIAL either way, since its default differs by head dim.
  for (const char* name : {"FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG", "FLASHGRAD_ATTN_FP8_WGMMA_SERIAL",
                           "FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL", "FLASHGRAD_ATTN_FP8_WGMMA_LEAN",
                           "FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP",
                           "FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE", "FLASHGRAD_ATTN_FP8_WGMMA_STAGGER",
                           "FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S"})
    unsetenv(name);
  const bool es = variant.rfind("es", 0) == 0;  // es, espp, esst, esppst
  const std::string rest = es ? variant.substr(2) : variant;  // what es is combined with
  if (rest == "pp" || variant == "spp" || variant == "opp" || rest == "ppst")
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG", "1", 1);
  // The staggered start: on for the st variants and wst (w with it at every head dim), the library's
  // default (on at hd 64 / 128 since session 6) for w and wspin, off for every other variant.
  if (rest == "st" || rest == "ppst" || variant == "wst")
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_STAGGER", "1", 1);
  else if (variant != "w" && variant != "wspin")
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_STAGGER", "0", 1);
  if (es) setenv("FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S", "1", 1);
  if (variant == "s" || variant == "spp" || variant == "spv") setenv("FLASHGRAD_ATTN_FP8_WGMMA_SERIAL", "1", 1);
  if (variant == "ov" || variant == "pp" || variant == "o" || variant == "opp" || variant == "w4" || variant == "pv" ||
      rest == "st" || rest == "ppst" || es)
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_SERIAL", "0", 1);
  if (variant == "o" || variant == "opp") setenv("FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL", "1", 1);
  if (variant == "w4") setenv("FLASHGRAD_ATTN_FP8_WGMMA_LEAN", "0", 1);
  if (variant == "wspin") setenv("FLASHGRAD_ATTN_FP8_WGMMA_PRODUCER_SLEEP", "0", 1);
  if (variant == "pv" || variant == "spv")
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE", "1", 1);
  else if (variant != "w" && variant != "wspin" && variant != "wst")  // the others are what they say
    setenv("FLASHGRAD_ATTN_FP8_WGMMA_PV_PIPE", "0", 1);
  setenv("FLASHGRAD_ATTN_FP8_WGMMA_HD64", "1", 1);  // hd 64 on wgmma (the default since session 6)
}

struct Diff {
  double out_rel_rms, out_max, lse_max;
};

Diff compare(const Buffer& out_a, const Buffer& out_b, const Buffer& lse_a, const Buffer& lse_b, size_t elems,
             size_t lse_n) {
  std::vector<uint16_t> ha(elems), hb(elems);
  std::vector<float> la_h(lse_n), lb_h(lse_n);
  CHECK_CUDA(cudaMemcpy(ha.data(), out_a.p, elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), out_b.p, elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(la_h.data(), lse_a.p, lse_n * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lb_h.data(), lse_b.p, lse_n * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, mx = 0, lmx = 0;
  for (size_t i = 0; i < elems; ++i) {
    const double a = bf16_to_float(ha[i]), b = bf16_to_float(hb[i]);
    const double d = std::isfinite(a) && std::isfinite(b) ? std::fabs(a - b) : INFINITY;
    num += d * d;
    den += a * a;
    mx = d > mx ? d : mx;
  }
  for (size_t i = 0; i < lse_n; ++i) {
    const double d = std::isfinite(la_h[i]) && std::isfinite(lb_h[i]) ? std::fabs(la_h[i] - lb_h[i]) : INFINITY;
    lmx = d > lmx ? d : lmx;
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx, lmx};
}

struct Row {
  double mma, bf16;
  std::vector<double> tflops;  // per variant
  std::vector<Diff> diff;      // per variant, against the mma.sync kernel's output
};

Row run(int B, int H, int S, int D, bool causal, const std::vector<std::string>& variants) {
  const std::vector<int64_t> shape = {B, S, H, D};
  const size_t elems = static_cast<size_t>(B) * S * H * D;
  Buffer q8(elems, 1, true), k8(elems, 2, true), v8(elems, 3, true);
  Buffer q16(elems * 2, 1), k16(elems * 2, 2), v16(elems * 2, 3);
  Buffer out_a(elems * 2, 0, false, false), out_b(elems * 2, 0, false, false);
  const size_t lse_n = static_cast<size_t>(B) * H * S;
  Buffer lse_a(lse_n * 4, 0, false, false), lse_b(lse_n * 4, 0, false, false);
  std::vector<float> ds_host(static_cast<size_t>(B) * H, 0.125f);
  Buffer ds(ds_host.size() * 4, 0, false, false);
  CHECK_CUDA(cudaMemcpy(ds.p, ds_host.data(), ds_host.size() * 4, cudaMemcpyHostToDevice));

  AttentionParams p8;
  p8.q = view(q8.p, DType::e4m3, shape);
  p8.k = view(k8.p, DType::e4m3, shape);
  p8.v = view(v8.p, DType::e4m3, shape);
  p8.mask = causal ? MaskKind::causal : MaskKind::none;
  p8.descale_q = p8.descale_k = p8.descale_v = view(ds.p, DType::f32, {B, H});
  AttentionParams p16 = p8;
  p16.q = view(q16.p, DType::bf16, shape);
  p16.k = view(k16.p, DType::bf16, shape);
  p16.v = view(v16.p, DType::bf16, shape);
  p16.descale_q = p16.descale_k = p16.descale_v = TensorView{};
  const TensorView oa = view(out_a.p, DType::bf16, shape), ob = view(out_b.p, DType::bf16, shape);
  const TensorView la = view(lse_a.p, DType::f32, {B, H, S}), lb = view(lse_b.p, DType::f32, {B, H, S});
  Buffer ws(attention_workspace_bytes(p8, Pass::forward), 0, false, false);
  const Workspace w{ws.p, ws.bytes};

  const double flops = 4.0 * B * H * double(S) * S * D * (causal ? 0.5 : 1.0);
  Row r{};
  set_switch("");
  r.bf16 = flops / (time_ms([&] { attention_forward(p16, oa, la, {}); }, 10) * 1e-3) / 1e12;
  r.mma = flops / (time_ms([&] { attention_forward(p8, oa, la, w); }, 5) * 1e-3) / 1e12;
  for (const std::string& v : variants) {
    set_switch(v);
    CHECK_CUDA(cudaMemset(out_b.p, 0xff, elems * 2));  // poisoned: a variant must write every output
    r.tflops.push_back(flops / (time_ms([&] { attention_forward(p8, ob, lb, w); }, 10) * 1e-3) / 1e12);
    r.diff.push_back(compare(out_a, out_b, lse_a, lse_b, elems, lse_n));
  }
  set_switch("");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int B = 2, H = 16, S = 8192;
  std::vector<std::string> variants;
  std::vector<int> dims, head_dims;
  int mask_only = -1;  // -1 both, 0 none, 1 causal
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "w" || a == "pp" || a == "s" || a == "spp" || a == "o" || a == "opp" || a == "w4" || a == "wspin" ||
        a == "pv" || a == "ov" || a == "spv" || a == "st" || a == "ppst" || a == "es" || a == "espp" || a == "esst" ||
        a == "esppst" || a == "wst")
      variants.push_back(a);
    else if (a == "d64" || a == "d128" || a == "d256")
      head_dims.push_back(std::atoi(a.c_str() + 1));
    else if (a == "none" || a == "causal")
      mask_only = a == "causal";
    else
      dims.push_back(std::atoi(argv[i]));
  }
  if (head_dims.empty()) head_dims = {128, 256, 64};
  if (dims.size() == 3) {
    B = dims[0];
    H = dims[1];
    S = dims[2];
  }
  if (variants.empty()) variants.push_back("w");
  std::printf("fp8 forward, B%d H%d S%d, TFLOP/s (4BHS^2D, /2 causal); each wgmma variant's output vs mma.sync's "
              "(out relative RMS / max |difference|, lse max |difference|)\n", B, H, S);
  std::printf("%-4s %-6s | %7s %7s |", "hd", "mask", "bf16", "fp8 mma");
  for (const auto& v : variants) std::printf(" %7s", v.c_str());
  std::printf(" | best/mma |");
  for (const auto& v : variants) std::printf(" %-26s", (v + ": relRMS maxd lsemax").c_str());
  std::printf("\n");
  for (int D : head_dims)
    for (bool causal : {false, true}) {
      if (mask_only >= 0 && causal != (mask_only == 1)) continue;
      try {
        const Row r = run(B, H, S, D, causal, variants);
        double best = 0;
        std::printf("%-4d %-6s | %7.1f %7.1f |", D, causal ? "causal" : "none", r.bf16, r.mma);
        for (double t : r.tflops) {
          std::printf(" %7.1f", t);
          best = t > best ? t : best;
        }
        std::printf(" | %8.2f |", best / r.mma);
        for (const Diff& d : r.diff) std::printf(" %8.1e %8.1e %8.1e", d.out_rel_rms, d.out_max, d.lse_max);
        std::printf("\n");
      } catch (const std::exception& e) {
        std::printf("%-4d %-6s | error: %s\n", D, causal ? "causal" : "none", e.what());
      }
      std::fflush(stdout);
    }
  return 0;
}
