// UcxTransport between real processes: every test forks two children (before either creates a
// UCX context), which build a transport over TCP on loopback, swap worker addresses through
// pipes, connect, run the test's body and write a report to the parent. Checks a 1 MiB ping-pong
// with distinct tags and the byte counters, matching by tag rather than arrival order, a receive
// whose deadline passes, and that a peer killed with SIGKILL fails the survivor's pending receive
// well before its deadline. With two transports per side: a worker's request to a server does not
// wait behind the AllReduce its communication thread is blocked in. Every child has an alarm() so
// that no failure can hang the suite. The gate: messages sealed under another secret, claiming a
// peer's name or a stranger's, are dropped while the genuine one arrives, and a payload declared
// over the job's limit is dropped unfetched.
#include "tests/TestUtil.h"

#include "core/Graph.h"
#include "dist/collective/Communicator.h"
#include "dist/server/ServerClient.h"
#include "dist/transport/UcxTransport.h"
#include "dist/transport/Wire.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

using namespace weft;
using namespace weft::dist;
using namespace std::chrono_literals;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

Secret secretOf(uint8_t seed) {
  Secret s{};
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(seed + 7 * i);
  return s;
}

const JobId kJob = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};

/// Transport k of side `rank`, as the job names it.
EndpointName nameOf(int rank, size_t k) { return endpointName(0, 0, rank, static_cast<uint8_t>(k)); }

UcxIdentity identityOf(EndpointName name, uint8_t secretSeed = 1, bool encrypt = false) {
  return {secretOf(secretSeed), kJob, name, "lo", encrypt};
}

/// The other side's transport addresses, in the child (what an outsider who found them would use).
std::vector<std::vector<uint8_t>>& otherSideAddresses() {
  static std::vector<std::vector<uint8_t>> addresses;
  return addresses;
}

/// One side's work once connected: its transport, its rank (0 or 1), the other side's peer index.
using Body = std::function<std::string(UcxTransport&, int rank, int peer)>;
/// The same with several transports per side, the k-th connected to the other side's k-th.
using Transports = std::vector<std::unique_ptr<UcxTransport>>;
using MultiBody = std::function<std::string(Transports&, int rank, const std::vector<int>& peers)>;

struct Pipe {
  FileDescriptor read, write;
};

Pipe makePipe() {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  return {FileDescriptor(fds[0]), FileDescriptor(fds[1])};
}

void writeAll(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, p + done, size - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

bool readAll(int fd, void* data, size_t size) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::read(fd, p + done, size - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void sendBlob(int fd, const std::vector<uint8_t>& blob) {
  const uint32_t size = static_cast<uint32_t>(blob.size());
  writeAll(fd, &size, sizeof size);
  writeAll(fd, blob.data(), blob.size());
}

std::vector<uint8_t> receiveBlob(int fd) {
  uint32_t size = 0;
  WEFT_CHECK(readAll(fd, &size, sizeof size) && size <= 4096, "no peer address on the pipe");
  std::vector<uint8_t> blob(size);
  WEFT_CHECK(readAll(fd, blob.data(), size), "truncated peer address on the pipe");
  return blob;
}

std::string readToEnd(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

std::vector<uint8_t> pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + seed + (i >> 12));
  return bytes;
}

/// Builds the transports, swaps addresses with the other child, runs the body; returns the report.
std::string runSide(int rank, int toPeer, int fromPeer, size_t count, const MultiBody& body, bool encrypt) {
  ::setenv("UCX_TLS", "tcp", 1);  // shm transports refuse peer error handling in UCX 1.13
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  std::string report;
  try {
    Transports transports;
    for (size_t k = 0; k < count; ++k) {
      transports.push_back(std::make_unique<UcxTransport>(identityOf(nameOf(rank, k), 1, encrypt)));
      sendBlob(toPeer, transports.back()->address());
    }
    std::vector<int> peers;
    for (size_t k = 0; k < count; ++k) {
      otherSideAddresses().push_back(receiveBlob(fromPeer));
      peers.push_back(transports[k]->connect(otherSideAddresses().back(), nameOf(1 - rank, k)));
    }
    report = body(transports, rank, peers);
  } catch (const std::exception& e) {
    report = std::string("unexpected error: ") + e.what();
  }
#if defined(__SANITIZE_ADDRESS__)
  // Children leave with _exit, which skips LeakSanitizer's exit-time check: run it here.
  if (__lsan_do_recoverable_leak_check() != 0) report += " [LeakSanitizer reported leaks]";
#endif
  return report;
}

struct SideResult {
  std::string report;
  int status = 0;  ///< as waitpid gives it
};

/// Forks both sides, collects their reports (read until the child closes its end) and statuses.
/// With `encrypt`, both sides' transports encrypt their payloads.
std::array<SideResult, 2> runPair(size_t transports, const MultiBody& body, bool encrypt = false) {
  std::array<Pipe, 2> toRank = {makePipe(), makePipe()};
  std::array<Pipe, 2> reports = {makePipe(), makePipe()};
  std::array<pid_t, 2> pids{};
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = ::fork();
    REQUIRE(pids[rank] >= 0);
    if (pids[rank] == 0) {
      ::alarm(20);  // the safety net: a hung child dies and the parent sees it
      reports[1 - rank].read.reset();
      reports[1 - rank].write.reset();
      const std::string report =
          runSide(rank, toRank[1 - rank].write.get(), toRank[rank].read.get(), transports, body, encrypt);
      writeAll(reports[rank].write.get(), report.data(), report.size());
      ::_exit(0);
    }
  }
  for (Pipe& p : toRank) p = {};
  std::array<SideResult, 2> results;
  for (int rank = 0; rank < 2; ++rank) {
    reports[rank].write.reset();
    results[rank].report = readToEnd(reports[rank].read.get());
    ::waitpid(pids[rank], &results[rank].status, 0);
  }
  return results;
}

std::array<SideResult, 2> runPair(const Body& body, bool encrypt = false) {
  return runPair(
      1, [&](Transports& t, int rank, const std::vector<int>& peers) { return body(*t[0], rank, peers[0]); }, encrypt);
}

bool exitedCleanly(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

template <class T>
std::vector<uint8_t> bytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string expectBytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* what) {
  return got == want ? "" : fmt::format("{}: content differs; ", what);
}

}  // namespace

TEST_CASE("UcxTransport: a 1 MiB ping-pong with distinct tags arrives intact and is counted") {
  constexpr int kRounds = 3;
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::string problems;
    std::vector<uint8_t> buffer(kMiB);
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t ping = 0x1000 + 2 * round, pong = ping + 1;
      const std::vector<uint8_t> pingBytes = pattern(kMiB, static_cast<uint8_t>(round));
      const std::vector<uint8_t> pongBytes = pattern(kMiB, static_cast<uint8_t>(100 + round));
      if (rank == 0) {
        t.send(peer, ping, pingBytes, Clock::now() + 5s);
        t.receive(pong, buffer, Clock::now() + 5s);
        problems += expectBytes(buffer, pongBytes, "pong");
      } else {
        t.receive(ping, buffer, Clock::now() + 5s);
        problems += expectBytes(buffer, pingBytes, "ping");
        t.send(peer, pong, pongBytes, Clock::now() + 5s);
      }
    }
    const uint64_t expected = kRounds * kMiB;
    if (t.bytesSent() != expected || t.bytesReceived() != expected)
      problems += fmt::format("counters: sent {}, received {}, expected {} each", t.bytesSent(), t.bytesReceived(),
                              expected);
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: a large message that lands while the receiver waits idle is fetched") {
  // Rank 1 sends after pauses of up to 2 ms, so rank 0 is often between spins and its idle
  // wait when a payload announces itself: wherever it is announced, it must be fetched.
  constexpr int kMessages = 300;
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    const std::vector<uint8_t> bytes = pattern(256 << 10, 6);
    std::vector<uint8_t> buffer(bytes.size());
    std::string problems;
    for (int i = 0; i < kMessages && problems.empty(); ++i) {
      if (rank == 1) {
        std::this_thread::sleep_for(std::chrono::microseconds(i * 7919 % 2000));
        t.send(peer, 0x600 + static_cast<uint64_t>(i), bytes, Clock::now() + 5s);
      } else {
        try {
          t.receive(0x600 + static_cast<uint64_t>(i), buffer, Clock::now() + 5s);
        } catch (const Error& e) {
          problems = fmt::format("message {}: {}", i, e.what());
        }
      }
    }
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: small messages are matched by tag, not by arrival order") {
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    const std::vector<uint8_t> first = pattern(64, 1), second = pattern(64, 2);
    std::vector<uint8_t> buffer(64);
    if (rank == 1) {  // eager sends complete before they are matched
      t.send(peer, 0x21, first, Clock::now() + 5s);
      t.send(peer, 0x22, second, Clock::now() + 5s);
      t.receive(0x23, buffer, Clock::now() + 5s);  // keeps rank 1 alive until rank 0 is done
      return std::string("ok");
    }
    std::string problems;
    t.receive(0x22, buffer, Clock::now() + 5s);
    problems += expectBytes(buffer, second, "tag 0x22");
    t.receive(0x21, buffer, Clock::now() + 5s);
    problems += expectBytes(buffer, first, "tag 0x21");
    t.send(peer, 0x23, buffer, Clock::now() + 5s);
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: a receive whose deadline passes fails naming the tag") {
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> buffer(16);
    if (rank == 1) {  // waits for rank 0 to finish, so no peer failure can stand in for the deadline
      t.receive(0x78, buffer, Clock::now() + 5s);
      return std::string("ok");
    }
    const auto start = Clock::now();
    std::string message = errorOf([&] { t.receive(0x77, buffer, Clock::now() + 200ms); });
    const auto elapsed = Clock::now() - start;
    if (elapsed < 200ms || elapsed > 3s) message += fmt::format(" [took {} ms]", (elapsed / 1ms));
    message += " | " + errorOf([&] { t.send(peer + 5, 0x79, buffer, Clock::now() + 1s); });
    t.send(peer, 0x78, buffer, Clock::now() + 5s);  // the transport still works after a timed-out receive
    return message;
  });
  CHECK(contains(results[0].report, "UCX receive of tag 0x77 (16 bytes) failed: the deadline passed"));
  CHECK_FALSE(contains(results[0].report, "[took"));
  CHECK(contains(results[0].report, "UCX: no peer 5 (1 connected)"));
  CHECK(results[1].report == "ok");
  for (const SideResult& r : results) CHECK(exitedCleanly(r.status));
}

TEST_CASE("UcxTransport: a peer killed with SIGKILL fails the pending receive instead of hanging") {
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> buffer(64);
    if (rank == 1) {  // answer one ping so both directions are connected, then die on request
      t.receive(0x31, buffer, Clock::now() + 5s);
      t.send(peer, 0x32, buffer, Clock::now() + 5s);
      t.receive(0x33, buffer, Clock::now() + 5s);
      ::raise(SIGKILL);
    }
    t.send(peer, 0x31, pattern(64, 3), Clock::now() + 5s);
    t.receive(0x32, buffer, Clock::now() + 5s);
    t.send(peer, 0x33, buffer, Clock::now() + 5s);
    const auto start = Clock::now();
    std::string message = errorOf([&] { t.receive(0x34, buffer, Clock::now() + 5s); });
    return message + fmt::format(" [after {} ms]", (Clock::now() - start) / 1ms);
  });
  INFO(results[0].report);
  CHECK(contains(results[0].report, "UCX receive of tag 0x34 failed: peer 0 failed: "));
  CHECK(exitedCleanly(results[0].status));
  CHECK((WIFSIGNALED(results[1].status) && WTERMSIG(results[1].status) == SIGKILL));
}

TEST_CASE("UcxTransport: closeAll ends by its deadline while the peer progresses nothing") {
  // A peer that never progresses its end (it waits on another transport's close, or is stuck)
  // never acknowledges the close: the close is left to UCX at the deadline, not waited for.
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> buffer(64);
    if (rank == 1) {  // connected both ways, then deaf for longer than rank 0 may take
      t.receive(0x41, buffer, Clock::now() + 5s);
      t.send(peer, 0x42, buffer, Clock::now() + 5s);
      std::this_thread::sleep_for(6s);
      return std::string("ok");
    }
    t.send(peer, 0x41, pattern(64, 5), Clock::now() + 5s);
    t.receive(0x42, buffer, Clock::now() + 5s);
    const auto start = Clock::now();
    t.closeAll(Clock::now() + 300ms);
    const auto took = Clock::now() - start;
    return took < 5s ? std::string("ok") : fmt::format("closeAll took {} ms", took / 1ms);
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

/// Progresses `t` until it has rejected `count` messages or 5 s passed; returns how many it has.
uint64_t awaitRejections(UcxTransport& t, uint64_t count) {
  const Deadline deadline = Clock::now() + 5s;
  while (t.rejected() < count && Clock::now() < deadline) {
    t.progress();
    t.waitForActivity(deadline, 1ms);
  }
  return t.rejected();
}

TEST_CASE("UcxTransport: messages sealed under another secret are dropped and the genuine one arrives") {
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> buffer(64);
    if (rank == 1) {
      // One impostor claims this side's name, one is a stranger; neither holds the job secret.
      UcxTransport impostor(identityOf(nameOf(1, 0), 2)), stranger(identityOf(nameOf(5, 0), 3));
      for (UcxTransport* forger : {&impostor, &stranger}) {
        const int victim = forger->connect(otherSideAddresses()[0], nameOf(0, 0));
        forger->send(victim, 0x41, pattern(64, 9), Clock::now() + 5s);
        forger->sendMessage(victim, std::vector<uint8_t>{1, 2, 3}, pattern(16, 9), Clock::now() + 5s);
      }
      std::this_thread::sleep_for(100ms);  // the forgeries are ahead of the genuine message
      t.send(peer, 0x41, pattern(64, 1), Clock::now() + 5s);
      t.receive(0x42, buffer, Clock::now() + 5s);  // the impostors stay alive until rank 0 is done
      return std::string("ok");
    }
    t.receive(0x41, buffer, Clock::now() + 5s);
    std::string problems = expectBytes(buffer, pattern(64, 1), "the genuine message");
    const uint64_t rejected = awaitRejections(t, 4);
    if (rejected != 4) problems += fmt::format("{} messages rejected, expected 4; ", rejected);
    if (!t.takeMessages(Clock::now() + 1s).empty()) problems += "a forged request got through; ";
    t.send(peer, 0x42, buffer, Clock::now() + 5s);
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: an encrypting job's messages arrive intact, and a payload sent in the clear is refused") {
  const auto results = runPair(
      [](UcxTransport& t, int rank, int peer) {
        std::vector<uint8_t> buffer(kMiB);
        if (rank == 1) {
          // A process with the job's secret that does not encrypt: its payloads are refused.
          UcxTransport clear(identityOf(nameOf(1, 1)));
          const int victim = clear.connect(otherSideAddresses()[0], nameOf(0, 0));
          clear.send(victim, 0x41, pattern(64, 9), Clock::now() + 5s);
          clear.sendMessage(victim, std::vector<uint8_t>{1, 2, 3}, pattern(16, 9), Clock::now() + 5s);
          std::this_thread::sleep_for(100ms);  // the clear messages are ahead of the genuine ones
          t.send(peer, 0x41, pattern(kMiB, 1), Clock::now() + 5s);
          t.sendMessage(peer, std::vector<uint8_t>{4, 5, 6}, pattern(4096, 2), Clock::now() + 5s);
          t.receive(0x42, buffer, Clock::now() + 5s);
          return std::string("ok");
        }
        t.receive(0x41, buffer, Clock::now() + 5s);
        std::string problems = expectBytes(buffer, pattern(kMiB, 1), "the encrypted tagged message");
        std::vector<Message> requests;
        for (auto until = Clock::now() + 5s; requests.empty() && Clock::now() < until;)
          requests = t.takeMessages(Clock::now() + 1s);
        if (requests.size() != 1 || requests[0].header != std::vector<uint8_t>{4, 5, 6} ||
            requests[0].payload != pattern(4096, 2))
          problems += fmt::format("{} request(s), not the one encrypted request; ", requests.size());
        const uint64_t rejected = awaitRejections(t, 2);
        if (rejected != 2) problems += fmt::format("{} messages rejected, expected the 2 in the clear; ", rejected);
        t.send(peer, 0x42, buffer, Clock::now() + 5s);
        return problems.empty() ? "ok" : problems;
      },
      true);
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: a flood from a stranger outside the roster is dropped and the members' exchange goes on") {
  constexpr int kRounds = 20, kBatch = 200;
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> buffer(16);
    if (rank == 1) {
      UcxTransport stranger(identityOf(nameOf(5, 0), 3));
      const int victim = stranger.connect(otherSideAddresses()[0], nameOf(0, 0));
      const std::vector<uint8_t> tiny(3, 0xee);
      auto floodBatch = [&] {
        for (int k = 0; k < kBatch; ++k) stranger.startSend(victim, 0x99, tiny);
        stranger.finishSends(Clock::now() + 30s);
      };
      for (int round = 0; round < kRounds; ++round) {
        floodBatch();
        t.send(peer, 0x60 + static_cast<uint64_t>(round), pattern(16, static_cast<uint8_t>(round)), Clock::now() + 30s);
      }
      // Flooding on until rank 0 has seen a wait end in the flood (and, having said so, may be
      // gone: the stranger's sends may fail by then).
      for (const Deadline end = Clock::now() + 15s; Clock::now() < end;) {
        try {
          floodBatch();
        } catch (const Error&) {
        }
        try {
          t.receive(0x7d, buffer, Clock::now() + 1ms);
          return std::string("ok");
        } catch (const Error&) {
        }
      }
      return std::string("rank 0 never said stop");
    }
    std::vector<EndpointName> roster{nameOf(0, 0), nameOf(1, 0)};
    t.acceptOnly(roster);
    std::string problems;
    for (int round = 0; round < kRounds; ++round) {
      t.receive(0x60 + static_cast<uint64_t>(round), buffer, Clock::now() + 30s);
      problems += expectBytes(buffer, pattern(16, static_cast<uint8_t>(round)), "a round's message");
    }
    const uint64_t rejected = awaitRejections(t, kRounds * kBatch);
    if (rejected < kRounds * kBatch)
      problems += fmt::format("{} messages rejected, expected {} or more; ", rejected, kRounds * kBatch);
    // A wait that runs out while the flood goes on says so (tried until a flood batch lands in one).
    std::string timeout;
    for (int attempt = 0; attempt < 20 && !contains(timeout, "is something flooding"); ++attempt)
      timeout = errorOf([&] { t.receive(0x7c, buffer, Clock::now() + 500ms); });
    if (!contains(timeout,
                  "messages from outside the job were dropped meanwhile: is something flooding this endpoint?"))
      problems += "no wait ended naming the flood: " + timeout + "; ";
    t.send(peer, 0x7d, buffer, Clock::now() + 30s);
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("UcxTransport: a request declared over the job's limit is dropped without being fetched") {
  const auto results = runPair([](UcxTransport& t, int rank, int peer) {
    std::vector<uint8_t> small(16);
    if (rank == 1) {
      t.send(peer, 0x51, pattern(16, 4), Clock::now() + 5s);
      // A member of the job (it holds the secret) whose request announces more than the plan allows.
      UcxTransport oversized(identityOf(nameOf(6, 0)));
      const int victim = oversized.connect(otherSideAddresses()[0], nameOf(0, 0));
      try {
        oversized.sendMessage(victim, std::vector<uint8_t>{1}, pattern(8 * kMiB, 5), Clock::now() + 2s);
      } catch (const Error&) {
        // a dropped rendezvous payload is never fetched: the send may time out
      }
      t.receive(0x53, small, Clock::now() + 10s);
      return std::string("ok");
    }
    t.limitPayloads(4096);
    t.receive(0x51, small, Clock::now() + 5s);
    std::string problems = expectBytes(small, pattern(16, 4), "the message within the limit");
    const uint64_t rejected = awaitRejections(t, 1);
    if (rejected != 1) problems += fmt::format("{} messages rejected, expected 1; ", rejected);
    t.send(peer, 0x53, small, Clock::now() + 5s);
    return problems.empty() ? "ok" : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}

TEST_CASE("ServerClient: a request goes out while the communication thread waits in an AllReduce") {
  // Rank 0 is a worker: it starts an AllReduce with rank 1 on its ring's transport, then pulls a
  // row over its client's. Rank 1 answers the pull first and joins the AllReduce only after, so
  // a pull queued behind the AllReduce would never be answered.
  constexpr int64_t kRows = 8, kWidth = 4;
  const auto results = runPair(2, [](Transports& t, int rank, const std::vector<int>& peers) {
    Ring ring(*t[0], rank, rank == 0 ? std::vector<int>{-1, peers[0]} : std::vector<int>{peers[0], -1}, 5000ms);
    TrafficLog traffic;
    Communicator communicator(ring, traffic);
    const std::vector<float> own = rank == 0 ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{10, 20, 30, 40};
    auto sumAll = [](Ring& r, std::vector<uint8_t>& b) { r.allReduceSum(DType::F32, b.data(), 4); };
    const std::vector<uint8_t> row = pattern(kWidth * sizeof(float), 7);
    std::string problems;
    if (rank == 0) {
      const uint64_t ticket = communicator.submit(bytesOf(own), sumAll, TrafficKind::Dense);
      Graph g;
      ServerPlan plan;
      plan.servers = 1;
      ServedVariable embedding;
      embedding.variable = g.variable("emb", f32, {kRows, kWidth}, Initializer::zeros()).node();
      embedding.sparse = true;
      plan.variables.push_back(embedding);
      Partition whole;
      whole.rows = kRows;
      whole.bytes = kRows * kWidth * sizeof(float);
      plan.partitions.push_back(whole);
      ServerClient client(traffic, *t[1], 0, {peers[1]}, plan, 5000ms);
      const std::vector<std::vector<uint8_t>> replies =
          client.request({{0, RequestKind::PullRows, bytesOf(std::vector<int64_t>{3})}}, TrafficKind::Sparse);
      problems += expectBytes(replies.at(0), row, "pulled row");
      const std::vector<uint8_t> sum = communicator.wait(ticket);
      if (sum != bytesOf(std::vector<float>{11, 22, 33, 44})) problems += "the AllReduce's sum differs; ";
      if (traffic.snapshot().sent[static_cast<size_t>(TrafficKind::Sparse)] == 0)
        problems += "the pull's bytes were not counted; ";
    } else {
      std::vector<Message> arrived;
      const Deadline deadline = Clock::now() + 5s;
      while (arrived.empty() && Clock::now() < deadline) {
        arrived = t[1]->takeMessages(deadline);
        if (arrived.empty()) t[1]->waitForActivity(deadline, 1ms);
      }
      if (arrived.size() != 1 || !isRequest(arrived[0].header)) return std::string("no single request arrived");
      const RequestHeader request = decodeRequest(arrived[0].header);
      if (request.kind != RequestKind::PullRows) problems += "not a pull; ";
      t[1]->sendMessage(peers[1], encode(ReplyHeader{request.id, 0}), row, deadline);
      if (communicator.run(bytesOf(own), sumAll, TrafficKind::Dense) != bytesOf(std::vector<float>{11, 22, 33, 44}))
        problems += "the AllReduce's sum differs; ";
    }
    return problems.empty() ? std::string("ok") : problems;
  });
  for (const SideResult& r : results) {
    CHECK(r.report == "ok");
    CHECK(exitedCleanly(r.status));
  }
}
