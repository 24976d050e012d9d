// get_runner and the Runner (see the header).
#include "dist/Runner.h"

#include "core/Error.h"
#include "dist/Launcher.h"
#include "dist/Nccl.h"
#include "dist/ParameterServer.h"
#include "dist/ServerClient.h"
#include "dist/UcxTransport.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <set>

namespace weft::dist {

namespace {

std::string requiredVariable(const char* name) {
  const char* value = std::getenv(name);
  WEFT_CHECK(value != nullptr && *value, "{} is not set: the launcher sets it for every process of a job", name);
  return value;
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
  g.groupOfWorker.resize(static_cast<size_t>(std::accumulate(
      g.members.begin(), g.members.end(), size_t{0}, [](size_t n, const std::vector<int>& m) { return n + m.size(); })));
  for (int group = 0; group < g.groups(); ++group)
    for (int w : g.members[static_cast<size_t>(group)]) g.groupOfWorker.at(static_cast<size_t>(w)) = group;
  return g;
}

void printServerTraffic(const std::string& who, const ServerTraffic& t) {
  if (t.steps == 0) return;  // it holds nothing and aggregates for no machine
  const double steps = static_cast<double>(t.steps);
  std::string text = fmt::format("communication of {}: per step {:.0f} bytes sent to other machines, {:.0f} received "
                                 "from them (pushes and pulls over {} steps)\n",
                                 who, static_cast<double>(t.sent) / steps, static_cast<double>(t.received) / steps, t.steps);
  for (const auto& [name, rows] : t.aggregatedRows) {
    // Each worker sends its distinct rows, so the rows that reach the aggregator add up the
    // workers' own alphas.
    text += fmt::format("local aggregation of {} by {}: alpha {:.5f} (distinct rows per step / {} rows), its "
                        "workers' alphas add up to {:.5f}\n",
                        name, who, rows.alpha(), rows.rows, rows.lookupFraction());
  }
  std::cout << text << std::flush;
}

}  // namespace

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
  const char* secretFile = std::getenv("WEFT_JOB_SECRET_FILE");
  identity.secret = secretFile && *secretFile ? loadSecret(secretFile) : secretFromEnvironment();
  return identity;
}

struct Runner::State {
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<UcxTransport> clientTransport;  // a worker's requests to the servers
  std::unique_ptr<Ring> ring;
  std::unique_ptr<Communicator> communicator;
#ifdef WEFT_HAVE_NCCL
  std::unique_ptr<NcclGroup> nccl;  // GPU workers' dense sums
#endif
  ServerPlan plan;
  std::unique_ptr<ServerClient> client;  // with servers in the job
  std::unique_ptr<Session> session;
  DistributedGraph distribution;
  Traffic trafficAtLeave;  // the communicator's counts, kept once it is gone
  int rank = 0;
  int workers = 1;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Heartbeat> heartbeat;  // tells the launcher this process is alive

  ~State() {
    if (!communicator) return;
    try {
      leave();
    } catch (const std::exception& e) {
      std::cerr << fmt::format("weft: worker rank {} could not leave the job cleanly: {}\n", rank, e.what());
    }
  }

  void barrier() {
    communicator->run({}, [](Ring& r, std::vector<uint8_t>&) { r.allGatherSizes(0); }, TrafficKind::Control);
  }

  /// The served variable of partition `p`, and its slots: what LOAD carries and FETCH returns.
  std::vector<Tensor*> stateOf(const ServedVariable& v) {
    std::vector<Tensor*> out{&session->variable(v.variable)};
    for (Node* s : v.slots) out.push_back(&session->variable(s));
    return out;
  }

  /// Every served variable's state on the host, indexed like plan.variables: the session's own
  /// tensors when they live there, else copies (`fill`: of their values; else uninitialised).
  std::vector<std::vector<Tensor>> hostStates(bool fill) {
    std::vector<std::vector<Tensor>> states;
    for (const ServedVariable& v : plan.variables) {
      std::vector<Tensor> state;
      for (Tensor* t : stateOf(v)) {
        const bool onHost = t->device().type == DeviceType::CPU;
        state.push_back(onHost || fill ? t->to(cpu()) : Tensor(t->dtype(), t->shape(), cpu()));
      }
      states.push_back(std::move(state));
    }
    return states;
  }

  void pullVariables() {
    std::vector<ServerClient::Call> calls;
    for (size_t p = 0; p < plan.partitions.size(); ++p) calls.push_back({static_cast<int>(p), RequestKind::Fetch, {}});
    const std::vector<std::vector<uint8_t>> replies = client->request(std::move(calls), TrafficKind::Control);
    // The partitions of a variable cover all its rows: every byte of the host copies is written.
    std::vector<std::vector<Tensor>> states = hostStates(false);
    for (size_t p = 0; p < plan.partitions.size(); ++p) {
      const Partition& part = plan.partitions[p];
      std::vector<Tensor>& tensors = states[static_cast<size_t>(part.variable)];
      WEFT_CHECK(replies[p].size() == part.bytes * tensors.size(), "FETCH of partition {} returned {} bytes, expected {}", p,
                 replies[p].size(), part.bytes * tensors.size());
      const size_t rowBytes = plan.variables[static_cast<size_t>(part.variable)].rowBytes();
      for (size_t i = 0; i < tensors.size(); ++i)
        unpackRows(part, rowBytes, replies[p].data() + i * part.bytes, static_cast<uint8_t*>(tensors[i].raw()));
    }
    for (size_t v = 0; v < plan.variables.size(); ++v) {
      const std::vector<Tensor*> live = stateOf(plan.variables[v]);
      for (size_t i = 0; i < live.size(); ++i)
        if (live[i]->raw() != states[v][i].raw()) live[i]->copyFrom(states[v][i]);
    }
    client->setLocalCopyCurrent(true);
  }

  void publishVariables() {
    if (rank == 0) {
      std::vector<ServerClient::Call> calls;
      const std::vector<std::vector<Tensor>> states = hostStates(true);
      for (size_t p = 0; p < plan.partitions.size(); ++p) {
        const Partition& part = plan.partitions[p];
        const ServedVariable& v = plan.variables[static_cast<size_t>(part.variable)];
        const std::vector<Tensor>& tensors = states[static_cast<size_t>(part.variable)];
        std::vector<uint8_t> payload(part.bytes * tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i)
          packRows(part, v.rowBytes(), static_cast<const uint8_t*>(tensors[i].raw()), payload.data() + i * part.bytes);
        calls.push_back({static_cast<int>(p), RequestKind::Load, std::move(payload)});
      }
      client->request(std::move(calls), TrafficKind::Control);
    }
    barrier();  // no worker pulls before the servers hold worker 0's values
  }

  /// Waits until every worker is done with its steps, takes the served variables' final values,
  /// says goodbye to the servers, and closes.
  void leave() {
    barrier();
    if (client) {
      if (!plan.empty()) pullVariables();
      client->goodbye();
    }
#ifdef WEFT_HAVE_NCCL
    nccl.reset();  // after the barrier: every GPU worker closes the communicator together
#endif
    trafficAtLeave = communicator->traffic();
    // Reset first: whatever happens below, this worker is no longer in the job.
    client.reset();
    communicator.reset();
    const Deadline deadline = Clock::now() + timeout;
    transport->closeAll(deadline);
    if (clientTransport) clientTransport->closeAll(deadline);
  }
};

Runner::Runner(std::unique_ptr<State> state) : state_(std::move(state)) {}
Runner::Runner(Runner&&) noexcept = default;
Runner& Runner::operator=(Runner&&) noexcept = default;
Runner::~Runner() = default;

std::vector<Tensor> Runner::run(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets) {
  // Steps that make no server request (all of them under `ar`) still answer the servers'
  // connection setup to the client's transport.
  if (state_->clientTransport) state_->clientTransport->progress();
#ifdef WEFT_HAVE_NCCL
  if (state_->nccl) {
    try {
      std::vector<Tensor> out = state_->session->run(fetches, feeds, targets);
      // A sum the watchdog aborted leaves the GPU's results of this step unfinished: say why.
      state_->nccl->throwIfFailed();
      return out;
    } catch (const std::exception& e) {
      // A step that stopped between a sum's Start and its Wait has left this worker's sums out
      // of step with the other workers': no later sum could match theirs.
      state_->nccl->abort(fmt::format("a step failed on this worker ({})", e.what()));
      throw;
    }
  }
#endif
  return state_->session->run(fetches, feeds, targets);
}

double Runner::meanOverWorkers(double value) {
  if (!state_->communicator) return value;
  std::vector<uint8_t> bytes(sizeof value);
  std::memcpy(bytes.data(), &value, sizeof value);
  bytes = state_->communicator->run(
      std::move(bytes), [](Ring& r, std::vector<uint8_t>& b) { r.allReduceSum(DType::F64, b.data(), 1); },
      TrafficKind::Control);
  std::memcpy(&value, bytes.data(), sizeof value);
  return value / state_->workers;
}

void Runner::finish() {
  if (state_->communicator) state_->leave();
}

void Runner::pullVariables() {
  if (state_->client && !state_->plan.empty()) state_->pullVariables();
}

void Runner::publishVariables() {
  if (state_->client && !state_->plan.empty()) state_->publishVariables();
}

int Runner::rank() const { return state_->rank; }
int Runner::workers() const { return state_->workers; }
Session& Runner::session() { return *state_->session; }
const DistributedGraph& Runner::distribution() const { return state_->distribution; }
Traffic Runner::traffic() const {
  return state_->communicator ? state_->communicator->traffic() : state_->trafficAtLeave;
}

namespace {

/// Copies worker rank 0's value of every variable the workers keep to this worker, in one
/// broadcast. The servers' variables and slots are not sent: worker 0 loads them into the
/// servers, and a worker reads them from there until it pulls them all.
void broadcastVariables(Session& session, Communicator& communicator, const ServerPlan& plan) {
  std::set<const Node*> served;
  for (const ServedVariable& v : plan.variables) {
    served.insert(v.variable);
    served.insert(v.slots.begin(), v.slots.end());
  }
  std::vector<Node*> variables;
  for (Node* v : session.graph().variables())
    if (!served.count(v)) variables.push_back(v);
  size_t total = 0;
  for (Node* v : variables) total += session.variable(v).bytes();
  std::vector<uint8_t> buffer(total);
  size_t offset = 0;
  for (Node* v : variables) {
    const Tensor t = session.variable(v).to(cpu());
    std::memcpy(buffer.data() + offset, t.raw(), t.bytes());
    offset += t.bytes();
  }
  buffer = communicator.run(std::move(buffer), [](Ring& r, std::vector<uint8_t>& b) { r.broadcast(b, 0); },
                            TrafficKind::Control);
  offset = 0;
  for (Node* v : variables) {
    Tensor& t = session.variable(v);
    Tensor host = t.to(cpu());
    std::memcpy(host.raw(), buffer.data() + offset, t.bytes());
    if (host.raw() != t.raw()) t.copyFrom(host);
    offset += t.bytes();
  }
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

}  // namespace

std::string processDevice(const ResourceSpec& resources) {
  const std::vector<WorkerSlot> slots = resources.workers();
  const std::optional<LaunchIdentity> identity = launchIdentityFromEnvironment();
  if (!identity) return slots.size() == 1 ? slots[0].device : "cpu";
  if (identity->id.role != Role::Worker) return "cpu";
  for (const WorkerSlot& w : slots)
    if (w.host == identity->id.host && w.slot == identity->id.slot) return w.device;
  WEFT_THROW("this process is {}, which the resource specification does not list", describe(identity->id));
}

Runner get_runner(Graph& graph, const ResourceSpec& resources, const Config& config) {
  auto state = std::make_unique<Runner::State>();
  state->timeout = config.timeout;
  const std::optional<LaunchIdentity> identity = launchIdentityFromEnvironment();
  if (!identity) {
    const size_t workers = resources.workers().size();
    WEFT_CHECK(workers == 1,
               "the resource specification has {} workers, but this process was not started by the launcher "
               "(WEFT_COORDINATOR is unset): run it with `weft launch`",
               workers);
    state->session = std::make_unique<Session>(graph, config.session);
    return Runner(std::move(state));
  }
  for (const auto& n : graph.nodes()) {
    WEFT_CHECK(!n->condition.valid(),
               "{} runs only when {} holds; distributed training does not run conditional updates (such as a loss "
               "scale's skipped steps) yet",
               n->describe(), n->condition.name());
  }
  const std::vector<WorkerSlot> slots = resources.workers();
  [[maybe_unused]] const bool gpuWorkers = requireOneKindOfWorker(slots);
  const Device own = Device::parse(processDevice(resources));
  if (own.type == DeviceType::CUDA) {
    const int gpus = cudaDeviceCount();
    WEFT_CHECK(own.index < gpus, "{} is to compute on {}, which this machine lacks: {}", describe(identity->id),
               own.str(), gpus > 0 ? fmt::format("it has {} GPU(s)", gpus) : cudaUnavailableReason());
  }
  state->transport = std::make_unique<UcxTransport>();
  JoinRequest request{identity->id, state->transport->address(), {}, {}};
#ifdef WEFT_HAVE_NCCL
  if (gpuWorkers && identity->id == MemberId{Role::Worker, slots[0].host, slots[0].slot}) request.ncclId = newNcclId();
#endif
  if (identity->id.role == Role::Worker && resources.serverCount() > 0) {
    state->clientTransport = std::make_unique<UcxTransport>();
    request.clientAddress = state->clientTransport->address();
  }
  // A member waits past the coordinator's own deadline, so that a member that never came is
  // reported by the coordinator's ABORT, which names it, not by every member's silent timeout.
  const auto joinTimeout = std::max(config.timeout, kRendezvousTimeout + std::chrono::seconds(15));
  const Roster roster = rendezvous(identity->coordinatorHost, identity->coordinatorPort, identity->secret,
                                   identity->job, request, joinTimeout);
  ServerRoutes routes;
  // A server reaches a worker's client transport; a worker reaches other workers through its
  // ring's transport and servers through its client's.
  const bool isServer = identity->id.role == Role::Server;
  for (const Member& m : roster.members) {
    const bool toWorker = m.id.role == Role::Worker;
    int peer = -1;
    if (m.rank != roster.rank && isServer) {
      WEFT_CHECK(!toWorker || !m.clientAddress.empty(),
                 "{} joined without an address for server requests (its resource specification lists no servers)",
                 describe(m.id));
      peer = state->transport->connect(toWorker ? m.clientAddress : m.address);
    } else if (m.rank != roster.rank && toWorker) {
      peer = state->transport->connect(m.address);
    } else if (m.rank != roster.rank) {
      WEFT_CHECK(state->clientTransport != nullptr,
                 "the roster lists {}, but this worker's resource specification lists no servers", describe(m.id));
      peer = state->clientTransport->connect(m.address);
    }
    if (m.id.role == Role::Server && m.rank == roster.rank) routes.self = static_cast<int>(routes.serverPeers.size());
    (m.id.role == Role::Worker ? routes.workerPeers : routes.serverPeers).push_back(peer);
    (m.id.role == Role::Worker ? routes.workerHosts : routes.serverHosts).push_back(m.id.host);
  }
  const int workers = static_cast<int>(routes.workerPeers.size()), servers = static_cast<int>(routes.serverPeers.size());
  state->plan = planServers(graph, config.architecture, servers, config.partitionBytes);
  const SenderGroups groups = senderGroups(roster, config.localAggregation);
  if (isServer) {
    const std::string who = describe(identity->id);
    try {
      ParameterServer::Options options;
      options.workers = workers;
      options.denseScale = config.averageDense ? 1.0 / workers : 1.0;
      options.sparseScale = config.averageSparse ? 1.0 / workers : 1.0;
      options.session = config.session;
      options.groups = groups;
      ParameterServer server(state->plan, routes.self, options);
      std::unique_ptr<LocalAggregator> aggregator;
      for (int g = 0; g < groups.groups(); ++g) {
        if (groups.relay[static_cast<size_t>(g)] == routes.self)
          aggregator = std::make_unique<LocalAggregator>(state->plan, groups.members[static_cast<size_t>(g)], servers);
      }
      const ServerTraffic traffic = serve(server, aggregator.get(), *state->transport, routes, who);
      if (config.reportTraffic) printServerTraffic(who, traffic);
    } catch (const std::exception& e) {
      std::cerr << fmt::format("weft: {} stops: {}\n", who, e.what());
      std::_Exit(1);
    }
    state.reset();  // releases UCX before the process ends
    std::exit(0);
  }

  state->rank = roster.rank;
  state->heartbeat = roster.heartbeat;
  state->workers = workers;
  state->timeout = config.timeout;
  state->ring = std::make_unique<Ring>(*state->transport, state->rank, routes.workerPeers, config.timeout);
  state->ring->setMachines(routes.workerHosts, config.localAggregation);
  state->communicator = std::make_unique<Communicator>(*state->ring);
#ifdef WEFT_HAVE_NCCL
  if (gpuWorkers) {
    state->nccl = std::make_unique<NcclGroup>(roster.ncclId, workers, state->rank, own.index,
                                              state->communicator->id(), config.timeout);
  }
#endif

  TransformOptions options;
  options.communicator = state->communicator->id();
  options.workers = state->workers;
  options.averageDense = config.averageDense;
  options.averageSparse = config.averageSparse;
  options.bucketBytes = config.bucketBytes;
  options.gpuCollectives = gpuWorkers;
  for (const ServedVariable& v : state->plan.variables) options.served.push_back(v.variable);
  state->distribution = distributeAllReduce(graph, options);
  if (servers > 0) {
    const int relay = groups.relay[static_cast<size_t>(groups.groupOfWorker[static_cast<size_t>(state->rank)])];
    state->client = std::make_unique<ServerClient>(*state->communicator, *state->clientTransport, state->rank,
                                                   routes.serverPeers, state->plan, config.timeout, relay);
    distributeParameterServers(graph, state->plan, state->client->id());
  }
  if (state->workers > 1) synchronizeBatchNorm(graph, state->communicator->id());
  for (const ServedVariable& v : state->plan.variables)
    state->distribution.variables.push_back({v.variable, v.sparse, static_cast<size_t>(v.rows()) * v.rowBytes(), -1, true});
  SessionOptions session = config.session;
  session.replica = state->rank;  // each worker feeds the rank-th part of the total batch
  state->session = std::make_unique<Session>(graph, session);
  broadcastVariables(*state->session, *state->communicator, state->plan);
  if (!state->plan.empty()) state->publishVariables();
  return Runner(std::move(state));
}

}  // namespace weft::dist
