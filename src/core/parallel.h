// Deterministic parallel loop for the CPU reference.
//
// Work items [0, n) are independent: each item is computed entirely by one worker, in the same
// order of arithmetic whatever the number of workers, so results are bitwise identical for 1 and
// N threads. Items are handed out one at a time to whichever worker is free; the worker index is
// passed so that a worker can reuse its own scratch buffer.
#pragma once

#include <cstdint>
#include <functional>

namespace flashgrad {

// Number of workers for a request: requested > 0 is taken as is (capped at n), 0 means
// std::thread::hardware_concurrency() (capped at n, at least 1).
int resolve_num_threads(int requested, int64_t n);

// Runs fn(item, worker) for item in [0, n) on `workers` threads (the caller's thread is one of
// them). An exception thrown by fn is rethrown on the caller's thread after all workers stop.
void parallel_for(int64_t n, int workers, const std::function<void(int64_t item, int worker)>& fn);

}  // namespace flashgrad
