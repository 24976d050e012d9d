// Dense AllReduce among GPU workers through NCCL: one communicator per job over every worker's
// GPU (one worker per GPU: NCCL refuses two ranks on one device). The AllReduce ops placed on a
// GPU run through it (see dist/CollectiveOps.h): AllReduceStart copies its inputs into one
// buffer and queues their sum on the group's own stream behind the compute stream's work so far;
// AllReduceWait makes the compute stream wait for that sum and copies it out, scaled. Neither
// blocks the host, so the sums overlap the rest of the backward pass on the GPU.
//
// NCCL runs non-blocking (ncclConfig_t::blocking = 0), and a watchdog thread holds every queued
// sum to the job's timeout and reads the communicator's asynchronous error; on either it aborts
// the communicator (ncclCommAbort ends kernels that wait for a peer which will never come), and
// the step fails with the reason instead of hanging. Built only with CUDA and NCCL.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft {
struct KernelContext;
}

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

class NcclGroup {
 public:
  /// Joins the job's communicator of `ranks` GPU workers as `rank` on GPU `gpu`; the AllReduce
  /// ops of communicator `communicator` (Communicator::id()) placed on that GPU then run through
  /// it. Throws naming NCCL's error, or after `timeout` when the other workers do not join.
  NcclGroup(const std::vector<uint8_t>& uniqueId, int ranks, int rank, int gpu, int64_t communicator,
            std::chrono::milliseconds timeout);
  /// Finishes the queued sums and frees the communicator (aborts it after a failure).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  /// Throws the error that made the watchdog abort the communicator, if one did.
  void throwIfFailed() const;
  /// Aborts the communicator (the sums of every worker then fail): for a step that stopped
  /// half-way, after which this worker's sums no longer match the others'.
  void abort(const std::string& why);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

namespace nccl {
void allReduceStart(KernelContext& ctx);
void allReduceWait(KernelContext& ctx);
}  // namespace nccl

#define WEFT_NCCL_KERNEL(name) (&::weft::dist::nccl::name)
#else
#define WEFT_NCCL_KERNEL(name) (static_cast<::weft::Kernel>(nullptr))
#endif

}  // namespace weft::dist
