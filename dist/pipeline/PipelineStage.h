// One stage of a synchronous pipeline: a process (or, in tests, a thread) that holds the whole
// training graph, computes only its stage's part of it (dist/pipeline/Pipeline.h), and exchanges
// activations and their gradients with the other stages over a Transport, in the order its
// schedule gives (dist/pipeline/Schedule.h). With virtual stages (interleaved, zbv, or a schedule
// file that gives a process several stages) it runs each of its model stages' actions in its
// list's order, in one session: what one of its stages sends another stays in memory, and the
// updates every stage makes for itself (the step counter) run once.
//
//     PipelineStage stage(graph, myStage, options, transport, stagePeers);
//     for (...) double loss = stage.step({loss}, trainStep, microbatchFeeds)[0];   // every stage alike
//
// Each micro-batch's forward keeps what its backward reads (by micro-batch), so 1F1B holds at
// most S micro-batches on stage 0; the variables' gradients are summed over the micro-batches and
// the optimizer runs once per step on their mean (averaged with the pipeline's data-parallel
// replicas from as soon as the last micro-batch has summed them). Every receive waits at most
// the timeout; a stage that died or stalled fails the step with an error naming it.
#pragma once

#include "core/Session.h"
#include "dist/pipeline/Pipeline.h"
#include "dist/pipeline/Schedule.h"
#include "dist/transport/Transport.h"

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace weft::dist {

/// Some of a stage's gradients of one step, each its mean over the micro-batches: what
/// data-parallel replicas of the pipeline average among themselves (each dense one in place;
/// each sparse one's rows replaced).
struct StageGradients {
  std::vector<Tensor*> dense;
  std::vector<std::pair<Tensor*, Tensor*>> sparse;  ///< indices and rows
};

struct PipelineOptions {
  int stages = 1;  ///< the pipeline's processes (the model's stages are schedule.modelStages(stages))
  int microbatches = 1;
  StepSchedule schedule = PipelineSchedule::OneFOneB;
  std::chrono::milliseconds timeout{60000};
  SessionOptions session;
  /// With data-parallel replicas of the pipeline: starts making each of the gradients given the
  /// mean over the replicas' same stage (their rows gathered, for sparse ones), every replica
  /// alike, and returns what waits until it has. A stage starts it for the gradients its last
  /// micro-batch's backward has just completed (in buckets: each action's completed ones
  /// together), so that the sums overlap its remaining backward work, and waits for all of them
  /// before its update. Every replica starts the same buckets in the same order. The servers'
  /// variables are left out: the servers average what each replica pushes.
  std::function<std::function<void()>(StageGradients)> startAveragingOverReplicas;
  /// Post-validation (the zero-bubble paper's): where the last two steps' global-norm clipping
  /// scale (or another scalar its update reads from other stages) was the same, a stage updates
  /// at once on it, without waiting for the others' last backward, and redoes the update on the
  /// real value in the step where it differs. The result is the same either way; a stage holds a
  /// copy of what its update writes meanwhile. A process holding several stages guesses for all
  /// of them at once.
  bool postValidation = true;
};

class PipelineStage {
 public:
  /// Stage `stage` of a pipeline over `graph`. `stagePeers[s]` is stage s's peer index on
  /// `transport` (any value for this stage).
  PipelineStage(Graph& graph, int stage, const PipelineOptions& options, Transport& transport,
                std::vector<int> stagePeers);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  /// One training step that computes `fetches` (scalars of the forward pass: the loss, a metric)
  /// and runs `trainStep`, on `microbatches` (options.microbatches of them, each feeding every
  /// placeholder it needs; the update reads the first's non-batch values). Every stage calls it
  /// alike. Returns the mean of each fetch over the micro-batches, on every stage. The first step
  /// with these fetches cuts the graph (dist/pipeline/Pipeline.h) and throws what the cut refuses.
  std::vector<double> step(const std::vector<Output>& fetches, Node* trainStep,
                           const std::vector<FeedMap>& microbatches);

  /// Copies every stage's variables (optimizer slots included) into stage `into`'s session, so it
  /// holds the whole model (to evaluate or save it); every stage must call it at the same point.
  void gatherVariables(int into = 0);
  /// Sets every variable of every stage to stage `from`'s value (after it restored a checkpoint).
  void scatterVariables(int from = 0);

  /// This process's index among the pipeline's (its stage, without virtual stages).
  int stage() const;
  /// The cut of the last step (throws before the first).
  const PipelineCut& cut() const;
  Session& session();
  /// The fraction of its steps' time this stage spent waiting on other stages (for what it
  /// receives, and for its sends to be taken): the pipeline's bubble as this stage sees it, over
  /// every step so far.
  double idleFraction() const;
  /// The most bytes this stage kept at once for its later runs (activations for the backward,
  /// what it received), over every step so far: what the schedule costs in memory.
  size_t peakKeptBytes() const;
  /// Post-validation: the updates made on a guess so far, and how many of them were redone.
  size_t updatesGuessed() const;
  size_t updatesRedone() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Multiplies a gradient (f32 or f64, on the host) by `factor` in place.
void scaleGradient(Tensor& t, double factor);

/// Cuts `feeds` into `count` micro-batches along the first axis of every placeholder whose first
/// dimension is the batch's (-1 where it was declared); other feeds go whole to each. Throws
/// naming the placeholder when its rows do not divide evenly.
std::vector<FeedMap> splitMicrobatches(const FeedMap& feeds, int count);

}  // namespace weft::dist
