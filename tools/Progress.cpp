#include "tools/Progress.h"

#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

namespace weft::tools {
namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string duration(double s) {
  const auto total = static_cast<int64_t>(s);
  return total >= 3600 ? fmt::format("{}h{:02}m", total / 3600, total / 60 % 60)
                       : fmt::format("{}m{:02}s", total / 60, total % 60);
}

}  // namespace

Progress::Progress(int64_t total, int64_t first)
    : total_(total),
      first_(first),
      terminal_(::isatty(::fileno(stdout)) != 0),
      start_(std::chrono::steady_clock::now()),
      rateStart_(start_),
      lastDraw_(start_) {}

std::string Progress::line(int64_t step, double loss, double items, const std::string& unit) const {
  const auto now = std::chrono::steady_clock::now();
  const double done = static_cast<double>(step - first_);
  const double eta = done > 0 ? seconds(now - start_) / done * static_cast<double>(total_ - step) : 0;
  return fmt::format("step {:>7}/{}  loss {:.4f}  {:.0f} {}/s  elapsed {}  eta {}", step, total_, loss, rate(items),
                     unit, duration(seconds(now - start_)), duration(eta));
}

void Progress::update(int64_t step, double loss, double items, const std::string& unit) {
  if (!terminal_) return;
  const auto now = std::chrono::steady_clock::now();
  if (seconds(now - lastDraw_) < 0.25) return;
  lastDraw_ = now;
  std::fputs(("\r\033[K" + line(step, loss, items, unit)).c_str(), stdout);
  std::fflush(stdout);
  statusShown_ = true;
}

void Progress::clearStatus() {
  if (statusShown_) std::fputs("\r\033[K", stdout);
  statusShown_ = false;
}

void Progress::log(int64_t step, double loss, double items, const std::string& unit) {
  clearStatus();
  std::fputs((line(step, loss, items, unit) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void Progress::report(int64_t step, const std::map<std::string, double>& metrics) {
  clearStatus();
  std::string text = fmt::format("eval at step {}:", step);
  for (const auto& [name, value] : metrics) text += fmt::format("  {} {:.4f}", name, value);
  std::fputs((text + "\n").c_str(), stdout);
  std::fflush(stdout);
}

double Progress::rate(double items) const {
  const double s = seconds(std::chrono::steady_clock::now() - rateStart_);
  return s > 0 ? items / s : 0;
}

void Progress::resetRate() { rateStart_ = std::chrono::steady_clock::now(); }

double Progress::elapsed() const { return seconds(std::chrono::steady_clock::now() - start_); }

}  // namespace weft::tools
