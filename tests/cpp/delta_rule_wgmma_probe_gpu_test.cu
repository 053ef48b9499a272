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
//      Y = do h^T with do [64 rows][V] and h [K][V], V contiguous in both), N = 128, V = 128;
//   4. wgmma_rs (A from registers in the m16n8k16 A layout per warp, B MN-major), N = 64, 128: B2's
//      S k in that plan;
//   5. wgmma_rs_kmajor_b_n64 (A from registers, B K-major), N = 64: B2's tmp = dA A^T (session 19;
//      compiled, first run in the next GPU check).
// The kernels and the expected products live in delta_rule_wgmma_probe_kernels.cuh, which the host
// emulation runs too (CTest DeltaRuleWgmmaProbe.HostEmulation, with emulator_sm90.h's models of the same
// descriptors and accumulator layout): these probes are what ties that model to the hardware. Small integer operands
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

#include "delta_rule_wgmma_probe_kernels.cuh"
#include "gpu_test_util.h"

namespace flashgrad::delta_wgmma_probe {
namespace {

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
  run_and_compare(probe_ss_kt<T, N>, kSmemKt, a.t, b.t, want_kt(a.f, b.f, N), N,
                  "wgmma_ss_kt N=" + std::to_string(N));
}

template <typename T, int N>
void check_tt(std::mt19937& rng) {
  Operand<T> x(rng, 64 * 64), y(rng, 64 * N);
  run_and_compare(probe_ss_tt<T, N>, kSmemTt, x.t, y.t, want_tt(x.f, y.f, N), N, "wgmma_ss_tt N=" + std::to_string(N));
}

template <typename T>
void check_kk(std::mt19937& rng) {
  Operand<T> p(rng, 64 * 128), q(rng, 128 * 128);
  run_and_compare(probe_ss_kk<T>, kSmemKk, p.t, q.t, want_kk(p.f, q.f), 128, "wgmma_ss_n128");
}

template <typename T, int N>
void check_rs(std::mt19937& rng) {
  Operand<T> a(rng, 64 * 64), b(rng, 64 * N);
  run_and_compare(probe_rs<T, N>, kSmemRs, a.t, b.t, want_rs(a.f, b.f, N), N, "wgmma_rs N=" + std::to_string(N));
}

template <typename T>
void check_rs_kb(std::mt19937& rng) {
  Operand<T> a(rng, 64 * 64), bt(rng, 64 * 64);
  run_and_compare(probe_rs_kb<T>, kSmemRsKb, a.t, bt.t, want_rs_kb(a.f, bt.f), 64, "wgmma_rs_kmajor_b_n64");
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

TEST(DeltaRuleWgmmaProbe, RegisterATimesMNMajorB) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  check_rs<__nv_bfloat16, 64>(rng);
  check_rs<__half, 128>(rng);
}

TEST(DeltaRuleWgmmaProbe, RegisterATimesKMajorB) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  check_rs_kb<__nv_bfloat16>(rng);
  check_rs_kb<__half>(rng);
}


// 6. Bulk row copies counted on an mbarrier (sm90::bulk_load, mbar_*: the chains' planned tile loads,
// docs/perf/delta_rule.md session 22): random bytes from a strided source, a partial chunk (rows past it
// zero-filled by ordinary stores), both stages used twice (phase parities 0 and 1); byte-exact. Written
// in session 22 after its last device call: first run in the next GPU check.
TEST(DeltaRuleWgmmaProbe, BulkRowCopiesOnAnMbarrier) {
  REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t pitch = 3 * kBulkRowBytes;
  std::vector<unsigned char> src(static_cast<std::size_t>(kBulkChunks) * 64 * pitch);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  const std::vector<int> len = {64, 37, 64, 1};
  const std::vector<unsigned char> want = want_bulk_rows(src, pitch, len);
  Dev<unsigned char> dsrc(src), dout(std::vector<unsigned char>(want.size(), 0xab));  // out poisoned
  Dev<int> dlen(len);
  ASSERT_NE(dsrc.p, nullptr);
  ASSERT_NE(dout.p, nullptr);
  ASSERT_NE(dlen.p, nullptr);
  const int smem = 2 * 64 * kBulkLd + 16 + 1024;  // two stages, two barriers, the alignment slack
  ASSERT_EQ(cudaFuncSetAttribute(probe_bulk_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  probe_bulk_rows<<<1, 128, smem>>>(dsrc.p, pitch, dlen.p, dout.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dout.p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ < 5)
      ADD_FAILURE() << "chunk " << i / (64 * kBulkRowBytes) << " row " << (i / kBulkRowBytes) % 64 << " byte "
                    << i % kBulkRowBytes << ": " << int(got[i]) << ", want " << int(want[i]);
  EXPECT_EQ(bad, 0) << bad << " of " << want.size() << " bytes differ";
}

}  // namespace
}  // namespace flashgrad::delta_wgmma_probe
