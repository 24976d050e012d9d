// The staleness gate and the DSSP controller (see the header).
#include "dist/server/Staleness.h"

#include "core/Error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace weft::dist {

int dsspExtraIterations(const PushTimes& fastest, const PushTimes& slowest, int rMax) {
  if (rMax <= 0 || !fastest.intervalKnown() || !slowest.intervalKnown()) return 0;
  int best = 0;
  double bestDistance = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= rMax; ++r) {
    const double fast = fastest.latest + r * fastest.interval();
    for (int k = 0; k <= rMax; ++k) {
      // The slowest's next push comes one interval after its latest.
      const double slow = slowest.latest + (k + 1) * slowest.interval();
      const double distance = std::abs(slow - fast);
      if (distance < bestDistance) {
        bestDistance = distance;
        best = r;
      }
    }
  }
  return best;
}

StalenessGate::StalenessGate(int senders, int lower, int upper)
    : lower_(lower), upper_(upper), clocks_(static_cast<size_t>(senders), 0), times_(static_cast<size_t>(senders)),
      allowance_(static_cast<size_t>(senders), 0), granted_(static_cast<size_t>(senders), true),
      left_(static_cast<size_t>(senders), false) {
  WEFT_CHECK(senders >= 1 && lower >= 0 && upper >= lower,
             "a staleness gate of {} senders with bounds [{}, {}]: the bounds must satisfy 0 <= lower <= upper",
             senders, lower, upper);
}

uint64_t StalenessGate::slowestClock() const { return clocks_[static_cast<size_t>(slowestSender())]; }

int StalenessGate::slowestSender() const {
  int slowest = -1;
  for (size_t s = 0; s < clocks_.size(); ++s) {
    if (left_[s]) continue;
    const bool behind = slowest < 0 || clocks_[s] < clocks_[static_cast<size_t>(slowest)] ||
                        (clocks_[s] == clocks_[static_cast<size_t>(slowest)] &&
                         times_[s].latest < times_[static_cast<size_t>(slowest)].latest);
    if (behind) slowest = static_cast<int>(s);
  }
  return slowest;
}

bool StalenessGate::isFastest(int sender) const {
  for (size_t s = 0; s < clocks_.size(); ++s)
    if (!left_[s] && clocks_[s] > clocks_[static_cast<size_t>(sender)]) return false;
  return true;
}

int64_t StalenessGate::gap(int sender) const {
  if (slowestSender() < 0) return 0;  // every sender has left
  return static_cast<int64_t>(clocks_.at(static_cast<size_t>(sender))) - static_cast<int64_t>(slowestClock());
}

void StalenessGate::applied(int sender, double pushTime) {
  const auto s = static_cast<size_t>(sender);
  ++clocks_.at(s);
  times_[s] = {pushTime, times_[s].latest, times_[s].pushes + 1};
  const int64_t ahead = gap(sender);
  if (ahead <= lower_) {
    granted_[s] = true;
  } else if (allowance_[s] > 0 && ahead <= upper_) {
    --allowance_[s];
    granted_[s] = true;
  } else if (allowance_[s] == 0 && ahead == lower_ + 1 && isFastest(sender)) {
    // The first iteration beyond s_L: the controller decides how many more to run (this one
    // included) before waiting for the slowest.
    const int extra = dsspExtraIterations(times_[s], times_[static_cast<size_t>(slowestSender())], upper_ - lower_);
    granted_[s] = extra > 0;
    allowance_[s] = std::max(extra - 1, 0);
  } else {
    granted_[s] = false;
    allowance_[s] = 0;
  }
}

void StalenessGate::leave(int sender) { left_.at(static_cast<size_t>(sender)) = true; }

bool StalenessGate::mayProceed(int sender) const {
  // The gap only shrinks while the sender waits (the slowest moves on), so one granted at most
  // `upper` ahead stays within it.
  return granted_.at(static_cast<size_t>(sender)) || gap(sender) <= lower_;
}

}  // namespace weft::dist
