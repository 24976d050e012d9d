// The job launcher (see the header).
#include "dist/Launcher.h"

#include "core/Error.h"
#include "dist/Auth.h"
#include "dist/Coordinator.h"

#include <fmt/format.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
void onStopSignal(int signal) { stopSignal = signal; }

/// Installs the SIGINT/SIGTERM handlers for the launcher's lifetime (without SA_RESTART, so a
/// blocked waitpid returns) and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = onStopSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &oldInt_);
    sigaction(SIGTERM, &action, &oldTerm_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
  }

 private:
  struct sigaction oldInt_ {}, oldTerm_ {};
};

/// A private directory for the secret file, removed with its content.
class PrivateDirectory {
 public:
  PrivateDirectory() {
    const std::filesystem::path base = std::filesystem::temp_directory_path();
    std::string pattern = (base / "weft-job-XXXXXX").string();
    WEFT_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a directory in {}: {}", base.string(),
               std::strerror(errno));  // mkdtemp makes it 0700
    path_ = pattern;
  }
  ~PrivateDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
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
  pid_t pid = -1;
  bool running = true;
};

/// Starts one member of the job: locally (through the host's launch prefix, if any) with its
/// identity in the environment, or over ssh with the secret written to the remote shell's
/// standard input.
pid_t start(const HostSpec& host, const MemberId& id, const std::vector<std::string>& command,
            const std::map<std::string, std::string>& environment, const std::string& secretFile,
            const Secret& secret) {
  int secretPipe[2] = {-1, -1};
  const bool local = isLocal(host.address) || !host.launchPrefix.empty();
  if (!local) WEFT_CHECK(::pipe(secretPipe) == 0, "pipe: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  WEFT_CHECK(pid >= 0, "fork: {}", std::strerror(errno));
  if (pid == 0) {
    std::vector<std::string> argv = host.launchPrefix;
    argv.insert(argv.end(), command.begin(), command.end());
    if (local) {
      for (const auto& [k, v] : environment) ::setenv(k.c_str(), v.c_str(), 1);
      ::setenv("WEFT_JOB_SECRET_FILE", secretFile.c_str(), 1);
    } else {
      ::dup2(secretPipe[0], STDIN_FILENO);
      ::close(secretPipe[0]);
      ::close(secretPipe[1]);
      std::string remote = fmt::format("cd {} && read -r WEFT_JOB_SECRET && export WEFT_JOB_SECRET && exec env",
                                       shellQuote(std::filesystem::current_path().string()));
      for (const auto& [k, v] : environment) remote += fmt::format(" {}={}", k, shellQuote(v));
      for (const std::string& a : command) remote += fmt::format(" {}", shellQuote(a));
      argv = sshCommand(host.address, remote);
    }
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::cerr << fmt::format("weft launch: cannot run {} for {}: {}\n", argv[0], describe(id), std::strerror(errno));
    std::_Exit(127);
  }
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
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

class Job {
 public:
  explicit Job(std::chrono::milliseconds grace) : grace_(grace) {}
  ~Job() { stopAll(); }  // never leave a process behind, whatever happened

  void add(Child child) { children_.push_back(child); }

  /// Waits for the job to end; returns the exit status. Stops the job when a process fails,
  /// on a stop signal, or when a running process has been silent past `silenceLimit`.
  int supervise(const Coordinator& coordinator, std::chrono::milliseconds silenceLimit) {
    int failures = 0;
    while (anyWorkerRunning()) {
      if (stopSignal != 0) {
        std::cerr << fmt::format("weft launch: got signal {}; stopping the job\n", stopSignal.load());
        stopAll();
        return 1;
      }
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno != EINTR) break;
      if (pid > 0) {
        Child* child = find(pid);
        if (child == nullptr) continue;
        child->running = false;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          const auto [cause, how] = firstCause(*child, status);
          std::cerr << fmt::format("weft launch: {} (pid {}) {}; stopping the job\n", describe(cause->id), cause->pid,
                                   howItEnded(how));
          ++failures;
          stopAll();
          return 1;
        }
        continue;
      }
      if (const std::string silent = silentMember(coordinator, silenceLimit); !silent.empty()) {
        std::cerr << fmt::format("weft launch: {}; stopping the job\n", silent);
        stopAll();
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Every worker succeeded: the servers leave once they have every worker's goodbye.
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    while (anyRunning() && std::chrono::steady_clock::now() < deadline) {
      reapExited();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (const Child& c : children_) {
      if (c.running) {
        std::cerr << fmt::format("weft launch: {} (pid {}) did not leave after the workers finished\n",
                                 describe(c.id), c.pid);
        ++failures;
      }
    }
    stopAll();
    return failures == 0 ? 0 : 1;
  }

 private:
  Child* find(pid_t pid) {
    for (Child& c : children_)
      if (c.pid == pid) return &c;
    return nullptr;
  }
  /// "worker 1 of host 0 (pid N) sent no heartbeat for 20.4 s ..." for the running process silent
  /// longest past the limit, or "".
  std::string silentMember(const Coordinator& coordinator, std::chrono::milliseconds limit) const {
    const auto silences = coordinator.silences();
    const Child* worst = nullptr;
    std::chrono::milliseconds longest{0};
    for (const Child& c : children_) {
      const auto it = silences.find(c.id);
      if (!c.running || it == silences.end() || it->second <= limit || it->second <= longest) continue;
      worst = &c;
      longest = it->second;
    }
    if (worst == nullptr) return "";
    return fmt::format("{} (pid {}) sent no heartbeat for {:.1f} s: it is stopped, hung in the kernel or cut off "
                       "from the network",
                       describe(worst->id), worst->pid, static_cast<double>(longest.count()) / 1000.0);
  }
  /// The process to name for a failure first seen as `failed` ending with `status`. Its peers
  /// stop with an error as soon as they notice a process die, so a process already ended by a
  /// signal (which is reaped here with every other that has ended) is named before them.
  std::pair<const Child*, int> firstCause(const Child& failed, int status) {
    std::pair<const Child*, int> cause{&failed, status};
    int other = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &other, WNOHANG)) > 0;) {
      Child* child = find(pid);
      if (child == nullptr) continue;
      child->running = false;
      if (WIFSIGNALED(other) && !WIFSIGNALED(cause.second)) cause = {child, other};
    }
    return cause;
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
  /// SIGTERM to every running process, SIGKILL to those still there after the grace period.
  void stopAll() {
    for (const Child& c : children_)
      if (c.running) ::kill(c.pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    while (anyRunning() && std::chrono::steady_clock::now() < deadline) {
      reapExited();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (Child& c : children_) {
      if (!c.running) continue;
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      c.running = false;
    }
  }

  std::chrono::milliseconds grace_;
  std::vector<Child> children_;
};

}  // namespace

int launch(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options) {
  WEFT_CHECK(!command.empty(), "weft launch: no command to run");
  const StopSignals signals;
  stopSignal = 0;
  const Secret secret = generateSecret();
  const JobId job = generateJobId();
  const PrivateDirectory directory;
  const std::string secretFile = directory.path() + "/secret";
  saveSecret(secretFile, secret);

  const std::vector<MemberId> members = expectedMembers(spec);
  Coordinator coordinator(spec, secret, job, members, options.rendezvousTimeout);
  const std::string coordinatorHost = spec.bind() == "0.0.0.0" ? spec.hosts().front().address : spec.bind();
  Job running(options.grace);
  for (const MemberId& id : members) {
    const std::map<std::string, std::string> environment{
        {"WEFT_COORDINATOR", fmt::format("{}:{}", coordinatorHost, coordinator.port())},
        {"WEFT_ROLE", id.role == Role::Worker ? "worker" : "server"},
        {"WEFT_HOST", std::to_string(id.host)},
        {"WEFT_SLOT", std::to_string(id.slot)},
        {"WEFT_JOB_ID", toHex(job)},
    };
    running.add({id, start(spec.hosts()[static_cast<size_t>(id.host)], id, command, environment, secretFile, secret)});
  }
  return running.supervise(coordinator, options.silenceLimit);
}

}  // namespace weft::dist
