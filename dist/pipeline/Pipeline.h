// The pipeline cut: splits a single-device training graph (forward pass, the backward pass autodiff
// made, the updates) into S stages and, within each stage, into the runs a pipelined step makes.
//
// Every node the step needs gets a stage and a phase:
//   - Forward: what the loss needs from the micro-batch; its stage is the author's (Graph::stage),
//     else the latest stage among its inputs (stage 0 for the first ops). An update of untrained
//     state from forward values alone (batch norm's moving averages) runs with each micro-batch's
//     forward too, as GPipe's per-micro-batch batch norm does.
//   - Backward / Weights: autodiff's nodes, in their forward op's stage; where that op runs in no
//     stage (a fusion replaced it), in the stage of the weights they read. Split into the part the
//     previous stage waits for (Backward) and the rest (Weights) when the schedule runs them apart
//     (zero bubble); otherwise all Backward.
//   - Update: the optimizer, in the stage of the variable it updates; a computation several stages
//     read (global-norm clipping's norm) in the latest stage among its inputs.
//     A trainable variable several stages read (tied weights, Graph::tieAcrossStages) has a copy
//     in each; the lowest of them updates it and sends the update to the others after the update
//     (PipelineCut::tied). Where its gradient is a sum of parts of several stages, each stage
//     sums its own part over the micro-batches as a gradient, and the lowest stage adds the
//     parts for its update (Megatron's embedding group, with the optimizer state held once).
//   - Static: what depends on variables and constants alone (a weight's transpose, the learning
//     rate): computed by whichever run of a stage reads it; the step counter's increment is
//     replicated in every stage, which each keep their copy of it, and so is the update of other
//     untrained state several stages read (a loss scale), from values one stage computes, with
//     what only those updates read (the scale's next value and its count of good steps).
// A node's run condition (a loss scale's skipped step) is read like an input: it is sent to the
// stage that runs the node. Loss scaling's finiteness check becomes one check per gradient, on
// its stage, whose answers the deciding stage combines (splitFiniteChecks).
// A value read by another stage becomes a transfer, sent once per micro-batch and reading stage
// (once per step in the update); a value a later phase of its own stage reads is kept until then.
// The gradients autodiff links to variables are summed over the micro-batches and fed, divided by
// their count, to the updates: the step equals single-device training on all micro-batches at
// once with a mean loss (gradient accumulation).
//
// Without Graph::stage scopes, planStages chooses the stages from a profile of the step.
//
// The update runs in waves: a stage runs wave w once every transfer of earlier waves into it has
// arrived, so a cross-stage computation (the global norm) costs one round trip, not a deadlock.
//
// With parameter servers (dist/server/ServerOps.h), a served variable's pulls are forward ops of
// the stage that reads it, and its push and APPLY run in that stage's update: the servers hold,
// update and average it over the pipeline's replicas, as they do over data-parallel workers.
// Such a stage does not guess its update (what it sent cannot be taken back).
//
// Refused, with an error naming the nodes: a forward value flowing to an earlier stage or a
// backward value to a later one, a stage number outside 0..S-1, an optimizer's update reading a
// per-micro-batch forward value, a served variable that several stages read,
// and a cut that leaves a stage without forward work.
#pragma once

#include "core/Graph.h"
#include "dist/pipeline/Schedule.h"

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace weft::dist {

enum class Phase : uint8_t { Static, Forward, Backward, Weights, Update };
const char* phaseName(Phase p);

/// A value that one stage computes and another reads.
struct Transfer {
  Output value;
  int from = 0, to = 0;
  /// The receiver's action that takes it: Forward, Backward (for Weights too) or Update.
  Phase receivedIn = Phase::Forward;
};

/// One run of a stage's session: per micro-batch for Forward, Backward and Weights, per wave of
/// the update once per step.
struct StageRun {
  std::vector<Output> placeholders;  ///< fed from the micro-batch (the whole batch in the update)
  std::vector<Output> inputs;        ///< fed from what arrived or what an earlier run kept
  std::vector<Output> fetches;       ///< what leaves the run
  std::vector<Node*> targets;        ///< the update ops it runs
  std::vector<int> receives;         ///< transfers to take before the run (indices into transfers)
  std::vector<int> sends;            ///< transfers among its fetches, sent after it
  std::vector<Output> kept;          ///< fetches a later run of this stage reads
  std::vector<int> gradients;        ///< fetched gradient links (indices into gradients)
  bool empty() const { return fetches.empty() && targets.empty() && receives.empty(); }
};

/// A variable's gradient, or a stage's part of a tied variable's: summed over the micro-batches
/// by its stage and fed to the update.
struct StageGradient {
  GradientLink link;
  int stage = 0;
  /// The variable is on the parameter servers, which average its gradient over the pipeline's
  /// replicas: the stage pushes its own mean over the micro-batches.
  bool served = false;
  /// The graph reduce-scatters it over the pipeline's replicas (its variable's optimizer state
  /// sharded among them: dist/Transform.h, shardOverReplicas): the runtime does not average it.
  bool sharded = false;
};

/// A trainable variable several stages read: each holds a copy, `owner` updates it and sends
/// the updated value to `copies` at the end of each step's update: only the rows `rows` names
/// where its updates are sparse (they change no other row), else all of it. Where its gradient sums
/// parts that several stages compute, each stage sums its parts over the micro-batches, and the
/// owner feeds its update their sum: dense parts added, sparse parts' rows concatenated, in
/// the order of `parts`.
struct TiedVariable {
  Node* variable = nullptr;
  int owner = 0;
  std::vector<int> copies;
  int gradient = -1;       ///< the whole gradient, the owner's (index into PipelineCut::gradients); -1: not split
  std::vector<int> parts;  ///< its parts (indices into PipelineCut::gradients, each with its stage)
  Output rows;             ///< the row ids its sparse updates read (the gradient's indices); none: dense updates
};

/// What a stage's update may guess (post-validation, after the zero-bubble paper): the scalars
/// its updates read that depend on what other stages send it in the update (global-norm
/// clipping's scale, whether a loss-scaled step's gradients are finite). The stage sends what it computes from its own
/// values, updates at once with the guessed scalars, then receives, computes the real ones and sends what depends on
/// them; where a guess was wrong it restores its variables and updates again.
struct UpdateGuess {
  std::vector<Output> points;      ///< the guessed scalars (fed with the guess when updating)
  std::vector<Output> localInputs; ///< its own update values that the real scalars are computed from
  std::vector<int> localSends;     ///< update transfers it sends from its own values alone
  std::vector<int> remoteSends;    ///< update transfers computed from what it receives
  std::vector<int> receives;       ///< every transfer it receives in the update
  bool possible() const { return !points.empty(); }
};

struct PipelineCut {
  int stages = 1;
  bool splitWeights = false;
  std::vector<int> stageOf;     ///< by node id: -1 where no stage owns it (static, sources, unneeded)
  std::vector<Phase> phaseOf;   ///< by node id
  std::vector<Transfer> transfers;
  std::vector<StageGradient> gradients;
  std::vector<TiedVariable> tied;
  /// The updates every stage runs for itself in its last update wave (the step counter's
  /// increment, a loss scale's new value): a process holding several stages in one session runs
  /// them once, last.
  std::vector<Node*> replicated;
  /// Whether the step runs a random op (dropout) on any stage: every stage's count of random draws
  /// then moves on after the step, as one session's does.
  bool drawsRandom = false;
  /// Per stage: what its update may guess; none anywhere when one stage's guessed values would
  /// wait on another's (a stage that sends what it computed from received values receives only
  /// values the others computed from their own).
  std::vector<UpdateGuess> guesses;
  /// Per stage: whether its update sends the parameter servers a push or an APPLY, which cannot
  /// be taken back: a process holding such a stage never updates on a guess.
  std::vector<char> updatesServers;
  /// Per stage: the variables it holds (its own, the replicated ones and copies of tied ones).
  std::vector<std::vector<Node*>> variables;
  /// Per stage: the Forward, Backward and Weights runs of a micro-batch, and the update's waves.
  std::vector<StageRun> forward, backward, weights;
  std::vector<std::vector<StageRun>> update;
  /// The stage that computes each of the step's fetches (each a Forward value).
  std::vector<int> fetchStage;
};

/// What a stage holds during a step, in bytes, as the cut reckons it from the graph before any
/// run: the training state of its variables and the activations its schedule keeps.
struct StageMemory {
  double parameters = 0;      ///< the variables its forward ops read (trained or not)
  double gradients = 0;       ///< their gradients, summed over the micro-batches
  double optimizerState = 0;  ///< the optimizer's slots of its variables (Adam: m and v)
  double activations = 0;     ///< one micro-batch's values that its backward reads
  int inFlight = 1;           ///< the micro-batches whose activations the schedule holds at once
  double total() const { return parameters + gradients + optimizerState + activations * inFlight; }
  /// "holds 5.82 MB (parameters 1.05 MB, gradients 1.05 MB, optimizer state 2.10 MB, activations 2 x 0.81 MB)".
  std::string describe() const;
};

/// What an automatic cut weighs besides the profile.
struct StagePlanOptions {
  int stages = 1;  ///< the pipeline's processes; the cut makes schedule.modelStages(stages) stages
  /// Each value's bytes in a run of one micro-batch's step (Session::valueTypes); a value
  /// missing here counts `rows` for each unknown dimension of its static shape.
  std::map<Output, size_t> valueBytes{};
  int64_t rows = 1;  ///< a micro-batch's rows
  int microbatches = 1;
  StepSchedule schedule = PipelineSchedule::OneFOneB;
  double linkBytesPerSecond = 1.25e9;
  /// The most bytes (StageMemory::total) a stage may hold, with virtual stages a process's
  /// stages together; 0: no limit.
  double memoryPerStage = 0;
  /// Variables the parameter servers hold: their optimizer state lives there, not in a stage
  /// (the stage keeps its copy of the variable and sums its gradient), and the servers run their
  /// updates, whose profiled time no stage is charged.
  std::vector<const Node*> served{};
  /// The replicas among which each stage's optimizer state is sharded (--shard optimizer): a
  /// stage holds 1/N of its dense untied variables' optimizer state.
  int optimizerShards = 1;
};

/// The bytes of each value of `types` (Session::valueTypes of one micro-batch's step), for
/// StagePlanOptions::valueBytes.
std::map<Output, size_t> valueBytes(const std::map<Output, TensorType>& types);

/// What an automatic cut chose: where each stage starts among the step's forward ops (in
/// topological order), and what each stage measured.
struct StagePlan {
  std::vector<size_t> firstOp;        ///< per stage: the index of its first forward op
  std::vector<size_t> ops;            ///< per stage: how many forward ops it has
  std::vector<double> seconds;        ///< per stage: its forward ops' and their gradients' time per step
  std::vector<double> boundaryBytes;  ///< per stage: the bytes it sends forward (and gets back as gradients)
  std::vector<StageMemory> memory;    ///< per stage: what it holds
  /// Per stage, one line each: its ops, time, boundary bytes, and memory with its parts.
  std::string describe() const;
};

/// Chooses the schedule's model stages (`options.stages`, times the virtual stages each process
/// holds) as contiguous runs of the forward ops of the step (in topological order) that minimise the slowest stage's
/// time per micro-batch (its ops' and their gradients' measured `seconds` of one micro-batch's step, from
/// Session::profile, and its variables' updates over the micro-batches) plus its boundary transfers both ways at the
/// link's speed: a dynamic program over the chain, as PipeDream's planner. No cut parts one variable's readers unless
/// it is tied (Graph::tieAcrossStages; then its copies count in every stage that reads it) and not served (the servers
/// keep one copy of it, for one stage), and with a memory limit no
/// stage holds more than it (StageMemory::total, with the activations of as many micro-batches as the schedule holds on
/// that stage at once). Throws when there are fewer places to cut than stages need, and when no cut fits the limit,
/// saying by how much the cut closest to fitting misses it.
StagePlan planStages(Graph& graph, const std::vector<Output>& fetches, Node* trainStep,
                     const std::unordered_map<const Node*, double>& seconds, const StagePlanOptions& options);
/// What each stage of the step holds as its ops are staged now (the author's Graph::stage scopes,
/// or applyStages'), reckoned as planStages reckons it; `options.memoryPerStage` is not applied.
std::vector<StageMemory> stageMemory(Graph& graph, const std::vector<Output>& fetches, Node* trainStep,
                                     const StagePlanOptions& options);

/// Puts the step's forward ops in the stages `firstOp` starts (Node::stage), as planStages chose:
/// every process of a pipeline applies the plan one of them made.
void applyStages(Graph& graph, const std::vector<Output>& fetches, Node* trainStep, const std::vector<size_t>& firstOp);

/// Cuts the step that computes `fetches` and runs `trainStep` into `stages` stages (see above).
/// `splitWeights`: run the weight gradients apart from the input gradients (zero bubble); the
/// graph's fused LSTM gradients are first split in two (LSTMInputGrad, LSTMWeightGrad), so that
/// a recurrent layer's weight gradients can wait too.
PipelineCut cutPipeline(Graph& graph, int stages, const std::vector<Output>& fetches, Node* trainStep,
                        bool splitWeights);

/// The graph's gradient links as its step computes them: a fused recurrent gradient's weight
/// gradients where the cut for zero bubble moved them.
std::vector<GradientLink> stepGradientLinks(const Graph& graph);

}  // namespace weft::dist
