// Shared pieces of the fused recurrent delta-rule kernels (forward, backward pass 1 and pass 2):
// the argument block, strided loads/stores with int64 offsets, and the thread layout.
//
// Thread layout (all three kernels): one thread block = 256 threads owns one (sequence n, value
// head hv, slice of BV value columns). Column j of the state S (K x V) evolves independently of
// the other columns, so a column is owned by a group of L = KMAX / 8 consecutive lanes; lane
// `gl` of the group holds rows k = 8 gl + i (i < 8) of that column in registers (row_of), so its
// q, k (and KDA gate) elements are one 16-byte run and the group's loads are coalesced. Dot
// products over K are a register sum plus log2(L) xor-shuffles inside the group. BV = 256 / L columns per block (KMAX 64: 32, 128: 16,
// 256: 8). K < KMAX is padded: rows k >= K load zeros and stay zero.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashgrad::cuda_detail::delta_rule {

enum class Gate : int { none = 0, scalar = 1, per_channel = 2 };

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerThread = 8;  // KPT
constexpr float kL2NormEps = 1e-6f;  // inside the sqrt, as fla's l2norm

// A strided view as the kernels see it: pointer + element strides (last dim contiguous, checked
// by validation). `f32` says the element type is float rather than the op's main dtype T (g,
// beta, saved_r, dg and dbeta may be either).
struct View {
  void* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 1;
  bool f32 = false;
};

// Everything one launch needs. Sizes are int64 so that no offset product can wrap.
struct RecurrentArgs {
  View q, k, v, g, beta;     // inputs (g.p null without a gate)
  View h0;                   // initial_state [N, HV, K, V] f32 (null: zeros)
  View o, r, ht;             // forward outputs (each may be null)
  View dout, dht;            // backward inputs (dht may be null)
  View dv, dh0;              // backward outputs written by the kernels (dh0 may be null)
  float* dq_acc = nullptr;   // [B, T, H, K] f32, zeroed: dq summed over V slices and value heads
  float* dk_acc = nullptr;   // [B, T, H, K] f32, zeroed
  // The recurrent backward's dq, dk accumulators interleaved, [B, T, H, K] of (dq, dk), zeroed: pass 2
  // adds both of a row with one 8-byte vector atomic (sm_90 float2 atomicAdd) instead of two, and
  // qk_pair_grad_finish_kernel reads each pair once. (dq_acc / dk_acc: the chunked path's GVA finish.)
  float2* dqk_acc = nullptr;
  float* dbeta_acc = nullptr;  // [B, T, HV] f32, zeroed
  float* dg_acc = nullptr;   // [B, T, HV] (GDN) or [B, T, HV, K] (KDA) f32, zeroed
  float* dg_const = nullptr;  // [N, HV] or [N, HV, K] f32, zeroed: added to every step of a sequence
  // Backward with the in-kernel L2 norm: 1 / ||x|| of every q and k row [B, T, H] (qk_rstd_kernel),
  // computed once instead of in both passes at every step (session 7).
  const float* q_rstd = nullptr;
  const float* k_rstd = nullptr;
  const int64_t* cu_seqlens = nullptr;  // device copy [N+1] (null: padded batch)
  int64_t T = 0, H = 0, HV = 0, K = 0, V = 0;
  float scale = 1.0f;
  bool l2norm = false;
  bool qk_vec = false;  // q, k rows: K % 8 == 0 and 16-byte aligned runs (vector loads)
  bool g_vec = false;   // KDA float32 gate rows: same
};

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

// Element at a precomputed int64 offset, as float; `f32` picks float storage over T.
template <typename T>
__device__ __forceinline__ float load_elem(const View& x, int64_t off) {
  return x.f32 ? static_cast<const float*>(x.p)[off] : to_f<T>(static_cast<const T*>(x.p)[off]);
}
template <typename T>
__device__ __forceinline__ void store_elem(const View& x, int64_t off, float val) {
  if (x.f32)
    static_cast<float*>(x.p)[off] = val;
  else
    static_cast<T*>(x.p)[off] = from_f<T>(val);
}

__device__ __forceinline__ int64_t off3(const View& x, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * x.s0 + i1 * x.s1 + i2 * x.s2;
}
__device__ __forceinline__ int64_t off4(const View& x, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * x.s0 + i1 * x.s1 + i2 * x.s2 + i3 * x.s3;
}

// Sum over the L lanes of a column group (L a power of two <= 32); every lane gets the sum.
template <int L>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = L / 2; o >= 1; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// Sum over the 32 / L column groups of a warp for the same row slot (lanes gl, gl+L, ...).
template <int L>
__device__ __forceinline__ float across_groups_sum(float x) {
#pragma unroll
  for (int o = L; o < 32; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Where one (sequence, value head, column slice) block works.
struct BlockCoords {
  int64_t n, b, bos, len, hv, h, col;
  int gl;      // lane inside the column group: holds rows row_of<KPT>(gl, i)
  bool col_ok; // this thread's column exists (col < V)
};

template <int L>
__device__ __forceinline__ BlockCoords block_coords(const RecurrentArgs& a) {
  BlockCoords c;
  c.n = blockIdx.x;
  c.hv = blockIdx.y;
  c.h = c.hv / (a.HV / a.H);
  constexpr int kCols = kThreads / L;
  c.col = static_cast<int64_t>(blockIdx.z) * kCols + threadIdx.x / L;
  c.gl = threadIdx.x % L;
  c.col_ok = c.col < a.V;
  if (a.cu_seqlens) {
    c.b = 0;
    c.bos = a.cu_seqlens[c.n];
    c.len = a.cu_seqlens[c.n + 1] - c.bos;
  } else {
    c.b = c.n;
    c.bos = 0;
    c.len = a.T;
  }
  return c;
}

// Row of the state held in register slot i by lane gl of a column group: each lane holds KPT
// consecutive rows, so its q / k / KDA-gate elements are one contiguous (vectorizable) run.
template <int KPT>
__device__ __forceinline__ int64_t row_of(int gl, int i) {
  return static_cast<int64_t>(gl) * KPT + i;
}

// Raw 32-bit storage of the element at p, of a View whose type is float (`f32`) or T (converted at
// use by raw_to_f, so that a prefetched load is waited for only where its value is needed).
template <typename T>
__device__ __forceinline__ uint32_t load_raw_at(bool f32, const void* p) {
  if (f32 || sizeof(T) == 4) return *static_cast<const uint32_t*>(p);
  return static_cast<uint32_t>(*static_cast<const uint16_t*>(p));
}
template <typename T>
__device__ __forceinline__ void store_elem_at(bool f32, void* p, float val) {
  if (f32)
    *static_cast<float*>(p) = val;
  else
    *static_cast<T*>(p) = from_f<T>(val);
}
template <typename T>
__device__ __forceinline__ float raw_to_f(bool f32, uint32_t bits) {
  if (f32 || sizeof(T) == 4) return __uint_as_float(bits);
  const uint16_t h = static_cast<uint16_t>(bits);
  T x;
  memcpy(&x, &h, 2);
  return to_f<T>(x);
}

// 2^x on the hardware ex2 with results below 2^-126 flushed to zero (ex2.approx.ftz: ~2 ulp; no
// denormal fix-up instructions): the decays of the chunked stages, whose terms that small are 0 for
// their sums. The host emulation uses exp2f.
__device__ __forceinline__ float exp2_ftz(float x) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}
constexpr float kLog2e = 1.4426950408889634f;

// exp(x) for a decay difference x = G_i - G_j <= 0 (g <= 0; stage 1's M, the serial chains' scale P,
// B2b's decay factors): exp2_ftz(x log2 e), ~2 ulp plus x log2 e's rounding, ~|x| 2^-24 relative (an
// absolute error below ~1.3e-7 of the factor for every x <= 0, under fp32 rounding of the sums it
// enters). Three instructions, against __expf's five with its denormal fix-ups and expf's eight. The
// host emulation uses expf (its logs stay those of the expf form).
__device__ __forceinline__ float decay_exp_ftz(float x) {
#ifdef FLASHGRAD_CHUNKED_HOST_EMULATION
  return expf(x);
#else
  return exp2_ftz(x * kLog2e);
#endif
}

// An input element's bits, unconverted (float: its 32 bits; 16-bit T: its bits zero-extended), and
// their value (raw_to_f32; the View form of load_raw_at / raw_to_f above, used by the chunked stage 1
// kernels), so that a global load's result can wait in a register until its use:
// a conversion right after the load makes the warp wait there for the load (ncu, run 13.1: the
// beta load's conversion before the gate's loads, v's conversions before the inverse).
__device__ __forceinline__ uint32_t raw_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t raw_bits(uint16_t x) { return x; }
template <typename T>
__device__ __forceinline__ float raw_to_f32(bool f32, uint32_t r) {
  if (f32) return __uint_as_float(r);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(r << 16);  // bf16 -> f32: the 16 bits moved to the top of the word
  } else {
    const uint16_t b = static_cast<uint16_t>(r);
    T x;
    memcpy(&x, &b, 2);
    return to_f<T>(x);
  }
}
template <typename T>
__device__ __forceinline__ uint32_t load_raw(const View& x, int64_t off) {
  return x.f32 ? raw_bits(static_cast<const float*>(x.p)[off]) : raw_bits(static_cast<const uint16_t*>(x.p)[off]);
}

// One step's per-thread inputs in raw form, loaded kPrefetch steps ahead into a register ring
// (pipelined_loop below), so global-memory latency overlaps several steps of compute.
template <typename T, int KPT, bool kPerChannel>
struct StepLoad {
  alignas(16) T q[KPT];
  alignas(16) T k[KPT];
  alignas(16) float g[kPerChannel ? KPT : 1];
  uint32_t beta;
  uint32_t x0, x1, x2;  // per-column values: meaning depends on the kernel (v, do, r, dv...)
  float q_rstd, k_rstd;  // backward passes with the L2 norm (RecurrentArgs::q_rstd)
};

// KPT consecutive elements starting at `run` (the thread's first row; rows at or past `rows_left`
// are zero). `vec`: the run is 16-byte aligned and fully inside K (checked once on the host), so it
// moves as 16-byte loads.
template <typename E, int KPT>
__device__ __forceinline__ void load_run(const E* run, int64_t rows_left, bool vec, E (&dst)[KPT]) {
  static_assert((KPT * sizeof(E)) % 16 == 0, "runs are whole 16-byte vectors");
  if (vec) {
    if (rows_left > 0) {
      const uint4* src = reinterpret_cast<const uint4*>(run);
#pragma unroll
      for (int c = 0; c < static_cast<int>(KPT * sizeof(E) / 16); ++c) reinterpret_cast<uint4*>(dst)[c] = src[c];
    } else {
#pragma unroll
      for (int c = 0; c < static_cast<int>(KPT * sizeof(E) / 16); ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      if (i < rows_left) {
        dst[i] = run[i];
      } else {
        const E zero{};
        dst[i] = zero;
      }
    }
  }
}

// One per-token element stream of this thread, hoisted out of the time loop: the address at step 0
// (token bos of the block's sequence) and the bytes from one token to the next, so step t's address
// is one wide multiply-add (t and the stride in 32 bits: launch_recurrent checks that they fit).
// Session 7: forming the full int64 index b*s0 + tok*s1 + head*s2 + col*s3 for every tensor at every
// step was about a third of the kernels' instructions, and at two blocks per SM they are bound by
// instruction issue.
struct TokenPtr {
  char* p0 = nullptr;
  uint32_t step = 0;  // bytes per token (non-negative)
  // Unsigned 32 x 32 -> 64-bit product: one IMAD.WIDE.U32 with p0 as its addend (a signed one
  // costs sign-extension fix-ups).
  template <typename E>
  __device__ __forceinline__ E* at(int64_t t) const {
    return reinterpret_cast<E*>(p0 + static_cast<uint64_t>(static_cast<uint32_t>(t)) * step);
  }
};
// Element (c.b, c.bos + t, head, e) of a [B, T, heads, inner] view whose elements are `esz` bytes
// (e = 0 for [B, T, heads]).
__device__ __forceinline__ TokenPtr view_tokens(const View& x, int esz, const BlockCoords& c, int64_t head,
                                                int64_t e = 0) {
  TokenPtr tp;
  if (x.p) tp.p0 = static_cast<char*>(x.p) + (c.b * x.s0 + c.bos * x.s1 + head * x.s2 + e * x.s3) * esz;
  tp.step = static_cast<uint32_t>(x.s1 * esz);
  return tp;
}
// Element (c.b, c.bos + t, head, e) of a packed accumulator [B, T, heads, inner] of E (float, or
// float2 for dqk_acc) (index ((b * T + tok) * heads + head) * inner + e; inner = 1 for per-head scalars).
template <typename E>
__device__ __forceinline__ TokenPtr acc_tokens(E* acc, int64_t T, const BlockCoords& c, int64_t heads,
                                               int64_t head, int64_t inner, int64_t e) {
  TokenPtr tp;
  if (acc) tp.p0 = reinterpret_cast<char*>(acc + ((c.b * T + c.bos) * heads + head) * inner + e);
  tp.step = static_cast<uint32_t>(heads * inner * sizeof(E));
  return tp;
}
// Element size of a View holding float or T.
template <typename T>
__device__ __forceinline__ int elem_size(const View& x) {
  return x.f32 ? 4 : static_cast<int>(sizeof(T));
}

// q and k rows for this thread as float, raw, and the norms that would normalize them over the full
// K (group reduction; 1 without the L2 norm). The kernels fold rq, rk into their per-column scalars:
// q and k enter only through dot products and rank-one updates with such scalars (k.S = rk (k_raw.S),
// S += (rk u) k_raw, o = (scale rq) (q_raw.S)), which saves 2 KPT multiplies per step.
template <typename T, int L, int KPT>
__device__ __forceinline__ void qk_to_float(const T (&qr)[KPT], const T (&kr)[KPT], bool l2norm,
                                            float (&q)[KPT], float (&k)[KPT], float& rq, float& rk) {
  float sq = 0.f, sk = 0.f;
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    q[i] = to_f<T>(qr[i]);
    k[i] = to_f<T>(kr[i]);
    sq += q[i] * q[i];
    sk += k[i] * k[i];
  }
  float nq = 1.f, nk = 1.f;
  if (l2norm) {
    // rsqrtf (~2 ulp): the exact 1 / sqrtf's division and square-root sequences with their
    // slow-path branches were ~8% of a step's instructions.
    nq = rsqrtf(group_sum<L>(sq) + kL2NormEps);
    nk = rsqrtf(group_sum<L>(sk) + kL2NormEps);
  }
  rq = nq;
  rk = nk;
}

// The backward passes' q and k rows with their precomputed norms q_rstd, k_rstd (qk_rstd_kernel; 1
// without the L2 norm). kFold (GDN and the plain rule): raw rows, rq / rk folded as in qk_to_float;
// else (KDA's backward, whose gate terms and shared q, k rows need them) normalized rows, rq = rk = 1.
template <typename T, int KPT, bool kFold>
__device__ __forceinline__ void qk_rows_rstd(const T (&qr)[KPT], const T (&kr)[KPT], float q_rstd, float k_rstd,
                                             float (&q)[KPT], float (&k)[KPT], float& rq, float& rk) {
  const float sq = kFold ? 1.f : q_rstd, sk = kFold ? 1.f : k_rstd;
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    q[i] = to_f<T>(qr[i]) * sq;
    k[i] = to_f<T>(kr[i]) * sk;
  }
  rq = kFold ? q_rstd : 1.f;
  rk = kFold ? k_rstd : 1.f;
}

// This thread's q, k, gate and beta streams (row0: its first row, rows_left = K - row0).
struct QkgbStreams {
  TokenPtr q, k, g, beta, q_rstd, k_rstd;
  int64_t rows_left;
};
template <typename T, int KPT, Gate G>
__device__ __forceinline__ QkgbStreams qkgb_streams(const RecurrentArgs& a, const BlockCoords& c) {
  const int64_t row0 = row_of<KPT>(c.gl, 0);
  QkgbStreams st;
  st.q = view_tokens(a.q, sizeof(T), c, c.h, row0);
  st.k = view_tokens(a.k, sizeof(T), c, c.h, row0);
  st.g = view_tokens(a.g, elem_size<T>(a.g), c, c.hv, G == Gate::per_channel ? row0 : 0);
  st.beta = view_tokens(a.beta, elem_size<T>(a.beta), c, c.hv);
  st.q_rstd = acc_tokens(const_cast<float*>(a.q_rstd), a.T, c, a.H, c.h, 1, 0);
  st.k_rstd = acc_tokens(const_cast<float*>(a.k_rstd), a.T, c, a.H, c.h, 1, 0);
  st.rows_left = a.K - row0;
  return st;
}

// Loads this thread's q, k rows and the gate / beta of step t (token bos + t).
template <typename T, int KPT, Gate G>
__device__ __forceinline__ void load_qkgb(const RecurrentArgs& a, const QkgbStreams& st, int64_t t,
                                          StepLoad<T, KPT, G == Gate::per_channel>& s) {
  load_run<T, KPT>(st.q.at<const T>(t), st.rows_left, a.qk_vec, s.q);
  load_run<T, KPT>(st.k.at<const T>(t), st.rows_left, a.qk_vec, s.k);
  if constexpr (G == Gate::scalar) {
    s.g[0] = __uint_as_float(load_raw_at<T>(a.g.f32, st.g.at<const void>(t)));  // raw bits, see gate_scalar
  } else if constexpr (G == Gate::per_channel) {
    if (a.g.f32) {
      load_run<float, KPT>(st.g.at<const float>(t), st.rows_left, a.g_vec, s.g);
    } else {
      const T* gp = st.g.at<const T>(t);
#pragma unroll
      for (int i = 0; i < KPT; ++i) s.g[i] = i < st.rows_left ? to_f<T>(gp[i]) : 0.f;
    }
  } else {
    s.g[0] = 0.f;
  }
  s.beta = load_raw_at<T>(a.beta.f32, st.beta.at<const void>(t));
  if (a.q_rstd) {
    s.q_rstd = *st.q_rstd.at<const float>(t);
    s.k_rstd = *st.k_rstd.at<const float>(t);
  } else {
    s.q_rstd = s.k_rstd = 1.f;
  }
}

// exp(g) for row slot i (one value for GDN, one per row for KDA, 1 without a gate).
template <Gate G, int KPT>
__device__ __forceinline__ void decays(const float* g, float (&d)[KPT]) {
  if constexpr (G == Gate::per_channel) {
#pragma unroll
    for (int i = 0; i < KPT; ++i) d[i] = expf(g[i]);
  } else if constexpr (G == Gate::scalar) {
    const float e = expf(g[0]);  // g[0] holds the gate already converted by gate_scalar
#pragma unroll
    for (int i = 0; i < KPT; ++i) d[i] = e;
  } else {
#pragma unroll
    for (int i = 0; i < KPT; ++i) d[i] = 1.f;
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule {

// Runs step(t, ring[slot]) for t over [0, len) (descending when kReverse), with the inputs of
// step t loaded D steps ahead into a register ring: the slot is refilled right after use, and
// indices into the ring are compile-time constants (the inner loop is unrolled), so the ring
// stays in registers and a load is waited for only D steps later.
template <int D, bool kReverse, typename Ring, typename Load, typename Step>
__device__ __forceinline__ void pipelined_loop(int64_t len, Ring (&ring)[D], Load&& load, Step&& step) {
  auto time_of = [&](int64_t i) { return kReverse ? len - 1 - i : i; };
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (s < len) load(time_of(s), ring[s]);
  for (int64_t i0 = 0; i0 < len; i0 += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      const int64_t i = i0 + s;
      if (i < len) {
        step(time_of(i), ring[s]);
        if (i + D < len) load(time_of(i + D), ring[s]);
      }
    }
  }
}

// The gate of GDN arrives as raw bits in g[0]; convert it in place at use.
template <typename T, Gate G, typename S>
__device__ __forceinline__ void gate_scalar(bool f32, S& s) {
  if constexpr (G == Gate::scalar) s.g[0] = raw_to_f<T>(f32, __float_as_uint(s.g[0]));
}

}  // namespace flashgrad::cuda_detail::delta_rule

namespace flashgrad::cuda_detail::delta_rule {

// A state slice [K rows, kCols columns] of (sequence n, value head hv) moves between a state
// tensor [N, HV, K, V] (float32) and the threads' registers through shared memory, so the global
// side is coalesced along V (rows of kCols consecutive floats) instead of one float per row per
// lane. kCols * KMAX == 2048 floats for every KMAX (kCols = 256 / (KMAX / 8)).
constexpr int kStateTileFloats = 2048;

template <int KMAX, int KPT>
__device__ __forceinline__ void load_state_slice(const View& st, const BlockCoords& c, int64_t K, int64_t V,
                                                 float* tile, float (&dst)[KPT]) {
  constexpr int L = KMAX / KPT, kCols = kThreads / L;
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kCols;
  if (st.p) {
    const float* p = static_cast<const float*>(st.p);
    for (int e = threadIdx.x; e < KMAX * kCols; e += kThreads) {
      const int64_t row = e / kCols, col = col0 + e % kCols;
      tile[e] = (row < K && col < V) ? p[off4(st, c.n, c.hv, row, col)] : 0.f;
    }
  }
  __syncthreads();
  const int my = threadIdx.x / L;
#pragma unroll
  for (int i = 0; i < KPT; ++i) dst[i] = st.p ? tile[row_of<KPT>(c.gl, i) * kCols + my] : 0.f;
  __syncthreads();  // the tile is reused by the caller's next load or store
}

template <int KMAX, int KPT>
__device__ __forceinline__ void store_state_slice(const View& st, const BlockCoords& c, int64_t K, int64_t V,
                                                  float* tile, const float (&src)[KPT]) {
  if (!st.p) return;  // uniform over the block
  constexpr int L = KMAX / KPT, kCols = kThreads / L;
  const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kCols;
  __syncthreads();  // earlier users of the tile are done
  const int my = threadIdx.x / L;
#pragma unroll
  for (int i = 0; i < KPT; ++i) tile[row_of<KPT>(c.gl, i) * kCols + my] = src[i];
  __syncthreads();
  float* p = static_cast<float*>(st.p);
  for (int e = threadIdx.x; e < KMAX * kCols; e += kThreads) {
    const int64_t row = e / kCols, col = col0 + e % kCols;
    if (row < K && col < V) p[off4(st, c.n, c.hv, row, col)] = tile[e];
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
