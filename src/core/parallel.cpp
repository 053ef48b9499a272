#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashgrad {

int resolve_num_threads(int requested, int64_t n) {
  int64_t w = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  w = std::max<int64_t>(1, std::min<int64_t>(w, std::max<int64_t>(n, 1)));
  return static_cast<int>(w);
}

void parallel_for(int64_t n, int workers, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  workers = std::max(1, std::min<int>(workers, static_cast<int>(std::min<int64_t>(n, 1 << 20))));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  // Dynamic hand-out of single items (they differ in cost, e.g. causal rows); which worker runs
  // an item does not change its result, so this stays deterministic.
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashgrad
