// The multi-core runtime of an AMP graph (amp/AmpGraph.h): worker threads, each owning some
// nodes (a heavy transform per worker, the light nodes beside the transform they follow), pass
// messages through per-worker queues, backward messages first; nothing waits for a global
// barrier. A controller thread (the caller's) pumps instances in, at most maxActiveKeys at a
// time, and collects them when their last message is answered.
//
//     amp::Runtime runtime(graph, {.workers = 4, .maxActiveKeys = 8, .minUpdateFrequency = 32,
//                                  .optimizer = std::make_shared<optim::Adam>(1e-3)});
//     for (int epoch = 0; epoch < 10; ++epoch) {
//       amp::EpochReport r = runtime.train(trainSet.size(), [&](int64_t i) { return pump(trainSet[i]); });
//       fmt::print("{}\n", r.summary());
//     }
//
// Each parameterised transform sums the gradients of its variables and, once minUpdateFrequency
// gradient messages have arrived, applies its optimizer to their sum divided by the number of
// instances they came from, then clears the sum. With `minibatch` set instead, every transform
// updates once per minibatch of instances, after all of them finished and before the next begins,
// on the sum divided by the minibatch's size: ordinary synchronous training, equal to batched
// training on the mean loss per instance.
#pragma once

#include "amp/AmpGraph.h"
#include "dist/transport/Transport.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace weft::amp {

struct AmpOptions {
  int workers = 1;
  /// Where the transforms and losses compute: "" or "cpu" (the CPU), or "cuda:N". Messages stay
  /// on the host; the workers' runs take turns on the GPU.
  std::string device = "";
  int maxActiveKeys = 1;
  /// Gradient messages a transform gathers before it updates (a TransformSpec may override).
  int minUpdateFrequency = 1;
  /// > 0: synchronous training, updating every transform once per this many instances.
  int minibatch = 0;
  /// The optimizer of transforms that name none.
  std::shared_ptr<optim::Optimizer> optimizer = nullptr;
  /// Replicas average their variables after every this many updates each; 0: after each epoch.
  int replicaSyncEvery = 0;
  /// No message processed anywhere for this long while instances are active stops the run with an
  /// error naming the worker and node that hold it up.
  std::chrono::milliseconds timeout{120000};
  /// Record each worker's forward, backward and update work (core/Trace.h, when tracing).
  bool trace = false;
};

/// This process's place in a job of several (each running the same graph and the same calls):
/// its rank (0 runs the controller), how many there are, and the transport that reaches the
/// others, with the peer index of each rank on it (any value for this one). The transport is
/// the runtime's alone while it lives. Global worker w runs in process w / AmpOptions::workers.
struct AmpProcesses {
  int rank = 0;
  int count = 1;
  dist::Transport* transport = nullptr;
  std::vector<int> peers;
};

struct NodeReport {
  std::string name;
  int worker = 0;
  int64_t forwards = 0, backwards = 0;
  int64_t updates = 0;     ///< optimizer steps (parameterised transforms)
  int64_t gradients = 0;   ///< gradient messages received since the report before
  double meanStaleness = 0;  ///< updates between a message's forward and its gradient
  int64_t maxStaleness = 0;
  double busySeconds = 0;
  /// Per output: forward messages sent, and backward messages that answered them.
  std::vector<int64_t> sent, answered;
};

struct EpochReport {
  int64_t instances = 0;
  double loss = 0;      ///< mean over instances of the sum of each one's loss messages
  double accuracy = 0;  ///< hits / count over all loss messages (0 when the losses count none)
  double seconds = 0;
  double instancesPerSecond = 0;
  double meanActiveKeys = 0;  ///< instances in flight, averaged over the epoch's time
  int peakActiveKeys = 0;
  std::vector<double> workerUtilisation;  ///< busy time / wall time per worker
  int64_t replicaSyncs = 0;  ///< averages of replicas made during the epoch (replicaSyncEvery > 0)
  std::vector<NodeReport> nodes;
  /// "loss 0.512 accuracy 0.873 | 1234.5 instances/s | active keys 3.9 | workers 92% 88% | staleness fc 1.3"
  std::string summary() const;
};

/// Where a run continues: every transform's variables ("node/variable", as variables() names
/// them) and the caller's count of what it has done (such as epochs).
struct ResumePoint {
  std::map<std::string, Tensor> variables;
  int64_t position = 0;
};

class Runtime {
 public:
  /// Verifies `graph` and builds the subgraph, session and optimizer of each transform this
  /// process runs.
  Runtime(Graph& graph, AmpOptions options, AmpProcesses processes = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// One pass over instances 0..count-1 (made by `make`, which worker threads may call at once
  /// in a process other than the controller's), training. In a job of several
  /// processes every process makes the same calls with the same instances; every process's
  /// report has the epoch's loss and accuracy, the controller's also every node's counts.
  EpochReport train(int64_t count, const std::function<Pumped(int64_t)>& make);
  /// Forward only: losses and accuracy, no gradients, no updates.
  EpochReport evaluate(int64_t count, const std::function<Pumped(int64_t)>& make);

  /// The variables of every transform, named "node/variable" (at the controller of a job of
  /// several processes: the others' as they reported them at the end of the last epoch).
  std::map<std::string, Tensor> variables() const;
  /// Overwrites one ("node/variable"); throws naming it when unknown or of another type.
  void setVariable(const std::string& name, const Tensor& value);
  /// Continues a run from a checkpoint that the controller alone read, so a job's other hosts
  /// need no copy of it: every process of the job calls this once, before its first epoch. At
  /// the controller `point` is the checkpoint (nothing: the run starts afresh); elsewhere it is
  /// ignored. Each process sets its own transforms' variables, which must be exactly the
  /// checkpoint's for them (optimizer slots and step counters included); a variable missing,
  /// left over or of another dtype or shape stops every process, named, before any is changed.
  /// Returns the controller's position (0 when starting afresh) at every process.
  int64_t resume(const std::optional<ResumePoint>& point);
  /// Tells the job's other processes that this one failed for `reason`, so that they stop naming
  /// it rather than wait for it (as a failure inside the runtime does).
  void abort(const std::string& reason);
  /// Whether `mine` is true in any process of the job: every process calls it at the same point
  /// between epochs, and all get the same answer (such as: stop here, SIGTERM came).
  bool anyProcess(bool mine);
  /// Averages the variables of each group of replicas (between epochs; train() does it itself).
  void syncReplicas();
  /// The worker each node runs on.
  int workerOf(int node) const;
  const AmpOptions& options() const { return options_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  AmpOptions options_;
};

}  // namespace weft::amp
