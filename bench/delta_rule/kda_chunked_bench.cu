// Per-stage timing of the chunked KDA stages (src/cuda/delta_rule/chunked_kda.h), called through
// their launchers (not yet dispatched by the public API): chunk KDA B4 T4096 H16 K=V=128 bf16,
// the issue's benchmark row (fla on this H200: forward 0.939 ms, backward 3.947 ms; targets
// 0.45 / 1.6 ms). The backward is timed as the chunked path runs it: stages 1, 2 again, B1, B2
// (the dq/dk/dg finish kernels are elementwise and left out). CUDA events, warm-up, median of reps.
//
// Usage: kda_chunked_bench [B T H K V]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cuda/delta_rule/chunked_kda.h"

namespace {

namespace dr = flashgrad::cuda_detail::delta_rule;

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

// Deterministic pseudo-random fill on the device: kind 0 normal-ish (sum of uniforms), 1 beta in
// (0, 1), 2 the KDA gate logsigmoid(x) with 10% zeros.
template <typename T>
__global__ void fill_kernel(T* x, int64_t n, uint32_t seed, int kind) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    float s = 0.f;
    for (int r = 0; r < 4; ++r) {
      h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
      s += (h & 0xffffff) / 16777216.f;
    }
    const float z = (s - 2.f) * 1.7320508f;  // mean 0, variance 1
    float v = z;
    if (kind == 1) v = 1.f / (1.f + expf(-z));
    if (kind == 2) v = (h % 10 == 0) ? 0.f : fminf(z, 0.f) - log1pf(expf(-fabsf(z)));
    x[i] = static_cast<T>(v);
  }
}

template <typename T>
T* alloc_fill(int64_t n, uint32_t seed, int kind) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, sizeof(T) * std::max<int64_t>(n, 1)));
  fill_kernel<T><<<1024, 256>>>(p, n, seed, kind);
  CHECK(cudaGetLastError());
  return p;
}

dr::View view(void* p, int64_t d0, int64_t d1, int64_t d2, int64_t d3, bool f32) {
  dr::View v;
  v.p = p, v.f32 = f32;
  v.s3 = 1, v.s2 = d3, v.s1 = d2 * d3, v.s0 = d1 * d2 * d3;
  return v;
}
dr::View view3(void* p, int64_t d1, int64_t d2, bool f32) {  // [d0, d1, d2]
  dr::View v;
  v.p = p, v.f32 = f32;
  v.s2 = 1, v.s1 = d2, v.s0 = d1 * d2;
  return v;
}

double time_ms(const std::function<void()>& f, int reps = 10) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  f();  // warm-up
  CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using T = __nv_bfloat16;
  int64_t B = 4, Tn = 4096, H = 16, K = 128, V = 128;
  if (argc == 6) B = atoll(argv[1]), Tn = atoll(argv[2]), H = atoll(argv[3]), K = atoll(argv[4]), V = atoll(argv[5]);
  const int64_t HV = H, rows = B * Tn;
  const dr::ChunkPlanHost plan = dr::make_chunk_plan(B, Tn, {});
  const int64_t NC = static_cast<int64_t>(plan.chunks.size());
  const dr::ChunkedScratchSizes sz = dr::kda_scratch_sizes(rows, NC, HV, K, V);

  T *q = alloc_fill<T>(rows * H * K, 1, 0), *k = alloc_fill<T>(rows * H * K, 2, 0), *v = alloc_fill<T>(rows * HV * V, 3, 0);
  T *beta = alloc_fill<T>(rows * HV, 4, 1), *o = alloc_fill<T>(rows * HV * V, 5, 0), *dout = alloc_fill<T>(rows * HV * V, 6, 0);
  float* g = alloc_fill<float>(rows * HV * K, 7, 2);
  float *G = alloc_fill<float>(sz.G, 8, 0), *A = alloc_fill<float>(sz.A, 9, 0), *u = alloc_fill<float>(sz.u, 10, 0);
  float *h = alloc_fill<float>(sz.h, 11, 0), *dh = alloc_fill<float>(sz.h, 12, 0), *dvn = alloc_fill<float>(sz.v_new, 13, 0);
  T *w = alloc_fill<T>(sz.w, 14, 0), *vn = alloc_fill<T>(sz.v_new, 15, 0);
  float *dq = alloc_fill<float>(rows * H * K, 16, 0), *dk = alloc_fill<float>(rows * H * K, 17, 0);
  float *dv = alloc_fill<float>(rows * HV * V, 18, 0), *db = alloc_fill<float>(rows * HV, 19, 0);
  float* dg = alloc_fill<float>(dr::kda_dg_size(rows, HV, K), 20, 0);
  dr::ChunkInfo* chunks = nullptr;
  int64_t* first = nullptr;
  CHECK(cudaMalloc(&chunks, sizeof(dr::ChunkInfo) * NC));
  CHECK(cudaMalloc(&first, 8 * plan.seq_first_chunk.size()));
  CHECK(cudaMemcpy(chunks, plan.chunks.data(), sizeof(dr::ChunkInfo) * NC, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(first, plan.seq_first_chunk.data(), 8 * plan.seq_first_chunk.size(), cudaMemcpyHostToDevice));

  dr::ChunkedArgs a;
  a.q = view(q, B, Tn, H, K, false), a.k = view(k, B, Tn, H, K, false), a.v = view(v, B, Tn, HV, V, false);
  a.g = view(g, B, Tn, HV, K, true), a.beta = view3(beta, Tn, HV, false), a.o = view(o, B, Tn, HV, V, false);
  a.chunks = chunks, a.seq_first_chunk = first, a.num_chunks = NC, a.num_seqs = B;
  a.G = G, a.A = A, a.w = w, a.u = u, a.v_new = vn, a.h = h;
  a.dout = view(dout, B, Tn, HV, V, false), a.dh = dh, a.dv_new = dvn;
  a.dq_acc = dq, a.dk_acc = dk, a.dv = dv, a.dbeta = db, a.dg = dg;
  a.T = Tn, a.H = H, a.HV = HV, a.K = K, a.V = V, a.scale = 1.f / sqrtf(float(K)), a.l2norm = true;
  CHECK(cudaDeviceSynchronize());

  const double t1 = time_ms([&] { dr::launch_kda_prepare<T>(a, nullptr); });
  const double t2 = time_ms([&] { dr::launch_kda_state<T>(a, nullptr); });
  const double t3 = time_ms([&] { dr::launch_kda_output<T>(a, nullptr); });
  const double tb1 = time_ms([&] { dr::launch_kda_state_backward<T>(a, nullptr); });
  const double tb2 = time_ms([&] {
    CHECK(cudaMemsetAsync(dq, 0, 4 * rows * H * K));
    CHECK(cudaMemsetAsync(dk, 0, 4 * rows * H * K));
    dr::launch_kda_grads<T>(a, nullptr);
  });
  CHECK(cudaDeviceSynchronize());
  const double fwd = t1 + t2 + t3, bwd = t1 + t2 + tb1 + tb2;
  std::printf("chunk KDA bf16 B%lld T%lld H%lld K%lld V%lld (ms, median of 10)\n", (long long)B, (long long)Tn,
              (long long)H, (long long)K, (long long)V);
  std::printf("  1 prepare %.3f | 2 state %.3f | 3 output %.3f | B1 state bwd %.3f | B2 grads %.3f\n", t1, t2, t3,
              tb1, tb2);
  std::printf("  forward %.3f ms (fla 0.939, target 0.45) | backward %.3f ms (fla 3.947, target 1.6)\n", fwd, bwd);
  std::printf("  ratio fla/flashgrad: forward %.2fx, backward %.2fx\n", 0.939 / fwd, 3.947 / bwd);
  return 0;
}
