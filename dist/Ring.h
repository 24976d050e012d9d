// Collectives over a ring of processes connected by a UcxTransport: the bandwidth-optimal ring
// AllReduce (reduce-scatter, then all-gather; each rank sends and receives 2(N-1)/N of the
// buffer), an AllGather of blocks that may differ in size, and a Broadcast. Every collective
// has a sequence number; tags are (sequence, phase, step), so a late message of one collective
// can never be taken for another's. Every step has the collective's deadline; a failure names
// the collective, the step and the neighbouring ranks. Every rank ends a collective with the
// same bytes, so replicas updated from them stay identical.
#pragma once

#include "core/DType.h"
#include "dist/UcxTransport.h"

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

class Ring {
 public:
  /// `peers[r]` is the transport's peer index of rank r (any value at this rank's own place).
  Ring(UcxTransport& transport, int rank, std::vector<int> peers, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  /// Replaces `count` elements of `dtype` (f32, f64, i64) at `data` by their sum over all ranks.
  void allReduceSum(DType dtype, void* data, int64_t count);
  /// Every rank's block, concatenated in rank order; blocks may differ in size.
  std::vector<uint8_t> allGather(std::span<const uint8_t> block);
  /// Every rank's block size, in rank order.
  std::vector<uint64_t> allGatherSizes(uint64_t mine);
  /// Copies rank `root`'s `data` into every other rank's `data` (same size on every rank).
  void broadcast(std::span<uint8_t> data, int root);

  const UcxTransport& transport() const { return transport_; }

 private:
  int left() const { return (rank_ + size() - 1) % size(); }
  int right() const { return (rank_ + 1) % size(); }
  /// Sends `out` to the right neighbour while receiving `into` from the left one.
  void shift(const char* collective, uint64_t sequence, int phase, int step, std::span<const uint8_t> out,
             std::span<uint8_t> into, Deadline deadline);
  /// The ring pass that gives every rank every block; `blocks[i]` is rank i's block.
  void circulate(const char* collective, uint64_t sequence, int phase, std::vector<std::span<uint8_t>> blocks,
                 int firstOwnedShift, Deadline deadline);

  UcxTransport& transport_;
  int rank_;
  std::vector<int> peers_;
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
};

}  // namespace weft::dist
