// Collectives of host buffers among the ranks of a group: what a job's processes agree on
// outside the graph (the Runner's barrier, broadcasts and means over the workers) and what a
// pipeline's replicas of a stage sum between steps. Every rank calls them in the same order; each
// returns when its result is here, and throws naming the collective when a rank fails or the
// deadline passes. Two implementations: the Communicator runs them on its thread, queued behind
// the graph's collectives (dist/collective/Communicator.h); RingCollectives runs them on the
// calling thread over a ring of its own (dist/collective/Ring.h).
#pragma once

#include "core/Tensor.h"

#include <chrono>
#include <cstdint>
#include <vector>

namespace weft::dist {

class HostCollectives {
 public:
  virtual ~HostCollectives() = default;
  /// Every rank's `count` values of `dtype` at `data`, summed in place.
  virtual void sum(DType dtype, void* data, int64_t count) = 0;
  /// Rank `root`'s bytes, on every rank (every rank passes as many).
  virtual std::vector<uint8_t> broadcast(std::vector<uint8_t> bytes, int root) = 0;
  /// Every rank's bytes (as many as each has), concatenated in rank order.
  virtual std::vector<uint8_t> gather(std::vector<uint8_t> bytes) = 0;
  /// Returns once every rank has called it; throws when that takes longer than `patience`.
  virtual void barrier(std::chrono::milliseconds patience) = 0;
};

}  // namespace weft::dist
