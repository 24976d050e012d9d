// The in-process transport (see the header).
#include "dist/transport/LoopbackTransport.h"

#include "core/Error.h"

#include <algorithm>
#include <cstring>

namespace weft::dist {

void LoopbackNetwork::fail(int endpoint, const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    std::string& failure = endpoints_.at(static_cast<size_t>(endpoint)).failure;
    if (failure.empty()) failure = why;
  }
  arrived_.notify_all();
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackNetwork> network) : network_(std::move(network)) {
  std::lock_guard lock(network_->mutex_);
  self_ = static_cast<int>(network_->endpoints_.size());
  network_->endpoints_.emplace_back();
}

LoopbackTransport::~LoopbackTransport() { network_->fail(self_, "the endpoint was closed"); }

std::vector<uint8_t> LoopbackTransport::address() const {
  std::vector<uint8_t> out(sizeof self_);
  std::memcpy(out.data(), &self_, sizeof self_);
  return out;
}

int LoopbackTransport::connect(std::span<const uint8_t> peerAddress, EndpointName /*peerName*/) {
  int endpoint = -1;
  WEFT_CHECK(peerAddress.size() == sizeof endpoint, "loopback connect: an address has {} bytes, not {}",
             peerAddress.size(), sizeof endpoint);
  std::memcpy(&endpoint, peerAddress.data(), sizeof endpoint);
  {
    std::lock_guard lock(network_->mutex_);
    WEFT_CHECK(endpoint >= 0 && endpoint < static_cast<int>(network_->endpoints_.size()),
               "loopback connect: no endpoint {} in the network", endpoint);
  }
  const int known = peerOf(endpoint);
  if (known >= 0) return known;  // it wrote first
  peers_.push_back(endpoint);
  return static_cast<int>(peers_.size()) - 1;
}

int LoopbackTransport::endpointOf(int peer) const {
  WEFT_CHECK(peer >= 0 && peer < static_cast<int>(peers_.size()), "loopback: no peer {} (connected: {})", peer,
             peers_.size());
  return peers_[static_cast<size_t>(peer)];
}

int LoopbackTransport::peerOf(int endpoint) const {
  const auto it = std::find(peers_.begin(), peers_.end(), endpoint);
  return it == peers_.end() ? -1 : static_cast<int>(it - peers_.begin());
}

int LoopbackTransport::senderPeer(int endpoint) {
  const int known = peerOf(endpoint);
  if (known >= 0) return known;
  peers_.push_back(endpoint);  // every endpoint of the network is of the job
  return static_cast<int>(peers_.size()) - 1;
}

std::string LoopbackTransport::failedLocked(int peer) const {
  if (peer >= 0) return network_->endpoints_[static_cast<size_t>(endpointOf(peer))].failure;
  for (int endpoint : peers_) {
    const std::string& failure = network_->endpoints_[static_cast<size_t>(endpoint)].failure;
    if (!failure.empty()) return failure;
  }
  return {};
}

void LoopbackTransport::send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline) {
  const int to = endpointOf(peer);
  {
    std::lock_guard lock(network_->mutex_);
    const std::string failure = failedLocked(peer);
    WEFT_CHECK(failure.empty(), "loopback send to peer {} (tag {:#x}) failed: the peer has failed: {}", peer, tag,
               failure);
    network_->endpoints_[static_cast<size_t>(to)].tagged.push_back({self_, tag, {bytes.begin(), bytes.end()}});
  }
  network_->arrived_.notify_all();
  bytesSent_ += bytes.size();
}

void LoopbackTransport::startSend(int peer, uint64_t tag, std::span<const uint8_t> bytes) {
  send(peer, tag, bytes, Clock::now());
}

void LoopbackTransport::receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer) {
  const int sender = fromPeer >= 0 ? endpointOf(fromPeer) : -1;
  std::unique_lock lock(network_->mutex_);
  for (;;) {
    // The endpoint's vector may grow while this waits: look it up afresh each time.
    std::deque<LoopbackNetwork::Tagged>& inbox = network_->endpoints_[static_cast<size_t>(self_)].tagged;
    std::erase_if(inbox, [&](const LoopbackNetwork::Tagged& m) {
      const bool drop = m.bytes.size() > payloadLimit_;
      rejected_ += drop;
      return drop;
    });
    const auto it = std::find_if(inbox.begin(), inbox.end(),
                                 [&](const auto& m) { return m.tag == tag && (sender < 0 || m.from == sender); });
    if (it != inbox.end()) {
      const size_t size = it->bytes.size();
      WEFT_CHECK(size == into.size(), "loopback receive of tag {:#x} failed: the message has {} bytes, expected {}",
                 tag, size, into.size());
      std::copy(it->bytes.begin(), it->bytes.end(), into.begin());
      inbox.erase(it);
      bytesReceived_ += size;
      return;
    }
    const std::string failure = failedLocked(fromPeer);
    WEFT_CHECK(failure.empty(), "loopback receive of tag {:#x} failed: peer {} failed: {}", tag,
               fromPeer >= 0 ? std::to_string(fromPeer) : std::string("(any)"), failure);
    WEFT_CHECK(network_->arrived_.wait_until(lock, deadline) != std::cv_status::timeout || Clock::now() < deadline,
               "loopback receive of tag {:#x} ({} bytes) failed: the deadline passed", tag, into.size());
  }
}

void LoopbackTransport::exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer,
                                 uint64_t receiveTag, std::span<uint8_t> into, Deadline deadline) {
  send(sendPeer, sendTag, bytes, deadline);
  receive(receiveTag, into, deadline, receivePeer);
}

void LoopbackTransport::sendMessage(int peer, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                                    Deadline) {
  const int to = endpointOf(peer);
  {
    std::lock_guard lock(network_->mutex_);
    const std::string failure = failedLocked(peer);
    WEFT_CHECK(failure.empty(), "loopback message to peer {} failed: the peer has failed: {}", peer, failure);
    // `from` holds the sending endpoint until the receiver turns it into its peer index.
    network_->endpoints_[static_cast<size_t>(to)].messages.push_back(
        {{header.begin(), header.end()}, {payload.begin(), payload.end()}, self_});
  }
  network_->arrived_.notify_all();
  bytesSent_ += header.size() + payload.size();
}

std::vector<Message> LoopbackTransport::takeMessages(Deadline) {
  std::lock_guard lock(network_->mutex_);
  std::deque<Message>& inbox = network_->endpoints_[static_cast<size_t>(self_)].messages;
  std::vector<Message> out;
  for (Message& m : inbox) {
    m.from = senderPeer(m.from);
    if (m.payload.size() > payloadLimit_) {
      ++rejected_;
      continue;
    }
    bytesReceived_ += m.header.size() + m.payload.size();
    out.push_back(std::move(m));
  }
  inbox.clear();
  return out;
}

// A failed peer does not end the wait (it stays failed, and would make the caller's loop spin):
// callers look at hasFailed() between waits, as they do with UCX.
void LoopbackTransport::waitForActivity(Deadline deadline, std::chrono::microseconds longest) {
  std::unique_lock lock(network_->mutex_);
  network_->arrived_.wait_until(lock, std::min(deadline, Deadline(Clock::now() + longest)), [&] {
    const LoopbackNetwork::Endpoint& self = network_->endpoints_[static_cast<size_t>(self_)];
    return !self.messages.empty() || !self.tagged.empty();
  });
}

bool LoopbackTransport::hasFailed(int peer) const { return !failureOf(peer).empty(); }

std::string LoopbackTransport::failureOf(int peer) const {
  std::lock_guard lock(network_->mutex_);
  return failedLocked(peer);
}

void LoopbackTransport::closeAll(Deadline) { network_->fail(self_, "the endpoint was closed"); }

void LoopbackTransport::closeNow() { network_->fail(self_, "the endpoint was closed"); }

}  // namespace weft::dist
