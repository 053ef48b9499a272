// Chunked stage 1 ("prepare"), blocks of 128 threads (4 warps) looping over (chunk, value head) items:
//   G = cumsum(g) inside the chunk,  M_ij = beta_i exp(G_i - G_j) k_i.k_j (i > j),
//   A = (I + M)^{-1},  w = A (beta exp(G) k),  u = A (beta v).
// Writes G, A (fp32), w (T) and u (fp32) to the intermediates (layouts: chunked_stages.h).
//
// The raw rows of k and v (exact in T) are copied to shared memory with cp.async one item ahead
// (each block loops over (chunk, value head) items); with the in-kernel L2 norm, k's row rstd is
// applied in fp32 outside the products:
//   k k^T:  M_ij = beta_i exp(G_i - G_j) rstd_i rstd_j (k_raw k_raw^T)_ij  (exact T products,
//           fp32 accumulation: A fragments and B fragments by ldmatrix from k's rows);
//   w = (A diag(s)) k_raw with s_j = beta_j exp(G_j) rstd_j,  u = (A diag(beta)) v_raw:
//           the fp32 factor A diag(.) is the A operand, split into hi = T(x) and lo = T(x - hi) in
//           registers (two mmas), the raw rows the B operand (ldmatrix.trans), so w and u keep
//           ~fp32 accuracy before w's storage in T.
// Warp wp owns rows [16 wp, 16 wp + 16) of M; of w and u it owns row blocks wp / 2 and 3 - wp / 2
// on half the columns (balanced_rows_times_tile: A is block lower triangular, so rows by warp
// would give the last warp four times the first's products). The inverse is blocked: the four
// 16 x 16 diagonal blocks by forward substitution (one thread per column, in registers), then
// block rows I = 1..3: A_IJ = -A_II sum_{J <= m < I} M_Im A_mJ, m over 16-blocks (fp32, CUDA
// cores, 4-column strips with fixed trip counts; invert_unit_lower64_blocked).
#pragma once

#include "chunked_mma.cuh"
#include "chunked_mma_ldmatrix.cuh"
#include "chunked_rows.cuh"
#include "chunked_tiles.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Shared memory of stage 1: M, A and the per-row arrays once, k's and v's raw rows twice (the
// next (chunk, value head) item's copies land while this one computes); v's tile is V + 8 wide
// (V is a runtime size), so K = V = 128 takes 106 KiB (two blocks per SM).
template <typename T, int KMAX>
struct PrepareSmem {
  static constexpr int C = kChunkSize, LDK = KMAX + 8, LDM = C + 4;
  static constexpr int64_t kKeyBytes = sizeof(T) * C * LDK, kMatBytes = sizeof(float) * C * LDM;
  static constexpr int64_t kFixedBytes = 2 * kMatBytes + sizeof(float) * (16 * 48 + 4 * C);
  static_assert(kFixedBytes % 16 == 0 && kKeyBytes % 16 == 0, "16-byte aligned tiles");
  float* M;        // [C][LDM] StrictLower(beta_i exp(G_i - G_j) k_i.k_j)
  float* A;        // [C][LDM] (I + M)^{-1}
  float* tmp;      // [16][48]: sum_m M_Im A_mJ of one block row
  float* G;        // [C]
  float* beta;     // [C] (0 past L)
  float* rstd;     // [C] k's row rstd (1 without the L2 norm)
  float* ws;       // [C] beta_j exp(G_j) rstd_j: w's column factor of A
  unsigned char* stages;  // 2 x ([C][LDK] k rows, raw; [C][V + 8] v rows, raw)
  int64_t stage_bytes;

  __host__ __device__ static int ldv(int64_t V) { return static_cast<int>(V) + 8; }
  __host__ __device__ static int64_t stage_size(int64_t V) { return kKeyBytes + sizeof(T) * C * ldv(V); }
  __host__ __device__ static int64_t bytes(int64_t V) { return kFixedBytes + 2 * stage_size(V); }
  __device__ PrepareSmem(unsigned char* raw, int64_t V) {
    M = reinterpret_cast<float*>(raw);
    A = M + C * LDM;
    tmp = A + C * LDM;
    G = tmp + 16 * 48;
    beta = G + C;
    rstd = beta + C;
    ws = rstd + C;
    stages = raw + kFixedBytes;
    stage_bytes = stage_size(V);
  }
  __device__ T* k(int s) const { return reinterpret_cast<T*>(stages + s * stage_bytes); }
  __device__ T* v(int s) const { return reinterpret_cast<T*>(stages + s * stage_bytes + kKeyBytes); }
};

// Inclusive prefix sum of G[0..63] in place (threads 0..63; the whole block calls it).
__device__ __forceinline__ void chunk_cumsum64(float* G) {
  const int tid = threadIdx.x, lane = tid & 31;
  float x = tid < kChunkSize ? G[tid] : 0.f;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (tid < kChunkSize) G[tid] = x;
  __syncthreads();
  if (tid >= 32 && tid < kChunkSize) G[tid] += G[31];  // warp 1 adds warp 0's total
  __syncthreads();
}

// As = (I + M)^{-1} for the 64 x 64 strictly lower M (both fp32 in shared memory, ld LDM).
template <int LDM>
__device__ __forceinline__ void invert_unit_lower64(const float* M, float* As, float* tmp) {
  const int tid = threadIdx.x;
  for (int e = tid; e < 64 * 64; e += kChunkThreads) As[(e / 64) * LDM + e % 64] = 0.f;
  __syncthreads();
  // Diagonal blocks: thread (block bI, column jj) runs forward substitution down its column:
  // A_jj = 1, A_ij = -sum_{m=j}^{i-1} M_im A_mj for i in the block.
  if (tid < 64) {
    const int j = tid, end = (j / 16) * 16 + 16;
    As[j * LDM + j] = 1.f;
    for (int i = j + 1; i < end; ++i) {
      float s = 0.f;
      for (int m = j; m < i; ++m) s += M[i * LDM + m] * As[m * LDM + j];
      As[i * LDM + j] = -s;
    }
  }
  __syncthreads();
  // Block rows I = 1..3, rows [16 I, 16 I + 16), columns c < 16 I:
  //   tmp[r][c] = sum_{m = c}^{16 I - 1} M[16 I + r][m] A[m][c]   (A[m][c] = 0 for m < c)
  //   A[16 I + r][c] = -sum_{m' = 0}^{r} A[16 I + r][16 I + m'] tmp[m'][c]
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, width = 16 * I;
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = c; m < r0; ++m) s += M[(r0 + r) * LDM + m] * As[m * LDM + c];
      tmp[r * 48 + c] = s;
    }
    __syncthreads();
    for (int e = tid; e < 16 * width; e += kChunkThreads) {
      const int r = e / width, c = e % width;
      float s = 0.f;
      for (int m = 0; m <= r; ++m) s += As[(r0 + r) * LDM + r0 + m] * tmp[m * 48 + c];
      As[(r0 + r) * LDM + c] = -s;
    }
    __syncthreads();
  }
}


// acc += x * v, component-wise.
__device__ __forceinline__ void fma4(float x, const float4& v, float4& acc) {
  acc.x = fmaf(x, v.x, acc.x);
  acc.y = fmaf(x, v.y, acc.y);
  acc.z = fmaf(x, v.z, acc.z);
  acc.w = fmaf(x, v.w, acc.w);
}

// As = (I + M)^{-1} for the 64 x 64 strictly lower M (fp32 in shared memory, pitch LDM % 4 == 0;
// 128 threads), the same blocked algorithm as invert_unit_lower64 with fewer shared-memory
// accesses: the diagonal blocks' forward substitution keeps its column in registers (thread
// (block bI, column jj) of the first 64), and the block rows are computed in strips of 4 columns
// (one float4 load of A or tmp per 4 FMAs).
template <int LDM>
__device__ __forceinline__ void invert_unit_lower64_blocked(const float* M, float* As, float* tmp) {
  static_assert(LDM % 4 == 0, "float4 rows");
  const int tid = threadIdx.x;
  if (tid < 64) {
    // Column jj of diagonal block bI: x_i = [i == jj] - sum_{m < i} M_im x_m (x_m = 0 for m < jj).
    const int r0 = 16 * (tid / 16), jj = tid % 16;
    const float* Mb = M + r0 * LDM + r0;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) acc = fmaf(Mb[i * LDM + m], x[m], acc);
      x[i] = i == jj ? 1.f : -acc;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) As[(r0 + i) * LDM + r0 + jj] = x[i];
  } else {
    // Blocks above the diagonal are zero (w and u read whole 16 x 16 blocks; A is stored whole).
    for (int e = tid - 64; e < 6 * 64; e += 64) {  // 6 blocks x 64 float4
      const int blk = e / 64, q = e % 64;          // blk: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
      const int I = blk < 3 ? 0 : (blk < 5 ? 1 : 2), J = blk < 3 ? blk + 1 : (blk < 5 ? blk - 1 : 3);
      *reinterpret_cast<float4*>(&As[(16 * I + q / 4) * LDM + 16 * J + 4 * (q % 4)]) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __syncthreads();
  // Block rows I = 1..3, rows [16 I, 16 I + 16), columns c < 16 I, in strips (r, c4 .. c4 + 3):
  //   tmp[r][c] = sum_{m = 0}^{16 I - 1} M[16 I + r][m] A[m][c]
  //   A[16 I + r][c] = -sum_{m' = 0}^{15} A[16 I + r][16 I + m'] tmp[m'][c]
  // Both sums run over fixed ranges (the terms outside the triangles are exact zeros: A[m][c] = 0
  // for m < c, in the zeroed blocks above the diagonal and the diagonal blocks' upper halves;
  // A_II[r][m'] = 0 for m' > r), so the loops unroll fully and each strip's loads issue ahead of
  // its FMAs (the variable-length loops this replaces waited on every shared load: ncu, session 6).
  // Two accumulator sets halve each strip's FMA chain.
#pragma unroll
  for (int I = 1; I < 4; ++I) {
    const int r0 = 16 * I, strips = r0 / 4;  // strips per row
    for (int e = tid; e < 16 * strips; e += kChunkThreads) {
      const int r = e / strips, c4 = 4 * (e % strips);
      const float* mrow = M + (r0 + r) * LDM;
      float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;
#pragma unroll
      for (int m = 0; m < r0; m += 4) {
        const float4 mv = *reinterpret_cast<const float4*>(mrow + m);
        fma4(mv.x, *reinterpret_cast<const float4*>(&As[(m + 0) * LDM + c4]), acc0);
        fma4(mv.y, *reinterpret_cast<const float4*>(&As[(m + 1) * LDM + c4]), acc1);
        fma4(mv.z, *reinterpret_cast<const float4*>(&As[(m + 2) * LDM + c4]), acc0);
        fma4(mv.w, *reinterpret_cast<const float4*>(&As[(m + 3) * LDM + c4]), acc1);
      }
      *reinterpret_cast<float4*>(&tmp[r * 48 + c4]) =
          make_float4(acc0.x + acc1.x, acc0.y + acc1.y, acc0.z + acc1.z, acc0.w + acc1.w);
    }
    __syncthreads();
    for (int e = tid; e < 16 * strips; e += kChunkThreads) {
      const int r = e / strips, c4 = 4 * (e % strips);
      const float* arow = As + (r0 + r) * LDM + r0;
      float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;
#pragma unroll
      for (int m = 0; m < 16; m += 4) {
        const float4 av = *reinterpret_cast<const float4*>(arow + m);
        fma4(av.x, *reinterpret_cast<const float4*>(&tmp[(m + 0) * 48 + c4]), acc0);
        fma4(av.y, *reinterpret_cast<const float4*>(&tmp[(m + 1) * 48 + c4]), acc1);
        fma4(av.z, *reinterpret_cast<const float4*>(&tmp[(m + 2) * 48 + c4]), acc0);
        fma4(av.w, *reinterpret_cast<const float4*>(&tmp[(m + 3) * 48 + c4]), acc1);
      }
      *reinterpret_cast<float4*>(&As[(r0 + r) * LDM + c4]) =
          make_float4(-(acc0.x + acc1.x), -(acc0.y + acc1.y), -(acc0.z + acc1.z), -(acc0.w + acc1.w));
    }
    __syncthreads();
  }
}

// The row blocks of A diag(s) Y, balanced over the four warps. A is lower triangular by 16-blocks,
// so row block rb takes rb + 1 block products: warp wp takes row blocks p and 3 - p (p = wp / 2,
// 5 products either way) on its half of the output columns, [col0, col0 + 8 NT) (with one block of
// rows per warp, the warp of row block 3 did four times the products of row block 0's, and every
// warp waited for it at the next barrier: ncu, session 6).
//   acc[i][nt] += (A diag(s))[rows 16 rb_i + [0, 16), columns 16 kb + [0, 16)] Y[16 kb + [0, 16),
//                 col0 + 8 nt + [0, 8)]   for kb <= rb_i,  rb_0 = p, rb_1 = 3 - p,
// A fp32 row-major in shared memory (pitch ldx), split hi + lo in registers (two mmas); Y the
// row-major T tile by ldmatrix.trans, each kb's fragments loaded once for both row blocks.
template <typename T, int NT>  // NT % 2 == 0
__device__ __forceinline__ void balanced_rows_times_tile(float (&acc)[2][NT][4], const float* X, int ldx,
                                                         const float* s, int p, const T* Y, int ldy, int col0) {
  const int lane = threadIdx.x & 31, g = mma::grp(), t = mma::tig();
  const int rbs[2] = {p, 3 - p};
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    if (kb > 3 - p) break;  // p is warp-uniform
    uint32_t b[NT / 2][4];
    const T* yrow = Y + (16 * kb + 8 * ((lane >> 3) & 1) + (lane & 7)) * ldy + col0 + 8 * (lane >> 4);
#pragma unroll
    for (int q = 0; q < NT / 2; ++q) mma::ldmatrix_x4<true>(b[q], yrow + 16 * q);
    const int c0 = 16 * kb + 2 * t;
    const float f0[2] = {s[c0], s[c0 + 1]}, f1[2] = {s[c0 + 8], s[c0 + 9]};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (kb > rbs[i]) continue;
      const float* x0 = X + (16 * rbs[i] + g) * ldx + c0;
      const float* x1 = x0 + 8 * ldx;
      const float c_lo[4] = {x0[0], x0[1], x1[0], x1[1]};  // accumulator-shaped: rows g, g + 8; cols c0, c0 + 1
      const float c_hi[4] = {x0[8], x0[9], x1[8], x1[9]};  // cols c0 + 8, c0 + 9
      uint32_t ah[4], al[4];
      mma::acc_to_a_split<T>(c_lo, c_hi, f0, f1, ah, al);
      mma::mma_tiles<T, NT / 2>(acc[i], ah, b);
      mma::mma_tiles<T, NT / 2>(acc[i], al, b);
    }
  }
}

// Each block loops over (chunk, value head) items blockIdx.x, + gridDim.x, ... (item = chunk * HV +
// value head), copying the next item's k and v rows (cp.async) and g, beta (registers) while it
// computes the current one: a block otherwise spends most of its time waiting on its loads.
template <typename T, int KMAX>
__global__ void __launch_bounds__(kChunkThreads) chunk_prepare_kernel(ChunkedArgs a) {
  using S = PrepareSmem<T, KMAX>;
  constexpr int C = kChunkSize, LDK = S::LDK, LDM = S::LDM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const S sm(smem_raw, a.V);
  const int tid = threadIdx.x, lane = tid & 31, wp = tid / 32;
  const int ldv = S::ldv(a.V);
  const int64_t items = a.num_chunks * a.HV;
  const bool k_vec = key_rows_vectorizable(a.k), v_vec = key_rows_vectorizable(a.v);

  // Issues item's copies into stage s (one cp.async group); returns g and beta of row tid (zeros
  // past the chunk's length) through gn, bn.
  auto issue = [&](int64_t item, int s, float& gn, float& bn) {
    const int64_t hv = item % a.HV, head = hv / (a.HV / a.H);
    const ChunkInfo ci = a.chunks[item / a.HV];
    view_rows_async<T, kChunkThreads>(a.k, ci, head, KMAX, k_vec, sm.k(s), LDK);
    view_rows_async<T, kChunkThreads>(a.v, ci, hv, static_cast<int>(a.V), v_vec, sm.v(s), ldv);
    mma::cp_async_commit();
    gn = 0.f;
    bn = 0.f;
    if (tid < ci.len) {
      const int64_t tok = ci.t0 + tid;
      bn = load_elem<T>(a.beta, off3(a.beta, ci.b, tok, hv));
      if (a.g.p) gn = load_elem<T>(a.g, off3(a.g, ci.b, tok, hv));
    }
  };

  float gn = 0.f, bn = 0.f;
  int s = 0;
  if (blockIdx.x < items) issue(blockIdx.x, 0, gn, bn);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x, s ^= 1) {
    const int64_t hv = item % a.HV;
    const ChunkInfo ci = a.chunks[item / a.HV];
    const int L = ci.len;
    const int64_t row0 = chunk_row0(ci, a.T);
    const T* ks = sm.k(s);
    const T* vs = sm.v(s);

    // This item's g, beta and rows in place (the previous item is done: barrier at the loop's
    // end); then the next item's copies into the other stage.
    if (tid < C) {
      sm.G[tid] = gn;
      sm.beta[tid] = bn;
    }
    mma::cp_async_wait<0>();
    __syncthreads();
    if (item + gridDim.x < items) issue(item + gridDim.x, s ^ 1, gn, bn);

    chunk_cumsum64(sm.G);  // G = cumsum(g); ends with a barrier
    if (a.G && tid < L) a.G[(row0 + tid) * a.HV + hv] = sm.G[tid];
    {
      const float rstd = tile_row_rstd<T, KMAX, kChunkThreads>(ks, LDK, a.l2norm);
      constexpr int kLanes = kChunkThreads / C;
      if (tid % kLanes == 0) {
        const int j = tid / kLanes;
        sm.rstd[j] = rstd;
        sm.ws[j] = sm.beta[j] * expf(sm.G[j]) * rstd;  // beta = 0 past L
      }
    }
    __syncthreads();

    // M = StrictLower(beta_i exp(G_i - G_j) rstd_i rstd_j (k k^T)_ij). Column tiles right of the
    // warp's diagonal block are zero (and never read by the inverse).
    {
      float acc[8][4] = {};
      const T* arow = ks + (16 * wp + (lane & 15)) * LDK + 8 * (lane >> 4);
      const T* brow = ks + (8 * (lane >> 4) + (lane & 7)) * LDK + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < KMAX / 16; ++kk) {
        uint32_t af[4];
        mma::ldmatrix_x4<false>(af, arow + 16 * kk);  // tiles (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8)
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np > wp) continue;
          uint32_t b[4];  // k rows 16 np + [0, 16) as B^T: chunk-column tiles 2 np, 2 np + 1
          mma::ldmatrix_x4<false>(b, brow + 16 * np * LDK + 16 * kk);
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma::mma16816<T>(acc[2 * np], af, b0);
          mma::mma16816<T>(acc[2 * np + 1], af, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * wp + mma::acc_row(e), j = 8 * nt + mma::acc_col(e);
          // exp(G_i - G_j) with i > j only: bounded by 1 for g <= 0.
          sm.M[i * LDM + j] =
              i > j && i < L ? sm.beta[i] * expf(sm.G[i] - sm.G[j]) * sm.rstd[i] * sm.rstd[j] * acc[nt][e] : 0.f;
        }
    }
    __syncthreads();
    invert_unit_lower64_blocked<LDM>(sm.M, sm.A, sm.tmp);  // ends with a barrier

    // A to the intermediates (rows < L; columns >= L are 0 there).
    if (a.A)
      for (int e = tid; e < L * C; e += kChunkThreads)
        a.A[(row0 + e / C) * a.HV * C + hv * C + e % C] = sm.A[(e / C) * LDM + e % C];

    // w = (A diag(ws)) k and u = (A diag(beta)) v (balanced_rows_times_tile): warp wp writes row
    // blocks p, 3 - p (rows 16 rb + g, + 8) of its column half h.
    const int p = wp >> 1, h = wp & 1, g = mma::grp(), c2 = 2 * mma::tig();
    {
      constexpr int NT = KMAX / 16;  // 8-column tiles per half of K
      float acc[2][NT][4] = {};
      balanced_rows_times_tile<T, NT>(acc, sm.A, LDM, sm.ws, p, ks, LDK, h * (KMAX / 2));
      T* w = static_cast<T*>(a.w);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = 16 * (i == 0 ? p : 3 - p) + g + 8 * half;
            if (row < L) {
              const uint32_t pair = mma::pack_floats<T>(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
              *reinterpret_cast<uint32_t*>(w + ((row0 + row) * a.HV + hv) * a.K + h * (KMAX / 2) + 8 * nt + c2) = pair;
            }
          }
    }
    // u, 64 value columns at a time (32 per column half).
    for (int c0 = 0; c0 < a.V; c0 += 64) {
      float acc[2][4][4] = {};
      balanced_rows_times_tile<T, 4>(acc, sm.A, LDM, sm.beta, p, vs, ldv, c0 + 32 * h);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = 16 * (i == 0 ? p : 3 - p) + g + 8 * half;
            if (row < L)
              *reinterpret_cast<float2*>(a.u + ((row0 + row) * a.HV + hv) * a.V + c0 + 32 * h + 8 * nt + c2) =
                  make_float2(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
          }
    }
    __syncthreads();  // M, A, G, beta and stage s are free for the next items
  }
}

}  // namespace flashgrad::cuda_detail::delta_rule
