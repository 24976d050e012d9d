// The distribution pass (see the header).
#include "dist/Transform.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "dist/collective/CollectiveOps.h"
#include "dist/Placement.h"
#include "dist/server/ServerOps.h"
#include "ops/Ops.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

namespace weft::dist {

namespace {

/// Every node the gradient outputs depend on, themselves included: the backward pass.
std::unordered_set<const Node*> backwardNodes(const std::vector<GradientLink>& links) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const GradientLink& l : links) {
    for (const Output& o : {l.dense, l.indices, l.values})
      if (o.valid()) stack.push_back(o.node());
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const Output& in : n->inputs) stack.push_back(in.node());
    for (const Node* c : n->controlInputs) stack.push_back(c);
  }
  return seen;
}

/// Under loss scaling, the nodes the pass added that read the scaled backward pass (the sums of
/// its gradients, their shards, the checks on them) may hold an overflow the step skips, as the
/// pass's own nodes may: Session::checkNumerics leaves them to the skip as well.
void leaveAddedToLossScaling(Graph& graph, size_t firstAdded) {
  const std::vector<Node*>& scaled = graph.collection(kLossScaledCollection);
  if (scaled.empty()) return;
  std::set<const Node*> within(scaled.begin(), scaled.end());
  for (Node* n : graph.topologicalOrder()) {
    if (static_cast<size_t>(n->id) < firstAdded || within.count(n)) continue;
    if (std::none_of(n->inputs.begin(), n->inputs.end(), [&](const Output& in) { return within.count(in.node()); }))
      continue;
    graph.addToCollection(kLossScaledCollection, n);
    within.insert(n);
  }
}

/// Redirects `from` to `to` in every node that consumes it after the backward pass.
class Rewirer {
 public:
  Rewirer(Graph& graph, const std::vector<GradientLink>& links) : backward_(backwardNodes(links)) {
    for (const auto& n : graph.nodes())
      if (!backward_.count(n.get())) after_.push_back(n.get());
  }
  /// Whether anything after the backward pass consumes `o`.
  bool consumed(const Output& o) const {
    return std::any_of(after_.begin(), after_.end(), [&](const Node* n) {
      return std::find(n->inputs.begin(), n->inputs.end(), o) != n->inputs.end();
    });
  }
  void redirect(const std::vector<std::pair<Output, Output>>& replacements) {
    replacements.at(0).first.graph().replaceUses(replacements, after_);
  }

 private:
  std::unordered_set<const Node*> backward_;
  std::vector<Node*> after_;  // taken before any collective exists, so those are never redirected
};

size_t byteSize(const Output& o) {
  const int64_t n = o.shape().numel();
  WEFT_CHECK(n >= 0, "the gradient {} has shape {}: a dense gradient needs a static shape to be bucketed",
             o.name(), o.shape().str());
  return static_cast<size_t>(n) * dtypeSize(o.dtype());
}

/// A sparse gradient summed by a dense AllReduce, for a sparse variable whose pushes touch so
/// many of its rows that the dense sum moves fewer bytes (see chooseBySparsity). Each row's count
/// of ids is summed beside it, and the sparse update still receives sparse rows: exactly the rows
/// some worker touched, as one process's update would (lazy optimizers decay only those).
std::pair<Output, Output> allReduceRows(const GradientLink& l, const TransformOptions& options, double scale) {
  Graph& g = l.indices.graph();
  auto scope = g.scope(l.variable->name + "/allreduced_rows");
  const int64_t rows = l.variable->output().shape()[0];
  const Output counts = unsortedSegmentSum(onesLike(cast(l.indices, l.values.dtype())), l.indices, rows);
  const std::vector<Output> summed =
      allReduce({unsortedSegmentSum(l.values, l.indices, rows), counts}, options.hostRing, scale);
  return touchedRows(summed[0], summed[1], l.indices.dtype());
}

/// The ZeRO rewrite of the dense variables distributeAllReduce shards (see the header).
class OptimizerSharding {
 public:
  OptimizerSharding(Graph& graph, const TransformOptions& options, const std::vector<const GradientLink*>& dense)
      : graph_(graph), options_(options) {
    if (!options.shardOptimizer) return;
    std::vector<GradientLink> links;
    for (const GradientLink* l : dense) links.push_back(*l);
    std::map<const Node*, std::vector<const Node*>> readers;
    for (const auto& n : graph.nodes())
      for (const Output& in : n->inputs) readers[in.node()].push_back(n.get());
    for (ServedVariable& u : describeUpdates(graph, links, "sharded")) {
      checkShardable(u, readers);
      updates_.emplace(u.variable, std::move(u));
    }
    if (options.shardParameters) gatherBeforeReaders(links, dense, readers);
  }

  bool covers(const Node* variable) const { return updates_.count(variable) != 0; }

  /// The group whose buckets and sums `variable`'s gradient travels in (TransformOptions::shardGroups).
  int groupOf(const Node* variable) const {
    const auto it = options_.shardGroups.find(variable);
    return it == options_.shardGroups.end() ? 0 : it->second;
  }

  /// Reduce-scatters one bucket of gradients and turns its variables' updates onto their shards.
  void shardBucket(const std::vector<const GradientLink*>& bucket, double scale) {
    std::vector<Output> grads;
    for (const GradientLink* l : bucket) grads.push_back(l->dense);
    const std::vector<Output> shards = reduceScatter(grads, options_.hostRing, options_.rank, options_.workers, scale);
    std::vector<Output> variables;
    std::vector<Node*> updates;
    for (size_t i = 0; i < bucket.size(); ++i) {
      const ServedVariable& u = updates_.at(bucket[i]->variable);
      shardUpdate(u, shards[i]);
      variables.push_back(u.variable->output());
      updates.push_back(u.update);
    }
    // Sharded parameters stay sharded: their readers gather them (gatherBeforeReaders).
    if (options_.shardParameters) return;
    // What ran after the updates runs once every shard is back in place.
    Node* gathered = graph_.group({}, bucket.front()->variable->name + "/shards_gathered");
    for (Node* u : updates) graph_.replaceControlInputs(u, gathered);
    for (Node* a : gatherShards(variables, updates, options_.hostRing, options_.rank, options_.workers))
      graph_.addControlInput(gathered, a);
  }

  /// What reads the whole gradients runs on each worker's shards, and its results are summed
  /// over the workers, all in one AllReduce per dtype. Clipping's squared norm of a whole
  /// gradient is the sum of its shards' norms. Loss scaling's check that every gradient is
  /// finite becomes each worker's check of its shards (and of the gradients not sharded, the same
  /// on every worker): the logarithm of its answer, 0 or -inf, summed over the workers is finite
  /// only where every worker's check passed, so the workers skip a step together.
  void sumChecks() {
    for (const auto& [check, group] : checks_) {
      std::vector<Output> inputs;
      for (const Output& in : check->inputs) {
        auto shard = onShard_.find(in);
        inputs.push_back(shard == onShard_.end() ? in : shard->second);
      }
      auto placed = graph_.onDevice(check->device);
      const Output local = graph_.addNode(check->op, inputs, check->attrs, check->name + "/shard")->output();
      norms_.push_back({check->output(), check->op == "AllFinite" ? log(local) : local, group});
    }
    std::map<std::pair<int, DType>, std::vector<std::pair<Output, Output>>> byGroup;
    for (const auto& [whole, shard, group] : norms_) byGroup[{group, shard.dtype()}].push_back({whole, shard});
    for (const auto& [key, pairs] : byGroup) {
      std::vector<Output> shards;
      for (const auto& p : pairs) shards.push_back(p.second);
      const std::vector<Output> sums = allReduce(shards, options_.hostRing, 1.0);
      for (size_t i = 0; i < pairs.size(); ++i) {
        Node* whole = pairs[i].first.node();
        // The check stays the node the updates' run condition names.
        if (whole->op == "AllFinite")
          graph_.rebuild(whole, whole->op, {sums[i]}, whole->attrs);
        else
          graph_.replaceUses(pairs[i].first, sums[i]);
      }
    }
  }

 private:
  /// The chain from the gradient to the update must work element by element on what it computes
  /// from the gradient, with scalars beside it (clipping's factor, casts), to run on a shard; and
  /// nothing outside it may read what it computes, which exists only as shards, besides the
  /// checks that sumChecks runs on shards (a squared norm, loss scaling's AllFinite).
  void checkShardable(const ServedVariable& u, const std::map<const Node*, std::vector<const Node*>>& readers) {
    const std::set<const Node*> chain(u.chain.begin(), u.chain.end());
    std::set<Output> fromGradient{u.gradient.dense};
    const Shape& shape = u.variable->outputs[0].shape;
    for (Node* n : u.chain) {
      if (n == u.update) continue;
      for (const Output& in : n->inputs) {
        const bool scalar = in.shape().isFullyDefined() && in.shape().numel() == 1;
        WEFT_CHECK(scalar || fromGradient.count(in),
                   "variable '{}' cannot be sharded: {} reads {} of shape {} on the way from its gradient to its "
                   "update, neither a scalar nor computed from the gradient",
                   u.variable->name, n->describe(), in.name(), in.shape().str());
      }
      for (size_t k = 0; k < n->outputs.size(); ++k) {
        WEFT_CHECK(n->outputs[k].shape == shape,
                   "variable '{}' cannot be sharded: {} turns its gradient into shape {}, not the variable's {}",
                   u.variable->name, n->describe(), n->outputs[k].shape.str(), shape.str());
        fromGradient.insert(n->output(static_cast<int>(k)));
      }
      const auto read = readers.find(n);
      if (read == readers.end()) continue;
      for (const Node* reader : read->second) {
        if (chain.count(reader)) continue;
        WEFT_CHECK(reader->op == "SquaredNorm" || reader->op == "AllFinite",
                   "variable '{}' cannot be sharded: {} reads {}, which exists only as shards on the way from its "
                   "gradient to its update",
                   u.variable->name, reader->describe(), n->describe());
        const int group = groupOf(u.variable);
        const auto [check, added] = checks_.emplace(const_cast<Node*>(reader), group);
        WEFT_CHECK(added || check->second == group,
                   "{} checks gradients of pipeline stages {} and {} at once: sharded over each stage's replicas, "
                   "they cannot be summed together",
                   reader->describe(), check->second, group);
      }
    }
  }

  /// Copies the chain onto `gradientShard`, shards the slots and points the update at them.
  void shardUpdate(const ServedVariable& u, Output gradientShard) {
    const ShardRange range = shardOf(Graph::wholeShapeOf(*u.variable).numel(), options_.rank, options_.workers);
    onShard_.emplace(u.gradient.dense, gradientShard);
    auto mapped = [&](const Output& in) {
      auto it = onShard_.find(in);
      return it == onShard_.end() ? in : it->second;
    };
    for (Node* n : u.chain) {
      if (n == u.update) continue;
      std::vector<Output> inputs;
      for (const Output& in : n->inputs) inputs.push_back(mapped(in));
      auto placed = graph_.onDevice(n->device);
      Node* copy = graph_.addNode(n->op, inputs, n->attrs, n->name + "/shard");
      for (size_t k = 0; k < n->outputs.size(); ++k)
        onShard_[n->output(static_cast<int>(k))] = copy->output(static_cast<int>(k));
    }
    if (u.squaredNorm != nullptr) {
      Node* norm = graph_.addNode(u.squaredNorm->op, {gradientShard}, u.squaredNorm->attrs,
                                  u.squaredNorm->name + "/shard");
      norms_.push_back({u.squaredNorm->output(), norm->output(), groupOf(u.variable)});
    }
    for (Node* slot : u.slots) graph_.shardVariable(slot, range.offset, range.count);
    std::vector<Output> inputs;
    for (const Output& in : u.update->inputs) inputs.push_back(mapped(in));
    Attrs attrs = u.update->attrs;
    // A sharded parameter is its shard: the update writes all of it.
    if (!options_.shardParameters) attrs.set("shard_offset", range.offset);
    graph_.rebuild(u.update, u.update->op, inputs, attrs);
  }

  /// Who reads a sharded parameter's whole value. Each class has gathers of its own, so that the
  /// forward's wholes are freed before the backward gathers them again, and a run outside the
  /// training step (an evaluation) gathers without waiting for the step's ops.
  enum class ReaderClass { Forward, Backward, Other };

  /// A variable's readers of one class, in graph order.
  struct Reads {
    Node* variable = nullptr;
    std::vector<Node*> readers;
  };
  using ReadsByClass = std::map<ReaderClass, std::vector<Reads>>;
  /// Where each variable's gather of a class waits: (class, the node it runs after, its readers).
  using Gathers = std::map<const Node*, std::vector<std::tuple<ReaderClass, Node*, const Reads*>>>;

  /// ZeRO stage 3: each covered variable becomes its rank's shard, and every reader besides its
  /// update reads a whole gathered for its class (chainGathers says when each starts).
  void gatherBeforeReaders(const std::vector<GradientLink>& links, const std::vector<const GradientLink*>& dense,
                           const std::map<const Node*, std::vector<const Node*>>& readers) {
    const std::vector<Node*> order = graph_.topologicalOrder();
    std::map<const Node*, size_t> position;
    for (Node* n : order) position.emplace(n, position.size());
    ReadsByClass byClass = classifyReaders(links, dense, readers, order, position);
    const Gathers gathers = chainGathers(byClass, position);
    // One variable at a time, so that a reader of several (a batch norm's scale and offset) is
    // re-inferred with each of its inputs whole or not yet sharded.
    for (const GradientLink* l : dense) {
      Node* v = updates_.at(l->variable).variable;
      const ShardRange range = shardOf(v->outputs[0].shape.numel(), options_.rank, options_.workers);
      graph_.shardVariable(v, range.offset, range.count);
      const auto found = gathers.find(v);
      if (found == gathers.end()) continue;
      for (const auto& [c, after, reads] : found->second) {
        auto scope = graph_.scope(v->name + (c == ReaderClass::Backward  ? "/gathered_for_backward"
                                             : c == ReaderClass::Forward ? "/gathered_for_forward"
                                                                         : "/gathered"));
        const Output gathered = gatherWhole(v->output(), Graph::wholeShapeOf(*v), after, options_.hostRing,
                                            options_.rank, options_.workers);
        graph_.replaceUses(v->output(), gathered, reads->readers);
      }
    }
  }

  /// Sorts each covered variable's readers (but its update chain) into the three classes: the
  /// backward (autodiff's nodes and whatever reads what they compute), the forward (whatever else
  /// the gradients depend on), the rest.
  ReadsByClass classifyReaders(const std::vector<GradientLink>& links, const std::vector<const GradientLink*>& dense,
                               const std::map<const Node*, std::vector<const Node*>>& readers,
                               const std::vector<Node*>& order, const std::map<const Node*, size_t>& position) {
    const std::unordered_set<const Node*> step = backwardNodes(links);
    std::unordered_set<const Node*> backward;
    for (const Node* n : order) {
      bool fromGradient = n->gradientOf != nullptr;
      for (const Output& in : n->inputs) fromGradient = fromGradient || backward.count(in.node());
      if (fromGradient) backward.insert(n);
    }
    ReadsByClass byClass;
    for (const GradientLink* l : dense) {
      const ServedVariable& u = updates_.at(l->variable);
      std::set<const Node*> own(u.chain.begin(), u.chain.end());
      own.insert(u.averages.begin(), u.averages.end());
      std::map<ReaderClass, std::vector<Node*>> reads;
      const auto found = readers.find(u.variable);
      for (const Node* r : found == readers.end() ? std::vector<const Node*>{} : found->second) {
        if (own.count(r)) continue;
        Node* reader = graph_.node(r->id);
        checkOnlyReads(u, *reader);
        if (reduceWithoutGather(reader, u.variable->output())) continue;
        const ReaderClass c = backward.count(r) ? ReaderClass::Backward
                              : step.count(r)   ? ReaderClass::Forward
                                                : ReaderClass::Other;
        std::vector<Node*>& list = reads[c];
        if (std::find(list.begin(), list.end(), reader) == list.end()) list.push_back(reader);
      }
      for (auto& [c, list] : reads) {
        std::sort(list.begin(), list.end(), [&](Node* a, Node* b) { return position.at(a) < position.at(b); });
        byClass[c].push_back({u.variable, std::move(list)});
      }
    }
    return byClass;
  }

  /// Chains the gathers of each class in the order their first readers take: a variable's
  /// gather starts as the first reader of the variable before it runs, so it overlaps that
  /// layer's compute and about two layers' wholes of a class exist at once. Variables with one
  /// first reader (a batch norm's scale and offset) start together; the backward's first gather
  /// waits for the forward's last reader.
  static Gathers chainGathers(ReadsByClass& byClass, const std::map<const Node*, size_t>& position) {
    Node* lastForwardReader = nullptr;
    for (const Reads& r : byClass[ReaderClass::Forward])
      if (lastForwardReader == nullptr || position.at(r.readers.back()) > position.at(lastForwardReader))
        lastForwardReader = r.readers.back();
    Gathers gathers;
    for (auto& [c, reads] : byClass) {
      std::stable_sort(reads.begin(), reads.end(), [&](const Reads& a, const Reads& b) {
        return position.at(a.readers.front()) < position.at(b.readers.front());
      });
      Node* after = c == ReaderClass::Backward ? lastForwardReader : nullptr;
      Node* previousFirst = after;
      for (const Reads& r : reads) {
        if (r.readers.front() != previousFirst) after = previousFirst;
        gathers[r.variable].emplace_back(c, after, &r);
        previousFirst = r.readers.front();
      }
    }
    return gathers;
  }

  /// A reader that needs only the variable's shape (the gradient of an add that broadcast a bias
  /// reduces to the bias's shape) reduces to that shape, known statically, gathering nothing.
  bool reduceWithoutGather(Node* reader, const Output& variable) {
    if (reader->op != "ReduceToLike" || reader->inputs[1] != variable || reader->inputs[0] == variable) return false;
    const Shape& whole = variable.shape();
    const Output x = reader->inputs[0];
    std::vector<int64_t> axes;  // the leading axes, and those the variable broadcast from 1
    const int lead = x.rank() - whole.rank();
    for (int i = 0; i < x.rank(); ++i)
      if (i < lead || whole[i - lead] == 1) axes.push_back(i);
    auto placed = graph_.onDevice(reader->device);
    auto scope = graph_.scope(reader->name + "/to_shape");
    const Output reduced = axes.empty() ? x : sum(x, axes, true);
    graph_.rebuild(reader, "Reshape", {reduced}, {{"shape", whole.dims()}});
    return true;
  }

  /// A sharded parameter's readers read a gathered copy: one that wrote it would write the copy.
  static void checkOnlyReads(const ServedVariable& u, const Node& reader) {
    for (int i : reader.def->mutatedInputs)
      WEFT_CHECK(reader.inputs.at(static_cast<size_t>(i)) != u.variable->output(),
                 "variable '{}' cannot have its parameters sharded: {} writes it besides its optimizer update",
                 u.variable->name, reader.describe());
  }

  Graph& graph_;
  const TransformOptions& options_;
  std::map<const Node*, ServedVariable> updates_;
  /// A whole gradient's check, what a worker sums of it, and the group it is summed with.
  std::vector<std::tuple<Output, Output, int>> norms_;
  std::map<Output, Output> onShard_;              // a value of an update's chain, its shard's
  struct ById {
    bool operator()(const Node* a, const Node* b) const { return a->id < b->id; }
  };
  std::map<Node*, int, ById> checks_;  // what reads chain values besides the chains (run on shards): its group
};

}  // namespace

// A batch norm fused with its ReLU (ops/Fusion.h) normalises from the summed moments with the
// ReLU applied ("relu"), and its gradient op's ReLU mask is applied to dy before the moments.
int synchronizeBatchNorm(Graph& graph, int64_t hostRing) {
  std::vector<Node*> forward, backward;
  for (const auto& n : graph.nodes()) {
    if (n->op == "BatchNormTrain" || n->op == "BatchNormReluTrain") forward.push_back(n.get());
    if (n->op == "BatchNormGrad" || n->op == "BatchNormReluGrad") backward.push_back(n.get());
  }
  std::map<Output, Output> totalMomentsOf;  // a replacement's invstd output -> its summed moments
  for (Node* n : forward) {
    auto scope = graph.scope(n->name + "/synchronized");
    const Output x = n->inputs[0];
    const Output total = allReduce({batchNormMoments(x)}, hostRing, 1.0)[0];
    Attrs attrs = n->attrs;
    attrs.set("relu", n->op == "BatchNormReluTrain");
    Node* replacement = graph.addNode("BatchNormFromMoments", {x, n->inputs[1], n->inputs[2], total}, attrs);
    for (int i = 0; i < 4; ++i) graph.replaceUses(n->output(i), replacement->output(i));
    totalMomentsOf[replacement->output(3)] = total;
  }
  for (Node* n : backward) {
    auto scope = graph.scope(n->name + "/synchronized");
    const auto moments = totalMomentsOf.find(n->inputs[4]);  // invstd of its forward op
    WEFT_CHECK(moments != totalMomentsOf.end(), "{} does not read the statistics of a BatchNormTrain", n->describe());
    const bool relu = n->op == "BatchNormReluGrad";
    const Output dy = relu ? graph.addNode("ReluGrad", {n->inputs[0], n->inputs[5]})->output(0) : n->inputs[0];
    const auto statGrads = n->inputs.begin() + (relu ? 6 : 5);  // dmean, dvar when given
    std::vector<Output> gradInputs{dy, n->inputs[1], n->inputs[3], n->inputs[4]};
    gradInputs.insert(gradInputs.end(), statGrads, n->inputs.end());
    const Output local = graph.addNode("BatchNormGradMoments", gradInputs)->output(0);
    const Output total = allReduce({local}, hostRing, 1.0)[0];
    Node* replacement = graph.addNode("BatchNormGradFromMoments", {dy, n->inputs[1], n->inputs[2], n->inputs[3],
                                                                    n->inputs[4], local, total, moments->second});
    for (int i = 0; i < 3; ++i) graph.replaceUses(n->output(i), replacement->output(i));
  }
  return static_cast<int>(forward.size());
}

/// Sorts gradient links in the order the backward pass produces them (the graph's topological order).
void sortInBackwardOrder(const Graph& graph, std::vector<const GradientLink*>& links) {
  std::map<const Node*, size_t> position;
  for (const Node* n : graph.topologicalOrder()) position.emplace(n, position.size());
  std::stable_sort(links.begin(), links.end(), [&](const GradientLink* a, const GradientLink* b) {
    return position.at(a->dense.node()) < position.at(b->dense.node());
  });
}

/// Cuts `dense` (in backward order) into buckets of about `bytes`, with an open bucket per key
/// (`keyOf`), and hands each to `flush` with its key.
template <class Key, class KeyOf, class Flush>
void forEachBucket(const std::vector<const GradientLink*>& dense, size_t bytes, KeyOf keyOf, Flush flush) {
  std::map<Key, std::vector<const GradientLink*>> open;
  std::map<Key, size_t> openBytes;
  for (const GradientLink* l : dense) {
    const Key key = keyOf(*l);
    open[key].push_back(l);
    openBytes[key] += byteSize(l->dense);
    if (openBytes[key] < bytes) continue;
    flush(key, open[key]);
    open[key].clear();
    openBytes[key] = 0;
  }
  for (const auto& [key, bucket] : open)
    if (!bucket.empty()) flush(key, bucket);
}

DistributedGraph distributeAllReduce(Graph& graph, const TransformOptions& options) {
  const size_t firstAdded = graph.size();
  const std::vector<GradientLink> links = graph.gradientLinks();
  Rewirer rewirer(graph, links);
  DistributedGraph result;
  const double denseScale = options.averageDense ? 1.0 / options.workers : 1.0;
  const double sparseScale = options.averageSparse ? 1.0 / options.workers : 1.0;

  std::vector<const GradientLink*> dense;
  for (const GradientLink& l : links) {
    if (std::find(options.served.begin(), options.served.end(), l.variable) != options.served.end()) continue;
    if (l.sparse && std::find(options.allReducedSparse.begin(), options.allReducedSparse.end(), l.variable) !=
                        options.allReducedSparse.end()) {
      if (!rewirer.consumed(l.indices) && !rewirer.consumed(l.values)) continue;
      auto [indices, values] = allReduceRows(l, options, sparseScale);
      rewirer.redirect({{l.indices, indices}, {l.values, values}});
      result.variables.push_back({l.variable, false, byteSize(l.variable->output()), -1});
    } else if (l.sparse) {
      if (!rewirer.consumed(l.indices) && !rewirer.consumed(l.values)) continue;
      auto [indices, values] =
          allGatherRows(l.indices, l.values, options.hostRing, options.workers, sparseScale, l.variable->name,
                        l.variable->output().shape()[0]);
      rewirer.redirect({{l.indices, indices}, {l.values, values}});
      result.variables.push_back({l.variable, true, byteSize(l.variable->output()), -1});
    } else if (rewirer.consumed(l.dense)) {
      dense.push_back(&l);
    }
  }
  sortInBackwardOrder(graph, dense);
  OptimizerSharding sharding(graph, options, dense);
  // One bucket per dtype and kind of device: a gradient on a GPU sums through the dense backend
  // there when it is the GPU workers' NCCL group, any other through the host's ring.
  using BucketKey = std::tuple<DType, bool, bool>;  // dtype, summed on the GPU, sharded
  auto keyOf = [&](const GradientLink& l) {
    const bool onGpu = options.denseOnGpu && l.dense.node()->device.rfind("cuda", 0) == 0;
    return BucketKey{l.dense.dtype(), onGpu, sharding.covers(l.variable)};
  };
  forEachBucket<BucketKey>(dense, options.bucketBytes, keyOf, [&](const BucketKey& key, const auto& bucket) {
    const auto& [dtype, onGpu, sharded] = key;
    if (sharded) {
      sharding.shardBucket(bucket, denseScale);
    } else {
      std::vector<Output> grads;
      for (const GradientLink* l : bucket) grads.push_back(l->dense);
      const std::vector<Output> reduced =
          allReduce(grads, onGpu ? options.denseBackend : options.hostRing, denseScale, onGpu,
                    onGpu || dtype != DType::F32 ? dtype : options.wireDType);
      for (size_t i = 0; i < bucket.size(); ++i) rewirer.redirect({{bucket[i]->dense, reduced[i]}});
    }
    for (const GradientLink* l : bucket)
      result.variables.push_back({l->variable, false, byteSize(l->dense), result.buckets, false, sharded});
    ++result.buckets;
  });
  sharding.sumChecks();
  leaveAddedToLossScaling(graph, firstAdded);
  return result;
}

DistributedGraph shardOverReplicas(Graph& graph, const std::vector<GradientLink>& links,
                                   const TransformOptions& options) {
  const size_t firstAdded = graph.size();
  const Rewirer rewirer(graph, links);
  std::vector<const GradientLink*> dense;
  for (const GradientLink& l : links)
    if (!l.sparse && options.shardGroups.count(l.variable) && rewirer.consumed(l.dense)) dense.push_back(&l);
  sortInBackwardOrder(graph, dense);
  TransformOptions sharded = options;
  sharded.shardOptimizer = true;
  sharded.shardParameters = false;
  OptimizerSharding sharding(graph, sharded, dense);
  DistributedGraph result;
  using BucketKey = std::pair<int, DType>;  // the group (a pipeline stage), dtype
  auto keyOf = [&](const GradientLink& l) { return BucketKey{sharding.groupOf(l.variable), l.dense.dtype()}; };
  forEachBucket<BucketKey>(dense, options.bucketBytes, keyOf, [&](const BucketKey&, const auto& bucket) {
    sharding.shardBucket(bucket, 1.0 / options.workers);
    for (const GradientLink* l : bucket)
      result.variables.push_back({l->variable, false, byteSize(l->dense), result.buckets, false, true});
    ++result.buckets;
  });
  sharding.sumChecks();
  leaveAddedToLossScaling(graph, firstAdded);
  return result;
}

namespace {

/// Points every reader of the served variable at the servers' value: lookups pull their rows,
/// anything else reads one pull of the whole variable. The update chain, the moving averages the
/// servers run and ops that write the variable are left alone.
void redirectReads(Graph& graph, const ServedVariable& v, int64_t client, int index) {
  const Output value = v.variable->output();
  Output pulled;
  const size_t existing = graph.size();  // the pull created below is not a reader to redirect
  for (size_t id = 0; id < existing; ++id) {
    Node* n = graph.node(static_cast<int>(id));
    if (std::find(v.chain.begin(), v.chain.end(), n) != v.chain.end()) continue;
    if (std::find(v.averages.begin(), v.averages.end(), n) != v.averages.end()) continue;
    for (size_t j = 0; j < n->inputs.size(); ++j) {
      if (n->inputs[j] != value) continue;
      const std::vector<int>& written = n->def->mutatedInputs;
      if (std::find(written.begin(), written.end(), static_cast<int>(j)) != written.end()) continue;
      if (n->op == "Gather" && j == 0) {
        turnIntoPull(n, client, index);
        break;
      }
      if (!pulled.valid()) pulled = pullVariable(value, client, index);
      graph.setInput(n, static_cast<int>(j), pulled);
    }
  }
}

}  // namespace

void distributeParameterServers(Graph& graph, const ServerPlan& plan, int64_t client) {
  for (size_t i = 0; i < plan.variables.size(); ++i) {
    const ServedVariable& v = plan.variables[i];
    const int index = static_cast<int>(i);
    redirectReads(graph, v, client, index);
    Node* push = v.squaredNorm;
    if (push != nullptr) {
      turnIntoPush(push, client, index);
    } else {
      push = pushGradient(v.sparse ? std::vector<Output>{v.gradient.indices, v.gradient.values}
                                   : std::vector<Output>{v.gradient.dense},
                          client, index);
    }
    Node* apply = applyRemote(graph, v.extras, client, index);
    graph.addControlInput(apply, push);
    graph.replaceControlInputs(v.update, apply);
    // The servers average the variable after their update: the worker's own average op drops
    // out, and what ran after it runs after the update and after what the average waited for.
    for (Node* average : v.averages) {
      std::vector<Node*> dependents;
      for (const auto& n : graph.nodes())
        if (std::find(n->controlInputs.begin(), n->controlInputs.end(), average) != n->controlInputs.end())
          dependents.push_back(n.get());
      graph.replaceControlInputs(average, apply);
      for (Node* n : dependents)
        for (Node* before : average->controlInputs) graph.addControlInput(n, before);
    }
  }
}

std::vector<GraphPass> dataParallelPasses(const TransformOptions& options, const ServerPlan& plan, int64_t client) {
  TransformOptions allReduced = options;
  for (const ServedVariable& v : plan.variables) allReduced.served.push_back(v.variable);
  std::vector<GraphPass> passes;
  passes.push_back(
      {"AllReduce", [allReduced](Graph& g, DistributedGraph& d) { d = distributeAllReduce(g, allReduced); }});
  if (!plan.empty()) {
    passes.push_back({"parameter servers", [&plan, client](Graph& g, DistributedGraph& d) {
                        distributeParameterServers(g, plan, client);
                        for (const ServedVariable& v : plan.variables)
                          d.variables.push_back(
                              {v.variable, v.sparse, static_cast<size_t>(v.rows()) * v.rowBytes(), -1, true});
                      }});
  }
  if (options.workers > 1 && options.synchronous) {
    passes.push_back({"batch normalisation", [ring = options.hostRing](Graph& g, DistributedGraph&) {
                        synchronizeBatchNorm(g, ring);
                      }});
  }
  return passes;
}

DistributedGraph applyPasses(Graph& graph, const std::vector<GraphPass>& passes) {
  DistributedGraph result;
  for (const GraphPass& pass : passes) {
    try {
      pass.run(graph, result);
      graph.verify();
    } catch (const std::exception& e) {
      WEFT_THROW("the {} pass: {}", pass.name, e.what());
    }
  }
  return result;
}

}  // namespace weft::dist
