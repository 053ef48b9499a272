// The split B2 in pieces (chunked_b2_pieces.h): the setting and the side stream's resources.
#include "chunked_b2_pieces.h"

#include <cstdlib>
#include <map>

namespace flashgrad::cuda_detail::delta_rule {

int64_t b2_piece_chunks() {
  const char* env = std::getenv("FLASHGRAD_CHUNKED_B2_PIECES");
  if (!env || !*env) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(env, &end, 10);
  return (end && *end == '\0' && n > 0) ? static_cast<int64_t>(n) : 0;
}

B2PieceStreams* b2_piece_streams(cudaStream_t s) {
  // Per host thread (two threads never share a side stream or an event's latest record) and device
  // (a stream belongs to one device). Kept for the thread's life: a few handles per device.
  thread_local std::map<int, B2PieceStreams> per_device;
  int device = 0;
  FLASHGRAD_CUDA_CHECK(cudaGetDevice(&device));
  auto it = per_device.find(device);
  if (it != per_device.end()) return &it->second;
  // Creating a stream or an event while s is being captured may invalidate the capture: not now.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHGRAD_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  B2PieceStreams r;
  // Non-blocking: no implicit order with the legacy default stream (which s may be), only the events.
  FLASHGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&r.side, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&r.fork, &r.a_done, &r.join, &r.b_done[0], &r.b_done[1]})
    FLASHGRAD_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  return &per_device.emplace(device, r).first->second;
}

}  // namespace flashgrad::cuda_detail::delta_rule
