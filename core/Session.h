// Session: runs a graph. A run compiles a plan for its fetches once (pruning, topological order
// with variable reads before writes, concrete shapes, kernel choice, a static memory plan that
// reuses buffers by liveness and runs ops in place where safe), caches it by fetches, targets and
// feed shapes, and replays it. All plans place their intermediate values in one arena, sized for
// the largest, since plans run one at a time (one arena per device). A run that uses a GPU
// returns when its GPU work has finished.
#pragma once

#include "core/Graph.h"
#include "core/ThreadPool.h"

#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace weft {

namespace detail {
struct Plan;
class GpuTimeline;
}

using FeedMap = std::vector<std::pair<Output, Tensor>>;

struct SessionOptions {
  /// Intra-op threads; <= 0 means one per hardware thread.
  int threads = 0;
  /// After every op, fail with the op's name if a floating output holds NaN or Inf; except for
  /// the nodes of a loss-scaled backward pass (kLossScaledCollection), whose overflow skips the
  /// step's update instead.
  bool checkNumerics = false;
  /// This session's place among data-parallel replicas that each feed an equal part of the total
  /// batch, in order: random ops (dropout) draw for the examples it holds what one session fed
  /// the total batch draws for them. 0 for a session that sees the whole batch.
  int replica = 0;
};

/// What a compiled plan costs.
struct PlanStats {
  size_t opCount = 0;        // kernels run per step
  size_t castOps = 0;        // of them, dtype conversions (Cast ops; mixed precision's count)
  size_t arenaBytes = 0;     // the static buffer all intermediate values share
  size_t unplannedBytes = 0; // what the intermediates would take without reuse
  size_t fetchBytes = 0;     // outputs handed back to the caller
  size_t peakBytes = 0;      // arenaBytes + fetchBytes
  size_t inplaceOps = 0;     // ops that write over a dying input
  size_t viewOps = 0;        // ops whose output shares their input's buffer (reshapes)
};

/// Runs a Graph and owns its variables' values. Each node runs on the device its DeviceScope
/// named (the CPU by default); a value needed on another device is copied there by the executor.
/// Fetched values come back on the host.
///
///     Session s(g);
///     auto [loss] = s.run({lossOut}, {{x, xBatch}, {y, yBatch}}, {trainStep});
class Session {
 public:
  explicit Session(Graph& graph, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Computes `fetches` given `feeds`, also running `targets` (ops without outputs, such as a
  /// training step). Variables read in a run see their value from before the run's updates;
  /// fetched variables return their value after it.
  std::vector<Tensor> run(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                          const std::vector<Node*>& targets = {});
  void run(Node* target, const FeedMap& feeds = {}) { run({}, feeds, {target}); }
  /// As run(), but each fetched value stays on the device that computed it: a GPU's is not copied
  /// to the host (a pipeline stage feeds its activations back to its own later runs this way).
  std::vector<Tensor> runOnDevice(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                                  const std::vector<Node*>& targets = {});

  /// Each op's mean time in seconds over `runs` runs of these fetches, targets and feeds, as run()
  /// would run them (a GPU op: its kernels' time on the GPU, not its launch's). The variables and
  /// the random-op counter are restored afterwards, so profiling a training step trains nothing.
  std::unordered_map<const Node*, double> profile(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                                                  const std::vector<Node*>& targets = {}, int runs = 3);

  /// Calls `hook` on the running thread after every op from now on: a pipeline stage moves its
  /// transport's sends along there, so a receiver need not wait until the sender's run ends.
  void setAfterEachOp(std::function<void()> hook) { afterEachOp_ = std::move(hook); }

  /// The cost of the plan for these fetches, targets and feeds (compiling it if needed).
  PlanStats planStats(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                      const std::vector<Node*>& targets = {});
  /// The concrete type of every value the plan for these fetches, targets and feeds reads or
  /// computes (compiling it if needed): the graph's partial shapes as this batch makes them.
  std::map<Output, TensorType> valueTypes(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                                          const std::vector<Node*>& targets = {});
  size_t cachedPlans() const { return plans_.size(); }
  /// The largest peakBytes among the plans compiled so far (a training run's largest batch shape).
  size_t largestPlanPeakBytes() const;

  /// The live value of a variable (shares its storage; initialised on first use).
  Tensor& variable(Node* variable);
  /// Whether the variable's value exists yet (without making it).
  bool holdsVariable(const Node* variable) const { return variables_.count(variable) != 0; }
  Tensor& variable(const std::string& name);
  /// Overwrites a variable's value (same dtype and shape).
  void setVariable(const std::string& name, const Tensor& value);
  /// Re-runs every variable's initializer.
  void resetVariables();
  /// Gives a variable whose shape the graph has changed since the session made its value (a
  /// shard of it: Graph::shardVariable) its new value, which must have the new shape. The plans
  /// compiled so far, which point at the old value, are dropped.
  void replaceVariable(Node* variable, Tensor value);

  /// Number of completed runs that drew random numbers (ran an op marked OpDef::random, such as
  /// dropout). Random ops draw from (seed, step), so runs are reproducible, and runs that draw
  /// none (evaluation) leave the training's draws as they were: a data-parallel worker that
  /// does not evaluate draws what the one that does draws.
  uint64_t step() const { return step_; }
  /// Sets that counter (when restoring a checkpoint, so random ops continue their streams).
  void setStep(uint64_t step) { step_ = step; }
  /// Which equal part of the total batch the next runs' inputs are (SessionOptions::replica), for
  /// a caller that feeds the parts in turn: a pipeline stage's micro-batches.
  void setReplica(int replica) { options_.replica = replica; }
  const ThreadPool& threadPool() const { return *pool_; }
  Graph& graph() { return graph_; }

 private:
  using Plan = detail::Plan;
  Plan& planFor(const std::vector<Output>& fetches, const FeedMap& feeds,
                const std::vector<Node*>& targets);
  std::unique_ptr<Plan> compile(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets);
  void initializeVariable(Node* variable);
  /// run() and runOnDevice(): `toHost` brings a GPU's fetched values to the host.
  std::vector<Tensor> runPlan(const std::vector<Output>& fetches, const FeedMap& feeds,
                              const std::vector<Node*>& targets, bool toHost);
  /// Runs the plan's kernels in order.
  void runSteps(Plan& plan);
  /// Points the plan's intermediate values into the session's arena, growing it if needed.
  void bindArena(Plan& plan);

  Graph& graph_;
  SessionOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::unordered_map<const Node*, Tensor> variables_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
  // One arena per device serves every plan (plans run one at a time), sized for the largest.
  std::vector<std::shared_ptr<Buffer>> arenas_;
  uint64_t arenaGeneration_ = 0;
  std::unordered_map<const Node*, double>* opSeconds_ = nullptr;  // while profiling: summed per op
  std::function<void()> afterEachOp_;
  std::unique_ptr<detail::GpuTimeline> gpuTimeline_;  // while tracing GPU ops: their kernels' times
  uint64_t step_ = 0;
};

}  // namespace weft
