// The CUDA thread model on host threads, shared by the FP8 attention emulation harnesses
// (fp8_emulation/, fp8_wgmma_emulation/, fp8_wgmma_backward_emulation/): one std::thread per CUDA
// thread, the blocks of a grid one after another; threadIdx / blockIdx / blockDim, __syncthreads,
// warp and warpgroup barriers, the warp shuffles and the atomics the kernels use.
//
// Include it first in a harness (before any kernel source: it defines the names the kernels use),
// and define emu_prepare_block() (below) in the harness. Every global here lives in the one
// translation unit that is the harness.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/host_dtype.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#define __grid_constant__

// A failed precondition of the emulation (not of the kernel's results): report and stop.
[[noreturn]] inline void emu_fail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}

struct EmuDim {
  unsigned x = 0, y = 0, z = 0;
};
thread_local EmuDim emu_tid, emu_bid;
EmuDim emu_block_dim;
#define threadIdx emu_tid
#define blockIdx emu_bid
#define blockDim emu_block_dim

// Up to 384 threads per block (the wgmma kernels: 3 warpgroups of 4 warps).
constexpr int kMaxWarps = 12;
constexpr int kMaxWarpgroups = 3;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[kMaxWarps];
std::barrier<>* g_wg_bar[kMaxWarpgroups];
// Per warp: where the lanes leave the values a shuffle or an emulated warp-wide instruction
// (ldmatrix, mma.sync) exchanges.
struct WarpBuf {
  float f[32];
  uint32_t u[32][4];
  uint32_t b[32][2];
  uint32_t addr[32];
} g_warp[kMaxWarps];

inline int emu_warp() { return emu_tid.x / 32; }
inline int emu_lane() { return emu_tid.x % 32; }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void emu_syncwarp() { g_warp_bar[emu_warp()]->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_syncwarp(); }

inline int __float_as_int(float f) { return static_cast<int>(flashgrad::host::float_to_bits(f)); }
inline float __int_as_float(int i) { return flashgrad::host::bits_to_float(static_cast<uint32_t>(i)); }
inline float __shfl_xor_sync(unsigned, float x, int o) {
  WarpBuf& w = g_warp[emu_warp()];
  w.f[emu_lane()] = x;
  emu_syncwarp();
  const float y = w.f[emu_lane() ^ o];
  emu_syncwarp();
  return y;
}
// Lane `src`'s x to every lane of the warp (the wgmma forward broadcasts its warpgroup index).
inline int __shfl_sync(unsigned, int x, int src) {
  WarpBuf& w = g_warp[emu_warp()];
  w.f[emu_lane()] = __int_as_float(x);
  emu_syncwarp();
  const int y = __float_as_int(w.f[src]);
  emu_syncwarp();
  return y;
}

// Warp votes (the FP8 wgmma forward's kIntMax block vote): every lane's predicate, the same answer to all.
inline bool emu_vote(bool pred, bool all) {
  WarpBuf& w = g_warp[emu_warp()];
  w.f[emu_lane()] = pred ? 1.f : 0.f;
  emu_syncwarp();
  bool any = false, every = true;
  for (int l = 0; l < 32; ++l) {
    any = any || w.f[l] != 0.f;
    every = every && w.f[l] != 0.f;
  }
  emu_syncwarp();
  return all ? every : any;
}
inline bool __any_sync(unsigned, bool pred) { return emu_vote(pred, false); }
inline bool __all_sync(unsigned, bool pred) { return emu_vote(pred, true); }

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float2 atomicAdd(float2* p, float2 v) {  // sm_90's vector atomic: each component atomically
  return make_float2(std::atomic_ref<float>(p->x).fetch_add(v.x), std::atomic_ref<float>(p->y).fetch_add(v.y));
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// Defined by each harness: the state every block starts from (its shared memory poisoned with 0xff,
// NaN in e4m3 and every float format; mbarriers and named barriers fresh).
void emu_prepare_block();

// Runs body() as every thread of every block of the grid, blocks one after another, each after
// emu_prepare_block(), with fresh block, warp and warpgroup barriers.
void launch(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& body) {
  emu_block_dim = {threads, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      emu_prepare_block();
      std::barrier<> block(threads);
      std::vector<std::unique_ptr<std::barrier<>>> warps, wgs;
      for (unsigned w = 0; w < threads / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        g_warp_bar[w] = warps.back().get();
      }
      for (unsigned w = 0; w < (threads + 127) / 128 && w < kMaxWarpgroups; ++w) {
        wgs.push_back(std::make_unique<std::barrier<>>(std::min<unsigned>(128, threads)));
        g_wg_bar[w] = wgs.back().get();
      }
      g_block_bar = &block;
      std::vector<std::thread> th;
      for (unsigned t = 0; t < threads; ++t)
        th.emplace_back([&, t] {
          emu_tid = {t, 0, 0};
          emu_bid = {x, y, 0};
          body();
          // A thread that returned early stops counting in the barriers.
          g_warp_bar[t / 32]->arrive_and_drop();
          if (t / 128 < kMaxWarpgroups) g_wg_bar[t / 128]->arrive_and_drop();
          block.arrive_and_drop();
        });
      for (auto& t : th) t.join();
    }
}
