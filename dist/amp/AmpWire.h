// What the processes of an AMP job say to each other (dist/amp/AmpRuntime.h), as the header of a
// transport's active message (dist/transport/Transport.h) with an optional payload: a node's forward or
// backward message (its state, the credit it carries and a tensor), the credit and metrics an
// instance's finished work returns to the controller, and the controller's epoch protocol. Every
// field is checked as it is read (dist/transport/Wire.h), so a malformed message is an error naming the
// field, never an over-read.
#pragma once

#include "core/Tensor.h"
#include "amp/AmpGraph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace weft::amp {

/// A share of an instance's credit (termination detection by weight throwing, dist/amp/AmpRuntime.cpp):
/// an exact dyadic fraction, `words` (a little-endian multiword integer) divided by 2^exponent,
/// kept reduced. Shares only split and add, so no precision is ever lost and no depth of fan-out
/// runs it out.
class Credit {
 public:
  /// The whole credit of an instance: 1.
  static Credit whole();
  bool empty() const { return words_.empty(); }
  bool isWhole() const { return exponent_ == 0 && words_.size() == 1 && words_[0] == 1; }
  /// True when the value exceeds 1 (more credit came back than was given).
  bool exceedsWhole() const;
  void add(const Credit& other);
  /// `k` nonzero shares that sum to this one exactly.
  std::vector<Credit> split(size_t k) const;

  uint32_t exponent() const { return exponent_; }
  const std::vector<uint64_t>& words() const { return words_; }
  /// Throws naming the value when it is not reduced (what decode receives).
  static Credit fromParts(uint32_t exponent, std::vector<uint64_t> words);

 private:
  void reduce();
  uint32_t exponent_ = 0;
  std::vector<uint64_t> words_;  // no high zero words; empty: zero
};

enum class WireKind : uint8_t {
  Forward = 1,   ///< node, port, state, credit; payload: the tensor
  Backward = 2,  ///< as Forward
  Credit = 3,    ///< to the controller: instance, credit, loss, hits, count
  Update = 4,    ///< controller -> process: a synchronous update over `instances` instances
  Updated = 5,   ///< process -> controller: its updates are done
  EpochEnd = 6,  ///< controller -> process: every instance finished (the epoch's loss, hits, count); report
  Report = 7,    ///< process -> controller; payload: its node counts, worker times and variables
  Failed = 8,    ///< process -> controller, and controller -> process (abort): a reason
  Ready = 9,     ///< process -> controller: it has entered the epoch (the controller pumps after every one)
  Resume = 10,   ///< controller -> process, before the first epoch: `instances` is the run's position;
                 ///< payload: a report holding that process's variables (none: start afresh)
  Vote = 11,     ///< process -> controller, between epochs: `instances` 1 or 0 (Runtime::anyProcess)
  Verdict = 12,  ///< controller -> process: `instances` 1 when any process voted 1
};

struct WireMessage {
  WireKind kind = WireKind::Forward;
  int32_t node = 0, port = 0;
  State state;
  Credit credit;
  double loss = 0, hits = 0, count = 0;
  int64_t instances = 0;
  std::string reason;
  Tensor tensor;                ///< Forward / Backward (undefined: a zero gradient)
  std::vector<uint8_t> report;  ///< Report, Resume: encodeReport's bytes
};

/// A message of the epoch protocol.
inline WireMessage control(WireKind kind, int64_t instances = 0) {
  WireMessage m;
  m.kind = kind;
  m.instances = instances;
  return m;
}

/// Header and payload of a message.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> encode(const WireMessage& m);
/// Throws naming the field when `header` or `payload` is malformed.
WireMessage decode(const std::vector<uint8_t>& header, const std::vector<uint8_t>& payload);

/// A process's report at the end of an epoch: per node it runs, its counts; per worker, its busy
/// seconds; its transforms' variables ("node/variable").
struct ProcessReport {
  struct NodeCounts {
    int32_t node = 0;
    int64_t forwards = 0, backwards = 0, updates = 0, gradients = 0;
    int64_t stalenessSum = 0, stalenessMax = 0, stalenessCount = 0;
    double busy = 0;
    std::vector<int64_t> sent, answered;
  };
  std::vector<NodeCounts> nodes;
  std::vector<double> workerBusy;
  std::vector<std::pair<std::string, Tensor>> variables;
};
std::vector<uint8_t> encodeReport(const ProcessReport& r);
ProcessReport decodeReport(const std::vector<uint8_t>& payload);

}  // namespace weft::amp
