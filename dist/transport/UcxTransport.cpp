// UcxTransport: sealed active messages over one explicitly progressed UCX worker (see the header).
#include "dist/transport/UcxTransport.h"

#include "core/Error.h"

#include <ucp/api/ucp.h>

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace weft::dist {

namespace {

void check(ucs_status_t status, const char* what) {
  WEFT_CHECK(status == UCS_OK, "UCX {} failed: {}", what, ucs_status_string(status));
}

ucp_context_h createContext(const std::string& netDevices) {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");  // UCX_* from the environment
  // UCX 1.13's shared-memory transports cannot report a dead peer, so TCP unless the user chose.
  const char* chosen = std::getenv("UCX_TLS");
  if (chosen == nullptr) check(ucp_config_modify(config, "TLS", "tcp"), "ucp_config_modify(TLS)");
  if (!netDevices.empty() && std::getenv("UCX_NET_DEVICES") == nullptr)
    check(ucp_config_modify(config, "NET_DEVICES", netDevices.c_str()), "ucp_config_modify(NET_DEVICES)");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM;
  // TCP can wake a blocked waiter (its sockets are file descriptors); asking for wakeups with
  // transports that cannot would leave UCX nothing to select.
  if (chosen == nullptr || std::string(chosen) == "tcp") params.features |= UCP_FEATURE_WAKEUP;
  params.name = "weft";
  ucp_context_h context = nullptr;
  const ucs_status_t status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  check(status, "ucp_init");
  return context;
}

ucp_worker_h createWorker(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  check(ucp_worker_create(context, &params, &worker), "ucp_worker_create");
  return worker;
}

ucp_request_param_t byteParams() {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  params.datatype = ucp_dt_make_contig(1);
  return params;
}

/// The status of what a *_nbx call returned: NULL is done, an error pointer is its error.
ucs_status_t statusOf(ucs_status_ptr_t request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  return ucp_request_check_status(request);
}

bool pending(ucs_status_ptr_t request) { return statusOf(request) == UCS_INPROGRESS; }

/// The one active-message id weft uses; the seal says what a message is.
constexpr unsigned kMessageId = 0;
/// A flood of rejected messages is reported at most this often.
constexpr auto kRejectionLogInterval = std::chrono::seconds(10);

/// What a deadline's error adds when messages were dropped meanwhile: a wait that ends so may
/// have been starved by a flood from outside the job rather than by a slow peer.
std::string floodNote(uint64_t dropped) {
  return dropped == 0 ? ""
                      : fmt::format(" ({} messages from outside the job were dropped meanwhile: is something flooding "
                                    "this endpoint?)", dropped);
}

/// How a drop's reason reads when the seal names `sender`.
std::string claims(EndpointName sender) {
  return fmt::format("it claims to come from {} but its seal does not verify", describeEndpoint(sender));
}

}  // namespace

UcxTransport::UcxTransport(UcxIdentity identity)
    : identity_(std::move(identity)),
      context_(createContext(identity_.netDevices)),
      drops_(fmt::format("weft: {} ", describeEndpoint(identity_.self)), "dropped messages", 1, kRejectionLogInterval) {
  try {
    worker_ = createWorker(context_);
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = kMessageId;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.cb = &UcxTransport::onMessage;
    handler.arg = this;
    check(ucp_worker_set_am_recv_handler(worker_, &handler), "ucp_worker_set_am_recv_handler");
    if (ucp_worker_get_efd(worker_, &eventFd_) != UCS_OK) eventFd_ = -1;  // no wakeups: waits yield
  } catch (...) {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw;
  }
}

UcxTransport::~UcxTransport() {
  closing_ = true;  // what arrives from here on is dropped, not kept
  // By index: closing progresses the worker, and a callback may still add a peer.
  for (size_t i = 0; i < peers_.size(); ++i) closeEndpoint(*peers_[i]);
  for (Started& s : started_) completeAndFree(s.request);  // closed endpoints end them
  for (Posted& r : posted_) abandon(r.peer, r.rendezvous, r.fetch);
  for (size_t i = 0; i < arrivals_.size(); ++i) abandon(arrivals_[i].peer, arrivals_[i].rendezvous, arrivals_[i].fetch);
  for (size_t i = 0; i < unexpected_.size(); ++i)
    abandon(unexpected_[i].peer, unexpected_[i].rendezvous, unexpected_[i].fetch);
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::vector<uint8_t> UcxTransport::address() const {
  ucp_address_t* raw = nullptr;
  size_t length = 0;
  check(ucp_worker_get_address(worker_, &raw, &length), "ucp_worker_get_address");
  const auto* begin = reinterpret_cast<const uint8_t*>(raw);
  std::vector<uint8_t> out(begin, begin + length);
  ucp_worker_release_address(worker_, raw);
  return out;
}

int UcxTransport::connect(std::span<const uint8_t> peerAddress, EndpointName peerName) {
  WEFT_CHECK(!peerAddress.empty(), "UCX connect: the peer address is empty");
  const auto known = peerByName_.find(peerName);
  Peer& p = known != peerByName_.end() ? *peers_[static_cast<size_t>(known->second)] : addPeer(peerName);
  WEFT_CHECK(p.endpoint == nullptr, "UCX connect: {} is connected already", describeEndpoint(peerName));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peerAddress.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onPeerError;
  params.err_handler.arg = &p;
  const ucs_status_t status = ucp_ep_create(worker_, &params, &p.endpoint);
  WEFT_CHECK(status == UCS_OK, "UCX connect to peer {} failed: {}", p.index, ucs_status_string(status));
  return p.index;
}

UcxTransport::Peer& UcxTransport::addPeer(EndpointName name) {
  auto p = std::make_unique<Peer>();
  p->index = static_cast<int>(peers_.size());
  p->name = name;
  p->sendMac = std::make_unique<Gmac>(dataKey(identity_.secret, identity_.job, identity_.self, name));
  p->receiveMac = std::make_unique<Gmac>(dataKey(identity_.secret, identity_.job, name, identity_.self));
  peerByName_[name] = p->index;
  peers_.push_back(std::move(p));
  return *peers_.back();
}

// ---- sending ----

void* UcxTransport::postSend(int index, Seal::Kind kind, uint64_t tag, std::span<const uint8_t> header,
                             std::span<const uint8_t> payload, std::vector<uint8_t>& keep) {
  Peer& p = peer(index);
  WEFT_CHECK(p.failure == UCS_OK, "UCX send to peer {} (tag {:#x}) failed: the peer has failed: {}", index, tag,
             ucs_status_string(p.failure));
  WEFT_CHECK(p.endpoint != nullptr, "UCX send to peer {} (tag {:#x}): this transport has not connected to it", index,
             tag);
  Seal seal;
  seal.kind = kind;
  seal.sender = identity_.self;
  seal.counter = p.nextCounter++;
  seal.tag = tag;
  seal.payloadLength = payload.size();
  seal.encrypted = identity_.encrypt;
  // `keep` holds the seal and the header, and an encrypted payload's ciphertext after them.
  const size_t sealed = Seal::kBytes + header.size();
  keep.assign(sealed + (seal.encrypted ? payload.size() : 0), 0);
  std::copy(header.begin(), header.end(), keep.begin() + Seal::kBytes);
  const std::span<uint8_t, Seal::kBytes> sealBytes(keep.data(), Seal::kBytes);
  seal.encodeInto(sealBytes);
  seal.headerMac = p.sendMac->compute(seal.counter, 0, {sealBytes.first(Seal::kCoveredBytes), header});
  if (seal.encrypted) {
    std::copy(payload.begin(), payload.end(), keep.begin() + static_cast<std::ptrdiff_t>(sealed));
    payload = std::span<const uint8_t>(keep.data() + sealed, payload.size());
    seal.payloadMac = p.sendMac->encrypt(seal.counter, 1, std::span<uint8_t>(keep.data() + sealed, payload.size()));
  } else {
    seal.payloadMac = p.sendMac->compute(seal.counter, 1, {payload});
  }
  seal.encodeInto(sealBytes);
  const ucp_request_param_t params = byteParams();
  return ucp_am_send_nbx(p.endpoint, kMessageId, keep.data(), sealed, payload.data(), payload.size(), &params);
}

void UcxTransport::finishSend(void* request, int index, uint64_t tag, size_t size) {
  Peer& p = peer(index);
  ucs_status_t status = statusOf(request);
  if (status == UCS_INPROGRESS) {  // the deadline passed: give up on this peer
    closeEndpoint(p);
    p.failure = status = UCS_ERR_TIMED_OUT;
  }
  completeAndFree(request);
  WEFT_CHECK(status == UCS_OK, "UCX send to peer {} (tag {:#x}, {} bytes) failed: {}", index, tag, size,
             ucs_status_string(status));
  bytesSent_ += size;
}

void UcxTransport::send(int index, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  std::vector<uint8_t> header;
  void* request = postSend(index, Seal::Tagged, tag, {}, bytes, header);
  progressUntil([&] { return !pending(request); }, deadline, Watch{});
  finishSend(request, index, tag, bytes.size());
}

void UcxTransport::startSend(int index, uint64_t tag, std::span<const uint8_t> bytes) {
  Started s{nullptr, index, tag, bytes.size(), {}};
  s.request = postSend(index, Seal::Tagged, tag, {}, bytes, s.header);
  started_.push_back(std::move(s));
}

void UcxTransport::finishSends(Deadline deadline) {
  std::vector<Started> started = std::move(started_);
  started_.clear();
  std::vector<int> peers;
  for (const Started& s : started) peers.push_back(s.peer);
  progressUntil(
      [&] {
        return std::none_of(started.begin(), started.end(), [&](const Started& s) { return pending(s.request); });
      },
      deadline, Watch{false, peers});
  std::exception_ptr failure;
  for (Started& s : started) {
    try {
      finishSend(s.request, s.peer, s.tag, s.size);
    } catch (...) {
      if (!failure) failure = std::current_exception();  // the first, every request freed
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void UcxTransport::sendMessage(int index, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                               Deadline deadline) {
  std::vector<uint8_t> sealed;
  void* request = postSend(index, Seal::Request, 0, header, payload, sealed);
  progressUntil([&] { return !pending(request); }, deadline, Watch{false, {index}});
  finishSend(request, index, kMessageId, header.size() + payload.size());
}

// ---- the gate ----

void UcxTransport::acceptOnly(std::vector<EndpointName> members) {
  std::sort(members.begin(), members.end());
  members_ = std::move(members);
}

int UcxTransport::admit(const Seal& seal, std::span<const uint8_t> sealedHeader, size_t length) {
  const auto verifies = [&](Gmac& mac) {
    return mac.verify(seal.headerMac, seal.counter, 0,
                      {sealedHeader.first(Seal::kCoveredBytes), sealedHeader.subspan(Seal::kBytes)});
  };
  const auto known = peerByName_.find(seal.sender);
  if (known == peerByName_.end()) {
    // A member may write before this process has connected to it (it got the roster first):
    // its seal verifies under the key its name derives, and it becomes a peer now. Deriving a
    // key costs more than checking a seal, so names outside the roster are not derived.
    if (!members_.empty() && !std::binary_search(members_.begin(), members_.end(), seal.sender)) {
      reject([&] {
        return fmt::format("it claims to come from {}, which is no member of this job", describeEndpoint(seal.sender));
      });
      return -1;
    }
    Gmac mac(dataKey(identity_.secret, identity_.job, seal.sender, identity_.self));
    if (!verifies(mac)) {
      reject([&] { return claims(seal.sender); });
      return -1;
    }
    addPeer(seal.sender);
  } else if (!verifies(*peers_[static_cast<size_t>(known->second)]->receiveMac)) {
    reject([&] { return claims(seal.sender); });
    return -1;
  }
  Peer& p = *peers_[static_cast<size_t>(peerByName_.at(seal.sender))];
  if (seal.payloadLength != length) {
    reject([&] {
      return fmt::format("{} sent a {}-byte payload sealed as {} bytes", describeEndpoint(seal.sender), length,
                         seal.payloadLength);
    });
    return -1;
  }
  if (seal.kind == Seal::Request && length > payloadLimit_) {
    reject([&] {
      return fmt::format("{} sent a {}-byte payload; this job's messages carry at most {}",
                         describeEndpoint(seal.sender), length, payloadLimit_);
    });
    return -1;
  }
  if (identity_.encrypt && !seal.encrypted) {
    reject([&] {
      return fmt::format("{} sent a payload in the clear to a job that encrypts", describeEndpoint(seal.sender));
    });
    return -1;
  }
  if (!p.window.accept(seal.counter)) {
    reject([&] {
      return fmt::format("message {} of {} came again (a replay)", seal.counter, describeEndpoint(seal.sender));
    });
    return -1;
  }
  return p.index;
}

ucs_status_t UcxTransport::onMessage(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  // Inside progress: check and keep; a rendezvous payload is fetched after progress returns.
  // Nothing may unwind through UCX's C frames: whatever fails drops the message.
  auto* self = static_cast<UcxTransport*>(arg);
  if (self->closing_) return UCS_OK;
  try {
    return self->take(static_cast<const uint8_t*>(header), headerLength, data, length,
                      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0);
  } catch (const std::exception& e) {
    self->reject([&] { return std::string(e.what()); });
  } catch (...) {
    self->reject([] { return std::string("an unknown failure while taking it in"); });
  }
  return UCS_OK;  // a rendezvous payload is then never fetched
}

ucs_status_t UcxTransport::take(const uint8_t* header, size_t headerLength, void* data, size_t length,
                                bool rendezvous) {
  const std::span<const uint8_t> sealed(header, headerLength);
  if (!Seal::wellFormed(sealed)) {
    reject([&] { return fmt::format("its {}-byte header is not a weft seal", headerLength); });
    return UCS_OK;
  }
  Arrival arrival;
  arrival.seal = Seal::decode(sealed);
  arrival.peer = admit(arrival.seal, sealed, length);
  if (arrival.peer < 0) return UCS_OK;
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (arrival.seal.kind == Seal::Tagged) {
    if (headerLength != Seal::kBytes) {
      reject([&] {
        return fmt::format("tagged data from {} carries a header", describeEndpoint(arrival.seal.sender));
      });
      return UCS_OK;
    }
    return takeTagged(std::move(arrival), data, length, rendezvous);
  }
  arrival.header.assign(sealed.begin() + Seal::kBytes, sealed.end());
  if (rendezvous) {
    arrival.rendezvous = data;
  } else if (length > 0) {
    arrival.payload.assign(bytes, bytes + length);
  }
  arrivals_.push_back(std::move(arrival));
  return rendezvous ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t UcxTransport::takeTagged(Arrival arrival, void* data, size_t length, bool rendezvous) {
  const auto r = std::find_if(posted_.begin(), posted_.end(), [&](const Posted& p) {
    return p.state == Posted::Waiting && p.tag == arrival.seal.tag && (p.fromPeer < 0 || p.fromPeer == arrival.peer);
  });
  if (r == posted_.end()) {
    if (unexpected_.size() >= kMaxUnexpected) {
      reject([&] {
        return fmt::format("{} sent more than {} tagged messages ahead of their receives",
                           describeEndpoint(arrival.seal.sender), kMaxUnexpected);
      });
      return UCS_OK;
    }
    if (rendezvous) {
      arrival.rendezvous = data;
    } else if (length > 0) {
      arrival.payload.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + length);
    }
    unexpected_.push_back(std::move(arrival));
    return rendezvous ? UCS_INPROGRESS : UCS_OK;
  }
  r->seal = arrival.seal;
  r->peer = arrival.peer;
  if (length != r->into.size()) {
    fail(*r, length);
    return UCS_OK;
  }
  if (rendezvous) {
    r->rendezvous = data;
    r->state = Posted::Matched;
    return UCS_INPROGRESS;
  }
  complete(*r, {static_cast<const uint8_t*>(data), length});
  return UCS_OK;
}

void UcxTransport::fail(Posted& r, size_t length) {
  r.state = Posted::Failed;
  r.failure =
      fmt::format("UCX receive of tag {:#x}: expected {} bytes, the message has {}", r.tag, r.into.size(), length);
}

bool UcxTransport::openPayload(Peer& from, const Seal& seal, std::span<uint8_t> payload) {
  return seal.encrypted ? from.receiveMac->decrypt(seal.payloadMac, seal.counter, 1, payload)
                        : from.receiveMac->verify(seal.payloadMac, seal.counter, 1, {payload});
}

void UcxTransport::complete(Posted& r, std::span<const uint8_t> payload) {
  if (payload.size() != r.into.size()) return fail(r, payload.size());
  if (!payload.empty() && payload.data() != r.into.data()) std::memcpy(r.into.data(), payload.data(), payload.size());
  if (openPayload(peer(r.peer), r.seal, r.into)) {
    r.state = Posted::Done;
    return;
  }
  // Its sealed header was genuine, so its counter is spent: the message was altered on the way
  // (or corrupted), and the genuine one cannot come any more.
  reject([&] {
    return fmt::format("the payload of message {} of {} does not verify", r.seal.counter,
                       describeEndpoint(r.seal.sender));
  });
  r.state = Posted::Failed;
  r.failure = fmt::format("UCX receive of tag {:#x}: the payload from peer {} does not match its seal (altered on the "
                          "way)", r.tag, r.peer);
}

void UcxTransport::matchUnexpected(Posted& r) {
  const auto a = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const Arrival& u) {
    return u.seal.tag == r.tag && (r.fromPeer < 0 || r.fromPeer == u.peer);
  });
  if (a == unexpected_.end()) return;
  Arrival arrival = std::move(*a);
  unexpected_.erase(a);
  r.seal = arrival.seal;
  r.peer = arrival.peer;
  if (arrival.seal.payloadLength != r.into.size()) {
    abandon(arrival.peer, arrival.rendezvous, arrival.fetch);
    return fail(r, arrival.seal.payloadLength);
  }
  if (arrival.rendezvous != nullptr) {
    r.rendezvous = arrival.rendezvous;
    r.state = Posted::Matched;
    return;
  }
  complete(r, arrival.payload);
}

// ---- receiving ----

UcxTransport::Posted& UcxTransport::post(uint64_t tag, std::span<uint8_t> into, int fromPeer) {
  if (fromPeer >= 0) peer(fromPeer);  // a valid index
  Posted& r = posted_.emplace_back();
  r.tag = tag;
  r.into = into;
  r.fromPeer = fromPeer;
  r.rejectedBefore = rejected_;
  matchUnexpected(r);
  startFetches();
  return r;
}

void UcxTransport::receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer) {
  post(tag, into, fromPeer);
  finishReceive(std::prev(posted_.end()), deadline, fromPeer < 0 ? Watch::all() : Watch{false, {fromPeer}});
}

void UcxTransport::exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer,
                            uint64_t receiveTag, std::span<uint8_t> into, Deadline deadline) {
  post(receiveTag, into, receivePeer);  // posted first, so the peer's payload can land in place
  const auto received = std::prev(posted_.end());
  std::vector<uint8_t> header;
  void* sent = nullptr;
  try {
    sent = postSend(sendPeer, Seal::Tagged, sendTag, {}, bytes, header);
    const Watch watch{false, {sendPeer, receivePeer}};
    progressUntil([&] { return !pending(sent) && received->state >= Posted::Done; }, deadline, watch);
    finishSend(sent, sendPeer, sendTag, bytes.size());
  } catch (...) {
    abandon(received->peer, received->rendezvous, received->fetch);
    posted_.erase(received);
    throw;
  }
  finishReceive(received, deadline, Watch{false, {receivePeer}});
}

void UcxTransport::finishReceive(std::list<Posted>::iterator r, Deadline deadline, const Watch& watch) {
  progressUntil([&] { return r->state >= Posted::Done; }, deadline, watch);
  const uint64_t tag = r->tag;
  const size_t size = r->into.size();
  const Posted::State state = r->state;
  const uint64_t dropped = rejected_ - r->rejectedBefore;
  const std::string failure = std::move(r->failure);
  abandon(r->peer, r->rendezvous, r->fetch);
  posted_.erase(r);
  if (state == Posted::Done) {
    bytesReceived_ += size;
    return;
  }
  WEFT_CHECK(state != Posted::Failed, "{}", failure);
  const Peer* failed = firstFailedPeer(watch);
  WEFT_CHECK(failed == nullptr, "UCX receive of tag {:#x} failed: peer {} failed: {}", tag, failed->index,
             ucs_status_string(failed->failure));
  WEFT_THROW("UCX receive of tag {:#x} ({} bytes) failed: the deadline passed: {}{}", tag, size,
             ucs_status_string(UCS_ERR_TIMED_OUT), floodNote(dropped));
}

void UcxTransport::startFetches() {
  const ucp_request_param_t params = byteParams();
  for (Arrival& a : arrivals_) {
    if (a.rendezvous == nullptr) continue;
    // The payload's buffer stays put when arrivals_ grows: moving a vector keeps its storage.
    a.payload.resize(a.seal.payloadLength);
    a.fetch = ucp_am_recv_data_nbx(worker_, a.rendezvous, a.payload.data(), a.payload.size(), &params);
    a.rendezvous = nullptr;  // UCX owns the descriptor from here on
  }
  for (Posted& r : posted_) {
    if (r.state != Posted::Matched) continue;
    r.fetch = ucp_am_recv_data_nbx(worker_, r.rendezvous, r.into.data(), r.into.size(), &params);
    r.rendezvous = nullptr;
    r.state = Posted::Fetching;
  }
}

void UcxTransport::settleFetches() {
  for (Posted& r : posted_) {
    if (r.state != Posted::Fetching || pending(r.fetch)) continue;
    const ucs_status_t status = statusOf(r.fetch);
    completeAndFree(r.fetch);
    r.fetch = nullptr;
    if (status == UCS_OK) {
      complete(r, r.into);
    } else {
      r.state = Posted::Failed;
      r.failure = fmt::format("UCX receive of tag {:#x}: fetching its {} bytes from peer {} failed: {}", r.tag,
                              r.into.size(), r.peer, ucs_status_string(status));
    }
  }
}

void UcxTransport::progress() {
  for (int i = 0; i < kProgressCallsPerProgress && ucp_worker_progress(worker_) != 0; ++i) {
  }
  startFetches();
  settleFetches();
}

std::vector<Message> UcxTransport::takeMessages(Deadline deadline) {
  progress();
  std::vector<Arrival> arrived = std::move(arrivals_);
  arrivals_.clear();
  std::vector<Message> out;
  for (size_t i = 0; i < arrived.size(); ++i) {
    Arrival& a = arrived[i];
    if (a.fetch != nullptr) {
      progressUntil([&] { return !pending(a.fetch); }, deadline, Watch{false, {a.peer}});
      const ucs_status_t status = statusOf(a.fetch);
      abandon(a.peer, a.rendezvous, a.fetch);
      if (status != UCS_OK) {
        for (size_t j = i + 1; j < arrived.size(); ++j)
          abandon(arrived[j].peer, arrived[j].rendezvous, arrived[j].fetch);
        WEFT_THROW("UCX: fetching a {}-byte message from peer {} failed: {}", a.payload.size(), a.peer,
                   status == UCS_INPROGRESS ? "the deadline passed" : ucs_status_string(status));
      }
    }
    if (!openPayload(peer(a.peer), a.seal, a.payload)) {
      reject([&] {
        return fmt::format("the payload of message {} of {} does not verify", a.seal.counter,
                           describeEndpoint(a.seal.sender));
      });
      continue;
    }
    bytesReceived_ += a.header.size() + a.payload.size();
    out.push_back(Message{std::move(a.header), std::move(a.payload), a.peer});
  }
  return out;
}

// ---- peers and waiting ----

bool UcxTransport::hasFailed(int index) const {
  WEFT_CHECK(index >= 0 && static_cast<size_t>(index) < peers_.size(), "UCX: no peer {}", index);
  return peers_[static_cast<size_t>(index)]->failure != UCS_OK;
}

std::string UcxTransport::failureOf(int index) const {
  WEFT_CHECK(index >= 0 && static_cast<size_t>(index) < peers_.size(), "UCX: no peer {}", index);
  return ucs_status_string(peers_[static_cast<size_t>(index)]->failure);
}

void UcxTransport::onPeerError(void* arg, ucp_ep* /*endpoint*/, ucs_status_t status) {
  static_cast<Peer*>(arg)->failure = status;  // inside progress: record only
}

UcxTransport::Peer& UcxTransport::peer(int index) {
  WEFT_CHECK(index >= 0 && static_cast<size_t>(index) < peers_.size(), "UCX: no peer {} ({} connected)", index,
             peers_.size());
  return *peers_[static_cast<size_t>(index)];
}

void UcxTransport::closeEndpoint(Peer& p) {
  if (p.endpoint == nullptr) return;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  completeAndFree(ucp_ep_close_nbx(p.endpoint, &params));
  p.endpoint = nullptr;
}

void UcxTransport::progressUntil(const std::function<bool()>& done, Deadline deadline, const Watch& watch) {
  int idle = 0;
  while (!done()) {
    const bool active = ucp_worker_progress(worker_) != 0;
    // Callbacks run in any progress call, waitForActivity's included: a payload they matched
    // is fetched here, whichever call it arrived in.
    startFetches();
    settleFetches();
    if (done() || Clock::now() >= deadline || firstFailedPeer(watch) != nullptr) return;
    idle = active ? 0 : idle + 1;
    if (idle > kSpinsBeforeWaiting) waitForActivity(deadline, std::chrono::milliseconds(1));
  }
}

void UcxTransport::waitForActivity(Deadline deadline, std::chrono::microseconds longest) {
  if (eventFd_ < 0) return std::this_thread::yield();
  if (ucp_worker_progress(worker_) != 0) return;
  const ucs_status_t armed = ucp_worker_arm(worker_);
  if (armed == UCS_ERR_BUSY) return;  // events came in meanwhile: the caller progresses them
  if (armed != UCS_OK) return std::this_thread::yield();
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
  const auto wait = std::clamp(left, std::chrono::microseconds(0), longest);
  timespec timeout{static_cast<time_t>(wait.count() / 1000000), static_cast<long>(wait.count() % 1000000 * 1000)};
  pollfd fd{eventFd_, POLLIN, 0};
  ::ppoll(&fd, 1, &timeout, nullptr);
}

void UcxTransport::completeAndFree(void* request) {
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker_);
  ucp_request_free(request);
}

void UcxTransport::abandon(int from, void*& rendezvous, void*& fetch) {
  if (rendezvous != nullptr) ucp_am_data_release(worker_, rendezvous);
  rendezvous = nullptr;
  if (pending(fetch) && from >= 0) {
    // UCX cannot cancel a fetch (ucp_request_cancel ends tag receives only): closing the
    // sender's endpoint ends it, and the sender counts as failed.
    Peer& p = peer(from);
    closeEndpoint(p);
    if (p.failure == UCS_OK) p.failure = UCS_ERR_TIMED_OUT;
  }
  completeAndFree(fetch);
  fetch = nullptr;
}

const UcxTransport::Peer* UcxTransport::firstFailedPeer(const Watch& watch) const {
  for (const std::unique_ptr<Peer>& p : peers_) {
    const bool watched =
        watch.everyPeer || std::find(watch.peers.begin(), watch.peers.end(), p->index) != watch.peers.end();
    if (watched && p->failure != UCS_OK) return p.get();
  }
  return nullptr;
}

void UcxTransport::closeAll(Deadline deadline) {
  ucp_request_param_t params{};  // no FORCE flag: the close flushes what is in flight
  for (size_t i = 0; i < peers_.size(); ++i) {  // by index: progress may add a peer
    Peer* p = peers_[i].get();
    if (p->endpoint == nullptr) continue;
    void* request = ucp_ep_close_nbx(p->endpoint, &params);
    if (statusOf(request) == UCS_INPROGRESS) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker_);
      // Past the deadline (a peer that no longer progresses its end) the close is left to UCX,
      // which releases the request if it ever completes: a close cannot be cancelled.
      ucp_request_free(request);
    }
    p->endpoint = nullptr;
  }
}

void UcxTransport::closeNow() {
  for (size_t i = 0; i < peers_.size(); ++i) closeEndpoint(*peers_[i]);  // by index: progress may add a peer
}

}  // namespace weft::dist
