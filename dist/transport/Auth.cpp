// Job secrets (generation, 0600 files, the environment) and the HMAC challenge-response.
#include "dist/transport/Auth.h"

#include "core/Error.h"
#include "core/InputFile.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace weft::dist {
namespace {

constexpr char kClientLabel[] = "weft-auth-v1";
constexpr char kServerLabel[] = "weft-auth-server-v1";
constexpr char kControlLabel[] = "weft-control-v1";

// label || job || server nonce || client nonce, MACed under the secret.
Digest handshakeMac(const Secret& secret, const char* label, const JobId& job, const Nonce& serverNonce,
                    const Nonce& clientNonce) {
  WireWriter w;
  w.putFixed({reinterpret_cast<const uint8_t*>(label), std::strlen(label)});
  w.putFixed(job);
  w.putFixed(serverNonce);
  w.putFixed(clientNonce);
  return hmacSha256(secret, w.bytes());
}

Digest labelled(const Digest& key, const char* label) {
  return hmacSha256(key, {reinterpret_cast<const uint8_t*>(label), std::strlen(label)});
}

/// The connection's keys (client to server, server to client), from the secret and both nonces.
std::pair<Digest, Digest> controlKeys(const Secret& secret, const JobId& job, const Nonce& serverNonce,
                                      const Nonce& clientNonce) {
  const Digest connection = handshakeMac(secret, kControlLabel, job, serverNonce, clientNonce);
  return {labelled(connection, "client-to-server"), labelled(connection, "server-to-client")};
}

template <class T>
T randomArray() {
  T out{};
  randomBytes(out);
  return out;
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void writeAll(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    WEFT_CHECK(n > 0, "cannot write secret file {}: {}", path, std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  WEFT_CHECK(::fsync(fd) == 0, "cannot write secret file {}: fsync: {}", path, std::strerror(errno));
}

}  // namespace

void randomBytes(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    WEFT_CHECK(n >= 0, "getrandom failed: {}", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

Secret generateSecret() { return randomArray<Secret>(); }
JobId generateJobId() { return randomArray<JobId>(); }

namespace {

/// Parses exactly out.size() bytes of hex (surrounding whitespace ignored).
void parseHex(const std::string& text, std::span<uint8_t> out, const char* what, const std::string& source) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  const std::string hex = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  // The messages never quote the text: it may be a real secret with a typo.
  WEFT_CHECK(hex.size() == 2 * out.size(), "{}: a {} is {} hex digits, got {} characters", source, what, 2 * out.size(),
             hex.size());
  std::fill(out.begin(), out.end(), 0);
  for (size_t i = 0; i < hex.size(); ++i) {
    const int v = hexValue(hex[i]);
    WEFT_CHECK(v >= 0, "{}: character {} of the {} is not a hex digit", source, i + 1, what);
    out[i / 2] = static_cast<uint8_t>(out[i / 2] << 4 | v);
  }
}

}  // namespace

Secret secretFromHex(const std::string& text, const std::string& source) {
  Secret secret{};
  parseHex(text, secret, "job secret", source);
  return secret;
}

JobId jobIdFromHex(const std::string& text, const std::string& source) {
  JobId job{};
  parseHex(text, job, "job id", source);
  return job;
}

void saveSecret(const std::string& path, const Secret& secret) {
  // O_EXCL: never overwrite (or follow a planted symlink to) an existing file.
  FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  WEFT_CHECK(fd.valid(), "cannot create secret file {}: {}", path, std::strerror(errno));
  try {
    // The umask can only clear bits of 0600, but some filesystems (vfat, some mounts) ignore
    // modes entirely, so the mode is verified rather than trusted.
    WEFT_CHECK(::fchmod(fd.get(), 0600) == 0, "cannot set mode 0600 on secret file {}: {}", path, std::strerror(errno));
    struct stat st {};
    WEFT_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat secret file {}: {}", path, std::strerror(errno));
    WEFT_CHECK((st.st_mode & 07777) == 0600,
               "secret file {} has mode {:04o} after creation, not 0600: its filesystem "
               "does not keep permissions",
               path, st.st_mode & 07777);
    writeAll(fd.get(), toHex(secret) + "\n", path);
  } catch (const Error&) {
    ::unlink(path.c_str());
    throw;
  }
}

Secret loadSecret(const std::string& path) {
  // A FIFO or a device is refused before anything is read from it; a regular file is read whole.
  InputFile in(path, "secret file", kMaxSecretFileBytes);
  WEFT_CHECK((in.permissions() & 077) == 0,
             "secret file {} has mode {:04o}: group or others may access it; it must be 0600", in.name(),
             in.permissions());
  return secretFromHex(in.readAll(), "secret file " + in.name());
}

Secret secretFromEnvironment() {
  const char* value = std::getenv("WEFT_JOB_SECRET");
  WEFT_CHECK(value != nullptr, "WEFT_JOB_SECRET is not set: a job's processes get the job secret in it");
  return secretFromHex(value, "WEFT_JOB_SECRET");
}

Digest hmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  const std::unique_ptr<EVP_MAC, decltype(&EVP_MAC_free)> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr), EVP_MAC_free);
  WEFT_CHECK(mac != nullptr, "HMAC-SHA256: OpenSSL has no HMAC implementation");
  const std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(mac.get()), EVP_MAC_CTX_free);
  char digestName[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digestName, 0),
                               OSSL_PARAM_construct_end()};
  Digest out{};
  size_t length = 0;
  const bool ok = ctx && EVP_MAC_init(ctx.get(), key.data(), key.size(), params) == 1 &&
                  EVP_MAC_update(ctx.get(), message.data(), message.size()) == 1 &&
                  EVP_MAC_final(ctx.get(), out.data(), &length, out.size()) == 1 && length == out.size();
  WEFT_CHECK(ok, "HMAC-SHA256 failed inside OpenSSL");
  return out;
}

bool digestsEqual(const Digest& a, const Digest& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Nonce sendChallenge(int fd, const JobId& job, Deadline deadline) {
  const Nonce serverNonce = randomArray<Nonce>();
  writeFrame(fd, MessageType::Challenge, job, serverNonce, deadline);
  return serverNonce;
}

ControlKeys checkAnswer(int fd, const Secret& secret, const JobId& job, const Nonce& challenge, const Frame& answer,
                        Deadline deadline) {
  try {
    expectType(answer, MessageType::Auth);
    WireReader r = answer.reader();
    const Nonce clientNonce = r.getFixed<32>("client_nonce");
    const Digest clientMac = r.getFixed<32>("client_mac");
    r.finish();
    WEFT_CHECK(digestsEqual(clientMac, handshakeMac(secret, kClientLabel, job, challenge, clientNonce)),
               "bad HMAC: the client does not hold the job secret");
    writeFrame(fd, MessageType::AuthOk, job, handshakeMac(secret, kServerLabel, job, challenge, clientNonce), deadline);
    const auto [toServer, toClient] = controlKeys(secret, job, challenge, clientNonce);
    return {toClient, toServer};
  } catch (const Error& e) {
    sendRefusal(fd, job, e.what());
    throw;
  }
}

ControlKeys serverHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline) {
  Nonce challenge;
  Frame answer;
  try {
    challenge = sendChallenge(fd, job, deadline);
    answer = readFrame(fd, deadline, job, kAuthAnswerBytes);
  } catch (const Error& e) {
    sendRefusal(fd, job, e.what());
    throw;
  }
  return checkAnswer(fd, secret, job, challenge, answer, deadline);
}

ControlKeys clientHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline) {
  const Frame challenge = readFrame(fd, deadline, job);
  expectType(challenge, MessageType::Challenge);
  WireReader r = challenge.reader();
  const Nonce serverNonce = r.getFixed<32>("server_nonce");
  r.finish();

  const Nonce clientNonce = randomArray<Nonce>();
  WireWriter w;
  w.putFixed(clientNonce);
  w.putFixed(handshakeMac(secret, kClientLabel, job, serverNonce, clientNonce));
  writeFrame(fd, MessageType::Auth, job, w.bytes(), deadline);

  const Frame ok = readFrame(fd, deadline, job);
  expectType(ok, MessageType::AuthOk);
  WireReader okReader = ok.reader();
  const Digest serverMac = okReader.getFixed<32>("server_mac");
  okReader.finish();
  WEFT_CHECK(digestsEqual(serverMac, handshakeMac(secret, kServerLabel, job, serverNonce, clientNonce)),
             "the server's proof is wrong: it does not hold the job secret");
  const auto [toServer, toClient] = controlKeys(secret, job, serverNonce, clientNonce);
  return {toServer, toClient};
}

Digest ControlSeal::tag(const Digest& key, uint64_t counter, MessageType type, std::span<const uint8_t> payload) const {
  WireWriter w;
  w.putU64(counter);
  w.putU8(static_cast<uint8_t>(type));
  w.putFixed(payload);
  return hmacSha256(key, w.bytes());
}

std::vector<uint8_t> ControlSeal::seal(MessageType type, std::span<const uint8_t> payload) {
  std::vector<uint8_t> sealed(payload.begin(), payload.end());
  const Digest t = tag(keys_.send, sent_++, type, payload);
  sealed.insert(sealed.end(), t.begin(), t.end());
  return sealed;
}

Frame ControlSeal::open(Frame frame) {
  WEFT_CHECK(frame.payload.size() >= kTagBytes,
             "frame {} of {} bytes after admission carries no seal: not from a member of the job",
             messageTypeName(frame.type), frame.payload.size());
  const size_t length = frame.payload.size() - kTagBytes;
  Digest given;
  std::copy(frame.payload.begin() + static_cast<std::ptrdiff_t>(length), frame.payload.end(), given.begin());
  frame.payload.resize(length);
  WEFT_CHECK(digestsEqual(given, tag(keys_.receive, received_, frame.type, frame.payload)),
             "frame {} failed its seal (frame {} of the connection): altered, replayed, reordered, or sent by a "
             "process without the job secret",
             messageTypeName(frame.type), received_);
  ++received_;
  return frame;
}

void writeSealed(int fd, ControlSeal& seal, MessageType type, const JobId& job, std::span<const uint8_t> payload,
                 Deadline deadline) {
  writeFrame(fd, type, job, seal.seal(type, payload), deadline);
}

Frame readSealed(int fd, ControlSeal& seal, Deadline deadline, const JobId& job, uint32_t maxPayload) {
  return seal.open(readFrame(fd, deadline, job, maxPayload + ControlSeal::kTagBytes));
}

void sendSealedRefusal(int fd, ControlSeal& seal, const JobId& job, const std::string& reason) {
  try {
    WireWriter w;
    w.putString(reason.substr(0, kMaxStringBytes));
    writeSealed(fd, seal, MessageType::Refused, job, w.bytes(), Clock::now() + std::chrono::milliseconds(500));
  } catch (const Error&) {
    // The peer is being dropped anyway; the caller reports the original reason.
  }
}

SecretMemory::SecretMemory(const Secret& secret)
    : fd_(::memfd_create("weft-job-secret", MFD_CLOEXEC | MFD_ALLOW_SEALING)) {
  WEFT_CHECK(fd_.valid(), "memfd_create failed: {}", std::strerror(errno));
  const std::string text = toHex(secret);
  WEFT_CHECK(::fchmod(fd_.get(), 0600) == 0 &&
                 ::write(fd_.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                 ::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0,
             "cannot store the job secret in memory: {}", std::strerror(errno));
}

}  // namespace weft::dist
