// The interface between the model zoo and `weft train`: a model with its data, its options,
// its default optimizer and its evaluation. Each zoo model implements it; the trainer, the
// checkpointing and (later) the distribution layer use only this.
#pragma once

#include "core/Session.h"
#include "data/Dataset.h"
#include "optim/Optimizer.h"

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace weft::models {

/// A command-line option bound to a field of a model's configuration.
struct ModelOption {
  std::string name;  // flag name without dashes, e.g. "hidden"
  std::string help;
  std::variant<int64_t*, double*, std::string*, bool*> target;
};

/// Settings every zoo model receives from the trainer.
struct CommonOptions {
  int64_t batchSize = 0;  // 0: the model's default
  uint64_t seed = 1;
  std::string data;       // path to real data; empty: the built-in generator
  std::string dtype = "f32";
  /// How the model's layers keep their activations for the backward pass: each layer (or block)
  /// is a Graph::recompute scope of this mode.
  Recompute recompute = Recompute::None;
  /// Threads that make each training batch's examples (data::BatchOptions::threads), for models
  /// whose examples are dear to make (ResNet reading an image folder decodes every image).
  int inputThreads = 1;
};

/// How a model trains unless the command line says otherwise.
struct OptimizerSpec {
  std::string name = "adam";  // adam, sgd, momentum, adagrad
  double lr = 1e-3;
  double momentum = 0.9;
  double weightDecay = 0;
  double clipNorm = 0;        // global-norm clipping; 0: off
};

class ZooModel {
 public:
  virtual ~ZooModel() = default;

  /// The model's own options, bound to its configuration (read before build()).
  virtual std::vector<ModelOption> options() { return {}; }
  virtual OptimizerSpec defaultOptimizer() const { return {}; }
  /// Training steps of a default run (enough to reach the model's convergence target).
  virtual int64_t defaultSteps() const { return 1000; }
  /// Whether some of its variables are updated sparsely (embeddings): the parameter servers'
  /// case, which a job started by a cluster engine gives a server per host by default.
  virtual bool updatesSparsely() const { return false; }

  /// Loads or generates the data and builds the model in `g`: placeholders named like the batch
  /// fields, the training loss, and whatever evaluate() runs.
  virtual void build(Graph& g, const CommonOptions& common) = 0;
  virtual Output loss() const = 0;

  virtual data::BatchSource& trainData() = 0;
  /// Evaluates on the held-out split (at most maxBatches batches; <= 0: all of it), returning
  /// named metrics, e.g. {"perplexity": 57.1} or {"accuracy": 0.93, "loss": 0.21}.
  virtual std::map<std::string, double> evaluate(Session& session, int64_t maxBatches) = 0;
  /// The metric that convergence is judged on, and whether higher is better.
  virtual std::string targetMetric() const = 0;
  virtual bool higherIsBetter() const = 0;
  /// What a training batch holds, for throughput: ("words", 640) or ("images", 128). Of a part
  /// read with BatchSource::readPart, its share of the whole batch's (the whole's divided by the parts).
  virtual std::pair<std::string, double> itemsIn(const data::Batch& batch) const = 0;
  /// Part `index` of `count` of a training batch, for data-parallel workers: by default every
  /// field cut along its first axis.
  virtual data::Batch shard(const data::Batch& batch, int64_t index, int64_t count) const {
    return data::sliceBatch(batch, index, count);
  }
  /// A micro-batch (a part `shard` cut) without the padding that every one of its sequences has
  /// (data::trimPadding), for a model whose result padding does not change: by default as it is.
  virtual data::Batch trimmed(data::Batch part) const { return part; }
};

/// Feeds for a batch: each field goes to the graph's placeholder of the same name; a field with
/// no placeholder is an error naming it.
FeedMap feedsFor(Graph& g, const data::Batch& batch);

/// The zoo's model names, and a fresh model by name (throws naming the known ones).
std::vector<std::string> zooModelNames();
std::unique_ptr<ZooModel> makeZooModel(const std::string& name);

}  // namespace weft::models
