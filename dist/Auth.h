// The job secret and mutual authentication. A job has a random 32-byte secret; only processes
// holding it are admitted. It travels in a 0600 file or the WEFT_JOB_SECRET environment variable
// (hex), never on a command line, which any local user can read in /proc/*/cmdline.
//
// Handshake (HMAC-SHA256, OpenSSL 3 EVP_MAC), right after a connection opens:
//   server -> client  CHALLENGE {server_nonce}
//   client -> server  AUTH      {client_nonce, HMAC(K, "weft-auth-v1"        || job || Ns || Nc)}
//   server -> client  AUTH_OK   {HMAC(K, "weft-auth-server-v1" || job || Ns || Nc)}
// Fresh nonces on both sides defeat replay; the distinct labels stop a server's proof from being
// reflected as a client's. This authenticates admission only: later bytes on the connection (and
// UCX traffic) are neither authenticated nor encrypted.
#pragma once

#include "dist/Wire.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>

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

/// Server side of the handshake on a connected socket: returns once the client proved it holds
/// the secret, else throws ("bad HMAC ...", a wire error, a timeout). It is sendChallenge, a
/// blocking read of the answer, and checkAnswer.
void serverHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline);
/// The server's handshake in steps, for a server that reads many connections' answers in one
/// loop: sendChallenge writes the CHALLENGE and returns its nonce; checkAnswer takes the frame
/// the client answered with (at most kAuthAnswerBytes of payload) and, if it proves the secret,
/// writes AUTH_OK; otherwise it tells the client why (REFUSED) and throws.
Nonce sendChallenge(int fd, const JobId& job, Deadline deadline);
/// AUTH is two 32-byte fields; an unauthenticated peer must not make the server allocate more.
inline constexpr uint32_t kAuthAnswerBytes = 64;
void checkAnswer(int fd, const Secret& secret, const JobId& job, const Nonce& challenge, const Frame& answer,
                 Deadline deadline);
/// Client side: returns once the server accepted us and proved it holds the secret too, else
/// throws (refused by the server with its reason, a wrong server proof, a wire error, a timeout).
void clientHandshake(int fd, const Secret& secret, const JobId& job, Deadline deadline);

}  // namespace weft::dist
