// The pipeline cut (see the header).
#include "dist/pipeline/Pipeline.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace weft::dist {

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::Static: return "static";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Weights: return "weights";
    case Phase::Update: return "update";
  }
  return "?";
}

namespace {

constexpr int kNone = -1;

bool isSource(const Node* n) { return n->inputs.empty() && n->controlInputs.empty(); }
bool isPlaceholder(const Node* n) { return n->op == "Placeholder"; }
bool isGroup(const Node* n) { return n->op == "NoOp"; }
bool mutates(const Node* n) { return !n->def->mutatedInputs.empty(); }
bool isTied(const Node* variable) { return variable->attrs.get<bool>("tied", false); }
/// Whether the parameter servers hold `variable` under a cut planned with `options`.
bool isServed(const StagePlanOptions& options, const Node* variable) {
  return std::find(options.served.begin(), options.served.end(), variable) != options.served.end();
}
/// The parameter servers' side of a served variable's update (dist/server/ServerOps.h): its push
/// and its APPLY run once a step, in the update of the stage that reads the variable.
bool updatesServers(const Node* n) { return n->op == "PushGradient" || n->op == "ApplyRemote"; }
/// A read of a served variable from the servers: input 0 is the worker's own copy of it.
bool pullsFromServers(const Node* n) { return n->op == "PullRows" || n->op == "PullVariable"; }
/// A collective among the replicas (dist/collective/CollectiveOps.h).
bool isCollective(const Node* n) {
  static const std::set<std::string> ops{
      "AllReduceStart",    "AllReduceWait",    "AllGatherStart",  "AllGatherWait",    "ReduceScatterStart",
      "ReduceScatterWait", "ShardGatherStart", "ShardGatherWait", "GatherWholeStart", "GatherWholeWait"};
  return ops.count(n->op) > 0;
}

/// The served variable a server op names (its index in the client's plan).
int64_t servedIndex(const Node* n) { return n->attrs.getInt("variable"); }

// On a fused recurrent gradient that splitRecurrentGradients replaced: the id of its weight half.
constexpr const char* kWeightsApart = "weights_apart";

/// A fused recurrent gradient op and its two halves (ops/Rnn.cpp): the input half reads the fused
/// op's inputs and makes its first `inputOutputs` outputs and then the gates' gradients; the
/// weight half reads `weightInputs` (the fused op's inputs by index, then the gates' gradients)
/// and makes the rest of the fused op's outputs.
struct RecurrentSplit {
  const char* fused;
  const char* input;
  const char* weights;
  std::vector<int> weightInputs;
  int inputOutputs;
  int gateOutputs;
};

const std::vector<RecurrentSplit>& recurrentSplits() {
  static const std::vector<RecurrentSplit> splits{
      {"LSTMGrad", "LSTMInputGrad", "LSTMWeightGrad", {0, 1, 7}, 3, 1},           // x, h0, y; dG
      {"GRUCellGrad", "GRUCellInputGrad", "GRUCellWeightGrad", {0, 1}, 2, 2},  // x, h; dGx, dGh
  };
  return splits;
}

const RecurrentSplit* splitOf(const Node* n) {
  for (const RecurrentSplit& split : recurrentSplits())
    if (n->op == split.fused) return &split;
  return nullptr;
}

/// Zero bubble defers a layer's weight gradients, but a fused recurrent gradient (LSTMGrad,
/// GRUCellGrad) computes them with the input gradient. Each becomes its input half and its
/// weight half, which compute the same values in the same order; the fused node stays, read by
/// no one, naming its weight half.
void splitRecurrentGradients(Graph& g) {
  for (size_t id = 0, count = g.size(); id < count; ++id) {
    Node* fused = g.node(static_cast<int>(id));
    const RecurrentSplit* split = splitOf(fused);
    if (split == nullptr || fused->attrs.has(kWeightsApart)) continue;
    const std::vector<Output> in = fused->inputs;
    auto staged = g.stage(fused->stage);
    auto placed = g.onDevice(fused->device);
    Node* input = g.addNode(split->input, in, fused->attrs, fused->name + "/input");
    std::vector<Output> weightInputs;
    for (int i : split->weightInputs) weightInputs.push_back(in[static_cast<size_t>(i)]);
    for (int k = 0; k < split->gateOutputs; ++k) weightInputs.push_back(input->output(split->inputOutputs + k));
    Node* weights = g.addNode(split->weights, weightInputs, fused->attrs, fused->name + "/weights");
    for (Node* half : {input, weights}) {
      half->gradientOf = fused->gradientOf;
      g.addToCollection(kBackwardCollection, half);
    }
    for (int i = 0; i < static_cast<int>(fused->outputs.size()); ++i)
      g.replaceUses(fused->output(i),
                    i < split->inputOutputs ? input->output(i) : weights->output(i - split->inputOutputs));
    fused->attrs.set(kWeightsApart, int64_t{weights->id});
  }
}

/// Loss scaling's check that every gradient is finite (AllFinite) reads the gradients of every
/// stage. Each gradient is checked by an AllFinite of its own, which the cut puts on the
/// gradient's stage, and the check reads the logarithms of their answers (0, or -inf for a
/// gradient that overflowed): scalars cross the stages, not gradients, as clipping's squared
/// norms do. A check of one value, or of scalars alone, is left as it is. The new nodes join the
/// check in loss scaling's collection: an overflow is theirs to report, not checkNumerics'.
void splitFiniteChecks(Graph& g) {
  const std::vector<Node*>& scaled = g.collection(kLossScaledCollection);
  for (size_t id = 0, count = g.size(); id < count; ++id) {
    Node* check = g.node(static_cast<int>(id));
    if (check->op != "AllFinite" || check->inputs.size() < 2 ||
        std::all_of(check->inputs.begin(), check->inputs.end(),
                    [](const Output& in) { return in.shape().numel() == 1; }))
      continue;
    const bool lossScaled = std::find(scaled.begin(), scaled.end(), check) != scaled.end();
    std::vector<Output> answers;
    for (const Output& in : check->inputs) {
      auto placed = g.onDevice(in.node()->device);
      Node* own = g.addNode("AllFinite", {in}, check->attrs, check->name + "/" + in.node()->name);
      answers.push_back(log(own->output()));
      if (!lossScaled) continue;
      g.addToCollection(kLossScaledCollection, own);
      g.addToCollection(kLossScaledCollection, answers.back().node());
    }
    g.rebuild(check, check->op, answers, check->attrs);
  }
}

/// Where splitRecurrentGradients moved fused recurrent gradients' weight gradients.
std::map<Output, Output> movedWeightGradients(const Graph& g) {
  std::map<Output, Output> moved;
  for (const auto& n : g.nodes()) {
    const RecurrentSplit* split = splitOf(n.get());
    if (split == nullptr || !n->attrs.has(kWeightsApart)) continue;
    Node* weights = g.node(static_cast<int>(n->attrs.getInt(kWeightsApart)));
    for (int i = split->inputOutputs; i < static_cast<int>(n->outputs.size()); ++i)
      moved.emplace(n->output(i), weights->output(i - split->inputOutputs));
  }
  return moved;
}

/// The bytes of a value: as a run of the step made it where one did (StagePlanOptions::valueBytes),
/// else from its static shape with `rows` for each unknown dimension.
struct ValueSize {
  const std::map<Output, size_t>& concrete;
  int64_t rows;
  double operator()(const Output& o) const {
    if (auto it = concrete.find(o); it != concrete.end()) return static_cast<double>(it->second);
    double n = 1;
    for (int64_t d : o.shape().dims()) n *= static_cast<double>(d < 0 ? rows : d);
    return n * static_cast<double>(dtypeSize(o.dtype()));
  }
};

/// Where the bytes a stage holds come from, by the forward ops of the step's chain: `state[i]`
/// holds the variables first read by op i, with their gradients and optimizer slots; `kept`
/// each value the backward pass reads, with the chain positions of the ops whose gradients read
/// it and its bytes.
struct ChainMemory {
  std::vector<StageMemory> state;
  std::vector<std::pair<std::set<size_t>, double>> kept;
};

/// The cut's working state: one entry per node id.
class Cutter {
 public:
  Cutter(Graph& graph, int stages, const std::vector<Output>& fetches, Node* trainStep, bool splitWeights)
      : g_(graph), fetches_(fetches), trainStep_(trainStep) {
    cut_.stages = stages;
    cut_.splitWeights = splitWeights;
    const size_t n = graph.size();
    cut_.stageOf.assign(n, kNone);
    cut_.phaseOf.assign(n, Phase::Static);
    needed_.assign(n, 0);
    dynamic_.assign(n, 0);
    wave_.assign(n, 0);
    for (Node* b : graph.collection(kBackwardCollection)) backward_.insert(b);
    for (const auto& node : graph.nodes())
      if (pullsFromServers(node.get())) servedCopies_.insert(node->inputs[0].node());
    for (const GradientLink& link : stepGradientLinks(graph)) addGradient(link);
  }

  PipelineCut run() {
    forwardChain();
    stageForward();
    stageBackward();
    keepRecomputationWithinStages();
    stageVariables();
    checkBackwardFlow();
    stageUpdates();
    checkControlEdges();
    findTransfers();
    if (cut_.splitWeights) splitWeights();
    assignWaves();
    buildRuns();
    numberTiedGradients();
    findGuesses();
    return std::move(cut_);
  }

  /// Each trainable variable's first and last reader among the chain's ops.
  std::map<Node*, std::pair<size_t, size_t>> readerSpans(const std::vector<Node*>& chain) {
    std::map<Node*, std::pair<size_t, size_t>> span;
    for (size_t i = 0; i < chain.size(); ++i) {
      for (Node* v : variablesRead(chain[i])) {
        if (!v->attrs.get<bool>("trainable")) continue;
        auto [it, added] = span.try_emplace(v, i, i);
        if (!added) it->second.second = i;
      }
    }
    return span;
  }

  /// What the ops of `chain` (forwardChain's) hold, each value sized by `bytesOf`.
  ChainMemory chainMemory(const std::vector<Node*>& chain, const ValueSize& bytesOf, const StagePlanOptions& options) {
    const int microbatches = options.microbatches;
    ChainMemory memory;
    memory.state.resize(chain.size());
    std::map<const Node*, size_t> position, firstReader, lastReader;
    for (size_t i = 0; i < chain.size(); ++i) {
      position[chain[i]] = i;
      for (Node* v : variablesRead(chain[i])) {
        if (firstReader.try_emplace(v, i).second) memory.state[i].parameters += bytesOf(v->output());
        lastReader[v] = i;
      }
    }
    for (const GradientLink& link : g_.gradientLinks()) {
      auto reader = firstReader.find(link.variable);
      if (reader == firstReader.end()) continue;
      // A sparse gradient's rows are gathered from every micro-batch, a dense one summed in place.
      const double gradientBytes = link.sparse ? microbatches * (bytesOf(link.indices) + bytesOf(link.values))
                                               : bytesOf(link.variable->output());
      memory.state[reader->second].gradients += gradientBytes;
      // A tied variable's last reader may be in another stage, with a copy and its part of the
      // gradient (reckoned at most as large as the whole); a served one's readers are one stage's.
      const size_t last = lastReader.at(link.variable);
      if (!isTied(link.variable) || last == reader->second || isServed(options, link.variable)) continue;
      memory.state[last].parameters += bytesOf(link.variable->output());
      memory.state[last].gradients += gradientBytes;
    }
    std::set<const Node*> sharded;  // what --shard optimizer shards among the replicas: dense, untied
    for (const GradientLink& link : g_.gradientLinks())
      if (!link.sparse && !isTied(link.variable)) sharded.insert(link.variable);
    for (Node* n : order_) {
      if (!mutates(n) || phase(n) != Phase::Update) continue;
      const std::vector<int>& written = n->def->mutatedInputs;
      const Node* variable = n->inputs[static_cast<size_t>(written.front())].node();
      auto reader = firstReader.find(variable);
      if (reader == firstReader.end() || isServed(options, variable)) continue;
      const double share = sharded.count(variable) ? 1.0 / options.optimizerShards : 1.0;
      for (size_t m = 1; m < written.size(); ++m)
        memory.state[reader->second].optimizerState += share * bytesOf(n->inputs[static_cast<size_t>(written[m])]);
    }
    // A gradient op goes with its forward op, else with the weights it reads, else with its
    // latest input, as stageBackward places it.
    std::map<Output, std::set<size_t>> readers;
    for (Node* b : order_) {
      if (phase(b) != Phase::Backward) continue;
      std::optional<size_t> at;
      if (auto p = position.find(b->gradientOf); p != position.end()) at = p->second;
      for (Node* v : variablesRead(b))
        if (auto r = firstReader.find(v); !at && r != firstReader.end()) at = r->second;
      if (!at) at = latestChainInput(b, position);
      if (!at) continue;
      for (const Output& in : b->inputs)
        if (isPlaceholder(in.node()) || phase(in.node()) == Phase::Forward) readers[in].insert(*at);
    }
    for (const auto& [value, at] : readers) memory.kept.emplace_back(at, bytesOf(value));
    return memory;
  }

  /// The chain position of `n`'s latest input among the chain's ops, if any.
  static std::optional<size_t> latestChainInput(const Node* n, const std::map<const Node*, size_t>& position) {
    std::optional<size_t> latest;
    for (const Output& in : n->inputs)
      if (auto p = position.find(in.node()); p != position.end()) latest = std::max(latest.value_or(0), p->second);
    return latest;
  }

  /// The stage of each op of `chain` (forwardChain's), as the cut places it: the author's stage
  /// scopes' or applyStages'.
  std::vector<int> chainStages(const std::vector<Node*>& chain) {
    stageForward();
    std::vector<int> stages;
    for (const Node* n : chain) stages.push_back(stage(n));
    return stages;
  }

  /// The step's forward ops in topological order (classifying every node on the way).
  std::vector<Node*> forwardChain() {
    WEFT_CHECK(cut_.stages >= 1, "a pipeline needs at least one stage, got {}", cut_.stages);
    markNeeded();
    order_ = neededOrder();
    markDynamic();
    assignPhases();
    std::vector<Node*> chain;
    for (Node* n : order_)
      if (phase(n) == Phase::Forward) chain.push_back(n);
    return chain;
  }

 private:
  size_t at(const Node* n) const { return static_cast<size_t>(n->id); }
  int& stage(const Node* n) { return cut_.stageOf[at(n)]; }
  Phase& phase(const Node* n) { return cut_.phaseOf[at(n)]; }
  bool isDynamicValue(const Output& o) const { return dynamic_[at(o.node())] && !isPlaceholder(o.node()); }

  void markNeeded() {
    std::vector<Node*> stack(trainStep_ ? std::vector<Node*>{trainStep_} : std::vector<Node*>{});
    for (const Output& f : fetches_) stack.push_back(f.node());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (needed_[at(n)]) continue;
      needed_[at(n)] = 1;
      cut_.drawsRandom = cut_.drawsRandom || n->def->drawsRandom;
      for (const Output& in : readsOf(n)) stack.push_back(in.node());
      for (Node* c : n->controlInputs) stack.push_back(c);
    }
  }

  std::vector<Node*> neededOrder() const {
    std::vector<Node*> order;
    for (Node* n : g_.topologicalOrder())
      if (needed_[at(n)]) order.push_back(n);
    return order;
  }

  /// Dynamic: depends on a micro-batch (a placeholder) or on the backward pass. A constant that
  /// autodiff made (Square's 2) is static like any other.
  void markDynamic() {
    for (Node* n : order_) {
      char d = isPlaceholder(n) || (backward_.count(n) && !isSource(n));
      for (const Output& in : n->inputs) d = d || dynamic_[at(in.node())];
      // What must follow an update of the step runs in the step too (a sharded variable's gather
      // of the other replicas' shards, which reads the variables alone).
      for (const Node* c : n->controlInputs) d = d || (dynamic_[at(c)] && mutates(c));
      dynamic_[at(n)] = d;
    }
  }

  void assignPhases() {
    // Forward: what the fetches and the backward pass read, outside the backward pass.
    std::vector<Node*> stack;
    for (const Output& f : fetches_) stack.push_back(f.node());
    for (Node* b : backward_)
      if (needed_[at(b)])
        for (const Output& in : b->inputs) stack.push_back(in.node());
    std::vector<char> forward(g_.size(), 0);
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (forward[at(n)] || !dynamic_[at(n)] || backward_.count(n) || isPlaceholder(n)) continue;
      forward[at(n)] = 1;
      for (const Output& in : n->inputs) stack.push_back(in.node());
    }
    addForwardSideEffects(forward);
    for (Node* n : order_) {
      if (isSource(n) || isGroup(n)) continue;
      if (backward_.count(n)) phase(n) = Phase::Backward;
      else if (forward[at(n)]) phase(n) = Phase::Forward;
      else if (dynamic_[at(n)] || mutates(n) || updatesServers(n)) phase(n) = Phase::Update;
    }
    for (const Output& f : fetches_) {
      WEFT_CHECK(phase(f.node()) == Phase::Forward,
                 "a pipelined step fetches values of the forward pass (the loss, a metric); {} is computed in its {} "
                 "phase",
                 f.name(), phaseName(phase(f.node())));
    }
  }

  /// Marks as forward the side effects of the forward pass: updates of state no optimizer trains
  /// (batch norm's moving averages) computed from forward values alone, and what only they read.
  /// They run with each micro-batch's forward, as GPipe's per-micro-batch batch norm does.
  void addForwardSideEffects(std::vector<char>& forward) {
    std::vector<char> derived(g_.size(), 0);  // computed from forward values alone
    for (Node* n : order_) {
      if (!dynamic_[at(n)] || backward_.count(n) || isPlaceholder(n)) continue;
      bool fromForward = true;
      for (const Output& in : n->inputs) {
        const Node* u = in.node();
        if (dynamic_[at(u)] && !isPlaceholder(u) && !forward[at(u)] && !derived[at(u)]) fromForward = false;
      }
      derived[at(n)] = fromForward && !forward[at(n)];
    }
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      Node* n = *it;
      if (!derived[at(n)]) continue;
      bool sideEffect = mutates(n);
      for (int m : n->def->mutatedInputs)
        sideEffect = sideEffect && !n->inputs[static_cast<size_t>(m)].node()->attrs.get<bool>("trainable");
      if (!mutates(n)) {
        const std::vector<Node*>& readers = consumers(n);
        sideEffect = !readers.empty() &&
                     std::all_of(readers.begin(), readers.end(), [&](const Node* c) { return forward[at(c)] != 0; });
      }
      if (sideEffect) forward[at(n)] = 1;
    }
  }

  int checkedStage(const Node* n) const {
    WEFT_CHECK(n->stage < cut_.stages, "{} is in pipeline stage {}, but the pipeline has {} stages (0..{})",
               n->describe(), n->stage, cut_.stages, cut_.stages - 1);
    return n->stage;
  }

  /// The stage of each variable's forward readers.
  std::map<const Node*, int> forwardStageOfVariables() {
    std::map<const Node*, int> stages;
    for (Node* n : order_)
      if (phase(n) == Phase::Forward)
        for (Node* v : variablesRead(n)) stages.emplace(v, stage(n));
    return stages;
  }

  /// A gradient op whose forward op runs in no stage (a fusion took its place, as
  /// fuseBatchNormRelu does with a batch norm whose recomputed copy the backward reads) goes
  /// with the forward readers of the weights it reads, which a cut keeps in one stage.
  int stageOfWeightsRead(Node* n, const std::map<const Node*, int>& weightStage) {
    int s = kNone;
    for (Node* v : variablesRead(n))
      if (auto it = weightStage.find(v); it != weightStage.end()) s = std::max(s, it->second);
    return s;
  }

  /// The latest stage among the dynamic inputs that have one, or kNone.
  int latestInputStage(const Node* n) {
    int s = kNone;
    for (const Output& in : n->inputs)
      if (isDynamicValue(in)) s = std::max(s, stage(in.node()));
    return s;
  }

  void stageForward() {
    std::vector<Node*> unplaced;
    for (Node* n : order_) {
      if (phase(n) != Phase::Forward) continue;
      stage(n) = n->stage >= 0 ? checkedStage(n) : latestInputStage(n);
      if (stage(n) == kNone) unplaced.push_back(n);
    }
    // What reads only the micro-batch (the labels' count) goes with its first reader.
    for (auto it = unplaced.rbegin(); it != unplaced.rend(); ++it) {
      int s = kNone;
      for (const Node* c : consumers(*it)) {
        const int reader = stage(c) != kNone ? stage(c) : c->stage;
        if (reader != kNone && (s == kNone || reader < s)) s = reader;
      }
      stage(*it) = std::max(s, 0);
    }
    for (Node* n : order_) {
      if (phase(n) != Phase::Forward) continue;
      for (const Output& in : n->inputs) {
        if (!isDynamicValue(in) || stage(in.node()) <= stage(n)) continue;
        WEFT_THROW("{} in pipeline stage {} reads {} of stage {}: the forward pass may only flow to later stages",
                   n->describe(), stage(n), in.name(), stage(in.node()));
      }
    }
    std::vector<int> forwardOps(static_cast<size_t>(cut_.stages), 0);
    for (Node* n : order_)
      if (phase(n) == Phase::Forward) ++forwardOps[static_cast<size_t>(stage(n))];
    for (int s = 0; s < cut_.stages; ++s) {
      WEFT_CHECK(forwardOps[static_cast<size_t>(s)] > 0,
                 "pipeline stage {} of {} has no forward ops: put ops in it with Graph::stage({}) or use fewer stages",
                 s, cut_.stages, s);
    }
  }

  void stageBackward() {
    std::vector<Node*> unplaced;
    const std::map<const Node*, int> weightStage = forwardStageOfVariables();
    for (Node* n : order_) {
      if (phase(n) != Phase::Backward) continue;
      if (n->stage >= 0) stage(n) = checkedStage(n);
      else if (n->gradientOf != nullptr && stage(n->gradientOf) != kNone) stage(n) = stage(n->gradientOf);
      else if (const int s = stageOfWeightsRead(n, weightStage); s != kNone) stage(n) = s;
      else stage(n) = latestInputStage(n);
      if (stage(n) == kNone) unplaced.push_back(n);
    }
    // A backward node that reads no staged value (a constant the backward pass starts from) goes
    // with its readers.
    for (auto it = unplaced.rbegin(); it != unplaced.rend(); ++it) {
      int s = 0;
      for (Node* c : consumers(*it)) s = std::max(s, stage(c));
      stage(*it) = s;
    }
  }

  /// A recompute segment (autodiff/Recompute.h) that the cut splits: a stage's backward reads
  /// what the other stage's part of the segment computed in the forward pass (sent forward as
  /// any value crossing the cut is) instead of that stage's recomputed copy, and a copy waits
  /// only for gradients of its own stage, since nothing orders two stages.
  void keepRecomputationWithinStages() {
    bool rewired = false;
    for (Node* n : order_) {
      if (phase(n) != Phase::Backward) continue;
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const Output in = n->inputs[i];
        if (!in.node()->recomputed || stage(in.node()) == stage(n)) continue;
        g_.setInput(n, static_cast<int>(i), Output(const_cast<Node*>(in.node()->gradientOf), in.index()));
        rewired = true;
      }
      if (!n->recomputed) continue;
      const std::vector<Node*> waits = n->controlInputs;
      for (Node* before : waits) {
        if (phase(before) == Phase::Backward && stage(before) != stage(n)) g_.removeControlInput(n, before);
      }
    }
    if (rewired) consumers_.clear();
  }

  void checkBackwardFlow() {
    for (Node* n : order_) {
      if (phase(n) != Phase::Backward) continue;
      for (const Output& in : n->inputs) {
        const Node* u = in.node();
        if (phase(u) != Phase::Backward || stage(u) >= stage(n)) continue;
        WEFT_THROW("{} in pipeline stage {} reads {} of stage {}: the backward pass may only flow to earlier stages",
                   n->describe(), stage(n), in.name(), stage(u));
      }
    }
  }

  /// What a node reads: its inputs and, where it runs only when a condition holds, the condition.
  static std::vector<Output> readsOf(const Node* n) {
    std::vector<Output> reads = n->inputs;
    if (n->condition.valid()) reads.push_back(n->condition);
    return reads;
  }

  const std::vector<Node*>& consumers(const Node* n) {
    if (consumers_.empty()) {
      consumers_.resize(g_.size());
      for (Node* c : order_)
        for (const Output& in : readsOf(c)) consumers_[at(in.node())].push_back(c);
    }
    return consumers_[at(n)];
  }

  /// The variables a node reads directly or through static nodes.
  const std::set<Node*>& variablesRead(Node* n) {
    auto [it, added] = variablesRead_.try_emplace(n);
    if (!added) return it->second;
    std::set<Node*> vars;
    for (const Output& in : n->inputs) {
      Node* u = in.node();
      if (u->op == "Variable") vars.insert(u);
      else if (!dynamic_[at(u)]) {
        const std::set<Node*>& more = variablesRead(u);
        vars.insert(more.begin(), more.end());
      }
    }
    return variablesRead_[n] = std::move(vars);
  }

  /// Which stages read each variable in the forward and backward passes; a trainable variable
  /// several read is tied.
  void stageVariables() {
    for (Node* n : order_) {
      if (phase(n) != Phase::Forward && phase(n) != Phase::Backward) continue;
      for (Node* v : variablesRead(n)) readers_[v].insert(stage(n));
    }
    for (const auto& [v, stages] : readers_)
      if (stages.size() > 1 && v->attrs.get<bool>("trainable")) tie(v, stages);
  }

  /// Tied weights: the lowest stage that reads `v` owns it (the last to finish its backward pass,
  /// it waits least for the others' parts of the gradient), the others hold copies.
  void tie(Node* v, const std::set<int>& stages) {
    WEFT_CHECK(!servedCopies_.count(v),
               "variable '{}' is held by the parameter servers and read by pipeline stages {}: a served variable is "
               "read by one stage (tied weights across stages stay on the workers: --arch ar)",
               v->name, fmt::join(stages, " and "));
    const int owner = *stages.begin();
    TiedVariable& tied = cut_.tied.emplace_back();
    tied.variable = v;
    tied.owner = owner;
    tied.copies.assign(std::next(stages.begin()), stages.end());
    tiedLinks_.emplace_back(-1, std::vector<int>{});
    for (size_t i = 0, count = links_.size(); i < count; ++i)
      if (links_[i].variable == v) splitGradientSum(i, owner);
  }

  /// A tied variable's gradient that sums parts of several stages: each part becomes a gradient
  /// of its own stage, and the owner's update reads their sum, which the runtime makes (a
  /// sparse part's rows, summed over the micro-batches, are as many as those have: no graph
  /// node's static shape could hold them). The sum's nodes run nowhere.
  void splitGradientSum(size_t index, int owner) {
    const GradientLink link = links_[index];
    const std::vector<Node*> sums = link.sparse ? std::vector<Node*>{link.indices.node(), link.values.node()}
                                                : std::vector<Node*>{link.dense.node()};
    std::vector<std::vector<Output>> parts;
    std::set<int> partStages;
    for (Node* sum : sums) {
      std::vector<Output>& mine = parts.emplace_back();
      for (const Output& in : sum->inputs) {
        if (!isDynamicValue(in)) continue;
        mine.push_back(in);
        partStages.insert(stage(in.node()));
      }
    }
    if (partStages.size() < 2) return;  // one stage computes it all: the owner's update receives it as it is
    const bool splittable = link.sparse ? sums[0]->op == "Concat" && sums[1]->op == "Concat" &&
                                              parts[0].size() == parts[1].size()
                                        : sums[0]->op == "AddN";
    WEFT_CHECK(splittable,
               "the gradient of variable '{}', which pipeline stages {} read (tied weights), is {}, not autodiff's "
               "sum of their parts: the cut cannot split it among the stages",
               link.variable->name, fmt::join(partStages, " and "), sums[0]->describe());
    for (Node* sum : sums) {
      phase(sum) = Phase::Static;
      stage(sum) = owner;  // where the owner's update reads it, and whence it goes to another stage's update
    }
    for (const Output& o : {link.dense, link.indices, link.values})
      if (o.valid()) gradientOutput_.erase(o);
    auto& [whole, partLinks] = tiedLinks_.back();
    whole = static_cast<int>(index);
    for (size_t p = 0; p < parts[0].size(); ++p) {
      GradientLink part = link;
      if (link.sparse) {
        part.indices = parts[0][p];
        part.values = parts[1][p];
      } else {
        part.dense = parts[0][p];
      }
      addGradient(part);
      partLinks.push_back(static_cast<int>(links_.size()) - 1);
    }
  }

  /// Each tied variable's gradient and parts, as indices into cut_.gradients, and the rows its
  /// updates change.
  void numberTiedGradients() {
    for (size_t t = 0; t < cut_.tied.size(); ++t) {
      TiedVariable& tied = cut_.tied[t];
      tied.rows = sparselyUpdatedRows(tied.variable);
      const auto& [whole, parts] = tiedLinks_[t];
      if (whole < 0) continue;
      tied.gradient = gradientIndex(whole, tied.owner);
      for (int part : parts) {
        auto it = gradientOfLink_.find(part);
        WEFT_CHECK(it != gradientOfLink_.end(),
                   "the part of tied variable '{}''s gradient in {} is computed by no stage", tied.variable->name,
                   links_[static_cast<size_t>(part)].dense.valid() ? links_[static_cast<size_t>(part)].dense.name()
                                                                   : links_[static_cast<size_t>(part)].values.name());
        tied.parts.push_back(it->second);
      }
    }
  }

  /// The indices of `v`'s sparse gradient when every update that writes `v` is a sparse apply of
  /// it (SparseApplySGD, SparseApplyAdam, ...: they change the rows named and no other);
  /// otherwise none.
  Output sparselyUpdatedRows(Node* v) {
    const GradientLink* link = nullptr;
    for (const GradientLink& l : g_.gradientLinks())
      if (l.variable == v && l.sparse) link = &l;
    if (link == nullptr) return {};
    bool updated = false;
    for (Node* n : order_) {
      if (!mutates(n)) continue;
      bool writesV = false;
      for (int m : n->def->mutatedInputs) writesV = writesV || n->inputs[static_cast<size_t>(m)].node() == v;
      if (!writesV) continue;
      const bool sparseApply = n->op.rfind("SparseApply", 0) == 0 &&
                               std::find(n->inputs.begin(), n->inputs.end(), link->indices) != n->inputs.end();
      if (!sparseApply) return {};
      updated = true;
    }
    return updated ? link->indices : Output{};
  }

  void addGradient(const GradientLink& link) {
    links_.push_back(link);
    for (const Output& o : {link.dense, link.indices, link.values})
      if (o.valid()) gradientOutput_[o] = static_cast<int>(links_.size()) - 1;
  }

  /// The stage that updates a variable: the one stage that reads it, the owner of a tied one,
  /// kNone for none.
  int ownerOf(Node* v) const {
    for (const TiedVariable& t : cut_.tied)
      if (t.variable == v) return t.owner;
    auto it = readers_.find(v);
    return it == readers_.end() || it->second.size() != 1 ? kNone : *it->second.begin();
  }

  void stageUpdates() {
    stageServerUpdates();
    for (Node* n : order_) {
      if (phase(n) != Phase::Update) continue;
      for (const Output& in : readsOf(n)) {
        const Phase p = phase(in.node());
        WEFT_CHECK(!(p == Phase::Forward || p == Phase::Backward) || gradientOutput_.count(in),
                   "{} (an update) reads {}, a value of each micro-batch's {} pass: pipelined training sums only the "
                   "variables' gradients over the micro-batches (batch-norm moving statistics are not pipelined yet)",
                   n->describe(), in.name(), phaseName(p));
      }
    }
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || !mutates(n)) continue;
      if (!dynamic_[at(n)]) {
        replicated_.push_back(n);  // the step counter: every stage counts for itself
        continue;
      }
      int s = kNone;
      for (int m : n->def->mutatedInputs) s = std::max(s, ownerOf(n->inputs[static_cast<size_t>(m)].node()));
      // State that only the update reads (a loss scale's count of good steps) goes with what
      // computes its new value, below (replicated with it where replicateSharedValues replicates
      // that); replicateSharedState decides what several stages read.
      if (s == kNone && updatesUntrainedState(n)) continue;
      WEFT_CHECK(s != kNone, "{} updates {}, which no forward or backward op of the pipeline reads: no stage holds it",
                 n->describe(), n->inputs[static_cast<size_t>(n->def->mutatedInputs[0])].name());
      stage(n) = s;
    }
    // What one stage's updates alone read goes there; what several read, to the latest stage it reads from.
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      Node* n = *it;
      if (phase(n) != Phase::Update || mutates(n) || !dynamic_[at(n)] || updatesServers(n)) continue;
      std::set<int> readers;
      for (Node* c : consumers(n)) readers.insert(stage(c));
      if (readers.size() == 1 && *readers.begin() != kNone) stage(n) = *readers.begin();
    }
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || !dynamic_[at(n)] || stage(n) != kNone) continue;
      stage(n) = std::max(latestInputStage(n), 0);
    }
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || stage(n) == kNone) continue;
      for (Node* v : variablesRead(n)) readers_[v].insert(stage(n));
      for (int m : n->def->mutatedInputs) readers_[n->inputs[static_cast<size_t>(m)].node()].insert(stage(n));
    }
    replicateSharedState();
  }

  /// Whether `n` writes only variables no optimizer trains and no tied or served one.
  bool updatesUntrainedState(const Node* n) const {
    for (int m : n->def->mutatedInputs) {
      const Node* v = n->inputs[static_cast<size_t>(m)].node();
      if (v->attrs.get<bool>("trainable") || isTied(v) || servedCopies_.count(v)) return false;
    }
    return true;
  }

  /// State that one stage's update writes and other stages read (a loss scale: the loss's stage
  /// multiplies by it, every stage's update divides its gradients by it) is every stage's: each
  /// runs the update on its own copy, from the same values, so that the copies stay equal.
  void replicateSharedState() {
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || !mutates(n) || stage(n) == kNone || !updatesUntrainedState(n)) continue;
      bool shared = false;
      for (int m : n->def->mutatedInputs) shared |= readers_[n->inputs[static_cast<size_t>(m)].node()].size() > 1;
      if (!shared) continue;
      // Every copy must compute the same: from values one stage computes and sends, constants
      // and the state it writes, not from variables only some stages hold or keep current.
      const std::vector<int>& written = n->def->mutatedInputs;
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const Output& in = n->inputs[i];
        const bool own = std::find(written.begin(), written.end(), static_cast<int>(i)) != written.end();
        WEFT_CHECK(own || isDynamicValue(in) || (in.node()->op != "Variable" && variablesRead(in.node()).empty()),
                   "{} updates '{}', which pipeline stages {} read, from {}, which reads variables: every stage "
                   "would update its own copy from its own (the cut replicates updates of such state only from "
                   "values one stage computes)",
                   n->describe(), n->inputs[static_cast<size_t>(written.front())].name(),
                   fmt::join(readers_[n->inputs[static_cast<size_t>(written.front())].node()], ", "), in.name());
      }
      stage(n) = kNone;
      replicated_.push_back(n);
    }
    replicateSharedValues();
  }

  /// What only the replicated updates read, computed from scalars one stage computes and from
  /// replicated state (a loss scale's next value, from the step's finiteness, the scale and its
  /// count of good steps), every stage computes for itself as well, with the updates of scalar
  /// state that such computations read (the count). Each stage then receives the one value that
  /// decides (the finiteness), which its own updates read too and post-validation can guess.
  /// Replicated state counts as every stage's alike only where its update reads nothing else
  /// (the step counter's increment, not a moving average of one stage's trained variable); nodes
  /// ordered by control edges stay where they are.
  void replicateSharedValues() {
    std::set<const Node*> ordered;  // ordered by a control edge that the cut keeps
    for (Node* n : order_) {
      if (isGroup(n)) continue;
      if (!n->controlInputs.empty()) ordered.insert(n);
      ordered.insert(n->controlInputs.begin(), n->controlInputs.end());
    }
    std::set<Node*> candidates;
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || !dynamic_[at(n)] || stage(n) == kNone || updatesServers(n) || ordered.count(n))
        continue;
      if (mutates(n) ? updatesUntrainedState(n) && writesScalars(n) : !n->condition.valid()) candidates.insert(n);
    }
    std::set<Node*> trusted(replicated_.begin(), replicated_.end());  // whose state is every stage's alike
    auto writtenBy = [](const Node* n) {
      std::set<const Node*> written;
      for (int m : n->def->mutatedInputs) written.insert(n->inputs[static_cast<size_t>(m)].node());
      return written;
    };
    for (bool changed = true; changed;) {
      std::set<const Node*> state;
      for (const Node* r : trusted) state.merge(writtenBy(r));
      for (const Node* c : candidates)
        if (mutates(c)) state.merge(writtenBy(c));
      // What every stage has alike: a value one stage computes and sends (a scalar, where
      // `scalarsOnly`), constants, and what reads only shared state.
      auto shared = [&](const Output& in, bool scalarsOnly) {
        Node* u = in.node();
        if (isDynamicValue(in)) return !scalarsOnly || (in.shape().isFullyDefined() && in.shape().numel() == 1);
        if (dynamic_[at(u)]) return false;  // a placeholder: the update's feeds are one stage's
        if (u->op == "Variable") return state.count(u) > 0;
        const std::set<Node*>& read = variablesRead(u);
        return std::all_of(read.begin(), read.end(), [&](Node* v) { return state.count(v) > 0; });
      };
      auto readsShared = [&](Node* n, bool scalarsOnly) {
        const std::vector<Output> reads = readsOf(n);
        return std::all_of(reads.begin(), reads.end(), [&](const Output& in) { return shared(in, scalarsOnly); });
      };
      auto replicable = [&](Node* n) {
        if (!readsShared(n, true)) return false;
        if (mutates(n)) {  // its state is read by what is replicated
          const std::set<const Node*> written = writtenBy(n);
          auto readsState = [&](Node* r) {
            const std::set<Node*>& read = variablesRead(r);
            return r != n && std::any_of(read.begin(), read.end(), [&](Node* v) { return written.count(v) > 0; });
          };
          return std::any_of(replicated_.begin(), replicated_.end(), readsState) ||
                 std::any_of(candidates.begin(), candidates.end(),
                             [&](Node* c) { return !mutates(c) && readsState(c); });
        }
        const std::vector<Node*>& readers = consumers(n);
        return !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](Node* c) {
          return (stage(c) == kNone && phase(c) == Phase::Update) || candidates.count(c) > 0;
        });
      };
      changed = std::erase_if(trusted, [&](Node* r) { return !readsShared(r, false); }) > 0;
      changed = std::erase_if(candidates, [&](Node* n) { return !replicable(n); }) > 0 || changed;
    }
    for (Node* n : order_) {
      if (!candidates.count(n)) continue;
      stage(n) = kNone;
      if (mutates(n)) replicated_.push_back(n);
    }
  }

  /// Whether every variable `n` writes is a scalar.
  static bool writesScalars(const Node* n) {
    return std::all_of(n->def->mutatedInputs.begin(), n->def->mutatedInputs.end(),
                       [&](int m) { return n->inputs[static_cast<size_t>(m)].shape().numel() == 1; });
  }

  /// A served variable's push and APPLY go to the one stage that reads the variable.
  void stageServerUpdates() {
    std::map<int64_t, Node*> copyOf;  // served variable index -> the worker's copy its pulls read
    for (Node* n : order_)
      if (pullsFromServers(n)) copyOf[servedIndex(n)] = n->inputs[0].node();
    for (Node* n : order_) {
      if (!updatesServers(n)) continue;
      auto copy = copyOf.find(servedIndex(n));
      WEFT_CHECK(copy != copyOf.end(), "{} updates a served variable that no op of the pipelined step reads",
                 n->describe());
      stage(n) = ownerOf(copy->second);
      WEFT_CHECK(stage(n) != kNone, "{} updates served variable '{}', which no stage reads", n->describe(),
                 copy->second->name);
    }
  }

  /// A control edge orders two runs of one stage's phase; across stages or phases nothing could.
  void checkControlEdges() {
    for (Node* n : order_) {
      if (isGroup(n)) continue;
      for (Node* c : n->controlInputs) {
        if (stage(c) == stage(n) && phase(c) == phase(n)) continue;
        WEFT_THROW("{} ({} stage {}) runs after {} ({} stage {}): a control edge across pipeline stages or phases "
                   "cannot be kept",
                   n->describe(), phaseName(phase(n)), stage(n), c->describe(), phaseName(phase(c)), stage(c));
      }
    }
  }

  void findTransfers() {
    std::map<std::pair<Output, int>, int> index;
    auto add = [&](const Output& in, int to, Phase readIn) {
      if (!isDynamicValue(in) || stage(in.node()) == kNone || stage(in.node()) == to) return;
      if (index.count({in, to})) return;
      Transfer t;
      t.value = in;
      t.from = stage(in.node());
      t.to = to;
      const Phase produced = phase(in.node());
      if (readIn == Phase::Update)
        t.receivedIn = Phase::Update;
      else if (produced == Phase::Forward && t.from < t.to)
        t.receivedIn = Phase::Forward;
      else
        t.receivedIn = Phase::Backward;
      index[{in, to}] = static_cast<int>(cut_.transfers.size());
      cut_.transfers.push_back(t);
    };
    for (Node* n : order_) {
      if (phase(n) == Phase::Static) continue;
      if (stage(n) != kNone) {
        for (const Output& in : readsOf(n)) add(in, stage(n), phase(n));
      } else if (phase(n) == Phase::Update) {  // a replicated update reads its values on every stage
        for (const Output& in : readsOf(n))
          for (int s : allStages()) add(in, s, Phase::Update);
      }  // else a tied gradient's sum: the runtime's
    }
  }

  /// Zero bubble: the backward nodes that no transfer to an earlier stage needs become Weights.
  void splitWeights() {
    std::vector<char> neededEarlier(g_.size(), 0);
    std::vector<Node*> stack;
    for (const Transfer& t : cut_.transfers)
      if (phase(t.value.node()) == Phase::Backward && t.receivedIn == Phase::Backward) stack.push_back(t.value.node());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (needed_[at(n)] == 0 || neededEarlier[at(n)] || phase(n) != Phase::Backward) continue;
      neededEarlier[at(n)] = 1;
      for (const Output& in : n->inputs)
        if (stage(in.node()) == stage(n)) stack.push_back(in.node());
    }
    for (Node* n : order_)
      if (phase(n) == Phase::Backward && !neededEarlier[at(n)]) phase(n) = Phase::Weights;
  }

  /// Update waves: a node runs after the waves of its inputs, one later when an input comes from
  /// another stage. Each wave is then split in two, what other stages wait for first (even) and
  /// the rest after the sends (odd), so a stage's own updates never delay another's.
  void assignWaves() {
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || stage(n) == kNone) continue;
      int w = 0;
      for (const Output& in : readsOf(n)) {
        const Node* u = in.node();
        if (stage(u) == kNone) continue;
        w = std::max(w, (phase(u) == Phase::Update ? wave_[at(u)] : 0) + (stage(u) != stage(n) ? 1 : 0));
      }
      for (const Node* c : n->controlInputs)
        if (phase(c) == Phase::Update && stage(c) == stage(n)) w = std::max(w, wave_[at(c)]);
      wave_[at(n)] = w;
    }
    std::vector<char> awaited(g_.size(), 0);
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      Node* n = *it;
      if (phase(n) != Phase::Update || stage(n) == kNone) continue;
      for (Node* c : consumers(n))
        if (stage(c) != kNone && (stage(c) != stage(n) || (wave_[at(c)] == wave_[at(n)] && awaited[at(c)])))
          awaited[at(n)] = 1;
    }
    for (Node* n : order_) {
      if (phase(n) != Phase::Update || stage(n) == kNone) continue;
      wave_[at(n)] = 2 * wave_[at(n)] + (awaited[at(n)] ? 0 : 1);
      lastWave_ = std::max(lastWave_, wave_[at(n)]);
    }
    // The updates every stage runs for itself go with the last wave, or after it where they
    // read what a stage computes in the update (whether a loss-scaled step's gradients are finite).
    replicatedWave_ = lastWave_;
    for (const Node* r : replicated_)
      for (const Output& in : readsOf(r))
        if (isDynamicValue(in)) replicatedWave_ = lastWave_ + 1;
    dropControlEdgesBetweenWaves();
  }

  /// A served variable's APPLY waits for its push (a control edge). Where the push is awaited by
  /// another stage (its squared norm, for clipping) and the APPLY reads what comes back, the two
  /// run in different waves, whose order keeps the edge; in the graph it would make the APPLY's
  /// run push again. The push's wave comes from its inputs (the gradients, wave 0) alone, so a
  /// later cut of the same graph puts the two in the same waves without the edge.
  void dropControlEdgesBetweenWaves() {
    for (Node* n : order_) {
      if (!updatesServers(n) || stage(n) == kNone) continue;
      const std::vector<Node*> waits = n->controlInputs;
      for (Node* c : waits)
        if (updatesServers(c) && stage(c) == stage(n) && wave_[at(c)] < wave_[at(n)]) g_.removeControlInput(n, c);
    }
  }

  /// The run of stage `s` that computes node `n`: 0 forward, 1 backward, 2 weights, 3 + w update wave w.
  int runOf(const Node* n) const {
    switch (cut_.phaseOf[at(n)]) {
      case Phase::Forward: return 0;
      case Phase::Backward: return 1;
      case Phase::Weights: return 2;
      case Phase::Update:
        return 3 + (cut_.stageOf[at(n)] == kNone ? replicatedWave_ : wave_[at(n)]);
      case Phase::Static: break;
    }
    return kNone;
  }

  void buildRuns() {
    const int runsPerStage = 4 + replicatedWave_;
    std::vector<std::vector<StageRun>> runs(static_cast<size_t>(cut_.stages),
                                            std::vector<StageRun>(static_cast<size_t>(runsPerStage)));
    auto runAt = [&](int s, int r) -> StageRun& { return runs[static_cast<size_t>(s)][static_cast<size_t>(r)]; };
    auto addUnique = [](auto& list, const auto& value) {
      if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
    };
    std::map<Output, int> receiveRun;  // per transfer: the receiving run
    for (Node* n : order_) {
      if (phase(n) == Phase::Static || isGroup(n) || isSource(n)) continue;
      const std::vector<int> stages = stage(n) == kNone ? allStages() : std::vector<int>{stage(n)};
      for (int s : stages) {
        StageRun& run = runAt(s, runOf(n));
        if (mutates(n) || updatesServers(n)) run.targets.push_back(n);
        for (const Output& in : readsOf(n)) {
          const Node* u = in.node();
          const bool replicatedHere = stage(u) == kNone && phase(u) == Phase::Update;  // in the same run
          if (isPlaceholder(u)) addUnique(run.placeholders, in);
          else if (dynamic_[at(u)] && !replicatedHere && (stage(u) != s || runOf(u) != runOf(n)))
            addUnique(run.inputs, in);
        }
      }
    }
    // Each value leaving its run: fetched there, sent, kept or summed.
    for (Node* n : order_) {
      if (phase(n) == Phase::Static || isGroup(n) || isSource(n) || !dynamic_[at(n)]) continue;
      if (stage(n) == kNone) continue;
      for (const Node* c : consumers(n)) {
        for (const Output& in : readsOf(c)) {
          if (in.node() != n || phase(c) == Phase::Static) continue;
          StageRun& from = runAt(stage(n), runOf(n));
          if (stage(c) == kNone) {  // a replicated update: every stage's copy reads it after its wave
            if (phase(c) == Phase::Update) addUnique(from.fetches, in);
            continue;
          }
          if (stage(c) == stage(n) && runOf(c) == runOf(n)) continue;
          addUnique(from.fetches, in);
          if (stage(c) == stage(n) && phase(c) != Phase::Update) addUnique(from.kept, in);
          if (stage(c) == stage(n) && phase(c) == Phase::Update && phase(n) == Phase::Update) addUnique(from.kept, in);
        }
      }
    }
    for (const auto& [output, link] : gradientOutput_) {
      if (!needed_[at(output.node())] || stage(output.node()) == kNone) continue;
      StageRun& run = runAt(stage(output.node()), runOf(output.node()));
      addUnique(run.fetches, output);
      const int gradient = gradientIndex(link, stage(output.node()));
      addUnique(run.gradients, gradient);
    }
    for (const Output& f : fetches_) {
      addUnique(runAt(stage(f.node()), 0).fetches, f);
      cut_.fetchStage.push_back(stage(f.node()));
    }
    for (size_t t = 0; t < cut_.transfers.size(); ++t) {
      const Transfer& transfer = cut_.transfers[t];
      // A gradient another stage's update reads leaves, summed, at the update's start.
      const int producer = runOf(transfer.value.node());
      const int sending = transfer.receivedIn == Phase::Update ? std::max(producer, 3) : producer;
      runAt(transfer.from, sending).sends.push_back(static_cast<int>(t));
      runAt(transfer.to, receivingRun(transfer)).receives.push_back(static_cast<int>(t));
    }
    cut_.replicated = replicated_;
    for (int s = 0; s < cut_.stages; ++s) {
      auto& mine = runs[static_cast<size_t>(s)];
      cut_.forward.push_back(std::move(mine[0]));
      cut_.backward.push_back(std::move(mine[1]));
      cut_.weights.push_back(std::move(mine[2]));
      cut_.update.emplace_back(std::make_move_iterator(mine.begin() + 3), std::make_move_iterator(mine.end()));
      std::vector<Node*> held;
      for (const auto& [v, readers] : readers_)
        if (readers.count(s) || readers.count(kNone)) held.push_back(v);
      for (Node* r : replicated_)
        for (int m : r->def->mutatedInputs) addUnique(held, r->inputs[static_cast<size_t>(m)].node());
      std::sort(held.begin(), held.end(), [](const Node* a, const Node* b) { return a->id < b->id; });
      cut_.variables.push_back(std::move(held));
    }
  }

  /// Each stage's UpdateGuess, or none anywhere when a stage that sends computed values would
  /// wait for another's.
  void findGuesses() {
    cut_.updatesServers.assign(static_cast<size_t>(cut_.stages), 0);
    for (Node* n : order_)
      if (updatesServers(n)) cut_.updatesServers[static_cast<size_t>(stage(n))] = 1;
    std::set<int> remoteSent;
    for (int s = 0; s < cut_.stages; ++s) {
      cut_.guesses.push_back(guessOf(s));
      for (int t : cut_.guesses.back().remoteSends) remoteSent.insert(t);
    }
    for (const UpdateGuess& guess : cut_.guesses) {
      const bool waitsOnComputed = std::any_of(guess.receives.begin(), guess.receives.end(),
                                               [&](int t) { return remoteSent.count(t) > 0; });
      if (!guess.remoteSends.empty() && waitsOnComputed) {
        cut_.guesses.assign(static_cast<size_t>(cut_.stages), {});
        return;
      }
    }
  }

  /// What stage `s`'s update may guess (PipelineCut::guesses), or none: remote values are those
  /// received in the update and the scalars computed from them; a remote value that a tensor op
  /// or an update reads, as an input or as its run condition, is a point. So is one that a scalar
  /// reading a variable the stage updates reads (a loss scale's next value reads the scale): the
  /// real scalars are computed after the update, when that variable has moved; and so is one that
  /// a scalar reading a value computed from a guess reads. Nothing to guess where a remote value
  /// is a tensor, or where the stage sends a value computed from a guess.
  UpdateGuess guessOf(int s) {
    UpdateGuess guess;
    std::set<Output> remote;
    for (size_t t = 0; t < cut_.transfers.size(); ++t) {
      const Transfer& transfer = cut_.transfers[t];
      if (transfer.to != s || transfer.receivedIn != Phase::Update) continue;
      remote.insert(transfer.value);
      guess.receives.push_back(static_cast<int>(t));
    }
    if (remote.empty()) return {};
    if (cut_.updatesServers[static_cast<size_t>(s)]) return {};  // what it sends the servers stays sent
    // A collective among the stage's replicas (a sharded update's) runs once in each wave: a
    // guess would run it again in the run that validates it.
    for (Node* n : order_)
      if (stage(n) == s && phase(n) == Phase::Update && isCollective(n)) return {};
    std::set<Node*> updated, tainted;
    for (const StageRun& wave : cut_.update[static_cast<size_t>(s)])
      for (Node* target : wave.targets)
        for (int m : target->def->mutatedInputs) updated.insert(target->inputs[static_cast<size_t>(m)].node());
    auto scalar = [](const Output& o) { return o.shape().numel() == 1; };
    auto scalarType = [](const TensorType& t) { return t.shape.numel() == 1; };
    auto addUnique = [](std::vector<Output>& list, const Output& o) {
      if (std::find(list.begin(), list.end(), o) == list.end()) list.push_back(o);
    };
    for (Node* n : order_) {
      if ((stage(n) != s && stage(n) != kNone) || phase(n) != Phase::Update) continue;  // kNone: every stage's
      std::vector<Output> remoteInputs;
      bool guessedInput = false;  // computed in the update from a guessed point, not remote itself
      for (const Output& in : readsOf(n)) {
        if (remote.count(in)) remoteInputs.push_back(in);
        else
          guessedInput |= tainted.count(in.node()) > 0;
      }
      if (remoteInputs.empty()) {
        if (guessedInput) tainted.insert(n);
        continue;
      }
      tainted.insert(n);
      const std::set<Node*>& read = variablesRead(n);
      const bool readsUpdated = std::any_of(read.begin(), read.end(), [&](Node* v) { return updated.count(v) > 0; });
      const bool scalarStep = !mutates(n) && std::all_of(n->outputs.begin(), n->outputs.end(), scalarType);
      // Computed after the update, a scalar reading what the update wrote, or what was computed
      // from a guess, would be wrong: its remote inputs are guessed instead.
      if (!scalarStep || readsUpdated || guessedInput) {
        for (const Output& in : remoteInputs) {
          if (!scalar(in)) return {};
          addUnique(guess.points, in);
        }
        continue;
      }
      for (size_t o = 0; o < n->outputs.size(); ++o) remote.insert(Output(n, static_cast<int>(o)));
      for (const Output& in : readsOf(n)) {
        const Node* u = in.node();
        if (!remote.count(in) && !tainted.count(in.node()) && dynamic_[at(u)] && stage(u) == s &&
            phase(u) == Phase::Update)
          addUnique(guess.localInputs, in);
      }
    }
    for (size_t t = 0; t < cut_.transfers.size(); ++t) {
      const Transfer& transfer = cut_.transfers[t];
      if (transfer.from != s || transfer.receivedIn != Phase::Update) continue;
      if (remote.count(transfer.value)) guess.remoteSends.push_back(static_cast<int>(t));
      else if (tainted.count(transfer.value.node())) return {};
      else guess.localSends.push_back(static_cast<int>(t));
    }
    return guess;
  }

  /// The run that takes a transfer: the receiver's forward or backward action, or in the update
  /// the first wave that reads it.
  int receivingRun(const Transfer& t) {
    if (t.receivedIn == Phase::Forward) return 0;
    if (t.receivedIn == Phase::Backward) return 1;
    int first = 3 + replicatedWave_;
    for (const Node* c : consumers(t.value.node()))
      if (stage(c) == t.to && phase(c) == Phase::Update) first = std::min(first, runOf(c));
    return first;
  }

  int gradientIndex(int link, int s) {
    auto [it, added] = gradientOfLink_.try_emplace(link, static_cast<int>(cut_.gradients.size()));
    if (added) {
      const GradientLink& l = links_[static_cast<size_t>(link)];
      cut_.gradients.push_back({l, s, servedCopies_.count(l.variable) > 0, reduceScattered(l)});
    }
    return it->second;
  }

  /// Whether the graph reduce-scatters a dense gradient over the stage's replicas itself
  /// (dist/Transform.h, shardOverReplicas).
  bool reduceScattered(const GradientLink& l) {
    if (l.sparse) return false;
    const std::vector<Node*>& readers = consumers(l.dense.node());
    return std::any_of(readers.begin(), readers.end(), [&](const Node* c) {
      return c->op == "ReduceScatterStart" && std::find(c->inputs.begin(), c->inputs.end(), l.dense) != c->inputs.end();
    });
  }

  std::vector<int> allStages() const {
    std::vector<int> out;
    for (int s = 0; s < cut_.stages; ++s) out.push_back(s);
    return out;
  }

  Graph& g_;
  std::vector<Output> fetches_;
  Node* trainStep_;
  PipelineCut cut_;
  std::vector<char> needed_, dynamic_;
  std::vector<int> wave_;
  int lastWave_ = 0, replicatedWave_ = 0;
  std::vector<Node*> order_;
  std::set<Node*> backward_;
  std::vector<GradientLink> links_;  // the graph's, then the stages' parts of tied variables' gradients
  std::map<Output, int> gradientOutput_;  // into links_
  std::map<int, int> gradientOfLink_;     // links_ index -> cut_.gradients index
  // Per tied variable: its gradient's links_ index (-1 when one stage computes it), and its parts'.
  std::vector<std::pair<int, std::vector<int>>> tiedLinks_;
  std::vector<std::vector<Node*>> consumers_;
  std::map<Node*, std::set<Node*>> variablesRead_;
  std::map<Node*, std::set<int>> readers_;
  std::vector<Node*> replicated_;
  std::set<const Node*> servedCopies_;  // the workers' copies of the variables the servers hold
};

/// Per cut point k (between chain ops k and k + 1): the bytes of the values ops up to k make that
/// later ops read.
std::vector<double> boundaryBytes(const std::vector<Node*>& chain, const ValueSize& bytesOf) {
  std::map<const Node*, size_t> position;
  for (size_t i = 0; i < chain.size(); ++i) position[chain[i]] = i;
  std::map<Output, size_t> lastReader;
  for (size_t j = 0; j < chain.size(); ++j)
    for (const Output& in : chain[j]->inputs)
      if (position.count(in.node())) lastReader[in] = std::max(lastReader[in], j);
  std::vector<double> bytes(chain.size(), 0);
  for (const auto& [value, last] : lastReader)
    for (size_t k = position.at(value.node()); k < last; ++k) bytes[k] += bytesOf(value);
  return bytes;
}

/// "512 B", "20.5 kB", "12.34 MB", "1.50 GB".
std::string humanBytes(double bytes) {
  if (bytes < 1e3) return fmt::format("{:.0f} B", bytes);
  if (bytes < 1e6) return fmt::format("{:.1f} kB", bytes / 1e3);
  if (bytes < 1e9) return fmt::format("{:.2f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

/// Per chain position p: the kept values whose gradient readers include p, each with the
/// position just past its previous such reader (0 for the first) and its bytes.
using KeptByReader = std::vector<std::vector<std::pair<size_t, double>>>;

KeptByReader keptByReader(const ChainMemory& memory) {
  KeptByReader byReader(memory.state.size());
  for (const auto& [readers, bytes] : memory.kept) {
    size_t after = 0;
    for (size_t p : readers) {
      byReader[p].emplace_back(after, bytes);
      after = p + 1;
    }
  }
  return byReader;
}

/// What each stage holds when chain op i runs in stage `stageOf[i]`; `inFlight` per stage.
std::vector<StageMemory> sumByStage(const ChainMemory& memory, const std::vector<int>& stageOf,
                                    const std::vector<int>& inFlight) {
  std::vector<StageMemory> held(inFlight.size());
  for (size_t s = 0; s < held.size(); ++s) held[s].inFlight = inFlight[s];
  for (size_t i = 0; i < stageOf.size(); ++i) {
    StageMemory& stage = held.at(static_cast<size_t>(stageOf[i]));
    stage.parameters += memory.state[i].parameters;
    stage.gradients += memory.state[i].gradients;
    stage.optimizerState += memory.state[i].optimizerState;
  }
  for (const auto& [readers, bytes] : memory.kept) {
    std::set<int> stages;
    for (size_t p : readers) stages.insert(stageOf[p]);
    for (int s : stages) held.at(static_cast<size_t>(s)).activations += bytes;
  }
  return held;
}

/// The activations of stages starting at one op, as their last op moves on: each value the
/// gradients of ops in [first, last] read, once (its previous reader lies before `first`).
class KeptBytes {
 public:
  KeptBytes(const KeptByReader& kept, size_t first) : kept_(kept), first_(first) {}
  /// Adds op `last` (called for first, first + 1, ...) and returns the stage's activations.
  double through(size_t last) {
    for (const auto& [after, bytes] : kept_[last])
      if (after <= first_) bytes_ += bytes;
    return bytes_;
  }

 private:
  const KeptByReader& kept_;
  size_t first_;
  double bytes_ = 0;
};

}  // namespace

std::map<Output, size_t> valueBytes(const std::map<Output, TensorType>& types) {
  std::map<Output, size_t> bytes;
  for (const auto& [value, type] : types)
    bytes.emplace(value, static_cast<size_t>(std::max<int64_t>(type.shape.numel(), 0)) * dtypeSize(type.dtype));
  return bytes;
}

std::string StageMemory::describe() const {
  return fmt::format("holds {} (parameters {}, gradients {}, optimizer state {}, activations {} x {})",
                     humanBytes(total()), humanBytes(parameters), humanBytes(gradients), humanBytes(optimizerState),
                     inFlight, humanBytes(activations));
}

std::string StagePlan::describe() const {
  std::string out;
  for (size_t s = 0; s < firstOp.size(); ++s) {
    out += fmt::format("stage {}: {} forward ops from #{}, {:.3f} ms with their gradients, sends {:.0f} bytes", s,
                       ops[s], firstOp[s], seconds[s] * 1e3, boundaryBytes[s]);
    if (s < memory.size()) out += ", " + memory[s].describe();
    out += "\n";
  }
  return out;
}

std::vector<StageMemory> stageMemory(Graph& graph, const std::vector<Output>& fetches, Node* trainStep,
                                     const StagePlanOptions& options) {
  Cutter cutter(graph, options.schedule.modelStages(options.stages), fetches, trainStep, false);
  const std::vector<Node*> chain = cutter.forwardChain();
  const std::vector<int> stageOf = cutter.chainStages(chain);
  const ChainMemory memory = cutter.chainMemory(chain, ValueSize{options.valueBytes, options.rows}, options);
  return sumByStage(memory, stageOf,
                    options.schedule.simulate(options.stages, options.microbatches, {}).stagePeakInFlight);
}

namespace {

/// A cut's cost when processes hold several stages: the bytes by which its fullest process
/// exceeds the memory limit (0 within it or without one), then its busiest process's time per
/// micro-batch.
using ProcessCost = std::pair<double, double>;

/// With virtual stages a process runs several stages of every micro-batch, so a step goes at the
/// pace of the busiest process rather than of the slowest stage, and a memory limit holds for a
/// process's stages together: moves the cuts `firstOp` (each between its neighbours, where
/// `cuttable` allows) while that lowers `cost(firstOp)`, the excess first, then the time. A
/// local search from the stage-balanced cut, not an exhaustive one.
template <typename Cost>
void balanceProcesses(std::vector<size_t>& firstOp, const std::vector<char>& cuttable, size_t ops, Cost&& cost) {
  auto better = [](const ProcessCost& a, const ProcessCost& b) {
    return a.first < b.first * (1 - 1e-9) || (a.first <= b.first && a.second < b.second * (1 - 1e-9));
  };
  ProcessCost current = cost(firstOp);
  for (bool improved = true; improved;) {
    improved = false;
    for (size_t s = 1; s < firstOp.size(); ++s) {
      const size_t end = s + 1 < firstOp.size() ? firstOp[s + 1] : ops;
      for (size_t i = firstOp[s - 1] + 1; i < end; ++i) {
        if (!cuttable[i - 1] || i == firstOp[s]) continue;
        const size_t was = firstOp[s];
        firstOp[s] = i;
        const ProcessCost moved = cost(firstOp);
        if (better(moved, current)) {
          current = moved;
          improved = true;
        } else {
          firstOp[s] = was;
        }
      }
    }
  }
}

/// Each op's stage in a chain of `ops` ops cut where `firstOp` says.
std::vector<int> stagesOfChain(const std::vector<size_t>& firstOp, size_t ops) {
  std::vector<int> stageOf(ops);
  for (size_t s = 0; s < firstOp.size(); ++s)
    std::fill(stageOf.begin() + static_cast<std::ptrdiff_t>(firstOp[s]), stageOf.end(), static_cast<int>(s));
  return stageOf;
}

}  // namespace

StagePlan planStages(Graph& graph, const std::vector<Output>& fetches, Node* trainStep,
                     const std::unordered_map<const Node*, double>& seconds, const StagePlanOptions& options) {
  const int stages = options.schedule.modelStages(options.stages);
  // With virtual stages the limit holds for each process's stages together: the program keeps
  // each stage within the limit's share, then balanceProcesses weighs the processes.
  const bool virtualStages = stages != options.stages;
  Cutter cutter(graph, stages, fetches, trainStep, false);
  const std::vector<Node*> chain = cutter.forwardChain();
  const std::map<Node*, std::pair<size_t, size_t>> spans = cutter.readerSpans(chain);
  // A cut never parts a variable's readers (a recurrent layer's steps share its weights) unless
  // the model ties them and the stages hold them: the servers keep one copy, for one stage.
  std::vector<char> cuttable(chain.size(), 1);
  for (const auto& [v, readers] : spans)
    if (!isTied(v) || isServed(options, v))
      for (size_t k = readers.first; k < readers.second; ++k) cuttable[k] = 0;
  const size_t n = chain.size(), count = static_cast<size_t>(stages);
  WEFT_CHECK(n >= count, "the step has {} forward ops, too few for {} pipeline stages", n, stages);
  const size_t cuts = static_cast<size_t>(std::count(cuttable.begin(), cuttable.end() - 1, 1));
  WEFT_CHECK(cuts + 1 >= count,
             "the step's forward ops can be cut in {} places without parting a variable's readers (a layer's "
             "weights stay in one stage): too few for {} pipeline stages",
             cuts, stages);
  WEFT_CHECK(options.linkBytesPerSecond > 0, "the link speed for the pipeline cut must be positive, got {}",
             options.linkBytesPerSecond);
  WEFT_CHECK(options.memoryPerStage >= 0, "the memory per pipeline stage must be positive (or 0: no limit), got {}",
             options.memoryPerStage);
  // Each forward op costs its own time and its gradient ops', and its variables' updates (once
  // per step: a micro-batch's share) but those of the variables the servers hold, which the
  // servers run: the profile timed them on the stage before the servers' pass took them away.
  std::map<const Node*, double> cost;
  for (const auto& [node, t] : seconds) {
    if (!node->def->mutatedInputs.empty()) {
      Node* variable = node->inputs[static_cast<size_t>(node->def->mutatedInputs.front())].node();
      if (isServed(options, variable)) continue;
      auto span = spans.find(variable);
      if (span != spans.end()) cost[chain[span->second.first]] += t / options.microbatches;
      continue;
    }
    cost[node->gradientOf != nullptr ? node->gradientOf : node] += t;
  }
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + (cost.count(chain[i]) ? cost.at(chain[i]) : 0.0);
  const ValueSize bytesOf{options.valueBytes, options.rows};
  const std::vector<double> boundary = boundaryBytes(chain, bytesOf);
  // Both ways: activations forward, their gradients back.
  auto transfer = [&](size_t k) { return 2 * boundary[k] / options.linkBytesPerSecond; };
  auto stageTime = [&](size_t first, size_t last) {
    return prefix[last + 1] - prefix[first] + (first > 0 ? transfer(first - 1) : 0) +
           (last + 1 < n ? transfer(last) : 0);
  };
  const ChainMemory memory = cutter.chainMemory(chain, bytesOf, options);
  const KeptByReader byReader = keptByReader(memory);
  std::vector<double> statePrefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const StageMemory& m = memory.state[i];
    statePrefix[i + 1] = statePrefix[i] + m.parameters + m.gradients + m.optimizerState;
  }
  const std::vector<int> inFlight =
      options.schedule.simulate(options.stages, options.microbatches, {}).stagePeakInFlight;
  // best[s][j]: the slowest of stages 0..s when stage s ends at op j, each within `stageLimit`;
  // from[s][j]: where stage s starts. leanest[s][j]: the least memory the largest of stages 0..s
  // can hold when stage s ends at op j, limit or not (what a refusal reports).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best, leanest;
  std::vector<std::vector<size_t>> from;
  auto program = [&](double stageLimit) {
    best.assign(count, std::vector<double>(n, inf));
    leanest = best;
    from.assign(count, std::vector<size_t>(n, 0));
    for (size_t i = 0; i < n; ++i) {  // a stage's first op
      if (i > 0 && !cuttable[i - 1]) continue;
      KeptBytes kept(byReader, i);
      for (size_t j = i; j < n; ++j) {  // its last
        const double activations = kept.through(j), time = stageTime(i, j);
        for (size_t s = i == 0 ? 0 : 1; s < count && s <= i; ++s) {
          const double bytes = statePrefix[j + 1] - statePrefix[i] + inFlight[s] * activations;
          const double before = s == 0 ? 0 : best[s - 1][i - 1];
          const double largestBefore = s == 0 ? 0 : leanest[s - 1][i - 1];
          leanest[s][j] = std::min(leanest[s][j], std::max(largestBefore, bytes));
          if (stageLimit > 0 && bytes > stageLimit) continue;
          if (std::max(before, time) < best[s][j]) {
            best[s][j] = std::max(before, time);
            from[s][j] = i;
          }
        }
      }
    }
    return best[count - 1][n - 1] < inf;
  };
  // With virtual stages: within the limit's share per stage if some cut is, else unlimited.
  const double share = options.memoryPerStage / options.schedule.virtualStages();
  if (!virtualStages) program(options.memoryPerStage);
  else if (options.memoryPerStage == 0 || !program(share)) program(0);
  const double leastLargest = leanest[count - 1][n - 1];
  WEFT_CHECK(best[count - 1][n - 1] < inf,
             "no cut of the step into {} pipeline stages keeps every stage within {} ({:.0f} bytes; parameters, "
             "gradients, optimizer state and the activations the schedule ({}) holds): the cut whose largest stage "
             "holds least needs {} ({:.0f} bytes) there, {:.0f} bytes more",
             stages, humanBytes(options.memoryPerStage), options.memoryPerStage, options.schedule.name(),
             humanBytes(leastLargest), leastLargest, leastLargest - options.memoryPerStage);
  StagePlan plan;
  plan.firstOp.assign(count, 0);
  for (size_t s = count - 1, end = n - 1; s > 0; --s) {
    plan.firstOp[s] = from[s][end];
    end = plan.firstOp[s] - 1;
  }
  if (virtualStages) {
    const std::vector<int> processOf = processOfStage(options.schedule.orders(options.stages, options.microbatches));
    auto cost = [&](const std::vector<size_t>& firsts) -> ProcessCost {
      const auto processes = static_cast<size_t>(options.stages);
      std::vector<double> time(processes, 0), bytes(processes, 0);
      std::vector<StageMemory> held;
      if (options.memoryPerStage > 0) held = sumByStage(memory, stagesOfChain(firsts, n), inFlight);
      for (size_t s = 0; s < count; ++s) {
        const auto p = static_cast<size_t>(processOf[s]);
        // Its compute, and the transfers at its ends that leave the process (what its
        // neighbouring stage on the same process receives stays in memory).
        const size_t first = firsts[s], last = s + 1 < count ? firsts[s + 1] - 1 : n - 1;
        time[p] += prefix[last + 1] - prefix[first];
        if (s > 0 && processOf[s - 1] != processOf[s]) time[p] += transfer(first - 1);
        if (s + 1 < count && processOf[s + 1] != processOf[s]) time[p] += transfer(last);
        if (!held.empty()) bytes[p] += held[s].total();
      }
      const double fullest = *std::max_element(bytes.begin(), bytes.end());
      return {options.memoryPerStage > 0 ? std::max(0.0, fullest - options.memoryPerStage) : 0.0,
              *std::max_element(time.begin(), time.end())};
    };
    balanceProcesses(plan.firstOp, cuttable, n, cost);
    const double excess = cost(plan.firstOp).first;
    WEFT_CHECK(excess == 0,
               "no cut of the step into {} pipeline stages on {} processes was found that keeps every process within "
               "{} ({:.0f} bytes; the parameters, gradients, optimizer state and activations the schedule ({}) holds "
               "of all its stages): the closest found holds {:.0f} bytes on its fullest process, {:.0f} bytes more",
               stages, options.stages, humanBytes(options.memoryPerStage), options.memoryPerStage,
               options.schedule.name(), options.memoryPerStage + excess, excess);
  }
  for (size_t s = 0; s < count; ++s) {
    const size_t first = plan.firstOp[s], last = s + 1 < count ? plan.firstOp[s + 1] - 1 : n - 1;
    plan.ops.push_back(last - first + 1);
    plan.seconds.push_back(prefix[last + 1] - prefix[first]);
    plan.boundaryBytes.push_back(last + 1 < n ? boundary[last] : 0);
  }
  plan.memory = sumByStage(memory, stagesOfChain(plan.firstOp, n), inFlight);
  return plan;
}

void applyStages(Graph& graph, const std::vector<Output>& fetches, Node* trainStep,
                 const std::vector<size_t>& firstOp) {
  const std::vector<Node*> chain =
      Cutter(graph, static_cast<int>(firstOp.size()), fetches, trainStep, false).forwardChain();
  for (size_t s = 0; s < firstOp.size(); ++s) {
    const size_t end = s + 1 < firstOp.size() ? firstOp[s + 1] : chain.size();
    WEFT_CHECK(firstOp[s] < end && end <= chain.size(),
               "pipeline stage {} would start at forward op {} of {}: not a cut", s, firstOp[s], chain.size());
    for (size_t i = firstOp[s]; i < end; ++i) chain[i]->stage = static_cast<int>(s);
  }
}

std::vector<GradientLink> stepGradientLinks(const Graph& graph) {
  const std::map<Output, Output> moved = movedWeightGradients(graph);
  std::vector<GradientLink> links = graph.gradientLinks();
  for (GradientLink& link : links)
    if (auto it = moved.find(link.dense); link.dense.valid() && it != moved.end()) link.dense = it->second;
  return links;
}

PipelineCut cutPipeline(Graph& graph, int stages, const std::vector<Output>& fetches, Node* trainStep,
                        bool splitWeights) {
  if (splitWeights) splitRecurrentGradients(graph);
  splitFiniteChecks(graph);
  return Cutter(graph, stages, fetches, trainStep, splitWeights).run();
}

}  // namespace weft::dist
