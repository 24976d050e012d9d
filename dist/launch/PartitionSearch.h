// Automatic search for the number of partitions P of the sparse variables on the parameter
// servers (the sparsity-aware Parallax paper, section 3.2). An iteration's time is modelled as
//
//     t(P) = θ0 + θ1 / P + θ2 · P
//
// θ0 the work P does not change, θ1 the work that partitions share out (aggregating and
// applying sparse gradients, in parallel across partitions), θ2 what each partition costs
// (requests, stitching the pulled rows together). The model is convex in P, so the search
// samples from the number of machines upwards, doubling while the measured time drops, then
// downwards from there, halving while it drops; the minimum then lies within the sampled range,
// and the P that minimises the least-squares fit there is chosen without extrapolating.
//
// This is the pure part (what to sample next, the fit, the choice), testable on synthetic
// curves; `weft train --partitions auto` runs each sample as a short stretch of the real job.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace weft::dist {

/// One sample: the mean seconds per iteration measured with `partitions` partitions.
struct PartitionSample {
  int partitions = 0;
  double seconds = 0;
};

/// t(P) = theta0 + theta1 / P + theta2 * P.
struct PartitionModel {
  double theta0 = 0, theta1 = 0, theta2 = 0;
  double predict(double partitions) const { return theta0 + theta1 / partitions + theta2 * partitions; }
};

/// The least-squares fit of the model to `samples` (mean squared error of the predictions).
/// Throws unless they hold at least three distinct partition counts.
PartitionModel fitPartitionModel(const std::vector<PartitionSample>& samples);

class PartitionSearch {
 public:
  /// Starts at `machines` (at least 1) and never samples more than `most` partitions.
  PartitionSearch(int machines, int most);

  /// The next partition count to sample, or std::nullopt when the search is done.
  std::optional<int> next() const { return next_; }
  /// Records the next sample's measured time. `effective` is the largest partition count the
  /// job really used (a variable has no more partitions than rows): once it stops growing,
  /// doubling further would only repeat the same job.
  void record(double seconds, int effective);
  /// Ends the search early (the job has no steps left to sample with).
  void stop() { next_.reset(); }

  const std::vector<PartitionSample>& samples() const { return samples_; }

  struct Choice {
    int partitions = 0;
    std::optional<PartitionModel> model;  ///< the fit, when three or more counts were sampled
    std::string reason;                   ///< one line: how the count was chosen
  };
  /// The count minimising the fitted model over the integers of the sampled range, or, with
  /// fewer than three sampled counts, the fastest sample. Throws when nothing was sampled.
  Choice choose() const;

 private:
  enum class Direction { Up, Down };
  std::optional<PartitionSample> measured(int partitions) const;

  int start_, most_;
  Direction direction_ = Direction::Up;
  std::optional<int> next_;
  std::vector<PartitionSample> samples_;
};

}  // namespace weft::dist
