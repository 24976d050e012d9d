#include "dist/pipeline/Schedule.h"

#include "core/Error.h"
#include "core/Escape.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

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
  return StepSchedule(schedule).simulate(stages, microbatches, {forward, backward, weights});
}

namespace {

// A schedule file larger than this is not a schedule (S = 64 stages of M = 4096 micro-batches
// take about 5 MB).
constexpr size_t kMaxScheduleFileBytes = size_t{64} << 20;

// "F12" as an action, or nullopt.
std::optional<PipelineAction> parseAction(std::string_view token) {
  static constexpr std::string_view kLetters = "FBW";
  const size_t kind = kLetters.find(token.empty() ? '?' : token.front());
  if (kind == std::string_view::npos || token.size() < 2 || token.size() > 6) return std::nullopt;
  int microbatch = 0;
  for (const char c : token.substr(1)) {
    if (c < '0' || c > '9') return std::nullopt;
    microbatch = microbatch * 10 + (c - '0');
  }
  return PipelineAction{static_cast<Kind>(kind), microbatch};
}

// Throws unless `order` runs F i and B i of each of `microbatches` once, and W i once each when
// `split` (none otherwise).
void checkStageOrder(const std::vector<PipelineAction>& order, size_t stage, int microbatches, bool split,
                     const std::string& source) {
  std::array<std::vector<char>, 3> seen;
  for (auto& kind : seen) kind.assign(static_cast<size_t>(microbatches), 0);
  for (const PipelineAction& a : order) {
    WEFT_CHECK(a.microbatch < microbatches, "{}: stage {} runs {}, but a step has {} micro-batches (0 to {})", source,
               stage, describe(a), microbatches, microbatches - 1);
    char& ran = seen[static_cast<size_t>(a.kind)][static_cast<size_t>(a.microbatch)];
    WEFT_CHECK(!ran, "{}: stage {} runs {} twice", source, stage, describe(a));
    ran = 1;
  }
  const auto& weights = seen[static_cast<size_t>(Kind::Weights)];
  WEFT_CHECK(!split || std::find(weights.begin(), weights.end(), 1) != weights.end(),
             "{}: stage {} runs no W while another stage does: a schedule splits the backward of every stage or of "
             "none",
             source, stage);
  for (const Kind kind : {Kind::Forward, Kind::Backward, Kind::Weights}) {
    if (kind == Kind::Weights && !split) continue;
    const auto& ran = seen[static_cast<size_t>(kind)];
    const auto missing = std::find(ran.begin(), ran.end(), 0);
    WEFT_CHECK(missing == ran.end(), "{}: stage {} never runs {}", source, stage,
               describe({kind, static_cast<int>(missing - ran.begin())}));
  }
}

}  // namespace

StepSchedule::StepSchedule(PipelineSchedule builtIn) : builtIn_(builtIn) {}

StepSchedule StepSchedule::read(const std::string& path) {
  std::error_code error;
  const uintmax_t bytes = std::filesystem::file_size(path, error);
  WEFT_CHECK(!error, "cannot read schedule file '{}': {}", path, error.message());
  WEFT_CHECK(bytes <= kMaxScheduleFileBytes, "schedule file '{}' has {} bytes, more than a schedule's {}", path, bytes,
             kMaxScheduleFileBytes);
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in, "cannot read schedule file '{}': {}", path, std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  StepSchedule schedule = parse(text, fmt::format("schedule file {}", path));
  schedule.name_ = "file " + path;
  return schedule;
}

StepSchedule StepSchedule::parse(const std::string& text, const std::string& source) {
  StepSchedule schedule;
  schedule.builtIn_.reset();
  schedule.source_ = schedule.name_ = source;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::istringstream tokens(line.substr(0, line.find('#')));
    std::vector<PipelineAction> order;
    for (std::string token; tokens >> token;) {
      const std::optional<PipelineAction> action = parseAction(token);
      WEFT_CHECK(action,
                 "{} line {}: '{}' is not an action: an action is F (forward), B (backward) or W (weight gradients) "
                 "and a micro-batch number, such as F0 or B12",
                 source, number, escapeBytes(token, 32));
      order.push_back(*action);
    }
    if (!order.empty()) schedule.listed_.push_back(std::move(order));
  }
  WEFT_CHECK(!schedule.listed_.empty(), "{} lists no stage's actions", source);
  return schedule;
}

PipelineOrders StepSchedule::orders(int stages, int microbatches) const {
  checkShape(stages, microbatches);
  PipelineOrders out;
  if (builtIn_) {
    for (int s = 0; s < stages; ++s) out.push_back(stageSchedule(*builtIn_, stages, microbatches, s));
    return out;
  }
  WEFT_CHECK(listed_.size() == static_cast<size_t>(stages), "{} lists {} stages' actions; the pipeline has {} stages",
             source_, listed_.size(), stages);
  for (size_t s = 0; s < listed_.size(); ++s) checkStageOrder(listed_[s], s, microbatches, splitsWeights(), source_);
  try {
    dist::simulate(listed_, {});
  } catch (const Error& e) {
    WEFT_THROW("{}: {}", source_, e.what());
  }
  return listed_;
}

bool StepSchedule::splitsWeights() const {
  if (builtIn_) return *builtIn_ == PipelineSchedule::ZeroBubble;
  for (const auto& order : listed_)
    for (const PipelineAction& a : order)
      if (a.kind == Kind::Weights) return true;
  return false;
}

SimulatedStep StepSchedule::simulate(int stages, int microbatches, const ActionCosts& costs) const {
  const PipelineOrders all = orders(stages, microbatches);
  checkCosts(costs);
  // Without a separate W the backward does the weight gradients too.
  ActionCosts run = costs;
  if (!splitsWeights()) run.backward += costs.weights;
  return dist::simulate(all, run);
}

std::string StepSchedule::name() const { return builtIn_ ? scheduleName(*builtIn_) : name_; }

std::string formatOrders(const PipelineOrders& orders) {
  std::string out;
  for (const auto& order : orders) {
    for (size_t k = 0; k < order.size(); ++k) {
      if (k > 0) out += ' ';
      out += describe(order[k]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace weft::dist
