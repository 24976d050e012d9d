// The control-plane wire format: schema'd binary messages in frames, read from sockets with
// deadlines. A frame is a fixed 28-byte header {magic "WEFT", version u16, type u16, job id (16
// bytes), payload length u32} and the payload; all integers are little-endian. Payloads are
// written field by field by WireWriter and read back by WireReader, which checks every length
// against the bytes that remain before it reads, so a hostile or truncated message is an error
// naming the field, never an over-read or a huge allocation. Nothing is ever deserialised into
// code: a message type is an enum value and a payload is plain fields.
#pragma once

#include "core/Error.h"
#include "core/Shape.h"
#include "dist/transport/Deadline.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

/// Identifies a job; every frame carries it, so frames of another job are refused.
using JobId = std::array<uint8_t, 16>;

/// Lower-case hex of some bytes (job ids and secrets in messages and files).
std::string toHex(std::span<const uint8_t> bytes);

/// The message types of the control plane (the wire value is the enum value).
enum class MessageType : uint16_t {
  Challenge = 1,    ///< server -> client: server_nonce[32]
  Auth = 2,         ///< client -> server: client_nonce[32], client_mac[32]
  AuthOk = 3,       ///< server -> client: server_mac[32]
  Refused = 4,      ///< server -> client: reason (string); the connection is closed after it
  Join = 5,         ///< member -> coordinator: role, host, slot, transport_address, nccl_id
  Roster = 6,       ///< coordinator -> member: rank, world_size, members[], nccl_id
  Abort = 7,        ///< coordinator -> member: reason (string)
  Heartbeat = 8,    ///< member -> coordinator after the roster, every second: progress u64, waiting u8, main_thread u8
  Leave = 9,        ///< member -> coordinator: it finished its part; its connection closing next is no failure
  Checkpoint = 10,  ///< coordinator -> member after the roster: stop at a checkpoint (the job is resized), reason
};
/// "CHALLENGE", "AUTH", ...; "type N" for a value that is not a message type.
std::string messageTypeName(uint16_t type);
inline std::string messageTypeName(MessageType type) { return messageTypeName(static_cast<uint16_t>(type)); }

inline constexpr uint32_t kWireMagic = 0x54464557;  // the bytes 'W' 'E' 'F' 'T' in little-endian order
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 28;
inline constexpr uint32_t kMaxControlPayload = 64u << 20;  ///< default frame payload limit
inline constexpr uint32_t kMaxStringBytes = 64u << 10;     ///< strings are names and reasons
inline constexpr uint32_t kMaxShapeRank = 64;

/// Builds a payload field by field.
class WireWriter {
 public:
  void putU8(uint8_t v) { bytes_.push_back(v); }
  void putU16(uint16_t v) { putLittleEndian(v, 2); }
  void putU32(uint32_t v) { putLittleEndian(v, 4); }
  void putU64(uint64_t v) { putLittleEndian(v, 8); }
  void putI64(int64_t v) { putLittleEndian(static_cast<uint64_t>(v), 8); }
  /// Bytes whose length the schema fixes (nonces, MACs): no length prefix.
  void putFixed(std::span<const uint8_t> bytes) { bytes_.insert(bytes_.end(), bytes.begin(), bytes.end()); }
  /// A u32 length, then the bytes.
  void putBytes(std::span<const uint8_t> bytes);
  /// A u32 length, then the UTF-8 bytes.
  void putString(const std::string& s);
  /// The rank (u32), then each dimension (i64; -1 = unknown).
  void putShape(const Shape& shape);

  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  void putLittleEndian(uint64_t v, int width);
  std::vector<uint8_t> bytes_;
};

/// Reads a payload field by field; `message` (the type's name) and each field's name appear in
/// every error, e.g. "message JOIN: field 'transport_address' claims 70000 bytes, 12 remain".
class WireReader {
 public:
  WireReader(std::span<const uint8_t> bytes, std::string message) : bytes_(bytes), message_(std::move(message)) {}

  uint8_t getU8(const char* field);
  uint16_t getU16(const char* field);
  uint32_t getU32(const char* field);
  uint64_t getU64(const char* field);
  int64_t getI64(const char* field);
  /// Exactly N bytes (the schema's fixed size).
  template <size_t N>
  std::array<uint8_t, N> getFixed(const char* field) {
    std::array<uint8_t, N> out{};
    const std::span<const uint8_t> src = take(field, N);
    std::copy(src.begin(), src.end(), out.begin());
    return out;
  }
  /// A length-prefixed byte string of at most maxLength bytes.
  std::vector<uint8_t> getBytes(const char* field, uint32_t maxLength = kMaxControlPayload);
  /// A length-prefixed string of at most kMaxStringBytes.
  std::string getString(const char* field);
  /// A rank of at most kMaxShapeRank and dimensions >= -1.
  Shape getShape(const char* field);
  /// An element count for a list whose elements take at least minElementBytes each: a count the
  /// remaining bytes cannot hold is refused before anything is allocated for it.
  uint32_t getCount(const char* field, size_t minElementBytes);
  /// Throws unless every byte was read.
  void finish() const;

  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::span<const uint8_t> take(const char* field, size_t n);
  uint64_t getLittleEndian(const char* field, int width);

  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
  std::string message_;
};

/// A received frame. Its header was validated; its payload is not parsed yet.
struct Frame {
  MessageType type{};
  std::vector<uint8_t> payload;
  /// A reader over the payload that names this frame's type in its errors.
  WireReader reader() const { return WireReader(payload, messageTypeName(type)); }
};

/// Owns a file descriptor (a socket, a pipe end): closed on destruction, movable, not copyable.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.release()) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// The peer closed the connection or reset it (a read found its end, a write found it gone):
/// the failure a caller may try again on a new connection, unlike a refusal or a bad frame.
class ConnectionClosed : public Error {
 public:
  using Error::Error;
};

/// Reads one frame before `deadline`. Refuses, naming what is wrong: a bad magic or version, an
/// unknown type, a frame of another job (both job ids in hex), a payload over `maxPayload`, the
/// peer closing early (ConnectionClosed), a socket error, or the deadline passing.
Frame readFrame(int fd, Deadline deadline, const JobId& expectedJob, uint32_t maxPayload = kMaxControlPayload);
/// Reads one frame at a time from a socket as its bytes arrive, for a loop that serves many
/// connections at once and cannot wait on any one (the coordinator's admissions): each call
/// takes what the socket holds now. The header is checked as readFrame checks it once it is
/// whole, so nothing is allocated for a payload over `maxPayload`.
class FrameAssembler {
 public:
  FrameAssembler(const JobId& expectedJob, uint32_t maxPayload) : job_(expectedJob), maxPayload_(maxPayload) {}
  /// The frame once its last byte arrived; nullopt while the socket has no more for now. Throws
  /// as readFrame does: ConnectionClosed for the peer's end, an error naming a bad header.
  std::optional<Frame> receive(int fd);

 private:
  JobId job_;
  uint32_t maxPayload_;
  std::array<uint8_t, kFrameHeaderBytes> header_{};
  Frame frame_;
  size_t got_ = 0;
};

/// The bytes of one frame: header, then payload.
std::vector<uint8_t> encodeFrame(MessageType type, const JobId& job, std::span<const uint8_t> payload);
/// Writes one frame before `deadline` (never raises SIGPIPE; a closed peer is ConnectionClosed).
void writeFrame(int fd, MessageType type, const JobId& job, std::span<const uint8_t> payload, Deadline deadline);

/// Throws unless `frame` is of type `expected`: a REFUSED frame becomes an error carrying the
/// peer's reason ("refused by the peer: ..."), any other type an error naming both types.
void expectType(const Frame& frame, MessageType expected);
/// Best effort: tells the peer why it is being turned away (a REFUSED frame); never throws, so
/// it can be called while handling another error.
void sendRefusal(int fd, const JobId& job, const std::string& reason);

/// Waits until the socket is ready for poll `events` (POLLIN, POLLOUT); false once the deadline
/// passed first.
bool waitReady(int fd, short events, Deadline deadline);
/// Milliseconds left until `deadline` (0 once it passed), for poll().
int millisecondsUntil(Deadline deadline);

}  // namespace weft::dist
