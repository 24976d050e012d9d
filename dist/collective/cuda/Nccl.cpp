// NCCL among GPU workers (see dist/collective/Nccl.h).
#include "dist/collective/Nccl.h"

#ifdef WEFT_HAVE_NCCL

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "core/Tensor.h"
#include "core/cuda/Runtime.h"
#include "ops/cuda/Host.h"

#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace weft::dist {

namespace {

using Clock = std::chrono::steady_clock;

/// How often the watchdog looks at the queued sums and the communicator's error.
constexpr std::chrono::milliseconds kWatchInterval{20};

ncclDataType_t ncclTypeOf(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    default: WEFT_THROW("NCCL cannot sum dtype {}", dtypeName(t));
  }
}

std::string ncclError(ncclResult_t r, const char* call) {
  return fmt::format("{} failed: {} ({})", call, ncclGetErrorString(r), static_cast<int>(r));
}

}  // namespace

std::vector<uint8_t> newNcclId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  WEFT_CHECK(r == ncclSuccess, "{}", ncclError(r, "ncclGetUniqueId"));
  static_assert(sizeof id.internal == NCCL_UNIQUE_ID_BYTES);
  return std::vector<uint8_t>(id.internal, id.internal + NCCL_UNIQUE_ID_BYTES);
}

struct NcclGroup::Impl {
  /// A sum started and not yet waited for: its buffer and the event that marks its end.
  struct Pending {
    Tensor fused;
    cudaEvent_t done = nullptr;
  };

  Impl(const std::vector<uint8_t>& uniqueId, int ranks, int rank, int gpu, TrafficLog& traffic,
       std::chrono::milliseconds timeout);
  ~Impl();

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  /// Throws unless the op runs on this group's GPU.
  void checkDevice(const KernelContext& ctx) const {
    WEFT_CHECK(ctx.device.index == gpu_, "{} runs on {}, but this worker's NCCL group is on cuda:{}",
               ctx.node->describe(), ctx.device.str(), gpu_);
  }
  void start(Tensor fused, cudaStream_t compute, const void* ticket, const Node& op);
  Pending take(const void* ticket, const Node& op);
  void recycle(cudaEvent_t event);
  void throwIfFailed() const;
  bool sumsInFlight() const {
    std::lock_guard lock(mutex_);
    return !pending_.empty();
  }
  void abort(const std::string& why);

 private:
  /// Polls a non-blocking call that answered ncclInProgress until it settles or `deadline` passes.
  ncclResult_t settle(Clock::time_point deadline);
  cudaEvent_t eventLocked();
  void abortLocked(std::string why);
  /// Throws the failure, naming the op that met it (the mutex is held).
  [[noreturn]] void failedAt(const Node& op) const { throw Error(fmt::format("{}: {}", op.describe(), failure_)); }
  void watch();
  void finishOrAbort();

  const int ranks_, rank_, gpu_;
  TrafficLog& traffic_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the sums run here, beside the compute stream

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string failure_;  // once set, the communicator is gone and every later sum fails
  bool stopping_ = false;
  uint64_t started_ = 0;
  std::atomic<uint64_t> finished_{0};  // counted on the stream, by a host function after each sum
  std::deque<std::pair<uint64_t, Clock::time_point>> deadlines_;  // of the sums not yet finished
  std::map<const void*, Pending> pending_;                        // by the ticket's address
  std::vector<cudaEvent_t> spareEvents_;
  std::thread watchdog_;
};

namespace {

void countFinished(void* counter) { static_cast<std::atomic<uint64_t>*>(counter)->fetch_add(1); }

}  // namespace

NcclGroup::Impl::Impl(const std::vector<uint8_t>& uniqueId, int ranks, int rank, int gpu, TrafficLog& traffic,
                      std::chrono::milliseconds timeout)
    : ranks_(ranks), rank_(rank), gpu_(gpu), traffic_(traffic), timeout_(timeout) {
  WEFT_CHECK(uniqueId.size() == NCCL_UNIQUE_ID_BYTES,
             "the roster's NCCL unique id has {} bytes, expected {} (worker rank 0 is not on a GPU?)", uniqueId.size(),
             NCCL_UNIQUE_ID_BYTES);
  cuda::setCurrent(gpu);
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ncclUniqueId id;
  std::memcpy(id.internal, uniqueId.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "weft";
  ncclResult_t r = ncclCommInitRankConfig(&comm_, ranks, id, rank, &config);
  if (r == ncclInProgress) r = settle(Clock::now() + timeout);
  if (r != ncclSuccess) {
    if (comm_) ncclCommAbort(comm_);
    cudaStreamDestroy(stream_);
    WEFT_THROW("worker rank {} could not join the NCCL communicator of {} GPU workers on cuda:{}: {}", rank, ranks, gpu,
               r == ncclInProgress ? fmt::format("the other workers did not join within {} ms", timeout.count())
                                   : ncclError(r, "ncclCommInitRankConfig"));
  }
  watchdog_ = std::thread([this] { watch(); });
}

NcclGroup::Impl::~Impl() {
  cudaSetDevice(gpu_);  // not checked: a destructor has no one to tell
  finishOrAbort();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  // An aborted or finalised communicator lets its kernels end: only then may their buffers go.
  cudaStreamSynchronize(stream_);
  for (auto& [ticket, sum] : pending_) cudaEventDestroy(sum.done);
  pending_.clear();
  for (cudaEvent_t e : spareEvents_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
}

/// Lets the queued sums finish (the watchdog aborts them at their deadline), then finalises the
/// communicator (flushing its work); a finalise that does not settle within the timeout aborts it.
void NcclGroup::Impl::finishOrAbort() {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return !failure_.empty() || finished_.load() == started_; });
  if (!failure_.empty()) return;
  ncclResult_t r = ncclCommFinalize(comm_);
  if (r == ncclInProgress) r = settle(Clock::now() + timeout_);
  if (r == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  failure_ = "the NCCL communicator is closed";
}

ncclResult_t NcclGroup::Impl::settle(Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

cudaEvent_t NcclGroup::Impl::eventLocked() {
  if (!spareEvents_.empty()) {
    cudaEvent_t e = spareEvents_.back();
    spareEvents_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// A stream wait takes the event's state when it is queued, so the event may be recorded again
// right after.
void NcclGroup::Impl::recycle(cudaEvent_t event) {
  std::lock_guard lock(mutex_);
  spareEvents_.push_back(event);
}

void NcclGroup::Impl::abortLocked(std::string why) {
  if (!failure_.empty()) return;
  failure_ = fmt::format("NCCL among the {} GPU workers (this is rank {}, cuda:{}): {}; the communicator was aborted",
                         ranks_, rank_, gpu_, why);
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  wake_.notify_all();
}

void NcclGroup::Impl::throwIfFailed() const {
  std::lock_guard lock(mutex_);
  if (!failure_.empty()) throw Error(failure_);
}

void NcclGroup::Impl::abort(const std::string& why) {
  std::lock_guard lock(mutex_);
  abortLocked(why);
}

void NcclGroup::Impl::start(Tensor fused, cudaStream_t compute, const void* ticket, const Node& op) {
  const int64_t count = fused.numel();
  const ncclDataType_t type = ncclTypeOf(fused.dtype());
  const uint64_t bytes = fused.bytes();
  std::unique_lock lock(mutex_);
  if (!failure_.empty()) failedAt(op);
  if (pending_.count(ticket)) {
    abortLocked(fmt::format("{} started a sum while its last one was never waited for", op.describe()));
    failedAt(op);
  }
  cudaEvent_t packed = eventLocked(), done = eventLocked();
  WEFT_CUDA_CHECK(cudaEventRecord(packed, compute));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream_, packed, 0));
  spareEvents_.push_back(packed);
  ncclResult_t r = ncclAllReduce(fused.raw(), fused.raw(), static_cast<size_t>(count), type, ncclSum, comm_, stream_);
  if (r == ncclInProgress) r = settle(Clock::now() + timeout_);
  if (r != ncclSuccess) {
    spareEvents_.push_back(done);
    abortLocked(r == ncclInProgress ? fmt::format("queueing a sum of {} bytes took over {} ms", bytes, timeout_.count())
                                    : ncclError(r, "ncclAllReduce"));
    failedAt(op);
  }
  // The sum is queued: from here a failure must not leave it running untracked.
  const cudaError_t recorded = cudaEventRecord(done, stream_);
  const cudaError_t counted =
      recorded == cudaSuccess ? cudaLaunchHostFunc(stream_, countFinished, &finished_) : recorded;
  if (counted != cudaSuccess) {
    abortLocked(fmt::format("tracking a queued sum failed: {}", cudaGetErrorString(counted)));
    failedAt(op);
  }
  // Its deadline counts from now, so it covers the GPU work queued before it.
  deadlines_.emplace_back(++started_, Clock::now() + timeout_);
  pending_[ticket] = Pending{std::move(fused), done};
  lock.unlock();
  // What a ring moves per rank; NCCL picks ring or tree, which move about as much for large sums.
  const uint64_t estimate =
      ranks_ > 1 ? 2 * bytes * static_cast<uint64_t>(ranks_ - 1) / static_cast<uint64_t>(ranks_) : 0;
  traffic_.record(TrafficKind::Dense, estimate, estimate);
}

NcclGroup::Impl::Pending NcclGroup::Impl::take(const void* ticket, const Node& op) {
  std::lock_guard lock(mutex_);
  if (!failure_.empty()) failedAt(op);
  const auto it = pending_.find(ticket);
  WEFT_CHECK(it != pending_.end(), "{}: no NCCL sum was started for its ticket", op.describe());
  Pending p = std::move(it->second);
  pending_.erase(it);
  return p;
}

void NcclGroup::Impl::watch() {
  cudaSetDevice(gpu_);  // for NCCL's calls below; they fail by their own result if it did not take
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kWatchInterval);
    while (!deadlines_.empty() && deadlines_.front().first <= finished_.load()) deadlines_.pop_front();
    if (deadlines_.empty()) wake_.notify_all();  // a closing group waits for this
    if (!failure_.empty() || comm_ == nullptr) continue;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) {
      abortLocked(ncclError(r, "ncclCommGetAsyncError"));
    } else if (state != ncclSuccess && state != ncclInProgress) {
      abortLocked(ncclError(state, "a queued collective"));
    } else if (!deadlines_.empty() && Clock::now() > deadlines_.front().second) {
      abortLocked(fmt::format("sum {} did not finish within {} ms: a GPU worker is missing or stalled",
                              deadlines_.front().first, timeout_.count()));
    }
  }
}

NcclGroup::NcclGroup(const std::vector<uint8_t>& uniqueId, int ranks, int rank, int gpu, TrafficLog& traffic,
                     std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(uniqueId, ranks, rank, gpu, traffic, timeout)) {}
NcclGroup::~NcclGroup() = default;
int NcclGroup::rank() const { return impl_->rank(); }
int NcclGroup::size() const { return impl_->size(); }
void NcclGroup::throwIfFailed() const { impl_->throwIfFailed(); }
bool NcclGroup::sumsInFlight() const { return impl_->sumsInFlight(); }
void NcclGroup::abort(const std::string& why) { impl_->abort(why); }

void NcclGroup::startSum(KernelContext& ctx) {
  impl_->checkDevice(ctx);
  int64_t count = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) count += ctx.input(i).numel();
  Tensor fused(ctx.input(0).dtype(), Shape{std::max<int64_t>(count, 1)}, ctx.device);
  const cudaStream_t compute = cudaops::streamOf(ctx);
  size_t offset = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) {
    const Tensor& x = ctx.input(i);
    WEFT_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(fused.raw()) + offset, x.raw(), x.bytes(),
                                    cudaMemcpyDeviceToDevice, compute));
    offset += x.bytes();
  }
  impl_->start(std::move(fused), compute, ctx.output(0).raw(), *ctx.node);
}

void NcclGroup::finishSum(KernelContext& ctx, double scale) {
  impl_->checkDevice(ctx);
  Impl::Pending sum = impl_->take(ctx.input(0).raw(), *ctx.node);
  const cudaStream_t compute = cudaops::streamOf(ctx);
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(compute, sum.done, 0));
  impl_->recycle(sum.done);
  size_t offset = 0;
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    Tensor& out = *ctx.outputs[i];
    const void* part = static_cast<const uint8_t*>(sum.fused.raw()) + offset;
    offset += out.bytes();
    if (scale == 1.0) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out.raw(), part, out.bytes(), cudaMemcpyDeviceToDevice, compute));
      continue;
    }
    cudaops::dispatchFloating(out.dtype(), [&](auto z) {
      using T = decltype(z);
      const Shape flat{out.numel()};
      const cudaops::BroadcastMap same = cudaops::broadcastMap(flat, flat);
      WEFT_CUDA_CHECK(cudaops::launch::spread<T>(static_cast<const T*>(part), out.data<T>(), out.numel(), same,
                                                 static_cast<T>(scale), compute));
    });
  }
  // The buffer goes back to the compute stream's cache: work queued there later runs after the copies above.
}

}  // namespace weft::dist

#endif  // WEFT_HAVE_NCCL
