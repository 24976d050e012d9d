#include "core/Session.h"

#include "core/MemoryPlanner.h"
#include "core/OpRegistry.h"
#include "core/Random.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>

namespace weft {

struct Session::Plan {
  struct Step {
    Kernel kernel;
    KernelContext ctx;
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

  std::vector<Tensor> slots;  // one per value; never resized after compile
  std::vector<TensorType> slotTypes;
  std::vector<Step> steps;
  std::vector<FeedSlot> feeds;  // sorted by output
  std::vector<FetchSlot> fetches;
  std::vector<std::pair<int, size_t>> arenaSlots;  // (slot, offset in the session's arena)
  uint64_t boundArena = 0;                         // generation of the arena the slots view
  PlanStats stats;
};

namespace {

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
    key.push_back(f->second.rank());
    for (int64_t d : f->second.shape().dims()) key.push_back(d);
  }
  return key;
}

void checkFinite(const Node& node, int index, const Tensor& t) {
  if (!isFloating(t.dtype())) return;
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

}  // namespace

Session::Session(Graph& graph, SessionOptions options)
    : graph_(graph), options_(options), pool_(std::make_unique<ThreadPool>(options.threads)) {}

Session::~Session() = default;

Tensor Session::initialValue(Node* v) {
  const Attrs& a = v->attrs;
  const DType dtype = a.get<DType>("dtype");
  const Shape& shape = a.get<Shape>("shape");
  const Initializer::Kind kind = Initializer::parseKind(a.get<std::string>("init"));
  const double p = a.getFloat("init_a"), q = a.getFloat("init_b");
  Tensor t(dtype, shape);
  const uint64_t key = streamKey(graph_.seed(), v->name);
  const auto [fanIn, fanOut] = fans(shape);
  auto fillWith = [&](auto draw) {
    dispatchDType(dtype, [&](auto z) {
      using T = decltype(z);
      T* d = t.data<T>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = static_cast<T>(draw(static_cast<uint64_t>(i)));
    });
  };
  switch (kind) {
    case Initializer::Kind::Zeros: t.fill(0); break;
    case Initializer::Kind::Constant: t.fill(p); break;
    case Initializer::Kind::Uniform: fillWith([&](uint64_t i) { return p + (q - p) * uniformAt(key, i); }); break;
    case Initializer::Kind::Normal: fillWith([&](uint64_t i) { return p + q * normalAt(key, i); }); break;
    case Initializer::Kind::TruncatedNormal:
      fillWith([&](uint64_t i) {
        for (uint64_t attempt = 0;; ++attempt) {
          const double z = normalAt(key, i + attempt * 0x100000000ULL);
          if (std::abs(z) <= 2.0) return q * z;
        }
      });
      break;
    case Initializer::Kind::GlorotUniform: {
      const double limit = std::sqrt(6.0 / (fanIn + fanOut));
      fillWith([&](uint64_t i) { return -limit + 2 * limit * uniformAt(key, i); });
      break;
    }
    case Initializer::Kind::HeNormal: {
      const double stddev = std::sqrt(2.0 / fanIn);
      fillWith([&](uint64_t i) { return stddev * normalAt(key, i); });
      break;
    }
    case Initializer::Kind::Value: t.copyFrom(a.get<Tensor>("value")); break;
    case Initializer::Kind::CopyOf: t.copyFrom(initialValue(graph_.find(a.get<std::string>("source")))); break;
  }
  return t;
}

void Session::initializeVariable(Node* v) {
  if (!variables_.count(v)) variables_.emplace(v, initialValue(v));
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

void Session::resetVariables() {
  // Values are overwritten in place so that compiled plans keep pointing at them.
  for (auto& [node, tensor] : variables_) tensor.copyFrom(initialValue(const_cast<Node*>(node)));
}

Session::Plan& Session::planFor(const std::vector<Output>& fetches, const FeedMap& feeds,
                                const std::vector<Node*>& targets) {
  std::vector<int64_t> key = planKey(fetches, feeds, targets);
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(std::move(key), compile(fetches, feeds, targets)).first;
  return *it->second;
}

std::unique_ptr<Session::Plan> Session::compile(const std::vector<Output>& fetches,
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

  // Values (node outputs and feeds) get slot numbers; concrete types flow in schedule order.
  std::map<Output, int> slotOf;
  auto newSlot = [&](const Output& o, TensorType t) {
    slotOf[o] = static_cast<int>(plan->slotTypes.size());
    plan->slotTypes.push_back(std::move(t));
  };
  for (const auto& [out, value] : feedValue) {
    const TensorType& declared = out.type();
    WEFT_CHECK(value->dtype() == declared.dtype && value->shape().compatibleWith(declared.shape),
               "feed for {} is {}{}, expected {}", out.name(), dtypeName(value->dtype()),
               value->shape().str(), declared.str());
    newSlot(out, {value->dtype(), value->shape()});
  }
  for (Node* n : order) {
    WEFT_CHECK(n->def->sourceKind != SourceKind::Placeholder,
               "placeholder '{}' ({}) is needed but was not fed", n->name, n->outputs[0].str());
    std::vector<TensorType> inputTypes;
    for (const Output& in : n->inputs) inputTypes.push_back(plan->slotTypes[static_cast<size_t>(slotOf.at(in))]);
    std::vector<TensorType> outTypes =
        n->def->sourceKind == SourceKind::None ? n->def->inferFn(InferContext{*n, inputTypes}) : n->outputs;
    for (size_t i = 0; i < outTypes.size(); ++i) {
      WEFT_CHECK(outTypes[i].shape.isFullyDefined(), "{}: output {} has unresolved shape {} at run time",
                 n->describe(), i, outTypes[i].shape.str());
      const Output o(n, static_cast<int>(i));
      if (!fed.count(o)) newSlot(o, outTypes[i]);
    }
  }
  plan->slots.resize(plan->slotTypes.size());

  // Lifetimes: a value lives from its producer's step to its last consumer's step.
  std::set<int> fetchedSlots;
  for (const Output& f : fetches) fetchedSlots.insert(slotOf.at(f));
  std::vector<int> producerStep(plan->slots.size(), -1), lastUse(plan->slots.size(), -1);
  std::vector<bool> planned(plan->slots.size(), false);
  for (size_t k = 0; k < order.size(); ++k) {
    Node* n = order[k];
    for (const Output& in : n->inputs) lastUse[static_cast<size_t>(slotOf.at(in))] = static_cast<int>(k);
    if (n->def->sourceKind != SourceKind::None) continue;
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      const int s = slotOf.at(Output(n, static_cast<int>(i)));
      producerStep[static_cast<size_t>(s)] = static_cast<int>(k);
      planned[static_cast<size_t>(s)] = !fetchedSlots.count(s);
    }
  }

  // Memory plan: outputs are placed before the step's dying inputs are released, so an output
  // never overlaps an input unless the op is marked in-place for it.
  MemoryPlanner planner;
  std::vector<MemoryPlanner::Block> blockOf(plan->slots.size());
  auto bytesOf = [&](int s) {
    const TensorType& t = plan->slotTypes[static_cast<size_t>(s)];
    return static_cast<size_t>(t.shape.numel()) * dtypeSize(t.dtype);
  };
  std::vector<std::vector<int>> dying(order.size());
  for (size_t s = 0; s < plan->slots.size(); ++s) {
    if (!planned[s]) continue;
    const int end = std::max(lastUse[s], producerStep[s]);
    dying[static_cast<size_t>(end)].push_back(static_cast<int>(s));
  }
  std::vector<bool> inheritedBy(plan->slots.size(), false);
  for (size_t k = 0; k < order.size(); ++k) {
    Node* n = order[k];
    if (n->def->sourceKind != SourceKind::None) continue;
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      const int s = slotOf.at(Output(n, static_cast<int>(i)));
      if (!planned[static_cast<size_t>(s)]) continue;
      plan->stats.unplannedBytes += bytesOf(s);
      const int src = n->def->inplaceInput;
      if (i == 0 && src >= 0 && src < static_cast<int>(n->inputs.size())) {
        const int in = slotOf.at(n->inputs[static_cast<size_t>(src)]);
        const auto u = static_cast<size_t>(in);
        if (planned[u] && !inheritedBy[u] && lastUse[u] == static_cast<int>(k) &&
            bytesOf(in) == bytesOf(s) &&
            plan->slotTypes[u].dtype == plan->slotTypes[static_cast<size_t>(s)].dtype) {
          blockOf[static_cast<size_t>(s)] = blockOf[u];
          inheritedBy[u] = true;
          ++plan->stats.inplaceOps;
          continue;
        }
      }
      blockOf[static_cast<size_t>(s)] = planner.allocate(bytesOf(s));
    }
    for (int s : dying[k]) {
      if (!inheritedBy[static_cast<size_t>(s)]) planner.release(blockOf[static_cast<size_t>(s)]);
    }
  }
  plan->stats.arenaBytes = planner.arenaBytes();

  // Bind every slot to storage.
  for (size_t k = 0; k < order.size(); ++k) {
    Node* n = order[k];
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      const Output o(n, static_cast<int>(i));
      if (fed.count(o)) continue;
      const auto s = static_cast<size_t>(slotOf.at(o));
      switch (n->def->sourceKind) {
        case SourceKind::Variable: plan->slots[s] = variable(n); break;
        case SourceKind::Constant: plan->slots[s] = n->attrs.get<Tensor>("value"); break;
        default:
          if (planned[s]) plan->arenaSlots.emplace_back(static_cast<int>(s), blockOf[s].offset);
      }
    }
  }
  for (const auto& [out, value] : feedValue) plan->feeds.push_back({out, slotOf.at(out)});

  // Steps: one per kernel, contexts pointing at the slots.
  for (Node* n : order) {
    if (n->def->sourceKind != SourceKind::None) continue;
    const Device device = n->device.empty() ? cpu() : Device::parse(n->device);
    WEFT_CHECK(device.type == DeviceType::CPU, "{} is placed on {}, but this session runs on cpu only",
               n->describe(), device.str());
    Kernel kernel = n->def->kernelFor(device.type);
    WEFT_CHECK(kernel != nullptr, "{} has no kernel for {}", n->describe(), device.str());
    Plan::Step step{kernel, {}};
    step.ctx.node = n;
    step.ctx.pool = pool_.get();
    for (const Output& in : n->inputs) step.ctx.inputs.push_back(&plan->slots[static_cast<size_t>(slotOf.at(in))]);
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      step.ctx.outputs.push_back(&plan->slots[static_cast<size_t>(slotOf.at(Output(n, static_cast<int>(i))))]);
    }
    plan->steps.push_back(std::move(step));
  }
  for (const Output& f : fetches) {
    const int s = slotOf.at(f);
    const bool isKernelOutput = !fed.count(f) && f.node()->def->sourceKind == SourceKind::None;
    plan->fetches.push_back({s, isKernelOutput, f.node()->def->sourceKind == SourceKind::Variable});
    if (isKernelOutput) plan->stats.fetchBytes += bytesOf(s);
  }
  plan->stats.opCount = plan->steps.size();
  plan->stats.peakBytes = plan->stats.arenaBytes + plan->stats.fetchBytes;
  return plan;
}

void Session::bindArena(Plan& plan) {
  if (!arena_ || arena_->bytes() < plan.stats.arenaBytes) {
    // Grow the one arena all plans share; other plans drop their views of the old one (freeing
    // it) and re-bind when they next run.
    for (auto& [key, other] : plans_) {
      for (const auto& [slot, offset] : other->arenaSlots) other->slots[static_cast<size_t>(slot)] = Tensor();
      other->boundArena = 0;
    }
    arena_.reset();
    arena_ = std::make_shared<Buffer>(plan.stats.arenaBytes, cpu());
    ++arenaGeneration_;
  }
  if (plan.boundArena == arenaGeneration_) return;
  for (const auto& [slot, offset] : plan.arenaSlots) {
    const TensorType& t = plan.slotTypes[static_cast<size_t>(slot)];
    plan.slots[static_cast<size_t>(slot)] = Tensor(arena_, offset, t.dtype, t.shape);
  }
  plan.boundArena = arenaGeneration_;
}

std::vector<Tensor> Session::run(const std::vector<Output>& fetches, const FeedMap& feeds,
                                 const std::vector<Node*>& targets) {
  Plan& plan = planFor(fetches, feeds, targets);
  bindArena(plan);
  for (const Plan::FeedSlot& f : plan.feeds) {
    for (const auto& [out, value] : feeds) {
      if (out == f.output) plan.slots[static_cast<size_t>(f.slot)] = value;
    }
  }
  for (const Plan::FetchSlot& f : plan.fetches) {
    if (f.allocatePerRun) {
      const TensorType& t = plan.slotTypes[static_cast<size_t>(f.slot)];
      plan.slots[static_cast<size_t>(f.slot)] = Tensor(t.dtype, t.shape);
    }
  }
  for (Plan::Step& s : plan.steps) {
    s.ctx.step = step_;
    try {
      s.kernel(s.ctx);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      WEFT_THROW("{}: {}", s.ctx.node->describe(), e.what());
    }
    if (options_.checkNumerics) {
      for (size_t i = 0; i < s.ctx.outputs.size(); ++i) checkFinite(*s.ctx.node, static_cast<int>(i), *s.ctx.outputs[i]);
    }
  }
  ++step_;
  std::vector<Tensor> out;
  out.reserve(plan.fetches.size());
  for (const Plan::FetchSlot& f : plan.fetches) {
    const Tensor& t = plan.slots[static_cast<size_t>(f.slot)];
    out.push_back(f.cloneAfterRun ? t.clone() : t);
  }
  // Drop references to fed tensors so the caller's memory is not kept alive by the plan.
  for (const Plan::FeedSlot& f : plan.feeds) plan.slots[static_cast<size_t>(f.slot)] = Tensor();
  return out;
}

PlanStats Session::planStats(const std::vector<Output>& fetches, const FeedMap& feeds,
                             const std::vector<Node*>& targets) {
  return planFor(fetches, feeds, targets).stats;
}

}  // namespace weft
