// Collective ops (see the header): definitions and shape functions; the kernels hand the work to
// the backend the op names (dist/collective/Collective.h, dist/collective/Communicator.h).
#include "dist/collective/CollectiveOps.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "core/Tensor.h"
#include "dist/collective/Communicator.h"
#include "ops/Ops.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace weft::dist {

namespace {

Communicator& communicatorOf(const KernelContext& ctx) {
  return Communicator::byId(ctx.attrs().getInt("communicator"));
}

/// The backend an AllReduce op names; it must compute where the op runs.
CollectiveBackend& backendOf(const KernelContext& ctx) {
  CollectiveBackend& backend = CollectiveBackend::byId(ctx.attrs().getInt("backend"));
  WEFT_CHECK(backend.device() == ctx.device.type, "{} runs on {}, but its sums go through {}", ctx.node->describe(),
             ctx.device.str(), backend.name());
  return backend;
}

std::vector<TensorType> ticketType(const InferContext&) { return {{DType::I64, Shape{}}}; }

std::vector<TensorType> allReduceStartInfer(const InferContext& c) {
  c.check(c.numInputs() >= 1, "needs at least one input");
  for (int i = 0; i < c.numInputs(); ++i) {
    c.check(c.dtype(i) == c.dtype(0), "input {} is {}, input 0 is {}: one AllReduce sums one dtype", i,
            dtypeName(c.dtype(i)), dtypeName(c.dtype(0)));
    c.check(c.dtype(i) == DType::F32 || c.dtype(i) == DType::F64 || c.dtype(i) == DType::I64,
            "dtype {} cannot be summed (f32, f64, i64 can)", dtypeName(c.dtype(i)));
  }
  return ticketType(c);
}

void allReduceStartKernel(KernelContext& ctx) { backendOf(ctx).startSum(ctx); }

std::vector<TensorType> allReduceWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of an AllReduceStart");
  return std::vector<TensorType>(c.inputs.begin() + 1, c.inputs.end());
}

void allReduceWaitKernel(KernelContext& ctx) { backendOf(ctx).finishSum(ctx, ctx.attrs().getFloat("scale")); }

std::vector<TensorType> allGatherStartInfer(const InferContext& c) {
  c.check(c.shape(0).rank() == 1, "indices must have rank 1, got {}", c.shape(0).str());
  c.check(c.shape(1).rank() >= 1, "values must have a row dimension, got {}", c.shape(1).str());
  return ticketType(c);
}

std::vector<TensorType> allGatherWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of an AllGatherStart");
  const int64_t world = c.attrs().getInt("world_size");
  auto gathered = [&](int i) {
    Shape s = c.shape(i);
    if (s[0] >= 0) s[0] *= world;
    return TensorType{c.dtype(i), s};
  };
  return {gathered(1), gathered(2)};
}

std::vector<TensorType> touchedRowsInfer(const InferContext& c) {
  c.check(c.shape(0).rank() >= 1, "rows must have a row dimension, got {}", c.shape(0).str());
  c.check(c.shape(1).rank() == 1 && (c.shape(1)[0] < 0 || c.shape(0)[0] < 0 || c.shape(1)[0] == c.shape(0)[0]),
          "counts {} must hold one count per row of {}", c.shape(1).str(), c.shape(0).str());
  const DType index = static_cast<DType>(c.attrs().getInt("index_dtype"));
  c.check(index == DType::I32 || index == DType::I64, "index_dtype must be i32 or i64, got {}", dtypeName(index));
  return {{index, Shape{c.shape(0)[0]}}, c.inputs[0]};
}

/// Row r with count > 0 is (r, rows[r]); every other row becomes (the first counted row, 0),
/// which adds nothing to that row, so a sparse update reading the result touches exactly the
/// counted rows with their values.
void touchedRowsKernel(KernelContext& ctx) {
  const Tensor &rows = ctx.input(0), &counts = ctx.input(1);
  const int64_t n = rows.shape()[0];
  const size_t rowBytes = n > 0 ? rows.bytes() / static_cast<size_t>(n) : 0;
  const std::vector<double> count = counts.toDoubles();
  const auto first = std::find_if(count.begin(), count.end(), [](double c) { return c != 0; });
  WEFT_CHECK(n == 0 || first != count.end(), "{}: no row of {} was touched by any worker", ctx.node->describe(),
             rows.shape().str());
  const auto filler = static_cast<int64_t>(first - count.begin());
  Tensor& ids = ctx.output(0);
  Tensor& values = ctx.output(1);
  values.fill(0);
  for (int64_t r = 0; r < n; ++r) {
    const bool touched = count[static_cast<size_t>(r)] != 0;
    const int64_t id = touched ? r : filler;
    if (ids.dtype() == DType::I32) ids.data<int32_t>()[r] = static_cast<int32_t>(id);
    else ids.data<int64_t>()[r] = id;
    if (touched)
      std::memcpy(static_cast<uint8_t*>(values.raw()) + static_cast<size_t>(r) * rowBytes,
                  static_cast<const uint8_t*>(rows.raw()) + static_cast<size_t>(r) * rowBytes, rowBytes);
  }
}

std::vector<TensorType> shardingStartInfer(const InferContext& c) {
  c.check(c.numInputs() >= 1, "needs at least one input");
  const int64_t ranks = c.attrs().getInt("world_size"), rank = c.attrs().getInt("rank");
  c.check(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {} ranks", rank, ranks);
  for (int i = 0; i < c.numInputs(); ++i) {
    c.check(c.dtype(i) == c.dtype(0), "input {} is {}, input 0 is {}: one collective moves one dtype", i,
            dtypeName(c.dtype(i)), dtypeName(c.dtype(0)));
    c.check(c.shape(i).isFullyDefined(), "input {} has shape {}: a shard needs a known size", i, c.shape(i).str());
  }
  return ticketType(c);
}

std::vector<TensorType> reduceScatterStartInfer(const InferContext& c) {
  for (int i = 0; i < c.numInputs(); ++i)
    c.check(c.dtype(i) == DType::F32 || c.dtype(i) == DType::F64, "dtype {} cannot be summed (f32 and f64 can)",
            dtypeName(c.dtype(i)));
  return shardingStartInfer(c);
}

std::vector<TensorType> reduceScatterWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of a ReduceScatterStart");
  const auto rank = static_cast<int>(c.attrs().getInt("rank"));
  const auto ranks = static_cast<int>(c.attrs().getInt("world_size"));
  const DType dtype = c.attrs().get<DType>("dtype");
  std::vector<TensorType> shards;
  for (int64_t numel : c.attrs().get<std::vector<int64_t>>("numels"))
    shards.push_back({dtype, Shape{shardOf(numel, rank, ranks).count}});
  c.check(!shards.empty(), "\"numels\" names no tensor");
  return shards;
}

std::vector<TensorType> shardGatherStartInfer(const InferContext& c) {
  for (int i = 0; i < c.numInputs(); ++i)
    c.check(c.node.inputs[static_cast<size_t>(i)].node()->op == "Variable", "input {} must be a variable", i);
  return shardingStartInfer(c);
}

std::vector<TensorType> shardGatherWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of a ShardGatherStart");
  return std::vector<TensorType>(c.inputs.begin() + 1, c.inputs.end());
}

std::vector<TensorType> gatherWholeStartInfer(const InferContext& c) {
  c.check(c.numInputs() == 1, "gathers one variable's shards, got {} inputs", c.numInputs());
  const Shape whole = c.attrs().get<Shape>("whole_shape");
  const ShardRange shard = shardOf(whole.numel(), static_cast<int>(c.attrs().getInt("rank")),
                                   static_cast<int>(c.attrs().getInt("world_size")));
  c.check(c.shape(0) == Shape{shard.count}, "input 0 has shape {}, not this rank's shard [{}] of the whole {}",
          c.shape(0).str(), shard.count, whole.str());
  std::vector<TensorType> out = shardingStartInfer(c);
  out.push_back({c.dtype(0), whole});
  return out;
}

std::vector<TensorType> gatherWholeWaitInfer(const InferContext& c) {
  c.check(c.dtype(0) == DType::I64, "input 0 must be the i64 ticket of a GatherWholeStart");
  c.check(c.shape(1) == c.attrs().get<Shape>("whole_shape"), "input 1 has shape {}, the whole {}", c.shape(1).str(),
          c.attrs().get<Shape>("whole_shape").str());
  return {c.inputs[1]};
}

void allGatherStartKernel(KernelContext& ctx) { communicatorOf(ctx).startGather(ctx); }
void allGatherWaitKernel(KernelContext& ctx) { communicatorOf(ctx).finishGather(ctx, ctx.attrs().getFloat("scale")); }

}  // namespace

void registerCollectiveOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& r = OpRegistry::global();
    // One kernel per op for both devices: the backend the op names does the work where it runs.
    r.add(OpDef("AllReduceStart").inputs(1, -1).infer(allReduceStartInfer).cpu(allReduceStartKernel)
              .cuda(allReduceStartKernel).launchAsync().noGradient());
    r.add(OpDef("AllReduceWait").inputs(2, -1).infer(allReduceWaitInfer).cpu(allReduceWaitKernel)
              .cuda(allReduceWaitKernel).noGradient());
    r.add(OpDef("AllGatherStart").inputs(2).infer(allGatherStartInfer).cpu(allGatherStartKernel)
              .launchAsync().noGradient());
    r.add(OpDef("AllGatherWait").inputs(3).infer(allGatherWaitInfer).cpu(allGatherWaitKernel).noGradient());
    r.add(OpDef("ReduceScatterStart").inputs(1, -1).infer(reduceScatterStartInfer)
              .cpu([](KernelContext& ctx) { communicatorOf(ctx).startReduceScatter(ctx); }).launchAsync().noGradient());
    r.add(OpDef("ReduceScatterWait")
              .inputs(1)
              .infer(reduceScatterWaitInfer)
              .cpu([](KernelContext& ctx) {
                communicatorOf(ctx).finishReduceScatter(ctx, ctx.attrs().getFloat("scale"));
              })
              .noGradient());
    r.add(OpDef("ShardGatherStart").inputs(1, -1).infer(shardGatherStartInfer)
              .cpu([](KernelContext& ctx) { communicatorOf(ctx).startShardGather(ctx); }).launchAsync().noGradient());
    r.add(OpDef("ShardGatherWait").inputs(2, -1).infer(shardGatherWaitInfer)
              .cpu([](KernelContext& ctx) { communicatorOf(ctx).finishShardGather(ctx); }).noGradient());
    r.add(OpDef("GatherWholeStart").inputs(1).infer(gatherWholeStartInfer)
              .cpu([](KernelContext& ctx) { communicatorOf(ctx).startGatherWhole(ctx); }).launchAsync().noGradient());
    r.add(OpDef("GatherWholeWait").inputs(2).infer(gatherWholeWaitInfer)
              .cpu([](KernelContext& ctx) { communicatorOf(ctx).finishGatherWhole(ctx); }).inplace(1).noGradient());
    r.add(OpDef("TouchedRows").inputs(2).infer(touchedRowsInfer).cpu(touchedRowsKernel).noGradient());
  });
}

std::vector<Output> allReduce(const std::vector<Output>& xs, int64_t backend, double scale, bool onGpu,
                              std::optional<DType> wire) {
  registerCollectiveOps();
  Graph& g = xs.at(0).graph();
  const std::string& device = xs[0].node()->device;
  auto placed = g.onDevice(onGpu && device.rfind("cuda", 0) == 0 ? device : "");
  Attrs startAttrs{{"backend", backend}};
  if (wire && *wire != xs[0].dtype()) startAttrs.set("wire", static_cast<int64_t>(*wire));
  Node* start = g.addNode("AllReduceStart", xs, startAttrs);
  std::vector<Output> waitInputs{start->output()};
  waitInputs.insert(waitInputs.end(), xs.begin(), xs.end());
  Node* wait = g.addNode("AllReduceWait", waitInputs, {{"backend", backend}, {"scale", scale}});
  std::vector<Output> out;
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(wait->output(static_cast<int>(i)));
  return out;
}

std::pair<Output, Output> allGatherRows(Output indices, Output values, int64_t communicator, int worldSize,
                                        double scale, const std::string& variable, int64_t variableRows) {
  registerCollectiveOps();
  Graph& g = indices.graph();
  Node* start = g.addNode("AllGatherStart", {indices, values},
                          {{"communicator", communicator}, {"variable", variable}, {"variable_rows", variableRows}});
  Node* wait = g.addNode("AllGatherWait", {start->output(), indices, values},
                         {{"communicator", communicator}, {"scale", scale}, {"world_size", int64_t{worldSize}}});
  return {wait->output(0), wait->output(1)};
}

ShardRange shardOf(int64_t numel, int rank, int ranks) {
  const int64_t begin = numel * rank / ranks, end = numel * (rank + 1) / ranks;
  return {begin, end - begin};
}

std::vector<Output> reduceScatter(const std::vector<Output>& xs, int64_t communicator, int rank, int ranks,
                                  double scale) {
  registerCollectiveOps();
  Graph& g = xs.at(0).graph();
  auto placed = g.onDevice("");
  const Attrs where{{"communicator", communicator}, {"rank", int64_t{rank}}, {"world_size", int64_t{ranks}}};
  Node* start = g.addNode("ReduceScatterStart", xs, where);
  // The wait reads only the ticket, so the whole gradients are freed once the start packed them.
  std::vector<int64_t> numels;
  for (const Output& x : xs) numels.push_back(x.shape().numel());
  Attrs waitAttrs = where;
  waitAttrs.set("scale", scale);
  waitAttrs.set("numels", numels);
  waitAttrs.set("dtype", xs[0].dtype());
  Node* wait = g.addNode("ReduceScatterWait", {start->output()}, waitAttrs);
  std::vector<Output> out;
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(wait->output(static_cast<int>(i)));
  return out;
}

std::vector<Node*> gatherShards(const std::vector<Output>& variables, const std::vector<Node*>& after,
                                int64_t communicator, int rank, int ranks) {
  registerCollectiveOps();
  Graph& g = variables.at(0).graph();
  auto placed = g.onDevice("");
  const Attrs where{{"communicator", communicator}, {"rank", int64_t{rank}}, {"world_size", int64_t{ranks}}};
  Node* start = g.addNode("ShardGatherStart", variables, where);
  for (Node* n : after) g.addControlInput(start, n);
  std::vector<Output> waitInputs{start->output()};
  waitInputs.insert(waitInputs.end(), variables.begin(), variables.end());
  Node* wait = g.addNode("ShardGatherWait", waitInputs, where);
  std::vector<Node*> assigns;
  for (size_t i = 0; i < variables.size(); ++i)
    assigns.push_back(assign(variables[i], wait->output(static_cast<int>(i))));
  return assigns;
}

Output gatherWhole(Output shard, const Shape& whole, Node* after, int64_t communicator, int rank, int ranks) {
  registerCollectiveOps();
  Graph& g = shard.graph();
  auto placed = g.onDevice("");
  Attrs where{{"communicator", communicator}, {"rank", int64_t{rank}}, {"world_size", int64_t{ranks}}};
  where.set("whole_shape", whole);
  Node* start = g.addNode("GatherWholeStart", {shard}, where);
  if (after != nullptr) g.addControlInput(start, after);
  return g.addNode("GatherWholeWait", {start->output(0), start->output(1)}, where)->output();
}

std::pair<Output, Output> touchedRows(Output rows, Output counts, DType indexDType) {
  registerCollectiveOps();
  Node* n = rows.graph().addNode("TouchedRows", {rows, counts}, {{"index_dtype", static_cast<int64_t>(indexDType)}});
  return {n->output(0), n->output(1)};
}

}  // namespace weft::dist
