#include "tools/TrainMlp.h"

#include "core/Random.h"
#include "core/Session.h"
#include "data/GaussianMixture.h"
#include "models/Mlp.h"
#include "optim/Optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

namespace weft::tools {
namespace {

struct MlpFlags {
  int64_t steps = 3000;
  int64_t batch = 128;
  std::vector<int64_t> hidden{256, 256};
  double lr = 1e-3;
  std::string optimizer = "adam";
  int threads = 2;
  uint64_t seed = 1;
  int64_t trainSize = 50000;
  int64_t testSize = 10000;
  int64_t evalEvery = 500;
  double dropout = 0.0;
};

std::unique_ptr<optim::Optimizer> makeOptimizer(const std::string& name, double lr) {
  if (name == "adam") return std::make_unique<optim::Adam>(lr);
  if (name == "sgd") return std::make_unique<optim::SGD>(lr);
  if (name == "momentum") return std::make_unique<optim::Momentum>(lr, 0.9);
  if (name == "adagrad") return std::make_unique<optim::Adagrad>(lr);
  WEFT_THROW("unknown optimizer '{}' (adam, sgd, momentum, adagrad)", name);
}

double evaluateAccuracy(Session& s, const models::MlpModel& m, const data::ClassificationData& test) {
  const auto out = s.run({m.accuracy}, {{m.features, test.features}, {m.labels, test.labels}});
  return out[0].item();
}

void trainMlp(const MlpFlags& f) {
  data::GaussianMixtureSpec task;
  const data::ClassificationData train = data::gaussianMixture(task, f.trainSize, f.seed * 2 + 100);
  const data::ClassificationData test = data::gaussianMixture(task, f.testSize, f.seed * 2 + 101);

  Graph g;
  models::MlpConfig config;
  config.inputs = task.dim;
  config.classes = task.classes;
  config.hidden = f.hidden;
  config.dropout = f.dropout;
  config.seed = f.seed;
  const models::MlpModel m = models::buildMlp(g, config);
  Node* step = makeOptimizer(f.optimizer, f.lr)->minimize(m.loss);
  Session s(g, {f.threads, false});

  std::vector<int64_t> order(static_cast<size_t>(f.trainSize));
  std::iota(order.begin(), order.end(), 0);
  const uint64_t shuffleKey = streamKey(f.seed, "shuffle");
  int64_t cursor = f.trainSize;
  uint64_t epoch = 0;
  const auto start = std::chrono::steady_clock::now();
  double lossSum = 0;
  int64_t lossCount = 0;
  for (int64_t i = 1; i <= f.steps; ++i) {
    if (cursor + f.batch > f.trainSize) {
      // Seeded Fisher-Yates shuffle per epoch.
      for (size_t k = order.size(); k > 1; --k) {
        const auto j = static_cast<size_t>(uniformAt(shuffleKey, epoch * order.size() + k) * static_cast<double>(k));
        std::swap(order[k - 1], order[j]);
      }
      ++epoch;
      cursor = 0;
    }
    Tensor x(f32, {f.batch, task.dim}), y(i64, {f.batch});
    for (int64_t r = 0; r < f.batch; ++r) {
      const int64_t src = order[static_cast<size_t>(cursor + r)];
      std::copy_n(train.features.data<float>() + src * task.dim, task.dim, x.data<float>() + r * task.dim);
      y.data<int64_t>()[r] = train.labels.data<int64_t>()[src];
    }
    cursor += f.batch;
    lossSum += s.run({m.loss}, {{m.features, x}, {m.labels, y}}, {step})[0].item();
    ++lossCount;
    if (i % f.evalEvery == 0 || i == f.steps) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print("step {:>6}  loss {:.4f}  test accuracy {:.4f}  {:.0f} examples/s\n", i, lossSum / static_cast<double>(lossCount),
                 evaluateAccuracy(s, m, test), static_cast<double>(i * f.batch) / seconds);
      std::fflush(stdout);
      lossSum = 0;
      lossCount = 0;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{{\"model\": \"mlp\", \"steps\": {}, \"test_accuracy\": {:.4f}, \"seconds\": {:.2f}}}\n", f.steps,
             evaluateAccuracy(s, m, test), seconds);
}

}  // namespace

void addTrainMlp(CLI::App& train) {
  auto flags = std::make_shared<MlpFlags>();
  CLI::App* cmd = train.add_subcommand("mlp", "MLP classifier on the built-in Gaussian-mixture task (10 classes, 32-d)");
  cmd->add_option("--steps", flags->steps, "training steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--batch", flags->batch, "examples per step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--hidden", flags->hidden, "hidden layer widths")->capture_default_str()->delimiter(',');
  cmd->add_option("--lr", flags->lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--optimizer", flags->optimizer, "adam, sgd, momentum or adagrad")->capture_default_str()
      ->check(CLI::IsMember({"adam", "sgd", "momentum", "adagrad"}));
  cmd->add_option("--threads", flags->threads, "intra-op threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seed", flags->seed, "seed of weights, shuffling and dropout")->capture_default_str();
  cmd->add_option("--train-size", flags->trainSize, "generated training examples")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--test-size", flags->testSize, "generated held-out examples")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--eval-every", flags->evalEvery, "steps between evaluations")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--dropout", flags->dropout, "dropout rate after each hidden layer")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  cmd->callback([flags] {
    WEFT_CHECK(flags->batch <= flags->trainSize, "--batch {} exceeds --train-size {}", flags->batch, flags->trainSize);
    trainMlp(*flags);
  });
}

}  // namespace weft::tools
