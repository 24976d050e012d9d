#include "dist/transport/LogLimit.h"

#include <fmt/format.h>

#include <cstdio>

namespace weft::dist {

LogLimit::LogLimit(std::string prefix, std::string what, int burst, std::chrono::milliseconds interval)
    : prefix_(std::move(prefix)), what_(std::move(what)), burst_(burst), interval_(interval) {}

LogLimit::~LogLimit() {
  if (unreported_ == 0) return;
  std::fputs(fmt::format("{}did not log {} more {}\n", prefix_, unreported_, what_).c_str(), stderr);
}

bool LogLimit::admit() {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (now - windowStart_ >= interval_) {
    windowStart_ = now;
    writtenInWindow_ = 0;
  }
  if (writtenInWindow_ < burst_) {
    ++writtenInWindow_;
    return true;
  }
  ++unreported_;
  ++suppressed_;
  return false;
}

void LogLimit::emit(const std::string& line) {
  uint64_t leftOut = 0;
  {
    std::lock_guard lock(mutex_);
    leftOut = unreported_;
    unreported_ = 0;
  }
  const std::string since =
      leftOut > 0 ? fmt::format(" ({} more {} since the last line were not logged)", leftOut, what_) : "";
  // One write per line, so lines of concurrent callers do not interleave.
  std::fputs(fmt::format("{}{}{}\n", prefix_, line, since).c_str(), stderr);
}

uint64_t LogLimit::suppressed() const {
  std::lock_guard lock(mutex_);
  return suppressed_;
}

}  // namespace weft::dist
