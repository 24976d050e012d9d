// Dense AllReduce among GPU workers through NCCL: the CollectiveBackend (dist/collective/Collective.h) of a
// job whose workers are GPUs, one communicator over every worker's GPU (one worker per GPU: NCCL
// refuses two ranks on one device). AllReduceStart copies its inputs into one buffer and queues
// their sum on the group's own stream behind the compute stream's work so far; AllReduceWait
// makes the compute stream wait for that sum and copies it out, scaled. Neither blocks the host,
// so the sums overlap the rest of the backward pass on the GPU.
//
// NCCL runs non-blocking (ncclConfig_t::blocking = 0), and a watchdog thread holds every queued
// sum to the job's timeout and reads the communicator's asynchronous error; on either it aborts
// the communicator (ncclCommAbort ends kernels that wait for a peer which will never come), and
// the step fails with the reason instead of hanging. Built only with CUDA and NCCL.
#pragma once

#include "dist/collective/Collective.h"
#include "dist/transport/Traffic.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::dist {

/// Whether this build has NCCL (GPU workers in distributed jobs need it).
#ifdef WEFT_HAVE_NCCL
inline constexpr bool kNcclBuilt = true;
#else
inline constexpr bool kNcclBuilt = false;
#endif

#ifdef WEFT_HAVE_NCCL

/// A new NCCL unique id (worker rank 0 makes it; the coordinator hands it to the others).
std::vector<uint8_t> newNcclId();

class NcclGroup final : public CollectiveBackend {
 public:
  /// Joins the job's communicator of `ranks` GPU workers as `rank` on GPU `gpu`; the bytes its
  /// sums move are estimated into `traffic`. Throws naming NCCL's error, or after `timeout` when
  /// the other workers do not join.
  NcclGroup(const std::vector<uint8_t>& uniqueId, int ranks, int rank, int gpu, TrafficLog& traffic,
            std::chrono::milliseconds timeout);
  /// Finishes the queued sums and frees the communicator (aborts it after a failure).
  ~NcclGroup() override;

  std::string name() const override { return "NCCL among the GPU workers"; }
  int rank() const override;
  int size() const override;
  DeviceType device() const override { return DeviceType::CUDA; }
  void startSum(KernelContext& ctx) override;
  void finishSum(KernelContext& ctx, double scale) override;
  /// Throws the error that made the watchdog abort the communicator, if one did.
  void throwIfFailed() const override;
  bool sumsInFlight() const override;
  /// Aborts the communicator (the sums of every worker then fail).
  void abort(const std::string& why) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

#endif

}  // namespace weft::dist
