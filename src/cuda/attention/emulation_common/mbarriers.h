// Hopper's mbarriers (arrival counts, transaction bytes, phases) and named barriers (bar.sync /
// bar.arrive with an id and a thread count) on the host, with the names and signatures of
// wgmma_primitives.cuh / fp8_wgmma_primitives.cuh (prepare_headers.py empties those headers).
// An mbarrier that gets more arrivals than its count, or a wait that does not finish in 20 s
// (a deadlock), is reported and stops the run.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "cuda/attention/emulation_common/thread_model.h"

struct EmuMbar {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  unsigned phase = 0;
};
std::mutex g_mu;
std::condition_variable g_cv;
std::map<uint32_t, EmuMbar> g_mbars;  // by shared-memory address
struct EmuNamedBar {
  int count = 0;
  unsigned gen = 0;
};
EmuNamedBar g_named[16];
std::atomic<bool> g_deadlock{false};

// Every block starts with no mbarrier and every named barrier empty (from emu_prepare_block()).
inline void reset_barriers() {
  g_mbars.clear();
  for (auto& nb : g_named) nb = EmuNamedBar{};
}

// With g_mu held: the phase completes once every arrival and every transaction byte is in.
void mbar_complete_if_done(EmuMbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.expected;
    g_cv.notify_all();
  }
}
EmuMbar& mbar_at(uint32_t bar) {
  auto it = g_mbars.find(bar);
  if (it == g_mbars.end()) {
    std::fprintf(stderr, "emulation: mbarrier at %u used before init\n", bar);
    std::abort();
  }
  return it->second;
}

namespace flashgrad::cuda_attn_emulated::sm90 {

inline void mbar_init(uint32_t bar, uint32_t count) {
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = g_mbars[bar];
  b.expected = b.pending = static_cast<int>(count);
  b.tx = 0;
  b.phase = 0;
}
inline void mbar_init_fence() {}
inline void mbar_arrive(uint32_t bar) {
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  if (--b.pending < 0) emu_fail("mbarrier: more arrivals than its count");
  mbar_complete_if_done(b);
}
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  b.tx += bytes;
  if (--b.pending < 0) emu_fail("mbarrier: more arrivals than its count");
  mbar_complete_if_done(b);
}
// Returns once the phase of parity `parity` has completed, i.e. the current phase's parity differs.
inline void mbar_wait(uint32_t bar, uint32_t parity) {
  std::unique_lock<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  if (!g_cv.wait_for(lock, std::chrono::seconds(20), [&] { return (b.phase & 1u) != parity || g_deadlock; }) ||
      g_deadlock) {
    if (!g_deadlock.exchange(true))
      std::fprintf(stderr, "emulation: DEADLOCK: thread %u of block %u,%u waits on mbarrier %u parity %u (phase %u, "
                   "pending %d, tx %lld)\n", emu_tid.x, emu_bid.x, emu_bid.y, bar, parity, b.phase, b.pending,
                   static_cast<long long>(b.tx));
    std::fflush(stderr);
    std::_Exit(3);
  }
}
inline void mbar_wait_suspend(uint32_t bar, uint32_t parity) { mbar_wait(bar, parity); }
// Whether the phase of parity `parity` has completed, without waiting (test_wait).
inline bool mbar_test(uint32_t bar, uint32_t parity) {
  std::lock_guard<std::mutex> lock(g_mu);
  return (mbar_at(bar).phase & 1u) != parity;
}

inline void named_barrier_sync(int id, int threads) {
  std::unique_lock<std::mutex> lock(g_mu);
  EmuNamedBar& nb = g_named[id];
  const unsigned gen = nb.gen;
  if (++nb.count == threads) {
    nb.count = 0;
    ++nb.gen;
    g_cv.notify_all();
    return;
  }
  if (!g_cv.wait_for(lock, std::chrono::seconds(20), [&] { return nb.gen != gen || g_deadlock; }) || g_deadlock) {
    if (!g_deadlock.exchange(true))
      std::fprintf(stderr, "emulation: DEADLOCK at named barrier %d (thread %u, block %u)\n", id, emu_tid.x,
                   emu_bid.x);
    std::fflush(stderr);
    std::_Exit(3);
  }
}
template <int kId>
inline void named_barrier_sync_id(int threads) {
  named_barrier_sync(kId, threads);
}
template <int kId>
inline void named_barrier_arrive_id(int threads) {
  std::lock_guard<std::mutex> lock(g_mu);
  EmuNamedBar& nb = g_named[kId];
  if (++nb.count == threads) {
    nb.count = 0;
    ++nb.gen;
    g_cv.notify_all();
  }
}

}  // namespace flashgrad::cuda_attn_emulated::sm90
