// CPU emulation of the FP8 attention kernels: runs their own source (fp8_prepass_kernels.cuh,
// fp8_forward_kernel.cuh, fp8_backward_kernel.cuh and the 16-bit headers they reuse) on host
// threads, one std::thread per CUDA thread, with the inline PTX replaced by the emulations below
// (rewrite_asm.py does the replacement in a copy of the headers), and checks forward and backward
// against the recipe emulated in fp32 and the fp32 reference (tests/cpp/attention_fp8_recipe.h) by
// the GPU test's rules: relative RMS bars and the 2x rule.
//
// What it checks: index math, fragment layouts (ldmatrix, mma.m16n8k32 e4m3, mma.m16n8k16), the
// key permutation between P and the transposed V copy, swizzles, barriers (shared memory is
// poisoned with NaN bytes before each block), masks, varlen bookkeeping, descales and the
// pre-passes. What it cannot check: the hardware (the emulated PTX follows the ISA's definitions,
// as does fp8_fragments.cuh; ex2.approx is emulated by exp2f), races, speed, register spills.
// The copied headers live in namespace flashgrad::cuda_attn_emulated (rewrite_asm.py renames it),
// so nothing here collides with the CUDA library's kernels when linked against a CUDA build.
// Build and run with run.sh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <algorithm>
#include <barrier>
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

constexpr int kMaxWarps = 8;
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
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// ---- the emulated PTX -----------------------------------------------------------------------------
inline uint64_t emu_shared_offset(const void* p) {
  return static_cast<uint64_t>(static_cast<const unsigned char*>(p) - smem_raw);
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

#include "fp8_backward_kernel.cuh"
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
      std::barrier<> block(threads);
      std::vector<std::unique_ptr<std::barrier<>>> warps;
      for (unsigned w = 0; w < threads / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        g_warp_bar[w] = warps.back().get();
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

template <int D>
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
  using BCfg = fp8::Fp8BackwardConfig<D>;
  const int nblocks = (c.max_k + BCfg::kBlockN - 1) / BCfg::kBlockN;
  if (bf16)
    launch(c.n * nblocks, cfg.hk, BCfg::kThreads,
           [&] { fp8::fp8_attention_backward_kernel<__nv_bfloat16, D>(f, nblocks); });
  else
    launch(c.n * nblocks, cfg.hk, BCfg::kThreads, [&] { fp8::fp8_attention_backward_kernel<__half, D>(f, nblocks); });
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
  const Fp8Outputs got = cfg.d == 64 ? run_emulated<64>(c) : cfg.d == 128 ? run_emulated<128>(c) : run_emulated<256>(c);
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
  if (const char* e = std::getenv("FP8_EMULATION_EXACT_ACCUMULATOR")) g_hopper_accumulator = std::string(e) != "1";
  std::printf("e4m3 mma accumulator: %s\n", g_hopper_accumulator ? "Hopper model (14-bit aligned products, 13-bit C)" : "exact");
  // FLASHGRAD_EMULATION_SEED=<n> repeats a run's inputs (to compare two builds line by line).
  const char* seed_env = std::getenv("FLASHGRAD_EMULATION_SEED");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : std::random_device{}();
  std::printf("inputs: seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<Fp8Config> cases;
  // "quick" (for CTest): one case per kernel path at hd 64, about a minute on 2 cores.
  const std::vector<std::string> quick = {"causal d64 Sq=70 Sk=130", "varlen causal d64 gqa 4/2 with empty sequences",
                                          "candidate_isolation d64", "deterministic varlen causal d64"};
  auto add = [&](std::string name, Fp8Config c) {
    c.name = std::move(name);
    const bool pick = only == "quick" ? std::find(quick.begin(), quick.end(), c.name) != quick.end()
                                      : only.empty() || c.name.find(only) != std::string::npos;
    if (pick) cases.push_back(c);
  };
  for (int d : {64, 128, 256})
    for (MaskKind m : {MaskKind::none, MaskKind::causal}) {
      Fp8Config c;
      c.d = d;
      c.mask = m;
      c.batch = 1;
      c.sq = 70;
      c.sk = 130;
      add(std::string(mask_name(m)) + " d" + std::to_string(d) + " Sq=70 Sk=130", c);
    }
  {
    Fp8Config c;
    c.d = 64;
    c.lens_q = {37, 0, 80, 5};
    c.lens_k = {53, 0, 80, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    add("varlen causal d64 gqa 4/2 with empty sequences", c);
    c.d = 128;
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
  }
  {
    Fp8Config c;
    c.d = 128;
    c.batch = 3;
    c.sq = c.sk = 100;
    c.mask = MaskKind::prefix_lm;
    c.prefix = {0, 40, 100};
    add("prefix_lm d128", c);
    c.d = 64;
    c.mask = MaskKind::candidate_isolation;
    c.prefix.clear();
    c.bounds = {0, 60, 60, 100, 10, 40, 70, 95, 0, 0, 0, 100};
    add("candidate_isolation d64", c);
  }
  for (int d : {64, 256}) {
    Fp8Config c;
    c.d = d;
    c.lens_q = {37, 0, 80, 5};
    c.lens_k = {53, 0, 80, 0};
    c.hq = 4;
    c.hk = 2;
    c.mask = MaskKind::causal;
    c.deterministic = true;
    c.softcap = d == 256 ? 5.f : 0.f;
    add("deterministic varlen causal d" + std::to_string(d) + (d == 256 ? " softcap" : ""), c);
  }
  {
    Fp8Config c;
    c.d = 64;
    c.batch = 1;
    c.hq = c.hk = 1;
    c.sq = 40;
    c.sk = 3000;
    add("none d64 Sq=40 Sk=3000 (long rows: accumulator drift)", c);
  }
  for (auto& c : cases) check_case(c, rng);
  std::printf("%s: %d failed checks\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
