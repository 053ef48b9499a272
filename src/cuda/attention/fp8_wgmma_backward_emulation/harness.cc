// CPU emulation of the FP8 wgmma backward (fp8_wgmma_backward_kernel.cuh, fp8_wgmma_backward_maps.h):
// runs the kernel's own source on host threads, one std::thread per CUDA thread, inside the whole
// FP8 backward as fp8_attention_host.cpp runs it (the mma.sync FP8 forward and pre-passes, also their
// own source, from the mma.sync emulation's rewritten headers; dq = scale dq_accum afterwards, or the
// deterministic dq kernel), and checks out, lse, dq, dk, dv against the recipe emulated in fp32 and
// the fp32 reference (tests/cpp/attention_fp8_recipe.h) by the GPU tests' rules (relative RMS bars,
// the 2x rule).
//
// Emulated beyond the mma.sync harness (fp8_emulation/harness.cc, whose thread model and PTX
// emulations this file copies) and the FP8 wgmma forward's (fp8_wgmma_emulation/harness.cc, whose
// map / mbarrier / TMA emulation it copies): wgmma e4m3 (both operands K-major through descriptors,
// Hopper's reduced-precision accumulation modelled; exact with FP8_EMULATION_EXACT_ACCUMULATOR=1),
// 16-bit wgmma with A from registers (the m16n8k16 A layout per warp) or from an MN-major descriptor
// and B MN-major (8-row k groups SBO apart, 64-element panels of the MN dim LBO apart: the bf16
// wgmma kernels' convention, which the H200 runs), named barriers, bulk reduce-adds (at issue).
// wgmma runs at issue, so a missing wait, races and speed are not checked; an mbarrier that gets
// more arrivals than its count, or a wait that does not finish in 20 s, is reported. Build and run
// with run.sh.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/host_dtype.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#define __grid_constant__

// ---- the emulated CUDA thread model ---------------------------------------------------------------
struct EmuDim {
  unsigned x = 0, y = 0, z = 0;
};
thread_local EmuDim emu_tid, emu_bid;
EmuDim emu_block_dim;
#define threadIdx emu_tid
#define blockIdx emu_bid
#define blockDim emu_block_dim

namespace flashgrad::cuda_attn_emulated::fp8 {
alignas(128) unsigned char smem_raw[232448];
}
using flashgrad::cuda_attn_emulated::fp8::smem_raw;
// The wgmma kernel's dynamic shared memory (its namespace's smem_raw).
constexpr int kSmemW = 232448 + 1024;
namespace flashgrad::cuda_attn_emulated::fp8wb {
alignas(1024) unsigned char smem_raw[kSmemW];
}
unsigned char* const smem_w = flashgrad::cuda_attn_emulated::fp8wb::smem_raw;

constexpr int kMaxWarps = 12;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[kMaxWarps];
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
std::barrier<>* g_wg_bar[3];
inline float __shfl_xor_sync(unsigned, float x, int o) {
  WarpBuf& w = g_warp[emu_warp()];
  w.f[emu_lane()] = x;
  emu_syncwarp();
  const float y = w.f[emu_lane() ^ o];
  emu_syncwarp();
  return y;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
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

// ---- the emulated PTX -----------------------------------------------------------------------------
// Shared addresses: offsets into whichever of the two arrays holds p.
inline uint64_t emu_shared_offset(const void* p) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c >= smem_w && c < smem_w + kSmemW) return static_cast<uint64_t>(c - smem_w);
  return static_cast<uint64_t>(c - smem_raw);
}
inline float emu_exp2(float x) { return std::exp2(x); }
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
template <typename T>
float half_of(uint32_t r, int hi) {
  const uint16_t h = hi ? (r >> 16) : (r & 0xffff);
  T x;
  std::memcpy(&x, &h, 2);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}
// mma.m16n8k16 (16-bit in, fp32 accumulate), fragments as in tile_primitives.cuh.
template <typename T>
void emu_mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpBuf& w = g_warp[emu_warp()];
  const int l = emu_lane();
  std::memcpy(w.u[l], a, 16);
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  emu_syncwarp();
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

#include "fp8_fragments.cuh"

// Whether emu_mma_e4m3 models the reduced-precision accumulation of the e4m3 tensor cores
// (FP8_EMULATION_EXACT_ACCUMULATOR=1 turns it off: exact products summed in float).
bool g_hopper_accumulator = true;

// mma.m16n8k32 e4m3 -> f32, fragments by fp8_fragments.cuh's ownership rules (checked against the
// PTX ISA's tables by the CPU test AttentionFp8Fragments).
void emu_mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  namespace f8 = flashgrad::cuda_attn_emulated::fp8;
  WarpBuf& w = g_warp[emu_warp()];
  const int l = emu_lane();
  std::memcpy(w.u[l], a, 16);
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  emu_syncwarp();
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
    // Hopper's e4m3 accumulation as measured by DeepSeek-V3 (products aligned to the largest
    // one's exponent and cut to 14 bits) and SageAttention2 (the accumulator input keeps 13
    // mantissa bits, the low 10 dropped). Products of e4m3 values are exact in double.
    double prod[32], big = 0;
    for (int k = 0; k < 32; ++k) {
      prod[k] = double(A[row][k]) * B[k][col];
      big = std::max(big, std::fabs(prod[k]));
    }
    double sum = 0;
    if (big > 0) {
      const double unit = std::ldexp(1.0, std::ilogb(big) - 13);
      for (int k = 0; k < 32; ++k) sum += std::trunc(prod[k] / unit) * unit;
    }
    uint32_t bits;
    std::memcpy(&bits, &c[e], 4);
    bits &= ~0x3ffu;
    float cin;
    std::memcpy(&cin, &bits, 4);
    c[e] = static_cast<float>(double(cin) + sum);
  }
  emu_syncwarp();
}

namespace flashgrad::cuda_attn_emulated::fp8 {
inline uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  return uint32_t{host::float_to_e4m3(x0)} | uint32_t{host::float_to_e4m3(x1)} << 8 |
         uint32_t{host::float_to_e4m3(x2)} << 16 | uint32_t{host::float_to_e4m3(x3)} << 24;
}
}  // namespace flashgrad::cuda_attn_emulated::fp8

// ---- tensor maps: what the map code asked for, kept inside the CUtensorMap -------------------------
struct EmuMap {
  const uint8_t* base;
  int rank;
  int swizzle;  // bytes of the swizzle span: 128, 64, 32, or 0
  int elem;     // bytes per element: 1 (UINT8: the operand maps) or 4 (FLOAT32: the dQ accumulator)
  int64_t dims[5];
  int64_t strides[5];  // bytes; strides[0] = elem
  uint32_t box[5];
};
static_assert(sizeof(EmuMap) <= sizeof(CUtensorMap), "the emulated map must fit in a CUtensorMap");

int g_maps_refused = 0;

// The checks cuTensorMapEncodeTiled makes that matter here, then the map recorded.
CUresult emu_encode(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base, const cuuint64_t* dims,
                    const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* elem_strides,
                    CUtensorMapInterleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion,
                    CUtensorMapFloatOOBfill) {
  EmuMap m{};
  const int span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                   : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                   : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32
                                                          : 0;
  const int elem = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 1;
  bool ok = (type == CU_TENSOR_MAP_DATA_TYPE_UINT8 || type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32) && rank >= 1 &&
            rank <= 5 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0 &&
            (span == 0 || box[0] * elem <= static_cast<cuuint32_t>(span));
  for (cuuint32_t i = 0; ok && i < rank; ++i) {
    ok = dims[i] >= 1 && dims[i] < (cuuint64_t{1} << 32) && box[i] >= 1 && box[i] <= 256 && elem_strides[i] == 1;
    if (i + 1 < rank) ok = ok && strides[i] % 16 == 0 && strides[i] < (cuuint64_t{1} << 40);
  }
  if (!ok) {
    ++g_maps_refused;
    return CUDA_ERROR_INVALID_VALUE;
  }
  m.base = static_cast<const uint8_t*>(base);
  m.rank = static_cast<int>(rank);
  m.swizzle = span;
  m.elem = elem;
  m.strides[0] = elem;
  for (int i = 0; i < m.rank; ++i) {
    m.dims[i] = static_cast<int64_t>(dims[i]);
    m.box[i] = box[i];
    if (i > 0) m.strides[i] = static_cast<int64_t>(strides[i - 1]);
  }
  std::memset(map, 0, sizeof(CUtensorMap));
  std::memcpy(map, &m, sizeof(m));
  return CUDA_SUCCESS;
}

// Shared-memory address swizzle of a span (address bits 4.. XOR bits 7..), as TMA writes and wgmma
// reads.
inline uint32_t swizzle_address(uint32_t a, int span) {
  switch (span) {
    case 128: return a ^ (((a >> 7) & 7u) << 4);
    case 64: return a ^ (((a >> 7) & 3u) << 4);
    case 32: return a ^ (((a >> 7) & 1u) << 4);
    default: return a;
  }
}

// ---- mbarriers and named barriers ------------------------------------------------------------------
struct EmuMbar {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  unsigned phase = 0;
};
std::mutex g_mu;
std::condition_variable g_cv;
std::map<uint32_t, EmuMbar> g_mbars;
struct EmuNamedBar {
  int count = 0;
  unsigned gen = 0;
};
EmuNamedBar g_named[16];
std::atomic<bool> g_deadlock{false};

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

// ---- wgmma -----------------------------------------------------------------------------------------
bool g_hopper_accumulator_w = true;

struct WgStage {
  float c[128][128];
  uint32_t a[128][4];
  double A[64][32], B[256][32], C[64][256];
} g_wg[3];

[[noreturn]] inline void emu_fail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}

// Address of byte kb of row `row` of a K-major operand (rows in groups of 8 SBO apart, rows of the
// swizzle span: 128 bytes for layout type 1, 64 for type 2), swizzled.
uint32_t kmajor_address(uint64_t desc, int row, int kb) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  const int layout = static_cast<int>(desc >> 62);
  if (layout != 1 && layout != 2) emu_fail("K-major wgmma descriptor without the 128- or 64-byte swizzle");
  const uint32_t span = layout == 1 ? 128 : 64;
  const uint32_t a = swizzle_address(start + static_cast<uint32_t>(row / 8) * sbo + static_cast<uint32_t>(row % 8) * span + kb,
                                     static_cast<int>(span));
  if (a + 1 >= static_cast<uint32_t>(kSmemW)) emu_fail("wgmma operand outside shared memory");
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
  if (a + 2 > static_cast<uint32_t>(kSmemW)) emu_fail("wgmma operand outside shared memory");
  return a;
}
template <typename T>
double half_value(uint16_t h) {
  T x;
  std::memcpy(&x, &h, 2);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}
uint16_t smem16(uint32_t a) {
  uint16_t h;
  std::memcpy(&h, smem_w + a, 2);
  return h;
}

enum class WgKind { e4m3_ss, b16_rs, b16_ss_tt };

// D[64 x N] (=|+=) A[64 x K] B[K x N] for the calling thread's warpgroup: every thread deposits its
// accumulators (and A registers), one thread computes, every thread takes its part back.
template <typename T>
void emu_wgmma(WgKind kind, float* d, int n, const uint32_t* a_regs, uint64_t a_desc, uint64_t b_desc, int scale_d) {
  const int wg = emu_tid.x / 128, t = emu_tid.x % 128;
  WgStage& st = g_wg[wg];
  std::memcpy(st.c[t], d, sizeof(float) * n / 2);
  if (a_regs != nullptr) std::memcpy(st.a[t], a_regs, 16);
  g_wg_bar[wg]->arrive_and_wait();
  if (t == 0) {
    const int K = kind == WgKind::e4m3_ss ? 32 : 16;
    auto& A = st.A;
    auto& B = st.B;
    auto& C = st.C;
    if (kind == WgKind::e4m3_ss) {
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 32; ++k) A[m][k] = flashgrad::host::e4m3_to_float(smem_w[kmajor_address(a_desc, m, k)]);
      for (int nn = 0; nn < n; ++nn)
        for (int k = 0; k < 32; ++k) B[nn][k] = flashgrad::host::e4m3_to_float(smem_w[kmajor_address(b_desc, nn, k)]);
    } else {
      if (kind == WgKind::b16_rs) {
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
        double prod[32], big = 0, sum = 0;
        for (int k = 0; k < K; ++k) {
          prod[k] = A[m][k] * B[nn][k];
          big = std::max(big, std::fabs(prod[k]));
        }
        float cin = scale_d ? static_cast<float>(C[m][nn]) : 0.f;
        if (kind == WgKind::e4m3_ss && g_hopper_accumulator_w) {
          // Hopper's e4m3 accumulation (the FP8 emulations' model): products aligned to the largest
          // one's exponent and cut to 14 bits; the accumulator input keeps 13 mantissa bits.
          if (big > 0) {
            const double unit = std::ldexp(1.0, std::ilogb(big) - 13);
            for (int k = 0; k < K; ++k) sum += std::trunc(prod[k] / unit) * unit;
          }
          uint32_t bits;
          std::memcpy(&bits, &cin, 4);
          bits &= ~0x3ffu;
          std::memcpy(&cin, &bits, 4);
        } else {
          for (int k = 0; k < K; ++k) sum += prod[k];
        }
        C[m][nn] = static_cast<float>(double(cin) + sum);
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

// The functions of wgmma_primitives.cuh and fp8_wgmma_primitives.cuh (prepare_headers.py empties
// both headers), same names and signatures.
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

// A TMA tile load: the box at coordinates c of the map into shared memory at dst (each byte at its
// swizzled address), zeros outside the tensor; then the box's bytes complete on the mbarrier.
inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  EmuMap m;
  std::memcpy(&m, map, sizeof(m));
  if (m.rank != 4 || m.elem != 1) emu_fail("TMA load with a map of another rank or element size");
  int64_t volume = 1;
  for (int i = 0; i < 4; ++i) volume *= m.box[i];
  if ((dst % 1024) != 0 && m.swizzle == 128) emu_fail("TMA SWIZZLE_128B destination not 1024-byte aligned");
  for (int64_t l = 0; l < volume; ++l) {
    int64_t rem = l, off = 0;
    bool inside = true;
    for (int i = 0; i < 4; ++i) {
      const int64_t idx = c[i] + rem % m.box[i];
      rem /= m.box[i];
      inside = inside && idx >= 0 && idx < m.dims[i];
      off += idx * m.strides[i];
    }
    const uint32_t a = swizzle_address(dst + static_cast<uint32_t>(l), m.swizzle);
    if (a >= static_cast<uint32_t>(kSmemW)) emu_fail("TMA destination outside shared memory");
    smem_w[a] = inside ? m.base[off] : 0;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  b.tx -= volume;
  mbar_complete_if_done(b);
}
inline void tma_prefetch_map(const CUtensorMap*) {}
inline void fence_proxy_async_shared() {}

// global box at (c0, c1, c2) of a 3-D fp32 map += the box in shared memory at src (element l of the
// box, in box order, at the swizzled address of src + 4 l), element-wise atomically (done at
// issue); elements outside the map's extent are skipped, as TMA does.
inline void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  EmuMap m;
  std::memcpy(&m, map, sizeof(m));
  if (m.rank != 3 || m.elem != 4) emu_fail("TMA reduce-add with a map that is not 3-D fp32");
  if ((src % 1024) != 0 && m.swizzle == 128) emu_fail("TMA SWIZZLE_128B source not 1024-byte aligned");
  const int64_t volume = int64_t{m.box[0]} * m.box[1] * m.box[2];
  for (int64_t l = 0; l < volume; ++l) {
    int64_t rem = l, off = 0;
    bool inside = true;
    for (int i = 0; i < 3; ++i) {
      const int64_t idx = c[i] + rem % m.box[i];
      rem /= m.box[i];
      inside = inside && idx >= 0 && idx < m.dims[i];
      off += idx * m.strides[i];
    }
    const uint32_t a = swizzle_address(src + static_cast<uint32_t>(4 * l), m.swizzle);
    if (a + 4 > static_cast<uint32_t>(kSmemW)) emu_fail("TMA reduce source outside shared memory");
    if (!inside) continue;
    float x;
    std::memcpy(&x, smem_w + a, 4);
    std::atomic_ref<float>(*reinterpret_cast<float*>(const_cast<uint8_t*>(m.base) + off)).fetch_add(x);
  }
}
inline void st_shared_v2_f32(uint32_t addr, float x, float y) {
  if (addr % 8 != 0 || addr + 8 > static_cast<uint32_t>(kSmemW)) emu_fail("st.shared.v2.f32 misaligned or outside");
  std::memcpy(smem_w + addr, &x, 4);
  std::memcpy(smem_w + addr + 4, &y, 4);
}
inline void bulk_commit() {}
inline void bulk_wait_read_all() {}
inline void bulk_wait_all() {}

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

template <int N>
inline void regs_decrease() {}
template <int N>
inline void regs_increase() {}

inline uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (uint64_t{1} << 62);
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
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu_wgmma<T>(WgKind::b16_rs, d, N, a, 0, b_desc, scale_d);
}
template <typename T, int N>
inline void wgmma_ss_tt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu_wgmma<T>(WgKind::b16_ss_tt, d, N, nullptr, a_desc, b_desc, scale_d);
}

}  // namespace flashgrad::cuda_attn_emulated::sm90

#include "fp8_backward_kernel.cuh"
#include "fp8_wgmma_backward_kernel.cuh"
#include "fp8_wgmma_backward_maps.h"
#include "fp8_dq_kernel.cuh"
#include "fp8_forward_kernel.cuh"
#include "fp8_prepass_kernels.cuh"

// ---- launching --------------------------------------------------------------------------------------
// Runs body() as every thread of every block of the grid, blocks one after another, shared memory
// poisoned with 0xff (NaN in every float format) before each block.
void launch(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& body) {
  emu_block_dim = {threads, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::memset(smem_raw, 0xff, sizeof(smem_raw));
      std::memset(smem_w, 0xff, kSmemW);
      g_mbars.clear();
      for (auto& nb : g_named) nb = EmuNamedBar{};
      std::barrier<> block(threads);
      std::vector<std::unique_ptr<std::barrier<>>> warps, wgs;
      for (unsigned w = 0; w < threads / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        g_warp_bar[w] = warps.back().get();
      }
      for (unsigned w = 0; w < (threads + 127) / 128 && w < 3; ++w) {
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
          if (t / 128 < 3) g_wg_bar[t / 128]->arrive_and_drop();
          block.arrive_and_drop();
        });
      for (auto& t : th) t.join();
    }
}

#include "attention_fp8_recipe.h"

namespace {

using namespace flashgrad;
using namespace flashgrad::cuda_attn_emulated;
using flashgrad::fp8_test::Fp8Case;
using flashgrad::fp8_test::Fp8Config;
using flashgrad::fp8_test::Fp8Outputs;

std::vector<uint16_t> encode16(DType dt, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = dt == DType::f16 ? host::float_to_f16(x[i]) : host::float_to_bf16(x[i]);
  return h;
}
std::vector<float> decode16(DType dt, const std::vector<uint16_t>& x) {
  std::vector<float> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = dt == DType::f16 ? host::f16_to_float(x[i]) : host::bf16_to_float(x[i]);
  return h;
}

// Row-major strides of [B, S, H, D] / [T, H, D] contiguous tensors.
RowMajorStrides strides(const Fp8Case& c, bool is_q, int heads) {
  RowMajorStrides s;
  const int64_t rows = int64_t{heads} * c.cfg.d;
  s.row = rows;
  s.head = c.cfg.d;
  s.batch = c.varlen ? 0 : (is_q ? c.cfg.sq : c.cfg.sk) * rows;
  return s;
}

template <int D, bool kLag>
Fp8Outputs run_emulated(Fp8Case& c) {
  const Fp8Config& cfg = c.cfg;
  const DType odt = cfg.out_dtype;
  const bool bf16 = odt == DType::bf16;
  Fp8KernelParams f;
  AttentionKernelParams& p = f.base;
  p.q = c.q8.data();
  p.k = c.k8.data();
  p.v = c.v8.data();
  p.q_st = p.out_st = p.dout_st = p.dq_st = strides(c, true, cfg.hq);
  p.k_st = p.v_st = p.dk_st = p.dv_st = strides(c, false, cfg.hk);
  if (c.varlen) {
    p.cu_seqlens_q = c.cu_q.data();
    p.cu_seqlens_k = c.cu_k.data();
  }
  p.num_seqs = c.n;
  p.seqlen_q = c.max_q;
  p.seqlen_k = c.max_k;
  p.total_q = c.tq;
  p.heads_q = cfg.hq;
  p.heads_k = cfg.hk;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  switch (cfg.mask) {
    case MaskKind::none: p.mask = kMaskNone; break;
    case MaskKind::causal: p.mask = kMaskCausal; break;
    case MaskKind::sliding_window: p.mask = kMaskWindow; break;
    case MaskKind::prefix_lm: p.mask = kMaskPrefix; break;
    case MaskKind::candidate_isolation: p.mask = kMaskCandidate; break;
  }
  if (cfg.mask == MaskKind::prefix_lm) p.prefix_lengths = cfg.prefix.data();
  if (cfg.mask == MaskKind::candidate_isolation) p.candidate_bounds = cfg.bounds.data();
  if (cfg.mask == MaskKind::sliding_window) {
    p.window_left = cfg.wl;
    p.window_right = cfg.wr;
  }
  if (cfg.softcap > 0.f) {
    p.softcap = cfg.softcap;
    p.softcap_method = cfg.method == SoftcapMethod::tanh ? kSoftcapTanh : kSoftcapSoftSign;
  }
  if (c.varlen) {
    p.lse_head_stride = c.tq;
    p.lse_row_stride = 1;
  } else {
    p.lse_batch_stride = int64_t{cfg.hq} * cfg.sq;
    p.lse_head_stride = cfg.sq;
    p.lse_row_stride = 1;
  }
  f.out_bf16 = bf16;
  f.descale_q = c.dsq.data();
  f.descale_k = c.dsk.data();
  f.descale_v = c.dsv.data();
  f.dq_st_n = f.dk_st_n = f.dv_st_n = cfg.hk;
  f.dq_st_h = f.dk_st_h = f.dv_st_h = 1;
  f.vt_cols = fp8::vt_columns(c.varlen, c.n, c.max_k, c.tk);
  std::vector<uint8_t> vt(static_cast<size_t>(cfg.hk) * D * f.vt_cols, 0xff);  // poisoned
  f.vt = vt.data();
  std::vector<uint16_t> out(c.q8.size(), 0xffff), dq(c.q8.size(), 0xffff), dk(c.k8.size(), 0xffff),
      dv(c.v8.size(), 0xffff);
  std::vector<float> lse(c.lse_count(), NAN);
  p.out = out.data();
  p.lse = lse.data();

  // Forward: transpose, then the forward kernel.
  const int key_blocks = (c.max_k + fp8::kTransposeKeys - 1) / fp8::kTransposeKeys;
  launch(c.n * key_blocks, cfg.hk, 256, [&] { fp8::transpose_v_kernel<D>(f, key_blocks); });
  using FCfg = fp8::Fp8ForwardConfig<D>;
  const int mblocks = (c.max_q + FCfg::kBlockM - 1) / FCfg::kBlockM;
  launch(c.n * mblocks, cfg.hq, FCfg::kThreads, [&] { fp8::fp8_attention_forward_kernel<D>(f, mblocks); });

  // Backward.
  std::vector<uint16_t> dout = encode16(odt, c.dout);
  p.dout = dout.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  if (cfg.with_dlse) {
    p.dlse = c.dlse.data();
    p.dlse_batch_stride = p.lse_batch_stride;
    p.dlse_head_stride = p.lse_head_stride;
    p.dlse_row_stride = p.lse_row_stride;
  }
  p.z_loss_weight = cfg.z_loss;
  p.deterministic = cfg.deterministic;
  std::vector<float> lse_log2(int64_t{cfg.hq} * c.tq, NAN), shift(lse_log2.size(), NAN),
      dq_accum(c.q8.size(), 0.f), amax(int64_t{c.n} * cfg.hq, 0.f);
  std::vector<uint8_t> dout8(c.q8.size(), 0xff);
  std::vector<uint16_t> q16(c.q8.size(), 0xffff), k16(c.k8.size(), 0xffff);
  p.lse_log2 = lse_log2.data();
  p.delta_shift = shift.data();
  p.dq_accum = dq_accum.data();
  f.dout_amax = amax.data();
  f.dout8 = dout8.data();
  f.q16 = q16.data();
  f.k16 = k16.data();
  f.total_k = c.tk;
  const unsigned q_blocks = static_cast<unsigned>((c.tq * cfg.hq * 32 + 255) / 256);
  const unsigned k_blocks = static_cast<unsigned>((c.tk * cfg.hk * 32 + 255) / 256);
  if (bf16) {
    launch(q_blocks, 1, 256, [&] { fp8::fp8_prepass_rows_kernel<__nv_bfloat16>(f, D); });
    launch(q_blocks, 1, 256, [&] { fp8::fp8_quantize_dout_kernel<__nv_bfloat16>(f, D); });
    launch(k_blocks, 1, 256, [&] { fp8::fp8_widen_k_kernel<__nv_bfloat16>(f, c.tk, D); });
  } else {
    launch(q_blocks, 1, 256, [&] { fp8::fp8_prepass_rows_kernel<__half>(f, D); });
    launch(q_blocks, 1, 256, [&] { fp8::fp8_quantize_dout_kernel<__half>(f, D); });
    launch(k_blocks, 1, 256, [&] { fp8::fp8_widen_k_kernel<__half>(f, c.tk, D); });
  }
  // The main pass: the wgmma kernel with the maps its launcher builds (fp8_wgmma_backward.cu).
  using WCfg = fp8wb::Fp8WgmmaBackwardConfig<D, kLag>;
  const int nblocks = (c.max_k + WCfg::kBlockN - 1) / WCfg::kBlockN;
  fp8wb::Fp8WgmmaBackwardMaps maps;
  fp8wb::Fp8WgmmaBackwardAxes axes;
  const fp8wb::MapSet set{&maps.q8, &maps.k8, &maps.v8, &maps.do8, &maps.q16, &maps.do16, &maps.k16,
                          &axes.q8, &axes.k8, &axes.v8, &axes.do8, &axes.q16, &axes.do16, &axes.k16,
                          &maps.dq};
  const int64_t batches = c.varlen ? 1 : c.n;
  const int64_t rows_q = c.varlen ? c.tq : c.max_q, rows_k = c.varlen ? c.tk : c.max_k;
  if (!fp8wb::make_backward_maps(emu_encode, f, rows_q, rows_k, batches, D, WCfg::kBlockM, WCfg::kBlockN, set)) {
    std::printf("    the map code refused a view (%d refusals)\n", g_maps_refused);
    std::exit(2);
  }
  if (bf16)
    launch(c.n * nblocks, cfg.hk, WCfg::kThreads,
           [&] { fp8wb::fp8_attention_backward_wgmma_kernel<__nv_bfloat16, D, kLag>(maps, f, axes, nblocks); });
  else
    launch(c.n * nblocks, cfg.hk, WCfg::kThreads,
           [&] { fp8wb::fp8_attention_backward_wgmma_kernel<__half, D, kLag>(maps, f, axes, nblocks); });
  Fp8Outputs r;
  r.out = decode16(odt, out);
  r.lse = lse;
  if (cfg.deterministic) {
    using QCfg = fp8::Fp8DqConfig<D>;
    const int qblocks = (c.max_q + QCfg::kBlockM - 1) / QCfg::kBlockM;
    if (bf16)
      launch(c.n * qblocks, cfg.hq, QCfg::kThreads, [&] { fp8::fp8_attention_dq_kernel<__nv_bfloat16, D>(f, qblocks); });
    else
      launch(c.n * qblocks, cfg.hq, QCfg::kThreads, [&] { fp8::fp8_attention_dq_kernel<__half, D>(f, qblocks); });
    r.dq = decode16(odt, dq);
  } else {  // dq = scale * dq_accum, rounded (what launch_dq_convert does)
    r.dq.resize(dq_accum.size());
    for (size_t i = 0; i < dq_accum.size(); ++i) r.dq[i] = fp8_test::round_out(odt, dq_accum[i] * p.scale);
  }
  r.dk = decode16(odt, dk);
  r.dv = decode16(odt, dv);
  return r;
}

int failures = 0;

void check_output(const char* what, const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<float>& emu, DType rounding, double r, double rms_bar,
                  double emu_score_terms = 0) {
  const double err = fp8_test::max_diff(got, ref), base = fp8_test::max_diff(emu, ref);
  const double atol = rounding == DType::f32
                            ? fp8_test::lse_atol(ref) + fp8_test::score_accumulator_atol(emu_score_terms)
                            : fp8_test::rounding_atol(ref, rounding);
  const double rms = fp8_test::rel_rms(got, ref), rms_emu = fp8_test::rel_rms(emu, ref);
  const bool ok = err <= r * base + atol && !std::isnan(rms) && (rms_bar <= 0 || rms <= rms_bar);
  failures += !ok;
  std::printf("    %-4s rel RMS kernels %.4f recipe %.4f | max|kernels-ref| %.3e max|recipe-ref| %.3e atol %.1e %s\n",
              what, rms, rms_emu, err, base, atol, ok ? "ok" : "FAIL");
}

void check_case(Fp8Config cfg, std::mt19937& rng) {
  Fp8Case c = fp8_test::make_case(cfg, rng);
  const Fp8Outputs ref = fp8_test::reference32(c);
  const Fp8Outputs emu = fp8_test::recipe(c);
  // The kernel's head dims; a case named "... (lagged dQ)" runs the lagged-dQ schedule (hd 128).
  const bool lag = cfg.name.find("(lagged dQ)") != std::string::npos;
  const Fp8Outputs got = cfg.d == 256 ? run_emulated<256, false>(c)
                         : cfg.d == 64 ? run_emulated<64, false>(c)
                         : lag        ? run_emulated<128, true>(c)
                                      : run_emulated<128, false>(c);
  const double r = cfg.softcap > 0.f ? 3.0 : 2.0;
  std::printf("  case %s\n", cfg.name.c_str());
  check_output("out", got.out, ref.out, emu.out, cfg.out_dtype, r, 0.03);
  check_output("lse", got.lse, ref.lse, emu.lse, DType::f32, r, 0, emu.score_terms_max);
  check_output("dq", got.dq, ref.dq, emu.dq, cfg.out_dtype, r, 0.08);
  check_output("dk", got.dk, ref.dk, emu.dk, cfg.out_dtype, r, 0.08);
  check_output("dv", got.dv, ref.dv, emu.dv, cfg.out_dtype, r, 0.08);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (const char* e = std::getenv("FP8_EMULATION_EXACT_ACCUMULATOR")) g_hopper_accumulator = g_hopper_accumulator_w = std::string(e) != "1";
  std::printf("e4m3 mma accumulator: %s\n", g_hopper_accumulator ? "Hopper model (14-bit aligned products, 13-bit C)" : "exact");
  // FLASHGRAD_EMULATION_SEED=<n> repeats a run's inputs (to compare two builds line by line).
  const char* seed_env = std::getenv("FLASHGRAD_EMULATION_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::printf("inputs: seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<Fp8Config> cases;
  // "quick": one full-tile and one masked varlen GQA case.
  const std::vector<std::string> quick = {"none d128 Sq=70 Sk=130", "varlen causal d128 gqa 4/2 with empty sequences",
                                          "none d256 B2 gqa 4/2 Sq=150 Sk=140",
                                          "causal d128 B2 mqa 3/1 Sq=Sk=200 (lagged dQ)",
                                          "causal d64 B2 gqa 4/2 Sq=150 Sk=200"};
  auto add = [&](std::string name, Fp8Config c) {
    c.name = std::move(name);
    const bool pick = only == "quick" ? std::find(quick.begin(), quick.end(), c.name) != quick.end()
                                      : only.empty() || c.name.find(only) != std::string::npos;
    if (pick) cases.push_back(c);
  };
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    Fp8Config c;
    c.d = 128;
    c.mask = m;
    c.batch = 1;
    c.sq = 70;
    c.sk = 130;
    add(std::string(mask_name(m)) + " d128 Sq=70 Sk=130", c);
  }
  {
    // Eight tiles per key block: the two-slot ring wraps several times (phases), GQA heads summed.
    Fp8Config c;
    c.d = 128;
    c.batch = 2;
    c.hq = 4;
    c.hk = 2;
    c.sq = c.sk = 200;
    c.mask = MaskKind::none;
    add("none d128 B2 gqa 4/2 Sq=Sk=200", c);
    c.mask = MaskKind::causal;
    c.hq = 3;
    c.hk = 1;
    add("causal d128 B2 mqa 3/1 Sq=Sk=200", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.lens_q = {37, 0, 80, 5};
    c.lens_k = {53, 0, 80, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    add("varlen causal d128 gqa 4/2 with empty sequences", c);
    c.deterministic = true;
    c.softcap = 5.f;
    add("deterministic varlen causal d128 softcap", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.lens_q = {150, 70};
    c.lens_k = {150, 270};
    c.mask = MaskKind::sliding_window;
    c.wl = 20;
    c.wr = 3;
    add("varlen window 20,3 d128", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 1;
    c.sq = 90;
    c.sk = 60;
    c.mask = MaskKind::causal;
    c.softcap = 5.f;
    c.input_std = 2.f;
    c.with_dlse = true;
    c.z_loss = 0.5f;
    c.out_dtype = DType::f16;
    add("causal Sq>Sk softcap tanh dlse z-loss fp16 out d128", c);
    c.method = SoftcapMethod::soft_sign;
    c.out_dtype = DType::bf16;
    add("causal Sq>Sk softcap soft_sign dlse z-loss d128", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 3;
    c.sq = c.sk = 100;
    c.mask = MaskKind::prefix_lm;
    c.prefix = {0, 40, 100};
    add("prefix_lm d128", c);
    c.mask = MaskKind::candidate_isolation;
    c.prefix.clear();
    c.bounds = {0, 60, 60, 100, 10, 40, 70, 95, 0, 0, 0, 100};
    add("candidate_isolation d128", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 1;
    c.hq = c.hk = 1;
    c.sq = 40;
    c.sk = 1000;
    add("none d128 H1 Sq=40 Sk=1000", c);
  }
  // D = 64 (FLASHGRAD_ATTN_FP8_WGMMA_BWD_HD64=1): 64-byte e4m3 rows with SWIZZLE_64B.
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    Fp8Config c;
    c.d = 64;
    c.mask = m;
    c.batch = 2;
    c.hq = 4;
    c.hk = 2;
    c.sq = 150;
    c.sk = 200;
    add(std::string(mask_name(m)) + " d64 B2 gqa 4/2 Sq=150 Sk=200", c);
  }
  {
    Fp8Config c;
    c.d = 64;
    c.lens_q = {37, 0, 80, 5};
    c.lens_k = {53, 0, 80, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    c.softcap = 5.f;
    c.with_dlse = true;
    c.z_loss = 0.5f;
    c.out_dtype = DType::f16;
    add("varlen causal d64 gqa 4/2 softcap dlse z-loss fp16 out", c);
    c.deterministic = true;
    c.out_dtype = DType::bf16;
    add("deterministic varlen causal d64 softcap", c);
  }
  // The lagged-dQ schedule (FLASHGRAD_ATTN_FP8_WGMMA_BWD_LAG=1).
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 2;
    c.hq = 4;
    c.hk = 2;
    c.sq = c.sk = 200;
    add("none d128 B2 gqa 4/2 Sq=Sk=200 (lagged dQ)", c);
    c.mask = MaskKind::causal;
    c.hq = 3;
    c.hk = 1;
    add("causal d128 B2 mqa 3/1 Sq=Sk=200 (lagged dQ)", c);
    Fp8Config v;
    v.d = 128;
    v.lens_q = {37, 0, 80, 5};
    v.lens_k = {53, 0, 80, 0};
    v.hq = 4;
    v.hk = 2;
    v.mask = MaskKind::causal;
    v.softcap = 5.f;
    v.with_dlse = true;
    v.z_loss = 0.5f;
    v.out_dtype = DType::f16;
    add("varlen causal d128 gqa 4/2 softcap dlse z-loss fp16 out (lagged dQ)", v);
    v.deterministic = true;
    v.out_dtype = DType::bf16;
    add("deterministic varlen causal d128 softcap (lagged dQ)", v);
  }
  // D = 256: 64-key CTAs, the head dim split between the warpgroups, one 16-bit slot, dQ by atomics.
  for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
    Fp8Config c;
    c.d = 256;
    c.mask = m;
    c.batch = 2;
    c.hq = 4;
    c.hk = 2;
    c.sq = 150;
    c.sk = 140;
    add(std::string(mask_name(m)) + " d256 B2 gqa 4/2 Sq=150 Sk=140", c);
  }
  {
    Fp8Config c;
    c.d = 256;
    c.lens_q = {37, 0, 80, 5};
    c.lens_k = {53, 0, 80, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    c.softcap = 5.f;
    c.with_dlse = true;
    c.z_loss = 0.5f;
    c.out_dtype = DType::f16;
    add("varlen causal d256 gqa 4/2 softcap dlse z-loss fp16 out", c);
    c.deterministic = true;
    c.out_dtype = DType::bf16;
    add("deterministic varlen causal d256 softcap", c);
  }
  for (auto& c : cases) check_case(c, rng);
  std::printf("%s: %d failed checks\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
