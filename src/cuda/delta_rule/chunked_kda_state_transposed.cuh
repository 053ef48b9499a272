// KDA chunked stage 2 ("state"), transposed and pipelined (session 8; stage 2 since run 9.1, H200
// 2026-11-30: 1.289 -> 0.330 ms per call at B4 T4096 H16 K=V=128 against the session-6 kernel, which
// was then removed; chunked_kda_launch_impl.cuh).
// Outputs: h_c (fp32, [chunks, HV, K, V]) for every chunk, v_new (T), the final state.
// Per (sequence, value head, slice of BV = 8 WARPS value columns), over the chunks:
//   store h_c;  v_new = u - w h_c;
//   h_{c+1} = diag(exp(G_{L-1})) h_c + (k o exp(G_{L-1} - G))^T v_new     (per key channel d)
//
// Why this shape (the old kernel spent ~20 us per chunk step on one sequential chain: H200, B4 T4096
// H16 K = V = 128, 1.31 ms over 64 chunks):
// - Transposed, as the GDN stage (chunked_state.cuh): each warp holds a 16-column slice of h^T
//   in mma accumulators, so both products take their state / v_new operand straight from its own
//   registers (accumulator tiles -> A fragments) instead of h and v_new making a round trip through
//   shared memory between warps every chunk. Two warps share 16 value columns (key channels
//   [0, K/2) and [K/2, K): KSPLIT = 2 of the GDN stage), so each warp's serial chain per chunk is
//   K/2 x 64 + 64 x K/2 mma columns; their halves of h^T w^T meet through shared memory (`swap`).
//   Warp wp: value columns [16 (wp % NG), +16), key channels [K/2 (wp / NG), +K/2), NG = WARPS / 2.
// - Everything that does not depend on h is off the chain: w, k (raw rows) and u of chunk c + 1 are
//   copied by cp.async during chunk c (two stages), G's rows of chunk c + 1 are loaded into
//   registers during chunk c, G_{L-1} and exp(G_{L-1}) of chunk c + 1 are written to shared memory
//   at the end of chunk c; kd = k o exp(G_{L-1} - G) (with k's L2 norm) is formed by the whole block
//   between the two products (it only needs chunk c's inputs), no longer before the first one.
// - Two barriers per chunk (the old kernel had four, and a global-load latency before each of its
//   k / G batches): (A) chunk c's tiles and gate have landed and chunk c - 1 is done with every
//   buffer; (B) the partial sums of h^T w^T and kd are written.
// - Single-fragment products by default (SPLIT = 0, as the GDN forward's fused kernel and fla): h^T
//   in h^T w^T, v_new^T and kd in the update enter as one T fragment each (round to nearest); h stays
//   in fp32 accumulators, so the rounding does not compound over chunks. SPLIT's bits (kKdaSplit*)
//   give any of the three operands hi + lo fragments instead (an extra mma each):
//   FLASHGRAD_CHUNKED_KDA_STATE=split runs all three so (its results equal the session-6 kernel's,
//   all hi + lo, to three digits in the emulation).
#pragma once

#include "chunked_kda_gate_rows.cuh"    // KdaRowPieces, G's rows and gate slots, exp2_ftz
#include "chunked_kda_state_slice.cuh"  // KdaStateSlice: the warp's h^T tiles
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"  // kL2NormEps
#include "chunked_tiles.cuh"  // key_tile_async, key_rows_vectorizable

#ifndef FLASHGRAD_KDA_STATE_SPLIT_DEFAULT  // host emulation: -D... to check other operand splits
#define FLASHGRAD_KDA_STATE_SPLIT_DEFAULT 0
#endif

namespace flashgrad::cuda_detail::delta_rule {

// Operands of the transposed KDA state kernel given as hi + lo fragments (bits of SPLIT).
constexpr int kKdaSplitH = 1;     // h^T in v_new = u - w h
constexpr int kKdaSplitVnew = 2;  // v_new^T in the update
constexpr int kKdaSplitKd = 4;    // kd in the update

template <typename T, int KMAX, int WARPS, int SPLIT>
struct KdaStateTSmem {
  static constexpr int C = kChunkSize, THREADS = 32 * WARPS, BV = 8 * WARPS;
  // Row pitches +8 (16-bit) / +4 (fp32) elements: the 8 rows of an ldmatrix (or the 4 x 8 pattern
  // of u's reads) start in different banks; rows stay 16-byte aligned.
  static constexpr int LDK = KMAX + 8, LDU = BV + 4;
  static constexpr int64_t kTileBytes = sizeof(T) * C * LDK;
  static constexpr int64_t kStageBytes = 2 * kTileBytes + sizeof(float) * C * LDU;  // w, k, u
  static constexpr int kKdTiles = (SPLIT & kKdaSplitKd) ? 2 : 1;
  static constexpr int64_t kSwapBytes = KdaHalfSums<THREADS>::kBytes;  // 32 partial sums per thread
  static constexpr int64_t kGateBytes = KdaGateSlots<KMAX>::kBytes;
  static_assert(kTileBytes % 16 == 0 && kStageBytes % 16 == 0, "16-byte aligned tiles");
  static constexpr int64_t bytes() { return 2 * kStageBytes + kKdTiles * kTileBytes + kSwapBytes + kGateBytes; }

  // Stage s (= chunk parity) by address arithmetic (an array of pointers indexed by the runtime
  // parity would live in local memory): w(s) [C][LDK] w rows; k(s) [C][LDK] k rows, raw;
  // u(s) [C][LDU] u rows, the slice's BV columns. Rows past the chunk are zero-filled.
  unsigned char* raw;
  T* kd;         // [C][LDK] k o exp(G_{L-1} - G) * rstd_k of the current chunk (hi part)
  T* kd_lo;      // [C][LDK] its lo part (kKdaSplitKd)
  KdaHalfSums<THREADS> swap;  // the two channel halves' partial sums
  KdaGateSlots<KMAX> gate;  // stage s: G_{L-1} and exp(G_{L-1}) of the chunk in stage s
  __device__ explicit KdaStateTSmem(unsigned char* r) : raw(r) {
    kd = reinterpret_cast<T*>(raw + 2 * kStageBytes);
    kd_lo = kd + C * LDK;
    swap.at = reinterpret_cast<float4*>(raw + 2 * kStageBytes + kKdTiles * kTileBytes);
    gate.at = reinterpret_cast<float*>(raw + 2 * kStageBytes + kKdTiles * kTileBytes + kSwapBytes);
  }
  __device__ T* w(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* k(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kTileBytes); }
  __device__ float* u(int s) const { return reinterpret_cast<float*>(raw + s * kStageBytes + 2 * kTileBytes); }
};

// Rows r < 64 of a tile by cp.async, P 16-byte pieces per row (E elements, 16 / sizeof(E) per
// piece): thread tid copies piece tid % P of rows tid / P + (THREADS / P) m. `src` is its first
// piece (row tid / P), `src_step` the distance in elements of THREADS / P rows; rows >= len are
// zero-filled (nothing read). Fixed trip count and one pointer bump per copy, instead of
// intermediate_tile_async's per-copy index division and 64-bit row products.
template <int P, int THREADS, typename E>
__device__ __forceinline__ void kda_rows_async(const E* src, int64_t src_step, int len, E* dst, int ld) {
  constexpr int kRows = THREADS / P, kPasses = kChunkSize / kRows, kPer = 16 / static_cast<int>(sizeof(E));
  static_assert(THREADS % P == 0 && kChunkSize % kRows == 0, "whole passes");
  const int r0 = static_cast<int>(threadIdx.x) / P;
  E* d = dst + r0 * ld + kPer * (static_cast<int>(threadIdx.x) % P);
#pragma unroll
  for (int m = 0; m < kPasses; ++m) {
    const bool ok = r0 + kRows * m < len;
    mma::cp_async16(d + kRows * m * ld, ok ? src + m * src_step : src, ok);
  }
}

// The A fragment of two adjacent 16 x 8 accumulator tiles as one T fragment (round to nearest),
// or hi + lo (mma::acc_to_a_split) when kSplit.
template <typename T, bool kSplit>
__device__ __forceinline__ void kda_acc_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&hi)[4],
                                             uint32_t (&lo)[4]) {
  if constexpr (kSplit) {
    mma::acc_to_a_split<T>(c0, c1, hi, lo);
  } else {
    hi[0] = mma::pack_floats<T>(c0[0], c0[1]);
    hi[1] = mma::pack_floats<T>(c0[2], c0[3]);
    hi[2] = mma::pack_floats<T>(c1[0], c1[1]);
    hi[3] = mma::pack_floats<T>(c1[2], c1[3]);
  }
}

template <typename T, int KMAX, int WARPS = 8, int SPLIT = FLASHGRAD_KDA_STATE_SPLIT_DEFAULT>
__global__ void __launch_bounds__(32 * WARPS, 1) kda_state_transposed_kernel(ChunkedArgs a) {
  using S = KdaStateTSmem<T, KMAX, WARPS, SPLIT>;
  constexpr int C = kChunkSize, THREADS = S::THREADS, BV = S::BV, LDK = S::LDK, LDU = S::LDU;
  using Slice = KdaStateSlice<KMAX, WARPS>;
  constexpr int NG = Slice::NG, KH = Slice::KH, NK = Slice::NK;
  constexpr bool kSplitH = SPLIT & kKdaSplitH, kSplitV = SPLIT & kKdaSplitVnew, kSplitKd = SPLIT & kKdaSplitKd;
  // kd formation: thread tid takes chunk row rp.fr and the 8-channel pieces at channels rp.ch(q)
  // (kLanes threads per row, kPer channels each; KdaRowPieces).
  using RowPieces = KdaRowPieces<KMAX, THREADS>;
  constexpr int kLanes = RowPieces::kLanes, kPer = RowPieces::kPer;
  static_assert(WARPS % 2 == 0 && KH % 16 == 0, "two channel halves of whole 16-channel steps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  // The block's (sequence n, value head hv, its key head, value columns [col0, +BV)); warp tid / 32's
  // value columns [vc0, +16) and key channels [kc0, +K/2), accumulator element e of a tile at value
  // column sl.vcol(e) and tile column sl.tcol(e) (a key channel of h^T, a chunk row of v_new^T).
  const Slice sl(a);
  const int64_t n = sl.n, hv = sl.hv, head = sl.head, col0 = sl.col0;
  const int tid = threadIdx.x, grp = sl.grp, tig = sl.tig, vc0 = sl.vc0, kh = sl.kh, kc0 = sl.kc0;
  const RowPieces rp(tid);
  const int fr = rp.fr;

  float hT[NK][4];
  sl.load(hT, a.h0);

  const T* w = static_cast<const T*>(a.w);
  T* v_new = static_cast<T*>(a.v_new);
  const bool k_vec = key_rows_vectorizable(a.k);
  const int64_t c_begin = a.seq_first_chunk[n], c_end = a.seq_first_chunk[n + 1];
  const int64_t vn_row = a.HV * a.V;  // row stride of v_new

  // Chunk ci's w, k, u tiles into stage s (one cp.async group). Row r of w / u at row0 + r of
  // [rows, HV, K / V]; of k at (b, t0 + r, head) of the view (element copies when its rows are not
  // 16-byte pieces: key_tile_async's synchronous path).
  constexpr int PK = KMAX / 8, PU = BV / 4;  // 16-byte pieces per row of w / k and of u
  const int rk = tid / PK, ru = tid / PU;    // this thread's first row of w / k and of u
  const int64_t wk_step = (THREADS / PK) * a.HV * a.K, u_step = (THREADS / PU) * a.HV * a.V;
  auto issue_tiles = [&](const ChunkInfo& ci, int s) {
    const int64_t row0 = chunk_row0(ci, a.T);
    kda_rows_async<PK, THREADS>(w + ((row0 + rk) * a.HV + hv) * a.K + 8 * (tid % PK), wk_step, ci.len, sm.w(s), LDK);
    if (k_vec)
      kda_rows_async<PK, THREADS>(static_cast<const T*>(a.k.p) + off3(a.k, ci.b, ci.t0 + rk, head) + 8 * (tid % PK),
                                  (THREADS / PK) * a.k.s1, ci.len, sm.k(s), LDK);
    else
      key_tile_async<T, KMAX, THREADS>(a.k, ci, head, false, sm.k(s), LDK);
    kda_rows_async<PU, THREADS>(a.u + ((row0 + ru) * a.HV + hv) * a.V + col0 + 4 * (tid % PU), u_step, ci.len,
                                sm.u(s), LDU);
    mma::cp_async_commit();
  };

  // The chunk plan's entries are read two chunks ahead (ci_next: the one the next prefetch copies).
  ChunkInfo ci_cur{}, ci_next{};
  float g[kPer];  // G rows of the current chunk (this thread's part), loaded one chunk ahead
  if (c_begin < c_end) {
    ci_cur = a.chunks[c_begin];
    issue_tiles(ci_cur, 0);
    kda_load_gate_rows(a, hv, rp, ci_cur, g);
    sm.gate.put(kda_load_gate_last<KMAX>(a, hv, tid, ci_cur), 0, tid);
    if (c_begin + 1 < c_end) ci_next = a.chunks[c_begin + 1];
  }
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int s = static_cast<int>((c - c_begin) & 1);
    const ChunkInfo ci = ci_cur;
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    const bool has_next = c + 1 < c_end;
    const ChunkInfo cn = ci_next;

    // (A) chunk c's tiles and gate are in place; every warp is done with chunk c - 1's buffers.
    mma::cp_async_wait<0>();
    __syncthreads();
    float4 gl_next = make_float4(0.f, 0.f, 0.f, 0.f);
    if (has_next) {
      issue_tiles(cn, s ^ 1);
      gl_next = kda_load_gate_last<KMAX>(a, hv, tid, cn);
      ci_cur = cn;
      if (c + 2 < c_end) ci_next = a.chunks[c + 2];
    }

    // Partial v_new^T = h^T w^T over this warp's channel half: p[j8] covers chunk rows [8 j8, +8).
    float p[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < KH / 16; ++ks) {
      uint32_t ah[4], al[4];
      kda_acc_to_a<T, kSplitH>(hT[2 * ks], hT[2 * ks + 1], ah, al);
      // Tiles (rows 16 jp + [0, 8), channels kc0 + 16 ks + [0, 8)), (same rows, + 8 channels), (rows
      // + 8, channels), (rows + 8, channels + 8): B fragments of chunk-row tiles 2 jp, 2 jp + 1.
      uint32_t b[4][4];
#pragma unroll
      for (int jp = 0; jp < 4; ++jp)
        mma::ldmatrix_x4<false>(b[jp], sm.w(s) + (16 * jp + sl.nb_r) * LDK + kc0 + 16 * ks + sl.nb_c);
      mma::mma_tiles<T, 4>(p, ah, b);
      if constexpr (kSplitH) mma::mma_tiles<T, 4>(p, al, b);
    }

    // h_c to the intermediates (fp32 [chunks, HV, K, V]; the slice's columns, this warp's channels).
    sl.store_chunk(hT, a.h, (c * a.HV + hv) * a.K * a.V, a.V);

    // kd = k o exp(G_{L-1} - G) * rstd_k, chunk row fr, this thread's channels rp.ch(q) + [0, 8):
    // raw k from shared memory (16-byte loads), G from registers; exp(G_{L-1, d} - G_rd) <= 1
    // (r <= L - 1) as 2^((G_{L-1} - G) log2 e): the difference first, so that its rounding is
    // relative to it, not to G (which reaches -1e3 under strong decay); rows past L are zero (rstd = 0).
    {
      uint32_t kw[kPer / 2];
      const T* krow = sm.k(s) + fr * LDK;
#pragma unroll
      for (int q = 0; q < kPer / 8; ++q) {
        const uint4 v = *reinterpret_cast<const uint4*>(krow + rp.ch(q));
        kw[4 * q] = v.x, kw[4 * q + 1] = v.y, kw[4 * q + 2] = v.z, kw[4 * q + 3] = v.w;
      }
      float rstd = 1.f;
      if (a.l2norm) {
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < kPer / 2; ++i) {
          float x0, x1;
          mma::unpack_floats<T>(kw[i], x0, x1);
          ss += x0 * x0 + x1 * x1;
        }
#pragma unroll
        for (int o = 1; o < kLanes; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        rstd = 1.0f / sqrtf(ss + kL2NormEps);
      }
      if (fr >= L) rstd = 0.f;  // rows past the chunk: kd = 0 (their k rows are zero-filled too)
      const float* gls = sm.gate.last(s);
      T* kdrow = sm.kd + fr * LDK;
#pragma unroll
      for (int q = 0; q < kPer / 8; ++q) {
        const float4 l0 = *reinterpret_cast<const float4*>(gls + rp.ch(q));
        const float4 l1 = *reinterpret_cast<const float4*>(gls + rp.ch(q) + 4);
        const float glv[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float x0, x1;
          mma::unpack_floats<T>(kw[4 * q + j], x0, x1);
          const int i = 8 * q + 2 * j;
          x0 *= rstd * exp2_ftz((glv[2 * j] - g[i]) * kLog2e);
          x1 *= rstd * exp2_ftz((glv[2 * j + 1] - g[i + 1]) * kLog2e);
          if constexpr (kSplitKd)
            mma::split_pair<T>(x0, x1, hi[j], lo[j]);
          else
            hi[j] = mma::pack_floats<T>(x0, x1);
        }
        *reinterpret_cast<uint4*>(kdrow + rp.ch(q)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        if constexpr (kSplitKd)
          *reinterpret_cast<uint4*>(sm.kd_lo + fr * LDK + rp.ch(q)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      }
    }
    // The next chunk's G rows (g is free now), in flight until the next chunk's kd.
    if (has_next) kda_load_gate_rows(a, hv, rp, cn, g);

    sm.swap.put(p, tid);
    // (B) both channel halves' partial sums and kd are written.
    __syncthreads();

    // v_new^T = u^T - (own + partner's partial sums): the same sum in both warps of a column group
    // (fp32 addition commutes). Each warp stores half of the chunk rows (j8 / 4 == kh), rows < L.
    {
      const int partner = tid ^ (32 * NG);  // same lane, the other channel half
      const float* us = sm.u(s);
      // Element e of tile j8: chunk row 8 j8 + 2 tig (+ 1 for odd e), column vc0 + grp (+ 8 for e >= 2).
      T* vn = v_new + ((row0 + 2 * tig) * a.HV + hv) * a.V + col0 + vc0 + grp;
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const float4 x = sm.swap.get(j8, partner);
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) p[j8][e] = us[(8 * j8 + sl.tcol(e)) * LDU + sl.vcol(e)] - (p[j8][e] + xs[e]);
        if (j8 / 4 == kh) {
          T* q = vn + 8 * j8 * vn_row;
          const int j = 8 * j8 + 2 * tig;
          if (j < L) q[0] = from_f<T>(p[j8][0]), q[8] = from_f<T>(p[j8][2]);
          if (j + 1 < L) q[vn_row] = from_f<T>(p[j8][1]), q[vn_row + 8] = from_f<T>(p[j8][3]);
        }
      }
    }

    // h^T = h^T diag(exp(G_{L-1})) + v_new^T kd (this warp's channels).
    sl.scale_channels(hT, sm.gate.decay(s));
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t ah[4], al[4];
      kda_acc_to_a<T, kSplitV>(p[2 * js], p[2 * js + 1], ah, al);
#pragma unroll
      for (int np = 0; np < NK / 2; np += 2) {
        // Tiles (.trans): (chunk rows 16 js + [0, 8), channels kc0 + 16 np + [0, 8)), (rows + 8, same
        // channels), (rows, channels + 8), (rows + 8, channels + 8): B fragments of h^T tiles
        // 2 np, 2 np + 1; two such at once.
        uint32_t b[2][4];
        sl.ldmatrix_trans_pair(b, sm.kd, LDK, js, np);
        mma::mma_tiles<T, 2>(hT, ah, b, 2 * np);
        if constexpr (kSplitV) mma::mma_tiles<T, 2>(hT, al, b, 2 * np);
        if constexpr (kSplitKd) {
          uint32_t bl[2][4];
          sl.ldmatrix_trans_pair(bl, sm.kd_lo, LDK, js, np);
          mma::mma_tiles<T, 2>(hT, ah, bl, 2 * np);
        }
      }
    }
    // The next chunk's G_{L-1} and decay (its stage's gate slot was last read in chunk c - 1).
    if (has_next) sm.gate.put(gl_next, s ^ 1, tid);
  }

  if (a.ht.p) sl.store(hT, a.ht);
}

}  // namespace flashgrad::cuda_detail::delta_rule
