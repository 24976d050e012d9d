// get_runner, makeWorker and the Runner (see the header).
#include "dist/Runner.h"

#include "core/Checkpoint.h"
#include "core/Error.h"
#include "core/OpRegistry.h"
#include "dist/Placement.h"
#include "dist/collective/Communicator.h"
#include "dist/collective/Nccl.h"
#include "dist/launch/Liveness.h"
#include "dist/launch/Preemption.h"
#include "dist/pipeline/PipelineStage.h"
#include "dist/server/ServerClient.h"
#include "dist/server/ServerProcess.h"
#include "dist/transport/LoopbackTransport.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

namespace weft::dist {

namespace {
// The ring channel of a pipeline stage's replicas (the ring of all workers is channel 0), and
// the transport channel of their own transport (JobContext::openTransport).
constexpr int kReplicaChannel = 1;
constexpr uint8_t kReplicaTransportChannel = 2;
// How long a wait for another worker lasts when no step bounds it: as long as the other lives.
// A dead one fails the transport; a frozen one is stopped by the launcher's heartbeat watch.
constexpr std::chrono::hours kAsLongAsTheyLive{24 * 365};
}  // namespace

namespace {
void broadcastVariables(Session& session, HostCollectives& workers, const ServerPlan& plan);
void refuseConditionalServedUpdates(const Graph& graph, const ServerPlan& plan);
}  // namespace

struct Runner::State {
  // A job its cluster engine started: the first process serves the rendezvous until every
  // member has left, so this goes last; SIGTERM from the engine is caught until then.
  std::shared_ptr<Preemption> preemption;
  std::shared_ptr<EngineJob> engine;
  std::optional<JobContext> job;  // empty: one process training alone, or a server that has served
  int serverStatus = -1;          // a server's exit status once it has served
  TrafficLog traffic;
  std::unique_ptr<Ring> ring;
  std::unique_ptr<Communicator> communicator;  // the host's collectives, and CPU workers' dense sums
  std::unique_ptr<CollectiveBackend> gpuSums;  // GPU workers' dense sums (NCCL)
  ServerPlan plan;
  std::vector<SparsityChoice> sparsityChoices;
  std::unique_ptr<ServerClient> client;  // with servers in the job
  std::unique_ptr<Session> session;
  DistributedGraph distribution;
  std::chrono::milliseconds timeout{0};
  bool synchronous = true;  // false under the asynchronous modes of the parameter servers
  Sharding sharding = Sharding::None;
  // A pipeline's stage (instead of a session of a data-parallel replica), and its automatic cut;
  // with replicas of the pipeline, the ring of this stage's replicas on a transport and a
  // thread of its own, so that their sums overlap the stage's work.
  std::unique_ptr<Transport> replicaTransport;
  std::unique_ptr<Ring> replicaRing;
  std::unique_ptr<Communicator> replicaSums;
  DType wireDType = DType::F32;  // how the replicas' dense f32 sums travel
  std::unique_ptr<LoopbackTransport> localTransport;  // one process's micro-batches
  std::unique_ptr<PipelineStage> pipeline;
  PipelineConfig pipelineConfig;
  bool staged = false;
  bool serversInGraph = false;  // a pipeline's graph reads the servers' variables from them
  bool shardedOverReplicas = false;  // a pipeline's graph shards its optimizer state over the replicas (once)
  size_t bucketBytes = size_t{4} << 20;
  std::map<const Node*, int> stageOfShard;  // a pipeline's sharded variables: the stage that updates each
  std::vector<int> processOfModelStage;     // a pipeline's: which of its processes runs each model stage
  std::string pipelinePlan;

  ~State() {
    if (!communicator) return;
    communicator->settle();  // before the session's values, which a gather may be writing, go
    try {
      leave();
    } catch (const std::exception& e) {
      std::cerr << fmt::format("weft: worker rank {} could not leave the job cleanly: {}\n", rank(), e.what());
    }
  }

  int rank() const { return job ? job->rank() : 0; }
  int workers() const { return job ? job->workers() : 1; }

  /// The backends this worker's steps sum through.
  std::vector<CollectiveBackend*> backends() const {
    std::vector<CollectiveBackend*> out;
    if (communicator) out.push_back(communicator.get());
    if (gpuSums) out.push_back(gpuSums.get());
    return out;
  }

  void barrier() {
    // Under the asynchronous modes the workers may finish far apart (ASP bounds nothing): the
    // last barrier waits as long as the others live.
    communicator->barrier(synchronous ? timeout : kAsLongAsTheyLive);
  }

  /// The served variable of partition `p`, its slots and moving averages: what LOAD carries and
  /// FETCH returns.
  std::vector<Tensor*> stateOf(const ServedVariable& v) {
    Session& mine = activeSession();
    std::vector<Tensor*> out{&mine.variable(v.variable)};
    for (Node* s : v.heldState()) out.push_back(&mine.variable(s));
    return out;
  }

  /// A served variable's value and slots on the host: the session's own tensors on a CPU worker;
  /// on a GPU worker copies (of their values when `fill`; else uninitialised).
  std::vector<Tensor> hostState(const ServedVariable& v, bool fill) {
    std::vector<Tensor> state;
    for (Tensor* t : stateOf(v)) {
      const bool onHost = t->device().type == DeviceType::CPU;
      state.push_back(onHost || fill ? t->to(cpu()) : Tensor(t->dtype(), t->shape(), cpu()));
    }
    return state;
  }

  /// Loads this worker's value and slots of `v` into the servers. One variable at a time, as
  /// pulls go: the payloads held at once are one variable's state.
  void loadVariable(const ServedVariable& v) {
    const std::vector<Tensor> tensors = hostState(v, true);
    std::vector<ServerClient::Call> calls;
    for (int p : v.partitions) {
      const Partition& part = plan.partitions[static_cast<size_t>(p)];
      std::vector<uint8_t> payload(part.bytes * tensors.size());
      for (size_t i = 0; i < tensors.size(); ++i)
        packRows(part, v.rowBytes(), static_cast<const uint8_t*>(tensors[i].raw()), payload.data() + i * part.bytes);
      calls.push_back({p, RequestKind::Load, std::move(payload)});
    }
    client->request(std::move(calls), TrafficKind::Control);
  }

  /// One variable at a time, so that the replies held at once are one variable's state, not the
  /// whole served model's (an LM's softmax and embedding are gigabytes).
  void pullVariables() {
    for (const ServedVariable& v : plan.variables) pullVariable(v);
    client->setLocalCopyCurrent(true);
  }

  void pullVariable(const ServedVariable& v) {
    std::vector<ServerClient::Call> calls;
    for (int p : v.partitions) calls.push_back({p, RequestKind::Fetch, {}});
    const std::vector<std::vector<uint8_t>> replies = client->request(std::move(calls), TrafficKind::Control);
    // The partitions of a variable cover all its rows: every byte of the host copies is written.
    std::vector<Tensor> tensors = hostState(v, false);
    for (size_t k = 0; k < replies.size(); ++k) {
      const Partition& part = plan.partitions[static_cast<size_t>(v.partitions[k])];
      WEFT_CHECK(replies[k].size() == part.bytes * tensors.size(),
                 "FETCH of partition {} returned {} bytes, expected {}", v.partitions[k], replies[k].size(),
                 part.bytes * tensors.size());
      for (size_t i = 0; i < tensors.size(); ++i)
        unpackRows(part, v.rowBytes(), replies[k].data() + i * part.bytes, static_cast<uint8_t*>(tensors[i].raw()));
    }
    const std::vector<Tensor*> live = stateOf(v);
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i]->raw() != tensors[i].raw()) live[i]->copyFrom(tensors[i]);
  }

  /// Makes this worker a stage of a pipeline: workers r·S .. r·S + S − 1 are replica r's stages.
  void joinPipeline(JobContext context, Graph& graph, const Config& config) {
    const PipelineConfig& stages = config.pipeline;  // checkConfig has checked it against the job
    timeout = config.timeout;
    job.emplace(std::move(context));
    limitPayloads(*job, graph);
    ring = std::make_unique<Ring>(*job->transport, job->rank(), job->routes.workerPeers, config.timeout);
    communicator = std::make_unique<Communicator>(*ring, traffic);
    pipelineConfig = stages;
    sharding = config.sharding;
    bucketBytes = config.bucketBytes;
    WEFT_CHECK(sharding == Sharding::None || !job->gpuWorkers,
               "--shard {}: a pipeline's GPU stages keep their optimizer state whole; sharding runs among CPU "
               "workers",
               shardingName(sharding));
    const int stage = job->rank() % stages.stages, replica = job->rank() / stages.stages;
    std::vector<int> stagePeers;
    for (int s = 0; s < stages.stages; ++s)
      stagePeers.push_back(job->routes.workerPeers[static_cast<size_t>(replica * stages.stages + s)]);
    PipelineOptions options;
    options.stages = stages.stages;
    options.microbatches = stages.microbatches;
    options.schedule = stages.schedule;
    options.postValidation = stages.postValidation;
    options.timeout = config.timeout;
    options.session = config.session;
    options.session.replica = replica;  // random ops draw for the replica's part of the total batch
    if (replicas() > 1) {
      connectReplicas(graph, stage, config);
      wireDType = config.wireDType;
      options.startAveragingOverReplicas = [this](StageGradients g) { return startAveragingOverReplicas(g); };
    }
    pipeline = std::make_unique<PipelineStage>(graph, stage, options, *job->transport, stagePeers);
    if (job->servers() == 0) return;
    // Each stage process talks to the servers for the variables its stage holds, as a part of
    // its replica. The graph reads them from the servers once the first step has cut it.
    plan = planServersBySparsity(graph, config, job->servers(), job->routes.serverHosts, job->machines(),
                                 sparsityChoices);
    client = std::make_unique<ServerClient>(traffic, *job->clientTransport, job->rank(), job->routes.serverPeers, plan,
                                            config.timeout, job->relay(), config.sync, config.wireDType);
    client->setReplica(replica);
    client->keepPulledRows();
    loadServedVariables();
  }

  /// Worker 0 loads its values of the served variables into the servers; no worker pulls before.
  void loadServedVariables() {
    if (plan.empty()) return;
    if (rank() == 0)
      for (const ServedVariable& v : plan.variables) loadVariable(v);
    barrier();
  }

  /// A pipeline's graph, cut into stages, reads and updates the served variables on the servers.
  void distributeServedVariables() {
    serversInGraph = true;
    if (plan.empty()) return;
    refuseConditionalServedUpdates(pipeline->session().graph(), plan);
    applyPasses(pipeline->session().graph(),
                {{"parameter servers", [this](Graph& g, DistributedGraph&) {
                    distributeParameterServers(g, plan, client->id());
                  }}});
  }

  /// One process training on micro-batches: a pipeline of one stage, with nothing to send.
  void accumulateLocally(Graph& graph, const Config& config) {
    pipelineConfig = config.pipeline;
    localTransport = std::make_unique<LoopbackTransport>(std::make_shared<LoopbackNetwork>());
    PipelineOptions options;
    options.microbatches = config.pipeline.microbatches;
    options.schedule = config.pipeline.schedule;
    options.timeout = config.timeout;
    options.session = config.session;
    pipeline = std::make_unique<PipelineStage>(graph, 0, options, *localTransport, std::vector<int>{0});
  }

  /// --shard optimizer in a pipeline with replicas (ZeRO stages 1 and 2 among each stage's
  /// replicas, as Megatron's distributed optimizer does beside its pipeline): once the stages are
  /// chosen, a cut says which stage updates each dense variable, and the graph reduce-scatters
  /// each stage's gradients over its replicas' ring, updates this replica's shard of each and
  /// gathers the others' (dist/Transform.h, shardOverReplicas). Values made before (worker 0's
  /// profile of the step, a restored checkpoint's) give their shard.
  void shardOverReplicas(const std::vector<Output>& fetches, Node* trainStep) {
    shardedOverReplicas = true;
    if (sharding == Sharding::None || replicas() < 2) return;
    Graph& graph = pipeline->session().graph();
    const int modelStages = pipelineConfig.schedule.modelStages(pipelineConfig.stages);
    const PipelineCut cut =
        cutPipeline(graph, modelStages, fetches, trainStep, pipelineConfig.schedule.splitsWeights());
    TransformOptions options;
    options.hostRing = replicaSums->id();
    options.workers = replicas();
    options.rank = rank() / pipelineConfig.stages;
    options.bucketBytes = bucketBytes;
    std::set<const Node*> tied;
    for (const TiedVariable& t : cut.tied) tied.insert(t.variable);
    // A tied variable's update reads the sum of several stages' parts, which its owner's runtime
    // adds: it stays whole, averaged by the runtime like a sparse one.
    for (const StageGradient& g : cut.gradients)
      if (!g.link.sparse && !g.served && !tied.count(g.link.variable)) options.shardGroups[g.link.variable] = g.stage;
    const std::vector<GradientLink> links = stepGradientLinks(graph);
    applyPasses(graph, {{"sharding over the pipeline's replicas",
                         [&](Graph& g, DistributedGraph& d) { d = dist::shardOverReplicas(g, links, options); }}});
    Session& session = pipeline->session();
    for (Node* v : graph.variables()) {
      if (!Graph::isShard(*v)) continue;
      stageOfShard[v] = stageOfUpdateOf(v, options.shardGroups);
      if (!session.holdsVariable(v) || session.variable(v).shape() == v->outputs[0].shape) continue;
      Tensor shard(v->outputs[0].dtype, v->outputs[0].shape);
      copyShardOf(*v, session.variable(v), shard);
      session.replaceVariable(v, shard);
    }
  }

  /// The stage that updates sharded variable `v` (an optimizer slot): its update's variable's.
  int stageOfUpdateOf(const Node* v, const std::map<const Node*, int>& stageOf) const {
    for (const auto& n : pipeline->session().graph().nodes()) {
      const std::vector<int>& written = n->def->mutatedInputs;
      const bool writesIt = std::any_of(written.begin(), written.end(),
                                        [&](int m) { return n->inputs[static_cast<size_t>(m)].node() == v; });
      if (!writesIt) continue;
      for (int m : written)
        if (auto it = stageOf.find(n->inputs[static_cast<size_t>(m)].node()); it != stageOf.end()) return it->second;
    }
    WEFT_THROW("sharded variable '{}' is written by no update of a sharded variable", v->name);
  }

  /// The variables this worker holds: made on first use, the shards by the first step; a
  /// pipeline stage's, those of the stages it runs (its session may hold copies of others').
  std::vector<Node*> heldVariables() {
    Session& held = activeSession();
    std::set<Node*> ofStages;
    if (pipeline) {
      const PipelineCut& cut = pipeline->cut();
      for (int s = 0; s < static_cast<int>(cut.variables.size()); ++s)
        if (runsStage(s))
          ofStages.insert(cut.variables[static_cast<size_t>(s)].begin(), cut.variables[static_cast<size_t>(s)].end());
    }
    std::vector<Node*> out;
    for (Node* v : held.graph().variables()) {
      const bool mine = pipeline ? ofStages.count(v) > 0 : Graph::isShard(*v) || held.holdsVariable(v);
      if (mine) out.push_back(v);
    }
    return out;
  }

  /// Whether this process runs model stage `s` of the pipeline.
  bool runsStage(int s) {
    if (processOfModelStage.empty())
      processOfModelStage =
          processOfStage(pipelineConfig.schedule.orders(pipelineConfig.stages, pipelineConfig.microbatches));
    return processOfModelStage.at(static_cast<size_t>(s)) == pipeline->stage();
  }

  /// Data-parallel replicas: of the model, or of a pipeline (each of its stages' workers).
  int replicas() const { return workers() / pipelineConfig.stages; }

  /// The ring of this stage's replicas (workers r·S + stage), on a transport of its own whose
  /// addresses travel over the workers' ring (sealed), and the thread that runs its sums.
  void connectReplicas(const Graph& graph, int stage, const Config& config) {
    WEFT_CHECK(job->openTransport != nullptr,
               "the replicas of a pipeline's stages sum on a transport of their own, which this job cannot open");
    replicaTransport = job->openTransport(kReplicaTransportChannel);
    replicaTransport->limitPayloads(payloadLimit(graph));
    const std::vector<std::vector<uint8_t>> addresses = everyWorkers(replicaTransport->address());
    const int stages = pipelineConfig.stages, replica = job->rank() / stages;
    std::vector<int> peers, hosts;  // hosts: to count the bytes that cross to other machines
    for (int r = 0; r < replicas(); ++r) {
      const int rank = r * stages + stage;
      peers.push_back(r == replica ? -1
                                   : replicaTransport->connect(addresses[static_cast<size_t>(rank)],
                                                               job->workerEndpoint(rank, kReplicaTransportChannel)));
      hosts.push_back(job->routes.workerHosts[static_cast<size_t>(rank)]);
    }
    replicaRing = std::make_unique<Ring>(*replicaTransport, replica, peers, config.timeout, kReplicaChannel);
    replicaRing->setMachines(hosts, false);
    replicaSums = std::make_unique<Communicator>(*replicaRing, traffic);
  }

  /// Every worker's `block`, in rank order (through the workers' ring, each behind its size).
  std::vector<std::vector<uint8_t>> everyWorkers(const std::vector<uint8_t>& block) {
    std::vector<uint8_t> sized(sizeof(uint64_t));
    const uint64_t size = block.size();
    std::memcpy(sized.data(), &size, sizeof size);
    sized.insert(sized.end(), block.begin(), block.end());
    const std::vector<uint8_t> all = communicator->gather(std::move(sized));
    std::vector<std::vector<uint8_t>> out;
    for (size_t at = 0; at < all.size();) {
      uint64_t next = 0;
      WEFT_CHECK(at + sizeof next <= all.size(), "the workers' blocks end inside a size, at byte {} of {}", at,
                 all.size());
      std::memcpy(&next, all.data() + at, sizeof next);
      at += sizeof next;
      WEFT_CHECK(next <= all.size() - at, "worker {}'s block of {} bytes runs past the {} gathered", out.size(), next,
                 all.size());
      out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                       all.begin() + static_cast<std::ptrdiff_t>(at + next));
      at += next;
    }
    WEFT_CHECK(static_cast<int>(out.size()) == workers(), "{} blocks came from {} workers", out.size(), workers());
    return out;
  }

  /// Starts making each of `g`'s gradients its mean over the replicas of this stage, on the
  /// replicas' thread: dense ones summed by the replicas' ring in one bucket per dtype (f32 ones
  /// travelling as --wire-dtype), sparse ones' rows gathered from every replica (in replica
  /// order), then divided. Returns what waits for them and puts the means in place. The ring's
  /// bytes count in the worker's traffic.
  std::function<void()> startAveragingOverReplicas(const StageGradients& g) {
    const double inverse = 1.0 / replicas();
    std::vector<std::pair<uint64_t, Tensor*>> rowTickets;
    std::vector<uint64_t> sumTickets;
    for (const Tensor* t : g.dense) {
      WEFT_CHECK(t->dtype() == DType::F32 || t->dtype() == DType::F64,
                 "a pipeline's replicas average f32 and f64 gradients, not {}", dtypeName(t->dtype()));
    }
    for (DType dtype : {DType::F32, DType::F64}) {
      std::vector<Tensor> bucket;  // sharing the gradients' buffers: summed into in place
      for (Tensor* t : g.dense)
        if (t->dtype() == dtype) bucket.push_back(*t);
      if (bucket.empty()) continue;
      const DType wire = dtype == DType::F32 ? wireDType : dtype;
      auto average = [bucket, dtype, wire, inverse](Ring& r, std::vector<uint8_t>&) {
        averageBucket(r, bucket, dtype, wire, inverse);
      };
      sumTickets.push_back(replicaSums->submit({}, average, TrafficKind::Dense));
    }
    const auto gatherRows = [](Ring& r, std::vector<uint8_t>& rows) { rows = r.allGather(rows); };
    for (const auto& [indices, values] : g.sparse) {
      for (Tensor* t : {indices, values}) {
        const auto* raw = static_cast<const uint8_t*>(t->raw());
        rowTickets.emplace_back(replicaSums->submit({raw, raw + t->bytes()}, gatherRows, TrafficKind::Sparse), t);
      }
    }
    return [this, sumTickets, rowTickets, values = g.sparse, inverse] {
      const WaitingOnPeer waiting;
      try {
        for (uint64_t ticket : sumTickets) replicaSums->wait(ticket);
        for (const auto& [ticket, t] : rowTickets) *t = rowsOf(*t, replicaSums->wait(ticket));
      } catch (const Error& e) {
        WEFT_THROW("pipeline stage {} averaging its gradients with the same stage of the other {} replicas: {}",
                   pipeline->stage(), replicas() - 1, e.what());
      }
      for (const auto& [indices, rows] : values) scaleGradient(*rows, inverse);
      noteProgress();
    };
  }

  /// Replaces `bucket`'s tensors by their mean over the ring's ranks, summed as one buffer.
  static void averageBucket(Ring& ring, const std::vector<Tensor>& bucket, DType dtype, DType wire, double inverse) {
    size_t bytes = 0;
    for (const Tensor& t : bucket) bytes += t.bytes();
    std::vector<uint8_t> flat(bytes);
    size_t at = 0;
    for (const Tensor& t : bucket) {
      if (t.bytes() > 0) std::memcpy(flat.data() + at, t.raw(), t.bytes());
      at += t.bytes();
    }
    ring.allReduceSum(dtype, flat.data(), static_cast<int64_t>(bytes / dtypeSize(dtype)), wire);
    at = 0;
    for (const Tensor& t : bucket) {
      Tensor mean = t;  // the same buffer
      if (t.bytes() > 0) std::memcpy(mean.raw(), flat.data() + at, t.bytes());
      scaleGradient(mean, inverse);
      at += t.bytes();
    }
  }

  /// Rows shaped as `like`'s, from `bytes` (every replica's rows of it, concatenated).
  static Tensor rowsOf(const Tensor& like, const std::vector<uint8_t>& bytes) {
    size_t rowBytes = dtypeSize(like.dtype());
    for (int axis = 1; axis < like.shape().rank(); ++axis) rowBytes *= static_cast<size_t>(like.shape()[axis]);
    Shape shape = like.shape();
    shape[0] = static_cast<int64_t>(bytes.size() / rowBytes);
    Tensor out(like.dtype(), shape);
    if (!bytes.empty()) std::memcpy(out.raw(), bytes.data(), bytes.size());
    return out;
  }

  Session& activeSession() { return pipeline ? pipeline->session() : *session; }

  /// Without the author's Graph::stage scopes, worker 0 profiles one micro-batch's step and
  /// chooses the stages; every worker applies its choice. With them, worker 0 reckons what each
  /// stage holds and holds it to the memory limit.
  void stageGraph(const std::vector<Output>& fetches, Node* trainStep, const FeedMap& microbatch) {
    staged = true;
    Graph& graph = pipeline->session().graph();
    const bool authorStaged =
        std::any_of(graph.nodes().begin(), graph.nodes().end(), [](const auto& n) { return n->stage >= 0; });
    const size_t stages = static_cast<size_t>(pipelineConfig.schedule.modelStages(pipelineConfig.stages));
    // Worker 0's choice: a 0 byte and each stage's first op (none for the author's stages), or a
    // 1 byte and why there is none (no cut fits --memory-per-stage), so that every worker stops
    // with that error at once rather than waiting out the timeout for a plan.
    std::vector<uint8_t> choice;
    if (rank() == 0) {
      choice.push_back(0);
      try {
        if (authorStaged) {
          pipelinePlan = checkAuthorStages(fetches, trainStep, microbatch);
        } else {
          const StagePlan plan = planPipeline(fetches, trainStep, microbatch);
          pipelinePlan = plan.describe();
          for (size_t s = 0; s < stages; ++s) {
            const uint64_t first = plan.firstOp[s];
            choice.insert(choice.end(), reinterpret_cast<const uint8_t*>(&first),
                          reinterpret_cast<const uint8_t*>(&first) + sizeof first);
          }
        }
      } catch (const Error& e) {
        const std::string why = e.what();
        choice.assign(1, 1);
        choice.insert(choice.end(), why.begin(), why.end());
      }
    }
    choice = communicator->gather(std::move(choice));  // the others give none: worker 0's, everywhere
    if (choice.at(0) == 1) throw Error(std::string(choice.begin() + 1, choice.end()));
    if (authorStaged) return;
    WEFT_CHECK(choice.size() == 1 + stages * sizeof(uint64_t),
               "worker 0's pipeline cut holds {} bytes, not one first op for each of {} stages", choice.size(),
               stages);
    std::vector<size_t> firstOp(stages);
    for (size_t s = 0; s < stages; ++s) {
      uint64_t first = 0;
      std::memcpy(&first, choice.data() + 1 + s * sizeof first, sizeof first);
      firstOp[s] = static_cast<size_t>(first);
    }
    applyStages(graph, fetches, trainStep, firstOp);
  }

  /// What the cut weighs for one micro-batch's step.
  StagePlanOptions planOptions(const std::vector<Output>& fetches, Node* trainStep, const FeedMap& microbatch) {
    int64_t rows = 1;
    for (const auto& [placeholder, value] : microbatch)
      if (placeholder.shape().rank() >= 1 && placeholder.shape()[0] == -1) rows = value.shape()[0];
    return {.stages = pipelineConfig.stages,
            .valueBytes = valueBytes(pipeline->session().valueTypes(fetches, microbatch, {trainStep})),
            .rows = rows,
            .microbatches = pipelineConfig.microbatches,
            .schedule = pipelineConfig.schedule,
            .linkBytesPerSecond = pipelineConfig.linkBytesPerSecond,
            .memoryPerStage = pipelineConfig.memoryPerStage,
            .served = servedVariables(),
            .optimizerShards = sharding == Sharding::Optimizer ? replicas() : 1};
  }

  /// The variables the servers hold (none without servers).
  std::vector<const Node*> servedVariables() const {
    std::vector<const Node*> out;
    for (const ServedVariable& v : plan.variables) out.push_back(v.variable);
    return out;
  }

  /// Profiles one micro-batch's step and chooses the stages (worker 0's part of stageGraph).
  StagePlan planPipeline(const std::vector<Output>& fetches, Node* trainStep, const FeedMap& microbatch) {
    Session& session = pipeline->session();
    const auto seconds = session.profile(fetches, microbatch, {trainStep});
    return planStages(session.graph(), fetches, trainStep, seconds, planOptions(fetches, trainStep, microbatch));
  }

  /// What each of the author's stages holds, one line each; throws when one exceeds the limit.
  std::string checkAuthorStages(const std::vector<Output>& fetches, Node* trainStep, const FeedMap& microbatch) {
    const StagePlanOptions options = planOptions(fetches, trainStep, microbatch);
    const std::vector<StageMemory> memory = stageMemory(pipeline->session().graph(), fetches, trainStep, options);
    // With virtual stages the limit holds for each process's stages together.
    const std::vector<int> processOf =
        processOfStage(options.schedule.orders(options.stages, options.microbatches));
    std::vector<double> processBytes(static_cast<size_t>(options.stages), 0);
    std::string described;
    for (size_t s = 0; s < memory.size(); ++s) {
      processBytes[static_cast<size_t>(processOf[s])] += memory[s].total();
      WEFT_CHECK(options.memoryPerStage == 0 || memory[s].total() <= options.memoryPerStage,
                 "pipeline stage {} of the model's stage scopes {}: {:.0f} bytes more than the {:.0f} a stage may "
                 "hold (--memory-per-stage); move layers to another stage",
                 s, memory[s].describe(), memory[s].total() - options.memoryPerStage, options.memoryPerStage);
      described += fmt::format("stage {} (the model's stage scopes): {}\n", s, memory[s].describe());
    }
    for (size_t p = 0; p < processBytes.size(); ++p)
      WEFT_CHECK(options.memoryPerStage == 0 || processBytes[p] <= options.memoryPerStage,
                 "pipeline process {} holds {:.0f} bytes with its stages of the model's stage scopes, {:.0f} more than "
                 "the {:.0f} a process may hold (--memory-per-stage); move layers to another stage",
                 p, processBytes[p], processBytes[p] - options.memoryPerStage, options.memoryPerStage);
    return described;
  }

  std::vector<Tensor> runPipelined(const std::vector<Output>& fetches, const std::vector<FeedMap>& microbatches,
                                   const std::vector<Node*>& targets) {
    WEFT_CHECK(targets.size() == 1, "a pipelined run is a training step: it takes the train step as its one target, "
               "got {} targets", targets.size());
    WEFT_CHECK(static_cast<int>(microbatches.size()) == pipelineConfig.microbatches,
               "a pipelined step of {} micro-batches was given {}", pipelineConfig.microbatches, microbatches.size());
    if (!staged && pipelineConfig.stages > 1) stageGraph(fetches, targets[0], microbatches.front());
    if (client) {
      // After the cut is chosen: choosing it profiles the step, which must not reach the servers.
      if (!serversInGraph) distributeServedVariables();
      // Stage 0's pulls to evaluate, and rows kept of partitions another stage pushes, are of a
      // step gone by.
      client->setLocalCopyCurrent(false);
      client->forgetPulledRows();
    }
    if (!shardedOverReplicas) shardOverReplicas(fetches, targets[0]);
    std::vector<double> means;
    try {
      means = pipeline->step(fetches, targets[0], microbatches);
    } catch (const std::exception& e) {
      // Sums started among the replicas and never waited for leave this stage's out of step
      // with its replicas': no later sum could match theirs.
      if (replicaSums && replicaSums->sumsInFlight()) {
        replicaSums->abort(fmt::format("a step failed on this worker ({})", e.what()));
        replicaSums->settle();  // a sum that was running may still write into the step's gradients
      }
      throw;
    }
    std::vector<Tensor> out;
    for (size_t f = 0; f < fetches.size(); ++f) out.push_back(Tensor::scalar(fetches[f].dtype(), means[f]));
    return out;
  }

  /// The variables this worker holds a shard of (ZeRO's optimizer slots), in graph order.
  std::vector<Node*> shards() const {
    std::vector<Node*> out;
    for (Node* v : (pipeline ? pipeline->session() : *session).graph().variables())
      if (Graph::isShard(*v)) out.push_back(v);
    return out;
  }

  /// Worker 0 takes every shard's whole value (every rank's shard, in rank order, is the whole
  /// flattened). The ring's gather reaches every worker: the others drop each whole at once.
  WholeValues gatherShards() {
    WholeValues wholes;
    for (Node* v : shards()) {
      // A pipeline's shards of a variable are its stage's replicas', which come in rank order.
      const bool holder = !pipeline || runsStage(stageOfShard.at(v));
      const Tensor shard = holder ? activeSession().variable(v).to(cpu()) : Tensor(v->outputs[0].dtype, {0});
      const std::vector<uint8_t> mine(static_cast<const uint8_t*>(shard.raw()),
                                      static_cast<const uint8_t*>(shard.raw()) + shard.bytes());
      const std::vector<uint8_t> all = communicator->gather(mine);
      if (rank() != 0) continue;
      Tensor whole(shard.dtype(), Graph::wholeShapeOf(*v));
      WEFT_CHECK(all.size() == whole.bytes(), "gathering the shards of '{}': {} bytes arrived, the whole {} has {}",
                 v->name, all.size(), whole.shape().str(), whole.bytes());
      std::memcpy(whole.raw(), all.data(), all.size());
      wholes.emplace(v->name, std::move(whole));
    }
    return wholes;
  }

  /// Every worker takes its shard of worker 0's `wholes` (what worker 0 restored), when worker 0
  /// has them; the broadcast of each whole is one variable at a time.
  void scatterShards(const WholeValues& wholes) {
    const std::vector<Node*> sharded = shards();
    if (sharded.empty()) return;
    const std::vector<uint8_t> present = communicator->broadcast({static_cast<uint8_t>(!wholes.empty())}, 0);
    if (present.at(0) == 0) return;
    for (Node* v : sharded) {
      Tensor whole(v->outputs[0].dtype, Graph::wholeShapeOf(*v));
      std::vector<uint8_t> bytes(whole.bytes());
      if (rank() == 0) {
        const auto it = wholes.find(v->name);
        WEFT_CHECK(it != wholes.end(), "publishing the restored shards: no whole value of '{}'", v->name);
        const Tensor host = it->second.to(cpu());
        std::memcpy(bytes.data(), host.raw(), bytes.size());
      }
      bytes = communicator->broadcast(std::move(bytes), 0);
      std::memcpy(whole.raw(), bytes.data(), bytes.size());
      copyShardOf(*v, whole, session->variable(v));
    }
  }

  void publishVariables(const WholeValues& wholes) {
    if (pipeline) {
      // Worker 0, replica 0's first stage, alone restored a checkpoint: the other replicas' first
      // stages take its values before each replica's first stage hands them to its other stages.
      if (replicas() > 1 && pipeline->stage() == 0) broadcastVariables(pipeline->session(), *replicaSums, plan);
      pipeline->scatterVariables(0);
      loadServedVariables();
      return;
    }
    broadcastVariables(*session, *communicator, plan);  // those the workers hold
    scatterShards(wholes);
    if (plan.empty()) return;
    if (rank() == 0)
      for (const ServedVariable& v : plan.variables) loadVariable(v);
    barrier();  // no worker pulls before the servers hold worker 0's values
  }

  /// Waits until every worker is done with its steps, takes the served variables' final values
  /// (unless told not to, or its copy is current already), says goodbye to the servers, and closes.
  void leave(ServedValues values = ServedValues::Pull) {
    barrier();
    if (client) {
      // A pipeline's whole model is worker 0's alone; its other stages hold their parts.
      const bool wholeModel = !pipeline || rank() == 0;
      if (values == ServedValues::Pull && wholeModel && !plan.empty() && !client->localCopyCurrent())
        pullVariables();
      client->goodbye();
    }
    gpuSums.reset();  // after the barrier: every GPU worker closes the communicator together
    // Reset first: whatever happens below, this worker is no longer in the job.
    client.reset();
    communicator.reset();
    replicaSums.reset();
    // The replicas' ring received its last sum before the barrier. Closed with a flush, after
    // or before the other transports, it would wait for replicas that wait in turn for this
    // process to progress another transport's close.
    if (replicaTransport) replicaTransport->closeNow();
    const Deadline deadline = Clock::now() + timeout;
    job->transport->closeAll(deadline);
    if (job->clientTransport) job->clientTransport->closeAll(deadline);
    job->leave();
  }
};

Runner::Runner(std::unique_ptr<State> state) : state_(std::move(state)) {}
Runner::Runner(Runner&&) noexcept = default;
Runner& Runner::operator=(Runner&&) noexcept = default;
Runner::~Runner() = default;

std::vector<Tensor> Runner::run(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets) {
  if (state_->pipeline)
    return state_->runPipelined(fetches, splitMicrobatches(feeds, state_->pipelineConfig.microbatches), targets);
  WEFT_CHECK(state_->session != nullptr, "this process was a parameter server of the job and has finished serving: "
             "it runs no steps (end the program with Runner::serverStatus())");
  // Steps that make no server request (all of them under `ar`) still answer the servers'
  // connection setup to the client's transport.
  if (state_->job && state_->job->clientTransport) state_->job->clientTransport->progress();
  const std::vector<CollectiveBackend*> backends = state_->backends();
  try {
    std::vector<Tensor> out = state_->session->run(fetches, feeds, targets);
    noteProgress();
    // A sum that failed in the background (the NCCL watchdog's abort) leaves the step unfinished.
    for (CollectiveBackend* b : backends) b->throwIfFailed();
    return out;
  } catch (const std::exception& e) {
    // A step that stopped between a sum's Start and its Wait has left this worker's sums out of
    // step with the other workers': no later sum could match theirs. One that stopped before any
    // (a feed refused) leaves the backends as they were.
    for (CollectiveBackend* b : backends)
      if (b->sumsInFlight()) b->abort(fmt::format("a step failed on this worker ({})", e.what()));
    // A gather may still be writing into the failed step's values (GatherWholeStart).
    if (state_->communicator) state_->communicator->settle();
    throw;
  }
}

std::vector<Tensor> Runner::runMicrobatches(const std::vector<Output>& fetches,
                                            const std::vector<FeedMap>& microbatches,
                                            const std::vector<Node*>& targets) {
  if (state_->pipeline) return state_->runPipelined(fetches, microbatches, targets);
  WEFT_CHECK(microbatches.size() == 1, "without a pipeline a step runs on one batch, not {} micro-batches",
             microbatches.size());
  return run(fetches, microbatches.front(), targets);
}

double Runner::meanOverWorkers(double value) {
  if (!state_->communicator) return value;
  state_->communicator->sum(DType::F64, &value, 1);
  return value / state_->workers();
}

std::vector<int64_t> Runner::fromWorker0(std::vector<int64_t> values) {
  if (!state_->communicator) return values;
  std::vector<uint8_t> bytes(values.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  bytes = state_->communicator->broadcast(std::move(bytes), 0);
  WEFT_CHECK(bytes.size() == values.size() * sizeof(int64_t), "fromWorker0: worker 0 sent {} bytes for {} values",
             bytes.size(), values.size());
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

void Runner::runOnWorker0(const std::function<void()>& work) {
  if (rank() == 0) work();
  if (state_->communicator && state_->synchronous) state_->communicator->barrier(kAsLongAsTheyLive);
}

void Runner::finish(ServedValues values) {
  if (state_->communicator) state_->leave(values);
}

void Runner::pullVariables() {
  if (state_->client && !state_->plan.empty()) state_->pullVariables();
}

void Runner::gatherModel() {
  // A pipeline's stages send their variables to worker 0 once their steps (and the APPLYs of the
  // served variables they hold) are done; worker 0 then fetches the served ones.
  if (state_->pipeline) state_->pipeline->gatherVariables(0);
  if (rank() == 0) pullVariables();
}

WholeValues Runner::gatherShards() {
  if (!state_->communicator) return {};
  return state_->gatherShards();
}

void Runner::publishVariables(const WholeValues& wholes) {
  if (state_->communicator) state_->publishVariables(wholes);
}

bool Runner::served() const { return state_->serverStatus >= 0; }
int Runner::serverStatus() const { return state_->serverStatus; }
int Runner::rank() const { return state_->rank(); }
int Runner::workers() const { return state_->workers(); }
int Runner::stages() const { return state_->pipeline ? state_->pipelineConfig.stages : 1; }
int Runner::replicas() const { return state_->replicas(); }
int Runner::replica() const { return rank() / stages(); }
bool Runner::synchronous() const { return state_->synchronous; }
std::string Runner::pipelinePlan() const { return state_->pipelinePlan; }
double Runner::pipelineIdleFraction() const { return state_->pipeline ? state_->pipeline->idleFraction() : 0; }
size_t Runner::pipelinePeakKeptBytes() const { return state_->pipeline ? state_->pipeline->peakKeptBytes() : 0; }
std::pair<size_t, size_t> Runner::pipelineGuesses() const {
  if (!state_->pipeline) return {0, 0};
  return {state_->pipeline->updatesGuessed(), state_->pipeline->updatesRedone()};
}
Session& Runner::session() {
  WEFT_CHECK(state_->session != nullptr || state_->pipeline != nullptr,
             "this process was a parameter server of the job: it has no session");
  return state_->activeSession();
}
const DistributedGraph& Runner::distribution() const { return state_->distribution; }

std::string Runner::shardingReport() {
  // A pipeline's shards are made by its first step.
  if (state_->pipeline ? state_->stageOfShard.empty() : state_->session == nullptr) return "";
  Session& session = state_->activeSession();
  size_t held = 0, whole = 0, all = 0, allWhole = 0;
  int sharded = 0;
  for (Node* v : state_->heldVariables()) {
    const size_t bytes = session.variable(v).bytes();
    const size_t wholeBytes =
        static_cast<size_t>(Graph::wholeShapeOf(*v).numel()) * dtypeSize(v->outputs[0].dtype);
    all += bytes;
    allWhole += wholeBytes;
    if (!Graph::isShard(*v)) continue;
    ++sharded;
    held += bytes;
    whole += wholeBytes;
  }
  if (sharded == 0) return "";
  return fmt::format(
      "sharded {} (1/{} each): this worker holds {} of {} bytes of its {} sharded variables; "
      "its variables take {} bytes, {} unsharded",
      state_->sharding == Sharding::Parameters ? "parameters and optimizer state" : "optimizer state", replicas(), held,
      whole, sharded, all, allWhole);
}

bool Runner::shardsParameters() const { return state_->sharding == Sharding::Parameters; }
const ServerPlan& Runner::serverPlan() const { return state_->plan; }
const std::vector<SparsityChoice>& Runner::sparsityChoices() const { return state_->sparsityChoices; }
Traffic Runner::traffic() const { return state_->traffic.snapshot(); }

bool Runner::handleStopRequests() {
  if (!state_->preemption) return false;
  state_->preemption->handle();
  return true;
}

bool Runner::stopRequested() const {
  return (state_->preemption && state_->preemption->requested()) || checkpointRequested();
}

namespace {

/// Copies worker rank 0's value of every variable the workers keep to this worker, in one
/// broadcast. The servers' variables, slots and moving averages are not sent: worker 0 loads
/// them into the servers, and a worker reads them from there until it pulls them all. Nor are
/// the shards a worker keeps of itself (State::scatterShards).
void broadcastVariables(Session& session, HostCollectives& workers, const ServerPlan& plan) {
  std::set<const Node*> served;
  for (const ServedVariable& v : plan.variables) {
    served.insert(v.variable);
    for (Node* held : v.heldState()) served.insert(held);
  }
  std::vector<Node*> variables;
  for (Node* v : session.graph().variables())
    if (!served.count(v) && !Graph::isShard(*v)) variables.push_back(v);
  size_t total = 0;
  for (Node* v : variables) total += session.variable(v).bytes();
  std::vector<uint8_t> buffer(total);
  size_t offset = 0;
  for (Node* v : variables) {
    const Tensor t = session.variable(v).to(cpu());
    std::memcpy(buffer.data() + offset, t.raw(), t.bytes());
    offset += t.bytes();
  }
  buffer = workers.broadcast(std::move(buffer), 0);
  offset = 0;
  for (Node* v : variables) {
    Tensor& t = session.variable(v);
    Tensor host = t.to(cpu());
    std::memcpy(host.raw(), buffer.data() + offset, t.bytes());
    if (host.raw() != t.raw()) t.copyFrom(host);
    offset += t.bytes();
  }
}

/// A conditional update (a loss scale's skipped step) runs where its condition is computed: on
/// the workers, from gradients that every worker has summed alike, so all skip together. The
/// parameter servers apply their variables' updates whatever a worker's condition, so a job
/// with a condition must keep every variable on the workers.
void refuseConditionalServedUpdates(const Graph& graph, const ServerPlan& plan) {
  if (plan.empty()) return;
  for (const auto& n : graph.nodes()) {
    WEFT_CHECK(!n->condition.valid(),
               "{} runs only when {} holds, which the parameter servers do not see: '{}' is updated there whatever "
               "the condition; keep every variable on the workers (Architecture::AllReduce, --arch ar) to train "
               "with conditional updates such as a loss scale's skipped steps",
               n->describe(), n->condition.name(), plan.variables.front().variable->name);
  }
}

}  // namespace

Runner makeWorker(JobContext job, Graph& graph, const Config& config) {
  WEFT_CHECK(!job.isServer(), "makeWorker: {} is a server of the job (serve it with serveJob)",
             describe(job.identity.id));
  checkConfig(config, {job.workers(), job.servers(), ""});
  const bool synchronous = config.sync->synchronous();
  if (config.pipeline.stages > 1) {
    auto state = std::make_unique<Runner::State>();
    state->joinPipeline(std::move(job), graph, config);
    return Runner(std::move(state));
  }
  auto state = std::make_unique<Runner::State>();
  state->timeout = config.timeout;
  state->synchronous = synchronous;
  state->sharding = config.sharding;
  state->job.emplace(std::move(job));
  JobContext& j = *state->job;
  limitPayloads(j, graph);
  state->ring = std::make_unique<Ring>(*j.transport, j.rank(), j.routes.workerPeers, config.timeout);
  state->ring->setMachines(j.routes.workerHosts, config.localAggregation);
  state->communicator = std::make_unique<Communicator>(*state->ring, state->traffic);
  CollectiveBackend* dense = state->communicator.get();
#ifdef WEFT_HAVE_NCCL
  if (j.gpuWorkers) {
    state->gpuSums = std::make_unique<NcclGroup>(j.roster.ncclId, j.workers(), j.rank(), j.device.index, state->traffic,
                                                 config.timeout);
    dense = state->gpuSums.get();
  }
#endif
  state->plan = planServersBySparsity(graph, config, j.servers(), j.routes.serverHosts, j.machines(),
                                      state->sparsityChoices);
  refuseConditionalServedUpdates(graph, state->plan);
  if (j.servers() > 0) {
    state->client = std::make_unique<ServerClient>(state->traffic, *j.clientTransport, j.rank(), j.routes.serverPeers,
                                                   state->plan, config.timeout, j.relay(), config.sync,
                                                   config.wireDType);
  }
  TransformOptions options;
  options.hostRing = state->communicator->id();
  options.denseBackend = dense->id();
  options.denseOnGpu = dense->device() == DeviceType::CUDA;
  options.workers = j.workers();
  options.averageDense = config.averageDense;
  options.averageSparse = config.averageSparse;
  options.bucketBytes = config.bucketBytes;
  options.wireDType = config.wireDType;
  WEFT_CHECK(!options.denseOnGpu || config.wireDType == DType::F32,
             "--wire-dtype {}: GPU workers sum their dense gradients through NCCL, which this setting does not narrow",
             dtypeName(config.wireDType));
  options.synchronous = synchronous;
  options.shardOptimizer = config.sharding != Sharding::None;
  options.shardParameters = config.sharding == Sharding::Parameters;
  options.rank = state->communicator->rank();
  WEFT_CHECK(!options.denseOnGpu || !options.shardOptimizer,
             "--shard {}: GPU workers sum their dense gradients through NCCL, whose reduce-scatter weft does not use "
             "yet; sharding runs among CPU workers", shardingName(config.sharding));
  for (const SparsityChoice& c : state->sparsityChoices) {
    if (!c.allReduce) continue;
    WEFT_CHECK(!options.denseOnGpu, "{}: summing a sparse gradient by AllReduce runs on CPU workers only",
               c.describe());
    options.allReducedSparse.push_back(graph.find(c.variable));
  }
  state->distribution =
      applyPasses(graph, dataParallelPasses(options, state->plan, state->client ? state->client->id() : -1));
  for (const SyncedVariable& v : state->distribution.variables) {
    WEFT_CHECK(synchronous || v.onServers,
               "{}: variable '{}' cannot be served (no optimizer update computed from its gradient writes it) and "
               "would be summed over the workers at every step, which holds them to the same step",
               config.sync->name(), v.variable->name);
  }
  SessionOptions session = config.session;
  session.replica = j.rank();  // each worker feeds the rank-th part of the total batch
  state->session = std::make_unique<Session>(graph, session);
  state->publishVariables({});  // every worker starts from worker 0's variables
  return Runner(std::move(state));
}

Runner get_runner(Graph& graph, const ResourceSpec& resources, const Config& config) {
  std::optional<JobContext> job = joinJob(resources, config);
  if (!job) {
    const size_t workers = resources.workers().size();
    WEFT_CHECK(workers == 1,
               "the resource specification has {} workers, but this process was not started by the launcher "
               "(WEFT_COORDINATOR is unset): run it with `weft launch`",
               workers);
    auto state = std::make_unique<Runner::State>();
    if (config.pipeline.microbatches > 1) {
      WEFT_CHECK(config.pipeline.stages == 1, "a pipeline of {} stages needs as many worker processes: run it with "
                 "`weft launch` (or --stages in `weft train`)", config.pipeline.stages);
      state->accumulateLocally(graph, config);
    } else {
      state->session = std::make_unique<Session>(graph, config.session);
    }
    return Runner(std::move(state));
  }
  checkConfig(config, {job->workers(), job->servers(), resources.sharedGpu()});
  if (job->isServer()) {
    auto state = std::make_unique<Runner::State>();
    state->serverStatus = serveJob(*job, graph, config);
    if (state->serverStatus == 0) job->leave();
    return Runner(std::move(state));  // the job's transports close here, once served
  }
  return makeWorker(std::move(*job), graph, config);
}

namespace {

/// `options`, with WEFT_SERVERS_PER_HOST over its servers per host (as a job's command line gives
/// them to a program that does not read flags of its own).
EngineOptions engineOptions(EngineOptions options) {
  const char* servers = std::getenv("WEFT_SERVERS_PER_HOST");
  if (servers == nullptr || !*servers) return options;
  char* end = nullptr;
  const long k = std::strtol(servers, &end, 10);
  WEFT_CHECK(*end == '\0' && k >= 0 && k < 1024, "WEFT_SERVERS_PER_HOST='{}' is not a count of servers", servers);
  options.serversPerHost = static_cast<int>(k);
  return options;
}

}  // namespace

Runner get_runner(Graph& graph, const Config& config) {
  std::shared_ptr<EngineJob> engine;
  std::shared_ptr<Preemption> preemption;
  if (!launchIdentityFromEnvironment()) {
    const std::optional<EngineView> view = detectEngine(processEnvironment());
    if (view && view->size > 1) {
      engine = std::make_shared<EngineJob>(*view, engineOptions(config.engine));
      // A server takes SIGTERM as a request from the start: it serves until its workers stop.
      const bool server = engine->layout().self.role == Role::Server;
      preemption = std::make_shared<Preemption>(config.engine.termGrace, server);
    }
  }
  std::optional<ResourceSpec> resources = ResourceSpec::fromEnvironment();
  if (!resources) {
    WEFT_CHECK(!launchIdentityFromEnvironment(), "this process was launched (WEFT_COORDINATOR is set) without its "
               "job's specification in {}: start it with `weft launch`", kResourcesVariable);
    resources = ResourceSpec::localCpu(1, 0);
  }
  Runner runner = get_runner(graph, *resources, withLaunchSettings(config));
  runner.state_->engine = std::move(engine);
  runner.state_->preemption = std::move(preemption);
  // A server of a job its engine stopped says so, as its workers do.
  if (runner.served() && runner.serverStatus() == 0 && runner.stopRequested())
    runner.state_->serverStatus = kExitPreempted;
  return runner;
}

}  // namespace weft::dist
