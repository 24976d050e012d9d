// The order in which each stage of a synchronous pipeline runs its micro-batches' forwards and
// backwards within one step, and a simulator that times such orders. No tensors, no transport:
// every schedule rule is testable in one process, and the pipeline runtime only walks
// stageSchedule(...) in order, sending activations and gradients as it goes.
//
// With S stages (stage 0 takes the input), M micro-batches and stage s:
//   gpipe  every forward, then every backward, both in micro-batch order 0..M-1 (on every stage,
//          so each stage's first backward is the one the next stage finishes first).
//          Holds up to M micro-batches' activations.
//   1f1b   PipeDream-flush: min(S-s-1, M) warm-up forwards, then one forward and one backward
//          while forwards remain, then the remaining backwards. Stage s holds at most
//          min(S-s, M) micro-batches.
//   zb     ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1f1b with each
//          backward split into B (the input gradient, which stage s-1 waits for) and W (the
//          weight gradient, which nothing waits for). Stage s runs W i right after B i+s and the
//          last W's at the end, so the W's it holds back fill what would be 1f1b's cool-down
//          bubble. Every stage then holds at most min(S, M) micro-batches whose W has not run:
//          stage 0's 1f1b bound, and stage 0 holds the most activations under both.
//          With F = B = W the step takes 3M + S - 1 units for M >= S against 1f1b's 3(M + S - 1):
//          a third of 1f1b's bubble.
//
// A schedule is data (StepSchedule): a built-in one generates each stage's list of actions, and
// a schedule file lists them, one line per stage, stage 0 first ("F0 F1 B0 F2 B1 B2", '#' starts
// a comment). The runtime runs whatever list the simulator accepts.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace weft::dist {

/// How a synchronous pipeline orders each stage's work within one step (M micro-batches, S stages).
enum class PipelineSchedule { GPipe, OneFOneB, ZeroBubble };
/// "gpipe", "1f1b", "zb".
const char* scheduleName(PipelineSchedule s);
/// Parses "gpipe", "1f1b", "zb"; throws weft::Error naming the value and the choices otherwise.
PipelineSchedule parseSchedule(const std::string& name);

/// One unit of a stage's work: the forward of a micro-batch, its backward (under gpipe and 1f1b the
/// whole backward; under zb only the part that computes the gradients the previous stage waits for),
/// or (zb only) the backward's weight-gradient part.
struct PipelineAction {
  enum class Kind { Forward, Backward, Weights };
  Kind kind;
  int microbatch;
  bool operator==(const PipelineAction&) const = default;
};
/// "F3", "B0", "W2".
std::string describe(const PipelineAction& a);

/// Stage `stage`'s actions in one step, in order. Throws naming the value when stages < 1,
/// microbatches < 1 or stage is not in [0, stages).
///
///   stageSchedule(PipelineSchedule::OneFOneB, 4, 6, 0)
///   // F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
std::vector<PipelineAction> stageSchedule(PipelineSchedule schedule, int stages, int microbatches, int stage);

/// What each kind of action costs on every stage, as run: in orders without W's (gpipe, 1f1b)
/// `backward` is the whole backward and `weights` goes unused.
struct ActionCosts {
  double forward = 1;
  double backward = 1;
  double weights = 1;
};

struct TimedAction {
  PipelineAction action;
  double start = 0;
  double end = 0;
};

/// One step run to completion: the first action starts at time 0.
struct SimulatedStep {
  std::vector<std::vector<TimedAction>> stages;  ///< per stage, its actions in the order it ran them
  double makespan = 0;                           ///< when the last action of any stage ends
  std::vector<double> idle;                      ///< per stage: makespan minus its time computing
  /// Per stage: the most micro-batches whose forward had run there and whose last action there
  /// (W on a stage whose order has W's, B otherwise) had not: the activations it held at once.
  std::vector<int> peakInFlight;
};

/// Runs `orders` (one per stage, stage 0 first, micro-batches numbered from 0): each stage runs
/// its actions in order, each as soon as the stage is free and its inputs are there: F(s,i)
/// after F(s-1,i); B(s,i) after B(s+1,i) and F(s,i); W(s,i) after B(s,i). Throws naming the
/// stuck action of every stage when the orders deadlock, and on negative costs or repeated actions.
SimulatedStep simulate(const std::vector<std::vector<PipelineAction>>& orders, const ActionCosts& costs);

/// Simulates `schedule` with these unit costs; under gpipe and 1f1b a backward costs
/// backward + weights, since it includes the weight gradients.
///
///   simulate(PipelineSchedule::ZeroBubble, 4, 8, 1, 1, 1).makespan  // 27 = 3*8 + 4 - 1
SimulatedStep simulate(PipelineSchedule schedule, int stages, int microbatches, double forward, double backward,
                       double weights);

/// Every stage's actions in one step, stage 0 first.
using PipelineOrders = std::vector<std::vector<PipelineAction>>;

/// A pipeline's schedule: a built-in one, or the orders of a schedule file.
class StepSchedule {
 public:
  StepSchedule(PipelineSchedule builtIn = PipelineSchedule::OneFOneB);  // NOLINT: a built-in is a schedule
  /// The schedule a file lists: one line per stage, stage 0 first, each the stage's actions in
  /// order, separated by spaces ("F0 F1 B0 B1"; W's split each backward as zb does); '#' starts
  /// a comment. Throws naming the file, the line and the token that is not an action.
  static StepSchedule read(const std::string& path);
  /// As read, from the file's text; `source` names it in errors.
  static StepSchedule parse(const std::string& text, const std::string& source);

  /// Every stage's actions for a step of `microbatches` micro-batches over `stages` stages. A
  /// file's orders are first checked to be such a step, throwing naming the file, the stage and
  /// the action otherwise: every stage runs F i and B i of every micro-batch once, W i of every
  /// micro-batch on every stage or on none, and no stage waits for what never comes.
  PipelineOrders orders(int stages, int microbatches) const;
  /// Whether each backward is split into B (input gradients) and W (weight gradients).
  bool splitsWeights() const;
  /// Simulates a step with these costs (a backward without W's costs backward + weights).
  SimulatedStep simulate(int stages, int microbatches, const ActionCosts& costs) const;
  /// "1f1b", or "file plan.txt".
  std::string name() const;
  /// The built-in it is, if it is one.
  std::optional<PipelineSchedule> builtIn() const { return builtIn_; }

 private:
  std::optional<PipelineSchedule> builtIn_;
  PipelineOrders listed_;  // a file's orders, as listed
  std::string source_;     // what errors call it: "schedule file plan.txt"
  std::string name_;
};

/// `orders` as a schedule file lists them.
std::string formatOrders(const PipelineOrders& orders);

}  // namespace weft::dist
