// The executor's GPU helpers (see the header).
#include "core/GpuStep.h"

#include "core/Error.h"
#ifdef WEFT_HAVE_CUDA
#include "core/cuda/Runtime.h"
#endif

#include "core/Trace.h"

#include <fmt/format.h>

#include <map>
#include <vector>

namespace weft::detail {

#ifdef WEFT_HAVE_CUDA

struct GpuTimeline::Impl {
  struct Op {
    int gpu;
    cudaEvent_t start = nullptr, end = nullptr;
    TraceClock::time_point launched;
    const Node* node = nullptr;
    std::string name, op;
    int64_t bytes = 0;
  };
  std::vector<Op> ops;
  std::map<int, std::vector<cudaEvent_t>> spare;  // events of each GPU, for reuse

  cudaEvent_t recorded(int gpu) {
    std::vector<cudaEvent_t>& events = spare[gpu];
    cudaEvent_t e = nullptr;
    if (events.empty()) {
      WEFT_CUDA_CHECK(cudaEventCreate(&e));
    } else {
      e = events.back();
      events.pop_back();
    }
    WEFT_CUDA_CHECK(cudaEventRecord(e, cuda::device(gpu).compute));
    return e;
  }

  void release() {
    for (const Op& op : ops) {
      for (cudaEvent_t e : {op.start, op.end})
        if (e) spare[op.gpu].push_back(e);
    }
    ops.clear();
  }
};

GpuTimeline::GpuTimeline() : impl_(std::make_unique<Impl>()) {}

GpuTimeline::~GpuTimeline() {
  impl_->release();
  for (auto& [gpu, events] : impl_->spare) {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
}

void GpuTimeline::begin(int gpu) {
  Impl::Op op;
  op.gpu = gpu;
  op.launched = TraceClock::now();
  op.start = impl_->recorded(gpu);
  impl_->ops.push_back(std::move(op));
}

void GpuTimeline::end(const Node* node, std::string name, std::string op, int64_t bytes) {
  Impl::Op& last = impl_->ops.back();
  last.end = impl_->recorded(last.gpu);
  last.node = node;
  last.name = std::move(name);
  last.op = std::move(op);
  last.bytes = bytes;
}

void GpuTimeline::flush(bool trace, std::unordered_map<const Node*, double>* seconds) {
  std::map<int, const Impl::Op*> first;  // each GPU's first op of the step: the anchor
  for (const Impl::Op& op : impl_->ops) {
    const Impl::Op*& anchor = first[op.gpu];
    if (!anchor) anchor = &op;
    float sinceAnchor = 0, took = 0;  // milliseconds
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&sinceAnchor, anchor->start, op.start));
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&took, op.start, op.end));
    const auto at = [](double ms) {
      return std::chrono::duration_cast<TraceClock::duration>(std::chrono::duration<double, std::milli>(ms));
    };
    const TraceClock::time_point start = anchor->launched + at(sinceAnchor);
    if (trace) traceEvent(op.name, op.op, "gpu", start, start + at(took), op.bytes);
    if (seconds) (*seconds)[op.node] += took / 1e3;
  }
  impl_->release();
}

void GpuTimeline::discard() { impl_->release(); }

void* computeStream(const Device& device) { return cuda::device(device.index).compute; }

void makeGpuCurrent(int gpu) { cuda::setCurrent(gpu); }

std::unique_lock<std::mutex> holdGpu(int gpu) {
  static std::mutex guard;
  static std::map<int, std::mutex> turns;  // a map's nodes stay where they are as it grows
  std::mutex* turn = nullptr;
  {
    const std::lock_guard<std::mutex> lock(guard);
    turn = &turns[gpu];
  }
  return std::unique_lock<std::mutex>(*turn);
}

std::string finishGpuStep(int gpu, const std::function<std::string(int)>& describeStep) {
  cuda::DeviceState& d = cuda::device(gpu);
  cuda::setCurrent(gpu);
  WEFT_CUDA_CHECK(
      cudaMemcpyAsync(d.hostError, d.deviceError, sizeof(cuda::KernelError), cudaMemcpyDeviceToHost, d.compute));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
  const cuda::KernelError e = *d.hostError;
  if (!e.kind) return {};
  WEFT_CUDA_CHECK(cudaMemsetAsync(d.deviceError, 0, sizeof(cuda::KernelError), d.compute));
  const std::string op = e.step >= 0 ? describeStep(e.step) : fmt::format("a kernel on cuda:{}", gpu);
  if (e.kind == cuda::KernelError::IntegerDivisionByZero) {
    return fmt::format("{}: integer division by zero (divisor element {})", op, e.position);
  }
  if (e.kind == cuda::KernelError::LengthOutOfRange) {
    return fmt::format("{}: length {} of sequence {} is outside [0, {}]", op, e.value, e.position, e.limit);
  }
  return fmt::format("{}: id {} at position {} is outside [0, {})", op, e.value, e.position, e.limit);
}

#else

void* computeStream(const Device& device) {
  WEFT_THROW("device {} is not available: {}", device.str(), cudaUnavailableReason());
}

void makeGpuCurrent(int gpu) { WEFT_THROW("device cuda:{} is not available: {}", gpu, cudaUnavailableReason()); }

std::unique_lock<std::mutex> holdGpu(int gpu) {
  WEFT_THROW("device cuda:{} is not available: {}", gpu, cudaUnavailableReason());
}

std::string finishGpuStep(int, const std::function<std::string(int)>&) { return {}; }

// Without the CUDA backend no plan runs on a GPU, so nothing is ever marked.
struct GpuTimeline::Impl {};
GpuTimeline::GpuTimeline() = default;
GpuTimeline::~GpuTimeline() = default;
void GpuTimeline::begin(int) {}
void GpuTimeline::end(const Node*, std::string, std::string, int64_t) {}
void GpuTimeline::flush(bool, std::unordered_map<const Node*, double>*) {}
void GpuTimeline::discard() {}

#endif

}  // namespace weft::detail
