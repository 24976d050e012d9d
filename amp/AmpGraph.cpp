#include "amp/AmpGraph.h"

#include "core/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace weft::amp {

std::string State::str() const {
  return fmt::format("instance {} step {} iteration {} item {} slot {}", instance, step, iteration, item, slot);
}

size_t StateHash::operator()(const State& s) const {
  uint64_t h = static_cast<uint64_t>(s.instance) * 0x9E3779B97F4A7C15ull;
  for (int32_t field : {s.step, s.iteration, s.item, s.slot})
    h = (h ^ static_cast<uint32_t>(field)) * 0x100000001B3ull + (h >> 29);
  return static_cast<size_t>(h);
}

const char* kindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::Input: return "input";
    case NodeKind::Transform: return "transform";
    case NodeKind::Loss: return "loss";
    case NodeKind::Cond: return "cond";
    case NodeKind::Phi: return "phi";
    case NodeKind::StateUpdate: return "state-update";
    case NodeKind::Concat: return "concat";
    case NodeKind::Split: return "split";
    case NodeKind::Broadcast: return "broadcast";
    case NodeKind::Group: return "group";
    case NodeKind::Ungroup: return "ungroup";
    case NodeKind::Flatmap: return "flatmap";
  }
  return "?";
}

Node& Graph::add(const std::string& name, NodeKind kind, std::vector<Port> inputs, int outputs) {
  for (const Node& n : nodes_)
    WEFT_CHECK(n.name != name, "amp graph: two nodes are named '{}'", name);
  for (const Port& p : inputs)
    WEFT_CHECK(p.valid() && p.node < static_cast<int>(nodes_.size()) && p.output < node(p.node).outputs,
               "amp graph: node '{}' reads an output that does not exist (node {}, output {})", name, p.node,
               p.output);
  Node& n = nodes_.emplace_back();
  n.id = static_cast<int>(nodes_.size()) - 1;
  n.name = name;
  n.kind = kind;
  n.inputs = std::move(inputs);
  n.outputs = outputs;
  return n;
}

Port Graph::input(const std::string& name, TensorType type) {
  Node& n = add(name, NodeKind::Input, {}, 1);
  n.outputTypes = {std::move(type)};
  return {n.id, 0};
}

Port Graph::transform(const std::string& name, const std::vector<Port>& inputs, TransformSpec spec) {
  WEFT_CHECK(!inputs.empty(), "amp graph: transform '{}' has no inputs", name);
  WEFT_CHECK(spec.build != nullptr, "amp graph: transform '{}' has no builder", name);
  Node& n = add(name, NodeKind::Transform, inputs, 1);
  n.worker = spec.worker;
  n.transform = std::move(spec);
  return {n.id, 0};
}

void Graph::loss(const std::string& name, Port x, LossSpec spec) {
  WEFT_CHECK(spec.build != nullptr, "amp graph: loss '{}' has no builder", name);
  Node& n = add(name, NodeKind::Loss, {x}, 0);
  n.worker = spec.worker;
  n.loss = std::move(spec);
}

std::vector<Port> Graph::cond(const std::string& name, Port x, int branches,
                              std::function<int(const State&, const Instance&)> route) {
  WEFT_CHECK(branches >= 1, "amp graph: cond '{}' needs at least one branch, not {}", name, branches);
  Node& n = add(name, NodeKind::Cond, {x}, branches);
  n.route = std::move(route);
  std::vector<Port> ports;
  for (int b = 0; b < branches; ++b) ports.push_back({n.id, b});
  return ports;
}

Port Graph::phi(const std::string& name, const std::vector<Port>& inputs) {
  Node& n = add(name, NodeKind::Phi, inputs, 1);
  return {n.id, 0};
}

void Graph::addPhiInput(Port phi, Port input) {
  WEFT_CHECK(phi.valid() && phi.node < static_cast<int>(nodes_.size()) && node(phi.node).kind == NodeKind::Phi,
             "amp graph: addPhiInput on node {}, which is not a phi", phi.node);
  WEFT_CHECK(input.valid() && input.node < static_cast<int>(nodes_.size()) && input.output < node(input.node).outputs,
             "amp graph: phi '{}' gets an input that does not exist", node(phi.node).name);
  node(phi.node).inputs.push_back(input);
}

Port Graph::stateUpdate(const std::string& name, Port x, StateMap forward, StateMap inverse) {
  Node& n = add(name, NodeKind::StateUpdate, {x}, 1);
  n.forward = std::move(forward);
  n.inverse = std::move(inverse);
  return {n.id, 0};
}

Port Graph::concat(const std::string& name, const std::vector<Port>& inputs) {
  WEFT_CHECK(inputs.size() >= 2, "amp graph: concat '{}' needs two or more inputs", name);
  Node& n = add(name, NodeKind::Concat, inputs, 1);
  return {n.id, 0};
}

std::vector<Port> Graph::split(const std::string& name, Port x, std::vector<int64_t> sizes) {
  WEFT_CHECK(sizes.size() >= 2, "amp graph: split '{}' needs two or more parts", name);
  for (int64_t s : sizes) WEFT_CHECK(s > 0, "amp graph: split '{}' has a part of width {}", name, s);
  Node& n = add(name, NodeKind::Split, {x}, static_cast<int>(sizes.size()));
  n.sizes = std::move(sizes);
  std::vector<Port> ports;
  for (int i = 0; i < n.outputs; ++i) ports.push_back({n.id, i});
  return ports;
}

std::vector<Port> Graph::broadcast(const std::string& name, Port x, int copies) {
  WEFT_CHECK(copies >= 2, "amp graph: broadcast '{}' needs two or more copies, not {}", name, copies);
  Node& n = add(name, NodeKind::Broadcast, {x}, copies);
  std::vector<Port> ports;
  for (int i = 0; i < copies; ++i) ports.push_back({n.id, i});
  return ports;
}

Port Graph::group(const std::string& name, Port x, GroupSpec spec) {
  WEFT_CHECK(spec.key && spec.count && spec.order, "amp graph: group '{}' needs a key, a count and an order", name);
  Node& n = add(name, NodeKind::Group, {x}, 1);
  n.group = std::move(spec);
  return {n.id, 0};
}

Port Graph::ungroup(const std::string& name, Port x,
                    std::function<std::vector<State>(const State&, const Instance&)> states) {
  Node& n = add(name, NodeKind::Ungroup, {x}, 1);
  n.expand = std::move(states);
  return {n.id, 0};
}

Port Graph::flatmap(const std::string& name, Port x,
                    std::function<std::vector<State>(const State&, const Instance&)> states) {
  Node& n = add(name, NodeKind::Flatmap, {x}, 1);
  n.expand = std::move(states);
  return {n.id, 0};
}

Port Graph::replicated(const std::string& name, Port x, int copies, const TransformSpec& spec) {
  WEFT_CHECK(copies >= 1, "amp graph: '{}' needs at least one replica, not {}", name, copies);
  if (copies == 1) return transform(name, {x}, spec);
  auto routes = cond(name + "/route", x, copies,
                     [copies](const State& s, const Instance&) { return static_cast<int>(s.instance % copies); });
  int groupId = static_cast<int>(nodes_.size());
  std::vector<Port> outs;
  for (int r = 0; r < copies; ++r) {
    TransformSpec replica = spec;
    replica.worker = spec.worker < 0 ? -1 : spec.worker + r;
    Port out = transform(fmt::format("{}/replica{}", name, r), {routes[static_cast<size_t>(r)]}, replica);
    node(out.node).replicaGroup = groupId;
    outs.push_back(out);
  }
  return phi(name, outs);
}

std::pair<int, int> Graph::consumer(Port port) const {
  return consumers_.at(static_cast<size_t>(port.node)).at(static_cast<size_t>(port.output));
}

TensorType transformType(const TransformSpec& spec, const std::vector<TensorType>& inputs, const std::string& node) {
  weft::Graph scratch;
  Inputs in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in.payloads.push_back(scratch.placeholder(fmt::format("payload{}", i), inputs[i].dtype, inputs[i].shape));
  for (const StateInput& s : spec.stateInputs)
    in.fromState.push_back(scratch.placeholder(s.name, s.type.dtype, s.type.shape));
  try {
    return spec.build(scratch, in).type();
  } catch (const Error& e) {
    std::string types;
    for (const TensorType& t : inputs) types += (types.empty() ? "" : ", ") + t.str();
    WEFT_THROW("amp graph: transform '{}' cannot be built for payloads ({}): {}", node, types, e.what());
  }
}

void Graph::inferTypes() {
  auto known = [&](const Port& p) { return !node(p.node).outputTypes.empty(); };
  auto typeOf = [&](const Port& p) { return node(p.node).outputTypes.at(static_cast<size_t>(p.output)); };
  for (bool changed = true; changed;) {
    changed = false;
    for (Node& n : nodes_) {
      if (!n.outputTypes.empty() || n.kind == NodeKind::Input || n.kind == NodeKind::Loss) continue;
      std::vector<TensorType> in;
      bool ready = true;
      for (const Port& p : n.inputs) {
        if (known(p)) in.push_back(typeOf(p));
        else if (n.kind != NodeKind::Phi) ready = false;
      }
      if (!ready || in.empty()) continue;
      TensorType x = in[0];
      switch (n.kind) {
        case NodeKind::Transform: n.outputTypes = {transformType(n.transform, in, n.name)}; break;
        case NodeKind::Cond:
        case NodeKind::Broadcast: n.outputTypes.assign(static_cast<size_t>(n.outputs), x); break;
        case NodeKind::Phi:
        case NodeKind::StateUpdate:
        case NodeKind::Flatmap: n.outputTypes = {x}; break;
        case NodeKind::Concat: {
          int64_t width = 0;
          for (const TensorType& t : in) {
            WEFT_CHECK(t.shape.rank() >= 1 && t.shape.rank() == x.shape.rank() && t.dtype == x.dtype,
                       "amp graph: concat '{}' joins payloads {} and {}", n.name, x.str(), t.str());
            int64_t w = t.shape.dims().back();
            width = (w < 0 || width < 0) ? -1 : width + w;
            n.sizes.push_back(w);
          }
          TensorType out = x;
          out.shape.dims().back() = width;
          n.outputTypes = {out};
          break;
        }
        case NodeKind::Split: {
          WEFT_CHECK(x.shape.rank() >= 1, "amp graph: split '{}' gets a scalar payload", n.name);
          int64_t total = 0;
          for (int64_t s : n.sizes) total += s;
          int64_t w = x.shape.dims().back();
          WEFT_CHECK(w < 0 || w == total, "amp graph: split '{}' cuts payloads {} into widths summing to {}", n.name,
                     x.str(), total);
          for (int64_t s : n.sizes) {
            TensorType part = x;
            part.shape.dims().back() = s;
            n.outputTypes.push_back(part);
          }
          break;
        }
        case NodeKind::Group: {
          TensorType out = x;
          out.shape.dims().insert(out.shape.dims().begin(), -1);
          n.outputTypes = {out};
          break;
        }
        case NodeKind::Ungroup: {
          WEFT_CHECK(x.shape.rank() >= 1, "amp graph: ungroup '{}' gets a scalar payload", n.name);
          TensorType out = x;
          out.shape.dims().erase(out.shape.dims().begin());
          n.outputTypes = {out};
          break;
        }
        case NodeKind::Input:
        case NodeKind::Loss: break;
      }
      changed = true;
    }
  }
}

void Graph::checkReachability() const {
  std::vector<char> fromInput(nodes_.size(), 0), toLoss(nodes_.size(), 0);
  std::vector<int> stack;
  for (const Node& n : nodes_)
    if (n.kind == NodeKind::Input) stack.push_back(n.id), fromInput[static_cast<size_t>(n.id)] = 1;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    for (const auto& reader : consumers_[static_cast<size_t>(id)])
      if (reader.first >= 0 && !fromInput[static_cast<size_t>(reader.first)])
        fromInput[static_cast<size_t>(reader.first)] = 1, stack.push_back(reader.first);
  }
  for (const Node& n : nodes_)
    if (n.kind == NodeKind::Loss) stack.push_back(n.id), toLoss[static_cast<size_t>(n.id)] = 1;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    for (const Port& p : node(id).inputs)
      if (!toLoss[static_cast<size_t>(p.node)]) toLoss[static_cast<size_t>(p.node)] = 1, stack.push_back(p.node);
  }
  for (const Node& n : nodes_)
    WEFT_CHECK(n.kind != NodeKind::Loss || fromInput[static_cast<size_t>(n.id)],
               "amp graph: loss '{}' is unreachable from the controller's inputs", n.name);
  for (const Node& n : nodes_) {
    WEFT_CHECK(fromInput[static_cast<size_t>(n.id)], "amp graph: node '{}' is unreachable from the controller's inputs",
               n.name);
    WEFT_CHECK(toLoss[static_cast<size_t>(n.id)],
               "amp graph: node '{}' reaches no loss, so its messages would never be answered backward", n.name);
  }
}

void Graph::checkCycles() const {
  // Without its state updates the graph must be acyclic: a loop that keeps the state would give a
  // message the same key on every turn.
  std::vector<int> color(nodes_.size(), 0);
  std::vector<std::pair<int, size_t>> stack;
  for (const Node& start : nodes_) {
    if (color[static_cast<size_t>(start.id)] != 0 || start.kind == NodeKind::StateUpdate) continue;
    stack.push_back({start.id, 0});
    color[static_cast<size_t>(start.id)] = 1;
    while (!stack.empty()) {
      auto& [id, next] = stack.back();
      std::vector<int> succ;
      for (const auto& out : consumers_[static_cast<size_t>(id)])
        if (out.first >= 0 && node(out.first).kind != NodeKind::StateUpdate) succ.push_back(out.first);
      if (next >= succ.size()) {
        color[static_cast<size_t>(id)] = 2;
        stack.pop_back();
        continue;
      }
      int s = succ[next++];
      WEFT_CHECK(color[static_cast<size_t>(s)] != 1,
                 "amp graph: the cycle through '{}' and '{}' has no state update, so its messages would repeat their "
                 "state on every turn",
                 node(id).name, node(s).name);
      if (color[static_cast<size_t>(s)] == 0) color[static_cast<size_t>(s)] = 1, stack.push_back({s, 0});
    }
  }
}

void Graph::checkPhis() const {
  // A phi tells its inputs apart by the state. Copies of one message (from a broadcast or split)
  // reaching two of its inputs with the state unchanged would arrive with one state twice.
  auto copiesReaching = [&](int from) {
    std::set<std::pair<int, int>> seen;  // (copying node, its output) whose copy arrives at `from`
    std::vector<int> stack{from};
    std::set<int> visited{from};
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      const Node& n = node(id);
      bool keepsState = n.kind != NodeKind::StateUpdate && n.kind != NodeKind::Group && n.kind != NodeKind::Ungroup &&
                        n.kind != NodeKind::Flatmap && n.kind != NodeKind::Input;
      if (!keepsState) continue;
      for (const Port& p : n.inputs) {
        const Node& producer = node(p.node);
        if (producer.kind == NodeKind::Broadcast || producer.kind == NodeKind::Split) seen.insert({p.node, p.output});
        if (visited.insert(p.node).second) stack.push_back(p.node);
      }
    }
    return seen;
  };
  for (const Node& n : nodes_) {
    if (n.kind != NodeKind::Phi) continue;
    WEFT_CHECK(n.inputs.size() >= 2, "amp graph: phi '{}' has {} input(s); it joins two or more", n.name,
               n.inputs.size());
    std::vector<std::set<std::pair<int, int>>> reach;
    for (const Port& p : n.inputs) {
      auto copies = copiesReaching(p.node);
      const Node& producer = node(p.node);
      if (producer.kind == NodeKind::Broadcast || producer.kind == NodeKind::Split) copies.insert({p.node, p.output});
      reach.push_back(std::move(copies));
    }
    for (size_t a = 0; a < reach.size(); ++a)
      for (size_t b = a + 1; b < reach.size(); ++b)
        for (const auto& [copier, out] : reach[a])
          for (const auto& [other, otherOut] : reach[b])
            WEFT_CHECK(copier != other || out == otherOut,
                       "amp graph: phi '{}' cannot tell its inputs {} and {} apart: both receive copies of one message "
                       "from '{}' with the same state",
                       n.name, a, b, node(copier).name);
  }
}

void Graph::verify() {
  WEFT_CHECK(!nodes_.empty(), "amp graph: the graph is empty");
  consumers_.assign(nodes_.size(), {});
  for (const Node& n : nodes_) consumers_[static_cast<size_t>(n.id)].assign(static_cast<size_t>(n.outputs), {-1, -1});
  for (const Node& n : nodes_)
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Port& p = n.inputs[i];
      auto& slot = consumers_[static_cast<size_t>(p.node)][static_cast<size_t>(p.output)];
      WEFT_CHECK(slot.first < 0,
                 "amp graph: output {} of '{}' is read by both '{}' and '{}'; send it through a broadcast", p.output,
                 node(p.node).name, node(slot.first).name, n.name);
      slot = {n.id, static_cast<int>(i)};
    }
  for (const Node& n : nodes_)
    for (int o = 0; o < n.outputs; ++o)
      WEFT_CHECK(consumers_[static_cast<size_t>(n.id)][static_cast<size_t>(o)].first >= 0,
                 "amp graph: output {} of '{}' ({}) is read by no node", o, n.name, kindName(n.kind));
  bool anyLoss = std::any_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.kind == NodeKind::Loss; });
  WEFT_CHECK(anyLoss, "amp graph: the graph has no loss");
  checkReachability();
  checkCycles();
  checkPhis();
  inferTypes();
  for (const Node& n : nodes_) {
    if (n.kind == NodeKind::Loss) {
      weft::Graph scratch;
      const TensorType& x = node(n.inputs[0].node).outputTypes.at(static_cast<size_t>(n.inputs[0].output));
      Inputs in{{scratch.placeholder("payload", x.dtype, x.shape)}, {}};
      for (const StateInput& s : n.loss.stateInputs)
        in.fromState.push_back(scratch.placeholder(s.name, s.type.dtype, s.type.shape));
      LossOutputs out = n.loss.build(scratch, in);
      WEFT_CHECK(out.loss.valid() && out.loss.rank() == 0, "amp graph: loss '{}' must build a scalar loss, not {}",
                 n.name, out.loss.valid() ? out.loss.type().str() : "nothing");
      continue;
    }
    WEFT_CHECK(static_cast<int>(n.outputTypes.size()) == n.outputs || n.kind == NodeKind::Input,
               "amp graph: the payload type of '{}' cannot be inferred", n.name);
    if (n.kind == NodeKind::Phi)
      for (const Port& p : n.inputs) {
        const TensorType& t = node(p.node).outputTypes.at(static_cast<size_t>(p.output));
        WEFT_CHECK(t.dtype == n.outputTypes[0].dtype && t.shape.compatibleWith(n.outputTypes[0].shape),
                   "amp graph: phi '{}' joins payloads {} (from '{}') and {}", n.name, t.str(), node(p.node).name,
                   n.outputTypes[0].str());
      }
  }
}

std::string Graph::describe(bool dot) const {
  auto edgeLabel = [&](const Port& p) {
    const Node& from = node(p.node);
    return p.output < static_cast<int>(from.outputTypes.size()) ? from.outputTypes[static_cast<size_t>(p.output)].str()
                                                                 : std::string("?");
  };
  std::string out;
  if (dot) {
    out += "digraph amp {\n";
    for (const Node& n : nodes_)
      out += fmt::format("  n{} [label=\"{}\\n{}{}\"{}];\n", n.id, n.name, kindName(n.kind),
                         n.worker >= 0 ? fmt::format(" (worker {})", n.worker) : "",
                         n.kind == NodeKind::Transform || n.kind == NodeKind::Loss ? ", shape=box" : "");
    for (const Node& n : nodes_)
      for (const Port& p : n.inputs)
        out += fmt::format("  n{} -> n{} [label=\"{}{}\"];\n", p.node, n.id,
                           node(p.node).outputs > 1 ? fmt::format("{}: ", p.output) : "", edgeLabel(p));
    return out + "}\n";
  }
  for (const Node& n : nodes_) {
    out += fmt::format("{:>3} {:<28} {:<12}", n.id, n.name, kindName(n.kind));
    if (n.worker >= 0) out += fmt::format(" worker {}", n.worker);
    std::string from;
    for (const Port& p : n.inputs)
      from += fmt::format("{}{}{} {}", from.empty() ? "" : ", ", node(p.node).name,
                          node(p.node).outputs > 1 ? fmt::format(":{}", p.output) : "", edgeLabel(p));
    if (!from.empty()) out += " <- " + from;
    out += "\n";
  }
  return out;
}

}  // namespace weft::amp
