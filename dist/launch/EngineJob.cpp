// A job started by a cluster engine (see the header).
#include "dist/launch/EngineJob.h"

#include "core/Error.h"
#include "dist/transport/Auth.h"
#include "dist/launch/Coordinator.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

namespace weft::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> processLeft{false};

std::span<const uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

/// A port for a rendezvous across hosts that nothing names: one of 20000-39999, from the run's ids.
uint16_t portFromRunKey(const std::string& runKey) {
  const std::array<uint8_t, 4> key{'w', 'e', 'f', 't'};
  const Digest d = hmacSha256(key, bytesOf("rendezvous port " + runKey));
  return static_cast<uint16_t>(20000 + (d[0] | d[1] << 8) % 20000);
}

/// The first IPv4 (else IPv6) address `host` resolves to.
sockaddr_storage resolve(const std::string& host, uint16_t port, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  WEFT_CHECK(rc == 0, "the rendezvous host '{}' does not resolve: {}", host, gai_strerror(rc));
  const addrinfo* chosen = list;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
  sockaddr_storage out{};
  std::memcpy(&out, chosen->ai_addr, chosen->ai_addrlen);
  length = chosen->ai_addrlen;
  ::freeaddrinfo(list);
  return out;
}

std::string numeric(const sockaddr_storage& addr, socklen_t length) {
  char text[NI_MAXHOST];
  const int rc =
      ::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), length, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
  WEFT_CHECK(rc == 0, "cannot print an address: {}", gai_strerror(rc));
  return text;
}

bool isLoopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(addr).sin_addr.s_addr) >> 24) == 127;
  return addr.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr);
}

/// The address this host sends from toward `addr`: where its processes can be reached.
std::string localAddressToward(const sockaddr_storage& addr, socklen_t length) {
  FileDescriptor probe(::socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  WEFT_CHECK(probe.valid(), "socket failed: {}", std::strerror(errno));
  // A datagram socket's connect sends nothing: it only picks the route and its source address.
  WEFT_CHECK(::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), length) == 0,
             "no route to the rendezvous at {}: {}", numeric(addr, length), std::strerror(errno));
  sockaddr_storage self{};
  socklen_t selfLength = sizeof self;
  WEFT_CHECK(::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&self), &selfLength) == 0, "getsockname failed: {}",
             std::strerror(errno));
  std::string text = numeric(self, selfLength);
  return text.substr(0, text.find('%'));
}

/// When process `pid` started (clock ticks since boot), or 0 when there is no such process.
uint64_t processStart(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

/// The user's directory for rendezvous files: $XDG_RUNTIME_DIR/weft, else /tmp/weft-UID; made
/// 0700 when missing, refused when another user owns it or others may enter it.
std::string rendezvousDirectory() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  const std::string dir =
      runtime != nullptr && *runtime ? std::string(runtime) + "/weft" : fmt::format("/tmp/weft-{}", ::getuid());
  if (::mkdir(dir.c_str(), 0700) != 0)
    WEFT_CHECK(errno == EEXIST, "cannot make the rendezvous directory {}: {}", dir, std::strerror(errno));
  struct stat st {};
  WEFT_CHECK(
      ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid() && (st.st_mode & 077) == 0,
      "the rendezvous directory {} is not a directory of this user's that only it may enter (mode 0700)", dir);
  return dir;
}

/// What the job's first process leaves for the others on one host.
struct RendezvousNote {
  pid_t pid = 0;
  uint64_t started = 0;
  uint16_t port = 0;
  JobId job{};
  Secret secret{};
};

std::string notePath(const EngineView& view) {
  const std::array<uint8_t, 4> key{'w', 'e', 'f', 't'};
  const Digest d = hmacSha256(key, bytesOf("rendezvous file " + view.runKey));
  return fmt::format("{}/rendezvous-{}", rendezvousDirectory(), toHex(std::span<const uint8_t>(d.data(), 16)));
}

void writeNote(const std::string& path, const RendezvousNote& note) {
  const std::string temporary = fmt::format("{}.{}", path, note.pid);
  const std::string text = fmt::format("weft-rendezvous 1\n{} {} {}\n{}\n{}\n", note.pid, note.started, note.port,
                                       toHex(note.job), toHex(note.secret));
  FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  WEFT_CHECK(fd.valid(), "cannot write the rendezvous file {}: {}", temporary, std::strerror(errno));
  WEFT_CHECK(::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()),
             "cannot write the rendezvous file {}: {}", temporary, std::strerror(errno));
  fd.reset();
  WEFT_CHECK(::rename(temporary.c_str(), path.c_str()) == 0, "cannot write the rendezvous file {}: {}", path,
             std::strerror(errno));  // whole or not at all, for readers
}

/// The note at `path` when its writer is alive (a note of a run that was killed is stale).
std::optional<RendezvousNote> readLiveNote(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return std::nullopt;
  struct stat st {};
  WEFT_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::getuid() && (st.st_mode & 077) == 0 &&
                 st.st_size < 4096,
             "the rendezvous file {} is not a small 0600 file of this user's", path);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  if (::read(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) return std::nullopt;
  std::istringstream in(text);
  std::string magic, version, job, secret;
  RendezvousNote note;
  unsigned port = 0;
  in >> magic >> version >> note.pid >> note.started >> port >> job >> secret;
  WEFT_CHECK(in && magic == "weft-rendezvous" && version == "1" && port > 0 && port < 65536,
             "the rendezvous file {} does not parse", path);
  note.port = static_cast<uint16_t>(port);
  note.job = jobIdFromHex(job, path);
  note.secret = secretFromHex(secret, path);
  if (processStart(note.pid) != note.started) return std::nullopt;
  return note;
}

RendezvousNote awaitNote(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (std::optional<RendezvousNote> note = readLiveNote(path)) return *note;
    WEFT_CHECK(Clock::now() < deadline,
               "the job's first process (local rank 0 of host 0) left no rendezvous file at {} within {:g} s: it did "
               "not start, failed before, or runs as another user or in another engine step",
               path, static_cast<double>(timeout.count()) / 1000.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Secret secretFromFile(const std::string& flag) {
  if (!flag.empty()) return loadSecret(flag);
  const char* variable = std::getenv("WEFT_SECRET_FILE");
  WEFT_CHECK(variable != nullptr && *variable, "no job secret: give --secret-file or WEFT_SECRET_FILE");
  return loadSecret(variable);
}

bool hasSecretFile(const std::string& flag) {
  const char* variable = std::getenv("WEFT_SECRET_FILE");
  return !flag.empty() || (variable != nullptr && *variable);
}

/// "worker 1 of host 0 (local rank 2 on node02)".
std::string describeMember(const MemberId& id, const EngineView& view, int serversPerHost) {
  const int local = id.role == Role::Server ? id.slot : id.slot + serversPerHost;
  const std::string host =
      static_cast<size_t>(id.host) < view.hosts.size() ? " on " + view.hosts[static_cast<size_t>(id.host)] : "";
  return fmt::format("{} (local rank {}{})", describe(id), local, host);
}

}  // namespace

bool startedByEngine() {
  const char* engine = std::getenv("WEFT_ENGINE");
  return engine != nullptr && *engine;
}

EngineRendezvous engineRendezvous(const EngineView& view) {
  if (view.nodes() == 1) return {"127.0.0.1", 0, "127.0.0.1"};
  WEFT_CHECK(!view.coordinatorHost.empty(),
             "the {} job spans {} hosts, and nothing says where its first process serves the rendezvous: set "
             "WEFT_RENDEZVOUS=HOST:PORT (HOST: the first host's address) in every process's environment (mpirun -x)",
             view.engine, view.nodes());
  const uint16_t port = view.coordinatorPort != 0 ? view.coordinatorPort : portFromRunKey(view.runKey);
  socklen_t length = 0;
  const sockaddr_storage addr = resolve(view.coordinatorHost, port, length);
  WEFT_CHECK(!isLoopback(addr),
             "the {} job spans {} hosts, but its rendezvous host '{}' resolves to {}, a loopback address the other "
             "hosts cannot reach (set WEFT_RENDEZVOUS=HOST:PORT to an address of the first host's network)",
             view.engine, view.nodes(), view.coordinatorHost, numeric(addr, length));
  return {view.coordinatorHost, port, localAddressToward(addr, length)};
}

std::string describeEngineEnvironment(const Environment& environment, int serversPerHost) {
  if (environment.count("WEFT_COORDINATOR")) return "weft launch started this process (WEFT_COORDINATOR is set)\n";
  const std::optional<EngineView> view = detectEngine(environment);
  if (!view)
    return "no cluster engine started this process: it trains alone, or launches with --workers or --cluster\n";
  const EngineRendezvous rendezvous = engineRendezvous(*view);
  const EngineLayout layout = layoutEngineJob(*view, serversPerHost, rendezvous.selfAddress);
  std::string out = describeEngineProcess(*view, layout) + "\n";
  out += rendezvous.port == 0 ? fmt::format("rendezvous: {}, a port the first process picks\n", rendezvous.host)
                              : fmt::format("rendezvous: {}:{}\n", rendezvous.host, rendezvous.port);
  out += fmt::format("this host's address: {}\n", rendezvous.selfAddress);
  for (const std::string& e : view->evidence) out += "  " + e + "\n";
  return out;
}

struct EngineJob::State {
  EngineView view;
  EngineOptions options;
  EngineRendezvous rendezvous;
  EngineLayout layout;
  std::unique_ptr<SecretMemory> secretMemory;
  // The first process's part: the rendezvous, its note for the others, and the watch.
  std::unique_ptr<Coordinator> coordinator;
  std::string notePath;
  std::thread watcher;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopWatching = false;  // guarded
  bool watching = true;       // guarded: false once every member left, or the rendezvous failed

  bool first() const { return view.node == 0 && view.localRank == 0; }
  std::string who(const MemberId& id) const { return describeMember(id, view, options.serversPerHost); }

  /// Why the job must stop, judged from the members' heartbeats, or "" while it runs well.
  std::string verdict(const std::map<MemberId, MemberLiveness>& members) const {
    // Of members that ended without finishing, the first to end is the cause: the others may
    // have failed on it.
    const MemberId* ended = nullptr;
    for (const auto& [id, l] : members)
      if (id != layout.self && !l.left && !l.connected && (!ended || l.closedFor > members.at(*ended).closedFor))
        ended = &id;
    if (ended) return fmt::format("{} ended without finishing: its connection to the rendezvous closed", who(*ended));
    for (const auto& [id, l] : members) {
      if (id == layout.self || l.left || l.silence < options.silenceLimit) continue;
      for (const auto& [other, o] : members)
        if (other != id && o.connected && o.steady >= options.silenceLimit)
          return fmt::format("{} sent no heartbeat for {:.1f} s while the others did: it froze, or its host is cut off",
                             who(id), static_cast<double>(l.silence.count()) / 1000.0);
    }
    return "";
  }

  /// Until every member has left: stops the job when one failed.
  void watch() {
    bool joined = true;
    try {
      coordinator->wait();
    } catch (const Error&) {
      joined = false;  // the rendezvous failed: its members were told why
    }
    std::unique_lock lock(mutex);
    while (joined && !stopWatching) {
      lock.unlock();
      const std::map<MemberId, MemberLiveness> members = coordinator->liveness();
      const std::string failure = verdict(members);
      if (!failure.empty()) {
        coordinator->stopJob(failure);
        std::cerr << fmt::format("weft: {} stops: the job stopped: {}\n", who(layout.self), failure) << std::flush;
        std::_Exit(kExitPeerFailed);
      }
      const bool allLeft = std::all_of(members.begin(), members.end(), [](const auto& m) { return m.second.left; });
      lock.lock();
      if (allLeft) break;
      wake.wait_for(lock, std::chrono::milliseconds(100));
    }
    watching = false;
    wake.notify_all();
  }

  void serve(const Secret& secret, const JobId& job) {
    coordinator = std::make_unique<Coordinator>(layout.resources, secret, job, expectedMembers(layout.resources),
                                                options.rendezvousTimeout);
    if (rendezvous.port == 0) {
      rendezvous.port = coordinator->port();
      const pid_t self = ::getpid();
      writeNote(notePath, {self, processStart(self), rendezvous.port, job, secret});
    }
    watcher = std::thread(&State::watch, this);
  }

  void exportIdentity(const JobId& job) {
    const MemberId& self = layout.self;
    const std::pair<const char*, std::string> variables[] = {
        {"WEFT_COORDINATOR", fmt::format("{}:{}", rendezvous.host, rendezvous.port)},
        {"WEFT_ROLE", self.role == Role::Worker ? "worker" : "server"},
        {"WEFT_HOST", std::to_string(self.host)},
        {"WEFT_SLOT", std::to_string(self.slot)},
        {"WEFT_JOB_ID", toHex(job)},
        {"WEFT_JOB_SECRET_FD", std::to_string(secretMemory->fd())},
        {kResourcesVariable, layout.resources.toJson()},
        {"WEFT_ENGINE", view.engine},
    };
    for (const auto& [name, value] : variables) ::setenv(name, value.c_str(), 1);
  }
};

EngineJob::EngineJob(EngineView view, const EngineOptions& options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.view = std::move(view);
  s.options = options;
  s.rendezvous = engineRendezvous(s.view);
  s.layout = layoutEngineJob(s.view, options.serversPerHost, s.rendezvous.selfAddress);
  Secret secret{};
  JobId job{};
  if (s.view.nodes() == 1) {
    s.notePath = notePath(s.view);
    if (s.first()) {
      secret = hasSecretFile(options.secretFile) ? secretFromFile(options.secretFile) : generateSecret();
      job = generateJobId();
    } else {
      const RendezvousNote note = awaitNote(s.notePath, options.rendezvousTimeout);
      secret = note.secret;
      job = note.job;
      s.rendezvous.port = note.port;
    }
  } else {
    WEFT_CHECK(hasSecretFile(options.secretFile),
               "the {} job spans {} hosts: its members prove to each other that they hold the job's secret, which "
               "every host needs in a file (--secret-file PATH or WEFT_SECRET_FILE; `weft secret PATH` writes one)",
               s.view.engine, s.view.nodes());
    secret = secretFromFile(options.secretFile);
    const Digest d = hmacSha256(secret, bytesOf("job id " + s.view.runKey));
    std::copy_n(d.begin(), job.size(), job.begin());
  }
  if (s.first()) s.serve(secret, job);
  s.secretMemory = std::make_unique<SecretMemory>(secret);
  s.exportIdentity(job);
}

EngineJob::~EngineJob() {
  State& s = *state_;
  if (s.watcher.joinable()) {
    std::unique_lock lock(s.mutex);
    if (!processLeft) {
      // This process failed (or never joined): whoever is still there stops now, told why. A
      // member whose end made it fail (a peer lost mid-step) is the cause to name.
      s.stopWatching = true;
      lock.unlock();
      const std::string cause = s.verdict(s.coordinator->liveness());
      const std::string self =
          fmt::format("{}, which serves the job's rendezvous, ended without finishing", s.who(s.layout.self));
      const std::string reason = cause.empty() ? self : fmt::format("{}; then {}", cause, self);
      s.coordinator->stopJob(reason);
      std::cerr << fmt::format("weft: the job stopped: {}\n", reason) << std::flush;
    } else {
      s.wake.wait(lock, [&] { return !s.watching; });
      lock.unlock();
    }
    s.wake.notify_all();
    s.watcher.join();
  }
  if (s.first() && !s.notePath.empty()) ::unlink(s.notePath.c_str());
}

const EngineLayout& EngineJob::layout() const { return state_->layout; }

void noteProcessLeft() { processLeft = true; }

}  // namespace weft::dist
