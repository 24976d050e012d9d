// A job under attack from a process on the same machine that holds no job secret: it learns
// every member's UCX address (WEFT_ADDRESS_BOOK publishes them; anyone who can reach a port can
// derive one) and sends what an outsider would — values in worker 0's name, goodbyes, a payload
// of a gigabyte, one announced by a process that then dies, tagged data sprayed at a worker's
// ring, pulls for steps far ahead, a three-byte reply, a flood of 50,000 small messages at the
// server. The job must end as an unattacked run ends, bit for bit, having logged what it dropped.
// Ten jobs started under a flood of connections at their coordinator (one every 2 ms, from the
// members' own address) all start and end as an unattacked one. And a local job's UCX listens
// on loopback alone.
#include "tests/TrainerCompare.h"
#include "tests/ConnectionFlood.h"

#include "dist/launch/Job.h"
#include "dist/launch/ResourceSpec.h"
#include "dist/server/ServerProtocol.h"
#include "dist/transport/UcxTransport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using namespace weft;
using namespace weft::dist;
using namespace std::chrono_literals;

namespace {

/// The attacked LM job, training for `steps` steps.
std::string lmFlags(int64_t steps) {
  return fmt::format("lm --vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 "
                     "--heldout-sentences 20 --batch 16 --steps {} --eval-every {} --threads 1 --timeout 60 "
                     "--workers 2 --servers 1",
                     steps, steps);
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> fromHex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

/// One line of the address book.
struct Published {
  Role role;
  int host, slot;
  uint8_t channel;
  std::vector<uint8_t> address;
  EndpointName name() const { return endpointName(static_cast<uint8_t>(role), host, slot, channel); }
};

/// Waits until the book lists `count` transports (or two minutes pass) and returns them.
std::vector<Published> awaitAddressBook(const fs::path& book, size_t count) {
  for (int i = 0; i < 1200; ++i) {
    std::istringstream in(readFile(book));
    std::vector<Published> out;
    std::string role, hex;
    int host, slot, channel;
    while (in >> role >> host >> slot >> channel >> hex)
      out.push_back(
          {role == "worker" ? Role::Worker : Role::Server, host, slot, static_cast<uint8_t>(channel), fromHex(hex)});
    if (out.size() == count) return out;
    std::this_thread::sleep_for(100ms);
  }
  FAIL("the job's members did not publish their addresses within two minutes");
  return {};
}

const Published& find(const std::vector<Published>& book, Role role, int slot, uint8_t channel) {
  for (const Published& p : book)
    if (p.role == role && p.slot == slot && p.channel == channel) return p;
  FAIL("no such member in the address book");
  throw std::logic_error("unreachable");
}

/// Runs `f`, whatever comes of it: an attacker does not care whether its sends complete (a victim
/// that drops a rendezvous payload never fetches it).
template <class F>
void regardless(F&& f) {
  try {
    f();
  } catch (...) {
  }
}

/// An outsider's transport: a key of its own (not the job's), claiming to be `claimed`.
struct Outsider {
  UcxTransport transport;
  int victim;
  Outsider(const Published& target, EndpointName claimed)
      : transport(UcxIdentity{Secret{0x66}, JobId{}, claimed, "lo"}),
        victim(transport.connect(target.address, target.name())) {}
  // UCX 1.13 stops a process with a failed assertion when a peer's connection fails while its
  // own reply to the peer's connection request still waits to be sent (removed upstream, UCX pull
  // request 8175): on a loaded machine, an outsider that closes at once could stop a victim that
  // way. That is an availability problem of its own; this test checks what an outsider can
  // change, so each outsider lets its connection finish before it closes.
  ~Outsider() { settle(); }
  void request(RequestKind kind, uint32_t worker, uint64_t clock, std::span<const uint8_t> payload,
               std::chrono::milliseconds wait = 2s) {
    regardless([&] {
      transport.sendMessage(victim, encode(RequestHeader{kind, 0, worker, 77, clock}), payload, Clock::now() + wait);
    });
  }
  /// Progresses the transport for a while, so that the victim's side of the connection completes.
  void settle() {
    const auto until = Clock::now() + 2s;
    while (Clock::now() < until) {
      regardless([&] { transport.progress(); });
      std::this_thread::sleep_for(1ms);
    }
  }
};

/// Every attack above, against the members in `book`.
void attack(const std::vector<Published>& book) {
  const Published& server = find(book, Role::Server, 0, 0);
  const Published& worker0 = find(book, Role::Worker, 0, 0);
  const Published& client0 = find(book, Role::Worker, 0, 1);
  const Published& client1 = find(book, Role::Worker, 1, 1);
  const Published& worker1 = find(book, Role::Worker, 1, 0);
  const std::vector<uint8_t> garbage(4096, 0xee);

  Outsider(server, client0.name()).request(RequestKind::Load, 0, 0, garbage);
  Outsider goodbyes(server, client1.name());
  goodbyes.request(RequestKind::Goodbye, 1, 0, {});
  goodbyes.request(RequestKind::Goodbye, 0, 0, {});
  Outsider pulls(server, client0.name());
  for (int i = 0; i < 200; ++i) pulls.request(RequestKind::PullAll, 0, 1000000 + i, {});

  // A gigabyte of zero pages that cost nothing until read: the victim must not fetch them.
  const size_t gigabyte = size_t{1} << 30;
  void* big = ::mmap(nullptr, gigabyte, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(big != MAP_FAILED);
  Outsider(server, client0.name()).request(RequestKind::Push, 0, 0, {static_cast<const uint8_t*>(big), gigabyte}, 1s);
  ::munmap(big, gigabyte);

  const pid_t vanishing = ::fork();  // announces a large payload and dies before it is fetched
  REQUIRE(vanishing >= 0);
  if (vanishing == 0) {
    Outsider dying(server, client0.name());
    dying.request(RequestKind::Push, 0, 0, std::vector<uint8_t>(64 << 20, 1), 200ms);
    dying.settle();  // the connection is made; the announced payload is never fetched
    ::_exit(0);
  }
  ::waitpid(vanishing, nullptr, 0);

  Outsider spray(worker0, worker1.name());
  const std::vector<uint8_t> chunk(1024, 0xab);
  for (uint64_t tag = 0; tag < 500; ++tag)
    regardless([&] { spray.transport.send(spray.victim, tag << 16, chunk, Clock::now() + 2s); });

  Outsider reply(client0, server.name());
  regardless([&] { reply.transport.sendMessage(reply.victim, std::vector<uint8_t>{1, 2, 3}, {}, Clock::now() + 2s); });

  // A flood of small messages at the server every worker waits on, from a name outside the roster.
  Outsider flood(server, endpointName(0, 9, 9, 0));
  const std::vector<uint8_t> tiny(3, 0xee);
  for (int batch = 0; batch < 100; ++batch) {
    regardless([&] {
      for (int k = 0; k < 500; ++k) flood.transport.startSend(flood.victim, 0x99, tiny);
      flood.transport.finishSends(Clock::now() + 2s);
    });
  }
}

}  // namespace

namespace {

/// Starts the attacked job of `steps` steps in the background (its output in `log`, its
/// members' addresses in `book`) and returns the launcher's pid.
pid_t launchAttackedJob(int64_t steps, const fs::path& book, const fs::path& log, const std::string& out) {
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    ::setenv("WEFT_ADDRESS_BOOK", book.c_str(), 1);
    const std::string command =
        std::string("exec ") + WEFT_CLI + " train " + lmFlags(steps) + " --out " + out + " > " + log.string() + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    std::_Exit(127);
  }
  return launcher;
}

/// Checks that the jobs that wrote to `a` and `b` ended with the same variables, bit for bit.
void checkSameCheckpoint(const std::string& a, const std::string& b) {
  const TensorFile expected = readSafetensors(a + "/checkpoint.safetensors");
  const TensorFile got = readSafetensors(b + "/checkpoint.safetensors");
  REQUIRE(got.tensors.size() == expected.tensors.size());
  for (const auto& [name, t] : expected.tensors) {
    CAPTURE(name);
    CHECK(relativeDifference(got.tensors.at(name), t) == 0.0);
  }
}

/// Runs every attack from a process of its own (the job sees a stranger, and UCX state stays
/// apart) and returns once it is done.
void attackFromOutside(const std::vector<Published>& members) {
  const pid_t attacker = ::fork();
  REQUIRE(attacker >= 0);
  if (attacker == 0) {
    ::signal(SIGABRT, SIG_DFL);  // not the test framework's handler: this process is no test
    ::alarm(120);
    const auto start = Clock::now();
    regardless([&] { attack(members); });
    ::_exit(static_cast<int>(std::min<int64_t>((Clock::now() - start) / 1s, 100)));
  }
  int attackerStatus = 0;
  ::waitpid(attacker, &attackerStatus, 0);
  MESSAGE("the attack took ", WIFEXITED(attackerStatus) ? WEXITSTATUS(attackerStatus) : -1, " s");
}

}  // namespace

TEST_CASE("an outsider without the secret changes nothing: the attacked job ends as an unattacked one, bit for bit") {
  TempDir dir;
  const std::string quiet = (dir.path / "quiet").string(), attacked = (dir.path / "attacked").string();
  // The attack must end while the job still trains, however fast the job and however slow the
  // attacker on a loaded machine: a job that ended first is run again four times as long.
  int64_t steps = 2500;
  std::string output;
  for (;;) {
    fs::remove_all(dir.path / "addresses");
    fs::remove_all(attacked);
    const pid_t launcher = launchAttackedJob(steps, dir.path / "addresses", dir.path / "log", attacked);
    attackFromOutside(awaitAddressBook(dir.path / "addresses", 5));
    // The job checkpoints once, after its last step: no checkpoint yet, the attack met it training.
    const bool endedFirst = fs::exists(attacked + "/checkpoint.safetensors");
    int status = 0;
    ::waitpid(launcher, &status, 0);
    output = readFile(dir.path / "log");
    CAPTURE(output);
    REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    if (!endedFirst) break;
    MESSAGE("the job of ", steps, " steps ended before the attack did; again with ", 4 * steps);
    steps *= 4;
  }
  CAPTURE(output);
  // Each victim noticed (the log is rate-limited: the first rejection of each is there).
  CHECK(contains(output, "endpoint 0 of server 0 of host 0 dropped a message: it claims to come from endpoint 1 of "
                         "worker 0 of host 0 but its seal does not verify"));
  CHECK(contains(output, "endpoint 0 of worker 0 of host 0 dropped a message"));
  CHECK(contains(output, "endpoint 1 of worker 0 of host 0 dropped a message"));

  const CliRun reference = weftCli("train " + lmFlags(steps) + " --out " + quiet);
  REQUIRE_MESSAGE(reference.status == 0, reference.output);
  checkSameCheckpoint(quiet, attacked);
}

namespace {

/// A TCP port on loopback that nothing listens on now (bound, then released).
uint16_t freePort() {
  FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t length = sizeof addr;
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  return ntohs(addr.sin_port);
}

/// A flooded job's output without the coordinator's lines about the flood, which would bury why it failed.
std::string withoutRefusals(const std::string& output) {
  std::istringstream in(output);
  std::string out, line;
  size_t dropped = 0;
  while (std::getline(in, line)) {
    if (contains(line, "weft coordinator: refused connection from")) ++dropped;
    else out += line + "\n";
  }
  return out + fmt::format("({} lines about refused connections left out)\n", dropped);
}

}  // namespace

TEST_CASE("under a flood of connections at their coordinator, ten jobs of ten start and end as an unattacked one") {
  TempDir dir;
  const uint16_t port = freePort();
  const fs::path cluster = dir.path / "cluster.json";
  std::ofstream(cluster) << fmt::format(
      R"({{"hosts": [{{"address": "127.0.0.1", "cpu_workers": 2, "servers": 1}}], "coordinator_port": {}}})", port);
  const std::string flags = "train mlp --train-size 1024 --test-size 64 --batch 64 --steps 20 --threads 1 --timeout 60 "
                            "--cluster " + cluster.string() + " --out ";
  const std::string quiet = (dir.path / "quiet").string();
  const CliRun reference = weftCli(flags + quiet);
  REQUIRE_MESSAGE(reference.status == 0, reference.output);
  for (int job = 0; job < 10; ++job) {
    CAPTURE(job);
    const std::string out = (dir.path / fmt::format("flooded-{}", job)).string();
    CliRun run{};
    uint64_t opened = 0;
    {
      ConnectionFlood flood(port, 1, std::chrono::milliseconds(2));
      run = weftCli(flags + out);
      opened = flood.opened();
    }
    CHECK_MESSAGE(run.status == 0, withoutRefusals(run.output));
    CHECK(opened > 0);  // the flood reached the coordinator
    if (run.status == 0) checkSameCheckpoint(quiet, out);
  }
}

namespace {

/// The local addresses ("127.0.0.1", "0.0.0.0", ...) of this process's listening TCP sockets.
std::set<std::string> listeningAddresses() {
  std::set<std::string> inodes;
  for (const fs::directory_entry& fd : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = fs::read_symlink(fd.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<std::string> out;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::istringstream in(readFile(table));
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.contains(inode)) continue;  // 0A: LISTEN
      const std::string hex = local.substr(0, local.find(':'));
      if (hex == "0100007F") {
        out.insert("127.0.0.1");
      } else if (hex == "00000000000000000000000001000000") {
        out.insert("::1");
      } else {
        out.insert(hex);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a local job's UCX listens on loopback alone") {
  const ResourceSpec local = ResourceSpec::localCpu(2);
  REQUIRE(listeningDevice(local, 0) == "lo");
  ::unsetenv("UCX_NET_DEVICES");
  UcxTransport transport(UcxIdentity{Secret{}, JobId{}, endpointName(0, 0, 0, 0), listeningDevice(local, 0)});
  const std::set<std::string> addresses = listeningAddresses();
  CAPTURE(fmt::format("{}", fmt::join(addresses, ", ")));
  CHECK(!addresses.empty());
  for (const std::string& a : addresses) CHECK((a == "127.0.0.1" || a == "::1"));
}

TEST_CASE("a host address on none of the machine's interfaces is refused naming it") {
  const ResourceSpec elsewhere =
      ResourceSpec::parse(R"({"hosts": [{"address": "192.0.2.1", "cpu_workers": 1}]})", "spec.json");
  const std::string error = errorOf([&] { listeningDevice(elsewhere, 0); });
  CHECK(contains(error, "host 0's address in the resource specification, '192.0.2.1', is on none of this machine's "
                        "interfaces (lo (127.0.0.1)"));
}
