// The data plane's proof of origin. Admission (dist/transport/Auth.h) proves that a process holds the job
// secret; this proves, for every message the processes then exchange over UCX, who sent it, to
// whom, and that it is new. Without it any process that can reach a worker's or a server's UCX
// address could inject requests, replies and collective data.
//
// Every endpoint of a job has a name: the member (role, host, slot) and which of its transports
// (a worker has one for collectives and one for requests to the servers). Each ordered pair of
// endpoints has its own key, derived from the job secret and the job id:
//   K(from -> to) = HMAC-SHA256(secret, "weft-data-v1" || job || from || to)
// A message carries a seal: the sender's name, a counter that the sender never reuses towards
// that receiver, and two GMACs (AES-256-GCM without plaintext) under K(from -> to), with IVs
// (counter, 0) and (counter, 1): one over the seal's fields and the protocol header, checked
// before anything is fetched or allocated, one over the payload, checked once it has arrived.
// The receiver accepts a counter once (a window of recent counters, as IPsec keeps, because
// UCX does not order a small message behind a large one). A job id is never reused, so neither
// is a (key, IV) pair.
//
// A job that encrypts (ResourceSpec "encrypt", --encrypt) sends every payload as AES-256-GCM
// ciphertext instead, under the same key and IV (counter, 1), whose tag is the payload MAC: the
// seal's `encrypted` flag (covered by the header MAC) says so. The seal and the protocol headers
// (message kinds, partition and row counts, tags) stay in the clear.
#pragma once

#include "dist/transport/Auth.h"
#include "dist/transport/Message.h"

#include <array>
#include <bitset>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

struct evp_cipher_ctx_st;

namespace weft::dist {

/// The name (role: 8 bits, transport: 8, host: 24, slot: 24) of transport `channel` (0: collectives or a server's only
/// one, 1: a worker's requests to the servers) of the member with this role, host and slot.
EndpointName endpointName(uint8_t role, int host, int slot, uint8_t channel);
/// "endpoint 1 of worker 2 of host 0", for messages.
std::string describeEndpoint(EndpointName name);

using MacTag = std::array<uint8_t, 16>;
using DataKey = std::array<uint8_t, 32>;

/// The key of messages from `from` to `to` in job `job`.
DataKey dataKey(const Secret& secret, const JobId& job, EndpointName from, EndpointName to);

/// AES-256-GCM under one key, its key schedule computed once: GMACs of byte sequences, and
/// payloads encrypted and decrypted in place (a job that encrypts).
class Gmac {
 public:
  explicit Gmac(const DataKey& key);
  ~Gmac();
  Gmac(const Gmac&) = delete;
  Gmac& operator=(const Gmac&) = delete;

  /// The tag of `parts` (in order) with IV (counter, part).
  MacTag compute(uint64_t counter, uint32_t part, std::initializer_list<std::span<const uint8_t>> parts);
  /// Whether `tag` is that tag (compared in constant time).
  bool verify(const MacTag& tag, uint64_t counter, uint32_t part,
              std::initializer_list<std::span<const uint8_t>> parts);
  /// Encrypts `bytes` in place with IV (counter, part); returns the tag of the ciphertext.
  MacTag encrypt(uint64_t counter, uint32_t part, std::span<uint8_t> bytes);
  /// Decrypts `bytes` in place when `tag` is the tag of that ciphertext; false (the bytes then
  /// garbage) when it is not.
  bool decrypt(const MacTag& tag, uint64_t counter, uint32_t part, std::span<uint8_t> bytes);

 private:
  evp_cipher_ctx_st* context_;
};

/// Which counters a receiver has accepted from one sender: each at most once, and none older
/// than the window below the highest seen.
class ReplayWindow {
 public:
  static constexpr uint64_t kWidth = 4096;
  /// Accepts `counter` (and remembers it) unless it was seen before or is too old; counter 0 is
  /// never valid.
  bool accept(uint64_t counter);

 private:
  uint64_t highest_ = 0;
  std::bitset<kWidth> seen_;  // bit (c % kWidth) for counters in (highest - kWidth, highest]
};

/// The seal in front of every UCX active message of a job (all integers little-endian):
///   magic u32 "WFTS", kind u8, encrypted u8 (0 or 1), padding u8[2], sender u64, counter u64, tag u64,
///   payload_length u64, header_mac u8[16], payload_mac u8[16]
/// followed by the protocol's own header (none for tagged data).
struct Seal {
  enum Kind : uint8_t { Request = 0, Tagged = 1 };
  Kind kind = Request;
  bool encrypted = false;  ///< the payload is ciphertext and payloadMac its GCM tag
  EndpointName sender = 0;
  uint64_t counter = 0;
  uint64_t tag = 0;  ///< a tagged message's tag; 0 for requests and replies
  uint64_t payloadLength = 0;
  MacTag headerMac{};
  MacTag payloadMac{};

  static constexpr size_t kBytes = 72;
  /// The bytes the header MAC covers: everything before the MACs.
  static constexpr size_t kCoveredBytes = 40;
  void encodeInto(std::span<uint8_t, kBytes> out) const;
  /// Throws naming the field when `bytes` do not start with a well-formed seal.
  static Seal decode(std::span<const uint8_t> bytes);
  /// Whether decode() would succeed: the check a receiver makes on what strangers send, at the
  /// cost of a few comparisons, no exception and no message.
  static bool wellFormed(std::span<const uint8_t> bytes);
};

}  // namespace weft::dist
