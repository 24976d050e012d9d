// The job launcher (see the header).
#include "dist/launch/Launcher.h"

#include "core/Error.h"
#include "dist/Config.h"
#include "dist/launch/Coordinator.h"
#include "dist/launch/Preemption.h"
#include "dist/transport/Auth.h"
#include "dist/transport/Wire.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
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
    // An ignored SIGCHLD, inherited from whatever started the launcher, would reap the members
    // by itself and lose how they ended.
    action.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &action, &oldChld_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
    sigaction(SIGTSTP, &oldTstp_, nullptr);
    sigaction(SIGCHLD, &oldChld_, nullptr);
  }

 private:
  struct sigaction oldInt_ {
  }, oldTerm_{}, oldTstp_{}, oldChld_{};
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
  // Close-on-exec: a host probe spawned meanwhile by another thread must not inherit it.
  if (!local) WEFT_CHECK(::pipe2(secretPipe, O_CLOEXEC) == 0, "pipe: {}", std::strerror(errno));
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

/// How long a host's probe may take before it counts as no answer: an ssh connection to a host
/// that is gone can take minutes to fail by itself.
constexpr std::chrono::seconds kProbeLimit{30};

/// A command line as a shell would take it back: arguments with spaces or quotes quoted.
std::string shownCommand(const std::vector<std::string>& argv) {
  std::string shown;
  for (const std::string& a : argv) {
    const bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./:=@%+-", c) != nullptr;
    });
    shown += (shown.empty() ? "" : " ") + (plain ? a : shellQuote(a));
  }
  return shown;
}

/// Runs `argv` in a process group of its own, its standard error into `errors` (a memory file:
/// a grandchild that keeps it open, such as an ssh connection master, holds up nothing); its
/// wait status, or nullopt when it ran past kProbeLimit or `cancelled` said so (then the group
/// is killed).
std::optional<int> runProbe(std::vector<std::string> argv, int errors, const std::function<bool()>& cancelled) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, errors, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::vector<char*> pointers;
  for (std::string& a : argv) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawnp(&pid, pointers[0], &actions, &attributes, pointers.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  WEFT_CHECK(spawned == 0, "could not run: {}", std::strerror(spawned));
  const auto deadline = std::chrono::steady_clock::now() + kProbeLimit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() >= deadline || cancelled()) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

/// Whether `host` answers the way its members are started (its launch prefix runs `true`, or
/// `ssh HOST true`): "" when it does, else why not.
std::string probeHost(const HostSpec& host, const std::function<bool()>& cancelled) {
  if (isLocal(host.address) && host.launchPrefix.empty()) return "";
  std::vector<std::string> argv = host.launchPrefix;
  if (argv.empty()) {
    argv = sshCommand(host.address, "true");
  } else {
    argv.push_back("true");
  }
  const std::string shown = shownCommand(argv);
  const FileDescriptor errors(::memfd_create("weft-probe", MFD_CLOEXEC));
  WEFT_CHECK(errors.valid(), "memfd_create: {}", std::strerror(errno));
  std::optional<int> status;
  try {
    status = runProbe(argv, errors.get(), cancelled);
  } catch (const Error& e) {
    return fmt::format("`{}` {}", shown, e.what());
  }
  if (!status) return fmt::format("`{}` did not finish within {} s", shown, kProbeLimit.count());
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return "";
  std::string said(1024, '\0');
  const ssize_t n = ::pread(errors.get(), said.data(), said.size(), 0);
  said.resize(n > 0 ? static_cast<size_t>(n) : 0);
  while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
  std::replace(said.begin(), said.end(), '\n', ' ');
  return fmt::format("`{}` {}{}", shown, howItEnded(*status), said.empty() ? "" : ": " + said);
}

/// The part of the specification an elastic job runs on, and why the rest is left out.
struct Sizing {
  std::vector<int> workersPerHost;  ///< per host of the full specification
  std::vector<bool> answered;       ///< per host of the full specification
  std::vector<std::string> absent;  ///< "host 2 (10.0.0.3): why" for each host that did not answer
  int workers = 0;
  int hosts = 0;
  int idle = 0;  ///< workers of answering hosts left out: the program cannot train with them all
};

/// Whether the launcher was told to stop (SIGINT, SIGTERM): probes give up at once.
bool stopAsked() { return stopSignal != 0; }

/// Probes every host of `hosts` (together): "" for each that answers, else why not.
std::vector<std::string> probeHosts(const std::vector<const HostSpec*>& hosts, const std::function<bool()>& cancelled) {
  std::vector<std::future<std::string>> probes;
  for (const HostSpec* host : hosts)
    probes.push_back(std::async(std::launch::async, [host, &cancelled] { return probeHost(*host, cancelled); }));
  std::vector<std::string> out;
  for (std::future<std::string>& p : probes) out.push_back(p.get());
  return out;
}

/// Sizes the job on the hosts that answer (see the header). Host 0 must answer: worker 0 writes
/// the checkpoints a restart continues from, on its own disk. So must a host with servers where
/// the job has any, since the specification's servers live on hosts with workers.
Sizing sizeElastic(const ResourceSpec& spec, const LaunchOptions& options, const std::function<bool()>& cancelled) {
  const std::vector<HostSpec>& hosts = spec.hosts();
  std::vector<const HostSpec*> all;
  for (const HostSpec& h : hosts) all.push_back(&h);
  const std::vector<std::string> answers = probeHosts(all, cancelled);
  Sizing sizing;
  for (size_t h = 0; h < hosts.size(); ++h) {
    sizing.answered.push_back(answers[h].empty());
    sizing.workersPerHost.push_back(answers[h].empty() ? hosts[h].slots() : 0);
    if (!answers[h].empty()) sizing.absent.push_back(fmt::format("host {} ({}): {}", h, hosts[h].address, answers[h]));
  }
  WEFT_CHECK(answers[0].empty(),
             "weft launch: host 0 ({}) does not answer, and an elastic job cannot go on without it: its worker 0 "
             "writes the checkpoints a restart continues from ({})",
             hosts[0].address, answers[0]);
  for (const int w : sizing.workersPerHost) sizing.workers += w;
  const int answering = sizing.workers;
  for (size_t h = hosts.size(); h-- > 0 && sizing.workers > 0;) {
    while (sizing.workersPerHost[h] > 0 && options.admitsWorkers && !options.admitsWorkers(sizing.workers)) {
      --sizing.workersPerHost[h];
      --sizing.workers;
    }
  }
  std::string absent;
  for (const std::string& a : sizing.absent) absent += "\n  " + a;
  WEFT_CHECK(sizing.workers >= options.minWorkers,
             "weft launch: the hosts that answer have {} worker{}{}, fewer than the {} the job needs "
             "(--min-workers){}",
             answering, answering == 1 ? "" : "s",
             answering == sizing.workers ? "" : fmt::format(", of which the program can train with {}", sizing.workers),
             options.minWorkers, absent.empty() ? "" : ":" + absent);
  int servers = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    sizing.hosts += sizing.workersPerHost[h] > 0 ? 1 : 0;
    servers += sizing.workersPerHost[h] > 0 ? hosts[h].servers : 0;
  }
  WEFT_CHECK(servers > 0 || spec.serverCount() == 0,
             "weft launch: none of the hosts the job would run on has a parameter server, and the specification's "
             "{} are on hosts left out:{}",
             spec.serverCount(), absent);
  sizing.idle = answering - sizing.workers;
  return sizing;
}

/// "3 workers on 2 hosts"
std::string sizeName(const Sizing& sizing) {
  return fmt::format("{} worker{} on {} host{}", sizing.workers, sizing.workers == 1 ? "" : "s", sizing.hosts,
                     sizing.hosts == 1 ? "" : "s");
}

/// While an elastic job runs on part of its hosts: probes the others every interval, from a
/// thread of its own, until one answers and the job would grow.
class HostWatch {
 public:
  HostWatch(const ResourceSpec& spec, const LaunchOptions& options, const Sizing& running)
      : spec_(spec), options_(options), running_(running), thread_(&HostWatch::watch, this) {}
  /// Returns at once: a probe under way is killed.
  ~HostWatch() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    stopping_ = true;
    wake_.notify_all();
    thread_.join();
  }
  HostWatch(const HostWatch&) = delete;
  HostWatch& operator=(const HostWatch&) = delete;

  /// Why the job should grow, once a probe found it can ("" until then).
  std::string growth() const {
    std::lock_guard lock(mutex_);
    return growth_;
  }

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, options_.hostProbeInterval, [&] { return stop_; })) {
      lock.unlock();
      const std::string why = growthNow();
      lock.lock();
      if (!why.empty()) {
        growth_ = why;
        return;
      }
    }
  }
  /// "host 2 (10.0.0.3) answers: the job can grow to 3 workers on 3 hosts", or "". Only the hosts
  /// the job runs without are probed, until one answers.
  std::string growthNow() const {
    const std::function<bool()> cancelled = [this] { return stopping_.load() || stopAsked(); };
    try {
      const std::vector<HostSpec>& hosts = spec_.hosts();
      std::vector<const HostSpec*> absent;
      std::vector<size_t> indices;
      for (size_t h = 0; h < hosts.size(); ++h)
        if (!running_.answered[h]) {
          absent.push_back(&hosts[h]);
          indices.push_back(h);
        }
      const std::vector<std::string> answers = probeHosts(absent, cancelled);
      std::string answering;
      for (size_t i = 0; i < answers.size(); ++i)
        if (answers[i].empty())
          answering +=
              fmt::format("{}host {} ({})", answering.empty() ? "" : ", ", indices[i], hosts[indices[i]].address);
      if (answering.empty() || cancelled()) return "";
      const Sizing grown = sizeElastic(spec_, options_, cancelled);
      if (grown.workers <= running_.workers || cancelled()) return "";
      return fmt::format("{} answer{}: the job can grow to {}", answering,
                         answering.find(", ") == std::string::npos ? "s" : "", sizeName(grown));
    } catch (const Error&) {
      return "";  // the hosts cannot make a larger job now: the next round probes again
    }
  }

  const ResourceSpec& spec_;
  const LaunchOptions& options_;
  const Sizing running_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // stop_, read by probes without the mutex
  std::string growth_;
  std::thread thread_;  // last: it starts once the rest is made
};

/// How one start of the job ended.
enum class Outcome { Succeeded, MemberFailed, Stopped, Resized };

class Job {
 public:
  explicit Job(std::chrono::milliseconds grace) : grace_(grace) {}
  ~Job() { stopAll(); }  // never leave a process behind, whatever happened

  void add(Child child) { children_.push_back(child); }

  /// Waits for the job to end. Stops the job when a process fails, on a stop signal, or when a
  /// running process has been silent past `silenceLimit` while the others were heard. With a
  /// `watch` (an elastic job on part of its hosts), asks the job for a checkpoint once the watch
  /// finds more hosts answering: members that then stop at it end the start as Resized.
  Outcome supervise(Coordinator& coordinator, std::chrono::milliseconds silenceLimit, const HostWatch* watch) {
    bool resizing = false, stoppedForResize = false;
    while (anyWorkerRunning()) {
      if (stopSignal != 0) {
        std::cerr << fmt::format("weft launch: got signal {}; stopping the job\n", stopSignal.load());
        stopAll();
        return Outcome::Stopped;
      }
      if (suspendRequested.exchange(false)) suspend();
      if (watch != nullptr && !resizing) resizing = askToGrow(coordinator, *watch);
      int status = 0;
      if (Child* child = reapAny(status)) {
        const bool succeeded = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        const bool stoppedAtCheckpoint = resizing && WIFEXITED(status) && WEXITSTATUS(status) == kExitPreempted;
        stoppedForResize = stoppedForResize || (stoppedAtCheckpoint && child->id.role == Role::Worker);
        if (succeeded || stoppedAtCheckpoint) continue;
        const std::string failure = verdict(coordinator, *child, status, silenceLimit);
        stopAll();
        if (stoppedForResize) {
          // The job stopped at its checkpoint already: the start ends as the resize it was.
          std::cerr << fmt::format("weft launch: {} after the job stopped at its checkpoint\n", failure);
          return Outcome::Resized;
        }
        cause_ = failure;
        std::cerr << fmt::format("weft launch: {}; stopping the job\n", cause_);
        return Outcome::MemberFailed;
      }
      if (const std::string silent = silentMember(coordinator, silenceLimit); !silent.empty()) {
        cause_ = silent;
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
    if (failures > 0) return Outcome::MemberFailed;
    return stoppedForResize ? Outcome::Resized : Outcome::Succeeded;
  }

  /// What ended the job: the failure of a member, or why the launcher resized it.
  const std::string& cause() const { return cause_; }

 private:
  /// Asks the job for a checkpoint once the watch found more hosts, and the rosters went out
  /// (a member hears the request on the connection the roster came on); whether it asked.
  bool askToGrow(Coordinator& coordinator, const HostWatch& watch) {
    const std::string growth = watch.growth();
    if (growth.empty() || coordinator.liveness().empty()) return false;
    std::cerr << fmt::format("weft launch: {}: asking the job to stop at a checkpoint\n", growth);
    coordinator.requestCheckpoint(growth);
    cause_ = growth;
    return true;
  }
  /// A running member that ended, with its status; null when none did. Each member is waited
  /// for by its pid, never any child: an elastic job's host probes are children too.
  Child* reapAny(int& status) {
    for (Child& c : children_) {
      if (!c.running) continue;
      const pid_t reaped = ::waitpid(c.pid, &status, WNOHANG);
      if (reaped < 0 && errno == ECHILD) status = W_EXITCODE(255, 0);  // gone, its status lost
      if (reaped == c.pid || (reaped < 0 && errno == ECHILD)) {
        c.running = false;
        return &c;
      }
    }
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
      while (Child* child = reapAny(other))
        if (killed(*child, other) && !killed(*cause.first, cause.second)) cause = {child, other};
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
  std::string cause_;
};

/// How one start of the job went: its outcome, and what ended it (see Job::cause).
struct Start {
  Outcome outcome;
  std::string cause;
};

/// One start of the job: a new id, secret and coordinator, every member. `coordinatorHost` is
/// where the members reach the coordinator; `watch`, when given, may ask the job to resize.
Start runOnce(const ResourceSpec& spec, const std::string& coordinatorHost, const std::vector<std::string>& command,
              const LaunchOptions& options, const HostWatch* watch) {
  const Secret secret = generateSecret();
  const JobId job = generateJobId();
  const SecretMemory secretMemory(secret);
  const std::vector<MemberId> members = expectedMembers(spec);
  Coordinator coordinator(spec, secret, job, members, options.rendezvousTimeout);
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
  const Outcome outcome = running.supervise(coordinator, options.silenceLimit, watch);
  return {outcome, running.cause()};
}

/// " (its hosts 0, 1 are the specification's 0, 2)" when hosts were left out before others, so
/// that a member named later ("worker 0 of host 1") can be found; "" when the numbers agree.
std::string renumbered(const Sizing& sizing) {
  std::string own, theirs;
  int next = 0;
  bool shifted = false;
  for (size_t h = 0; h < sizing.workersPerHost.size(); ++h) {
    if (sizing.workersPerHost[h] == 0) continue;
    shifted = shifted || static_cast<size_t>(next) != h;
    own += fmt::format("{}{}", own.empty() ? "" : ", ", next++);
    theirs += fmt::format("{}{}", theirs.empty() ? "" : ", ", h);
  }
  return shifted ? fmt::format(" (its hosts {} are the specification's {})", own, theirs) : "";
}

/// "; host 2 (10.0.0.3) left out: `ip netns exec h2 true` exited with status 1: ..." for each
/// host an elastic start leaves out, or "".
std::string leftOut(const Sizing& sizing) {
  std::string out = renumbered(sizing);
  for (const std::string& a : sizing.absent) out += "; left out " + a;
  if (sizing.idle > 0)
    out += fmt::format("; {} worker{} of the hosts that answer left out: the program cannot train with {}", sizing.idle,
                       sizing.idle == 1 ? "" : "s", sizing.workers + sizing.idle);
  return out;
}

}  // namespace

int launch(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options) {
  WEFT_CHECK(!command.empty(), "weft launch: no command to run");
  const int fullSize = static_cast<int>(spec.workers().size());
  WEFT_CHECK(options.minWorkers <= fullSize, "weft launch: --min-workers {} is more than the job's {} workers",
             options.minWorkers, fullSize);
  const StopSignals signals;
  stopSignal = 0;
  suspendRequested = false;
  const std::string coordinatorHost = spec.bind() == "0.0.0.0" ? spec.hosts().front().address : spec.bind();
  const bool elastic = options.minWorkers > 0;
  std::vector<std::string> current = command;
  LaunchOptions attempt = options;
  Sizing sizing;
  if (elastic) {
    attempt.environment[kElasticVariable] = "1";
    sizing = sizeElastic(spec, options, stopAsked);
    if (stopAsked()) return 1;
    std::cerr << fmt::format("weft launch: elastic job (at least {} workers) starting with {}{}\n", options.minWorkers,
                             sizeName(sizing), leftOut(sizing));
  }
  for (int starts = 0, restarts = 0;; ++starts) {
    attempt.environment[kRestartCountVariable] = std::to_string(starts);
    std::optional<HostWatch> watch;
    if (elastic && !sizing.absent.empty()) watch.emplace(spec, options, sizing);
    const Start start = runOnce(elastic ? spec.resized(sizing.workersPerHost) : spec, coordinatorHost, current, attempt,
                                watch ? &*watch : nullptr);
    watch.reset();
    if (start.outcome == Outcome::Succeeded) return 0;
    if (start.outcome == Outcome::Stopped || stopSignal != 0) return 1;
    const bool failed = start.outcome == Outcome::MemberFailed;
    if (failed && ++restarts > options.maxRestarts) return 1;
    std::string cause = start.cause;
    if (elastic) {
      try {
        sizing = sizeElastic(spec, options, stopAsked);
      } catch (const Error& e) {
        std::cerr << e.what() << "\n";
        return 1;
      }
      if (stopAsked()) return 1;
      cause += fmt::format("; starting again with {}{}", sizeName(sizing), leftOut(sizing));
    }
    attempt.environment[kRestartCauseVariable] = cause;
    if (options.restartCommand) current = options.restartCommand(starts + 1);
    if (failed) {
      std::cerr << fmt::format("weft launch: restarting the job ({} of {} restarts){}\n", restarts, options.maxRestarts,
                               elastic ? fmt::format(" with {}{}", sizeName(sizing), leftOut(sizing)) : "");
    } else {
      std::cerr << fmt::format("weft launch: the job stopped at a checkpoint; starting it again with {}{}\n",
                               sizeName(sizing), leftOut(sizing));
    }
  }
}

}  // namespace weft::dist
