// Rendezvous with real processes: forked members join a coordinator in this process over TCP on
// 127.0.0.1 and report their roster through a pipe. Checks deterministic ranks, that everyone sees
// every address, that bad connections are refused (and logged) without disturbing the real
// members, and that a missing member makes the others abort within the timeout. Every child has
// an alarm() so that no failure can hang the suite.
#include "tests/ConnectionFlood.h"
#include "tests/TestUtil.h"

#include "dist/launch/Coordinator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

using namespace weft;
using namespace weft::dist;
using namespace std::chrono_literals;

namespace {

const JobId kJob = {0xa1, 0xb2, 0xc3, 0xd4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const Secret kSecret = generateSecret();

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string textOf(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::vector<uint8_t> ncclIdPattern() {
  std::vector<uint8_t> id(kNcclIdBytes);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 3);
  return id;
}

JoinRequest request(Role role, int host, int slot) {
  JoinRequest r{{role, host, slot}, bytesOf(fmt::format("addr-{}", describe({role, host, slot}))), {}, {}};
  if (role == Role::Worker && host == 0 && slot == 0) r.ncclId = ncclIdPattern();
  return r;
}

// One line per member, so the parent can compare what every child saw.
std::string formatRoster(const Roster& roster) {
  std::string out =
      fmt::format("rank {} of {}; nccl {}\n", roster.rank, roster.worldSize,
                  roster.ncclId == ncclIdPattern() ? "ok" : fmt::format("{} bytes", roster.ncclId.size()));
  for (const Member& m : roster.members) out += fmt::format("{}: {} @ {}\n", m.rank, describe(m.id), textOf(m.address));
  return out;
}

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// A forked member. The child waits for the coordinator's port on a pipe (the coordinator's
// threads start only after every fork), runs rendezvous(), writes its roster or error to another
// pipe and exits 0 (roster) or 1 (error).
class MemberProcess {
 public:
  MemberProcess(const JoinRequest& join, std::chrono::milliseconds timeout) {
    int portPipe[2], resultPipe[2];
    REQUIRE(::pipe(portPipe) == 0);
    REQUIRE(::pipe(resultPipe) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(portPipe[1]);
      ::close(resultPipe[0]);
      runChild(portPipe[0], resultPipe[1], join, timeout);
    }
    ::close(portPipe[0]);
    ::close(resultPipe[1]);
    portWrite_.reset(portPipe[1]);
    resultRead_.reset(resultPipe[0]);
  }
  ~MemberProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  void start(uint16_t port) {
    writeAll(portWrite_.get(), std::string(reinterpret_cast<const char*>(&port), sizeof port));
  }

  /// The child's exit code (0 roster, 1 error; -1 killed) and its report.
  std::pair<int, std::string> finish() {
    std::string report;
    char buffer[4096];
    for (;;) {
      pollfd p{resultRead_.get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) break;  // the child's alarm fires before this
      const ssize_t n = ::read(resultRead_.get(), buffer, sizeof buffer);
      if (n <= 0) break;
      report.append(buffer, static_cast<size_t>(n));
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, report};
  }

 private:
  [[noreturn]] static void runChild(int portFd, int resultFd, const JoinRequest& join,
                                    std::chrono::milliseconds timeout) {
    ::alarm(10);  // the safety net: a hung child dies and the parent sees it
    uint16_t port = 0;
    if (::read(portFd, &port, sizeof port) != sizeof port) ::_exit(3);  // the parent gave up
    int code = 0;
    std::string report;
    try {
      report = formatRoster(rendezvous("127.0.0.1", port, kSecret, kJob, join, timeout));
    } catch (const Error& e) {
      report = e.what();
      code = 1;
    }
    writeAll(resultFd, report);
    ::_exit(code);
  }

  pid_t pid_ = -1;
  FileDescriptor portWrite_, resultRead_;
};

// Redirects this process's stderr (the coordinator's log) to a file while alive.
class StderrCapture {
 public:
  StderrCapture()
      : path_((std::filesystem::temp_directory_path() / ("weft-coordinator-log-" + std::to_string(::getpid())))
                  .string()) {
    std::fflush(stderr);
    saved_.reset(::dup(2));
    FileDescriptor file(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ::dup2(file.get(), 2);
  }
  ~StderrCapture() {
    restore();
    std::remove(path_.c_str());
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    return {std::istreambuf_iterator<char>(in), {}};
  }

 private:
  void restore() {
    if (!saved_.valid()) return;
    std::fflush(stderr);
    ::dup2(saved_.get(), 2);
    saved_.reset();
  }
  std::string path_;
  FileDescriptor saved_;
};

FileDescriptor connectRaw(uint16_t port) {
  FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

Deadline in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

// What the coordinator answers a raw connection that sends `bytes` after the challenge.
std::string refusalAfter(uint16_t port, const std::vector<uint8_t>& bytes) {
  const FileDescriptor fd = connectRaw(port);
  expectType(readFrame(fd.get(), in(2s), kJob), MessageType::Challenge);
  if (!bytes.empty())
    REQUIRE(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  return errorOf([&] { expectType(readFrame(fd.get(), in(2s), kJob), MessageType::AuthOk); });
}

const std::string kExpectedRoster =
    "0: worker 0 of host 0 @ addr-worker 0 of host 0\n"
    "1: worker 1 of host 0 @ addr-worker 1 of host 0\n"
    "2: server of host 0 @ addr-server of host 0\n";

}  // namespace

TEST_CASE("rendezvous: three processes get deterministic ranks and every address") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  // The server is forked first and worker 1 before worker 0: ranks must not follow arrival.
  MemberProcess server(request(Role::Server, 0, 0), 5s), worker1(request(Role::Worker, 0, 1), 5s),
      worker0(request(Role::Worker, 0, 0), 5s);
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 5s);
  CHECK(coordinator.port() != 0);
  for (MemberProcess* m : {&server, &worker1, &worker0}) m->start(coordinator.port());

  const std::vector<Member> members = coordinator.wait();
  REQUIRE(members.size() == 3);
  CHECK(members[0].id == MemberId{Role::Worker, 0, 0});
  CHECK(members[1].id == MemberId{Role::Worker, 0, 1});
  CHECK(members[2].id == MemberId{Role::Server, 0, 0});
  const std::pair<int, std::string> reports[] = {worker0.finish(), worker1.finish(), server.finish()};
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_MESSAGE(reports[rank].first == 0, reports[rank].second);
    CHECK(reports[rank].second == fmt::format("rank {} of 3; nccl ok\n", rank) + kExpectedRoster);
  }
}

TEST_CASE("rendezvous: bad connections are refused and logged; the real members still meet") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  MemberProcess worker0(request(Role::Worker, 0, 0), 5s), worker1(request(Role::Worker, 0, 1), 5s),
      server(request(Role::Server, 0, 0), 5s);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 5s, {.handshakeTimeout = 300ms});
  const uint16_t port = coordinator.port();

  const std::string http = "GET / HTTP/1.1\r\nHost: weft\r\n\r\n";
  CHECK(refusalAfter(port, bytesOf(http)) ==
        "refused by the peer: bad frame magic 0x20544547 (expected 0x54464557, \"WEFT\"): not a weft peer");
  CHECK(refusalAfter(port, encodeFrame(MessageType::Auth, {}, std::vector<uint8_t>(64))) ==
        "refused by the peer: frame AUTH belongs to job 00000000000000000000000000000000, expected job "
        "a1b2c3d405060708090a0b0c0d0e0f10");
  CHECK(refusalAfter(port, encodeFrame(MessageType::Auth, kJob, std::vector<uint8_t>(10))) ==
        "refused by the peer: message AUTH: field 'client_nonce' needs 32 bytes, 10 remain");
  CHECK(refusalAfter(port, {}) == "refused by the peer: timed out: no answer to the challenge within 300 ms");
  {
    const FileDescriptor fd = connectRaw(port);
    CHECK(errorOf([&] { clientHandshake(fd.get(), generateSecret(), kJob, in(2s)); }) ==
          "refused by the peer: bad HMAC: the client does not hold the job secret");
  }
  {
    // Admitted, then an unsealed JOIN (what an on-path forger, holding no secret, could send):
    // refused, and the refusal itself is sealed.
    const FileDescriptor fd = connectRaw(port);
    ControlSeal seal(clientHandshake(fd.get(), kSecret, kJob, in(2s)));
    writeFrame(fd.get(), MessageType::Join, kJob, std::vector<uint8_t>(48), in(2s));
    CHECK(errorOf([&] { expectType(readSealed(fd.get(), seal, in(2s), kJob), MessageType::Roster); }) ==
          "refused by the peer: frame JOIN failed its seal (frame 0 of the connection): altered, replayed, "
          "reordered, or sent by a process without the job secret");
  }
  // Authenticated but not a member of this job, then a member joining twice.
  CHECK(contains(errorOf([&] { rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, 7), 2s); }),
                 "failed: refused by the peer: worker 7 of host 0 is not a member of this job"));
  CHECK(
      contains(errorOf([&] { rendezvous("127.0.0.1", port, generateSecret(), kJob, request(Role::Worker, 0, 0), 2s); }),
               "rendezvous of worker 0 of host 0 with the coordinator at 127.0.0.1:"));

  for (MemberProcess* m : {&worker0, &worker1, &server}) m->start(port);
  CHECK(coordinator.wait().size() == 3);
  CHECK(worker0.finish() == std::pair<int, std::string>{0, "rank 0 of 3; nccl ok\n" + kExpectedRoster});
  CHECK(worker1.finish().first == 0);
  CHECK(server.finish().first == 0);

  const std::string text = log.text();
  const std::string prefix = "weft coordinator: refused connection from 127.0.0.1:";
  for (const char* reason : {"bad frame magic", "belongs to job", "field 'client_nonce'", "timed out", "bad HMAC",
                             "frame JOIN failed its seal", "worker 7 of host 0 is not a member"}) {
    CHECK_MESSAGE(contains(text, reason), reason);
  }
  size_t lines = 0;
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) ++lines;
  CHECK_MESSAGE(lines == 8, text);
}

TEST_CASE("rendezvous: a member joining twice is refused") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, {{Role::Worker, 0, 0}, {Role::Worker, 0, 1}}, 5s);
  const uint16_t port = coordinator.port();
  auto join = [&](int slot) {
    try {
      return formatRoster(rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, slot), 5s));
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  // Two processes claim worker 0: whichever comes second is refused at once, while the first
  // waits for worker 1.
  std::future<std::string> a = std::async(std::launch::async, join, 0), b = std::async(std::launch::async, join, 0);
  while (a.wait_for(5ms) != std::future_status::ready && b.wait_for(5ms) != std::future_status::ready) {
  }
  const bool aFirst = a.wait_for(0ms) == std::future_status::ready;
  std::future<std::string>& refused = aFirst ? a : b;
  std::future<std::string>& admitted = aFirst ? b : a;
  CHECK(contains(refused.get(), "failed: refused by the peer: worker 0 of host 0 has already joined"));
  CHECK(join(1) ==
        "rank 1 of 2; nccl ok\n"
        "0: worker 0 of host 0 @ addr-worker 0 of host 0\n"
        "1: worker 1 of host 0 @ addr-worker 1 of host 0\n");
  CHECK(contains(admitted.get(), "rank 0 of 2"));
  CHECK(coordinator.wait().size() == 2);
  CHECK(contains(log.text(), "worker 0 of host 0 has already joined"));
}

TEST_CASE("rendezvous: a missing member makes the others abort within the timeout") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  MemberProcess worker0(request(Role::Worker, 0, 0), 10s), worker1(request(Role::Worker, 0, 1), 10s);
  const auto start = Clock::now();
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 1500ms);
  worker0.start(coordinator.port());
  worker1.start(coordinator.port());

  const std::string expected = "rendezvous timed out after 1.5 s: 1 of 3 members missing (server of host 0)";
  CHECK(errorOf([&] { coordinator.wait(); }) == expected);
  for (MemberProcess* m : {&worker0, &worker1}) {
    const auto [code, report] = m->finish();
    CHECK(code == 1);
    CHECK_MESSAGE(contains(report, "failed: aborted by the coordinator: " + expected), report);
  }
  CHECK(Clock::now() - start < 4s);
}

TEST_CASE("rendezvous: client-side failures name the reason") {
  JobId other = kJob;
  other[15] = 0;
  const ResourceSpec spec = ResourceSpec::localCpu(1);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 5s);
  CHECK(contains(
      errorOf([&] { rendezvous("127.0.0.1", coordinator.port(), kSecret, other, request(Role::Worker, 0, 0), 2s); }),
      "frame CHALLENGE belongs to job a1b2c3d405060708090a0b0c0d0e0f10, expected job "
      "a1b2c3d405060708090a0b0c0d0e0f00"));

  // Nothing listening: refused at once. A listener that never answers: the timeout.
  FileDescriptor silent(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(silent.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t length = sizeof addr;
  ::getsockname(silent.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  const uint16_t port = ntohs(addr.sin_port);
  CHECK(contains(errorOf([&] { rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, 0), 2s); }),
                 "failed: cannot connect: Connection refused"));
  REQUIRE(::listen(silent.get(), 4) == 0);
  const auto start = Clock::now();
  CHECK(contains(errorOf([&] { rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, 0), 300ms); }),
                 "failed: timed out: 0 of 28 bytes of a frame header arrived before the deadline"));
  CHECK(Clock::now() - start < 2s);
}

TEST_CASE("coordinator: the expected members must fit the specification") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  CHECK(errorOf([&] { Coordinator(spec, kSecret, kJob, {}, 1s); }) == "coordinator: no members are expected");
  CHECK(errorOf([&] {
          Coordinator(spec, kSecret, kJob, {{Role::Worker, 0, 1}, {Role::Worker, 0, 1}}, 1s);
        }) == "coordinator: worker 1 of host 0 is expected twice");
  CHECK(errorOf([&] {
          Coordinator(spec, kSecret, kJob, {{Role::Worker, 0, 2}}, 1s);
        }) == "coordinator: expected member worker 2 of host 0 is not in the resource specification");
  CHECK(errorOf([&] {
          Coordinator(spec, kSecret, kJob, {{Role::Server, 1, 0}}, 1s);
        }) == "coordinator: expected member server of host 1 is not in the resource specification");
  const ResourceSpec foreign =
      ResourceSpec::parse(R"({"hosts": [{"address": "a", "cpu_workers": 1}], "bind": "10.255.255.1"})", "t");
  CHECK(errorOf([&] { Coordinator(foreign, kSecret, kJob, expectedMembers(foreign), 1s); }) ==
        "coordinator: cannot listen on 10.255.255.1:0: Cannot assign requested address");
  CHECK(expectedMembers(spec) ==
        std::vector<MemberId>{{Role::Worker, 0, 0}, {Role::Worker, 0, 1}, {Role::Server, 0, 0}});
}

TEST_CASE("after the rendezvous the coordinator hears each member's heartbeat, and notices one stop") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  Coordinator coordinator(spec, kSecret, kJob, {{Role::Worker, 0, 0}, {Role::Worker, 0, 1}}, 5s);
  CHECK(coordinator.liveness().empty());
  const uint16_t port = coordinator.port();
  std::atomic<uint64_t> progress{7};
  std::atomic<bool> secondWaits{true};
  auto join = [&](int slot) {
    HeartbeatOptions beats;
    beats.interval = 100ms;
    beats.sample = [&progress, &secondWaits, slot] {
      return MainThreadSample{progress + static_cast<uint64_t>(slot), slot == 1 && secondWaits, 'R'};
    };
    return rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, slot), 5s, beats);
  };
  std::future<Roster> first = std::async(std::launch::async, join, 0);
  Roster second = join(1);
  Roster zero = first.get();
  REQUIRE(coordinator.wait().size() == 2);
  std::this_thread::sleep_for(700ms);
  auto liveness = coordinator.liveness();
  REQUIRE(liveness.size() == 2);
  const MemberLiveness w0 = liveness.at({Role::Worker, 0, 0}), w1 = liveness.at({Role::Worker, 0, 1});
  CHECK(w0.silence < 400ms);
  CHECK(w1.silence < 400ms);
  // What the beats said: each member's progress counter, whether it waits, its main thread.
  CHECK(w0.progress == 7);
  CHECK(w1.progress == 8);
  CHECK_FALSE(w0.waiting);
  CHECK(w1.waiting);
  CHECK(w0.mainThread == 'R');
  CHECK(w0.connected);
  CHECK_FALSE(w0.waitedWhileStalled);
  CHECK(w1.waitedWhileStalled);
  // Polled rather than slept on: a loaded machine may delay a beat.
  auto secondOnceBeaten = [&](const std::function<bool(const MemberLiveness&)>& seen) {
    for (auto end = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < end;
         std::this_thread::sleep_for(20ms))
      if (seen(coordinator.liveness().at({Role::Worker, 0, 1}))) return true;
    return false;
  };
  secondWaits = false;  // worker 1 gave up its wait: its counter did not move
  REQUIRE(secondOnceBeaten([](const MemberLiveness& l) { return !l.waiting; }));
  CHECK(coordinator.liveness().at({Role::Worker, 0, 1}).waitedWhileStalled);
  progress = 9;  // a new stall, with no wait in it yet
  CHECK(secondOnceBeaten([](const MemberLiveness& l) { return l.progress == 10 && !l.waitedWhileStalled; }));
  second.heartbeat.reset();  // worker 1 stops beating and closes its connection
  std::this_thread::sleep_for(900ms);
  liveness = coordinator.liveness();
  CHECK(liveness.at({Role::Worker, 0, 0}).silence < 400ms);
  CHECK(liveness.at({Role::Worker, 0, 1}).silence > 700ms);
  CHECK_FALSE(liveness.at({Role::Worker, 0, 1}).connected);
  CHECK(liveness.at({Role::Worker, 0, 1}).stalled > 700ms);
}

TEST_CASE("a member notices its coordinator go away") {
  const ResourceSpec spec = ResourceSpec::localCpu(1, 0);
  auto coordinator = std::make_unique<Coordinator>(spec, kSecret, kJob, expectedMembers(spec), 5s);
  std::promise<std::string> lost;
  HeartbeatOptions beats;
  beats.interval = 100ms;
  beats.onLost = [&lost](const std::string& reason) { lost.set_value(reason); };
  const Roster roster =
      rendezvous("127.0.0.1", coordinator->port(), kSecret, kJob, request(Role::Worker, 0, 0), 5s, beats);
  CHECK_FALSE(roster.heartbeat->lost());
  coordinator.reset();  // the launcher ends (or is killed): its connections close
  std::future<std::string> reason = lost.get_future();
  REQUIRE(reason.wait_for(30s) == std::future_status::ready);
  CHECK(reason.get() == "the coordinator closed the connection");
  CHECK(roster.heartbeat->lost());
}

TEST_CASE("a member that leaves is marked as left, and its coordinator closing afterwards is no loss") {
  const ResourceSpec spec = ResourceSpec::localCpu(1, 0);
  auto coordinator = std::make_unique<Coordinator>(spec, kSecret, kJob, expectedMembers(spec), 5s);
  std::atomic<bool> lost{false};
  HeartbeatOptions beats;
  beats.interval = 100ms;
  beats.onLost = [&lost](const std::string&) { lost = true; };
  const Roster roster =
      rendezvous("127.0.0.1", coordinator->port(), kSecret, kJob, request(Role::Worker, 0, 0), 5s, beats);
  coordinator->wait();
  CHECK_FALSE(coordinator->liveness().at({Role::Worker, 0, 0}).left);
  roster.heartbeat->leave();
  for (int i = 0; i < 3000 && !coordinator->liveness().at({Role::Worker, 0, 0}).left; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(coordinator->liveness().at({Role::Worker, 0, 0}).left);
  coordinator.reset();  // the job's first process ends once every member left
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(lost);
}

TEST_CASE("a member of an engine's job waits for a coordinator that starts after it") {
  uint16_t port = 0;
  {
    const ResourceSpec any = ResourceSpec::localCpu(1, 0);
    const Coordinator probe(any, kSecret, kJob, expectedMembers(any), 1s);  // a free port, then released
    port = probe.port();
  }
  const ResourceSpec spec = ResourceSpec::parse(
      fmt::format(
          R"({{"hosts": [{{"address": "127.0.0.1", "cpu_workers": 1, "servers": 0}}], "coordinator_port": {}}})", port),
      "spec");
  CHECK(contains(errorOf([&] { rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, 0), 2s); }),
                 "cannot connect"));
  std::future<Roster> member = std::async(std::launch::async, [&] {
    return rendezvous("127.0.0.1", port, kSecret, kJob, request(Role::Worker, 0, 0), 60s, {}, true);
  });
  std::this_thread::sleep_for(300ms);
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 60s);
  CHECK(member.get().worldSize == 1);
}

namespace {

/// Two workers of a job on this machine joined by `coordinator`, each beating every 100 ms with
/// the handlers `handlers(slot, beats)` sets; their rosters once both joined.
std::vector<Roster> joinTwo(Coordinator& coordinator, const std::function<void(int, HeartbeatOptions&)>& handlers) {
  std::vector<Roster> rosters(2);
  std::vector<std::thread> members;
  for (int slot = 0; slot < 2; ++slot)
    members.emplace_back([&, slot] {
      HeartbeatOptions beats;
      beats.interval = 100ms;
      handlers(slot, beats);
      rosters[static_cast<size_t>(slot)] =
          rendezvous("127.0.0.1", coordinator.port(), kSecret, kJob, request(Role::Worker, 0, slot), 10s, beats);
    });
  for (std::thread& t : members) t.join();
  coordinator.wait();
  return rosters;
}

}  // namespace

TEST_CASE("a coordinator that stops the job tells each member why") {
  const ResourceSpec spec = ResourceSpec::localCpu(2, 0);
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 10s);
  std::promise<std::string> lost[2];
  const std::vector<Roster> rosters = joinTwo(coordinator, [&lost](int slot, HeartbeatOptions& beats) {
    beats.onLost = [&lost, slot](const std::string& reason) { lost[slot].set_value(reason); };
  });
  coordinator.stopJob("worker 1 of host 0 ended without finishing");
  for (std::promise<std::string>& p : lost) {
    std::future<std::string> reason = p.get_future();
    REQUIRE(reason.wait_for(30s) == std::future_status::ready);
    CHECK(reason.get() == "the job stopped: worker 1 of host 0 ended without finishing");
  }
}

TEST_CASE("a coordinator's request for a checkpoint reaches each member's handler, and the beats go on") {
  const ResourceSpec spec = ResourceSpec::localCpu(2, 0);
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 10s);
  std::promise<std::string> asked[2];
  std::atomic<bool> lost{false};
  const std::vector<Roster> rosters = joinTwo(coordinator, [&](int slot, HeartbeatOptions& beats) {
    beats.onLost = [&lost](const std::string&) { lost = true; };
    beats.onCheckpoint = [&asked, slot](const std::string& reason) { asked[slot].set_value(reason); };
  });
  coordinator.requestCheckpoint("host 2 (10.0.0.3) answers: the job can grow to 3 workers on 3 hosts");
  for (std::promise<std::string>& p : asked) {
    std::future<std::string> reason = p.get_future();
    REQUIRE(reason.wait_for(30s) == std::future_status::ready);
    CHECK(reason.get() == "host 2 (10.0.0.3) answers: the job can grow to 3 workers on 3 hosts");
  }
  // Still beating: a member that stopped at the request would be silent for good by now.
  const auto heard = [&] {
    const auto liveness = coordinator.liveness();
    return std::all_of(liveness.begin(), liveness.end(), [](const auto& m) { return m.second.silence < 1000ms; });
  };
  std::this_thread::sleep_for(1500ms);
  bool beating = false;
  for (int i = 0; i < 3000 && !beating; ++i) {
    beating = heard();
    std::this_thread::sleep_for(10ms);
  }
  CHECK(beating);
  CHECK_FALSE(lost);
  for (const Roster& r : rosters) CHECK_FALSE(r.heartbeat->lost());
}

namespace {

// A connection that connects and then says nothing; true once the coordinator admitted it into
// a handshake (its challenge arrived).
bool silentConnection(uint16_t port, std::vector<FileDescriptor>& held) {
  FileDescriptor fd = connectRaw(port);
  try {
    expectType(readFrame(fd.get(), in(2s), kJob), MessageType::Challenge);
  } catch (const Error&) {
    return false;
  }
  held.push_back(std::move(fd));
  return true;
}

}  // namespace

TEST_CASE("a flood of silent connections does not keep the members out") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  MemberProcess worker0(request(Role::Worker, 0, 0), 8s), worker1(request(Role::Worker, 0, 1), 8s),
      server(request(Role::Server, 0, 0), 8s);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 8s);
  const uint16_t port = coordinator.port();
  // Connections that say nothing, from the members' own address, hold the coordinator's waiting
  // room before the members come; a thread keeps opening more while they join.
  std::vector<FileDescriptor> held;
  for (int i = 0; i < 64; ++i) REQUIRE(silentConnection(port, held));
  std::atomic<bool> flooding{true};
  std::thread flood([&] {
    std::vector<FileDescriptor> more;
    while (flooding) {
      FileDescriptor fd = connectRaw(port);
      more.push_back(std::move(fd));
      std::this_thread::sleep_for(2ms);
    }
  });
  for (MemberProcess* m : {&worker0, &worker1, &server}) m->start(port);
  std::string outcome;
  try {
    outcome = fmt::format("{} members", coordinator.wait().size());
  } catch (const Error& e) {
    outcome = e.what();
  }
  flooding = false;
  flood.join();
  CHECK(outcome == "3 members");
  for (MemberProcess* m : {&worker0, &worker1, &server}) {
    const auto [code, report] = m->finish();
    CHECK_MESSAGE(code == 0, report);
  }
}

TEST_CASE("a source holding its share of the waiting room has its oldest silent connection dropped and told to retry") {
  const ResourceSpec spec = ResourceSpec::localCpu(1, 0);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 60s, {.answerTimeout = 60s, .waitingRoom = 64});
  REQUIRE(coordinator.waitingShare() == 32);
  std::vector<FileDescriptor> held;
  for (size_t i = 0; i < coordinator.waitingShare(); ++i) REQUIRE(silentConnection(coordinator.port(), held));
  const std::string before = errorOf([&] { readFrame(held.front().get(), in(200ms), kJob); });
  CHECK(contains(before, "timed out"));  // a full share drops nothing yet
  REQUIRE(silentConnection(coordinator.port(), held));
  // The peer hears "busy", which a member takes as a reason to try again.
  const std::string dropped =
      errorOf([&] { expectType(readFrame(held.front().get(), in(5s), kJob), MessageType::Auth); });
  CHECK(contains(dropped, "refused by the peer: busy: dropped for a newer connection: " +
                              std::to_string(coordinator.waitingShare()) + " connections owed their answer"));
  const std::string second = errorOf([&] { readFrame(held[1].get(), in(200ms), kJob); });
  CHECK(contains(second, "timed out"));  // only the oldest made way
  CHECK(contains(log.text(), "busy: dropped for a newer connection"));
}

TEST_CASE("under a flood of connections from the members' own address, ten rendezvous of ten complete") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  StderrCapture log;
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    MemberProcess worker0(request(Role::Worker, 0, 0), 8s), worker1(request(Role::Worker, 0, 1), 8s),
        server(request(Role::Server, 0, 0), 8s);
    Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 8s);
    std::string outcome;
    {
      ConnectionFlood flood(coordinator.port(), 2);
      while (flood.opened() < 64) std::this_thread::yield();  // the flood is on before the members come
      for (MemberProcess* m : {&worker0, &worker1, &server}) m->start(coordinator.port());
      try {
        outcome = fmt::format("{} members", coordinator.wait().size());
      } catch (const Error& e) {
        outcome = e.what();
      }
    }
    CHECK(outcome == "3 members");
    for (MemberProcess* m : {&worker0, &worker1, &server}) {
      const auto [code, report] = m->finish();
      CHECK_MESSAGE(code == 0, report);
    }
  }
}

TEST_CASE("refused connections are logged at most ten lines a second; the rest are counted") {
  const ResourceSpec spec = ResourceSpec::localCpu(1, 0);
  StderrCapture log;
  const int refused = 300;
  const auto start = Clock::now();
  {
    Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 60s);
    const std::vector<uint8_t> http = bytesOf("GET / HTTP/1.1\r\nHost: weft\r\n\r\n");  // past a frame header
    for (int i = 0; i < refused; ++i) {
      const std::string refusal = refusalAfter(coordinator.port(), http);
      REQUIRE_MESSAGE(contains(refusal, "bad frame magic"), i, ": ", refusal);
    }
  }  // the coordinator's last word counts what it left out
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string text = log.text();
  uint64_t written = 0, counted = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (contains(line, "refused connection from 127.0.0.1:")) ++written;
    const std::regex count(R"((\d+) more refused connections)");
    for (std::sregex_iterator m(line.begin(), line.end(), count), end; m != end; ++m) counted += std::stoull((*m)[1]);
  }
  CHECK_MESSAGE(written + counted == refused, text);
  CHECK_MESSAGE(written <= 10 * (static_cast<uint64_t>(seconds) + 1), text);
  CHECK(counted > 0);
}

namespace {

/// A TCP relay on the path between one member and the coordinator that flips one bit of the
/// byte at `offset` of what the coordinator sends: an attacker on the path, without the secret.
class TamperingRelay {
 public:
  TamperingRelay(uint16_t coordinatorPort, size_t offset) : offset_(offset) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_.get(), 1) == 0);
    socklen_t length = sizeof addr;
    REQUIRE(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, coordinatorPort] { relay(coordinatorPort); });
  }
  ~TamperingRelay() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  void relay(uint16_t coordinatorPort) {
    const FileDescriptor member(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!member.valid()) return;
    const FileDescriptor coordinator = connectRaw(coordinatorPort);
    size_t fromCoordinator = 0;
    std::vector<uint8_t> buffer(4096);
    for (;;) {
      pollfd fds[2] = {{member.get(), POLLIN, 0}, {coordinator.get(), POLLIN, 0}};
      if (::poll(fds, 2, 5000) <= 0) return;
      for (int side = 0; side < 2; ++side) {
        if (!fds[side].revents) continue;
        const ssize_t n = ::recv(fds[side].fd, buffer.data(), buffer.size(), 0);
        if (n <= 0) return;
        if (side == 1) {
          if (offset_ >= fromCoordinator && offset_ < fromCoordinator + static_cast<size_t>(n))
            buffer[offset_ - fromCoordinator] ^= 1;
          fromCoordinator += static_cast<size_t>(n);
        }
        const int to = side == 0 ? coordinator.get() : member.get();
        if (::send(to, buffer.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) return;
      }
    }
  }

  FileDescriptor listener_;
  uint16_t port_ = 0;
  size_t offset_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("a roster altered on its way to a member fails its seal, and the member says so") {
  const ResourceSpec spec = ResourceSpec::localCpu(1, 0);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 5s);
  // The coordinator sends CHALLENGE and AUTH_OK (32-byte payloads each), then the ROSTER: the
  // relay flips a bit of the roster's payload.
  const size_t rosterPayload = 2 * (kFrameHeaderBytes + 32) + kFrameHeaderBytes;
  TamperingRelay relay(coordinator.port(), rosterPayload + 2);
  const std::string error =
      errorOf([&] { rendezvous("127.0.0.1", relay.port(), kSecret, kJob, request(Role::Worker, 0, 0), 5s); });
  CHECK(contains(error,
                 "frame ROSTER failed its seal (frame 0 of the connection): altered, replayed, reordered, or "
                 "sent by a process without the job secret"));
}

TEST_CASE("a member whose connection closed after its JOIN joins again on a new one") {
  const ResourceSpec spec = ResourceSpec::localCpu(2);
  StderrCapture log;
  Coordinator coordinator(spec, kSecret, kJob, expectedMembers(spec), 8s);
  {
    // Worker 0's first connection: admitted, joined, then cut off before the roster.
    const FileDescriptor first = connectRaw(coordinator.port());
    ControlSeal seal(clientHandshake(first.get(), kSecret, kJob, in(5s)));
    const JoinRequest join = request(Role::Worker, 0, 0);
    WireWriter w;
    w.putU8(static_cast<uint8_t>(join.id.role));
    w.putU32(0);
    w.putU32(0);
    w.putBytes(join.address);
    w.putBytes(join.ncclId);
    w.putBytes(join.clientAddress);
    writeSealed(first.get(), seal, MessageType::Join, kJob, w.bytes(), in(5s));
    std::this_thread::sleep_for(500ms);  // its JOIN is taken in (the outcome holds if it is not)
  }
  MemberProcess worker0(request(Role::Worker, 0, 0), 8s), worker1(request(Role::Worker, 0, 1), 8s),
      server(request(Role::Server, 0, 0), 8s);
  for (MemberProcess* m : {&worker0, &worker1, &server}) m->start(coordinator.port());
  CHECK(coordinator.wait().size() == 3);
  const auto [code, report] = worker0.finish();
  CHECK_MESSAGE(code == 0, report);
  CHECK(report == "rank 0 of 3; nccl ok\n" + kExpectedRoster);
  CHECK(worker1.finish().first == 0);
  CHECK(server.finish().first == 0);
  const std::string text = log.text();
  CHECK_MESSAGE(!contains(text, "has already joined"), text);
}
