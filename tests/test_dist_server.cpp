// The parameter-server placement plan and the server's rules, in one process: requests are
// handed to ParameterServer::handle as they would arrive over UCX, and the replies it releases
// are checked against values computed here by plain loops.
#include "tests/TestUtil.h"

#include "dist/ParameterServer.h"
#include "dist/Placement.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <cstring>

using namespace weft;
using namespace weft::dist;

namespace {

constexpr int64_t kRows = 10, kWidth = 3;
constexpr float kLearningRate = 0.5f;

/// An embedding (sparse gradient) and a dense weight, trained by plain SGD.
struct Model {
  Graph g;
  Output emb, w;
  explicit Model(double clip = 0) {
    const Output ids = g.placeholder("ids", i32, {4});
    emb = g.variable("emb", f32, {kRows, kWidth}, Initializer::normal(0, 1));
    w = g.variable("w", f32, {kWidth, 2}, Initializer::normal(0, 1));
    optim::SGD(kLearningRate).minimize(sum(square(matmul(gather(emb, ids), w))), {clip, {}, std::nullopt});
  }
};

template <class T>
std::vector<uint8_t> bytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <class T>
std::vector<T> valuesOf(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

UcxTransport::Message request(RequestKind kind, uint32_t worker, uint64_t clock, std::vector<uint8_t> payload = {},
                              uint32_t partition = 0) {
  static uint64_t id = 0;
  return {encode(RequestHeader{kind, partition, worker, ++id, clock}), std::move(payload)};
}

/// A sparse PUSH payload: u64 count, the row ids, the rows.
std::vector<uint8_t> sparseRows(const std::vector<int64_t>& ids, const std::vector<float>& rows) {
  std::vector<uint8_t> out = bytesOf(std::vector<uint64_t>{ids.size()});
  for (const std::vector<uint8_t>& part : {bytesOf(ids), bytesOf(rows)}) out.insert(out.end(), part.begin(), part.end());
  return out;
}

ReplyHeader headerOf(const ParameterServer::Reply& r) { return decodeReply(r.header); }

std::string errorIn(const ParameterServer::Reply& r) {
  REQUIRE(headerOf(r).status != 0);
  return std::string(r.payload.begin(), r.payload.end());
}

/// The embedding's server, loaded with 0, 1, 2, ... and with two workers averaging.
struct Server {
  Model model;
  ServerPlan plan = planServers(model.g, Architecture::Auto, 1, size_t{1} << 20);
  ParameterServer server{plan, 0, {2, 0.5, 0.5, {1, false}}};
  std::vector<float> initial = std::vector<float>(kRows * kWidth);
  Server() {
    for (size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<float>(i);
    const auto replies = server.handle(request(RequestKind::Load, 0, 0, bytesOf(initial)));
    REQUIRE(replies.size() == 1);
    REQUIRE(headerOf(replies[0]).status == 0);
  }
  std::vector<float> fetch(uint64_t clock = 1) {
    const auto replies = server.handle(request(RequestKind::Fetch, 1, clock));
    REQUIRE(replies.size() == 1);
    return valuesOf<float>(replies[0].payload);
  }
};

}  // namespace

TEST_CASE("AUTO serves the sparse embedding alone; PS serves every trained variable") {
  Model m;
  const ServerPlan automatic = planServers(m.g, Architecture::Auto, 2, size_t{1} << 20);
  REQUIRE(automatic.variables.size() == 1);
  CHECK(automatic.variables[0].variable == m.emb.node());
  CHECK(automatic.variables[0].sparse);
  CHECK(automatic.variables[0].update->op == "SparseApplySGD");
  CHECK(automatic.variables[0].extras.size() == 1);  // the learning rate
  const ServerPlan everything = planServers(m.g, Architecture::ParameterServer, 2, size_t{1} << 20);
  CHECK(everything.variables.size() == 2);
  CHECK(planServers(m.g, Architecture::AllReduce, 2, size_t{1} << 20).empty());
}

TEST_CASE("a large variable is split into one row partition per server, spread by bytes") {
  Model m;
  const ServerPlan plan = planServers(m.g, Architecture::ParameterServer, 2, 64);
  const ServedVariable& emb = *plan.find(m.emb.node());
  REQUIRE(emb.partitions.size() == 2);
  const Partition& a = plan.partitions[static_cast<size_t>(emb.partitions[0])];
  const Partition& b = plan.partitions[static_cast<size_t>(emb.partitions[1])];
  CHECK(a.rowBegin == 0);
  CHECK(a.rowEnd == 5);
  CHECK(b.rowBegin == 5);
  CHECK(b.rowEnd == 10);
  CHECK(a.server != b.server);
  // The dense weight (24 bytes) is whole and goes to the less loaded server.
  REQUIRE(plan.find(m.w.node())->partitions.size() == 1);
}

TEST_CASE("clipping: the gradient's squared norm becomes a server answer, the scale an extra input") {
  Model m(1.0);
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, size_t{1} << 20);
  REQUIRE(plan.variables.size() == 1);
  REQUIRE(plan.variables[0].squaredNorm != nullptr);
  CHECK(plan.variables[0].squaredNorm->op == "SparseSquaredNorm");
  CHECK(plan.variables[0].chain.size() == 2);   // scaling the rows, then the update
  CHECK(plan.variables[0].extras.size() == 2);  // the clipping scale and the learning rate
}

TEST_CASE("pushes are aggregated in worker order, answered with the squared norm, and applied by worker 0") {
  Server s;
  // Worker 1 pushes first: nothing is released until every worker has pushed.
  CHECK(s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({2, 7}, {1, 1, 1, 2, 2, 2}))).empty());
  const auto replies = s.server.handle(request(RequestKind::Push, 0, 0, sparseRows({2}, {3, 0, -1})));
  REQUIRE(replies.size() == 2);
  // Averaged over 2 workers: row 2 = (3 + 1, 0 + 1, -1 + 1) / 2, row 7 = (2, 2, 2) / 2.
  const double expectedNorm = 2 * 2 + 0.5 * 0.5 + 0 + 3 * 1.0;
  for (const ParameterServer::Reply& r : replies) {
    CHECK(headerOf(r).status == 0);
    CHECK(valuesOf<double>(r.payload).at(0) == doctest::Approx(expectedNorm));
  }
  const auto applied = s.server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate})));
  REQUIRE(applied.size() == 1);
  CHECK(headerOf(applied[0]).status == 0);
  std::vector<float> expected = s.initial;
  const float row2[] = {2, 0.5f, 0}, row7[] = {1, 1, 1};
  for (int k = 0; k < kWidth; ++k) {
    expected[2 * kWidth + k] -= kLearningRate * row2[k];
    expected[7 * kWidth + k] -= kLearningRate * row7[k];
  }
  CHECK(s.fetch() == expected);
}

TEST_CASE("a pull for the next version waits until the update is applied") {
  Server s;
  CHECK(s.server.handle(request(RequestKind::Push, 0, 0, sparseRows({1}, {2, 2, 2}))).size() == 0);
  CHECK(s.server.handle(request(RequestKind::PullRows, 1, 1, bytesOf(std::vector<int64_t>{1}))).empty());
  CHECK(s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({}, {}))).size() == 2);
  const auto released = s.server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate})));
  REQUIRE(released.size() == 2);  // the APPLY's ack and the waiting pull
  const std::vector<float> row = valuesOf<float>(released[1].payload);
  CHECK(row == std::vector<float>{3 - 0.5f, 4 - 0.5f, 5 - 0.5f});  // 3, 4, 5 minus lr * 2 / 2
}

TEST_CASE("malformed messages are rejected without changing the server") {
  Server s;
  UcxTransport::Message shortHeader = request(RequestKind::Push, 0, 0);
  shortHeader.header.resize(10);
  CHECK(contains(errorOf([&] { s.server.handle(shortHeader); }), "the header has 10 bytes, expected 32"));
  UcxTransport::Message unknownKind = request(RequestKind::Push, 0, 0);
  unknownKind.header[4] = 99;
  CHECK(contains(errorOf([&] { s.server.handle(unknownKind); }), "unknown kind 99"));
  CHECK(contains(errorOf([&] { s.server.handle(request(RequestKind::Push, 7, 0)); }), "from worker 7: the job has 2 workers"));

  auto single = [&](UcxTransport::Message m) {
    const auto replies = s.server.handle(m);
    REQUIRE(replies.size() == 1);
    return errorIn(replies[0]);
  };
  CHECK(contains(single(request(RequestKind::PullAll, 0, 0, {}, 5)), "the plan has 1 partitions"));
  CHECK(contains(single(request(RequestKind::Push, 0, 3, sparseRows({1}, {1, 1, 1}))),
                 "PUSH for clock 3 while the partition is at version 0"));
  std::vector<uint8_t> truncated = sparseRows({1, 2}, {1, 1, 1, 2, 2, 2});
  truncated.resize(truncated.size() - 4);
  CHECK(contains(single(request(RequestKind::Push, 0, 0, truncated)), "a sparse PUSH of 2 rows of 12 bytes carries"));
  std::vector<uint8_t> huge = sparseRows({1}, {1, 1, 1});
  std::memset(huge.data(), 0xff, 8);  // a row count that would overflow any size computation
  CHECK(contains(single(request(RequestKind::Push, 0, 0, huge)), "a sparse PUSH of 18446744073709551615 rows"));
  CHECK(contains(single(request(RequestKind::Push, 0, 0, sparseRows({10}, {1, 1, 1}))),
                 "row id 10 at position 0 is outside the partition's [0, 10)"));
  CHECK(contains(single(request(RequestKind::PullRows, 0, 0, bytesOf(std::vector<int64_t>{-1}))), "row id -1"));
  CHECK(contains(single(request(RequestKind::Apply, 1, 0, bytesOf(std::vector<float>{1}))), "from worker 0 alone"));
  CHECK(contains(single(request(RequestKind::Load, 0, 0, {1, 2, 3})), "LOAD carries 3 bytes"));

  // None of it changed anything: a proper step still works from version 0.
  CHECK(s.server.handle(request(RequestKind::Push, 0, 0, sparseRows({}, {}))).empty());
  CHECK(s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({}, {}))).size() == 2);
  CHECK(s.server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate}))).size() == 1);
  CHECK(s.fetch() == s.initial);
}

TEST_CASE("the server has left the job when every worker has said goodbye") {
  Server s;
  CHECK_FALSE(s.server.finished());
  s.server.handle(request(RequestKind::Goodbye, 1, 0));
  CHECK(s.server.hasLeft(1));
  CHECK_FALSE(s.server.finished());
  s.server.handle(request(RequestKind::Goodbye, 0, 0));
  CHECK(s.server.finished());
}
