// Payload encoding, bounds-checked decoding, and frame I/O over sockets with poll() deadlines.
#include "dist/transport/Wire.h"

#include "core/Error.h"
#include "core/Escape.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace weft::dist {

std::string toHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::string messageTypeName(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::Challenge: return "CHALLENGE";
    case MessageType::Auth: return "AUTH";
    case MessageType::AuthOk: return "AUTH_OK";
    case MessageType::Refused: return "REFUSED";
    case MessageType::Join: return "JOIN";
    case MessageType::Roster: return "ROSTER";
    case MessageType::Abort: return "ABORT";
    case MessageType::Heartbeat: return "HEARTBEAT";
    case MessageType::Leave: return "LEAVE";
    case MessageType::Checkpoint:
      return "CHECKPOINT";
  }
  return fmt::format("type {}", type);
}

// ---- WireWriter ----

void WireWriter::putLittleEndian(uint64_t v, int width) {
  for (int i = 0; i < width; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void WireWriter::putBytes(std::span<const uint8_t> bytes) {
  WEFT_CHECK(bytes.size() <= kMaxControlPayload, "cannot encode a byte field of {} bytes (limit {})", bytes.size(),
             kMaxControlPayload);
  putU32(static_cast<uint32_t>(bytes.size()));
  putFixed(bytes);
}

void WireWriter::putString(const std::string& s) {
  WEFT_CHECK(s.size() <= kMaxStringBytes, "cannot encode a string of {} bytes (limit {})", s.size(), kMaxStringBytes);
  putBytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

void WireWriter::putShape(const Shape& shape) {
  WEFT_CHECK(static_cast<uint32_t>(shape.rank()) <= kMaxShapeRank, "cannot encode shape {}: rank over {}", shape.str(),
             kMaxShapeRank);
  putU32(static_cast<uint32_t>(shape.rank()));
  for (int64_t d : shape.dims()) putI64(d);
}

// ---- WireReader ----

std::span<const uint8_t> WireReader::take(const char* field, size_t n) {
  WEFT_CHECK(n <= remaining(), "message {}: field '{}' needs {} bytes, {} remain", message_, field, n, remaining());
  const std::span<const uint8_t> out = bytes_.subspan(offset_, n);
  offset_ += n;
  return out;
}

uint64_t WireReader::getLittleEndian(const char* field, int width) {
  const std::span<const uint8_t> src = take(field, static_cast<size_t>(width));
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = (v << 8) | src[static_cast<size_t>(i)];
  return v;
}

uint8_t WireReader::getU8(const char* field) { return static_cast<uint8_t>(getLittleEndian(field, 1)); }
uint16_t WireReader::getU16(const char* field) { return static_cast<uint16_t>(getLittleEndian(field, 2)); }
uint32_t WireReader::getU32(const char* field) { return static_cast<uint32_t>(getLittleEndian(field, 4)); }
uint64_t WireReader::getU64(const char* field) { return getLittleEndian(field, 8); }
int64_t WireReader::getI64(const char* field) { return static_cast<int64_t>(getLittleEndian(field, 8)); }

std::vector<uint8_t> WireReader::getBytes(const char* field, uint32_t maxLength) {
  const uint32_t length = getU32(field);
  WEFT_CHECK(length <= maxLength, "message {}: field '{}' claims {} bytes, over its {}-byte limit", message_, field,
             length, maxLength);
  WEFT_CHECK(length <= remaining(), "message {}: field '{}' claims {} bytes, {} remain", message_, field, length,
             remaining());
  const std::span<const uint8_t> src = take(field, length);
  return {src.begin(), src.end()};
}

std::string WireReader::getString(const char* field) {
  const std::vector<uint8_t> bytes = getBytes(field, kMaxStringBytes);
  return {bytes.begin(), bytes.end()};
}

Shape WireReader::getShape(const char* field) {
  const uint32_t rank = getU32(field);
  WEFT_CHECK(rank <= kMaxShapeRank, "message {}: field '{}' has rank {}, over the limit of {}", message_, field, rank,
             kMaxShapeRank);
  WEFT_CHECK(rank * 8ull <= remaining(), "message {}: field '{}' claims rank {} ({} bytes), {} remain", message_, field,
             rank, rank * 8ull, remaining());
  std::vector<int64_t> dims;
  for (uint32_t i = 0; i < rank; ++i) {
    dims.push_back(getI64(field));
    WEFT_CHECK(dims.back() >= -1, "message {}: field '{}' dimension {} is {}", message_, field, i, dims.back());
  }
  return Shape(std::move(dims));
}

uint32_t WireReader::getCount(const char* field, size_t minElementBytes) {
  const uint32_t count = getU32(field);
  WEFT_CHECK(count * static_cast<uint64_t>(minElementBytes) <= remaining(),
             "message {}: field '{}' claims {} entries of at least {} bytes, {} bytes remain", message_, field, count,
             minElementBytes, remaining());
  return count;
}

void WireReader::finish() const {
  WEFT_CHECK(remaining() == 0, "message {}: {} trailing bytes after the last field", message_, remaining());
}

// ---- FileDescriptor ----

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

int FileDescriptor::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void FileDescriptor::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

// ---- frame I/O ----

int millisecondsUntil(Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

bool waitReady(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, millisecondsUntil(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) WEFT_THROW("poll failed: {}", std::strerror(errno));
    if (n == 0 && Clock::now() >= deadline) return false;
  }
}

namespace {

// Receives exactly buffer.size() bytes; `what` names them in errors.
void receiveAll(int fd, std::span<uint8_t> buffer, Deadline deadline, const std::string& what) {
  size_t got = 0;
  while (got < buffer.size()) {
    const ssize_t n = ::recv(fd, buffer.data() + got, buffer.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      throw ConnectionClosed(
          fmt::format("connection closed by the peer after {} of {} bytes of {}", got, buffer.size(), what));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WEFT_CHECK(waitReady(fd, POLLIN, deadline), "timed out: {} of {} bytes of {} arrived before the deadline", got,
                 buffer.size(), what);
    } else if (errno == ECONNRESET) {
      throw ConnectionClosed(fmt::format("reading {} failed: {}", what, std::strerror(errno)));
    } else if (errno != EINTR) {
      WEFT_THROW("reading {} failed: {}", what, std::strerror(errno));
    }
  }
}

void sendAll(int fd, std::span<const uint8_t> bytes, Deadline deadline, const std::string& what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WEFT_CHECK(waitReady(fd, POLLOUT, deadline), "timed out sending {}: {} of {} bytes sent before the deadline",
                 what, sent, bytes.size());
    } else if (errno == EPIPE || errno == ECONNRESET) {
      throw ConnectionClosed(fmt::format("sending {} failed: {}", what, std::strerror(errno)));
    } else if (errno != EINTR) {
      WEFT_THROW("sending {} failed: {}", what, std::strerror(errno));
    }
  }
}

bool isMessageType(uint16_t type) {
  return type >= static_cast<uint16_t>(MessageType::Challenge) &&
         type <= static_cast<uint16_t>(MessageType::Checkpoint);
}

}  // namespace

namespace {

/// Checks a frame header and returns the frame it announces, its payload sized but not read.
Frame announcedFrame(std::span<const uint8_t> header, const JobId& expectedJob, uint32_t maxPayload) {
  WireReader r(header, "frame header");
  const uint32_t magic = r.getU32("magic");
  WEFT_CHECK(magic == kWireMagic, "bad frame magic 0x{:08x} (expected 0x{:08x}, \"WEFT\"): not a weft peer", magic,
             kWireMagic);
  const uint16_t version = r.getU16("version");
  WEFT_CHECK(version == kWireVersion, "frame version {} is not supported (this build speaks version {})", version,
             kWireVersion);
  const uint16_t type = r.getU16("type");
  WEFT_CHECK(isMessageType(type), "frame type {} is not a weft message type", type);
  const JobId job = r.getFixed<16>("job_id");
  WEFT_CHECK(job == expectedJob, "frame {} belongs to job {}, expected job {}", messageTypeName(type), toHex(job),
             toHex(expectedJob));
  const uint32_t length = r.getU32("payload_length");
  WEFT_CHECK(length <= maxPayload, "frame {} claims a payload of {} bytes, over the {}-byte limit",
             messageTypeName(type), length, maxPayload);
  return Frame{static_cast<MessageType>(type), std::vector<uint8_t>(length)};
}

}  // namespace

Frame readFrame(int fd, Deadline deadline, const JobId& expectedJob, uint32_t maxPayload) {
  std::array<uint8_t, kFrameHeaderBytes> header{};
  receiveAll(fd, header, deadline, "a frame header");
  Frame frame = announcedFrame(header, expectedJob, maxPayload);
  receiveAll(fd, frame.payload, deadline, "the payload of frame " + messageTypeName(frame.type));
  return frame;
}

std::optional<Frame> FrameAssembler::receive(int fd) {
  for (;;) {
    const bool inHeader = got_ < kFrameHeaderBytes;
    const std::span<uint8_t> into = inHeader ? std::span<uint8_t>(header_).subspan(got_)
                                             : std::span<uint8_t>(frame_.payload).subspan(got_ - kFrameHeaderBytes);
    if (!inHeader && into.empty()) {
      got_ = 0;
      return std::move(frame_);
    }
    const ssize_t n = ::recv(fd, into.data(), into.size(), MSG_DONTWAIT);
    if (n > 0) {
      got_ += static_cast<size_t>(n);
      if (inHeader && got_ == kFrameHeaderBytes) frame_ = announcedFrame(header_, job_, maxPayload_);
    } else if (n == 0) {
      throw ConnectionClosed(fmt::format("connection closed by the peer after {} bytes of a frame", got_));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return std::nullopt;
    } else if (errno == ECONNRESET) {
      throw ConnectionClosed(fmt::format("reading a frame failed: {}", std::strerror(errno)));
    } else if (errno != EINTR) {
      WEFT_THROW("reading a frame failed: {}", std::strerror(errno));
    }
  }
}

std::vector<uint8_t> encodeFrame(MessageType type, const JobId& job, std::span<const uint8_t> payload) {
  WEFT_CHECK(payload.size() <= UINT32_MAX, "frame {}: a payload of {} bytes does not fit the 32-bit length field",
             messageTypeName(type), payload.size());
  WireWriter w;
  w.putU32(kWireMagic);
  w.putU16(kWireVersion);
  w.putU16(static_cast<uint16_t>(type));
  w.putFixed(job);
  w.putU32(static_cast<uint32_t>(payload.size()));
  w.putFixed(payload);
  return w.take();
}

void writeFrame(int fd, MessageType type, const JobId& job, std::span<const uint8_t> payload, Deadline deadline) {
  sendAll(fd, encodeFrame(type, job, payload), deadline, "frame " + messageTypeName(type));
}

void expectType(const Frame& frame, MessageType expected) {
  if (frame.type == expected) return;
  if (frame.type == MessageType::Refused) {
    WireReader r = frame.reader();
    const std::string reason = r.getString("reason");
    r.finish();
    WEFT_THROW("refused by the peer: {}", escapeBytes(reason, kMaxStringBytes));
  }
  WEFT_THROW("expected a {} frame, got {}", messageTypeName(expected), messageTypeName(frame.type));
}

void sendRefusal(int fd, const JobId& job, const std::string& reason) {
  try {
    WireWriter w;
    w.putString(reason.substr(0, kMaxStringBytes));
    writeFrame(fd, MessageType::Refused, job, w.bytes(), Clock::now() + std::chrono::milliseconds(500));
  } catch (const Error&) {
    // The peer is being dropped anyway; the caller reports the original reason.
  }
}

}  // namespace weft::dist
