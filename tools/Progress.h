// Training progress: a live status line (step, loss, throughput, ETA) on a terminal, plain
// periodic lines otherwise.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace weft::tools {

class Progress {
 public:
  /// A run of `total` steps starting at step `first` (non-zero when resuming).
  Progress(int64_t total, int64_t first);

  /// After each step: redraws the status line when the output is a terminal.
  void update(int64_t step, double loss, double items, const std::string& unit);
  /// A permanent line (every --log-every steps).
  void log(int64_t step, double loss, double items, const std::string& unit);
  /// Evaluation results.
  void report(int64_t step, const std::map<std::string, double>& metrics);
  /// Items per second since the last resetRate().
  double rate(double items) const;
  void resetRate();
  double elapsed() const;

 private:
  std::string line(int64_t step, double loss, double items, const std::string& unit) const;
  void clearStatus();

  int64_t total_, first_;
  bool terminal_;
  bool statusShown_ = false;
  std::chrono::steady_clock::time_point start_, rateStart_, lastDraw_;
};

}  // namespace weft::tools
