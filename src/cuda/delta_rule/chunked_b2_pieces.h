// The split B2 (B2a, then B2b; chunked_grads_split.cuh) in pieces of chunks on two streams, so that B2b
// reads what B2a of the same chunks read and wrote while it is still in L2 (session 16; opt-in,
// FLASHGRAD_CHUNKED_B2_PIECES=n chunks per piece, read per call).
//
// Why: at B8 T4096 H16 K = V = 128 the two kernels move 3.30 GB (docs/perf/delta_rule_b2_wgmma_plan.md):
// B2b reads again q, k, do, v_new, dv_new (B2a's inputs) and dq_s, dk_s, dw (B2a's outputs), ~1.3 GB of
// its ~1.6, long after B2a touched them (each kernel walks all 8192 (chunk, value head) items; L2 is
// 50 MB). In pieces of n chunks (n HV items), B2b's piece p runs beside B2a's piece p + 1:
//   caller's stream s:  B2a(0)  B2a(1)  [wait B2b(0)] B2a(2)  [wait B2b(1)] B2a(3) ...   [wait side]
//   side stream:        [wait B2a(0)] B2b(0)  [wait B2a(1)] B2b(1)  ...
// so at most two pieces are in flight and the distance between B2a's and B2b's touch of an item is
// about two pieces' bytes (n HV x ~240 KiB each: n = 8 at HV = 16 is ~30 MiB).
// Pieces write disjoint rows (their chunks' rows of dq, dk, dv, dG_state, dbeta, dg), so B2a(p + 1)
// and B2b(p) do not race.
//
// The side stream and its events are created once per (host thread, device), outside any stream
// capture; a call that finds its stream capturing before they exist runs the two kernels whole on s.
// Inside a capture the events fork the side stream into the graph and join it back before returning.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"

namespace flashgrad::cuda_detail::delta_rule {

// Chunks per piece from FLASHGRAD_CHUNKED_B2_PIECES (0: unset, not a positive integer: whole kernels).
int64_t b2_piece_chunks();

// The side stream and events for the caller's current device, or nullptr (see above).
struct B2PieceStreams {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, a_done = nullptr, join = nullptr;
  cudaEvent_t b_done[2] = {nullptr, nullptr};  // B2b(p) in b_done[p % 2]: B2a(p + 2) waits on it
};
B2PieceStreams* b2_piece_streams(cudaStream_t s);

// Runs launch_a(first chunk, chunks, stream) and launch_b(first chunk, chunks, stream) over pieces of
// `piece` chunks as drawn above. The caller has checked 0 < piece < num_chunks.
template <typename LaunchA, typename LaunchB>
void run_b2_in_pieces(int64_t num_chunks, int64_t piece, cudaStream_t s, const B2PieceStreams& r,
                      LaunchA&& launch_a, LaunchB&& launch_b) {
  // Fork: the side stream starts after everything already on s (B1's dh, dv_new; the rebuilt h).
  FLASHGRAD_CUDA_CHECK(cudaEventRecord(r.fork, s));
  FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(r.side, r.fork, 0));
  for (int64_t p = 0, c0 = 0; c0 < num_chunks; ++p, c0 += piece) {
    const int64_t n = num_chunks - c0 < piece ? num_chunks - c0 : piece;
    // B2a(p) waits for B2b(p - 2): two pieces in flight at most (a wait enqueued now uses b_done's
    // latest record, which is B2b(p - 2)'s).
    if (p >= 2) FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(s, r.b_done[p % 2], 0));
    launch_a(c0, n, s);
    FLASHGRAD_CUDA_CHECK(cudaEventRecord(r.a_done, s));
    FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(r.side, r.a_done, 0));
    launch_b(c0, n, r.side);
    FLASHGRAD_CUDA_CHECK(cudaEventRecord(r.b_done[p % 2], r.side));
  }
  // Join: what follows on s (and the caller's frees) comes after the last B2b.
  FLASHGRAD_CUDA_CHECK(cudaEventRecord(r.join, r.side));
  FLASHGRAD_CUDA_CHECK(cudaStreamWaitEvent(s, r.join, 0));
}

}  // namespace flashgrad::cuda_detail::delta_rule
