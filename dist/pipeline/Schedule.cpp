#include "dist/pipeline/Schedule.h"

#include "core/Error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

namespace weft::dist {

using Kind = PipelineAction::Kind;

const char* scheduleName(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::GPipe:
      return "gpipe";
    case PipelineSchedule::OneFOneB:
      return "1f1b";
    case PipelineSchedule::ZeroBubble:
      return "zb";
  }
  return "?";
}

PipelineSchedule parseSchedule(const std::string& name) {
  for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble}) {
    if (name == scheduleName(s)) return s;
  }
  WEFT_THROW("unknown pipeline schedule '{}' (expected gpipe, 1f1b or zb)", name);
}

std::string describe(const PipelineAction& a) {
  static constexpr std::array<char, 3> kLetters = {'F', 'B', 'W'};
  return kLetters[static_cast<size_t>(a.kind)] + std::to_string(a.microbatch);
}

namespace {

void checkShape(int stages, int microbatches) {
  WEFT_CHECK(stages >= 1, "a pipeline needs at least 1 stage, got stages = {}", stages);
  WEFT_CHECK(microbatches >= 1, "a pipeline step needs at least 1 micro-batch, got microbatches = {}", microbatches);
}

std::vector<PipelineAction> gpipeOrder(int microbatches) {
  std::vector<PipelineAction> order;
  for (int i = 0; i < microbatches; ++i) order.push_back({Kind::Forward, i});
  for (int i = 0; i < microbatches; ++i) order.push_back({Kind::Backward, i});
  return order;
}

// 1f1b and zb share one shape: warm-up forwards, then forward/backward pairs, then the remaining
// backwards. With a `weightLag` (zb) every backward is followed by the W that is `weightLag`
// micro-batches behind it, if any, and the W's still held back run at the end.
std::vector<PipelineAction> interleavedOrder(int stages, int microbatches, int stage, std::optional<int> weightLag) {
  std::vector<PipelineAction> order;
  int forwards = 0, backwards = 0, weights = 0;
  auto forward = [&] { order.push_back({Kind::Forward, forwards++}); };
  auto backward = [&] {
    order.push_back({Kind::Backward, backwards++});
    if (weightLag && backwards - weights > *weightLag) order.push_back({Kind::Weights, weights++});
  };
  // The warm-up fills the pipe: stage s's first backward needs S-s-1 later stages' forwards.
  const int warmup = std::min(stages - stage - 1, microbatches);
  while (forwards < warmup) forward();
  while (forwards < microbatches) {
    forward();
    backward();
  }
  while (backwards < microbatches) backward();
  while (weightLag && weights < microbatches) order.push_back({Kind::Weights, weights++});
  return order;
}

}  // namespace

std::vector<PipelineAction> stageSchedule(PipelineSchedule schedule, int stages, int microbatches, int stage) {
  checkShape(stages, microbatches);
  WEFT_CHECK(stage >= 0 && stage < stages, "pipeline stage {} is out of range [0, {})", stage, stages);
  switch (schedule) {
    case PipelineSchedule::GPipe:
      return gpipeOrder(microbatches);
    case PipelineSchedule::OneFOneB:
      return interleavedOrder(stages, microbatches, stage, std::nullopt);
    // Holding back s W's on stage s keeps it at S micro-batches in flight, stage 0's 1f1b bound.
    case PipelineSchedule::ZeroBubble:
      return interleavedOrder(stages, microbatches, stage, stage);
  }
  WEFT_THROW("unknown pipeline schedule {}", static_cast<int>(schedule));
}

namespace {

// When each action ended, per stage, kind and micro-batch; nullopt while it has not run.
class EndTimes {
 public:
  EndTimes(int stages, int microbatches)
      : ends_(static_cast<size_t>(stages), std::array<std::vector<std::optional<double>>, 3>{}) {
    for (auto& kinds : ends_) {
      for (auto& times : kinds) times.resize(static_cast<size_t>(microbatches));
    }
  }
  std::optional<double>& at(int stage, Kind kind, int microbatch) {
    return ends_[static_cast<size_t>(stage)][static_cast<size_t>(kind)][static_cast<size_t>(microbatch)];
  }
  int stages() const { return static_cast<int>(ends_.size()); }

 private:
  std::vector<std::array<std::vector<std::optional<double>>, 3>> ends_;
};

// The time `a` on `stage` may start as far as its inputs go, or nullopt while one is missing.
std::optional<double> inputsReady(EndTimes& ends, int stage, const PipelineAction& a) {
  double ready = 0;
  bool missing = false;
  auto after = [&](int s, Kind kind) {
    const std::optional<double>& end = ends.at(s, kind, a.microbatch);
    if (end)
      ready = std::max(ready, *end);
    else
      missing = true;
  };
  switch (a.kind) {
    case Kind::Forward:
      if (stage > 0) after(stage - 1, Kind::Forward);
      break;
    case Kind::Backward:
      after(stage, Kind::Forward);
      if (stage + 1 < ends.stages()) after(stage + 1, Kind::Backward);
      break;
    case Kind::Weights:
      after(stage, Kind::Backward);
      break;
  }
  return missing ? std::nullopt : std::optional<double>(ready);
}

double costOf(Kind kind, const ActionCosts& costs) {
  switch (kind) {
    case Kind::Forward:
      return costs.forward;
    case Kind::Backward:
      return costs.backward;
    case Kind::Weights:
      return costs.weights;
  }
  return 0;
}

void checkCosts(const ActionCosts& c) {
  for (double cost : {c.forward, c.backward, c.weights}) {
    WEFT_CHECK(std::isfinite(cost) && cost >= 0,
               "pipeline action costs must be finite and >= 0, got forward = {}, backward = {}, weights = {}",
               c.forward, c.backward, c.weights);
  }
}

// The number of micro-batches the orders name; throws on a negative one or an action run twice.
int checkOrders(const std::vector<std::vector<PipelineAction>>& orders) {
  WEFT_CHECK(!orders.empty(), "a pipeline needs at least 1 stage, got no stage orders");
  int microbatches = 0;
  for (size_t s = 0; s < orders.size(); ++s) {
    for (size_t k = 0; k < orders[s].size(); ++k) {
      const PipelineAction& a = orders[s][k];
      WEFT_CHECK(a.microbatch >= 0, "stage {} runs {}: micro-batches are numbered from 0", s, describe(a));
      WEFT_CHECK(std::find(orders[s].begin(), orders[s].begin() + static_cast<long>(k), a) ==
                     orders[s].begin() + static_cast<long>(k),
                 "stage {} runs {} twice", s, describe(a));
      microbatches = std::max(microbatches, a.microbatch + 1);
    }
  }
  return microbatches;
}

// Most micro-batches forwarded on a stage and not yet released by its last action for them.
int peakInFlight(const std::vector<PipelineAction>& order) {
  const bool splitBackward =
      std::any_of(order.begin(), order.end(), [](const PipelineAction& a) { return a.kind == Kind::Weights; });
  const Kind release = splitBackward ? Kind::Weights : Kind::Backward;
  int inFlight = 0, peak = 0;
  for (const PipelineAction& a : order) {
    if (a.kind == Kind::Forward) peak = std::max(peak, ++inFlight);
    if (a.kind == release) --inFlight;
  }
  return peak;
}

std::string describeStuck(const std::vector<std::vector<PipelineAction>>& orders, const std::vector<size_t>& next) {
  std::string stuck;
  for (size_t s = 0; s < orders.size(); ++s) {
    if (next[s] == orders[s].size()) continue;
    stuck += fmt::format("{}stage {} at {}", stuck.empty() ? "" : ", ", s, describe(orders[s][next[s]]));
  }
  return stuck;
}

// Runs stage `s`'s next action if its inputs are there; returns whether it did.
bool runNext(const std::vector<std::vector<PipelineAction>>& orders, int s, EndTimes& ends, std::vector<size_t>& next,
             SimulatedStep& step, const ActionCosts& costs) {
  const size_t stage = static_cast<size_t>(s);
  if (next[stage] == orders[stage].size()) return false;
  const PipelineAction& a = orders[stage][next[stage]];
  const std::optional<double> ready = inputsReady(ends, s, a);
  if (!ready) return false;
  const double start = step.stages[stage].empty() ? *ready : std::max(*ready, step.stages[stage].back().end);
  const double end = start + costOf(a.kind, costs);
  step.stages[stage].push_back({a, start, end});
  ends.at(s, a.kind, a.microbatch) = end;
  ++next[stage];
  return true;
}

void summarize(SimulatedStep& step, const std::vector<std::vector<PipelineAction>>& orders) {
  for (const auto& timed : step.stages) {
    for (const TimedAction& t : timed) step.makespan = std::max(step.makespan, t.end);
  }
  for (size_t s = 0; s < orders.size(); ++s) {
    double busy = 0;
    for (const TimedAction& t : step.stages[s]) busy += t.end - t.start;
    step.idle.push_back(step.makespan - busy);
    step.peakInFlight.push_back(peakInFlight(orders[s]));
  }
}

}  // namespace

SimulatedStep simulate(const std::vector<std::vector<PipelineAction>>& orders, const ActionCosts& costs) {
  checkCosts(costs);
  const int stages = static_cast<int>(orders.size());
  EndTimes ends(stages, checkOrders(orders));
  SimulatedStep step;
  step.stages.resize(orders.size());
  std::vector<size_t> next(orders.size(), 0);
  // An action's start depends only on when its inputs and its stage are ready, not on which stage
  // we visit first, so sweeping until no stage can move gives every action its earliest start.
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      while (runNext(orders, s, ends, next, step, costs)) moved = true;
    }
  }
  const std::string stuck = describeStuck(orders, next);
  WEFT_CHECK(stuck.empty(), "the pipeline orders deadlock: {} can never run", stuck);
  summarize(step, orders);
  return step;
}

SimulatedStep simulate(PipelineSchedule schedule, int stages, int microbatches, double forward, double backward,
                       double weights) {
  std::vector<std::vector<PipelineAction>> orders;
  checkShape(stages, microbatches);
  for (int s = 0; s < stages; ++s) orders.push_back(stageSchedule(schedule, stages, microbatches, s));
  // Without a separate W the backward does the weight gradients too.
  const bool splitBackward = schedule == PipelineSchedule::ZeroBubble;
  return simulate(orders, {forward, splitBackward ? backward : backward + weights, weights});
}

}  // namespace weft::dist
