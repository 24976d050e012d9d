// The op registry: one record per op holding its input arity, shape function, kernels (one per
// device type) and gradient rule. Op families in ops/ fill it; the graph and executor read it.
#pragma once

#include "core/Graph.h"
#include "core/ThreadPool.h"

#include <fmt/format.h>

#include <array>
#include <functional>
#include <map>
#include <shared_mutex>
#include <string>
#include <vector>

namespace weft {

/// Inputs to a shape function. Shapes may hold -1 (unknown) at graph-build time; at plan time
/// they are concrete.
struct InferContext {
  const Node& node;  // op, name and attrs (outputs are not yet set)
  const std::vector<TensorType>& inputs;

  const Attrs& attrs() const { return node.attrs; }
  int numInputs() const { return static_cast<int>(inputs.size()); }
  const Shape& shape(int i) const { return inputs[static_cast<size_t>(i)].shape; }
  DType dtype(int i) const { return inputs[static_cast<size_t>(i)].dtype; }

  /// Throws weft::Error: "op 'X' (node 'a/b'): <message>; inputs: f32[2, 3], i64[?]".
  [[noreturn]] void failMessage(const std::string& message) const;
  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    failMessage(fmt::format(f, std::forward<A>(args)...));
  }
  template <class... A>
  void check(bool cond, fmt::format_string<A...> f, A&&... args) const {
    if (!cond) failMessage(fmt::format(f, std::forward<A>(args)...));
  }
};

/// What a kernel sees: its node, input tensors, preallocated output tensors (shapes inferred),
/// the intra-op thread pool, the session's random step and replica (for reproducible random
/// ops), and the device it runs on.
struct KernelContext {
  const Node* node = nullptr;
  std::vector<const Tensor*> inputs;
  std::vector<Tensor*> outputs;
  const ThreadPool* pool = nullptr;
  uint64_t step = 0;        // Session::step(): earlier runs that drew random numbers
  int replica = 0;          // SessionOptions::replica: which equal part of the total batch the inputs are
  Device device;            // where the kernel runs; its inputs and outputs live there
  void* stream = nullptr;   // CUDA kernels: the cudaStream_t to launch on
  int planStep = 0;         // position in the plan (CUDA kernels report data errors with it)

  const Tensor& input(int i) const { return *inputs[static_cast<size_t>(i)]; }
  Tensor& output(int i) const { return *outputs[static_cast<size_t>(i)]; }
  /// The elements of input or output i as T (checked against its dtype).
  template <class T>
  const T* in(int i) const { return input(i).template data<T>(); }
  template <class T>
  T* out(int i) const { return output(i).template data<T>(); }
  int numInputs() const { return static_cast<int>(inputs.size()); }
  const Attrs& attrs() const { return node->attrs; }
  /// What a random op's draws are keyed by, with the seed and the step: the node's name, or the
  /// name of the node whose draws it repeats (attribute "stream": a recomputed copy's).
  const std::string& randomStream() const {
    return node->attrs.has("stream") ? node->attrs.get<std::string>("stream") : node->name;
  }
  void parallelFor(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& f) const {
    pool->parallelFor(n, cost, f);
  }
  /// Throws weft::Error naming the op and the node.
  [[noreturn]] void failMessage(const std::string& message) const;
  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    failMessage(fmt::format(f, std::forward<A>(args)...));
  }
};

/// The gradient of one op input: dense, or sparse rows (indices + values) of a dense shape.
struct Grad {
  Output dense;
  Output indices, values;
  Shape denseShape;

  Grad() = default;
  Grad(Output d) : dense(d) {}  // NOLINT: a dense gradient converts implicitly
  static Grad sparse(Output indices, Output values, Shape denseShape) {
    Grad g;
    g.indices = indices;
    g.values = values;
    g.denseShape = std::move(denseShape);
    return g;
  }
  bool isSparse() const { return indices.valid(); }
  bool valid() const { return dense.valid() || indices.valid(); }
};

/// What a gradient rule sees: the forward node and the gradient of each of its outputs
/// (invalid where no gradient flows to that output).
struct GradContext {
  Node* node;
  std::vector<Output> outputGrads;

  Graph& graph() const { return *node->graph; }
  Output x(int i) const { return node->inputs[static_cast<size_t>(i)]; }
  Output y(int i = 0) const { return node->output(i); }
  Output dy(int i = 0) const { return outputGrads[static_cast<size_t>(i)]; }
  const Attrs& attrs() const { return node->attrs; }
};

using InferFn = std::function<std::vector<TensorType>(const InferContext&)>;
using Kernel = void (*)(KernelContext&);
/// Returns one Grad per op input; an invalid Grad means no gradient flows to that input.
using GradFn = std::function<std::vector<Grad>(GradContext&)>;

/// Nodes that the executor binds to storage instead of running a kernel.
enum class SourceKind { None, Placeholder, Variable, Constant };

/// The single record of an op. Built fluently:
///
///     registry.add(OpDef("Relu").inputs(1).infer(sameAsInput).cpu(reluKernel).inplace(0)
///                      .grad([](GradContext& c) -> std::vector<Grad> { ... }));
struct OpDef {
  explicit OpDef(std::string opName) : name(std::move(opName)) {}

  OpDef& inputs(int n) { minInputs = maxInputs = n; return *this; }
  OpDef& inputs(int lo, int hi) { minInputs = lo; maxInputs = hi; return *this; }  // hi -1: unbounded
  OpDef& infer(InferFn f) { inferFn = std::move(f); return *this; }
  OpDef& cpu(Kernel k) { kernels[static_cast<size_t>(DeviceType::CPU)] = k; return *this; }
  OpDef& cuda(Kernel k) { kernels[static_cast<size_t>(DeviceType::CUDA)] = k; return *this; }
  OpDef& grad(GradFn f) { gradFn = std::move(f); return *this; }
  /// Marks the op as having no gradient (integer results, update ops, gradient helpers).
  OpDef& noGradient() { noGrad = true; return *this; }
  /// Output 0 may reuse input `i`'s buffer when that input dies at this op.
  OpDef& inplace(int i) { inplaceInput = i; return *this; }
  /// Output 0 is input `i`'s bytes unchanged (a reshape): it shares that input's buffer however
  /// long either lives, where the plan holds both (else the kernel copies).
  OpDef& view(int i) {
    viewInput = i;
    return *this;
  }
  /// The kernel writes variable input `i` (update ops); the executor orders it after readers.
  OpDef& mutates(std::vector<int> inputsWritten) { mutatedInputs = std::move(inputsWritten); return *this; }
  OpDef& source(SourceKind k) { sourceKind = k; return *this; }
  /// The kernel starts work that completes in the background (a collective): the executor runs
  /// it as soon as its inputs are ready.
  OpDef& launchAsync() { launchesAsync = true; return *this; }
  /// The kernel seldom reads these inputs and copies what it reads itself: the executor hands
  /// them over from whichever device holds them instead of copying them every run.
  OpDef& uncopiedInputs(std::vector<int> inputs) { inputsNotCopied = std::move(inputs); return *this; }
  /// The kernel draws random numbers keyed by the session's random step (KernelContext::step),
  /// which advances only in runs that contain such an op.
  OpDef& random() { drawsRandom = true; return *this; }
  /// Mixed precision: `inputs` may hold 16-bit floats (bf16 or f16, one type for all of them)
  /// while the op's other floating inputs stay f32; the kernels then compute in f32 and the
  /// `outputs` take the 16-bit type. keepActivationsLow (ops/MixedPrecision.h) reads this to keep
  /// the activations between such ops in 16 bits. kAllInputs stands for every input.
  static constexpr int kAllInputs = -1;
  OpDef& halfActivations(std::vector<int> inputs, std::vector<int> outputs) {
    halfInputs = std::move(inputs);
    halfOutputs = std::move(outputs);
    return *this;
  }

  std::string name;
  int minInputs = 0, maxInputs = 0;
  InferFn inferFn;
  std::array<Kernel, 2> kernels{};
  GradFn gradFn;
  bool noGrad = false;
  int inplaceInput = -1;
  int viewInput = -1;
  std::vector<int> mutatedInputs;
  SourceKind sourceKind = SourceKind::None;
  bool launchesAsync = false;
  std::vector<int> inputsNotCopied;
  bool drawsRandom = false;
  std::vector<int> halfInputs, halfOutputs;

  Kernel kernelFor(DeviceType t) const { return kernels[static_cast<size_t>(t)]; }
};

/// Thread-safe: graphs may be built on several threads while a layer registers its ops (the
/// distribution layer registers its own on first use). A record never moves once added.
class OpRegistry {
 public:
  /// The process-wide registry, holding the core ops (Placeholder, Variable, Const, NoOp).
  static OpRegistry& global();

  /// Adds an op; throws if one of that name exists or it lacks a shape function.
  void add(OpDef def);
  const OpDef* find(const std::string& name) const;
  /// Throws "unknown op 'X'" when missing.
  const OpDef& get(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::string, std::unique_ptr<OpDef>> ops_;
};

}  // namespace weft
