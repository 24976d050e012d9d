// What each kind of node does with a forward, a backward and an update task: the semantics of
// the AMP IR's nodes (amp/AmpGraph.h) on one instance's messages.
#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "dist/amp/Payloads.h"
#include "core/Trace.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <cstring>

namespace weft::amp {

Kept Runtime::Impl::takeKept(NodeRt& n, const State& s, const char* what) {
  auto it = n.kept.find(s);
  WEFT_CHECK(it != n.kept.end(), "amp: {} '{}' got a backward message for {}, which it never sent forward", what,
             n.spec->name, s.str());
  Kept k = std::move(it->second);
  n.kept.erase(it);
  return k;
}

void Runtime::Impl::keep(NodeRt& n, const State& s, Kept k) {
  if (!training) return;
  bool fresh = n.kept.emplace(s, std::move(k)).second;
  WEFT_CHECK(fresh, "amp: {} '{}' got a second forward message with {} before the first was answered",
             kindName(n.spec->kind), n.spec->name, s.str());
}

/// Collects one message per input for state s; true (and the payloads) once all arrived.
bool Runtime::Impl::joinInputs(NodeRt& n, const Task& t, std::vector<Tensor>& payloads) {
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

FeedMap Runtime::Impl::feedsFor(const Compiled& c, const std::vector<Tensor>& payloads,
                                const std::vector<Tensor>& stateValues) {
  FeedMap feeds;
  for (size_t i = 0; i < payloads.size(); ++i) feeds.push_back({c.payloads[i], payloads[i]});
  for (size_t i = 0; i < stateValues.size(); ++i) feeds.push_back({c.fromState[i], stateValues[i]});
  return feeds;
}

std::vector<Tensor> Runtime::Impl::stateValues(const NodeRt& n, const State& s) {
  const auto& specs = n.spec->kind == NodeKind::Loss ? n.spec->loss.stateInputs : n.spec->transform.stateInputs;
  std::vector<Tensor> values;
  for (const StateInput& si : specs) values.push_back(si.value(s, instanceOf(s)));
  return values;
}

void Runtime::Impl::transformForward(NodeRt& n, const Task& t) {
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

void Runtime::Impl::transformBackward(NodeRt& n, const Task& t) {
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
void Runtime::Impl::update(NodeRt& n, int64_t instances) {
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
      Tensor values =
          p.values.empty() ? Tensor(p.variable.dtype(), Shape(noRows)) : scaled(concatRows(p.values), scale);
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

void Runtime::Impl::lossForward(NodeRt& n, const Task& t) {
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

void Runtime::Impl::forward(NodeRt& n, const Task& t) {
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

void Runtime::Impl::groupForward(NodeRt& n, const Task& t) {
  const amp::Node& spec = *n.spec;
  const Instance& inst = instanceOf(t.state);
  State key = spec.group.key(t.state, inst);
  WEFT_CHECK(key.instance == t.state.instance, "amp: group '{}' keyed {} to another instance", spec.name,
             t.state.str());
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

void Runtime::Impl::expandForward(NodeRt& n, const Task& t) {
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

void Runtime::Impl::backward(NodeRt& n, const Task& t) {
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
      std::vector<Tensor> parts =
          t.payload.defined() ? splitLast(t.payload, k.widths) : std::vector<Tensor>(k.widths.size());
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

Shape Runtime::Impl::partShape(const amp::Node& spec, size_t missing, const std::vector<Tensor>& parts) {
  for (const Tensor& p : parts)
    if (p.defined()) {
      Shape s = p.shape();
      s[s.rank() - 1] = spec.sizes[missing];
      return s;
    }
  return spec.outputTypes[missing].shape;
}

void Runtime::Impl::expandBackward(NodeRt& n, const Task& t) {
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

void Runtime::Impl::process(NodeRt& n, Task& t) {
  if (t.kind == Task::Kind::Backward) ++n.answered[static_cast<size_t>(t.port)];
  switch (t.kind) {
    case Task::Kind::Forward: forward(n, t); break;
    case Task::Kind::Backward: backward(n, t); break;
    case Task::Kind::Update: update(n, t.port); break;
  }
}

}  // namespace weft::amp
