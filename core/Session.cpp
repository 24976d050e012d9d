#include "core/Session.h"

#include "core/GpuStep.h"
#include "core/Initializers.h"
#include "core/MemoryPlanner.h"
#include "core/OpRegistry.h"
#include "core/Trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <queue>
#include <set>
#include <string_view>

namespace weft {

struct detail::Plan {
  struct Step {
    Kernel kernel;
    KernelContext ctx;
    const Tensor* condition = nullptr;  // run only when this scalar is nonzero
    bool checkFinite = false;           // checkNumerics applies to this step's outputs
  };
  struct FeedSlot {
    Output output;
    int slot;
  };
  struct FetchSlot {
    int slot;
    bool allocatePerRun;  // a kernel output handed to the caller: fresh memory every run
    bool cloneAfterRun;   // a variable: return its value after the run
  };
  struct ArenaSlot {
    int slot;
    int arena;  // index into arenaDevices
    size_t offset;
  };

  std::vector<Tensor> slots;  // one per value; never resized after compile
  std::vector<TensorType> slotTypes;
  std::map<Output, int> slotOf;  // each graph value's slot (a copy to another device has its own)
  std::vector<Device> slotDevices;
  std::vector<Step> steps;
  std::vector<FeedSlot> feeds;  // sorted by output
  std::vector<FetchSlot> fetches;
  std::vector<ArenaSlot> arenaSlots;
  std::vector<Device> arenaDevices;  // one arena per device the plan computes on...
  std::vector<size_t> arenaBytes;    // ...and its size
  std::vector<int> gpus;             // GPUs the plan runs kernels on, ascending
  bool drawsRandom = false;          // a step runs a random op: the run advances the session's step
  uint64_t boundArena = 0;           // generation of the arenas the slots view
  PlanStats stats;
};

namespace {

/// Where a node runs: its requested device, or the CPU.
Device placement(const Node* n) { return n->device.empty() ? cpu() : Device::parse(n->device); }

/// Key of a plan: fetches, targets, and the dtype and shape of every feed (sorted).
std::vector<int64_t> planKey(const std::vector<Output>& fetches, const FeedMap& feeds,
                             const std::vector<Node*>& targets) {
  std::vector<int64_t> key;
  key.push_back(static_cast<int64_t>(fetches.size()));
  for (const Output& f : fetches) {
    WEFT_CHECK(f.valid(), "Session::run: empty fetch");
    key.push_back(f.node()->id);
    key.push_back(f.index());
  }
  key.push_back(static_cast<int64_t>(targets.size()));
  for (Node* t : targets) {
    WEFT_CHECK(t != nullptr, "Session::run: null target");
    key.push_back(t->id);
  }
  std::vector<const std::pair<Output, Tensor>*> sorted;
  for (const auto& f : feeds) sorted.push_back(&f);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (const auto* f : sorted) {
    WEFT_CHECK(f->first.valid() && f->second.defined(), "Session::run: empty feed");
    key.push_back(f->first.node()->id);
    key.push_back(f->first.index());
    key.push_back(static_cast<int64_t>(f->second.dtype()));
    key.push_back(f->second.device().type == DeviceType::CPU ? -1 : f->second.device().index);
    key.push_back(f->second.rank());
    for (int64_t d : f->second.shape().dims()) key.push_back(d);
  }
  return key;
}

void checkFinite(const Node& node, int index, const Tensor& value) {
  if (!isFloating(value.dtype())) return;
  const Tensor t = value.to(cpu());
  dispatchFloat(t.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      if (!std::isfinite(p[i])) {
        WEFT_THROW("{}: output {} of shape {} holds {} at element {} (numerics check)",
                   node.describe(), index, t.shape().str(), static_cast<double>(p[i]), i);
      }
    }
  });
}

/// The needed nodes, pruned to what the fetches and targets depend on; fed outputs cut the
/// graph (their producers run only if another of their outputs is needed).
std::vector<Node*> neededNodes(const std::vector<Output>& fetches, const std::set<Output>& fed,
                               const std::vector<Node*>& targets) {
  std::vector<char> seen;
  std::vector<Node*> stack, out;
  auto demand = [&](Node* n) {
    if (seen.size() <= static_cast<size_t>(n->id)) seen.resize(static_cast<size_t>(n->id) + 1, 0);
    if (!seen[static_cast<size_t>(n->id)]) {
      seen[static_cast<size_t>(n->id)] = 1;
      stack.push_back(n);
    }
  };
  for (const Output& f : fetches) {
    if (!fed.count(f)) demand(f.node());
  }
  for (Node* t : targets) demand(t);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    out.push_back(n);
    for (const Output& in : n->inputs) {
      if (!fed.count(in)) demand(in.node());
    }
    for (Node* c : n->controlInputs) demand(c);
    if (n->condition.valid() && !fed.count(n->condition)) demand(n->condition.node());
  }
  std::sort(out.begin(), out.end(), [](Node* a, Node* b) { return a->id < b->id; });
  return out;
}

/// Orders the needed nodes: data and control edges, plus "every reader of a variable runs before
/// the ops that write it" (unless the reader itself depends on the writer). Ties break by node id,
/// so the order is deterministic; ops that launch asynchronous work run as early as they can.
std::vector<Node*> scheduleNodes(const std::vector<Node*>& nodes, const std::set<Output>& fed) {
  std::unordered_map<const Node*, size_t> pos;
  for (size_t i = 0; i < nodes.size(); ++i) pos[nodes[i]] = i;
  std::vector<std::vector<size_t>> succ(nodes.size());
  auto edge = [&](size_t from, size_t to) { succ[from].push_back(to); };
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const Output& in : nodes[i]->inputs) {
      if (!fed.count(in)) edge(pos.at(in.node()), i);
    }
    for (Node* c : nodes[i]->controlInputs) edge(pos.at(c), i);
    const Output& condition = nodes[i]->condition;
    if (condition.valid() && !fed.count(condition)) edge(pos.at(condition.node()), i);
  }
  // Readers of each written variable.
  std::unordered_map<const Node*, std::vector<size_t>> readers, writers;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    std::set<const Node*> written;
    for (int m : n->def->mutatedInputs) {
      const Node* v = n->inputs[static_cast<size_t>(m)].node();
      WEFT_CHECK(v->op == "Variable", "{}: input {} must be a variable, got {}", n->describe(), m,
                 v->describe());
      written.insert(v);
      writers[v].push_back(i);
    }
    for (const Output& in : n->inputs) {
      if (in.node()->op == "Variable" && !written.count(in.node())) readers[in.node()].push_back(i);
    }
  }
  for (const auto& [var, ws] : writers) {
    for (size_t k = 0; k < ws.size(); ++k) {
      // Descendants of this writer may not be forced before it.
      std::vector<char> after(nodes.size(), 0);
      std::vector<size_t> stack{ws[k]};
      while (!stack.empty()) {
        size_t x = stack.back();
        stack.pop_back();
        for (size_t y : succ[x]) {
          if (!after[y]) {
            after[y] = 1;
            stack.push_back(y);
          }
        }
      }
      auto it = readers.find(var);
      if (it != readers.end()) {
        for (size_t r : it->second) {
          if (!after[r]) edge(r, ws[k]);
        }
      }
      if (k + 1 < ws.size() && !after[ws[k + 1]]) edge(ws[k], ws[k + 1]);
    }
  }
  std::vector<int> indegree(nodes.size(), 0);
  for (const auto& s : succ) {
    for (size_t y : s) ++indegree[y];
  }
  // Ops that launch asynchronous work (collectives) go first among the ready ones, so that the
  // work overlaps the rest of the step; the rest keep node order.
  auto later = [&](size_t a, size_t b) {
    const bool asyncA = nodes[a]->def->launchesAsync, asyncB = nodes[b]->def->launchesAsync;
    return asyncA != asyncB ? asyncB : a > b;
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(later);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!indegree[i]) ready.push(i);
  }
  std::vector<Node*> order;
  while (!ready.empty()) {
    size_t x = ready.top();
    ready.pop();
    order.push_back(nodes[x]);
    for (size_t y : succ[x]) {
      if (--indegree[y] == 0) ready.push(y);
    }
  }
  WEFT_CHECK(order.size() == nodes.size(),
             "the graph's control dependencies and variable updates form a cycle");
  return order;
}

/// The bytes an op reads and writes: its inputs and outputs, each counted once, except an output
/// that is a view of an input (a reshape), which moves neither.
int64_t operandBytes(const KernelContext& ctx) {
  int64_t bytes = 0;
  for (const Tensor* t : ctx.inputs) bytes += static_cast<int64_t>(t->bytes());
  for (const Tensor* out : ctx.outputs) {
    const auto view = std::find_if(ctx.inputs.begin(), ctx.inputs.end(), [&](const Tensor* in) {
      return out->bytes() > 0 && in->raw() == out->raw();
    });
    bytes += static_cast<int64_t>(out->bytes()) * (view == ctx.inputs.end() ? 1 : -1);
  }
  return bytes;
}

}  // namespace

Session::Session(Graph& graph, SessionOptions options)
    : graph_(graph), options_(options), pool_(std::make_unique<ThreadPool>(options.threads)) {}

Session::~Session() = default;

void Session::initializeVariable(Node* v) {
  if (!variables_.count(v)) variables_.emplace(v, initialValue(graph_, *v).to(placement(v)));
}

Tensor& Session::variable(Node* v) {
  WEFT_CHECK(v && v->op == "Variable" && v->graph == &graph_, "{} is not a variable of this graph",
             v ? v->describe() : std::string("null node"));
  initializeVariable(v);
  return variables_.at(v);
}

Tensor& Session::variable(const std::string& name) {
  Node* v = graph_.find(name);
  WEFT_CHECK(v && v->op == "Variable", "no variable named '{}' in the graph", name);
  return variable(v);
}

void Session::setVariable(const std::string& name, const Tensor& value) {
  Tensor& t = variable(name);
  WEFT_CHECK(t.dtype() == value.dtype() && t.shape() == value.shape(),
             "variable '{}' is {}{}, the new value {}{}", name, dtypeName(t.dtype()), t.shape().str(),
             dtypeName(value.dtype()), value.shape().str());
  t.copyFrom(value);
}

void Session::replaceVariable(Node* v, Tensor value) {
  WEFT_CHECK(v && v->op == "Variable" && v->graph == &graph_, "{} is not a variable of this graph",
             v ? v->describe() : std::string("null node"));
  const TensorType& type = v->outputs[0];
  WEFT_CHECK(value.dtype() == type.dtype && value.shape() == type.shape,
             "variable '{}' is {}{} in the graph, the new value {}{}", v->name, dtypeName(type.dtype), type.shape.str(),
             dtypeName(value.dtype()), value.shape().str());
  variables_.insert_or_assign(v, value.to(placement(v)));
  plans_.clear();
}

void Session::resetVariables() {
  // Values are overwritten in place so that compiled plans keep pointing at them.
  for (auto& [node, tensor] : variables_) tensor.copyFrom(initialValue(graph_, *node));
}

detail::Plan& Session::planFor(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets) {
  std::vector<int64_t> key = planKey(fetches, feeds, targets);
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(std::move(key), compile(fetches, feeds, targets)).first;
  return *it->second;
}

namespace {

/// A kernel's work item in plan order: a node's kernel, or a copy of a value to the device of the
/// node that consumes it (inserted by the executor, so graphs never name copies).
struct Item {
  Node* node;       // the node, or the consumer the copy is made for
  bool copy;
  Device device;
  std::vector<int> in, out;
  int condition = -1;  // the slot of the node's run condition
};

void copyKernel(KernelContext& ctx) { ctx.output(0).copyFrom(ctx.input(0)); }

/// What phase 2 gives: the work items in plan order and every value's slot, with its concrete
/// type and the device it lives on.
struct Slots {
  std::vector<Item> items;
  std::map<Output, int> slotOf;
  std::vector<TensorType> types;
  std::vector<Device> devices;

  int add(TensorType t, Device d) {
    types.push_back(std::move(t));
    devices.push_back(d);
    return static_cast<int>(types.size()) - 1;
  }
  size_t bytes(int slot) const {
    const TensorType& t = types[static_cast<size_t>(slot)];
    return static_cast<size_t>(t.shape.numel()) * dtypeSize(t.dtype);
  }
};

/// Phase 2, slots and device copies: concrete types flow through the ordered nodes (feeds give
/// the batch size); a value lives on its producer's device (a feed: where the caller's tensor
/// is); where a node reads a value that lives on another device, a copy item is added before it
/// (one per value and device, shared by its consumers there).
Slots assignSlots(const std::vector<Node*>& order, const std::map<Output, const Tensor*>& feedValue,
                  const std::set<Output>& fed) {
  Slots s;
  for (const auto& [out, value] : feedValue) {
    const TensorType& declared = out.type();
    WEFT_CHECK(value->dtype() == declared.dtype && value->shape().compatibleWith(declared.shape),
               "feed for {} is {}{}, expected {}", out.name(), dtypeName(value->dtype()),
               value->shape().str(), declared.str());
    s.slotOf[out] = s.add({value->dtype(), value->shape()}, value->device());
  }
  std::map<std::pair<int, std::string>, int> copyOf;  // (slot, device) -> the copied slot
  for (Node* n : order) {
    WEFT_CHECK(n->def->sourceKind != SourceKind::Placeholder,
               "placeholder '{}' ({}) is needed but was not fed", n->name, n->outputs[0].str());
    const Device device = placement(n);
    WEFT_CHECK(
        device.type == DeviceType::CPU || device.index < cudaDeviceCount(),
        "{} is placed on {}, which is not available: {}", n->describe(), device.str(),
        cudaDeviceCount() ? fmt::format("this machine has {} GPU(s)", cudaDeviceCount()) : cudaUnavailableReason());
    std::vector<TensorType> inputTypes;
    for (const Output& in : n->inputs) inputTypes.push_back(s.types[static_cast<size_t>(s.slotOf.at(in))]);
    const bool kernel = n->def->sourceKind == SourceKind::None;
    const std::vector<TensorType> outTypes = kernel ? n->def->inferFn(InferContext{*n, inputTypes}) : n->outputs;
    Item item{n, false, device, {}, {}};
    if (n->condition.valid()) item.condition = s.slotOf.at(n->condition);
    if (kernel) {
      WEFT_CHECK(n->def->kernelFor(device.type) != nullptr, "{} has no kernel for {}", n->describe(), device.str());
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const int slot = s.slotOf.at(n->inputs[i]);
        const Device from = s.devices[static_cast<size_t>(slot)];
        const std::vector<int>& uncopied = n->def->inputsNotCopied;
        if (from == device || std::find(uncopied.begin(), uncopied.end(), static_cast<int>(i)) != uncopied.end()) {
          item.in.push_back(slot);
          continue;
        }
        const bool mutated = std::find(n->def->mutatedInputs.begin(), n->def->mutatedInputs.end(),
                                       static_cast<int>(i)) != n->def->mutatedInputs.end();
        WEFT_CHECK(!mutated, "{} runs on {} but updates {} on {}: place a variable and its updates on one device",
                   n->describe(), device.str(), n->inputs[i].node()->describe(), from.str());
        auto [it, added] = copyOf.try_emplace({slot, device.str()}, 0);
        if (added) {
          it->second = s.add(s.types[static_cast<size_t>(slot)], device);
          s.items.push_back({n, true, device, {slot}, {it->second}});
        }
        item.in.push_back(it->second);
      }
    }
    for (size_t i = 0; i < outTypes.size(); ++i) {
      WEFT_CHECK(outTypes[i].shape.isFullyDefined(), "{}: output {} has unresolved shape {} at run time",
                 n->describe(), i, outTypes[i].shape.str());
      const Output o(n, static_cast<int>(i));
      if (fed.count(o)) continue;
      s.slotOf[o] = s.add(outTypes[i], device);
      item.out.push_back(s.slotOf[o]);
    }
    if (kernel) s.items.push_back(std::move(item));
  }
  return s;
}

/// Phases 3 and 4's result: every value as the arena plan saw it, and where it went.
struct MemoryLayout {
  std::vector<PlannedValue> values;
  ArenaPlan arenas;
};

/// Phases 3 and 4, lifetimes and the arena plan (core/MemoryPlanner.h): every kernel output that
/// is not fetched is planned, in the arena of its device. A value that must outlive the step
/// (a pipeline stage's stashed activation) is one the plan does not place: a fetch.
MemoryLayout planMemory(const Slots& s, const std::set<int>& fetched, std::vector<Device>& arenaDevices) {
  std::vector<PlannedValue> values(s.types.size());
  auto arenaOf = [&](const Device& d) {
    const auto it = std::find(arenaDevices.begin(), arenaDevices.end(), d);
    if (it != arenaDevices.end()) return static_cast<int>(it - arenaDevices.begin());
    arenaDevices.push_back(d);
    return static_cast<int>(arenaDevices.size()) - 1;
  };
  std::vector<PlannedItem> items;
  for (const Item& item : s.items) {
    PlannedItem p{item.in, item.out};
    if (item.condition >= 0) p.reads.push_back(item.condition);
    const auto input = [&](int i) { return i >= 0 && i < static_cast<int>(item.in.size()) ? item.in[size_t(i)] : -1; };
    if (!item.copy) {
      p.inplaceInput = input(item.node->def->inplaceInput);
      p.viewInput = input(item.node->def->viewInput);
    }
    for (int v : item.out) {
      values[static_cast<size_t>(v)] = {s.bytes(v), s.types[static_cast<size_t>(v)].dtype,
                                        arenaOf(s.devices[static_cast<size_t>(v)]), !fetched.count(v)};
    }
    items.push_back(std::move(p));
  }
  ArenaPlan arenas = planArenas(items, values, static_cast<int>(arenaDevices.size()));
  return {std::move(values), std::move(arenas)};
}

// Phase 5a: variables and constants bind to their storage, planned values to arena offsets
// (bound to the arena itself when the plan runs).
void bindStorage(detail::Plan& plan, const std::vector<Node*>& order, const std::map<Output, int>& slotOf,
                 const std::set<Output>& fed, const MemoryLayout& memory,
                 const std::function<Tensor&(Node*)>& variableOf) {
  for (Node* n : order) {
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      const Output o(n, static_cast<int>(i));
      if (fed.count(o)) continue;
      const auto s = static_cast<size_t>(slotOf.at(o));
      if (n->def->sourceKind == SourceKind::Variable) plan.slots[s] = variableOf(n);
      if (n->def->sourceKind == SourceKind::Constant) plan.slots[s] = n->attrs.get<Tensor>("value").to(placement(n));
    }
  }
  for (size_t v = 0; v < memory.values.size(); ++v) {
    if (memory.values[v].planned)
      plan.arenaSlots.push_back({static_cast<int>(v), memory.values[v].arena, memory.arenas.offsets[v]});
  }
}

// Phase 5b: one step per item, its context pointing at the slots.
void buildSteps(detail::Plan& plan, const std::vector<Item>& items, const Graph& graph, const ThreadPool* pool,
                const SessionOptions& options) {
  const std::vector<Node*>& lossScaled = graph.collection(kLossScaledCollection);
  const std::set<const Node*> numericsLeftToLossScaling(lossScaled.begin(), lossScaled.end());
  for (const Item& item : items) {
    detail::Plan::Step step{item.copy ? copyKernel : item.node->def->kernelFor(item.device.type), {}};
    step.ctx.node = item.node;
    step.ctx.pool = pool;
    step.ctx.device = item.device;
    step.ctx.planStep = static_cast<int>(plan.steps.size());
    if (item.device.type == DeviceType::CUDA) {
      step.ctx.stream = detail::computeStream(item.device);
      // Kept ascending: a run holds its GPUs in this order, as every thread does (Session::runPlan).
      const auto at = std::lower_bound(plan.gpus.begin(), plan.gpus.end(), item.device.index);
      if (at == plan.gpus.end() || *at != item.device.index) plan.gpus.insert(at, item.device.index);
    }
    for (int in : item.in) step.ctx.inputs.push_back(&plan.slots[static_cast<size_t>(in)]);
    for (int out : item.out) step.ctx.outputs.push_back(&plan.slots[static_cast<size_t>(out)]);
    if (item.condition >= 0) step.condition = &plan.slots[static_cast<size_t>(item.condition)];
    // An op that launches work in the background (a gather into its output) has not written its
    // outputs when it returns; what waits for the work is checked instead.
    step.checkFinite = options.checkNumerics && !numericsLeftToLossScaling.count(item.node) &&
                       !item.node->def->launchesAsync;
    plan.drawsRandom = plan.drawsRandom || (!item.copy && item.node->def->drawsRandom);
    plan.steps.push_back(std::move(step));
  }
}

/// A step's name and category in the trace: its node's, or for a copy the executor added, what
/// it copies and for whom.
std::string traceName(const detail::Plan::Step& s) {
  if (s.kernel != copyKernel) return s.ctx.node->name;
  return fmt::format("copy to {} for {}", s.ctx.device.str(), s.ctx.node->name);
}

std::string traceCategory(const detail::Plan::Step& s) { return s.kernel == copyKernel ? "Copy" : s.ctx.node->op; }

}  // namespace

// Compiling runs in phases: (1) prune to what the fetches and targets need and order it,
// (2) assign slots and device copies, (3-4) plan lifetimes and arenas, (5) bind storage and
// build the steps.
std::unique_ptr<detail::Plan> Session::compile(const std::vector<Output>& fetches,
                                                const FeedMap& feeds,
                                                const std::vector<Node*>& targets) {
  auto plan = std::make_unique<Plan>();
  std::set<Output> fed;
  std::map<Output, const Tensor*> feedValue;
  for (const auto& [out, value] : feeds) {
    WEFT_CHECK(out.node()->graph == &graph_, "feed {} belongs to another graph", out.name());
    WEFT_CHECK(fed.insert(out).second, "{} is fed twice", out.name());
    feedValue[out] = &value;
  }
  const std::vector<Node*> order = scheduleNodes(neededNodes(fetches, fed, targets), fed);

  Slots slots = assignSlots(order, feedValue, fed);
  plan->slotTypes = slots.types;
  plan->slotOf = slots.slotOf;
  plan->slotDevices = slots.devices;
  plan->slots.resize(slots.types.size());

  std::set<int> fetchedSlots;
  for (const Output& f : fetches) fetchedSlots.insert(slots.slotOf.at(f));
  const MemoryLayout memory = planMemory(slots, fetchedSlots, plan->arenaDevices);
  plan->arenaBytes = memory.arenas.arenaBytes;
  for (size_t bytes : memory.arenas.arenaBytes) plan->stats.arenaBytes += bytes;
  plan->stats.unplannedBytes = memory.arenas.unplannedBytes;
  plan->stats.inplaceOps = memory.arenas.inplaceOps;
  plan->stats.viewOps = memory.arenas.viewOps;
  bindStorage(*plan, order, slots.slotOf, fed, memory, [this](Node* v) -> Tensor& { return variable(v); });
  for (const auto& [out, value] : feedValue) plan->feeds.push_back({out, slots.slotOf.at(out)});
  buildSteps(*plan, slots.items, graph_, pool_.get(), options_);
  for (const Output& f : fetches) {
    const int s = slots.slotOf.at(f);
    const bool isKernelOutput = !fed.count(f) && f.node()->def->sourceKind == SourceKind::None;
    plan->fetches.push_back({s, isKernelOutput, f.node()->def->sourceKind == SourceKind::Variable});
    if (isKernelOutput) plan->stats.fetchBytes += slots.bytes(s);
  }
  plan->stats.opCount = plan->steps.size();
  plan->stats.castOps = static_cast<size_t>(
      std::count_if(order.begin(), order.end(), [](const Node* n) { return n->op == "Cast"; }));
  plan->stats.peakBytes = plan->stats.arenaBytes + plan->stats.fetchBytes;
  return plan;
}

void Session::bindArena(Plan& plan) {
  bool grown = false;
  for (size_t a = 0; a < plan.arenaDevices.size(); ++a) {
    const Device& d = plan.arenaDevices[a];
    auto it = std::find_if(arenas_.begin(), arenas_.end(), [&](const auto& arena) { return arena->device() == d; });
    if (it != arenas_.end() && (*it)->bytes() >= plan.arenaBytes[a]) continue;
    if (!grown) {
      // Growing an arena all plans share: other plans drop their views of the old one (freeing
      // it) and re-bind when they next run.
      for (auto& [key, other] : plans_) {
        for (const Plan::ArenaSlot& v : other->arenaSlots) other->slots[static_cast<size_t>(v.slot)] = Tensor();
        other->boundArena = 0;
      }
      grown = true;
    }
    if (it != arenas_.end()) {
      it->reset();
      *it = std::make_shared<Buffer>(plan.arenaBytes[a], d);
    } else {
      arenas_.push_back(std::make_shared<Buffer>(plan.arenaBytes[a], d));
    }
  }
  if (grown) ++arenaGeneration_;
  if (plan.boundArena == arenaGeneration_) return;
  for (const Plan::ArenaSlot& v : plan.arenaSlots) {
    const TensorType& t = plan.slotTypes[static_cast<size_t>(v.slot)];
    const Device& d = plan.arenaDevices[static_cast<size_t>(v.arena)];
    const auto& arena = *std::find_if(arenas_.begin(), arenas_.end(), [&](const auto& b) { return b->device() == d; });
    plan.slots[static_cast<size_t>(v.slot)] = Tensor(arena, v.offset, t.dtype, t.shape);
  }
  plan.boundArena = arenaGeneration_;
}

std::vector<Tensor> Session::run(const std::vector<Output>& fetches, const FeedMap& feeds,
                                 const std::vector<Node*>& targets) {
  return runPlan(fetches, feeds, targets, true);
}

std::vector<Tensor> Session::runOnDevice(const std::vector<Output>& fetches, const FeedMap& feeds,
                                         const std::vector<Node*>& targets) {
  return runPlan(fetches, feeds, targets, false);
}

std::vector<Tensor> Session::runPlan(const std::vector<Output>& fetches, const FeedMap& feeds,
                                     const std::vector<Node*>& targets, bool toHost) {
  Plan& plan = planFor(fetches, feeds, targets);
  std::vector<std::unique_lock<std::mutex>> turns;  // each GPU's, in ascending order
  for (int gpu : plan.gpus) turns.push_back(detail::holdGpu(gpu));
  const auto describeStep = [&plan](int step) {
    return static_cast<size_t>(step) < plan.steps.size() ? plan.steps[static_cast<size_t>(step)].ctx.node->describe()
                                                        : fmt::format("plan step {}", step);
  };
  bindArena(plan);
  for (const Plan::FeedSlot& f : plan.feeds) {
    for (const auto& [out, value] : feeds) {
      if (out == f.output) plan.slots[static_cast<size_t>(f.slot)] = value;
    }
  }
  for (const Plan::FetchSlot& f : plan.fetches) {
    if (f.allocatePerRun) {
      const TensorType& t = plan.slotTypes[static_cast<size_t>(f.slot)];
      Tensor& slot = plan.slots[static_cast<size_t>(f.slot)];
      slot = Tensor();  // the last run's buffer goes back first, so the next can reuse it
      slot = Tensor(t.dtype, t.shape, plan.slotDevices[static_cast<size_t>(f.slot)]);
    }
  }
  try {
    runSteps(plan);
  } catch (const std::exception& e) {
    if (gpuTimeline_) gpuTimeline_->discard();
    // A GPU error recorded earlier in the step is the likelier cause; it is also cleared here.
    std::string gpuError;
    for (int gpu : plan.gpus) {
      try {
        const std::string m = detail::finishGpuStep(gpu, describeStep);
        if (gpuError.empty()) gpuError = m;
      } catch (const std::exception&) {
        // The original error says more.
      }
    }
    if (!gpuError.empty()) throw Error(gpuError);
    throw;
  }
  // A step ends when its GPU work has: errors surface in this run, naming their op.
  std::string gpuError;
  for (int gpu : plan.gpus) {
    const std::string m = detail::finishGpuStep(gpu, describeStep);
    if (gpuError.empty()) gpuError = m;
  }
  if (gpuTimeline_) {
    if (gpuError.empty()) gpuTimeline_->flush(tracing(), opSeconds_);
    else gpuTimeline_->discard();
  }
  if (!gpuError.empty()) throw Error(gpuError);
  if (plan.drawsRandom) ++step_;
  std::vector<Tensor> out;
  out.reserve(plan.fetches.size());
  for (const Plan::FetchSlot& f : plan.fetches) {
    const Tensor& t = plan.slots[static_cast<size_t>(f.slot)];
    if (toHost && t.device().type != DeviceType::CPU) out.push_back(t.to(cpu()));
    else out.push_back(f.cloneAfterRun ? t.clone() : t);
  }
  // Drop references to fed tensors so the caller's memory is not kept alive by the plan.
  for (const Plan::FeedSlot& f : plan.feeds) plan.slots[static_cast<size_t>(f.slot)] = Tensor();
  return out;
}

void Session::runSteps(Plan& plan) {
  std::vector<std::pair<const Tensor*, bool>> conditions;  // each read once per run
  auto holds = [&](const Tensor* condition) {
    for (const auto& [t, value] : conditions) {
      if (t == condition) return value;
    }
    // A condition on a GPU is read after the work queued before it: the step's one wait.
    const Tensor host = condition->device().type == DeviceType::CPU ? *condition : condition->to(cpu());
    const double v = host.item();
    const bool value = v != 0 && !std::isnan(v);
    conditions.emplace_back(condition, value);
    return value;
  };
  for (Plan::Step& s : plan.steps) {
    if (s.condition && !holds(s.condition)) continue;
    s.ctx.step = step_;
    s.ctx.replica = options_.replica;
    // Copies and allocations may change the thread's current GPU, so each GPU step sets it.
    if (s.ctx.device.type == DeviceType::CUDA) detail::makeGpuCurrent(s.ctx.device.index);
    const bool timed = opSeconds_ != nullptr || tracing();
    const auto started = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    // A traced or profiled GPU op also gets its kernels' own time, from events around its launch;
    // profiling counts that time rather than the launch's.
    const bool gpuTimed = timed && s.ctx.device.type == DeviceType::CUDA;
    if (gpuTimed) {
      if (!gpuTimeline_) gpuTimeline_ = std::make_unique<detail::GpuTimeline>();
      gpuTimeline_->begin(s.ctx.device.index);
    }
    try {
      s.kernel(s.ctx);
    } catch (const Error& e) {
      // CPU kernels name their op when they fail; a GPU launch failure is named here.
      const std::string op = s.ctx.node->describe();
      if (s.ctx.device.type == DeviceType::CPU || std::string_view(e.what()).find(op) != std::string_view::npos) throw;
      WEFT_THROW("{} on {}: {}", op, s.ctx.device.str(), e.what());
    } catch (const std::exception& e) {
      WEFT_THROW("{}: {}", s.ctx.node->describe(), e.what());
    }
    if (timed) {
      const auto ended = std::chrono::steady_clock::now();
      if (opSeconds_ != nullptr && !gpuTimed)
        (*opSeconds_)[s.ctx.node] += std::chrono::duration<double>(ended - started).count();
      if (tracing()) traceEvent(traceName(s), traceCategory(s), "ops", started, ended, operandBytes(s.ctx));
    }
    if (gpuTimed) gpuTimeline_->end(s.ctx.node, traceName(s), traceCategory(s), operandBytes(s.ctx));
    if (s.checkFinite) {
      for (size_t i = 0; i < s.ctx.outputs.size(); ++i)
        checkFinite(*s.ctx.node, static_cast<int>(i), *s.ctx.outputs[i]);
    }
    if (afterEachOp_) afterEachOp_();
  }
}

std::unordered_map<const Node*, double> Session::profile(const std::vector<Output>& fetches, const FeedMap& feeds,
                                                         const std::vector<Node*>& targets, int runs) {
  WEFT_CHECK(runs >= 1, "Session::profile: {} runs", runs);
  std::vector<std::pair<Node*, Tensor>> saved;
  for (Node* v : graph_.variables()) saved.emplace_back(v, variable(v).clone());
  const uint64_t step = step_;
  std::unordered_map<const Node*, double> seconds;
  std::exception_ptr failure;
  try {
    run(fetches, feeds, targets);  // compiles and warms up, untimed
    opSeconds_ = &seconds;
    for (int r = 0; r < runs; ++r) run(fetches, feeds, targets);
  } catch (...) {
    failure = std::current_exception();
  }
  opSeconds_ = nullptr;
  for (auto& [v, value] : saved) variable(v).copyFrom(value);
  step_ = step;
  if (failure) std::rethrow_exception(failure);
  for (auto& [node, total] : seconds) total /= runs;
  return seconds;
}

PlanStats Session::planStats(const std::vector<Output>& fetches, const FeedMap& feeds,
                             const std::vector<Node*>& targets) {
  return planFor(fetches, feeds, targets).stats;
}

std::map<Output, TensorType> Session::valueTypes(const std::vector<Output>& fetches, const FeedMap& feeds,
                                                const std::vector<Node*>& targets) {
  const Plan& plan = planFor(fetches, feeds, targets);
  std::map<Output, TensorType> types;
  for (const auto& [output, slot] : plan.slotOf) types.emplace(output, plan.slotTypes[static_cast<size_t>(slot)]);
  return types;
}

size_t Session::largestPlanPeakBytes() const {
  size_t largest = 0;
  for (const auto& [key, plan] : plans_) largest = std::max(largest, plan->stats.peakBytes);
  return largest;
}

}  // namespace weft
