// dist::TrainingLoop in one process (the job's way is tested through `weft launch` in
// tests/test_examples.sh): a run resumed from its checkpoint ends as the uninterrupted run,
// SIGTERM stops at a step with a checkpoint, other settings are refused, and a sample of the
// partition search trains its stretch and reports it.
#include "tests/TestUtil.h"

#include "core/Checkpoint.h"
#include "dist/Config.h"
#include "dist/TrainingLoop.h"
#include "nn/Layers.h"
#include "optim/Optimizer.h"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

using namespace weft;

namespace {

/// An environment variable set for a scope (the launcher's word, in a test).
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedVariable() { ::unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
};

/// A small regression trained by Adam, its batch a function of the step alone.
struct Model {
  Graph graph;
  Output x, y, loss;
  Node* step = nullptr;
  std::optional<nn::Linear> layer;

  Model() {
    graph.setSeed(3);
    x = graph.placeholder("x", f64, {4, 3});
    y = graph.placeholder("y", f64, {4, 1});
    layer.emplace(graph, "layer", 3, 1, true, f64);
    loss = mean(square((*layer)(x)-y));
    step = optim::Adam(0.05).minimize(loss);
  }

  FeedMap batch(int64_t step) const {
    std::vector<double> xs, ys;
    for (int64_t row = 0; row < 4; ++row) {
      double target = 0;
      for (int64_t col = 0; col < 3; ++col) {
        const double v = static_cast<double>((step * 7 + row * 3 + col) % 11) / 11.0;
        xs.push_back(v);
        target += v * static_cast<double>(col + 1);
      }
      ys.push_back(target);
    }
    return {{x, Tensor::fromVector(xs, {4, 3})}, {y, Tensor::fromVector(ys, {4, 1})}};
  }
};

struct Outcome {
  int status = 0;
  int64_t firstStep = 0, lastStep = 0;
  bool resumed = false, completed = false;
  std::vector<double> weight;
};

/// Trains `steps` steps with `options`; `duringStep(step)` runs inside each step.
Outcome train(int64_t steps, dist::TrainingLoopOptions options, const std::function<void(int64_t)>& duringStep = {}) {
  Model model;
  const dist::Config config;
  dist::Runner runner = dist::get_runner(model.graph, config);
  dist::TrainingLoop loop(runner, steps, std::move(options));
  Outcome outcome;
  outcome.firstStep = loop.step();
  outcome.resumed = loop.resumed();
  for (; loop.running(); loop.stepDone()) {
    runner.run({}, model.batch(loop.step()), {model.step});
    if (duringStep) duringStep(loop.step());
  }
  outcome.status = loop.finish();
  outcome.lastStep = loop.step();
  outcome.completed = loop.completed();
  outcome.weight = runner.session().variable(model.layer->weight.node()).toDoubles();
  return outcome;
}

dist::TrainingLoopOptions checkpointedAt(const std::string& path) {
  dist::TrainingLoopOptions options;
  options.checkpoint = path;
  options.checkpointEvery = 4;
  return options;
}

}  // namespace

TEST_CASE("a run resumed from its checkpoint ends with the variables of the uninterrupted run") {
  TempDir dir;
  const Outcome whole = train(12, checkpointedAt(dir.file("whole/checkpoint.safetensors")));
  CHECK(whole.status == 0);
  CHECK(whole.completed);
  const std::string path = dir.file("parts/checkpoint.safetensors");
  const Outcome first = train(5, checkpointedAt(path));
  CHECK(first.lastStep == 5);
  CHECK(readSafetensors(path).metadata.at("step") == "5");  // the end, between checkpoints
  const Outcome rest = train(12, checkpointedAt(path));
  CHECK(rest.resumed);
  CHECK(rest.firstStep == 5);
  CHECK(rest.weight == whole.weight);
}

TEST_CASE("SIGTERM stops the loop after its step with a checkpoint, and finish returns kExitPreempted") {
  TempDir dir;
  const std::string path = dir.file("checkpoint.safetensors");
  const Outcome stopped = train(12, checkpointedAt(path), [](int64_t step) {
    if (step == 6) std::raise(SIGTERM);
  });
  CHECK(stopped.status == dist::kExitPreempted);
  CHECK(stopped.lastStep == 7);
  CHECK_FALSE(stopped.completed);
  CHECK(readSafetensors(path).metadata.at("step") == "7");
  const Outcome rest = train(12, checkpointedAt(path));
  const Outcome whole = train(12, checkpointedAt(dir.file("whole.safetensors")));
  CHECK(rest.firstStep == 7);
  CHECK(rest.weight == whole.weight);
}

TEST_CASE("a checkpoint of a run with other settings is refused, naming each") {
  TempDir dir;
  dist::TrainingLoopOptions options = checkpointedAt(dir.file("checkpoint.safetensors"));
  options.settings = {{"lr", "0.05"}, {"data", "a.txt"}};
  train(3, options);
  options.settings = {{"lr", "0.1"}, {"data", "a.txt"}, {"batch", "8"}};
  const std::string error = errorOf([&] { train(6, options); });
  CHECK(contains(error, "was written by a run with other settings"));
  CHECK(contains(error, "'lr': 0.05 in the checkpoint, 0.1 now"));
  CHECK(contains(error, "'batch': not recorded in the checkpoint, 8 now"));
  CHECK_FALSE(contains(error, "'data'"));
}

TEST_CASE(
    "Resume::Always needs the checkpoint; Resume::Never starts afresh, removing it, unless the job was restarted") {
  TempDir dir;
  const std::string path = dir.file("checkpoint.safetensors");
  dist::TrainingLoopOptions always = checkpointedAt(path);
  always.resume = dist::Resume::Always;
  CHECK(contains(errorOf([&] { train(3, always); }), "resuming: no checkpoint at " + path));
  train(3, checkpointedAt(path));
  dist::TrainingLoopOptions never = checkpointedAt(path);
  never.resume = dist::Resume::Never;
  train(0, never);
  CHECK_FALSE(std::filesystem::exists(path));  // no restart of the new run may continue the old one
  train(3, checkpointedAt(path));
  CHECK_FALSE(train(6, never).resumed);  // which ends with a checkpoint of step 6
  const ScopedVariable restart(dist::kRestartCountVariable, "1");
  const Outcome restarted = train(9, never);
  CHECK(restarted.resumed);
  CHECK(restarted.firstStep == 6);
}

TEST_CASE("a sample of the partition search trains its stretch, times its second half and reports to the launcher") {
  TempDir dir;
  const std::string report = dir.file("sample.json"), path = dir.file("checkpoint.safetensors");
  train(2, checkpointedAt(path));
  {
    const ScopedVariable sample(dist::kPartitionSampleVariable, "4");
    const ScopedVariable to(dist::kPartitionReportVariable, report);
    const ScopedVariable partitions(dist::kPartitionsVariable, "2");
    const ScopedVariable resume(dist::kResumeVariable, "on");
    const Outcome sampled = train(20, checkpointedAt(path));
    CHECK(sampled.firstStep == 2);
    CHECK(sampled.lastStep == 6);
    CHECK_FALSE(sampled.completed);
  }
  std::ifstream in(report);
  const nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j.at("partitions") == 2);
  CHECK(j.at("timed_steps") == 2);
  CHECK(j.at("seconds_per_step").get<double>() > 0);
  CHECK(j.at("step") == 6);
  CHECK(j.at("steps") == 20);
  CHECK(readSafetensors(path).metadata.at("step") == "6");  // the next sample goes on from here
}

TEST_CASE("a sample of the partition search without a checkpoint path is refused") {
  const ScopedVariable sample(dist::kPartitionSampleVariable, "4");
  CHECK(contains(errorOf([] { train(10, {}); }), "has no checkpoint path"));
}

TEST_CASE("a launcher's setting that does not parse is refused, naming the variable and its value") {
  const dist::Config program;
  {
    const ScopedVariable sync(dist::kSyncVariable, "fast");
    CHECK(contains(errorOf([&] { dist::withLaunchSettings(program); }), "WEFT_SYNC=fast: "));
  }
  {
    const ScopedVariable stages(dist::kStagesVariable, "two");
    CHECK(contains(errorOf([&] { dist::withLaunchSettings(program); }), "WEFT_STAGES=two: expected a whole number"));
  }
  const ScopedVariable partitions(dist::kPartitionsVariable, "3");
  const ScopedVariable sync(dist::kSyncVariable, "ssp:2");
  const dist::Config config = dist::withLaunchSettings(program);
  CHECK(config.partitioning.count == 3);
  CHECK(config.sync->name() == "SSP(s=2)");
}
