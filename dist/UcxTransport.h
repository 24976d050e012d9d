// The Transport (dist/Transport.h) between processes, over UCX (1.13): tag matching for the ring's
// collectives, active messages for requests to parameter servers (RPC-style traffic, where UCX
// recommends them over tags). One process owns one UcxTransport: a ucp_context with UCP_FEATURE_TAG and
// UCP_FEATURE_AM and a single worker progressed explicitly by
// the calling thread (UCS_THREAD_MODE_SINGLE, so not thread-safe). Peers are found by worker
// address: address() gives the blob to publish through the coordinator's ROSTER, connect() turns
// a peer's blob into a peer index. Every endpoint uses peer error handling, so a dead peer is
// reported instead of waited for; every send and receive has a deadline. Failures raise
// weft::Error naming the peer index, the tag and the UCX status string. Transports come from the
// environment (UCX_TLS, UCX_NET_DEVICES, ...); shared-memory transports are not usable with peer
// error handling in UCX 1.13, so when UCX_TLS is unset the transport uses TCP.
#pragma once

#include "dist/Transport.h"

#include <ucs/type/status.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

struct ucp_context;
struct ucp_worker;
struct ucp_ep;
struct ucp_am_recv_param;
typedef struct ucp_am_recv_param ucp_am_recv_param_t;

namespace weft::dist {

class UcxTransport final : public Transport {
 public:
  UcxTransport();
  /// Force-closes every endpoint, then releases the worker and the context.
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::vector<uint8_t> address() const override;
  /// Creates an endpoint (with peer error handling) to the UCX worker of that address.
  int connect(std::span<const uint8_t> peerAddress) override;

  /// When the deadline passes the peer's endpoint is closed and the peer counts as failed.
  void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) override;
  void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer = -1) override;
  /// The receive is posted first, so two peers may exchange with each other at once.
  void exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer, uint64_t receiveTag,
                std::span<uint8_t> into, Deadline deadline) override;
  /// Flushes what is in flight to each endpoint, force-closing what is not flushed by the deadline.
  void closeAll(Deadline deadline) override;

  /// Meanwhile fetches large messages that arrive, so two processes may send each other one at once.
  void sendMessage(int peer, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                   Deadline deadline) override;
  /// Large payloads travel by rendezvous: they are fetched here, before the deadline.
  std::vector<Message> takeMessages(Deadline deadline) override;
  /// Progresses the worker. A transport that nobody waits on is still progressed now and then,
  /// so that its peers' connection setup completes (peers of an unprogressed UCX worker keep
  /// retrying, spinning their CPU).
  void progress() override;
  /// Blocks in UCX's wakeup descriptor (it yields where UCX offers none: transports other than TCP).
  void waitForActivity(Deadline deadline, std::chrono::microseconds longest) override;
  bool hasFailed(int peer) const override;
  std::string failureOf(int peer) const override;

  uint64_t bytesSent() const override { return bytesSent_; }
  uint64_t bytesReceived() const override { return bytesReceived_; }

 private:
  /// One endpoint; heap-allocated so that UCX's error handler can keep a pointer to it.
  struct Peer {
    int index = 0;
    ucp_ep* endpoint = nullptr;
    ucs_status_t failure = UCS_OK;  ///< what the error handler reported (or a send's timeout)
  };
  /// Which peers' failure ends a wait.
  struct Watch {
    bool everyPeer = false;
    std::vector<int> peers;
    static Watch all() { return {true, {}}; }
  };
  static void onPeerError(void* arg, ucp_ep* endpoint, ucs_status_t status);
  /// An arrived active message; `rendezvous` is UCX's descriptor when its payload is still remote,
  /// `fetch` the request that brings it once started.
  struct Arrival {
    Message message;
    void* rendezvous = nullptr;
    void* fetch = nullptr;
    size_t length = 0;
  };
  /// Starts fetching the payloads still remote. Every wait does, so that a peer that is sending
  /// this process a large message while this process sends it one is not left waiting: each
  /// send completes only once its receiver fetches.
  void startFetches();
  static ucs_status_t onMessage(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                                const ucp_am_recv_param_t* param);

  Peer& peer(int index);
  /// Force-closes the endpoint (its pending requests end as canceled); idempotent.
  void closeEndpoint(Peer& p);
  void* postSend(int peer, uint64_t tag, std::span<const uint8_t> bytes);
  /// Waits for nothing: frees the send request, closing the peer if it is still in progress
  /// (its deadline passed), and throws on failure; counts the bytes on success.
  void finishSend(void* request, int peer, uint64_t tag, size_t size);
  void* postReceive(uint64_t tag, std::span<uint8_t> into);
  /// Frees the receive request, cancelling it if still in progress; throws naming the failed peer
  /// or the deadline, or when the message had another size; counts the bytes on success.
  void finishReceive(void* request, uint64_t tag, size_t size);
  /// Progresses the worker until every request completes, the deadline passes or a watched peer
  /// has failed. The requests are neither cancelled nor freed.
  void progressUntil(std::initializer_list<void*> requests, Deadline deadline, const Watch& watch);
  /// Progresses until a request that is bound to complete (cancelled, force-closed) does, then
  /// frees it. Accepts what a *_nbx call returned, including NULL and error pointers.
  void completeAndFree(void* request);
  const Peer* firstFailedPeer(const Watch& watch) const;

  // Progress calls that find nothing before a wait blocks: a reply often lands within them.
  static constexpr int kSpinsBeforeWaiting = 200;

  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  int eventFd_ = -1;  // the worker's wakeup descriptor, or -1
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<Arrival> arrivals_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

}  // namespace weft::dist
