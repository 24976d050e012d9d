// SIGTERM as a request to checkpoint and stop (see the header).
#include "dist/launch/Preemption.h"

#include "core/Error.h"
#include "dist/Config.h"
#include "dist/transport/Wire.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

namespace weft::dist {

namespace {

std::atomic<bool> termRequested{false};
std::atomic<bool> termHandled{true};
std::atomic<int> signalPipe{-1};  // the write end: the handler's one async-signal-safe way out

std::atomic<bool> launcherAsked{false};
std::mutex launcherReasonMutex;
std::string launcherReason;  // guarded by launcherReasonMutex

void onTerm(int) {
  if (!termHandled) {  // nobody stops at a step: the signal ends the process, as by default
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);  // delivered once this handler returns
    return;
  }
  termRequested = true;
  const char byte = 1;
  const int fd = signalPipe.load();
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
}

}  // namespace

struct Preemption::State {
  std::chrono::milliseconds grace;
  FileDescriptor readEnd, writeEnd, stopRead, stopWrite;
  struct sigaction previous {};
  std::thread watchdog;

  /// After SIGTERM, ends the process once the grace period ran out (unless destroyed first).
  void watch() {
    pollfd fds[2] = {{readEnd.get(), POLLIN, 0}, {stopRead.get(), POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    if (fds[1].revents) return;
    const int ms = static_cast<int>(grace.count());
    pollfd stop{stopRead.get(), POLLIN, 0};
    int ready;
    while ((ready = ::poll(&stop, 1, ms)) < 0 && errno == EINTR) {
    }
    if (ready > 0) return;
    std::cerr << fmt::format(
                     "weft: SIGTERM arrived {:g} s ago (--term-grace) and the job has not stopped at a "
                     "step yet: exiting without a checkpoint\n",
                     static_cast<double>(ms) / 1000.0)
              << std::flush;
    std::_Exit(1);
  }
};

Preemption::Preemption(std::chrono::milliseconds grace, bool handled) : state_(std::make_unique<State>()) {
  state_->grace = grace;
  int ends[2], stop[2];
  WEFT_CHECK(::pipe2(ends, O_CLOEXEC | O_NONBLOCK) == 0 && ::pipe2(stop, O_CLOEXEC) == 0, "pipe failed: {}",
             std::strerror(errno));
  state_->readEnd.reset(ends[0]);
  state_->writeEnd.reset(ends[1]);
  state_->stopRead.reset(stop[0]);
  state_->stopWrite.reset(stop[1]);
  termRequested = false;
  termHandled = handled;
  signalPipe = state_->writeEnd.get();
  struct sigaction action {};
  action.sa_handler = onTerm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a step's system calls go on: the loop looks at the request between steps
  ::sigaction(SIGTERM, &action, &state_->previous);
  state_->watchdog = std::thread(&State::watch, state_.get());
}

Preemption::~Preemption() {
  ::sigaction(SIGTERM, &state_->previous, nullptr);
  signalPipe = -1;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(state_->stopWrite.get(), &byte, 1);
  state_->watchdog.join();
}

bool Preemption::requested() const { return termRequested; }

void Preemption::handle() { termHandled = true; }

bool elasticJob() {
  const char* value = std::getenv(kElasticVariable);
  return value != nullptr && std::string(value) == "1";
}

void requestCheckpoint(const std::string& reason) {
  {
    std::lock_guard lock(launcherReasonMutex);
    launcherReason = reason;
  }
  launcherAsked = true;
}

bool checkpointRequested() { return launcherAsked; }

std::string checkpointReason() {
  std::lock_guard lock(launcherReasonMutex);
  return launcherReason;
}

}  // namespace weft::dist
