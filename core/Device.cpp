#include "core/Device.h"

#include "core/Error.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace weft {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) bytes = kCpuAlignment;
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

CpuAllocator& cpuAllocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace

std::string Device::str() const {
  return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string num = text.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(num.c_str(), &end, 10);
    WEFT_CHECK(!num.empty() && *end == '\0' && v >= 0, "invalid device '{}': bad index", text);
    index = static_cast<int>(v);
  }
  if (kind == "cpu") return {DeviceType::CPU, index};
  if (kind == "cuda") return {DeviceType::CUDA, index};
  WEFT_THROW("invalid device '{}' (expected cpu or cuda:N)", text);
}

#ifdef WEFT_HAVE_CUDA
namespace detail {
// core/cuda/Runtime.cpp
Allocator& cudaAllocator(int index);
MemoryStats cudaMemoryStats(int index);
void cudaCopy(void* dst, const Device& dstDevice, const void* src, const Device& srcDevice, size_t bytes);
void cudaSynchronize(int index);
Allocator& cudaPinnedAllocator();
MemoryStats cudaPinnedStats();
}  // namespace detail

bool hostMemoryPinnable() { return cudaDeviceCount() > 0; }

Allocator& pinnedHostAllocator() { return hostMemoryPinnable() ? detail::cudaPinnedAllocator() : cpuAllocator(); }

MemoryStats pinnedMemoryStats() { return hostMemoryPinnable() ? detail::cudaPinnedStats() : MemoryStats{}; }

Allocator& allocatorFor(const Device& device) {
  return device.type == DeviceType::CPU ? cpuAllocator() : detail::cudaAllocator(device.index);
}

void copyBytes(void* dst, const Device& dstDevice, const void* src, const Device& srcDevice, size_t bytes) {
  if (bytes == 0) return;
  if (dstDevice.type == DeviceType::CPU && srcDevice.type == DeviceType::CPU) {
    std::memcpy(dst, src, bytes);
  } else {
    detail::cudaCopy(dst, dstDevice, src, srcDevice, bytes);
  }
}

void synchronize(const Device& device) {
  if (device.type == DeviceType::CUDA) detail::cudaSynchronize(device.index);
}

MemoryStats memoryStats(const Device& device) {
  WEFT_CHECK(device.type == DeviceType::CUDA, "memory statistics are kept for GPUs, not for {}", device.str());
  return detail::cudaMemoryStats(device.index);
}
#else
namespace {
[[noreturn]] void noCuda(const Device& device) {
  WEFT_THROW("device {} is not available: {}", device.str(), cudaUnavailableReason());
}
}  // namespace

Allocator& allocatorFor(const Device& device) {
  if (device.type != DeviceType::CPU) noCuda(device);
  return cpuAllocator();
}

void copyBytes(void* dst, const Device& dstDevice, const void* src, const Device& srcDevice, size_t bytes) {
  if (dstDevice.type != DeviceType::CPU) noCuda(dstDevice);
  if (srcDevice.type != DeviceType::CPU) noCuda(srcDevice);
  if (bytes) std::memcpy(dst, src, bytes);
}

void synchronize(const Device&) {}

bool hostMemoryPinnable() { return false; }

Allocator& pinnedHostAllocator() { return cpuAllocator(); }

MemoryStats pinnedMemoryStats() { return {}; }

int cudaDeviceCount() { return 0; }

std::string cudaUnavailableReason() {
  return "weft was built without its CUDA backend (no CUDA toolkit was found, or WEFT_CUDA=OFF)";
}

MemoryStats memoryStats(const Device& device) { noCuda(device); }
#endif

}  // namespace weft
