// The distribution pass on a training graph, in one process (nothing runs): which gradients go
// through which collective, how dense gradients are bucketed, and that only the consumers after
// the backward pass (update ops, clipping) are redirected to the collectives.
#include "tests/TestUtil.h"

#include "core/OpRegistry.h"
#include "dist/collective/CollectiveOps.h"
#include "dist/Config.h"
#include "dist/server/ServerOps.h"
#include "dist/Transform.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <set>

using namespace weft;
using namespace weft::dist;

namespace {

/// A model with a sparse embedding and two dense variables, trained by SGD with clipping.
struct Model {
  Graph g;
  Output emb, w, b;
  Model() {
    const Output ids = g.placeholder("ids", i32, {4});
    emb = g.variable("emb", f32, {10, 3}, Initializer::normal(0, 1));
    w = g.variable("w", f32, {3, 2}, Initializer::normal(0, 1));
    b = g.variable("b", f32, {4, 2}, Initializer::zeros());  // same shape as y: b's gradient is dy itself
    const Output y = matmul(gather(emb, ids), w) + b;
    optim::SGD(0.1).minimize(sum(square(y)), {1.0, {}, std::nullopt});
  }
  std::vector<Node*> nodesOf(const std::string& op) const {
    std::vector<Node*> out;
    for (const auto& n : g.nodes())
      if (n->op == op) out.push_back(n.get());
    return out;
  }
  const GradientLink& linkOf(const Output& variable) const {
    for (const GradientLink& l : g.gradientLinks())
      if (l.variable == variable.node()) return l;
    FAIL("no gradient link");
    return g.gradientLinks().front();
  }
};

TransformOptions twoWorkers(size_t bucketBytes) {
  TransformOptions o;
  o.workers = 2;
  o.bucketBytes = bucketBytes;
  return o;
}

}  // namespace

TEST_CASE("the embedding's sparse gradient is gathered, the dense ones reduced in one bucket") {
  Model m;
  const DistributedGraph d = distributeAllReduce(m.g, twoWorkers(size_t{4} << 20));
  REQUIRE(d.variables.size() == 3);
  CHECK(d.buckets == 1);
  CHECK(m.nodesOf("AllGatherStart").size() == 1);
  REQUIRE(m.nodesOf("AllReduceStart").size() == 1);
  CHECK(m.nodesOf("AllReduceStart")[0]->inputs.size() == 2);
  for (const SyncedVariable& v : d.variables) {
    CAPTURE(v.variable->name);
    CHECK(v.sparse == (v.variable == m.emb.node()));
  }
  CHECK(m.nodesOf("AllReduceWait")[0]->attrs.getFloat("scale") == 0.5);
}

TEST_CASE("a small bucket size gives one AllReduce per dense gradient") {
  Model m;
  const DistributedGraph d = distributeAllReduce(m.g, twoWorkers(1));
  CHECK(d.buckets == 2);
  CHECK(m.nodesOf("AllReduceStart").size() == 2);
}

TEST_CASE("update ops and clipping read the collectives; the backward pass keeps local gradients") {
  Model m;
  const Output db = m.linkOf(m.b).dense;
  const Output dw = m.linkOf(m.w).dense;
  distributeAllReduce(m.g, twoWorkers(1));
  int backwardReadsOfDb = 0;
  for (const auto& n : m.g.nodes()) {
    for (const Output& in : n->inputs) {
      if (in != db && in != dw) continue;
      CAPTURE(n->describe());
      // What still reads a raw gradient: the collective itself, or the backward pass (dy feeds
      // w's gradient too, since b's gradient is dy).
      const bool collective = n->op == "AllReduceStart" || n->op == "AllReduceWait";
      const bool backward = n->op == "MatMul" || n->op == "Reshape" || n->op == "Transpose";
      CHECK((collective || backward));
      if (backward && in == db) ++backwardReadsOfDb;
    }
  }
  CHECK(backwardReadsOfDb > 0);  // w's gradient is still computed from this worker's dy
  const std::vector<Node*> updates = m.nodesOf("ApplySGD");
  REQUIRE(updates.size() == 2);
  for (Node* u : updates) {
    CAPTURE(u->describe());
    bool readsCollective = false;
    std::vector<const Node*> stack{u};
    while (!stack.empty() && !readsCollective) {
      const Node* n = stack.back();
      stack.pop_back();
      readsCollective = n->op == "AllReduceWait";
      for (const Output& in : n->inputs) stack.push_back(in.node());
    }
    CHECK(readsCollective);
  }
}

TEST_CASE("architecture names") {
  CHECK(parseArchitecture("ar") == Architecture::AllReduce);
  CHECK(std::string(architectureName(Architecture::Auto)) == "auto");
  CHECK(errorOf([] { parseArchitecture("ring"); }) == "unknown architecture 'ring' (expected auto, ar or ps)");
}

TEST_CASE("every op the distribution layer registers has a shape function, a CPU kernel and a gradient rule or an "
          "explicit no-gradient mark") {
  registerAllOps();
  registerCollectiveOps();
  registerServerOps();
  for (const char* op :
       {"AllReduceStart", "AllReduceWait", "AllGatherStart", "AllGatherWait", "TouchedRows", "ReduceScatterStart",
        "ReduceScatterWait", "ShardGatherStart", "ShardGatherWait", "GatherWholeStart", "GatherWholeWait", "PullRows",
        "PullVariable", "PushGradient", "ApplyRemote"}) {
    CHECK(OpRegistry::global().find(op) != nullptr);
  }
  for (const std::string& name : OpRegistry::global().names()) {
    CAPTURE(name);
    const OpDef& d = OpRegistry::global().get(name);
    CHECK(static_cast<bool>(d.inferFn));
    CHECK((d.kernelFor(DeviceType::CPU) != nullptr || d.sourceKind != SourceKind::None));
    CHECK((static_cast<bool>(d.gradFn) != d.noGrad));
  }
}

TEST_CASE(
    "with the distribution pass's ops, every registered op has a shape function, a kernel and a gradient rule or a "
    "no-gradient mark") {
  registerAllOps();
  registerCollectiveOps();
  registerServerOps();
  const OpRegistry& r = OpRegistry::global();
  // The collectives' Start/Wait pairs and TouchedRows; the servers' pulls, push and apply.
  for (const char* name :
       {"AllReduceStart", "AllReduceWait", "AllGatherStart", "AllGatherWait", "TouchedRows", "ReduceScatterStart",
        "ReduceScatterWait", "ShardGatherStart", "ShardGatherWait", "GatherWholeStart", "GatherWholeWait", "PullRows",
        "PullVariable", "PushGradient", "ApplyRemote"}) {
    CAPTURE(name);
    REQUIRE(r.find(name) != nullptr);
    // They run after the backward pass (or are its sums): no gradient flows through them.
    CHECK(r.get(name).noGrad);
  }
  for (const std::string& name : r.names()) {
    CAPTURE(name);
    const OpDef& d = r.get(name);
    CHECK(static_cast<bool>(d.inferFn));
    CHECK((d.kernelFor(DeviceType::CPU) != nullptr || d.sourceKind != SourceKind::None));
    CHECK((static_cast<bool>(d.gradFn) != d.noGrad));
  }
}

namespace {

/// Two dense variables of 15 and 5 elements trained by Adam with clipping, beside a sparse
/// embedding: what --shard optimizer (or parameters) rewrites on rank 1 of 3.
struct ShardedModel {
  Graph g;
  Output emb, w, b, loss;
  optim::Adam adam{0.1};
  Node* step = nullptr;
  explicit ShardedModel(Sharding sharding = Sharding::Optimizer, bool lossScaled = false) {
    const Output ids = g.placeholder("ids", i32, {4});
    emb = g.variable("emb", f32, {10, 3}, Initializer::normal(0, 1));
    w = g.variable("w", f32, {3, 5}, Initializer::normal(0, 1));
    b = g.variable("b", f32, {5}, Initializer::zeros());
    loss = sum(square(matmul(gather(emb, ids), w) + b));
    step = adam.minimize(loss, {1.0, {}, lossScaled ? std::optional{optim::LossScaling{}} : std::nullopt});
    TransformOptions o;
    o.workers = 3;
    o.rank = 1;
    o.shardOptimizer = true;
    o.shardParameters = sharding == Sharding::Parameters;
    distribution = distributeAllReduce(g, o);
    g.verify();
  }
  std::vector<Node*> nodesOf(const std::string& op) const {
    std::vector<Node*> out;
    for (const auto& n : g.nodes())
      if (n->op == op) out.push_back(n.get());
    return out;
  }
  const Node* updateOf(const Output& variable) const {
    for (const Node* n : nodesOf("ApplyAdam"))
      if (n->inputs[0] == variable) return n;
    return nullptr;
  }
  DistributedGraph distribution;
};

}  // namespace

TEST_CASE("--shard optimizer: rank r keeps elements [n r / N, n (r + 1) / N) of each dense variable's slots") {
  ShardedModel m;
  // w: 15 elements, rank 1 of 3 keeps [5, 10); b: 5 elements, [1, 3).
  for (const auto& [variable, offset, count, whole] :
       {std::tuple{m.w, 5, 5, Shape{3, 5}}, std::tuple{m.b, 1, 2, Shape{5}}}) {
    for (const char* slot : {"m", "v"}) {
      const Node* v = m.adam.slot(variable, slot).node();
      CAPTURE(v->name);
      REQUIRE(Graph::isShard(*v));
      CHECK(v->outputs[0].shape == Shape{count});
      CHECK(Graph::wholeShapeOf(*v) == whole);
      CHECK(Graph::shardOffsetOf(*v) == offset);
    }
    const Node* update = m.updateOf(variable);
    REQUIRE(update != nullptr);
    CHECK(update->attrs.getInt("shard_offset") == offset);
    CHECK(update->inputs[3].shape() == Shape{count});  // its gradient: the shard
  }
  // The sparse embedding is not sharded: gathered, and updated whole.
  CHECK(!Graph::isShard(*m.adam.slot(m.emb, "m").node()));
  CHECK(m.nodesOf("AllGatherStart").size() == 1);
  for (const SyncedVariable& v : m.distribution.variables) {
    CAPTURE(v.variable->name);
    CHECK(v.sharded == (v.variable != m.emb.node()));
  }
}

TEST_CASE("--shard optimizer: one reduce-scatter and one all-gather per bucket, the norms summed in one AllReduce") {
  ShardedModel m;
  REQUIRE(m.nodesOf("ReduceScatterStart").size() == 1);
  CHECK(m.nodesOf("ReduceScatterStart")[0]->inputs.size() == 2);
  const Node* wait = m.nodesOf("ReduceScatterWait").at(0);
  CHECK(wait->attrs.getFloat("scale") == doctest::Approx(1.0 / 3));
  REQUIRE(m.nodesOf("ShardGatherStart").size() == 1);
  CHECK(m.nodesOf("ShardGatherStart")[0]->inputs.size() == 2);
  CHECK(m.nodesOf("ShardGatherStart")[0]->controlInputs.size() == 2);  // after both updates
  // No dense gradient is all-reduced; clipping's squared norms of the shards are, together.
  const std::vector<Node*> sums = m.nodesOf("AllReduceStart");
  REQUIRE(sums.size() == 1);
  CHECK(sums[0]->inputs.size() == 2);
  for (const Output& in : sums[0]->inputs) {
    CHECK(in.node()->op == "SquaredNorm");
    CHECK(in.node()->inputs[0].node()->op == "ReduceScatterWait");
  }
  // The step ends once the gathered values are assigned.
  int gathered = 0;
  for (const Node* c : m.step->controlInputs) {
    if (c->op != "NoOp") continue;
    ++gathered;
    for (const Node* a : c->controlInputs) CHECK(a->op == "Assign");
  }
  CHECK(gathered == 1);
}

TEST_CASE("sharding names: --shard gradients is what optimizer does") {
  CHECK(parseSharding("optimizer") == Sharding::Optimizer);
  CHECK(parseSharding("parameters") == Sharding::Parameters);
  CHECK(std::string(shardingName(Sharding::None)) == "none");
  CHECK(std::string(shardingName(Sharding::Parameters)) == "parameters");
  CHECK(contains(errorOf([] { parseSharding("gradients"); }), "'optimizer' reduce-scatters the gradients already"));
  CHECK(errorOf([] { parseSharding("all"); }) == "unknown sharding 'all' (expected none, optimizer or parameters)");
}

namespace {

/// The shard a GatherWholeWait gathers.
Output gatheredShard(const Node* wait) { return wait->inputs[0].node()->inputs[0]; }

/// The GatherWholeWait a node reads `variable` through, or nullptr.
const Node* gatherRead(const Node* reader, const Output& variable) {
  for (const Output& in : reader->inputs) {
    if (in.node()->op == "GatherWholeWait" && gatheredShard(in.node()) == variable) return in.node();
  }
  return nullptr;
}

}  // namespace

TEST_CASE("--shard parameters: each dense variable is its rank's shard, which its update writes whole") {
  ShardedModel m(Sharding::Parameters);
  for (const auto& [variable, offset, count, whole] :
       {std::tuple{m.w, 5, 5, Shape{3, 5}}, std::tuple{m.b, 1, 2, Shape{5}}}) {
    CAPTURE(variable.name());
    REQUIRE(Graph::isShard(*variable.node()));
    CHECK(variable.shape() == Shape{count});
    CHECK(Graph::wholeShapeOf(*variable.node()) == whole);
    CHECK(Graph::shardOffsetOf(*variable.node()) == offset);
    CHECK(Graph::isShard(*m.adam.slot(variable, "m").node()));
    const Node* update = m.updateOf(variable);
    REQUIRE(update != nullptr);
    CHECK(!update->attrs.has("shard_offset"));
    CHECK(update->inputs[3].shape() == Shape{count});
  }
  // Nothing puts the whole back after the update; the embedding stays whole.
  CHECK(m.nodesOf("ShardGatherStart").empty());
  CHECK(!Graph::isShard(*m.emb.node()));
}

TEST_CASE("--shard parameters: the forward and the backward read wholes gathered for each, chained layer by layer") {
  ShardedModel m(Sharding::Parameters);
  const Node *forwardMatmul = nullptr, *forwardAdd = nullptr;
  std::vector<const Node*> backwardReadersOfW;
  for (const auto& n : m.g.nodes()) {
    for (const Output& in : n->inputs) {
      if (in.node()->op != "GatherWholeWait") continue;
      const Output shard = gatheredShard(in.node());
      CHECK(in.shape() == Graph::wholeShapeOf(*shard.node()));
      const bool backward = in.node()->name.find("/gathered_for_backward") != std::string::npos;
      CHECK(backward == (n->gradientOf != nullptr));
      if (!backward && shard == m.w) forwardMatmul = n.get();
      if (!backward && shard == m.b) forwardAdd = n.get();
      if (backward) {
        CHECK(shard == m.w);  // the bias's gradient reduces to its shape without gathering it
        backwardReadersOfW.push_back(n.get());
      }
    }
  }
  REQUIRE(forwardMatmul != nullptr);
  REQUIRE(forwardAdd != nullptr);
  CHECK(m.g.find("gradients/Add/ReduceToLike")->op == "Reshape");
  CHECK(!backwardReadersOfW.empty());
  // Nothing reads a shard but its gather and its update.
  for (const Output& shard : {m.w, m.b}) {
    for (const auto& n : m.g.nodes()) {
      const bool reads = std::find(n->inputs.begin(), n->inputs.end(), shard) != n->inputs.end();
      CHECK((!reads || n->op == "GatherWholeStart" || n->op == "ApplyAdam"));
    }
  }
  const Node* forwardW = gatherRead(forwardMatmul, m.w);
  const Node* forwardB = gatherRead(forwardAdd, m.b);
  const Node* backwardW = gatherRead(backwardReadersOfW[0], m.w);
  REQUIRE(forwardW != nullptr);
  REQUIRE(forwardB != nullptr);
  REQUIRE(backwardW != nullptr);
  for (const Node* reader : backwardReadersOfW) CHECK(gatherRead(reader, m.w) == backwardW);
  // The forward's first gather starts at once; the bias's as the matmul that reads w runs; the
  // backward's first once the forward's last reader of a parameter (the add) ran.
  const Node* startW = forwardW->inputs[0].node();
  const Node* startB = forwardB->inputs[0].node();
  const Node* startBackwardW = backwardW->inputs[0].node();
  CHECK(startW->controlInputs.empty());
  CHECK(startB->controlInputs == std::vector<Node*>{const_cast<Node*>(forwardMatmul)});
  CHECK(startBackwardW->controlInputs == std::vector<Node*>{const_cast<Node*>(forwardAdd)});
}

TEST_CASE("--shard parameters: a step's plan holds a few layers' gathered wholes, not the model") {
  // Eight layers of 1 MiB weights on a batch of 2: the plan's values are almost all wholes.
  constexpr int kLayers = 8;
  constexpr int64_t kWidth = 512;
  constexpr size_t kLayerBytes = kWidth * kWidth * 4;
  Graph g;
  const Output x = g.placeholder("x", f32, {2, kWidth});
  Output h = x;
  for (int l = 0; l < kLayers; ++l)
    h = tanh(matmul(h, g.variable(fmt::format("w{}", l), f32, {kWidth, kWidth}, Initializer::glorotUniform())));
  const Output loss = sum(square(h));
  Node* step = optim::Momentum(0.1, 0.9).minimize(loss);
  TransformOptions o;
  o.workers = 2;
  o.shardOptimizer = true;
  o.shardParameters = true;
  o.bucketBytes = kLayerBytes;  // a bucket's gradients wait whole until it is full
  distributeAllReduce(g, o);
  g.verify();
  Session session(g);
  const PlanStats stats = session.planStats({loss}, {{x, Tensor::zeros(f32, {2, kWidth})}}, {step});
  CAPTURE(stats.arenaBytes);
  // A layer's backward holds its weights whole beside their whole gradient: two layers' worth
  // and the small activations, where a forward whole kept for the backward would hold all eight.
  CHECK(stats.arenaBytes >= 2 * kLayerBytes);
  CHECK(stats.arenaBytes <= 3 * kLayerBytes);
}

TEST_CASE("--shard parameters: a reader that writes a sharded parameter is refused, naming it") {
  Graph g;
  const Output w = g.variable("w", f32, {3, 5}, Initializer::normal(0, 1));
  const Output x = g.placeholder("x", f32, {4, 3});
  optim::Adam(0.1).minimize(sum(square(matmul(x, w))));
  assign(w, zerosLike(w));
  TransformOptions o;
  o.workers = 2;
  o.shardOptimizer = true;
  o.shardParameters = true;
  CHECK(contains(errorOf([&] { distributeAllReduce(g, o); }),
                 "variable 'w' cannot have its parameters sharded: op 'Assign'"));
}

TEST_CASE("--shard: loss scaling's finite check runs on each worker's shards, summed with the norms") {
  for (const Sharding sharding : {Sharding::Optimizer, Sharding::Parameters}) {
    CAPTURE(std::string(shardingName(sharding)));
    ShardedModel m(sharding, true);
    // The updates still run on the check the loss scale named, which now reads the sum over the
    // workers of the logarithm of each worker's own check.
    const Node* update = m.updateOf(m.w);
    REQUIRE(update != nullptr);
    const Node* check = update->condition.node();
    REQUIRE(check->op == "AllFinite");
    REQUIRE(check->inputs.size() == 1);
    const Node* summed = check->inputs[0].node();
    CHECK(summed->op == "AllReduceWait");
    // One AllReduce: the two squared norms and the logarithm of this worker's check.
    const std::vector<Node*> sums = m.nodesOf("AllReduceStart");
    REQUIRE(sums.size() == 1);
    std::multiset<std::string> summedOps;
    const Node* local = nullptr;
    for (const Output& in : sums[0]->inputs) {
      summedOps.insert(in.node()->op);
      if (in.node()->op == "Log") local = in.node()->inputs[0].node();
    }
    CHECK(summedOps == std::multiset<std::string>{"Log", "SquaredNorm", "SquaredNorm"});
    REQUIRE(local != nullptr);
    CHECK(local->op == "AllFinite");
    // This worker's check reads its shards of w (15 elements, [5, 10)) and b (5, [1, 3)), unscaled,
    // and the embedding's gradient rows gathered from the 3 workers (4 rows of 3 each), not sharded.
    std::multiset<int64_t> checked;
    for (const Output& in : local->inputs) checked.insert(in.shape().numel());
    CHECK(checked == std::multiset<int64_t>{2, 5, 3 * 4 * 3});
  }
}

TEST_CASE("--shard optimizer refuses a variable whose unscaled gradient something besides its update reads") {
  // Only clipping's norm and loss scaling's check run on shards: any other reader of the values
  // between the gradient and the update would need them whole.
  Graph g;
  const Output w = g.variable("w", f32, {3, 5}, Initializer::normal(0, 1));
  const Output x = g.placeholder("x", f32, {4, 3});
  optim::Adam adam(0.1);
  const std::vector<Grad> grads = gradients(sum(square(matmul(x, w))), {w});
  const Output halved = grads[0].dense * 0.5;
  adam.applyGradients({{Grad(halved), w}});
  [[maybe_unused]] const Output watched = sum(halved);
  TransformOptions o;
  o.workers = 2;
  o.shardOptimizer = true;
  const std::string error = errorOf([&] { distributeAllReduce(g, o); });
  CHECK(contains(error, "variable 'w' cannot be sharded: "));
  CHECK(contains(error, "which exists only as shards"));
}
