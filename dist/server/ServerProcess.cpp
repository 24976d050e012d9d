// The server process's loop (see the header).
#include "dist/server/ServerProcess.h"

#include "core/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

namespace weft::dist {

namespace {

/// Moves one server process's messages between the network, its ParameterServer (the owner of
/// partitions) and its LocalAggregator (the machine's workers' sender), counting the pushes and
/// pulls that cross between machines.
class ServerRouter {
 public:
  ServerRouter(ParameterServer& server, LocalAggregator* aggregator, Transport& transport, const PeerRoutes& routes,
               std::chrono::milliseconds timeout)
      : server_(server), aggregator_(aggregator), transport_(transport), routes_(routes), timeout_(timeout),
        groups_(server.groups()), host_(routes.serverHosts.at(static_cast<size_t>(routes.self))) {}

  /// Takes the messages that arrived together in; what they release waits in the outbox. The
  /// requests for this server's own partitions are served together (in parallel across
  /// partitions); a message that is not a valid request or reply is logged, naming `who`, and
  /// releases nothing.
  void handleAll(std::vector<Message> messages, const std::string& who) {
    auto reject = [&](const std::string& why) {
      std::cerr << fmt::format("weft: {} rejected a message: {}\n", who, why);
    };
    std::vector<Message> own;
    for (Message& m : messages) {
      try {
        if (isRequest(m.header) && !fromMember(m)) {
          checkSender(m, decodeRequest(m.header));
          own.push_back(std::move(m));
        } else {
          handle(m);
        }
      } catch (const std::exception& e) {
        reject(e.what());
      }
    }
    ParameterServer::Handled handled = server_.handleAll(own);
    for (const std::string& why : handled.rejected) reject(why);
    for (size_t i = 0; i < own.size(); ++i) {
      const RequestHeader h = decodeRequest(own[i].header);
      if (h.worker < routes_.workerPeers.size())
        count(traffic_.received, senderHost(static_cast<int>(h.worker)), own[i], h.kind);
    }
    for (ParameterServer::Reply& r : handled.replies) route(std::move(r));
  }

  /// Takes one message that is not a request for this server's own partitions (a reply to a
  /// forwarded request, or a request of the machine's workers for its aggregator). Throws,
  /// having released nothing more, when the message is not a valid request or reply.
  void handle(const Message& m) {
    if (!isRequest(m.header)) {
      WEFT_CHECK(aggregator_ != nullptr, "a reply arrived, but this server forwards no requests");
      const auto [server, kind] = aggregator_->destinationOf(decodeReply(m.header).id);
      WEFT_CHECK(m.from == routes_.serverPeers[static_cast<size_t>(server)],
                 "a reply to a request sent to server {} came from another peer ({})", server, m.from);
      count(traffic_.received, routes_.serverHosts[static_cast<size_t>(server)], m, kind);
      deliver(aggregator_->fromServer(m));
      return;
    }
    checkSender(m, decodeRequest(m.header));
    deliver(aggregator_->fromMember(m));
  }

  /// Whether `m` is a request of one of the workers this process's aggregator speaks for.
  bool fromMember(const Message& m) const {
    return aggregator_ != nullptr && aggregator_->isMember(static_cast<int>(decodeRequest(m.header).worker));
  }

  /// Throws unless the request's claimed worker is the sealed sender's: the worker itself, or
  /// (for a machine whose workers reach the servers together) that machine's relaying server.
  void checkSender(const Message& m, const RequestHeader& h) const {
    WEFT_CHECK(h.worker < routes_.workerPeers.size(), "{} request from worker {}: the job has {} workers",
               requestKindName(h.kind), h.worker, routes_.workerPeers.size());
    const int relay = groups_.relay[static_cast<size_t>(groups_.groupOfWorker[h.worker])];
    const bool relayed = relay >= 0 && relay != routes_.self;
    const int expected = relayed ? routes_.serverPeers[static_cast<size_t>(relay)] : routes_.workerPeers[h.worker];
    WEFT_CHECK(m.from == expected, "{} request claiming to be worker {}'s came from peer {}, not from {} (peer {})",
               requestKindName(h.kind), h.worker, m.from, relayed ? fmt::format("server {}", relay) : "that worker",
               expected);
  }

  /// Throws when a worker or server this process still depends on has failed.
  void checkPeers() const {
    for (size_t w = 0; w < routes_.workerPeers.size(); ++w) {
      const int worker = static_cast<int>(w), peer = routes_.workerPeers[w];
      const bool member = aggregator_ != nullptr && aggregator_->isMember(worker);
      const bool direct = groups_.relay[static_cast<size_t>(groups_.groupOfWorker[w])] < 0;
      const bool gone = member ? aggregator_->hasLeft(worker) : !direct || server_.hasLeft(worker);
      WEFT_CHECK(gone || !transport_.hasFailed(peer), "worker {} failed: {}", w, transport_.failureOf(peer));
    }
    for (size_t s = 0; s < routes_.serverPeers.size(); ++s) {
      const int peer = routes_.serverPeers[s];
      if (peer < 0 || !transport_.hasFailed(peer)) continue;
      bool needed = aggregator_ != nullptr && !aggregator_->saidGoodbye();
      for (int g = 0; g < groups_.groups(); ++g)
        needed = needed ||
                 (groups_.relay[static_cast<size_t>(g)] == static_cast<int>(s) && !server_.hasLeft(groups_.leader(g)));
      WEFT_CHECK(!needed, "server {} failed: {}", s, transport_.failureOf(peer));
    }
  }

  /// Sends what the messages released; throws when a send fails.
  void flush() {
    for (const Outgoing& o : outbox_) transport_.sendMessage(o.peer, o.header, o.payload, Clock::now() + timeout_);
    outbox_.clear();
  }

  bool finished() const { return server_.finished() && (aggregator_ == nullptr || aggregator_->finished()); }

  ServerTraffic traffic() const {
    ServerTraffic t = traffic_;
    t.steps = std::max(server_.steps(), aggregator_ != nullptr ? aggregator_->steps() : int64_t{0});
    if (aggregator_ != nullptr) t.aggregatedRows = aggregator_->sparseRows();
    t.staleness = server_.staleness();
    return t;
  }

 private:
  /// The machine a request of worker `worker`'s group comes from: its aggregator's or its own.
  int senderHost(int worker) const {
    const int relay = groups_.relay[static_cast<size_t>(groups_.groupOfWorker[static_cast<size_t>(worker)])];
    return relay >= 0 ? routes_.serverHosts[static_cast<size_t>(relay)]
                      : routes_.workerHosts[static_cast<size_t>(worker)];
  }

  template <class Bytes>
  void count(uint64_t& counter, int host, const Bytes& m, RequestKind kind) {
    const bool training = kind == RequestKind::Push || kind == RequestKind::PullRows || kind == RequestKind::PullAll;
    if (training && host != host_) counter += m.header.size() + m.payload.size();
  }

  void send(int peer, std::vector<uint8_t> header, std::vector<uint8_t> payload) {
    outbox_.push_back({peer, std::move(header), std::move(payload)});
  }

  /// What the local aggregator released: replies to the machine's workers, requests for servers
  /// (this one in process).
  void deliver(LocalAggregator::Released released) {
    for (auto& [worker, e] : released.replies)
      send(routes_.workerPeers[static_cast<size_t>(worker)], std::move(e.header), std::move(e.payload));
    for (auto& [server, e] : released.forwards) {
      if (server == routes_.self) {
        for (ParameterServer::Reply& r : server_.handle({std::move(e.header), std::move(e.payload)}))
          route(std::move(r));
        continue;
      }
      count(traffic_.sent, routes_.serverHosts[static_cast<size_t>(server)], e, decodeRequest(e.header).kind);
      send(routes_.serverPeers[static_cast<size_t>(server)], std::move(e.header), std::move(e.payload));
    }
  }

  /// An owner's reply: to this process's aggregator, another machine's, or a worker on its own.
  void route(ParameterServer::Reply r) {
    const int relay = groups_.relay[static_cast<size_t>(groups_.groupOfWorker[static_cast<size_t>(r.worker)])];
    if (relay == routes_.self) {
      deliver(aggregator_->fromServer({std::move(r.header), std::move(r.payload)}));
      return;
    }
    count(traffic_.sent, senderHost(r.worker), r, r.kind);
    send(relay >= 0 ? routes_.serverPeers[static_cast<size_t>(relay)]
                    : routes_.workerPeers[static_cast<size_t>(r.worker)],
         std::move(r.header), std::move(r.payload));
  }

  ParameterServer& server_;
  LocalAggregator* aggregator_;
  Transport& transport_;
  const PeerRoutes& routes_;
  std::chrono::milliseconds timeout_;
  const SenderGroups& groups_;
  int host_;
  ServerTraffic traffic_;
  struct Outgoing {
    int peer;
    std::vector<uint8_t> header, payload;
  };
  std::vector<Outgoing> outbox_;
};

}  // namespace

ServerTraffic serve(ParameterServer& server, LocalAggregator* aggregator, Transport& transport,
                    const PeerRoutes& routes, const std::string& who, std::chrono::milliseconds timeout) {
  using namespace std::chrono_literals;
  ServerRouter router(server, aggregator, transport, routes, timeout);
  // Between requests the server blocks in UCX's wakeup (without it: yields), so it leaves the
  // CPU to the workers yet answers as soon as a request lands. A server that holds nothing and
  // aggregates for no machine (AUTO with no sparse variables) only waits for goodbyes.
  const std::chrono::microseconds longestWait = server.partitions().empty() && aggregator == nullptr ? 5ms : 1ms;
  while (!router.finished()) {
    std::vector<Message> messages = transport.takeMessages(Clock::now() + timeout);
    const bool idle = messages.empty();
    router.handleAll(std::move(messages), who);
    router.flush();
    router.checkPeers();
    if (idle) transport.waitForActivity(Clock::now() + longestWait, longestWait);
  }
  // Every sender has said goodbye: what is left to flush is at most the last acknowledgements,
  // so a peer that does not take them within seconds is not waited for the whole timeout.
  transport.closeAll(Clock::now() + std::min<std::chrono::milliseconds>(timeout, 5s));
  return router.traffic();
}

namespace {

void printServerTraffic(const std::string& who, const ServerTraffic& t) {
  if (t.steps == 0) return;  // it holds nothing and aggregates for no machine
  const double steps = static_cast<double>(t.steps);
  std::string text = fmt::format(
      "communication of {}: per step {:.0f} bytes sent to other machines, {:.0f} received "
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

/// What each worker's pulls met here under an asynchronous mode; one line per worker.
void printStaleness(const std::string& who, const SyncPolicy& sync, const std::vector<SenderStaleness>& senders) {
  const int64_t bound = sync.stalenessBound();
  std::string text;
  for (size_t w = 0; w < senders.size(); ++w) {
    const SenderStaleness& s = senders[w];
    text += fmt::format("staleness of worker {} at {} under {}: at most {} clocks ahead of the slowest ({}), {:.2f} on "
                        "average over {} pulls, held {:.3f} s\n",
                        w, who, sync.name(), s.maxGap, bound < 0 ? "no bound" : fmt::format("bound {}", bound),
                        s.meanGap(), s.pulls, s.waitedSeconds);
  }
  std::cout << text << std::flush;
}

}  // namespace

int serveJob(JobContext& job, const Graph& graph, const Config& config) {
  const std::string who = describe(job.identity.id);
  try {
    std::vector<SparsityChoice> choices;
    const ServerPlan plan =
        planServersBySparsity(graph, config, job.servers(), job.routes.serverHosts, job.machines(), choices);
    limitPayloads(job, graph);
    // A pipeline's replica pushes each variable once, from the stage that holds it.
    const int workers = job.workers(), replicas = workers / config.pipeline.stages;
    ParameterServer::Options options;
    options.workers = workers;
    options.denseScale = config.averageDense ? 1.0 / replicas : 1.0;
    options.sparseScale = config.averageSparse ? 1.0 / replicas : 1.0;
    options.session = config.session;
    options.groups = job.groups;
    options.sync = config.sync;
    options.wire = config.wireDType;
    ParameterServer server(plan, job.routes.self, options);
    std::unique_ptr<LocalAggregator> aggregator;
    for (int g = 0; g < job.groups.groups(); ++g) {
      if (job.groups.relay[static_cast<size_t>(g)] == job.routes.self)
        aggregator = std::make_unique<LocalAggregator>(plan, job.groups.members[static_cast<size_t>(g)], job.servers(),
                                                       config.sync, config.wireDType);
    }
    const ServerTraffic traffic = serve(server, aggregator.get(), *job.transport, job.routes, who, config.timeout);
    if (config.reportTraffic) printServerTraffic(who, traffic);
    if (!config.sync->synchronous() && !server.partitions().empty())
      printStaleness(who, *config.sync, traffic.staleness);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("weft: {} stops: {}\n", who, e.what());
    // The workers waiting on this server learn at once that it has gone.
    try {
      job.transport->closeAll(Clock::now() + config.timeout);
    } catch (const std::exception&) {
      // Closing is a courtesy here; the process ends with the error above either way.
    }
    return 1;
  }
}

}  // namespace weft::dist
