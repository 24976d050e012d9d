// The parameter-server placement plan, the server's rules and the local aggregator's, in one
// process: requests are handed to ParameterServer::handle and LocalAggregator::fromMember as they
// would arrive over UCX, and what they release is checked against values computed here by plain
// loops.
#include "tests/TestUtil.h"

#include "dist/server/ParameterServer.h"
#include "dist/server/WireRows.h"
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

Message request(RequestKind kind, uint32_t worker, uint64_t clock, std::vector<uint8_t> payload = {},
                              uint32_t partition = 0) {
  static uint64_t id = 0;
  return {encode(RequestHeader{kind, partition, worker, ++id, clock}), std::move(payload)};
}

/// A sparse PUSH payload: u64 count, the row ids, the rows.
std::vector<uint8_t> sparseRows(const std::vector<int64_t>& ids, const std::vector<float>& rows) {
  std::vector<uint8_t> out = bytesOf(std::vector<uint64_t>{ids.size()});
  for (const std::vector<uint8_t>& part : {bytesOf(ids), bytesOf(rows)})
    out.insert(out.end(), part.begin(), part.end());
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
  ServerPlan plan = planServers(model.g, Architecture::Auto, 1, {size_t{1} << 20});
  ParameterServer server;
  std::vector<float> initial = std::vector<float>(kRows * kWidth);
  explicit Server(std::shared_ptr<const SyncPolicy> sync = bspPolicy())
      : server(plan, 0,
               {.workers = 2, .denseScale = 0.5, .sparseScale = 0.5, .session = {1, false}, .groups = {},
                .sync = std::move(sync)}) {
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
  const ServerPlan automatic = planServers(m.g, Architecture::Auto, 2, {size_t{1} << 20});
  REQUIRE(automatic.variables.size() == 1);
  CHECK(automatic.variables[0].variable == m.emb.node());
  CHECK(automatic.variables[0].sparse);
  CHECK(automatic.variables[0].update->op == "SparseApplySGD");
  CHECK(automatic.variables[0].extras.size() == 1);  // the learning rate
  const ServerPlan everything = planServers(m.g, Architecture::ParameterServer, 2, {size_t{1} << 20});
  CHECK(everything.variables.size() == 2);
  CHECK(planServers(m.g, Architecture::AllReduce, 2, {size_t{1} << 20}).empty());
}

TEST_CASE("a large variable is dealt out row by row into one partition per server, spread by bytes") {
  Model m;
  const ServerPlan plan = planServers(m.g, Architecture::ParameterServer, 2, {64});
  const ServedVariable& emb = *plan.find(m.emb.node());
  REQUIRE(emb.partitions.size() == 2);
  const Partition& a = plan.partitions[static_cast<size_t>(emb.partitions[0])];
  const Partition& b = plan.partitions[static_cast<size_t>(emb.partitions[1])];
  // Dealt out row by row: rows 0, 2, 4, ... and 1, 3, 5, ...
  CHECK((a.first == 0 && a.stride == 2 && a.rows == 5));
  CHECK((b.first == 1 && b.stride == 2 && b.rows == 5));
  CHECK(a.server != b.server);
  // The dense weight (24 bytes) is whole and goes to the less loaded server.
  REQUIRE(plan.find(m.w.node())->partitions.size() == 1);
}

TEST_CASE("the number of partitions is the job's, independent of the servers, and spread over them by bytes") {
  Model m;
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 2, {.bytes = 64, .count = 5});
  const ServedVariable& emb = *plan.find(m.emb.node());
  REQUIRE(emb.partitions.size() == 5);
  std::vector<int> perServer(2, 0);
  for (size_t k = 0; k < 5; ++k) {
    const Partition& p = plan.partitions[static_cast<size_t>(emb.partitions[k])];
    CHECK((p.first == static_cast<int64_t>(k) && p.stride == 5 && p.rows == 2));
    CHECK(emb.partitionOfRow(static_cast<int64_t>(k) + 5) == k);
    ++perServer[static_cast<size_t>(p.server)];
  }
  CHECK(perServer == std::vector<int>{3, 2});
}

TEST_CASE("no more partitions than rows") {
  Model m;
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 2, {.bytes = 64, .count = 1000});
  CHECK(plan.find(m.emb.node())->partitions.size() == static_cast<size_t>(kRows));
}

/// Two embeddings, each created in its own partitioner scope, and one outside any.
struct ScopedModel {
  Graph g;
  Output fixed, job, plain;
  ScopedModel() {
    const Output ids = g.placeholder("ids", i32, {4});
    {
      auto p = g.partitioner(3);
      fixed = g.variable("fixed", f32, {kRows, kWidth}, Initializer::normal(0, 1));
    }
    {
      auto p = g.partitioner();
      job = g.variable("job", f32, {kRows, kWidth}, Initializer::normal(0, 1));
    }
    plain = g.variable("plain", f32, {kRows, kWidth}, Initializer::normal(0, 1));
    const Output loss =
        sum(square(gather(fixed, ids))) + sum(square(gather(job, ids))) + sum(square(gather(plain, ids)));
    optim::SGD(kLearningRate).minimize(loss);
  }
  size_t partitionsOf(const ServerPlan& plan, const Output& v) const { return plan.find(v.node())->partitions.size(); }
};

TEST_CASE("a partitioner scope splits its variables whatever their size, by its count or the job's") {
  ScopedModel m;
  // 120-byte variables, far below the threshold: only the scoped ones are split.
  const ServerPlan byServers = planServers(m.g, Architecture::Auto, 2, {size_t{1} << 20});
  CHECK(m.partitionsOf(byServers, m.fixed) == 3);
  CHECK(m.partitionsOf(byServers, m.job) == 2);  // the job's count: one per server
  CHECK(m.partitionsOf(byServers, m.plain) == 1);
  const ServerPlan counted = planServers(m.g, Architecture::Auto, 2, {.bytes = size_t{1} << 20, .count = 4});
  CHECK(m.partitionsOf(counted, m.fixed) == 3);
  CHECK(m.partitionsOf(counted, m.job) == 4);
  CHECK(m.partitionsOf(counted, m.plain) == 1);
  // Over the threshold, a variable outside every scope takes the job's count too.
  CHECK(m.partitionsOf(planServers(m.g, Architecture::Auto, 2, {.bytes = 64, .count = 4}), m.plain) == 4);
}

TEST_CASE("a partitioner scope refuses a negative count") {
  Graph g;
  CHECK_THROWS_WITH_AS(g.partitioner(-2), doctest::Contains("partitioner(-2)"), Error);
}

TEST_CASE("a moving average of a served variable is held by its server and updated after each update") {
  Model m;
  optim::ExponentialMovingAverage ema(0.25);
  Node* averaged = ema.apply({m.emb}, nullptr);
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, {size_t{1} << 20});
  const ServedVariable& emb = *plan.find(m.emb.node());
  REQUIRE(emb.averages.size() == 1);
  CHECK(emb.heldState() == std::vector<Node*>{ema.average(m.emb).node()});
  CHECK(averaged->op == "NoOp");

  ParameterServer server(plan, 0,
                         {.workers = 1, .denseScale = 1, .sparseScale = 1, .session = {1, false}, .groups = {}});
  std::vector<float> values(kRows * kWidth), shadow(kRows * kWidth, 1.0f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  std::vector<uint8_t> load = bytesOf(values), shadowBytes = bytesOf(shadow);
  load.insert(load.end(), shadowBytes.begin(), shadowBytes.end());
  REQUIRE(headerOf(server.handle(request(RequestKind::Load, 0, 0, load))[0]).status == 0);
  REQUIRE(server.handle(request(RequestKind::Push, 0, 0, sparseRows({4}, {2, 2, 2}))).size() == 1);
  REQUIRE(server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate}))).size() == 1);
  const std::vector<float> fetched = valuesOf<float>(server.handle(request(RequestKind::Fetch, 0, 1))[0].payload);
  REQUIRE(fetched.size() == 2 * values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    CAPTURE(i);
    const float updated = values[i] - (i / kWidth == 4 ? kLearningRate * 2 : 0.0f);
    CHECK(fetched[i] == updated);
    CHECK(fetched[values.size() + i] == doctest::Approx(0.25 * 1.0 + 0.75 * updated));
  }
}

TEST_CASE("clipping: the gradient's squared norm becomes a server answer, the scale an extra input") {
  Model m(1.0);
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, {size_t{1} << 20});
  REQUIRE(plan.variables.size() == 1);
  REQUIRE(plan.variables[0].squaredNorm != nullptr);
  CHECK(plan.variables[0].squaredNorm->op == "SparseSquaredNorm");
  CHECK(plan.variables[0].chain.size() == 2);   // scaling the rows, then the update
  CHECK(plan.variables[0].extras.size() == 2);  // the clipping scale and the learning rate
}

TEST_CASE("messages that arrive together are served in parallel across partitions, as one by one") {
  // Five partitions on one server: a whole step of two workers (pushes, APPLYs, the next pulls)
  // arrives as one batch, handled on 4 threads, and again message by message on one.
  Model m;
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, {.bytes = 64, .count = 5});
  REQUIRE(plan.partitions.size() == 5);
  auto serverOn = [&](int threads) {
    return std::make_unique<ParameterServer>(
        plan, 0,
        ParameterServer::Options{
            .workers = 2, .denseScale = 0.5, .sparseScale = 0.5, .session = {threads, false}, .groups = {}});
  };
  std::vector<Message> loads, step, fetches;
  for (uint32_t p = 0; p < 5; ++p) {
    std::vector<float> rows(2 * kWidth);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(p * 10 + i);
    loads.push_back(request(RequestKind::Load, 0, 0, bytesOf(rows), p));
    for (uint32_t w : {1u, 0u}) {
      step.push_back(request(RequestKind::Push, w, 0, sparseRows({1}, {1.0f + w, 2, 3}), p));
      step.push_back(request(RequestKind::PullRows, w, 1, bytesOf(std::vector<int64_t>{0, 1}), p));
    }
    step.push_back(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate}), p));
    fetches.push_back(request(RequestKind::Fetch, 0, 1, {}, p));
  }
  auto byId = [](std::vector<ParameterServer::Reply> replies) {
    std::map<uint64_t, std::vector<uint8_t>> out;
    for (ParameterServer::Reply& r : replies) {
      CHECK(headerOf(r).status == 0);
      out[headerOf(r).id] = std::move(r.payload);
    }
    return out;
  };
  auto parallel = serverOn(4), serial = serverOn(1);
  std::vector<ParameterServer::Reply> together, oneByOne;
  for (const std::vector<Message>* batch : {&loads, &step, &fetches}) {
    ParameterServer::Handled handled = parallel->handleAll(*batch);
    CHECK(handled.rejected.empty());
    // Per partition of the step: 2 norms, the APPLY's ack and the 2 pulls it released.
    CHECK(handled.replies.size() == (batch == &step ? 25u : 5u));
    for (ParameterServer::Reply& r : handled.replies) together.push_back(std::move(r));
    for (const Message& msg : *batch)
      for (ParameterServer::Reply& r : serial->handle(msg)) oneByOne.push_back(std::move(r));
  }
  const auto answers = byId(std::move(together));
  CHECK(answers.size() == 35);
  CHECK(answers == byId(std::move(oneByOne)));
  for (const Message& f : fetches) {
    const RequestHeader h = decodeRequest(f.header);
    const std::vector<float> rows = valuesOf<float>(answers.at(h.id));
    // Row 1 of each partition moved by lr * ((2 + 1) / 2, (2 + 2) / 2, (3 + 3) / 2).
    CHECK(rows[kWidth] == static_cast<float>(h.partition * 10 + kWidth) - kLearningRate * 1.5f);
    CHECK(rows[kWidth + 2] == static_cast<float>(h.partition * 10 + kWidth + 2) - kLearningRate * 3.0f);
  }
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

/// Worker `worker`'s push of one row `id` of ones, as its `clock`-th update, and its APPLY.
std::vector<ParameterServer::Reply> pushAndApply(Server& s, uint32_t worker, uint64_t clock, int64_t id) {
  std::vector<ParameterServer::Reply> out =
      s.server.handle(request(RequestKind::Push, worker, clock, sparseRows({id}, {1, 1, 1})));
  REQUIRE(out.size() == 1);  // the norm, at once
  CHECK(valuesOf<double>(out[0].payload).at(0) == doctest::Approx(3 * 0.25));
  for (auto& r :
       s.server.handle(request(RequestKind::Apply, worker, clock, bytesOf(std::vector<float>{kLearningRate}))))
    out.push_back(std::move(r));
  return out;
}

TEST_CASE("ASP: each worker's push is an update of its own, applied with its own APPLY as it comes") {
  Server s(aspPolicy());
  // Worker 1 twice before worker 0 pushes at all.
  CHECK(pushAndApply(s, 1, 0, 2).size() == 2);
  CHECK(pushAndApply(s, 1, 1, 2).size() == 2);
  std::vector<float> expected = s.initial;
  for (int k = 0; k < kWidth; ++k) expected[2 * kWidth + k] -= 2 * kLearningRate * 0.5f;  // two updates of 1/2
  CHECK(s.fetch(0) == expected);
  // Its pull is answered at once with the current rows.
  const auto pulled = s.server.handle(request(RequestKind::PullRows, 1, 2, bytesOf(std::vector<int64_t>{2})));
  REQUIRE(pulled.size() == 1);
  CHECK(valuesOf<float>(pulled[0].payload) ==
        std::vector<float>(expected.begin() + 2 * kWidth, expected.begin() + 3 * kWidth));
  CHECK(s.server.staleness()[1].maxGap == 2);
}

TEST_CASE("SSP(1): a worker's pull waits while it is more than one update ahead of the slowest") {
  Server s(sspPolicy(1));
  pushAndApply(s, 1, 0, 3);
  CHECK(s.server.handle(request(RequestKind::PullRows, 1, 1, bytesOf(std::vector<int64_t>{3}))).size() == 1);
  pushAndApply(s, 1, 1, 3);
  CHECK(s.server.handle(request(RequestKind::PullRows, 1, 2, bytesOf(std::vector<int64_t>{3}))).empty());
  // Worker 0's update brings worker 1 back within the bound: its APPLY releases the pull.
  const auto released = pushAndApply(s, 0, 0, 5);
  REQUIRE(released.size() == 3);
  CHECK(released[2].worker == 1);
  CHECK(headerOf(released[2]).status == 0);
  const SenderStaleness held = s.server.staleness()[1];
  CHECK(held.pulls == 2);
  CHECK(held.maxGap == 1);
  CHECK(held.meanGap() == 1.0);
}

TEST_CASE("SSP(0): a worker that says goodbye releases the pulls it held back") {
  Server s(sspPolicy(0));
  pushAndApply(s, 1, 0, 3);
  CHECK(s.server.handle(request(RequestKind::PullRows, 1, 1, bytesOf(std::vector<int64_t>{3}))).empty());
  const auto released = s.server.handle(request(RequestKind::Goodbye, 0, 0));
  REQUIRE(released.size() == 2);  // the goodbye's ack and the pull
  CHECK(released[1].worker == 1);
}

TEST_CASE("asynchronous modes refuse a second push before its update, and an APPLY for another clock") {
  Server s(sspPolicy(2));
  CHECK(s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({1}, {1, 1, 1}))).size() == 1);
  auto single = [&](Message m) {
    const auto replies = s.server.handle(m);
    REQUIRE(replies.size() == 1);
    return errorIn(replies[0]);
  };
  CHECK(contains(single(request(RequestKind::Push, 1, 0, sparseRows({1}, {1, 1, 1}))),
                 "worker 1 pushed twice for its update 0"));
  CHECK(contains(single(request(RequestKind::Apply, 1, 4, bytesOf(std::vector<float>{kLearningRate}))),
                 "APPLY for clock 4 while 0 of the sender's updates are applied"));
  CHECK(contains(single(request(RequestKind::PullAll, 1, 3)), "a pull for clock 3 while 0 of the sender's updates"));
}

TEST_CASE("malformed messages are rejected without changing the server") {
  Server s;
  Message shortHeader = request(RequestKind::Push, 0, 0);
  shortHeader.header.resize(10);
  CHECK(contains(errorOf([&] { s.server.handle(shortHeader); }), "the header has 10 bytes, expected 32"));
  Message unknownKind = request(RequestKind::Push, 0, 0);
  unknownKind.header[4] = 99;
  CHECK(contains(errorOf([&] { s.server.handle(unknownKind); }), "unknown kind 99"));
  CHECK(contains(errorOf([&] { s.server.handle(request(RequestKind::Push, 7, 0)); }),
                 "from worker 7: the job has 2 workers"));

  auto single = [&](Message m) {
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
                 "partition row id 10 at position 0 is outside [0, 10)"));
  CHECK(contains(single(request(RequestKind::PullRows, 0, 0, bytesOf(std::vector<int64_t>{-1}))), "row id -1"));
  CHECK(contains(single(request(RequestKind::Apply, 1, 0, bytesOf(std::vector<float>{1}))), "from worker 0 alone"));
  CHECK(contains(single(request(RequestKind::Load, 0, 0, {1, 2, 3})), "LOAD carries 3 bytes"));

  // None of it changed anything: a proper step still works from version 0.
  CHECK(s.server.handle(request(RequestKind::Push, 0, 0, sparseRows({}, {}))).empty());
  CHECK(s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({}, {}))).size() == 2);
  CHECK(s.server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate}))).size() == 1);
  CHECK(s.fetch() == s.initial);
}

TEST_CASE("LOAD comes from worker 0 before training; pulls run at most a version ahead; nobody speaks after goodbye") {
  Server s;
  auto single = [&](Message m) {
    const auto replies = s.server.handle(m);
    REQUIRE(replies.size() == 1);
    return errorIn(replies[0]);
  };
  const std::vector<uint8_t> zeros = bytesOf(std::vector<float>(kRows * kWidth));
  CHECK(contains(single(request(RequestKind::Load, 1, 0, zeros)), "LOAD comes from worker 0 alone, not worker 1"));
  CHECK(contains(single(request(RequestKind::PullRows, 1, 2, bytesOf(std::vector<int64_t>{1}))),
                 "a pull for clock 2 while the partition is at version 0"));
  CHECK(s.server.handle(request(RequestKind::Push, 0, 0, sparseRows({}, {}))).empty());
  CHECK(contains(single(request(RequestKind::Load, 0, 0, zeros)), "values are loaded only before training starts"));
  for (int i = 0; i < 4; ++i) CHECK(s.server.handle(request(RequestKind::PullAll, 0, 1)).empty());
  CHECK(contains(single(request(RequestKind::PullAll, 0, 1)), "worker 0 has 4 pulls waiting for version 1 already"));
  CHECK(s.fetch(0) == s.initial);  // none of it changed the values
  s.server.handle(request(RequestKind::Goodbye, 1, 0));
  CHECK(contains(errorOf([&] { s.server.handle(request(RequestKind::Push, 1, 0, sparseRows({}, {}))); }),
                 "PUSH request from worker 1, which has said goodbye"));
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

namespace {

/// The local aggregator of workers 1, 2 and 3 (worker 1 speaks for them) in front of the
/// embedding's server (AUTO, one server) or of both variables' (PS, two servers).
struct Aggregation {
  Model model;
  ServerPlan plan;
  LocalAggregator aggregator;
  explicit Aggregation(Architecture architecture = Architecture::Auto, int servers = 1)
      : plan(planServers(model.g, architecture, servers, {size_t{1} << 20})), aggregator(plan, {1, 2, 3}, servers) {}
  uint32_t partitionOf(const Output& variable) const {
    return static_cast<uint32_t>(plan.find(variable.node())->partitions.at(0));
  }
};

RequestHeader forwardedHeader(const LocalAggregator::Released& r, size_t i = 0) {
  return decodeRequest(r.forwards.at(i).second.header);
}

Message answer(const RequestHeader& forwarded, std::vector<uint8_t> payload, uint32_t status = 0) {
  return {encode(ReplyHeader{forwarded.id, status}), std::move(payload)};
}

/// The rows of `ids` from a table whose element (row, k) is 10 row + k.
std::vector<float> tableRows(const std::vector<int64_t>& ids) {
  std::vector<float> out;
  for (int64_t id : ids)
    for (int k = 0; k < kWidth; ++k) out.push_back(static_cast<float>(10 * id + k));
  return out;
}

}  // namespace

TEST_CASE("local aggregation: a machine's sparse pushes go out once, rows of one id summed") {
  Aggregation a;
  CHECK(a.aggregator.fromMember(request(RequestKind::Push, 2, 0, sparseRows({4, 1}, {1, 1, 1, 2, 2, 2})))
            .forwards.empty());
  CHECK(a.aggregator.fromMember(request(RequestKind::Push, 3, 0, sparseRows({}, {}))).forwards.empty());
  const auto released = a.aggregator.fromMember(request(RequestKind::Push, 1, 0, sparseRows({4}, {0.5f, 0, -1})));
  REQUIRE(released.forwards.size() == 1);
  CHECK(released.replies.empty());
  const RequestHeader h = forwardedHeader(released);
  CHECK(h.kind == RequestKind::Push);
  CHECK(h.worker == 1);  // the machine's first worker speaks for it
  CHECK(h.clock == 0);
  CHECK(released.forwards[0].first == 0);  // the embedding's server
  // Ids sorted, each once: row 1 from worker 2; row 4 = worker 1's (0.5, 0, -1) + worker 2's (1, 1, 1).
  CHECK(released.forwards[0].second.payload == sparseRows({1, 4}, {2, 2, 2, 1.5f, 1, 0}));

  // The server's answer (the squared norm) reaches every worker, each under its own request id.
  const auto answered = a.aggregator.fromServer(answer(h, bytesOf(std::vector<double>{7.5})));
  REQUIRE(answered.replies.size() == 3);
  std::vector<int> workers;
  for (const auto& [worker, e] : answered.replies) {
    workers.push_back(worker);
    CHECK(decodeReply(e.header).status == 0);
    CHECK(valuesOf<double>(e.payload) == std::vector<double>{7.5});
  }
  CHECK(workers == std::vector<int>{1, 2, 3});
  const SparseRows rows = a.aggregator.sparseRows().at("emb");
  CHECK(rows.steps == 1);
  CHECK(rows.lookups == 3);  // the rows that came in
  CHECK(rows.touched == 2);  // the rows that went out
}

TEST_CASE("local aggregation: dense pushes are summed element by element") {
  Aggregation a(Architecture::ParameterServer, 2);
  const uint32_t w = a.partitionOf(a.model.w);
  for (uint32_t worker : {1u, 2u})
    a.aggregator.fromMember(request(RequestKind::Push, worker, 0, bytesOf(std::vector<float>(6, float(worker))), w));
  const auto released = a.aggregator.fromMember(
      request(RequestKind::Push, 3, 0, bytesOf(std::vector<float>{0, 1, 2, 3, 4, 5}), w));
  REQUIRE(released.forwards.size() == 1);
  CHECK(released.forwards[0].first == a.plan.partitions[w].server);
  CHECK(valuesOf<float>(released.forwards[0].second.payload) == std::vector<float>{3, 4, 5, 6, 7, 8});
}

TEST_CASE("local aggregation: a row crosses once per version, however many workers read it") {
  Aggregation a;
  // Worker 2 asks first: its rows are fetched.
  const auto first = a.aggregator.fromMember(request(RequestKind::PullRows, 2, 0, bytesOf(std::vector<int64_t>{5, 3})));
  REQUIRE(first.forwards.size() == 1);
  const RequestHeader h1 = forwardedHeader(first);
  CHECK(valuesOf<int64_t>(first.forwards[0].second.payload) == std::vector<int64_t>{3, 5});
  // Workers 1 and 3 ask while that fetch is on its way: they wait.
  const auto waiting1 =
      a.aggregator.fromMember(request(RequestKind::PullRows, 1, 0, bytesOf(std::vector<int64_t>{3, 8, 3})));
  const auto waiting3 =
      a.aggregator.fromMember(request(RequestKind::PullRows, 3, 0, bytesOf(std::vector<int64_t>{9, 5})));
  CHECK(waiting1.forwards.empty());
  CHECK(waiting3.forwards.empty());
  CHECK(waiting1.replies.empty());
  // The answer serves worker 2 and fetches only what is still missing, 8 and 9, in one request.
  const auto second = a.aggregator.fromServer(answer(h1, bytesOf(tableRows({3, 5}))));
  REQUIRE(second.replies.size() == 1);
  CHECK(second.replies[0].first == 2);
  CHECK(valuesOf<float>(second.replies[0].second.payload) == tableRows({5, 3}));
  REQUIRE(second.forwards.size() == 1);
  const RequestHeader h2 = forwardedHeader(second);
  CHECK(valuesOf<int64_t>(second.forwards[0].second.payload) == std::vector<int64_t>{8, 9});
  const auto third = a.aggregator.fromServer(answer(h2, bytesOf(tableRows({8, 9}))));
  REQUIRE(third.replies.size() == 2);
  CHECK(third.forwards.empty());
  for (const auto& [worker, e] : third.replies)
    CHECK(valuesOf<float>(e.payload) == (worker == 1 ? tableRows({3, 8, 3}) : tableRows({9, 5})));
  // Another read of version 0 is answered at once; version 1 is fetched anew.
  CHECK(
      a.aggregator.fromMember(request(RequestKind::PullRows, 3, 0, bytesOf(std::vector<int64_t>{8}))).replies.size() ==
      1);
  CHECK(
      a.aggregator.fromMember(request(RequestKind::PullRows, 3, 1, bytesOf(std::vector<int64_t>{8}))).forwards.size() ==
      1);
}

TEST_CASE("local aggregation: a whole partition is pulled once per version") {
  Aggregation a(Architecture::ParameterServer, 2);
  const uint32_t w = a.partitionOf(a.model.w);
  const auto first = a.aggregator.fromMember(request(RequestKind::PullAll, 3, 0, {}, w));
  REQUIRE(first.forwards.size() == 1);
  CHECK(a.aggregator.fromMember(request(RequestKind::PullAll, 1, 0, {}, w)).forwards.empty());
  const std::vector<float> value{1, 2, 3, 4, 5, 6};
  const auto answered = a.aggregator.fromServer(answer(forwardedHeader(first), bytesOf(value)));
  REQUIRE(answered.replies.size() == 2);
  for (const auto& [worker, e] : answered.replies) CHECK(valuesOf<float>(e.payload) == value);
  const auto late = a.aggregator.fromMember(request(RequestKind::PullAll, 2, 0, {}, w));
  CHECK(late.forwards.empty());
  REQUIRE(late.replies.size() == 1);
  CHECK(valuesOf<float>(late.replies[0].second.payload) == value);
}

TEST_CASE("local aggregation: a server's error reaches every worker waiting on the request") {
  Aggregation a;
  const auto first = a.aggregator.fromMember(request(RequestKind::PullRows, 1, 0, bytesOf(std::vector<int64_t>{2})));
  a.aggregator.fromMember(request(RequestKind::PullRows, 2, 0, bytesOf(std::vector<int64_t>{2})));
  const std::string text = "server 0: no such version";
  const auto failed = a.aggregator.fromServer(
      answer(forwardedHeader(first), std::vector<uint8_t>(text.begin(), text.end()), 1));
  REQUIRE(failed.replies.size() == 2);
  for (const auto& [worker, e] : failed.replies) {
    CHECK(decodeReply(e.header).status != 0);
    CHECK(std::string(e.payload.begin(), e.payload.end()) == text);
  }
  // A reply of the wrong size is an error too, naming the sizes.
  const auto again = a.aggregator.fromMember(request(RequestKind::PullRows, 3, 0, bytesOf(std::vector<int64_t>{2, 4})));
  const auto wrong = a.aggregator.fromServer(answer(forwardedHeader(again), bytesOf(tableRows({2}))));
  REQUIRE(wrong.replies.size() == 1);
  CHECK(contains(std::string(wrong.replies[0].second.payload.begin(), wrong.replies[0].second.payload.end()),
                 "answered a PULL_ROWS with 12 bytes, expected 24"));
}

TEST_CASE("local aggregation: what one worker asks alone goes out as it comes") {
  Aggregation a;
  const auto fetch = a.aggregator.fromMember(request(RequestKind::Fetch, 2, 0));
  REQUIRE(fetch.forwards.size() == 1);
  CHECK(forwardedHeader(fetch).kind == RequestKind::Fetch);
  const auto back = a.aggregator.fromServer(answer(forwardedHeader(fetch), bytesOf(std::vector<float>{1, 2})));
  REQUIRE(back.replies.size() == 1);
  CHECK(back.replies[0].first == 2);
  // APPLY and LOAD come from worker 0 alone, so a machine without it refuses them.
  const auto apply = a.aggregator.fromMember(request(RequestKind::Apply, 1, 0, bytesOf(std::vector<float>{0.5f})));
  REQUIRE(apply.replies.size() == 1);
  CHECK(contains(std::string(apply.replies[0].second.payload.begin(), apply.replies[0].second.payload.end()),
                 "APPLY comes from worker 0 alone"));
}

TEST_CASE("local aggregation: malformed requests are refused and change nothing") {
  Aggregation a;
  auto refusal = [&](Message m) {
    const auto released = a.aggregator.fromMember(m);
    REQUIRE(released.replies.size() == 1);
    CHECK(released.forwards.empty());
    return std::string(released.replies[0].second.payload.begin(), released.replies[0].second.payload.end());
  };
  CHECK(contains(errorOf([&] { a.aggregator.fromMember(request(RequestKind::Push, 0, 0)); }),
                 "from worker 0, which is not one of this machine's workers"));
  CHECK(contains(errorOf([&] { a.aggregator.fromServer(answer(RequestHeader{RequestKind::Push, 0, 1, 77, 0}, {})); }),
                 "reply to request 77, which is not in flight"));
  CHECK(contains(refusal(request(RequestKind::PullAll, 1, 0, {}, 4)), "the plan has 1 partitions"));
  CHECK(contains(refusal(request(RequestKind::PullRows, 1, 0, bytesOf(std::vector<int64_t>{10}))), "row id 10"));
  CHECK(contains(refusal(request(RequestKind::Push, 1, 0, {1, 2, 3})), "a sparse PUSH needs a row count"));
  a.aggregator.fromMember(request(RequestKind::Push, 1, 0, sparseRows({}, {})));
  CHECK(contains(refusal(request(RequestKind::Push, 1, 0, sparseRows({}, {}))), "a second PUSH for clock 0"));
  // The step still completes with one push from each.
  a.aggregator.fromMember(request(RequestKind::Push, 2, 0, sparseRows({}, {})));
  CHECK(a.aggregator.fromMember(request(RequestKind::Push, 3, 0, sparseRows({}, {}))).forwards.size() == 1);
}

TEST_CASE("local aggregation: when its workers have left, the machine says goodbye to every server") {
  Aggregation a(Architecture::ParameterServer, 2);
  for (uint32_t worker : {3u, 1u})
    CHECK(a.aggregator.fromMember(request(RequestKind::Goodbye, worker, 0)).forwards.empty());
  CHECK(a.aggregator.hasLeft(1));
  CHECK_FALSE(a.aggregator.saidGoodbye());
  const auto last = a.aggregator.fromMember(request(RequestKind::Goodbye, 2, 0));
  REQUIRE(last.replies.size() == 1);
  REQUIRE(last.forwards.size() == 2);
  CHECK(a.aggregator.saidGoodbye());
  CHECK_FALSE(a.aggregator.finished());
  for (size_t i = 0; i < 2; ++i) {
    CHECK(last.forwards[i].first == static_cast<int>(i));
    CHECK(forwardedHeader(last, i).kind == RequestKind::Goodbye);
    CHECK(a.aggregator.fromServer(answer(forwardedHeader(last, i), {})).replies.empty());
  }
  CHECK(a.aggregator.finished());
}

TEST_CASE("a server counts a machine's workers as one sender: it takes their pushes from the first alone") {
  Model model;
  const ServerPlan plan = planServers(model.g, Architecture::Auto, 1, {size_t{1} << 20});
  SenderGroups groups;
  groups.groupOfWorker = {0, 1, 1};
  groups.members = {{0}, {1, 2}};
  groups.relay = {-1, 0};
  ParameterServer server{
      plan, 0, {.workers = 3, .denseScale = 1, .sparseScale = 1, .session = {1, false}, .groups = groups}};
  auto single = [&](Message m) {
    const auto replies = server.handle(m);
    REQUIRE(replies.size() == 1);
    return errorIn(replies[0]);
  };
  CHECK(contains(errorOf([&] { server.handle(request(RequestKind::Push, 2, 0, sparseRows({}, {}))); }),
                 "whose machine's local aggregator speaks for it as worker 1"));
  CHECK(server.handle(request(RequestKind::Push, 1, 0, sparseRows({1}, {1, 1, 1}))).empty());
  CHECK(contains(single(request(RequestKind::Push, 1, 0, sparseRows({}, {}))), "pushed twice for version 0"));
  // Two senders: worker 0's push completes the version.
  CHECK(server.handle(request(RequestKind::Push, 0, 0, sparseRows({}, {}))).size() == 2);
  server.handle(request(RequestKind::Goodbye, 0, 0));
  CHECK_FALSE(server.finished());
  server.handle(request(RequestKind::Goodbye, 1, 0));
  CHECK(server.hasLeft(2));
  CHECK(server.finished());
}

TEST_CASE("a pipelined job's server counts each replica as one sender: each of its stages sends for its own "
          "variables, and the first replica's APPLY makes the version") {
  Model model;
  const ServerPlan plan = planServers(model.g, Architecture::ParameterServer, 1, {size_t{1} << 20});
  const auto emb = static_cast<uint32_t>(plan.find(model.emb.node())->partitions.at(0));
  const auto w = static_cast<uint32_t>(plan.find(model.w.node())->partitions.at(0));
  // 2 replicas of 2 stages: workers 0 and 2 read the embedding (stage 0), 1 and 3 the weight.
  ParameterServer server{plan, 0,
                         {.workers = 4, .denseScale = 0.5, .sparseScale = 0.5, .session = {1, false},
                          .groups = SenderGroups::pipelineReplicas(4, 2)}};
  const std::vector<uint8_t> lr = bytesOf(std::vector<float>{kLearningRate});
  CHECK(server.handle(request(RequestKind::Push, 0, 0, sparseRows({1}, {1, 1, 1}), emb)).empty());
  CHECK(server.handle(request(RequestKind::Push, 1, 0, bytesOf(std::vector<float>(6, 1)), w)).empty());
  // Replica 1's stages complete each variable's version: one push of each replica.
  CHECK(server.handle(request(RequestKind::Push, 2, 0, sparseRows({}, {}), emb)).size() == 2);
  CHECK(server.handle(request(RequestKind::Push, 3, 0, bytesOf(std::vector<float>(6, 3)), w)).size() == 2);
  const auto refused = server.handle(request(RequestKind::Apply, 3, 0, lr, w));
  REQUIRE(refused.size() == 1);
  CHECK(contains(errorIn(refused[0]), "APPLY comes from worker 0 alone (in a pipeline, from its first replica), not "
                                      "worker 3"));
  for (auto [worker, partition] : {std::pair{0u, emb}, std::pair{1u, w}}) {
    const auto applied = server.handle(request(RequestKind::Apply, worker, 0, lr, partition));
    REQUIRE(applied.size() == 1);
    CHECK(headerOf(applied[0]).status == 0);
  }
  // The weight (never loaded: zeros) moves by the replicas' mean gradient, (1 + 3) / 2, times the rate.
  const auto weight = server.handle(request(RequestKind::PullAll, 1, 1, {}, w));
  REQUIRE(weight.size() == 1);
  CHECK(valuesOf<float>(weight[0].payload) == std::vector<float>(6, -kLearningRate * 2));
  // A replica leaves when all its stages have: worker 0's goodbye leaves worker 1 free to speak.
  server.handle(request(RequestKind::Goodbye, 0, 1));
  CHECK(server.hasLeft(0));
  CHECK_FALSE(server.hasLeft(1));
  CHECK(server.handle(request(RequestKind::Push, 1, 1, bytesOf(std::vector<float>(6, 0)), w)).empty());
  for (uint32_t worker : {1u, 2u}) server.handle(request(RequestKind::Goodbye, worker, 1));
  CHECK_FALSE(server.finished());
  server.handle(request(RequestKind::Goodbye, 3, 1));
  CHECK(server.finished());
}

TEST_CASE("--wire-dtype bf16: a server takes pushed rows in bf16, sums them in f32, and answers pulls in bf16; "
          "LOAD and FETCH stay f32") {
  Model model;
  const ServerPlan plan = planServers(model.g, Architecture::Auto, 1, {size_t{1} << 20});
  ParameterServer server{plan, 0,
                         {.workers = 2, .denseScale = 0.5, .sparseScale = 0.5, .session = {1, false}, .groups = {},
                          .sync = bspPolicy(), .wire = DType::BF16}};
  const RowWire wire = RowWire::of(plan.variables.at(0), DType::BF16);
  REQUIRE(wire.narrowed);
  CHECK(wire.bytes() == kWidth * sizeof(uint16_t));
  CHECK_FALSE(RowWire::of(plan.variables.at(0), DType::F16).narrowed);  // f16 would lose small gradients
  // 1 + 2^-10 is not a bf16 value: it travels as 1, and 3.5 exactly.
  const std::vector<float> initial(kRows * kWidth, 1.0f + std::ldexp(1.0f, -10));
  REQUIRE(headerOf(server.handle(request(RequestKind::Load, 0, 0, bytesOf(initial))).at(0)).status == 0);
  const auto bf16Rows = [&](const std::vector<float>& rows) { return wire.narrow(bytesOf(rows)); };
  const auto sparseBf16 = [&](const std::vector<int64_t>& ids, const std::vector<float>& rows) {
    std::vector<uint8_t> out = bytesOf(std::vector<uint64_t>{ids.size()});
    for (const std::vector<uint8_t>& part : {bytesOf(ids), bf16Rows(rows)})
      out.insert(out.end(), part.begin(), part.end());
    return out;
  };
  const auto pulled = server.handle(request(RequestKind::PullRows, 1, 0, bytesOf(std::vector<int64_t>{4})));
  REQUIRE(pulled.size() == 1);
  CHECK(pulled[0].payload == bf16Rows({1, 1, 1}));
  // A push of f32 rows (twice the bytes) is refused as malformed.
  const auto wide = server.handle(request(RequestKind::Push, 1, 0, sparseRows({2}, {1, 1, 1})));
  REQUIRE(wide.size() == 1);
  CHECK(headerOf(wide[0]).status != 0);
  CHECK(server.handle(request(RequestKind::Push, 1, 0, sparseBf16({2}, {3.5f, 0, -1}))).empty());
  const auto summed = server.handle(request(RequestKind::Push, 0, 0, sparseBf16({2}, {0.5f, 1, 1})));
  REQUIRE(summed.size() == 2);
  // Averaged in f32: row 2's gradient (2, 0.5, 0), squared norm 4.25.
  CHECK(valuesOf<double>(summed[0].payload).at(0) == doctest::Approx(4.25));
  REQUIRE(server.handle(request(RequestKind::Apply, 0, 0, bytesOf(std::vector<float>{kLearningRate}))).size() == 1);
  // FETCH returns the f32 values: row 2 moved by 0.5 x its gradient from the unrounded start.
  const std::vector<float> fetched =
      valuesOf<float>(server.handle(request(RequestKind::Fetch, 1, 1)).at(0).payload);
  const float start = 1.0f + std::ldexp(1.0f, -10);
  CHECK(fetched[2 * kWidth + 0] == start - kLearningRate * 2.0f);
  CHECK(fetched[2 * kWidth + 1] == start - kLearningRate * 0.5f);
  CHECK(fetched[2 * kWidth + 2] == start);
  CHECK(fetched[0] == start);
}
