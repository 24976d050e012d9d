// Devices, their allocators and copies between them. The CUDA backend (core/cuda/) is compiled in
// when the toolkit is found; callers name devices and never see backend types.
#pragma once

#include "core/CachingAllocator.h"

#include <cstddef>
#include <string>

namespace weft {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  /// "cpu" or "cuda:1".
  std::string str() const;
  /// Parses "cpu", "cpu:0", "cuda", "cuda:1"; throws on anything else.
  static Device parse(const std::string& text);
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

inline Device cpu() { return {}; }

/// Raw memory for one device.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
};

/// Byte alignment of every CPU allocation (a cache line; enough for AVX-512 loads).
inline constexpr size_t kCpuAlignment = 64;

/// The allocator that serves `device`; throws, saying why, if the device is not available.
Allocator& allocatorFor(const Device& device);

/// Copies `bytes` between any two devices. Returns once the source may be overwritten and, for a
/// copy to the host, once the data has landed; a copy to a GPU is ordered before that GPU's later
/// kernels.
void copyBytes(void* dst, const Device& dstDevice, const void* src, const Device& srcDevice, size_t bytes);
/// Waits for the work queued on `device` (nothing to wait for on the CPU).
void synchronize(const Device& device);

/// Page-locked host memory where a GPU is visible, which the GPU's copy engines read and write
/// directly (uploadTo() copies from it on its own stream, overlapping compute); ordinary host
/// memory otherwise. Blocks are cached and reused like GPU memory (pinning is slow).
Allocator& pinnedHostAllocator();
/// Whether pinnedHostAllocator() hands out page-locked memory on this machine.
bool hostMemoryPinnable();
/// The page-locked cache's statistics (all zero where host memory is not pinned).
MemoryStats pinnedMemoryStats();

/// GPUs this process can use: 0 when weft was built without CUDA or the machine has no GPU.
int cudaDeviceCount();
/// Why cudaDeviceCount() is 0 ("" when it is not).
std::string cudaUnavailableReason();
/// The caching allocator's statistics for a GPU (see core/CachingAllocator.h).
MemoryStats memoryStats(const Device& device);

}  // namespace weft
