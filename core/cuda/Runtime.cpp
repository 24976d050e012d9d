#include "core/cuda/Runtime.h"

#include "core/Device.h"

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

/// Serves Tensor buffers of one GPU from its caching allocator, on its compute stream.
class GpuAllocator final : public Allocator {
 public:
  explicit GpuAllocator(DeviceState& state) : state_(state) {}
  void* allocate(size_t bytes) override {
    return state_.allocator->allocate(bytes, reinterpret_cast<CachingAllocator::Stream>(state_.compute));
  }
  void deallocate(void* ptr, size_t) override { state_.allocator->deallocate(ptr); }

 private:
  DeviceState& state_;
};

struct Gpu {
  DeviceState state;
  std::unique_ptr<GpuMemory> memory;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<GpuAllocator> tensorAllocator;
};

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
    WEFT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&g->state.hostError), sizeof(KernelError)));
    *g->state.hostError = {};
    WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g->state.deviceError), sizeof(KernelError)));
    WEFT_CUDA_CHECK(cudaMemset(g->state.deviceError, 0, sizeof(KernelError)));
    g->memory = std::make_unique<GpuMemory>(index);
    g->allocator = std::make_unique<CachingAllocator>(*g->memory, fmt::format("cuda:{}", index));
    g->state.allocator = g->allocator.get();
    g->tensorAllocator = std::make_unique<GpuAllocator>(g->state);
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
  // Queued after the kernels on the compute stream. Host tensors live in pageable memory: the
  // runtime returns from an asynchronous copy from pageable memory once the source has been
  // staged, and from one to pageable memory once the data has landed (CUDA's "API
  // synchronization behavior"), so host memory may be reused at once.
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
  if (!toGpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(d.compute));
}

}  // namespace detail
}  // namespace weft
