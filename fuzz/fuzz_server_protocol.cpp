// Fuzz target: the parameter-server protocol (dist/server/ServerProtocol.h and ParameterServer::handle).
// The input is a run of messages, each a u8 header length, the header, a u16 payload length and
// the payload, handed in order to a fresh server holding an embedding for two workers; every
// reply it releases must have a header that decodes. The header and payload parsers are also
// run on their own.
#include "dist/server/ParameterServer.h"
#include "fuzz/Fuzz.h"
#include "optim/Optimizer.h"

#include <cstdlib>
#include <cstring>

namespace {

using namespace weft;
using namespace weft::dist;

constexpr int64_t kRows = 6, kWidth = 3;

struct Model {
  Graph g;
  ServerPlan plan;
  Model() {
    const Output ids = g.placeholder("ids", i32, {4});
    const Output emb = g.variable("emb", f32, {kRows, kWidth}, Initializer::normal(0, 1));
    const Output w = g.variable("w", f32, {kWidth, 2}, Initializer::normal(0, 1));
    optim::SGD(0.5f).minimize(sum(square(matmul(gather(emb, ids), w))));
    plan = planServers(g, Architecture::Auto, 1, {size_t{1} << 20});
  }
};

const Model& model() {
  static const Model m;
  return m;
}

std::string bytesOf(const void* p, size_t n) { return {static_cast<const char*>(p), n}; }

std::string message(RequestKind kind, uint32_t worker, uint64_t clock, const std::string& payload) {
  static uint64_t id = 0;
  const std::vector<uint8_t> h = encode(RequestHeader{kind, 0, worker, ++id, clock});
  return std::string(1, static_cast<char>(h.size())) + std::string(h.begin(), h.end()) +
         weft::fuzz::littleEndian(payload.size(), 2) + payload;
}

}  // namespace

std::vector<std::string> weftFuzzSeeds() {
  const std::vector<float> table(kRows * kWidth, 0.25f), row(kWidth, 1.0f);
  const std::string rows = bytesOf(table.data(), table.size() * 4);
  const int64_t ids[2] = {0, 2};
  std::string push = weft::fuzz::littleEndian(1, 8) + weft::fuzz::littleEndian(1, 8) + bytesOf(row.data(), kWidth * 4);
  std::string run = message(RequestKind::Load, 0, 0, rows) + message(RequestKind::PullRows, 0, 0, bytesOf(ids, 16)) +
                    message(RequestKind::PullRows, 1, 0, bytesOf(ids, 16)) + message(RequestKind::Push, 0, 0, push) +
                    message(RequestKind::Push, 1, 0, push) + message(RequestKind::Apply, 0, 1, "") +
                    message(RequestKind::PullAll, 1, 1, "") + message(RequestKind::Fetch, 0, 1, "") +
                    message(RequestKind::Goodbye, 0, 1, "") + message(RequestKind::Goodbye, 1, 1, "");
  return {run, message(RequestKind::Load, 0, 0, rows) + message(RequestKind::PullAll, 0, 0, ""),
          message(RequestKind::PullRows, 1, 0, bytesOf(ids, 16))};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Model& m = model();
  const std::span<const uint8_t> all(data, size);
  // The parsers alone, on the input as a header and as payloads.
  weft::fuzz::refusalsAllowed([&] { decodeRequest(all.first(std::min(size, kRequestHeaderBytes))); });
  weft::fuzz::refusalsAllowed([&] { decodeReply(all.first(std::min(size, kReplyHeaderBytes))); });
  weft::fuzz::refusalsAllowed([&] { pullRowIds(all, kRows); });
  weft::fuzz::refusalsAllowed([&] { sparsePushRowIds(all, kRows, kWidth * 4); });

  ParameterServer server(m.plan, 0,
                         {.workers = 2, .denseScale = 0.5, .sparseScale = 0.5, .session = {1, false}, .groups = {}});
  size_t at = 0;
  for (int k = 0; k < 32 && at < size; ++k) {
    Message msg;
    const size_t claimed = data[at++];
    const size_t headerBytes = std::min(claimed, size - at);
    msg.header.assign(data + at, data + at + headerBytes);
    at += headerBytes;
    size_t payloadBytes = 0;
    if (at + 2 <= size) payloadBytes = std::min<size_t>(data[at] | size_t{data[at + 1]} << 8, size - at - 2);
    at = std::min(size, at + 2);
    msg.payload.assign(data + at, data + at + payloadBytes);
    at += payloadBytes;
    std::vector<ParameterServer::Reply> replies;
    weft::fuzz::refusalsAllowed([&] { replies = server.handle(msg); });
    for (const ParameterServer::Reply& reply : replies) {
      try {
        decodeReply(reply.header);
      } catch (const Error&) {
        std::abort();  // the server's own replies must decode
      }
    }
  }
  return 0;
}
