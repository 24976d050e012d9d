#include "core/Device.h"

#include "core/Error.h"

#include <array>
#include <cstdlib>
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

std::array<Allocator*, 2>& allocators() {
  static CpuAllocator cpuAllocator;
  static std::array<Allocator*, 2> table{&cpuAllocator, nullptr};
  return table;
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

Allocator& allocatorFor(const Device& device) {
  Allocator* a = allocators()[static_cast<size_t>(device.type)];
  WEFT_CHECK(a != nullptr, "no backend is available for device {}", device.str());
  return *a;
}

void registerAllocator(DeviceType type, Allocator* allocator) {
  allocators()[static_cast<size_t>(type)] = allocator;
}

}  // namespace weft
