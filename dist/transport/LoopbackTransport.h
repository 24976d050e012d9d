// A Transport (dist/transport/Transport.h) between threads of one process: the ring, the parameter-server
// protocol and a whole job's workers and servers run on it without forking or UCX, so their
// logic is tested in one process, fast and under the sanitizers' eyes. Endpoints live in a
// LoopbackNetwork; an endpoint's address is its number there. Messages are delivered at once
// (a send never waits for its receiver), tagged messages are matched by tag, and an endpoint
// that closes, is destroyed or is failed by the test is reported to its peers' waits as UCX
// reports a dead peer. A message's sender is the endpoint that sent it (names are not needed in
// one process: every endpoint of the network belongs to the job); one larger than the limit is
// dropped and counted, as UCX's gate does.
#pragma once

#include "dist/transport/Transport.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace weft::dist {

/// The endpoints of one in-process network (thread-safe).
class LoopbackNetwork {
 public:
  /// Makes endpoint `endpoint` count as failed with `why`, as if its process had died.
  void fail(int endpoint, const std::string& why);

 private:
  friend class LoopbackTransport;
  struct Tagged {
    int from;
    uint64_t tag;
    std::vector<uint8_t> bytes;
  };
  struct Endpoint {
    std::deque<Tagged> tagged;
    std::deque<Message> messages;
    std::string failure;  // empty while it is alive
  };
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<Endpoint> endpoints_;
};

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(std::shared_ptr<LoopbackNetwork> network);
  /// Closes the endpoint: its peers' waits on it fail from then on.
  ~LoopbackTransport() override;
  LoopbackTransport(const LoopbackTransport&) = delete;
  LoopbackTransport& operator=(const LoopbackTransport&) = delete;

  /// This endpoint's number in the network (what LoopbackNetwork::fail takes).
  int endpoint() const { return self_; }
  std::vector<uint8_t> address() const override;
  int connect(std::span<const uint8_t> peerAddress, EndpointName peerName) override;
  void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) override;
  /// Delivers at once, as send() does.
  void startSend(int peer, uint64_t tag, std::span<const uint8_t> bytes) override;
  void finishSends(Deadline) override {}
  void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer = -1) override;
  void exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer, uint64_t receiveTag,
                std::span<uint8_t> into, Deadline deadline) override;
  void sendMessage(int peer, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                   Deadline deadline) override;
  std::vector<Message> takeMessages(Deadline deadline) override;
  void progress() override {}
  void waitForActivity(Deadline deadline, std::chrono::microseconds longest) override;
  bool hasFailed(int peer) const override;
  std::string failureOf(int peer) const override;
  void closeAll(Deadline deadline) override;
  void closeNow() override;
  void limitPayloads(uint64_t bytes) override { payloadLimit_ = bytes; }
  uint64_t rejected() const override { return rejected_; }

  uint64_t bytesSent() const override { return bytesSent_; }
  uint64_t bytesReceived() const override { return bytesReceived_; }

 private:
  /// The endpoint of peer index `peer`; throws for an index connect() never returned.
  int endpointOf(int peer) const;
  /// The peer index of endpoint `endpoint`, or -1 when this transport never connected to it.
  int peerOf(int endpoint) const;
  /// The peer index of the sending endpoint, made one when it wrote before connect().
  int senderPeer(int endpoint);
  /// Why `peer` (any peer when -1) has failed, or "" (the network's mutex is held).
  std::string failedLocked(int peer) const;

  std::shared_ptr<LoopbackNetwork> network_;
  int self_;
  std::vector<int> peers_;  // endpoint of each peer index
  uint64_t bytesSent_ = 0, bytesReceived_ = 0;
  uint64_t payloadLimit_ = uint64_t{1} << 40;
  uint64_t rejected_ = 0;
};

}  // namespace weft::dist
