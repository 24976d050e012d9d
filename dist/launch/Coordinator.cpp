// The rendezvous server and client. The coordinator's serve thread accepts connections, admits
// them (handshake, then JOIN) and decides the outcome (roster or abort) in one loop over every
// connection in its admission, reading each one's frames as their bytes arrive: a silent or slow
// peer delays nobody else and costs a socket, not a thread, so a flood of them is held by the
// thousand and dropped oldest first. After the rosters the serve thread watches the members'
// heartbeats.
#include "dist/launch/Coordinator.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "dist/transport/LogLimit.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace weft::dist {
namespace {

constexpr uint32_t kMaxAddressBytes = 64u << 10;  // a UCX worker address is ~200 bytes
constexpr uint32_t kMaxJoinPayload = 2 * kMaxAddressBytes + kNcclIdBytes + 64;
// File descriptors left to the rest of the process when the waiting room is sized.
constexpr rlim_t kDescriptorsKept = 512;
constexpr int kAcceptsPerWake = 64;  // the listener's backlog is drained in turns with the others' frames
// The watch loop's tick, and how late a wake-up may be before the excess counts as the
// coordinator's own absence (its process paused or not scheduled), not as the members' silence.
constexpr std::chrono::milliseconds kWatchTick{200};
constexpr std::chrono::milliseconds kSchedulingSlack{300};
constexpr uint32_t kHeartbeatPayload = 8 + 1 + 1;
constexpr size_t kMemberMinBytes = 1 + 4 + 4 + 4 + 4 + 4;  // a roster entry with empty addresses
constexpr size_t kMissingListed = 10;                      // an ABORT names at most this many members
constexpr int kRefusalsLoggedPerSecond = 10;

// ---- sockets ----

using AddrInfo = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

AddrInfo resolve(const std::string& host, uint16_t port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  WEFT_CHECK(rc == 0, "cannot resolve address '{}': {}", host, gai_strerror(rc));
  return AddrInfo(list, freeaddrinfo);
}

std::string formatAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    ::inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(in.sin_port));
  }
  const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
  ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
  return fmt::format("[{}]:{}", text, ntohs(in6.sin6_port));
}

// The address without the port: what a per-source limit counts.
std::string sourceOf(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }

uint16_t boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  WEFT_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0, "getsockname failed: {}",
             std::strerror(errno));
  return addr.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port)
                                   : ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
}

// Non-blocking, so an accept after a peer vanished between poll and accept cannot hang the loop.
FileDescriptor listenTcp(const std::string& bind, uint16_t port) {
  const AddrInfo ai = resolve(bind, port, AI_PASSIVE);
  FileDescriptor fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  WEFT_CHECK(fd.valid(), "coordinator: socket() failed: {}", std::strerror(errno));
  const int on = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // a restart may rebind a fixed port
  WEFT_CHECK(::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.get(), 128) == 0,
             "coordinator: cannot listen on {}:{}: {}", bind, port, std::strerror(errno));
  return fd;
}

FileDescriptor connectTcp(const std::string& host, uint16_t port, Deadline deadline) {
  const AddrInfo ai = resolve(host, port, 0);
  std::string lastError = "no address";
  for (const addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    FileDescriptor fd(::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      lastError = std::strerror(errno);
      continue;
    }
    int error = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      WEFT_CHECK(waitReady(fd.get(), POLLOUT, deadline), "timed out connecting");
      socklen_t length = sizeof error;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error == 0) return fd;
    lastError = std::strerror(error);
  }
  WEFT_THROW("cannot connect: {}", lastError);
}

// Whether the peer of a joined member's connection has closed it or reset it: a joined member
// sends nothing until its roster, so anything readable is its end.
bool closedByPeer(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// ---- messages ----

MemberId decodeId(WireReader& r, const char* message) {
  const uint8_t role = r.getU8("role");
  WEFT_CHECK(role <= static_cast<uint8_t>(Role::Server), "message {}: field 'role' is {}, not worker (0) or server (1)",
             message, role);
  MemberId id;
  id.role = static_cast<Role>(role);
  id.host = static_cast<int>(r.getU32("host"));
  id.slot = static_cast<int>(r.getU32("slot"));
  return id;
}

void encodeId(WireWriter& w, const MemberId& id) {
  w.putU8(static_cast<uint8_t>(id.role));
  w.putU32(static_cast<uint32_t>(id.host));
  w.putU32(static_cast<uint32_t>(id.slot));
}

std::vector<uint8_t> encodeJoin(const JoinRequest& request) {
  WireWriter w;
  encodeId(w, request.id);
  w.putBytes(request.address);
  w.putBytes(request.ncclId);
  w.putBytes(request.clientAddress);
  return w.take();
}

JoinRequest decodeJoin(const Frame& frame) {
  WireReader r = frame.reader();
  JoinRequest request;
  request.id = decodeId(r, "JOIN");
  request.address = r.getBytes("transport_address", kMaxAddressBytes);
  request.ncclId = r.getBytes("nccl_id", kNcclIdBytes);
  request.clientAddress = r.getBytes("client_address", kMaxAddressBytes);
  r.finish();
  WEFT_CHECK(request.ncclId.empty() || request.ncclId.size() == kNcclIdBytes,
             "message JOIN: field 'nccl_id' has {} bytes; it must be empty or {}", request.ncclId.size(), kNcclIdBytes);
  return request;
}

std::vector<uint8_t> encodeRoster(int rank, const std::vector<Member>& members, const std::vector<uint8_t>& ncclId) {
  WireWriter w;
  w.putU32(static_cast<uint32_t>(rank));
  w.putU32(static_cast<uint32_t>(members.size()));
  w.putU32(static_cast<uint32_t>(members.size()));
  for (const Member& m : members) {
    encodeId(w, m.id);
    w.putU32(static_cast<uint32_t>(m.rank));
    w.putBytes(m.address);
    w.putBytes(m.clientAddress);
  }
  w.putBytes(ncclId);
  return w.take();
}

Roster decodeRoster(const Frame& frame, const MemberId& self) {
  WireReader r = frame.reader();
  Roster roster;
  roster.rank = static_cast<int>(r.getU32("rank"));
  roster.worldSize = static_cast<int>(r.getU32("world_size"));
  const uint32_t count = r.getCount("members", kMemberMinBytes);
  WEFT_CHECK(count == static_cast<uint32_t>(roster.worldSize) && roster.rank >= 0 && roster.rank < roster.worldSize,
             "message ROSTER: rank {} and {} members do not fit world size {}", roster.rank, count, roster.worldSize);
  for (uint32_t i = 0; i < count; ++i) {
    Member m;
    m.id = decodeId(r, "ROSTER");
    m.rank = static_cast<int>(r.getU32("member_rank"));
    m.address = r.getBytes("transport_address", kMaxAddressBytes);
    m.clientAddress = r.getBytes("client_address", kMaxAddressBytes);
    WEFT_CHECK(m.rank == static_cast<int>(i), "message ROSTER: member {} has rank {}", i, m.rank);
    roster.members.push_back(std::move(m));
  }
  roster.ncclId = r.getBytes("nccl_id", kNcclIdBytes);
  r.finish();
  const MemberId& ranked = roster.members[static_cast<size_t>(roster.rank)].id;
  WEFT_CHECK(ranked == self, "message ROSTER: rank {} belongs to {}, not to this process ({})", roster.rank,
             describe(ranked), describe(self));
  return roster;
}

/// The reason an ABORT gives, its control bytes escaped: it is printed.
std::string readReason(const Frame& frame) {
  WireReader r = frame.reader();
  const std::string reason = r.getString("reason");
  r.finish();
  return escapeBytes(reason, kMaxStringBytes);
}

std::string describeMissing(const std::vector<MemberId>& missing) {
  std::string out;
  for (size_t i = 0; i < missing.size() && i < kMissingListed; ++i) out += (i ? ", " : "") + describe(missing[i]);
  if (missing.size() > kMissingListed) out += fmt::format(" and {} more", missing.size() - kMissingListed);
  return out;
}

}  // namespace

std::string describe(const MemberId& id) {
  return id.role == Role::Server ? (id.slot == 0 ? fmt::format("server of host {}", id.host)
                                                 : fmt::format("server {} of host {}", id.slot, id.host))
                                 : fmt::format("worker {} of host {}", id.slot, id.host);
}

std::vector<MemberId> expectedMembers(const ResourceSpec& spec) {
  std::vector<MemberId> out;
  for (const WorkerSlot& w : spec.workers()) out.push_back({Role::Worker, w.host, w.slot});
  for (size_t h = 0; h < spec.hosts().size(); ++h)
    for (int s = 0; s < spec.hosts()[h].servers; ++s) out.push_back({Role::Server, static_cast<int>(h), s});
  return out;
}

// ---- the coordinator ----

struct Coordinator::State {
  // A connection on its way from accept to JOIN: first waiting for its answer to the challenge,
  // then, once it proved the secret, for its JOIN. Its frames are read as their bytes arrive.
  struct Pending {
    Pending(FileDescriptor socket, std::string address, const JobId& job)
        : fd(std::move(socket)), peer(std::move(address)), source(sourceOf(peer)), incoming(job, kAuthAnswerBytes) {}
    FileDescriptor fd;
    std::string peer, source;  // its address, and that address without the port (what a share counts)
    Deadline accepted = Clock::now(), expires;
    Nonce challenge{};
    bool authenticated = false;  // it proved the secret: never dropped for another
    ControlSeal seal;            // from then on, every frame either way is sealed
    FrameAssembler incoming;
  };
  struct Joined {
    JoinRequest request;
    FileDescriptor fd;
    ControlSeal seal;
  };
  // A member after the rendezvous: its connection (closed once it fails or ends), what its
  // last heartbeat said, and when (on the awake clock).
  struct Watched {
    MemberId id;
    FileDescriptor fd;
    ControlSeal seal;  // sending: stopJob's ABORT, under the mutex; receiving: the watch's heartbeats
    std::chrono::milliseconds lastHeard{0}, progressSince{0}, beatingSince{0}, closedAt{0};
    MainThreadSample last;
    bool waitedWhileStalled = false;
    bool left = false;
  };

  State(const ResourceSpec& spec, const Secret& secret, const JobId& job, std::vector<MemberId> expected,
        std::chrono::milliseconds timeout, AdmissionLimits limits);

  void serve();
  /// Reads heartbeats until the coordinator stops.
  void watch();
  void decide();
  bool stopping();
  /// Accepts what the listener holds (up to kAcceptsPerWake) and sends each its challenge.
  void acceptConnections();
  /// Makes room in the waiting room for a connection from `source`: drops the oldest connection
  /// still owing its answer from that source when it holds its share, or the oldest of all when
  /// the room is full.
  void makeRoom(const std::string& source);
  /// Reads what `it` sent: its answer to the challenge, then its JOIN.
  void serveConnection(std::list<Pending>::iterator it);
  /// Drops pending connections whose deadline passed.
  void expirePending();
  /// Closes a pending connection, logging why, and tells the peer when `tell` (a peer told
  /// "busy" or "timed out" tries again).
  void drop(std::list<Pending>::iterator it, const std::string& reason, bool tell);
  /// The earliest of the rendezvous's deadline and the pending connections'.
  Deadline nextDeadline() const;
  std::chrono::milliseconds answerTimeout() const { return std::min(limits_.handshakeTimeout, limits_.answerTimeout); }
  /// The awake clock now (under mutex_).
  std::chrono::milliseconds awakeNow() const;
  void readHeartbeat(Watched& w);
  /// ABORT or CHECKPOINT with `reason` to every member still connected.
  void tellEveryMember(MessageType type, const std::string& reason);
  /// Admits the member whose JOIN `frame` is, taking its connection; throws why not.
  void join(Pending& pending, const Frame& frame);
  void sendRosters();
  void abortRendezvous();
  void logRefusal(const std::string& peer, const std::string& reason);
  void wake() const;
  bool closeIfComplete();

  const Secret secret_;
  const JobId job_;
  const std::vector<MemberId> expected_;  // sorted: index = rank
  const std::chrono::milliseconds timeout_;
  const AdmissionLimits limits_;
  const Deadline deadline_;
  FileDescriptor listener_;
  uint16_t port_ = 0;
  FileDescriptor wakeRead_, wakeWrite_;  // a pipe: the destructor wakes the serve loop

  std::mutex mutex_;
  std::map<MemberId, Joined> joined_;              // guarded by mutex_
  std::list<Pending> pending_;                     // the serve thread's own, in order of arrival
  size_t waitingCapacity_ = 0, waitingShare_ = 0;  // connections owing their answer: in all, per source
  // Where the rendezvous stands (guarded): Gathering while members may join; Closed once its
  // outcome is being settled (every member in, the deadline passed, or the destructor ran), from
  // which on no JOIN is admitted; Decided once members_ or failure_ is final.
  enum class Phase { Gathering, Closed, Decided } phase_ = Phase::Gathering;
  bool stop_ = false;  // guarded; the destructor's request: serving and watching end
  std::condition_variable decidedChanged_;
  std::vector<Watched> watched_;  // guarded, except fd (the serve thread's)
  // The awake clock: time the watch loop saw pass, each wake-up counting at most one tick plus
  // the scheduling slack. awake_ is its value at the loop's last wake-up, lastWake_ when that was.
  std::chrono::milliseconds awake_{0};  // guarded
  Deadline lastWake_;                   // guarded

  std::vector<Member> members_;  // the outcome, written by the serve thread before Decided
  std::string failure_;
  // A flood of refused connections writes a few lines a second, then counts.
  LogLimit refusals_{"weft coordinator: ", "refused connections", kRefusalsLoggedPerSecond, std::chrono::seconds(1)};
  std::thread thread_;
};

namespace {

std::vector<MemberId> checkedExpected(const ResourceSpec& spec, std::vector<MemberId> expected) {
  WEFT_CHECK(!expected.empty(), "coordinator: no members are expected");
  std::sort(expected.begin(), expected.end());
  for (size_t i = 0; i < expected.size(); ++i) {
    const MemberId& id = expected[i];
    WEFT_CHECK(i == 0 || expected[i - 1] != id, "coordinator: {} is expected twice", describe(id));
    const bool inSpec = id.host >= 0 && id.host < static_cast<int>(spec.hosts().size()) && id.slot >= 0 &&
                        (id.role == Role::Server ? id.slot < spec.hosts()[static_cast<size_t>(id.host)].servers
                                                 : id.slot < spec.hosts()[static_cast<size_t>(id.host)].slots());
    WEFT_CHECK(inSpec, "coordinator: expected member {} is not in the resource specification", describe(id));
  }
  return expected;
}

// The connections the waiting room holds: `wanted`, the soft limit on open files raised for them
// where the hard limit allows (a common default soft limit is 1,024), fewer where it does not.
size_t waitingRoomSize(size_t room) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 16;
  const rlim_t wanted = room + kDescriptorsKept;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(limit.rlim_max, wanted);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return room;
  return static_cast<size_t>(
      std::max<rlim_t>(16, limit.rlim_cur > kDescriptorsKept ? limit.rlim_cur - kDescriptorsKept : 0));
}

}  // namespace

Coordinator::State::State(const ResourceSpec& spec, const Secret& secret, const JobId& job,
                          std::vector<MemberId> expected, std::chrono::milliseconds timeout, AdmissionLimits limits)
    : secret_(secret),
      job_(job),
      expected_(checkedExpected(spec, std::move(expected))),
      timeout_(timeout),
      limits_(limits),
      deadline_(Clock::now() + timeout),
      listener_(listenTcp(spec.bind(), spec.coordinatorPort())) {
  port_ = boundPort(listener_.get());
  waitingCapacity_ = waitingRoomSize(limits.waitingRoom);
  waitingShare_ = std::max<size_t>(1, waitingCapacity_ / 2);
  lastWake_ = Clock::now();
  int ends[2];
  WEFT_CHECK(::pipe2(ends, O_CLOEXEC | O_NONBLOCK) == 0, "coordinator: pipe failed: {}", std::strerror(errno));
  wakeRead_.reset(ends[0]);
  wakeWrite_.reset(ends[1]);
}

void Coordinator::State::logRefusal(const std::string& peer, const std::string& reason) {
  refusals_.write([&] { return fmt::format("refused connection from {}: {}", peer, reason); });
}

void Coordinator::State::wake() const {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wakeWrite_.get(), &byte, 1);  // a full pipe is already awake
}

// Closes the rendezvous once every member joined; true when closed (complete, or stopped by the
// destructor). A member whose connection closed after its JOIN does not count: it is trying
// again, and the rosters wait for it.
bool Coordinator::State::closeIfComplete() {
  std::lock_guard lock(mutex_);
  if (phase_ == Phase::Gathering && joined_.size() == expected_.size()) {
    std::erase_if(joined_, [](const auto& entry) { return closedByPeer(entry.second.fd.get()); });
    if (joined_.size() == expected_.size()) phase_ = Phase::Closed;
  }
  return phase_ != Phase::Gathering;
}

void Coordinator::State::decide() {
  {
    std::lock_guard lock(mutex_);
    phase_ = Phase::Decided;
  }
  decidedChanged_.notify_all();
}

bool Coordinator::State::stopping() {
  std::lock_guard lock(mutex_);
  return stop_;
}

void Coordinator::State::serve() {
  for (;;) {
    if (closeIfComplete()) {
      sendRosters();  // a stop request also ends here; with members missing it sends nothing
      break;
    }
    if (Clock::now() >= deadline_) {
      abortRendezvous();
      break;
    }
    std::vector<pollfd> fds{{listener_.get(), POLLIN, 0}, {wakeRead_.get(), POLLIN, 0}};
    for (const Pending& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), millisecondsUntil(nextDeadline())) > 0) {
      char drain[64];
      while (::read(wakeRead_.get(), drain, sizeof drain) > 0) {
      }
      // Newer connections join the list's end, and a served one may leave it: the polled ones
      // are the first fds.size() - 2, visited in order.
      auto it = pending_.begin();
      for (size_t i = 2; i < fds.size(); ++i) {
        const auto next = std::next(it);
        if (fds[i].revents) serveConnection(it);
        it = next;
      }
      if (fds[0].revents & POLLIN) acceptConnections();
    }
    expirePending();
  }
  pending_.clear();  // closes their connections: their peers try again or give up
  decide();
  if (!members_.empty()) watch();
}

Deadline Coordinator::State::nextDeadline() const {
  Deadline next = deadline_;
  for (const Pending& p : pending_) next = std::min(next, p.expires);
  return next;
}

std::chrono::milliseconds Coordinator::State::awakeNow() const {
  const auto sinceWake = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - lastWake_);
  return awake_ + std::min(sinceWake, kWatchTick + kSchedulingSlack);
}

void Coordinator::State::readHeartbeat(Watched& w) {
  try {
    // A heartbeat is one small write, so it arrives whole; the deadline only bounds a torn one.
    const Frame frame = readSealed(w.fd.get(), w.seal, Clock::now() + std::chrono::seconds(1), job_, kHeartbeatPayload);
    if (frame.type == MessageType::Leave) {
      frame.reader().finish();
      std::lock_guard lock(mutex_);
      w.left = true;
      return;
    }
    expectType(frame, MessageType::Heartbeat);
    WireReader r = frame.reader();
    MainThreadSample sample;
    sample.progress = r.getU64("progress");
    sample.waiting = r.getU8("waiting") != 0;
    sample.state = static_cast<char>(r.getU8("main_thread"));
    r.finish();
    std::lock_guard lock(mutex_);
    const std::chrono::milliseconds now = awakeNow();
    if (sample.progress != w.last.progress) {
      w.progressSince = now;
      w.waitedWhileStalled = false;
    }
    w.waitedWhileStalled = w.waitedWhileStalled || sample.waiting;
    if (now - w.lastHeard > kSteadyGap) w.beatingSince = now;
    w.last = sample;
    w.lastHeard = now;
  } catch (const Error&) {
    std::lock_guard lock(mutex_);
    w.fd.reset();  // closed (the member ended) or broken: silent from now on
    w.closedAt = awakeNow();
  }
}

void Coordinator::State::watch() {
  while (!stopping()) {
    std::vector<pollfd> fds{{wakeRead_.get(), POLLIN, 0}};
    std::vector<Watched*> polled;
    for (Watched& w : watched_) {
      if (!w.fd.valid()) continue;
      fds.push_back({w.fd.get(), POLLIN, 0});
      polled.push_back(&w);
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(kWatchTick.count()));
    {
      std::lock_guard lock(mutex_);
      awake_ = awakeNow();
      lastWake_ = Clock::now();
    }
    if (ready <= 0) continue;
    char drain[64];
    while (::read(wakeRead_.get(), drain, sizeof drain) > 0) {
    }
    for (size_t i = 0; i < polled.size(); ++i)
      if (fds[i + 1].revents) readHeartbeat(*polled[i]);
  }
}

void Coordinator::State::acceptConnections() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    sockaddr_storage addr{};
    socklen_t length = sizeof addr;
    FileDescriptor fd(
        ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &length, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      // Out of file descriptors, the connection stays in the backlog and the listener readable:
      // the oldest silent connection makes way for it.
      const bool full = errno == EMFILE || errno == ENFILE;
      const auto oldestSilent =
          std::find_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.authenticated; });
      if (full && oldestSilent != pending_.end()) {
        drop(oldestSilent, "busy: dropped for a newer connection: out of file descriptors", true);
        continue;
      }
      return;  // none left, the peer gave up already, or a transient error: poll again
    }
    std::string peer = formatAddress(addr);
    makeRoom(sourceOf(peer));
    Pending& p = pending_.emplace_back(std::move(fd), std::move(peer), job_);
    p.expires = p.accepted + answerTimeout();
    try {
      p.challenge = sendChallenge(p.fd.get(), job_, p.expires);  // a new socket's buffer takes it at once
    } catch (const Error& e) {
      drop(std::prev(pending_.end()), e.what(), false);
    }
  }
}

void Coordinator::State::makeRoom(const std::string& source) {
  size_t waiting = 0, fromSource = 0;
  auto oldest = pending_.end(), oldestOfSource = pending_.end();
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {  // in order of arrival
    if (it->authenticated) continue;
    ++waiting;
    if (oldest == pending_.end()) oldest = it;
    if (it->source != source) continue;
    ++fromSource;
    if (oldestOfSource == pending_.end()) oldestOfSource = it;
  }
  const auto victim = fromSource >= waitingShare_   ? oldestOfSource
                      : waiting >= waitingCapacity_ ? oldest
                                                    : pending_.end();
  if (victim == pending_.end()) return;
  // "busy": the peer, a member among a flood, tries again.
  drop(victim,
       fmt::format("busy: dropped for a newer connection: {} connections owed their answer to the challenge, {} of "
                   "them from {}",
                   waiting, fromSource, victim->source),
       true);
}

void Coordinator::State::serveConnection(std::list<Pending>::iterator it) {
  Pending& p = *it;
  std::optional<Frame> frame;
  try {
    frame = p.incoming.receive(p.fd.get());
  } catch (const Error& e) {
    drop(it, e.what(), true);
    return;
  }
  if (!frame) return;
  if (!p.authenticated) {
    try {
      p.seal = ControlSeal(
          checkAnswer(p.fd.get(), secret_, job_, p.challenge, *frame, p.expires));  // tells a peer it refuses
    } catch (const Error& e) {
      drop(it, e.what(), false);
      return;
    }
    p.authenticated = true;
    p.expires = p.accepted + limits_.handshakeTimeout;
    p.incoming = FrameAssembler(job_, kMaxJoinPayload + ControlSeal::kTagBytes);
    return;
  }
  try {
    join(p, p.seal.open(std::move(*frame)));
  } catch (const Error& e) {
    drop(it, e.what(), true);
    return;
  }
  pending_.erase(it);
}

void Coordinator::State::expirePending() {
  const Deadline now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    const auto next = std::next(it);
    if (now >= it->expires) {
      // "timed out": the peer, a member too slow on a busy machine, tries again.
      drop(it,
           it->authenticated
               ? fmt::format("timed out: no JOIN within {} ms of connecting", limits_.handshakeTimeout.count())
               : fmt::format("timed out: no answer to the challenge within {} ms", answerTimeout().count()),
           true);
    }
    it = next;
  }
}

void Coordinator::State::drop(std::list<Pending>::iterator it, const std::string& reason, bool tell) {
  {
    std::lock_guard lock(mutex_);
    logRefusal(it->peer, reason);
  }
  if (tell && it->authenticated)
    sendSealedRefusal(it->fd.get(), it->seal, job_, reason);
  else if (tell)
    sendRefusal(it->fd.get(), job_, reason);
  pending_.erase(it);
}

void Coordinator::State::join(Pending& pending, const Frame& frame) {
  expectType(frame, MessageType::Join);
  JoinRequest request = decodeJoin(frame);
  std::lock_guard lock(mutex_);
  WEFT_CHECK(phase_ == Phase::Gathering, "the rendezvous is over");
  WEFT_CHECK(std::binary_search(expected_.begin(), expected_.end(), request.id), "{} is not a member of this job",
             describe(request.id));
  const auto earlier = joined_.find(request.id);
  // A member whose first connection closed after its JOIN (it then tries again) replaces it;
  // a second live claim of the same identity is refused.
  WEFT_CHECK(earlier == joined_.end() || closedByPeer(earlier->second.fd.get()), "{} has already joined",
             describe(request.id));
  const MemberId id = request.id;
  joined_.insert_or_assign(id, Joined{std::move(request), std::move(pending.fd), pending.seal});
}

void Coordinator::State::sendRosters() {
  // The rendezvous is closed: no admission touches joined_ any more.
  if (joined_.size() != expected_.size()) return;
  std::vector<Member> members;
  for (size_t rank = 0; rank < expected_.size(); ++rank) {
    const JoinRequest& joined = joined_.at(expected_[rank]).request;
    members.push_back({expected_[rank], static_cast<int>(rank), joined.address, joined.clientAddress});
  }
  const Joined& first = joined_.at(expected_[0]);
  const std::vector<uint8_t> ncclId = expected_[0].role == Role::Worker ? first.request.ncclId : std::vector<uint8_t>{};
  for (const Member& m : members) {
    FileDescriptor& fd = joined_.at(m.id).fd;
    ControlSeal& seal = joined_.at(m.id).seal;
    try {
      const std::vector<uint8_t> payload = encodeRoster(m.rank, members, ncclId);
      writeSealed(fd.get(), seal, MessageType::Roster, job_, payload, Clock::now() + limits_.handshakeTimeout);
    } catch (const Error& e) {
      // The member died after joining; the others still get the roster and will see it gone.
      std::fputs(fmt::format("weft coordinator: cannot send the roster to {}: {}\n", describe(m.id), e.what()).c_str(),
                 stderr);
      fd.reset();
    }
    std::lock_guard lock(mutex_);
    const std::chrono::milliseconds now = awakeNow();
    watched_.push_back({m.id, std::move(fd), seal, now, now, now, {}, {}});
  }
  joined_.clear();
  members_ = std::move(members);
}

void Coordinator::State::abortRendezvous() {
  {
    std::lock_guard lock(mutex_);
    phase_ = Phase::Closed;  // from here on no admission touches joined_
  }
  std::vector<MemberId> missing;
  for (const MemberId& id : expected_) {
    if (!joined_.count(id)) missing.push_back(id);
  }
  failure_ = fmt::format("rendezvous timed out after {:g} s: {} of {} members missing ({})", timeout_.count() / 1000.0,
                         missing.size(), expected_.size(), describeMissing(missing));
  WireWriter w;
  w.putString(failure_);
  for (auto& [id, member] : joined_) {
    try {
      writeSealed(member.fd.get(), member.seal, MessageType::Abort, job_, w.bytes(),
                  Clock::now() + limits_.handshakeTimeout);
    } catch (const Error&) {
      // That member is gone; nothing else to tell it.
    }
  }
  joined_.clear();
}

Coordinator::Coordinator(const ResourceSpec& spec, const Secret& secret, const JobId& job,
                         std::vector<MemberId> expected, std::chrono::milliseconds timeout, AdmissionLimits limits)
    : state_(std::make_unique<State>(spec, secret, job, std::move(expected), timeout, limits)) {
  state_->thread_ = std::thread(&State::serve, state_.get());
}

Coordinator::~Coordinator() {
  {
    std::lock_guard lock(state_->mutex_);
    if (state_->phase_ == State::Phase::Gathering) state_->phase_ = State::Phase::Closed;
    state_->stop_ = true;
  }
  state_->wake();
  if (state_->thread_.joinable()) state_->thread_.join();
}

uint16_t Coordinator::port() const { return state_->port_; }

size_t Coordinator::waitingShare() const { return state_->waitingShare_; }

std::vector<Member> Coordinator::wait() {
  std::unique_lock lock(state_->mutex_);
  state_->decidedChanged_.wait(lock, [&] { return state_->phase_ == State::Phase::Decided; });
  WEFT_CHECK(state_->failure_.empty(), "{}", state_->failure_);
  return state_->members_;
}

std::map<MemberId, MemberLiveness> Coordinator::liveness() const {
  std::lock_guard lock(state_->mutex_);
  std::map<MemberId, MemberLiveness> out;
  const std::chrono::milliseconds now = state_->awakeNow();
  for (const State::Watched& w : state_->watched_) {
    MemberLiveness& l = out[w.id];
    l.silence = now - w.lastHeard;
    l.stalled = now - w.progressSince;
    l.steady = l.silence > kSteadyGap ? std::chrono::milliseconds(0) : now - w.beatingSince;
    l.connected = w.fd.valid();
    l.closedFor = l.connected ? std::chrono::milliseconds(0) : now - w.closedAt;
    l.left = w.left;
    l.progress = w.last.progress;
    l.waiting = w.last.waiting;
    l.waitedWhileStalled = w.waitedWhileStalled;
    l.mainThread = w.last.state;
  }
  return out;
}

void Coordinator::stopJob(const std::string& reason) { state_->tellEveryMember(MessageType::Abort, reason); }

void Coordinator::requestCheckpoint(const std::string& reason) {
  state_->tellEveryMember(MessageType::Checkpoint, reason);
}

void Coordinator::State::tellEveryMember(MessageType type, const std::string& reason) {
  WireWriter w;
  w.putString(reason);
  std::lock_guard lock(mutex_);
  for (Watched& member : watched_) {
    if (!member.fd.valid()) continue;
    try {
      writeSealed(member.fd.get(), member.seal, type, job_, w.bytes(), Clock::now() + std::chrono::seconds(1));
    } catch (const Error&) {
      // That member is gone, or stopped reading: its connection closing tells it as much.
    }
  }
}

// ---- heartbeats ----

struct Heartbeat::State {
  FileDescriptor fd;
  ControlSeal seal;  // used by the beating thread alone
  JobId job;
  std::chrono::milliseconds interval;
  LostHandler onLost;
  LostHandler onCheckpoint;
  Sampler sample;
  FileDescriptor stopRead, stopWrite;  // a pipe: the destructor's request (kStop), or leave()'s (kLeave)
  std::atomic<bool> lost{false};
  std::mutex leaving;
  std::condition_variable leaveSent;
  bool left = false;  // guarded by leaving
  std::chrono::milliseconds verdictWait{0};
  std::thread thread;

  static constexpr char kStop = 1, kLeave = 2;

  /// Sends LEAVE and wakes leave().
  void sendLeave() {
    try {
      writeSealed(fd.get(), seal, MessageType::Leave, job, {}, Clock::now() + std::chrono::seconds(10));
    } catch (const Error&) {
      // The coordinator is gone: the closed connection will say so, and a member that left ends anyway.
    }
    std::lock_guard lock(leaving);
    left = true;
    leaveSent.notify_all();
  }

  /// What the readable connection brought: a request for a checkpoint (the connection goes on),
  /// or its end: the coordinator stopped the job (ABORT), or closed or broke the connection.
  struct End {
    bool ended = true;
    bool aborted = false;
    std::string why;
  };
  End readEnd() {
    char byte;
    const ssize_t n = ::recv(fd.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0) return {true, false, "the coordinator closed the connection"};
    if (n < 0) return {true, false, fmt::format("the coordinator connection failed: {}", std::strerror(errno))};
    try {
      const Frame frame = readSealed(fd.get(), seal, Clock::now() + std::chrono::seconds(5), job);
      if (frame.type == MessageType::Abort) return {true, true, "the job stopped: " + readReason(frame)};
      if (frame.type == MessageType::Checkpoint) return {false, false, readReason(frame)};
      return {true, false, fmt::format("the coordinator sent {} after the roster", messageTypeName(frame.type))};
    } catch (const Error& e) {
      return {true, false, fmt::format("the coordinator connection failed: {}", e.what())};
    }
  }

  bool hasLeft() {
    std::lock_guard lock(leaving);
    return left;
  }

  // Beats until stopped, or until this member left (then the coordinator has read all it sent,
  // and closes the connection without a reset). Between beats it watches the connection: after
  // the roster the coordinator sends nothing but ABORT and CHECKPOINT, so the socket becoming
  // readable means a request for a checkpoint, or that the job stopped or the connection closed
  // (or broke), which is no loss once the member left.
  void beat() {
    for (;;) {
      pollfd fds[2] = {{stopRead.get(), POLLIN, 0}, {fd.get(), POLLIN, 0}};
      const int ready = ::poll(fds, 2, static_cast<int>(interval.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (fds[0].revents) {
        char request = kStop;
        if (::read(stopRead.get(), &request, 1) != 1 || request == kStop) return;
        sendLeave();
        continue;
      }
      std::string failure;
      if (fds[1].revents) {
        const End end = readEnd();
        if (!end.ended) {
          if (onCheckpoint) onCheckpoint(end.why);
          continue;
        }
        if (hasLeft() && !end.aborted) return;
        failure = end.why;
      } else if (hasLeft()) {
        continue;
      } else {
        const MainThreadSample s = sample ? sample() : MainThreadSample{};
        WireWriter w;
        w.putU64(s.progress);
        w.putU8(s.waiting ? 1 : 0);
        w.putU8(static_cast<uint8_t>(s.state));
        try {
          // The deadline only bounds a coordinator that stopped reading for good: a few dozen
          // bytes a second take hours to fill a socket's buffer.
          writeSealed(fd.get(), seal, MessageType::Heartbeat, job, w.bytes(), Clock::now() + std::chrono::minutes(10));
          continue;
        } catch (const Error& e) {
          failure = e.what();
        }
      }
      {
        std::lock_guard lock(leaving);
        lost = true;
        leaveSent.notify_all();
      }
      if (onLost) onLost(failure);
      return;
    }
  }
};

Heartbeat::Heartbeat(int fd, ControlSeal seal, const JobId& job, std::chrono::milliseconds interval, LostHandler onLost,
                     Sampler sample, std::chrono::milliseconds verdictWait, LostHandler onCheckpoint)
    : state_(std::make_unique<State>()) {
  state_->onCheckpoint = std::move(onCheckpoint);
  state_->verdictWait = verdictWait;
  state_->fd.reset(fd);
  state_->seal = seal;
  state_->job = job;
  state_->interval = interval;
  state_->onLost = std::move(onLost);
  state_->sample = std::move(sample);
  int ends[2];
  WEFT_CHECK(::pipe2(ends, O_CLOEXEC) == 0, "heartbeat: pipe failed: {}", std::strerror(errno));
  state_->stopRead.reset(ends[0]);
  state_->stopWrite.reset(ends[1]);
  state_->thread = std::thread(&State::beat, state_.get());
}

Heartbeat::~Heartbeat() {
  if (state_->verdictWait.count() > 0) {
    std::unique_lock lock(state_->leaving);
    state_->leaveSent.wait_for(lock, state_->verdictWait, [&] { return state_->left || state_->lost; });
  }
  const char byte = State::kStop;
  [[maybe_unused]] const ssize_t n = ::write(state_->stopWrite.get(), &byte, 1);
  ::shutdown(state_->fd.get(), SHUT_RDWR);  // ends a write the coordinator does not read
  state_->thread.join();
}

bool Heartbeat::lost() const { return state_->lost; }

void Heartbeat::leave() {
  const char byte = State::kLeave;
  if (::write(state_->stopWrite.get(), &byte, 1) != 1) return;
  std::unique_lock lock(state_->leaving);
  // The beating thread sends it, unless the connection was lost first (then nothing is owed).
  state_->leaveSent.wait(lock, [&] { return state_->left || state_->lost; });
}

// ---- the member side ----

namespace {

// A failure worth another try: the coordinator dropped the connection (or timed its handshake
// out) before admitting it, which a flood of other connections or a busy machine causes.
struct Retry {
  std::string reason;
};

// One attempt: connect, authenticate, join and wait for the roster.
Roster joinOnce(const std::string& address, uint16_t port, const Secret& secret, const JobId& job,
                const JoinRequest& request, Deadline deadline, HeartbeatOptions& heartbeat,
                bool coordinatorMayComeLater) {
  FileDescriptor fd;
  try {
    fd = connectTcp(address, port, deadline);
  } catch (const Error& e) {
    if (!coordinatorMayComeLater || Clock::now() >= deadline) throw;
    throw Retry{fmt::format("no coordinator there yet: {}", e.what())};
  }
  ControlSeal seal;
  try {
    seal = ControlSeal(clientHandshake(fd.get(), secret, job, deadline));
  } catch (const Error& e) {
    const std::string reason = e.what();
    // The coordinator's verdicts (a wrong secret, another job) are final; a dropped connection,
    // or a handshake it timed out or had no room for, is not. Our own deadline ends the tries.
    const bool verdict = reason.rfind("refused by the peer: ", 0) == 0 &&
                         reason.rfind("refused by the peer: timed out", 0) != 0 &&
                         reason.rfind("refused by the peer: busy", 0) != 0;
    if (verdict || Clock::now() >= deadline) throw;
    throw Retry{reason};
  }
  Frame reply;
  try {
    writeSealed(fd.get(), seal, MessageType::Join, job, encodeJoin(request), deadline);
    reply = readSealed(fd.get(), seal, deadline, job);
  } catch (const ConnectionClosed& e) {
    // Admitted, then cut off (a network fault, a coordinator restarting its listener): a new
    // connection's JOIN replaces this one's.
    if (Clock::now() >= deadline) throw;
    throw Retry{fmt::format("the coordinator's connection closed after the handshake: {}", e.what())};
  }
  WEFT_CHECK(reply.type != MessageType::Abort, "aborted by the coordinator: {}", readReason(reply));
  expectType(reply, MessageType::Roster);
  Roster roster = decodeRoster(reply, request.id);
  roster.heartbeat = std::make_shared<Heartbeat>(fd.release(), seal, job, heartbeat.interval,
                                                 std::move(heartbeat.onLost), std::move(heartbeat.sample),
                                                 heartbeat.verdictWait, std::move(heartbeat.onCheckpoint));
  return roster;
}

}  // namespace

Roster rendezvous(const std::string& address, uint16_t port, const Secret& secret, const JobId& job,
                  const JoinRequest& request, std::chrono::milliseconds timeout, HeartbeatOptions heartbeat,
                  bool coordinatorMayComeLater) {
  const Deadline deadline = Clock::now() + timeout;
  try {
    std::chrono::milliseconds backoff{20};
    for (int attempt = 1;; ++attempt) {
      try {
        return joinOnce(address, port, secret, job, request, deadline, heartbeat, coordinatorMayComeLater);
      } catch (const Retry& retry) {
        // Jittered, so members dropped together do not come back together.
        static thread_local std::minstd_rand random(static_cast<unsigned>(::getpid()) ^
                                                    static_cast<unsigned>(Clock::now().time_since_epoch().count()));
        const auto pause =
            backoff / 2 + std::chrono::milliseconds(random() % static_cast<unsigned>(backoff.count() / 2 + 1));
        WEFT_CHECK(Clock::now() + pause < deadline, "{} (after {} attempts)", retry.reason, attempt);
        std::this_thread::sleep_for(pause);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      }
    }
  } catch (const Error& e) {
    WEFT_THROW("rendezvous of {} with the coordinator at {}:{} failed: {}", describe(request.id), address, port,
               e.what());
  }
}

}  // namespace weft::dist
