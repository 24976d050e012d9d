// The messages between workers and parameter servers, carried as UCX active messages: a fixed
// header (little-endian, validated field by field before use) and a payload whose layout the
// request kind fixes. Every request names a partition and carries the worker's clock for it
// (how many gradients the worker has pushed to it), so a server can serve the version a worker
// needs (BSP now; SSP bounds later).
//
//   PullRows  payload: n i64 row ids, local to the partition      reply: those rows
//   PullAll   payload: none                                       reply: the partition
//   Push      dense: the partition's gradient; sparse: u64 n, n i64 local row ids, n rows
//             reply (when every worker has pushed): f64 squared norm of the aggregated gradient
//   Apply     payload: the update's extra inputs (worker 0)      reply: none needed, an ack
//   Load      payload: the partition, then each optimizer slot    reply: ack
//   Fetch     payload: none                                       reply: as Load's payload
//   Goodbye   payload: none (the worker leaves the job)           reply: ack
// A reply echoes the request id; status 0 is success, otherwise the payload is the server's
// error message. With Config::wireDType bf16 or f16, the rows of f32 variables in PullRows,
// PullAll and Push travel in 16 bits (dist/server/WireRows.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace weft::dist {

enum class RequestKind : uint8_t { PullRows = 1, PullAll, Push, Apply, Load, Fetch, Goodbye };
const char* requestKindName(RequestKind kind);

struct RequestHeader {
  RequestKind kind = RequestKind::PullAll;
  uint32_t partition = 0;
  uint32_t worker = 0;  ///< the sender's worker rank
  uint64_t id = 0;      ///< echoed by the reply
  uint64_t clock = 0;   ///< the gradients this worker has pushed to the partition before this request
};

struct ReplyHeader {
  uint64_t id = 0;
  uint32_t status = 0;  ///< 0: done; otherwise the payload is an error message
};

constexpr size_t kRequestHeaderBytes = 32;
constexpr size_t kReplyHeaderBytes = 16;

std::vector<uint8_t> encode(const RequestHeader& h);
std::vector<uint8_t> encode(const ReplyHeader& h);
/// Throws a message naming the field when the bytes are not a valid header.
RequestHeader decodeRequest(std::span<const uint8_t> bytes);
ReplyHeader decodeReply(std::span<const uint8_t> bytes);
/// Whether the bytes start like a request (or else like a reply).
bool isRequest(std::span<const uint8_t> bytes);

/// The row ids of a PULL_ROWS payload, each checked against the partition's `rows`; throws
/// naming the bad size or id.
std::vector<int64_t> pullRowIds(std::span<const uint8_t> payload, int64_t rows);
/// Checks a sparse PUSH payload (count, ids within `rows`, rows of `rowBytes`); returns its ids.
std::vector<int64_t> sparsePushRowIds(std::span<const uint8_t> payload, int64_t rows, size_t rowBytes);

}  // namespace weft::dist
