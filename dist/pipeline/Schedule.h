// The order in which each process of a synchronous pipeline runs its micro-batches' forwards and
// backwards within one step, and a simulator that times such orders. No tensors, no transport:
// every schedule rule is testable in one process, and the pipeline runtime only walks each
// process's list in order, sending activations and gradients as it goes.
//
// The model is cut into stages (chunks of consecutive layers); a process runs one of them, or,
// with virtual stages, V non-adjacent ones (Megatron-LM's interleaving). With S processes, M
// micro-batches and process s:
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
//   interleaved  Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
//          Training on GPU Clusters Using Megatron-LM", SC 2021): process s holds the V stages
//          s, s + S, ..., s + (V-1)S of S·V, and runs forwards in groups of S micro-batches per
//          stage, 2(S-s-1) + (V-1)S of them before its first backward, then one forward and one
//          backward. Each action is 1/V of a whole process's, so the bubble shrinks V times:
//          (S-1)/(V·M) of the ideal step. M must be a multiple of S.
//   zbv    ZB-V (the zero-bubble paper's V shape): process s holds stages s and 2S-1-s, so the
//          first and the last stage (the loss) share process 0, and backwards split into B and
//          W. Each process picks, whenever it is free (F = B = W), a ready B first, then a
//          forward (the later stage first) while it holds fewer than 2S stage-activations (1f1b's
//          stage 0, in half-size stages), then a W. With F = B = W the step takes 6M + S - 1
//          half-size units: each process idles S - 1 of them (process S - 1 cannot start before
//          S - 1 forwards reached it), half of ZB-H1's bubble at 1f1b's activation memory.
//
// A schedule is data (StepSchedule): a built-in one generates each process's list of actions,
// and a schedule file lists them, one line per process, process 0 first ("F0 F1 B0 F2 B1 B2";
// with virtual stages each action names its stage first, "3F0" being stage 3's forward of
// micro-batch 0; '#' starts a comment). The runtime runs whatever list the simulator accepts.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace weft::dist {

/// How a synchronous pipeline orders each stage's work within one step (M micro-batches, S stages).
enum class PipelineSchedule { GPipe, OneFOneB, ZeroBubble, Interleaved, ZeroBubbleV };
/// "gpipe", "1f1b", "zb", "interleaved", "zbv".
const char* scheduleName(PipelineSchedule s);
/// Parses a scheduleName; throws weft::Error naming the value and the choices otherwise.
PipelineSchedule parseSchedule(const std::string& name);

/// One unit of a stage's work: the forward of a micro-batch, its backward (under gpipe and 1f1b the
/// whole backward; under zb only the part that computes the gradients the previous stage waits for),
/// or (zb, zbv) the backward's weight-gradient part, of one stage of the model.
struct PipelineAction {
  enum class Kind { Forward, Backward, Weights };
  Kind kind;
  int microbatch;
  /// The model stage it runs; -1: the one stage of the process whose list holds it.
  int stage = -1;
  bool operator==(const PipelineAction&) const = default;
};
/// "F3", "B0", "W2"; with a stage, "5F3".
std::string describe(const PipelineAction& a);

/// Process `stage`'s actions in one step, in order; `virtualStages` model stages per process
/// (interleaved: 2 or more, zbv: 2, the others: 1). Throws naming the value when stages < 1,
/// microbatches < 1, stage is not in [0, stages), or the schedule cannot take these counts.
///
///   stageSchedule(PipelineSchedule::OneFOneB, 4, 6, 0)
///   // F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5
std::vector<PipelineAction> stageSchedule(PipelineSchedule schedule, int stages, int microbatches, int stage,
                                          int virtualStages = 1);

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
  std::vector<std::vector<TimedAction>> stages;  ///< per process, its actions in the order it ran them
  double makespan = 0;                           ///< when the last action of any process ends
  std::vector<double> idle;                      ///< per process: makespan minus its time computing
  /// Per process: the most (model stage, micro-batch) pairs whose forward had run there and whose
  /// last action there (W on a process whose order has W's, B otherwise) had not: the
  /// activations it held at once, in its stages' units.
  std::vector<int> peakInFlight;
  /// The same per model stage: what each stage's activations cost the process holding it.
  std::vector<int> stagePeakInFlight;
};

/// Runs `orders` (one per process, process 0 first, micro-batches numbered from 0; an action
/// without a stage runs its process's own): each process runs its actions in order, each as
/// soon as the process is free and its inputs are there: F(s,i) after F(s-1,i); B(s,i) after
/// B(s+1,i) and F(s,i); W(s,i) after B(s,i), s being model stages 0..C-1, each run by one
/// process. Throws naming the stuck action of every process when the orders deadlock, and on
/// negative costs, repeated actions or a stage that two processes run or none does.
SimulatedStep simulate(const std::vector<std::vector<PipelineAction>>& orders, const ActionCosts& costs);

/// Simulates `schedule` with these unit costs; under gpipe and 1f1b a backward costs
/// backward + weights, since it includes the weight gradients.
///
///   simulate(PipelineSchedule::ZeroBubble, 4, 8, 1, 1, 1).makespan  // 27 = 3*8 + 4 - 1
SimulatedStep simulate(PipelineSchedule schedule, int stages, int microbatches, double forward, double backward,
                       double weights);

/// Every process's actions in one step, process 0 first.
using PipelineOrders = std::vector<std::vector<PipelineAction>>;

/// Per model stage, the process that runs it (actions without a stage run their process's).
std::vector<int> processOfStage(const PipelineOrders& orders);

/// A pipeline's schedule: a built-in one, or the orders of a schedule file.
class StepSchedule {
 public:
  /// `virtualStages`: the model stages each process holds (interleaved: 2 or more; zbv: 2, as
  /// it is when left at 1; the others: 1). Throws naming the schedule and the count otherwise.
  StepSchedule(PipelineSchedule builtIn = PipelineSchedule::OneFOneB,  // NOLINT: a built-in is a schedule
               int virtualStages = 1);
  /// The schedule a file lists: one line per process, process 0 first, each the process's
  /// actions in order, separated by spaces ("F0 F1 B0 B1"; W's split each backward as zb does;
  /// with virtual stages, each action names its model stage first: "0F0 2F0 2B0 0B0"); '#'
  /// starts a comment. Throws naming the file, the line and the token that is not an action.
  static StepSchedule read(const std::string& path);
  /// As read, from the file's text; `source` names it in errors.
  static StepSchedule parse(const std::string& text, const std::string& source);

  /// Every process's actions for a step of `microbatches` micro-batches over `stages`
  /// processes. A file's orders are first checked to be such a step, throwing naming the file,
  /// the process and the action otherwise: every model stage runs F i and B i of every
  /// micro-batch once, on one process, W i of every micro-batch on every stage or on none, and no
  /// process waits for what never comes.
  PipelineOrders orders(int stages, int microbatches) const;
  /// The model stages a pipeline of `stages` processes cuts the model into: stages times the
  /// virtual stages, or as many as a file names.
  int modelStages(int stages) const;
  /// The model stages each process holds (1 unless virtual).
  int virtualStages() const { return virtualStages_; }
  /// Whether each backward is split into B (input gradients) and W (weight gradients).
  bool splitsWeights() const;
  /// Simulates a step with these costs of each action (of one model stage; a backward without W's
  /// costs backward + weights).
  SimulatedStep simulate(int stages, int microbatches, const ActionCosts& costs) const;
  /// "1f1b", "interleaved (2 stages a process)", or "file plan.txt".
  std::string name() const;
  /// The built-in it is, if it is one.
  std::optional<PipelineSchedule> builtIn() const { return builtIn_; }

 private:
  std::optional<PipelineSchedule> builtIn_;
  int virtualStages_ = 1;
  PipelineOrders listed_;  // a file's orders, as listed
  std::string source_;     // what errors call it: "schedule file plan.txt"
  std::string name_;
};

/// `orders` as a schedule file lists them.
std::string formatOrders(const PipelineOrders& orders);

}  // namespace weft::dist
