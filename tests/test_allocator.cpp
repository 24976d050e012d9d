// The caching allocator that serves device memory: size classes, reuse per stream, statistics,
// and what happens when the device runs out. A counting host "device" stands in for the GPU, so
// these run everywhere.
#include "tests/TestUtil.h"

#include "core/CachingAllocator.h"

#include <cstdlib>
#include <set>

using namespace weft;

namespace {

/// Host memory with a capacity, counting what it is asked for.
class CountingDevice final : public CachingAllocator::Device {
 public:
  explicit CountingDevice(size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  ~CountingDevice() override { CHECK(live.empty()); }
  void* allocate(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    void* p = std::malloc(bytes);
    used_ += bytes;
    live[p] = bytes;
    return p;
  }
  void free(void* ptr) override {
    used_ -= live.at(ptr);
    live.erase(ptr);
    std::free(ptr);
  }
  void synchronize() override { ++synchronizations; }

  std::map<void*, size_t> live;
  int synchronizations = 0;

 private:
  size_t capacity_;
  size_t used_ = 0;
};

constexpr size_t MiB = size_t{1} << 20;

}  // namespace

TEST_CASE("sizes round to 512-byte classes below 1 MiB and 2 MiB classes above") {
  CHECK(CachingAllocator::roundedSize(0) == 512);
  CHECK(CachingAllocator::roundedSize(1) == 512);
  CHECK(CachingAllocator::roundedSize(512) == 512);
  CHECK(CachingAllocator::roundedSize(513) == 1024);
  CHECK(CachingAllocator::roundedSize(MiB - 1) == MiB);
  CHECK(CachingAllocator::roundedSize(MiB) == 2 * MiB);
  CHECK(CachingAllocator::roundedSize(5 * MiB + 1) == 6 * MiB);
}

TEST_CASE("a freed block serves the next request of its class on the same stream") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  void* p = a.allocate(1000);
  a.deallocate(p);
  CHECK(a.allocate(900) == p);
  const MemoryStats s = a.stats();
  CHECK(s.allocations == 2);
  CHECK(s.cacheHits == 1);
  CHECK(s.deviceAllocations == 1);
  CHECK(device.live.size() == 1);
  a.deallocate(p);
}

TEST_CASE("a block freed on one stream is not handed to another") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  void* p = a.allocate(4096, /*stream=*/1);
  a.deallocate(p);
  void* q = a.allocate(4096, /*stream=*/2);
  CHECK(q != p);
  CHECK(a.stats().deviceAllocations == 2);
  CHECK(a.allocate(4096, 1) == p);
  a.deallocate(p);
  a.deallocate(q);
}

TEST_CASE("a cached block at most twice the request serves it; a larger one does not") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  void* big = a.allocate(8 * MiB);
  a.deallocate(big);
  void* small = a.allocate(2 * MiB);  // 8 MiB > 2 x 2 MiB: a new block
  CHECK(small != big);
  void* half = a.allocate(4 * MiB);  // 8 MiB <= 2 x 4 MiB: the cached block
  CHECK(half == big);
  CHECK(a.stats().allocatedBytes == 2 * MiB + 8 * MiB);
  a.deallocate(small);
  a.deallocate(half);
}

TEST_CASE("statistics track allocated, reserved and peak bytes") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  void* p = a.allocate(3 * MiB);    // class 4 MiB
  void* q = a.allocate(100);        // class 512 B
  MemoryStats s = a.stats();
  CHECK(s.allocatedBytes == 4 * MiB + 512);
  CHECK(s.reservedBytes == 4 * MiB + 512);
  a.deallocate(p);
  s = a.stats();
  CHECK(s.allocatedBytes == 512);
  CHECK(s.reservedBytes == 4 * MiB + 512);  // cached, still held from the device
  CHECK(s.peakAllocatedBytes == 4 * MiB + 512);
  a.releaseCached();
  s = a.stats();
  CHECK(s.reservedBytes == 512);
  CHECK(s.peakReservedBytes == 4 * MiB + 512);
  CHECK(device.live.size() == 1);
  CHECK(device.synchronizations == 1);
  a.deallocate(q);
}

TEST_CASE("out of memory returns the cache to the device and tries again") {
  CountingDevice device(10 * MiB);
  CachingAllocator a(device, "test:0");
  void* p = a.allocate(6 * MiB);
  a.deallocate(p);  // cached: 6 MiB of the 10 held
  void* q = a.allocate(8 * MiB);  // fits only once the cached block is returned
  CHECK(q != nullptr);
  CHECK(device.synchronizations == 1);
  CHECK(a.stats().reservedBytes == 8 * MiB);
  a.deallocate(q);
}

TEST_CASE("a request the device cannot hold fails with the device and the sizes") {
  CountingDevice device(10 * MiB);
  CachingAllocator a(device, "test:3");
  void* p = a.allocate(4 * MiB);
  const std::string e = errorOf([&] { a.allocate(7 * MiB); });
  CHECK(contains(e, "out of memory on test:3"));
  CHECK(contains(e, "cannot allocate 8.0 MiB"));
  CHECK(contains(e, "4.0 MiB allocated"));
  // Nothing was lost: the live block is intact and can be freed.
  CHECK(a.stats().allocatedBytes == 4 * MiB);
  a.deallocate(p);
}

TEST_CASE("freeing a pointer the allocator did not hand out is refused") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  int local = 0;
  CHECK(contains(errorOf([&] { a.deallocate(&local); }), "did not hand out"));
}

TEST_CASE("blocks are reused in a steady loop: no device allocation after the first round") {
  CountingDevice device;
  CachingAllocator a(device, "test:0");
  const std::vector<size_t> sizes{100, 70000, 3 * MiB, 512, 70000};
  for (int round = 0; round < 5; ++round) {
    std::vector<void*> held;
    for (size_t n : sizes) held.push_back(a.allocate(n));
    CHECK(std::set<void*>(held.begin(), held.end()).size() == held.size());
    for (void* p : held) a.deallocate(p);
  }
  CHECK(a.stats().deviceAllocations == sizes.size());
  CHECK(a.stats().cacheHits == 4 * sizes.size());
}
