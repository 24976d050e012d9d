// Dense sums over the workers of a job: the one interface the AllReduce ops run through. Two
// backends implement it: the UCX ring among CPU workers (dist/collective/Communicator.h, whose thread runs
// the ring's collectives beside the executor) and NCCL among GPU workers (dist/collective/Nccl.h, on a
// stream beside the compute stream). AllReduceStart and AllReduceWait (dist/collective/CollectiveOps.h)
// name their backend by id and run on its device; Start returns at once with a ticket, so the sum
// overlaps the rest of the backward pass, and Wait delivers it.
//
// After a failure, every later sum of the backend fails with the first error; abort() makes a
// rank's step that stopped half-way such a failure, since its sums no longer pair with the other
// ranks'. A backend registers itself for the ops under its id while it lives.
#pragma once

#include "core/Device.h"

#include <cstdint>
#include <string>

namespace weft {
struct KernelContext;
}

namespace weft::dist {

class CollectiveBackend {
 public:
  CollectiveBackend();
  virtual ~CollectiveBackend();
  CollectiveBackend(const CollectiveBackend&) = delete;
  CollectiveBackend& operator=(const CollectiveBackend&) = delete;

  /// "the UCX ring of CPU workers", "NCCL among the GPU workers": for messages.
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Where the tensors it sums live.
  virtual DeviceType device() const = 0;

  /// AllReduceStart: starts summing the op's inputs (one dtype) over the ranks and writes a
  /// ticket into its output, which pairs the sum with its AllReduceWait.
  virtual void startSum(KernelContext& ctx) = 0;
  /// AllReduceWait: writes the sum of its ticket's (input 0) tensors, times `scale`, into the
  /// op's outputs.
  virtual void finishSum(KernelContext& ctx, double scale) = 0;

  /// Throws the failure that broke the backend, if one did.
  virtual void throwIfFailed() const = 0;
  /// Whether collectives were started and not yet waited for: a step that stopped now has left
  /// them without their pair on this rank.
  virtual bool sumsInFlight() const = 0;
  /// Fails every later sum of this rank with `why`.
  virtual void abort(const std::string& why) = 0;

  /// The ops find their backend by this id.
  int64_t id() const { return id_; }
  /// The live backend of this id; throws when there is none.
  static CollectiveBackend& byId(int64_t id);

 private:
  int64_t id_;
};

}  // namespace weft::dist
