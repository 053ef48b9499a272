// Hardware probes of the layouts the FP8 wgmma forward (src/cuda/attention/fp8_wgmma_*) relies on,
// one concern per test, so that a failure of the attention tests with
// FLASHGRAD_ATTN_FP8_FORWARD=wgmma points at its cause:
//   1. S = Q K^T: wgmma m64nNk32 e4m3 with both operands K-major in SWIZZLE_128B shared memory,
//      k32 steps as +32 bytes inside the 128-byte row, row offsets (the second consumer
//      warpgroup's 64 query rows, the D = 256 kernel's second 64-key sub-block); and with the
//      D = 64 kernel's 64-byte rows (SWIZZLE_64B);
//   2. the 8-bit A register fragment of wgmma (claimed: mma.sync m16n8k32's A per warp,
//      fp8_fragments.cuh a_element) against a K-major B, at each k32 offset of the row;
//   3. the kernel's P path end to end: S accumulators -> fp8w_pack_p -> A registers, times the V^T
//      tile written by the kernel's own transpose (key permutation, zero fill past the sequence).
// Small integer operands: every product and sum is exact whatever the tensor cores' alignment, so
// results compare exactly. Fresh random inputs per run; outputs poisoned before each launch.
// They run only with FLASHGRAD_TEST_FP8W_PROBES=1 (tools/gpu-extra/fp8w.sh sets it, in a process of
// their own): until the hardware has confirmed the layouts, a wrong descriptor could leave a sticky
// CUDA error that would fail every later test of the GPU test binary.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/attention/fp8_wgmma_forward_kernel.cuh"
#include "gpu_test_util.h"

namespace flashgrad::fp8w_probe {
namespace {

namespace sm90 = cuda_attn::sm90;
namespace f8 = cuda_attn::fp8;
namespace f8w = cuda_attn::fp8w;

// Byte offset of (row, col) in a tile of 128-byte rows as TMA's SWIZZLE_128B writes it (16-byte
// chunk c of row r at chunk c ^ (r % 8), tile 1024-byte aligned); with 64-byte rows as SWIZZLE_64B
// writes it (address bits 4-5 ^= bits 7-8: chunk c of row r at c ^ ((r / 2) % 4)).
template <int RB = 128>
__host__ __device__ inline int swizzled(int row, int col) {
  if constexpr (RB == 128)
    return row * 128 + ((((col >> 4) ^ (row & 7))) << 4) + (col & 15);
  else
    return row * 64 + ((((col >> 4) ^ ((row >> 1) & 3))) << 4) + (col & 15);
}

// Copies a [rows][128] byte tile from global memory into shared memory at `dst` (swizzled), and
// makes it visible to the tensor cores (async proxy).
template <int RB = 128>
__device__ void load_tile(uint8_t* dst, const uint8_t* src, int rows) {
  for (int i = threadIdx.x; i < rows * RB; i += blockDim.x) dst[swizzled<RB>(i / RB, i % RB)] = src[i];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

__device__ uint8_t* aligned_smem() {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t a = cuda_attn::smem_address(smem_raw);
  return smem_raw + (((a + 1023u) & ~1023u) - a);
}

// Accumulator element i of this thread -> (row, col) of the 64 x N result.
__device__ void store_acc(float* out, const float* d, int n, int count) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int i = 0; i < count; ++i) {
    const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
    out[row * n + col] = d[i];
  }
}

// D[64 x N] = A[a_row0 .., 0..RB-1] . B[b_row0 .., 0..RB-1]^T (RB / 32 k32 steps), A, B [128][RB]
// bytes, descriptors as the kernel's (fp8w_qk_desc).
template <int N, int RB>
__global__ void ss_probe(const uint8_t* A, const uint8_t* B, int a_row0, int b_row0, float* D) {
  uint8_t* sA = aligned_smem();
  uint8_t* sB = sA + 128 * 128;
  load_tile<RB>(sA, A, 128);
  load_tile<RB>(sB, B, 128);
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint32_t a0 = cuda_attn::smem_address(sA) + a_row0 * RB, b0 = cuda_attn::smem_address(sB) + b_row0 * RB;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < RB / 32; ++kk)
    sm90::wgmma_e4m3_ss<N>(d, f8w::fp8w_qk_desc<RB>(a0 + kk * 32), f8w::fp8w_qk_desc<RB>(b0 + kk * 32), kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(d);
  store_acc(D, d, N, N / 2);
}

// D[64 x N] = A[64 x 32] (registers, per the claimed fragment layout) . B[b_row0 .., 32 ks ..
// 32 ks + 31]^T, B [256][128] bytes.
template <int N>
__global__ void rs_probe(const uint8_t* A, const uint8_t* B, int b_row0, int ks, float* D) {
  uint8_t* sB = aligned_smem();
  load_tile(sB, B, 256);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) {
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b) {
      int row, col;
      f8::a_element(lane, r, b, row, col);
      word |= static_cast<uint32_t>(A[(16 * w + row) * 32 + col]) << (8 * b);
    }
    a[r] = word;
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  sm90::wgmma_fence();
  sm90::wgmma_e4m3_rs<N>(d, a, sm90::smem_desc(cuda_attn::smem_address(sB) + b_row0 * 128 + ks * 32, 16, 1024), 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(d);
  store_acc(D, d, N, N / 2);
}

// O[64 x 128] = P8[64 x 128 keys] . V[128 keys x 128 dims]: P from "S accumulators" (P[row][key]
// placed as the S wgmma leaves it) through fp8w_pack_p, vt [128 dims][128 columns] from the
// kernel's transpose, 4 k32 steps as the kernel's issue_pv.
__global__ void pv_path_probe(const float* P, const uint8_t* vt, float* O) {
  uint8_t* sVt = aligned_smem();
  load_tile(sVt, vt, 128);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float s[64];
  for (int i = 0; i < 64; ++i) s[i] = P[(16 * w + g + 8 * ((i >> 1) & 1)) * 128 + 8 * (i >> 2) + 2 * t + (i & 1)];
  uint32_t pa[4][4];
  f8w::fp8w_pack_p<128>(s, pa);
  float o[64];
  sm90::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    sm90::wgmma_e4m3_rs<128>(o, pa[ks], sm90::smem_desc(cuda_attn::smem_address(sVt) + ks * 32, 16, 1024), ks > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::pin_registers(o);
  store_acc(O, o, 128, 64);
}

template <typename T>
struct Dev {
  T* ptr = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) { cudaMalloc(&ptr, count * sizeof(T)); }
  ~Dev() { cudaFree(ptr); }
  void up(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> down() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() { cudaMemset(ptr, 0xff, n * sizeof(T)); }
};

// Random e4m3 codes of small integers in [-3, 3], with their values.
void small_ints(std::mt19937& rng, std::vector<uint8_t>& code, std::vector<float>& val) {
  std::uniform_int_distribution<int> small(-3, 3);
  for (size_t i = 0; i < code.size(); ++i) val[i] = host::e4m3_to_float(code[i] = host::float_to_e4m3(float(small(rng))));
}

constexpr int kProbeSmem = 2 * 128 * 128 + 1024;

#define REQUIRE_FP8W_PROBES()                                                                        \
  do {                                                                                               \
    REQUIRE_GPU();                                                                                   \
    const char* on_ = std::getenv("FLASHGRAD_TEST_FP8W_PROBES");                                     \
    if (on_ == nullptr || std::strcmp(on_, "1") != 0)                                                \
      GTEST_SKIP() << "FP8 wgmma layout probes run with FLASHGRAD_TEST_FP8W_PROBES=1 (fp8w.sh)";     \
  } while (0)

template <int N, int RB = 128>
void check_ss(int a_row0, int b_row0) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint8_t> A(128 * RB), B(128 * RB);
  std::vector<float> Af(A.size()), Bf(B.size());
  small_ints(rng, A, Af);
  small_ints(rng, B, Bf);
  Dev<uint8_t> dA(A.size()), dB(B.size());
  Dev<float> dD(64 * N);
  dA.up(A);
  dB.up(B);
  dD.poison();
  ss_probe<N, RB><<<1, 128, kProbeSmem>>>(dA.ptr, dB.ptr, a_row0, b_row0, dD.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> D = dD.down();
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < RB; ++k) want += double(Af[(a_row0 + m) * RB + k]) * Bf[(b_row0 + n) * RB + k];
      ASSERT_EQ(D[m * N + n], float(want)) << "wgmma m64n" << N << "k32 e4m3 (smem, smem), rows of " << RB
                                           << " bytes, A rows from " << a_row0
                                           << ", B rows from " << b_row0 << ": D[" << m << "][" << n << "]";
    }
}

TEST(Fp8WgmmaProbe, SharedMemoryOperandsKMajor) {
  REQUIRE_FP8W_PROBES();
  check_ss<128>(0, 0);   // D = 128: first consumer warpgroup
  check_ss<128>(64, 0);  // second consumer warpgroup (+8192 bytes)
  check_ss<64>(0, 0);    // D = 256: 64-key sub-blocks of a 128-key K tile
  check_ss<64>(64, 64);
}

// D = 64: Q / K rows of 64 bytes with SWIZZLE_64B (descriptor layout type 2, SBO 512), the second
// consumer warpgroup's rows at +4096 bytes.
TEST(Fp8WgmmaProbe, SharedMemoryOperands64ByteRows) {
  REQUIRE_FP8W_PROBES();
  check_ss<128, 64>(0, 0);
  check_ss<128, 64>(64, 0);
}

template <int N>
void check_rs(int b_row0, int ks) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint8_t> A(64 * 32), B(256 * 128);
  std::vector<float> Af(A.size()), Bf(B.size());
  small_ints(rng, A, Af);
  small_ints(rng, B, Bf);
  Dev<uint8_t> dA(A.size()), dB(B.size());
  Dev<float> dD(64 * N);
  dA.up(A);
  dB.up(B);
  dD.poison();
  rs_probe<N><<<1, 128, 256 * 128 + 1024>>>(dA.ptr, dB.ptr, b_row0, ks, dD.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> D = dD.down();
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < 32; ++k) want += double(Af[m * 32 + k]) * Bf[(b_row0 + n) * 128 + 32 * ks + k];
      ASSERT_EQ(D[m * N + n], float(want)) << "wgmma m64n" << N << "k32 e4m3, A in registers (mma.sync m16n8k32 A "
                                           << "layout per warp), B rows from " << b_row0 << ", k step " << ks
                                           << ": D[" << m << "][" << n << "]";
    }
}

TEST(Fp8WgmmaProbe, RegisterAFragmentIsMmaSyncLayout) {
  REQUIRE_FP8W_PROBES();
  for (int ks = 0; ks < 4; ++ks) check_rs<128>(0, ks);  // D = 128: one chunk of 128 dims
  check_rs<128>(128, 2);                               // second 128-dim chunk of a D = 256 tile
  check_rs<64>(192, 1);                                // D = 256 with 64-dim chunks: the last one
}

TEST(Fp8WgmmaProbe, PackedPTimesKernelTransposedV) {
  REQUIRE_FP8W_PROBES();
  std::mt19937 rng(std::random_device{}());
  constexpr int kKeys = 100;  // < 128: the transpose must zero-fill columns 100..127
  std::uniform_int_distribution<int> pint(0, 15);
  std::vector<float> P(64 * 128), V(128 * 128, 0.f);
  std::vector<uint8_t> v8(128 * 128, 0), vcode(kKeys * 128);
  std::vector<float> vval(vcode.size());
  small_ints(rng, vcode, vval);
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < 128; ++d) {
      v8[j * 128 + d] = vcode[j * 128 + d];
      V[j * 128 + d] = vval[j * 128 + d];
    }
  for (auto& x : P) x = float(pint(rng));  // already "448 p~": packed as is, exact in e4m3
  Dev<uint8_t> dv(v8.size()), dvt(128 * 128);
  Dev<float> dP(P.size()), dO(64 * 128);
  dv.up(v8);
  dP.up(P);
  dvt.poison();  // 0xff is NaN in e4m3fn: columns the transpose fails to write poison O
  dO.poison();
  cuda_attn::Fp8KernelParams f;
  f.base.v = dv.ptr;
  f.base.v_st = {128 * 128, 128, 128};
  f.base.num_seqs = 1;
  f.base.seqlen_k = kKeys;
  f.base.heads_k = 1;
  f.vt = dvt.ptr;
  f.vt_cols = f8w::vt_columns(false, 1, kKeys, kKeys);
  ASSERT_EQ(f.vt_cols, 128);
  f8w::fp8w_transpose_v_kernel<128><<<dim3(1, 1), 256, f8w::vt_transpose_smem_bytes<128>()>>>(f, 1);
  pv_path_probe<<<1, 128, 128 * 128 + 1024>>>(dP.ptr, dvt.ptr, dO.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> O = dO.down();
  for (int m = 0; m < 64; ++m)
    for (int d = 0; d < 128; ++d) {
      double want = 0;
      for (int j = 0; j < 128; ++j) want += double(P[m * 128 + j]) * V[j * 128 + d];
      ASSERT_EQ(O[m * 128 + d], float(want)) << "P8 (fp8w_pack_p) . vt (fp8w_transpose_v_kernel): row " << m
                                             << " dim " << d;
    }
}

}  // namespace
}  // namespace flashgrad::fp8w_probe
