// Tests of the intra-op thread pool (core/ThreadPool.h): every index once, whichever thread runs
// it; nested and concurrent calls; exceptions; regions after the workers have gone to sleep.
#include "core/ThreadPool.h"
#include "tests/TestUtil.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace weft;

namespace {

/// Runs parallelFor over n indices and returns how many times each was visited.
std::vector<int> visits(const ThreadPool& pool, int64_t n, int64_t cost) {
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  pool.parallelFor(n, cost, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  std::vector<int> counts;
  for (const auto& s : seen) counts.push_back(s.load());
  return counts;
}

}  // namespace

TEST_CASE("parallelFor visits every index exactly once, for any size and thread count") {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
      CAPTURE(threads);
      CAPTURE(n);
      CHECK(visits(pool, n, 1 << 20) == std::vector<int>(static_cast<size_t>(n), 1));
    }
  }
}

TEST_CASE("parallelFor spreads large work over the threads, and keeps small work on the caller") {
  ThreadPool pool(2);
  std::atomic<int> ranges{0};
  pool.parallelFor(2, 1 << 20, [&](int64_t, int64_t) { ranges.fetch_add(1); });
  CHECK(ranges.load() == 2);
  const std::thread::id caller = std::this_thread::get_id();
  bool onCaller = false;
  pool.parallelFor(
      2, 1, [&](int64_t lo, int64_t hi) { onCaller = lo == 0 && hi == 2 && std::this_thread::get_id() == caller; });
  CHECK(onCaller);
}

TEST_CASE("a worker that slept between regions takes part again") {
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the workers' spin
    std::atomic<int> threadsSeen{0};
    // Each range waits for the other: the region ends only if both threads ran one.
    pool.parallelFor(2, 1 << 20, [&](int64_t, int64_t) {
      threadsSeen.fetch_add(1);
      while (threadsSeen.load() < 2) std::this_thread::yield();
    });
    CHECK(threadsSeen.load() == 2);
  }
}

TEST_CASE("a parallelFor inside a range runs on that range's thread") {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallelFor(4, 1 << 20, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      pool.parallelFor(10, 1 << 20, [&](int64_t a, int64_t b) { total.fetch_add(b - a); });
    }
  });
  CHECK(total.load() == 40);
}

TEST_CASE("parallelFor from two threads at once: each call covers its indices") {
  ThreadPool pool(2);
  std::vector<std::vector<int>> results(2);
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < 200 && results[c].empty(); ++i) {
        const std::vector<int> v = visits(pool, 300, 1 << 20);
        if (v != std::vector<int>(300, 1)) results[c] = v;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(results[0].empty());
  CHECK(results[1].empty());
}

TEST_CASE("an exception from a range reaches the caller after every range has ended, and the pool goes on") {
  ThreadPool pool(2);
  std::atomic<int> ended{0};
  for (int64_t thrower : {0, 1}) {
    CAPTURE(thrower);
    ended = 0;
    CHECK_THROWS_WITH_AS(pool.parallelFor(2, 1 << 20,
                                          [&](int64_t lo, int64_t) {
                                            if (lo == thrower) throw std::runtime_error("range failed");
                                            std::this_thread::sleep_for(std::chrono::milliseconds(2));
                                            ended.fetch_add(1);
                                          }),
                         "range failed", std::runtime_error);
    CHECK(ended.load() == 1);
  }
  CHECK(visits(pool, 50, 1 << 20) == std::vector<int>(50, 1));
}
