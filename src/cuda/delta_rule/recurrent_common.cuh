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
  float* dbeta_acc = nullptr;  // [B, T, HV] f32, zeroed
  float* dg_acc = nullptr;   // [B, T, HV] (GDN) or [B, T, HV, K] (KDA) f32, zeroed
  float* dg_const = nullptr;  // [N, HV] or [N, HV, K] f32, zeroed: added to every step of a sequence
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

// Raw 32-bit storage of one element of a View whose type is float or T (converted at use, so
// that a prefetched load is waited for only where its value is needed).
template <typename T>
__device__ __forceinline__ uint32_t load_raw(const View& x, int64_t off) {
  if (x.f32) return __float_as_uint(static_cast<const float*>(x.p)[off]);
  if constexpr (sizeof(T) == 2) return static_cast<uint32_t>(static_cast<const uint16_t*>(x.p)[off]);
  else return __float_as_uint(static_cast<const float*>(x.p)[off]);
}
template <typename T>
__device__ __forceinline__ float raw_to_f(bool f32, uint32_t bits) {
  if (f32 || sizeof(T) == 4) return __uint_as_float(bits);
  const uint16_t h = static_cast<uint16_t>(bits);
  T x;
  memcpy(&x, &h, 2);
  return to_f<T>(x);
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
};

// KPT consecutive elements starting at `off` (rows >= K are zero). `vec`: the run is 16-byte
// aligned and fully inside K (checked once on the host), so it moves as 16-byte loads.
template <typename E, int KPT>
__device__ __forceinline__ void load_run(const E* base, int64_t off, int64_t row0, int64_t K, bool vec,
                                         E (&dst)[KPT]) {
  static_assert((KPT * sizeof(E)) % 16 == 0, "runs are whole 16-byte vectors");
  if (vec) {
    if (row0 < K) {
      const uint4* src = reinterpret_cast<const uint4*>(base + off + row0);
#pragma unroll
      for (int c = 0; c < static_cast<int>(KPT * sizeof(E) / 16); ++c) reinterpret_cast<uint4*>(dst)[c] = src[c];
    } else {
#pragma unroll
      for (int c = 0; c < static_cast<int>(KPT * sizeof(E) / 16); ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int64_t row = row0 + i;
      if (row < K) {
        dst[i] = base[off + row];
      } else {
        const E zero{};
        dst[i] = zero;
      }
    }
  }
}

// q and k rows for this thread, optionally normalized over the full K (group reduction).
template <typename T, int L, int KPT>
__device__ __forceinline__ void qk_to_float(const T (&qr)[KPT], const T (&kr)[KPT], bool l2norm,
                                            float (&q)[KPT], float (&k)[KPT], float* q_rstd,
                                            float* k_rstd) {
  float sq = 0.f, sk = 0.f;
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    q[i] = to_f<T>(qr[i]);
    k[i] = to_f<T>(kr[i]);
    sq += q[i] * q[i];
    sk += k[i] * k[i];
  }
  float rq = 1.f, rk = 1.f;
  if (l2norm) {
    rq = 1.0f / sqrtf(group_sum<L>(sq) + kL2NormEps);
    rk = 1.0f / sqrtf(group_sum<L>(sk) + kL2NormEps);
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      q[i] *= rq;
      k[i] *= rk;
    }
  }
  if (q_rstd) *q_rstd = rq;
  if (k_rstd) *k_rstd = rk;
}

// Loads this thread's q, k rows and the gate/beta of absolute token `tok`.
template <typename T, int L, int KPT, Gate G>
__device__ __forceinline__ void load_qkgb(const RecurrentArgs& a, const BlockCoords& c, int64_t tok,
                                          StepLoad<T, KPT, G == Gate::per_channel>& s) {
  const int64_t row0 = row_of<KPT>(c.gl, 0);
  load_run<T, KPT>(static_cast<const T*>(a.q.p), off3(a.q, c.b, tok, c.h), row0, a.K, a.qk_vec, s.q);
  load_run<T, KPT>(static_cast<const T*>(a.k.p), off3(a.k, c.b, tok, c.h), row0, a.K, a.qk_vec, s.k);
  if constexpr (G == Gate::scalar) {
    s.g[0] = __uint_as_float(load_raw<T>(a.g, off3(a.g, c.b, tok, c.hv)));  // raw bits, see gate_value
  } else if constexpr (G == Gate::per_channel) {
    const int64_t go = off3(a.g, c.b, tok, c.hv);
    if (a.g.f32) {
      load_run<float, KPT>(static_cast<const float*>(a.g.p), go, row0, a.K, a.g_vec, s.g);
    } else {
#pragma unroll
      for (int i = 0; i < KPT; ++i) {
        const int64_t row = row0 + i;
        s.g[i] = row < a.K ? to_f<T>(static_cast<const T*>(a.g.p)[go + row]) : 0.f;
      }
    }
  } else {
    s.g[0] = 0.f;
  }
  s.beta = load_raw<T>(a.beta, off3(a.beta, c.b, tok, c.hv));
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
