#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "dist/amp/Payloads.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <algorithm>

namespace weft::amp {

namespace {

/// Heavy nodes (transforms and losses) in turn over the workers of every process; the others
/// beside the node whose output they read first, so a message rarely changes thread between two
/// heavy nodes. Inputs run where the controller is (worker 0), and the replicas of a transform
/// in the process of the first, whose variables they average in memory.
std::vector<int> assignWorkers(const Graph& g, int perProcess, int processes) {
  const int workers = perProcess * processes;
  std::vector<int> worker(g.nodes().size(), -1);
  std::map<int, int> groupFirst;  // replica group -> its first member's worker
  int next = 0;
  for (const amp::Node& n : g.nodes()) {
    int& w = worker[static_cast<size_t>(n.id)];
    if (n.worker >= 0) {
      WEFT_CHECK(n.worker < workers, "amp: node '{}' asks for worker {} of {}", n.name, n.worker, workers);
      w = n.worker;
    } else if (n.kind == NodeKind::Input) {
      w = 0;
    } else if (n.kind == NodeKind::Transform || n.kind == NodeKind::Loss) {
      w = next++ % workers;
    }
    if (n.replicaGroup < 0) continue;
    auto [first, fresh] = groupFirst.emplace(n.replicaGroup, w);
    const int process = first->second / perProcess;
    if (!fresh && n.worker < 0) w = process * perProcess + (w % perProcess);
    WEFT_CHECK(w / perProcess == process,
               "amp: replica '{}' is on worker {}, in another process than its first replica's "
               "worker {}; replicas average in memory, so they share a process",
               n.name, w, first->second);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (const amp::Node& n : g.nodes()) {
      if (worker[static_cast<size_t>(n.id)] >= 0) continue;
      for (const Port& p : n.inputs)
        if (worker[static_cast<size_t>(p.node)] >= 0) {
          worker[static_cast<size_t>(n.id)] = worker[static_cast<size_t>(p.node)];
          changed = true;
          break;
        }
    }
  }
  for (int& w : worker)
    if (w < 0) w = 0;
  return worker;
}

}  // namespace

Runtime::Runtime(Graph& graph, AmpOptions options, AmpProcesses processes) : options_(options) {
  WEFT_CHECK(options.workers >= 1, "amp: workers must be at least 1, not {}", options.workers);
  WEFT_CHECK(options.maxActiveKeys >= 1, "amp: max active keys must be at least 1, not {}", options.maxActiveKeys);
  WEFT_CHECK(options.minUpdateFrequency >= 1, "amp: min update frequency must be at least 1, not {}",
             options.minUpdateFrequency);
  WEFT_CHECK(options.minibatch >= 0 && options.replicaSyncEvery >= 0,
             "amp: minibatch {} and replica sync {} must not be negative", options.minibatch, options.replicaSyncEvery);
  WEFT_CHECK(processes.count >= 1 && processes.rank >= 0 && processes.rank < processes.count,
             "amp: process {} of {}", processes.rank, processes.count);
  WEFT_CHECK(processes.count == 1 ||
                 (processes.transport != nullptr && static_cast<int>(processes.peers.size()) == processes.count),
             "amp: a job of {} processes needs a transport and a peer per process", processes.count);
  graph.verify();
  impl_ = std::make_unique<Impl>(graph, options, processes);
  std::vector<int> workerOf = assignWorkers(graph, options.workers, processes.count);
  std::map<int, ReplicaGroup*> groups;
  impl_->nodes.resize(graph.nodes().size());
  for (const amp::Node& n : graph.nodes()) {
    NodeRt& rt = impl_->nodes[static_cast<size_t>(n.id)];
    rt.spec = &n;
    rt.worker = workerOf[static_cast<size_t>(n.id)];
    rt.sent.assign(static_cast<size_t>(n.outputs), 0);
    rt.answered.assign(static_cast<size_t>(n.outputs), 0);
    if (!impl_->isLocal(rt)) continue;  // another process runs it
    if (n.kind == NodeKind::Transform || n.kind == NodeKind::Loss) {
      std::vector<TensorType> inputs;
      for (const Port& p : n.inputs) inputs.push_back(graph.node(p.node).outputTypes.at(static_cast<size_t>(p.output)));
      optim::Optimizer* opt = n.transform.optimizer ? n.transform.optimizer.get() : options.optimizer.get();
      rt.compiled = compileTransform(n, inputs, opt, true, options.device);
      rt.minUpdateFrequency =
          n.transform.minUpdateFrequency > 0 ? n.transform.minUpdateFrequency : options.minUpdateFrequency;
    }
    if (n.replicaGroup >= 0) {
      auto [it, fresh] = groups.emplace(n.replicaGroup, nullptr);
      if (fresh) it->second = &impl_->replicaGroups.emplace_back();
      rt.replicas = it->second;
      rt.replicaIndex = it->second->members++;
    }
  }
  for (ReplicaGroup& g : impl_->replicaGroups) g.posted.resize(static_cast<size_t>(g.members));
  // Replicas start equal: each takes the first one's initial values.
  std::map<ReplicaGroup*, NodeRt*> first;
  for (NodeRt& n : impl_->nodes) {
    if (n.replicas == nullptr) continue;
    auto [it, fresh] = first.emplace(n.replicas, &n);
    if (fresh) continue;
    std::vector<Tensor*> from = impl_->trainedValues(*it->second), to = impl_->trainedValues(n);
    for (size_t i = 0; i < to.size(); ++i) to[i]->copyFrom(*from[i]);
  }
  impl_->reports.resize(static_cast<size_t>(processes.count));
  for (int i = 0; i < options.workers; ++i) impl_->workers.push_back(std::make_unique<Worker>());
  for (int i = 0; i < options.workers; ++i)
    impl_->workers[static_cast<size_t>(i)]->thread = std::thread([this, i] { impl_->workerLoop(i); });
  if (processes.count > 1) impl_->comm = std::thread([this] { impl_->commLoop(); });
}

Runtime::~Runtime() {
  impl_->stopWorkers();
  // What this process last said (its report, a failure) leaves before the transport's thread.
  for (auto until = Clock::now() + std::chrono::seconds(5);
       impl_->comm.joinable() && !impl_->commEnded && Clock::now() < until;) {
    {
      std::lock_guard<std::mutex> lock(impl_->outboxMutex);
      if (impl_->outbox.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->commStopping = true;
  if (impl_->comm.joinable()) impl_->comm.join();
}

void Runtime::Impl::checkDrained() {
  for (const NodeRt& n : nodes) {
    auto report = [&](size_t held, const State& example, const char* what) {
      WEFT_THROW(
          "amp: after every instance finished, {} '{}' still holds {} {} (e.g. {}): a message was never answered",
          kindName(n.spec->kind), n.spec->name, held, what, example.str());
    };
    if (!n.kept.empty()) report(n.kept.size(), n.kept.begin()->first, "forward message(s)");
    if (!n.joins.empty()) report(n.joins.size(), n.joins.begin()->first, "partial join(s)");
    if (!n.gradJoins.empty()) report(n.gradJoins.size(), n.gradJoins.begin()->first, "partial gradient sum(s)");
    if (!n.parentOf.empty()) report(n.parentOf.size(), n.parentOf.begin()->first, "unanswered message(s)");
  }
}

const NodeRt& Runtime::Impl::transformOwning(const std::string& variable) const {
  const NodeRt* owner = nullptr;
  for (const NodeRt& n : nodes) {
    const std::string& node = n.spec->name;
    if (n.spec->kind == NodeKind::Transform && variable.size() > node.size() + 1 &&
        variable.rfind(node + "/", 0) == 0 && (owner == nullptr || node.size() > owner->spec->name.size()))
      owner = &n;
  }
  WEFT_CHECK(owner != nullptr, "amp: the checkpoint's variable '{}' belongs to no transform of this graph", variable);
  return *owner;
}

void Runtime::Impl::restoreLocal(const std::vector<std::pair<std::string, Tensor>>& given) {
  std::map<std::string, const Tensor*> unused;
  for (const auto& [name, value] : given)
    WEFT_CHECK(unused.emplace(name, &value).second, "amp: the checkpoint holds variable '{}' twice", name);
  std::vector<std::string> problems;
  std::vector<std::pair<Tensor*, const Tensor*>> writes;
  for (NodeRt& n : nodes) {
    if (!isLocal(n) || !n.compiled || n.spec->kind != NodeKind::Transform) continue;
    for (weft::Node* v : n.compiled->graph->variables()) {
      const std::string name = n.spec->name + "/" + v->name;
      Tensor& now = n.compiled->session->variable(v);
      const auto it = unused.find(name);
      if (it == unused.end()) {
        problems.push_back(
            fmt::format("'{}' ({}{}) is not in the checkpoint", name, dtypeName(now.dtype()), now.shape().str()));
        continue;
      }
      const Tensor& saved = *it->second;
      if (saved.dtype() != now.dtype() || saved.shape() != now.shape()) {
        problems.push_back(fmt::format("'{}' is {}{} in the checkpoint, {}{} in this graph", name,
                                       dtypeName(saved.dtype()), saved.shape().str(), dtypeName(now.dtype()),
                                       now.shape().str()));
      } else {
        writes.emplace_back(&now, &saved);
      }
      unused.erase(it);
    }
  }
  for (const auto& [name, value] : unused)
    problems.push_back(
        fmt::format("'{}' is in the checkpoint, but no transform of process {} has it", name, processes.rank));
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    const std::string message =
        fmt::format("amp: process {} cannot resume from the checkpoint:{}", processes.rank, list);
    if (processes.rank != 0) tellFailure(message);
    WEFT_THROW("{}", message);
  }
  for (auto& [now, saved] : writes) now->copyFrom(*saved);
}

EpochReport Runtime::Impl::runEpoch(int64_t count, const std::function<Pumped(int64_t)>& makeInstance, bool train) {
  beginEpoch(count, makeInstance, train);
  const Clock::time_point start = Clock::now();
  if (processes.rank != 0) return runFollowerEpoch(count, start);
  Activity activity{start};
  std::unique_lock<std::mutex> lock(doneMutex);
  try {
    for (int r = 1; r < processes.count; ++r) nextControl(lock, {WireKind::Ready});
    controlEpoch(lock, count, activity);
    if (failure.empty() && processes.count > 1) {
      // The epoch's loss and accuracy go with its end, so every process reports (and decides) alike.
      WireMessage end = control(WireKind::EpochEnd);
      for (const auto& r : records) end.loss += r->loss, end.hits += r->hits, end.count += r->count;
      for (int r = 1; r < processes.count; ++r) post(r, end);
      for (int r = 1; r < processes.count; ++r) nextControl(lock, {WireKind::Report});
    }
  } catch (const std::exception& e) {
    if (failure.empty()) failure = e.what();
  }
  if (!failure.empty()) throwFailure(lock);
  // The workers finish their bookkeeping (busy times) after returning the last credit.
  doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
  lock.unlock();
  activity.change(0);
  checkDrained();
  EpochReport report = summarise(count, start, activity.activeTime, activity.peak);
  records.clear();
  return report;
}

void Runtime::Impl::beginEpoch(int64_t count, const std::function<Pumped(int64_t)>& makeInstance, bool train) {
  {
    std::lock_guard<std::mutex> lock(doneMutex);
    WEFT_CHECK(failure.empty(), "amp: the runtime failed earlier and cannot run again: {}", failure);
  }
  WEFT_CHECK(count >= 0, "amp: {} instances", count);
  training = train;
  make = &makeInstance;
  records.clear();
  firstInstance = nextInstanceId;
  finished.clear();
  for (NodeRt& n : nodes) {
    n.forwards = n.backwards = n.gradients = n.updatesReported = 0;
    n.sent.assign(static_cast<size_t>(n.spec->outputs), 0);
    n.answered.assign(static_cast<size_t>(n.spec->outputs), 0);
    n.stalenessSum = n.stalenessMax = n.stalenessCount = 0;
    n.busy = 0;
  }
  for (auto& w : workers) w->busy = 0;
  records.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) records.push_back(std::make_unique<InstanceRecord>());
}

EpochReport Runtime::Impl::runFollowerEpoch(int64_t count, Clock::time_point start) {
  try {
    post(0, control(WireKind::Ready));  // no message of this epoch may reach it before now
    followEpoch();
  } catch (const std::exception& e) {
    fail(e.what());
    stopWorkers();
    throw;
  }
  nextInstanceId += count;
  EpochReport local = summarise(count, start, 0, 0);
  records.clear();
  return local;
}

namespace {

/// Whether the job still moves: messages processed or instances finished since the last look.
struct ProgressWatch {
  int64_t processed = -1, done = -1;
  Clock::time_point since = Clock::now();

  /// True when neither changed for longer than `timeout`.
  bool stalled(int64_t processedNow, int64_t doneNow, std::chrono::milliseconds timeout) {
    if (processedNow != processed || doneNow != done) {
      processed = processedNow, done = doneNow, since = Clock::now();
      return false;
    }
    return Clock::now() - since > timeout;
  }
};

}  // namespace

void Runtime::Impl::controlEpoch(std::unique_lock<std::mutex>& lock, int64_t count, Activity& activity) {
  const int minibatch = training ? options.minibatch : 0;
  int64_t pumped = 0, done = 0;
  int64_t batchStart = 0, batchEnd = minibatch > 0 ? std::min<int64_t>(count, minibatch) : count;
  ProgressWatch watch;
  while (done < count) {
    while (failure.empty() && pumped < batchEnd && activity.active < options.maxActiveKeys) {
      lock.unlock();
      try {
        pumpInstance(pumped++, activity);
      } catch (...) {
        lock.lock();
        throw;
      }
      lock.lock();
    }
    // Idle workers mean something only in one process: elsewhere work may be under way.
    doneChanged.wait_for(lock, std::chrono::milliseconds(200), [&] {
      return !failure.empty() || !finished.empty() || (processes.count == 1 && outstandingTasks.load() == 0);
    });
    if (!failure.empty()) return;
    for (size_t i = 0; i < finished.size(); ++i) ++done, activity.change(-1);
    finished.clear();
    if (processes.count == 1 && done < pumped && outstandingTasks.load() == 0) {
      failStuck(pumped);
      return;
    }
    if (watch.stalled(processed.load(), done, options.timeout) && done < pumped) {
      failure = stallReport();
      return;
    }
    if (minibatch > 0 && done == batchEnd) {
      updateEverywhere(lock, batchEnd - batchStart);
      if (!failure.empty()) return;
      batchStart = batchEnd;
      batchEnd = std::min<int64_t>(count, batchEnd + minibatch);
    }
  }
}

void Runtime::Impl::pumpInstance(int64_t index, Activity& activity) {
  Pumped p = (*make)(index);
  WEFT_CHECK(p.instance != nullptr && !p.entries.empty(), "amp: instance {} has no data or no messages", index);
  const int64_t id = nextInstanceId++;
  records[static_cast<size_t>(index)]->data = p.instance;
  for (const Pumped::Entry& e : p.entries) {
    WEFT_CHECK(e.input.valid() && e.input.node < static_cast<int>(nodes.size()) &&
                   graph.node(e.input.node).kind == NodeKind::Input,
               "amp: instance {} enters the graph at node {}, which is not an input", index, e.input.node);
    const TensorType& type = graph.node(e.input.node).outputTypes[0];
    WEFT_CHECK(e.payload.dtype() == type.dtype && type.shape.compatibleWith(e.payload.shape()),
               "amp: instance {} sends {}{} to input '{}', which takes {}", index, dtypeName(e.payload.dtype()),
               e.payload.shape().str(), graph.node(e.input.node).name, type.str());
  }
  Flow flow{Credit::whole(), {}, 0, 0, 0, false};
  for (Pumped::Entry& e : p.entries) {
    e.state.instance = id;
    flow.out.push_back({Task::Kind::Forward, e.input.node, 0, std::move(e.payload), e.state});
  }
  activity.change(+1);
  finishFlow(flow, State{id});
}

void Runtime::Impl::updateEverywhere(std::unique_lock<std::mutex>& lock, int64_t instances) {
  lock.unlock();
  queueUpdates(instances);
  for (int r = 1; r < processes.count; ++r) post(r, control(WireKind::Update, instances));
  lock.lock();
  for (int r = 1; r < processes.count; ++r) nextControl(lock, {WireKind::Updated});
  doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
}

void Runtime::Impl::failStuck(int64_t pumped) {
  for (int64_t i = 0; i < pumped; ++i)
    if (!records[static_cast<size_t>(i)]->returned.isWhole()) {
      stuckInstance = firstInstance + i;
      break;
    }
  failure = fmt::format("amp: instance {} can go no further: its messages wait for partners that never come",
                        stuckInstance);
}

void Runtime::Impl::throwFailure(std::unique_lock<std::mutex>& lock) {
  std::string message = failure;
  lock.unlock();
  tellFailure(message);
  stopWorkers();
  if (stuckInstance >= 0) message += heldMessages(stuckInstance);
  WEFT_THROW("{}", message);
}

EpochReport Runtime::train(int64_t count, const std::function<Pumped(int64_t)>& make) {
  EpochReport report = impl_->runEpoch(count, make, true);
  if (options_.replicaSyncEvery == 0) syncReplicas();
  return report;
}

EpochReport Runtime::evaluate(int64_t count, const std::function<Pumped(int64_t)>& make) {
  return impl_->runEpoch(count, make, false);
}

std::map<std::string, Tensor> Runtime::variables() const {
  std::map<std::string, Tensor> out = impl_->remoteVariables;
  for (NodeRt& n : impl_->nodes)
    if (n.compiled && n.spec->kind == NodeKind::Transform)
      for (weft::Node* v : n.compiled->graph->variables())
        out[n.spec->name + "/" + v->name] = hostCopy(n.compiled->session->variable(v));
  return out;
}

void Runtime::setVariable(const std::string& name, const Tensor& value) {
  for (NodeRt& n : impl_->nodes) {
    if (!n.compiled || name.rfind(n.spec->name + "/", 0) != 0) continue;
    weft::Node* v = n.compiled->graph->find(name.substr(n.spec->name.size() + 1));
    if (v == nullptr) continue;
    Tensor& t = n.compiled->session->variable(v);
    WEFT_CHECK(t.dtype() == value.dtype() && t.shape() == value.shape(), "amp: variable '{}' is {}{}, not {}{}", name,
               dtypeName(t.dtype()), t.shape().str(), dtypeName(value.dtype()), value.shape().str());
    t.copyFrom(value);
    return;
  }
  WEFT_THROW("amp: no variable '{}' in this process", name);
}

int Runtime::workerOf(int node) const { return impl_->nodes.at(static_cast<size_t>(node)).worker; }

}  // namespace weft::amp
