// The communication thread of a CPU worker: the ring's collectives run on it, in the order they
// were submitted, while the worker's executor goes on computing (so gradient AllReduce overlaps
// the rest of the backward pass). Every worker submits the same collectives in the same order,
// because they all run the same plan. The ring (and its transport) is used by this thread alone.
// After a failure every pending and later collective fails with the first error: a job with a
// broken ring stops. It is the CollectiveBackend of CPU workers' dense sums, and runs the host's
// other collectives (AllGather of sparse rows, batch-norm moments, broadcasts, barriers).
#pragma once

#include "dist/collective/Collective.h"
#include "dist/collective/HostCollectives.h"
#include "dist/collective/Ring.h"
#include "dist/transport/Traffic.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft::dist {

class Communicator final : public CollectiveBackend, public HostCollectives {
 public:
  /// Works on the buffer handed to submit(): in place, or by replacing it.
  using Collective = std::function<void(Ring&, std::vector<uint8_t>&)>;

  /// Takes the ring over and starts the thread; the ring's bytes are counted in `traffic`.
  Communicator(Ring& ring, TrafficLog& traffic);
  /// Finishes the queued collectives, then stops the thread.
  ~Communicator() override;

  /// Queues a collective on `buffer`; returns its ticket.
  uint64_t submit(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind);
  /// Blocks until the collective of `ticket` is done and returns its buffer; throws its error
  /// (or the error that broke the ring before it ran).
  std::vector<uint8_t> wait(uint64_t ticket);
  /// Runs a collective and waits for it.
  std::vector<uint8_t> run(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind) {
    return wait(submit(std::move(buffer), std::move(collective), kind));
  }

  /// The host collectives, queued like any other and counted as control traffic.
  void sum(DType dtype, void* data, int64_t count) override;
  std::vector<uint8_t> broadcast(std::vector<uint8_t> bytes, int root) override;
  std::vector<uint8_t> gather(std::vector<uint8_t> bytes) override;
  void barrier(std::chrono::milliseconds patience) override;

  std::string name() const override { return "the UCX ring of CPU workers"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceType device() const override { return DeviceType::CPU; }
  void startSum(KernelContext& ctx) override;
  void finishSum(KernelContext& ctx, double scale) override;
  void throwIfFailed() const override;
  bool sumsInFlight() const override;
  /// AllGatherStart and AllGatherWait (dist/collective/CollectiveOps.h): every rank's sparse rows, in rank
  /// order, values times `scale`; the rows are counted per step in the traffic.
  void startGather(KernelContext& ctx);
  void finishGather(KernelContext& ctx, double scale);
  /// ReduceScatterStart and ReduceScatterWait (dist/collective/CollectiveOps.h): this rank's
  /// shard of each input's sum over the ranks, times `scale`.
  void startReduceScatter(KernelContext& ctx);
  void finishReduceScatter(KernelContext& ctx, double scale);
  /// ShardGatherStart and ShardGatherWait: each variable with every rank's shard of it.
  void startShardGather(KernelContext& ctx);
  void finishShardGather(KernelContext& ctx);
  /// GatherWholeStart and GatherWholeWait: the whole of a tensor from this rank's shard of it,
  /// gathered into the start's second output while the step goes on.
  void startGatherWhole(KernelContext& ctx);
  void finishGatherWhole(KernelContext& ctx);
  /// Waits until no collective runs or waits to run (after abort, those queued are dropped), so
  /// that none still writes into a step's values once the step has failed.
  void settle();
  void abort(const std::string& why) override;

  TrafficLog& traffic() const { return traffic_; }
  /// The live communicator of this id; throws when there is none or the id names another backend.
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
  TrafficLog& traffic_;
  int rank_, size_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<uint64_t> queue_;
  std::map<uint64_t, Job> jobs_;
  uint64_t nextTicket_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace weft::dist
