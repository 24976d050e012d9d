// Point-to-point transport between the processes of a job, as the ring's collectives, the
// workers' requests to the parameter servers and the servers' loop use it: tagged messages (the
// ring: UCX orders tagged messages between two endpoints) and active messages (requests and
// replies). Implemented over UCX between processes (dist/transport/UcxTransport.h) and in one process
// (dist/transport/LoopbackTransport.h), where the protocols are tested without forking.
//
// A transport is used by one thread. Peers are found by address: address() is what the
// coordinator's roster hands to the others, connect() turns a peer's address and name into a peer
// index. What a transport receives comes from endpoints of the job (over UCX: sealed under the
// key its sender's name derives), or is dropped and counted; Message::from and a receive's
// `fromPeer` are established by the transport, not claimed by the sender.
// Every wait has a deadline, and a peer that dies is reported instead of waited for. Failures
// raise weft::Error naming the peer, the tag and the reason.
#pragma once

#include "dist/transport/Deadline.h"
#include "dist/transport/Message.h"

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

class Transport {
 public:
  virtual ~Transport() = default;

  /// This endpoint's address, to hand to the peers.
  virtual std::vector<uint8_t> address() const = 0;
  /// Reaches the endpoint whose address is `peerAddress` and whose name in the job is `peerName`;
  /// returns its peer index (0, 1, ... in order; an endpoint of the job that wrote first got
  /// its index then, and keeps it).
  virtual int connect(std::span<const uint8_t> peerAddress, EndpointName peerName) = 0;

  /// Sends `bytes` with `tag` to `peer` and waits until the buffer may be reused.
  virtual void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) = 0;
  /// Starts sending `bytes` with `tag` to `peer` and returns without waiting for the receiver:
  /// the bytes must stay as they are until finishSends() returns. Two processes that each send
  /// to the other before receiving from it (a pipeline's stages) cannot block each other so.
  virtual void startSend(int peer, uint64_t tag, std::span<const uint8_t> bytes) = 0;
  /// Waits until every started send has completed; fails naming the peer and the tag of one that
  /// failed or had not completed by the deadline.
  virtual void finishSends(Deadline deadline) = 0;
  /// Receives exactly into.size() bytes of the message with `tag` (from any peer). Fails when
  /// the deadline passes, when the message has another size, or when peer `fromPeer` (any peer
  /// when -1) has failed.
  virtual void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer = -1) = 0;
  /// Sends `bytes` to `sendPeer` while receiving the message with `receiveTag` (which
  /// `receivePeer` sends) into `into`, so two peers may exchange with each other at once (a
  /// ring step). Fails when either of the two peers fails.
  virtual void exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer,
                        uint64_t receiveTag, std::span<uint8_t> into, Deadline deadline) = 0;

  /// Sends an active message to `peer` and waits until its buffers may be reused.
  virtual void sendMessage(int peer, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                           Deadline deadline) = 0;
  /// The active messages that arrived since the last call, in arrival order (requests carry ids:
  /// arrival order between two peers is not guaranteed). Does not wait for more.
  virtual std::vector<Message> takeMessages(Deadline deadline) = 0;
  /// Moves pending work along without waiting; what arrives is kept for takeMessages.
  virtual void progress() = 0;
  /// The idle side of a wait loop: returns when something may have arrived, `longest` has
  /// passed, or the deadline has, without using the CPU meanwhile where the transport can.
  virtual void waitForActivity(Deadline deadline, std::chrono::microseconds longest) = 0;

  /// Whether peer `peer` has failed, and why.
  virtual bool hasFailed(int peer) const = 0;
  virtual std::string failureOf(int peer) const = 0;
  /// Closes every connection after flushing what is in flight (the clean way to leave a job).
  virtual void closeAll(Deadline deadline) = 0;
  /// Closes every connection at once, without flushing: for a transport on which nothing can be
  /// in flight any more (its peers received every message, as a barrier after its last use
  /// shows), whose peers need not progress it for the close to end.
  virtual void closeNow() = 0;

  /// Drops arriving requests and replies whose payload declares more than `bytes` (the most the
  /// job's plan produces), before anything is allocated for them. (Tagged data is fetched only
  /// into a receive of the size it expects.)
  virtual void limitPayloads(uint64_t bytes) = 0;
  /// How many arriving messages were dropped: not from a peer, not sealed, replayed, too large.
  virtual uint64_t rejected() const = 0;
  /// From now on, messages that name a sender outside `members` (the job's roster: every channel
  /// of every member) are dropped before any key is derived for them. Transports that only the
  /// job's own processes can reach ignore this.
  virtual void acceptOnly(std::vector<EndpointName> /*members*/) {}

  /// Payload bytes of the sends and receives that completed (active messages: header included).
  virtual uint64_t bytesSent() const = 0;
  virtual uint64_t bytesReceived() const = 0;
};

}  // namespace weft::dist
