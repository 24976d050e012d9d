// A data-parallel program: the same code trains alone, or as every process of a job that
//
//   weft launch --workers 2 --servers 1 -- ./data_parallel [CHECKPOINT_DIR [STEPS]]
//
// (or srun, mpirun, torchrun) starts. get_runner finds the job in the environment the launcher
// sets: the embedding table, whose gradient is sparse, lives on the parameter server; the dense
// head's gradients are summed by AllReduce. Each worker feeds its own part of every total batch,
// so the job computes what one process computes on the whole batch: worker 0 prints the loss and
// the trained variables' sums, which agree with a lone run's to rounding. With a checkpoint
// directory, dist::TrainingLoop checkpoints every 10 steps and resumes from there, so `weft
// launch --max-restarts`, `--partitions auto` and SIGTERM from a cluster engine work as for
// `weft train`.
#include "core/Session.h"
#include "dist/Runner.h"
#include "dist/TrainingLoop.h"
#include "nn/Layers.h"
#include "optim/Optimizer.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace weft;

namespace {

constexpr int64_t kVocab = 500, kDim = 8, kIdsPerExample = 4, kTotalBatch = 64, kDefaultSteps = 40;

/// Rows [first, first + count) of total batch `step`: ids, and a target the model can learn
/// (the mean of a fixed function of the ids). Every process makes the same total batch.
std::pair<Tensor, Tensor> batchPart(int64_t step, int64_t first, int64_t count) {
  std::mt19937_64 random(static_cast<uint64_t>(step) + 1);
  std::uniform_int_distribution<int64_t> id(0, kVocab - 1);
  std::vector<int64_t> ids;
  std::vector<double> targets;
  for (int64_t row = 0; row < kTotalBatch; ++row) {
    double target = 0;
    for (int64_t k = 0; k < kIdsPerExample; ++k) {
      const int64_t drawn = id(random);
      target += std::sin(static_cast<double>(drawn)) / kIdsPerExample;
      if (row >= first && row < first + count) ids.push_back(drawn);
    }
    if (row >= first && row < first + count) targets.push_back(target);
  }
  return {Tensor::fromVector(ids, {count, kIdsPerExample}), Tensor::fromVector(targets, {count, 1})};
}

double sumOf(const Tensor& t) {
  double sum = 0;
  for (double v : t.toDoubles()) sum += v;
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string checkpoints = argc > 1 ? argv[1] : "";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : kDefaultSteps;
  Graph g;
  g.setSeed(7);
  Output ids = g.placeholder("ids", i64, {-1, kIdsPerExample});
  Output target = g.placeholder("target", f64, {-1, 1});
  nn::Embedding embed(g, "embed", kVocab, kDim, f64);
  nn::Linear head(g, "head", kDim, 1, true, f64);
  Output loss = mean(square(head(mean(embed(ids), {1})) - target));
  Node* step = optim::Adam(0.05).minimize(loss);

  dist::Runner runner = dist::get_runner(g);
  if (runner.served()) return runner.serverStatus();  // this process was a parameter server
  const int64_t part = kTotalBatch / runner.workers();
  double totalLoss = 0;
  dist::TrainingLoop loop(runner, steps,
                          {.checkpoint = checkpoints.empty() ? "" : checkpoints + "/checkpoint.safetensors",
                           .checkpointEvery = 10,
                           .settings = {{"total-batch", std::to_string(kTotalBatch)}}});
  for (; loop.running(); loop.stepDone()) {
    auto [idsPart, targetPart] = batchPart(loop.step(), runner.rank() * part, part);
    const double partLoss = runner.run({loss}, {{ids, idsPart}, {target, targetPart}}, {step})[0].item();
    totalLoss = runner.meanOverWorkers(partLoss);  // the total batch's loss
  }
  // The servers' final values join worker 0's session; after SIGTERM, the checkpoint is written.
  if (const int status = loop.finish(); status != 0) return status;
  if (runner.rank() == 0 && loop.completed()) {  // a sample of --partitions auto ends earlier
    Session& session = runner.session();
    std::printf("workers %d\nloss %.17g\nembed %.17g\nhead %.17g\n", runner.workers(), totalLoss,
                sumOf(session.variable(embed.table.node())), sumOf(session.variable(head.weight.node())));
  }
  return 0;
}
