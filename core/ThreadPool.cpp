#include "core/ThreadPool.h"

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/ThreadPool>

#include <algorithm>
#include <thread>

namespace weft {

struct ThreadPool::Impl {
  explicit Impl(int workers) : pool(workers) {}
  Eigen::ThreadPool pool;
};

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_ = threads;
  if (threads_ > 1) impl_ = std::make_unique<Impl>(threads_ - 1);
}

ThreadPool::~ThreadPool() = default;

void ThreadPool::parallelFor(int64_t n, int64_t costPerItem,
                             const std::function<void(int64_t, int64_t)>& body) const {
  if (n <= 0) return;
  // Below ~20 µs of work a hand-off to other threads costs more than it saves.
  constexpr int64_t kMinWorkPerChunk = 20000;
  const int64_t work = n * std::max<int64_t>(costPerItem, 1);
  const int64_t chunks = std::min<int64_t>({threads_, n, std::max<int64_t>(1, work / kMinWorkPerChunk)});
  if (chunks <= 1 || !impl_) {
    body(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  Eigen::Barrier barrier(static_cast<unsigned>(chunks - 1));
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t begin = c * per, end = std::min(n, begin + per);
    impl_->pool.Schedule([&body, &barrier, begin, end] {
      if (begin < end) body(begin, end);
      barrier.Notify();
    });
  }
  body(0, std::min(n, per));
  barrier.Wait();
}

}  // namespace weft
