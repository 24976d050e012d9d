#include "core/Graph.h"

#include "core/OpRegistry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <set>

namespace weft {

Graph& Output::graph() const { return *node_->graph; }

const TensorType& Output::type() const {
  WEFT_CHECK(node_ != nullptr, "use of an empty Output");
  WEFT_CHECK(index_ >= 0 && index_ < static_cast<int>(node_->outputs.size()),
             "{} has no output {}", node_->describe(), index_);
  return node_->outputs[static_cast<size_t>(index_)];
}

std::string Output::name() const {
  return node_ ? fmt::format("{}:{}", node_->name, index_) : std::string("<none>");
}

bool Output::operator<(const Output& o) const {
  if (node_ != o.node_) return (node_ ? node_->id : -1) < (o.node_ ? o.node_->id : -1);
  return index_ < o.index_;
}

std::string Node::describe() const { return fmt::format("op '{}' (node '{}')", op, name); }

Initializer Initializer::copyOf(const Output& variable) {
  WEFT_CHECK(variable.valid() && variable.node()->op == "Variable",
             "Initializer::copyOf needs a variable, got {}", variable.name());
  return {Kind::CopyOf, 0, 0, {}, variable.node()->name};
}

namespace {
constexpr std::pair<Initializer::Kind, const char*> kInitializerNames[] = {
    {Initializer::Kind::Zeros, "zeros"},     {Initializer::Kind::Constant, "constant"},
    {Initializer::Kind::Uniform, "uniform"}, {Initializer::Kind::Normal, "normal"},
    {Initializer::Kind::TruncatedNormal, "truncated_normal"}, {Initializer::Kind::GlorotUniform, "glorot_uniform"},
    {Initializer::Kind::HeNormal, "he_normal"}, {Initializer::Kind::Value, "value"},
    {Initializer::Kind::CopyOf, "copy_of"}};
}  // namespace

const char* Initializer::kindName(Kind kind) {
  for (const auto& [k, name] : kInitializerNames) {
    if (k == kind) return name;
  }
  WEFT_THROW("invalid initializer kind {}", static_cast<int>(kind));
}

Initializer::Kind Initializer::parseKind(const std::string& name) {
  for (const auto& [k, n] : kInitializerNames) {
    if (name == n) return k;
  }
  WEFT_THROW("unknown initializer '{}'", name);
}

std::pair<double, double> fans(const Shape& s) {
  if (s.rank() == 0) return {1, 1};
  if (s.rank() == 1) return {static_cast<double>(s[0]), static_cast<double>(s[0])};
  if (s.rank() == 2) return {static_cast<double>(s[0]), static_cast<double>(s[1])};
  double receptive = 1;
  for (int i = 2; i < s.rank(); ++i) receptive *= static_cast<double>(s[i]);
  return {static_cast<double>(s[1]) * receptive, static_cast<double>(s[0]) * receptive};
}

Graph::Graph() = default;
Graph::~Graph() = default;

std::string Graph::uniqueName(const std::string& base) {
  const std::string prefix = currentScope().empty() ? base : currentScope() + "/" + base;
  if (!byName_.count(prefix)) return prefix;
  for (int i = 1;; ++i) {
    std::string candidate = fmt::format("{}_{}", prefix, i);
    if (!byName_.count(candidate)) return candidate;
  }
}

Node* Graph::addNode(const std::string& op, std::vector<Output> inputs, Attrs attrs,
                     const std::string& name) {
  const OpDef& def = OpRegistry::global().get(op);
  auto node = std::make_unique<Node>();
  node->id = static_cast<int>(nodes_.size());
  node->op = op;
  node->name = uniqueName(name.empty() ? op : name);
  node->inputs = std::move(inputs);
  node->attrs = std::move(attrs);
  node->device = devices_.empty() ? std::string() : devices_.back();
  node->stage = currentStage();
  if (!recomputeSegments_.empty()) {
    node->recompute = recomputeSegments_.back().mode;
    node->recomputeSegment = recomputeSegments_.back().id;
  }
  node->def = &def;
  node->graph = this;

  const int n = static_cast<int>(node->inputs.size());
  WEFT_CHECK(n >= def.minInputs && (def.maxInputs < 0 || n <= def.maxInputs),
             "{} takes {} inputs, got {}", node->describe(),
             def.maxInputs == def.minInputs ? std::to_string(def.minInputs)
             : def.maxInputs < 0            ? fmt::format("at least {}", def.minInputs)
                                            : fmt::format("{} to {}", def.minInputs, def.maxInputs),
             n);
  std::vector<TensorType> inputTypes;
  inputTypes.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Output& in = node->inputs[static_cast<size_t>(i)];
    WEFT_CHECK(in.valid(), "{}: input {} is empty", node->describe(), i);
    WEFT_CHECK(in.node()->graph == this, "{}: input {} ({}) belongs to another graph",
               node->describe(), i, in.name());
    inputTypes.push_back(in.type());
  }
  node->outputs = def.inferFn(InferContext{*node, inputTypes});

  Node* raw = node.get();
  byName_[raw->name] = raw;
  nodes_.push_back(std::move(node));
  return raw;
}

Output Graph::placeholder(const std::string& name, DType dtype, Shape shape) {
  return addNode("Placeholder", {}, {{"dtype", dtype}, {"shape", std::move(shape)}}, name)->output();
}

Output Graph::variable(const std::string& name, DType dtype, Shape shape, Initializer init,
                       bool trainable) {
  WEFT_CHECK(shape.isFullyDefined(), "variable '{}' needs a fully defined shape, got {}", name,
             shape.str());
  Attrs attrs{{"dtype", dtype},
              {"shape", shape},
              {"trainable", trainable},
              {"init", std::string(Initializer::kindName(init.kind))},
              {"init_a", init.a},
              {"init_b", init.b}};
  if (init.kind == Initializer::Kind::Value) {
    WEFT_CHECK(init.value.shape() == shape && init.value.dtype() == dtype,
               "variable '{}' of {}{} initialised from a tensor of {}{}", name, dtypeName(dtype),
               shape.str(), dtypeName(init.value.dtype()), init.value.shape().str());
    attrs.set("value", init.value);
  }
  if (init.kind == Initializer::Kind::CopyOf) {
    Node* src = find(init.source);
    WEFT_CHECK(src && src->outputs[0].shape == shape && src->outputs[0].dtype == dtype,
               "variable '{}' copies '{}', which is missing or of another type", name, init.source);
    attrs.set("source", init.source);
  }
  Node* node = addNode("Variable", {}, std::move(attrs), name);
  if (!partitioners_.empty()) requestedPartitions_[node] = partitioners_.back();
  return node->output();
}

Output Graph::constant(Tensor value, const std::string& name) {
  return addNode("Const", {}, {{"value", std::move(value)}}, name.empty() ? "Const" : name)->output();
}

Node* Graph::group(const std::vector<Node*>& deps, const std::string& name) {
  Node* n = addNode("NoOp", {}, {}, name);
  n->controlInputs = deps;
  return n;
}

Graph::Scope::Scope(Graph& g, const std::string& name) : graph_(g) {
  const std::string& outer = g.currentScope();
  g.scopes_.push_back(outer.empty() ? name : outer + "/" + name);
}
Graph::Scope::~Scope() { graph_.scopes_.pop_back(); }

Graph::DeviceScope::DeviceScope(Graph& g, const std::string& device) : graph_(g) {
  if (!device.empty()) Device::parse(device);  // validates; "" restores the default device
  g.devices_.push_back(device);
}
Graph::DeviceScope::~DeviceScope() { graph_.devices_.pop_back(); }

Graph::StageScope::StageScope(Graph& g, int stage) : graph_(g) {
  WEFT_CHECK(stage >= -1, "pipeline stage {} is negative (stages count from 0; -1 leaves the choice to the cut)",
             stage);
  g.stages_.push_back(stage);
}
Graph::StageScope::~StageScope() { graph_.stages_.pop_back(); }

void Graph::tieAcrossStages(Output variable) {
  WEFT_CHECK(variable.valid() && variable.node()->op == "Variable", "tieAcrossStages takes a variable, got {}",
             variable.valid() ? variable.node()->describe() : std::string("an empty output"));
  variable.node()->attrs.set("tied", true);
}

Graph::RecomputeScope::RecomputeScope(Graph& g, Recompute mode) : graph_(g) {
  g.recomputeSegments_.push_back({mode, g.nextRecomputeSegment_++});
}
Graph::RecomputeScope::~RecomputeScope() { graph_.recomputeSegments_.pop_back(); }

Recompute parseRecompute(const std::string& text) {
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    if (text == recomputeName(mode)) return mode;
  }
  throw Error(fmt::format("recompute '{}': expected none, selective or full", text));
}

const char* recomputeName(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "none";
}

Graph::PartitionerScope::PartitionerScope(Graph& g, int partitions) : graph_(g) {
  WEFT_CHECK(partitions >= 0,
             "partitioner({}): a variable is split into at least one partition ({} leaves the count to "
             "the job)",
             partitions, kJobPartitions);
  g.partitioners_.push_back(partitions);
}
Graph::PartitionerScope::~PartitionerScope() { graph_.partitioners_.pop_back(); }

std::optional<int> Graph::requestedPartitions(const Node* variable) const {
  auto it = requestedPartitions_.find(variable);
  if (it == requestedPartitions_.end()) return std::nullopt;
  return it->second;
}

Graph::PrecisionScope::PrecisionScope(Graph& g, DType low, MixedOps ops) : graph_(g) {
  WEFT_CHECK(low == DType::F32 || low == DType::BF16 || low == DType::F16,
             "mixed precision computes in bf16 or f16 (or f32 for none), not {}", dtypeName(low));
  g.precisions_.push_back({low, ops});
}
Graph::PrecisionScope::~PrecisionScope() { graph_.precisions_.pop_back(); }

void Graph::runOnlyIf(Node* node, Output condition) {
  WEFT_CHECK(node->outputs.empty(),
             "{} has outputs, so it cannot be skipped: only ops without outputs run conditionally", node->describe());
  WEFT_CHECK(condition.shape().rank() == 0, "the condition of {} must be a scalar, got {}", node->describe(),
             condition.type().str());
  WEFT_CHECK(&condition.graph() == this && condition.node() != node,
             "the condition of {} must be another node of the same graph", node->describe());
  node->condition = condition;
}

namespace {

/// Whether a value of type `now` may stand where one of type `before` was read.
bool fits(const TensorType& now, const TensorType& before) {
  return now.dtype == before.dtype && now.shape.compatibleWith(before.shape);
}

void checkReplacement(const Output& from, const Output& to, const char* what) {
  WEFT_CHECK(from.valid() && to.valid(), "{}: an empty output", what);
  WEFT_CHECK(&from.graph() == &to.graph(), "{}: {} and {} belong to different graphs", what, from.name(), to.name());
  WEFT_CHECK(to.dtype() == from.dtype(), "{}: {} is {}, the value it replaces ({}) is {}", what, to.name(),
             to.type().str(), from.name(), from.type().str());
}

}  // namespace

int Graph::replaceUses(Output from, Output to) {
  std::vector<Node*> all;
  for (const auto& n : nodes_) all.push_back(n.get());
  return replaceUses(from, to, all);
}

int Graph::replaceUses(Output from, Output to, const std::vector<Node*>& consumers) {
  return replaceUses({{from, to}}, consumers);
}

int Graph::replaceUses(const std::vector<std::pair<Output, Output>>& replacements,
                       const std::vector<Node*>& consumers) {
  bool reshaped = false;
  std::vector<std::pair<Output*, Output>> changes;  // (input, old value), to undo on failure
  std::vector<Node*> changed;                       // the nodes that own them
  for (const auto& [from, to] : replacements) {
    checkReplacement(from, to, "replaceUses");
    reshaped = reshaped || to.shape() != from.shape();
    for (Node* n : consumers) {
      for (Output& in : n->inputs) {
        if (in != from) continue;
        WEFT_CHECK(to.node() != n, "replaceUses: {} would read its own output {}", n->describe(), to.name());
        changes.emplace_back(&in, in);
        if (changed.empty() || changed.back() != n) changed.push_back(n);
      }
    }
  }
  for (auto& [input, old] : changes) {
    for (const auto& [from, to] : replacements)
      if (old == from) *input = to;
  }
  try {
    if (reshaped) {
      reinferDownstream(changed);  // walks the topological order, so it finds a cycle too
    } else if (!changes.empty()) {
      topologicalOrder();  // throws when the new edges close a cycle
    }
  } catch (...) {
    for (auto& [input, old] : changes) *input = old;
    throw;
  }
  return static_cast<int>(changes.size());
}

void Graph::setInput(Node* node, int i, Output value) {
  WEFT_CHECK(node && node->graph == this && i >= 0 && i < static_cast<int>(node->inputs.size()),
             "setInput: {} has no input {}", node ? node->describe() : std::string("a null node"), i);
  Output& input = node->inputs[static_cast<size_t>(i)];
  checkReplacement(input, value, "setInput");
  WEFT_CHECK(value.node() != node, "setInput: {} would read its own output", node->describe());
  const Output old = input;
  input = value;
  try {
    if (value.shape() != old.shape()) {
      reinferDownstream({node});
    } else {
      topologicalOrder();  // throws when the new edge closes a cycle
    }
  } catch (...) {
    input = old;
    throw;
  }
}

void Graph::reinferDownstream(const std::vector<Node*>& changed) {
  std::map<const Node*, std::vector<Node*>> consumers;
  for (const auto& n : nodes_)
    for (const Output& in : n->inputs) consumers[in.node()].push_back(n.get());
  std::set<const Node*> dirty(changed.begin(), changed.end());
  std::vector<std::pair<Node*, std::vector<TensorType>>> previous;  // to undo on failure
  try {
    for (Node* n : topologicalOrder()) {
      if (!dirty.count(n) || n->def->sourceKind != SourceKind::None) continue;
      std::vector<TensorType> inputTypes;
      for (const Output& in : n->inputs) inputTypes.push_back(in.type());
      std::vector<TensorType> outputs = n->def->inferFn(InferContext{*n, inputTypes});
      bool same = outputs.size() == n->outputs.size();
      for (size_t i = 0; same && i < outputs.size(); ++i)
        same = outputs[i].dtype == n->outputs[i].dtype && outputs[i].shape == n->outputs[i].shape;
      if (same) continue;
      for (size_t i = 0; i < std::min(outputs.size(), n->outputs.size()); ++i)
        WEFT_CHECK(outputs[i].dtype == n->outputs[i].dtype, "{}: output {} would become {}, its consumers read {}",
                   n->describe(), i, outputs[i].str(), n->outputs[i].str());
      previous.emplace_back(n, n->outputs);
      n->outputs = std::move(outputs);
      for (Node* c : consumers[n]) dirty.insert(c);
    }
  } catch (...) {
    for (auto& [n, outputs] : previous) n->outputs = std::move(outputs);
    throw;
  }
}

void Graph::retarget(Node* node, const std::string& op, Attrs attrs, const std::string& device) {
  WEFT_CHECK(node && node->graph == this, "retarget: the node belongs to another graph");
  const OpDef& def = OpRegistry::global().get(op);
  Node changed = *node;
  changed.op = op;
  changed.def = &def;
  changed.attrs = std::move(attrs);
  const int n = static_cast<int>(changed.inputs.size());
  WEFT_CHECK(n >= def.minInputs && (def.maxInputs < 0 || n <= def.maxInputs), "retarget {} to '{}': it takes {} inputs",
             node->describe(), op, n);
  std::vector<TensorType> inputTypes;
  for (const Output& in : changed.inputs) inputTypes.push_back(in.type());
  const std::vector<TensorType> outputs = def.inferFn(InferContext{changed, inputTypes});
  WEFT_CHECK(outputs.size() >= node->outputs.size(), "retarget {} to '{}': it has {} outputs, the node's consumers "
             "may read {}", node->describe(), op, outputs.size(), node->outputs.size());
  for (size_t i = 0; i < node->outputs.size(); ++i) {
    WEFT_CHECK(fits(outputs[i], node->outputs[i]), "retarget {} to '{}': output {} would be {}, its consumers read {}",
               node->describe(), op, i, outputs[i].str(), node->outputs[i].str());
  }
  node->op = op;
  node->def = &def;
  node->attrs = std::move(changed.attrs);
  node->outputs = outputs;
  node->device = device;
}

void Graph::rebuild(Node* node, const std::string& op, std::vector<Output> inputs, Attrs attrs) {
  WEFT_CHECK(node && node->graph == this, "rebuild: the node belongs to another graph");
  for (const Output& in : inputs) {
    WEFT_CHECK(in.valid() && &in.graph() == this && in.node() != node,
               "rebuild {}: every input must be another node's output in this graph", node->describe());
  }
  Node before = *node;
  node->inputs = std::move(inputs);
  try {
    retarget(node, op, std::move(attrs), node->device);
    topologicalOrder();  // throws when the new inputs close a cycle
  } catch (...) {
    node->inputs = std::move(before.inputs);
    node->op = before.op;
    node->def = before.def;
    node->attrs = std::move(before.attrs);
    node->outputs = std::move(before.outputs);
    throw;
  }
}

void Graph::retype(Node* node, const std::vector<std::pair<int, Output>>& inputs,
                   const std::function<Output(Output)>& convert) {
  WEFT_CHECK(node && node->graph == this, "retype: the node belongs to another graph");
  Node changed = *node;
  for (const auto& [i, value] : inputs) {
    WEFT_CHECK(i >= 0 && i < static_cast<int>(node->inputs.size()), "retype: {} has no input {}", node->describe(), i);
    WEFT_CHECK(value.valid() && &value.graph() == this && value.node() != node,
               "retype: input {} of {} must be another node's output in this graph", i, node->describe());
    changed.inputs[static_cast<size_t>(i)] = value;
  }
  std::vector<TensorType> inputTypes;
  for (const Output& in : changed.inputs) inputTypes.push_back(in.type());
  const std::vector<TensorType> outputs = node->def->inferFn(InferContext{changed, inputTypes});
  WEFT_CHECK(outputs.size() == node->outputs.size(), "retype {}: {} outputs would become {}", node->describe(),
             node->outputs.size(), outputs.size());
  std::vector<int> retyped;
  for (size_t i = 0; i < outputs.size(); ++i) {
    WEFT_CHECK(outputs[i].shape.compatibleWith(node->outputs[i].shape), "retype {}: output {} would be {}, not {}",
               node->describe(), i, outputs[i].str(), node->outputs[i].str());
    if (outputs[i].dtype != node->outputs[i].dtype) retyped.push_back(static_cast<int>(i));
  }
  // The readers of each retyped output, found before any new node reads it.
  std::vector<std::pair<Output*, int>> readers;  // (input, output index)
  for (const auto& n : nodes_) {
    for (Output& in : n->inputs) {
      if (in.node() == node && std::count(retyped.begin(), retyped.end(), in.index()))
        readers.emplace_back(&in, in.index());
    }
    WEFT_CHECK(n->condition.node() != node || !std::count(retyped.begin(), retyped.end(), n->condition.index()),
               "retype {}: output {} is the condition of {}", node->describe(), n->condition.index(), n->describe());
  }
  const std::vector<TensorType> before = node->outputs;
  node->inputs = std::move(changed.inputs);
  node->outputs = outputs;
  for (int i : retyped) {
    const Output converted = convert(node->output(i));
    WEFT_CHECK(converted.valid() && converted.dtype() == before[static_cast<size_t>(i)].dtype,
               "retype {}: output {} must be converted back to {}", node->describe(), i,
               dtypeName(before[static_cast<size_t>(i)].dtype));
    for (auto& [input, index] : readers)
      if (index == i) *input = converted;
  }
}

void Graph::addControlInput(Node* node, Node* before) {
  WEFT_CHECK(node && before && node->graph == this && before->graph == this && node != before,
             "addControlInput: both nodes must be distinct nodes of this graph");
  node->controlInputs.push_back(before);
}

void Graph::removeControlInput(Node* node, Node* before) {
  auto& inputs = node->controlInputs;
  const auto it = std::find(inputs.begin(), inputs.end(), before);
  WEFT_CHECK(it != inputs.end(), "removeControlInput: {} does not wait for {}", node->describe(), before->describe());
  inputs.erase(it);
}

void Graph::replaceControlInputs(Node* from, Node* to) {
  WEFT_CHECK(from && to && from->graph == this && to->graph == this, "replaceControlInputs: nodes of another graph");
  const bool selfWait = std::find(to->controlInputs.begin(), to->controlInputs.end(), from) != to->controlInputs.end();
  WEFT_CHECK(!selfWait, "replaceControlInputs: {} would wait for itself", to->describe());
  for (const auto& n : nodes_) {
    std::vector<Node*>& waits = n->controlInputs;
    if (std::find(waits.begin(), waits.end(), to) != waits.end())
      waits.erase(std::remove(waits.begin(), waits.end(), from), waits.end());  // waits for `to` once
    else
      std::replace(waits.begin(), waits.end(), from, to);
  }
}

std::vector<Node*> Graph::topologicalOrder() const {
  const size_t count = nodes_.size();
  std::vector<std::vector<int>> successors(count);
  std::vector<int> waitingFor(count, 0);
  auto edge = [&](const Node* from, const Node* to) {
    successors[static_cast<size_t>(from->id)].push_back(to->id);
    ++waitingFor[static_cast<size_t>(to->id)];
  };
  for (const auto& n : nodes_) {
    for (const Output& in : n->inputs) edge(in.node(), n.get());
    for (const Node* c : n->controlInputs) edge(c, n.get());
    if (n->condition.valid()) edge(n->condition.node(), n.get());
  }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;  // earliest created first
  for (size_t i = 0; i < count; ++i)
    if (waitingFor[i] == 0) ready.push(static_cast<int>(i));
  std::vector<Node*> order;
  order.reserve(count);
  while (!ready.empty()) {
    const int id = ready.top();
    ready.pop();
    order.push_back(nodes_[static_cast<size_t>(id)].get());
    for (int next : successors[static_cast<size_t>(id)])
      if (--waitingFor[static_cast<size_t>(next)] == 0) ready.push(next);
  }
  if (order.size() != count) {
    const auto stuck = std::find_if(waitingFor.begin(), waitingFor.end(), [](int w) { return w > 0; });
    WEFT_THROW("the graph has a cycle through {}", nodes_[static_cast<size_t>(stuck - waitingFor.begin())]->describe());
  }
  return order;
}

void Graph::verify() const {
  for (const auto& n : nodes_) {
    WEFT_CHECK(n->def != nullptr && n->graph == this, "verify: {} has no op record or belongs to another graph",
               n->describe());
    std::vector<TensorType> inputTypes;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const Output& in = n->inputs[i];
      WEFT_CHECK(in.valid() && in.node()->graph == this && in.index() >= 0 &&
                     in.index() < static_cast<int>(in.node()->outputs.size()),
                 "verify: input {} of {} is not an output of this graph", i, n->describe());
      inputTypes.push_back(in.type());
    }
    for (const Node* c : n->controlInputs)
      WEFT_CHECK(c != nullptr && c->graph == this, "verify: a control input of {} is not a node of this graph",
                 n->describe());
    WEFT_CHECK(!n->condition.valid() || n->condition.node()->graph == this,
               "verify: the condition of {} is not an output of this graph", n->describe());
    const std::vector<TensorType> inferred = n->def->inferFn(InferContext{*n, inputTypes});
    bool same = inferred.size() == n->outputs.size();
    for (size_t i = 0; same && i < inferred.size(); ++i) same = fits(inferred[i], n->outputs[i]);
    WEFT_CHECK(same, "verify: {} records outputs that its op no longer infers from its inputs", n->describe());
  }
  topologicalOrder();
}

Node* Graph::find(const std::string& name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : it->second;
}

void Graph::shardVariable(Node* variable, int64_t offset, int64_t count) {
  WEFT_CHECK(variable && variable->graph == this && variable->op == "Variable",
             "shardVariable: {} is not a variable of this graph", variable ? variable->describe() : "null");
  WEFT_CHECK(!isShard(*variable), "shardVariable: '{}' is a shard already", variable->name);
  const Shape whole = variable->attrs.get<Shape>("shape");
  WEFT_CHECK(offset >= 0 && count >= 0 && offset + count <= whole.numel(),
             "shardVariable: elements [{}, {}) are not within '{}' of shape {}", offset, offset + count,
             variable->name, whole.str());
  variable->attrs.set("whole_shape", whole);
  variable->attrs.set("shard_offset", offset);
  variable->attrs.set("shape", Shape{count});
  variable->outputs[0].shape = Shape{count};
}

Shape Graph::wholeShapeOf(const Node& variable) {
  return isShard(variable) ? variable.attrs.get<Shape>("whole_shape") : variable.attrs.get<Shape>("shape");
}

std::vector<Node*> Graph::variables() const {
  std::vector<Node*> out;
  for (const auto& n : nodes_) {
    if (n->op == "Variable") out.push_back(n.get());
  }
  return out;
}

std::vector<Node*> Graph::trainableVariables() const {
  std::vector<Node*> out;
  for (Node* v : variables()) {
    if (v->attrs.get<bool>("trainable")) out.push_back(v);
  }
  return out;
}

const std::vector<Node*>& Graph::collection(const std::string& key) const {
  static const std::vector<Node*> none;
  auto it = collections_.find(key);
  return it == collections_.end() ? none : it->second;
}

std::string Graph::dump() const {
  std::string s;
  for (const auto& n : nodes_) {
    std::vector<std::string> ins, outs;
    for (const Output& in : n->inputs) ins.push_back(in.name());
    for (Node* c : n->controlInputs) ins.push_back("^" + c->name);
    for (const TensorType& t : n->outputs) outs.push_back(t.str());
    s += fmt::format("{} = {}({}) -> ({})", n->name, n->op, fmt::join(ins, ", "), fmt::join(outs, ", "));
    if (!n->device.empty()) s += " @" + n->device;
    if (n->stage >= 0) s += fmt::format(" stage {}", n->stage);
    if (n->condition.valid()) s += " if " + n->condition.name();
    if (!n->attrs.values().empty() && n->op != "Const") s += " {" + n->attrs.str() + "}";
    s += "\n";
  }
  for (const GradientLink& l : gradientLinks_) {
    if (l.sparse) {
      s += fmt::format("grad {} = sparse(indices={}, values={}, shape={})\n", l.variable->name,
                       l.indices.name(), l.values.name(), l.denseShape.str());
    } else {
      s += fmt::format("grad {} = dense({})\n", l.variable->name, l.dense.name());
    }
  }
  return s;
}

std::string Graph::toDot() const {
  auto quote = [](const std::string& x) { return "\"" + x + "\""; };
  std::string s = "digraph weft {\n  node [shape=box, fontname=\"monospace\"];\n";
  for (const auto& n : nodes_) {
    std::vector<std::string> outs;
    for (const TensorType& t : n->outputs) outs.push_back(t.str());
    s += fmt::format("  {} [label=\"{}\\n{}\\n{}\"{}];\n", quote(n->name), n->name, n->op,
                     fmt::join(outs, " "), n->op == "Variable" ? ", style=filled, fillcolor=lightblue" : "");
    for (const Output& in : n->inputs) {
      s += fmt::format("  {} -> {} [label=\"{}\"];\n", quote(in.node()->name), quote(n->name),
                       in.shape().str());
    }
    for (Node* c : n->controlInputs) {
      s += fmt::format("  {} -> {} [style=dashed];\n", quote(c->name), quote(n->name));
    }
  }
  for (const GradientLink& l : gradientLinks_) {
    const Output& g = l.sparse ? l.values : l.dense;
    s += fmt::format("  {} -> {} [style=dotted, color=red, label=\"{}\"];\n", quote(g.node()->name),
                     quote(l.variable->name), l.sparse ? "sparse grad" : "grad");
  }
  return s + "}\n";
}

}  // namespace weft
