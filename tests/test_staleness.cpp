// The staleness gate of SSP and DSSP and the DSSP controller (Algorithm 2 of the DSSP paper),
// against cases worked out by hand, and the bound under random interleavings of senders.
#include "tests/TestUtil.h"

#include "dist/server/Staleness.h"
#include "dist/server/SyncPolicy.h"

#include <algorithm>
#include <random>
#include <vector>

using namespace weft;
using namespace weft::dist;

namespace {

PushTimes times(double previous, double latest) { return {latest, previous, 2}; }

}  // namespace

TEST_CASE("DSSP controller: the extra iterations that meet the slowest's next push") {
  // Fastest every 1 s (next at 10, 11, 12, 13, 14), slowest every 3 s (next at 13, 16, ...):
  // after 3 more iterations the fastest arrives when the slowest does.
  CHECK(dsspExtraIterations(times(9, 10), times(7, 10), 4) == 3);
  // Every 2 s against every 5 s: 14 and 16 are both 1 s from the slowest's 15; the smaller wins.
  CHECK(dsspExtraIterations(times(8, 10), times(5, 10), 4) == 2);
  CHECK(dsspExtraIterations(times(8, 10), times(5, 10), 1) == 1);
  // Equally fast, half an interval apart: waiting now (0.5 s) is as good as any later point.
  CHECK(dsspExtraIterations(times(9, 10), times(8.5, 9.5), 4) == 0);
}

TEST_CASE("DSSP controller: no extra iterations without a range or before an interval is known") {
  CHECK(dsspExtraIterations(times(9, 10), times(7, 10), 0) == 0);
  CHECK(dsspExtraIterations({10, 0, 1}, times(7, 10), 4) == 0);
  CHECK(dsspExtraIterations(times(9, 10), {10, 0, 1}, 4) == 0);
}

TEST_CASE("SSP gate: a sender goes on while at most s clocks ahead of the slowest") {
  StalenessGate gate(2, 1, 1);
  gate.applied(0, 0.0);
  CHECK(gate.gap(0) == 1);
  CHECK(gate.mayProceed(0));
  gate.applied(0, 1.0);
  CHECK(gate.gap(0) == 2);
  CHECK_FALSE(gate.mayProceed(0));
  CHECK(gate.mayProceed(1));  // the slowest never waits
  gate.applied(1, 1.5);
  CHECK(gate.mayProceed(0));
}

TEST_CASE("SSP gate: a sender that left holds no one back") {
  StalenessGate gate(3, 0, 0);
  gate.applied(0, 0.0);
  gate.applied(1, 0.0);
  CHECK_FALSE(gate.mayProceed(0));
  gate.leave(2);
  CHECK(gate.mayProceed(0));
}

TEST_CASE("DSSP gate: the fastest runs the controller's extra iterations beyond s_L, then waits for s_L") {
  StalenessGate gate(2, 1, 3);
  gate.applied(1, 0.0);  // the slowest: every 3 s
  gate.applied(0, 0.0);
  gate.applied(1, 3.0);
  gate.applied(0, 3.0);  // the fastest: every 1 s from here
  gate.applied(0, 4.0);
  CHECK(gate.gap(0) == 1);
  CHECK(gate.mayProceed(0));
  // Beyond s_L: the fastest's next pushes at 5, 6, 7; the slowest's at 6, 9, 12: one extra.
  gate.applied(0, 5.0);
  CHECK(gate.gap(0) == 2);
  CHECK(gate.mayProceed(0));
  CHECK(gate.allowance(0) == 0);
  gate.applied(0, 6.0);
  CHECK(gate.gap(0) == 3);
  CHECK_FALSE(gate.mayProceed(0));
  gate.applied(1, 6.0);
  CHECK_FALSE(gate.mayProceed(0));  // 2 ahead: waits until back within s_L
  gate.applied(1, 9.0);
  CHECK(gate.mayProceed(0));
}

TEST_CASE("DSSP gate: a grant of r extra iterations lets the fastest run exactly r beyond s_L") {
  StalenessGate gate(2, 0, 4);
  gate.applied(1, 0.0);
  gate.applied(0, 0.0);
  gate.applied(1, 7.0);  // the slowest: every 7 s, next at 14, 21, ...
  gate.applied(0, 7.0);
  // The fastest, every 1 s: beyond s_L = 0 at 8; 8 + r comes closest to 14 at r = 4, the most allowed.
  int proceeded = 0;
  for (double t = 8.0; t < 14.0; t += 1.0) {
    gate.applied(0, t);
    if (!gate.mayProceed(0)) break;
    ++proceeded;
    CHECK(gate.gap(0) <= 4);
  }
  CHECK(proceeded == 4);
}

TEST_CASE("under random speeds no sender ever goes on beyond the bound, and the slowest always may") {
  for (const auto& [lower, upper] : std::vector<std::pair<int, int>>{{0, 0}, {2, 2}, {1, 5}, {3, 15}}) {
    CAPTURE(lower);
    CAPTURE(upper);
    std::mt19937_64 random(static_cast<uint64_t>(lower * 100 + upper));
    constexpr int kSenders = 4;
    StalenessGate gate(kSenders, lower, upper);
    std::vector<double> interval(kSenders), next(kSenders, 0.0);
    std::vector<bool> waiting(kSenders, false);
    for (int s = 0; s < kSenders; ++s)
      interval[static_cast<size_t>(s)] = std::uniform_real_distribution<double>(0.5, 4.0)(random);
    for (int event = 0; event < 4000; ++event) {
      // The sender whose step ends first applies its update.
      int s = -1;
      for (int c = 0; c < kSenders; ++c)
        if (!waiting[static_cast<size_t>(c)] && (s < 0 || next[static_cast<size_t>(c)] < next[static_cast<size_t>(s)]))
          s = c;
      REQUIRE_MESSAGE(s >= 0, "every sender waits: the gate deadlocked");
      const double now = next[static_cast<size_t>(s)];
      gate.applied(s, now);
      waiting[static_cast<size_t>(s)] = true;
      for (int c = 0; c < kSenders; ++c) {
        if (!waiting[static_cast<size_t>(c)] || !gate.mayProceed(c)) continue;
        CHECK(gate.gap(c) <= upper);
        waiting[static_cast<size_t>(c)] = false;
        // Jitter of +-20% per step, as a busy machine gives.
        next[static_cast<size_t>(c)] =
            now + interval[static_cast<size_t>(c)] * std::uniform_real_distribution<double>(0.8, 1.2)(random);
      }
    }
  }
}

TEST_CASE("--sync values parse into their policies, and bad ones are refused naming the value") {
  CHECK(parseSyncPolicy("bsp")->synchronous());
  CHECK(parseSyncPolicy("asp")->stalenessBound() == -1);
  CHECK(parseSyncPolicy("ssp:3")->name() == "SSP(s=3)");
  CHECK(parseSyncPolicy("ssp:3")->stalenessBound() == 3);
  CHECK(parseSyncPolicy("dssp:3:15")->name() == "DSSP(s_L=3, s_U=15)");
  CHECK(parseSyncPolicy("dssp:3:15")->stalenessBound() == 15);
  CHECK(parseSyncPolicy("asp")->makeGate(2) == nullptr);
  CHECK_THROWS_WITH_AS(parseSyncPolicy("ssp"), doctest::Contains("expected bsp, asp, ssp:S or dssp:SL:SU"), Error);
  CHECK_THROWS_WITH_AS(parseSyncPolicy("ssp:x"), doctest::Contains("the staleness S is 'x'"), Error);
  CHECK_THROWS_WITH_AS(parseSyncPolicy("dssp:5:2"), doctest::Contains("0 <= s_L <= s_U"), Error);
  CHECK_THROWS_WITH_AS(parseSyncPolicy("ssp:-1"), doctest::Contains("the staleness S is '-1'"), Error);
}
