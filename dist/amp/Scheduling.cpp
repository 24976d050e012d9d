// The workers of this process: their queues (control first, then backward, then forward
// messages), the tasks they run, and the credit each instance's messages carry.
#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "core/Trace.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <deque>

namespace weft::amp {

const char* workerTrack(int worker) {
  static std::mutex mutex;
  static std::deque<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<int>(names.size()) <= worker) names.push_back(fmt::format("amp worker {}", names.size()));
  return names[static_cast<size_t>(worker)].c_str();
}

thread_local Flow* currentFlow = nullptr;

InstanceRecord& Runtime::Impl::record(int64_t instance) {
  int64_t i = instance - firstInstance;
  WEFT_CHECK(i >= 0 && i < static_cast<int64_t>(records.size()),
             "amp: a message names instance {}, which is not in flight", instance);
  return *records[static_cast<size_t>(i)];
}

/// The data of an instance; a process other than the controller's makes it on first use, as
/// the controller did (every process's model makes the same instances).
const Instance& Runtime::Impl::instanceOf(const State& s) {
  InstanceRecord& r = record(s.instance);
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.data) r.data = (*make)(s.instance - firstInstance).instance;
  WEFT_CHECK(r.data != nullptr, "amp: instance {} has no data", s.instance);
  return *r.data;
}

void Runtime::Impl::push(int node, Task task) {
  task.node = node;
  if (currentFlow != nullptr) currentFlow->out.push_back(std::move(task));
  else dispatch(std::move(task));
}

void Runtime::Impl::dispatch(Task task) {
  NodeRt& n = nodes[static_cast<size_t>(task.node)];
  if (!isLocal(n)) {
    WireMessage m;
    m.kind = task.kind == Task::Kind::Backward ? WireKind::Backward : WireKind::Forward;
    m.node = task.node;
    m.port = task.port;
    m.state = task.state;
    m.credit = task.credit;
    m.tensor = std::move(task.payload);
    post(processOf(n.worker), std::move(m));
    return;
  }
  outstandingTasks.fetch_add(1);
  Worker& w = localWorker(n);
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    (task.kind == Task::Kind::Backward ? w.backward : task.kind == Task::Kind::Forward ? w.forward : w.control)
        .push_back(std::move(task));
  }
  w.ready.notify_one();
}

void Runtime::Impl::sendForward(int node, int output, Tensor payload, const State& state) {
  ++nodes[static_cast<size_t>(node)].sent[static_cast<size_t>(output)];
  auto [reader, input] = graph.consumer({node, output});
  push(reader, {Task::Kind::Forward, reader, input, std::move(payload), state});
}

void Runtime::Impl::sendBackward(const amp::Node& node, int input, Tensor grad, const State& state) {
  const Port& from = node.inputs[static_cast<size_t>(input)];
  push(from.node, {Task::Kind::Backward, from.node, from.output, std::move(grad), state});
}

/// Sends what a task produced, each message with a share of its credit; a task that sent
/// nothing returns its credit, and what a loss measured goes to the controller either way.
/// A measured loss returns with a share of its own, so the instance cannot finish before the
/// controller has its loss.
void Runtime::Impl::finishFlow(Flow& flow, const State& state) {
  const size_t k = flow.out.size() + (flow.measured && !flow.out.empty() ? 1 : 0);
  if (!flow.out.empty()) {
    std::vector<Credit> shares = flow.credit.split(k);
    for (size_t i = 0; i < flow.out.size(); ++i) {
      flow.out[i].credit = std::move(shares[i]);
      dispatch(std::move(flow.out[i]));
    }
    flow.credit = flow.measured ? std::move(shares.back()) : Credit();
  }
  if (!flow.credit.empty() || flow.measured) giveBack(state.instance, std::move(flow.credit), flow);
}

void Runtime::Impl::giveBack(int64_t instance, Credit credit, const Flow& measured) {
  if (processes.rank != 0) {
    WireMessage m;
    m.kind = WireKind::Credit;
    m.state.instance = instance;
    m.credit = std::move(credit);
    m.loss = measured.loss, m.hits = measured.hits, m.count = measured.count;
    post(0, std::move(m));
    return;
  }
  std::lock_guard<std::mutex> lock(doneMutex);
  InstanceRecord& r = record(instance);
  r.loss += measured.loss, r.hits += measured.hits, r.count += measured.count;
  const bool returning = !credit.empty();
  r.returned.add(credit);
  WEFT_CHECK(!r.returned.exceedsWhole(), "amp: instance {} returned more credit than it was given", instance);
  if (returning && r.returned.isWhole()) {
    finished.push_back(instance);
    doneChanged.notify_all();
  }
}

/// A message that waits in a join keeps its credit there until the join completes.
void Runtime::Impl::hold(Join& j) {
  j.credit.add(currentFlow->credit);
  currentFlow->credit = Credit();
}

void Runtime::Impl::release(Join& j) {
  currentFlow->credit.add(j.credit);
  j.credit = Credit();
}

void Runtime::Impl::workerLoop(int index) {
  Worker& w = *workers[static_cast<size_t>(index)];
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(w.mutex);
      w.ready.wait(lock, [&] { return stopping || !w.control.empty() || !w.backward.empty() || !w.forward.empty(); });
      if (stopping) return;
      auto& queue = !w.control.empty() ? w.control : !w.backward.empty() ? w.backward : w.forward;
      task = std::move(queue.front());
      queue.pop_front();
    }
    NodeRt& n = nodes[static_cast<size_t>(task.node)];
    auto start = Clock::now();
    w.currentSince.store(start.time_since_epoch().count());
    w.currentNode.store(task.node);
    Flow flow{std::move(task.credit), {}, 0, 0, 0, false};
    try {
      currentFlow = &flow;
      process(n, task);
      currentFlow = nullptr;
      if (task.kind != Task::Kind::Update) finishFlow(flow, task.state);
    } catch (const std::exception& e) {
      currentFlow = nullptr;
      fail(fmt::format("amp: worker {} failed in {} '{}' on {}: {}", processes.rank * options.workers + index,
                       kindName(n.spec->kind), n.spec->name, task.state.str(), e.what()));
    }
    auto end = Clock::now();
    w.currentNode.store(-1);
    double spent = seconds(end - start);
    n.busy += spent;
    w.busy += spent;
    if (options.trace && task.kind != Task::Kind::Update)
      traceEvent(fmt::format("{} {}", n.spec->name, task.state.instance),
                 task.kind == Task::Kind::Forward ? "forward" : "backward", workerTrack(index), start, end);
    std::lock_guard<std::mutex> lock(doneMutex);
    processed.fetch_add(1);
    if (outstandingTasks.fetch_sub(1) == 1) doneChanged.notify_all();
  }
}

void Runtime::Impl::queueUpdates(int64_t instances) {
  for (NodeRt* n : parameterised()) {
    outstandingTasks.fetch_add(1);
    Worker& w = localWorker(*n);
    {
      std::lock_guard<std::mutex> lock(w.mutex);
      w.control.push_back({Task::Kind::Update, n->spec->id, static_cast<int>(instances), {}, {}, {}});
    }
    w.ready.notify_one();
  }
}

void Runtime::Impl::stopWorkers() {
  stopping = true;
  for (auto& w : workers) {
    { std::lock_guard<std::mutex> lock(w->mutex); }
    w->ready.notify_all();
  }
  for (auto& w : workers)
    if (w->thread.joinable()) w->thread.join();
}

std::vector<NodeRt*> Runtime::Impl::parameterised() {
  std::vector<NodeRt*> out;
  for (NodeRt& n : nodes)
    if (n.compiled && n.compiled->updateStep != nullptr) out.push_back(&n);
  return out;
}

}  // namespace weft::amp
