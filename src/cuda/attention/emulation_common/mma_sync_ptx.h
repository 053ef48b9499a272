// The PTX of the mma.sync kernels (the 16-bit headers and the FP8 mma.sync kernels), emulated on
// the host: cp.async, ldmatrix.x4 (.trans), mma.m16n8k16 (bf16 / f16) and mma.m16n8k32 e4m3, each
// warp-wide instruction through the warp's exchange buffer (thread_model.h). rewrite_asm.py
// (fp8_emulation/) replaces every asm statement of those headers by a call of one of these.
// Include after thread_model.h, before the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "core/host_dtype.h"
#include "cuda/attention/emulation_common/e4m3_accumulator.h"
#include "cuda/attention/emulation_common/scalar_ptx.h"
#include "cuda/attention/emulation_common/thread_model.h"
#include "fp8_fragments.cuh"  // the rewritten copy (namespace flashgrad::cuda_attn_emulated)

// The mma.sync kernels' dynamic shared memory (their namespace's smem_raw: the kernels declare it
// extern __shared__ at block scope), the opt-in maximum of an H100 / H200 block.
namespace flashgrad::cuda_attn_emulated::fp8 {
alignas(128) unsigned char smem_raw[232448];
}
using flashgrad::cuda_attn_emulated::fp8::smem_raw;

// cp.async: cp_size bytes at dst, the first src_size from src, the rest zeros (synchronous here;
// the kernels' waits and barriers are then no-ops / real barriers).
inline void emu_cp_async(uint32_t dst, const void* src, int src_size, int cp_size) {
  std::memset(smem_raw + dst, 0, cp_size);
  if (src_size > 0) std::memcpy(smem_raw + dst, src, src_size);
}
// ldmatrix.x4 (.trans): matrix i's 8 row addresses come from lanes 8i..8i+7. Without .trans lane l
// gets the 16-bit elements (row l / 4, cols 2 (l % 4), +1) of matrix i; with .trans, (rows
// 2 (l % 4), +1, col l / 4).
inline void emu_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  WarpBuf& w = g_warp[emu_warp()];
  const int l = emu_lane();
  w.addr[l] = addr;
  emu_syncwarp();
  for (int i = 0; i < 4; ++i) {
    uint16_t e[2];
    for (int h = 0; h < 2; ++h) {
      const int row = trans ? 2 * (l % 4) + h : l / 4;
      const int col = trans ? l / 4 : 2 * (l % 4) + h;
      std::memcpy(&e[h], smem_raw + w.addr[8 * i + row] + 2 * col, 2);
    }
    r[i] = uint32_t{e[0]} | (uint32_t{e[1]} << 16);
  }
  emu_syncwarp();
}
// The 16-bit value (bf16 or f16, T) in the low (hi = 0) or high half of a register.
template <typename T>
float half_of(uint32_t r, int hi) {
  return half_value<T>(static_cast<uint16_t>(hi ? (r >> 16) : (r & 0xffff)));
}
// An mma.sync's first step: every lane leaves its A and B registers in its warp's buffer, then
// waits for the others (the caller reads all lanes' operands, then calls emu_syncwarp()).
inline WarpBuf& deposit_mma_operands(const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpBuf& w = g_warp[emu_warp()];
  const int l = emu_lane();
  std::memcpy(w.u[l], a, 16);
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  emu_syncwarp();
  return w;
}
// mma.m16n8k16 (16-bit in, fp32 accumulate), fragments as in tile_primitives.cuh.
template <typename T>
void emu_mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const WarpBuf& w = deposit_mma_operands(a, b0, b1);
  const int l = emu_lane();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; ++L) {
    const int g = L >> 2, t = L & 3;
    for (int hi = 0; hi < 2; ++hi) {
      A[g][2 * t + hi] = half_of<T>(w.u[L][0], hi);
      A[g + 8][2 * t + hi] = half_of<T>(w.u[L][1], hi);
      A[g][2 * t + 8 + hi] = half_of<T>(w.u[L][2], hi);
      A[g + 8][2 * t + 8 + hi] = half_of<T>(w.u[L][3], hi);
      B[2 * t + hi][g] = half_of<T>(w.b[L][0], hi);
      B[2 * t + 8 + hi][g] = half_of<T>(w.b[L][1], hi);
    }
  }
  const int g = l >> 2, t = l & 3;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
    float s = 0;
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    c[e] += s;
  }
  emu_syncwarp();
}

// mma.m16n8k32 e4m3 -> f32, fragments by fp8_fragments.cuh's ownership rules (checked against the
// PTX ISA's tables by the CPU test AttentionFp8Fragments). Exact mode: the products summed in float.
void emu_mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  namespace f8 = flashgrad::cuda_attn_emulated::fp8;
  const WarpBuf& w = deposit_mma_operands(a, b0, b1);
  const int l = emu_lane();
  float A[16][32], B[32][8];
  for (int L = 0; L < 32; ++L)
    for (int x = 0; x < 4; ++x) {
      int row, col;
      for (int r = 0; r < 4; ++r) {
        f8::a_element(L, r, x, row, col);
        A[row][col] = flashgrad::host::e4m3_to_float(static_cast<uint8_t>(w.u[L][r] >> (8 * x)));
      }
      for (int r = 0; r < 2; ++r) {
        f8::b_element(L, r, x, row, col);
        B[row][col] = flashgrad::host::e4m3_to_float(static_cast<uint8_t>(w.b[L][r] >> (8 * x)));
      }
    }
  for (int e = 0; e < 4; ++e) {
    int row, col;
    f8::c_element(l, e, row, col);
    if (!g_hopper_accumulator) {
      float s = 0;
      for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
      c[e] += s;
      continue;
    }
    double prod[32];
    for (int k = 0; k < 32; ++k) prod[k] = double(A[row][k]) * B[k][col];
    c[e] = hopper_e4m3_accumulate(c[e], prod, 32);
  }
  emu_syncwarp();
}
