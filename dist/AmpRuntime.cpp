#include "dist/AmpRuntime.h"

#include "core/Error.h"
#include "core/Session.h"
#include "core/Trace.h"
#include "dist/AmpWire.h"
#include "dist/Transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace weft::amp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- payload arithmetic on the host (payloads are one instance's values: small) ----

void addInto(Tensor& sum, const Tensor& x) {
  if (!x.defined()) return;
  if (!sum.defined()) {
    sum = x.clone();
    return;
  }
  WEFT_CHECK(sum.dtype() == x.dtype() && sum.shape() == x.shape(), "amp: adding gradients {}{} and {}{}",
             dtypeName(sum.dtype()), sum.shape().str(), dtypeName(x.dtype()), x.shape().str());
  int64_t n = sum.numel();
  if (sum.dtype() == f64) {
    double* s = sum.data<double>();
    const double* v = x.data<double>();
    for (int64_t i = 0; i < n; ++i) s[i] += v[i];
  } else {
    WEFT_CHECK(sum.dtype() == f32, "amp: gradients of dtype {} cannot be summed", dtypeName(sum.dtype()));
    float* s = sum.data<float>();
    const float* v = x.data<float>();
    for (int64_t i = 0; i < n; ++i) s[i] += v[i];
  }
}

Tensor scaled(const Tensor& x, double factor) {
  Tensor out = x.clone();
  if (out.dtype() == f64) {
    for (int64_t i = 0; i < out.numel(); ++i) out.data<double>()[i] *= factor;
  } else {
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = static_cast<float>(out.data<float>()[i] * factor);
  }
  return out;
}

int64_t lastWidth(const Tensor& t) { return t.rank() == 0 ? 1 : t.shape()[t.rank() - 1]; }

Tensor concatLast(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  int64_t width = 0;
  for (const Tensor& p : parts) {
    WEFT_CHECK(p.dtype() == parts[0].dtype() && p.rank() == shape.rank() && p.rank() >= 1 &&
                   p.numel() / lastWidth(p) == parts[0].numel() / lastWidth(parts[0]),
               "amp: concatenating payloads {} and {}", parts[0].shape().str(), p.shape().str());
    width += lastWidth(p);
  }
  shape[shape.rank() - 1] = width;
  Tensor out(parts[0].dtype(), shape);
  size_t element = dtypeSize(out.dtype());
  int64_t rows = out.numel() / std::max<int64_t>(width, 1);
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (const Tensor& p : parts) {
      size_t bytes = static_cast<size_t>(lastWidth(p)) * element;
      std::memcpy(dst, static_cast<const char*>(p.raw()) + static_cast<size_t>(r) * bytes, bytes);
      dst += bytes;
    }
  return out;
}

std::vector<Tensor> splitLast(const Tensor& x, const std::vector<int64_t>& widths) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  WEFT_CHECK(x.rank() >= 1 && lastWidth(x) == total, "amp: splitting a payload {} into widths summing to {}",
             x.shape().str(), total);
  size_t element = dtypeSize(x.dtype());
  int64_t rows = x.numel() / std::max<int64_t>(total, 1);
  std::vector<Tensor> parts;
  std::vector<char*> dst;
  for (int64_t w : widths) {
    Shape s = x.shape();
    s[s.rank() - 1] = w;
    parts.emplace_back(x.dtype(), s);
    dst.push_back(static_cast<char*>(parts.back().raw()));
  }
  const char* src = static_cast<const char*>(x.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < widths.size(); ++i) {
      size_t bytes = static_cast<size_t>(widths[i]) * element;
      std::memcpy(dst[i], src, bytes);
      dst[i] += bytes;
      src += bytes;
    }
  return parts;
}

Tensor stackRows(const std::vector<Tensor>& rows) {
  std::vector<int64_t> dims = rows[0].shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(rows.size()));
  Tensor out(rows[0].dtype(), Shape(dims));
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& r : rows) {
    WEFT_CHECK(r.dtype() == rows[0].dtype() && r.shape() == rows[0].shape(), "amp: grouping payloads {} and {}",
               rows[0].shape().str(), r.shape().str());
    std::memcpy(dst, r.raw(), r.bytes());
    dst += r.bytes();
  }
  return out;
}

Tensor row(const Tensor& x, int64_t i) {
  std::vector<int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
  Tensor out(x.dtype(), Shape(dims));
  std::memcpy(out.raw(), static_cast<const char*>(x.raw()) + static_cast<size_t>(i) * out.bytes(), out.bytes());
  return out;
}

/// Gradients of payloads no gradient reaches (an id) travel as empty tensors: zero.
std::vector<Tensor> rowsOrEmpty(const Tensor& grad, int64_t n) {
  std::vector<Tensor> rows(static_cast<size_t>(n));
  if (grad.defined())
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = row(grad, i);
  return rows;
}

Tensor stackOrEmpty(std::vector<Tensor>& rows) {
  const Tensor* any = nullptr;
  for (const Tensor& r : rows)
    if (r.defined()) any = &r;
  if (any == nullptr) return {};
  for (Tensor& r : rows)
    if (!r.defined()) r = Tensor::zeros(any->dtype(), any->shape());
  return stackRows(rows);
}

const char* workerTrack(int worker) {
  static std::mutex mutex;
  static std::deque<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<int>(names.size()) <= worker) names.push_back(fmt::format("amp worker {}", names.size()));
  return names[static_cast<size_t>(worker)].c_str();
}

// ---- the compiled subgraph of a transform or a loss ----

struct Param {
  std::string name;
  Output variable;
  Grad grad;
  Output densePh, indicesPh, valuesPh;
  Tensor sum;                         // dense gradients summed
  std::vector<Tensor> indices, values;  // sparse gradients gathered
};

struct Compiled {
  std::unique_ptr<weft::Graph> graph;
  std::unique_ptr<Session> session;
  std::vector<Output> payloads, fromState;
  Output y, dy;
  std::vector<Output> kept;        // forward values the backward pass reads
  std::vector<Output> inputGrads;  // per payload; invalid where none flows
  std::vector<Param> params;
  weft::Node* updateStep = nullptr;
  LossOutputs loss;
  Output lossGrad;
};

bool isBackward(const weft::Node* n, size_t forwardEnd) { return static_cast<size_t>(n->id) >= forwardEnd; }

std::vector<Output> keptValues(weft::Graph& g, size_t forwardEnd) {
  std::vector<Output> kept;
  std::unordered_set<Output, OutputHash> seen;
  for (const auto& n : g.nodes()) {
    if (!isBackward(n.get(), forwardEnd)) continue;
    for (const Output& in : n->inputs) {
      weft::Node* producer = in.node();
      if (isBackward(producer, forwardEnd) || producer->def->sourceKind != SourceKind::None) continue;
      if (seen.insert(in).second) kept.push_back(in);
    }
  }
  return kept;
}

std::unique_ptr<Compiled> compileTransform(const amp::Node& node, const std::vector<TensorType>& inputs,
                                           optim::Optimizer* optimizer, bool needsGradients) {
  auto c = std::make_unique<Compiled>();
  c->graph = std::make_unique<weft::Graph>();
  weft::Graph& g = *c->graph;
  for (size_t i = 0; i < inputs.size(); ++i)
    c->payloads.push_back(g.placeholder(fmt::format("payload{}", i), inputs[i].dtype, inputs[i].shape));
  const auto& stateInputs = node.kind == NodeKind::Loss ? node.loss.stateInputs : node.transform.stateInputs;
  for (const StateInput& s : stateInputs) c->fromState.push_back(g.placeholder(s.name, s.type.dtype, s.type.shape));
  Inputs in{c->payloads, c->fromState};
  std::vector<Output> wrt;
  for (const Output& p : c->payloads)
    if (isFloating(p.dtype())) wrt.push_back(p);
  if (node.kind == NodeKind::Loss) {
    c->loss = node.loss.build(g, in);
    WEFT_CHECK(g.trainableVariables().empty(), "amp: loss '{}' has variables; put them in a transform before it",
               node.name);
    WEFT_CHECK(!wrt.empty(), "amp: loss '{}' gets a payload of dtype {}, which has no gradient", node.name,
               dtypeName(c->payloads[0].dtype()));
    c->lossGrad = toDense(gradients(c->loss.loss, {c->payloads[0]})[0]);
    WEFT_CHECK(c->lossGrad.valid(), "amp: loss '{}' does not depend on its payload", node.name);
  } else {
    c->y = node.transform.build(g, in);
    size_t forwardEnd = g.size();
    for (weft::Node* v : g.trainableVariables()) c->params.push_back({v->name, v->output(), {}, {}, {}, {}, {}, {}, {}});
    if (needsGradients && isFloating(c->y.dtype())) {
      c->dy = g.placeholder("output_gradient", c->y.dtype(), c->y.shape());
      Output surrogate = sum(mul(c->y, c->dy));
      for (const Param& p : c->params) wrt.push_back(p.variable);
      std::vector<Grad> grads = gradients(surrogate, wrt);
      size_t k = 0;
      for (const Output& p : c->payloads) {
        if (!isFloating(p.dtype())) {
          c->inputGrads.emplace_back();
          continue;
        }
        const Grad& g = grads[k++];
        c->inputGrads.push_back(g.valid() ? toDense(g) : Output());
      }
      for (Param& p : c->params) p.grad = grads[k++];
      c->kept = keptValues(g, forwardEnd);
      std::vector<std::pair<Grad, Output>> updates;
      for (Param& p : c->params) {
        if (!p.grad.valid()) continue;
        const TensorType& t = p.variable.type();
        if (p.grad.isSparse()) {
          p.indicesPh = g.placeholder("sum/" + p.name + "/indices", p.grad.indices.dtype(), {-1});
          std::vector<int64_t> rowShape = t.shape.dims();
          rowShape[0] = -1;
          p.valuesPh = g.placeholder("sum/" + p.name + "/values", t.dtype, Shape(rowShape));
          updates.push_back({Grad::sparse(p.indicesPh, p.valuesPh, t.shape), p.variable});
        } else {
          p.densePh = g.placeholder("sum/" + p.name, t.dtype, t.shape);
          updates.push_back({Grad(p.densePh), p.variable});
        }
      }
      if (!updates.empty()) {
        WEFT_CHECK(optimizer != nullptr, "amp: transform '{}' has variables but neither it nor the runtime names an optimizer",
                   node.name);
        c->updateStep = optimizer->applyGradients(updates);
      }
    } else {
      c->inputGrads.assign(c->payloads.size(), Output());
    }
  }
  c->session = std::make_unique<Session>(g, SessionOptions{.threads = 1});
  return c;
}

// ---- per-node runtime state ----

/// What a node keeps of a forward message until its backward message comes.
struct Kept {
  std::vector<Tensor> tensors;
  std::vector<State> states;
  std::vector<int64_t> widths;
  int origin = 0;
  int64_t version = 0;
};

/// Messages of one state (or one group key) arriving on several inputs, or several gradients
/// answering one message.
struct Join {
  std::vector<Tensor> parts;
  std::vector<State> states;
  std::vector<int64_t> order;
  int arrived = 0;
  int expected = 0;
  Credit credit{};  // what the held messages carried
};

struct ReplicaGroup {
  std::mutex mutex;
  int members = 0;
  int64_t round = 0;
  std::vector<std::vector<Tensor>> posted;  // per member, this round
  int postedCount = 0;
  std::vector<Tensor> average;
  int64_t averageRound = -1;
  std::atomic<int64_t> rounds{0};  // averages made, since the last report
};

struct NodeRt {
  const amp::Node* spec = nullptr;
  int worker = 0;
  std::unique_ptr<Compiled> compiled;
  std::unordered_map<State, Kept, StateHash> kept;
  std::unordered_map<State, Join, StateHash> joins;        // forward joins (concat, transforms, groups)
  std::unordered_map<State, Join, StateHash> gradJoins;    // backward joins (broadcast, split, flatmap, ungroup)
  std::unordered_map<State, std::pair<State, int>, StateHash> parentOf;  // ungroup / flatmap children
  int minUpdateFrequency = 1;
  int64_t updates = 0;
  int64_t gradientsSinceUpdate = 0;
  std::unordered_set<int64_t> instancesSinceUpdate;
  // replicas
  ReplicaGroup* replicas = nullptr;
  int replicaIndex = 0;
  int64_t updatesSinceSync = 0;
  int64_t postedRound = -1;
  std::vector<Tensor> postedValues;
  // counts since the last report
  std::vector<int64_t> sent, answered;  // per output: forward messages sent, backward ones received
  int64_t forwards = 0, backwards = 0, gradients = 0, updatesReported = 0;
  int64_t stalenessSum = 0, stalenessMax = 0, stalenessCount = 0;
  double busy = 0;
};

struct Task {
  enum class Kind { Forward, Backward, Update } kind = Kind::Forward;
  int node = 0;
  int port = 0;  // forward: the input it arrives on; backward: the output it answers
  Tensor payload;
  State state;
  Credit credit{};  // the share of its instance's credit (see Flow)
};

/// An instance starts with the whole credit (1), which every message of it carries a share of
/// (an exact dyadic fraction, dist/AmpWire.h): a task's credit is split among the messages it
/// sends, held with a message that waits in a join (and merged when the join completes), and
/// returned to the controller by a task that sends nothing. The controller has the whole credit
/// back exactly when nothing of the instance is left anywhere, in this process or another
/// (termination detection by weight throwing).
/// What the task being processed produces: its credit, the messages it sends and the loss it
/// measured. The worker splits the credit and sends the messages after the node returns.
struct Flow {
  Credit credit;
  std::vector<Task> out;
  double loss = 0, hits = 0, count = 0;
  bool measured = false;
};

thread_local Flow* currentFlow = nullptr;

struct Worker {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Task> forward, backward, control;
  std::thread thread;
  double busy = 0;
  std::atomic<int> currentNode{-1};
  std::atomic<int64_t> currentSince{0};
};

struct InstanceRecord {
  std::mutex mutex;  // guards `data`, which another process's instance gets on first use
  std::shared_ptr<const Instance> data;
  Credit returned;  // credit back at the controller (under the controller's lock)
  double loss = 0, hits = 0, count = 0;
};

}  // namespace

struct Runtime::Impl {
  Graph& graph;
  AmpOptions options;
  AmpProcesses processes;
  std::vector<NodeRt> nodes;
  std::vector<std::unique_ptr<Worker>> workers;  // this process's
  std::deque<ReplicaGroup> replicaGroups;
  std::atomic<bool> stopping{false};
  bool training = true;

  // the run in progress
  std::vector<std::unique_ptr<InstanceRecord>> records;
  const std::function<Pumped(int64_t)>* make = nullptr;
  int64_t firstInstance = 0, nextInstanceId = 0;
  std::mutex doneMutex;
  std::condition_variable doneChanged;
  std::vector<int64_t> finished;
  std::atomic<int64_t> outstandingTasks{0};
  std::atomic<int64_t> processed{0};
  std::string failure;
  int64_t stuckInstance = -1;

  // between processes (processes.count > 1): a thread owns the transport
  std::thread comm;
  std::atomic<bool> commStopping{false}, commEnded{false};
  std::mutex outboxMutex;
  std::vector<std::pair<int, WireMessage>> outbox;  // (rank, message)
  std::deque<std::pair<int, WireMessage>> controlInbox;  // epoch protocol, for the main thread
  std::vector<std::vector<uint8_t>> reports;  // per rank, this epoch's
  std::map<std::string, Tensor> remoteVariables;
  WireMessage epochTotals;  // the controller's loss and accuracy of the epoch (another process)

  Impl(Graph& g, AmpOptions o, AmpProcesses p) : graph(g), options(std::move(o)), processes(std::move(p)) {}

  int globalWorkers() const { return options.workers * processes.count; }
  int processOf(int worker) const { return worker / options.workers; }
  bool isLocal(const NodeRt& n) const { return processOf(n.worker) == processes.rank; }
  Worker& localWorker(const NodeRt& n) { return *workers[static_cast<size_t>(n.worker % options.workers)]; }

  InstanceRecord& record(int64_t instance) {
    int64_t i = instance - firstInstance;
    WEFT_CHECK(i >= 0 && i < static_cast<int64_t>(records.size()), "amp: a message names instance {}, which is not in flight",
               instance);
    return *records[static_cast<size_t>(i)];
  }

  /// The data of an instance; a process other than the controller's makes it on first use, as
  /// the controller did (every process's model makes the same instances).
  const Instance& instanceOf(const State& s) {
    InstanceRecord& r = record(s.instance);
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.data) r.data = (*make)(s.instance - firstInstance).instance;
    WEFT_CHECK(r.data != nullptr, "amp: instance {} has no data", s.instance);
    return *r.data;
  }

  // ---- messages: a node's task goes to its worker's queue, here or in another process ----

  void push(int node, Task task) {
    task.node = node;
    if (currentFlow != nullptr) currentFlow->out.push_back(std::move(task));
    else dispatch(std::move(task));
  }

  void dispatch(Task task) {
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

  void sendForward(int node, int output, Tensor payload, const State& state) {
    ++nodes[static_cast<size_t>(node)].sent[static_cast<size_t>(output)];
    auto [reader, input] = graph.consumer({node, output});
    push(reader, {Task::Kind::Forward, reader, input, std::move(payload), state});
  }

  void sendBackward(const amp::Node& node, int input, Tensor grad, const State& state) {
    const Port& from = node.inputs[static_cast<size_t>(input)];
    push(from.node, {Task::Kind::Backward, from.node, from.output, std::move(grad), state});
  }

  /// Sends what a task produced, each message with a share of its credit; a task that sent
  /// nothing returns its credit, and what a loss measured goes to the controller either way.
  /// A measured loss returns with a share of its own, so the instance cannot finish before the
  /// controller has its loss.
  void finishFlow(Flow& flow, const State& state) {
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

  void giveBack(int64_t instance, Credit credit, const Flow& measured) {
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
  void hold(Join& j) {
    j.credit.add(currentFlow->credit);
    currentFlow->credit = Credit();
  }
  void release(Join& j) {
    currentFlow->credit.add(j.credit);
    j.credit = Credit();
  }

  // ---- node behaviour ----

  Kept takeKept(NodeRt& n, const State& s, const char* what) {
    auto it = n.kept.find(s);
    WEFT_CHECK(it != n.kept.end(), "amp: {} '{}' got a backward message for {}, which it never sent forward", what,
               n.spec->name, s.str());
    Kept k = std::move(it->second);
    n.kept.erase(it);
    return k;
  }

  void keep(NodeRt& n, const State& s, Kept k) {
    if (!training) return;
    bool fresh = n.kept.emplace(s, std::move(k)).second;
    WEFT_CHECK(fresh, "amp: {} '{}' got a second forward message with {} before the first was answered",
               kindName(n.spec->kind), n.spec->name, s.str());
  }

  /// Collects one message per input for state s; true (and the payloads) once all arrived.
  bool joinInputs(NodeRt& n, const Task& t, std::vector<Tensor>& payloads) {
    size_t inputs = n.spec->inputs.size();
    if (inputs == 1) {
      payloads = {t.payload};
      return true;
    }
    Join& j = n.joins[t.state];
    if (j.parts.empty()) j.parts.resize(inputs);
    WEFT_CHECK(!j.parts[static_cast<size_t>(t.port)].defined(), "amp: {} '{}' got two messages with {} on input {}",
               kindName(n.spec->kind), n.spec->name, t.state.str(), t.port);
    j.parts[static_cast<size_t>(t.port)] = t.payload;
    if (++j.arrived < static_cast<int>(inputs)) {
      hold(j);
      return false;
    }
    release(j);
    payloads = std::move(j.parts);
    n.joins.erase(t.state);
    return true;
  }

  FeedMap feedsFor(const Compiled& c, const std::vector<Tensor>& payloads, const std::vector<Tensor>& stateValues) {
    FeedMap feeds;
    for (size_t i = 0; i < payloads.size(); ++i) feeds.push_back({c.payloads[i], payloads[i]});
    for (size_t i = 0; i < stateValues.size(); ++i) feeds.push_back({c.fromState[i], stateValues[i]});
    return feeds;
  }

  std::vector<Tensor> stateValues(const NodeRt& n, const State& s) {
    const auto& specs = n.spec->kind == NodeKind::Loss ? n.spec->loss.stateInputs : n.spec->transform.stateInputs;
    std::vector<Tensor> values;
    for (const StateInput& si : specs) values.push_back(si.value(s, instanceOf(s)));
    return values;
  }

  void transformForward(NodeRt& n, const Task& t) {
    std::vector<Tensor> payloads;
    if (!joinInputs(n, t, payloads)) return;
    Compiled& c = *n.compiled;
    std::vector<Tensor> fromState = stateValues(n, t.state);
    FeedMap feeds = feedsFor(c, payloads, fromState);
    std::vector<Output> fetches{c.y};
    if (training) fetches.insert(fetches.end(), c.kept.begin(), c.kept.end());
    std::vector<Tensor> out = c.session->run(fetches, feeds);
    Tensor y = out[0];
    if (training) {
      Kept k;
      k.tensors = std::move(payloads);
      k.tensors.insert(k.tensors.end(), fromState.begin(), fromState.end());
      k.tensors.insert(k.tensors.end(), out.begin() + 1, out.end());
      k.version = n.updates;
      keep(n, t.state, std::move(k));
    }
    ++n.forwards;
    sendForward(n.spec->id, 0, std::move(y), t.state);
  }

  void transformBackward(NodeRt& n, const Task& t) {
    Kept k = takeKept(n, t.state, "transform");
    Compiled& c = *n.compiled;
    size_t payloads = c.payloads.size(), fromState = c.fromState.size();
    std::vector<Output> fetches;
    for (const Output& g : c.inputGrads)
      if (g.valid()) fetches.push_back(g);
    for (const Param& p : c.params) {
      if (p.grad.isSparse()) fetches.push_back(p.grad.indices), fetches.push_back(p.grad.values);
      else if (p.grad.valid()) fetches.push_back(p.grad.dense);
    }
    // An empty gradient is zero: nothing flows back and the variables gain nothing.
    std::vector<Tensor> out;
    if (!fetches.empty() && c.dy.valid() && t.payload.defined()) {
      FeedMap feeds;
      for (size_t i = 0; i < payloads; ++i) feeds.push_back({c.payloads[i], k.tensors[i]});
      for (size_t i = 0; i < fromState; ++i) feeds.push_back({c.fromState[i], k.tensors[payloads + i]});
      for (size_t i = 0; i < c.kept.size(); ++i) feeds.push_back({c.kept[i], k.tensors[payloads + fromState + i]});
      feeds.push_back({c.dy, t.payload});
      out = c.session->run(fetches, feeds);
    }
    std::vector<Tensor> inputGrads(payloads);
    size_t next = 0;
    if (!out.empty()) {
      for (size_t i = 0; i < payloads; ++i)
        if (c.inputGrads[i].valid()) inputGrads[i] = out[next++];
      for (Param& p : c.params) {
        if (p.grad.isSparse()) {
          p.indices.push_back(out[next++]);
          p.values.push_back(out[next++]);
        } else if (p.grad.valid()) {
          addInto(p.sum, out[next++]);
        }
      }
    }
    ++n.backwards;
    if (!c.params.empty()) {
      ++n.gradients;
      ++n.gradientsSinceUpdate;
      n.instancesSinceUpdate.insert(t.state.instance);
      int64_t staleness = n.updates - k.version;
      n.stalenessSum += staleness;
      n.stalenessMax = std::max(n.stalenessMax, staleness);
      ++n.stalenessCount;
      if (options.minibatch == 0 && n.gradientsSinceUpdate >= n.minUpdateFrequency) update(n);
    }
    for (size_t i = 0; i < payloads; ++i) sendBackward(*n.spec, static_cast<int>(i), std::move(inputGrads[i]), t.state);
  }

  /// Applies the mean per instance of the gathered gradients: over the `instances` of a synchronous
  /// minibatch (those that never reached this node add zero), or, asynchronously, over the
  /// instances the gradients came from.
  void update(NodeRt& n, int64_t instances = 0) {
    Compiled& c = *n.compiled;
    if (c.updateStep == nullptr || n.gradientsSinceUpdate == 0) return;
    auto start = Clock::now();
    if (instances == 0) instances = static_cast<int64_t>(n.instancesSinceUpdate.size());
    double scale = 1.0 / static_cast<double>(std::max<int64_t>(instances, 1));
    FeedMap feeds;
    for (Param& p : c.params) {
      if (p.grad.isSparse()) {
        // Gradients that were all empty (zero) leave no rows: the update gets none.
        std::vector<int64_t> noRows = p.variable.shape().dims();
        noRows[0] = 0;
        Tensor indices = p.indices.empty() ? Tensor(p.indicesPh.dtype(), {0}) : concatRows(p.indices);
        Tensor values = p.values.empty() ? Tensor(p.variable.dtype(), Shape(noRows)) : scaled(concatRows(p.values), scale);
        feeds.push_back({p.indicesPh, indices});
        feeds.push_back({p.valuesPh, values});
        p.indices.clear();
        p.values.clear();
      } else if (p.grad.valid()) {
        Tensor g = p.sum.defined() ? scaled(p.sum, scale) : Tensor::zeros(p.variable.dtype(), p.variable.shape());
        feeds.push_back({p.densePh, g});
        p.sum = Tensor();
      }
    }
    c.session->run({}, feeds, {c.updateStep});
    ++n.updates;
    ++n.updatesReported;
    n.gradientsSinceUpdate = 0;
    n.instancesSinceUpdate.clear();
    if (n.replicas != nullptr && options.replicaSyncEvery > 0) exchangeWithReplicas(n);
    if (options.trace) traceEvent(n.spec->name, "update", workerTrack(n.worker), start, Clock::now());
  }

  static Tensor concatRows(const std::vector<Tensor>& parts) {
    std::vector<int64_t> dims = parts[0].shape().dims();
    int64_t rows = 0;
    for (const Tensor& p : parts) rows += p.shape()[0];
    dims[0] = rows;
    Tensor out(parts[0].dtype(), Shape(dims));
    char* dst = static_cast<char*>(out.raw());
    for (const Tensor& p : parts) {
      std::memcpy(dst, p.raw(), p.bytes());
      dst += p.bytes();
    }
    return out;
  }

  std::vector<Tensor*> trainedValues(NodeRt& n) {
    std::vector<Tensor*> values;
    for (Param& p : n.compiled->params) values.push_back(&n.compiled->session->variable(p.variable.node()));
    return values;
  }

  /// Every replicaSyncEvery updates a replica posts its variables; the last of a round to post
  /// averages them, and each replica then moves to that average plus what it learned since it posted.
  void exchangeWithReplicas(NodeRt& n) {
    ReplicaGroup& g = *n.replicas;
    std::vector<Tensor*> mine = trainedValues(n);
    std::lock_guard<std::mutex> lock(g.mutex);
    if (n.postedRound >= 0 && g.averageRound >= n.postedRound) {
      for (size_t i = 0; i < mine.size(); ++i) {
        Tensor moved = g.average[i].clone();
        addInto(moved, *mine[i]);
        addInto(moved, scaled(n.postedValues[i], -1.0));
        mine[i]->copyFrom(moved);
      }
      n.postedRound = -1;
      n.postedValues.clear();
    }
    if (++n.updatesSinceSync < options.replicaSyncEvery || n.postedRound >= 0) return;
    n.updatesSinceSync = 0;
    n.postedRound = g.round;
    for (Tensor* v : mine) n.postedValues.push_back(v->clone());
    g.posted[static_cast<size_t>(n.replicaIndex)] = n.postedValues;
    if (++g.postedCount < g.members) return;
    g.average.clear();
    for (size_t i = 0; i < mine.size(); ++i) {
      Tensor sum;
      for (const auto& member : g.posted) addInto(sum, member[i]);
      g.average.push_back(scaled(sum, 1.0 / g.members));
    }
    g.averageRound = g.round++;
    ++g.rounds;
    g.postedCount = 0;
  }

  void lossForward(NodeRt& n, const Task& t) {
    Compiled& c = *n.compiled;
    std::vector<Tensor> fromState = stateValues(n, t.state);
    FeedMap feeds = feedsFor(c, {t.payload}, fromState);
    std::vector<Output> fetches{c.loss.loss};
    bool scored = c.loss.hits.valid() && c.loss.count.valid();
    if (scored) fetches.push_back(c.loss.hits), fetches.push_back(c.loss.count);
    if (training) fetches.push_back(c.lossGrad);
    std::vector<Tensor> out = c.session->run(fetches, feeds);
    currentFlow->measured = true;
    currentFlow->loss += out[0].item();
    if (scored) currentFlow->hits += out[1].item(), currentFlow->count += out[2].item();
    ++n.forwards;
    if (training) {
      ++n.backwards;
      sendBackward(*n.spec, 0, std::move(out.back()), t.state);
    }
  }

  void forward(NodeRt& n, const Task& t) {
    const amp::Node& spec = *n.spec;
    switch (spec.kind) {
      case NodeKind::Input: sendForward(spec.id, 0, t.payload, t.state); break;
      case NodeKind::Transform: transformForward(n, t); return;
      case NodeKind::Loss: lossForward(n, t); return;
      case NodeKind::Cond: {
        int branch = spec.route(t.state, instanceOf(t.state));
        WEFT_CHECK(branch >= 0 && branch < spec.outputs, "amp: cond '{}' routed {} to branch {} of {}", spec.name,
                   t.state.str(), branch, spec.outputs);
        keep(n, t.state, Kept{{}, {}, {}, branch, 0});
        sendForward(spec.id, branch, t.payload, t.state);
        break;
      }
      case NodeKind::Phi:
        keep(n, t.state, Kept{{}, {}, {}, t.port, 0});
        sendForward(spec.id, 0, t.payload, t.state);
        break;
      case NodeKind::StateUpdate: {
        State next = spec.forward(t.state, instanceOf(t.state));
        WEFT_CHECK(next.instance == t.state.instance, "amp: state update '{}' changed the instance of {}", spec.name,
                   t.state.str());
        keep(n, next, Kept{{}, {t.state}, {}, 0, 0});
        sendForward(spec.id, 0, t.payload, next);
        break;
      }
      case NodeKind::Concat: {
        std::vector<Tensor> parts;
        if (!joinInputs(n, t, parts)) return;
        Kept k;
        for (const Tensor& p : parts) k.widths.push_back(lastWidth(p));
        keep(n, t.state, std::move(k));
        sendForward(spec.id, 0, concatLast(parts), t.state);
        break;
      }
      case NodeKind::Split: {
        keep(n, t.state, Kept{});
        auto parts = splitLast(t.payload, spec.sizes);
        for (size_t i = 0; i < parts.size(); ++i) sendForward(spec.id, static_cast<int>(i), std::move(parts[i]), t.state);
        break;
      }
      case NodeKind::Broadcast:
        keep(n, t.state, Kept{});
        for (int i = 0; i < spec.outputs; ++i) sendForward(spec.id, i, t.payload, t.state);
        break;
      case NodeKind::Group: groupForward(n, t); return;
      case NodeKind::Ungroup:
      case NodeKind::Flatmap: expandForward(n, t); break;
    }
    ++n.forwards;
  }

  void groupForward(NodeRt& n, const Task& t) {
    const amp::Node& spec = *n.spec;
    const Instance& inst = instanceOf(t.state);
    State key = spec.group.key(t.state, inst);
    WEFT_CHECK(key.instance == t.state.instance, "amp: group '{}' keyed {} to another instance", spec.name, t.state.str());
    Join& j = n.joins[key];
    if (j.expected == 0) {
      j.expected = spec.group.count(key, inst);
      WEFT_CHECK(j.expected >= 1, "amp: group '{}' expects {} messages for {}", spec.name, j.expected, key.str());
    }
    j.parts.push_back(t.payload);
    j.states.push_back(t.state);
    j.order.push_back(spec.group.order(t.state));
    if (++j.arrived < j.expected) {
      hold(j);
      return;
    }
    release(j);
    std::vector<size_t> order(j.parts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return j.order[a] < j.order[b]; });
    std::vector<Tensor> rows;
    Kept k;
    for (size_t i : order) rows.push_back(j.parts[i]), k.states.push_back(j.states[i]);
    for (size_t i = 1; i < order.size(); ++i)
      WEFT_CHECK(j.order[order[i]] != j.order[order[i - 1]], "amp: group '{}' got two messages of order {} for {}",
                 spec.name, j.order[order[i]], key.str());
    n.joins.erase(key);
    keep(n, key, std::move(k));
    ++n.forwards;
    sendForward(spec.id, 0, stackRows(rows), key);
  }

  void expandForward(NodeRt& n, const Task& t) {
    const amp::Node& spec = *n.spec;
    std::vector<State> states = spec.expand(t.state, instanceOf(t.state));
    bool ungroup = spec.kind == NodeKind::Ungroup;
    if (states.empty()) {
      // Nothing goes on (a graph node without edges): the message is answered at once, with zero.
      if (training) sendBackward(spec, 0, Tensor(), t.state);
      return;
    }
    if (ungroup)
      WEFT_CHECK(t.payload.rank() >= 1 && t.payload.shape()[0] == static_cast<int64_t>(states.size()),
                 "amp: ungroup '{}' got a payload {} for {} states of {}", spec.name, t.payload.shape().str(),
                 states.size(), t.state.str());
    if (training) {
      Join& j = n.gradJoins[t.state];
      WEFT_CHECK(j.expected == 0, "amp: {} '{}' got a second forward message with {}", kindName(spec.kind), spec.name,
                 t.state.str());
      j.expected = static_cast<int>(states.size());
      j.parts.resize(states.size());
      for (size_t i = 0; i < states.size(); ++i) {
        WEFT_CHECK(states[i].instance == t.state.instance, "amp: {} '{}' made a state of another instance from {}",
                   kindName(spec.kind), spec.name, t.state.str());
        bool fresh = n.parentOf.emplace(states[i], std::make_pair(t.state, static_cast<int>(i))).second;
        WEFT_CHECK(fresh, "amp: {} '{}' made the state {} twice", kindName(spec.kind), spec.name, states[i].str());
      }
    }
    for (size_t i = 0; i < states.size(); ++i)
      sendForward(spec.id, 0, ungroup ? row(t.payload, static_cast<int64_t>(i)) : t.payload, states[i]);
  }

  void backward(NodeRt& n, const Task& t) {
    const amp::Node& spec = *n.spec;
    switch (spec.kind) {
      case NodeKind::Input: break;
      case NodeKind::Transform: transformBackward(n, t); return;
      case NodeKind::Loss: WEFT_THROW("amp: loss '{}' got a backward message", spec.name);
      case NodeKind::Cond: {
        Kept k = takeKept(n, t.state, "cond");
        WEFT_CHECK(k.origin == t.port, "amp: cond '{}' sent {} to branch {} but its gradient came from branch {}",
                   spec.name, t.state.str(), k.origin, t.port);
        sendBackward(spec, 0, t.payload, t.state);
        break;
      }
      case NodeKind::Phi: {
        Kept k = takeKept(n, t.state, "phi");
        sendBackward(spec, k.origin, t.payload, t.state);
        break;
      }
      case NodeKind::StateUpdate: {
        Kept k = takeKept(n, t.state, "state update");
        State previous = spec.inverse(t.state, instanceOf(t.state));
        WEFT_CHECK(previous == k.states[0], "amp: state update '{}' maps {} back to {}, but it came from {}", spec.name,
                   t.state.str(), previous.str(), k.states[0].str());
        sendBackward(spec, 0, t.payload, previous);
        break;
      }
      case NodeKind::Concat: {
        Kept k = takeKept(n, t.state, "concat");
        std::vector<Tensor> parts = t.payload.defined() ? splitLast(t.payload, k.widths) : std::vector<Tensor>(k.widths.size());
        for (size_t i = 0; i < parts.size(); ++i) sendBackward(spec, static_cast<int>(i), std::move(parts[i]), t.state);
        break;
      }
      case NodeKind::Split:
      case NodeKind::Broadcast: {
        Join& j = n.gradJoins[t.state];
        if (j.parts.empty()) j.parts.resize(static_cast<size_t>(spec.outputs));
        WEFT_CHECK(j.arrived == 0 || !j.parts[static_cast<size_t>(t.port)].defined(),
                   "amp: {} '{}' got two gradients for {} on output {}", kindName(spec.kind), spec.name, t.state.str(),
                   t.port);
        j.parts[static_cast<size_t>(t.port)] = t.payload;
        if (++j.arrived < spec.outputs) {
          hold(j);
          return;
        }
        release(j);
        takeKept(n, t.state, kindName(spec.kind));
        Tensor grad;
        if (spec.kind == NodeKind::Broadcast) {
          for (const Tensor& p : j.parts) addInto(grad, p);
        } else {
          for (size_t i = 0; i < j.parts.size(); ++i)
            if (!j.parts[i].defined()) j.parts[i] = Tensor::zeros(spec.outputTypes[i].dtype, partShape(spec, i, j.parts));
          grad = concatLast(j.parts);
        }
        n.gradJoins.erase(t.state);
        sendBackward(spec, 0, std::move(grad), t.state);
        break;
      }
      case NodeKind::Group: {
        Kept k = takeKept(n, t.state, "group");
        std::vector<Tensor> rows = rowsOrEmpty(t.payload, static_cast<int64_t>(k.states.size()));
        for (size_t i = 0; i < rows.size(); ++i) sendBackward(spec, 0, std::move(rows[i]), k.states[i]);
        break;
      }
      case NodeKind::Ungroup:
      case NodeKind::Flatmap: expandBackward(n, t); return;
    }
    ++n.backwards;
  }

  static Shape partShape(const amp::Node& spec, size_t missing, const std::vector<Tensor>& parts) {
    for (const Tensor& p : parts)
      if (p.defined()) {
        Shape s = p.shape();
        s[s.rank() - 1] = spec.sizes[missing];
        return s;
      }
    return spec.outputTypes[missing].shape;
  }

  void expandBackward(NodeRt& n, const Task& t) {
    const amp::Node& spec = *n.spec;
    auto child = n.parentOf.find(t.state);
    WEFT_CHECK(child != n.parentOf.end(), "amp: {} '{}' got a backward message for {}, which it never sent forward",
               kindName(spec.kind), spec.name, t.state.str());
    auto [parent, index] = child->second;
    n.parentOf.erase(child);
    Join& j = n.gradJoins[parent];
    j.parts[static_cast<size_t>(index)] = t.payload;
    ++n.backwards;
    if (++j.arrived < j.expected) {
      hold(j);
      return;
    }
    release(j);
    Tensor grad;
    if (spec.kind == NodeKind::Flatmap) {
      for (const Tensor& p : j.parts) addInto(grad, p);
    } else {
      grad = stackOrEmpty(j.parts);
    }
    n.gradJoins.erase(parent);
    sendBackward(spec, 0, std::move(grad), parent);
  }

  // ---- workers ----

  void process(NodeRt& n, Task& t) {
    if (t.kind == Task::Kind::Backward) ++n.answered[static_cast<size_t>(t.port)];
    switch (t.kind) {
      case Task::Kind::Forward: forward(n, t); break;
      case Task::Kind::Backward: backward(n, t); break;
      case Task::Kind::Update: update(n, t.port); break;
    }
  }

  void workerLoop(int index) {
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

  /// Stops the run with `message` (the first failure wins); another process's failure also goes
  /// to the controller, which stops every process.
  void fail(std::string message) {
    {
      std::lock_guard<std::mutex> lock(doneMutex);
      if (!failure.empty()) return;
      failure = message;
      doneChanged.notify_all();
    }
    tellFailure(message);
  }

  /// Sends a failure on: from a process to the controller, from the controller to every process.
  void tellFailure(const std::string& message) {
    if (processes.count == 1) return;
    WireMessage m = control(WireKind::Failed);
    m.reason = message;
    if (processes.rank != 0) post(0, std::move(m));
    else
      for (int r = 1; r < processes.count; ++r) post(r, m);
  }

  // ---- between processes ----

  void post(int rank, WireMessage m) {
    std::lock_guard<std::mutex> lock(outboxMutex);
    outbox.emplace_back(rank, std::move(m));
  }

  /// The transport's thread: sends what the workers and the controller posted, and hands what
  /// arrives to the workers (node messages), the controller (credit) or the main thread (the
  /// epoch protocol).
  void commLoop() {
    dist::Transport& transport = *processes.transport;
    auto lastTraffic = Clock::now();
    try {
      while (!commStopping) {
        std::vector<std::pair<int, WireMessage>> sending;
        {
          std::lock_guard<std::mutex> lock(outboxMutex);
          sending.swap(outbox);
        }
        for (auto& [rank, m] : sending) {
          try {
            auto [header, payload] = encode(m);
            transport.sendMessage(processes.peers.at(static_cast<size_t>(rank)), header, payload,
                                  Clock::now() + options.timeout);
          } catch (const std::exception& e) {
            WEFT_THROW("sending to process {}: {}", rank, e.what());
          }
        }
        transport.progress();
        std::vector<dist::Message> arrived = transport.takeMessages(Clock::now() + options.timeout);
        // A message that cannot be taken stops the run; the thread goes on carrying the news.
        for (dist::Message& raw : arrived) {
          try {
            receive(raw);
          } catch (const std::exception& e) {
            fail(fmt::format("amp: process {} could not take a message: {}", processes.rank, e.what()));
          }
        }
        for (int r = 0; r < processes.count; ++r)
          if (r != processes.rank && transport.hasFailed(processes.peers[static_cast<size_t>(r)]))
            WEFT_THROW("process {} failed: {}", r, transport.failureOf(processes.peers[static_cast<size_t>(r)]));
        // Workers cannot wake a wait on the transport, so while messages flow the wait is short
        // (what they post leaves soon) and grows when the job is quiet.
        const auto now = Clock::now();
        if (!sending.empty() || !arrived.empty()) lastTraffic = now;
        else
          transport.waitForActivity(now + options.timeout, now - lastTraffic < std::chrono::milliseconds(2)
                                                               ? std::chrono::microseconds(20)
                                                               : std::chrono::microseconds(500));
      }
    } catch (const std::exception& e) {
      fail(fmt::format("amp: process {} lost its connection: {}", processes.rank, e.what()));
      std::lock_guard<std::mutex> lock(doneMutex);
      WireMessage lost = control(WireKind::Failed);
      lost.reason = e.what();
      controlInbox.emplace_back(-1, std::move(lost));
      doneChanged.notify_all();
    }
    commEnded = true;
  }

  int rankOfPeer(int peer) const {
    for (int r = 0; r < processes.count; ++r)
      if (processes.peers[static_cast<size_t>(r)] == peer && r != processes.rank) return r;
    WEFT_THROW("amp: a message came from peer {}, which is no process of this job", peer);
  }

  void receive(const dist::Message& raw) {
    const int from = rankOfPeer(raw.from);
    processed.fetch_add(1);  // progress, as the controller's stall check counts it
    WireMessage m = decode(raw.header, raw.payload);
    switch (m.kind) {
      case WireKind::Forward:
      case WireKind::Backward: {
        WEFT_CHECK(m.node >= 0 && m.node < static_cast<int>(nodes.size()) && isLocal(nodes[static_cast<size_t>(m.node)]),
                   "amp: process {} sent a message for node {}, which process {} does not run", from, m.node,
                   processes.rank);
        const amp::Node& target = graph.node(m.node);
        const int ports = m.kind == WireKind::Forward ? static_cast<int>(target.inputs.size()) : target.outputs;
        WEFT_CHECK(m.port >= 0 && m.port < ports, "amp: process {} sent node '{}' a message on port {} of {}", from,
                   target.name, m.port, ports);
        dispatch({m.kind == WireKind::Forward ? Task::Kind::Forward : Task::Kind::Backward, m.node, m.port,
                  std::move(m.tensor), m.state, m.credit});
        break;
      }
      case WireKind::Credit: {
        WEFT_CHECK(processes.rank == 0, "amp: process {} returned credit to process {}, not the controller", from,
                   processes.rank);
        Flow measured{{}, {}, m.loss, m.hits, m.count, true};
        giveBack(m.state.instance, std::move(m.credit), measured);
        break;
      }
      case WireKind::Failed:
        fail(fmt::format("{} (process {})", m.reason, from));
        [[fallthrough]];
      default: {
        std::lock_guard<std::mutex> lock(doneMutex);
        if (m.kind == WireKind::Report) reports[static_cast<size_t>(from)] = std::move(m.report);
        controlInbox.emplace_back(from, std::move(m));
        doneChanged.notify_all();
      }
    }
  }

  /// Waits (the main thread) for a message of the epoch protocol; a failure anywhere throws it.
  /// The first message of the epoch protocol of one of `kinds`. Messages from different
  /// processes (and, over UCX, from one) may come in any order, so others wait their turn.
  std::pair<int, WireMessage> nextControl(std::unique_lock<std::mutex>& lock, std::initializer_list<WireKind> kinds) {
    auto wanted = [&] {
      return std::find_if(controlInbox.begin(), controlInbox.end(), [&](const auto& entry) {
        return std::find(kinds.begin(), kinds.end(), entry.second.kind) != kinds.end();
      });
    };
    // Waits as long as messages move here; a whole timeout without any is a stalled job.
    for (int64_t seen = processed.load();;) {
      if (doneChanged.wait_for(lock, options.timeout, [&] { return !failure.empty() || wanted() != controlInbox.end(); }))
        break;
      const int64_t now = processed.load();
      WEFT_CHECK(now != seen, "amp: process {} heard nothing from the other processes for {:.0f} s", processes.rank,
                 seconds(options.timeout));
      seen = now;
    }
    if (!failure.empty()) throw Error(failure);
    auto it = wanted();
    auto next = std::move(*it);
    controlInbox.erase(it);
    return next;
  }

  void queueUpdates(int64_t instances) {
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

  void stopWorkers() {
    stopping = true;
    for (auto& w : workers) {
      { std::lock_guard<std::mutex> lock(w->mutex); }
      w->ready.notify_all();
    }
    for (auto& w : workers)
      if (w->thread.joinable()) w->thread.join();
  }

  /// Why nothing moves: the worker busy in one node the longest, or the nodes holding messages
  /// that wait for others which will never come.
  std::string stallReport() {
    int worst = -1, worstNode = -1;
    int64_t since = 0;
    for (size_t i = 0; i < workers.size(); ++i) {
      int node = workers[i]->currentNode.load();
      int64_t at = workers[i]->currentSince.load();
      if (node >= 0 && (worst < 0 || at < since)) worst = static_cast<int>(i), since = at, worstNode = node;
    }
    std::string where = worst < 0 ? std::string()
                                  : fmt::format(": worker {} is stuck in '{}'", processes.rank * options.workers + worst,
                                                nodes[static_cast<size_t>(worstNode)].spec->name);
    return fmt::format("amp: no message was processed for {:.0f} s{}", seconds(options.timeout), where);
  }

  /// The messages of `instance` (all, when -1) that nodes hold; read after the workers stopped.
  std::string heldMessages(int64_t instance) {
    std::string out;
    auto mine = [&](const State& s) { return instance < 0 || s.instance == instance; };
    for (const NodeRt& n : nodes) {
      for (const auto& [state, j] : n.joins)
        if (mine(state))
          out += fmt::format("\n  {} '{}' holds {} of {} message(s) for {}", kindName(n.spec->kind), n.spec->name, j.arrived,
                             j.expected > 0 ? j.expected : static_cast<int>(n.spec->inputs.size()), state.str());
      for (const auto& [state, j] : n.gradJoins)
        if (mine(state) && j.arrived > 0)
          out += fmt::format("\n  {} '{}' holds {} of {} gradient(s) for {}", kindName(n.spec->kind), n.spec->name,
                             j.arrived, j.expected > 0 ? j.expected : n.spec->outputs, state.str());
    }
    return out;
  }

  // ---- the controller ----

  EpochReport runEpoch(int64_t count, const std::function<Pumped(int64_t)>& make, bool train);
  void followEpoch();
  EpochReport summarise(int64_t count, Clock::time_point start, double activeTime, int peak);
  ProcessReport localReport();
  /// The transform whose variable `variable` ("node/variable") is; throws naming it when none is.
  const NodeRt& transformOwning(const std::string& variable) const;
  /// Sets this process's transforms' variables to `given`, which must be exactly theirs.
  void restoreLocal(const std::vector<std::pair<std::string, Tensor>>& given);
  void checkDrained();
  std::vector<NodeRt*> parameterised() {
    std::vector<NodeRt*> out;
    for (NodeRt& n : nodes)
      if (n.compiled && n.compiled->updateStep != nullptr) out.push_back(&n);
    return out;
  }
};

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
    WEFT_CHECK(w / perProcess == process, "amp: replica '{}' is on worker {}, in another process than its first replica's "
               "worker {}; replicas average in memory, so they share a process", n.name, w, first->second);
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
  WEFT_CHECK(options.minibatch >= 0 && options.replicaSyncEvery >= 0, "amp: minibatch {} and replica sync {} must not be negative",
             options.minibatch, options.replicaSyncEvery);
  WEFT_CHECK(processes.count >= 1 && processes.rank >= 0 && processes.rank < processes.count,
             "amp: process {} of {}", processes.rank, processes.count);
  WEFT_CHECK(processes.count == 1 || (processes.transport != nullptr && static_cast<int>(processes.peers.size()) == processes.count),
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
      rt.compiled = compileTransform(n, inputs, opt, true);
      rt.minUpdateFrequency = n.transform.minUpdateFrequency > 0 ? n.transform.minUpdateFrequency : options.minUpdateFrequency;
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
  for (auto until = Clock::now() + std::chrono::seconds(5); impl_->comm.joinable() && !impl_->commEnded && Clock::now() < until;) {
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
      WEFT_THROW("amp: after every instance finished, {} '{}' still holds {} {} (e.g. {}): a message was never answered",
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

ProcessReport Runtime::Impl::localReport() {
  ProcessReport r;
  for (const NodeRt& n : nodes) {
    if (!isLocal(n)) continue;
    r.nodes.push_back({n.spec->id, n.forwards, n.backwards, n.updatesReported, n.gradients, n.stalenessSum, n.stalenessMax,
                       n.stalenessCount, n.busy, n.sent, n.answered});
  }
  for (const auto& w : workers) r.workerBusy.push_back(w->busy);
  for (NodeRt& n : nodes)
    if (n.compiled && n.spec->kind == NodeKind::Transform)
      for (weft::Node* v : n.compiled->graph->variables())
        r.variables.push_back({n.spec->name + "/" + v->name, n.compiled->session->variable(v).clone()});
  return r;
}

/// The epoch of a process other than the controller's: its workers answer messages while it
/// waits for the controller's updates (synchronous training) and the end of the epoch, when it
/// checks that nothing is left and reports.
void Runtime::Impl::followEpoch() {
  std::unique_lock<std::mutex> lock(doneMutex);
  for (;;) {
    WireMessage m = nextControl(lock, {WireKind::Update, WireKind::EpochEnd}).second;
    if (m.kind == WireKind::Update) {
      lock.unlock();
      queueUpdates(m.instances);
      lock.lock();
      doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
      if (!failure.empty()) throw Error(failure);
      post(0, control(WireKind::Updated));
      continue;
    }
    epochTotals = m;
    break;
  }
  doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
  if (!failure.empty()) throw Error(failure);
  lock.unlock();
  checkDrained();
  WireMessage report = control(WireKind::Report);
  report.report = encodeReport(localReport());
  post(0, std::move(report));
}

EpochReport Runtime::Impl::runEpoch(int64_t count, const std::function<Pumped(int64_t)>& makeInstance, bool train) {
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
  auto start = Clock::now();
  if (processes.rank != 0) {
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

  int active = 0, peak = 0;
  double activeTime = 0;
  auto lastChange = start;
  auto noteActive = [&](int delta) {
    auto now = Clock::now();
    activeTime += active * seconds(now - lastChange);
    lastChange = now;
    active += delta;
    peak = std::max(peak, active);
  };
  int64_t pumped = 0, done = 0;
  int minibatch = train ? options.minibatch : 0;
  int64_t batchStart = 0, batchEnd = minibatch > 0 ? std::min<int64_t>(count, minibatch) : count;
  int64_t lastProcessed = -1, lastDone = -1;
  auto lastProgress = Clock::now();

  auto pumpOne = [&] {
    Pumped p = makeInstance(pumped);
    WEFT_CHECK(p.instance != nullptr && !p.entries.empty(), "amp: instance {} has no data or no messages", pumped);
    int64_t id = nextInstanceId++;
    records[static_cast<size_t>(pumped)]->data = p.instance;
    for (const Pumped::Entry& e : p.entries) {
      WEFT_CHECK(e.input.valid() && e.input.node < static_cast<int>(nodes.size()) &&
                     graph.node(e.input.node).kind == NodeKind::Input,
                 "amp: instance {} enters the graph at node {}, which is not an input", pumped, e.input.node);
      const TensorType& type = graph.node(e.input.node).outputTypes[0];
      WEFT_CHECK(e.payload.dtype() == type.dtype && type.shape.compatibleWith(e.payload.shape()),
                 "amp: instance {} sends {}{} to input '{}', which takes {}", pumped, dtypeName(e.payload.dtype()),
                 e.payload.shape().str(), graph.node(e.input.node).name, type.str());
    }
    Flow flow{Credit::whole(), {}, 0, 0, 0, false};
    for (Pumped::Entry& e : p.entries) {
      e.state.instance = id;
      flow.out.push_back({Task::Kind::Forward, e.input.node, 0, std::move(e.payload), e.state});
    }
    ++pumped;
    noteActive(+1);
    finishFlow(flow, State{id});
  };
  auto updateAll = [&](std::unique_lock<std::mutex>& lock, int64_t instances) {
    lock.unlock();
    queueUpdates(instances);
    for (int r = 1; r < processes.count; ++r) post(r, control(WireKind::Update, instances));
    lock.lock();
    for (int r = 1; r < processes.count; ++r) nextControl(lock, {WireKind::Updated});
    doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
  };

  std::unique_lock<std::mutex> lock(doneMutex);
  try {
    for (int r = 1; r < processes.count; ++r) nextControl(lock, {WireKind::Ready});
    while (done < count) {
      while (failure.empty() && pumped < batchEnd && active < options.maxActiveKeys) {
        lock.unlock();
        try {
          pumpOne();
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
      if (!failure.empty()) break;
      for (size_t i = 0; i < finished.size(); ++i) ++done, noteActive(-1);
      finished.clear();
      if (processes.count == 1 && done < pumped && outstandingTasks.load() == 0) {
        for (int64_t i = 0; i < pumped; ++i)
          if (!records[static_cast<size_t>(i)]->returned.isWhole()) {
            stuckInstance = firstInstance + i;
            break;
          }
        failure = fmt::format("amp: instance {} can go no further: its messages wait for partners that never come",
                              stuckInstance);
        break;
      }
      const int64_t nowProcessed = processed.load();
      if (nowProcessed != lastProcessed || done != lastDone) {
        lastProcessed = nowProcessed;
        lastDone = done;
        lastProgress = Clock::now();
      } else if (done < pumped && Clock::now() - lastProgress > options.timeout) {
        failure = stallReport();
        break;
      }
      if (minibatch > 0 && done == batchEnd) {
        updateAll(lock, batchEnd - batchStart);
        if (!failure.empty()) break;
        batchStart = batchEnd;
        batchEnd = std::min<int64_t>(count, batchEnd + minibatch);
      }
    }
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
  if (!failure.empty()) {
    std::string message = failure;
    lock.unlock();
    tellFailure(message);
    stopWorkers();
    if (stuckInstance >= 0) message += heldMessages(stuckInstance);
    WEFT_THROW("{}", message);
  }
  // The workers finish their bookkeeping (busy times) after returning the last credit.
  doneChanged.wait(lock, [&] { return !failure.empty() || outstandingTasks.load() == 0; });
  lock.unlock();
  noteActive(0);
  checkDrained();
  EpochReport report = summarise(count, start, activeTime, peak);
  records.clear();
  return report;
}

EpochReport Runtime::Impl::summarise(int64_t count, Clock::time_point start, double activeTime, int peak) {
  EpochReport report;
  report.instances = count;
  report.seconds = seconds(Clock::now() - start);
  report.instancesPerSecond = report.seconds > 0 ? static_cast<double>(count) / report.seconds : 0;
  report.meanActiveKeys = report.seconds > 0 ? activeTime / report.seconds : 0;
  report.peakActiveKeys = peak;
  for (ReplicaGroup& g : replicaGroups) report.replicaSyncs += g.rounds.exchange(0);
  double loss = 0, hits = 0, scored = 0;
  for (const auto& r : records) loss += r->loss, hits += r->hits, scored += r->count;
  if (processes.rank != 0) loss = epochTotals.loss, hits = epochTotals.hits, scored = epochTotals.count;
  report.loss = count > 0 ? loss / static_cast<double>(count) : 0;
  report.accuracy = scored > 0 ? hits / scored : 0;
  // This process's counts, then (at the controller) every other process's report.
  ProcessReport mine = localReport();
  std::vector<ProcessReport> all{mine};
  if (processes.rank == 0)
    for (int r = 1; r < processes.count; ++r) all.push_back(decodeReport(reports[static_cast<size_t>(r)]));
  for (const NodeRt& n : nodes) {
    NodeReport nr;
    nr.name = n.spec->name;
    nr.worker = n.worker;
    nr.sent.assign(static_cast<size_t>(n.spec->outputs), 0);
    nr.answered = nr.sent;
    report.nodes.push_back(nr);
  }
  std::vector<int64_t> stalenessSum(nodes.size(), 0), stalenessCount(nodes.size(), 0);
  for (const ProcessReport& p : all) {
    for (double busy : p.workerBusy) report.workerUtilisation.push_back(report.seconds > 0 ? busy / report.seconds : 0);
    for (const auto& c : p.nodes) {
      WEFT_CHECK(c.node >= 0 && c.node < static_cast<int>(nodes.size()) && c.sent.size() == report.nodes[static_cast<size_t>(c.node)].sent.size(),
                 "amp: a process reported node {}, which the graph does not have", c.node);
      NodeReport& nr = report.nodes[static_cast<size_t>(c.node)];
      nr.forwards += c.forwards, nr.backwards += c.backwards, nr.updates += c.updates, nr.gradients += c.gradients;
      nr.maxStaleness = std::max(nr.maxStaleness, c.stalenessMax);
      nr.busySeconds += c.busy;
      for (size_t o = 0; o < c.sent.size(); ++o) nr.sent[o] += c.sent[o], nr.answered[o] += c.answered[o];
      stalenessSum[static_cast<size_t>(c.node)] += c.stalenessSum;
      stalenessCount[static_cast<size_t>(c.node)] += c.stalenessCount;
    }
    if (&p != &all.front())
      for (const auto& [name, value] : p.variables) remoteVariables[name] = value;
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    report.nodes[i].meanStaleness =
        stalenessCount[i] > 0 ? static_cast<double>(stalenessSum[i]) / static_cast<double>(stalenessCount[i]) : 0;
  return report;
}

EpochReport Runtime::train(int64_t count, const std::function<Pumped(int64_t)>& make) {
  EpochReport report = impl_->runEpoch(count, make, true);
  if (options_.replicaSyncEvery == 0) syncReplicas();
  return report;
}

EpochReport Runtime::evaluate(int64_t count, const std::function<Pumped(int64_t)>& make) {
  return impl_->runEpoch(count, make, false);
}

void Runtime::syncReplicas() {
  std::map<ReplicaGroup*, std::vector<NodeRt*>> groups;
  for (NodeRt& n : impl_->nodes)
    if (n.replicas != nullptr) groups[n.replicas].push_back(&n);
  for (auto& [group, members] : groups) {
    std::vector<std::vector<Tensor*>> values;
    for (NodeRt* m : members) values.push_back(impl_->trainedValues(*m));
    for (size_t i = 0; i < values[0].size(); ++i) {
      Tensor sum;
      for (auto& v : values) addInto(sum, *v[i]);
      Tensor mean = scaled(sum, 1.0 / static_cast<double>(members.size()));
      for (auto& v : values) v[i]->copyFrom(mean);
    }
    for (NodeRt* m : members) m->postedRound = -1, m->postedValues.clear(), m->updatesSinceSync = 0;
    group->postedCount = 0;
  }
}

std::map<std::string, Tensor> Runtime::variables() const {
  std::map<std::string, Tensor> out = impl_->remoteVariables;
  for (NodeRt& n : impl_->nodes)
    if (n.compiled && n.spec->kind == NodeKind::Transform)
      for (weft::Node* v : n.compiled->graph->variables())
        out[n.spec->name + "/" + v->name] = n.compiled->session->variable(v).clone();
  return out;
}

void Runtime::abort(const std::string& reason) { impl_->tellFailure(reason); }

bool Runtime::anyProcess(bool mine) {
  Impl& m = *impl_;
  if (m.processes.count == 1) return mine;
  std::unique_lock<std::mutex> lock(m.doneMutex);
  if (m.processes.rank != 0) {
    m.post(0, control(WireKind::Vote, mine ? 1 : 0));
    return m.nextControl(lock, {WireKind::Verdict}).second.instances != 0;
  }
  bool any = mine;
  for (int r = 1; r < m.processes.count; ++r) any = m.nextControl(lock, {WireKind::Vote}).second.instances != 0 || any;
  for (int r = 1; r < m.processes.count; ++r) m.post(r, control(WireKind::Verdict, any ? 1 : 0));
  return any;
}

int64_t Runtime::resume(const std::optional<ResumePoint>& point) {
  Impl& m = *impl_;
  if (m.processes.rank != 0) {
    std::unique_lock<std::mutex> lock(m.doneMutex);
    WireMessage message = m.nextControl(lock, {WireKind::Resume}).second;
    lock.unlock();
    if (message.instances > 0) m.restoreLocal(decodeReport(message.report).variables);
    return message.instances;
  }
  if (!point) {
    for (int r = 1; r < m.processes.count; ++r) m.post(r, control(WireKind::Resume, 0));
    return 0;
  }
  WEFT_CHECK(point->position > 0, "amp: resuming at position {}; a checkpoint comes after some work", point->position);
  std::vector<ProcessReport> shares(static_cast<size_t>(m.processes.count));
  try {
    for (const auto& [name, value] : point->variables)
      shares[static_cast<size_t>(m.processOf(m.transformOwning(name).worker))].variables.emplace_back(name, value);
    m.restoreLocal(shares[0].variables);
  } catch (const std::exception& e) {
    m.tellFailure(e.what());  // the others wait for their share: they stop now, not at the timeout
    throw;
  }
  for (int r = 1; r < m.processes.count; ++r) {
    WireMessage message = control(WireKind::Resume, point->position);
    message.report = encodeReport(shares[static_cast<size_t>(r)]);
    m.post(r, std::move(message));
    for (const auto& [name, value] : shares[static_cast<size_t>(r)].variables) m.remoteVariables[name] = value.clone();
  }
  return point->position;
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

std::string EpochReport::summary() const {
  std::string workers;
  for (double u : workerUtilisation) workers += fmt::format(" {:.0f}%", 100 * u);
  std::string stale;
  for (const NodeReport& n : nodes)
    if (n.gradients > 0) stale += fmt::format(" {} {:.2f}", n.name, n.meanStaleness);
  return fmt::format("loss {:.4f} accuracy {:.4f} | {:.1f} instances/s | active keys {:.2f} | workers{}{}", loss, accuracy,
                     instancesPerSecond, meanActiveKeys, workers, stale.empty() ? "" : " | staleness" + stale);
}

}  // namespace weft::amp
