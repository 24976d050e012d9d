#include "core/cuda/Runtime.h"

#include "core/Device.h"
#include "core/Tensor.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace weft::cuda {
namespace {

/// cudaMalloc / cudaFree for one GPU.
class GpuMemory final : public CachingAllocator::Device {
 public:
  explicit GpuMemory(int index) : index_(index) {}
  void* allocate(size_t bytes) override {
    setCurrent(index_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clears the sticky-free error so later calls do not see it
      return nullptr;
    }
    WEFT_CUDA_CHECK(e);
    return p;
  }
  void free(void* ptr) override {
    setCurrent(index_);
    WEFT_CUDA_CHECK(cudaFree(ptr));
  }
  void synchronize() override {
    setCurrent(index_);
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  int index_;
};

CachingAllocator::Stream streamKey(cudaStream_t stream) { return reinterpret_cast<CachingAllocator::Stream>(stream); }

/// Serves Tensor buffers of one GPU from its caching allocator, on its compute stream.
class GpuAllocator final : public Allocator {
 public:
  explicit GpuAllocator(DeviceState& state) : state_(state) {}
  void* allocate(size_t bytes) override { return state_.allocator->allocate(bytes, streamKey(state_.compute)); }
  void deallocate(void* ptr, size_t) override { state_.allocator->deallocate(ptr); }

 private:
  DeviceState& state_;
};

/// Serves uploadTo()'s buffers, written on the upload stream and read on the compute stream. A
/// freed buffer may still be read by compute work queued before its free, so it returns to the
/// upload stream's cache only once an event recorded on the compute stream at the free has passed.
class UploadAllocator final : public Allocator {
 public:
  explicit UploadAllocator(DeviceState& state) : state_(state) {}
  ~UploadAllocator() override {
    for (const Pending& p : pending_) cudaEventDestroy(p.computePassed);
    for (cudaEvent_t e : spareEvents_) cudaEventDestroy(e);
  }

  void* allocate(size_t bytes) override {
    std::lock_guard lock(mutex_);
    setCurrent(state_.index);
    reclaim(false);
    try {
      return state_.allocator->allocate(bytes, streamKey(state_.upload));
    } catch (const Error&) {
      reclaim(true);  // the compute stream may still hold enough
      return state_.allocator->allocate(bytes, streamKey(state_.upload));
    }
  }

  // Called from destructors, also during unwinding after a CUDA error and at exit: never throws,
  // and leaves the caller's current device as it was. Without an event it waits for the compute
  // stream instead.
  void deallocate(void* ptr, size_t) override {
    std::lock_guard lock(mutex_);
    int callersDevice = -1;
    if (cudaGetDevice(&callersDevice) != cudaSuccess) callersDevice = -1;
    cudaSetDevice(state_.index);
    cudaEvent_t event = nullptr;
    if (!spareEvents_.empty()) {
      event = spareEvents_.back();
      spareEvents_.pop_back();
    } else if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      event = nullptr;
    }
    if (event && cudaEventRecord(event, state_.compute) == cudaSuccess) {
      pending_.push_back({ptr, event});
    } else {
      if (event) cudaEventDestroy(event);
      cudaStreamSynchronize(state_.compute);
      state_.allocator->deallocate(ptr);
    }
    reclaim(false);  // so blocks do not wait for the next upload to be counted free
    cudaGetLastError();
    if (callersDevice >= 0) cudaSetDevice(callersDevice);
  }

 private:
  struct Pending {
    void* ptr;
    cudaEvent_t computePassed;
  };

  /// Returns the freed buffers whose compute work has finished (all of them, waiting, when
  /// `wait`). Needs the GPU current; never throws.
  void reclaim(bool wait) {
    std::vector<Pending> still;
    for (const Pending& p : pending_) {
      const cudaError_t e = wait ? cudaEventSynchronize(p.computePassed) : cudaEventQuery(p.computePassed);
      if (e == cudaErrorNotReady) {
        still.push_back(p);
        continue;
      }
      if (e != cudaSuccess) cudaStreamSynchronize(state_.compute);
      state_.allocator->deallocate(p.ptr);
      spareEvents_.push_back(p.computePassed);
    }
    pending_ = std::move(still);
  }

  DeviceState& state_;
  std::mutex mutex_;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> spareEvents_;
};

struct Gpu {
  DeviceState state;
  std::unique_ptr<GpuMemory> memory;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<GpuAllocator> tensorAllocator;
  std::unique_ptr<UploadAllocator> uploadAllocator;
};

/// cudaHostAlloc / cudaFreeHost: page-locked host memory, usable by every GPU's copies.
class PinnedMemory final : public CachingAllocator::Device {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    WEFT_CUDA_CHECK(e);
    return p;
  }
  void free(void* ptr) override { WEFT_CUDA_CHECK(cudaFreeHost(ptr)); }
  // Every copy from or to a pinned block has finished before the block is freed: uploads and
  // copies wait for theirs (see cudaUpload and cudaCopy).
  void synchronize() override {}
};

/// Host tensors' buffers from the pinned cache.
class PinnedAllocator final : public Allocator {
 public:
  PinnedAllocator() : cache_(memory_, "pinned host memory") {}
  void* allocate(size_t bytes) override { return cache_.allocate(bytes); }
  void deallocate(void* ptr, size_t) override { cache_.deallocate(ptr); }
  MemoryStats stats() const { return cache_.stats(); }

 private:
  PinnedMemory memory_;
  CachingAllocator cache_;
};

// Never destroyed, like the GPUs' state: pinned tensors in static storage may free into it at exit.
PinnedAllocator& pinnedAllocator() {
  static auto* allocator = new PinnedAllocator();
  return *allocator;
}

bool isPinned(const void* host) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost || attributes.type == cudaMemoryTypeManaged;
}

std::mutex& gpusMutex() {
  static std::mutex m;
  return m;
}

// Never destroyed: tensors in static storage may free into it during exit.
std::vector<std::unique_ptr<Gpu>>& gpus() {
  static auto* table = new std::vector<std::unique_ptr<Gpu>>();
  return *table;
}

struct Availability {
  int count = 0;
  std::string reason;
};

const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.count = 0;
      const char* what = e == cudaErrorInsufficientDriver ? "no NVIDIA driver that runs this CUDA version is loaded"
                         : e == cudaErrorNoDevice         ? "no NVIDIA GPU is visible"
                                                          : "the CUDA runtime cannot start";
      r.reason = fmt::format("{} ({}: {})", what, cudaGetErrorName(e), cudaGetErrorString(e));
    } else if (r.count == 0) {
      r.reason = "the CUDA runtime finds no GPU";
    }
    return r;
  }();
  return a;
}

Gpu& gpu(int index) {
  const Availability& a = availability();
  WEFT_CHECK(index >= 0 && index < a.count, "device cuda:{} is not available: {}", index,
             a.count == 0 ? a.reason : fmt::format("this machine has {} GPU(s)", a.count));
  std::lock_guard lock(gpusMutex());
  auto& table = gpus();
  if (table.size() < static_cast<size_t>(a.count)) table.resize(static_cast<size_t>(a.count));
  auto& slot = table[static_cast<size_t>(index)];
  if (!slot) {
    auto g = std::make_unique<Gpu>();
    setCurrent(index);
    g->state.index = index;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&g->state.compute, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&g->state.upload, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&g->state.hostError), sizeof(KernelError)));
    *g->state.hostError = {};
    WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g->state.deviceError), sizeof(KernelError)));
    // On the compute stream, which does not wait for the legacy default stream's work.
    WEFT_CUDA_CHECK(cudaMemsetAsync(g->state.deviceError, 0, sizeof(KernelError), g->state.compute));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(g->state.compute));
    g->memory = std::make_unique<GpuMemory>(index);
    g->allocator = std::make_unique<CachingAllocator>(*g->memory, fmt::format("cuda:{}", index));
    g->state.allocator = g->allocator.get();
    g->tensorAllocator = std::make_unique<GpuAllocator>(g->state);
    g->uploadAllocator = std::make_unique<UploadAllocator>(g->state);
    slot = std::move(g);
  }
  return *slot;
}

}  // namespace

void fail(cudaError_t error, const char* call, const char* file, int line) {
  WEFT_THROW("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(error), cudaGetErrorString(error), call, file, line);
}

DeviceState& device(int index) { return gpu(index).state; }

void setCurrent(int index) { WEFT_CUDA_CHECK(cudaSetDevice(index)); }

}  // namespace weft::cuda

namespace weft {

int cudaDeviceCount() { return cuda::availability().count; }

std::string cudaUnavailableReason() { return cuda::availability().reason; }

namespace detail {

Allocator& cudaAllocator(int index) { return *cuda::gpu(index).tensorAllocator; }

MemoryStats cudaMemoryStats(int index) { return cuda::gpu(index).allocator->stats(); }

void cudaSynchronize(int index) {
  const cuda::DeviceState& d = cuda::device(index);
  cuda::setCurrent(index);
  WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
}

void cudaCopy(void* dst, const Device& dstDevice, const void* src, const Device& srcDevice, size_t bytes) {
  const bool toGpu = dstDevice.type == DeviceType::CUDA, fromGpu = srcDevice.type == DeviceType::CUDA;
  const cuda::DeviceState& d = cuda::device(toGpu ? dstDevice.index : srcDevice.index);
  cuda::setCurrent(d.index);
  // Queued after the kernels on the compute stream. The runtime returns from an asynchronous copy
  // from pageable memory once the source has been staged, and from one to pageable memory once
  // the data has landed (CUDA's "API synchronization behavior"), so host memory may be reused at
  // once. A copy from pinned (or managed) memory would still be reading it, so it is waited for
  // below, after the compute stream's queued work: uploadTo() is the asynchronous way in. A copy
  // to the host is always waited for.
  if (toGpu && fromGpu && dstDevice.index != srcDevice.index) {
    cudaSynchronize(srcDevice.index);
    WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dstDevice.index, src, srcDevice.index, bytes, d.compute));
    // The source GPU's later work may reuse the source's memory: the copy must be done first.
    WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
    return;
  }
  const cudaMemcpyKind kind = toGpu && fromGpu ? cudaMemcpyDeviceToDevice
                              : toGpu         ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToHost;
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, d.compute));
  if (!toGpu || (!fromGpu && cuda::isPinned(src))) WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
}

Allocator& cudaPinnedAllocator() { return cuda::pinnedAllocator(); }

MemoryStats cudaPinnedStats() { return cuda::pinnedAllocator().stats(); }

std::vector<Tensor> cudaUpload(const std::vector<Tensor>& tensors, int index) {
  cuda::Gpu& g = cuda::gpu(index);
  cuda::setCurrent(index);
  const Device device{DeviceType::CUDA, index};
  std::vector<Tensor> staging, out;
  try {
    for (const Tensor& t : tensors) {
      if (t.device() == device) {
        out.push_back(t);
        continue;
      }
      Tensor host = t;
      if (&t.buffer()->allocator() != &pinnedHostAllocator()) {
        host = Tensor::pinned(t.dtype(), t.shape());
        std::memcpy(host.raw(), t.raw(), t.bytes());
      }
      Tensor onGpu(std::make_shared<Buffer>(t.bytes(), device, *g.uploadAllocator), 0, t.dtype(), t.shape());
      WEFT_CUDA_CHECK(cudaMemcpyAsync(onGpu.raw(), host.raw(), t.bytes(), cudaMemcpyHostToDevice, g.state.upload));
      staging.push_back(std::move(host));
      out.push_back(std::move(onGpu));
    }
    // The copies have landed before the results are handed out and the staging buffers reused.
    WEFT_CUDA_CHECK(cudaStreamSynchronize(g.state.upload));
  } catch (...) {
    cudaStreamSynchronize(g.state.upload);
    throw;
  }
  return out;
}

}  // namespace detail
}  // namespace weft
