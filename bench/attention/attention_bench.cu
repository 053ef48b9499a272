// Times flashgrad's CUDA attention forward and backward on the rows of docs anchors.md (plus a GQA
// and a varlen row) with CUDA events: warm-up calls, then the median of repeats. Prints TFLOP/s,
// the fraction of the measured bf16 matmul ceiling (770 TFLOP/s on the H200), and ratios against
// the anchor numbers measured for torch SDPA's cuDNN and FLASH (FA2) backends (labelled as anchors:
// they were measured separately, not in this run). Writes attention_bench.csv and .md to argv[1].
//
// FLOPs: forward 4 * B * Hq * Sq * Sk * D, halved when causal with Sq == Sk; backward 2.5 x forward.
// Varlen rows sum per-sequence terms.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashgrad/attention.h"

namespace {

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));           \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

constexpr double kCeilingTflops = 770.0;
bool g_profile = false;

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
  std::string name;
  int b, hq, hk, s, d;
  bool causal;
  std::vector<int> varlen;  // sequence lengths (B = 1 packed) when non-empty
  // Anchors (TFLOP/s, torch SDPA on this H200; 0 = none).
  double cudnn_fwd, cudnn_bwd, fa2_fwd, fa2_bwd;
};

struct Result {
  double fwd_ms, bwd_ms, fwd_tf, bwd_tf, bwd_det_ms;
};

template <typename F>
double median_ms(F&& f, int warmup, int reps) {
  if (g_profile) warmup = 0, reps = 1;
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

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

Result run_row(const Row& r, bool with_deterministic) {
  using namespace flashgrad;
  const bool varlen = !r.varlen.empty();
  int64_t tokens = int64_t{r.b} * r.s;
  double pairs = 0;  // sum over sequences of allowed (i, j) pairs, by the anchors' formula
  std::vector<int32_t> cu = {0};
  if (varlen) {
    tokens = 0;
    for (int len : r.varlen) {
      tokens += len;
      cu.push_back(static_cast<int32_t>(tokens));
      pairs += double(len) * len * (r.causal ? 0.5 : 1.0);
    }
  } else {
    pairs = double(r.b) * r.s * r.s * (r.causal ? 0.5 : 1.0);
  }
  const double fwd_flops = 4.0 * r.hq * pairs * r.d;
  const int64_t nq = tokens * r.hq * r.d, nk = tokens * r.hk * r.d;
  __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  int32_t* cu_dev = nullptr;
  for (auto [ptr, n] : {std::pair{&q, nq}, {&k, nk}, {&v, nk}, {&o, nq}, {&dout, nq}, {&dq, nq}, {&dk, nk}, {&dv, nk}})
    CK(cudaMalloc(ptr, n * 2));
  CK(cudaMalloc(&lse, tokens * r.hq * 4));
  fill_hashed<<<2048, 256>>>(q, nq, 1);
  fill_hashed<<<2048, 256>>>(k, nk, 2);
  fill_hashed<<<2048, 256>>>(v, nk, 3);
  fill_hashed<<<2048, 256>>>(dout, nq, 4);
  AttentionParams p;
  p.mask = r.causal ? MaskKind::causal : MaskKind::none;
  std::vector<int64_t> qs, ks, ls;
  if (varlen) {
    CK(cudaMalloc(&cu_dev, cu.size() * 4));
    CK(cudaMemcpy(cu_dev, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
    qs = {tokens, r.hq, r.d};
    ks = {tokens, r.hk, r.d};
    ls = {r.hq, tokens};
    p.cu_seqlens_q = dev_view(cu_dev, DType::i32, {int64_t(cu.size())});
    p.cu_seqlens_k = p.cu_seqlens_q;
    p.max_seqlen_q = p.max_seqlen_k = *std::max_element(r.varlen.begin(), r.varlen.end());
  } else {
    qs = {r.b, r.s, r.hq, r.d};
    ks = {r.b, r.s, r.hk, r.d};
    ls = {r.b, r.hq, r.s};
  }
  p.q = dev_view(q, DType::bf16, qs);
  p.k = dev_view(k, DType::bf16, ks);
  p.v = dev_view(v, DType::bf16, ks);
  const TensorView out = dev_view(o, DType::bf16, qs), lv = dev_view(lse, DType::f32, ls);
  AttentionBackwardInputs in;
  in.out = out;
  in.lse = lv;
  in.dout = dev_view(dout, DType::bf16, qs);
  void* ws = nullptr;
  p.deterministic = true;
  size_t ws_bytes = attention_workspace_bytes(p, Pass::backward);
  p.deterministic = false;
  ws_bytes = std::max(ws_bytes, attention_workspace_bytes(p, Pass::backward));
  CK(cudaMalloc(&ws, ws_bytes));
  const Workspace w{ws, ws_bytes};
  const TensorView dqv = dev_view(dq, DType::bf16, qs), dkv = dev_view(dk, DType::bf16, ks),
                   dvv = dev_view(dv, DType::bf16, ks);
  Result res{};
  res.fwd_ms = median_ms([&] { attention_forward(p, out, lv); }, 3, 15);
  res.bwd_ms = median_ms([&] { attention_backward(p, in, dqv, dkv, dvv, w); }, 3, 15);
  if (with_deterministic) {
    p.deterministic = true;
    res.bwd_det_ms = median_ms([&] { attention_backward(p, in, dqv, dkv, dvv, w); }, 2, 7);
    p.deterministic = false;
  }
  CK(cudaDeviceSynchronize());
  res.fwd_tf = fwd_flops / (res.fwd_ms * 1e-3) / 1e12;
  res.bwd_tf = 2.5 * fwd_flops / (res.bwd_ms * 1e-3) / 1e12;
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                    (void*)lse, (void*)cu_dev, ws})
    cudaFree(ptr);
  return res;
}

std::string ratio(double x, double anchor) {
  if (anchor <= 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x / anchor);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  const std::string mode = argc > 2 ? argv[2] : "";
  const bool quick = mode == "quick";
  g_profile = mode == "profile";  // one call of each kernel, for a profiler
  std::vector<Row> rows = {
      {"8x16x2048 d128", 8, 16, 16, 2048, 128, false, {}, 637, 456, 339, 267},
      {"8x16x2048 d128", 8, 16, 16, 2048, 128, true, {}, 486, 371, 279, 218},
      {"2x16x8192 d128", 2, 16, 16, 8192, 128, false, {}, 621, 510, 340, 303},
      {"2x16x8192 d128", 2, 16, 16, 8192, 128, true, {}, 560, 484, 311, 283},
      {"4x16x4096 d64", 4, 16, 16, 4096, 64, false, {}, 451, 417, 297, 267},
      {"4x16x4096 d64", 4, 16, 16, 4096, 64, true, {}, 398, 377, 260, 224},
      {"2x16x8192 d256", 2, 16, 16, 8192, 256, false, {}, 649, 356, 315, 258},
      {"2x16x8192 d256", 2, 16, 16, 8192, 256, true, {}, 605, 373, 304, 241},
      {"GQA 2x32/4x8192 d128", 2, 32, 4, 8192, 128, true, {}, 0, 0, 0, 0},
      {"varlen 16 seqs d128", 1, 16, 16, 0, 128, true,
       {512, 1024, 2048, 4096, 8192, 300, 700, 1500, 3000, 6000, 100, 2500, 3500, 5000, 7000, 1}, 0, 0, 0, 0},
  };
  if (quick) rows.resize(4);
  if (g_profile) {  // FLASHGRAD_PROFILE_ROW picks the row (index into the list above; default 3)
    const char* pick = std::getenv("FLASHGRAD_PROFILE_ROW");
    const int i = pick ? std::atoi(pick) : 3;
    if (i < 0 || i >= static_cast<int>(rows.size())) {
      std::fprintf(stderr, "FLASHGRAD_PROFILE_ROW=%d: must be in [0, %zu)\n", i, rows.size());
      return 2;
    }
    rows = {rows[i]};
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device: %s (%d SMs), driver %d, runtime %d; bf16; ceiling %.0f TFLOP/s\n", prop.name,
              prop.multiProcessorCount, driver, runtime, kCeilingTflops);
  FILE* csv = std::fopen((dir + "/attention_bench.csv").c_str(), "w");
  FILE* md = std::fopen((dir + "/attention_bench.md").c_str(), "w");
  if (csv)
    std::fprintf(csv, "row,causal,fwd_ms,fwd_tflops,fwd_frac_ceiling,bwd_ms,bwd_tflops,bwd_frac_ceiling,"
                      "bwd_deterministic_ms,fwd_vs_cudnn_anchor,bwd_vs_cudnn_anchor,fwd_vs_fa2_anchor,bwd_vs_fa2_anchor\n");
  const char* header =
      "| row | causal | fwd ms | fwd TFLOP/s | fwd / 770 | bwd ms | bwd TFLOP/s | bwd / 770 | bwd det. ms | "
      "fwd / cuDNN anchor | bwd / cuDNN anchor | fwd / FA2 anchor | bwd / FA2 anchor |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::printf("%s", header);
  if (md) std::fprintf(md, "%s", header);
  for (const Row& r : rows) {
    const bool det = r.d == 128 && !r.varlen.size() && r.hq == r.hk;
    const Result x = run_row(r, det);
    char line[512];
    std::snprintf(line, sizeof line, "| %s | %s | %.3f | %.0f | %.2f | %.3f | %.0f | %.2f | %s | %s | %s | %s | %s |\n",
                  r.name.c_str(), r.causal ? "yes" : "no", x.fwd_ms, x.fwd_tf, x.fwd_tf / kCeilingTflops,
                  x.bwd_ms, x.bwd_tf, x.bwd_tf / kCeilingTflops,
                  det ? std::to_string(x.bwd_det_ms).substr(0, 6).c_str() : "-",
                  ratio(x.fwd_tf, r.cudnn_fwd).c_str(), ratio(x.bwd_tf, r.cudnn_bwd).c_str(),
                  ratio(x.fwd_tf, r.fa2_fwd).c_str(), ratio(x.bwd_tf, r.fa2_bwd).c_str());
    std::printf("%s", line);
    std::fflush(stdout);
    if (md) std::fprintf(md, "%s", line);
    if (csv)
      std::fprintf(csv, "%s,%d,%.4f,%.1f,%.3f,%.4f,%.1f,%.3f,%.4f,%s,%s,%s,%s\n", r.name.c_str(), r.causal,
                   x.fwd_ms, x.fwd_tf, x.fwd_tf / kCeilingTflops, x.bwd_ms, x.bwd_tf, x.bwd_tf / kCeilingTflops,
                   det ? x.bwd_det_ms : 0.0, ratio(x.fwd_tf, r.cudnn_fwd).c_str(), ratio(x.bwd_tf, r.cudnn_bwd).c_str(),
                   ratio(x.fwd_tf, r.fa2_fwd).c_str(), ratio(x.bwd_tf, r.fa2_bwd).c_str());
  }
  if (csv) std::fclose(csv);
  if (md) std::fclose(md);
  return 0;
}
