// Server ops (see the header): definitions, shape functions and kernels.
#include "dist/server/ServerOps.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "core/Tensor.h"
#include "dist/server/RowSums.h"
#include "dist/server/ServerClient.h"
#include "ops/RowIds.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace weft::dist {

namespace {

struct Target {
  ServerClient* client = nullptr;  // null once the worker has left the job
  const ServedVariable* variable = nullptr;
};

/// The client and variable of a server op; for pulls, no client when the worker's own copy is
/// current (it has left the job, or has just taken every served variable from the servers).
Target targetOf(const KernelContext& ctx, bool pull = false) {
  Target t;
  t.client = ServerClient::find(ctx.attrs().getInt("client"));
  if (pull && t.client != nullptr && t.client->localCopyCurrent()) t.client = nullptr;
  if (t.client != nullptr)
    t.variable = &t.client->plan().variables.at(static_cast<size_t>(ctx.attrs().getInt("variable")));
  return t;
}

TrafficKind trafficOf(const ServedVariable& v) { return v.sparse ? TrafficKind::Sparse : TrafficKind::Dense; }

const Partition& partitionAt(const Target& t, size_t k) {
  return t.client->plan().partitions[static_cast<size_t>(t.variable->partitions[k])];
}

/// The ids as int64, each checked against the served variable's rows; an error names it.
std::vector<int64_t> checkedRows(const KernelContext& ctx, const Tensor& ids, const ServedVariable& variable) {
  try {
    return checkedRowIds(ids, variable.rows(), "id");
  } catch (const Error& e) {
    ctx.fail("{} of variable '{}'", e.what(), variable.variable->name);
  }
}

template <class T>
void append(std::vector<uint8_t>& bytes, const T& value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  bytes.insert(bytes.end(), p, p + sizeof value);
}

void checkReply(const KernelContext& ctx, const std::vector<uint8_t>& reply, size_t expected) {
  if (reply.size() != expected) ctx.fail("a server replied with {} bytes, expected {}", reply.size(), expected);
}

// ---- PullRows ------------------------------------------------------------------------------

std::vector<TensorType> pullRowsInfer(const InferContext& c) {
  c.check(c.shape(0).rank() >= 1, "the variable must have rows");
  c.check(isInteger(c.dtype(1)), "ids must be i32 or i64, got {}", dtypeName(c.dtype(1)));
  std::vector<int64_t> out = c.shape(1).dims();
  out.insert(out.end(), c.shape(0).dims().begin() + 1, c.shape(0).dims().end());
  return {{c.dtype(0), Shape(std::move(out))}};
}

/// The rows of the worker's own copy of the variable (input 0, which may live on a GPU).
void gatherFromLocalCopy(KernelContext& ctx) {
  const Kernel gather = OpRegistry::global().get("Gather").kernelFor(DeviceType::CPU);
  if (ctx.input(0).device().type == DeviceType::CPU) return gather(ctx);
  const Tensor variable = ctx.input(0).to(cpu());
  KernelContext onHost = ctx;
  onHost.inputs[0] = &variable;
  gather(onHost);
}

void pullRowsKernel(KernelContext& ctx) {
  const Target t = targetOf(ctx, true);
  if (t.client == nullptr) return gatherFromLocalCopy(ctx);
  const std::vector<int64_t> rows = checkedRows(ctx, ctx.input(1), *t.variable);
  const size_t parts = t.variable->partitions.size();
  std::vector<std::vector<int64_t>> wanted(parts);  // unique local row ids per partition
  for (int64_t r : rows) wanted[t.variable->partitionOfRow(r)].push_back(t.variable->localRow(r));
  std::vector<ServerClient::Call> calls;
  std::vector<size_t> callOf(parts, 0);
  for (size_t k = 0; k < parts; ++k) {
    std::sort(wanted[k].begin(), wanted[k].end());
    wanted[k].erase(std::unique(wanted[k].begin(), wanted[k].end()), wanted[k].end());
    if (wanted[k].empty()) continue;
    callOf[k] = calls.size();
    const auto* ids = reinterpret_cast<const uint8_t*>(wanted[k].data());
    calls.push_back(
        {t.variable->partitions[k], RequestKind::PullRows, {ids, ids + wanted[k].size() * sizeof(int64_t)}});
  }
  const std::vector<std::vector<uint8_t>> replies = t.client->pullRows(std::move(calls), trafficOf(*t.variable));
  const size_t rowBytes = t.variable->rowBytes();
  const RowWire wire = t.client->wireOf(*t.variable);
  for (size_t k = 0; k < parts; ++k)
    if (!wanted[k].empty()) checkReply(ctx, replies[callOf[k]], wanted[k].size() * wire.bytes());
  auto* out = static_cast<uint8_t*>(ctx.output(0).raw());
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t k = t.variable->partitionOfRow(rows[i]);
    const int64_t local = t.variable->localRow(rows[i]);
    const auto at =
        static_cast<size_t>(std::lower_bound(wanted[k].begin(), wanted[k].end(), local) - wanted[k].begin());
    wire.widen({replies[callOf[k]].data() + at * wire.bytes(), wire.bytes()}, out + i * rowBytes);
  }
}

// ---- PullVariable --------------------------------------------------------------------------

std::vector<TensorType> sameAsVariable(const InferContext& c) { return {c.inputs[0]}; }

void pullVariableKernel(KernelContext& ctx) {
  const Target t = targetOf(ctx, true);
  if (t.client == nullptr) return ctx.output(0).copyFrom(ctx.input(0));
  std::vector<ServerClient::Call> calls;
  for (int p : t.variable->partitions) calls.push_back({p, RequestKind::PullAll, {}});
  const std::vector<std::vector<uint8_t>> replies = t.client->pullWhole(std::move(calls), trafficOf(*t.variable));
  const RowWire wire = t.client->wireOf(*t.variable);
  auto* out = static_cast<uint8_t*>(ctx.output(0).raw());
  for (size_t k = 0; k < replies.size(); ++k) {
    const Partition& part = partitionAt(t, k);
    checkReply(ctx, replies[k], static_cast<size_t>(part.rows) * wire.bytes());
    std::vector<uint8_t> widened(wire.narrowed ? part.bytes : 0);
    if (wire.narrowed) wire.widen(replies[k], widened.data());
    unpackRows(part, t.variable->rowBytes(), wire.narrowed ? widened.data() : replies[k].data(), out);
  }
}

// ---- PushGradient --------------------------------------------------------------------------

std::vector<TensorType> pushGradientInfer(const InferContext& c) {
  c.check(c.numInputs() == 1 || isInteger(c.dtype(0)), "a sparse gradient's indices must be integers, got {}",
          dtypeName(c.dtype(0)));
  return {{c.dtype(c.numInputs() - 1), Shape{}}};
}

/// Each partition's share of a dense gradient: its rows.
std::vector<ServerClient::Call> denseShares(const Target& t, const Tensor& gradient) {
  std::vector<ServerClient::Call> calls;
  const auto* base = static_cast<const uint8_t*>(gradient.raw());
  const size_t rowBytes = t.variable->rowBytes();
  for (size_t k = 0; k < t.variable->partitions.size(); ++k) {
    const Partition& p = partitionAt(t, k);
    std::vector<uint8_t> share(p.bytes);
    packRows(p, rowBytes, base, share.data());
    std::vector<uint8_t> travelling = t.client->wireOf(*t.variable).narrow(std::move(share));
    calls.push_back({t.variable->partitions[k], RequestKind::Push, std::move(travelling)});
  }
  return calls;
}

/// Each partition's share of sparse rows: u64 count, the local row ids, the rows. Rows of one id
/// are summed here first (in the order they come), so each touched row travels once. The step's
/// rows are counted in the worker's traffic.
std::vector<ServerClient::Call> sparseShares(const KernelContext& ctx, const Target& t, const Tensor& indices,
                                             const Tensor& values) {
  const std::vector<int64_t> rows = checkedRows(ctx, indices, *t.variable);
  const size_t parts = t.variable->partitions.size(), rowBytes = t.variable->rowBytes();
  if (values.bytes() != rows.size() * rowBytes)
    ctx.fail("{} gradient rows of {} bytes for {} indices", values.bytes() / std::max<size_t>(rowBytes, 1), rowBytes,
             rows.size());
  std::vector<const uint8_t*> rowsAt(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) rowsAt[i] = static_cast<const uint8_t*>(values.raw()) + i * rowBytes;
  const RowSums sums = sumRowsById(values.dtype(), rowBytes, rows, rowsAt);
  const std::vector<int64_t>& unique = sums.ids;
  const std::vector<uint8_t>& summed = sums.rows;
  t.client->traffic().recordSparseRows(t.variable->variable->name, static_cast<int64_t>(rows.size()),
                                            static_cast<int64_t>(unique.size()), t.variable->rows());
  std::vector<std::vector<size_t>> ofPartition(parts);  // positions in `unique`, ascending
  for (size_t i = 0; i < unique.size(); ++i) ofPartition[t.variable->partitionOfRow(unique[i])].push_back(i);
  const RowWire wire = t.client->wireOf(*t.variable);
  std::vector<ServerClient::Call> calls;
  for (size_t k = 0; k < parts; ++k) {
    const std::vector<size_t>& mine = ofPartition[k];
    std::vector<uint8_t> payload(sizeof(uint64_t));
    const uint64_t count = mine.size();
    std::memcpy(payload.data(), &count, sizeof count);
    payload.reserve(sizeof count + mine.size() * (sizeof(int64_t) + wire.bytes()));
    for (size_t i : mine) append(payload, t.variable->localRow(unique[i]));
    for (size_t i : mine) wire.appendTravelling({summed.data() + i * rowBytes, rowBytes}, payload);
    calls.push_back({t.variable->partitions[k], RequestKind::Push, std::move(payload)});
  }
  return calls;
}

void pushGradientKernel(KernelContext& ctx) {
  const Target t = targetOf(ctx);
  if (t.client == nullptr) ctx.fail("this worker has left the job: gradients can no longer be pushed");
  t.client->setLocalCopyCurrent(false);
  std::vector<ServerClient::Call> calls =
      ctx.numInputs() == 1 ? denseShares(t, ctx.input(0)) : sparseShares(ctx, t, ctx.input(0), ctx.input(1));
  double squaredNorm = 0;
  for (const std::vector<uint8_t>& reply : t.client->request(std::move(calls), trafficOf(*t.variable))) {
    checkReply(ctx, reply, sizeof(double));
    double part = 0;
    std::memcpy(&part, reply.data(), sizeof part);
    squaredNorm += part;
  }
  dispatchFloat(ctx.output(0).dtype(), [&](auto z) {
    using T = decltype(z);
    ctx.output(0).data<T>()[0] = static_cast<T>(squaredNorm);
  });
}

// ---- ApplyRemote ---------------------------------------------------------------------------

std::vector<TensorType> noOutputs(const InferContext&) { return {}; }

void applyRemoteKernel(KernelContext& ctx) {
  const Target t = targetOf(ctx);
  if (t.client == nullptr) ctx.fail("this worker has left the job: updates can no longer be applied");
  // Under BSP one worker speaks for all (every worker holds the same extras); otherwise each
  // worker's push is an update of its own, with its own learning rate, step and clipping scale.
  if (!t.client->appliesForAll() && !t.client->appliesOwnPushes()) return;
  std::vector<uint8_t> extras;
  for (int i = 0; i < ctx.numInputs(); ++i) {
    const auto* p = static_cast<const uint8_t*>(ctx.input(i).raw());
    extras.insert(extras.end(), p, p + ctx.input(i).bytes());
  }
  std::vector<ServerClient::Call> calls;
  for (int p : t.variable->partitions) calls.push_back({p, RequestKind::Apply, extras});
  t.client->request(std::move(calls), TrafficKind::Control);
}

Attrs targetAttrs(int64_t client, int index) { return {{"client", client}, {"variable", int64_t{index}}}; }

}  // namespace

void registerServerOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& r = OpRegistry::global();
    // The variable is read only once the worker's own copy is current (after the job).
    r.add(OpDef("PullRows").inputs(2).infer(pullRowsInfer).cpu(pullRowsKernel).uncopiedInputs({0}).noGradient());
    r.add(OpDef("PullVariable").inputs(1).infer(sameAsVariable).cpu(pullVariableKernel).uncopiedInputs({0})
              .noGradient());
    r.add(OpDef("PushGradient").inputs(1, 2).infer(pushGradientInfer).cpu(pushGradientKernel).noGradient());
    r.add(OpDef("ApplyRemote").inputs(0, -1).infer(noOutputs).cpu(applyRemoteKernel).noGradient());
  });
}

Output pullVariable(Output variable, int64_t client, int index) {
  registerServerOps();
  return variable.graph().addNode("PullVariable", {variable}, targetAttrs(client, index))->output();
}

Node* pushGradient(const std::vector<Output>& gradient, int64_t client, int index) {
  registerServerOps();
  return gradient.at(0).graph().addNode("PushGradient", gradient, targetAttrs(client, index));
}

Node* applyRemote(Graph& graph, const std::vector<Output>& extras, int64_t client, int index) {
  registerServerOps();
  return graph.addNode("ApplyRemote", extras, targetAttrs(client, index));
}

void turnIntoPull(Node* gather, int64_t client, int index) {
  registerServerOps();
  WEFT_CHECK(gather->op == "Gather", "{} is not a Gather", gather->describe());
  // Requests to the servers run on the host.
  gather->graph->retarget(gather, "PullRows", targetAttrs(client, index), "");
}

void turnIntoPush(Node* squaredNorm, int64_t client, int index) {
  registerServerOps();
  WEFT_CHECK(squaredNorm->op == "SquaredNorm" || squaredNorm->op == "SparseSquaredNorm", "{} is not a squared norm",
             squaredNorm->describe());
  // Requests to the servers run on the host.
  squaredNorm->graph->retarget(squaredNorm, "PushGradient", targetAttrs(client, index), "");
}

}  // namespace weft::dist
