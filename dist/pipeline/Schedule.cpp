#include "dist/pipeline/Schedule.h"

#include "core/Error.h"
#include "core/Escape.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
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
    case PipelineSchedule::Interleaved:
      return "interleaved";
    case PipelineSchedule::ZeroBubbleV:
      return "zbv";
  }
  return "?";
}

PipelineSchedule parseSchedule(const std::string& name) {
  for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble,
                             PipelineSchedule::Interleaved, PipelineSchedule::ZeroBubbleV}) {
    if (name == scheduleName(s)) return s;
  }
  WEFT_THROW("unknown pipeline schedule '{}' (expected gpipe, 1f1b, zb, interleaved or zbv)", name);
}

std::string describe(const PipelineAction& a) {
  static constexpr std::array<char, 3> kLetters = {'F', 'B', 'W'};
  const std::string action = kLetters[static_cast<size_t>(a.kind)] + std::to_string(a.microbatch);
  return a.stage >= 0 ? std::to_string(a.stage) + action : action;
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

// Megatron-LM's interleaved 1F1B for process `process` of S holding stages process + v·S: its
// k-th forward runs chunk (k mod SV) / S of micro-batch (k / SV)·S + k mod S (S micro-batches
// through one chunk, then the next chunk); its backwards walk the chunks the other way.
std::vector<PipelineAction> interleavedChunksOrder(int stages, int chunks, int microbatches, int process) {
  WEFT_CHECK(microbatches % stages == 0,
             "interleaved 1F1B runs micro-batches in groups of one per process: {} micro-batches do not divide "
             "among {} stages (use a multiple of {})",
             microbatches, stages, stages);
  const int total = microbatches * chunks, group = stages * chunks;
  auto action = [&](Kind kind, int k) {
    const int chunk = (k % group) / stages;
    return PipelineAction{kind, (k / group) * stages + k % stages,
                          (kind == Kind::Forward ? chunk : chunks - 1 - chunk) * stages + process};
  };
  const int warmup = std::min(2 * (stages - process - 1) + (chunks - 1) * stages, total);
  std::vector<PipelineAction> order;
  for (int k = 0; k < warmup; ++k) order.push_back(action(Kind::Forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(action(Kind::Forward, warmup + k));
    order.push_back(action(Kind::Backward, k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(action(Kind::Backward, k));
  return order;
}

// ZB-V by list scheduling with F = B = W = 1 (see the header): the processes advance in unit
// time steps, each taking the best ready action of its two stages, which run their forwards,
// backwards and W's each in micro-batch order.
PipelineOrders zeroBubbleVOrders(int stages, int microbatches) {
  const int chunks = 2 * stages, limit = 2 * stages;
  // ends[c][kind][i]: when that action ends (-1: not run); next[c][kind]: its next micro-batch.
  std::vector<std::array<std::vector<int>, 3>> ends(static_cast<size_t>(chunks));
  for (auto& kinds : ends)
    for (auto& times : kinds) times.assign(static_cast<size_t>(microbatches), -1);
  std::vector<std::array<int, 3>> next(static_cast<size_t>(chunks), {0, 0, 0});
  auto endOf = [&](const PipelineAction& a) -> int& {
    return ends[static_cast<size_t>(a.stage)][static_cast<size_t>(a.kind)][static_cast<size_t>(a.microbatch)];
  };
  auto nextOf = [&](int c, Kind kind) -> int& { return next[static_cast<size_t>(c)][static_cast<size_t>(kind)]; };
  // Stage c's next action of `kind`, if its inputs have ended by `now`.
  auto ready = [&](int c, Kind kind, int now) -> std::optional<PipelineAction> {
    const int i = nextOf(c, kind);
    if (i >= microbatches) return std::nullopt;
    auto done = [&](int stage, Kind k) {
      const int end = endOf({k, i, stage});
      return end >= 0 && end <= now;
    };
    const bool inputs = kind == Kind::Forward ? c == 0 || done(c - 1, Kind::Forward)
                        : kind == Kind::Backward
                            ? done(c, Kind::Forward) && (c + 1 == chunks || done(c + 1, Kind::Backward))
                            : done(c, Kind::Backward);
    return inputs ? std::optional<PipelineAction>({kind, i, c}) : std::nullopt;
  };
  // Process p's choice at `now`: B, then F under the limit, then W; the lowest micro-batch
  // first, and between its two stages the later one (nearer the loss).
  auto choose = [&](int p, int held, int now) -> std::optional<PipelineAction> {
    for (const Kind kind : {Kind::Backward, Kind::Forward, Kind::Weights}) {
      if (kind == Kind::Forward && held >= limit) continue;
      std::optional<PipelineAction> chosen;
      for (const int c : {chunks - 1 - p, p}) {
        const std::optional<PipelineAction> a = ready(c, kind, now);
        if (a && (!chosen || a->microbatch < chosen->microbatch)) chosen = a;
      }
      if (chosen) return chosen;
    }
    return std::nullopt;
  };
  PipelineOrders orders(static_cast<size_t>(stages));
  std::vector<int> inFlight(static_cast<size_t>(stages), 0);
  for (int now = 0, left = 3 * chunks * microbatches; left > 0; ++now) {
    for (int p = 0; p < stages; ++p) {
      auto& order = orders[static_cast<size_t>(p)];
      if (!order.empty() && endOf(order.back()) > now) continue;  // busy
      int& held = inFlight[static_cast<size_t>(p)];
      const std::optional<PipelineAction> chosen = choose(p, held, now);
      if (!chosen) continue;
      order.push_back(*chosen);
      endOf(*chosen) = now + 1;
      ++nextOf(chosen->stage, chosen->kind);
      held += chosen->kind == Kind::Forward ? 1 : chosen->kind == Kind::Weights ? -1 : 0;
      --left;
    }
  }
  return orders;
}

int checkedVirtualStages(PipelineSchedule schedule, int virtualStages) {
  switch (schedule) {
    case PipelineSchedule::Interleaved:
      WEFT_CHECK(virtualStages >= 2,
                 "interleaved 1F1B needs 2 or more virtual stages per process, got {} (with 1 it is 1f1b)",
                 virtualStages);
      return virtualStages;
    case PipelineSchedule::ZeroBubbleV:
      WEFT_CHECK(virtualStages == 1 || virtualStages == 2,
                 "zbv holds 2 stages per process (a V), not {} virtual stages", virtualStages);
      return 2;
    default:
      WEFT_CHECK(virtualStages == 1,
                 "the {} schedule runs one stage per process; {} virtual stages need interleaved or zbv",
                 scheduleName(schedule), virtualStages);
      return 1;
  }
}

PipelineOrders builtInOrders(PipelineSchedule schedule, int stages, int virtualStages, int microbatches) {
  checkShape(stages, microbatches);
  const int chunks = checkedVirtualStages(schedule, virtualStages);
  PipelineOrders orders;
  switch (schedule) {
    case PipelineSchedule::ZeroBubbleV:
      return zeroBubbleVOrders(stages, microbatches);
    case PipelineSchedule::Interleaved:
      for (int s = 0; s < stages; ++s) orders.push_back(interleavedChunksOrder(stages, chunks, microbatches, s));
      return orders;
    case PipelineSchedule::GPipe:
      for (int s = 0; s < stages; ++s) orders.push_back(gpipeOrder(microbatches));
      return orders;
    case PipelineSchedule::OneFOneB:
      for (int s = 0; s < stages; ++s) orders.push_back(interleavedOrder(stages, microbatches, s, std::nullopt));
      return orders;
    // Holding back s W's on stage s keeps it at S micro-batches in flight, stage 0's 1f1b bound.
    case PipelineSchedule::ZeroBubble:
      for (int s = 0; s < stages; ++s) orders.push_back(interleavedOrder(stages, microbatches, s, s));
      return orders;
  }
  WEFT_THROW("unknown pipeline schedule {}", static_cast<int>(schedule));
}

}  // namespace

std::vector<PipelineAction> stageSchedule(PipelineSchedule schedule, int stages, int microbatches, int stage,
                                          int virtualStages) {
  checkShape(stages, microbatches);
  WEFT_CHECK(stage >= 0 && stage < stages, "pipeline stage {} is out of range [0, {})", stage, stages);
  return builtInOrders(schedule, stages, virtualStages, microbatches)[static_cast<size_t>(stage)];
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

// The model stage `a` runs, listed by process `process`.
int stageOf(const PipelineAction& a, size_t process) { return a.stage >= 0 ? a.stage : static_cast<int>(process); }

// What an order's line is called in errors: a stage, or with virtual stages a process.
const char* lineName(const std::vector<std::vector<PipelineAction>>& orders) {
  for (const auto& order : orders)
    for (const PipelineAction& a : order)
      if (a.stage >= 0) return "process";
  return "stage";
}

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
  const char* line = lineName(orders);
  int microbatches = 0;
  for (size_t s = 0; s < orders.size(); ++s) {
    for (size_t k = 0; k < orders[s].size(); ++k) {
      const PipelineAction& a = orders[s][k];
      WEFT_CHECK(a.microbatch >= 0, "{} {} runs {}: micro-batches are numbered from 0", line, s, describe(a));
      WEFT_CHECK(std::find(orders[s].begin(), orders[s].begin() + static_cast<long>(k), a) ==
                     orders[s].begin() + static_cast<long>(k),
                 "{} {} runs {} twice", line, s, describe(a));
      microbatches = std::max(microbatches, a.microbatch + 1);
    }
  }
  return microbatches;
}

// Most (stage, micro-batch) pairs forwarded in `order` and not yet released by their last
// action there; with `stage` >= 0, counting that model stage's actions only.
int peakInFlight(const std::vector<PipelineAction>& order, size_t process, int stage = -1) {
  const bool splitBackward =
      std::any_of(order.begin(), order.end(), [](const PipelineAction& a) { return a.kind == Kind::Weights; });
  const Kind release = splitBackward ? Kind::Weights : Kind::Backward;
  int inFlight = 0, peak = 0;
  for (const PipelineAction& a : order) {
    if (stage >= 0 && stageOf(a, process) != stage) continue;
    if (a.kind == Kind::Forward) peak = std::max(peak, ++inFlight);
    if (a.kind == release) --inFlight;
  }
  return peak;
}

std::string describeStuck(const std::vector<std::vector<PipelineAction>>& orders, const std::vector<size_t>& next) {
  std::string stuck;
  for (size_t s = 0; s < orders.size(); ++s) {
    if (next[s] == orders[s].size()) continue;
    stuck += fmt::format("{}{} {} at {}", stuck.empty() ? "" : ", ", lineName(orders), s, describe(orders[s][next[s]]));
  }
  return stuck;
}

// Runs process `p`'s next action if its inputs are there; returns whether it did.
bool runNext(const std::vector<std::vector<PipelineAction>>& orders, size_t p, EndTimes& ends,
             std::vector<size_t>& next, SimulatedStep& step, const ActionCosts& costs) {
  if (next[p] == orders[p].size()) return false;
  const PipelineAction& a = orders[p][next[p]];
  const int stage = stageOf(a, p);
  const std::optional<double> ready = inputsReady(ends, stage, a);
  if (!ready) return false;
  const double start = step.stages[p].empty() ? *ready : std::max(*ready, step.stages[p].back().end);
  const double end = start + costOf(a.kind, costs);
  step.stages[p].push_back({a, start, end});
  ends.at(stage, a.kind, a.microbatch) = end;
  ++next[p];
  return true;
}

void summarize(SimulatedStep& step, const std::vector<std::vector<PipelineAction>>& orders,
               const std::vector<int>& processOf) {
  for (const auto& timed : step.stages) {
    for (const TimedAction& t : timed) step.makespan = std::max(step.makespan, t.end);
  }
  for (size_t p = 0; p < orders.size(); ++p) {
    double busy = 0;
    for (const TimedAction& t : step.stages[p]) busy += t.end - t.start;
    step.idle.push_back(step.makespan - busy);
    step.peakInFlight.push_back(peakInFlight(orders[p], p));
  }
  for (size_t c = 0; c < processOf.size(); ++c) {
    const auto p = static_cast<size_t>(processOf[c]);
    step.stagePeakInFlight.push_back(peakInFlight(orders[p], p, static_cast<int>(c)));
  }
}

}  // namespace

std::vector<int> processOfStage(const PipelineOrders& orders) {
  const char* line = lineName(orders);
  std::map<int, size_t> owner;
  for (size_t p = 0; p < orders.size(); ++p) {
    for (const PipelineAction& a : orders[p]) {
      const int stage = stageOf(a, p);
      WEFT_CHECK(stage >= 0, "{} {} runs {}: stages are numbered from 0", line, p, describe(a));
      const auto [it, added] = owner.emplace(stage, p);
      WEFT_CHECK(added || it->second == p, "stage {} runs on {} {} ({}) and {} {}: a stage belongs to one process",
                 stage, line, it->second, describe(a), line, p);
    }
  }
  std::vector<int> processOf;
  for (const auto& [stage, p] : owner) {
    WEFT_CHECK(stage == static_cast<int>(processOf.size()),
               "no process runs stage {}, yet {} {} runs stage {}: the model's stages are numbered 0 to {} without a "
               "gap",
               processOf.size(), line, p, stage, owner.rbegin()->first);
    processOf.push_back(static_cast<int>(p));
  }
  return processOf;
}

SimulatedStep simulate(const std::vector<std::vector<PipelineAction>>& orders, const ActionCosts& costs) {
  checkCosts(costs);
  const int microbatches = checkOrders(orders);
  const std::vector<int> processOf = processOfStage(orders);
  EndTimes ends(static_cast<int>(processOf.size()), microbatches);
  SimulatedStep step;
  step.stages.resize(orders.size());
  std::vector<size_t> next(orders.size(), 0);
  // An action's start depends only on when its inputs and its process are ready, not on which
  // process we visit first, so sweeping until none can move gives every action its earliest start.
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t p = 0; p < orders.size(); ++p) {
      while (runNext(orders, p, ends, next, step, costs)) moved = true;
    }
  }
  const std::string stuck = describeStuck(orders, next);
  WEFT_CHECK(stuck.empty(), "the pipeline orders deadlock: {} can never run", stuck);
  summarize(step, orders, processOf);
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

// Digits as a number below a million, or nullopt.
std::optional<int> parseCount(std::string_view digits) {
  if (digits.empty() || digits.size() > 6) return std::nullopt;
  int value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

// "F12", or with its stage "3F12", as an action, or nullopt.
std::optional<PipelineAction> parseAction(std::string_view token) {
  static constexpr std::string_view kLetters = "FBW";
  const size_t letter = token.find_first_of(kLetters);
  if (letter == std::string_view::npos) return std::nullopt;
  const std::optional<int> microbatch = parseCount(token.substr(letter + 1));
  const std::optional<int> stage = letter == 0 ? std::optional<int>(-1) : parseCount(token.substr(0, letter));
  if (!microbatch || !stage) return std::nullopt;
  return PipelineAction{static_cast<Kind>(kLetters.find(token[letter])), *microbatch, *stage};
}

// Throws unless each model stage runs F i and B i of each of `microbatches` once, and W i once
// each when `split` (none otherwise), all on one process.
void checkStageOrders(const PipelineOrders& orders, int microbatches, bool split, const std::string& source) {
  std::vector<int> processOf;
  try {
    processOf = processOfStage(orders);
  } catch (const Error& e) {
    WEFT_THROW("{}: {}", source, e.what());
  }
  const char* line = lineName(orders);
  // seen[stage][kind][micro-batch]
  std::vector<std::array<std::vector<char>, 3>> seen(processOf.size());
  for (auto& kinds : seen)
    for (auto& kind : kinds) kind.assign(static_cast<size_t>(microbatches), 0);
  for (size_t p = 0; p < orders.size(); ++p) {
    for (const PipelineAction& a : orders[p]) {
      WEFT_CHECK(a.microbatch < microbatches, "{}: {} {} runs {}, but a step has {} micro-batches (0 to {})", source,
                 line, p, describe(a), microbatches, microbatches - 1);
      auto& kinds = seen[static_cast<size_t>(stageOf(a, p))];
      char& ran = kinds[static_cast<size_t>(a.kind)][static_cast<size_t>(a.microbatch)];
      WEFT_CHECK(!ran, "{}: {} {} runs {} twice", source, line, p, describe(a));
      ran = 1;
    }
  }
  const bool named = std::string_view(line) == "process";
  for (size_t c = 0; c < seen.size(); ++c) {
    const auto& weights = seen[c][static_cast<size_t>(Kind::Weights)];
    WEFT_CHECK(!split || std::find(weights.begin(), weights.end(), 1) != weights.end(),
               "{}: stage {} runs no W while another stage does: a schedule splits the backward of every stage or "
               "of none",
               source, c);
    for (const Kind kind : {Kind::Forward, Kind::Backward, Kind::Weights}) {
      if (kind == Kind::Weights && !split) continue;
      const auto& ran = seen[c][static_cast<size_t>(kind)];
      const auto missing = std::find(ran.begin(), ran.end(), 0);
      WEFT_CHECK(missing == ran.end(), "{}: stage {} never runs {}", source, c,
                 describe({kind, static_cast<int>(missing - ran.begin()), named ? static_cast<int>(c) : -1}));
    }
  }
}

}  // namespace

StepSchedule::StepSchedule(PipelineSchedule builtIn, int virtualStages)
    : builtIn_(builtIn), virtualStages_(checkedVirtualStages(builtIn, virtualStages)) {}

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
  for (size_t p = 0; p < schedule.listed_.size(); ++p) {
    std::vector<int> held;
    for (const PipelineAction& a : schedule.listed_[p])
      if (std::find(held.begin(), held.end(), stageOf(a, p)) == held.end()) held.push_back(stageOf(a, p));
    schedule.virtualStages_ = std::max(schedule.virtualStages_, static_cast<int>(held.size()));
  }
  return schedule;
}

PipelineOrders StepSchedule::orders(int stages, int microbatches) const {
  checkShape(stages, microbatches);
  if (builtIn_) return builtInOrders(*builtIn_, stages, virtualStages_, microbatches);
  WEFT_CHECK(listed_.size() == static_cast<size_t>(stages), "{} lists {} {}s' actions; the pipeline has {} {}s",
             source_, listed_.size(), lineName(listed_), stages, lineName(listed_));
  checkStageOrders(listed_, microbatches, splitsWeights(), source_);
  try {
    dist::simulate(listed_, {});
  } catch (const Error& e) {
    WEFT_THROW("{}: {}", source_, e.what());
  }
  return listed_;
}

int StepSchedule::modelStages(int stages) const {
  if (builtIn_) return stages * virtualStages_;
  try {
    return static_cast<int>(processOfStage(listed_).size());
  } catch (const Error& e) {
    WEFT_THROW("{}: {}", source_, e.what());
  }
}

bool StepSchedule::splitsWeights() const {
  if (builtIn_) return *builtIn_ == PipelineSchedule::ZeroBubble || *builtIn_ == PipelineSchedule::ZeroBubbleV;
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

std::string StepSchedule::name() const {
  if (!builtIn_) return name_;
  if (*builtIn_ == PipelineSchedule::Interleaved)
    return fmt::format("interleaved ({} stages a process)", virtualStages_);
  return scheduleName(*builtIn_);
}

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
