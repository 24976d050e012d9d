// The communication thread of a worker: collectives run on it, in the order they were submitted,
// while the worker's executor goes on computing (so gradient AllReduce overlaps the rest of the
// backward pass). Every worker submits the same collectives in the same order, because they all
// run the same plan. The ring (and its UCX worker) is used by this thread alone. After a failure
// every pending and later collective fails with the first error: a job with a broken ring stops.
#pragma once

#include "dist/Ring.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft::dist {

/// What the bytes of a collective carry, for the per-kind traffic counters.
enum class TrafficKind { Dense = 0, Sparse = 1, Control = 2 };

/// How much of a sparse variable one worker's gradients covered, summed over steps.
struct SparseRows {
  int64_t steps = 0;
  int64_t lookups = 0;  // gradient rows, a row once per lookup
  int64_t touched = 0;  // distinct rows
  int64_t rows = 0;     // the variable's rows

  /// alpha of the sparsity-aware paper: the mean fraction of the rows touched per step.
  double alpha() const { return steps > 0 && rows > 0 ? double(touched) / double(steps * rows) : 0.0; }
  /// The same for gradient rows with repeats, which is what an AllGather of them moves.
  double lookupFraction() const { return steps > 0 && rows > 0 ? double(lookups) / double(steps * rows) : 0.0; }
};

/// Payload bytes sent and received, per kind, those of the ring's collectives that crossed to
/// other machines, and the rows of each sparse variable's gradients.
struct Traffic {
  uint64_t sent[3] = {0, 0, 0};
  uint64_t received[3] = {0, 0, 0};
  uint64_t sentAcross[3] = {0, 0, 0};
  uint64_t receivedAcross[3] = {0, 0, 0};
  std::map<std::string, SparseRows> sparseRows;  // by variable name
};

class Communicator {
 public:
  /// Works on the buffer handed to submit(): in place, or by replacing it.
  using Collective = std::function<void(Ring&, std::vector<uint8_t>&)>;

  /// Takes the ring over and starts the thread.
  explicit Communicator(Ring& ring);
  /// Finishes the queued collectives, then stops the thread.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// Queues a collective on `buffer`; returns its ticket.
  uint64_t submit(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind);
  /// Blocks until the collective of `ticket` is done and returns its buffer; throws its error
  /// (or the error that broke the ring before it ran).
  std::vector<uint8_t> wait(uint64_t ticket);
  /// Runs a collective and waits for it.
  std::vector<uint8_t> run(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind) {
    return wait(submit(std::move(buffer), std::move(collective), kind));
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  Traffic traffic() const;
  /// Records one step's gradient of a sparse variable: `lookups` rows, `touched` of them
  /// distinct, out of the variable's `rows`.
  void recordSparseRows(const std::string& variable, int64_t lookups, int64_t touched, int64_t rows);
  /// Counts bytes that moved outside the ring (the worker's requests to parameter servers).
  void recordTraffic(TrafficKind kind, uint64_t sent, uint64_t received);

  /// Communicators are found by the kernels of the collective ops through this id.
  int64_t id() const { return id_; }
  /// The live communicator of this id; throws when there is none.
  static Communicator& byId(int64_t id);

 private:
  struct Job {
    std::vector<uint8_t> buffer;
    Collective collective;
    TrafficKind kind = TrafficKind::Dense;
    bool done = false;
  };
  void loop();

  Ring& ring_;
  int rank_, size_;
  int64_t id_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<uint64_t> queue_;
  std::map<uint64_t, Job> jobs_;
  uint64_t nextTicket_ = 0;
  std::exception_ptr failure_;
  Traffic traffic_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace weft::dist
