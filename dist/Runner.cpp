// get_runner and the Runner (see the header).
#include "dist/Runner.h"

#include "core/Error.h"
#include "dist/UcxTransport.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace weft::dist {

namespace {

/// Tag of the message a worker sends each server when it leaves (far above the ring's tags).
constexpr uint64_t kGoodbyeTag = uint64_t{1} << 63;

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
  std::unique_ptr<Ring> ring;
  std::unique_ptr<Communicator> communicator;
  std::vector<int> serverPeers;
  std::unique_ptr<Session> session;
  DistributedGraph distribution;
  Traffic trafficAtLeave;  // the communicator's counts, kept once it is gone
  int rank = 0;
  int workers = 1;
  std::chrono::milliseconds timeout{0};

  ~State() {
    if (!communicator) return;
    try {
      leave();
    } catch (const std::exception& e) {
      std::cerr << fmt::format("weft: worker rank {} could not leave the job cleanly: {}\n", rank, e.what());
    }
  }

  /// Waits until every worker is done with the ring, says goodbye to the servers, and closes.
  void leave() {
    // Reset first: whatever happens below, this worker is no longer in the job.
    std::unique_ptr<Communicator> last = std::move(communicator);
    last->run({}, [](Ring& r, std::vector<uint8_t>&) { r.allGatherSizes(0); }, TrafficKind::Control);
    trafficAtLeave = last->traffic();
    last.reset();
    const Deadline deadline = Clock::now() + timeout;
    const uint8_t goodbye = 1;
    for (int peer : serverPeers)
      transport->send(peer, kGoodbyeTag | static_cast<uint64_t>(rank), {&goodbye, 1}, deadline);
    transport->closeAll(deadline);
  }
};

Runner::Runner(std::unique_ptr<State> state) : state_(std::move(state)) {}
Runner::Runner(Runner&&) noexcept = default;
Runner& Runner::operator=(Runner&&) noexcept = default;
Runner::~Runner() = default;

std::vector<Tensor> Runner::run(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets) {
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

int Runner::rank() const { return state_->rank; }
int Runner::workers() const { return state_->workers; }
Session& Runner::session() { return *state_->session; }
const DistributedGraph& Runner::distribution() const { return state_->distribution; }
Traffic Runner::traffic() const {
  return state_->communicator ? state_->communicator->traffic() : state_->trafficAtLeave;
}

namespace {

/// Copies worker rank 0's value of every variable to this worker, in one broadcast.
void broadcastVariables(Session& session, Communicator& communicator) {
  std::vector<Node*> variables = session.graph().variables();
  size_t total = 0;
  for (Node* v : variables) total += session.variable(v).bytes();
  std::vector<uint8_t> buffer(total);
  size_t offset = 0;
  for (Node* v : variables) {
    const Tensor& t = session.variable(v);
    std::memcpy(buffer.data() + offset, t.raw(), t.bytes());
    offset += t.bytes();
  }
  buffer = communicator.run(std::move(buffer), [](Ring& r, std::vector<uint8_t>& b) { r.broadcast(b, 0); },
                            TrafficKind::Control);
  offset = 0;
  for (Node* v : variables) {
    Tensor& t = session.variable(v);
    std::memcpy(t.raw(), buffer.data() + offset, t.bytes());
    offset += t.bytes();
  }
}

/// A server's life under the AllReduce architecture: it holds nothing, and waits for every
/// worker's goodbye (or the failure of one) before it exits.
[[noreturn]] void serve(UcxTransport& transport, const Roster& roster, const std::vector<int>& workerPeers) {
  const MemberId& me = roster.members[static_cast<size_t>(roster.rank)].id;
  try {
    for (size_t w = 0; w < workerPeers.size(); ++w) {
      uint8_t goodbye = 0;
      // No deadline: a job runs as long as it trains; a dead worker is reported by UCX.
      transport.receive(kGoodbyeTag | w, {&goodbye, 1}, Clock::now() + std::chrono::hours(24 * 365),
                        workerPeers[w]);
    }
    transport.closeAll(Clock::now() + std::chrono::seconds(5));
  } catch (const std::exception& e) {
    std::cerr << fmt::format("weft: {} stops: {}\n", describe(me), e.what());
    std::_Exit(1);
  }
  std::exit(0);
}

}  // namespace

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
  WEFT_CHECK(config.architecture == Architecture::AllReduce,
             "architecture '{}' needs parameter servers, which this build does not have yet: use ar",
             architectureName(config.architecture));

  state->transport = std::make_unique<UcxTransport>();
  JoinRequest request{identity->id, state->transport->address(), {}};
  const Roster roster = rendezvous(identity->coordinatorHost, identity->coordinatorPort, identity->secret,
                                   identity->job, request, config.timeout);
  std::vector<int> workerPeers, serverPeers;
  for (const Member& m : roster.members) {
    const int peer = m.rank == roster.rank ? -1 : state->transport->connect(m.address);
    (m.id.role == Role::Worker ? workerPeers : serverPeers).push_back(peer);
  }
  if (identity->id.role == Role::Server) serve(*state->transport, roster, workerPeers);

  state->rank = roster.rank;
  state->workers = static_cast<int>(workerPeers.size());
  state->serverPeers = serverPeers;
  state->ring = std::make_unique<Ring>(*state->transport, state->rank, workerPeers, config.timeout);
  state->communicator = std::make_unique<Communicator>(*state->ring);

  TransformOptions options;
  options.communicator = state->communicator->id();
  options.workers = state->workers;
  options.averageDense = config.averageDense;
  options.averageSparse = config.averageSparse;
  options.bucketBytes = config.bucketBytes;
  state->distribution = distributeAllReduce(graph, options);
  state->session = std::make_unique<Session>(graph, config.session);
  broadcastVariables(*state->session, *state->communicator);
  return Runner(std::move(state));
}

}  // namespace weft::dist
