// Devices and their allocators. A backend contributes an Allocator for its DeviceType; callers
// name devices and never see backend types, so CUDA slots in without touching them.
#pragma once

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

/// The allocator that serves `device`; throws if no backend for it is registered.
Allocator& allocatorFor(const Device& device);
/// Installs the allocator for a device type (backends call this once at start-up).
void registerAllocator(DeviceType type, Allocator* allocator);

}  // namespace weft
