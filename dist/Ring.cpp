// Ring collectives over tagged UCX messages (see the header).
#include "dist/Ring.h"

#include "core/Error.h"
#include "core/Tensor.h"

#include <cstring>

namespace weft::dist {

namespace {

/// Tag layout: sequence (40 bits) | phase (8 bits) | step (16 bits).
uint64_t tagOf(uint64_t sequence, int phase, int step) {
  return (sequence << 24) | (static_cast<uint64_t>(phase) << 16) | static_cast<uint64_t>(step);
}

enum Phase { kReduceScatter = 0, kGatherReduced = 1, kGatherSizes = 2, kGatherBlocks = 3, kBroadcast = 4 };

template <class T>
void addInto(void* into, const void* from, int64_t count) {
  T* a = static_cast<T*>(into);
  const T* b = static_cast<const T*>(from);
  for (int64_t i = 0; i < count; ++i) a[i] += b[i];
}

void addElements(DType dtype, void* into, const void* from, int64_t count) {
  switch (dtype) {
    case DType::F32: return addInto<float>(into, from, count);
    case DType::F64: return addInto<double>(into, from, count);
    case DType::I64: return addInto<int64_t>(into, from, count);
    default: WEFT_THROW("AllReduce: dtype {} is not supported (f32, f64, i64 are)", dtypeName(dtype));
  }
}

}  // namespace

Ring::Ring(UcxTransport& transport, int rank, std::vector<int> peers, std::chrono::milliseconds timeout)
    : transport_(transport), rank_(rank), peers_(std::move(peers)), timeout_(timeout) {
  WEFT_CHECK(rank_ >= 0 && rank_ < size(), "ring: rank {} out of range for {} ranks", rank_, size());
}

void Ring::shift(const char* collective, uint64_t sequence, int phase, int step, std::span<const uint8_t> out,
                 std::span<uint8_t> into, Deadline deadline) {
  try {
    transport_.exchange(peers_[static_cast<size_t>(right())], tagOf(sequence, phase, step), out,
                        peers_[static_cast<size_t>(left())], tagOf(sequence, phase, step), into, deadline);
  } catch (const Error& e) {
    WEFT_THROW("{} #{} at rank {}: ring step {} (phase {}) with rank {} (sending) and rank {} (receiving) "
               "failed: {}",
               collective, sequence, rank_, step, phase, right(), left(), e.what());
  }
}

void Ring::circulate(const char* collective, uint64_t sequence, int phase, std::vector<std::span<uint8_t>> blocks,
                     int firstOwnedShift, Deadline deadline) {
  const int n = size();
  for (int step = 0; step < n - 1; ++step) {
    const int sent = ((rank_ + firstOwnedShift - step) % n + n) % n;
    const int received = (sent + n - 1) % n;
    shift(collective, sequence, phase, step, blocks[static_cast<size_t>(sent)],
          blocks[static_cast<size_t>(received)], deadline);
  }
}

void Ring::allReduceSum(DType dtype, void* data, int64_t count) {
  const uint64_t sequence = sequence_++;
  const int n = size();
  if (n == 1 || count == 0) return;
  const Deadline deadline = Clock::now() + timeout_;
  const size_t element = dtypeSize(dtype);
  auto chunkBegin = [&](int i) { return count * i / n; };
  auto chunk = [&](int i) {
    return std::span<uint8_t>(static_cast<uint8_t*>(data) + chunkBegin(i) * static_cast<int64_t>(element),
                              static_cast<size_t>(chunkBegin(i + 1) - chunkBegin(i)) * element);
  };
  // Reduce-scatter: after step s, chunk (rank - s - 1) holds the sum over s + 2 ranks; after
  // n - 1 steps this rank holds the full sum of chunk (rank + 1).
  std::vector<uint8_t> incoming(chunk(0).size() + element);
  for (int step = 0; step < n - 1; ++step) {
    const int sent = ((rank_ - step) % n + n) % n;
    const int received = (sent + n - 1) % n;
    std::span<uint8_t> target = chunk(received);
    shift("AllReduce", sequence, kReduceScatter, step, chunk(sent), std::span(incoming).first(target.size()),
          deadline);
    addElements(dtype, target.data(), incoming.data(), static_cast<int64_t>(target.size() / element));
  }
  // All-gather the reduced chunks: rank r owns chunk r + 1.
  std::vector<std::span<uint8_t>> chunks;
  for (int i = 0; i < n; ++i) chunks.push_back(chunk(i));
  circulate("AllReduce", sequence, kGatherReduced, chunks, 1, deadline);
}

std::vector<uint64_t> Ring::allGatherSizes(uint64_t mine) {
  const uint64_t sequence = sequence_++;
  std::vector<uint64_t> sizes(static_cast<size_t>(size()));
  sizes[static_cast<size_t>(rank_)] = mine;
  std::vector<std::span<uint8_t>> blocks;
  for (uint64_t& s : sizes) blocks.emplace_back(reinterpret_cast<uint8_t*>(&s), sizeof s);
  circulate("AllGather(sizes)", sequence, kGatherSizes, blocks, 0, Clock::now() + timeout_);
  return sizes;
}

std::vector<uint8_t> Ring::allGather(std::span<const uint8_t> block) {
  const std::vector<uint64_t> sizes = allGatherSizes(block.size());
  const uint64_t sequence = sequence_++;
  size_t total = 0;
  for (uint64_t s : sizes) total += s;
  std::vector<uint8_t> out(total);
  std::vector<std::span<uint8_t>> blocks;
  size_t offset = 0;
  for (uint64_t s : sizes) {
    blocks.emplace_back(out.data() + offset, s);
    offset += s;
  }
  std::memcpy(blocks[static_cast<size_t>(rank_)].data(), block.data(), block.size());
  circulate("AllGather", sequence, kGatherBlocks, blocks, 0, Clock::now() + timeout_);
  return out;
}

void Ring::broadcast(std::span<uint8_t> data, int root) {
  const uint64_t sequence = sequence_++;
  WEFT_CHECK(root >= 0 && root < size(), "Broadcast: root {} out of range for {} ranks", root, size());
  const Deadline deadline = Clock::now() + timeout_;
  // A chain from the root around the ring: receive from the left, pass on to the right.
  const int position = (rank_ - root + size()) % size();
  try {
    if (position > 0)
      transport_.receive(tagOf(sequence, kBroadcast, 0), data, deadline, peers_[static_cast<size_t>(left())]);
    if (position < size() - 1)
      transport_.send(peers_[static_cast<size_t>(right())], tagOf(sequence, kBroadcast, 0), data, deadline);
  } catch (const Error& e) {
    WEFT_THROW("Broadcast #{} from rank {} at rank {} (receiving from rank {}, sending to rank {}) failed: {}",
               sequence, root, rank_, left(), right(), e.what());
  }
}

}  // namespace weft::dist
