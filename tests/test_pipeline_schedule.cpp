// Pipeline schedules (dist/pipeline/Schedule.h): what each stage runs in one step under gpipe, 1f1b and
// zb (ZB-H1), how long the step takes, how much each stage holds, and the errors.
#include "tests/TestUtil.h"

#include "dist/pipeline/Schedule.h"

#include <fstream>
#include <map>
#include <set>
#include <tuple>

using namespace weft;
using namespace weft::dist;

namespace {

using Kind = PipelineAction::Kind;

const PipelineSchedule kSchedules[] = {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
                                       PipelineSchedule::ZeroBubble};
const int kStageCounts[] = {1, 2, 3, 4, 8};
const int kMicrobatchCounts[] = {1, 2, 3, 4, 8, 16};

/// "F0 F1 B0 B1": a stage's order as one would write it by hand.
std::string orderText(PipelineSchedule schedule, int stages, int microbatches, int stage) {
  std::string text;
  for (const PipelineAction& a : stageSchedule(schedule, stages, microbatches, stage)) {
    if (!text.empty()) text += ' ';
    text += describe(a);
  }
  return text;
}

/// Where each (kind, micro-batch) sits in a stage's order; every action must appear once.
std::map<std::pair<Kind, int>, size_t> positions(const std::vector<PipelineAction>& order) {
  std::map<std::pair<Kind, int>, size_t> at;
  for (size_t k = 0; k < order.size(); ++k) {
    const bool fresh = at.emplace(std::pair{order[k].kind, order[k].microbatch}, k).second;
    CHECK_MESSAGE(fresh, describe(order[k]), " appears twice");
  }
  return at;
}

/// Runs `check(stages, microbatches)` for every count in the tables above.
template <class F>
void forEveryCount(F&& check) {
  for (int stages : kStageCounts) {
    for (int microbatches : kMicrobatchCounts) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      check(stages, microbatches);
    }
  }
}

/// Runs `check(schedule, stages, microbatches)` for every combination in the tables above.
template <class F>
void forEveryShape(F&& check) {
  for (PipelineSchedule schedule : kSchedules) {
    CAPTURE(scheduleName(schedule));
    forEveryCount([&](int stages, int microbatches) { check(schedule, stages, microbatches); });
  }
}

}  // namespace

TEST_CASE("parseSchedule reads back every scheduleName") {
  for (PipelineSchedule schedule : kSchedules) CHECK(parseSchedule(scheduleName(schedule)) == schedule);
  CHECK(std::string(scheduleName(PipelineSchedule::GPipe)) == "gpipe");
  CHECK(std::string(scheduleName(PipelineSchedule::OneFOneB)) == "1f1b");
  CHECK(std::string(scheduleName(PipelineSchedule::ZeroBubble)) == "zb");
}

TEST_CASE("describe writes an action as its letter and micro-batch") {
  CHECK(describe({Kind::Forward, 3}) == "F3");
  CHECK(describe({Kind::Backward, 0}) == "B0");
  CHECK(describe({Kind::Weights, 12}) == "W12");
}

TEST_CASE("every stage runs each micro-batch's F and B once, and W once under zb only") {
  forEveryShape([](PipelineSchedule schedule, int stages, int microbatches) {
    const bool split = schedule == PipelineSchedule::ZeroBubble;
    for (int s = 0; s < stages; ++s) {
      const std::vector<PipelineAction> order = stageSchedule(schedule, stages, microbatches, s);
      const auto at = positions(order);
      CHECK(order.size() == static_cast<size_t>(microbatches * (split ? 3 : 2)));
      for (int i = 0; i < microbatches; ++i) {
        CHECK(at.count({Kind::Forward, i}) == 1);
        CHECK(at.count({Kind::Backward, i}) == 1);
        CHECK(at.count({Kind::Weights, i}) == (split ? 1 : 0));
      }
    }
  });
}

TEST_CASE("every stage runs F i before B i, and B i before W i") {
  forEveryShape([](PipelineSchedule schedule, int stages, int microbatches) {
    for (int s = 0; s < stages; ++s) {
      auto at = positions(stageSchedule(schedule, stages, microbatches, s));
      for (int i = 0; i < microbatches; ++i) {
        CHECK(at[{Kind::Forward, i}] < at[{Kind::Backward, i}]);
        if (schedule == PipelineSchedule::ZeroBubble) CHECK(at[{Kind::Backward, i}] < at[{Kind::Weights, i}]);
      }
    }
  });
}

TEST_CASE("every schedule runs to the end, and the simulation keeps its waiting rules") {
  forEveryShape([](PipelineSchedule schedule, int stages, int microbatches) {
    SimulatedStep step;
    REQUIRE_NOTHROW(step = simulate(schedule, stages, microbatches, 1, 2, 1));
    // When each (stage, kind, micro-batch) started and ended, to check the rules independently.
    std::map<std::tuple<int, Kind, int>, std::pair<double, double>> when;
    for (int s = 0; s < stages; ++s) {
      double stageFree = 0;
      for (const TimedAction& t : step.stages[static_cast<size_t>(s)]) {
        CHECK(t.start >= stageFree);  // one action at a time, in order
        stageFree = t.end;
        when[{s, t.action.kind, t.action.microbatch}] = {t.start, t.end};
      }
    }
    for (const auto& [key, time] : when) {
      const auto [s, kind, i] = key;
      if (kind == Kind::Forward && s > 0) CHECK(time.first >= when.at({s - 1, Kind::Forward, i}).second);
      if (kind == Kind::Backward) CHECK(time.first >= when.at({s, Kind::Forward, i}).second);
      if (kind == Kind::Backward && s + 1 < stages) CHECK(time.first >= when.at({s + 1, Kind::Backward, i}).second);
      if (kind == Kind::Weights) CHECK(time.first >= when.at({s, Kind::Backward, i}).second);
    }
  });
}

TEST_CASE("gpipe runs every forward, then every backward, in micro-batch order") {
  for (int s = 0; s < 4; ++s) CHECK(orderText(PipelineSchedule::GPipe, 4, 3, s) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("1f1b with 4 stages and 6 micro-batches: warm-up, one forward one backward, drain") {
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 6, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 6, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 6, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 6, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST_CASE("1f1b with fewer micro-batches than warm-up slots runs them all, then every backward") {
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 2, 0) == "F0 F1 B0 B1");
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 2, 2) == "F0 F1 B0 B1");
  CHECK(orderText(PipelineSchedule::OneFOneB, 4, 2, 3) == "F0 B0 F1 B1");
}

TEST_CASE("1f1b stage s holds at most min(S - s, M) micro-batches") {
  forEveryCount([&](int stages, int microbatches) {
    const SimulatedStep step = simulate(PipelineSchedule::OneFOneB, stages, microbatches, 1, 2, 0);
    for (int s = 0; s < stages; ++s) {
      CAPTURE(s);
      CHECK(step.peakInFlight[static_cast<size_t>(s)] == std::min(stages - s, microbatches));
    }
  });
}

TEST_CASE("gpipe holds every micro-batch on every stage") {
  const SimulatedStep step = simulate(PipelineSchedule::GPipe, 4, 6, 1, 2, 0);
  CHECK(step.peakInFlight == std::vector<int>{6, 6, 6, 6});
}

TEST_CASE("gpipe and 1f1b with equal forward and backward costs idle (S-1)/(M+S-1) of the step") {
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    forEveryCount([&](int stages, int microbatches) {
      CAPTURE(scheduleName(schedule));
      const SimulatedStep step = simulate(schedule, stages, microbatches, 1, 1, 0);
      double idle = 0;
      for (double stageIdle : step.idle) idle += stageIdle;
      // Both sides are the same rational number of small integers, rounded once: exactly equal.
      CHECK(idle / (stages * step.makespan) ==
            static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1));
    });
  }
}

TEST_CASE("gpipe and 1f1b take (M+S-1)(F+B), the backward costing backward plus weights") {
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    forEveryCount([&](int stages, int microbatches) {
      CAPTURE(scheduleName(schedule));
      const double expected = 3.0 * (microbatches + stages - 1);
      CHECK(simulate(schedule, stages, microbatches, 1, 2, 0).makespan == expected);
      CHECK(simulate(schedule, stages, microbatches, 1, 1, 1).makespan == expected);
    });
  }
}

TEST_CASE("zb with 4 stages and 6 micro-batches: stage s runs W i after B i+s, the rest at the end") {
  CHECK(orderText(PipelineSchedule::ZeroBubble, 4, 6, 0) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5");
  CHECK(orderText(PipelineSchedule::ZeroBubble, 4, 6, 1) == "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5");
  CHECK(orderText(PipelineSchedule::ZeroBubble, 4, 6, 2) == "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5");
  CHECK(orderText(PipelineSchedule::ZeroBubble, 4, 6, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5");
}

// With F = B = W = 1 stage 0 can run at most S forwards before its first B, which cannot start
// before 2S - 1 (S forwards down the pipe, S - 1 B's back up): it idles at least S - 1, so no
// order within the bound beats 3M + S - 1. ZB-H1 reaches it for M >= S: a third of 1f1b's
// 3(S - 1) idle units per stage, where 1f1b (F = 1, B = 2) takes 3(M + S - 1).
TEST_CASE("zb with F = B = W takes 3M + S - 1, below 1f1b's 3(M + S - 1), for M >= S >= 2") {
  forEveryCount([&](int stages, int microbatches) {
    if (stages < 2 || microbatches < stages) return;
    const SimulatedStep zb = simulate(PipelineSchedule::ZeroBubble, stages, microbatches, 1, 1, 1);
    const SimulatedStep oneFOneB = simulate(PipelineSchedule::OneFOneB, stages, microbatches, 1, 2, 0);
    CHECK(zb.makespan == 3.0 * microbatches + stages - 1);
    CHECK(zb.makespan < oneFOneB.makespan);
    for (double idle : zb.idle) CHECK(idle == stages - 1);
  });
}

TEST_CASE("zb holds at most min(S, M) micro-batches whose W has not run, on every stage") {
  forEveryCount([&](int stages, int microbatches) {
    const SimulatedStep step = simulate(PipelineSchedule::ZeroBubble, stages, microbatches, 1, 1, 1);
    for (int peak : step.peakInFlight) CHECK(peak <= std::min(stages, microbatches));
    CHECK(step.peakInFlight[0] == std::min(stages, microbatches));  // stage 0: the same as 1f1b's
  });
}

TEST_CASE("stageSchedule and simulate name a stage count below 1") {
  const std::string message = errorOf([] { stageSchedule(PipelineSchedule::OneFOneB, 0, 4, 0); });
  CHECK_MESSAGE(contains(message, "stages = 0"), message);
  const std::string simulated = errorOf([] { simulate(PipelineSchedule::GPipe, 0, 4, 1, 1, 1); });
  CHECK_MESSAGE(contains(simulated, "stages = 0"), simulated);
}

TEST_CASE("stageSchedule names a micro-batch count below 1") {
  const std::string message = errorOf([] { stageSchedule(PipelineSchedule::GPipe, 4, 0, 0); });
  CHECK_MESSAGE(contains(message, "microbatches = 0"), message);
}

TEST_CASE("stageSchedule names a stage out of range, and the range") {
  const std::string past = errorOf([] { stageSchedule(PipelineSchedule::ZeroBubble, 4, 8, 4); });
  CHECK_MESSAGE(contains(past, "stage 4 is out of range [0, 4)"), past);
  const std::string negative = errorOf([] { stageSchedule(PipelineSchedule::ZeroBubble, 4, 8, -1); });
  CHECK_MESSAGE(contains(negative, "stage -1 is out of range [0, 4)"), negative);
}

TEST_CASE("parseSchedule names an unknown value and the choices") {
  const std::string message = errorOf([] { parseSchedule("foo"); });
  CHECK_MESSAGE(contains(message, "'foo'"), message);
  for (const char* choice : {"gpipe", "1f1b", "zb"}) CHECK_MESSAGE(contains(message, choice), message);
}

TEST_CASE("simulate names each stage's stuck action when the orders deadlock") {
  // Stage 1 wants F1 first, which stage 0 only sends after B0, which waits for stage 1.
  const std::vector<std::vector<PipelineAction>> orders = {
      {{Kind::Forward, 0}, {Kind::Backward, 0}, {Kind::Forward, 1}, {Kind::Backward, 1}},
      {{Kind::Forward, 1}, {Kind::Forward, 0}, {Kind::Backward, 0}, {Kind::Backward, 1}},
  };
  const std::string message = errorOf([&] { simulate(orders, {}); });
  CHECK_MESSAGE(contains(message, "deadlock"), message);
  CHECK_MESSAGE(contains(message, "stage 0 at B0"), message);
  CHECK_MESSAGE(contains(message, "stage 1 at F1"), message);
}

TEST_CASE("simulate names an action a stage runs twice, and a negative cost") {
  const std::string twice = errorOf([] { simulate({{{Kind::Forward, 0}, {Kind::Forward, 0}}}, {}); });
  CHECK_MESSAGE(contains(twice, "stage 0 runs F0 twice"), twice);
  const std::string cost = errorOf([] { simulate(PipelineSchedule::GPipe, 2, 2, 1, -2, 0); });
  CHECK_MESSAGE(contains(cost, "backward = -2"), cost);
}

// ---- schedule files (StepSchedule) ----

TEST_CASE("a schedule file that lists a built-in schedule's orders is that schedule: same orders, same step") {
  for (PipelineSchedule schedule : kSchedules) {
    for (int stages : {1, 2, 4}) {
      for (int microbatches : {1, 3, 8}) {
        CAPTURE(scheduleName(schedule));
        CAPTURE(stages);
        CAPTURE(microbatches);
        const StepSchedule builtIn(schedule);
        const PipelineOrders orders = builtIn.orders(stages, microbatches);
        for (int s = 0; s < stages; ++s)
          CHECK(orders[static_cast<size_t>(s)] == stageSchedule(schedule, stages, microbatches, s));
        const StepSchedule listed = StepSchedule::parse("# as listed\n" + formatOrders(orders), "listed");
        CHECK(listed.orders(stages, microbatches) == orders);
        CHECK(listed.splitsWeights() == (schedule == PipelineSchedule::ZeroBubble));
        const ActionCosts costs{1, 2, 1};
        CHECK(listed.simulate(stages, microbatches, costs).makespan ==
              builtIn.simulate(stages, microbatches, costs).makespan);
      }
    }
  }
}

TEST_CASE("a schedule file's lines are stages, its tokens actions; comments and blank lines say nothing") {
  const StepSchedule schedule = StepSchedule::parse("\n  F0 F1   B0 B1 # stage 0\n# a note\n\nF0\tB0 F1 B1\n", "plan");
  const PipelineOrders orders = schedule.orders(2, 2);
  REQUIRE(orders.size() == 2);
  CHECK(formatOrders(orders) == "F0 F1 B0 B1\nF0 B0 F1 B1\n");
  CHECK(schedule.name() == "plan");
  CHECK_FALSE(schedule.builtIn());
}

TEST_CASE("a schedule file's token that is not an action is refused naming the line and the token") {
  for (const char* token : {"X1", "F", "f1", "F-1", "F1x", "B1234567", "W0,"}) {
    CAPTURE(token);
    const std::string message = errorOf([&] { StepSchedule::parse(fmt::format("F0 B0\nF0 {}\n", token), "plan"); });
    CHECK_MESSAGE(contains(message, fmt::format("plan line 2: '{}' is not an action", token)), message);
  }
  const std::string empty = errorOf([] { StepSchedule::parse("# nothing\n\n", "plan"); });
  CHECK_MESSAGE(contains(empty, "plan lists no stage's actions"), empty);
}

TEST_CASE("a schedule file for another number of stages is refused naming both") {
  const std::string message = errorOf([] { StepSchedule::parse("F0 B0\nF0 B0\n", "plan").orders(3, 1); });
  CHECK_MESSAGE(contains(message, "plan lists 2 stages' actions; the pipeline has 3 stages"), message);
}

TEST_CASE("a schedule file whose stage misses an action is refused naming the stage and the action") {
  const std::string message = errorOf([] { StepSchedule::parse("F0 F1 B0 B1\nF0 B0 F1\n", "plan").orders(2, 2); });
  CHECK_MESSAGE(contains(message, "plan: stage 1 never runs B1"), message);
}

TEST_CASE("a schedule file whose stage runs an action twice is refused naming it") {
  const std::string message = errorOf([] { StepSchedule::parse("F0 B0 B0\n", "plan").orders(1, 1); });
  CHECK_MESSAGE(contains(message, "plan: stage 0 runs B0 twice"), message);
}

TEST_CASE("a schedule file naming a micro-batch past the step's is refused naming it and the step's") {
  const std::string message = errorOf([] { StepSchedule::parse("F0 B0 F2 B2\n", "plan").orders(1, 2); });
  CHECK_MESSAGE(contains(message, "plan: stage 0 runs F2, but a step has 2 micro-batches (0 to 1)"), message);
}

TEST_CASE("a schedule file that splits some stages' backwards and not others is refused naming a stage without W") {
  const std::string message = errorOf([] { StepSchedule::parse("F0 B0 W0\nF0 B0\n", "plan").orders(2, 1); });
  CHECK_MESSAGE(contains(message, "plan: stage 1 runs no W while another stage does"), message);
}

TEST_CASE("a schedule file whose orders deadlock is refused naming each stage's stuck action") {
  // Stage 0 waits for B0 of stage 1, which runs it after F1, which stage 0 sends after B0.
  const std::string message = errorOf([] { StepSchedule::parse("F0 B0 F1 B1\nF1 F0 B0 B1\n", "plan").orders(2, 2); });
  CHECK_MESSAGE(contains(message, "plan: the pipeline orders deadlock"), message);
  CHECK_MESSAGE(contains(message, "stage 0 at B0"), message);
  CHECK_MESSAGE(contains(message, "stage 1 at F1"), message);
  // A stage's own backward before its forward can never run either.
  const std::string backwards = errorOf([] { StepSchedule::parse("B0 F0\n", "plan").orders(1, 1); });
  CHECK_MESSAGE(contains(backwards, "stage 0 at B0"), backwards);
}

TEST_CASE("a schedule file that cannot be read is refused naming the file and why") {
  TempDir dir;
  const std::string missing = errorOf([&] { StepSchedule::read((dir.path / "none.txt").string()); });
  CHECK_MESSAGE(contains(missing, "cannot read schedule file '" + (dir.path / "none.txt").string() + "'"), missing);
  std::ofstream(dir.path / "plan.txt") << "F0 B0\nF0 Q0\n";
  const std::string bad = errorOf([&] { StepSchedule::read((dir.path / "plan.txt").string()); });
  CHECK_MESSAGE(contains(bad, "schedule file " + (dir.path / "plan.txt").string() + " line 2: 'Q0'"), bad);
}

// ---- virtual stages: interleaved 1F1B and ZB-V ----

namespace {

/// Runs `check(stages, virtualStages, microbatches)` for every count interleaved 1F1B takes
/// (micro-batches a multiple of the stages) up to S = 8, V = 4, M = 16.
template <class F>
void forEveryInterleavedCount(F&& check) {
  for (int stages : {1, 2, 3, 4, 8}) {
    for (int virtualStages : {2, 3, 4}) {
      for (int microbatches = stages; microbatches <= 16; microbatches += stages) {
        CAPTURE(stages);
        CAPTURE(virtualStages);
        CAPTURE(microbatches);
        check(stages, virtualStages, microbatches);
      }
    }
  }
}

/// Each model stage's (kind, micro-batch) actions in `orders`, checking each appears once.
std::map<int, std::map<std::pair<Kind, int>, size_t>> actionsByStage(const PipelineOrders& orders) {
  std::map<int, std::map<std::pair<Kind, int>, size_t>> byStage;
  for (const auto& order : orders) {
    for (size_t k = 0; k < order.size(); ++k) {
      const bool fresh = byStage[order[k].stage].emplace(std::pair{order[k].kind, order[k].microbatch}, k).second;
      CHECK_MESSAGE(fresh, describe(order[k]), " appears twice");
    }
  }
  return byStage;
}

}  // namespace

TEST_CASE("describe and a schedule file write an action's model stage before it") {
  CHECK(describe({Kind::Forward, 3, 5}) == "5F3");
  CHECK(describe({Kind::Weights, 0, 12}) == "12W0");
  const PipelineOrders orders = StepSchedule::parse("0F0 3F0 3B0 0B0\n1F0 2F0 2B0 1B0\n", "v").orders(2, 1);
  CHECK(orders[0] == std::vector<PipelineAction>{{Kind::Forward, 0, 0}, {Kind::Forward, 0, 3},
                                                 {Kind::Backward, 0, 3}, {Kind::Backward, 0, 0}});
  CHECK(formatOrders(orders) == "0F0 3F0 3B0 0B0\n1F0 2F0 2B0 1B0\n");
}

TEST_CASE("interleaved: process s holds stages s, s + S, ...; every stage runs each F and B once, F before B") {
  forEveryInterleavedCount([](int stages, int virtualStages, int microbatches) {
    const PipelineOrders orders =
        StepSchedule(PipelineSchedule::Interleaved, virtualStages).orders(stages, microbatches);
    std::vector<int> expected;
    for (int c = 0; c < stages * virtualStages; ++c) expected.push_back(c % stages);
    CHECK(processOfStage(orders) == expected);
    const auto byStage = actionsByStage(orders);
    REQUIRE(byStage.size() == static_cast<size_t>(stages * virtualStages));
    for (const auto& [stage, at] : byStage) {
      CAPTURE(stage);
      CHECK(at.size() == static_cast<size_t>(2 * microbatches));
      for (int i = 0; i < microbatches; ++i) CHECK(at.at({Kind::Forward, i}) < at.at({Kind::Backward, i}));
    }
  });
}

// Megatron-LM's figure: with chunk actions 1/V of a whole stage's, the bubble is (S-1)(F+B) in
// chunk units against M·V(F+B) of work: (S-1)/(V·M) of the ideal step, V times 1f1b's.
TEST_CASE("interleaved with F = 1, B = 2 per stage takes 3MV + 3(S-1): a bubble of (S-1)/(V M) of the ideal") {
  forEveryInterleavedCount([](int stages, int virtualStages, int microbatches) {
    const SimulatedStep step =
        StepSchedule(PipelineSchedule::Interleaved, virtualStages).simulate(stages, microbatches, {1, 2, 0});
    const double ideal = 3.0 * microbatches * virtualStages;
    CHECK(step.makespan == ideal + 3.0 * (stages - 1));
    CHECK((step.makespan - ideal) / ideal ==
          doctest::Approx(static_cast<double>(stages - 1) / (virtualStages * microbatches)));
  });
}

TEST_CASE("interleaved process s holds at most 2(S-s-1) + (V-1)S + 1 stage micro-batches, and stage s of 1f1b's") {
  forEveryInterleavedCount([](int stages, int virtualStages, int microbatches) {
    const SimulatedStep step =
        StepSchedule(PipelineSchedule::Interleaved, virtualStages).simulate(stages, microbatches, {1, 2, 0});
    for (int s = 0; s < stages; ++s) {
      CAPTURE(s);
      const int warmup = 2 * (stages - s - 1) + (virtualStages - 1) * stages;
      CHECK(step.peakInFlight[static_cast<size_t>(s)] == std::min(warmup + 1, microbatches * virtualStages));
    }
  });
}

TEST_CASE("interleaved names micro-batches that are not a multiple of the stages, and too few virtual stages") {
  const std::string uneven = errorOf([] { StepSchedule(PipelineSchedule::Interleaved, 2).orders(4, 6); });
  CHECK_MESSAGE(contains(uneven, "6 micro-batches do not divide among 4 stages"), uneven);
  const std::string one = errorOf([] { StepSchedule(PipelineSchedule::Interleaved, 1); });
  CHECK_MESSAGE(contains(one, "interleaved 1F1B needs 2 or more virtual stages per process, got 1"), one);
  const std::string gpipe = errorOf([] { StepSchedule(PipelineSchedule::GPipe, 2); });
  CHECK_MESSAGE(contains(gpipe, "the gpipe schedule runs one stage per process; 2 virtual stages"), gpipe);
  const std::string zbv = errorOf([] { StepSchedule(PipelineSchedule::ZeroBubbleV, 3); });
  CHECK_MESSAGE(contains(zbv, "zbv holds 2 stages per process (a V), not 3"), zbv);
}

TEST_CASE("zbv: process s holds stages s and 2S-1-s; every stage runs each F, B and W once, in order") {
  forEveryCount([](int stages, int microbatches) {
    const StepSchedule zbv(PipelineSchedule::ZeroBubbleV);
    CHECK(zbv.virtualStages() == 2);
    CHECK(zbv.splitsWeights());
    const PipelineOrders orders = zbv.orders(stages, microbatches);
    std::vector<int> expected;
    for (int c = 0; c < 2 * stages; ++c) expected.push_back(c < stages ? c : 2 * stages - 1 - c);
    CHECK(processOfStage(orders) == expected);
    for (const auto& [stage, at] : actionsByStage(orders)) {
      CAPTURE(stage);
      CHECK(at.size() == static_cast<size_t>(3 * microbatches));
      for (int i = 0; i < microbatches; ++i) {
        CHECK(at.at({Kind::Forward, i}) < at.at({Kind::Backward, i}));
        CHECK(at.at({Kind::Backward, i}) < at.at({Kind::Weights, i}));
      }
    }
  });
}

// Process S-1 cannot start before S-1 forwards reached it, so no order idles less than S-1 of
// 6M units of work per process; ZB-V reaches that once there are as many micro-batches as stages.
TEST_CASE("zbv with F = B = W takes 6M + S - 1 for M >= S: each process idles S - 1, half of zb's bubble") {
  forEveryCount([](int stages, int microbatches) {
    if (microbatches < stages) return;
    const SimulatedStep zbv = StepSchedule(PipelineSchedule::ZeroBubbleV).simulate(stages, microbatches, {1, 1, 1});
    CHECK(zbv.makespan == 6.0 * microbatches + stages - 1);
    for (double idle : zbv.idle) CHECK(idle == stages - 1);
    // In whole-stage units (each of zbv's stages half of zb's), zb idles S - 1 per stage.
    const SimulatedStep zb = simulate(PipelineSchedule::ZeroBubble, stages, microbatches, 2, 2, 2);
    if (stages > 1) CHECK(zbv.makespan < zb.makespan);
  });
}

TEST_CASE("zbv holds at most 2S half-size stage micro-batches on a process: 1f1b's stage 0") {
  forEveryCount([](int stages, int microbatches) {
    const SimulatedStep step = StepSchedule(PipelineSchedule::ZeroBubbleV).simulate(stages, microbatches, {1, 1, 1});
    for (int peak : step.peakInFlight) CHECK(peak <= 2 * std::min(stages, microbatches));
    CHECK(step.stagePeakInFlight.size() == static_cast<size_t>(2 * stages));
  });
}

TEST_CASE("a schedule file with virtual stages that lists a built-in's orders is that schedule") {
  for (const StepSchedule& builtIn :
       {StepSchedule(PipelineSchedule::Interleaved, 2), StepSchedule(PipelineSchedule::ZeroBubbleV)}) {
    CAPTURE(builtIn.name());
    const PipelineOrders orders = builtIn.orders(4, 8);
    const StepSchedule listed = StepSchedule::parse(formatOrders(orders), "listed");
    CHECK(listed.orders(4, 8) == orders);
    CHECK(listed.modelStages(4) == 8);
    CHECK(listed.virtualStages() == 2);
    CHECK(listed.splitsWeights() == builtIn.splitsWeights());
    CHECK(listed.simulate(4, 8, {1, 2, 1}).makespan == builtIn.simulate(4, 8, {1, 2, 1}).makespan);
  }
}

TEST_CASE("a schedule file that gives one stage to two processes, or skips a stage, is refused naming it") {
  const std::string shared = errorOf([] { StepSchedule::parse("0F0 1F0 1B0 0B0\n1F0 1B0\n", "plan").orders(2, 1); });
  CHECK_MESSAGE(contains(shared, "plan: stage 1 runs on process 0 (1F0) and process 1"), shared);
  const std::string gap = errorOf([] { StepSchedule::parse("0F0 0B0\n2F0 2B0\n", "plan").orders(2, 1); });
  CHECK_MESSAGE(contains(gap, "plan: no process runs stage 1"), gap);
  const std::string missing =
      errorOf([] { StepSchedule::parse("0F0 3F0 3B0 0B0\n1F0 2F0 2B0\n", "plan").orders(2, 1); });
  CHECK_MESSAGE(contains(missing, "plan: stage 1 never runs 1B0"), missing);
  const std::string deadlock =
      errorOf([] { StepSchedule::parse("0F0 3F0 0B0 3B0\n1F0 2F0 2B0 1B0\n", "plan").orders(2, 1); });
  CHECK_MESSAGE(contains(deadlock, "process 0 at 0B0"), deadlock);
}
