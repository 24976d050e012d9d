// Intra-op parallelism: a fixed team of threads and parallelFor (see ThreadPool.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace weft {

class ThreadPool {
 public:
  /// `threads` <= 0 means one per hardware thread. The calling thread takes part in every
  /// parallelFor, so the pool starts threads-1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();

  int numThreads() const { return threads_; }

  /// Runs `body(begin, end)` over disjoint ranges covering [0, n), in parallel when the work
  /// (n * costPerItem, in rough nanoseconds) is large enough to pay for the hand-off. A call
  /// made while another runs (from inside a body, or from another thread) runs on its caller
  /// alone. An exception from any range is rethrown once all ranges have ended.
  void parallelFor(int64_t n, int64_t costPerItem,
                   const std::function<void(int64_t, int64_t)>& body) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int threads_;
};

}  // namespace weft
