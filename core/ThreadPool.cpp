// The pool is a fork-join team built for many short parallel regions: an LSTM step is a product
// and a pass of gate math, a few dozen microseconds each, dozens of them per training step.
// Waking a sleeping thread costs tens of microseconds on a virtual machine, more than such a
// region, so idle workers spin for a while (kSpin) before they sleep, as OpenMP runtimes do.
//
// A region is published as a generation number with the count of chunks claimed, packed in one
// atomic word (ticket_). Threads claim chunks by compare-and-swap against that word, so a claim
// succeeds only for the region whose description the thread read; the caller claims chunks too
// and so finishes the region alone when the workers are descheduled, waiting only for chunks
// already started.
#include "core/ThreadPool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

/// How long an idle thread spins for the next region before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(200);

void relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Counts spins and reads the clock every 64th: reading it on every spin cost more than the
/// spinning saved.
class SpinBudget {
 public:
  SpinBudget() : until_(Clock::now() + kSpin) {}
  bool spent() { return (++spins_ & 63) == 0 && Clock::now() >= until_; }

 private:
  Clock::time_point until_;
  unsigned spins_ = 0;
};

using Body = std::function<void(int64_t, int64_t)>;

}  // namespace

struct ThreadPool::Impl {
  explicit Impl(int workers) {
    for (int w = 0; w < workers; ++w) threads.emplace_back([this] { work(); });
  }

  ~Impl() {
    stop.store(true);
    wake.fetch_add(1);
    wake.notify_all();
    for (std::thread& t : threads) t.join();
  }

  /// Runs one region with the calling thread taking part; false when a region is already running
  /// (a nested or concurrent call), which the caller then runs alone.
  bool run(int64_t n, int64_t chunks, const Body& body) {
    if (busy.exchange(true, std::memory_order_acquire)) return false;
    body_.store(&body, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    done.store(0, std::memory_order_relaxed);
    const uint64_t generation = (ticket.load(std::memory_order_relaxed) >> 32) + 1;
    ticket.store(generation << 32, std::memory_order_seq_cst);
    wake.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) wake.notify_all();
    claimAndRun(generation);
    waitForChunks(chunks);
    std::exception_ptr thrown = std::exchange(error, nullptr);
    busy.store(false, std::memory_order_release);
    if (thrown) std::rethrow_exception(thrown);
    return true;
  }

  /// Claims and runs chunks of region `generation` until none is left or another region began.
  void claimAndRun(uint64_t generation) {
    const Body* body = body_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed), chunks = chunks_.load(std::memory_order_relaxed);
    uint64_t t = ticket.load(std::memory_order_acquire);
    for (;;) {
      if ((t >> 32) != generation) return;
      const int64_t chunk = static_cast<int64_t>(t & 0xffffffffu);
      if (chunk >= chunks) return;
      // Success proves the region is still `generation`: what was read above describes it.
      if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      const int64_t per = (n + chunks - 1) / chunks, begin = chunk * per;
      try {
        if (begin < n) (*body)(begin, std::min(n, begin + per));
      } catch (...) {
        // The first exception of the region reaches the caller once every chunk has ended.
        const std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == chunks && callerAsleep.load()) done.notify_all();
      t = ticket.load(std::memory_order_acquire);
    }
  }

  /// The caller's wait for chunks that workers started: spinning, then sleeping.
  void waitForChunks(int64_t chunks) {
    SpinBudget budget;
    for (int64_t d; (d = done.load(std::memory_order_acquire)) != chunks;) {
      if (!budget.spent()) {
        relax();
        continue;
      }
      callerAsleep.store(true);
      if (done.load() != chunks) done.wait(d);
      callerAsleep.store(false);
    }
  }

  void work() {
    uint64_t seen = 0;
    SpinBudget budget;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t generation = ticket.load(std::memory_order_acquire) >> 32;
      if (generation != seen) {
        seen = generation;
        claimAndRun(generation);
        budget = SpinBudget();
        continue;
      }
      if (!budget.spent()) {
        relax();
        continue;
      }
      // Read wake before looking at the ticket again: a region published after that look bumps
      // wake, and the wait then returns at once.
      const uint32_t before = wake.load(std::memory_order_seq_cst);
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      if ((ticket.load(std::memory_order_seq_cst) >> 32) == seen && !stop.load()) wake.wait(before);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      budget = SpinBudget();
    }
  }

  std::vector<std::thread> threads;
  std::atomic<bool> busy{false}, stop{false}, callerAsleep{false};
  std::atomic<uint64_t> ticket{0};  // generation << 32 | chunks claimed
  std::atomic<const Body*> body_{nullptr};
  std::atomic<int64_t> n_{0}, chunks_{0}, done{0};
  std::atomic<uint32_t> wake{0};
  std::atomic<int> sleepers{0};
  std::mutex errorMutex;
  std::exception_ptr error;
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
  if (chunks <= 1 || !impl_ || !impl_->run(n, chunks, body)) body(0, n);
}

}  // namespace weft
