// Hopper's wgmma on the host, with the names and signatures of wgmma_primitives.cuh /
// fp8_wgmma_primitives.cuh (prepare_headers.py empties those headers): m64nNk32 e4m3 with both
// operands from descriptors (K-major) or A from registers (the 8-bit A fragment layout of
// fp8_fragments.cuh per warp), and m64nNk16 bf16 / f16 with A from registers (the m16n8k16 A
// layout per warp) or from an MN-major descriptor and B MN-major. Descriptors follow the PTX ISA
// and CUTLASS (as the kernels do); the GPU probes check them on the hardware. A wgmma runs
// synchronously at issue, so fences, commits and waits are no-ops and a missing wait goes unseen.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/attention/wgmma_descriptor.h"

#include "core/host_dtype.h"
#include "cuda/attention/emulation_common/e4m3_accumulator.h"
#include "cuda/attention/emulation_common/scalar_ptx.h"
#include "cuda/attention/emulation_common/sm90_shared_memory.h"
#include "cuda/attention/emulation_common/tensor_maps.h"
#include "cuda/attention/emulation_common/thread_model.h"
#include "fp8_fragments.cuh"  // the rewritten copy (namespace flashgrad::cuda_attn_emulated)

// Per warpgroup: the threads' accumulators and A registers, and the computing thread's operands
// (as doubles: e4m3 / 16-bit values and their products are exact there).
struct WgStage {
  float c[128][128];
  uint32_t a[128][4];
  double A[64][32], B[256][32], C[64][256];
} g_wg[kMaxWarpgroups];

// Address of byte kb of row `row` of a K-major operand: rows in groups of 8 SBO apart, the row
// pitch the swizzle span (layout type 1: 128 bytes, 2: 64, 3: 32), then the address swizzle.
uint32_t kmajor_address(uint64_t desc, int row, int kb) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  const int layout = static_cast<int>(desc >> 62);
  const int span = layout == 1 ? 128 : layout == 2 ? 64 : layout == 3 ? 32 : 0;
  if (span == 0) emu_fail("K-major wgmma descriptor without swizzle");
  const uint32_t a = swizzle_address(
      start + static_cast<uint32_t>(row / 8) * sbo + static_cast<uint32_t>(row % 8) * span + kb, span);
  if (a >= static_cast<uint32_t>(kSm90SmemBytes)) emu_fail("wgmma operand outside shared memory");
  return a;
}
// Address of 16-bit element (mn, k) of an MN-major operand: the MN dim contiguous in 64-element
// (128-byte) panels LBO apart, k rows 128 bytes apart in groups of 8 SBO apart, swizzled.
uint32_t mnmajor_address(uint64_t desc, int mn, int k) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 62) != 1) emu_fail("wgmma descriptor without the 128-byte swizzle");
  const uint32_t a = swizzle_address(start + static_cast<uint32_t>(mn / 64) * lbo + static_cast<uint32_t>(k / 8) * sbo +
                                         static_cast<uint32_t>(k % 8) * 128 + static_cast<uint32_t>(mn % 64) * 2,
                                     128);
  if (a + 2 > static_cast<uint32_t>(kSm90SmemBytes)) emu_fail("wgmma operand outside shared memory");
  return a;
}
uint16_t smem16(uint32_t a) {
  uint16_t h;
  std::memcpy(&h, sm90_smem + a, 2);
  return h;
}

enum class WgKind { e4m3_ss, e4m3_rs, b16_rs, b16_ss_tt };

// D[64 x N] (=|+=) A[64 x K] B[K x N] for the calling thread's warpgroup (T: the 16-bit type of
// the b16 kinds): every thread deposits its accumulators (and A registers), one thread computes,
// every thread takes its part back. Accumulator i of thread th (warp w = th / 32, g = (th % 32) / 4,
// t = th % 4) is D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 t + (i & 1)].
template <typename T>
void emu_wgmma(WgKind kind, float* d, int n, const uint32_t* a_regs, uint64_t a_desc, uint64_t b_desc, int scale_d) {
  namespace f8 = flashgrad::cuda_attn_emulated::fp8;
  const int wg = emu_tid.x / 128, t = emu_tid.x % 128;
  WgStage& st = g_wg[wg];
  std::memcpy(st.c[t], d, sizeof(float) * n / 2);
  if (a_regs != nullptr) std::memcpy(st.a[t], a_regs, 16);
  g_wg_bar[wg]->arrive_and_wait();
  if (t == 0) {
    const bool e4m3 = kind == WgKind::e4m3_ss || kind == WgKind::e4m3_rs;
    const int K = e4m3 ? 32 : 16;
    auto& A = st.A;
    auto& B = st.B;
    auto& C = st.C;
    if (kind == WgKind::e4m3_ss) {
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 32; ++k) A[m][k] = flashgrad::host::e4m3_to_float(sm90_smem[kmajor_address(a_desc, m, k)]);
    } else if (kind == WgKind::e4m3_rs) {
      for (int th = 0; th < 128; ++th)
        for (int r = 0; r < 4; ++r)
          for (int b = 0; b < 4; ++b) {
            int row, col;
            f8::a_element(th % 32, r, b, row, col);
            A[16 * (th / 32) + row][col] = flashgrad::host::e4m3_to_float(static_cast<uint8_t>(st.a[th][r] >> (8 * b)));
          }
    } else if (kind == WgKind::b16_rs) {
      for (int th = 0; th < 128; ++th) {
        const int w = th / 32, g = (th % 32) / 4, tt = th % 4;
        for (int r = 0; r < 4; ++r)
          for (int hi = 0; hi < 2; ++hi) {
            const int row = 16 * w + g + 8 * (r & 1), col = 2 * tt + hi + 8 * (r >> 1);
            A[row][col] = half_value<T>(static_cast<uint16_t>(hi ? st.a[th][r] >> 16 : st.a[th][r] & 0xffff));
          }
      }
    } else {
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) A[m][k] = half_value<T>(smem16(mnmajor_address(a_desc, m, k)));
    }
    if (e4m3) {
      for (int nn = 0; nn < n; ++nn)
        for (int k = 0; k < 32; ++k) B[nn][k] = flashgrad::host::e4m3_to_float(sm90_smem[kmajor_address(b_desc, nn, k)]);
    } else {
      for (int nn = 0; nn < n; ++nn)
        for (int k = 0; k < 16; ++k) B[nn][k] = half_value<T>(smem16(mnmajor_address(b_desc, nn, k)));
    }
    for (int th = 0; th < 128; ++th) {
      const int w = th / 32, g = (th % 32) / 4, tt = th % 4;
      for (int i = 0; i < n / 2; ++i)
        C[16 * w + g + 8 * ((i >> 1) & 1)][8 * (i >> 2) + 2 * tt + (i & 1)] = st.c[th][i];
    }
    for (int m = 0; m < 64; ++m)
      for (int nn = 0; nn < n; ++nn) {
        double prod[32];
        for (int k = 0; k < K; ++k) prod[k] = A[m][k] * B[nn][k];
        const float cin = scale_d ? static_cast<float>(C[m][nn]) : 0.f;
        if (e4m3 && g_hopper_accumulator) {
          C[m][nn] = hopper_e4m3_accumulate(cin, prod, K);
        } else {
          double sum = 0;
          for (int k = 0; k < K; ++k) sum += prod[k];
          C[m][nn] = static_cast<float>(double(cin) + sum);
        }
      }
    for (int th = 0; th < 128; ++th) {
      const int w = th / 32, g = (th % 32) / 4, tt = th % 4;
      for (int i = 0; i < n / 2; ++i)
        st.c[th][i] = static_cast<float>(C[16 * w + g + 8 * ((i >> 1) & 1)][8 * (i >> 2) + 2 * tt + (i & 1)]);
    }
  }
  g_wg_bar[wg]->arrive_and_wait();
  std::memcpy(d, st.c[t], sizeof(float) * n / 2);
  g_wg_bar[wg]->arrive_and_wait();
}

namespace flashgrad::cuda_attn_emulated::sm90 {

template <int N>
inline void regs_decrease() {}
template <int N>
inline void regs_increase() {}

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
template <int KK>
inline void pin_fragments(uint32_t (&)[KK][4], uint32_t (&)[KK][4]) {}

template <int BN>
inline void wgmma_e4m3_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu_wgmma<__nv_bfloat16>(WgKind::e4m3_ss, d, BN, nullptr, a_desc, b_desc, scale_d);
}
template <int NC>
inline void wgmma_e4m3_rs(float (&d)[NC / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu_wgmma<__nv_bfloat16>(WgKind::e4m3_rs, d, NC, a, 0, b_desc, scale_d);
}
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu_wgmma<T>(WgKind::b16_rs, d, N, a, 0, b_desc, scale_d);
}
template <typename T, int N>
inline void wgmma_ss_tt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu_wgmma<T>(WgKind::b16_ss_tt, d, N, nullptr, a_desc, b_desc, scale_d);
}

}  // namespace flashgrad::cuda_attn_emulated::sm90
