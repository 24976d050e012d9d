// The resource specification: which hosts take part in a job and what each contributes, in JSON:
//
//   {"hosts": [{"address": "127.0.0.1", "cpu_workers": 2},
//              {"address": "10.0.0.2", "gpus": [0, 1]}],
//    "bind": "127.0.0.1", "coordinator_port": 0}
//
// Each host has exactly one of `cpu_workers` (>= 1 worker processes) or `gpus` (distinct CUDA
// device indices, one worker per GPU). `bind` is the address the coordinator listens on
// (default "127.0.0.1": loopback, so a single-host job is never reachable from the network);
// `coordinator_port` 0 means any free port. Every host also runs `servers` parameter servers
// (optional, default 1, may be 0). A host may give `launch_prefix`, a command its processes are
// started through on this machine instead of over ssh, e.g. ["ip", "netns", "exec", "h1"] to
// emulate hosts with network namespaces.
//
// An address (and `bind`) is a host name or an IP address, optionally with "user@" before it:
// letters, digits and . - _ : %, not starting with '-', at most 255 bytes. A file over
// kMaxResourceSpecBytes, or one that is not a regular file, is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace weft::dist {

/// The environment variable through which launched processes get the job's specification.
inline constexpr char kResourcesVariable[] = "WEFT_RESOURCES";

/// The largest resource specification file read.
inline constexpr uint64_t kMaxResourceSpecBytes = uint64_t{1} << 20;

/// One host of the specification.
struct HostSpec {
  std::string address;
  int cpuWorkers = 0;     ///< > 0 for a CPU host
  std::vector<int> gpus;  ///< non-empty for a GPU host
  int servers = 1;        ///< parameter-server processes on this host
  std::vector<std::string> launchPrefix;  ///< started locally through this command, not over ssh
  /// Worker processes on this host.
  int slots() const { return cpuWorkers > 0 ? cpuWorkers : static_cast<int>(gpus.size()); }
};

/// One worker process: its host, its index among that host's workers, and its device.
struct WorkerSlot {
  int host = 0;
  int slot = 0;
  std::string device;  ///< "cpu" or "cuda:N"
};

/// A validated resource specification.
class ResourceSpec {
 public:
  /// Reads and validates a file; errors name the file and the JSON path of the bad value.
  static ResourceSpec load(const std::string& path);
  /// Validates JSON text; `sourceName` (a file name) prefixes every error.
  static ResourceSpec parse(const std::string& text, const std::string& sourceName);
  /// The single-host default: `workers` CPU workers on 127.0.0.1, any free port.
  static ResourceSpec localCpu(int workers, int servers = 1);
  /// The specification of the job this process was launched in (the launcher puts it in
  /// WEFT_RESOURCES); nullopt when the variable is unset. Errors name the variable.
  static std::optional<ResourceSpec> fromEnvironment();
  /// The specification as JSON that parse() reads back as it is.
  std::string toJson() const;

  const std::vector<HostSpec>& hosts() const { return hosts_; }
  const std::string& bind() const { return bind_; }
  uint16_t coordinatorPort() const { return coordinatorPort_; }
  /// Whether the job's data plane encrypts its payloads ("encrypt": true; dist/transport/Seal.h).
  bool encrypt() const { return encrypt_; }
  void setEncrypt(bool encrypt) { encrypt_ = encrypt; }
  /// The specification with host h keeping its first workersPerHost[h] workers (CPU workers,
  /// or GPUs in the listed order); a host given 0 is left out with its servers. How an elastic
  /// job runs on part of its hosts. Throws unless one count is given per host, each between 0
  /// and the host's slots, and some host keeps a worker.
  ResourceSpec resized(const std::vector<int>& workersPerHost) const;
  /// Every worker in rank order: hosts in order, then slots in order.
  std::vector<WorkerSlot> workers() const;
  /// Parameter servers over all hosts.
  int serverCount() const;
  /// Where a host lists one GPU for two workers ("hosts[0].gpus[2] is 1, which hosts[0].gpus[0]
  /// lists too"), or "": pipeline stages may share a GPU, data-parallel workers may not (NCCL
  /// refuses two ranks on one device; checkConfig says so).
  std::string sharedGpu() const;

 private:
  std::vector<HostSpec> hosts_;
  std::string bind_ = "127.0.0.1";
  uint16_t coordinatorPort_ = 0;
  bool encrypt_ = false;
};

/// ssh's argument list that runs `remoteCommand` on `address`: batch mode, and "--" ending
/// ssh's options before the host, so no address is ever taken for an option (parse() has
/// refused such addresses already; this holds for a HostSpec built in code too).
std::vector<std::string> sshCommand(const std::string& address, const std::string& remoteCommand);

}  // namespace weft::dist
