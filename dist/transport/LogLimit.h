// Log lines about what outsiders cause (refused connections, dropped messages), rate-limited:
// a flood must not turn into a flood of formatted lines on stderr, which costs the process as
// much time as the flood itself and buries every other message. At most `burst` lines are
// written per `interval`; the rest are counted, the next line written says how many were left
// out, and so does the last word when the limiter is destroyed.
//
//     LogLimit refusals("weft coordinator: ", "refused connections", 10, std::chrono::seconds(1));
//     refusals.write([&] { return fmt::format("refused connection from {}: {}", peer, why); });
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace weft::dist {

class LogLimit {
 public:
  /// `what` names the suppressed lines in the counts ("refused connections").
  LogLimit(std::string prefix, std::string what, int burst, std::chrono::milliseconds interval);
  /// Writes the count of lines left out since the last one written, if any.
  ~LogLimit();
  LogLimit(const LogLimit&) = delete;
  LogLimit& operator=(const LogLimit&) = delete;

  /// Writes prefix + line() + "\n" to stderr in one write, or counts it without calling line():
  /// a suppressed line costs no formatting. Thread-safe.
  template <class MakeLine>
  void write(MakeLine&& line) {
    if (admit()) emit(line());
  }
  /// The lines counted but not written so far (all of them, not only since the last written).
  uint64_t suppressed() const;

 private:
  bool admit();
  void emit(const std::string& line);

  const std::string prefix_, what_;
  const int burst_;
  const std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point windowStart_{};
  int writtenInWindow_ = 0;
  uint64_t unreported_ = 0;  // suppressed since the last line written
  uint64_t suppressed_ = 0;
};

}  // namespace weft::dist
