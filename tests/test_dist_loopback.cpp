// The distribution runtime's logic in one process: the ring's collectives over in-process
// transports, and whole jobs — every worker and server a thread, joined through connectJob as
// joinJob joins them after the rendezvous — training like one session on the total batch, with
// the parameter servers, local aggregation and the BSP policy in the loop. A member that dies
// stops the others with an error, not a hang.
#include "tests/TestUtil.h"

#include "dist/launch/Job.h"
#include "dist/transport/LoopbackTransport.h"
#include "dist/collective/Ring.h"
#include "dist/Runner.h"
#include "dist/server/ServerProcess.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

using namespace weft;
using namespace weft::dist;
using namespace std::chrono_literals;
using weft::testing::randomTensor;

namespace {

Config jobConfig(Architecture architecture) {
  Config c;
  c.architecture = architecture;
  c.timeout = 60s;
  c.session = SessionOptions{1, false};
  return c;
}

/// Every member of a job on `hosts` (workers per host, one server per host when `servers`) as
/// joinJob would leave it, over one loopback network: workers first, then servers, in rank order.
std::vector<JobContext> loopbackJob(const std::shared_ptr<LoopbackNetwork>& network, const std::vector<int>& hosts,
                                    bool servers, const Config& config) {
  std::vector<JobContext> members;
  for (Role role : {Role::Worker, Role::Server}) {
    if (role == Role::Server && !servers) break;
    for (int host = 0; host < static_cast<int>(hosts.size()); ++host) {
      const int slots = role == Role::Worker ? hosts[static_cast<size_t>(host)] : 1;
      for (int slot = 0; slot < slots; ++slot) {
        JobContext m;
        m.identity.id = {role, host, slot};
        m.device = cpu();
        m.transport = std::make_unique<LoopbackTransport>(network);
        if (role == Role::Worker && servers) m.clientTransport = std::make_unique<LoopbackTransport>(network);
        m.openTransport = [network](uint8_t) { return std::make_unique<LoopbackTransport>(network); };
        members.push_back(std::move(m));
      }
    }
  }
  Roster roster;
  roster.worldSize = static_cast<int>(members.size());
  for (size_t r = 0; r < members.size(); ++r) {
    const JobContext& m = members[r];
    roster.members.push_back({m.identity.id, static_cast<int>(r), m.transport->address(),
                              m.clientTransport ? m.clientTransport->address() : std::vector<uint8_t>{}});
  }
  for (size_t r = 0; r < members.size(); ++r) {
    members[r].roster = roster;
    members[r].roster.rank = static_cast<int>(r);
    connectJob(members[r], config);
  }
  return members;
}

/// A regression model with an embedding (sparse gradient) and a dense layer, in float64; with
/// `averaged`, exponential moving averages of both, updated after every step.
struct Model {
  Graph g;
  Output ids, x, y, loss;
  Node* step = nullptr;

  explicit Model(bool averaged = false) {
    g.setSeed(3);
    ids = g.placeholder("ids", i64, {-1});
    x = g.placeholder("x", f64, {-1, 6});
    y = g.placeholder("y", f64, {-1, 1});
    const Output table = g.variable("embedding", f64, {40, 6}, Initializer::normal(0, 0.5));
    const Output w = g.variable("w", f64, {6, 1}, Initializer::glorotUniform());
    const Output prediction = matmul(gather(table, ids) * x, w);
    loss = mean(square(prediction - y));
    step = optim::Adam(0.05).minimize(loss);
    if (averaged) step = optim::ExponentialMovingAverage(0.7).apply({table, w}, step);
  }
};

struct Batch {
  Tensor ids, x, y;
  /// Examples [begin, end) of the batch.
  Batch part(int64_t begin, int64_t end) const {
    auto rows = [&](const Tensor& t) {
      const int64_t width = t.numel() / t.shape()[0];
      Shape s = t.shape();
      s[0] = end - begin;
      Tensor out(t.dtype(), s);
      std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + begin * width * dtypeSize(t.dtype()), out.bytes());
      return out;
    };
    return {rows(ids), rows(x), rows(y)};
  }
};

Batch batchOf(int64_t step, int64_t size) {
  Batch b{Tensor(i64, {size}), randomTensor(f64, {size, 6}, 100 + static_cast<uint64_t>(step)),
          randomTensor(f64, {size, 1}, 200 + static_cast<uint64_t>(step))};
  // Few ids, so that the workers' rows overlap and local aggregation has rows to sum.
  for (int64_t i = 0; i < size; ++i) b.ids.data<int64_t>()[i] = (i * 7 + step * 3) % 13;
  return b;
}

constexpr int64_t kBatch = 16, kSteps = 5;

FeedMap feedsOf(const Model& m, const Batch& b) { return {{m.ids, b.ids}, {m.x, b.x}, {m.y, b.y}}; }

/// kSteps steps of `runner` on its rank's part of each total batch, cut into `workers` parts.
void trainPart(Runner& runner, const Model& m, int64_t workers) {
  const int64_t part = kBatch / workers, rank = runner.rank();
  for (int64_t step = 0; step < kSteps; ++step)
    runner.run({m.loss}, feedsOf(m, batchOf(step, kBatch).part(rank * part, (rank + 1) * part)), {m.step});
}

std::map<std::string, std::vector<double>> variablesOf(Session& s) {
  std::map<std::string, std::vector<double>> out;
  for (Node* v : s.graph().variables()) out[v->name] = s.variable(v).toDoubles();
  return out;
}

/// The variables one session reaches on the total batches, after `steps` steps.
std::map<std::string, std::vector<double>> trainedAlone(bool averaged = false, int64_t steps = kSteps) {
  Model m(averaged);
  Session s(m.g, {1, false});
  for (int64_t step = 0; step < steps; ++step) s.run({m.loss}, feedsOf(m, batchOf(step, kBatch)), {m.step});
  return variablesOf(s);
}

/// The variables worker 0 holds after training the same batches as a job on `hosts`.
/// With `impostor`, an endpoint of the network that is none of the job's members' sends each
/// server requests in the workers' names (a LOAD as worker 0, a PUSH and a GOODBYE as worker 1)
/// before the job starts.
std::map<std::string, std::vector<double>> trainedAsJob(const std::vector<int>& hosts, Architecture architecture,
                                                        bool localAggregation = true, bool impostor = false,
                                                        bool averaged = false) {
  auto network = std::make_shared<LoopbackNetwork>();
  Config config = jobConfig(architecture);
  config.localAggregation = localAggregation;
  std::vector<JobContext> members = loopbackJob(network, hosts, true, config);
  LoopbackTransport outsider(network);
  for (const JobContext& m : members) {
    if (!impostor || !m.isServer()) continue;
    const int server = outsider.connect(m.transport->address(), 0);
    const std::vector<uint8_t> garbage(1 << 12, 0xee);
    for (const auto& [kind, worker] :
         {std::pair{RequestKind::Load, 0u}, {RequestKind::Push, 1u}, {RequestKind::Goodbye, 1u}})
      outsider.sendMessage(server, encode(RequestHeader{kind, 0, worker, 1000 + worker, 0}), garbage,
                           Clock::now() + 1s);
  }
  int workers = 0;
  for (int h : hosts) workers += h;
  std::map<std::string, std::vector<double>> result;
  std::vector<int> serverStatus(members.size(), 0);
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    Model m(averaged);
    if (members[i].isServer()) {
      serverStatus[i] = serveJob(members[i], m.g, config);
      return;
    }
    Runner runner = makeWorker(std::move(members[i]), m.g, config);
    trainPart(runner, m, workers);
    runner.finish();
    if (runner.rank() == 0) result = variablesOf(runner.session());
  });
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (int status : serverStatus) CHECK(status == 0);
  return result;
}

void checkSame(const std::map<std::string, std::vector<double>>& a,
               const std::map<std::string, std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, values] : a) {
    CAPTURE(name);
    const std::vector<double>& other = b.at(name);
    REQUIRE(values.size() == other.size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      diff = std::max(diff, std::abs(values[i] - other[i]));
      scale = std::max(scale, std::abs(values[i]));
    }
    // float64, 5 steps: only the order of summation differs (see test_dist_train's bound).
    CHECK(diff <= 1e-10 * std::max(scale, 1.0));
  }
}

/// In-process transports of `ranks` ring ranks, each connected to every other.
struct RingTransports {
  explicit RingTransports(int ranks)
      : peers(static_cast<size_t>(ranks), std::vector<int>(static_cast<size_t>(ranks), -1)) {
    auto network = std::make_shared<LoopbackNetwork>();
    for (int r = 0; r < ranks; ++r) transports.push_back(std::make_unique<LoopbackTransport>(network));
    for (size_t r = 0; r < transports.size(); ++r)
      for (size_t q = 0; q < transports.size(); ++q)
        if (q != r) peers[r][q] = transports[r]->connect(transports[q]->address(), static_cast<EndpointName>(q));
  }
  std::vector<std::unique_ptr<LoopbackTransport>> transports;
  std::vector<std::vector<int>> peers;
};

}  // namespace

TEST_CASE("the ring's AllReduce, AllGather and Broadcast over in-process transports") {
  const int ranks = 4;
  RingTransports net(ranks);
  for (bool twoMachines : {false, true}) {
    CAPTURE(twoMachines);
    std::vector<std::vector<double>> sums(ranks), gathered(ranks), broadcasts(ranks);
    const std::vector<std::string> errors = onThreads(ranks, [&](size_t r) {
      Ring ring(*net.transports[r], static_cast<int>(r), net.peers[r], 30s);
      if (twoMachines) ring.setMachines({0, 0, 1, 1}, true);
      std::vector<double> own(1000);
      for (size_t i = 0; i < own.size(); ++i) own[i] = static_cast<double>(r * 1000 + i);
      ring.allReduceSum(f64, own.data(), static_cast<int64_t>(own.size()));
      sums[r] = own;
      const double mine[2] = {static_cast<double>(r), static_cast<double>(r * r)};
      const std::vector<uint8_t> all = ring.allGather({reinterpret_cast<const uint8_t*>(mine), sizeof mine});
      gathered[r].assign(reinterpret_cast<const double*>(all.data()),
                         reinterpret_cast<const double*>(all.data()) + 2 * ranks);
      std::vector<double> value{r == 2 ? 42.0 : -1.0};
      ring.broadcast({reinterpret_cast<uint8_t*>(value.data()), sizeof(double)}, 2);
      broadcasts[r] = value;
    });
    for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      for (size_t i = 0; i < 1000; i += 97) CHECK(sums[r][i] == static_cast<double>(6000 + 4 * i));
      CHECK(gathered[r] == std::vector<double>{0, 0, 1, 1, 2, 4, 3, 9});
      CHECK(broadcasts[r] == std::vector<double>{42.0});
    }
  }
}

TEST_CASE("the ring's reduce-scatter leaves each rank the sum of its chunk, and the all-gather every rank's chunk") {
  const int ranks = 3;
  RingTransports net(ranks);
  // Chunks of unequal sizes, one of them empty (a shard of a variable smaller than the ring).
  const std::vector<int64_t> counts{5, 0, 7};
  const int64_t total = 12;
  std::vector<std::vector<double>> reduced(ranks), gathered(ranks);
  const std::vector<std::string> errors = onThreads(ranks, [&](size_t r) {
    Ring ring(*net.transports[r], static_cast<int>(r), net.peers[r], 30s);
    std::vector<double> own(total);
    for (int64_t i = 0; i < total; ++i) own[static_cast<size_t>(i)] = static_cast<double>((r + 1) * 100 + i);
    ring.reduceScatterSum(f64, own.data(), counts);
    reduced[r] = own;
    std::vector<double> mine(total, -1);  // only this rank's chunk is filled in
    int64_t begin = 0;
    for (size_t q = 0; q < r; ++q) begin += counts[q];
    for (int64_t i = 0; i < counts[r]; ++i) mine[static_cast<size_t>(begin + i)] = static_cast<double>(r * 10 + i);
    const std::vector<size_t> sizes{5 * sizeof(double), 0, 7 * sizeof(double)};
    ring.allGatherChunks(mine.data(), sizes);
    gathered[r] = mine;
  });
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  // Rank 0 owns elements [0, 5), rank 2 [5, 12): each sums 100 + 200 + 300 + 3 i.
  for (int64_t i = 0; i < 5; ++i) CHECK(reduced[0][static_cast<size_t>(i)] == 600.0 + 3.0 * static_cast<double>(i));
  for (int64_t i = 5; i < 12; ++i) CHECK(reduced[2][static_cast<size_t>(i)] == 600.0 + 3.0 * static_cast<double>(i));
  std::vector<double> expected;
  for (int64_t i = 0; i < 5; ++i) expected.push_back(static_cast<double>(i));
  for (int64_t i = 0; i < 7; ++i) expected.push_back(static_cast<double>(20 + i));
  for (int r = 0; r < ranks; ++r) CHECK(gathered[r] == expected);
}

TEST_CASE("the ring's AllReduce with bf16 or f16 on the wire: f32 sums within the rounding, equal on every rank, "
          "half the bytes") {
  const int ranks = 4;
  const int64_t count = 1001;  // chunks of unequal length
  RingTransports net(ranks);
  auto valueOf = [](int r, int64_t i) { return std::sin(0.37 * static_cast<double>(i) + r) * (1.0 + i % 7); };
  for (DType wire : {bf16, f16}) {
    for (bool twoMachines : {false, true}) {
      CAPTURE(dtypeName(wire));
      CAPTURE(twoMachines);
      std::vector<std::vector<float>> sums(ranks);
      std::vector<uint64_t> sent(ranks);
      const std::vector<std::string> errors = onThreads(ranks, [&](size_t r) {
        Ring ring(*net.transports[r], static_cast<int>(r), net.peers[r], 30s);
        if (twoMachines) ring.setMachines({0, 0, 1, 1}, true);
        std::vector<float> own(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) own[static_cast<size_t>(i)] = static_cast<float>(valueOf(int(r), i));
        const uint64_t before = net.transports[r]->bytesSent();
        ring.allReduceSum(f32, own.data(), count, wire);
        sent[r] = net.transports[r]->bytesSent() - before;
        sums[r] = own;
      });
      for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
      // A value is rounded at most 4 times on its way (3 partial sums sent, and the final sum),
      // each time by at most half a unit in the last place of a value no larger than the sum of
      // magnitudes: 2^-8 of it for bf16 (7 stored mantissa bits), 2^-11 for f16 (10).
      const double unit = wire == bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      for (int64_t i = 0; i < count; ++i) {
        double exact = 0, magnitude = 0;
        for (int r = 0; r < ranks; ++r) exact += valueOf(r, i), magnitude += std::abs(valueOf(r, i));
        CAPTURE(i);
        CHECK(std::abs(sums[0][static_cast<size_t>(i)] - exact) <= 4 * unit * magnitude);
        for (int r = 1; r < ranks; ++r) CHECK(sums[r][static_cast<size_t>(i)] == sums[0][static_cast<size_t>(i)]);
      }
      if (!twoMachines) {
        // A flat ring: each rank sends 2 (N - 1) / N of the buffer, in 2 bytes a value.
        for (int r = 0; r < ranks; ++r) CHECK(sent[r] <= 2 * 3 * (static_cast<uint64_t>(count) / 4 + 1) * 2);
      }
    }
  }
  Ring ring(*net.transports[0], 0, net.peers[0], 30s);
  double values[2] = {1, 2};
  CHECK(errorOf([&] { ring.allReduceSum(f64, values, 2, bf16); }) ==
        "AllReduce: f64 values cannot travel as bf16 (only f32 sums travel narrower, as bf16 or f16)");
}

TEST_CASE("a job of threads trains like one session on the total batch, under each architecture") {
  const auto alone = trainedAlone();
  for (Architecture a : {Architecture::Auto, Architecture::AllReduce, Architecture::ParameterServer}) {
    CAPTURE(architectureName(a));
    checkSame(trainedAsJob({2}, a), alone);
  }
}

TEST_CASE("moving averages of served variables, kept on the servers, end as one session's") {
  const auto alone = trainedAlone(true);
  REQUIRE(alone.count("embedding/ExponentialMovingAverage") == 1);
  checkSame(trainedAsJob({2}, Architecture::Auto, true, false, true), alone);
  checkSame(trainedAsJob({2, 2}, Architecture::ParameterServer, true, false, true), alone);
}

TEST_CASE("a worker that finishes with ServedValues::Leave keeps its own copies; one that pulls takes the servers'") {
  const std::map<std::string, std::vector<double>> alone = trainedAlone();
  auto network = std::make_shared<LoopbackNetwork>();
  const Config config = jobConfig(Architecture::ParameterServer);
  std::vector<JobContext> members = loopbackJob(network, {2}, true, config);
  std::vector<std::map<std::string, std::vector<double>>> workers(2);
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    Model m;
    if (members[i].isServer()) {
      CHECK(serveJob(members[i], m.g, config) == 0);
      return;
    }
    Runner runner = makeWorker(std::move(members[i]), m.g, config);
    trainPart(runner, m, 2);
    runner.finish(runner.rank() == 0 ? ServedValues::Pull : ServedValues::Leave);
    workers[static_cast<size_t>(runner.rank())] = variablesOf(runner.session());
  });
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  checkSame(workers[0], alone);
  // Worker 1 never took the servers' values: its copies are as it initialised them.
  for (const char* served : {"embedding", "w"}) {
    CAPTURE(served);
    CHECK(workers[1].at(served) != alone.at(served));
    CHECK(workers[1].at(served) == trainedAlone(false, 0).at(served));
  }
}

TEST_CASE("the other workers wait for worker 0's work alone (its evaluation) past the timeout, then go on") {
  auto network = std::make_shared<LoopbackNetwork>();
  Config config = jobConfig(Architecture::AllReduce);
  config.timeout = 3s;
  std::vector<JobContext> members = loopbackJob(network, {3}, false, config);
  std::vector<double> means(members.size(), 0);
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    Model m;
    Runner runner = makeWorker(std::move(members[i]), m.g, config);
    runner.runOnWorker0([] { std::this_thread::sleep_for(7s); });  // more than twice the timeout
    means[i] = runner.meanOverWorkers(static_cast<double>(runner.rank()));
    runner.finish();
  });
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (double mean : means) CHECK(mean == 1.0);  // (0 + 1 + 2) / 3: every worker went on together
}

TEST_CASE("two machines of two workers: each machine's pushes and pulls go through its aggregator") {
  const auto alone = trainedAlone();
  checkSame(trainedAsJob({2, 2}, Architecture::Auto), alone);
  checkSame(trainedAsJob({2, 2}, Architecture::ParameterServer), alone);
  checkSame(trainedAsJob({2, 2}, Architecture::Auto, false), alone);
}

TEST_CASE("requests in a worker's name from another endpoint are refused and the job trains as before") {
  checkSame(trainedAsJob({2}, Architecture::ParameterServer, true, true), trainedAlone());
  checkSame(trainedAsJob({2, 2}, Architecture::Auto, true, true), trainedAlone());
}

TEST_CASE("a worker that dies mid-job stops the other worker and the server with an error, not a hang") {
  auto network = std::make_shared<LoopbackNetwork>();
  const Config config = jobConfig(Architecture::Auto);
  std::vector<JobContext> members = loopbackJob(network, {2}, true, config);
  const int deadRing = dynamic_cast<LoopbackTransport&>(*members[1].transport).endpoint();
  const int deadClient = dynamic_cast<LoopbackTransport&>(*members[1].clientTransport).endpoint();
  int serverStatus = -1;
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    Model m;
    if (members[i].isServer()) {
      serverStatus = serveJob(members[i], m.g, config);
      return;
    }
    Runner runner = makeWorker(std::move(members[i]), m.g, config);
    const Batch b = batchOf(0, kBatch).part(runner.rank() * 8, runner.rank() * 8 + 8);
    runner.run({m.loss}, feedsOf(m, b), {m.step});
    if (runner.rank() == 1) {
      network->fail(deadRing, "killed by the test");
      network->fail(deadClient, "killed by the test");
      throw Error("worker 1 died");
    }
    for (int step = 0; step < 3; ++step) runner.run({m.loss}, feedsOf(m, b), {m.step});
  });
  CHECK(errors[1] == "worker 1 died");
  // Worker 0 learns it from its ring or from the server, which stops on worker 1's death.
  CAPTURE(errors[0]);
  CHECK((contains(errors[0], "killed by the test") || contains(errors[0], "on server 0")));
  CHECK(serverStatus == 1);
}

namespace {

/// Stages the author chose with Graph::stage scopes (one 4 x 4 layer each, as many as the
/// schedule has over two processes), trained pipelined by two workers over two micro-batches
/// under a memory limit (0: none); rank 0's pipelinePlan() and each worker's error.
std::pair<std::string, std::vector<std::string>> authorStagedJob(double memoryPerStage,
                                                                  const StepSchedule& schedule = {}) {
  auto network = std::make_shared<LoopbackNetwork>();
  Config config = jobConfig(Architecture::AllReduce);
  config.pipeline.stages = 2;
  config.pipeline.microbatches = 2;
  config.pipeline.schedule = schedule;
  config.pipeline.memoryPerStage = memoryPerStage;
  std::vector<JobContext> members = loopbackJob(network, {2}, false, config);
  std::string plan;
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    Graph g;
    const Output x = g.placeholder("x", f64, {-1, 4});
    Output h = x;
    const int stages = schedule.modelStages(2);
    for (int s = 0; s < stages; ++s) {
      auto staged = g.stage(s);
      h = matmul(h, g.variable(fmt::format("w{}", s), f64, {4, 4}, Initializer::glorotUniform()));
      if (s + 1 < stages) h = tanh(h);
    }
    const Output loss = mean(square(h));
    Node* step = optim::SGD(0.1).minimize(loss);
    Runner runner = makeWorker(std::move(members[i]), g, config);
    runner.run({loss}, {{x, randomTensor(f64, {8, 4}, 5)}}, {step});
    if (runner.rank() == 0) plan = runner.pipelinePlan();
  });
  return {plan, errors};
}

}  // namespace

TEST_CASE("a pipeline the author cut: the job reckons what each stage holds and holds it to the memory limit") {
  const auto [plan, errors] = authorStagedJob(0);
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  // Each stage: one 4 x 4 float64 weight (128 B) and its gradient; SGD keeps no slots.
  CHECK(contains(plan, "stage 0 (the model's stage scopes): holds "));
  CHECK(contains(plan, "stage 1 (the model's stage scopes): holds "));
  CHECK(contains(plan, "(parameters 128 B, gradients 128 B, optimizer state 0 B, activations 2 x "));
  const auto [none, refused] = authorStagedJob(100);
  for (const std::string& e : refused)
    CHECK(contains(e, "pipeline stage 0 of the model's stage scopes holds "));
}

TEST_CASE("a pipeline the author cut into 4 stages on 2 processes (zbv): the limit holds for each process's stages") {
  const StepSchedule zbv(PipelineSchedule::ZeroBubbleV);
  const auto [plan, errors] = authorStagedJob(0, zbv);
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(contains(plan, "stage 3 (the model's stage scopes): holds "));
  // Every stage fits 1,100 bytes (768 each, the last 1,040), but no process's two stages do together:
  // process 0 holds 768 + 1,040.
  const auto [none, refused] = authorStagedJob(1100, zbv);
  for (const std::string& e : refused) CHECK_MESSAGE(contains(e, "pipeline process 0 holds 1808 bytes"), e);
}

namespace {

/// A dense regression model whose loss is scaled (optim::LossScaling), in float64; its feeds
/// may hold an infinity, which overflows the scaled gradient of whoever reads it.
struct ScaledModel {
  Graph g;
  Output x, y, loss;
  Node* step = nullptr;

  explicit ScaledModel(bool embedding = false) {
    g.setSeed(4);
    x = g.placeholder("x", f64, {-1, 6});
    y = g.placeholder("y", f64, {-1, 1});
    Output features = x;
    if (embedding) {  // a sparse gradient, which Architecture::Auto serves from the servers
      const Output table = g.variable("embedding", f64, {8, 6}, Initializer::normal(0, 0.5));
      features = features * gather(table, cast(sum(x * 0.0, {1}) + 1.0, i64));
    }
    const Output w = g.variable("w", f64, {6, 1}, Initializer::glorotUniform());
    loss = mean(square(matmul(features, w) - y));
    optim::MinimizeOptions options;
    options.lossScaling = optim::LossScaling{};
    step = optim::SGD(0.1).minimize(loss, options);
  }
};

/// The total batch of `step`; the first step's last example is infinite, in the second half.
std::pair<Tensor, Tensor> scaledBatch(int64_t step) {
  Tensor x = randomTensor(f64, {kBatch, 6}, 300 + static_cast<uint64_t>(step));
  if (step == 0) x.data<double>()[x.numel() - 1] = INFINITY;
  return {x, randomTensor(f64, {kBatch, 1}, 400 + static_cast<uint64_t>(step))};
}

Tensor rowsOf(const Tensor& t, int64_t begin, int64_t end) {
  Shape s = t.shape();
  s[0] = end - begin;
  Tensor out(t.dtype(), s);
  const int64_t width = t.numel() / t.shape()[0];
  std::memcpy(out.raw(), t.data<double>() + begin * width, out.bytes());
  return out;
}

}  // namespace

namespace {

/// kSteps steps of a loss-scaled model M in one session on the total batches `batchOf(step)`.
/// With `checkNumerics`, an overflow anywhere but in the scaled backward pass stops the run.
template <class M, class Batches>
std::map<std::string, std::vector<double>> scaledAlone(Batches batchOf, bool checkNumerics) {
  M m;
  Session s(m.g, {1, checkNumerics});
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [x, y] = batchOf(step);
    s.run({m.loss}, {{m.x, x}, {m.y, y}}, {m.step});
  }
  return variablesOf(s);
}

/// The same steps on the two workers of a job under `config`, each fed its half of every batch:
/// each worker's variables, worker 0's whole where the workers keep shards (Config::sharding).
template <class M, class Batches>
std::vector<std::map<std::string, std::vector<double>>> scaledOnTwoWorkers(const Config& config, Batches batchOf) {
  auto network = std::make_shared<LoopbackNetwork>();
  std::vector<JobContext> members = loopbackJob(network, {2}, false, config);
  std::vector<std::map<std::string, std::vector<double>>> workers(2);
  const std::vector<std::string> errors = onThreads(members.size(), [&](size_t i) {
    M m;
    Runner runner = makeWorker(std::move(members[i]), m.g, config);
    const int64_t part = kBatch / 2, rank = runner.rank();
    for (int64_t step = 0; step < kSteps; ++step) {
      const auto [x, y] = batchOf(step);
      runner.run({m.loss},
                 {{m.x, rowsOf(x, rank * part, (rank + 1) * part)}, {m.y, rowsOf(y, rank * part, (rank + 1) * part)}},
                 {m.step});
    }
    const WholeValues wholes = runner.gatherShards();
    runner.finish();
    std::map<std::string, std::vector<double>>& held = workers[static_cast<size_t>(rank)];
    held = variablesOf(runner.session());
    for (const auto& [name, whole] : wholes) held[name] = whole.toDoubles();
  });
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  return workers;
}

}  // namespace

TEST_CASE("a step that overflows on one worker is skipped by every worker, as one session skips it") {
  const auto alone = scaledAlone<ScaledModel>(scaledBatch, false);
  // One step skipped, the scale halved once, every other step applied.
  CHECK(alone.at("global_step")[0] == kSteps - 1);
  CHECK(alone.at("loss_scale")[0] == optim::LossScaling{}.initial / 2);
  // Only worker 1's half of the first batch holds the infinity.
  const auto workers = scaledOnTwoWorkers<ScaledModel>(jobConfig(Architecture::AllReduce), scaledBatch);
  checkSame(workers[0], alone);
  checkSame(workers[1], alone);
}

namespace {

/// A loss-scaled regression of each of 6 columns on sqrt(x^2 w), in float64, trained by Adam:
/// where x is exactly 0 in column 5, the forward pass stays finite but the gradient of weight 5
/// alone is 0/0, which under --shard lies in the last worker's shard, so that only that worker's
/// own check of its shard sees it.
struct ColumnModel {
  Graph g;
  Output x, y, loss;
  Node* step = nullptr;

  ColumnModel() {
    g.setSeed(5);
    x = g.placeholder("x", f64, {-1, 6});
    y = g.placeholder("y", f64, {-1, 6});
    const Output w = g.variable("w", f64, {6}, Initializer::constant(1));
    loss = mean(square(sqrt(x * x * w) - y));
    optim::MinimizeOptions options;
    options.lossScaling = optim::LossScaling{};
    step = optim::Adam(0.1).minimize(loss, options);
  }
};

/// The total batch of `step`; the second step's last example is 0 in column 5.
std::pair<Tensor, Tensor> columnBatch(int64_t step) {
  Tensor x = randomTensor(f64, {kBatch, 6}, 500 + static_cast<uint64_t>(step));
  if (step == 1) x.data<double>()[x.numel() - 1] = 0;
  return {x, randomTensor(f64, {kBatch, 6}, 600 + static_cast<uint64_t>(step))};
}

}  // namespace

TEST_CASE(
    "--shard: a step that overflows in one worker's shard alone is skipped by every worker, as one session "
    "skips it") {
  // The skipped step's 0/0 is left to the loss scale; checkNumerics stops at any other.
  const auto alone = scaledAlone<ColumnModel>(columnBatch, true);
  CHECK(alone.at("global_step")[0] == kSteps - 1);
  CHECK(alone.at("loss_scale")[0] == optim::LossScaling{}.initial / 2);
  for (const Sharding sharding : {Sharding::Optimizer, Sharding::Parameters}) {
    CAPTURE(std::string(shardingName(sharding)));
    Config config = jobConfig(Architecture::AllReduce);
    config.sharding = sharding;
    config.session.checkNumerics = true;
    // Only worker 1's half of the second batch holds the 0. The weight, Adam's slots of it, the
    // loss scale, its count of good steps and the step count, whole on worker 0:
    checkSame(scaledOnTwoWorkers<ColumnModel>(config, columnBatch)[0], alone);
  }
}

TEST_CASE("a loss-scaled step with a variable on the parameter servers is refused, naming the variable") {
  auto network = std::make_shared<LoopbackNetwork>();
  const Config config = jobConfig(Architecture::Auto);
  std::vector<JobContext> members = loopbackJob(network, {1}, true, config);
  ScaledModel m(true);
  const std::string e = errorOf([&] { makeWorker(std::move(members[0]), m.g, config); });
  CHECK(contains(e, "which the parameter servers do not see: 'embedding' is updated there"));
  CHECK(contains(e, "--arch ar"));
}
