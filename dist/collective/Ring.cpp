// Ring collectives over tagged UCX messages (see the header).
#include "dist/collective/Ring.h"

#include "core/Error.h"
#include "core/Half.h"
#include "core/Tensor.h"

#include <algorithm>
#include <cstring>

namespace weft::dist {

namespace {

/// Tag layout: channel (8 bits) and sequence (32 bits), as sequence_ counts | phase (8 bits) | step (16 bits).
uint64_t tagOf(uint64_t sequence, int phase, int step) {
  return (sequence << 24) | (static_cast<uint64_t>(phase) << 16) | static_cast<uint64_t>(step);
}

enum Phase {
  kReduceScatter = 0,
  kGatherReduced = 1,
  kGatherSizes = 2,
  kGatherBlocks = 3,
  kBroadcast = 4,
  kMachineReduce = 5,  // a rank's buffer to its machine's first rank; step: the rank's place there
  kMachineResult = 6,  // the sum back from the machine's first rank
};

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

Ring::Ring(Transport& transport, int rank, std::vector<int> peers, std::chrono::milliseconds timeout, int channel)
    : transport_(transport), rank_(rank), peers_(std::move(peers)), timeout_(timeout),
      sequence_(static_cast<uint64_t>(channel) << 32) {  // the channel is the tag's top byte
  WEFT_CHECK(rank_ >= 0 && rank_ < size(), "ring: rank {} out of range for {} ranks", rank_, size());
  WEFT_CHECK(channel >= 0 && channel < 0x50, "ring: channel {} is not one of 0..79 (above are other protocols' tags)",
             channel);
}

void Ring::setMachines(std::vector<int> machineOfRank, bool hierarchical) {
  WEFT_CHECK(static_cast<int>(machineOfRank.size()) == size(), "ring: machines given for {} ranks, the ring has {}",
             machineOfRank.size(), size());
  bool shared = false;
  int machines = 1;
  for (size_t r = 1; r < machineOfRank.size(); ++r) {
    if (machineOfRank[r] == machineOfRank[r - 1]) {
      shared = true;
      continue;
    }
    ++machines;
    for (size_t q = 0; q + 1 < r; ++q)
      WEFT_CHECK(machineOfRank[q] != machineOfRank[r], "ring: the ranks of machine {} are not consecutive",
                 machineOfRank[r]);
  }
  machineOf_ = std::move(machineOfRank);
  hierarchical_ = hierarchical && shared && machines > 1;
}

Ring::Circle Ring::everyone() const {
  Circle c{std::vector<int>(static_cast<size_t>(size())), rank_};
  for (int r = 0; r < size(); ++r) c.ranks[static_cast<size_t>(r)] = r;
  return c;
}

void Ring::countBytes(int peerRank, size_t sent, size_t received) {
  if (!machineOf_.empty() && machineOf_[static_cast<size_t>(peerRank)] == machineOf_[static_cast<size_t>(rank_)])
    return;
  sentAcross_ += sent;
  receivedAcross_ += received;
}

void Ring::shift(const Circle& circle, const char* collective, uint64_t sequence, int phase, int step,
                 std::span<const uint8_t> out, std::span<uint8_t> into, Deadline deadline) {
  const int right = circle.right(), left = circle.left();
  try {
    transport_.exchange(peers_[static_cast<size_t>(right)], tagOf(sequence, phase, step), out,
                        peers_[static_cast<size_t>(left)], tagOf(sequence, phase, step), into, deadline);
  } catch (const Error& e) {
    WEFT_THROW("{} #{} at rank {}: ring step {} (phase {}) with rank {} (sending) and rank {} (receiving) "
               "failed: {}",
               collective, sequence, rank_, step, phase, right, left, e.what());
  }
  countBytes(right, out.size(), 0);
  countBytes(left, 0, into.size());
}

void Ring::circulate(const Circle& circle, const char* collective, uint64_t sequence, int phase,
                     std::vector<std::span<uint8_t>> blocks, int firstOwnedShift, Deadline deadline) {
  const int n = circle.size();
  for (int step = 0; step < n - 1; ++step) {
    const int sent = ((circle.position + firstOwnedShift - step) % n + n) % n;
    const int received = (sent + n - 1) % n;
    shift(circle, collective, sequence, phase, step, blocks[static_cast<size_t>(sent)],
          blocks[static_cast<size_t>(received)], deadline);
  }
}

void Ring::allReduceSum(DType dtype, void* data, int64_t count, DType wire) {
  WEFT_CHECK(wire == dtype || (dtype == DType::F32 && (wire == DType::BF16 || wire == DType::F16)),
             "AllReduce: {} values cannot travel as {} (only f32 sums travel narrower, as bf16 or f16)",
             dtypeName(dtype), dtypeName(wire));
  const uint64_t sequence = sequence_++;
  if (size() == 1 || count == 0) return;
  const Deadline deadline = Clock::now() + timeout_;
  if (hierarchical_) return hierarchicalAllReduce(sequence, dtype, wire, data, count, deadline);
  if (wire != dtype) return narrowRingAllReduce(everyone(), sequence, wire, static_cast<float*>(data), count, deadline);
  ringAllReduce(everyone(), sequence, dtype, data, count, deadline);
}

void Ring::hierarchicalAllReduce(uint64_t sequence, DType dtype, DType wire, void* data, int64_t count,
                                 Deadline deadline) {
  const int machine = machineOf_[static_cast<size_t>(rank_)];
  int first = rank_, last = rank_;
  while (first > 0 && machineOf_[static_cast<size_t>(first - 1)] == machine) --first;
  while (last + 1 < size() && machineOf_[static_cast<size_t>(last + 1)] == machine) ++last;
  const auto bytes = std::span<uint8_t>(static_cast<uint8_t*>(data), static_cast<size_t>(count) * dtypeSize(dtype));
  const int place = rank_ - first;
  if (place > 0) {  // hand this rank's buffer to the machine's first rank and take the sum back
    const int peer = peers_[static_cast<size_t>(first)];
    try {
      transport_.send(peer, tagOf(sequence, kMachineReduce, place), bytes, deadline);
      transport_.receive(tagOf(sequence, kMachineResult, place), bytes, deadline, peer);
    } catch (const Error& e) {
      WEFT_THROW("AllReduce #{} at rank {}: reducing through rank {}, the first of its machine, failed: {}", sequence,
                 rank_, first, e.what());
    }
    return;
  }
  std::vector<uint8_t> incoming(bytes.size());
  for (int r = first + 1; r <= last; ++r) {
    try {
      transport_.receive(tagOf(sequence, kMachineReduce, r - first), incoming, deadline,
                         peers_[static_cast<size_t>(r)]);
    } catch (const Error& e) {
      WEFT_THROW("AllReduce #{} at rank {}: the buffer of rank {} of its machine did not arrive: {}", sequence, rank_,
                 r, e.what());
    }
    addElements(dtype, data, incoming.data(), count);
  }
  Circle firsts;
  for (int r = 0; r < size(); ++r) {
    if (r > 0 && machineOf_[static_cast<size_t>(r)] == machineOf_[static_cast<size_t>(r - 1)]) continue;
    if (r == rank_) firsts.position = firsts.size();
    firsts.ranks.push_back(r);
  }
  // Only the ring between machines is narrowed: within a machine the sums stay exact.
  if (firsts.size() > 1 && wire != dtype)
    narrowRingAllReduce(firsts, sequence, wire, static_cast<float*>(data), count, deadline);
  else if (firsts.size() > 1)
    ringAllReduce(firsts, sequence, dtype, data, count, deadline);
  for (int r = first + 1; r <= last; ++r) {
    try {
      transport_.send(peers_[static_cast<size_t>(r)], tagOf(sequence, kMachineResult, r - first), bytes, deadline);
    } catch (const Error& e) {
      WEFT_THROW("AllReduce #{} at rank {}: handing the sum to rank {} of its machine failed: {}", sequence, rank_, r,
                 e.what());
    }
  }
}

void Ring::reduceScatter(const Circle& circle, const char* collective, uint64_t sequence, DType dtype,
                         const std::vector<std::span<uint8_t>>& chunks, int ownedShift, Deadline deadline) {
  const int n = circle.size();
  const size_t element = dtypeSize(dtype);
  size_t largest = 0;
  for (const std::span<uint8_t>& c : chunks) largest = std::max(largest, c.size());
  // After step s, chunk (p + ownedShift - s - 2) holds the sum over s + 2 ranks; after n - 1
  // steps this rank holds the full sum of chunk p + ownedShift.
  std::vector<uint8_t> incoming(largest + element);
  for (int step = 0; step < n - 1; ++step) {
    const int sent = ((circle.position + ownedShift - 1 - step) % n + n) % n;
    const int received = (sent + n - 1) % n;
    const std::span<uint8_t> target = chunks[static_cast<size_t>(received)];
    shift(circle, collective, sequence, kReduceScatter, step, chunks[static_cast<size_t>(sent)],
          std::span(incoming).first(target.size()), deadline);
    addElements(dtype, target.data(), incoming.data(), static_cast<int64_t>(target.size() / element));
  }
}

void Ring::ringAllReduce(const Circle& circle, uint64_t sequence, DType dtype, void* data, int64_t count,
                         Deadline deadline) {
  const int n = circle.size();
  const size_t element = dtypeSize(dtype);
  auto chunkBegin = [&](int i) { return count * i / n; };
  std::vector<std::span<uint8_t>> chunks;
  for (int i = 0; i < n; ++i) {
    chunks.emplace_back(static_cast<uint8_t*>(data) + chunkBegin(i) * static_cast<int64_t>(element),
                        static_cast<size_t>(chunkBegin(i + 1) - chunkBegin(i)) * element);
  }
  reduceScatter(circle, "AllReduce", sequence, dtype, chunks, 1, deadline);
  // All-gather the reduced chunks: rank r owns chunk r + 1.
  circulate(circle, "AllReduce", sequence, kGatherReduced, chunks, 1, deadline);
}

void Ring::reduceScatterSum(DType dtype, void* data, std::span<const int64_t> counts) {
  WEFT_CHECK(static_cast<int>(counts.size()) == size(), "ReduceScatter: chunks given for {} ranks, the ring has {}",
             counts.size(), size());
  const uint64_t sequence = sequence_++;
  if (size() == 1) return;
  const size_t element = dtypeSize(dtype);
  std::vector<std::span<uint8_t>> chunks;
  auto* next = static_cast<uint8_t*>(data);
  for (int64_t c : counts) {
    chunks.emplace_back(next, static_cast<size_t>(c) * element);
    next += chunks.back().size();
  }
  reduceScatter(everyone(), "ReduceScatter", sequence, dtype, chunks, 0, Clock::now() + timeout_);
}

void Ring::allGatherChunks(void* data, std::span<const size_t> sizes) {
  WEFT_CHECK(static_cast<int>(sizes.size()) == size(), "AllGather: chunks given for {} ranks, the ring has {}",
             sizes.size(), size());
  const uint64_t sequence = sequence_++;
  if (size() == 1) return;
  std::vector<std::span<uint8_t>> chunks;
  auto* next = static_cast<uint8_t*>(data);
  for (size_t bytes : sizes) {
    chunks.emplace_back(next, bytes);
    next += bytes;
  }
  circulate(everyone(), "AllGather", sequence, kGatherBlocks, chunks, 0, Clock::now() + timeout_);
}

namespace {

uint16_t narrowed(DType wire, float value) {
  return wire == DType::BF16 ? half_bits::bfloat16FromFloat(value) : half_bits::float16FromFloat(value);
}

float widened(DType wire, uint16_t bits) {
  return wire == DType::BF16 ? half_bits::bfloat16ToFloat(bits) : half_bits::float16ToFloat(bits);
}

std::span<uint8_t> bytesOf(std::span<uint16_t> values) {
  return {reinterpret_cast<uint8_t*>(values.data()), values.size_bytes()};
}

}  // namespace

void Ring::narrowRingAllReduce(const Circle& circle, uint64_t sequence, DType wire, float* data, int64_t count,
                               Deadline deadline) {
  const int n = circle.size();
  const int position = circle.position;
  auto begin = [&](int i) { return count * i / n; };
  auto length = [&](int i) { return static_cast<size_t>(begin(i + 1) - begin(i)); };
  // The same steps as ringAllReduce: the partial sums travel rounded, and are added in f32.
  std::vector<uint16_t> outgoing(length(0) + 1), incoming(length(0) + 1);
  for (int step = 0; step < n - 1; ++step) {
    const int sent = ((position - step) % n + n) % n;
    const int received = (sent + n - 1) % n;
    for (size_t i = 0; i < length(sent); ++i) outgoing[i] = narrowed(wire, data[begin(sent) + static_cast<int64_t>(i)]);
    shift(circle, "AllReduce", sequence, kReduceScatter, step, bytesOf(std::span(outgoing).first(length(sent))),
          bytesOf(std::span(incoming).first(length(received))), deadline);
    for (size_t i = 0; i < length(received); ++i)
      data[begin(received) + static_cast<int64_t>(i)] += widened(wire, incoming[i]);
  }
  // This rank owns chunk position + 1: it rounds that chunk once, and every rank (itself
  // included) takes the rounded values, so the replicas stay identical.
  std::vector<uint16_t> all(static_cast<size_t>(count));
  const int owned = (position + 1) % n;
  for (size_t i = 0; i < length(owned); ++i)
    all[static_cast<size_t>(begin(owned)) + i] = narrowed(wire, data[begin(owned) + static_cast<int64_t>(i)]);
  std::vector<std::span<uint8_t>> chunks;
  for (int i = 0; i < n; ++i)
    chunks.push_back(bytesOf(std::span(all).subspan(static_cast<size_t>(begin(i)), length(i))));
  circulate(circle, "AllReduce", sequence, kGatherReduced, chunks, 1, deadline);
  for (int64_t i = 0; i < count; ++i) data[i] = widened(wire, all[static_cast<size_t>(i)]);
}

std::vector<uint64_t> Ring::allGatherSizes(uint64_t mine) { return allGatherSizes(mine, Clock::now() + timeout_); }

std::vector<uint64_t> Ring::allGatherSizes(uint64_t mine, Deadline deadline) {
  const uint64_t sequence = sequence_++;
  std::vector<uint64_t> sizes(static_cast<size_t>(size()));
  sizes[static_cast<size_t>(rank_)] = mine;
  std::vector<std::span<uint8_t>> blocks;
  for (uint64_t& s : sizes) blocks.emplace_back(reinterpret_cast<uint8_t*>(&s), sizeof s);
  circulate(everyone(), "AllGather(sizes)", sequence, kGatherSizes, blocks, 0, deadline);
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
  if (!block.empty()) std::memcpy(blocks[static_cast<size_t>(rank_)].data(), block.data(), block.size());
  circulate(everyone(), "AllGather", sequence, kGatherBlocks, blocks, 0, Clock::now() + timeout_);
  return out;
}

void Ring::broadcast(std::span<uint8_t> data, int root) {
  const uint64_t sequence = sequence_++;
  WEFT_CHECK(root >= 0 && root < size(), "Broadcast: root {} out of range for {} ranks", root, size());
  const Deadline deadline = Clock::now() + timeout_;
  // A chain from the root around the ring: receive from the left, pass on to the right.
  const Circle ring = everyone();
  const int position = (rank_ - root + size()) % size();
  try {
    if (position > 0) {
      transport_.receive(tagOf(sequence, kBroadcast, 0), data, deadline, peers_[static_cast<size_t>(ring.left())]);
      countBytes(ring.left(), 0, data.size());
    }
    if (position < size() - 1) {
      transport_.send(peers_[static_cast<size_t>(ring.right())], tagOf(sequence, kBroadcast, 0), data, deadline);
      countBytes(ring.right(), data.size(), 0);
    }
  } catch (const Error& e) {
    WEFT_THROW("Broadcast #{} from rank {} at rank {} (receiving from rank {}, sending to rank {}) failed: {}",
               sequence, root, rank_, ring.left(), ring.right(), e.what());
  }
}

std::vector<uint8_t> RingCollectives::broadcast(std::vector<uint8_t> bytes, int root) {
  ring_.broadcast(bytes, root);
  return bytes;
}

void RingCollectives::barrier(std::chrono::milliseconds patience) { ring_.allGatherSizes(0, Clock::now() + patience); }

}  // namespace weft::dist
