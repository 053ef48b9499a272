// Hardware probes of the 16-bit warpgroup MMA forms the delta rule's wgmma kernels use, with their
// operands laid out in shared memory exactly as those kernels lay them out (chunked_state_wgmma.cuh,
// chunked_state_backward_wgmma.cuh: 128-byte-swizzled tiles of 64-element rows, `swizzled`), and the
// descriptors those kernels build; one form per test:
//   1. wgmma_ss_kt (A K-major, B MN-major): the chains' first product, v_new = w h (stage 2) and
//      dv_new = k dh (B1): A = [64 rows][K = 128] as two [64][64] panels, k steps of 16 as +32 bytes
//      inside the row; B = [K][N] in a [K][64] tile (Hs), N = 16, 32, 64;
//   2. wgmma_ss_tt (both MN-major): the chains' second product, h += k^T v' and dh += q^T do': A^T
//      stored [64 rows][64 channels] (one panel of k or q), B = [64 rows][N] (Vs / Ds);
//   3. wgmma_ss_n128 (both K-major): the form B2 on wgmma would use (docs/perf/delta_rule_b2_wgmma_plan.md:
//      Y = do h^T with do [64 rows][V] and h [K][V], V contiguous in both), N = 128, V = 128.
// The host emulation of these kernels (chunked_emulation/emulator_sm90.h) models the same descriptors
// and accumulator layout: these probes are what ties that model to the hardware. Small integer operands
// (|x| <= 4): every product and sum is exact in fp32, so the results compare exactly. Fresh random inputs
// per run, outputs poisoned before each launch. (Written in session 18 after its last device call: first
// run in the next GPU check.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/attention/wgmma_primitives.cuh"
#include "cuda/delta_rule/chunked_state_wgmma.cuh"  // swizzled()
#include "gpu_test_util.h"

namespace flashgrad::delta_wgmma_probe {
namespace {

namespace sm90 = cuda_attn::sm90;
using cuda_detail::delta_rule::swizzled;

constexpr int kPanel = 64 * 128;  // bytes of a [64 rows][64 elements] 16-bit panel

// Byte offset of 16-bit element (r, c) of a tile of [rows][64] panels (panel c / 64, `panel_bytes` apart).
__device__ inline uint32_t tile_at(int r, int c, int panel_bytes) {
  return static_cast<uint32_t>((c / 64) * panel_bytes) + swizzled(r, (c % 64) / 8) + 2 * (c % 8);
}

__device__ unsigned char* aligned_smem() {
  extern __shared__ unsigned char probe_smem[];
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(probe_smem));
  return probe_smem + ((1024 - (a & 1023)) & 1023);
}

// Writes the thread's accumulators as D[64][N] (row-major): element i of thread tid is row
// 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1) (wgmma_primitives.cuh).
template <int N>
__device__ void store_acc(const float (&acc)[N / 2], float* d) {
  const int tid = threadIdx.x, w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  for (int i = 0; i < N / 2; ++i) d[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i];
}

// 1. D[64][N] = A[64][128] B[128][N]: A in two K-major panels (as w, k), B MN-major in a [128][64] tile (Hs).
template <typename T, int N>
__global__ void __launch_bounds__(128) probe_ss_kt(const T* a, const T* b, float* d) {
  unsigned char* s = aligned_smem();
  unsigned char* as = s;                 // [64][128]: 2 panels
  unsigned char* bs = s + 2 * kPanel;    // [128][64]: K rows x 64 (N used)
  for (int i = threadIdx.x; i < 64 * 128; i += 128) *reinterpret_cast<T*>(as + tile_at(i / 128, i % 128, kPanel)) = a[i];
  for (int i = threadIdx.x; i < 128 * N; i += 128) *reinterpret_cast<T*>(bs + tile_at(i / N, i % N, 128 * 128)) = b[i];
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t a_s = static_cast<uint32_t>(__cvta_generic_to_shared(as)),
                 b_s = static_cast<uint32_t>(__cvta_generic_to_shared(bs));
  float acc[N / 2];
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    sm90::wgmma_ss_kt<T, N>(acc, sm90::smem_desc(a_s + (kk / 4) * kPanel + (kk % 4) * 32, 16, 1024),
                            sm90::smem_desc(b_s + kk * 16 * 128, 128 * 128, 1024), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(acc);
  store_acc<N>(acc, d);
}

// 2. D[64][N] = X^T[64][64] Y[64][N]: X [64 rows][64 channels] one panel (as q, k), Y [64 rows][N] (Ds, Vs).
template <typename T, int N>
__global__ void __launch_bounds__(128) probe_ss_tt(const T* x, const T* y, float* d) {
  unsigned char* s = aligned_smem();
  unsigned char* xs = s;
  unsigned char* ys = s + kPanel;
  for (int i = threadIdx.x; i < 64 * 64; i += 128) *reinterpret_cast<T*>(xs + tile_at(i / 64, i % 64, kPanel)) = x[i];
  for (int i = threadIdx.x; i < 64 * N; i += 128) *reinterpret_cast<T*>(ys + tile_at(i / N, i % N, kPanel)) = y[i];
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t x_s = static_cast<uint32_t>(__cvta_generic_to_shared(xs)),
                 y_s = static_cast<uint32_t>(__cvta_generic_to_shared(ys));
  float acc[N / 2];
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90::wgmma_ss_tt<T, N>(acc, sm90::smem_desc(x_s + kk * 16 * 128, kPanel, 1024),
                            sm90::smem_desc(y_s + kk * 16 * 128, kPanel, 1024), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(acc);
  store_acc<N>(acc, d);
}

// 3. D[64][128] = P[64][128] Q^T: P [64 rows][V = 128], Q [128 rows][V = 128], both K-major in two panels.
template <typename T>
__global__ void __launch_bounds__(128) probe_ss_kk(const T* p, const T* q, float* d) {
  unsigned char* s = aligned_smem();
  unsigned char* ps = s;               // [64][128]: 2 panels of [64][64]
  unsigned char* qs = s + 2 * kPanel;  // [128][128]: 2 panels of [128][64]
  for (int i = threadIdx.x; i < 64 * 128; i += 128) *reinterpret_cast<T*>(ps + tile_at(i / 128, i % 128, kPanel)) = p[i];
  for (int i = threadIdx.x; i < 128 * 128; i += 128)
    *reinterpret_cast<T*>(qs + tile_at(i / 128, i % 128, 2 * kPanel)) = q[i];
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t p_s = static_cast<uint32_t>(__cvta_generic_to_shared(ps)),
                 q_s = static_cast<uint32_t>(__cvta_generic_to_shared(qs));
  float acc[64];
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    sm90::wgmma_ss_n128<T>(acc, sm90::smem_desc(p_s + (kk / 4) * kPanel + (kk % 4) * 32, 16, 1024),
                           sm90::smem_desc(q_s + (kk / 4) * 2 * kPanel + (kk % 4) * 32, 16, 1024), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(acc);
  store_acc<128>(acc, d);
}

// Small integers in [-4, 4] as T (exact), their float values alongside.
template <typename T>
struct Operand {
  std::vector<float> f;
  std::vector<T> t;
  Operand(std::mt19937& rng, int n) : f(n), t(n) {
    std::uniform_int_distribution<int> u(-4, 4);
    for (int i = 0; i < n; ++i) {
      f[i] = static_cast<float>(u(rng));
      if constexpr (std::is_same_v<T, __nv_bfloat16>)
        t[i] = __float2bfloat16(f[i]);
      else
        t[i] = __float2half(f[i]);
    }
  }
};

template <typename X>
struct Dev {
  X* p = nullptr;
  explicit Dev(const std::vector<X>& h) {
    if (cudaMalloc(&p, h.size() * sizeof(X)) == cudaSuccess) cudaMemcpy(p, h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice);
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
};

// Runs `kernel` (one warpgroup, `smem` bytes + alignment) and compares D[64][N] with `want` exactly.
template <typename Kernel, typename T>
void run_and_compare(Kernel kernel, int smem, const std::vector<T>& x, const std::vector<T>& y,
                     const std::vector<float>& want, int N, const std::string& what) {
  Dev<T> dx(x), dy(y);
  Dev<float> dd(std::vector<float>(64 * N, NAN));  // poisoned
  ASSERT_NE(dx.p, nullptr);
  ASSERT_NE(dy.p, nullptr);
  ASSERT_NE(dd.p, nullptr);
  ASSERT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem + 1024), cudaSuccess);
  kernel<<<1, 128, smem + 1024>>>(dx.p, dy.p, dd.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << what;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<float> got(64 * N);
  ASSERT_EQ(cudaMemcpy(got.data(), dd.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  int bad = 0;
  for (int i = 0; i < 64 * N; ++i)
    if (got[i] != want[i] && bad++ < 5)
      ADD_FAILURE() << what << ": D[" << i / N << "][" << i % N << "] = " << got[i] << ", want " << want[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << 64 * N << " elements differ";
}

template <typename T, int N>
void check_kt(std::mt19937& rng) {
  Operand<T> a(rng, 64 * 128), b(rng, 128 * N);
  std::vector<float> want(64 * N, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 128; ++k) want[m * N + n] += a.f[m * 128 + k] * b.f[k * N + n];
  run_and_compare(probe_ss_kt<T, N>, 2 * kPanel + 128 * 128, a.t, b.t, want, N,
                  "wgmma_ss_kt N=" + std::to_string(N));
}

template <typename T, int N>
void check_tt(std::mt19937& rng) {
  Operand<T> x(rng, 64 * 64), y(rng, 64 * N);
  std::vector<float> want(64 * N, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 64; ++k) want[m * N + n] += x.f[k * 64 + m] * y.f[k * N + n];
  run_and_compare(probe_ss_tt<T, N>, 2 * kPanel, x.t, y.t, want, N, "wgmma_ss_tt N=" + std::to_string(N));
}

template <typename T>
void check_kk(std::mt19937& rng) {
  Operand<T> p(rng, 64 * 128), q(rng, 128 * 128);
  std::vector<float> want(64 * 128, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n)
      for (int k = 0; k < 128; ++k) want[m * 128 + n] += p.f[m * 128 + k] * q.f[n * 128 + k];
  run_and_compare(probe_ss_kk<T>, 2 * kPanel + 4 * kPanel, p.t, q.t, want, 128, "wgmma_ss_n128");
}

TEST(DeltaRuleWgmmaProbe, KMajorATimesMNMajorB) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  check_kt<__nv_bfloat16, 16>(rng);
  check_kt<__nv_bfloat16, 32>(rng);
  check_kt<__half, 64>(rng);
}

TEST(DeltaRuleWgmmaProbe, MNMajorATimesMNMajorB) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  check_tt<__nv_bfloat16, 16>(rng);
  check_tt<__half, 32>(rng);
  check_tt<__nv_bfloat16, 64>(rng);
}

TEST(DeltaRuleWgmmaProbe, KMajorATimesKMajorB) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  check_kk<__nv_bfloat16>(rng);
  check_kk<__half>(rng);
}

}  // namespace
}  // namespace flashgrad::delta_wgmma_probe
