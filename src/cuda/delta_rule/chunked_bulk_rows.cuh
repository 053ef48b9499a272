// One bulk copy per thread and chunk (cp.async.bulk, completion counted in bytes on an mbarrier) in
// place of the serial chains' 16 - 20 cp.async per thread: the fused forward chain's opt-in tile loads
// (chunk_state_kernel's kBulk, FLASHGRAD_CHUNKED_FWD_BULK=1; docs/perf/delta_rule.md, sessions 22 - 23).
// Why: run 22.4 found the next chunk's copies and their address arithmetic ~45 % of the instructions
// every warp runs before the chain's row-scale barrier.
//
// Protocol (probed by tests/cpp/delta_rule_wgmma_probe_kernels.cuh, probe_bulk_rows): one mbarrier
// (count 1) per stage. Chunk c goes into stage s; thread 0 arrives on stage s's barrier announcing the
// chunk's bytes (L rows of every tile); every thread owning a row r < L issues that row's copy; a thread
// owning a row r >= L stores zeros into it with ordinary stores (the chain relies on zero rows past L),
// seen by the others after the block barrier that follows the wait. Readers wait on the stage's phase
// parity: the k-th use of a stage (k = chunk index from the sequence's first / 2) completes phase k,
// parity k & 1.
#pragma once

#include "chunked_stages.h"
#include "chunked_tiles.cuh"  // key_rows_vectorizable
#include "chunked_wgmma_primitives.cuh"

namespace flashgrad::cuda_detail::delta_rule {

// Whether the fused forward's tiles can come by bulk row copies (chunk_state_kernel's kBulk; the
// launcher's and the emulation's test): q and k rows 16-byte copyable, K one of the kernel's widths (a
// row is KMAX elements), w and u 16-byte aligned.
inline bool bulk_rows_possible(const ChunkedArgs& a) {
  return key_rows_vectorizable(a.k) && key_rows_vectorizable(a.q) && (a.K == 64 || a.K == 128) &&
         (reinterpret_cast<uintptr_t>(a.w) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.u) & 15) == 0;
}

// The row one thread copies in every chunk: row r of one tile (w, k, q rows of 16-bit T or u rows of
// fp32). Source byte address of chunk ci's row r = src + ci.b * per_batch + ci.t0 * per_token; its
// destination in stage s: dst + s * stage_bytes.
struct BulkRow {
  const unsigned char* src;  // row r at batch 0, token 0
  int64_t per_batch, per_token;
  unsigned char* dst;        // row r of the tile in stage 0 (shared memory)
  uint32_t bytes;            // the row's length: a multiple of 16, both ends 16-byte aligned
  int r;

  // Issues chunk ci's row into stage s (the stage at dst + s * stage_bytes), completing on `bar`.
  template <int64_t kStageBytes>
  __device__ __forceinline__ void issue(const ChunkInfo& ci, int s, uint32_t bar) const {
    namespace sm90 = ::flashgrad::cuda_attn::sm90;
    unsigned char* const d = dst + s * kStageBytes;
    // The stage's previous contents were read (ldmatrix) and partly written (zero rows) by ordinary
    // accesses before the block barrier this follows: order them before the async proxy's writes.
    sm90::fence_proxy_async_shared();
    if (r < ci.len) {
      sm90::bulk_load(static_cast<uint32_t>(__cvta_generic_to_shared(d)), src + ci.b * per_batch + ci.t0 * per_token,
                      bytes, bar);
    } else {
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      for (uint32_t b = 0; b < bytes; b += 16) *reinterpret_cast<uint4*>(d + b) = zero;
    }
  }
};

}  // namespace flashgrad::cuda_detail::delta_rule
