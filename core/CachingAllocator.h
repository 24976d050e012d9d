// A caching allocator for device memory. Raw device allocation is slow and synchronises the
// device (cudaMalloc, cudaFree), so blocks freed by tensors are kept and handed out again: after
// its first step a training loop no longer reaches the device's allocator at all.
//
// Sizes are rounded to classes (512-byte multiples below 1 MiB, 2 MiB multiples above), and a
// request is served by the smallest cached block of at least its class and at most twice it.
// Every block belongs to the stream it was allocated for: work queued on one stream runs in
// order, so a block freed there may be reused there at once, while another stream could still be
// reading it — blocks move between streams only through the device (after a synchronisation).
// When the device is out of memory the allocator waits for the device, returns every cached block
// and tries once more before it fails with the sizes in the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

namespace weft {

/// What a device's allocator holds. Sizes are the rounded sizes of blocks.
struct MemoryStats {
  size_t allocatedBytes = 0;       // in blocks handed out now
  size_t reservedBytes = 0;        // taken from the device: handed out + cached
  size_t peakAllocatedBytes = 0;
  size_t peakReservedBytes = 0;
  uint64_t allocations = 0;        // requests served
  uint64_t cacheHits = 0;          // requests served from a cached block
  uint64_t deviceAllocations = 0;  // requests that reached the device
};

class CachingAllocator {
 public:
  /// An opaque stream handle (a cudaStream_t); 0 is the default stream.
  using Stream = uintptr_t;

  /// The device underneath.
  class Device {
   public:
    virtual ~Device() = default;
    /// Returns null when the device is out of memory.
    virtual void* allocate(size_t bytes) = 0;
    virtual void free(void* ptr) = 0;
    /// Waits until all work queued on the device has finished.
    virtual void synchronize() = 0;
  };

  /// `name` ("cuda:0") appears in error messages.
  CachingAllocator(Device& device, std::string name);
  /// Returns every cached block; blocks still handed out are the owners' to free first.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// A block of at least `bytes` for use on `stream`; throws weft::Error when the device has no
  /// memory left even after the cache is returned to it.
  void* allocate(size_t bytes, Stream stream = 0);
  /// Takes back a block from allocate(); it stays cached for its stream.
  void deallocate(void* ptr);
  /// Waits for the device and returns every cached block to it.
  void releaseCached();
  MemoryStats stats() const;

  /// The size class that a request of `bytes` is served from.
  static size_t roundedSize(size_t bytes);

 private:
  struct Block {
    size_t bytes;
    Stream stream;
  };
  void* takeCached(size_t bytes, Stream stream);
  void releaseCachedLocked();

  Device& device_;
  std::string name_;
  mutable std::mutex mutex_;
  std::map<Stream, std::multimap<size_t, void*>> cached_;  // free blocks per stream, by size
  std::unordered_map<void*, Block> live_;                  // handed-out blocks
  MemoryStats stats_;
};

}  // namespace weft
