// The wgmma probe kernels (tests/cpp/delta_rule_wgmma_probe_kernels.cuh; and since session 22 the bulk-copy /
// mbarrier probe, compared byte for byte) run on the host with the
// emulation's models of the Hopper primitives (emulator_sm90.h), against the same products the GPU test
// DeltaRuleWgmmaProbe.* holds the hardware to: the check that the model the chunked emulation runs the
// wgmma kernels with computes, for the kernels' own operand layouts and descriptors, what those kernels
// mean (and, through the GPU test, what the hardware does). Exact comparisons (small integer operands).
// One warpgroup of host threads per probe; fresh random operands per run. CTest
// DeltaRuleWgmmaProbe.HostEmulation; exits 1 on any difference.
#include "emulator.h"
#include "emulator_sm90.h"

#include <memory>
#include <string>

#include "delta_rule_wgmma_probe_kernels.cuh"

namespace probe = flashgrad::delta_wgmma_probe;

// Runs body() on 128 host threads as one block (shared memory poisoned first).
template <typename F>
void launch_warpgroup(F&& body) {
  emu_gdim = {1, 1, 1};
  emu_bdim = {128, 1, 1};
  std::memset(flashgrad::cuda_detail::delta_rule::smem_dyn, 0xff, sizeof(flashgrad::cuda_detail::delta_rule::smem_dyn));
  std::barrier<> blk(128);
  std::vector<std::unique_ptr<std::barrier<>>> wb;
  for (int w = 0; w < 4; ++w) {
    wb.emplace_back(new std::barrier<>(32));
    g_warp_bar[w] = wb.back().get();
  }
  g_block_bar = &blk;
  std::vector<std::thread> th;
  for (unsigned t = 0; t < 128; ++t)
    th.emplace_back([&, t] {
      emu_tid = {t, 0, 0};
      emu_bid = {0, 0, 0};
      body();
    });
  for (auto& t : th) t.join();
}

int compare(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]) && bad++ < 5) std::printf("  %s: element %zu = %g, want %g\n", what.c_str(), i, got[i], want[i]);
  std::printf("%-28s %s\n", what.c_str(), bad ? "FAIL" : "exact");
  return bad != 0;
}

template <typename T, int N>
int check_kt(std::mt19937& rng) {
  probe::Operand<T> a(rng, 64 * 128), b(rng, 128 * N);
  std::vector<float> d(64 * N, NAN);
  launch_warpgroup([&] { probe::probe_ss_kt<T, N>(a.t.data(), b.t.data(), d.data()); });
  return compare(d, probe::want_kt(a.f, b.f, N), "wgmma_ss_kt N=" + std::to_string(N));
}
template <typename T, int N>
int check_tt(std::mt19937& rng) {
  probe::Operand<T> x(rng, 64 * 64), y(rng, 64 * N);
  std::vector<float> d(64 * N, NAN);
  launch_warpgroup([&] { probe::probe_ss_tt<T, N>(x.t.data(), y.t.data(), d.data()); });
  return compare(d, probe::want_tt(x.f, y.f, N), "wgmma_ss_tt N=" + std::to_string(N));
}
template <typename T>
int check_kk(std::mt19937& rng) {
  probe::Operand<T> p(rng, 64 * 128), q(rng, 128 * 128);
  std::vector<float> d(64 * 128, NAN);
  launch_warpgroup([&] { probe::probe_ss_kk<T>(p.t.data(), q.t.data(), d.data()); });
  return compare(d, probe::want_kk(p.f, q.f), "wgmma_ss_n128");
}

template <typename T, int N>
int check_rs(std::mt19937& rng) {
  probe::Operand<T> a(rng, 64 * 64), b(rng, 64 * N);
  std::vector<float> d(64 * N, NAN);
  launch_warpgroup([&] { probe::probe_rs<T, N>(a.t.data(), b.t.data(), d.data()); });
  return compare(d, probe::want_rs(a.f, b.f, N), "wgmma_rs N=" + std::to_string(N));
}

template <typename T>
int check_rs_kb(std::mt19937& rng) {
  probe::Operand<T> a(rng, 64 * 64), bt(rng, 64 * 64);
  std::vector<float> d(64 * 64, NAN);
  launch_warpgroup([&] { probe::probe_rs_kb<T>(a.t.data(), bt.t.data(), d.data()); });
  return compare(d, probe::want_rs_kb(a.f, bt.f), "wgmma_rs_kmajor_b_n64");
}

// Bulk row copies on an mbarrier (probe 6): random bytes, a strided source, one partial chunk.
int check_bulk_rows(std::mt19937& rng) {
  const int64_t pitch = 3 * probe::kBulkRowBytes;
  std::vector<unsigned char> src(static_cast<std::size_t>(probe::kBulkChunks) * 64 * pitch);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  const std::vector<int> len = {64, 37, 64, 1};
  std::vector<unsigned char> out(static_cast<std::size_t>(probe::kBulkChunks) * 64 * probe::kBulkRowBytes, 0xab);
  launch_warpgroup([&] { probe::probe_bulk_rows(src.data(), pitch, len.data(), out.data()); });
  const std::vector<unsigned char> want = probe::want_bulk_rows(src, pitch, len);
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (out[i] != want[i] && bad++ < 5) std::printf("  bulk rows: byte %zu = %d, want %d\n", i, out[i], want[i]);
  std::printf("%-28s %s\n", "bulk_load rows + mbarrier", bad ? "FAIL" : "exact");
  return bad != 0;
}

int main() {
  std::mt19937 rng(std::random_device{}());
  int fails = 0;
  fails += check_kt<__nv_bfloat16, 16>(rng);
  fails += check_kt<__nv_bfloat16, 32>(rng);
  fails += check_kt<__half, 64>(rng);
  fails += check_tt<__nv_bfloat16, 16>(rng);
  fails += check_tt<__half, 32>(rng);
  fails += check_tt<__nv_bfloat16, 64>(rng);
  fails += check_kk<__nv_bfloat16>(rng);
  fails += check_kk<__half>(rng);
  fails += check_rs<__nv_bfloat16, 64>(rng);
  fails += check_rs<__half, 128>(rng);
  fails += check_rs_kb<__nv_bfloat16>(rng);
  fails += check_rs_kb<__half>(rng);
  fails += check_bulk_rows(rng);
  std::printf(fails ? "%d probes differ\n" : "all probes exact\n", fails);
  return fails ? 1 : 0;
}
