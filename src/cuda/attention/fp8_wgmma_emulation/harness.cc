// CPU emulation of the FP8 wgmma forward (fp8_wgmma_forward_kernel.cuh, fp8_wgmma_vt.cuh,
// fp8_wgmma_maps.h): runs their own source on host threads, one std::thread per CUDA thread, with
// the Hopper primitives (wgmma_primitives.cuh, fp8_wgmma_primitives.cuh) replaced by the emulations
// below, and checks out and lse against the FP8 recipe emulated in fp32 and the fp32 reference
// (tests/cpp/attention_fp8_recipe.h) by the GPU tests' rules (relative RMS bar, 2x rule).
//
// Emulated: mbarriers (arrival counts, transaction bytes, phases; a wait that does not finish in
// 20 s reports a deadlock), TMA tile loads (the tensor maps the kernel's own map code builds, zero
// fill out of bounds, the SWIZZLE_128B / 64B address swizzle), wgmma m64nNk32 e4m3 with operands
// from descriptors (canonical K-major layouts: 8-row groups SBO apart, the row pitch of the swizzle
// mode, the same address swizzle) or A from registers (the 8-bit fragment layout), with a model of
// Hopper's reduced-precision accumulation (FP8W_EMULATION_EXACT_ACCUMULATOR=1: exact), named
// barriers, warp shuffles. wgmma runs synchronously at issue, so a missing wait is not detected;
// races and speed are not either. What it checks: the pipeline's ring and phase bookkeeping, tile
// and key-block indexing, masks, sub-blocks, P packing against the V^T permutation, the two-level
// accumulation, descales, varlen / GQA, the epilogue, and the host's map dims / strides / boxes.
// The layouts follow the PTX ISA and CUTLASS's descriptors (as the kernel does); the GPU probes
// (tests/cpp/fp8_wgmma_probe_gpu_test.cu) check them on the hardware. Build and run with run.sh.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

constexpr int kSmemBytes = 232448 + 1024;
namespace flashgrad::cuda_attn_emulated::fp8w {
alignas(1024) unsigned char smem_raw[kSmemBytes];
}
using flashgrad::cuda_attn_emulated::fp8w::smem_raw;

constexpr int kMaxWarps = 12;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[kMaxWarps];
std::barrier<>* g_wg_bar[3];
struct WarpBuf {
  float f[32];
} g_warp[kMaxWarps];

inline int emu_warp() { return emu_tid.x / 32; }
inline int emu_lane() { return emu_tid.x % 32; }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void emu_syncwarp() { g_warp_bar[emu_warp()]->arrive_and_wait(); }
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
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
// Lane `src`'s x to every lane of the warp (the kernel broadcasts its warpgroup index).
inline int __shfl_sync(unsigned, int x, int src) {
  WarpBuf& w = g_warp[emu_warp()];
  w.f[emu_lane()] = __int_as_float(x);
  emu_syncwarp();
  const int y = __float_as_int(w.f[src]);
  emu_syncwarp();
  return y;
}

// ---- PTX of the 16-bit / mma.sync headers the kernel includes but this path never calls ------------
inline uint64_t emu_shared_offset(const void* p) {
  return static_cast<uint64_t>(static_cast<const unsigned char*>(p) - smem_raw);
}
inline float emu_exp2(float x) { return std::exp2(x); }
[[noreturn]] inline void emu_unexpected(const char* what) {
  std::fprintf(stderr, "emulation: unexpected call of %s\n", what);
  std::abort();
}
inline void emu_cp_async(uint32_t, const void*, int, int) { emu_unexpected("cp.async"); }
inline void emu_ldmatrix_x4(uint32_t (&)[4], uint32_t, bool) { emu_unexpected("ldmatrix"); }
template <typename T>
void emu_mma_16816(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) {
  emu_unexpected("mma.m16n8k16");
}
inline void emu_mma_e4m3(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) { emu_unexpected("mma.m16n8k32"); }

#include "fp8_fragments.cuh"

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
  int64_t dims[5];
  int64_t strides[5];  // bytes; strides[0] = 1 (one-byte elements)
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
  bool ok = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 && rank >= 1 && rank <= 5 &&
            reinterpret_cast<std::uintptr_t>(base) % 16 == 0 && (span == 0 || box[0] <= static_cast<cuuint32_t>(span));
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
  m.strides[0] = 1;
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
// reads (128 B: 3 bits, 64 B: 2, 32 B: 1).
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
int g_stagger = 0;  // Fp8wMapAxes::stagger of the next emulated launch (run_variant's bit 8)
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
bool g_hopper_accumulator = true;

// Per warpgroup: the threads' accumulators and A registers, and the computing thread's operands.
struct WgStage {
  float c[128][128];
  uint32_t a[128][4];
  float A[64][32], B[256][32], C[64][256];
} g_wg[3];

// Byte (row, kb) of a K-major operand through its descriptor: rows in groups of 8, SBO apart, row
// pitch = the swizzle span, then the address swizzle.
uint8_t desc_byte(uint64_t desc, int row, int kb) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  const int layout = static_cast<int>(desc >> 62);
  const int span = layout == 1 ? 128 : layout == 2 ? 64 : layout == 3 ? 32 : 0;
  if (span == 0) emu_unexpected("wgmma descriptor without swizzle");
  const uint32_t a = start + static_cast<uint32_t>(row / 8) * sbo + static_cast<uint32_t>(row % 8) * span + kb;
  const uint32_t p = swizzle_address(a, span);
  if (p >= static_cast<uint32_t>(kSmemBytes)) emu_unexpected("wgmma operand outside shared memory");
  return smem_raw[p];
}

// D[64 x N] (=|+=) A[64 x 32] B[N x 32]^T for the calling thread's warpgroup: every thread deposits
// its accumulators (and A registers), one thread computes, every thread takes its part back.
void emu_wgmma(float* d, int n, const uint32_t* a_regs, uint64_t a_desc, uint64_t b_desc, int scale_d) {
  namespace f8 = flashgrad::cuda_attn_emulated::fp8;
  const int wg = emu_tid.x / 128, t = emu_tid.x % 128;
  WgStage& st = g_wg[wg];
  std::memcpy(st.c[t], d, sizeof(float) * n / 2);
  if (a_regs != nullptr) std::memcpy(st.a[t], a_regs, 16);
  g_wg_bar[wg]->arrive_and_wait();
  if (t == 0) {
    auto& A = st.A;
    auto& B = st.B;
    auto& C = st.C;
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 32; ++k) {
        if (a_regs == nullptr) A[m][k] = flashgrad::host::e4m3_to_float(desc_byte(a_desc, m, k));
      }
    if (a_regs != nullptr)
      for (int th = 0; th < 128; ++th)
        for (int r = 0; r < 4; ++r)
          for (int b = 0; b < 4; ++b) {
            int row, col;
            f8::a_element(th % 32, r, b, row, col);
            A[16 * (th / 32) + row][col] = flashgrad::host::e4m3_to_float(static_cast<uint8_t>(st.a[th][r] >> (8 * b)));
          }
    for (int nn = 0; nn < n; ++nn)
      for (int k = 0; k < 32; ++k) B[nn][k] = flashgrad::host::e4m3_to_float(desc_byte(b_desc, nn, k));
    for (int th = 0; th < 128; ++th) {
      const int w = th / 32, g = (th % 32) / 4, tt = th % 4;
      for (int i = 0; i < n / 2; ++i)
        C[16 * w + g + 8 * ((i >> 1) & 1)][8 * (i >> 2) + 2 * tt + (i & 1)] = st.c[th][i];
    }
    for (int m = 0; m < 64; ++m)
      for (int nn = 0; nn < n; ++nn) {
        double prod[32], big = 0, sum = 0;
        for (int k = 0; k < 32; ++k) {
          prod[k] = double(A[m][k]) * B[nn][k];
          big = std::max(big, std::fabs(prod[k]));
        }
        float cin = scale_d ? C[m][nn] : 0.f;
        if (g_hopper_accumulator) {
          // Hopper's e4m3 accumulation as modelled by the mma.sync FP8 emulation: products aligned
          // to the largest one's exponent and cut to 14 bits; the accumulator input keeps 13
          // mantissa bits (the low 10 dropped).
          if (big > 0) {
            const double unit = std::ldexp(1.0, std::ilogb(big) - 13);
            for (int k = 0; k < 32; ++k) sum += std::trunc(prod[k] / unit) * unit;
          }
          uint32_t bits;
          std::memcpy(&bits, &cin, 4);
          bits &= ~0x3ffu;
          std::memcpy(&cin, &bits, 4);
        } else {
          for (int k = 0; k < 32; ++k) sum += prod[k];
        }
        C[m][nn] = static_cast<float>(double(cin) + sum);
      }
    for (int th = 0; th < 128; ++th) {
      const int w = th / 32, g = (th % 32) / 4, tt = th % 4;
      for (int i = 0; i < n / 2; ++i)
        st.c[th][i] = C[16 * w + g + 8 * ((i >> 1) & 1)][8 * (i >> 2) + 2 * tt + (i & 1)];
    }
  }
  g_wg_bar[wg]->arrive_and_wait();
  std::memcpy(d, st.c[t], sizeof(float) * n / 2);
  g_wg_bar[wg]->arrive_and_wait();
}

// The functions of wgmma_primitives.cuh and fp8_wgmma_primitives.cuh (run.sh replaces both headers
// by empty ones), same names and signatures.
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
  --b.pending;
  mbar_complete_if_done(b);
}
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  b.tx += bytes;
  --b.pending;
  mbar_complete_if_done(b);
}
// Returns once the phase of parity `parity` has completed, i.e. the current phase's parity differs.
inline void mbar_wait(uint32_t bar, uint32_t parity) {
  std::unique_lock<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  if (!g_cv.wait_for(lock, std::chrono::seconds(20), [&] { return (b.phase & 1u) != parity || g_deadlock; }) ||
      g_deadlock) {
    if (!g_deadlock.exchange(true))
      std::fprintf(stderr, "emulation: DEADLOCK: thread %u of block %u waits on mbarrier %u parity %u (phase %u, "
                   "pending %d, tx %lld)\n", emu_tid.x, emu_bid.x, bar, parity, b.phase, b.pending,
                   static_cast<long long>(b.tx));
    std::fflush(stderr);
    std::_Exit(3);
  }
}

inline void mbar_wait_suspend(uint32_t bar, uint32_t parity) { mbar_wait(bar, parity); }

// A TMA tile load: the box at coordinates c of the map into shared memory at dst (box elements in
// order, innermost first, each byte at its swizzled address), zeros outside the tensor; then the
// box's bytes complete on the mbarrier.
inline void emu_tma(uint32_t dst, const CUtensorMap* map, uint32_t bar, const int* c, int rank) {
  EmuMap m;
  std::memcpy(&m, map, sizeof(m));
  if (m.rank != rank) emu_unexpected("TMA load with a map of another rank");
  int64_t volume = 1;
  for (int i = 0; i < rank; ++i) volume *= m.box[i];
  if ((dst % 1024) != 0 && m.swizzle == 128) emu_unexpected("TMA SWIZZLE_128B destination not 1024-byte aligned");
  for (int64_t l = 0; l < volume; ++l) {
    int64_t rem = l, off = 0;
    bool inside = true;
    for (int i = 0; i < rank; ++i) {
      const int64_t idx = c[i] + rem % m.box[i];
      rem /= m.box[i];
      inside = inside && idx >= 0 && idx < m.dims[i];
      off += idx * m.strides[i];
    }
    const uint32_t a = swizzle_address(dst + static_cast<uint32_t>(l), m.swizzle);
    if (a >= static_cast<uint32_t>(kSmemBytes)) emu_unexpected("TMA destination outside shared memory");
    smem_raw[a] = inside ? m.base[off] : 0;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  EmuMbar& b = mbar_at(bar);
  b.tx -= volume;
  mbar_complete_if_done(b);
}
inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  emu_tma(dst, map, bar, c, 4);
}
inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  emu_tma(dst, map, bar, c, 3);
}
inline void tma_prefetch_map(const CUtensorMap*) {}

template <int kId>
inline void named_barrier_sync_id(int threads) {
  std::unique_lock<std::mutex> lock(g_mu);
  EmuNamedBar& nb = g_named[kId];
  const unsigned gen = nb.gen;
  if (++nb.count == threads) {
    nb.count = 0;
    ++nb.gen;
    g_cv.notify_all();
    return;
  }
  if (!g_cv.wait_for(lock, std::chrono::seconds(20), [&] { return nb.gen != gen || g_deadlock; }) || g_deadlock) {
    if (!g_deadlock.exchange(true))
      std::fprintf(stderr, "emulation: DEADLOCK at named barrier %d (thread %u, block %u)\n", kId, emu_tid.x,
                   emu_bid.x);
    std::fflush(stderr);
    std::_Exit(3);
  }
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

template <int BN>
inline void wgmma_e4m3_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  emu_wgmma(d, BN, nullptr, a_desc, b_desc, scale_d);
}
template <int NC>
inline void wgmma_e4m3_rs(float (&d)[NC / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  emu_wgmma(d, NC, a, 0, b_desc, scale_d);
}

}  // namespace flashgrad::cuda_attn_emulated::sm90

#include "fp8_wgmma_forward_kernel.cuh"
#include "fp8_wgmma_maps.h"

// ---- launching --------------------------------------------------------------------------------------
// Runs body() as every thread of every block of the grid, blocks one after another; shared memory
// poisoned with 0xff (NaN in e4m3 and the float formats) and every barrier fresh before each block.
void launch(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& body) {
  emu_block_dim = {threads, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::memset(smem_raw, 0xff, sizeof(smem_raw));
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
          // A thread that returned stops counting in the barriers.
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

// [B, S, H, D] -> [B, H, S, D] copy of a padded case's e4m3 tensor (the rows then have the smaller
// stride: the tensor maps swap the rows and heads axes).
std::vector<uint8_t> to_bhsd(const std::vector<uint8_t>& x, int b, int s, int h, int d) {
  std::vector<uint8_t> y(x.size());
  for (int bi = 0; bi < b; ++bi)
    for (int si = 0; si < s; ++si)
      for (int hi = 0; hi < h; ++hi)
        std::memcpy(&y[((int64_t{bi} * h + hi) * s + si) * d], &x[((int64_t{bi} * s + si) * h + hi) * d], d);
  return y;
}

// The forward as fp8_wgmma_attention_forward launches it: maps, the V^T transpose, the kernel.
// bhsd (padded cases): q, k, v stored [B, H, S, D].
template <int D, bool kPingpong, int kSchedule, bool kPolyExp = false, bool kLean = true>
bool run_emulated(Fp8Case& c, Fp8Outputs& r, bool bhsd) {
  const Fp8Config& cfg = c.cfg;
  Fp8KernelParams f;
  AttentionKernelParams& p = f.base;
  p.q = c.q8.data();
  p.k = c.k8.data();
  p.v = c.v8.data();
  p.q_st = p.out_st = strides(c, true, cfg.hq);
  p.k_st = p.v_st = strides(c, false, cfg.hk);
  std::vector<uint8_t> q_bhsd, k_bhsd, v_bhsd;
  if (bhsd && !c.varlen) {
    q_bhsd = to_bhsd(c.q8, c.n, cfg.sq, cfg.hq, D);
    k_bhsd = to_bhsd(c.k8, c.n, cfg.sk, cfg.hk, D);
    v_bhsd = to_bhsd(c.v8, c.n, cfg.sk, cfg.hk, D);
    p.q = q_bhsd.data();
    p.k = k_bhsd.data();
    p.v = v_bhsd.data();
    p.q_st = {int64_t{cfg.hq} * cfg.sq * D, D, int64_t{cfg.sq} * D};
    p.k_st = p.v_st = {int64_t{cfg.hk} * cfg.sk * D, D, int64_t{cfg.sk} * D};
  }
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
  f.out_bf16 = cfg.out_dtype == DType::bf16;
  f.descale_q = c.dsq.data();
  f.descale_k = c.dsk.data();
  f.descale_v = c.dsv.data();
  f.dq_st_n = f.dk_st_n = f.dv_st_n = cfg.hk;
  f.dq_st_h = f.dk_st_h = f.dv_st_h = 1;
  f.vt_cols = fp8w::vt_columns(c.varlen, c.n, c.max_k, c.tk);
  // 1024-aligned like a device allocation, poisoned with e4m3 NaN.
  const size_t vt_bytes = static_cast<size_t>(cfg.hk) * D * f.vt_cols;
  std::unique_ptr<uint8_t, void (*)(void*)> vt(static_cast<uint8_t*>(std::aligned_alloc(1024, (vt_bytes + 1023) / 1024 * 1024)),
                                               std::free);
  std::memset(vt.get(), 0xff, vt_bytes);
  f.vt = vt.get();
  std::vector<uint16_t> out(static_cast<size_t>(c.tq) * cfg.hq * D, 0xffff);
  std::vector<float> lse(c.lse_count(), NAN);
  p.out = out.data();
  p.lse = lse.data();

  const int64_t batches = c.varlen ? 1 : c.n;
  const int64_t rows_q = c.varlen ? c.tq : c.max_q, rows_k = c.varlen ? c.tk : c.max_k;
  CUtensorMap mq, mk, mvt;
  fp8w::Fp8wMapAxes axes;
  axes.stagger = g_stagger;
  if (!fp8w::make_rows_map(emu_encode, &mq, p.q, p.q_st, rows_q, cfg.hq, batches, D, &axes.q_rows_inner) ||
      !fp8w::make_rows_map(emu_encode, &mk, p.k, p.k_st, rows_k, cfg.hk, batches, D, &axes.k_rows_inner) ||
      !fp8w::make_vt_map(emu_encode, &mvt, f.vt, f.vt_cols, D, cfg.hk, fp8w::kVtBoxKeys)) {
    std::printf("    the map code refused a view (%d refusals)\n", g_maps_refused);
    return false;
  }
  const int key_blocks = (c.max_k + fp8w::kVtBoxKeys - 1) / fp8w::kVtBoxKeys;
  launch(c.n * key_blocks, cfg.hk, 256, [&] { fp8w::fp8w_transpose_v_kernel<D>(f, key_blocks); });
  const int mblocks = (c.max_q + 127) / 128;
  const unsigned tiles = static_cast<unsigned>(int64_t{c.n} * mblocks * cfg.hq);
  launch(tiles, 1, 384, [&] {
    fp8w::fp8_attention_forward_wgmma_kernel<D, kPingpong, kSchedule, kPolyExp, kLean>(mq, mk, mvt, f, axes, mblocks);
  });
  r.out = decode16(cfg.out_dtype, out);
  r.lse = lse;
  return true;
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
  std::printf("    %-4s rel RMS kernel %.4f recipe %.4f | max|kernel-ref| %.3e max|recipe-ref| %.3e atol %.1e %s\n",
              what, rms, rms_emu, err, base, atol, ok ? "ok" : "FAIL");
}

// The kernel variant: bit 0 ping-pong, bit 1 serial, bit 3 one-level (Fp8wSchedule), bit 4 polynomial
// exp2 (on session 4's stream, as the host launches it), bit 5 session 4's instruction stream
// (kLean = false; overlapped schedule), bit 6 P V chunks pipelined (kOverlapPvPipe), bit 7 the serial
// schedule's P V chunks pipelined (kSerialPvPipe), bit 8 the staggered start (Fp8wMapAxes::stagger,
// a launch option: set through g_stagger), bit 9 kEarlyS (D = 64 / 128; with bit 0 ping-pong);
// bit 2: inputs stored [B, H, S, D].
template <int D>
bool run_variant(int variant, Fp8Case& c, Fp8Outputs& r) {
  const bool bhsd = variant & 4;
  g_stagger = variant & 256 ? 1 : 0;
  if (variant & 32) return run_emulated<D, false, fp8w::kOverlap, false, false>(c, r, bhsd);
  if (variant & 16) return run_emulated<D, false, fp8w::kOverlap, true, false>(c, r, bhsd);  // as the host runs it
  if (variant & 64) return run_emulated<D, false, fp8w::kOverlapPvPipe>(c, r, bhsd);
  if (variant & 128) return run_emulated<D, false, fp8w::kSerialPvPipe>(c, r, bhsd);
  if constexpr (D <= 128)
    if (variant & 512)
      return variant & 1 ? run_emulated<D, true, fp8w::kEarlyS>(c, r, bhsd)
                         : run_emulated<D, false, fp8w::kEarlyS>(c, r, bhsd);
  if (variant & 8)
    return variant & 1 ? run_emulated<D, true, fp8w::kOneLevel>(c, r, bhsd)
                       : run_emulated<D, false, fp8w::kOneLevel>(c, r, bhsd);
  switch (variant & 3) {
    case 0: return run_emulated<D, false, fp8w::kOverlap>(c, r, bhsd);
    case 1: return run_emulated<D, true, fp8w::kOverlap>(c, r, bhsd);
    case 2: return run_emulated<D, false, fp8w::kSerial>(c, r, bhsd);
    default: return run_emulated<D, true, fp8w::kSerial>(c, r, bhsd);
  }
}

void check_case(Fp8Config cfg, int variant, std::mt19937& rng) {
  Fp8Case c = fp8_test::make_case(cfg, rng);
  const Fp8Outputs ref = fp8_test::reference32(c);
  const Fp8Outputs emu = fp8_test::recipe(c);
  Fp8Outputs got;
  const char* names[4] = {"", " (ping-pong)", " (serial)", " (serial ping-pong)"};
  std::printf("  case %s%s%s%s%s\n", cfg.name.c_str(), names[variant & 3], variant & 8 ? " (one-level P V)" : "",
              variant & 16 ? " (polynomial exp2)" : "", variant & 4 ? " [B, H, S, D] inputs" : "");
  if (variant & 32) std::printf("    (session 4 instruction stream: kLean = false)\n");
  if (variant & 64) std::printf("    (P V chunks pipelined: kOverlapPvPipe)\n");
  if (variant & 128) std::printf("    (serial, P V chunks pipelined: kSerialPvPipe)\n");
  if (variant & 256) std::printf("    (staggered start: warpgroup 2 after warpgroup 1's first P)\n");
  if (variant & 512) std::printf("    (early S: kEarlyS)\n");
  std::fflush(stdout);
  const bool ran = cfg.d == 64    ? run_variant<64>(variant, c, got)
                   : cfg.d == 128 ? run_variant<128>(variant, c, got)
                                  : run_variant<256>(variant, c, got);
  if (!ran) {
    ++failures;
    return;
  }
  const double r = cfg.softcap > 0.f ? 3.0 : 2.0;
  check_output("out", got.out, ref.out, emu.out, cfg.out_dtype, r, 0.03);
  check_output("lse", got.lse, ref.lse, emu.lse, DType::f32, r, 0, emu.score_terms_max);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (const char* e = std::getenv("FP8W_EMULATION_EXACT_ACCUMULATOR")) g_hopper_accumulator = std::string(e) != "1";
  std::printf("e4m3 wgmma accumulator: %s\n",
              g_hopper_accumulator ? "Hopper model (14-bit aligned products, 13-bit C)" : "exact");
  // FLASHGRAD_EMULATION_SEED=<n> repeats a run's inputs (to compare two builds line by line).
  const char* seed_env = std::getenv("FLASHGRAD_EMULATION_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::printf("inputs: seed %u\n", seed);
  std::mt19937 rng(seed);
  struct Entry {
    Fp8Config cfg;
    int variant;  // bit 0 ping-pong, bit 1 serial, bit 3 one-level, bit 4 polynomial exp2, bit 5 session-4
                  // stream, bit 6 / 7 P V chunks pipelined (overlapped / serial), bit 2 [B, H, S, D] inputs
  };
  std::vector<Entry> cases;
  const std::vector<std::string> quick = {"causal d128 Sq=200 Sk=300", "varlen causal d256 gqa 4/2 with empty sequences"};
  auto add = [&](std::string name, Fp8Config c, int variant = 0) {
    c.name = std::move(name);
    const bool pick = only == "quick" ? std::find(quick.begin(), quick.end(), c.name) != quick.end() && variant == 0
                                      : only.empty() || c.name.find(only) != std::string::npos;
    if (pick) cases.push_back({c, variant});
  };
  for (int d : {64, 128, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      Fp8Config c;
      c.d = d;
      c.mask = m;
      c.batch = 1;
      c.sq = 200;
      c.sk = 300;
      add(std::string(mask_name(m)) + " d" + std::to_string(d) + " Sq=200 Sk=300", c);
    }
  {
    Fp8Config c;
    c.d = 128;
    c.mask = MaskKind::causal;
    c.batch = 2;
    c.hq = 2;
    c.hk = 1;
    c.sq = c.sk = 260;
    for (int variant : {0, 1, 2, 3, 8, 9, 16, 512, 513}) add("causal d128 B2 mqa Sq=Sk=260", c, variant);
    c.d = 256;
    for (int variant : {1, 2, 3, 8, 9, 16, 64, 128}) add("causal d256 B2 mqa Sq=Sk=260", c, variant);
    c.d = 64;
    add("causal d64 B2 mqa Sq=Sk=260", c, 3);
    c.hq = 4;
    c.hk = 2;
    for (int d : {64, 128, 256}) {
      c.d = d;
      add("causal d" + std::to_string(d) + " B2 gqa 4/2 Sq=Sk=260", c, 4);
    }
  }
  for (int d : {128, 256}) {
    Fp8Config c;
    c.d = d;
    c.lens_q = {37, 0, 180, 5};
    c.lens_k = {53, 0, 300, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    add("varlen causal d" + std::to_string(d) + " gqa 4/2 with empty sequences", c);
    if (d == 256) add("varlen causal d256 gqa 4/2 with empty sequences", c, 3);
    add("varlen causal d" + std::to_string(d) + " gqa 4/2 with empty sequences", c, 16);
    if (d == 128) add("varlen causal d128 gqa 4/2 with empty sequences", c, 512);
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
    add("varlen window 20,3 d128", c, 512);
  }
  {
    Fp8Config c;
    c.d = 256;
    c.batch = 1;
    c.sq = 190;
    c.sk = 160;
    c.mask = MaskKind::causal;
    c.softcap = 5.f;
    c.input_std = 2.f;
    c.out_dtype = DType::f16;
    add("causal Sq>Sk softcap tanh fp16 out d256", c);
    add("causal Sq>Sk softcap tanh fp16 out d256", c, 2);
    add("causal Sq>Sk softcap tanh fp16 out d256", c, 16);
    c.d = 128;
    c.method = SoftcapMethod::soft_sign;
    add("causal Sq>Sk softcap soft_sign fp16 out d128", c);
    add("causal Sq>Sk softcap soft_sign fp16 out d128", c, 512);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 3;
    c.sq = c.sk = 150;
    c.mask = MaskKind::prefix_lm;
    c.prefix = {0, 40, 150};
    add("prefix_lm d128", c);
    add("prefix_lm d128", c, 512);
    c.d = 256;
    c.mask = MaskKind::candidate_isolation;
    c.prefix.clear();
    c.bounds = {0, 60, 60, 150, 10, 40, 70, 145, 0, 0, 0, 150};
    add("candidate_isolation d256", c);
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 1;
    c.hq = c.hk = 1;
    c.sq = 40;
    c.sk = 3000;
    add("none d128 Sq=40 Sk=3000 (long rows: accumulator drift)", c);
    add("none d128 Sq=40 Sk=3000 (long rows: accumulator drift)", c, 8);
    add("none d128 Sq=40 Sk=3000 (long rows: accumulator drift)", c, 16);
    add("none d128 Sq=40 Sk=3000 (long rows: accumulator drift)", c, 512);
  }
  {
    // Runs of full key blocks (kLean steps through them by fp8w_full_run_end): rows inside the
    // sequence (Sq a multiple of 128 per CTA), Sk not a multiple of 128 (a partial last block), and
    // causal with Sk > Sq (offset > 0: full blocks up to the diagonal shifted right) and Sk < Sq
    // (offset < 0: the first row blocks see no full block). Each also on session 4's stream (32).
    Fp8Config c;
    c.batch = 1;
    c.hq = 2;
    c.hk = 1;
    c.sq = 256;
    c.sk = 700;
    for (int d : {64, 128, 256}) {
      c.d = d;
      c.mask = MaskKind::none;
      add("none d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c);
      c.mask = MaskKind::causal;
      add("causal d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c);
    }
    c.d = 128;
    add("causal d128 Sq=256 Sk=700 (full-block runs)", c, 32);
    c.mask = MaskKind::none;
    add("none d128 Sq=256 Sk=700 (full-block runs)", c, 32);
    c.mask = MaskKind::causal;
    c.sq = 640;
    c.sk = 300;
    add("causal d128 Sq=640 Sk=300 (offset < 0)", c);
    add("causal d128 Sq=640 Sk=300 (offset < 0)", c, 512);
    c.d = 256;
    add("causal d256 Sq=640 Sk=300 (offset < 0)", c);
    // hd 256 with the P V chunks pipelined (kOverlapPvPipe): full blocks, masked blocks, ring wrap.
    add("causal d256 Sq=640 Sk=300 (offset < 0)", c, 64);
    add("causal d256 Sq=640 Sk=300 (offset < 0)", c, 128);
    c.sq = 256;
    c.sk = 700;
    add("causal d256 Sq=256 Sk=700 (full-block runs)", c, 64);
    add("causal d256 Sq=256 Sk=700 (full-block runs)", c, 128);
    c.mask = MaskKind::none;
    add("none d256 Sq=256 Sk=700 (full-block runs)", c, 64);
    add("none d256 Sq=256 Sk=700 (full-block runs)", c, 128);
    // Session 6: the staggered start (bit 8), alone and with ping-pong, full and masked blocks.
    for (int d : {64, 128, 256}) {
      c.d = d;
      c.mask = MaskKind::none;
      add("none d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 256);
      c.mask = MaskKind::causal;
      add("causal d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 257);
    }
    c.d = 128;
    c.mask = MaskKind::none;
    add("none d128 Sq=256 Sk=700 (full-block runs)", c, 257);
    // The staggered start in the serial schedules (run 6.3: stagger default at hd 64 / 128; tried at
    // hd 256 serial + pipelined P V): serial, serial ping-pong, kSerialPvPipe.
    c.d = 256;
    c.mask = MaskKind::none;
    add("none d256 Sq=256 Sk=700 (full-block runs)", c, 128 + 256);
    c.mask = MaskKind::causal;
    add("causal d256 Sq=256 Sk=700 (full-block runs)", c, 128 + 256);
    c.d = 128;
    add("causal d128 Sq=256 Sk=700 (full-block runs)", c, 3 + 256);
    c.mask = MaskKind::none;
    add("none d128 Sq=256 Sk=700 (full-block runs)", c, 2 + 256);
    // hd 64's default in the first session-6 commits: the serial schedule (variant 2).
    c.d = 64;
    c.mask = MaskKind::none;
    add("none d64 Sq=256 Sk=700 (full-block runs)", c, 2);
    c.mask = MaskKind::causal;
    add("causal d64 Sq=256 Sk=700 (full-block runs)", c, 2);
    // kEarlyS (bit 9): alone, with ping-pong, with the stagger; full and masked blocks, ring wrap.
    for (int d : {64, 128}) {
      c.d = d;
      c.mask = MaskKind::none;
      add("none d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 512);
      add("none d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 512 + 256 + 1);
      c.mask = MaskKind::causal;
      add("causal d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 512);
      add("causal d" + std::to_string(d) + " Sq=256 Sk=700 (full-block runs)", c, 512 + 1);
    }
  }
  for (auto& e : cases) check_case(e.cfg, e.variant, rng);
  std::printf("%s: %d failed checks\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
