// Point-to-point data transport over UCX tag matching (UCX 1.13). One process owns one
// UcxTransport: a ucp_context with UCP_FEATURE_TAG and a single worker progressed explicitly by
// the calling thread (UCS_THREAD_MODE_SINGLE, so not thread-safe). Peers are found by worker
// address: address() gives the blob to publish through the coordinator's ROSTER, connect() turns
// a peer's blob into a peer index. Every endpoint uses peer error handling, so a dead peer is
// reported instead of waited for; every send and receive has a deadline. Failures raise
// weft::Error naming the peer index, the tag and the UCX status string. Transports come from the
// environment (UCX_TLS, UCX_NET_DEVICES, ...); shared-memory transports are not usable with peer
// error handling in UCX 1.13, so multi-process setups run with UCX_TLS=tcp.
#pragma once

#include "dist/Wire.h"

#include <ucs/type/status.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

struct ucp_context;
struct ucp_worker;
struct ucp_ep;

namespace weft::dist {

class UcxTransport {
 public:
  UcxTransport();
  /// Force-closes every endpoint, then releases the worker and the context.
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  /// This worker's address, to hand to the peers.
  std::vector<uint8_t> address() const;
  /// Creates an endpoint to the worker whose address is `peerAddress`; returns its peer index
  /// (0, 1, ... in connection order).
  int connect(std::span<const uint8_t> peerAddress);

  /// Sends `bytes` with `tag` to `peer` and waits until the buffer may be reused. When the
  /// deadline passes the peer's endpoint is closed and the peer counts as failed from then on.
  void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline);
  /// Receives exactly into.size() bytes of the message with `tag` (from any peer). Fails when
  /// the deadline passes, when the message has another size, or when any peer has failed.
  void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline);

  /// Payload bytes of the sends and receives that completed.
  uint64_t bytesSent() const { return bytesSent_; }
  uint64_t bytesReceived() const { return bytesReceived_; }

 private:
  /// One endpoint; heap-allocated so that UCX's error handler can keep a pointer to it.
  struct Peer {
    int index = 0;
    ucp_ep* endpoint = nullptr;
    ucs_status_t failure = UCS_OK;  ///< what the error handler reported (or a send's timeout)
  };
  static void onPeerError(void* arg, ucp_ep* endpoint, ucs_status_t status);

  Peer& peer(int index);
  /// Force-closes the endpoint (its pending requests end as canceled); idempotent.
  void closeEndpoint(Peer& p);
  /// Progresses the worker until `request` completes, the deadline passes or, with watchPeers,
  /// some peer has failed. The request is neither cancelled nor freed.
  void progressUntil(void* request, Deadline deadline, bool watchPeers);
  /// Progresses until a request that is bound to complete (cancelled, force-closed) does, then
  /// frees it. Accepts what a *_nbx call returned, including NULL and error pointers.
  void completeAndFree(void* request);
  const Peer* firstFailedPeer() const;

  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  std::vector<std::unique_ptr<Peer>> peers_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

}  // namespace weft::dist
