// UcxTransport: tag sends and receives and active messages over one explicitly progressed UCX
// worker (see the header).
#include "dist/UcxTransport.h"

#include "core/Error.h"

#include <ucp/api/ucp.h>

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

namespace weft::dist {

namespace {

void check(ucs_status_t status, const char* what) {
  WEFT_CHECK(status == UCS_OK, "UCX {} failed: {}", what, ucs_status_string(status));
}

ucp_context_h createContext() {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");  // UCX_* from the environment
  // UCX 1.13's shared-memory transports cannot report a dead peer, so TCP unless the user chose.
  const char* chosen = std::getenv("UCX_TLS");
  if (chosen == nullptr) check(ucp_config_modify(config, "TLS", "tcp"), "ucp_config_modify(TLS)");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM;
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

}  // namespace

/// The one active-message id weft uses; the header says what a message is.
constexpr unsigned kMessageId = 0;

UcxTransport::UcxTransport() : context_(createContext()) {
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
  for (const std::unique_ptr<Peer>& p : peers_) closeEndpoint(*p);
  for (const Arrival& a : arrivals_) {
    if (a.rendezvous != nullptr) ucp_am_data_release(worker_, a.rendezvous);
    if (statusOf(a.fetch) == UCS_INPROGRESS) ucp_request_cancel(worker_, a.fetch);
    completeAndFree(a.fetch);
  }
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

int UcxTransport::connect(std::span<const uint8_t> peerAddress) {
  WEFT_CHECK(!peerAddress.empty(), "UCX connect: the peer address is empty");
  auto p = std::make_unique<Peer>();
  p->index = static_cast<int>(peers_.size());
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peerAddress.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onPeerError;
  params.err_handler.arg = p.get();
  const ucs_status_t status = ucp_ep_create(worker_, &params, &p->endpoint);
  WEFT_CHECK(status == UCS_OK, "UCX connect to peer {} failed: {}", p->index, ucs_status_string(status));
  peers_.push_back(std::move(p));
  return peers_.back()->index;
}

void UcxTransport::send(int index, uint64_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  const ucs_status_ptr_t request = postSend(index, tag, bytes);
  progressUntil({request}, deadline, Watch{});
  finishSend(request, index, tag, bytes.size());
}

void UcxTransport::receive(uint64_t tag, std::span<uint8_t> into, Deadline deadline, int fromPeer) {
  void* request = postReceive(tag, into);
  progressUntil({request}, deadline, fromPeer < 0 ? Watch::all() : Watch{false, {fromPeer}});
  finishReceive(request, tag, into.size());
}

void UcxTransport::exchange(int sendPeer, uint64_t sendTag, std::span<const uint8_t> bytes, int receivePeer,
                            uint64_t receiveTag, std::span<uint8_t> into, Deadline deadline) {
  void* received = postReceive(receiveTag, into);  // posted first, so the peer's send can land in place
  ucs_status_ptr_t sent = nullptr;
  try {
    sent = postSend(sendPeer, sendTag, bytes);
  } catch (...) {
    ucp_request_cancel(worker_, received);
    completeAndFree(received);
    throw;
  }
  progressUntil({received, sent}, deadline, Watch{false, {sendPeer, receivePeer}});
  try {
    finishSend(sent, sendPeer, sendTag, bytes.size());
  } catch (...) {
    ucp_request_cancel(worker_, received);
    completeAndFree(received);
    throw;
  }
  finishReceive(received, receiveTag, into.size());
}

void* UcxTransport::postSend(int index, uint64_t tag, std::span<const uint8_t> bytes) {
  Peer& p = peer(index);
  WEFT_CHECK(p.failure == UCS_OK, "UCX send to peer {} (tag {:#x}) failed: the peer has failed: {}", index, tag,
             ucs_status_string(p.failure));
  const ucp_request_param_t params = byteParams();
  return ucp_tag_send_nbx(p.endpoint, bytes.data(), bytes.size(), tag, &params);
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

void* UcxTransport::postReceive(uint64_t tag, std::span<uint8_t> into) {
  ucp_request_param_t params = byteParams();
  params.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // always a request, so its length can be read
  const ucs_status_ptr_t request = ucp_tag_recv_nbx(worker_, into.data(), into.size(), tag, ~ucp_tag_t{0}, &params);
  WEFT_CHECK(!UCS_PTR_IS_ERR(request), "UCX receive of tag {:#x} ({} bytes) failed: {}", tag, into.size(),
             ucs_status_string(UCS_PTR_STATUS(request)));
  return request;
}

void UcxTransport::finishReceive(void* request, uint64_t tag, size_t size) {
  ucp_tag_recv_info_t info{};
  const ucs_status_t status = ucp_tag_recv_request_test(request, &info);
  if (status == UCS_INPROGRESS) ucp_request_cancel(worker_, request);
  completeAndFree(request);
  if (status == UCS_INPROGRESS) {
    const Peer* failed = firstFailedPeer(Watch::all());
    WEFT_CHECK(failed == nullptr, "UCX receive of tag {:#x} failed: peer {} failed: {}", tag, failed->index,
               ucs_status_string(failed->failure));
    WEFT_THROW("UCX receive of tag {:#x} ({} bytes) failed: the deadline passed: {}", tag, size,
               ucs_status_string(UCS_ERR_TIMED_OUT));
  }
  WEFT_CHECK(status == UCS_OK, "UCX receive of tag {:#x} ({} bytes) failed: {}", tag, size,
             ucs_status_string(status));
  WEFT_CHECK(info.length == size, "UCX receive of tag {:#x}: expected {} bytes, the message has {}", tag, size,
             info.length);
  bytesReceived_ += info.length;
}

ucs_status_t UcxTransport::onMessage(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  // Inside progress: keep the message; a rendezvous payload is fetched by takeMessages().
  auto* self = static_cast<UcxTransport*>(arg);
  Arrival arrival;
  const auto* h = static_cast<const uint8_t*>(header);
  arrival.message.header.assign(h, h + headerLength);
  arrival.length = length;
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (rendezvous) {
    arrival.rendezvous = data;
  } else if (length > 0) {
    const auto* d = static_cast<const uint8_t*>(data);
    arrival.message.payload.assign(d, d + length);
  }
  self->arrivals_.push_back(std::move(arrival));
  return rendezvous ? UCS_INPROGRESS : UCS_OK;
}

void UcxTransport::sendMessage(int index, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                               Deadline deadline) {
  Peer& p = peer(index);
  WEFT_CHECK(p.failure == UCS_OK, "UCX message to peer {} failed: the peer has failed: {}", index,
             ucs_status_string(p.failure));
  const ucp_request_param_t params = byteParams();
  void* request = ucp_am_send_nbx(p.endpoint, kMessageId, header.data(), header.size(), payload.data(),
                                  payload.size(), &params);
  progressUntil({request}, deadline, Watch{false, {index}});
  finishSend(request, index, kMessageId, header.size() + payload.size());
}

void UcxTransport::startFetches() {
  for (Arrival& a : arrivals_) {
    if (a.rendezvous == nullptr) continue;
    // The payload's buffer stays put when arrivals_ grows: moving a vector keeps its storage.
    a.message.payload.resize(a.length);
    ucp_request_param_t params = byteParams();
    a.fetch = ucp_am_recv_data_nbx(worker_, a.rendezvous, a.message.payload.data(), a.length, &params);
    a.rendezvous = nullptr;  // UCX owns the descriptor from here on
  }
}

void UcxTransport::progress() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  startFetches();
}

std::vector<Message> UcxTransport::takeMessages(Deadline deadline) {
  progress();
  std::vector<Arrival> arrived = std::move(arrivals_);
  arrivals_.clear();
  std::vector<Message> out;
  for (size_t i = 0; i < arrived.size(); ++i) {
    Arrival& a = arrived[i];
    if (a.fetch != nullptr) {
      progressUntil({a.fetch}, deadline, Watch{});  // the sender is unknown here; UCX fails the fetch if it dies
      const ucs_status_t status = statusOf(a.fetch);
      if (status == UCS_INPROGRESS) ucp_request_cancel(worker_, a.fetch);
      completeAndFree(a.fetch);
      if (status != UCS_OK) {
        for (size_t j = i + 1; j < arrived.size(); ++j) {
          if (statusOf(arrived[j].fetch) == UCS_INPROGRESS) ucp_request_cancel(worker_, arrived[j].fetch);
          completeAndFree(arrived[j].fetch);
        }
        WEFT_THROW("UCX: fetching a {}-byte message failed: {}", a.length,
                   status == UCS_INPROGRESS ? "the deadline passed" : ucs_status_string(status));
      }
    }
    bytesReceived_ += a.message.header.size() + a.message.payload.size();
    out.push_back(std::move(a.message));
  }
  return out;
}

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

void UcxTransport::progressUntil(std::initializer_list<void*> requests, Deadline deadline, const Watch& watch) {
  auto pending = [&] {
    for (void* r : requests)
      if (statusOf(r) == UCS_INPROGRESS) return true;
    return false;
  };
  int idle = 0;
  while (pending()) {
    if (ucp_worker_progress(worker_) != 0) {
      startFetches();
      idle = 0;
    } else if (++idle > kSpinsBeforeWaiting) {
      waitForActivity(deadline, std::chrono::milliseconds(1));
    }
    if (Clock::now() >= deadline || firstFailedPeer(watch) != nullptr) return;
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

const UcxTransport::Peer* UcxTransport::firstFailedPeer(const Watch& watch) const {
  for (const std::unique_ptr<Peer>& p : peers_) {
    const bool watched = watch.everyPeer || std::find(watch.peers.begin(), watch.peers.end(), p->index) != watch.peers.end();
    if (watched && p->failure != UCS_OK) return p.get();
  }
  return nullptr;
}

void UcxTransport::closeAll(Deadline deadline) {
  ucp_request_param_t params{};  // no FORCE flag: the close flushes what is in flight
  std::vector<void*> requests;
  for (const std::unique_ptr<Peer>& p : peers_) {
    if (p->endpoint == nullptr) continue;
    void* request = ucp_ep_close_nbx(p->endpoint, &params);
    if (statusOf(request) == UCS_INPROGRESS) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker_);
      if (ucp_request_check_status(request) == UCS_INPROGRESS) {
        ucp_request_cancel(worker_, request);
        completeAndFree(request);
      } else {
        ucp_request_free(request);
      }
    }
    p->endpoint = nullptr;
  }
}

}  // namespace weft::dist
