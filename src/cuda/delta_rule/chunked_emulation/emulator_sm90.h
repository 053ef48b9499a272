// Host models of the Hopper primitives the delta rule's wgmma chains use (chunked_wgmma_primitives.cuh
// names them): the kernels' dynamic shared memory (smem_dyn) and its 32-bit addresses
// (__cvta_generic_to_shared), and in flashgrad::cuda_attn::sm90 the 128-byte-swizzle descriptors
// (smem_desc), the 16-bit warpgroup MMA forms with both operands in shared memory (wgmma_ss_kt: A K-major,
// B MN-major, and wgmma_ss_tt: both MN-major, the chains' two; wgmma_ss_n128 / wgmma_ss_n64 / wgmma_ss:
// both K-major, the form B2 on wgmma would use), the form with A from registers and B MN-major
// (wgmma_rs_n64 / wgmma_rs_n128 / wgmma_rs: A in the m16n8k16 A fragment layout per warp, exchanged
// through the emulated warp's buffer), the same with B K-major (wgmma_rs_kmajor_b_n64), and the
// fences, commits, waits and register pins around them; mbarriers and bulk copies (bulk_load: session
// 22, for the chains' planned row loads). tests/cpp/delta_rule_wgmma_probe_kernels.cuh runs every form
// here (CTest DeltaRuleWgmmaProbe.HostEmulation) and on the GPU (DeltaRuleWgmmaProbe.*) against the same
// products (and bytes).
// Include after emulator.h, before any kernel source.
//
// Model: one warpgroup per block (the chains' 128 threads); a wgmma is computed when issued, each
// thread its own accumulator elements straight from shared memory through the descriptors (both
// operands come from shared memory: no exchange between threads), sums of exact 16-bit products in
// double, rounded to fp32 once per instruction. So fences, commits and waits are no-ops, and a
// missing wait, an operand overwritten while a wgmma is in flight, or the hardware's own accumulation
// order go unseen; the descriptors' layout (start, LBO, SBO, the swizzle) and the accumulator layout
// are modelled as the PTX ISA states them (the attention emulation's wgmma.h does the same for its
// kinds; the GPU tests check the hardware).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cuda/attention/wgmma_descriptor.h"
#include <type_traits>

namespace flashgrad::cuda_detail::delta_rule {
// The chains' `extern __shared__ unsigned char smem_dyn[]`: 1024-byte aligned, so their alignment
// offset is 0 and a shared address is the offset from here. Poisoned per block by the harness.
alignas(1024) unsigned char smem_dyn[262144];
}  // namespace flashgrad::cuda_detail::delta_rule

inline std::size_t __cvta_generic_to_shared(const void* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  const unsigned char* base = flashgrad::cuda_detail::delta_rule::smem_dyn;
  if (b < base || b >= base + sizeof(flashgrad::cuda_detail::delta_rule::smem_dyn)) {
    std::fprintf(stderr, "__cvta_generic_to_shared: pointer outside the emulated shared memory\n");
    std::abort();
  }
  return static_cast<std::size_t>(b - base);
}

namespace flashgrad::cuda_attn::sm90 {

inline uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return ::flashgrad::wgmma_descriptor::swizzle128_desc(addr, lbo_bytes, sbo_bytes);
}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}
template <int N>
inline void pin_registers(float (&)[N]) {}
inline void pin_words(uint32_t (&)[4]) {}
inline void fence_proxy_async_shared() {}

namespace emu {
[[noreturn]] inline void fail(const char* why) {
  std::fprintf(stderr, "emulated wgmma: %s\n", why);
  std::abort();
}
// The 128-byte swizzle: 16-byte chunk bits [4, 7) XOR the 128-byte row bits [7, 10) of the address.
inline uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }
inline void check_desc(uint64_t desc) {
  if ((desc >> 62) != 1) fail("descriptor without the 128-byte swizzle (layout type 1)");
}
// 16-bit element (row, k) of a K-major operand: rows 128 bytes apart in groups of 8 SBO apart, k
// contiguous from the start address (a k step of 16 elements: +32 bytes there).
inline uint32_t kmajor(uint64_t desc, int row, int k) {
  check_desc(desc);
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  return swizzle128(start + static_cast<uint32_t>(row / 8) * sbo + static_cast<uint32_t>(row % 8) * 128 +
                    static_cast<uint32_t>(2 * k));
}
// 16-bit element (mn, k) of an MN-major operand: mn contiguous in 64-element (128-byte) panels LBO
// apart, k rows 128 bytes apart in groups of 8 SBO apart.
inline uint32_t mnmajor(uint64_t desc, int mn, int k) {
  check_desc(desc);
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  return swizzle128(start + static_cast<uint32_t>(mn / 64) * lbo + static_cast<uint32_t>(k / 8) * sbo +
                    static_cast<uint32_t>(k % 8) * 128 + static_cast<uint32_t>(mn % 64) * 2);
}
// The 16-bit element at shared address a, as emulator.h's mma::half_of reads one from a register.
template <typename T>
inline double load16(uint32_t a) {
  if (a + 2 > sizeof(flashgrad::cuda_detail::delta_rule::smem_dyn)) fail("operand outside shared memory");
  uint16_t h;
  std::memcpy(&h, flashgrad::cuda_detail::delta_rule::smem_dyn + a, 2);
  return flashgrad::cuda_detail::delta_rule::mma::half_of<T>(h, 0);
}
// D[64 x N] (=|+=) A[64 x 16] B[16 x N] for the calling thread's elements: accumulator i of thread th
// (warp w = th / 32 of the warpgroup, g = (th % 32) / 4, t = th % 4) is D[16 w + g + 8 ((i >> 1) & 1)]
// [8 (i >> 2) + 2 t + (i & 1)]. A K-major (kAK) or MN-major; B K-major (kBK: element (n, k) as row n of a
// K-major operand) or MN-major.
template <typename T, int N, bool kAK, bool kBK = false>
inline void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "m64nNk16: N a multiple of 8 up to 256");
  const int th = static_cast<int>(emu_tid.x % 128), w = th / 32, g = (th % 32) / 4, t = th % 4;
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k)
      s += load16<T>(kAK ? kmajor(a_desc, row, k) : mnmajor(a_desc, row, k)) *
           load16<T>(kBK ? kmajor(b_desc, col, k) : mnmajor(b_desc, col, k));
    d[i] = static_cast<float>((scale_d ? static_cast<double>(d[i]) : 0.0) + s);
  }
}
// The same with A from registers (B MN-major, or K-major with kBK): thread th's a[4] holds, per its warp w (of the warpgroup), rows
// 16 w + g (a[0], a[2]) and 16 w + g + 8 (a[1], a[3]), columns 2 t, 2 t + 1 (a[0], a[1]) and + 8 (a[2],
// a[3]), the lower column in the low half. A thread's output rows need only its own warp's fragments.
template <typename T, int N, bool kBK = false>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "m64nNk16: N a multiple of 8 up to 256");
  const int w = emu_warp(), l = static_cast<int>(emu_tid.x % 32), g = l / 4, t = l % 4;
  std::memcpy(g_warp[w].a[l], a, 16);
  __syncwarp();
  double A[2][16];  // rows g, g + 8 of the warp's 16
  for (int tt = 0; tt < 4; ++tt) {
    const uint32_t* f = g_warp[w].a[4 * g + tt];
    for (int hi = 0; hi < 2; ++hi) {
      A[0][2 * tt + hi] = flashgrad::cuda_detail::delta_rule::mma::half_of<T>(f[0], hi);
      A[1][2 * tt + hi] = flashgrad::cuda_detail::delta_rule::mma::half_of<T>(f[1], hi);
      A[0][2 * tt + 8 + hi] = flashgrad::cuda_detail::delta_rule::mma::half_of<T>(f[2], hi);
      A[1][2 * tt + 8 + hi] = flashgrad::cuda_detail::delta_rule::mma::half_of<T>(f[3], hi);
    }
  }
  __syncwarp();
  for (int i = 0; i < N / 2; ++i) {
    const int r = (i >> 1) & 1, col = 8 * (i >> 2) + 2 * t + (i & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += A[r][k] * load16<T>(kBK ? kmajor(b_desc, col, k) : mnmajor(b_desc, col, k));
    d[i] = static_cast<float>((scale_d ? static_cast<double>(d[i]) : 0.0) + s);
  }
}
}  // namespace emu

template <typename T, int N>
inline void wgmma_ss_kt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu::wgmma_ss<T, N, true>(d, a_desc, b_desc, scale_d);
}
template <typename T, int N>
inline void wgmma_ss_tt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu::wgmma_ss<T, N, false>(d, a_desc, b_desc, scale_d);
}
template <typename T>
inline void wgmma_ss_n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu::wgmma_ss<T, 128, true, true>(d, a_desc, b_desc, scale_d);
}
template <typename T>
inline void wgmma_ss_n64(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu::wgmma_ss<T, 64, true, true>(d, a_desc, b_desc, scale_d);
}
template <typename T, int BN>
inline void wgmma_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu::wgmma_ss<T, BN, true, true>(d, a_desc, b_desc, scale_d);
}
template <typename T>
inline void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu::wgmma_rs<T, 64>(d, a, b_desc, scale_d);
}
template <typename T>
inline void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu::wgmma_rs<T, 128>(d, a, b_desc, scale_d);
}
template <typename T, int D>
inline void wgmma_rs(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu::wgmma_rs<T, D>(d, a, b_desc, scale_d);
}
template <typename T>
inline void wgmma_rs_kmajor_b_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu::wgmma_rs<T, 64, true>(d, a, b_desc, scale_d);
}

// mbarriers and bulk copies (wgmma_primitives.cuh: mbar_init / mbar_arrive / mbar_arrive_expect_tx /
// mbar_wait, bulk_load). The barrier's 8 bytes at its shared address hold the model's state, changed
// atomically: bit 63 the phase parity, bits [44, 63) the arrivals still due in this phase, bits [32, 44)
// the arrival count it was initialized with, bits [0, 32) the transaction bytes still due (signed: a
// copy may complete before its arrive.expect_tx announces it, as on the hardware). The phase completes
// when both reach 0: the parity flips and the arrivals due restart at the count. A bulk copy is done
// when issued (its bytes written, then its transaction count completed), so a wait that comes too
// early, or a buffer refilled while still read, is not modelled; what is: the byte counts (a phase
// waits for exactly the announced bytes: a missing or extra copy hangs or completes early; the
// emulation aborts after ~10 s of waiting, naming the barrier), the parities, the arrival count.
namespace emu {
inline std::atomic_ref<uint64_t> mbar_state(uint32_t bar) {
  if (bar % 8 != 0 || bar + 8 > sizeof(::flashgrad::cuda_detail::delta_rule::smem_dyn)) fail("mbarrier address");
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(::flashgrad::cuda_detail::delta_rule::smem_dyn + bar));
}
// Adds `arrivals` arrivals and `tx` transaction bytes (either may be 0) to the barrier's current phase.
inline void mbar_update(uint32_t bar, uint32_t arrivals, int64_t tx) {
  std::atomic_ref<uint64_t> st = mbar_state(bar);
  uint64_t old = st.load(), next;
  do {
    const uint64_t phase = old >> 63, due = (old >> 44) & 0x7ffffu, count = (old >> 32) & 0xfffu;
    const int64_t bytes = static_cast<int32_t>(static_cast<uint32_t>(old)) + tx;
    if (arrivals > due) fail("mbarrier: more arrivals than its count");
    const uint64_t due_next = due - arrivals;
    if (due_next == 0 && bytes == 0)
      next = ((phase ^ 1u) << 63) | (count << 44) | (count << 32);  // phase done: the next one starts
    else
      next = (phase << 63) | (due_next << 44) | (count << 32) | static_cast<uint32_t>(static_cast<int32_t>(bytes));
  } while (!st.compare_exchange_weak(old, next));
}
}  // namespace emu
inline void mbar_init(uint32_t bar, uint32_t count) {
  if (count == 0 || count > 0xfffu) emu::fail("mbarrier count");
  emu::mbar_state(bar).store((uint64_t{count} << 44) | (uint64_t{count} << 32));
}
inline void mbar_init_fence() {}
inline void mbar_arrive(uint32_t bar) { emu::mbar_update(bar, 1, 0); }
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) { emu::mbar_update(bar, 1, bytes); }
inline void mbar_wait(uint32_t bar, uint32_t parity) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long spins = 1; (emu::mbar_state(bar).load() >> 63) == (parity & 1u); ++spins) {
    if (spins % 1024 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      std::fprintf(stderr, "emulated mbar_wait: barrier at shared address %u never completed phase parity %u\n", bar,
                   parity);
      std::abort();
    }
    std::this_thread::yield();
  }
}
inline void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  if (bytes % 16 != 0 || dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) emu::fail("bulk_load alignment");
  if (dst + bytes > sizeof(::flashgrad::cuda_detail::delta_rule::smem_dyn)) emu::fail("bulk_load past shared memory");
  std::memcpy(::flashgrad::cuda_detail::delta_rule::smem_dyn + dst, src, bytes);
  std::atomic_thread_fence(std::memory_order_release);
  emu::mbar_update(bar, 0, -static_cast<int64_t>(bytes));
}

}  // namespace flashgrad::cuda_attn::sm90
