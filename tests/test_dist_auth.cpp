// The job secret and the mutual HMAC handshake: secret files (0600, refused when group or
// others may read them), the environment variable, HMAC-SHA256 against RFC 4231, the handshake
// over a socket pair, succeeding and failing on either side, and the seal of every frame after
// it (altered, replayed, reordered, retyped, reflected, moved between connections, unsealed).
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include "dist/transport/Auth.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

using namespace weft;
using namespace weft::dist;
namespace fs = std::filesystem;

namespace {

struct SocketPair {
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    server.reset(fds[0]);
    client.reset(fds[1]);
  }
  FileDescriptor server, client;
};

Deadline in(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

const JobId kJob = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

// Runs the server side on a thread; returns its error ("" when it admitted the client).
struct ServerThread {
  ServerThread(int fd, const Secret& secret, const JobId& job)
      : thread([this, fd, secret, job] {
          try {
            keys = serverHandshake(fd, secret, job, in(2000));
          } catch (const Error& e) {
            error = e.what();
          }
        }) {}
  std::string finish() {
    thread.join();
    return error;
  }
  std::string error;
  ControlKeys keys{};
  std::thread thread;
};

// An admitted connection: each side's seal.
struct Admitted {
  explicit Admitted(const Secret& secret = generateSecret()) {
    ServerThread handshake(pair.server.get(), secret, kJob);
    client = ControlSeal(clientHandshake(pair.client.get(), secret, kJob, in(2000)));
    REQUIRE(handshake.finish().empty());
    server = ControlSeal(handshake.keys);
  }
  SocketPair pair;
  ControlSeal client, server;
};

}  // namespace

TEST_CASE("HMAC-SHA256 matches RFC 4231") {
  // Test case 2: key "Jefe", data "what do ya want for nothing?".
  CHECK(toHex(hmacSha256(bytesOf("Jefe"), bytesOf("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: key 20 x 0x0b, data "Hi There".
  CHECK(toHex(hmacSha256(std::vector<uint8_t>(20, 0x0b), bytesOf("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  Digest a = hmacSha256(bytesOf("k"), bytesOf("m")), b = a;
  CHECK(digestsEqual(a, b));
  b[31] ^= 1;
  CHECK_FALSE(digestsEqual(a, b));
}

TEST_CASE("secrets: random, hex round trip, malformed hex") {
  const Secret s = generateSecret();
  CHECK(s != generateSecret());
  CHECK(generateJobId() != generateJobId());
  const std::string hex = toHex(s);
  CHECK(hex.size() == 64);
  CHECK(secretFromHex("  " + hex + "\n", "test") == s);
  const std::string shortError = errorOf([] { secretFromHex("abcd", "test"); });
  CHECK(shortError == "test: a job secret is 64 hex digits, got 4 characters");
  std::string bad = hex;
  bad[10] = 'g';
  const std::string badError = errorOf([&] { secretFromHex(bad, "test"); });
  CHECK(badError == "test: character 11 of the job secret is not a hex digit");
  CHECK_FALSE(contains(badError, bad));  // a secret with a typo is never echoed
}

TEST_CASE("secrets: files are created 0600 and refused when others may read them") {
  TempDir dir;
  const std::string path = dir.file("job.secret");
  const Secret s = generateSecret();
  const mode_t oldMask = ::umask(0);  // a permissive umask must not widen the file's mode
  saveSecret(path, s);
  ::umask(oldMask);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(loadSecret(path) == s);

  CHECK(contains(errorOf([&] { saveSecret(path, s); }), "cannot create secret file " + path + ": File exists"));

  ::chmod(path.c_str(), 0644);
  CHECK(errorOf([&] { loadSecret(path); }) ==
        "secret file " + path + " has mode 0644: group or others may access it; it must be 0600");
  ::chmod(path.c_str(), 0640);
  CHECK(contains(errorOf([&] { loadSecret(path); }), "has mode 0640"));
  ::chmod(path.c_str(), 0400);
  CHECK(loadSecret(path) == s);

  CHECK(contains(errorOf([&] { loadSecret(dir.file("missing")); }),
                 "secret file " + dir.file("missing") + " does not exist"));
  const std::string garbage = dir.file("garbage");
  std::ofstream(garbage) << "not a secret";
  ::chmod(garbage.c_str(), 0600);
  CHECK(errorOf([&] { loadSecret(garbage); }) ==
        "secret file " + garbage + ": a job secret is 64 hex digits, got 12 characters");
  CHECK(errorOf([&] { loadSecret(dir.path.string()); }) ==
        "secret file " + dir.path.string() + " is a directory; only a regular file is read");
}

TEST_CASE("secrets: WEFT_JOB_SECRET") {
  const Secret s = generateSecret();
  ::setenv("WEFT_JOB_SECRET", toHex(s).c_str(), 1);
  CHECK(secretFromEnvironment() == s);
  ::setenv("WEFT_JOB_SECRET", "xyz", 1);
  CHECK(errorOf([] { secretFromEnvironment(); }) == "WEFT_JOB_SECRET: a job secret is 64 hex digits, got 3 characters");
  ::unsetenv("WEFT_JOB_SECRET");
  CHECK(contains(errorOf([] { secretFromEnvironment(); }), "WEFT_JOB_SECRET is not set"));
}

TEST_CASE("handshake: both sides holding the secret admit each other") {
  SocketPair p;
  const Secret s = generateSecret();
  ServerThread server(p.server.get(), s, kJob);
  clientHandshake(p.client.get(), s, kJob, in(2000));
  CHECK(server.finish().empty());
}

TEST_CASE("handshake: a client with the wrong secret is refused and told why") {
  SocketPair p;
  ServerThread server(p.server.get(), generateSecret(), kJob);
  const std::string clientError = errorOf([&] { clientHandshake(p.client.get(), generateSecret(), kJob, in(2000)); });
  CHECK(server.finish() == "bad HMAC: the client does not hold the job secret");
  CHECK(clientError == "refused by the peer: bad HMAC: the client does not hold the job secret");
}

TEST_CASE("handshake: a server that cannot prove the secret is refused by the client") {
  SocketPair p;
  const Secret s = generateSecret();
  std::thread impostor([&] {
    // Plays the server without the secret: it cannot compute the server MAC, so it guesses.
    writeFrame(p.server.get(), MessageType::Challenge, kJob, Nonce{}, in(2000));
    readFrame(p.server.get(), in(2000), kJob);
    writeFrame(p.server.get(), MessageType::AuthOk, kJob, Digest{}, in(2000));
  });
  const std::string error = errorOf([&] { clientHandshake(p.client.get(), s, kJob, in(2000)); });
  impostor.join();
  CHECK(error == "the server's proof is wrong: it does not hold the job secret");
}

TEST_CASE("handshake: another job, a malformed answer, silence") {
  const Secret s = generateSecret();
  JobId other = kJob;
  other[0] = 8;
  {
    SocketPair p;
    ServerThread server(p.server.get(), s, kJob);
    const std::string clientError = errorOf([&] { clientHandshake(p.client.get(), s, other, in(2000)); });
    CHECK(clientError ==
          "frame CHALLENGE belongs to job 07070707070707070707070707070707, expected job "
          "08070707070707070707070707070707");
    p.client.reset();  // the client hangs up with the challenge's payload unread: a reset
    CHECK(server.finish() == "reading a frame header failed: Connection reset by peer");
  }
  {
    SocketPair p;
    ServerThread server(p.server.get(), s, kJob);
    readFrame(p.client.get(), in(2000), kJob);
    writeFrame(p.client.get(), MessageType::Auth, kJob, std::vector<uint8_t>(40), in(2000));
    CHECK(server.finish() == "message AUTH: field 'client_mac' needs 32 bytes, 8 remain");
    const Frame refused = readFrame(p.client.get(), in(2000), kJob);
    CHECK(errorOf([&] { expectType(refused, MessageType::AuthOk); }) ==
          "refused by the peer: message AUTH: field 'client_mac' needs 32 bytes, 8 remain");
  }
  {
    SocketPair p;
    ServerThread server(p.server.get(), s, kJob);
    writeFrame(p.client.get(), MessageType::Auth, kJob, std::vector<uint8_t>(65), in(2000));  // over the AUTH limit
    CHECK(server.finish() == "frame AUTH claims a payload of 65 bytes, over the 64-byte limit");
  }
  {
    SocketPair p;
    const auto start = Clock::now();
    const std::string error = errorOf([&] { serverHandshake(p.server.get(), s, kJob, in(200)); });
    CHECK(error == "timed out: 0 of 28 bytes of a frame header arrived before the deadline");
    CHECK(Clock::now() - start < std::chrono::seconds(2));
  }
}

TEST_CASE("after the handshake each side opens the other's sealed frames, in order") {
  Admitted a;
  const std::vector<uint8_t> join = bytesOf("join"), roster = bytesOf("roster");
  writeSealed(a.pair.client.get(), a.client, MessageType::Join, kJob, join, in(2000));
  writeSealed(a.pair.client.get(), a.client, MessageType::Heartbeat, kJob, {}, in(2000));
  const Frame first = readSealed(a.pair.server.get(), a.server, in(2000), kJob);
  CHECK(first.type == MessageType::Join);
  CHECK(first.payload == join);
  CHECK(readSealed(a.pair.server.get(), a.server, in(2000), kJob).payload.empty());
  writeSealed(a.pair.server.get(), a.server, MessageType::Roster, kJob, roster, in(2000));
  CHECK(readSealed(a.pair.client.get(), a.client, in(2000), kJob).payload == roster);
}

TEST_CASE("a sealed frame altered in flight is refused, naming its type") {
  Admitted a;
  std::vector<uint8_t> sealed = a.client.seal(MessageType::Heartbeat, bytesOf("progress"));
  sealed[3] ^= 1;
  writeFrame(a.pair.client.get(), MessageType::Heartbeat, kJob, sealed, in(2000));
  CHECK(errorOf([&] { readSealed(a.pair.server.get(), a.server, in(2000), kJob); }) ==
        "frame HEARTBEAT failed its seal (frame 0 of the connection): altered, replayed, reordered, or sent by a "
        "process without the job secret");
}

TEST_CASE("a sealed frame replayed, reordered or retyped on its connection is refused") {
  Admitted a;
  const std::vector<uint8_t> first = a.client.seal(MessageType::Heartbeat, bytesOf("1"));
  const std::vector<uint8_t> second = a.client.seal(MessageType::Heartbeat, bytesOf("2"));
  writeFrame(a.pair.client.get(), MessageType::Heartbeat, kJob, first, in(2000));
  CHECK(readSealed(a.pair.server.get(), a.server, in(2000), kJob).payload == bytesOf("1"));
  writeFrame(a.pair.client.get(), MessageType::Heartbeat, kJob, first, in(2000));  // again
  CHECK(contains(errorOf([&] { readSealed(a.pair.server.get(), a.server, in(2000), kJob); }),
                 "frame HEARTBEAT failed its seal (frame 1 of the connection)"));
  Admitted b;
  b.client.seal(MessageType::Leave, {});  // sealed first, never sent
  const std::vector<uint8_t> beat = b.client.seal(MessageType::Heartbeat, {});
  writeFrame(b.pair.client.get(), MessageType::Heartbeat, kJob, beat, in(2000));  // before the LEAVE sealed first
  CHECK(contains(errorOf([&] { readSealed(b.pair.server.get(), b.server, in(2000), kJob); }), "failed its seal"));
  Admitted c;
  const std::vector<uint8_t> heartbeat = c.client.seal(MessageType::Heartbeat, {});
  writeFrame(c.pair.client.get(), MessageType::Leave, kJob, heartbeat, in(2000));  // another type, same bytes
  CHECK(contains(errorOf([&] { readSealed(c.pair.server.get(), c.server, in(2000), kJob); }),
                 "frame LEAVE failed its seal"));
}

TEST_CASE("a frame sealed on one connection, or by the other side, fails on any other") {
  const Secret secret = generateSecret();
  Admitted a(secret), b(secret);  // the same job and secret, other nonces
  writeFrame(b.pair.client.get(), MessageType::Abort, kJob, a.client.seal(MessageType::Abort, bytesOf("stop")),
             in(2000));
  CHECK(contains(errorOf([&] { readSealed(b.pair.server.get(), b.server, in(2000), kJob); }),
                 "frame ABORT failed its seal"));
  // The client's own frame reflected back to it: the directions have different keys.
  writeFrame(a.pair.server.get(), MessageType::Abort, kJob, a.client.seal(MessageType::Abort, bytesOf("stop")),
             in(2000));
  CHECK(contains(errorOf([&] { readSealed(a.pair.client.get(), a.client, in(2000), kJob); }),
                 "frame ABORT failed its seal"));
}

TEST_CASE("an unsealed frame after the handshake is refused: a forged ABORT or ROSTER does not pass") {
  Admitted a;
  writeFrame(a.pair.server.get(), MessageType::Abort, kJob, bytesOf("stop"), in(2000));
  CHECK(errorOf([&] { readSealed(a.pair.client.get(), a.client, in(2000), kJob); }) ==
        "frame ABORT of 4 bytes after admission carries no seal: not from a member of the job");
  writeFrame(a.pair.server.get(), MessageType::Roster, kJob, std::vector<uint8_t>(64, 0), in(2000));
  CHECK(contains(errorOf([&] { readSealed(a.pair.client.get(), a.client, in(2000), kJob); }),
                 "frame ROSTER failed its seal"));
}

TEST_CASE("secrets: a FIFO or a device is refused without blocking, an oversized file too") {
  TempDir dir;
  const std::string fifo = makeFifo(dir, "secret.fifo");
  CHECK(fifoError(fifo, [&] { loadSecret(fifo); }) ==
        "secret file " + fifo + " is a FIFO; only a regular file is read");
  CHECK(contains(errorOf([&] { loadSecret("/dev/zero"); }), "/dev/zero is a character device"));
  const std::string big = dir.write("big.secret", toHex(generateSecret()) + std::string(5000, ' '));
  ::chmod(big.c_str(), 0600);
  CHECK(contains(errorOf([&] { loadSecret(big); }), big + " has 5064 bytes, over the limit of 4096 bytes"));
}
