// The communication thread (see the header).
#include "dist/collective/Communicator.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "dist/collective/CollectiveOps.h"
#include "ops/RowIds.h"

#include <algorithm>
#include <cstring>

namespace weft::dist {

Communicator::Communicator(Ring& ring, TrafficLog& traffic)
    : ring_(ring), traffic_(traffic), rank_(ring.rank()), size_(ring.size()) {
  thread_ = std::thread([this] { loop(); });
}

Communicator::~Communicator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

Communicator& Communicator::byId(int64_t id) {
  auto* communicator = dynamic_cast<Communicator*>(&CollectiveBackend::byId(id));
  WEFT_CHECK(communicator != nullptr, "collective backend {} is not the host's ring, which this collective needs", id);
  return *communicator;
}

uint64_t Communicator::submit(std::vector<uint8_t> buffer, Collective collective, TrafficKind kind) {
  std::lock_guard lock(mutex_);
  const uint64_t ticket = nextTicket_++;
  jobs_[ticket] = Job{std::move(buffer), std::move(collective), kind, false};
  queue_.push_back(ticket);
  changed_.notify_all();
  return ticket;
}

std::vector<uint8_t> Communicator::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  auto it = jobs_.find(ticket);
  WEFT_CHECK(it != jobs_.end(), "collective {} was never submitted or was already collected", ticket);
  changed_.wait(lock, [&] { return it->second.done; });
  std::vector<uint8_t> buffer = std::move(it->second.buffer);
  jobs_.erase(it);
  if (failure_) std::rethrow_exception(failure_);
  return buffer;
}

void Communicator::sum(DType dtype, void* data, int64_t count) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * dtypeSize(dtype));
  std::memcpy(bytes.data(), data, bytes.size());
  bytes = run(
      std::move(bytes), [dtype, count](Ring& r, std::vector<uint8_t>& b) { r.allReduceSum(dtype, b.data(), count); },
      TrafficKind::Control);
  std::memcpy(data, bytes.data(), bytes.size());
}

std::vector<uint8_t> Communicator::broadcast(std::vector<uint8_t> bytes, int root) {
  return run(
      std::move(bytes), [root](Ring& r, std::vector<uint8_t>& b) { r.broadcast(b, root); }, TrafficKind::Control);
}

std::vector<uint8_t> Communicator::gather(std::vector<uint8_t> bytes) {
  return run(std::move(bytes), [](Ring& r, std::vector<uint8_t>& b) { b = r.allGather(b); }, TrafficKind::Control);
}

void Communicator::barrier(std::chrono::milliseconds patience) {
  run({}, [patience](Ring& r, std::vector<uint8_t>&) { r.allGatherSizes(0, Clock::now() + patience); },
      TrafficKind::Control);
}

namespace {

void writeTicket(KernelContext& ctx, uint64_t ticket) {
  ctx.output(0).data<int64_t>()[0] = static_cast<int64_t>(ticket);
}

uint64_t readTicket(const KernelContext& ctx) { return static_cast<uint64_t>(ctx.input(0).data<int64_t>()[0]); }

/// Multiplies a floating tensor by `scale`.
void scaleInPlace(Tensor& out, double scale) {
  if (scale == 1.0) return;
  dispatchFloat(out.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = out.data<T>();
    const T s = static_cast<T>(scale);
    for (int64_t i = 0, n = out.numel(); i < n; ++i) p[i] *= s;
  });
}

}  // namespace

// The inputs are packed into one buffer, summed in place by the ring, and unpacked by the wait.
void Communicator::startSum(KernelContext& ctx) {
  size_t total = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) total += ctx.input(i).bytes();
  std::vector<uint8_t> buffer(total);
  size_t offset = 0;
  for (int i = 0; i < ctx.numInputs(); ++i) {
    std::memcpy(buffer.data() + offset, ctx.input(i).raw(), ctx.input(i).bytes());
    offset += ctx.input(i).bytes();
  }
  const DType dtype = ctx.input(0).dtype();
  const auto wire = static_cast<DType>(ctx.attrs().getInt("wire", static_cast<int64_t>(dtype)));
  const auto count = static_cast<int64_t>(total / dtypeSize(dtype));
  const uint64_t ticket = submit(
      std::move(buffer),
      [dtype, wire, count](Ring& ring, std::vector<uint8_t>& b) { ring.allReduceSum(dtype, b.data(), count, wire); },
      TrafficKind::Dense);
  writeTicket(ctx, ticket);
}

void Communicator::finishSum(KernelContext& ctx, double scale) {
  const std::vector<uint8_t> buffer = wait(readTicket(ctx));
  size_t offset = 0;
  for (int i = 1; i < ctx.numInputs(); ++i) {
    Tensor& out = ctx.output(i - 1);
    WEFT_CHECK(offset + out.bytes() <= buffer.size(), "{}: the reduced buffer has {} bytes, fewer than the inputs",
               ctx.node->describe(), buffer.size());
    std::memcpy(out.raw(), buffer.data() + offset, out.bytes());
    offset += out.bytes();
    scaleInPlace(out, scale);
  }
}

void Communicator::startGather(KernelContext& ctx) {
  const Tensor& indices = ctx.input(0);
  const Tensor& values = ctx.input(1);
  traffic_.recordSparseRows(ctx.attrs().get<std::string>("variable"), indices.numel(),
                            groupRowsById(rowIds(indices)).count(), ctx.attrs().getInt("variable_rows"));
  std::vector<uint8_t> block(indices.bytes() + values.bytes());
  std::memcpy(block.data(), indices.raw(), indices.bytes());
  std::memcpy(block.data() + indices.bytes(), values.raw(), values.bytes());
  const std::string name = ctx.node->describe();
  const uint64_t ticket = submit(
      std::move(block),
      [name](Ring& ring, std::vector<uint8_t>& b) {
        const std::vector<uint64_t> sizes = ring.allGatherSizes(b.size());
        for (size_t r = 0; r < sizes.size(); ++r) {
          WEFT_CHECK(sizes[r] == b.size(),
                     "{}: rank {} gathers {} bytes of sparse rows but rank {} has {}: under the AR architecture every "
                     "worker needs a batch of the same shape",
                     name, r, sizes[r], ring.rank(), b.size());
        }
        b = ring.allGather(b);
      },
      TrafficKind::Sparse);
  writeTicket(ctx, ticket);
}

void Communicator::finishGather(KernelContext& ctx, double scale) {
  const std::vector<uint8_t> gathered = wait(readTicket(ctx));
  const size_t indexBytes = ctx.input(1).bytes(), valueBytes = ctx.input(2).bytes();
  const size_t world = gathered.size() / (indexBytes + valueBytes);
  Tensor& indices = ctx.output(0);
  Tensor& values = ctx.output(1);
  WEFT_CHECK(indices.bytes() == world * indexBytes && values.bytes() == world * valueBytes,
             "{}: gathered {} bytes, expected {} ranks of {} + {}", ctx.node->describe(), gathered.size(),
             indices.bytes() / std::max<size_t>(indexBytes, 1), indexBytes, valueBytes);
  for (size_t r = 0; r < world; ++r) {
    const uint8_t* block = gathered.data() + r * (indexBytes + valueBytes);
    std::memcpy(static_cast<uint8_t*>(indices.raw()) + r * indexBytes, block, indexBytes);
    std::memcpy(static_cast<uint8_t*>(values.raw()) + r * valueBytes, block + indexBytes, valueBytes);
  }
  scaleInPlace(values, scale);
}

namespace {

/// Where each tensor's shards lie in one buffer laid out rank by rank (every tensor's shard of
/// rank 0, then of rank 1, ...), the chunks the ring's reduce-scatter and all-gather work on.
struct ShardLayout {
  std::vector<std::vector<ShardRange>> shards;   ///< [rank][tensor], in elements of the tensor
  std::vector<std::vector<size_t>> placed;       ///< [rank][tensor]: byte offset in the buffer
  std::vector<size_t> chunkBytes;                ///< [rank]
  size_t total = 0;
};

ShardLayout shardLayout(const std::vector<int64_t>& numels, size_t element, int ranks) {
  ShardLayout layout;
  for (int r = 0; r < ranks; ++r) {
    layout.shards.emplace_back();
    layout.placed.emplace_back();
    size_t chunk = 0;
    for (int64_t n : numels) {
      const ShardRange shard = shardOf(n, r, ranks);
      layout.shards.back().push_back(shard);
      layout.placed.back().push_back(layout.total + chunk);
      chunk += static_cast<size_t>(shard.count) * element;
    }
    layout.chunkBytes.push_back(chunk);
    layout.total += chunk;
  }
  return layout;
}

/// Copies shard `shard` of a tensor (elements of `element` bytes) between it and the buffer.
void copyShard(const ShardRange& shard, size_t element, const void* from, size_t fromOffset, void* to,
               size_t toOffset) {
  if (shard.count == 0) return;
  std::memcpy(static_cast<uint8_t*>(to) + toOffset, static_cast<const uint8_t*>(from) + fromOffset,
              static_cast<size_t>(shard.count) * element);
}

/// The element count of each of a sharding collective's inputs.
std::vector<int64_t> numelsOf(const KernelContext& ctx) {
  std::vector<int64_t> numels;
  for (int i = 0; i < ctx.numInputs(); ++i) numels.push_back(ctx.input(i).numel());
  return numels;
}

void checkRank(const KernelContext& ctx, int rank, int size) {
  WEFT_CHECK(ctx.attrs().getInt("rank") == rank && ctx.attrs().getInt("world_size") == size,
             "{} was built for rank {} of {}, but runs on rank {} of {}", ctx.node->describe(),
             ctx.attrs().getInt("rank"), ctx.attrs().getInt("world_size"), rank, size);
}

}  // namespace

// Every input is packed rank by rank and reduce-scattered as one buffer; the wait unpacks this
// rank's chunk.
void Communicator::startReduceScatter(KernelContext& ctx) {
  checkRank(ctx, rank_, size_);
  const DType dtype = ctx.input(0).dtype();
  const size_t element = dtypeSize(dtype);
  const ShardLayout layout = shardLayout(numelsOf(ctx), element, size_);
  std::vector<uint8_t> buffer(layout.total);
  for (int r = 0; r < size_; ++r) {
    for (int t = 0; t < ctx.numInputs(); ++t) {
      const ShardRange& shard = layout.shards[static_cast<size_t>(r)][static_cast<size_t>(t)];
      copyShard(shard, element, ctx.input(t).raw(), static_cast<size_t>(shard.offset) * element, buffer.data(),
                layout.placed[static_cast<size_t>(r)][static_cast<size_t>(t)]);
    }
  }
  std::vector<int64_t> counts;
  for (size_t bytes : layout.chunkBytes) counts.push_back(static_cast<int64_t>(bytes / element));
  const uint64_t ticket = submit(
      std::move(buffer),
      [dtype, counts](Ring& ring, std::vector<uint8_t>& b) { ring.reduceScatterSum(dtype, b.data(), counts); },
      TrafficKind::Dense);
  writeTicket(ctx, ticket);
}

void Communicator::finishReduceScatter(KernelContext& ctx, double scale) {
  const std::vector<uint8_t> buffer = wait(readTicket(ctx));
  const size_t element = dtypeSize(ctx.attrs().get<DType>("dtype"));
  const ShardLayout layout = shardLayout(ctx.attrs().get<std::vector<int64_t>>("numels"), element, size_);
  WEFT_CHECK(buffer.size() == layout.total, "{}: the reduced buffer has {} bytes, the inputs {}",
             ctx.node->describe(), buffer.size(), layout.total);
  for (int t = 0; t < static_cast<int>(ctx.outputs.size()); ++t) {
    Tensor& out = ctx.output(t);
    const ShardRange& shard = layout.shards[static_cast<size_t>(rank_)][static_cast<size_t>(t)];
    copyShard(shard, element, buffer.data(), layout.placed[static_cast<size_t>(rank_)][static_cast<size_t>(t)],
              out.raw(), 0);
    scaleInPlace(out, scale);
  }
}

void Communicator::startShardGather(KernelContext& ctx) {
  checkRank(ctx, rank_, size_);
  const size_t element = dtypeSize(ctx.input(0).dtype());
  const ShardLayout layout = shardLayout(numelsOf(ctx), element, size_);
  std::vector<uint8_t> buffer(layout.total);
  for (int t = 0; t < ctx.numInputs(); ++t) {
    const ShardRange& shard = layout.shards[static_cast<size_t>(rank_)][static_cast<size_t>(t)];
    copyShard(shard, element, ctx.input(t).raw(), static_cast<size_t>(shard.offset) * element, buffer.data(),
              layout.placed[static_cast<size_t>(rank_)][static_cast<size_t>(t)]);
  }
  const std::vector<size_t> sizes = layout.chunkBytes;
  const uint64_t ticket = submit(
      std::move(buffer), [sizes](Ring& ring, std::vector<uint8_t>& b) { ring.allGatherChunks(b.data(), sizes); },
      TrafficKind::Dense);
  writeTicket(ctx, ticket);
}

void Communicator::finishShardGather(KernelContext& ctx) {
  const std::vector<uint8_t> buffer = wait(readTicket(ctx));
  const size_t element = dtypeSize(ctx.input(1).dtype());
  std::vector<int64_t> numels;
  for (int t = 0; t < static_cast<int>(ctx.outputs.size()); ++t) numels.push_back(ctx.output(t).numel());
  const ShardLayout layout = shardLayout(numels, element, size_);
  WEFT_CHECK(buffer.size() == layout.total, "{}: the gathered buffer has {} bytes, the variables {}",
             ctx.node->describe(), buffer.size(), layout.total);
  for (int r = 0; r < size_; ++r) {
    for (int t = 0; t < static_cast<int>(ctx.outputs.size()); ++t) {
      const ShardRange& shard = layout.shards[static_cast<size_t>(r)][static_cast<size_t>(t)];
      copyShard(shard, element, buffer.data(), layout.placed[static_cast<size_t>(r)][static_cast<size_t>(t)],
                ctx.output(t).raw(), static_cast<size_t>(shard.offset) * element);
    }
  }
}

// One tensor's shards laid out rank by rank are the tensor itself: the ring gathers straight into
// the start's second output, a value of the step's plan that lives until the wait hands it on.
void Communicator::startGatherWhole(KernelContext& ctx) {
  checkRank(ctx, rank_, size_);
  Tensor& whole = ctx.output(1);
  const size_t element = dtypeSize(whole.dtype());
  const ShardLayout layout = shardLayout({whole.numel()}, element, size_);
  const ShardRange& mine = layout.shards[static_cast<size_t>(rank_)][0];
  WEFT_CHECK(ctx.input(0).numel() == mine.count, "{}: the shard holds {} elements, rank {}'s part of {} is {}",
             ctx.node->describe(), ctx.input(0).numel(), rank_, whole.numel(), mine.count);
  copyShard(mine, element, ctx.input(0).raw(), 0, whole.raw(), layout.placed[static_cast<size_t>(rank_)][0]);
  auto* data = static_cast<uint8_t*>(whole.raw());
  const std::vector<size_t> sizes = layout.chunkBytes;
  const uint64_t ticket = submit(
      {}, [data, sizes](Ring& ring, std::vector<uint8_t>&) { ring.allGatherChunks(data, sizes); }, TrafficKind::Dense);
  writeTicket(ctx, ticket);
}

void Communicator::finishGatherWhole(KernelContext& ctx) {
  wait(readTicket(ctx));
  const Tensor& gathered = ctx.input(1);
  Tensor& whole = ctx.output(0);
  if (whole.raw() != gathered.raw()) std::memcpy(whole.raw(), gathered.raw(), whole.bytes());
}

void Communicator::settle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    return std::all_of(jobs_.begin(), jobs_.end(), [](const auto& job) { return job.second.done; });
  });
}

void Communicator::throwIfFailed() const {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
}

bool Communicator::sumsInFlight() const {
  std::lock_guard lock(mutex_);
  return !jobs_.empty();
}

void Communicator::abort(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (!failure_) failure_ = std::make_exception_ptr(Error(fmt::format("{} (rank {}): {}", name(), rank_, why)));
}

void Communicator::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const uint64_t ticket = queue_.front();
    queue_.pop_front();
    Job& job = jobs_.at(ticket);  // std::map: the reference survives other submissions
    if (!failure_) {
      lock.unlock();
      const Transport& transport = ring_.transport();
      const uint64_t sentBefore = transport.bytesSent(), receivedBefore = transport.bytesReceived();
      const uint64_t acrossBefore[2] = {ring_.bytesSentAcross(), ring_.bytesReceivedAcross()};
      std::exception_ptr error;
      try {
        job.collective(ring_, job.buffer);
      } catch (...) {
        error = std::current_exception();
      }
      traffic_.record(job.kind, transport.bytesSent() - sentBefore, transport.bytesReceived() - receivedBefore,
                      ring_.bytesSentAcross() - acrossBefore[0], ring_.bytesReceivedAcross() - acrossBefore[1]);
      lock.lock();
      if (error && !failure_) failure_ = error;
    }
    job.done = true;
    changed_.notify_all();
  }
}

}  // namespace weft::dist
