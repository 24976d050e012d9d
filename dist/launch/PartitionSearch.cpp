// The partition search (see the header).
#include "dist/launch/PartitionSearch.h"

#include "core/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

namespace weft::dist {

namespace {

using Row = std::array<double, 3>;

Row basis(double partitions) { return {1.0, 1.0 / partitions, partitions}; }

/// Solves the 3x3 system `a` x = `b` by Gaussian elimination with partial pivoting.
Row solve(std::array<Row, 3> a, Row b) {
  for (size_t col = 0; col < 3; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < 3; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    WEFT_CHECK(a[pivot][col] != 0, "the partition model's normal equations are singular");
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (size_t r = col + 1; r < 3; ++r) {
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c < 3; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  Row x{};
  for (size_t i = 3; i-- > 0;) {
    double s = b[i];
    for (size_t c = i + 1; c < 3; ++c) s -= a[i][c] * x[c];
    x[i] = s / a[i][i];
  }
  return x;
}

}  // namespace

PartitionModel fitPartitionModel(const std::vector<PartitionSample>& samples) {
  std::map<int, int> counts;
  for (const PartitionSample& s : samples) {
    WEFT_CHECK(s.partitions >= 1 && std::isfinite(s.seconds) && s.seconds >= 0,
               "a partition sample of {} partitions taking {} s per iteration", s.partitions, s.seconds);
    ++counts[s.partitions];
  }
  WEFT_CHECK(counts.size() >= 3,
             "fitting t(P) = theta0 + theta1 / P + theta2 * P takes samples of at least 3 partition "
             "counts, not {}",
             counts.size());
  // Each basis column is scaled to at most 1, so the normal equations stay well conditioned for
  // P in the thousands.
  Row scale{};
  for (const PartitionSample& s : samples) {
    const Row x = basis(s.partitions);
    for (size_t c = 0; c < 3; ++c) scale[c] = std::max(scale[c], std::abs(x[c]));
  }
  std::array<Row, 3> normal{};
  Row rhs{};
  for (const PartitionSample& s : samples) {
    Row x = basis(s.partitions);
    for (size_t c = 0; c < 3; ++c) x[c] /= scale[c];
    for (size_t r = 0; r < 3; ++r) {
      for (size_t c = 0; c < 3; ++c) normal[r][c] += x[r] * x[c];
      rhs[r] += x[r] * s.seconds;
    }
  }
  const Row theta = solve(normal, rhs);
  return {theta[0] / scale[0], theta[1] / scale[1], theta[2] / scale[2]};
}

PartitionSearch::PartitionSearch(int machines, int most) : start_(std::max(machines, 1)), most_(std::max(most, 1)) {
  start_ = std::min(start_, most_);
  next_ = start_;
}

std::optional<PartitionSample> PartitionSearch::measured(int partitions) const {
  for (const PartitionSample& s : samples_)
    if (s.partitions == partitions) return s;
  return std::nullopt;
}

void PartitionSearch::record(double seconds, int effective) {
  WEFT_CHECK(next_.has_value(), "a partition sample recorded after the search ended");
  const int requested = *next_;
  const int used = std::clamp(effective, 1, requested);
  // The sample it is compared with: the previous one in this direction, or the start's.
  const std::optional<PartitionSample> previous = measured(direction_ == Direction::Up ? requested / 2 : requested * 2);
  samples_.push_back({used, seconds});
  const bool faster = requested == start_ || (previous && seconds < previous->seconds);
  if (direction_ == Direction::Up) {
    if (faster && used == requested && requested * 2 <= most_) {
      next_ = requested * 2;
      return;
    }
    direction_ = Direction::Down;
    next_ = start_ / 2;
    if (*next_ < 1) next_.reset();
    return;
  }
  next_ = requested / 2;
  if (!faster || *next_ < 1) next_.reset();
}

PartitionSearch::Choice PartitionSearch::choose() const {
  WEFT_CHECK(!samples_.empty(), "no partition count was sampled");
  const PartitionSample fastest = *std::min_element(samples_.begin(), samples_.end(),
                                                    [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
  std::map<int, bool> distinct;
  for (const PartitionSample& s : samples_) distinct[s.partitions] = true;
  Choice choice;
  if (distinct.size() < 3) {
    choice.partitions = fastest.partitions;
    choice.reason = fmt::format("{} partition count{} sampled, too few to fit the model: the fastest, {} partition{} "
                                "at {:.2f} ms per step",
                                distinct.size(), distinct.size() == 1 ? "" : "s", fastest.partitions,
                                fastest.partitions == 1 ? "" : "s", fastest.seconds * 1e3);
    return choice;
  }
  const PartitionModel model = fitPartitionModel(samples_);
  const int lowest = distinct.begin()->first, highest = distinct.rbegin()->first;
  int best = lowest;
  for (int p = lowest + 1; p <= highest; ++p)
    if (model.predict(p) < model.predict(best)) best = p;
  choice.partitions = best;
  choice.model = model;
  choice.reason = fmt::format(
      "t(P) = {:.4g} + {:.4g} / P + {:.4g} P seconds fits the samples; its minimum over P in "
      "[{}, {}] is at {} partition{} ({:.2f} ms predicted; the fastest sample: {} partition{} at "
      "{:.2f} ms)",
      model.theta0, model.theta1, model.theta2, lowest, highest, best, best == 1 ? "" : "s", model.predict(best) * 1e3,
      fastest.partitions, fastest.partitions == 1 ? "" : "s", fastest.seconds * 1e3);
  return choice;
}

}  // namespace weft::dist
