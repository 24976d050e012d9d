#include "core/CachingAllocator.h"

#include "core/Error.h"

#include <algorithm>

namespace weft {
namespace {

constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{2} << 20;

size_t roundUp(size_t n, size_t granule) { return (n + granule - 1) / granule * granule; }

std::string mebibytes(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

CachingAllocator::CachingAllocator(Device& device, std::string name) : device_(device), name_(std::move(name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  for (auto& [stream, blocks] : cached_) {
    for (auto& [bytes, ptr] : blocks) device_.free(ptr);
  }
}

size_t CachingAllocator::roundedSize(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  return bytes < kLargeThreshold ? roundUp(bytes, kSmallGranule) : roundUp(bytes, kLargeGranule);
}

void* CachingAllocator::takeCached(size_t bytes, Stream stream) {
  auto pool = cached_.find(stream);
  if (pool == cached_.end()) return nullptr;
  // The smallest block that fits; a much larger one would waste more than it saves.
  auto it = pool->second.lower_bound(bytes);
  if (it == pool->second.end() || it->first > 2 * bytes) return nullptr;
  void* ptr = it->second;
  live_[ptr] = {it->first, stream};
  pool->second.erase(it);
  return ptr;
}

void* CachingAllocator::allocate(size_t bytes, Stream stream) {
  const size_t size = roundedSize(bytes);
  std::lock_guard lock(mutex_);
  ++stats_.allocations;
  void* ptr = takeCached(size, stream);
  if (ptr) {
    ++stats_.cacheHits;
  } else {
    ptr = device_.allocate(size);
    if (!ptr) {
      releaseCachedLocked();
      ptr = device_.allocate(size);
    }
    WEFT_CHECK(ptr != nullptr, "out of memory on {}: cannot allocate {} ({} allocated, {} reserved, peak {})", name_,
               mebibytes(size), mebibytes(stats_.allocatedBytes), mebibytes(stats_.reservedBytes),
               mebibytes(stats_.peakAllocatedBytes));
    ++stats_.deviceAllocations;
    live_[ptr] = {size, stream};
    stats_.reservedBytes += size;
    stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  }
  stats_.allocatedBytes += live_[ptr].bytes;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  WEFT_CHECK(it != live_.end(), "{}: freeing a pointer this allocator did not hand out", name_);
  const Block block = it->second;
  live_.erase(it);
  stats_.allocatedBytes -= block.bytes;
  cached_[block.stream].emplace(block.bytes, ptr);
}

void CachingAllocator::releaseCached() {
  std::lock_guard lock(mutex_);
  releaseCachedLocked();
}

void CachingAllocator::releaseCachedLocked() {
  device_.synchronize();
  for (auto& [stream, blocks] : cached_) {
    for (auto& [bytes, ptr] : blocks) {
      device_.free(ptr);
      stats_.reservedBytes -= bytes;
    }
  }
  cached_.clear();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace weft
