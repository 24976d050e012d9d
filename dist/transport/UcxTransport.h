// The Transport (dist/transport/Transport.h) between processes, over UCX (1.13). Everything a process
// receives is an active message with a seal (dist/transport/Seal.h): requests and replies (RPC-style
// traffic, where UCX recommends active messages) and the collectives' tagged data alike, so one
// gate checks every message before its payload is fetched or a buffer allocated for it: who sent
// it (an endpoint of the job), that it is sealed under that pair's key, that its counter is new
// and, for requests and replies, that its declared length is within the job's limit. A message that fails is dropped
// and counted (rejected()), and logged at most every few seconds; the job goes on. Refusing costs no exception and no
// formatting, a sender outside the roster (acceptOnly) costs no key derivation, and one progress() call does a bounded
// amount of work, so a flood of messages slows the process's other work down but cannot stop it. A tagged receive is
// matched by tag (and sender, when given) against the sealed tag, and a large payload is fetched straight into the
// receiver's buffer.
//
// One process owns one UcxTransport per channel: a ucp_context with UCP_FEATURE_AM and a single
// worker progressed explicitly by the calling thread (UCS_THREAD_MODE_SINGLE, so not
// thread-safe). Every endpoint uses peer error handling, so a dead peer is reported instead of
// waited for; every send and receive has a deadline. Failures raise weft::Error naming the peer
// index, the tag and the UCX status string. UCX listens only on the network devices given (the
// interface of the host's address in the resource specification; UCX_NET_DEVICES overrides);
// shared-memory transports are not usable with peer error handling in UCX 1.13, so when UCX_TLS
// is unset the transport uses TCP.
#pragma once

#include "dist/transport/LogLimit.h"
#include "dist/transport/Seal.h"
#include "dist/transport/Transport.h"

#include <ucs/type/status.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
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

/// Who a UcxTransport is, and where it may listen.
struct UcxIdentity {
  Secret secret{};
  JobId job{};
  EndpointName self = 0;
  /// UCX_NET_DEVICES for this transport ("lo", "eth0", ...); empty leaves UCX's choice (every
  /// device). The environment's UCX_NET_DEVICES, when set, wins.
  std::string netDevices;
  /// Payloads go out as AES-256-GCM ciphertext (dist/transport/Seal.h), and payloads that arrive
  /// in the clear are refused.
  bool encrypt = false;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(UcxIdentity identity);
  /// Force-closes every endpoint, then releases the worker and the context.
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::vector<uint8_t> address() const override;
  /// Creates an endpoint (with peer error handling) to the UCX worker of that address, whose
  /// messages are accepted as `peerName`'s. A member that wrote first already has its peer
  /// index (given when its first message passed the gate); connect() returns that index.
  int connect(std::span<const uint8_t> peerAddress, EndpointName peerName) override;

  /// When the deadline passes the peer's endpoint is closed and the peer counts as failed.
  void send(int peer, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) override;
  void startSend(int peer, uint64_t tag, std::span<const uint8_t> bytes) override;
  void finishSends(Deadline deadline) override;
  void receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer = -1) override;
  /// The receive is posted first, so two peers may exchange with each other at once.
  void exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer, uint64_t receiveTag,
                std::span<uint8_t> into, Deadline deadline) override;
  /// Flushes what is in flight to each endpoint; a close not done by the deadline is left to UCX
  /// (a peer that no longer progresses its end would never let it finish).
  void closeAll(Deadline deadline) override;
  /// Force-closes each endpoint: nothing is flushed and no peer is waited for.
  void closeNow() override;

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
  void limitPayloads(uint64_t bytes) override { payloadLimit_ = bytes; }
  uint64_t rejected() const override { return rejected_; }
  void acceptOnly(std::vector<EndpointName> members) override;

  uint64_t bytesSent() const override { return bytesSent_; }
  uint64_t bytesReceived() const override { return bytesReceived_; }

 private:
  /// One endpoint; heap-allocated so that UCX's error handler can keep a pointer to it.
  struct Peer {
    int index = 0;
    EndpointName name = 0;
    ucp_ep* endpoint = nullptr;
    ucs_status_t failure = UCS_OK;  ///< what the error handler reported (or a send's timeout)
    std::unique_ptr<Gmac> sendMac, receiveMac;
    uint64_t nextCounter = 1;
    ReplayWindow window;
  };
  /// Which peers' failure ends a wait.
  struct Watch {
    bool everyPeer = false;
    std::vector<int> peers;
    static Watch all() { return {true, {}}; }
  };
  /// A sealed message that passed the header check. `rendezvous` is UCX's descriptor while its
  /// payload is still remote, `fetch` the request that brings it once started.
  struct Arrival {
    Seal seal;
    int peer = -1;
    std::vector<uint8_t> header;  ///< the protocol's header (requests and replies)
    std::vector<uint8_t> payload;
    void* rendezvous = nullptr;
    void* fetch = nullptr;
  };
  /// A tagged receive in progress.
  struct Posted {
    uint64_t tag = 0;
    std::span<uint8_t> into;
    int fromPeer = -1;
    uint64_t rejectedBefore = 0;  ///< rejected() when it was posted, for the deadline's error
    enum State { Waiting, Matched, Fetching, Done, Failed } state = Waiting;
    Seal seal;
    int peer = -1;
    void* rendezvous = nullptr;
    void* fetch = nullptr;
    std::string failure;
  };

  static void onPeerError(void* arg, ucp_ep* endpoint, ucs_status_t status);
  static ucs_status_t onMessage(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
  /// Takes in one arriving message (onMessage's body, which may throw).
  ucs_status_t take(const uint8_t* header, size_t headerLength, void* data, size_t length, bool rendezvous);
  /// The gate: the peer whose sealed header this is, or -1 (the message is rejected, and
  /// counted) when it is not a valid message of this job to this endpoint.
  int admit(const Seal& seal, std::span<const uint8_t> sealedHeader, size_t length);
  /// Takes a tagged message that passed the gate: into a matching posted receive, or kept.
  ucs_status_t takeTagged(Arrival arrival, void* data, size_t length, bool rendezvous);
  /// Copies an arrived payload into a posted receive and checks its seal; one that does not
  /// verify fails the receive (its genuine header's counter is spent).
  /// Verifies a payload that arrived against its seal (and decrypts it in place when the seal
  /// says it is ciphertext); false when it was altered on the way.
  bool openPayload(Peer& from, const Seal& seal, std::span<uint8_t> payload);
  void complete(Posted& r, std::span<const uint8_t> payload);
  /// Matches a waiting receive with a tagged message that came before it.
  void matchUnexpected(Posted& r);
  /// Fails a receive whose sealed sender sent another size than it expects.
  void fail(Posted& r, size_t length);
  /// Counts a dropped message and logs why (at most every few seconds): `why()` makes the
  /// reason, and is called only when a line is written, so a flood costs no formatting.
  template <class MakeWhy>
  void reject(MakeWhy&& why) {
    ++rejected_;
    drops_.write([&] { return "dropped a message: " + why(); });
  }

  /// Starts fetching the payloads still remote. Every wait does, so that a peer that is sending
  /// this process a large message while this process sends it one is not left waiting: each
  /// send completes only once its receiver fetches.
  void startFetches();
  /// Finishes the fetches into posted receives that completed, checking their seals.
  void settleFetches();
  Posted& post(uint64_t tag, std::span<uint8_t> into, int fromPeer);
  /// Waits for the posted receive and removes it; throws naming the failed peer, the deadline,
  /// or the size mismatch.
  void finishReceive(std::list<Posted>::iterator r, Deadline deadline, const Watch& watch);

  Peer& peer(int index);
  /// A peer of that name, not connected yet.
  Peer& addPeer(EndpointName name);
  /// Force-closes the endpoint (its pending requests end as canceled); idempotent.
  void closeEndpoint(Peer& p);
  /// Sends a sealed active message; returns the request (and keeps the header alive in `keep`).
  void* postSend(int peer, Seal::Kind kind, uint64_t tag, std::span<const uint8_t> header,
                 std::span<const uint8_t> payload, std::vector<uint8_t>& keep);
  /// Waits for nothing: frees the send request, closing the peer if it is still in progress
  /// (its deadline passed), and throws on failure; counts the bytes on success.
  void finishSend(void* request, int peer, uint64_t tag, size_t size);
  /// Progresses the worker until `done()`, the deadline passes or a watched peer has failed.
  void progressUntil(const std::function<bool()>& done, Deadline deadline, const Watch& watch);
  /// Progresses until a request that is bound to complete (cancelled, force-closed) does, then
  /// frees it. Accepts what a *_nbx call returned, including NULL and error pointers.
  void completeAndFree(void* request);
  /// Releases a descriptor, or ends a fetch from peer `from`, that will no longer be wanted.
  void abandon(int from, void*& rendezvous, void*& fetch);
  const Peer* firstFailedPeer(const Watch& watch) const;

  // Progress calls that find nothing before a wait blocks: a reply often lands within them.
  static constexpr int kSpinsBeforeWaiting = 200;
  // Tagged messages kept before their receive is posted: the ring runs at most a few steps ahead.
  static constexpr size_t kMaxUnexpected = 4096;
  // The worker progress calls one progress() makes at most: each takes in up to UCX_TCP_MAX_POLL
  // sockets' reads, so a flood cannot keep progress() from returning to the caller's loop.
  static constexpr int kProgressCallsPerProgress = 64;

  UcxIdentity identity_;
  bool closing_ = false;  // the destructor runs: arrivals are dropped
  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  int eventFd_ = -1;  // the worker's wakeup descriptor, or -1
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<EndpointName, int> peerByName_;
  std::vector<EndpointName> members_;  // sorted; empty: any sender whose seal verifies
  std::vector<Arrival> arrivals_;   // requests and replies
  std::deque<Arrival> unexpected_;  // tagged data not yet received
  // Sends started and not yet finished: the request, its peer, tag, size and sealed header.
  struct Started {
    void* request;
    int peer;
    uint64_t tag;
    size_t size;
    std::vector<uint8_t> header;
  };
  std::vector<Started> started_;
  std::list<Posted> posted_;        // stable addresses: UCX callbacks write into them
  uint64_t payloadLimit_ = uint64_t{1} << 40;
  uint64_t rejected_ = 0;
  LogLimit drops_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

}  // namespace weft::dist
