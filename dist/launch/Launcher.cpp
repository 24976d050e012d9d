// The job launcher (see the header).
#include "dist/launch/Launcher.h"

#include "core/Error.h"
#include "dist/transport/Auth.h"
#include "dist/Config.h"
#include "dist/launch/Coordinator.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>
#include <utility>

namespace weft::dist {

namespace {

std::atomic<int> stopSignal{0};
std::atomic<bool> suspendRequested{false};
void onStopSignal(int signal) { stopSignal = signal; }
void onSuspend(int) { suspendRequested = true; }

/// Installs the SIGINT/SIGTERM and SIGTSTP handlers for the launcher's lifetime (without
/// SA_RESTART, so a blocked waitpid returns) and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &oldInt_);
    sigaction(SIGTERM, &action, &oldTerm_);
    action.sa_handler = onSuspend;
    sigaction(SIGTSTP, &action, &oldTstp_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
    sigaction(SIGTSTP, &oldTstp_, nullptr);
  }

 private:
  struct sigaction oldInt_ {}, oldTerm_ {}, oldTstp_ {};
};

bool isLocal(const std::string& address) { return address.rfind("127.", 0) == 0 || address == "localhost"; }

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out.append("'\\''");
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  return out;
}

struct Child {
  MemberId id;
  pid_t pid = -1;  // also its process group
  bool remote = false;  // pid is the ssh that runs it on its host
  bool running = true;
};

/// How long a failure waits for a remote member's ssh to report that member's death, which its
/// peers, failing on it at once, may be reaped before.
constexpr std::chrono::milliseconds kRemoteDeathReport{2000};

/// `program` as execvp would find it: itself when it names a path, else the first executable
/// file of that name in a directory of PATH.
std::string resolveProgram(const std::string& program, const MemberId& id) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string directories = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  for (;;) {
    const size_t end = std::min(directories.find(':', begin), directories.size());
    const std::string directory = end == begin ? "." : directories.substr(begin, end - begin);
    const std::string candidate = directory + "/" + program;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == directories.size()) break;
    begin = end + 1;
  }
  WEFT_THROW("weft launch: cannot run {} for {}: no executable of that name on PATH ({})", program, describe(id),
             directories);
}

/// What a member's process execs, made whole before the fork: the launcher has threads (the
/// coordinator's among them), and one of them may hold a lock of the allocator at the fork, so
/// the child calls nothing but async-signal-safe functions until exec.
struct ChildImage {
  std::string program;
  std::vector<std::string> argv, environment;
  std::vector<char*> argvPointers, environmentPointers;
  std::string execFailure;  // written, with the error, when exec fails

  void pointAtStrings() {
    for (std::string& a : argv) argvPointers.push_back(a.data());
    argvPointers.push_back(nullptr);
    for (std::string& e : environment) environmentPointers.push_back(e.data());
    environmentPointers.push_back(nullptr);
  }
};

/// This process's environment, `overrides` replacing or adding variables and `removed` left out.
std::vector<std::string> childEnvironment(const std::map<std::string, std::string>& overrides,
                                          const std::vector<std::string>& removed) {
  std::vector<std::string> out;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    const std::string name(variable.substr(0, variable.find('=')));
    if (!overrides.contains(name) && std::find(removed.begin(), removed.end(), name) == removed.end())
      out.emplace_back(variable);
  }
  for (const auto& [name, value] : overrides) out.push_back(name + "=" + value);
  return out;
}

/// Locally (through the host's launch prefix, if any) the member gets its identity in the
/// environment and inherits the secret's memory file; over ssh the remote shell reads the secret
/// from its standard input.
ChildImage childImage(const HostSpec& host, const MemberId& id, const std::vector<std::string>& command,
                      std::map<std::string, std::string> environment, const SecretMemory& secretMemory, bool local) {
  ChildImage image;
  if (local) {
    image.argv = host.launchPrefix;
    image.argv.insert(image.argv.end(), command.begin(), command.end());
    environment["WEFT_JOB_SECRET_FD"] = std::to_string(secretMemory.fd());
    image.environment = childEnvironment(environment, {"WEFT_JOB_SECRET_FILE"});
  } else {
    std::string remote = fmt::format("cd {} && read -r WEFT_JOB_SECRET && export WEFT_JOB_SECRET && exec env",
                                     shellQuote(std::filesystem::current_path().string()));
    for (const auto& [k, v] : environment) remote += fmt::format(" {}={}", k, shellQuote(v));
    for (const std::string& a : command) remote += fmt::format(" {}", shellQuote(a));
    image.argv = sshCommand(host.address, remote);
    image.environment = childEnvironment({}, {});
  }
  image.program = resolveProgram(image.argv.front(), id);
  image.execFailure = fmt::format("weft launch: cannot run {} for {}: ", image.program, describe(id));
  image.pointAtStrings();
  return image;
}

/// Starts one member of the job in a process group of its own, with the parent-death signal.
pid_t start(const HostSpec& host, const MemberId& id, const std::vector<std::string>& command,
            const std::map<std::string, std::string>& environment, const SecretMemory& secretMemory,
            const Secret& secret) {
  const bool local = isLocal(host.address) || !host.launchPrefix.empty();
  ChildImage image = childImage(host, id, command, environment, secretMemory, local);
  int secretPipe[2] = {-1, -1};
  if (!local) WEFT_CHECK(::pipe(secretPipe) == 0, "pipe: {}", std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  WEFT_CHECK(pid >= 0, "fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(1);  // the launcher died before the line above
    if (local) {
      ::fcntl(secretMemory.fd(), F_SETFD, 0);  // inherited through exec, by this child alone
    } else {
      ::dup2(secretPipe[0], STDIN_FILENO);
      ::close(secretPipe[0]);
      ::close(secretPipe[1]);
    }
    ::execve(image.program.c_str(), image.argvPointers.data(), image.environmentPointers.data());
    const char* error = ::strerrordesc_np(errno);  // a constant string: no locale, no allocation
    if (error == nullptr) error = "unknown error";
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, image.execFailure.data(), image.execFailure.size());
    written = ::write(STDERR_FILENO, error, std::strlen(error));
    written = ::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any signal
  if (!local) {
    ::close(secretPipe[0]);
    const std::string line = toHex(secret) + "\n";
    [[maybe_unused]] const ssize_t written = ::write(secretPipe[1], line.data(), line.size());
    ::close(secretPipe[1]);
  }
  return pid;
}

// What a process that met an instruction its CPU lacks was told; a remote one's shell reports it
// as status 128 + SIGILL.
constexpr char kBuiltForAnotherCpu[] =
    ": this weft was built for a CPU with instructions this host lacks (the build machine's, by default); build "
    "one binary for every host with WEFT_MARCH=x86-64-v3 (AVX2) or the oldest host's -march, see README";

std::string howItEnded(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGILL)
    return fmt::format("exited with status {} (illegal instruction){}", WEXITSTATUS(status), kBuiltForAnotherCpu);
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGILL)
    return fmt::format("was killed by signal {} ({}){}", SIGILL, strsignal(SIGILL), kBuiltForAnotherCpu);
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

/// How one start of the job ended.
enum class Outcome { Succeeded, MemberFailed, Stopped };

class Job {
 public:
  explicit Job(std::chrono::milliseconds grace) : grace_(grace) {}
  ~Job() { stopAll(); }  // never leave a process behind, whatever happened

  void add(Child child) { children_.push_back(child); }

  /// Waits for the job to end. Stops the job when a process fails, on a stop signal, or when a
  /// running process has been silent past `silenceLimit` while the others were heard.
  Outcome supervise(const Coordinator& coordinator, std::chrono::milliseconds silenceLimit) {
    while (anyWorkerRunning()) {
      if (stopSignal != 0) {
        std::cerr << fmt::format("weft launch: got signal {}; stopping the job\n", stopSignal.load());
        stopAll();
        return Outcome::Stopped;
      }
      if (suspendRequested.exchange(false)) suspend();
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno != EINTR) break;
      if (pid > 0) {
        Child* child = find(pid);
        if (child == nullptr) continue;
        child->running = false;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          std::cerr << fmt::format("weft launch: {}; stopping the job\n",
                                   verdict(coordinator, *child, status, silenceLimit));
          stopAll();
          return Outcome::MemberFailed;
        }
        continue;
      }
      if (const std::string silent = silentMember(coordinator, silenceLimit); !silent.empty()) {
        std::cerr << fmt::format("weft launch: {}; stopping the job\n", silent);
        stopAll();
        return Outcome::MemberFailed;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Every worker succeeded: the servers leave once they have every worker's goodbye.
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    while (anyRunning() && std::chrono::steady_clock::now() < deadline) {
      reapExited();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int failures = 0;
    for (const Child& c : children_) {
      if (c.running) {
        std::cerr << fmt::format("weft launch: {} (pid {}) did not leave after the workers finished\n",
                                 describe(c.id), c.pid);
        ++failures;
      }
    }
    stopAll();
    return failures == 0 ? Outcome::Succeeded : Outcome::MemberFailed;
  }

 private:
  Child* find(pid_t pid) {
    for (Child& c : children_)
      if (c.pid == pid) return &c;
    return nullptr;
  }
  /// Ctrl-Z: stops every member, then the launcher itself; once continued, continues them.
  void suspend() {
    for (const Child& c : children_)
      if (c.running) ::kill(-c.pid, SIGSTOP);
    ::raise(SIGSTOP);
    for (const Child& c : children_)
      if (c.running) ::kill(-c.pid, SIGCONT);
  }
  /// "worker 1 of host 0 (pid N) sent no heartbeat for 20.4 s ..." for the running process silent
  /// longest past the limit while another beat steadily all that time, or "". Silence is on the
  /// coordinator's awake clock, so a launcher that was paused or starved blames no one; members
  /// silent together (a job or machine paused as a whole, then resumed) blame no one either, nor
  /// does a member that left (it beats no more: worker 0's last evaluation comes after).
  std::string silentMember(const Coordinator& coordinator, std::chrono::milliseconds limit) const {
    const auto liveness = coordinator.liveness();
    const Child* worst = nullptr;
    std::chrono::milliseconds longest{0};
    for (const Child& c : children_) {
      const auto it = liveness.find(c.id);
      if (!c.running || it == liveness.end() || it->second.left || it->second.silence <= limit ||
          it->second.silence <= longest)
        continue;
      worst = &c;
      longest = it->second.silence;
    }
    if (worst == nullptr) return "";
    const Child* witness = nullptr;
    for (const Child& c : children_) {
      const auto it = liveness.find(c.id);
      if (c.running && &c != worst && it != liveness.end() && it->second.steady >= limit) witness = &c;
    }
    if (witness == nullptr) return "";
    return fmt::format("{} (pid {}) sent no heartbeat for {:.1f} s while {} beat steadily: it is stopped, hung in "
                       "the kernel or cut off from the network",
                       describe(worst->id), worst->pid, static_cast<double>(longest.count()) / 1000.0,
                       describe(witness->id));
  }
  /// What to say about a failure first seen as `failed` ending with `status`. A process ended
  /// by a signal is a fact and named first: its peers stop with an error as soon as they
  /// notice it die, so one already ended by a signal (reaped here with every other that has
  /// ended) is the cause. A process that exited with an error may have given up waiting on a
  /// peer, or stopped because one that gave up left (a server whose worker left first is often
  /// reaped first): when a member waited through a stall of `limit` or more meanwhile, the
  /// member whose main thread made no progress all that while, computing or stopped, is named.
  std::string verdict(const Coordinator& coordinator, const Child& failed, int status,
                      std::chrono::milliseconds limit) {
    std::pair<const Child*, int> cause{&failed, status};
    const bool anyRemote = std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.remote; });
    const auto deadline =
        std::chrono::steady_clock::now() + (anyRemote ? kRemoteDeathReport : std::chrono::milliseconds(0));
    for (;;) {
      int other = 0;
      for (pid_t pid; (pid = ::waitpid(-1, &other, WNOHANG)) > 0;) {
        Child* child = find(pid);
        if (child == nullptr) continue;
        child->running = false;
        if (killed(*child, other) && !killed(*cause.first, cause.second)) cause = {child, other};
      }
      if (killed(*cause.first, cause.second) || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::string ended = fmt::format("{} (pid {}) {}", describe(cause.first->id), cause.first->pid,
                                          howItEnded(cause.second));
    if (killed(*cause.first, cause.second)) return ended;
    const auto liveness = coordinator.liveness();
    const Child* stuck = stuckMember(liveness, *cause.first, limit);
    if (stuck == nullptr) return ended;
    const Child* waiter = memberThatGaveUp(liveness, *cause.first, *stuck, limit);
    if (waiter == nullptr) return ended;
    const MemberLiveness& l = liveness.at(stuck->id);
    return fmt::format("{} (pid {}) made no progress for {:.1f} s, its main thread {}, while {} waited for it and "
                       "gave up ({})",
                       describe(stuck->id), stuck->pid, static_cast<double>(l.stalled.count()) / 1000.0,
                       stopped(l) ? "stopped" : "computing", describe(waiter->id),
                       waiter == cause.first ? howItEnded(cause.second) : "first to end: " + ended);
  }
  /// Whether a member ended by a signal: locally, or on its host, where the remote shell reports
  /// it as status 128 + N and ssh, when sshd reports the signal, as 255.
  static bool killed(const Child& c, int status) {
    return WIFSIGNALED(status) || (c.remote && WIFEXITED(status) && WEXITSTATUS(status) > 128);
  }
  static bool stopped(const MemberLiveness& l) { return l.mainThread == 'T' || l.mainThread == 't'; }
  /// The running member other than `cause` stalled longest, `limit` or more, while stopped or
  /// without having waited on a peer (computing): the one its peers waited on.
  const Child* stuckMember(const std::map<MemberId, MemberLiveness>& liveness, const Child& cause,
                           std::chrono::milliseconds limit) const {
    const Child* stuck = nullptr;
    for (const Child& c : children_) {
      const auto it = liveness.find(c.id);
      if (!c.running || it == liveness.end() || &c == &cause) continue;
      const MemberLiveness& l = it->second;
      if (l.connected && !l.left && l.stalled >= limit && (stopped(l) || !l.waitedWhileStalled) &&
          (stuck == nullptr || l.stalled > liveness.at(stuck->id).stalled))
        stuck = &c;
    }
    return stuck;
  }
  /// `cause` when it waited through a stall of `limit` or more, else the member (running or not)
  /// other than `stuck` that did so longest, or none.
  const Child* memberThatGaveUp(const std::map<MemberId, MemberLiveness>& liveness, const Child& cause,
                                const Child& stuck, std::chrono::milliseconds limit) const {
    auto waited = [&](const Child& c) {
      const auto it = liveness.find(c.id);
      return it != liveness.end() && it->second.waitedWhileStalled && !stopped(it->second) &&
             it->second.stalled >= limit;
    };
    if (waited(cause)) return &cause;
    const Child* waiter = nullptr;
    for (const Child& c : children_)
      if (&c != &stuck && waited(c) &&
          (waiter == nullptr || liveness.at(c.id).stalled > liveness.at(waiter->id).stalled))
        waiter = &c;
    return waiter;
  }
  bool anyRunning() const {
    for (const Child& c : children_)
      if (c.running) return true;
    return false;
  }
  bool anyWorkerRunning() const {
    for (const Child& c : children_)
      if (c.running && c.id.role == Role::Worker) return true;
    return false;
  }
  void reapExited() {
    for (Child& c : children_) {
      int status = 0;
      if (c.running && ::waitpid(c.pid, &status, WNOHANG) == c.pid) c.running = false;
    }
  }
  /// SIGTERM to every running member's process group, SIGKILL to those still there after the
  /// grace period; then SIGKILL to every group, for what a launch prefix left behind.
  void stopAll() {
    for (const Child& c : children_)
      if (c.running) {
        ::kill(-c.pid, SIGTERM);
        ::kill(-c.pid, SIGCONT);  // a stopped member cannot act on SIGTERM
      }
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    while (anyRunning() && std::chrono::steady_clock::now() < deadline) {
      reapExited();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (Child& c : children_) {
      ::kill(-c.pid, SIGKILL);
      if (!c.running) continue;
      ::waitpid(c.pid, nullptr, 0);
      c.running = false;
    }
  }

  std::chrono::milliseconds grace_;
  std::vector<Child> children_;
};

/// One start of the job: a new id, secret and coordinator, every member.
Outcome runOnce(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options) {
  const Secret secret = generateSecret();
  const JobId job = generateJobId();
  const SecretMemory secretMemory(secret);
  const std::vector<MemberId> members = expectedMembers(spec);
  Coordinator coordinator(spec, secret, job, members, options.rendezvousTimeout);
  const std::string coordinatorHost = spec.bind() == "0.0.0.0" ? spec.hosts().front().address : spec.bind();
  Job running(options.grace);
  for (const MemberId& id : members) {
    std::map<std::string, std::string> environment{
        {"WEFT_COORDINATOR", fmt::format("{}:{}", coordinatorHost, coordinator.port())},
        {"WEFT_ROLE", id.role == Role::Worker ? "worker" : "server"},
        {"WEFT_HOST", std::to_string(id.host)},
        {"WEFT_SLOT", std::to_string(id.slot)},
        {"WEFT_JOB_ID", toHex(job)},
        {kResourcesVariable, spec.toJson()},
    };
    environment.insert(options.environment.begin(), options.environment.end());  // the identity wins
    const HostSpec& host = spec.hosts()[static_cast<size_t>(id.host)];
    const bool remote = !isLocal(host.address) && host.launchPrefix.empty();
    running.add({id, start(host, id, command, environment, secretMemory, secret), remote});
  }
  return running.supervise(coordinator, options.silenceLimit);
}

}  // namespace

int launch(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options) {
  WEFT_CHECK(!command.empty(), "weft launch: no command to run");
  const StopSignals signals;
  stopSignal = 0;
  suspendRequested = false;
  std::vector<std::string> current = command;
  LaunchOptions attempt = options;
  for (int restart = 1;; ++restart) {
    attempt.environment[kRestartCountVariable] = std::to_string(restart - 1);
    const Outcome outcome = runOnce(spec, current, attempt);
    if (outcome != Outcome::MemberFailed || restart > options.maxRestarts || stopSignal != 0)
      return outcome == Outcome::Succeeded ? 0 : 1;
    if (options.restartCommand) current = options.restartCommand(restart);
    std::cerr << fmt::format("weft launch: restarting the job ({} of {} restarts)\n", restart, options.maxRestarts);
  }
}

}  // namespace weft::dist
