// The AMP runtime over several processes (each here a thread with its own graph, model and
// runtime, joined by in-process transports; `weft train --amp --processes` runs them as
// processes over UCX): every message crosses processes as a node's worker says, training equals
// training in one process, every forward message is answered, and a failure anywhere stops all.
#include "tests/TestUtil.h"

#include "dist/transport/LoopbackTransport.h"
#include "dist/amp/AmpRuntime.h"
#include "models/AmpModels.h"
#include "optim/Optimizer.h"

#include <optional>

using namespace weft;

namespace {

std::unique_ptr<models::AmpModel> model(const std::string& name, const std::map<std::string, int64_t>& settings) {
  auto m = models::makeAmpModel(name);
  for (const models::ModelOption& o : m->options())
    if (auto it = settings.find(o.name); it != settings.end()) *std::get<int64_t*>(o.target) = it->second;
  m->build({5, "", f64, 1});
  return m;
}

struct JobResult {
  std::vector<std::string> errors;
  std::vector<amp::EpochReport> reports;  // the controller's, per epoch
  std::map<std::string, Tensor> variables;
};

/// How a job trains: SGD afresh, or Adam (optimizer state to carry over), resuming from the
/// controller's `from` when set.
struct Training {
  bool adam = false;
  std::optional<amp::ResumePoint> from;
};

/// Trains `epochs` epochs of `count` instances with `processes` runtimes of `workers` workers
/// each, joined by in-process transports.
JobResult runJob(const std::string& name, const std::map<std::string, int64_t>& settings, int processes, int workers,
                 amp::AmpOptions options, double learningRate, int64_t count, int epochs,
                 const Training& training = {}) {
  auto network = std::make_shared<dist::LoopbackNetwork>();
  std::vector<std::unique_ptr<dist::LoopbackTransport>> transports;
  for (int p = 0; p < processes; ++p) transports.push_back(std::make_unique<dist::LoopbackTransport>(network));
  std::vector<std::vector<int>> peers(static_cast<size_t>(processes),
                                      std::vector<int>(static_cast<size_t>(processes), -1));
  for (int r = 0; r < processes; ++r)
    for (int q = 0; q < processes; ++q)
      if (q != r)
        peers[static_cast<size_t>(r)][static_cast<size_t>(q)] = transports[static_cast<size_t>(r)]->connect(
            transports[static_cast<size_t>(q)]->address(), static_cast<dist::EndpointName>(q));
  std::vector<std::unique_ptr<models::AmpModel>> models;
  for (int p = 0; p < processes; ++p) models.push_back(model(name, settings));
  options.workers = workers;
  JobResult result;
  result.errors = onThreads(static_cast<size_t>(processes), [&](size_t p) {
    models::AmpModel& m = *models[p];
    amp::AmpProcesses job{static_cast<int>(p), processes, processes > 1 ? transports[p].get() : nullptr, peers[p]};
    amp::AmpOptions mine = options;  // an optimizer builds into one graph at a time: one per process
    if (training.adam)
      mine.optimizer = std::make_shared<optim::Adam>(learningRate);
    else
      mine.optimizer = std::make_shared<optim::SGD>(learningRate);
    try {
      amp::Runtime runtime(m.graph(), mine, job);
      // Only the controller holds the checkpoint; the others take their part from it.
      if (training.from) runtime.resume(p == 0 ? training.from : std::nullopt);
      for (int e = 0; e < epochs; ++e) {
        amp::EpochReport r = runtime.train(count, [&](int64_t i) { return m.trainInstance(i); });
        runtime.evaluate(4, [&](int64_t i) { return m.evalInstance(i); });
        if (p == 0) result.reports.push_back(r);
      }
      if (p == 0) result.variables = runtime.variables();
    } catch (const std::exception& e) {
      network->fail(transports[p]->endpoint(), e.what());
      throw;
    }
  });
  return result;
}

void checkSameVariables(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, value] : a) {
    if (value.dtype() != f64) {
      CHECK_MESSAGE(value.toDoubles() == b.at(name).toDoubles(), name);  // step counters
      continue;
    }
    CHECK_MESSAGE(relativeDifference(value, b.at(name)) < 1e-12, name);
  }
}

void checkNoErrors(const JobResult& r) {
  for (size_t p = 0; p < r.errors.size(); ++p)
    CHECK_MESSAGE(r.errors[p].empty(), "process " << p << ": " << r.errors[p]);
}

}  // namespace

TEST_CASE("synchronous training over 2 and 3 processes equals training in one process") {
  const std::map<std::string, int64_t> small{{"hidden", 6}, {"embedding", 3}, {"train-size", 12}, {"eval-size", 4}};
  amp::AmpOptions options{.maxActiveKeys = 3, .minibatch = 4};
  JobResult one = runJob("list_reduction", small, 1, 2, options, 0.1, 12, 2);
  checkNoErrors(one);
  for (int processes : {2, 3}) {
    CAPTURE(processes);
    JobResult many = runJob("list_reduction", small, processes, 1, options, 0.1, 12, 2);
    checkNoErrors(many);
    checkSameVariables(many.variables, one.variables);
    CHECK(many.reports.back().loss == doctest::Approx(one.reports.back().loss).epsilon(1e-9));
  }
}

TEST_CASE("a job resumed from the controller's variables after an epoch ends as the uninterrupted job") {
  const std::map<std::string, int64_t> small{{"hidden", 6}, {"embedding", 3}, {"train-size", 12}, {"eval-size", 4}};
  amp::AmpOptions options{.maxActiveKeys = 3, .minibatch = 4};
  const Training adam{.adam = true, .from = std::nullopt};
  JobResult whole = runJob("list_reduction", small, 3, 1, options, 0.01, 12, 3, adam);
  JobResult first = runJob("list_reduction", small, 3, 1, options, 0.01, 12, 1, adam);
  checkNoErrors(whole);
  checkNoErrors(first);
  CHECK(first.variables.count("linear/Adam/linear/weight/m") == 1);  // the optimizer's state goes with it
  JobResult rest = runJob("list_reduction", small, 3, 1, options, 0.01, 12, 2,
                          {.adam = true, .from = amp::ResumePoint{first.variables, 1}});
  checkNoErrors(rest);
  checkSameVariables(rest.variables, whole.variables);
  CHECK(rest.reports.back().loss == doctest::Approx(whole.reports.back().loss).epsilon(1e-9));
}

TEST_CASE("a checkpoint that lacks a variable of another process stops every process, naming it") {
  const std::map<std::string, int64_t> small{{"hidden", 6}, {"embedding", 3}, {"train-size", 12}, {"eval-size", 4}};
  amp::AmpOptions options{.maxActiveKeys = 3, .minibatch = 4};
  JobResult first = runJob("list_reduction", small, 2, 1, options, 0.1, 12, 1);
  checkNoErrors(first);
  std::map<std::string, Tensor> lacking = first.variables;
  REQUIRE(lacking.erase("linear/linear/bias") == 1);  // the hidden layer runs in process 1
  JobResult rest = runJob("list_reduction", small, 2, 1, options, 0.1, 12, 1, {.from = amp::ResumePoint{lacking, 1}});
  REQUIRE(rest.errors.size() == 2);
  for (const std::string& error : rest.errors) {
    CAPTURE(error);
    CHECK(contains(error, "process 1 cannot resume from the checkpoint"));
    CHECK(contains(error, "'linear/linear/bias' (f64[6]) is not in the checkpoint"));
  }
}

TEST_CASE("a checkpoint variable of no transform is refused before any process starts") {
  const std::map<std::string, int64_t> small{{"hidden", 6}, {"embedding", 3}, {"train-size", 12}, {"eval-size", 4}};
  amp::AmpOptions options{.maxActiveKeys = 3, .minibatch = 4};
  JobResult first = runJob("list_reduction", small, 2, 1, options, 0.1, 12, 1);
  checkNoErrors(first);
  std::map<std::string, Tensor> extra = first.variables;
  extra["decoder/weight"] = extra.begin()->second;
  JobResult rest = runJob("list_reduction", small, 2, 1, options, 0.1, 12, 1, {.from = amp::ResumePoint{extra, 1}});
  for (const std::string& error : rest.errors)
    CHECK_MESSAGE(contains(error, "'decoder/weight' belongs to no transform"), error);
}

TEST_CASE("message passing over each graph's nodes and edges, split across processes, equals one process") {
  const std::map<std::string, int64_t> small{{"hidden", 4},    {"propagation-steps", 2}, {"train-size", 8},
                                             {"eval-size", 4}, {"min-nodes", 4},         {"max-nodes", 7}};
  amp::AmpOptions options{.maxActiveKeys = 2, .minibatch = 4};
  JobResult one = runJob("ggsnn", small, 1, 3, options, 0.1, 8, 1);
  JobResult three = runJob("ggsnn", small, 3, 1, options, 0.1, 8, 1);
  checkNoErrors(one);
  checkNoErrors(three);
  checkSameVariables(three.variables, one.variables);
}

TEST_CASE("asynchronous training over processes answers every forward message and reports every node") {
  const std::map<std::string, int64_t> small{{"hidden", 5}, {"embedding", 3}, {"train-size", 30}, {"eval-size", 4}};
  amp::AmpOptions options{.maxActiveKeys = 6, .minUpdateFrequency = 3};
  JobResult r = runJob("tree_lstm", small, 2, 2, options, 0.05, 30, 2);
  checkNoErrors(r);
  REQUIRE(r.reports.size() == 2);
  const amp::EpochReport& last = r.reports.back();
  CHECK(last.workerUtilisation.size() == 4);
  for (const amp::NodeReport& n : last.nodes) {
    CHECK_MESSAGE(n.forwards > 0, n.name);
    for (size_t o = 0; o < n.sent.size(); ++o) CHECK_MESSAGE(n.sent[o] == n.answered[o], n.name);
  }
  CHECK(last.loss > 0);
}

TEST_CASE("a node failing in one process stops every process, and the controller names it") {
  const std::map<std::string, int64_t> small{{"hidden", 4}, {"embedding", 3}, {"train-size", 6}, {"eval-size", 4}};
  auto network = std::make_shared<dist::LoopbackNetwork>();
  dist::LoopbackTransport t0(network), t1(network);
  std::vector<std::vector<int>> peers{{-1, t0.connect(t1.address(), 1)}, {t1.connect(t0.address(), 0), -1}};
  auto m0 = model("list_reduction", small), m1 = model("list_reduction", small);
  std::vector<models::AmpModel*> ms{m0.get(), m1.get()};
  std::vector<dist::LoopbackTransport*> ts{&t0, &t1};
  auto errors = onThreads(2, [&](size_t p) {
    // Worker 1 (process 1) runs the output layer and the loss; instance 3 enters at a node that is
    // no input, which the controller refuses — and a label out of range fails in process 1.
    amp::Runtime runtime(ms[p]->graph(),
                         {.workers = 1, .maxActiveKeys = 2, .optimizer = std::make_shared<optim::SGD>(0.1)},
                         {static_cast<int>(p), 2, ts[p], peers[p]});
    try {
      runtime.train(6, [&](int64_t i) {
        amp::Pumped pumped = ms[p]->trainInstance(i);
        if (i == 3) {
          auto broken = std::make_shared<models::TokenListInstance>(pumped.instance->as<models::TokenListInstance>());
          broken->label = 99;
          pumped.instance = broken;
        }
        return pumped;
      });
    } catch (const std::exception& e) {
      network->fail(ts[p]->endpoint(), e.what());
      throw;
    }
  });
  INFO(errors[0]);
  INFO(errors[1]);
  REQUIRE(!errors[0].empty());
  REQUIRE(!errors[1].empty());
  CHECK(contains(errors[0], "loss 'loss'"));
  CHECK(contains(errors[0], "process 1"));
}
