// KDA chunked backward stage B1 ("state backward"), transposed and pipelined (session 9; the default
// since run 9.3, chunked_kda_launch_impl.cuh). Same outputs as the session-6 kernel it replaced
// (kda_state_backward_kernel): dh per chunk (fp32, dL/dh_{c+1}),
// dv_new (fp32), dh0. Per (sequence, value head, slice of BV = 8 WARPS value columns), over the
// chunks in reverse, with dh = dL/dh_{c+1} (dht for the last chunk) and per key channel d:
//   dv_new = kd dh + (scale P)^T do,                 kd = k o exp(G_{L-1} - G)
//   dh_c   = diag(exp(G_{L-1})) dh + qg^T do - w^T dv_new,   qg = scale q o exp(G)
// (q, k L2-normalized rows when asked; P from stage 1, packed in A: kda_packed_P_row).
//
// Design (the forward's kda_state_transposed_kernel, chunked_kda_state_transposed.cuh, applied to
// the backward; the old kernel spent ~34 us per chunk, 2.2 ms at B4 T4096 H16 K = V = 128):
// - Transposed: warp wp holds a 16 x K/2 slice of dh^T in mma accumulators (value columns
//   [16 (wp % NG), +16), key channels [K/2 (wp / NG), +K/2), NG = WARPS / 2), so the products take
//   dh^T and dv_new^T straight from registers (accumulator tiles -> A fragments) instead of dh and
//   dv_new making round trips through shared memory. Per chunk, per warp:
//     (1) p = dh^T kd^T over the warp's channel half        A = dh^T (registers), B = kd rows
//     (2) p += do^T (scale P) over half of P's 16 x 16 blocks   A = do^T (ldmatrix.trans),
//         B = P (fp32 in shared memory, read as float2 pairs, masked, scaled, rounded to T)
//     (3) dh^T = dh^T diag(exp(G_{L-1})) + do^T qg          B = qg rows (ldmatrix.trans)
//     swap: dv_new^T = own p + the partner warp's p (the other channel half), via shared memory
//     (4) dh^T -= dv_new^T w                                 A = -dv_new^T (registers), B = w rows
//   (2)'s ten nonzero blocks (is, jp <= is) are split 5 + 5 between the two warps of a column group:
//   channel half 0 takes row blocks is = 0, 3, half 1 takes is = 1, 2.
// - qg and kd of chunk c - 1 are formed during chunk c, after its second barrier, off the dh chain:
//   each thread copies (cp.async) exactly the raw q and k pieces it later scales in place (so no
//   barrier separates the copy from the scaling: its own wait_group suffices), with G's rows of
//   chunk c - 1 in its registers (loaded after chunk c's first barrier) and G_{L-1} of chunk c - 1
//   in shared memory (written before chunk c's second barrier). w, the do slice and P's rows of
//   chunk c - 1 arrive by cp.async during chunk c too (two stages).
// - Two barriers per chunk (the old kernel had seven): (A) chunk c's tiles, qg, kd and gate are in
//   place and every warp is done with chunk c + 1's buffers; (B) the partial sums p are written.
// - Single-fragment products by default (kSplit = false, as the forward's default and fla): dh^T in
//   (1), scale P in (2) and dv_new^T in (4) enter rounded to T once; dh stays in fp32 accumulators,
//   so the rounding does not compound over chunks. kSplit = true gives those three operands hi + lo
//   fragments (an extra mma each). qg and kd are always rounded to T once (their lo parts would
//   need two more tiles per stage).
#pragma once

#include "chunked_kda_gate_rows.cuh"         // KdaRowPieces, G's rows and gate slots
#include "chunked_kda_state_slice.cuh"       // KdaStateSlice: the warp's dh^T tiles
#include "chunked_kda_state_transposed.cuh"  // kda_rows_async
#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"   // kL2NormEps, chunk_row0
#include "chunked_tiles.cuh"  // key_rows_vectorizable, view_rows_async

namespace flashgrad::cuda_detail::delta_rule {

template <typename T, int KMAX, int WARPS>
struct KdaStateBackwardTSmem {
  static constexpr int C = kChunkSize, THREADS = 32 * WARPS, BV = 8 * WARPS;
  // Row pitches +8 elements: the 8 rows of an ldmatrix (and the 8 rows of P's float2 reads) start
  // in different banks; rows stay 16-byte aligned.
  static constexpr int LDK = KMAX + 8, LDD = BV + 8, LDP = C + 8;
  static constexpr int64_t kTileBytes = sizeof(T) * C * LDK;
  static constexpr int64_t kDoutBytes = sizeof(T) * C * LDD;
  static constexpr int64_t kPBytes = sizeof(float) * C * LDP;
  static constexpr int64_t kStageBytes = 3 * kTileBytes + kDoutBytes + kPBytes;  // w, qg, kd, do, P^T
  static constexpr int64_t kSwapBytes = KdaHalfSums<THREADS>::kBytes;  // 32 partial sums per thread
  static constexpr int64_t kGateBytes = KdaGateSlots<KMAX>::kBytes;
  static_assert(kTileBytes % 16 == 0 && kDoutBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned tiles");
  static constexpr int64_t bytes() { return 2 * kStageBytes + kSwapBytes + kGateBytes; }

  // Stage s (= the chunk's parity in this stage's order) by address arithmetic: w(s) [C][LDK] w
  // rows; qg(s), kd(s) [C][LDK] raw q, k rows until scaled in place; dout(s) [C][LDD] the slice's
  // columns of do; PT(s) [C][LDP] fp32, row j = A's row j (P_ij at column i for i >= j). Rows
  // past the chunk are zero-filled.
  unsigned char* raw;
  KdaHalfSums<THREADS> swap;  // the two channel halves' partial sums
  KdaGateSlots<KMAX> gate;  // stage s: G_{L-1} and exp(G_{L-1}) of the chunk in stage s
  __device__ explicit KdaStateBackwardTSmem(unsigned char* r) : raw(r) {
    swap.at = reinterpret_cast<float4*>(raw + 2 * kStageBytes);
    gate.at = reinterpret_cast<float*>(raw + 2 * kStageBytes + kSwapBytes);
  }
  __device__ T* w(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes); }
  __device__ T* qg(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + kTileBytes); }
  __device__ T* kd(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + 2 * kTileBytes); }
  __device__ T* dout(int s) const { return reinterpret_cast<T*>(raw + s * kStageBytes + 3 * kTileBytes); }
  __device__ float* PT(int s) const {
    return reinterpret_cast<float*>(raw + s * kStageBytes + 3 * kTileBytes + kDoutBytes);
  }
};

template <typename T, int KMAX, int WARPS = 8, bool kSplit = false>
__global__ void __launch_bounds__(32 * WARPS, 1) kda_state_backward_transposed_kernel(ChunkedArgs a) {
  using S = KdaStateBackwardTSmem<T, KMAX, WARPS>;
  constexpr int C = kChunkSize, THREADS = S::THREADS, BV = S::BV, LDK = S::LDK, LDD = S::LDD, LDP = S::LDP;
  using Slice = KdaStateSlice<KMAX, WARPS>;
  constexpr int NG = Slice::NG, KH = Slice::KH, NK = Slice::NK;
  // qg / kd formation: thread tid owns chunk row rp.fr and the 8-channel pieces at channels rp.ch(q)
  // (kLanes threads per row, kPer channels each; KdaRowPieces, the forward's layout).
  using RowPieces = KdaRowPieces<KMAX, THREADS>;
  constexpr int kLanes = RowPieces::kLanes, kPer = RowPieces::kPer;
  static_assert(WARPS % 2 == 0 && KH % 32 == 0, "two channel halves of whole pairs of 16-channel steps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S sm(smem_raw);
  // The block's (sequence n, value head hv, its key head, value columns [col0, +BV)); warp tid / 32's
  // value columns [vc0, +16) and key channels [kc0, +K/2), accumulator element e of a tile at value
  // column sl.vcol(e) and tile column sl.tcol(e) (a key channel of dh^T, a chunk row of dv_new^T).
  const Slice sl(a);
  const int64_t n = sl.n, hv = sl.hv, head = sl.head, col0 = sl.col0;
  const int tid = threadIdx.x, grp = sl.grp, tig = sl.tig, vc0 = sl.vc0, kh = sl.kh, kc0 = sl.kc0;
  const RowPieces rp(tid);
  const int fr = rp.fr;

  float dhT[NK][4];
  sl.load(dhT, a.dht);

  const T* w = static_cast<const T*>(a.w);
  const bool q_vec = key_rows_vectorizable(a.q), k_vec = key_rows_vectorizable(a.k);
  View dslice = a.dout;  // the slice's columns of do (still vectorizable: col0 is a multiple of 64)
  dslice.p = static_cast<T*>(a.dout.p) + col0 * a.dout.s3;
  const bool d_vec = key_rows_vectorizable(dslice);
  const int64_t c_first = a.seq_first_chunk[n], c_last = a.seq_first_chunk[n + 1] - 1;

  // This thread's raw pieces of row fr of x (q or k) into dst (16-byte copies when the view allows,
  // else element loads); zeros past the chunk.
  auto own_key_pieces = [&](const View& x, bool vec, const ChunkInfo& ci, T* dst) {
    const bool ok = fr < ci.len;
    const T* src = static_cast<const T*>(x.p) + off3(x, ci.b, ci.t0 + (ok ? fr : 0), head);
    T* d = dst + fr * LDK;
    if (vec) {
#pragma unroll
      for (int q = 0; q < kPer / 8; ++q) mma::cp_async16(d + rp.ch(q), src + rp.ch(q), ok);
    } else {  // (rare: strided views) one branch for all pieces, not unrolled
#pragma unroll 1
      for (int q = 0; q < kPer / 8; ++q)
        for (int i = 0; i < 8; ++i) d[rp.ch(q) + i] = ok ? src[(rp.ch(q) + i) * x.s3] : from_f<T>(0.f);
    }
  };
  // Chunk ci's copies into stage s (one cp.async group): w, do, P^T by the block; q, k by owner.
  constexpr int PW = KMAX / 8, PD = BV / 8, PP = C / 4;  // 16-byte pieces per row of w, do, P^T
  auto issue = [&](const ChunkInfo& ci, int s) {
    const int64_t row0 = chunk_row0(ci, a.T);
    kda_rows_async<PW, THREADS>(w + ((row0 + tid / PW) * a.HV + hv) * a.K + 8 * (tid % PW),
                                (THREADS / PW) * a.HV * a.K, ci.len, sm.w(s), LDK);
    if (d_vec)
      kda_rows_async<PD, THREADS>(static_cast<const T*>(dslice.p) + off3(dslice, ci.b, ci.t0 + tid / PD, hv) +
                                      8 * (tid % PD),
                                  (THREADS / PD) * dslice.s1, ci.len, sm.dout(s), LDD);
    else
      view_rows_async<T, THREADS>(dslice, ci, hv, BV, false, sm.dout(s), LDD);
    kda_rows_async<PP, THREADS>(a.A + ((row0 + tid / PP) * a.HV + hv) * C + 4 * (tid % PP),
                                (THREADS / PP) * a.HV * C, ci.len, sm.PT(s), LDP);
    own_key_pieces(a.q, q_vec, ci, sm.qg(s));
    own_key_pieces(a.k, k_vec, ci, sm.kd(s));
    mma::cp_async_commit();
  };
  // qg = scale rstd_q q o exp(G) and kd = rstd_k k o exp(G_{L-1} - G), this thread's pieces of
  // stage s, in place over the raw rows it copied (its own wait_group makes them visible to it).
  // The exponents are <= 0 (G_{L-1} <= G_r for r <= L - 1; the difference is formed first, so its
  // rounding is relative to it, not to G); rows past the chunk are zero (rstd = 0).
  auto form = [&](int len, int s, const float (&g)[kPer]) {
    mma::cp_async_wait<0>();
    T* qrow = sm.qg(s) + fr * LDK;
    T* krow = sm.kd(s) + fr * LDK;
    uint32_t qw[kPer / 2], kw[kPer / 2];
#pragma unroll
    for (int q = 0; q < kPer / 8; ++q) {
      const uint4 vq = *reinterpret_cast<const uint4*>(qrow + rp.ch(q));
      const uint4 vk = *reinterpret_cast<const uint4*>(krow + rp.ch(q));
      qw[4 * q] = vq.x, qw[4 * q + 1] = vq.y, qw[4 * q + 2] = vq.z, qw[4 * q + 3] = vq.w;
      kw[4 * q] = vk.x, kw[4 * q + 1] = vk.y, kw[4 * q + 2] = vk.z, kw[4 * q + 3] = vk.w;
    }
    float rq = 1.f, rk = 1.f;
    if (a.l2norm) {
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < kPer / 2; ++i) {
        float x0, x1;
        mma::unpack_floats<T>(qw[i], x0, x1);
        sq += x0 * x0 + x1 * x1;
        mma::unpack_floats<T>(kw[i], x0, x1);
        sk += x0 * x0 + x1 * x1;
      }
#pragma unroll
      for (int o = 1; o < kLanes; o <<= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
      }
      rq = 1.0f / sqrtf(sq + kL2NormEps);
      rk = 1.0f / sqrtf(sk + kL2NormEps);
    }
    if (fr >= len) rq = 0.f, rk = 0.f;
    rq *= a.scale;
    const float* gls = sm.gate.last(s);
#pragma unroll
    for (int q = 0; q < kPer / 8; ++q) {
      const float4 l0 = *reinterpret_cast<const float4*>(gls + rp.ch(q));
      const float4 l1 = *reinterpret_cast<const float4*>(gls + rp.ch(q) + 4);
      const float glv[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
      uint32_t qo[4], ko[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * q + 2 * j;
        float x0, x1, y0, y1;
        mma::unpack_floats<T>(qw[4 * q + j], x0, x1);
        mma::unpack_floats<T>(kw[4 * q + j], y0, y1);
        qo[j] = mma::pack_floats<T>(x0 * rq * exp2_ftz(g[i] * kLog2e), x1 * rq * exp2_ftz(g[i + 1] * kLog2e));
        ko[j] = mma::pack_floats<T>(y0 * rk * exp2_ftz((glv[2 * j] - g[i]) * kLog2e),
                                    y1 * rk * exp2_ftz((glv[2 * j + 1] - g[i + 1]) * kLog2e));
      }
      *reinterpret_cast<uint4*>(qrow + rp.ch(q)) = make_uint4(qo[0], qo[1], qo[2], qo[3]);
      *reinterpret_cast<uint4*>(krow + rp.ch(q)) = make_uint4(ko[0], ko[1], ko[2], ko[3]);
    }
  };

  // The chunk plan's entries are read two chunks ahead (ci_next: the one the next issue copies).
  ChunkInfo ci_cur{}, ci_next{};
  float g[kPer];  // G rows of the next chunk to form (this thread's part)
  if (c_last >= c_first) {
    ci_cur = a.chunks[c_last];
    issue(ci_cur, 0);
    kda_load_gate_rows(a, hv, rp, ci_cur, g);
    sm.gate.put(kda_load_gate_last<KMAX>(a, hv, tid, ci_cur), 0, tid);
    if (c_last - 1 >= c_first) ci_next = a.chunks[c_last - 1];
    __syncthreads();  // stage 0's G_{L-1}
    form(ci_cur.len, 0, g);
  }
  for (int64_t c = c_last; c >= c_first; --c) {
    const int s = static_cast<int>((c_last - c) & 1);
    const ChunkInfo ci = ci_cur;
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    const bool has_next = c - 1 >= c_first;  // the next chunk in this stage's (reverse) order
    const ChunkInfo cn = ci_next;

    // (A) chunk c's tiles, qg, kd and gate are in place; every warp is done with chunk c + 1's buffers.
    mma::cp_async_wait<0>();
    __syncthreads();
    float4 gl_next = make_float4(0.f, 0.f, 0.f, 0.f);
    if (has_next) {
      issue(cn, s ^ 1);
      kda_load_gate_rows(a, hv, rp, cn, g);
      gl_next = kda_load_gate_last<KMAX>(a, hv, tid, cn);
      ci_cur = cn;
      if (c - 2 >= c_first) ci_next = a.chunks[c - 2];
    }
    const T* ws = sm.w(s);
    const T* qgs = sm.qg(s);
    const T* kds = sm.kd(s);
    const T* ds = sm.dout(s);
    const float* pt = sm.PT(s);

    // dL/dh_{c+1} to the intermediates (fp32 [chunks, HV, K, V]; the slice's columns, this warp's
    // channels).
    sl.store_chunk(dhT, a.dh, (c * a.HV + hv) * a.K * a.V, a.V);

    // (1) p = dh^T kd^T over this warp's channel half; p[j8]: chunk rows [8 j8, +8).
    float p[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < KH / 16; ++ks) {
      uint32_t ah[4], al[4];
      mma::acc_to_a<T, kSplit>(dhT[2 * ks], dhT[2 * ks + 1], ah, al);
      // Tiles (rows 16 jp + [0, 8), channels kc0 + 16 ks + [0, 8)), (same rows, + 8 channels), (rows
      // + 8, channels), (rows + 8, channels + 8): B fragments of chunk-row tiles 2 jp, 2 jp + 1.
      uint32_t b[4][4];
#pragma unroll
      for (int jp = 0; jp < 4; ++jp)
        mma::ldmatrix_x4<false>(b[jp], kds + (16 * jp + sl.nb_r) * LDK + kc0 + 16 * ks + sl.nb_c);
      mma::mma_tiles<T, 4>(p, ah, b);
      if constexpr (kSplit) mma::mma_tiles<T, 4>(p, al, b);
    }

    // dh^T diag(exp(G_{L-1})) (this warp's channels).
    sl.scale_channels(dhT, sm.gate.decay(s));

    // Per 16-row block is of the chunk (the k dimension of both): A = do^T's columns [16 is, +16)
    // (ldmatrix.trans of do's rows); (2) p += do^T (scale P) over P's rows is (this warp's half of
    // the blocks; column tiles nt <= 2 is + 1 only), (3) dh^T += do^T qg.
    const bool p_rows_0_3 = kh == 0;  // channel half 0: P's row blocks 0 and 3; half 1: 1 and 2
#pragma unroll
    for (int is = 0; is < C / 16; ++is) {
      uint32_t ad[4];
      mma::ldmatrix_x4<true>(ad, ds + (16 * is + sl.nb_r) * LDD + vc0 + sl.nb_c);
      if ((is == 0 || is == 3) == p_rows_0_3) {
        // B fragment of column tile nt: (k = i = 16 is + 2 tig + {0, 1} (+ 8), n = j = 8 nt + grp) =
        // P_ij = P^T's row j, columns i, i + 1: one float2; P_ij for j <= i < L only.
        const int i0 = 16 * is + 2 * tig;
#pragma unroll
        for (int nt = 0; nt < 2 * is + 2; ++nt) {
          const int j = 8 * nt + grp;
          const float2 x0 = *reinterpret_cast<const float2*>(pt + j * LDP + i0);
          const float2 x1 = *reinterpret_cast<const float2*>(pt + j * LDP + i0 + 8);
          auto in = [&](int i) { return j <= i && i < L; };
          uint32_t bh[2], bl[2];
          mma::round_pair<T, kSplit>(in(i0) ? a.scale * x0.x : 0.f, in(i0 + 1) ? a.scale * x0.y : 0.f, bh[0], bl[0]);
          mma::round_pair<T, kSplit>(in(i0 + 8) ? a.scale * x1.x : 0.f, in(i0 + 9) ? a.scale * x1.y : 0.f, bh[1],
                                     bl[1]);
          mma::mma16816<T>(p[nt], ad, bh);
          if constexpr (kSplit) mma::mma16816<T>(p[nt], ad, bl);
        }
      }
#pragma unroll
      for (int np = 0; np < NK / 2; np += 2) {
        // .trans tiles (rows 16 is + [0, 8), channels kc0 + 16 (np + q) + [0, 8)), (rows + 8, ..),
        // (rows, channels + 8), (rows + 8, channels + 8): B fragments of dh^T tiles 2 (np + q) + {0, 1}.
        uint32_t b[2][4];
        sl.ldmatrix_trans_pair(b, qgs, LDK, is, np);
        mma::mma_tiles<T, 2>(dhT, ad, b, 2 * np);
      }
    }

    sm.swap.put(p, tid);
    // The next chunk's G_{L-1} and decay (its gate slot was last read before chunk c + 1's (B)).
    if (has_next) sm.gate.put(gl_next, s ^ 1, tid);
    // (B) both channel halves' partial sums are written.
    __syncthreads();

    // dv_new^T = own + partner's partial sums: the same sum in both warps of a column group (fp32
    // addition commutes). Each warp stores half of the chunk rows (j8 / 4 == kh), rows < L (rows past
    // L are zero: kd's rows and P's columns vanish there).
    {
      const int partner = tid ^ (32 * NG);  // same lane, the other channel half
      const int64_t vn_row = a.HV * a.V;
      // Element e of tile j8: chunk row 8 j8 + 2 tig (+ 1 for odd e), column vc0 + grp (+ 8 for e >= 2).
      float* dvn = a.dv_new + ((row0 + 2 * tig) * a.HV + hv) * a.V + col0 + vc0 + grp;
#pragma unroll
      for (int j8 = 0; j8 < 8; ++j8) {
        const float4 x = sm.swap.get(j8, partner);
        p[j8][0] += x.x, p[j8][1] += x.y, p[j8][2] += x.z, p[j8][3] += x.w;
        if (j8 / 4 == kh) {
          float* q = dvn + 8 * j8 * vn_row;
          const int j = 8 * j8 + 2 * tig;
          if (j < L) q[0] = p[j8][0], q[8] = p[j8][2];
          if (j + 1 < L) q[vn_row] = p[j8][1], q[vn_row + 8] = p[j8][3];
        }
      }
    }

    // (4) dh^T -= dv_new^T w (this warp's channels): A = -dv_new^T.
    const float fneg[2] = {-1.f, -1.f};
#pragma unroll
    for (int js = 0; js < C / 16; ++js) {
      uint32_t ah[4], al[4];
      mma::acc_to_a<T, kSplit>(p[2 * js], p[2 * js + 1], fneg, fneg, ah, al);
#pragma unroll
      for (int np = 0; np < NK / 2; np += 2) {
        uint32_t b[2][4];
        sl.ldmatrix_trans_pair(b, ws, LDK, js, np);
        mma::mma_tiles<T, 2>(dhT, ah, b, 2 * np);
        if constexpr (kSplit) mma::mma_tiles<T, 2>(dhT, al, b, 2 * np);
      }
    }

    // The next chunk's qg and kd (its copies, issued after (A), have had the products to land).
    if (has_next) form(cn.len, s ^ 1, g);
  }

  if (a.dh0.p) sl.store(dhT, a.dh0);
}

}  // namespace flashgrad::cuda_detail::delta_rule
