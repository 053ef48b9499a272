// The probe kernels of the 16-bit warpgroup MMA forms the delta rule's wgmma kernels use (what they
// check: delta_rule_wgmma_probe_gpu_test.cu's file comment), shared by that GPU test and by the host
// emulation's check of its own models (src/cuda/delta_rule/chunked_emulation/wgmma_probe_emulation.cc,
// CTest DeltaRuleWgmmaProbe.HostEmulation): the same kernels, the same expected products, so the
// emulation's wgmma model and the hardware are held to one standard. One warpgroup (128 threads) each;
// D[64][N] written row-major from the accumulators.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/delta_rule/chunked_state_wgmma.cuh"  // swizzled(), and the primitives (or their host models)

namespace flashgrad::delta_wgmma_probe {

namespace sm90 = cuda_attn::sm90;
using cuda_detail::delta_rule::swizzled;

constexpr int kPanel = 64 * 128;  // bytes of a [64 rows][64 elements] 16-bit panel

// Byte offset of 16-bit element (r, c) of a tile of [rows][64] panels (panel c / 64, `panel_bytes` apart).
__device__ inline uint32_t tile_at(int r, int c, int panel_bytes) {
  return static_cast<uint32_t>((c / 64) * panel_bytes) + swizzled(r, (c % 64) / 8) + 2 * (c % 8);
}

#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
inline unsigned char* aligned_smem() { return cuda_detail::delta_rule::smem_dyn; }  // (1024-byte aligned)
#else
__device__ unsigned char* aligned_smem() {
  extern __shared__ unsigned char probe_smem[];
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(probe_smem));
  return probe_smem + ((1024 - (a & 1023)) & 1023);
}
#endif

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


// 6. Bulk row copies counted on an mbarrier (sm90::bulk_load, mbar_*): the chains' planned tile loads
// (docs/perf/delta_rule.md, session 22). Chunk c's 64 rows of kBulkRowBytes come from src rows c 64 + r,
// `pitch` bytes apart, into stage c % 2 (rows kBulkLd bytes apart): one bulk copy per row r < len[c] by
// thread r, rows r >= len[c] zero-filled by ordinary stores, one arrive.expect_tx of len[c] rows' bytes by
// thread 0; every thread waits on the stage's phase, then the tile goes out densely to out[c][64][kBulkRowBytes].
// kBulkChunks chunks: each stage used twice (phase parities 0, then 1); out is written by every thread.
constexpr int kBulkRowBytes = 256, kBulkLd = 272, kBulkChunks = 4;
__global__ void __launch_bounds__(128) probe_bulk_rows(const unsigned char* src, int64_t pitch, const int* len,
                                                      unsigned char* out) {
  unsigned char* s = aligned_smem();
  const uint32_t s_sh = static_cast<uint32_t>(__cvta_generic_to_shared(s));
  const uint32_t bar0 = s_sh + 2 * 64 * kBulkLd;  // the stages' two barriers, 8 bytes each, after the stages
  const int tid = threadIdx.x;
  if (tid == 0) {
    sm90::mbar_init(bar0, 1);
    sm90::mbar_init(bar0 + 8, 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();
  auto issue = [&](int c) {  // chunk c into stage c % 2
    const int st = c & 1, L = len[c];
    const uint32_t bar = bar0 + 8 * st;
    sm90::fence_proxy_async_shared();  // (the stage's previous reads were ordinary loads)
    if (tid == 0) sm90::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(L * kBulkRowBytes));
    if (tid < 64) {
      if (tid < L) {
        sm90::bulk_load(s_sh + (st * 64 + tid) * kBulkLd, src + (64 * c + tid) * pitch, kBulkRowBytes, bar);
      } else {
        const uint32_t zero[4] = {0u, 0u, 0u, 0u};
        for (int b = 0; b < kBulkRowBytes; b += 16) memcpy(s + (st * 64 + tid) * kBulkLd + b, zero, 16);
      }
    }
  };
  issue(0);
  for (int c = 0; c < kBulkChunks; ++c) {
    const int st = c & 1;
    sm90::mbar_wait(bar0 + 8 * st, (c >> 1) & 1);
    __syncthreads();  // zero rows seen; every thread is done with chunk c - 1's stage, which c + 1 refills
    if (c + 1 < kBulkChunks) issue(c + 1);
    for (int i = tid; i < 64 * kBulkRowBytes / 16; i += 128) {
      const int r = i / (kBulkRowBytes / 16), b = 16 * (i % (kBulkRowBytes / 16));
      memcpy(out + (64 * c + r) * kBulkRowBytes + b, s + (st * 64 + r) * kBulkLd + b, 16);
    }
  }
}
// 6. What probe_bulk_rows must write: src's rows r < len[c], zeros past them.
inline std::vector<unsigned char> want_bulk_rows(const std::vector<unsigned char>& src, int64_t pitch,
                                                 const std::vector<int>& len) {
  std::vector<unsigned char> d(static_cast<std::size_t>(kBulkChunks) * 64 * kBulkRowBytes, 0);
  for (int c = 0; c < kBulkChunks; ++c)
    for (int r = 0; r < len[c]; ++r)
      memcpy(&d[(64 * c + r) * kBulkRowBytes], &src[(64 * c + r) * pitch], kBulkRowBytes);
  return d;
}

// Two 16-bit values as one register (lo in the low half).
template <typename T>
__host__ __device__ inline uint32_t pack_pair(T lo, T hi) {
  uint16_t a, b;
  memcpy(&a, &lo, 2);
  memcpy(&b, &hi, 2);
  return static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
}

// The four k steps' A fragments of A[64][64] (row-major in global memory) in the m16n8k16 A layout per
// warp w of the warpgroup: rows 16 w + g (+ 8), columns 16 kk + 2 t (+ 1, + 8, + 9).
template <typename T>
__device__ inline void load_a_fragments(const T* a, uint32_t (&f)[4][4]) {
  const int tid = threadIdx.x, w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  auto pair = [&](int r, int c) { return pack_pair<T>(a[r * 64 + c], a[r * 64 + c + 1]); };
  for (int kk = 0; kk < 4; ++kk) {
    f[kk][0] = pair(16 * w + g, 16 * kk + 2 * t);
    f[kk][1] = pair(16 * w + g + 8, 16 * kk + 2 * t);
    f[kk][2] = pair(16 * w + g, 16 * kk + 2 * t + 8);
    f[kk][3] = pair(16 * w + g + 8, 16 * kk + 2 * t + 8);
  }
}

// 4. D[64][N] = A[64][64] B[64][N]: A from registers (the m16n8k16 A fragment layout per warp, read from
// global memory: rows 16 w + g (+ 8), columns 16 kk + 2 t (+ 1, + 8, + 9)), B MN-major [64 rows][N] in
// N / 64 panels (V in the attention's O += P V; S k, tmp = dA A^T in B2 on wgmma). N = 64, 128. All four
// k steps' fragments stay in their own registers until the wait (the tensor cores read them late).
template <typename T, int N>
__global__ void __launch_bounds__(128) probe_rs(const T* a, const T* b, float* d) {
  unsigned char* s = aligned_smem();
  for (int i = threadIdx.x; i < 64 * N; i += 128) *reinterpret_cast<T*>(s + tile_at(i / N, i % N, kPanel)) = b[i];
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t b_s = static_cast<uint32_t>(__cvta_generic_to_shared(s));
  uint32_t f[4][4];
  load_a_fragments<T>(a, f);
  float acc[N / 2];
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90::wgmma_rs<T, N>(acc, f[kk], sm90::smem_desc(b_s + kk * 16 * 128, kPanel, 1024), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(acc);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) sm90::pin_words(f[kk]);
  store_acc<N>(acc, d);
}

// 5. D[64][64] = A[64][64] Bt^T: A from registers (as probe_rs), Bt [64 rows n][64 k] K-major in one
// panel (k contiguous), so B[k][n] = Bt[n][k]: B2's tmp = dA A^T with A stored [m][j] (S2 / dA chains of
// docs/perf/delta_rule_b2_wgmma_plan.md). k step kk: +32 bytes inside the rows.
template <typename T>
__global__ void __launch_bounds__(128) probe_rs_kb(const T* a, const T* bt, float* d) {
  unsigned char* s = aligned_smem();
  for (int i = threadIdx.x; i < 64 * 64; i += 128) *reinterpret_cast<T*>(s + tile_at(i / 64, i % 64, kPanel)) = bt[i];
  sm90::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t b_s = static_cast<uint32_t>(__cvta_generic_to_shared(s));
  uint32_t f[4][4];
  load_a_fragments<T>(a, f);
  float acc[32];
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90::wgmma_rs_kmajor_b_n64<T>(acc, f[kk], sm90::smem_desc(b_s + kk * 32, 16, 1024), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(acc);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) sm90::pin_words(f[kk]);
  store_acc<64>(acc, d);
}

// ---- host side: operands and the products the probes must give --------------------------------------
// Shared memory each probe takes (plus up to 1024 bytes of alignment).
constexpr int kSmemKt = 2 * kPanel + 128 * 128, kSmemTt = 2 * kPanel, kSmemKk = 6 * kPanel, kSmemRs = 2 * kPanel,
              kSmemRsKb = kPanel;

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

// 1. D[64][N] = A[64][128] B[128][N].
inline std::vector<float> want_kt(const std::vector<float>& a, const std::vector<float>& b, int N) {
  std::vector<float> d(64 * N, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 128; ++k) d[m * N + n] += a[m * 128 + k] * b[k * N + n];
  return d;
}
// 2. D[64][N] = X^T Y, X [64 rows][64], Y [64 rows][N].
inline std::vector<float> want_tt(const std::vector<float>& x, const std::vector<float>& y, int N) {
  std::vector<float> d(64 * N, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 64; ++k) d[m * N + n] += x[k * 64 + m] * y[k * N + n];
  return d;
}
// 3. D[64][128] = P Q^T, P [64][128], Q [128][128].
inline std::vector<float> want_kk(const std::vector<float>& p, const std::vector<float>& q) {
  std::vector<float> d(64 * 128, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n)
      for (int k = 0; k < 128; ++k) d[m * 128 + n] += p[m * 128 + k] * q[n * 128 + k];
  return d;
}

// 4. D[64][N] = A[64][64] B[64][N].
inline std::vector<float> want_rs(const std::vector<float>& a, const std::vector<float>& b, int N) {
  std::vector<float> d(64 * N, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < 64; ++k) d[m * N + n] += a[m * 64 + k] * b[k * N + n];
  return d;
}

// 5. D[64][64] = A[64][64] Bt^T, Bt [64 n][64 k].
inline std::vector<float> want_rs_kb(const std::vector<float>& a, const std::vector<float>& bt) {
  std::vector<float> d(64 * 64, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) d[m * 64 + n] += a[m * 64 + k] * bt[n * 64 + k];
  return d;
}

}  // namespace flashgrad::delta_wgmma_probe
