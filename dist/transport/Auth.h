// The job secret and mutual authentication. A job has a random 32-byte secret; only processes
// holding it are admitted. It travels in a 0600 file or the WEFT_JOB_SECRET environment variable
// (hex), never on a command line, which any local user can read in /proc/*/cmdline.
//
// Handshake (HMAC-SHA256, OpenSSL 3 EVP_MAC), right after a connection opens:
//   server -> client  CHALLENGE {server_nonce}
//   client -> server  AUTH      {client_nonce, HMAC(K, "weft-auth-v1"        || job || Ns || Nc)}
//   server -> client  AUTH_OK   {HMAC(K, "weft-auth-server-v1" || job || Ns || Nc)}
// Fresh nonces on both sides defeat replay; the distinct labels stop a server's proof from being
// reflected as a client's.
//
// Every later frame on the connection (JOIN, ROSTER, heartbeats, LEAVE, ABORT, a refusal) is
// sealed (ControlSeal): it carries HMAC-SHA256 under a key of its direction, derived from the
// secret and both nonces, over the frame's position on the connection, its type and its payload.
// A process without the secret can neither forge a roster or an abort nor alter one in flight,
// a frame cannot be replayed or reordered within the connection (both sides count frames; TCP
// keeps their order), and a frame recorded on one connection fails on any other (fresh nonces,
// fresh keys). Nothing is encrypted: the control plane carries addresses and counters, no model
// data. (UCX traffic has its own seal, dist/transport/Seal.h.)
#pragma once

#include "dist/transport/Wire.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

inline constexpr size_t kSecretBytes = 32;
using Secret = std::array<uint8_t, kSecretBytes>;
using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

/// Fills `out` from the kernel's random source (getrandom).
void randomBytes(std::span<uint8_t> out);
/// A new random job secret.
Secret generateSecret();
/// A new random job id.
JobId generateJobId();

/// Parses 64 hex digits (surrounding whitespace ignored); `source` names the origin in errors.
Secret secretFromHex(const std::string& text, const std::string& source);
/// Parses a job id (32 hex digits), as toHex() writes it.
JobId jobIdFromHex(const std::string& text, const std::string& source);
/// Creates `path` with mode 0600 holding the secret in hex; refuses to overwrite a file.
void saveSecret(const std::string& path, const Secret& secret);
/// The largest secret file read (a secret is 64 hex digits and a newline).
inline constexpr uint64_t kMaxSecretFileBytes = 4096;
/// Reads a secret file; refuses one that group or others may access, one that is not a regular
/// file (a FIFO would block for ever) and one over kMaxSecretFileBytes.
Secret loadSecret(const std::string& path);
/// The secret in WEFT_JOB_SECRET; throws when unset or malformed.
Secret secretFromEnvironment();

/// The job secret in a sealed memory file (hex, one line), named to a process by
/// WEFT_JOB_SECRET_FD: local members inherit the descriptor. Nothing reaches the file system, so
/// a process killed with SIGKILL leaves nothing behind.
class SecretMemory {
 public:
  explicit SecretMemory(const Secret& secret);
  int fd() const { return fd_.get(); }

 private:
  FileDescriptor fd_;
};

/// HMAC-SHA256 of `message` under `key`.
Digest hmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> message);
/// Constant-time comparison (CRYPTO_memcmp), so timing does not leak how much of a MAC matched.
bool digestsEqual(const Digest& a, const Digest& b);

/// The two keys of a connection's sealed frames after the handshake, as one side sees them.
struct ControlKeys {
  Digest send, receive;
};

/// Seals the frames one side of an admitted connection sends, and opens those it receives.
class ControlSeal {
 public:
  /// The tag each sealed frame's payload ends with.
  static constexpr uint32_t kTagBytes = 32;
  ControlSeal() = default;
  explicit ControlSeal(const ControlKeys& keys) : keys_(keys) {}
  /// `payload` and its tag, for the next frame of type `type` this side sends.
  std::vector<uint8_t> seal(MessageType type, std::span<const uint8_t> payload);
  /// `frame` without its tag, once the tag proves it is the next frame the peer sealed; throws
  /// naming the frame's type otherwise (altered, replayed, reordered, unsealed, from a process
  /// without the secret).
  Frame open(Frame frame);

 private:
  Digest tag(const Digest& key, uint64_t counter, MessageType type, std::span<const uint8_t> payload) const;
  ControlKeys keys_{};
  uint64_t sent_ = 0, received_ = 0;
};

/// writeFrame and readFrame through a seal (`maxPayload` without the tag).
void writeSealed(int fd, ControlSeal& seal, MessageType type, const JobId& job, std::span<const uint8_t> payload,
                 Deadline deadline);
Frame readSealed(int fd, ControlSeal& seal, Deadline deadline, const JobId& job,
                 uint32_t maxPayload = kMaxControlPayload - ControlSeal::kTagBytes);
/// sendRefusal on an admitted connection: sealed, so the peer can believe the reason.
void sendSealedRefusal(int fd, ControlSeal& seal, const JobId& job, const std::string& reason);

/// Server side of the handshake on a connected socket: returns the connection's keys once the
/// client proved it holds the secret, else throws ("bad HMAC ...", a wire error, a timeout). It
/// is sendChallenge, a blocking read of the answer, and checkAnswer.
ControlKeys serverHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline);
/// The server's handshake in steps, for a server that reads many connections' answers in one
/// loop: sendChallenge writes the CHALLENGE and returns its nonce; checkAnswer takes the frame
/// the client answered with (at most kAuthAnswerBytes of payload) and, if it proves the secret,
/// writes AUTH_OK; otherwise it tells the client why (REFUSED) and throws.
Nonce sendChallenge(int fd, const JobId& job, Deadline deadline);
/// AUTH is two 32-byte fields; an unauthenticated peer must not make the server allocate more.
inline constexpr uint32_t kAuthAnswerBytes = 64;
ControlKeys checkAnswer(int fd, const Secret& secret, const JobId& job, const Nonce& challenge, const Frame& answer,
                        Deadline deadline);
/// Client side: returns once the server accepted us and proved it holds the secret too, else
/// throws (refused by the server with its reason, a wrong server proof, a wire error, a timeout).
ControlKeys clientHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline);

}  // namespace weft::dist
