// Joining a job (see the header).
#include "dist/launch/Job.h"

#include "core/Error.h"
#include "dist/collective/Nccl.h"
#include "dist/launch/EngineJob.h"
#include "dist/launch/Launcher.h"
#include "dist/launch/Liveness.h"
#include "dist/launch/Preemption.h"
#include "dist/transport/UcxTransport.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>

namespace weft::dist {

namespace {

std::string requiredVariable(const char* name) {
  const char* value = std::getenv(name);
  WEFT_CHECK(value != nullptr && *value, "{} is not set: the launcher sets it for every process of a job", name);
  return value;
}

int intVariable(const char* name);

/// The secret the launcher left in an inherited descriptor (a sealed memfd): read from its
/// start, so every read gets it whole.
Secret secretFromDescriptor(const char* name) {
  const int fd = intVariable(name);
  char text[2 * kSecretBytes + 1] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  WEFT_CHECK(n >= 0, "{}={}: cannot read the job secret from descriptor {}: {}", name, fd, fd, std::strerror(errno));
  return secretFromHex(std::string(text, static_cast<size_t>(n)), name);
}

int intVariable(const char* name) {
  const std::string text = requiredVariable(name);
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  WEFT_CHECK(*end == '\0' && v >= 0 && v < (1 << 20), "{}='{}' is not a valid index", name, text);
  return static_cast<int>(v);
}

/// Who reaches the servers together: with local aggregation, the workers of a machine that runs
/// a server and more than one worker go through its first server; every other worker alone.
SenderGroups senderGroups(const Roster& roster, bool localAggregation) {
  std::map<int, std::vector<int>> workersOf;  // by host; ranks ascending
  std::map<int, int> firstServerOf;
  int servers = 0;
  for (const Member& m : roster.members) {
    if (m.id.role == Role::Worker) {
      workersOf[m.id.host].push_back(m.rank);
    } else {
      firstServerOf.emplace(m.id.host, servers++);
    }
  }
  SenderGroups g;
  for (const auto& [host, ranks] : workersOf) {
    const auto server = firstServerOf.find(host);
    const bool together = localAggregation && ranks.size() > 1 && server != firstServerOf.end();
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (together && i > 0) {
        g.members.back().push_back(ranks[i]);
      } else {
        g.members.push_back({ranks[i]});
        g.relay.push_back(together ? server->second : -1);
      }
    }
  }
  g.groupOfWorker.resize(
      static_cast<size_t>(std::accumulate(g.members.begin(), g.members.end(), size_t{0},
                                          [](size_t n, const std::vector<int>& m) { return n + m.size(); })));
  for (int group = 0; group < g.groups(); ++group)
    for (int w : g.members[static_cast<size_t>(group)]) g.groupOfWorker.at(static_cast<size_t>(w)) = group;
  return g;
}

/// Whether the job's workers are GPUs; throws when it mixes GPU and CPU workers, or lists GPUs
/// to a build without NCCL.
bool requireOneKindOfWorker(const std::vector<WorkerSlot>& slots) {
  const auto onGpu = [](const WorkerSlot& w) { return w.device != "cpu"; };
  if (std::none_of(slots.begin(), slots.end(), onGpu)) return false;
  const auto cpuWorker = std::find_if_not(slots.begin(), slots.end(), onGpu);
  WEFT_CHECK(cpuWorker == slots.end(),
             "the resource specification has GPU workers and CPU workers (host {} lists cpu_workers): the workers "
             "of one job are all GPUs, summing through NCCL, or all CPUs, summing through the UCX ring",
             cpuWorker == slots.end() ? -1 : cpuWorker->host);
  WEFT_CHECK(kNcclBuilt,
             "the resource specification lists GPU workers, but this weft was built without NCCL, which GPU workers "
             "sum their gradients through (install NCCL, or set WEFT_NCCL_ROOT to it, and rebuild)");
  return true;
}

/// A member's transports: 0 reaches the other workers (a server's only one), 1 is a worker's
/// client of the servers.
constexpr uint8_t kPeersChannel = 0, kClientChannel = 1;

EndpointName nameOf(const MemberId& id, uint8_t channel) {
  return endpointName(static_cast<uint8_t>(id.role), id.host, id.slot, channel);
}

/// Connects to the members this process talks to: a server reaches every worker's client
/// transport and every other server; a worker reaches the other workers through its transport
/// and the servers through its client's.
PeerRoutes connectPeers(JobContext& job) {
  PeerRoutes routes;
  const bool isServer = job.isServer();
  for (const Member& m : job.roster.members) {
    const bool toWorker = m.id.role == Role::Worker;
    const bool self = m.rank == job.roster.rank;  // ranks count the workers, then the servers
    int peer = -1;
    if (!self && isServer) {
      WEFT_CHECK(!toWorker || !m.clientAddress.empty(),
                 "{} joined without an address for server requests (its resource specification lists no servers)",
                 describe(m.id));
      peer = job.transport->connect(toWorker ? m.clientAddress : m.address,
                                    nameOf(m.id, toWorker ? kClientChannel : kPeersChannel));
    } else if (!self && toWorker) {
      peer = job.transport->connect(m.address, nameOf(m.id, kPeersChannel));
    } else if (!self) {
      WEFT_CHECK(job.clientTransport != nullptr,
                 "the roster lists {}, but this worker's resource specification lists no servers", describe(m.id));
      peer = job.clientTransport->connect(m.address, nameOf(m.id, kPeersChannel));
    }
    if (self && isServer) routes.self = static_cast<int>(routes.serverPeers.size());
    (toWorker ? routes.workerPeers : routes.serverPeers).push_back(peer);
    (toWorker ? routes.workerHosts : routes.serverHosts).push_back(m.id.host);
  }
  return routes;
}

/// The numeric addresses `address` (a name or a number) stands for.
std::vector<std::string> numericAddresses(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(address.c_str(), nullptr, &hints, &list);
  WEFT_CHECK(rc == 0, "cannot resolve host address '{}': {}", address, gai_strerror(rc));
  std::vector<std::string> out;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0)
      out.push_back(text);
  }
  ::freeaddrinfo(list);
  return out;
}

}  // namespace

std::string listeningDevice(const ResourceSpec& resources, int host) {
  WEFT_CHECK(host >= 0 && static_cast<size_t>(host) < resources.hosts().size(),
             "host {} is not in the resource specification ({} hosts)", host, resources.hosts().size());
  const std::string& address = resources.hosts()[static_cast<size_t>(host)].address;
  const std::vector<std::string> wanted = numericAddresses(address);
  ifaddrs* interfaces = nullptr;
  WEFT_CHECK(::getifaddrs(&interfaces) == 0, "cannot list this machine's network interfaces");
  std::string found, seen;
  for (const ifaddrs* i = interfaces; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    const socklen_t length = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char text[NI_MAXHOST];
    if (::getnameinfo(i->ifa_addr, length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string numeric = text;
    numeric = numeric.substr(0, numeric.find('%'));  // an IPv6 link-local address's scope
    seen += fmt::format("{}{} ({})", seen.empty() ? "" : ", ", i->ifa_name, numeric);
    if (std::find(wanted.begin(), wanted.end(), numeric) != wanted.end()) found = i->ifa_name;
  }
  ::freeifaddrs(interfaces);
  WEFT_CHECK(!found.empty(),
             "host {}'s address in the resource specification, '{}', is on none of this machine's interfaces ({}): "
             "its processes would not know where to listen (set UCX_NET_DEVICES to choose yourself)",
             host, address, seen);
  return found;
}

namespace {

/// With WEFT_ADDRESS_BOOK set, appends "ROLE HOST SLOT CHANNEL HEX-ADDRESS" for a transport to
/// that file: a diagnostic for testing a job's defences from outside. Transport addresses are no
/// secret (anyone who can reach a port can derive one); only the job secret admits.
void publishAddress(const MemberId& id, uint8_t channel, const std::vector<uint8_t>& address) {
  const char* book = std::getenv("WEFT_ADDRESS_BOOK");
  if (book == nullptr || !*book) return;
  const std::string line = fmt::format("{} {} {} {} {}\n", id.role == Role::Worker ? "worker" : "server", id.host,
                                       id.slot, channel, toHex(address));
  const int fd = ::open(book, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  WEFT_CHECK(fd >= 0, "WEFT_ADDRESS_BOOK: cannot open '{}': {}", book, std::strerror(errno));
  const ssize_t written = ::write(fd, line.data(), line.size());  // one append: lines never interleave
  ::close(fd);
  WEFT_CHECK(written == static_cast<ssize_t>(line.size()), "WEFT_ADDRESS_BOOK: cannot write '{}'", book);
}

}  // namespace

uint64_t payloadLimit(const Graph& graph) {
  uint64_t state = 0;
  for (const Node* v : graph.variables()) {
    const TensorType& type = v->outputs[0];
    state += static_cast<uint64_t>(type.shape.numel()) * dtypeSize(type.dtype);
  }
  return 2 * state + (uint64_t{1} << 20);
}

std::optional<LaunchIdentity> launchIdentityFromEnvironment() {
  const char* coordinator = std::getenv("WEFT_COORDINATOR");
  if (coordinator == nullptr || !*coordinator) return std::nullopt;
  LaunchIdentity identity;
  const std::string address = coordinator;
  const size_t colon = address.rfind(':');
  WEFT_CHECK(colon != std::string::npos && colon > 0, "WEFT_COORDINATOR='{}' is not host:port", address);
  identity.coordinatorHost = address.substr(0, colon);
  char* end = nullptr;
  const long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  WEFT_CHECK(*end == '\0' && port > 0 && port < 65536, "WEFT_COORDINATOR='{}' has no valid port", address);
  identity.coordinatorPort = static_cast<uint16_t>(port);
  const std::string role = requiredVariable("WEFT_ROLE");
  WEFT_CHECK(role == "worker" || role == "server", "WEFT_ROLE='{}' is neither worker nor server", role);
  identity.id.role = role == "worker" ? Role::Worker : Role::Server;
  identity.id.host = intVariable("WEFT_HOST");
  identity.id.slot = intVariable("WEFT_SLOT");
  identity.job = jobIdFromHex(requiredVariable("WEFT_JOB_ID"), "WEFT_JOB_ID");
  const char* secretFd = std::getenv("WEFT_JOB_SECRET_FD");
  const char* secretFile = std::getenv("WEFT_JOB_SECRET_FILE");
  identity.secret = secretFd && *secretFd           ? secretFromDescriptor("WEFT_JOB_SECRET_FD")
                    : secretFile && *secretFile ? loadSecret(secretFile)
                                                : secretFromEnvironment();
  return identity;
}

std::string processDevice(const ResourceSpec& resources) {
  const std::vector<WorkerSlot> slots = resources.workers();
  const std::optional<LaunchIdentity> identity = launchIdentityFromEnvironment();
  if (!identity) return slots.size() == 1 ? slots[0].device : "cpu";
  if (identity->id.role != Role::Worker) return "cpu";
  for (const WorkerSlot& w : slots)
    if (w.host == identity->id.host && w.slot == identity->id.slot) return w.device;
  WEFT_THROW("this process is {}, which the resource specification does not list", describe(identity->id));
}

int JobContext::relay() const {
  return groups.relay[static_cast<size_t>(groups.groupOfWorker[static_cast<size_t>(rank())])];
}

EndpointName JobContext::workerEndpoint(int rank, uint8_t channel) const {
  for (const Member& m : roster.members)
    if (m.id.role == Role::Worker && m.rank == rank) return nameOf(m.id, channel);
  WEFT_THROW("the roster of {} members lists no worker of rank {}", roster.members.size(), rank);
}

std::optional<JobContext> joinJob(const ResourceSpec& resources, const Config& config) {
  std::optional<LaunchIdentity> identity = launchIdentityFromEnvironment();
  if (!identity) return std::nullopt;
  JobContext job;
  job.identity = std::move(*identity);
  const std::vector<WorkerSlot> slots = resources.workers();
  job.gpuWorkers = requireOneKindOfWorker(slots);
  job.device = Device::parse(processDevice(resources));
  if (job.device.type == DeviceType::CUDA) {
    const int gpus = cudaDeviceCount();
    WEFT_CHECK(job.device.index < gpus, "{} is to compute on {}, which this machine lacks: {}",
               describe(job.identity.id), job.device.str(),
               gpus > 0 ? fmt::format("it has {} GPU(s)", gpus) : cudaUnavailableReason());
  }
  markMainThread();
  UcxIdentity ucx{job.identity.secret, job.identity.job, nameOf(job.identity.id, kPeersChannel),
                  listeningDevice(resources, job.identity.id.host), resources.encrypt() || config.encrypt};
  job.transport = watchWaits(std::make_unique<UcxTransport>(ucx));
  JoinRequest request{job.identity.id, job.transport->address(), {}, {}};
  publishAddress(job.identity.id, kPeersChannel, request.address);
#ifdef WEFT_HAVE_NCCL
  if (job.gpuWorkers && job.identity.id == MemberId{Role::Worker, slots[0].host, slots[0].slot})
    request.ncclId = newNcclId();
#endif
  if (!job.isServer() && resources.serverCount() > 0) {
    ucx.self = nameOf(job.identity.id, kClientChannel);
    job.clientTransport = watchWaits(std::make_unique<UcxTransport>(ucx));
    request.clientAddress = job.clientTransport->address();
    publishAddress(job.identity.id, kClientChannel, request.clientAddress);
  }
  // A member waits past the coordinator's own deadline, so that a member that never came is
  // reported by the coordinator's ABORT, which names it, not by every member's silent timeout.
  const auto joinTimeout = std::max(config.timeout, kRendezvousTimeout + std::chrono::seconds(15));
  // A member whose coordinator connection closes has lost its launcher (ended or killed): it
  // stops at once rather than train on unsupervised.
  HeartbeatOptions heartbeat;
  heartbeat.sample = sampleMainThread;
  // Under an engine, a member that fails waits a moment for the verdict of its job's first
  // process: when another member's end caused the failure, it names that one and exits 75.
  if (startedByEngine()) heartbeat.verdictWait = std::chrono::seconds(5);
  heartbeat.onLost = [who = describe(job.identity.id), engine = startedByEngine()](const std::string& reason) {
    if (engine) {
      // The engine sees only exit statuses: this one says that another member failed.
      std::cerr << fmt::format("weft: {} stops: {}\n", who, reason) << std::flush;
      std::_Exit(kExitPeerFailed);
    }
    std::cerr << fmt::format("weft: {} lost its launcher ({}); stopping\n", who, reason) << std::flush;
    std::_Exit(1);
  };
  heartbeat.onCheckpoint = requestCheckpoint;
  job.roster = rendezvous(job.identity.coordinatorHost, job.identity.coordinatorPort, job.identity.secret,
                          job.identity.job, request, joinTimeout, std::move(heartbeat), startedByEngine());
  // From here on only the roster's members are heard: a stranger's messages cost no key.
  std::vector<EndpointName> members;
  for (const Member& m : job.roster.members)
    for (const uint8_t channel : {kPeersChannel, kClientChannel}) members.push_back(nameOf(m.id, channel));
  job.transport->acceptOnly(members);
  if (job.clientTransport) job.clientTransport->acceptOnly(members);
  job.openTransport = [ucx, id = job.identity.id, roster = job.roster.members](uint8_t channel) {
    WEFT_CHECK(channel > kClientChannel, "transport channel {} is taken: 0 and 1 are every member's own", channel);
    UcxIdentity identity = ucx;
    identity.self = nameOf(id, channel);
    // Not watchWaits: its waits are another thread's, not the main thread's.
    std::unique_ptr<Transport> transport = std::make_unique<UcxTransport>(identity);
    std::vector<EndpointName> members;
    for (const Member& m : roster) members.push_back(nameOf(m.id, channel));
    transport->acceptOnly(members);
    publishAddress(id, channel, transport->address());
    return transport;
  };
  connectJob(job, config);
  return job;
}

void limitPayloads(JobContext& job, const Graph& graph) {
  const uint64_t limit = payloadLimit(graph);
  job.transport->limitPayloads(limit);
  if (job.clientTransport) job.clientTransport->limitPayloads(limit);
}

void connectJob(JobContext& job, const Config& config) {
  job.routes = connectPeers(job);
  // Under the asynchronous modes a machine's workers are at different clocks: none is summed.
  job.groups = config.pipeline.stages > 1
                   ? SenderGroups::pipelineReplicas(job.workers(), config.pipeline.stages)
                   : senderGroups(job.roster, config.localAggregation && config.sync->synchronous());
}

void JobContext::leave() {
  if (roster.heartbeat) roster.heartbeat->leave();
  noteProcessLeft();
}

int JobContext::machines() const {
  int highest = 0;
  for (const std::vector<int>* hosts : {&routes.workerHosts, &routes.serverHosts})
    for (const int h : *hosts) highest = std::max(highest, h);
  return highest + 1;
}

}  // namespace weft::dist
