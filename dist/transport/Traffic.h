// What a worker's bytes carry, counted per kind: the figures behind --report-comm and the
// sparsity-aware paper's communication formulas.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace weft::dist {

/// What the bytes of a collective or a request carry.
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

/// Payload bytes sent and received, per kind, those of them that crossed to other machines, and
/// the rows of each sparse variable's gradients.
struct Traffic {
  uint64_t sent[3] = {0, 0, 0};
  uint64_t received[3] = {0, 0, 0};
  uint64_t sentAcross[3] = {0, 0, 0};
  uint64_t receivedAcross[3] = {0, 0, 0};
  std::map<std::string, SparseRows> sparseRows;  // by variable name
};

/// One worker's counters, shared by everything that moves its bytes: the collectives' thread,
/// the executor's requests to the servers and the NCCL group (thread-safe).
class TrafficLog {
 public:
  /// Counts bytes of `kind`; `sentAcross` and `receivedAcross` of them crossed to other machines.
  void record(TrafficKind kind, uint64_t sent, uint64_t received, uint64_t sentAcross = 0,
              uint64_t receivedAcross = 0) {
    std::lock_guard lock(mutex_);
    const auto k = static_cast<size_t>(kind);
    traffic_.sent[k] += sent;
    traffic_.received[k] += received;
    traffic_.sentAcross[k] += sentAcross;
    traffic_.receivedAcross[k] += receivedAcross;
  }
  /// Records one step's gradient of a sparse variable: `lookups` rows, `touched` of them
  /// distinct, out of the variable's `rows`.
  void recordSparseRows(const std::string& variable, int64_t lookups, int64_t touched, int64_t rows) {
    std::lock_guard lock(mutex_);
    SparseRows& r = traffic_.sparseRows[variable];
    ++r.steps;
    r.lookups += lookups;
    r.touched += touched;
    r.rows = rows;
  }
  Traffic snapshot() const {
    std::lock_guard lock(mutex_);
    return traffic_;
  }

 private:
  mutable std::mutex mutex_;
  Traffic traffic_;
};

}  // namespace weft::dist
