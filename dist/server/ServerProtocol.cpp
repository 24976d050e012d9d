// Parameter-server message headers (see the header).
#include "dist/server/ServerProtocol.h"

#include "core/Error.h"
#include "dist/transport/Wire.h"
#include "ops/RowIds.h"

#include <cstring>

namespace weft::dist {

namespace {

// "WPSQ" and "WPSR" in little-endian byte order.
constexpr uint32_t kRequestMagic = 0x51535057;
constexpr uint32_t kReplyMagic = 0x52535057;

uint32_t magicOf(std::span<const uint8_t> bytes) {
  if (bytes.size() < 4) return 0;
  return uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 | uint32_t{bytes[3]} << 24;
}

/// Checks a header's size and magic before any field is read.
void checkHeader(std::span<const uint8_t> bytes, size_t expected, uint32_t magic, const char* what) {
  WEFT_CHECK(bytes.size() == expected, "{}: the header has {} bytes, expected {}", what, bytes.size(), expected);
  WEFT_CHECK(magicOf(bytes) == magic, "{}: bad magic {:#x}", what, magicOf(bytes));
}

/// `count` i64 row ids at `offset`, each checked against the partition's rows.
std::vector<int64_t> readRowIds(std::span<const uint8_t> bytes, size_t offset, size_t count, int64_t rows) {
  std::vector<int64_t> ids(count);
  if (count > 0) std::memcpy(ids.data(), bytes.data() + offset, count * sizeof(int64_t));
  return checkedRowIds(ids, rows, "partition row id");
}

}  // namespace

std::vector<int64_t> pullRowIds(std::span<const uint8_t> payload, int64_t rows) {
  WEFT_CHECK(payload.size() % 8 == 0, "PULL_ROWS carries {} bytes, not a whole number of i64 ids", payload.size());
  return readRowIds(payload, 0, payload.size() / 8, rows);
}

std::vector<int64_t> sparsePushRowIds(std::span<const uint8_t> payload, int64_t rows, size_t rowBytes) {
  WEFT_CHECK(payload.size() >= 8, "a sparse PUSH needs a row count, got {} bytes", payload.size());
  uint64_t n = 0;
  std::memcpy(&n, payload.data(), sizeof n);
  WEFT_CHECK(n <= (payload.size() - 8) / (8 + rowBytes) && payload.size() == 8 + n * (8 + rowBytes),
             "a sparse PUSH of {} rows of {} bytes carries {} bytes", n, rowBytes, payload.size());
  return readRowIds(payload, 8, n, rows);
}

const char* requestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::PullRows: return "PULL_ROWS";
    case RequestKind::PullAll: return "PULL_ALL";
    case RequestKind::Push: return "PUSH";
    case RequestKind::Apply: return "APPLY";
    case RequestKind::Load: return "LOAD";
    case RequestKind::Fetch: return "FETCH";
    case RequestKind::Goodbye: return "GOODBYE";
  }
  return "?";
}

std::vector<uint8_t> encode(const RequestHeader& h) {
  WireWriter w;
  w.putU32(kRequestMagic);
  w.putU8(static_cast<uint8_t>(h.kind));
  w.putFixed(std::array<uint8_t, 3>{});
  w.putU32(h.partition);
  w.putU32(h.worker);
  w.putU64(h.id);
  w.putU64(h.clock);
  return w.take();
}

std::vector<uint8_t> encode(const ReplyHeader& h) {
  WireWriter w;
  w.putU32(kReplyMagic);
  w.putU32(h.status);
  w.putU64(h.id);
  return w.take();
}

bool isRequest(std::span<const uint8_t> bytes) { return magicOf(bytes) == kRequestMagic; }

RequestHeader decodeRequest(std::span<const uint8_t> bytes) {
  checkHeader(bytes, kRequestHeaderBytes, kRequestMagic, "server request");
  WireReader r(bytes, "server request");
  r.getU32("magic");
  RequestHeader h;
  const uint8_t kind = r.getU8("kind");
  WEFT_CHECK(kind >= static_cast<uint8_t>(RequestKind::PullRows) && kind <= static_cast<uint8_t>(RequestKind::Goodbye),
             "server request: unknown kind {}", kind);
  h.kind = static_cast<RequestKind>(kind);
  r.getFixed<3>("padding");
  h.partition = r.getU32("partition");
  h.worker = r.getU32("worker");
  h.id = r.getU64("id");
  h.clock = r.getU64("clock");
  return h;
}

ReplyHeader decodeReply(std::span<const uint8_t> bytes) {
  checkHeader(bytes, kReplyHeaderBytes, kReplyMagic, "server reply");
  WireReader r(bytes, "server reply");
  r.getU32("magic");
  ReplyHeader h;
  h.status = r.getU32("status");
  h.id = r.getU64("id");
  return h;
}

}  // namespace weft::dist
