// Reading a cluster engine's environment (see the header).
#include "dist/launch/Engine.h"

#include "core/Error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <numeric>

extern char** environ;

namespace weft::dist {

namespace {

/// The most processes and hosts an engine's variables may describe.
constexpr int kMostProcesses = 1 << 20;

/// Reads one engine's variables out of an environment, remembering what it read.
class Reader {
 public:
  explicit Reader(const Environment& environment) : environment_(environment) {}

  bool has(const std::string& name) const { return environment_.count(name) > 0; }
  std::string text(const std::string& name) {
    const std::string& value = environment_.at(name);
    evidence_.push_back(fmt::format("{}={}", name, value));
    return value;
  }
  /// A count or index: digits only, below kMostProcesses.
  int number(const std::string& name) {
    const std::string value = text(name);
    const bool digits = !value.empty() && value.size() <= 7 &&
                        std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isdigit(c); });
    WEFT_CHECK(digits && std::stoi(value) < kMostProcesses, "{}='{}' is not a count or index of processes", name,
               value);
    return std::stoi(value);
  }
  std::optional<int> optionalNumber(const std::string& name) {
    return has(name) ? std::optional<int>(number(name)) : std::nullopt;
  }
  /// `name`, which `because` (a variable that is set) needs.
  int required(const std::string& name, const std::string& because) {
    WEFT_CHECK(has(name), "{} is set without {}: the environment of this process is partial ({})", because, name,
               describeSet());
    return number(name);
  }
  uint16_t port(const std::string& name) {
    const int value = number(name);
    WEFT_CHECK(value > 0 && value < 65536, "{}={} is not a TCP port", name, value);
    return static_cast<uint16_t>(value);
  }
  std::vector<std::string> takeEvidence() { return std::move(evidence_); }
  std::string describeSet() const {
    std::string out;
    for (const std::string& e : evidence_) out += (out.empty() ? "" : ", ") + e;
    return out.empty() ? "nothing else read" : out;
  }

 private:
  const Environment& environment_;
  std::vector<std::string> evidence_;
};

/// `rank` < `size`, both read from the variables named.
void checkRank(int rank, int size, const std::string& rankName, const std::string& sizeName) {
  WEFT_CHECK(size >= 1, "{}={}: a job has at least one process", sizeName, size);
  WEFT_CHECK(rank < size, "{}={} is not below {}={}", rankName, rank, sizeName, size);
}

/// `size` processes on hosts of `perHost` each.
std::vector<int> evenHosts(int size, int perHost, const std::string& what) {
  WEFT_CHECK(perHost >= 1 && size % perHost == 0, "{}: {} processes do not fill hosts of {} each", what, size, perHost);
  return std::vector<int>(static_cast<size_t>(size / perHost), perHost);
}

/// The rendezvous at the master address and port of a Kubernetes manifest, which also tell its
/// run from others (the pods of a run share nothing else); the view's evidence is then complete.
void readMaster(Reader& r, EngineView& v, const std::string& address, const std::string& port) {
  v.coordinatorHost = r.text(address);
  v.coordinatorPort = r.port(port);
  v.runKey = fmt::format("{}/{}:{}", v.engine, v.coordinatorHost, v.coordinatorPort);
  v.evidence = r.takeEvidence();
}

std::optional<EngineView> readSlurm(const Environment& environment) {
  Reader r(environment);
  if (!r.has("SLURM_PROCID")) return std::nullopt;
  EngineView v;
  v.engine = "slurm";
  v.rank = r.number("SLURM_PROCID");
  v.size =
      r.required(!r.has("SLURM_NTASKS") && r.has("SLURM_NPROCS") ? "SLURM_NPROCS" : "SLURM_NTASKS", "SLURM_PROCID");
  checkRank(v.rank, v.size, "SLURM_PROCID", "SLURM_NTASKS");
  v.localRank = r.required("SLURM_LOCALID", "SLURM_PROCID");
  v.node = r.required("SLURM_NODEID", "SLURM_PROCID");
  const std::string nodeList = r.has("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  WEFT_CHECK(r.has(nodeList), "SLURM_PROCID is set without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST ({})",
             r.describeSet());
  v.hosts = expandSlurmHostList(r.text(nodeList));
  const std::string perNode = r.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  WEFT_CHECK(r.has(perNode), "SLURM_PROCID is set without SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE ({})",
             r.describeSet());
  v.tasksPerNode = expandSlurmTasksPerNode(r.text(perNode));
  WEFT_CHECK(v.tasksPerNode.size() == v.hosts.size(), "{} lists {} hosts, but {} gives tasks for {}", nodeList,
             v.hosts.size(), perNode, v.tasksPerNode.size());
  const int total = std::accumulate(v.tasksPerNode.begin(), v.tasksPerNode.end(), 0);
  WEFT_CHECK(total == v.size, "{} adds up to {} tasks, but SLURM_NTASKS={}", perNode, total, v.size);
  WEFT_CHECK(v.node < v.nodes(), "SLURM_NODEID={} is not below the {} hosts of {}", v.node, v.nodes(), nodeList);
  WEFT_CHECK(v.localRank < v.localSize(), "SLURM_LOCALID={} is not below host {}'s {} tasks ({})", v.localRank, v.node,
             v.localSize(), perNode);
  v.coordinatorHost = v.hosts.front();
  v.runKey = fmt::format("slurm/{}.{}/{}", r.has("SLURM_JOB_ID") ? r.text("SLURM_JOB_ID") : "?",
                         r.has("SLURM_STEP_ID") ? r.text("SLURM_STEP_ID") : "?",
                         r.has("SLURM_RESTART_COUNT") ? r.text("SLURM_RESTART_COUNT") : "0");
  v.evidence = r.takeEvidence();
  return v;
}

std::optional<EngineView> readOpenMpi(const Environment& environment) {
  Reader r(environment);
  if (!r.has("OMPI_COMM_WORLD_RANK")) return std::nullopt;
  EngineView v;
  v.engine = "openmpi";
  v.rank = r.number("OMPI_COMM_WORLD_RANK");
  v.size = r.required("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
  checkRank(v.rank, v.size, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  v.localRank = r.required("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK");
  const int localSize = r.required("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK");
  // Open MPI names no host index: the hosts follow from ranks placed host by host in blocks of
  // one size (mpirun's default mapping with as many slots on every host).
  WEFT_CHECK(localSize >= 1 && v.size % localSize == 0 && v.rank % localSize == v.localRank,
             "OMPI_COMM_WORLD_RANK={} is local rank {} of {} on its host (OMPI_COMM_WORLD_LOCAL_RANK, _LOCAL_SIZE) "
             "of {} processes: weft needs the ranks placed host by host in blocks of one size (mpirun's default "
             "--map-by slot, with as many slots on every host)",
             v.rank, v.localRank, localSize, v.size);
  v.tasksPerNode = evenHosts(v.size, localSize, "OMPI_COMM_WORLD_SIZE");
  v.node = v.rank / localSize;
  const std::string jobId = r.has("OMPI_MCA_ess_base_jobid") ? r.text("OMPI_MCA_ess_base_jobid")
                            : r.has("PMIX_NAMESPACE")        ? r.text("PMIX_NAMESPACE")
                                                             : "?";
  v.runKey = "openmpi/" + jobId;
  v.evidence = r.takeEvidence();
  return v;
}

/// torchrun's variables, or RANK and WORLD_SIZE as DeepSpeed, Ray Train or a script set them.
std::optional<EngineView> readTorchStyle(const Environment& environment) {
  Reader r(environment);
  // An indexed Job's manifest gives WORLD_SIZE beside the pod's index, without RANK.
  if (!r.has("RANK") && (!r.has("WORLD_SIZE") || r.has("JOB_COMPLETION_INDEX"))) return std::nullopt;
  EngineView v;
  const bool torchrun = r.has("TORCHELASTIC_RUN_ID");
  v.engine = torchrun ? "torchrun" : "rank-env";
  v.rank = r.required("RANK", "WORLD_SIZE");
  v.size = r.required("WORLD_SIZE", "RANK");
  checkRank(v.rank, v.size, "RANK", "WORLD_SIZE");
  WEFT_CHECK(r.has("LOCAL_RANK") == r.has("LOCAL_WORLD_SIZE"),
             "{} is set without {}: the environment of this process is partial ({})",
             r.has("LOCAL_RANK") ? "LOCAL_RANK" : "LOCAL_WORLD_SIZE",
             r.has("LOCAL_RANK") ? "LOCAL_WORLD_SIZE" : "LOCAL_RANK", r.describeSet());
  const int perHost = r.has("LOCAL_WORLD_SIZE") ? r.number("LOCAL_WORLD_SIZE") : 1;
  v.localRank = r.has("LOCAL_RANK") ? r.number("LOCAL_RANK") : 0;
  WEFT_CHECK(v.localRank < perHost, "LOCAL_RANK={} is not below LOCAL_WORLD_SIZE={}", v.localRank, perHost);
  v.tasksPerNode = evenHosts(v.size, perHost, "WORLD_SIZE and LOCAL_WORLD_SIZE");
  v.node = r.has("GROUP_RANK") ? r.number("GROUP_RANK") : v.rank / perHost;
  WEFT_CHECK(v.node < v.nodes(),
             "GROUP_RANK={} is not below the {} hosts that WORLD_SIZE={} and LOCAL_WORLD_SIZE={} make", v.node,
             v.nodes(), v.size, perHost);
  if (r.has("MASTER_ADDR")) v.coordinatorHost = r.text("MASTER_ADDR");
  if (r.has("MASTER_PORT")) {
    const uint16_t port = r.port("MASTER_PORT");
    // torchrun's own store listens on the master port: the rendezvous takes the next one.
    WEFT_CHECK(!torchrun || port < 65535, "MASTER_PORT=65535 leaves no port after it for weft's rendezvous");
    v.coordinatorPort = torchrun ? static_cast<uint16_t>(port + 1) : port;
  }
  v.runKey = fmt::format("{}/{}/{}/{}:{}", v.engine, torchrun ? r.text("TORCHELASTIC_RUN_ID") : "",
                         r.has("TORCHELASTIC_RESTART_COUNT") ? r.text("TORCHELASTIC_RESTART_COUNT") : "0",
                         v.coordinatorHost, v.coordinatorPort);
  v.evidence = r.takeEvidence();
  return v;
}

/// A Kubeflow pod's variables; `underTorchrun`: torchrun started this process in the pod, its
/// variables decide, and the pod may run several processes.
std::optional<EngineView> readKubeflow(const Environment& environment, bool underTorchrun) {
  Reader r(environment);
  if (!r.has("PET_NNODES") && !r.has("PET_NODE_RANK")) return std::nullopt;
  EngineView v;
  v.engine = "kubeflow";
  WEFT_CHECK(r.has("PET_NNODES"), "PET_NODE_RANK is set without PET_NNODES ({})", r.describeSet());
  const std::string nodes = r.text("PET_NNODES");
  if (nodes.find(':') != std::string::npos) {
    // An elastic range is torchrun's to resolve: each round of its rendezvous gives the hosts
    // that came their ranks (not the pods' indices), and weft resumes at that size.
    WEFT_CHECK(underTorchrun,
               "PET_NNODES='{}' is an elastic range of hosts, which torchrun resolves: run `torchrun --no-python weft "
               "...` in the pod (weft resumes its checkpoint at whatever size torchrun starts), or give one number",
               nodes);
    return std::nullopt;
  }
  v.size = r.number("PET_NNODES");
  v.rank = r.required("PET_NODE_RANK", "PET_NNODES");
  checkRank(v.rank, v.size, "PET_NODE_RANK", "PET_NNODES");
  if (r.has("PET_NPROC_PER_NODE")) {
    const std::string perNode = r.text("PET_NPROC_PER_NODE");
    WEFT_CHECK(underTorchrun || perNode == "1",
               "PET_NPROC_PER_NODE='{}' asks for several processes in each pod, which torchrun starts: run `torchrun "
               "--no-python weft ...` in the pod, or set it to 1",
               perNode);
  }
  v.node = v.rank;
  v.tasksPerNode.assign(static_cast<size_t>(v.size), 1);
  WEFT_CHECK(r.has("PET_MASTER_ADDR") && r.has("PET_MASTER_PORT"),
             "PET_NNODES is set without PET_MASTER_ADDR and PET_MASTER_PORT ({})", r.describeSet());
  readMaster(r, v, "PET_MASTER_ADDR", "PET_MASTER_PORT");
  return v;
}

/// A Kubernetes indexed Job or JobSet: the pod's index, with the size and the first pod's stable
/// host name from the manifest.
std::optional<EngineView> readIndexedJob(const Environment& environment) {
  Reader r(environment);
  if (!r.has("JOB_COMPLETION_INDEX")) return std::nullopt;
  EngineView v;
  v.engine = "indexed-job";
  v.rank = r.number("JOB_COMPLETION_INDEX");
  WEFT_CHECK(r.has("WORLD_SIZE") && r.has("MASTER_ADDR") && r.has("MASTER_PORT"),
             "JOB_COMPLETION_INDEX is set, but the manifest gives not all of WORLD_SIZE (its pods), MASTER_ADDR (pod "
             "0's stable host name) and MASTER_PORT ({})",
             r.describeSet());
  v.size = r.number("WORLD_SIZE");
  checkRank(v.rank, v.size, "JOB_COMPLETION_INDEX", "WORLD_SIZE");
  v.node = v.rank;
  v.tasksPerNode.assign(static_cast<size_t>(v.size), 1);
  readMaster(r, v, "MASTER_ADDR", "MASTER_PORT");
  return v;
}

/// Two readings of one launch must agree on the process's rank (and size, where both give one).
void checkAgree(const EngineView& a, const EngineView& b, bool sameSize) {
  const auto named = [](const EngineView& v) {
    std::string out;
    for (const std::string& e : v.evidence) out += (out.empty() ? "" : ", ") + e;
    return out;
  };
  WEFT_CHECK(a.rank == b.rank && (!sameSize || a.size == b.size),
             "the variables of {} and of {} disagree on this process's place (rank {} of {} against rank {} of {}): "
             "{}; {}",
             a.engine, b.engine, a.rank, a.size, b.rank, b.size, named(a), named(b));
}

/// PMIX_RANK, which PMIx launches (mpirun, `srun --mpi=pmix`) set beside their own variables.
void checkPmix(const Environment& environment, const std::optional<EngineView>& mpi,
               const std::optional<EngineView>& slurm) {
  if (!environment.count("PMIX_RANK")) return;
  Reader r(environment);
  const int rank = r.number("PMIX_RANK");
  const std::optional<EngineView>& launch = mpi ? mpi : slurm;
  WEFT_CHECK(launch.has_value(),
             "PMIX_RANK={} is set without the job's size: weft reads the size from Open MPI's or Slurm's variables, "
             "which this environment lacks",
             rank);
  WEFT_CHECK(launch->rank == rank, "PMIX_RANK={} disagrees with {}'s rank {} of this process", rank, launch->engine,
             launch->rank);
}

std::string hostListError(const std::string& list, const std::string& why) {
  return fmt::format("Slurm host list '{}' does not parse: {}", list, why);
}

/// The items of a host list: split at commas outside brackets.
std::vector<std::string> splitOutsideBrackets(const std::string& list) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (const char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    WEFT_CHECK(depth == 0 || depth == 1, "{}", hostListError(list, "brackets do not pair"));
    if (c == ',' && depth == 0) {
      items.push_back(std::move(item));
      item.clear();
    } else {
      item.push_back(c);
    }
  }
  WEFT_CHECK(depth == 0, "{}", hostListError(list, "a '[' is not closed"));
  items.push_back(std::move(item));
  return items;
}

/// The numbers of one bracket's range list ("01-03,7"), each with its zero padding.
std::vector<std::string> expandRanges(const std::string& ranges, const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', start), ranges.size());
    const std::string range = ranges.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string low = range.substr(0, dash), high = dash == std::string::npos ? low : range.substr(dash + 1);
    const auto isNumber = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    WEFT_CHECK(isNumber(low) && isNumber(high), "{}",
               hostListError(list, fmt::format("'{}' in brackets is not a number or a range of numbers", range)));
    const long first = std::stol(low), last = std::stol(high);
    WEFT_CHECK(first <= last, "{}", hostListError(list, fmt::format("the range '{}' runs backwards", range)));
    WEFT_CHECK(last - first < kMostProcesses, "{}",
               hostListError(list, fmt::format("the range '{}' is too long", range)));
    for (long n = first; n <= last; ++n) out.push_back(fmt::format("{:0{}}", n, low.size()));
    start = comma + 1;
  }
  return out;
}

/// One item of a host list, its brackets expanded in order (the last varies fastest).
void expandItem(const std::string& item, const std::string& list, std::vector<std::string>& out) {
  WEFT_CHECK(!item.empty(), "{}", hostListError(list, "it has an empty host name"));
  std::vector<std::string> names{""};
  size_t at = 0;
  while (at < item.size()) {
    const size_t open = item.find('[', at);
    const std::string literal = item.substr(at, open == std::string::npos ? std::string::npos : open - at);
    WEFT_CHECK(literal.find(']') == std::string::npos, "{}", hostListError(list, "a ']' has no '['"));
    for (std::string& n : names) n += literal;
    if (open == std::string::npos) break;
    const size_t close = item.find(']', open);
    const std::vector<std::string> numbers = expandRanges(item.substr(open + 1, close - open - 1), list);
    std::vector<std::string> longer;
    for (const std::string& n : names)
      for (const std::string& number : numbers) longer.push_back(n + number);
    names = std::move(longer);
    WEFT_CHECK(names.size() <= static_cast<size_t>(kMostProcesses), "{}",
               hostListError(list, "it names too many hosts"));
    at = close + 1;
  }
  out.insert(out.end(), names.begin(), names.end());
}

}  // namespace

Environment processEnvironment() {
  Environment out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t equals = entry.find('=');
    if (equals != std::string::npos) out.emplace(entry.substr(0, equals), entry.substr(equals + 1));
  }
  return out;
}

std::vector<std::string> expandSlurmHostList(const std::string& list) {
  WEFT_CHECK(!list.empty(), "the Slurm host list is empty");
  std::vector<std::string> hosts;
  for (const std::string& item : splitOutsideBrackets(list)) expandItem(item, list, hosts);
  return hosts;
}

std::vector<int> expandSlurmTasksPerNode(const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t paren = item.find("(x");
    const std::string count = item.substr(0, paren);
    const std::string repeat = paren == std::string::npos ? "1" : item.substr(paren + 2);
    const auto number = [&](const std::string& s, bool closed) {
      const std::string digits = closed ? s.substr(0, s.size() - (s.ends_with(')') ? 1 : 0)) : s;
      const bool ok = (!closed || s.ends_with(')')) && !digits.empty() && digits.size() <= 7 &&
                      std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); });
      WEFT_CHECK(ok, "Slurm tasks per node '{}' do not parse at '{}' (expected e.g. '2(x3),1')", text, item);
      return std::stoi(digits);
    };
    const int tasks = number(count, false);
    const int times = number(repeat, paren != std::string::npos);
    WEFT_CHECK(
        tasks >= 1 && times >= 1 && out.size() + static_cast<size_t>(times) <= static_cast<size_t>(kMostProcesses),
        "Slurm tasks per node '{}': '{}' gives no tasks, or too many hosts", text, item);
    out.insert(out.end(), static_cast<size_t>(times), tasks);
    start = comma + 1;
  }
  return out;
}

namespace {

/// WEFT_RENDEZVOUS=HOST:PORT, where it is set.
void applyRendezvousOverride(const Environment& environment, EngineView& view) {
  const auto it = environment.find("WEFT_RENDEZVOUS");
  if (it == environment.end()) return;
  const std::string& value = it->second;
  const size_t colon = value.rfind(':');
  const std::string port = colon == std::string::npos ? "" : value.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
  WEFT_CHECK(colon != std::string::npos && colon > 0 && digits && std::stoi(port) > 0 && std::stoi(port) < 65536,
             "WEFT_RENDEZVOUS='{}' is not HOST:PORT", value);
  view.coordinatorHost = value.substr(0, colon);
  view.coordinatorPort = static_cast<uint16_t>(std::stoi(port));
  view.evidence.push_back("WEFT_RENDEZVOUS=" + value);
}

std::optional<EngineView> chooseEngine(const Environment& environment) {
  const std::optional<EngineView> mpi = readOpenMpi(environment);
  const std::optional<EngineView> slurm = readSlurm(environment);
  const std::optional<EngineView> torch = readTorchStyle(environment);
  const std::optional<EngineView> kubeflow = readKubeflow(environment, torch && torch->engine == "torchrun");
  // A TrainJob's pods belong to an indexed Job too: their index is the node rank Kubeflow gives.
  const std::optional<EngineView> indexed = kubeflow ? std::nullopt : readIndexedJob(environment);
  if (kubeflow && environment.count("JOB_COMPLETION_INDEX"))
    WEFT_CHECK(environment.at("JOB_COMPLETION_INDEX") == std::to_string(kubeflow->rank),
               "JOB_COMPLETION_INDEX={} disagrees with PET_NODE_RANK={}", environment.at("JOB_COMPLETION_INDEX"),
               kubeflow->rank);
  checkPmix(environment, mpi, slurm);
  // mpirun or torchrun in a Slurm allocation (or a Kubeflow pod) started this process: the
  // surrounding engine's variables describe the launcher's task, not this process.
  if (mpi) return mpi;
  if (torch && torch->engine == "torchrun") {
    if (kubeflow)
      WEFT_CHECK(torch->node == kubeflow->rank && torch->nodes() == kubeflow->size,
                 "torchrun's GROUP_RANK={} of {} hosts disagrees with Kubeflow's PET_NODE_RANK={} of "
                 "PET_NNODES={}",
                 torch->node, torch->nodes(), kubeflow->rank, kubeflow->size);
    return torch;
  }
  // RANK and WORLD_SIZE set beside another engine's variables (by a script, a PyTorchJob, a
  // manifest) describe the same processes.
  for (const std::optional<EngineView>* other : {&slurm, &kubeflow, &indexed})
    if (torch && other->has_value()) checkAgree(**other, *torch, true);
  if (slurm) {
    // An sbatch script's own process has SLURM_PROCID 0 of the allocation's tasks, but no step.
    WEFT_CHECK(slurm->size == 1 || environment.count("SLURM_STEP_ID"),
               "SLURM_PROCID=0 and SLURM_NTASKS={} without SLURM_STEP_ID: this is the batch script's own process, "
               "not one of the job's tasks; start weft with `srun weft ...` in the script",
               slurm->size);
    return slurm;
  }
  if (kubeflow) return kubeflow;
  if (indexed) return indexed;
  return torch;
}

}  // namespace

std::optional<EngineView> detectEngine(const Environment& environment) {
  if (environment.count("WEFT_COORDINATOR")) return std::nullopt;  // weft's own launcher started it
  std::optional<EngineView> view = chooseEngine(environment);
  if (view) applyRendezvousOverride(environment, *view);
  return view;
}

EngineLayout layoutEngineJob(const EngineView& view, int serversPerHost, const std::string& selfAddress) {
  WEFT_CHECK(serversPerHost >= 0, "--servers-per-host {} is negative", serversPerHost);
  nlohmann::json hosts = nlohmann::json::array();
  for (int h = 0; h < view.nodes(); ++h) {
    const int tasks = view.tasksPerNode[static_cast<size_t>(h)];
    WEFT_CHECK(tasks > serversPerHost,
               "host {} of the {} job runs {} process{}, and --servers-per-host {} would leave it no worker", h,
               view.engine, tasks, tasks == 1 ? "" : "es", serversPerHost);
    const std::string address = h == view.node                               ? selfAddress
                                : static_cast<size_t>(h) < view.hosts.size() ? view.hosts[static_cast<size_t>(h)]
                                                                             : fmt::format("engine-host-{}", h);
    hosts.push_back({{"address", address}, {"cpu_workers", tasks - serversPerHost}, {"servers", serversPerHost}});
  }
  const bool oneHost = view.nodes() == 1;
  const nlohmann::json spec{{"hosts", hosts},
                            {"bind", oneHost ? "127.0.0.1" : "0.0.0.0"},
                            {"coordinator_port", oneHost ? 0 : view.coordinatorPort}};
  EngineLayout layout{ResourceSpec::parse(spec.dump(), fmt::format("the {} job", view.engine)), {}};
  layout.self = view.localRank < serversPerHost ? MemberId{Role::Server, view.node, view.localRank}
                                                : MemberId{Role::Worker, view.node, view.localRank - serversPerHost};
  return layout;
}

std::string describeEngineProcess(const EngineView& view, const EngineLayout& layout) {
  const std::string hostName = static_cast<size_t>(view.node) < view.hosts.size()
                                   ? fmt::format(" ({})", view.hosts[static_cast<size_t>(view.node)])
                                   : "";
  return fmt::format("{}: rank {} of {}, host {} of {}{}, local rank {} of {}: {}", view.engine, view.rank, view.size,
                     view.node, view.nodes(), hostName, view.localRank, view.localSize(), describe(layout.self));
}

}  // namespace weft::dist
