// The parameter server (see the header).
#include "dist/server/ParameterServer.h"

#include "core/Error.h"
#include "core/Tensor.h"
#include "dist/server/WireRows.h"
#include "ops/RowIds.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>

namespace weft::dist {

namespace {

using Payload = std::vector<uint8_t>;

// A worker waits on one pull per partition at a time (a FETCH beside it at most): a sender with
// more waiting is not following the protocol.
constexpr std::ptrdiff_t kMaxWaitingPulls = 4;

Shape withRows(const Shape& shape, int64_t rows) {
  std::vector<int64_t> dims = shape.dims();
  dims[0] = rows;
  return Shape(std::move(dims));
}

uint64_t readU64(const Payload& bytes, size_t offset) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

/// memcpy that accepts the null pointers of empty vectors when there is nothing to copy.
void copyBytes(void* to, const void* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}

}  // namespace

struct ParameterServer::PartitionState final : UpdateChain {
  int index = 0;
  const ServedVariable* served = nullptr;
  int64_t rows = 0;
  size_t rowBytes = 0;
  RowWire wire;  // how pulled and pushed rows travel
  size_t bytes() const { return static_cast<size_t>(rows) * rowBytes; }

  // The update chain on this partition: its own variable, slots, gradient feeds and extras.
  Graph graph;
  std::unique_ptr<Session> session;
  Node* variable = nullptr;
  std::vector<Node*> held;  // the slots, then the moving averages' shadows (ServedVariable::heldState)
  Output denseGradient, indices, values;
  std::vector<Output> extras;
  Node* updateOp = nullptr;
  std::vector<Node*> averages;  // run after the update

  uint64_t applied = 0;  // updates
  double denseScale = 1, sparseScale = 1;
  struct WaitingPull {
    RequestHeader header;
    Payload payload;
    Clock::time_point since;
  };
  std::vector<WaitingPull> waiting;  // pulls for a later version, or held by the staleness gate
  std::unique_ptr<PartitionUpdates> updates;  // the synchronisation mode's pushes and APPLYs

  void build(const ServerPlan& plan, int partition, const SessionOptions& options, DType wireDType);
  Payload answer(const RequestHeader& h, const Payload& payload);
  void load(const Payload& payload);
  void checkGradient(const Payload& payload) const override;
  void checkExtras(const Payload& payload) const override;
  Gradient aggregate(const std::vector<const Payload*>& from) override;
  void update(FeedMap gradient, const Payload& extrasBytes) override;
  uint64_t version() const override { return applied; }
};

void ParameterServer::PartitionState::build(const ServerPlan& plan, int partition, const SessionOptions& options,
                                            DType wireDType) {
  index = partition;
  const Partition& part = plan.partitions[static_cast<size_t>(partition)];
  served = &plan.variables[static_cast<size_t>(part.variable)];
  const ServedVariable& v = *served;
  rows = part.rows;
  rowBytes = v.rowBytes();
  wire = RowWire::of(v, wireDType);
  const Shape shape = withRows(v.variable->outputs[0].shape, rows);
  std::map<Output, Output> mapped;
  std::map<const Node*, Node*> copies;
  variable = graph.variable(v.variable->name, v.variable->outputs[0].dtype, shape, Initializer::zeros(), false).node();
  mapped[v.variable->output()] = variable->output();
  for (Node* s : v.heldState()) {
    held.push_back(graph.variable(s->name, s->outputs[0].dtype, shape, Initializer::zeros(), false).node());
    mapped[s->output()] = held.back()->output();
  }
  if (v.sparse) {
    indices = graph.placeholder("gradient_indices", v.gradient.indices.dtype(), Shape{-1});
    values = graph.placeholder("gradient_values", v.gradient.values.dtype(), withRows(shape, -1));
    mapped[v.gradient.indices] = indices;
    mapped[v.gradient.values] = values;
  } else {
    denseGradient = graph.placeholder("gradient", v.gradient.dense.dtype(), shape);
    mapped[v.gradient.dense] = denseGradient;
  }
  for (size_t i = 0; i < v.extras.size(); ++i) {
    extras.push_back(graph.placeholder(fmt::format("extra_{}", i), v.extras[i].dtype(), v.extras[i].shape()));
    mapped[v.extras[i]] = extras.back();
  }
  for (const Node* n : v.chain) {
    std::vector<Output> inputs;
    for (const Output& in : n->inputs) {
      auto it = mapped.find(in);
      WEFT_CHECK(it != mapped.end(), "server: {} reads {}, which the server does not hold", n->describe(), in.name());
      inputs.push_back(it->second);
    }
    Node* copy = graph.addNode(n->op, inputs, n->attrs, n->name);
    copies[n] = copy;
    for (size_t i = 0; i < n->outputs.size(); ++i)
      mapped[Output(const_cast<Node*>(n), static_cast<int>(i))] = copy->output(static_cast<int>(i));
  }
  updateOp = copies.at(v.update);
  for (const Node* a : v.averages) {
    averages.push_back(graph.addNode(a->op, {mapped.at(a->inputs[0]), variable->output()}, a->attrs, a->name));
    graph.addControlInput(averages.back(), updateOp);  // it averages the updated value
  }
  session = std::make_unique<Session>(graph, options);
}

Payload ParameterServer::PartitionState::answer(const RequestHeader& h, const Payload& payload) {
  const Tensor& value = session->variable(variable);
  const auto* base = static_cast<const uint8_t*>(value.raw());
  switch (h.kind) {
    case RequestKind::PullRows: {
      const std::vector<int64_t> ids = pullRowIds(payload, rows);
      Payload out(ids.size() * rowBytes);
      for (size_t i = 0; i < ids.size(); ++i)
        std::memcpy(out.data() + i * rowBytes, base + static_cast<size_t>(ids[i]) * rowBytes, rowBytes);
      return wire.narrow(std::move(out));
    }
    case RequestKind::PullAll: return wire.narrow(Payload(base, base + bytes()));
    case RequestKind::Fetch: {
      Payload out(base, base + bytes());
      for (Node* s : held) {
        const auto* slot = static_cast<const uint8_t*>(session->variable(s).raw());
        out.insert(out.end(), slot, slot + bytes());
      }
      return out;
    }
    default: WEFT_THROW("{} is not a pull", requestKindName(h.kind));
  }
}

void ParameterServer::PartitionState::load(const Payload& payload) {
  WEFT_CHECK(payload.size() == bytes() * (1 + held.size()),
             "LOAD carries {} bytes, the partition with its {} slots and moving averages takes {}", payload.size(),
             held.size(), bytes() * (1 + held.size()));
  std::memcpy(session->variable(variable).raw(), payload.data(), bytes());
  for (size_t i = 0; i < held.size(); ++i)
    std::memcpy(session->variable(held[i]).raw(), payload.data() + bytes() * (i + 1), bytes());
}

UpdateChain::Gradient ParameterServer::PartitionState::aggregate(const std::vector<const Payload*>& from) {
  const DType dtype = served->variable->outputs[0].dtype;
  Gradient result;
  double& squaredNorm = result.squaredNorm;
  if (served->sparse) {
    size_t total = 0;
    for (const Payload* p : from) total += readU64(*p, 0);
    Tensor ids(indices.dtype(), Shape{static_cast<int64_t>(total)});
    Tensor rowsOut(values.dtype(), withRows(values.shape(), static_cast<int64_t>(total)));
    std::vector<int64_t> allIds;
    size_t at = 0;
    for (const Payload* p : from) {
      const std::vector<int64_t> local = sparsePushRowIds(*p, rows, wire.bytes());
      const size_t n = local.size();
      allIds.insert(allIds.end(), local.begin(), local.end());
      wire.widen({p->data() + 8 + n * 8, n * wire.bytes()}, static_cast<uint8_t*>(rowsOut.raw()) + at * rowBytes);
      at += n;
    }
    dispatchIndex(ids.dtype(), [&](auto z) {
      using I = decltype(z);
      for (size_t i = 0; i < total; ++i) ids.data<I>()[i] = static_cast<I>(allIds[i]);
    });
    // The squared norm of the dense gradient these rows stand for: rows of one id add up first.
    const RowGroups groups = groupRowsById(allIds);
    const size_t width = rowBytes / dtypeSize(dtype);
    squaredNorm = 0;
    dispatchFloat(dtype, [&](auto z) {
      using T = decltype(z);
      T* data = rowsOut.data<T>();
      for (size_t i = 0; i < total * width; ++i) data[i] = static_cast<T>(data[i] * sparseScale);
      std::vector<double> row(width);
      for (int64_t g = 0; g < groups.count(); ++g) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int64_t j = groups.begin(g); j < groups.end(g); ++j) {
          const T* src = data + static_cast<size_t>(groups.order[static_cast<size_t>(j)]) * width;
          for (size_t k = 0; k < width; ++k) row[k] += static_cast<double>(src[k]);
        }
        for (double x : row) squaredNorm += x * x;
      }
    });
    result.feeds = {{indices, ids}, {values, rowsOut}};
  } else {
    Tensor sum = Tensor::zeros(dtype, denseGradient.shape());
    squaredNorm = 0;
    dispatchFloat(dtype, [&](auto z) {
      using T = decltype(z);
      T* out = sum.data<T>();
      const size_t n = bytes() / sizeof(T);
      std::vector<T> widened(wire.narrowed ? n : 0);
      for (const Payload* p : from) {
        const T* in = reinterpret_cast<const T*>(p->data());
        if (wire.narrowed) {
          wire.widen(*p, reinterpret_cast<uint8_t*>(widened.data()));
          in = widened.data();
        }
        for (size_t i = 0; i < n; ++i) out[i] += in[i];
      }
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<T>(out[i] * denseScale);
        squaredNorm += static_cast<double>(out[i]) * static_cast<double>(out[i]);
      }
    });
    result.feeds = {{denseGradient, sum}};
  }
  return result;
}

void ParameterServer::PartitionState::update(FeedMap feeds, const Payload& extrasBytes) {
  size_t offset = 0;
  for (const Output& e : extras) {
    Tensor t(e.dtype(), e.shape());
    copyBytes(t.raw(), extrasBytes.data() + offset, t.bytes());
    offset += t.bytes();
    feeds.emplace_back(e, t);
  }
  std::vector<Node*> targets{updateOp};
  targets.insert(targets.end(), averages.begin(), averages.end());
  session->run({}, feeds, targets);
  ++applied;
}

ParameterServer::ParameterServer(const ServerPlan& plan, int server, Options options)
    : plan_(plan), server_(server), options_(std::move(options)), pool_(options_.session.threads) {
  if (options_.groups.members.empty()) options_.groups = SenderGroups::separate(options_.workers);
  WEFT_CHECK(static_cast<int>(options_.groups.groupOfWorker.size()) == options_.workers,
             "the sender groups cover {} workers, the job has {}", options_.groups.groupOfWorker.size(),
             options_.workers);
  leftJob_.assign(static_cast<size_t>(options_.groups.groups()), false);
  saidGoodbye_.assign(static_cast<size_t>(options_.workers), false);
  states_.resize(plan.partitions.size());
  for (size_t i = 0; i < plan.partitions.size(); ++i) {
    if (plan.partitions[i].server != server) continue;
    auto state = std::make_unique<PartitionState>();
    // Partitions are served in parallel with one another, each on one thread.
    state->build(plan, static_cast<int>(i), SessionOptions{1, options_.session.checkNumerics}, options_.wire);
    state->denseScale = options_.denseScale;
    state->sparseScale = options_.sparseScale;
    state->updates = options_.sync->makeUpdates(options_.groups.groups());
    states_[i] = std::move(state);
  }
}

ParameterServer::~ParameterServer() = default;

bool ParameterServer::finished() const {
  return std::all_of(leftJob_.begin(), leftJob_.end(), [](bool left) { return left; });
}

bool ParameterServer::hasLeft(int worker) const {
  const int sender = options_.groups.sends(worker) ? worker : options_.groups.leader(options_.groups.groupOfWorker.at(
                                                                  static_cast<size_t>(worker)));
  return saidGoodbye_.at(static_cast<size_t>(sender));
}

std::vector<int> ParameterServer::partitions() const {
  std::vector<int> out;
  for (const auto& s : states_)
    if (s) out.push_back(s->index);
  return out;
}

namespace {

ParameterServer::Reply replyTo(const RequestHeader& h, Payload payload, uint32_t status = 0) {
  return {static_cast<int>(h.worker), h.kind, encode(ReplyHeader{h.id, status}), std::move(payload)};
}

}  // namespace

void ParameterServer::admit(const RequestHeader& h) const {
  WEFT_CHECK(h.worker < static_cast<uint32_t>(options_.workers), "{} request from worker {}: the job has {} workers",
             requestKindName(h.kind), h.worker, options_.workers);
  const int group = options_.groups.groupOfWorker[h.worker];
  WEFT_CHECK(options_.groups.sends(static_cast<int>(h.worker)),
             "{} request from worker {}, whose machine's local aggregator speaks for it as worker {}",
             requestKindName(h.kind), h.worker, options_.groups.leader(group));
  WEFT_CHECK(!saidGoodbye_[h.worker], "{} request from worker {}, which has said goodbye", requestKindName(h.kind),
             h.worker);
}

void ParameterServer::sayGoodbye(const RequestHeader& h, std::vector<Reply>& out) {
  out.push_back(replyTo(h, {}));
  saidGoodbye_[h.worker] = true;
  // A group leaves once every member that sends has said goodbye (a pipeline replica's stages).
  const int group = options_.groups.groupOfWorker[h.worker];
  for (int member : options_.groups.members[static_cast<size_t>(group)])
    if (options_.groups.sends(member) && !saidGoodbye_[static_cast<size_t>(member)]) return;
  leave(group, out);
}

std::vector<ParameterServer::Reply> ParameterServer::handle(const Message& message) {
  const RequestHeader h = decodeRequest(message.header);
  admit(h);
  if (h.kind == RequestKind::Goodbye) {
    std::vector<Reply> out;
    sayGoodbye(h, out);
    return out;
  }
  return serveOrRefuse(h, message.payload);
}

ParameterServer::Handled ParameterServer::handleAll(const std::vector<Message>& messages) {
  Handled out;
  // Each partition's requests in arrival order; goodbyes once every request before them is served.
  std::map<uint32_t, std::vector<std::pair<RequestHeader, const Payload*>>> byPartition;
  std::vector<RequestHeader> goodbyes;
  std::vector<bool> leaving(saidGoodbye_.size(), false);
  for (const Message& m : messages) {
    try {
      const RequestHeader h = decodeRequest(m.header);
      admit(h);
      WEFT_CHECK(!leaving[h.worker], "{} request from worker {}, which has said goodbye", requestKindName(h.kind),
                 h.worker);
      if (h.kind == RequestKind::Goodbye) {
        leaving[h.worker] = true;
        goodbyes.push_back(h);
      } else {
        byPartition[h.partition].emplace_back(h, &m.payload);
      }
    } catch (const std::exception& e) {
      out.rejected.emplace_back(e.what());
    }
  }
  std::vector<std::vector<std::pair<RequestHeader, const Payload*>>*> queues;
  for (auto& [partition, requests] : byPartition) queues.push_back(&requests);
  std::vector<std::vector<Reply>> replies(queues.size());
  // A partition's requests cost at least its update's pass over the rows it holds.
  pool_.parallelFor(static_cast<int64_t>(queues.size()), 1 << 20, [&](int64_t begin, int64_t end) {
    for (auto q = static_cast<size_t>(begin); q < static_cast<size_t>(end); ++q) {
      for (const auto& [h, payload] : *queues[q]) {
        std::vector<Reply> released = serveOrRefuse(h, *payload);
        std::move(released.begin(), released.end(), std::back_inserter(replies[q]));
      }
    }
  });
  for (std::vector<Reply>& r : replies) std::move(r.begin(), r.end(), std::back_inserter(out.replies));
  for (const RequestHeader& h : goodbyes) sayGoodbye(h, out.replies);
  return out;
}

std::vector<ParameterServer::Reply> ParameterServer::serveOrRefuse(const RequestHeader& h, const Payload& payload) {
  try {
    return serve(partitionFor(h), h, payload);
  } catch (const std::exception& e) {
    const std::string text = fmt::format("server {}: {} request {} of worker {} for partition {}: {}", server_,
                                         requestKindName(h.kind), h.id, h.worker, h.partition, e.what());
    return {replyTo(h, Payload(text.begin(), text.end()), 1)};
  }
}

ParameterServer::PartitionState& ParameterServer::partitionFor(const RequestHeader& h) {
  WEFT_CHECK(h.partition < states_.size(), "the plan has {} partitions", states_.size());
  WEFT_CHECK(states_[h.partition] != nullptr, "partition {} is held by server {}, not this one", h.partition,
             plan_.partitions[h.partition].server);
  return *states_[h.partition];
}

std::vector<ParameterServer::Reply> ParameterServer::serve(PartitionState& p, const RequestHeader& h,
                                                           const Payload& payload) {
  switch (h.kind) {
    case RequestKind::PullRows:
      pullRowIds(payload, p.rows);  // validate now, not when the version arrives
      [[fallthrough]];
    case RequestKind::PullAll:
    case RequestKind::Fetch:
      WEFT_CHECK(h.kind == RequestKind::PullRows || payload.empty(), "{} carries {} bytes, expected none",
                 requestKindName(h.kind), payload.size());
      options_.sync->checkPull(h.clock, versionFor(p, h));
      if (!pullAnswerable(p, h)) {
        const auto sameSender = [&](const auto& w) { return w.header.worker == h.worker; };
        WEFT_CHECK(std::count_if(p.waiting.begin(), p.waiting.end(), sameSender) < kMaxWaitingPulls,
                   "worker {} has {} pulls waiting for version {} already", h.worker, kMaxWaitingPulls, h.clock);
        p.waiting.push_back({h, payload, Clock::now()});
        return {};
      }
      return {answerPull(p, h, payload, Clock::now())};
    case RequestKind::Push: return release(p, p.updates->push(p, h, senderOf(h), payload));
    case RequestKind::Apply: return release(p, p.updates->apply(p, h, senderOf(h), payload));
    case RequestKind::Load:
      // Worker 0 publishes the initial (or restored) values before any gradient arrives; later
      // they would overwrite the job's training.
      WEFT_CHECK(h.worker == 0, "LOAD comes from worker 0 alone, not worker {}", h.worker);
      WEFT_CHECK(p.updates->untouched(p), "LOAD at version {}: values are loaded only before training starts",
                 p.version());
      p.load(payload);
      return {replyTo(h, {})};
    case RequestKind::Goodbye: break;
  }
  WEFT_THROW("unexpected {} request", requestKindName(h.kind));
}

void ParameterServer::PartitionState::checkGradient(const Payload& payload) const {
  if (served->sparse) {
    sparsePushRowIds(payload, rows, wire.bytes());
  } else {
    const size_t expected = static_cast<size_t>(rows) * wire.bytes();
    WEFT_CHECK(payload.size() == expected, "a dense PUSH carries {} bytes, the partition takes {}{}", payload.size(),
               expected, wire.narrowed ? fmt::format(" as {}", dtypeName(wire.wire)) : "");
  }
}

void ParameterServer::PartitionState::checkExtras(const Payload& payload) const {
  size_t expected = 0;
  for (const Output& e : extras) expected += static_cast<size_t>(e.shape().numel()) * dtypeSize(e.dtype());
  WEFT_CHECK(payload.size() == expected, "APPLY carries {} bytes, the update's {} extra inputs take {}", payload.size(),
             extras.size(), expected);
}

int ParameterServer::senderOf(const RequestHeader& h) const { return options_.groups.groupOfWorker[h.worker]; }

uint64_t ParameterServer::versionFor(const PartitionState& p, const RequestHeader& h) const {
  return p.updates->versionOf(p, senderOf(h));
}

std::vector<ParameterServer::Reply> ParameterServer::release(PartitionState& p, std::vector<Released> released) {
  std::vector<Reply> out;
  for (Released& r : released) out.push_back(replyTo(r.to, std::move(r.payload)));
  releaseWaiting(p, out);
  return out;
}

bool ParameterServer::pullAnswerable(const PartitionState& p, const RequestHeader& h) const {
  if (!options_.sync->pullReady(h.clock, versionFor(p, h))) return false;
  // Reading the whole model to evaluate or save it (FETCH) never waits for other senders.
  return h.kind == RequestKind::Fetch || p.updates->mayProceed(senderOf(h));
}

ParameterServer::Reply ParameterServer::answerPull(PartitionState& p, const RequestHeader& h, const Payload& payload,
                                                   Clock::time_point since) {
  if (h.kind != RequestKind::Fetch)
    p.updates->answered(senderOf(h), std::chrono::duration<double>(Clock::now() - since).count(), leftJob_);
  return replyTo(h, p.answer(h, payload));
}

void ParameterServer::releaseWaiting(PartitionState& p, std::vector<Reply>& out) {
  std::vector<PartitionState::WaitingPull> still;
  for (PartitionState::WaitingPull& w : p.waiting) {
    if (pullAnswerable(p, w.header)) {
      out.push_back(answerPull(p, w.header, w.payload, w.since));
    } else {
      still.push_back(std::move(w));
    }
  }
  p.waiting = std::move(still);
}

void ParameterServer::leave(int group, std::vector<Reply>& out) {
  leftJob_[static_cast<size_t>(group)] = true;
  for (const auto& state : states_) {
    if (!state) continue;
    state->updates->leave(group);
    releaseWaiting(*state, out);
  }
}

std::vector<SenderStaleness> ParameterServer::staleness() const {
  std::vector<SenderStaleness> out(leftJob_.size());
  for (const auto& state : states_) {
    if (!state) continue;
    const std::vector<SenderStaleness> partition = state->updates->staleness();
    for (size_t g = 0; g < partition.size(); ++g) {
      const SenderStaleness& s = partition[g];
      out[g].pulls += s.pulls;
      out[g].gapSum += s.gapSum;
      out[g].maxGap = std::max(out[g].maxGap, s.maxGap);
      out[g].waitedSeconds = std::max(out[g].waitedSeconds, s.waitedSeconds);
    }
  }
  return out;
}

int64_t ParameterServer::steps() const {
  int64_t most = 0;
  for (const auto& s : states_)
    if (s) most = std::max(most, static_cast<int64_t>(s->version()));
  return most;
}

}  // namespace weft::dist
