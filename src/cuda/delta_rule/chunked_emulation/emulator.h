// Host emulation of the CUDA features the chunked delta-rule stages use (threadIdx / blockIdx,
// __syncthreads, __syncwarp, shuffles, shared float atomics and mma.sync m16n8k16), shared by
// the emulation harnesses of this folder (harness.cc: GDN and the plain rule; kda_harness.cc:
// KDA). harness.cc's file comment says how the emulation works and what it cannot check.
// Include it before any kernel source (it defines the names the kernels use).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

struct EmuDim { unsigned x = 0, y = 0, z = 0; };
thread_local EmuDim emu_tid, emu_bid;
EmuDim emu_gdim;  // the grid of the current launch (set by the harness's launch)
EmuDim emu_bdim;  // the block of the current launch (x threads per row; y rows: 2D blocks)
// The linear warp of the calling thread (threadIdx.y rows of emu_bdim.x threads).
inline int emu_warp() { return static_cast<int>((emu_tid.y * emu_bdim.x + emu_tid.x) / 32); }
#define threadIdx emu_tid
#define blockIdx emu_bid
#define gridDim emu_gdim
std::barrier<>* g_block_bar;
std::barrier<>* g_named_bar[16];  // bar.sync id, n (chunked_stage_sync.cuh): one per id the launch names
inline void emu_named_barrier(int id) { g_named_bar[id]->arrive_and_wait(); }
std::barrier<>* g_warp_bar[16];  // up to 512 threads per block
struct WarpBuf { float f[32]; uint32_t a[32][4]; uint32_t b[32][2]; } g_warp[16];
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
#define __launch_bounds__(...)
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_bar[emu_warp()]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float x, int o) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  g_warp[w].f[l] = x; __syncwarp();
  const float y = g_warp[w].f[l ^ o]; __syncwarp();
  return y;
}
inline float __shfl_up_sync(unsigned, float x, unsigned o) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  g_warp[w].f[l] = x; __syncwarp();
  const float y = l >= (int)o ? g_warp[w].f[l - o] : x; __syncwarp();
  return y;
}
inline float __shfl_sync(unsigned, float x, int src) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  g_warp[w].f[l] = x; __syncwarp();
  const float y = g_warp[w].f[src & 31]; __syncwarp();
  return y;
}
namespace flashgrad::cuda_detail::delta_rule {
alignas(16) unsigned char smem_raw[262144];
namespace mma {
template <typename T> float half_of(uint32_t r, int hi) {
  const uint16_t h = hi ? (r >> 16) : (r & 0xffff);
  T x; std::memcpy(&x, &h, 2);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x); else return __half2float(x);
}
template <typename T>
void emulated_mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  std::memcpy(g_warp[w].a[l], a, 16); std::memcpy(g_warp[w].b[l], b, 8);
  __syncwarp();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; ++L) {
    const int g = L >> 2, t = L & 3; const uint32_t* aa = g_warp[w].a[L]; const uint32_t* bb = g_warp[w].b[L];
    for (int hi = 0; hi < 2; ++hi) {
      A[g][2*t+hi] = half_of<T>(aa[0], hi); A[g+8][2*t+hi] = half_of<T>(aa[1], hi);
      A[g][2*t+8+hi] = half_of<T>(aa[2], hi); A[g+8][2*t+8+hi] = half_of<T>(aa[3], hi);
      B[2*t+hi][g] = half_of<T>(bb[0], hi); B[2*t+8+hi][g] = half_of<T>(bb[1], hi);
    }
  }
  const int g = l >> 2, t = l & 3;
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
    float s = 0; for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][c];
    d[e] += s;
  }
  __syncwarp();
}
// TF32 (chunked_mma_tf32.cuh): cvt.rna keeps 10 mantissa bits, rounding half away from zero.
inline uint32_t emulated_to_tf32(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
}
inline void emulated_mma1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  std::memcpy(g_warp[w].a[l], a, 16); std::memcpy(g_warp[w].b[l], b, 8);
  __syncwarp();
  float A[16][8], B[8][8];
  for (int L = 0; L < 32; ++L) {
    const int g = L >> 2, t = L & 3; const uint32_t* aa = g_warp[w].a[L]; const uint32_t* bb = g_warp[w].b[L];
    A[g][t] = __uint_as_float(aa[0]); A[g + 8][t] = __uint_as_float(aa[1]);
    A[g][t + 4] = __uint_as_float(aa[2]); A[g + 8][t + 4] = __uint_as_float(aa[3]);
    B[t][g] = __uint_as_float(bb[0]); B[t + 4][g] = __uint_as_float(bb[1]);
  }
  const int g = l >> 2, t = l & 3;
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
    float s = 0; for (int k = 0; k < 8; ++k) s += A[r][k] * B[k][c];
    d[e] += s;
  }
  __syncwarp();
}
// ldmatrix .x4 (chunked_mma_ldmatrix.cuh), from the PTX ISA's description: lane l supplies the
// address of row l % 8 of tile l / 8; register m of lane l receives tile m's 16-bit elements
// (row l / 4, columns 2 (l % 4), 2 (l % 4) + 1), or with .trans (rows 2 (l % 4), 2 (l % 4) + 1,
// column l / 4); the lower index in the low half. Addresses are exchanged through the warp buffer.
inline const void* g_warp_ptr[16][32];
// ldmatrix / stmatrix: the calling lane's row address (16-byte aligned, else the emulation stops,
// naming the instruction) into the warp's exchange slots, visible to the whole warp on return.
inline void emu_publish_row_address(const void* row_addr, const char* instruction) {
  if ((reinterpret_cast<uintptr_t>(row_addr) & 15) != 0) {
    std::fprintf(stderr, "%s: row address not 16-byte aligned\n", instruction);
    std::abort();
  }
  g_warp_ptr[emu_warp()][emu_tid.x % 32] = row_addr;
  __syncwarp();
}
inline void emulated_ldmatrix_x4(uint32_t (&r)[4], const void* row_addr, bool trans) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  emu_publish_row_address(row_addr, "ldmatrix");
  auto elem = [&](int tile, int row, int col) {
    uint16_t x;
    std::memcpy(&x, static_cast<const unsigned char*>(g_warp_ptr[w][8 * tile + row]) + 2 * col, 2);
    return static_cast<uint32_t>(x);
  };
  for (int m = 0; m < 4; ++m) {
    if (!trans)
      r[m] = elem(m, l / 4, 2 * (l % 4)) | (elem(m, l / 4, 2 * (l % 4) + 1) << 16);
    else
      r[m] = elem(m, 2 * (l % 4), l / 4) | (elem(m, 2 * (l % 4) + 1, l / 4) << 16);
  }
  __syncwarp();
}
// stmatrix .x4 .trans (chunked_mma_ldmatrix.cuh), from the PTX ISA's description: lane l supplies
// the address of stored row l % 8 of tile l / 8; register m of lane l holds tile m's fragment row
// l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low half first), stored transposed: at stored rows
// 2 (l % 4) and 2 (l % 4) + 1, position l / 4.
inline void emulated_stmatrix_x4_trans(const uint32_t (&r)[4], void* row_addr) {
  const int w = emu_warp(), l = emu_tid.x % 32;
  emu_publish_row_address(row_addr, "stmatrix");
  for (int m = 0; m < 4; ++m)
    for (int hi = 0; hi < 2; ++hi) {
      const uint16_t x = static_cast<uint16_t>(hi ? r[m] >> 16 : r[m] & 0xffffu);
      void* row = const_cast<void*>(g_warp_ptr[w][8 * m + 2 * (l % 4) + hi]);
      std::memcpy(static_cast<unsigned char*>(row) + 2 * (l / 4), &x, 2);
    }
  __syncwarp();
}
// cp.async 16 bytes (with zero fill when !full), modelled as a synchronous copy: the emulation
// cannot see a missing wait_group (the block barrier that must follow it is still modelled).
inline void emulated_cp_async16(void* dst, const void* src, bool full) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15) != 0 || (full && (reinterpret_cast<uintptr_t>(src) & 15) != 0)) {
    std::fprintf(stderr, "cp.async: address not 16-byte aligned\n");
    std::abort();
  }
  if (full)
    std::memcpy(dst, src, 16);
  else
    std::memset(dst, 0, 16);
}
inline void emulated_cp_async4(void* dst, const void* src, bool full) {
  if ((reinterpret_cast<uintptr_t>(dst) & 3) != 0 || (full && (reinterpret_cast<uintptr_t>(src) & 3) != 0)) {
    std::fprintf(stderr, "cp.async: address not 4-byte aligned\n");
    std::abort();
  }
  if (full)
    std::memcpy(dst, src, 4);
  else
    std::memset(dst, 0, 4);
}
}  // namespace mma
}  // namespace flashgrad::cuda_detail::delta_rule
