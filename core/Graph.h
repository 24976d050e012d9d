// The dataflow graph: nodes (op instances) connected by outputs, with name scopes, device
// placement, static shape/dtype inference at build time, variables, placeholders and the
// gradient <-> variable links that autodiff records.
#pragma once

#include "core/Attrs.h"
#include "core/DType.h"
#include "core/Shape.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weft {

class Graph;
struct Node;
struct OpDef;

/// Static type of a node output: dtype and (possibly partial) shape.
struct TensorType {
  DType dtype = DType::F32;
  Shape shape;
  std::string str() const { return std::string(dtypeName(dtype)) + shape.str(); }
};

/// A symbolic value: output `index` of `node`. Cheap to copy.
class Output {
 public:
  Output() = default;
  Output(Node* node, int index = 0) : node_(node), index_(index) {}  // NOLINT: implicit by design

  bool valid() const { return node_ != nullptr; }
  Node* node() const { return node_; }
  int index() const { return index_; }
  Graph& graph() const;
  const TensorType& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int rank() const { return shape().rank(); }
  /// "scope/name:index".
  std::string name() const;

  bool operator==(const Output& o) const { return node_ == o.node_ && index_ == o.index_; }
  bool operator!=(const Output& o) const { return !(*this == o); }
  bool operator<(const Output& o) const;

 private:
  Node* node_ = nullptr;
  int index_ = 0;
};

struct OutputHash {
  size_t operator()(const Output& o) const {
    return std::hash<const void*>()(o.node()) ^ static_cast<size_t>(o.index());
  }
};

/// The nodes whose NaN or Inf a loss-scaled step handles by skipping its update (the scaled
/// backward pass), so a Session's checkNumerics does not stop on them.
inline constexpr char kLossScaledCollection[] = "loss_scaled";
/// The nodes autodiff created (the backward pass): a pipeline cut tells them from the forward
/// pass and the updates by this.
inline constexpr char kBackwardCollection[] = "backward";

/// How the values of a recompute scope (Graph::recompute) reach the backward pass.
enum class Recompute {
  None,       // kept alive from the forward pass, as outside every scope
  Selective,  // element-wise, normalisation and shape values recomputed; products' and convolutions' kept
  Full,       // every value recomputed from what flows into the scope
};
/// "none", "selective" or "full"; throws naming the text otherwise.
Recompute parseRecompute(const std::string& text);
const char* recomputeName(Recompute mode);

/// One op instance.
struct Node {
  int id = 0;
  std::string op;
  std::string name;  // unique within the graph, scope included
  std::vector<Output> inputs;
  std::vector<Node*> controlInputs;  // must run before this node; carry no data
  Output condition;  // when set (a scalar), the node runs only in steps where it is nonzero, not NaN
  Attrs attrs;
  std::vector<TensorType> outputs;
  std::string device;  // requested placement ("" = default device)
  int stage = -1;      // pipeline stage the author put it in (Graph::stage); -1: chosen by the cut
  Recompute recompute = Recompute::None;  // set by Graph::recompute
  int recomputeSegment = -1;              // which recompute scope: one segment per scope
  bool recomputed = false;  // a copy of forward op gradientOf, made for the backward (autodiff/Recompute.h)
  const Node* gradientOf = nullptr;  // autodiff's nodes: the forward op whose gradient they compute
  const OpDef* def = nullptr;
  Graph* graph = nullptr;

  Output output(int i = 0) { return Output(this, i); }
  /// "op 'MatMul' (node 'fc1/MatMul')" for error messages.
  std::string describe() const;
};

/// How a variable gets its first value. Random kinds draw from a stream seeded by the graph seed
/// and the variable's name, so adding a variable never changes another's initial value.
struct Initializer {
  enum class Kind { Zeros, Constant, Uniform, Normal, TruncatedNormal, GlorotUniform, HeNormal, Value, CopyOf };
  Kind kind = Kind::Zeros;
  double a = 0, b = 0;
  Tensor value;
  std::string source;  // CopyOf: the name of the variable to copy

  static Initializer zeros() { return {}; }
  static Initializer constant(double v) { return {Kind::Constant, v, 0, {}, {}}; }
  static Initializer uniform(double lo, double hi) { return {Kind::Uniform, lo, hi, {}, {}}; }
  static Initializer normal(double mean, double stddev) { return {Kind::Normal, mean, stddev, {}, {}}; }
  /// Normal(0, stddev) with draws beyond two standard deviations redrawn.
  static Initializer truncatedNormal(double stddev) { return {Kind::TruncatedNormal, 0, stddev, {}, {}}; }
  /// Uniform(-l, l), l = sqrt(6 / (fan_in + fan_out)).
  static Initializer glorotUniform() { return {Kind::GlorotUniform, 0, 0, {}, {}}; }
  /// Normal(0, sqrt(2 / fan_in)).
  static Initializer heNormal() { return {Kind::HeNormal, 0, 0, {}, {}}; }
  static Initializer fromTensor(Tensor t) { return {Kind::Value, 0, 0, std::move(t), {}}; }
  /// The initial value of another variable (for slots and moving averages).
  static Initializer copyOf(const Output& variable);

  /// "zeros", "glorot_uniform", ... (the form stored in a Variable's "init" attribute).
  static const char* kindName(Kind kind);
  static Kind parseKind(const std::string& name);
};

/// A gradient recorded by autodiff for one variable.
struct GradientLink {
  Node* variable = nullptr;
  bool sparse = false;
  Output dense;    // dense gradient (when !sparse)
  Output indices;  // sparse: row ids (i32/i64, shape [n])
  Output values;   // sparse: rows (shape [n, ...row shape])
  Shape denseShape;
};

/// A define-and-run dataflow graph. Nodes are appended and never removed. Building a graph
/// creates inputs before their consumers, but a rewrite (replaceUses, setInput) may make a node
/// read one created after it: topologicalOrder() is the order to walk it in.
///
///     Graph g;
///     auto x = g.placeholder("x", f32, {-1, 4});
///     auto w = g.variable("w", f32, {4, 2}, Initializer::glorotUniform());
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Appends a node of a registered op, inferring its output types. Throws weft::Error naming the
  /// op, the node and the input types when the op is unknown or the inputs do not fit.
  Node* addNode(const std::string& op, std::vector<Output> inputs, Attrs attrs = {},
                const std::string& name = "");

  /// A value supplied at run time through a feed; -1 dimensions take the fed size.
  Output placeholder(const std::string& name, DType dtype, Shape shape);
  /// Trainable (or not) state that lives in the session across runs.
  Output variable(const std::string& name, DType dtype, Shape shape, Initializer init,
                  bool trainable = true);
  Output constant(Tensor value, const std::string& name = "");
  Output scalar(double value, DType dtype = f32) { return constant(Tensor::scalar(dtype, value)); }
  /// A node with no outputs that runs after `deps` (groups update ops into one step).
  Node* group(const std::vector<Node*>& deps, const std::string& name = "group");

  /// RAII name scope: nodes created while it lives are named "outer/inner/...".
  class Scope {
   public:
    Scope(Graph& g, const std::string& name);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Graph& graph_;
  };
  Scope scope(const std::string& name) { return Scope(*this, name); }
  const std::string& currentScope() const { return scopes_.empty() ? empty_ : scopes_.back(); }

  /// RAII device scope: nodes created while it lives request `device` ("cpu", "cuda:0"; "" for
  /// the default device).
  class DeviceScope {
   public:
    DeviceScope(Graph& g, const std::string& device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    Graph& graph_;
  };
  DeviceScope onDevice(const std::string& device) { return DeviceScope(*this, device); }

  /// RAII pipeline-stage scope: nodes created while it lives belong to stage `stage` of a
  /// pipelined run (dist/pipeline/Pipeline.h); the gradients autodiff makes for them do too. Nodes
  /// outside every stage scope go where the pipeline cut puts them.
  class StageScope {
   public:
    StageScope(Graph& g, int stage);
    ~StageScope();
    StageScope(const StageScope&) = delete;
    StageScope& operator=(const StageScope&) = delete;

   private:
    Graph& graph_;
  };
  StageScope stage(int stage) { return StageScope(*this, stage); }
  /// The stage nodes created now belong to (-1 outside every stage scope).
  int currentStage() const { return stages_.empty() ? -1 : stages_.back(); }
  /// Declares `variable` tied: read at distant places of the model, as an LM's input embedding
  /// and output softmax share one table. A pipeline's automatic cut (dist::planStages) may then
  /// put its readers in different stages, each of which holds a copy; the lowest of them sums the
  /// stages' gradients, updates it and sends the update to the others. Otherwise an automatic cut
  /// keeps a variable's readers in one stage (a recurrent layer's steps). Stage scopes may part
  /// any variable's readers, tied or not.
  void tieAcrossStages(Output variable);

  /// RAII recompute scope (activation checkpointing): the values of the forward ops created
  /// while it lives are not kept for the backward pass. autodiff's gradients() has the backward
  /// read copies of those ops instead, which re-run just before the backward needs them, from the
  /// values that flow into the scope (kept) and the variables. Each scope is one segment: wrap
  /// each layer or block in its own, so that only one segment's values are alive again at a time.
  /// Random ops draw the same numbers again; ops that write state (batch norm's moving averages
  /// are separate update ops) run once.
  ///
  ///     for (auto& layer : layers) {
  ///       auto segment = g.recompute();
  ///       h = relu(layer(h));
  ///     }
  class RecomputeScope {
   public:
    RecomputeScope(Graph& g, Recompute mode);
    ~RecomputeScope();
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

   private:
    Graph& graph_;
  };
  RecomputeScope recompute(Recompute mode = Recompute::Full) { return RecomputeScope(*this, mode); }

  /// RAII partitioner scope (the `partitioner` of the sparsity-aware Parallax paper): variables
  /// created while it lives, when a distributed job puts them on parameter servers, are split
  /// into `partitions` row partitions whatever their size, every variable of the scope alike.
  /// kJobPartitions leaves the count to the job (dist::Config::partitions, which
  /// `--partitions auto` searches). Outside every scope a size threshold decides.
  static constexpr int kJobPartitions = 0;
  class PartitionerScope {
   public:
    PartitionerScope(Graph& g, int partitions);
    ~PartitionerScope();
    PartitionerScope(const PartitionerScope&) = delete;
    PartitionerScope& operator=(const PartitionerScope&) = delete;

   private:
    Graph& graph_;
  };
  PartitionerScope partitioner(int partitions = kJobPartitions) { return PartitionerScope(*this, partitions); }
  /// The partitions requested for `variable` by the partitioner scope it was created in
  /// (kJobPartitions: the job's count), or std::nullopt when it was created outside every one.
  std::optional<int> requestedPartitions(const Node* variable) const;

  /// How a mixed-precision scope lowers its ops to 16 bits.
  enum class MixedOps {
    /// Matrix products and convolutions run on 16-bit copies of their f32 operands and their
    /// results are cast back to f32: for GPUs, whose 16-bit kernels also read half the bytes.
    CastOperands,
    /// Matrix products alone, marked to round their f32 operands to 16 bits as their kernel
    /// packs them, with f32 results and no copies: for CPUs with bf16 dot products
    /// (AVX512_BF16), which have no 16-bit convolutions to gain from.
    RoundInProducts,
  };
  /// RAII mixed-precision scope: while it lives, matrix products and convolutions built from f32
  /// values compute in `low` (bf16 or f16) as `ops` says, so the rest of the model, the variables
  /// and the optimizer stay in f32.
  class PrecisionScope {
   public:
    PrecisionScope(Graph& g, DType low, MixedOps ops = MixedOps::CastOperands);
    ~PrecisionScope();
    PrecisionScope(const PrecisionScope&) = delete;
    PrecisionScope& operator=(const PrecisionScope&) = delete;

   private:
    Graph& graph_;
  };
  PrecisionScope mixedPrecision(DType low, MixedOps ops = MixedOps::CastOperands) {
    return PrecisionScope(*this, low, ops);
  }
  /// The innermost scope's precision: f32 (and CastOperands) outside every scope.
  struct ComputePrecision {
    DType dtype;
    MixedOps ops;
  };
  ComputePrecision computePrecision() const {
    return precisions_.empty() ? ComputePrecision{DType::F32, MixedOps::CastOperands} : precisions_.back();
  }

  /// Makes `node` (an op without outputs, such as an update) run only in steps where the scalar
  /// `condition` is nonzero (NaN counts as zero); the condition is computed first.
  void runOnlyIf(Node* node, Output condition);

  // ---- Rewriting: graph-to-graph passes change nodes through these, never field by field ----

  /// Points every input that reads `from` at `to`, in every node, or only in `consumers`;
  /// returns how many inputs changed. `to` must have from's dtype, and the edges may not close a
  /// cycle. When the shapes differ (an AllGather's rows for one worker's), the output types of
  /// every node downstream are inferred again. A refused replacement (a cycle, a shape function
  /// that refuses the new shapes) changes nothing and throws.
  int replaceUses(Output from, Output to);
  int replaceUses(Output from, Output to, const std::vector<Node*>& consumers);
  /// Several (from, to) replacements at once, inferred again together (a sparse gradient's
  /// indices and values, which only fit each other).
  int replaceUses(const std::vector<std::pair<Output, Output>>& replacements, const std::vector<Node*>& consumers);
  /// Points input `i` of `node` at `value` (the old input's dtype), as replaceUses does.
  void setInput(Node* node, int i, Output value);
  /// Makes `node` an instance of `op` with `attrs` on the same inputs, placed on `device`, with
  /// its output types inferred again. Throws, changing nothing, when the op refuses the inputs or
  /// its outputs would not fit what its consumers read (count, dtypes, shapes).
  void retarget(Node* node, const std::string& op, Attrs attrs, const std::string& device);
  /// Makes `node` an instance of `op` reading `inputs`, with `attrs`, on its device: a fusion
  /// (ops/Fusion.h) turns a node into the fused op that computes its value from further upstream.
  /// Its output types are inferred again; those its readers read must not change. Throws,
  /// changing nothing, when the op refuses the inputs, an output would change, or the new inputs
  /// would close a cycle.
  void rebuild(Node* node, const std::string& op, std::vector<Output> inputs, Attrs attrs);
  /// Points inputs of `node` at values of other dtypes (mixed precision's 16-bit activations,
  /// ops/MixedPrecision.h) and infers its outputs again. Where an output's dtype changes, its
  /// readers read `convert(output)` instead, a value of the old type that `convert` builds, so
  /// nothing downstream changes type. Throws, changing nothing, when the op refuses the inputs or
  /// an output's shape would change.
  void retype(Node* node, const std::vector<std::pair<int, Output>>& inputs,
              const std::function<Output(Output)>& convert);
  /// Makes `variable` hold one shard of itself: the elements [offset, offset + count) of its
  /// value flattened, as a vector of `count` (ZeRO's sharded training state, dist/Transform.h).
  /// Its attributes keep the whole: "whole_shape" and "shard_offset" (wholeShapeOf, shardOffsetOf).
  /// It starts as those elements of what its initializer makes of the whole (initialValue). Its
  /// readers read a vector now: the caller rebuilds them before the graph is verified.
  void shardVariable(Node* variable, int64_t offset, int64_t count);
  /// Makes `node` run after `before`.
  void addControlInput(Node* node, Node* before);
  /// Makes `node` no longer wait for `before` (one of its control inputs).
  void removeControlInput(Node* node, Node* before);
  /// Every node that ran after `from` runs after `to` instead (once, if it already waited for it).
  void replaceControlInputs(Node* from, Node* to);

  /// Every node once, each after its inputs, control inputs and condition; among the nodes that
  /// are ready, the earliest created first, so a graph no rewrite has touched comes back in
  /// creation order. Throws naming a node of the cycle when there is one.
  std::vector<Node*> topologicalOrder() const;
  /// Checks that the graph is well formed: every input, control input and condition is an
  /// existing output of this graph, every node's output types are what its op infers from its
  /// inputs now, and the edges have no cycle. Throws naming the first node that is not.
  void verify() const;

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size(); }
  Node* node(int id) const { return nodes_.at(static_cast<size_t>(id)).get(); }
  /// The node named `name`, or nullptr.
  Node* find(const std::string& name) const;
  /// Every Variable node, in creation order.
  std::vector<Node*> variables() const;
  /// Whether `variable` holds a shard of itself (shardVariable); the shape of its whole value,
  /// and where its shard begins in the whole flattened.
  static bool isShard(const Node& variable) { return variable.attrs.has("shard_offset"); }
  static Shape wholeShapeOf(const Node& variable);
  static int64_t shardOffsetOf(const Node& variable) { return variable.attrs.getInt("shard_offset", 0); }
  std::vector<Node*> trainableVariables() const;

  /// Seed of every random initializer and random op that does not name its own.
  void setSeed(uint64_t seed) { seed_ = seed; }
  uint64_t seed() const { return seed_; }

  void addGradientLink(GradientLink link) { gradientLinks_.push_back(std::move(link)); }
  const std::vector<GradientLink>& gradientLinks() const { return gradientLinks_; }

  /// Named lists of nodes; layers add their side-effect ops (batch-norm moving statistics) to
  /// "update_ops", which optimizers run with every step, and loss scaling names the nodes of its
  /// scaled backward pass in kLossScaledCollection.
  void addToCollection(const std::string& key, Node* node) { collections_[key].push_back(node); }
  const std::vector<Node*>& collection(const std::string& key) const;

  /// One line per node: name, op, inputs, output types, device, attributes; then the gradient links.
  std::string dump() const;
  /// Graphviz DOT of the graph (data edges solid, control edges dashed, gradient links dotted).
  std::string toDot() const;

 private:
  std::string uniqueName(const std::string& base);
  /// Infers the outputs of `changed` and of everything downstream again (after their inputs
  /// changed); undoes what it changed and throws when a shape function refuses.
  void reinferDownstream(const std::vector<Node*>& changed);

  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::string, Node*> byName_;
  std::vector<std::string> scopes_;
  std::vector<std::string> devices_;
  std::vector<int> stages_;
  struct RecomputeSegment {
    Recompute mode;
    int id;
  };
  std::vector<RecomputeSegment> recomputeSegments_;
  int nextRecomputeSegment_ = 0;
  std::vector<int> partitioners_;
  std::map<const Node*, int> requestedPartitions_;
  std::vector<ComputePrecision> precisions_;
  std::vector<GradientLink> gradientLinks_;
  std::map<std::string, std::vector<Node*>> collections_;
  uint64_t seed_ = 0;
  std::string empty_;
};

/// Fan-in and fan-out of a weight of this shape ([in, out] matrices, [out, in, kh, kw] filters).
std::pair<double, double> fans(const Shape& shape);

}  // namespace weft
