// Loading one chunk's rows of q, k or v into the chunked stages (128-thread blocks), with the
// in-kernel L2 norm of q and k. Rows past the chunk's length L read as zeros, so padded rows of
// a short last chunk contribute nothing to any product.
#pragma once

#include "chunked_stages.h"
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

constexpr int kChunkThreads = 128;

// For e = threadIdx.x + 128 i < count: store(e, load(e)). Loads kBatch values into registers before
// storing any of them. Why: the stores go to shared memory through generic pointers, which the
// compiler cannot prove distinct from the global loads, so a plain loop keeps load -> store order
// and exposes one global-memory latency per element per thread. Measured on the H200 (B8 T4096
// H16 K=V=128): B2 (the only user now) 24.2 -> 22.8 ms; the same change in stages 2 and B1
// (their w loads) made them slower (3.8 -> 6.4 ms, 12.8 -> 18.3 ms) and was reverted.
template <int kBatch = 8, typename Load, typename Store>
__device__ __forceinline__ void batched_copy(int count, Load&& load, Store&& store) {
  for (int base = threadIdx.x; base < count; base += kBatch * kChunkThreads) {
    float buf[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = base + i * kChunkThreads;
      buf[i] = e < count ? load(e) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = base + i * kChunkThreads;
      if (e < count) store(e, buf[i]);
    }
  }
}

// For every row r < 64 of the chunk and column d < KMAX (K == KMAX), calls emit(r, d, x) with
// x = q/k[b, t0 + r, head, d] as float, divided by sqrt(sum_d x^2 + eps) when `l2norm`.
// Thread layout: KMAX / 8 consecutive lanes share a row, each loading 8 consecutive elements;
// the row's sum of squares is a shuffle sum inside those lanes (group_sum), so every lane of a
// warp takes part even for padded rows.
template <typename T, int KMAX, typename Emit>
__device__ __forceinline__ void for_each_key_row(const View& x, const ChunkInfo& ci, int64_t head, bool l2norm,
                                                 Emit&& emit) {
  constexpr int kLanesPerRow = KMAX / 8;
  constexpr int kRowsPerPass = kChunkThreads / kLanesPerRow;
  const int lr = threadIdx.x / kLanesPerRow, seg = threadIdx.x % kLanesPerRow;
  for (int r0 = 0; r0 < kChunkSize; r0 += kRowsPerPass) {
    const int r = r0 + lr;
    const bool ok = r < ci.len;
    const int64_t base = ok ? off3(x, ci.b, ci.t0 + r, head) + seg * 8 : 0;
    float e[8];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      e[i] = ok ? load_elem<T>(x, base + i) : 0.f;
      ss += e[i] * e[i];
    }
    const float rstd = l2norm ? 1.0f / sqrtf(group_sum<kLanesPerRow>(ss) + kL2NormEps) : 1.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) emit(r, seg * 8 + i, e[i] * rstd);
  }
}

// For every row r < 64 and column col < width of a [B, T, HV, V] tensor slice starting at
// column col0: emit(r, col, x) with x = 0 for rows past the chunk. Consecutive threads take
// consecutive columns (coalesced).
template <typename T, typename Emit>
__device__ __forceinline__ void for_each_value_row(const View& x, const ChunkInfo& ci, int64_t hv, int64_t col0,
                                                   int width, Emit&& emit) {
  for (int e = threadIdx.x; e < kChunkSize * width; e += kChunkThreads) {
    const int r = e / width, col = e % width;
    const float val = r < ci.len ? load_elem<T>(x, off4(x, ci.b, ci.t0 + r, hv, col0 + col)) : 0.f;
    emit(r, col, val);
  }
}

// Chunk c's plan entry. Batches without cu_seqlens (a.uniform_chunks = n chunks per sequence): computed
// as make_chunk_plan lays them out: batch row (and sequence) b = c / n, chunk i = c % n of it starting
// at token 64 i, length min(64, T - 64 i) (32-bit: the plan sets n only below 2^31 chunks). Else read
// from the plan. Reading it is a global round trip before a block's first address (ncu, run 20.1:
// 4.2 % of B2a's and 1.6 % of B2b's stall samples on that first use); computing it costs ~80
// instructions per warp of 64-bit index math. Measured (run 20.2): part of B2b's prologue gain, B2a on
// wgmma unchanged, the mma.sync B2a 6 % slower (so it reads the plan); the serial chains read their
// entries a chunk or two ahead instead.
__device__ __forceinline__ ChunkInfo chunk_info(const ChunkedArgs& a, int64_t c) {
  if (a.uniform_chunks > 0) {
    const uint32_t n = static_cast<uint32_t>(a.uniform_chunks), cc = static_cast<uint32_t>(c);
    const uint32_t b = cc / n, i = cc - b * n;
    const int64_t t0 = static_cast<int64_t>(i) * kChunkSize, rest = a.T - t0;
    return ChunkInfo{b, t0, b, static_cast<int32_t>(rest < kChunkSize ? rest : kChunkSize), 0};
  }
  return a.chunks[c];
}

// Token row (the intermediates' first index) of local row 0 of a chunk.
__device__ __forceinline__ int64_t chunk_row0(const ChunkInfo& ci, int64_t T) { return ci.b * T + ci.t0; }

}  // namespace flashgrad::cuda_detail::delta_rule
