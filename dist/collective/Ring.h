// Collectives over a ring of processes connected by a Transport (UCX between processes): the bandwidth-optimal ring
// AllReduce (reduce-scatter, then all-gather; each rank sends and receives 2(N-1)/N of the
// buffer), an AllGather of blocks that may differ in size, and a Broadcast. Every collective
// has a sequence number; tags are (sequence, phase, step), so a late message of one collective
// can never be taken for another's. Every step has the collective's deadline; a failure names
// the collective, the step and the neighbouring ranks. Every rank ends a collective with the
// same bytes, so replicas updated from them stay identical.
//
// Given the machine of every rank, AllReduce between machines is hierarchical: the ranks of a
// machine send their buffers to its first rank, which sums them in rank order; the first ranks
// run the ring among themselves; each hands the sum back to its machine. A machine then moves
// 4w(N-1)/N bytes across the network for N machines and w bytes, as if it had one rank, where
// a flat ring through all ranks would move about twice w per machine.
#pragma once

#include "core/DType.h"
#include "dist/collective/HostCollectives.h"
#include "dist/transport/Transport.h"

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

class Ring {
 public:
  /// `peers[r]` is the transport's peer index of rank r (any value at this rank's own place).
  /// Rings that share a transport and some processes (a pipeline's ring of all workers and its
  /// stages' rings of replicas) each take their own `channel` (0 to 79) into their tags.
  Ring(Transport& transport, int rank, std::vector<int> peers, std::chrono::milliseconds timeout, int channel = 0);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  /// `machineOfRank[r]` is rank r's machine; ranks of one machine must be consecutive. With
  /// `hierarchical`, AllReduce becomes hierarchical when there are several machines and one of
  /// them has several ranks.
  void setMachines(std::vector<int> machineOfRank, bool hierarchical);
  /// Bytes this rank sent to and received from ranks on other machines (all of them without
  /// machines set).
  uint64_t bytesSentAcross() const { return sentAcross_; }
  uint64_t bytesReceivedAcross() const { return receivedAcross_; }

  /// Replaces `count` elements of `dtype` (f32, f64, i64) at `data` by their sum over all ranks.
  /// With `wire` bf16 or f16 (f32 sums only), what travels between ranks is rounded to 16 bits
  /// while every rank accumulates in f32: each step of the reduce-scatter sends its partial sums
  /// rounded, and the owner of a reduced chunk rounds it before the all-gather, so every rank ends
  /// with the same values, each within a 16-bit rounding of every partial sum of the exact one.
  void allReduceSum(DType dtype, void* data, int64_t count, DType wire);
  void allReduceSum(DType dtype, void* data, int64_t count) { allReduceSum(dtype, data, count, dtype); }
  /// The reduce-scatter half of allReduceSum over chunks of given sizes (ZeRO's sharded
  /// gradients): `data` is every rank's chunk in rank order, counts[r] elements of `dtype` for
  /// rank r; afterwards this rank's chunk holds the sum of every rank's, and the other chunks
  /// hold partial sums. Each rank sends and receives (N - 1) / N of the buffer, half an AllReduce.
  void reduceScatterSum(DType dtype, void* data, std::span<const int64_t> counts);
  /// The all-gather half: `data` is every rank's chunk in rank order, sizes[r] bytes for rank r;
  /// afterwards every chunk holds what its rank had there.
  void allGatherChunks(void* data, std::span<const size_t> sizes);
  /// Every rank's block, concatenated in rank order; blocks may differ in size.
  std::vector<uint8_t> allGather(std::span<const uint8_t> block);
  /// Every rank's block size, in rank order.
  std::vector<uint64_t> allGatherSizes(uint64_t mine);
  /// The same, waiting until `deadline` rather than the ring's timeout (a barrier that workers
  /// reach far apart).
  std::vector<uint64_t> allGatherSizes(uint64_t mine, Deadline deadline);
  /// Copies rank `root`'s `data` into every other rank's `data` (same size on every rank).
  void broadcast(std::span<uint8_t> data, int root);

  const Transport& transport() const { return transport_; }

 private:
  /// A ring through some of the ranks (all of them, or one per machine), and this rank's place.
  struct Circle {
    std::vector<int> ranks;
    int position = 0;
    int size() const { return static_cast<int>(ranks.size()); }
    int left() const { return ranks[static_cast<size_t>((position + size() - 1) % size())]; }
    int right() const { return ranks[static_cast<size_t>((position + 1) % size())]; }
  };
  Circle everyone() const;
  /// Sends `out` to the right neighbour while receiving `into` from the left one.
  void shift(const Circle& circle, const char* collective, uint64_t sequence, int phase, int step,
             std::span<const uint8_t> out, std::span<uint8_t> into, Deadline deadline);
  /// The ring pass that gives every rank every block; `blocks[i]` is the i-th rank's block.
  void circulate(const Circle& circle, const char* collective, uint64_t sequence, int phase,
                 std::vector<std::span<uint8_t>> blocks, int firstOwnedShift, Deadline deadline);
  /// Reduce-scatter of `chunks` (one per position of the circle): afterwards the rank at
  /// position p holds the sum of chunk (p + ownedShift) mod n.
  void reduceScatter(const Circle& circle, const char* collective, uint64_t sequence, DType dtype,
                     const std::vector<std::span<uint8_t>>& chunks, int ownedShift, Deadline deadline);
  void ringAllReduce(const Circle& circle, uint64_t sequence, DType dtype, void* data, int64_t count,
                     Deadline deadline);
  /// The ring AllReduce of f32 values whose messages carry them as `wire` (bf16 or f16).
  void narrowRingAllReduce(const Circle& circle, uint64_t sequence, DType wire, float* data, int64_t count,
                           Deadline deadline);
  void hierarchicalAllReduce(uint64_t sequence, DType dtype, DType wire, void* data, int64_t count,
                             Deadline deadline);
  void countBytes(int peerRank, size_t sent, size_t received);

  Transport& transport_;
  int rank_;
  std::vector<int> peers_;
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
  std::vector<int> machineOf_;  // empty: one machine per rank
  bool hierarchical_ = false;
  uint64_t sentAcross_ = 0, receivedAcross_ = 0;
};

/// The host collectives over a ring, run on the calling thread (a pipeline stage's replicas sum
/// their gradients between steps, when no other collective of theirs is in flight).
class RingCollectives final : public HostCollectives {
 public:
  explicit RingCollectives(Ring& ring) : ring_(ring) {}
  void sum(DType dtype, void* data, int64_t count) override { ring_.allReduceSum(dtype, data, count); }
  std::vector<uint8_t> broadcast(std::vector<uint8_t> bytes, int root) override;
  std::vector<uint8_t> gather(std::vector<uint8_t> bytes) override { return ring_.allGather(bytes); }
  void barrier(std::chrono::milliseconds patience) override;

 private:
  Ring& ring_;
};

}  // namespace weft::dist
