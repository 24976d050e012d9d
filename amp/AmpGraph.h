// The asynchronous model-parallel (AMP) intermediate representation of Gaunt et al., 2017: a static
// graph whose nodes exchange messages (a payload tensor and a small state) and carry control flow
// in the graph itself: cond routes by the state, phi joins and remembers where each message came
// from, an invertible state update moves the state on (and back, backward), so a loop is a cycle
// rather than an unrolled chain. Group / ungroup / flatmap batch and unbatch inside one instance.
//
// The invariant every node keeps: each forward message it sends with state s is answered by
// exactly one backward message with state s. Nodes key what they keep for backward by the state,
// so many instances interleave (dist/amp/AmpRuntime.h runs the graph; models/AmpModels.h builds the
// paper's models on this layer alone).
//
//     amp::Graph g;
//     auto x = g.input("x", {f32, {4}});
//     auto h = g.transform("fc", {x}, {[](weft::Graph& w, const amp::Inputs& in) {
//                                    return relu(nn::Linear(w, "fc", 4, 8)(in.payloads[0])); }});
//     g.loss("loss", h, lossSpec);
#pragma once

#include "core/Graph.h"
#include "optim/Optimizer.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace weft::amp {

/// Where a message stands in its instance's computation. Every field but `instance` means what
/// the model says (a position in a sequence, an outer iteration, a node of the instance's tree or
/// graph, which child or which edge).
struct State {
  int64_t instance = 0;
  int32_t step = 0;
  int32_t iteration = 0;
  int32_t item = 0;
  int32_t slot = 0;

  bool operator==(const State&) const = default;
  /// "instance 3 step 2 iteration 0 item 5 slot 1"
  std::string str() const;
};

struct StateHash {
  size_t operator()(const State& s) const;
};

/// An instance's own data that nodes consult through its id (a list's tokens, a tree, a graph
/// and its labels): a model derives from it.
struct Instance {
  virtual ~Instance() = default;
  template <typename T>
  const T& as() const {
    auto* derived = dynamic_cast<const T*>(this);
    WEFT_CHECK(derived != nullptr, "amp: an instance is not of the type its model expects");
    return *derived;
  }
};

/// One output of a node: messages leave a node through a port.
struct Port {
  int node = -1;
  int output = 0;
  bool valid() const { return node >= 0; }
};

/// What a controller pumps in for one instance: its data and a payload per input it enters by
/// (the state's instance field is set by the runtime; the other fields start as given).
struct Pumped {
  std::shared_ptr<const Instance> instance;
  struct Entry {
    Port input;
    Tensor payload;
    State state;
  };
  std::vector<Entry> entries;
};

/// A tensor computed from a message's state and instance (a word id, a label) and fed to a
/// transform or a loss beside the payloads.
struct StateInput {
  std::string name;
  TensorType type;
  std::function<Tensor(const State&, const Instance&)> value;
};

/// What a transform's or a loss's builder gets: a placeholder per payload input (shaped like the
/// messages that arrive) and per state input.
struct Inputs {
  std::vector<Output> payloads;
  std::vector<Output> fromState;
};

/// A payload transform: a weft subgraph (ops, kernels and autodiff of the op library) that maps
/// its inputs' payloads to one output payload. With trainable variables it is parameterised: it
/// accumulates their gradients and applies `optimizer` once `minUpdateFrequency` gradients have
/// arrived (0: the runtime's default).
struct TransformSpec {
  using Builder = std::function<Output(weft::Graph&, const Inputs&)>;
  TransformSpec() = default;
  TransformSpec(Builder build, std::vector<StateInput> stateInputs = {})  // NOLINT: {builder} reads best
      : build(std::move(build)), stateInputs(std::move(stateInputs)) {}

  Builder build;
  std::vector<StateInput> stateInputs;
  std::shared_ptr<optim::Optimizer> optimizer;  ///< null: the runtime's default
  int minUpdateFrequency = 0;
  int worker = -1;  ///< the worker it runs on; -1: chosen by the runtime
};

/// What a loss's builder returns: the scalar loss of one message, and optionally the scalar
/// count of correct predictions and of predictions it scores (for accuracy).
struct LossOutputs {
  Output loss;
  Output hits, count;
};

struct LossSpec {
  using Builder = std::function<LossOutputs(weft::Graph&, const Inputs&)>;
  LossSpec() = default;
  LossSpec(Builder build, std::vector<StateInput> stateInputs = {})  // NOLINT: {builder, inputs} reads best
      : build(std::move(build)), stateInputs(std::move(stateInputs)) {}

  Builder build;
  std::vector<StateInput> stateInputs;  ///< typically the label
  int worker = -1;
};

using StateMap = std::function<State(const State&, const Instance&)>;

/// Group: messages whose `key` agree are batched into one payload [n, ...] of `count` rows in
/// ascending `order`; the group's message has state `key`.
struct GroupSpec {
  StateMap key;
  std::function<int(const State& key, const Instance&)> count;
  std::function<int64_t(const State&)> order;
};

enum class NodeKind {
  Input,
  Transform,
  Loss,
  Cond,
  Phi,
  StateUpdate,
  Concat,
  Split,
  Broadcast,
  Group,
  Ungroup,
  Flatmap
};
const char* kindName(NodeKind kind);

struct Node {
  int id = 0;
  std::string name;
  NodeKind kind = NodeKind::Input;
  std::vector<Port> inputs;
  int outputs = 1;
  std::vector<TensorType> outputTypes;  ///< static payload type per output (-1: varies)
  int worker = -1;
  /// Replicas of one transform share a group id (>= 0).
  int replicaGroup = -1;

  TransformSpec transform;
  LossSpec loss;
  std::function<int(const State&, const Instance&)> route;   // Cond
  StateMap forward, inverse;                                 // StateUpdate
  std::vector<int64_t> sizes;                                // Concat / Split: last-axis widths
  GroupSpec group;                                           // Group
  std::function<std::vector<State>(const State&, const Instance&)> expand;  // Ungroup / Flatmap
};

/// An AMP graph, built and then checked (verify) before it runs. Every output feeds exactly one
/// input: a value that two nodes read passes a broadcast.
class Graph {
 public:
  /// Where the controller pumps an instance's messages in; their payloads have type `type`.
  Port input(const std::string& name, TensorType type);
  /// A payload transform of the payloads arriving (with one state) on `inputs`.
  Port transform(const std::string& name, const std::vector<Port>& inputs, TransformSpec spec);
  /// A loss: it starts the backward pass of each message it receives.
  void loss(const std::string& name, Port x, LossSpec spec);
  /// Routes each message to output route(state) of `branches`; backward returns the way it came.
  std::vector<Port> cond(const std::string& name, Port x, int branches,
                         std::function<int(const State&, const Instance&)> route);
  /// Joins `inputs` (more may be added with addPhiInput, to close a loop) into one stream.
  Port phi(const std::string& name, const std::vector<Port>& inputs);
  void addPhiInput(Port phi, Port input);
  /// Maps each message's state with `forward`; backward maps it back with `inverse`.
  Port stateUpdate(const std::string& name, Port x, StateMap forward, StateMap inverse);
  /// Joins the messages of one state from `inputs` into one payload along the last axis.
  Port concat(const std::string& name, const std::vector<Port>& inputs);
  /// Splits each payload along its last axis into parts of `sizes`.
  std::vector<Port> split(const std::string& name, Port x, std::vector<int64_t> sizes);
  /// Sends each message on `copies` outputs; backward sums their gradients.
  std::vector<Port> broadcast(const std::string& name, Port x, int copies);
  /// Batches messages into one (see GroupSpec).
  Port group(const std::string& name, Port x, GroupSpec spec);
  /// Unbatches a payload [n, ...] into n messages, row i with state states(state)[i].
  Port ungroup(const std::string& name, Port x,
               std::function<std::vector<State>(const State&, const Instance&)> states);
  /// Sends one message's payload once per state of states(state); backward sums the gradients.
  Port flatmap(const std::string& name, Port x,
               std::function<std::vector<State>(const State&, const Instance&)> states);
  /// `copies` replicas of a one-input transform behind a cond that routes instance i to replica
  /// i % copies, joined again by a phi. The replicas start equal and the runtime synchronises
  /// their variables (AmpOptions::replicaSyncEvery).
  Port replicated(const std::string& name, Port x, int copies, const TransformSpec& spec);

  /// Checks the graph (throws an Error naming the node): every output read exactly once, every
  /// node reachable from an input and reaching a loss, every cycle through a state update, no phi
  /// receiving one message twice, payload types agreeing where they are static. Run() calls it.
  void verify();

  const std::vector<Node>& nodes() const { return nodes_; }
  Node& node(int id) { return nodes_.at(static_cast<size_t>(id)); }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  /// The node consuming output `port` (and which of its inputs), after verify().
  std::pair<int, int> consumer(Port port) const;
  /// The nodes' names, kinds, workers and edges with payload types; DOT when `dot`.
  std::string describe(bool dot = false) const;

 private:
  Node& add(const std::string& name, NodeKind kind, std::vector<Port> inputs, int outputs);
  void inferTypes();
  void checkReachability() const;
  void checkCycles() const;
  void checkPhis() const;

  std::vector<Node> nodes_;
  std::vector<std::vector<std::pair<int, int>>> consumers_;  // [node][output] -> (node, input)
};

/// The static type of a transform's output for inputs of `inputs` types, built in a scratch graph.
TensorType transformType(const TransformSpec& spec, const std::vector<TensorType>& inputs, const std::string& node);

}  // namespace weft::amp
