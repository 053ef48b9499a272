// L2 prefetch of the next chunk's rows for the sequence-serial KDA B1 (chunked_kda_state_backward.cuh,
// kPrefetch: off by default; the session-6 stage 2 used it until run 9.1 replaced that kernel). Its
// chunk-local inputs (q, k, G, w, do, P) do not depend on the carried state, but each step loads
// them after the previous step's state work, so every batch of those loads waits a full HBM latency
// (the working set, e.g. G at 134 MB for B4 T4096 H16 K = 128, is larger than the 50 MB L2). A step
// now first asks L2 for the next step's rows (prefetch.global.L2: no registers, no shared memory,
// nothing waits on it), so the next step's loads hit L2. Under the host emulation a no-op.
#pragma once

#include "chunked_stages.h"
#include "chunked_state.cuh"  // kStateCols
#include "recurrent_common.cuh"

namespace flashgrad::cuda_detail::delta_rule {

__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Prefetches rows r < len at base + r * stride (elements of E), `bytes` bytes from each row start:
// one prefetch per 128-byte line (plus one for a row start that is not line-aligned), spread over
// the block's NTHR threads.
template <int NTHR, typename E>
__device__ __forceinline__ void prefetch_rows_l2(const E* base, int64_t stride, int len, int bytes) {
  const int lines = bytes / 128 + 1;
  for (int i = threadIdx.x; i < len * lines; i += NTHR) {
    const int r = i / lines, l = i % lines;
    const char* row = reinterpret_cast<const char*>(base + r * stride);
    prefetch_l2(row + (l * 128 < bytes ? l * 128 : bytes - 1));
  }
}

// The chunk-local rows B1 reads for chunk `ci` (value head hv, key head `head`, value columns
// [col0, col0 + kStateCols)): q, k, G, w, do and P.
template <typename T, int NTHR>
__device__ __forceinline__ void prefetch_kda_serial_rows(const ChunkedArgs& a, const ChunkInfo& ci, int64_t hv,
                                                         int64_t head, int64_t col0) {
  const int L = ci.len;
  const int64_t row0 = chunk_row0(ci, a.T), K = a.K;
  const int kbytes = static_cast<int>(K * sizeof(T));
  prefetch_rows_l2<NTHR>(static_cast<const T*>(a.k.p) + off3(a.k, ci.b, ci.t0, head), a.k.s1, L, kbytes);
  prefetch_rows_l2<NTHR>(a.G + (row0 * a.HV + hv) * K, a.HV * K, L, static_cast<int>(K * 4));
  prefetch_rows_l2<NTHR>(static_cast<const T*>(a.w) + (row0 * a.HV + hv) * K, a.HV * K, L, kbytes);
  prefetch_rows_l2<NTHR>(static_cast<const T*>(a.q.p) + off3(a.q, ci.b, ci.t0, head), a.q.s1, L, kbytes);
  prefetch_rows_l2<NTHR>(static_cast<const T*>(a.dout.p) + off4(a.dout, ci.b, ci.t0, hv, col0), a.dout.s1, L,
                         static_cast<int>(kStateCols * sizeof(T)));
  prefetch_rows_l2<NTHR>(a.A + row0 * a.HV * kChunkSize + hv * kChunkSize, a.HV * kChunkSize, L, kChunkSize * 4);
}

}  // namespace flashgrad::cuda_detail::delta_rule
