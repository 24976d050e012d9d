// One stage of a synchronous pipeline (see the header).
#include "dist/pipeline/PipelineStage.h"

#include "core/Device.h"
#include "core/Error.h"
#include "core/Trace.h"
#include "dist/launch/Liveness.h"
#include "ops/RowIds.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>

namespace weft::dist {

namespace {

// Tags: 'P' | kind | step (16 bits) | index (16 bits) | micro-batch (16 bits). The step's bits keep
// a stage that is one step ahead from matching a receive of the step before.
enum class TagKind : uint64_t { Header = 1, Payload = 2, Fetches = 3 };
uint64_t tagOf(TagKind kind, uint64_t step, size_t index, int microbatch) {
  return (uint64_t{0x50} << 56) | (static_cast<uint64_t>(kind) << 48) | ((step & 0xffff) << 32) |
         ((static_cast<uint64_t>(index) & 0xffff) << 16) | (static_cast<uint64_t>(microbatch) & 0xffff);
}

// The index field of the tags that move variables rather than transfers.
constexpr size_t kGatherIndex = 0xffff, kScatterIndex = 0xfffe, kTiedIndex = 0xfffd, kTiedPartIndex = 0xfffc;

constexpr int kMaxRank = 8;
struct TensorHeader {
  uint8_t dtype = 0;
  uint8_t rank = 0;
  std::array<int64_t, kMaxRank> dims{};
};
constexpr size_t kHeaderBytes = 8 + 8 * kMaxRank;

std::array<uint8_t, kHeaderBytes> encode(const Tensor& t) {
  WEFT_CHECK(t.shape().rank() <= kMaxRank, "a pipeline transfer has rank {}, above the most, {}", t.shape().rank(),
             kMaxRank);
  std::array<uint8_t, kHeaderBytes> bytes{};
  bytes[0] = static_cast<uint8_t>(t.dtype());
  bytes[1] = static_cast<uint8_t>(t.shape().rank());
  for (int axis = 0; axis < t.shape().rank(); ++axis) {
    const int64_t d = t.shape()[axis];
    std::memcpy(bytes.data() + 8 + sizeof d * static_cast<size_t>(axis), &d, sizeof d);
  }
  return bytes;
}

/// The tensor a header announces, checked against the value's static type; `anyRows`: a sum of
/// sparse rows over micro-batches, whose first dimension is theirs summed.
Tensor allocateFor(const std::array<uint8_t, kHeaderBytes>& bytes, const Output& value, int from,
                   bool anyRows = false) {
  const int rank = bytes[1];
  std::vector<int64_t> dims(static_cast<size_t>(std::min(rank, kMaxRank)));
  for (size_t axis = 0; axis < dims.size(); ++axis)
    std::memcpy(&dims[axis], bytes.data() + 8 + sizeof(int64_t) * axis, sizeof(int64_t));
  const Shape shape(dims);
  Shape expected = value.shape();
  if (anyRows && expected.rank() >= 1) expected[0] = -1;
  bool valid =
      rank <= kMaxRank && bytes[0] == static_cast<uint8_t>(value.dtype()) && shape.compatibleWith(expected);
  for (int64_t d : dims) valid = valid && d >= 0;
  WEFT_CHECK(valid, "stage {} sent {} as dtype #{} shape {}: expected {}", from, value.name(), bytes[0], shape.str(),
             value.type().str());
  shape.bytes(dtypeSize(value.dtype()));  // throws when it overflows
  return Tensor(value.dtype(), shape);
}

template <typename F>
void forFloating(DType dtype, const char* what, F&& f) {
  if (dtype == DType::F32) f(float{});
  else if (dtype == DType::F64) f(double{});
  else WEFT_THROW("pipelined training sums {} gradients in f32 or f64, not {}", what, dtypeName(dtype));
}

void addInto(Tensor& sum, const Tensor& value) {
  forFloating(sum.dtype(), "dense", [&](auto zero) {
    using T = decltype(zero);
    T* s = sum.data<T>();
    const T* v = value.data<T>();
    const int64_t n = sum.numel();  // Shape::numel() checks for overflow: once, not per element
    for (int64_t i = 0; i < n; ++i) s[i] += v[i];
  });
}


/// The parts joined along their first axis.
Tensor concatRows(const std::vector<Tensor>& parts) {
  Shape shape = parts.front().shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.shape()[0];
  Tensor out(parts.front().dtype(), shape);
  char* at = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    if (p.bytes() > 0) std::memcpy(at, p.raw(), p.bytes());
    at += p.bytes();
  }
  return out;
}

size_t rowBytesOf(const Tensor& t) { return t.shape()[0] == 0 ? 0 : t.bytes() / static_cast<size_t>(t.shape()[0]); }

/// Calls f(r, n) for each run ids[r .. r + n) of consecutive ids: one copy each, which on a GPU
/// is one transfer rather than one per row.
template <typename F>
void forConsecutiveRuns(const std::vector<int64_t>& ids, F&& f) {
  for (size_t r = 0, n = 1; r < ids.size(); r += n) {
    for (n = 1; r + n < ids.size() && ids[r + n] == ids[r] + static_cast<int64_t>(n);) ++n;
    f(r, n);
  }
}

/// Rows `ids` of `t` (along its first axis), in that order, on t's device.
Tensor takeRows(const Tensor& t, const std::vector<int64_t>& ids) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(ids.size());
  Tensor rows(t.dtype(), shape, t.device());
  const size_t rowBytes = rowBytesOf(t);
  forConsecutiveRuns(ids, [&](size_t r, size_t n) {
    copyBytes(static_cast<char*>(rows.raw()) + r * rowBytes, rows.device(),
              static_cast<const char*>(t.raw()) + static_cast<size_t>(ids[r]) * rowBytes, t.device(), n * rowBytes);
  });
  return rows;
}

/// Writes `rows` (one per id, any device) into rows `ids` of `t`.
void putRows(Tensor& t, const std::vector<int64_t>& ids, const Tensor& rows) {
  const size_t rowBytes = rowBytesOf(t);
  forConsecutiveRuns(ids, [&](size_t r, size_t n) {
    copyBytes(static_cast<char*>(t.raw()) + static_cast<size_t>(ids[r]) * rowBytes, t.device(),
              static_cast<const char*>(rows.raw()) + r * rowBytes, rows.device(), n * rowBytes);
  });
}

/// Distinct ids, ascending.
std::vector<int64_t> distinct(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// What an update overwrites, kept to restore it: a variable whole, or the rows its sparse
/// update writes (`rows` ascending; `value` holds them in that order).
struct SavedState {
  Node* variable = nullptr;
  std::optional<std::vector<int64_t>> rows;
  Tensor value;
};

/// A variable's gradient over the micro-batches: a dense sum, or sparse rows gathered.
struct GradientSum {
  Tensor dense;
  std::vector<Tensor> indices, values;
  void clear() {
    dense = Tensor();
    indices.clear();
    values.clear();
  }
};

}  // namespace

struct PipelineStage::State {
  Graph& graph;
  int process;  // this process's index among the pipeline's
  PipelineOptions options;
  Transport& transport;
  std::vector<int> peers;
  std::unique_ptr<Session> session;
  // The model stages: which process runs each, and the ones this process runs (ascending).
  std::vector<int> processOf;
  std::vector<int> held;
  // The step being run: its fetches, cut and this process's actions (cut again when they change).
  std::vector<Output> fetches;
  Node* trainStep = nullptr;
  std::optional<PipelineCut> cut;
  std::vector<PipelineAction> actions;
  uint64_t step = 0;
  // The session's count of random draws when the step began: each micro-batch's runs draw under
  // it, for the rows of the total batch it holds (Session::setReplica), what one session running
  // the whole batch at once draws for them. After the step every process's count moves on as one
  // session's would (PipelineCut::drawsRandom), so that the checkpoint worker 0 writes holds the
  // job's count whichever stages draw.
  uint64_t drawsBefore = 0;
  double waitSeconds = 0, stepSeconds = 0;  // over every step so far
  size_t peakKept = 0;                        // the most bytes kept for later runs at once
  // Per step: what each (model stage, micro-batch)'s runs keep, what one held stage sent another
  // (by transfer and micro-batch), what the update's waves keep, the gradient sums and each
  // fetch's sum.
  std::map<std::pair<int, int>, std::map<Output, Tensor>> kept;
  std::map<std::pair<int, int>, Tensor> local;
  std::map<Output, Tensor> updateValues;
  std::vector<Tensor> tiedRowIds;  // per tied variable owned with sparse updates: the rows this step changed
  // Post-validation: the real values of the guessed scalars in the last two steps, and how many
  // updates were made on a guess and how many of those redone.
  std::optional<UpdateGuess> processGuess;  // this process's stages' guesses, merged
  std::vector<Tensor> lastPoints, pointsBefore;
  size_t guessed_ = 0, redone_ = 0;
  std::vector<GradientSum> sums;
  // With replicas: per gradient, whether its mean over the replicas starts as soon as its last
  // micro-batch is summed (a tied variable's and the servers' do not), the runs of this process
  // that sum it in a step and how many have in this one; the waits for the means started.
  std::vector<char> averagedEarly;
  std::vector<int> runsOfGradient, runsDone;
  std::vector<std::function<void()>> averaging;
  std::vector<double> fetchSums;
  // What the step's started sends read until finishSends (a deque keeps the headers in place).
  std::deque<std::array<uint8_t, kHeaderBytes>> headersInFlight;
  std::vector<Tensor> tensorsInFlight;

  State(Graph& g, int s, const PipelineOptions& o, Transport& t, std::vector<int> p)
      : graph(g), process(s), options(o), transport(t), peers(std::move(p)) {
    WEFT_CHECK(options.stages >= 1 && process >= 0 && process < options.stages,
               "pipeline stage {} of {} does not exist", process, options.stages);
    WEFT_CHECK(static_cast<int>(peers.size()) == options.stages, "a pipeline of {} stages needs {} stage peers, got {}",
               options.stages, options.stages, peers.size());
    WEFT_CHECK(options.microbatches >= 1 && options.microbatches <= 0xffff,
               "a pipelined step needs 1 to 65535 micro-batches, got {}", options.microbatches);
    const PipelineOrders orders = options.schedule.orders(options.stages, options.microbatches);
    actions = orders[static_cast<size_t>(process)];
    processOf = processOfStage(orders);
    for (size_t c = 0; c < processOf.size(); ++c)
      if (processOf[c] == process) held.push_back(static_cast<int>(c));
    session = std::make_unique<Session>(graph, options.session);
    // A large send moves only while its sender progresses: between ops, not after the whole run.
    session->setAfterEachOp([this] { transport.progress(); });
  }

  void prepare(const std::vector<Output>& f, Node* t) {
    if (cut && f == fetches && t == trainStep) return;
    for (const Output& o : f) {
      WEFT_CHECK(o.shape().numel() == 1,
                 "a pipelined step fetches scalars (their mean over the micro-batches); {} is {}", o.name(),
                 o.type().str());
    }
    cut = cutPipeline(graph, static_cast<int>(processOf.size()), f, t, options.schedule.splitsWeights());
    WEFT_CHECK(cut->transfers.size() < kTiedPartIndex && graph.variables().size() <= 0xffff &&
                   2 * cut->gradients.size() <= 0xffff && 2 * cut->tied.size() <= 0xffff,
               "a pipeline of {} transfers, {} variables and {} gradients is more than its message tags can number",
               cut->transfers.size(), graph.variables().size(), cut->gradients.size());
    fetches = f;
    trainStep = t;
    sums.assign(cut->gradients.size(), {});
    planAveraging();
    processGuess = mergedGuess();
    lastPoints.clear();
    pointsBefore.clear();
  }

  /// Which gradients' means over the replicas start as soon as they are summed, and how many of
  /// this process's runs sum each.
  void planAveraging() {
    const size_t count = cut->gradients.size();
    runsOfGradient.assign(count, 0);
    for (const PipelineAction& a : actions)
      for (int g : runOf(a).gradients) ++runsOfGradient[static_cast<size_t>(g)];
    averagedEarly.assign(count, 0);
    if (!options.startAveragingOverReplicas) return;
    for (size_t g = 0; g < count; ++g)
      averagedEarly[g] = holds(cut->gradients[g].stage) && averagedByRuntime(g) && runsOfGradient[g] > 0;
    // A tied variable's parts go to its owner first, who averages their sum.
    for (const TiedVariable& tied : cut->tied) {
      for (int g : tied.parts) averagedEarly[static_cast<size_t>(g)] = 0;
      if (tied.gradient >= 0) averagedEarly[static_cast<size_t>(tied.gradient)] = 0;
    }
  }

  /// Whether the replicas' mean of gradient `g` is the runtime's to take: the servers average a
  /// served variable's, and a sharded variable's graph reduce-scatters its own.
  bool averagedByRuntime(size_t g) const { return !cut->gradients[g].served && !cut->gradients[g].sharded; }

  Deadline deadline() const { return Clock::now() + options.timeout; }
  /// The transport peer of the process running model stage `s`.
  int peerOf(int s) const { return peers[static_cast<size_t>(processOf[static_cast<size_t>(s)])]; }
  bool holds(int s) const { return processOf[static_cast<size_t>(s)] == process; }
  /// The model stage `a` runs here.
  int stageOf(const PipelineAction& a) const { return a.stage >= 0 ? a.stage : process; }

  /// Sends `t` (a GPU's through a host copy) and waits until it has gone.
  void sendTensor(int to, uint64_t headerTag, uint64_t payloadTag, const Tensor& value) {
    const Tensor t = value.to(cpu());
    const std::array<uint8_t, kHeaderBytes> header = encode(t);
    transport.send(peerOf(to), headerTag, header, deadline());
    const std::span<const uint8_t> payload(static_cast<const uint8_t*>(t.raw()), t.bytes());
    transport.send(peerOf(to), payloadTag, payload, deadline());
  }

  /// Starts sending `t` without waiting for the receiver (finishSends ends the step's sends):
  /// a stage that sends forward while the next sends back must not wait on it.
  void startSendingTensor(int to, uint64_t headerTag, uint64_t payloadTag, const Tensor& value) {
    const Tensor t = value.to(cpu());  // kept in flight: a GPU's value goes through this host copy
    headersInFlight.push_back(encode(t));
    tensorsInFlight.push_back(t);
    transport.startSend(peerOf(to), headerTag, headersInFlight.back());
    transport.startSend(peerOf(to), payloadTag,
                        std::span<const uint8_t>(static_cast<const uint8_t*>(t.raw()), t.bytes()));
  }

  /// Runs `wait` (receives, or the sends' end) as time this stage waited on others.
  template <typename F>
  void waitFor(const std::string& what, F&& wait) {
    const auto started = TraceClock::now();
    {
      const TraceScope waiting(what, "wait", "pipeline");
      wait();
    }
    waitSeconds += std::chrono::duration<double>(TraceClock::now() - started).count();
  }

  void finishSends() {
    try {
      waitFor("finish the step's sends", [&] { transport.finishSends(deadline()); });
    } catch (const Error& e) {
      WEFT_THROW("pipeline stage {} finishing the sends of step {}: {}", process, step + 1, e.what());
    }
    headersInFlight.clear();
    tensorsInFlight.clear();
  }

  Tensor receiveTensor(int from, uint64_t headerTag, uint64_t payloadTag, const Output& value, bool anyRows = false) {
    std::array<uint8_t, kHeaderBytes> header{};
    transport.receive(headerTag, header, deadline(), peerOf(from));
    Tensor t = allocateFor(header, value, from, anyRows);
    transport.receive(payloadTag, std::span<uint8_t>(static_cast<uint8_t*>(t.raw()), t.bytes()), deadline(),
                      peerOf(from));
    return t;
  }

  void receive(const StageRun& run, int microbatch, std::map<Output, Tensor>& into) {
    for (int t : run.receives) {
      const Transfer& transfer = cut->transfers[static_cast<size_t>(t)];
      if (holds(transfer.from)) {
        auto sent = local.find({t, microbatch});
        WEFT_CHECK(sent != local.end(), "pipeline stage {} needs {} of micro-batch {}, which stage {} has not computed",
                   transfer.to, transfer.value.name(), microbatch, transfer.from);
        into[transfer.value] = std::move(sent->second);
        local.erase(sent);
        continue;
      }
      try {
        into[transfer.value] =
            receiveTensor(transfer.from, tagOf(TagKind::Header, step, static_cast<size_t>(t), microbatch),
                          tagOf(TagKind::Payload, step, static_cast<size_t>(t), microbatch), transfer.value);
      } catch (const Error& e) {
        WEFT_THROW("pipeline stage {} waiting for {} of micro-batch {} from stage {} (step {}): {}", transfer.to,
                   transfer.value.name(), microbatch, transfer.from, step + 1, e.what());
      }
    }
  }

  void send(const StageRun& run, int microbatch, const std::map<Output, Tensor>& values) {
    for (int t : run.sends) {
      const Transfer& transfer = cut->transfers[static_cast<size_t>(t)];
      if (holds(transfer.to)) {  // another of this process's stages: no copy, no transport
        local[{t, microbatch}] = values.at(transfer.value);
        continue;
      }
      try {
        startSendingTensor(transfer.to, tagOf(TagKind::Header, step, static_cast<size_t>(t), microbatch),
                           tagOf(TagKind::Payload, step, static_cast<size_t>(t), microbatch),
                           values.at(transfer.value));
      } catch (const Error& e) {
        WEFT_THROW("pipeline stage {} sending {} of micro-batch {} to stage {} (step {}): {}", transfer.from,
                   transfer.value.name(), microbatch, transfer.to, step + 1, e.what());
      }
    }
  }

  /// Variable `v` (the `i`-th of a list every process knows) from process `from` to process `to`.
  void moveVariable(Node* v, size_t i, int from, int to, size_t kind) {
    const uint64_t headerTag = tagOf(TagKind::Header, step, kind, static_cast<int>(i));
    const uint64_t payloadTag = tagOf(TagKind::Payload, step, kind, static_cast<int>(i));
    if (process == from) sendTensor(firstStageOf(to), headerTag, payloadTag, session->variable(v));
    else session->variable(v).copyFrom(receiveTensor(firstStageOf(from), headerTag, payloadTag, v->output()));
  }

  /// A model stage process `p` runs, to address it.
  int firstStageOf(int p) const {
    return static_cast<int>(std::find(processOf.begin(), processOf.end(), p) - processOf.begin());
  }

  /// The variables process `p`'s stages hold, by node id.
  std::vector<Node*> variablesOf(int p) const {
    std::vector<Node*> all;
    for (size_t c = 0; c < processOf.size(); ++c)
      if (processOf[c] == p) all.insert(all.end(), cut->variables[c].begin(), cut->variables[c].end());
    std::sort(all.begin(), all.end(), [](const Node* a, const Node* b) { return a->id < b->id; });
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  static const Tensor& fed(const FeedMap& feeds, const Output& placeholder) {
    for (const auto& [out, value] : feeds)
      if (out == placeholder) return value;
    WEFT_THROW("placeholder '{}' ({}) is needed by the pipelined step but was not fed", placeholder.node()->name,
               placeholder.type().str());
  }

  /// Runs `run` of model stage `s` on the values it needs; returns every fetched value by output.
  /// `replicated`: whether to run the updates every stage runs for itself (once per process).
  /// `onDevice`: whether fetched values stay where they were computed (on a GPU, a forward's
  /// activations for the backward) rather than coming to the host.
  std::map<Output, Tensor> compute(int s, const StageRun& run, const FeedMap& microbatch,
                                   const std::map<Output, Tensor>& available, bool replicated, bool onDevice) {
    FeedMap feeds;
    for (const Output& p : run.placeholders) feeds.emplace_back(p, fed(microbatch, p));
    for (const Output& in : run.inputs) {
      auto it = available.find(in);
      WEFT_CHECK(it != available.end(), "pipeline stage {}: {} is needed but was neither received nor kept", s,
                 in.name());
      feeds.emplace_back(in, it->second);
    }
    std::vector<Node*> targets = run.targets;
    if (!replicated)
      std::erase_if(targets, [&](Node* n) {
        return std::find(cut->replicated.begin(), cut->replicated.end(), n) != cut->replicated.end();
      });
    std::map<Output, Tensor> out;
    if (run.fetches.empty() && targets.empty()) return out;
    std::vector<Tensor> values =
        onDevice ? session->runOnDevice(run.fetches, feeds, targets) : session->run(run.fetches, feeds, targets);
    noteProgress();
    for (size_t i = 0; i < values.size(); ++i) out[run.fetches[i]] = std::move(values[i]);
    return out;
  }

  void accumulate(const StageRun& run, const std::map<Output, Tensor>& values) {
    for (int g : run.gradients) {
      const GradientLink& link = cut->gradients[static_cast<size_t>(g)].link;
      GradientSum& sum = sums[static_cast<size_t>(g)];
      // Gradients are summed on the host (a GPU's copied there).
      if (link.sparse) {
        sum.indices.push_back(values.at(link.indices).to(cpu()));
        sum.values.push_back(values.at(link.values).to(cpu()));
      } else if (!sum.dense.defined()) {
        sum.dense = values.at(link.dense).to(cpu());  // a fetch is the caller's own tensor: summed into in place
      } else {
        addInto(sum.dense, values.at(link.dense).to(cpu()));
      }
    }
  }

  /// What action `a` runs on its model stage.
  const StageRun& runOf(const PipelineAction& a) const {
    const auto at = static_cast<size_t>(stageOf(a));
    return a.kind == PipelineAction::Kind::Forward    ? cut->forward[at]
           : a.kind == PipelineAction::Kind::Backward ? cut->backward[at]
                                                      : cut->weights[at];
  }

  /// The next runs draw random numbers as one session's run of the whole step would for part
  /// `part` of the total batch (this replica's micro-batch, in order).
  void drawAs(int part) {
    session->setStep(drawsBefore);
    session->setReplica(part);
  }

  /// Forward, backward or weights of one micro-batch on one of this process's stages.
  void act(const PipelineAction& a, const std::vector<FeedMap>& microbatches) {
    const int stage = stageOf(a);
    const StageRun& run = runOf(a);
    std::map<Output, Tensor>& mine = kept[{stage, a.microbatch}];
    waitFor("wait for " + describe(a), [&] { receive(run, a.microbatch, mine); });
    std::map<Output, Tensor> values;
    {
      const TraceScope working(describe(a), "compute", "pipeline");
      drawAs(options.session.replica * options.microbatches + a.microbatch);
      values = compute(stage, run, microbatches[static_cast<size_t>(a.microbatch)], mine, true, true);
    }
    {
      const TraceScope sending("send " + describe(a), "send", "pipeline");
      send(run, a.microbatch, values);
    }
    {
      const TraceScope summing("sum gradients of " + describe(a), "sum", "pipeline");
      accumulate(run, values);
    }
    startAveragingCompleted(run);
    for (const Output& k : run.kept) mine[k] = values.at(k);
    if (a.kind == PipelineAction::Kind::Forward) {
      for (size_t f = 0; f < fetches.size(); ++f)
        if (cut->fetchStage[f] == stage) fetchSums[f] += values.at(fetches[f]).item();
    }
    noteKeptBytes();
    if (a.kind == lastKind()) kept.erase({stage, a.microbatch});  // the micro-batch is done on this stage
  }

  /// The activations (and received values) kept for later runs now, against the peak.
  void noteKeptBytes() {
    size_t bytes = 0;
    for (const auto& [key, values] : kept)
      for (const auto& [output, value] : values) bytes += value.bytes();
    for (const auto& [key, value] : local) bytes += value.bytes();
    peakKept = std::max(peakKept, bytes);
  }

  PipelineAction::Kind lastKind() const {
    return cut->splitWeights ? PipelineAction::Kind::Weights : PipelineAction::Kind::Backward;
  }

  /// Tags of a tied gradient's part `g`: its dense sum or indices (0), or its rows (1).
  uint64_t partTag(TagKind kind, int g, int which) const {
    return tagOf(kind, step, kTiedPartIndex, 2 * g + which);
  }

  void sendPart(int to, int g, int which, const Tensor& t) {
    startSendingTensor(to, partTag(TagKind::Header, g, which), partTag(TagKind::Payload, g, which), t);
  }

  /// This stage's parts of tied variables' gradients, summed over the micro-batches, to their owners.
  void sendTiedParts() {
    for (const TiedVariable& tied : cut->tied) {
      if (holds(tied.owner)) continue;
      for (int g : tied.parts) {
        const StageGradient& part = cut->gradients[static_cast<size_t>(g)];
        if (!holds(part.stage)) continue;
        GradientSum& sum = sums[static_cast<size_t>(g)];
        try {
          if (part.link.sparse) {
            sendPart(tied.owner, g, 0, concatRows(sum.indices));
            sendPart(tied.owner, g, 1, concatRows(sum.values));
          } else {
            sendPart(tied.owner, g, 0, sum.dense);
          }
        } catch (const Error& e) {
          WEFT_THROW("pipeline stage {} sending its part of tied variable '{}''s gradient to stage {} (step {}): {}",
                     part.stage, tied.variable->name, tied.owner, step + 1, e.what());
        }
        sum.clear();
      }
    }
  }

  /// Part `g` of a tied gradient from the stage that summed it.
  GradientSum receivePart(const TiedVariable& tied, int g) {
    const StageGradient& part = cut->gradients[static_cast<size_t>(g)];
    GradientSum sum;
    waitFor("wait for stage " + std::to_string(part.stage) + "'s part of the gradient of tied " + tied.variable->name,
            [&] {
              auto receive = [&](int which, const Output& value) {
                return receiveTensor(part.stage, partTag(TagKind::Header, g, which),
                                     partTag(TagKind::Payload, g, which), value, part.link.sparse);
              };
              try {
                if (part.link.sparse) {
                  sum.indices.push_back(receive(0, part.link.indices));
                  sum.values.push_back(receive(1, part.link.values));
                } else {
                  sum.dense = receive(0, part.link.dense);
                }
              } catch (const Error& e) {
                WEFT_THROW(
                    "pipeline stage {} waiting for stage {}'s part of tied variable '{}''s gradient (step {}): {}",
                    tied.owner, part.stage, tied.variable->name, step + 1, e.what());
              }
            });
    return sum;
  }

  /// A tied variable's gradient on its owner: the parts' sums added (dense) or their rows joined
  /// (sparse), in the order of the parts.
  GradientSum sumOfParts(const TiedVariable& tied) {
    GradientSum whole;
    for (int g : tied.parts) {
      GradientSum& own = sums[static_cast<size_t>(g)];
      const GradientSum part = holds(cut->gradients[static_cast<size_t>(g)].stage) ? own : receivePart(tied, g);
      own.clear();
      whole.indices.insert(whole.indices.end(), part.indices.begin(), part.indices.end());
      whole.values.insert(whole.values.end(), part.values.begin(), part.values.end());
      if (!part.dense.defined()) continue;
      if (!whole.dense.defined()) whole.dense = part.dense;
      else addInto(whole.dense, part.dense);
    }
    return whole;
  }

  /// Gradient `g`'s sum over the micro-batches becomes their mean (a sparse one's rows joined).
  void meanOverMicrobatches(size_t g) {
    GradientSum& sum = sums[g];
    if (cut->gradients[g].link.sparse) {
      sum.indices = {concatRows(sum.indices)};
      sum.values = {concatRows(sum.values)};
      scaleGradient(sum.values.front(), 1.0 / options.microbatches);
    } else {
      scaleGradient(sum.dense, 1.0 / options.microbatches);
    }
  }

  /// Starts the means over the replicas of gradients `bucket`, each a mean over the micro-batches.
  void startAveragingOverReplicas(const std::vector<size_t>& bucket) {
    StageGradients gradients;
    for (size_t g : bucket) {
      GradientSum& sum = sums[g];
      if (cut->gradients[g].link.sparse) gradients.sparse.emplace_back(&sum.indices.front(), &sum.values.front());
      else gradients.dense.push_back(&sum.dense);
    }
    averaging.push_back(options.startAveragingOverReplicas(std::move(gradients)));
  }

  /// With replicas: starts the means over the replicas of the gradients `run` has just summed for
  /// the last time this step, while this process goes on with its other runs.
  void startAveragingCompleted(const StageRun& run) {
    std::vector<size_t> completed;
    for (int g : run.gradients) {
      const auto i = static_cast<size_t>(g);
      if (averagedEarly[i] && ++runsDone[i] == runsOfGradient[i]) completed.push_back(i);
    }
    if (completed.empty()) return;
    for (size_t g : completed) meanOverMicrobatches(g);
    const TraceScope starting("start averaging gradients over the replicas", "send", "pipeline");
    startAveragingOverReplicas(completed);
  }

  /// The mean gradients, as the update reads them (over the replicas too, with replicas).
  void feedGradients(std::map<Output, Tensor>& into) {
    sendTiedParts();
    std::vector<char> isPart(sums.size(), 0);
    for (const TiedVariable& tied : cut->tied) {
      for (int g : tied.parts) isPart[static_cast<size_t>(g)] = 1;
      if (holds(tied.owner) && tied.gradient >= 0) sums[static_cast<size_t>(tied.gradient)] = sumOfParts(tied);
    }
    auto ownWhole = [&](size_t g) { return holds(cut->gradients[g].stage) && !isPart[g]; };
    // What was not averaged as soon as it was summed (tied variables', with replicas) is now.
    std::vector<size_t> late;
    for (size_t g = 0; g < sums.size(); ++g) {
      if (!ownWhole(g) || averagedEarly[g]) continue;
      meanOverMicrobatches(g);
      if (options.startAveragingOverReplicas && averagedByRuntime(g)) late.push_back(g);
    }
    if (!late.empty()) startAveragingOverReplicas(late);
    if (!averaging.empty()) {
      waitFor("average gradients over the replicas", [&] {
        for (const std::function<void()>& wait : averaging) wait();
      });
    }
    averaging.clear();
    for (size_t g = 0; g < sums.size(); ++g) {
      if (!ownWhole(g)) continue;
      const GradientLink& link = cut->gradients[g].link;
      GradientSum& sum = sums[g];
      if (link.sparse) {
        into[link.indices] = sum.indices.front();
        into[link.values] = sum.values.front();
      } else {
        into[link.dense] = sum.dense;
      }
      sum.clear();
    }
  }

  /// The update: on guessed scalars where the last two steps had the same ones (post-validation),
  /// else in waves.
  void update(const FeedMap& firstMicrobatch) {
    updateValues.clear();
    feedGradients(updateValues);
    if (guessing()) {
      updateOnGuess(firstMicrobatch);
    } else {
      updateInWaves(firstMicrobatch);
      rememberPoints(firstMicrobatch);
    }
    keepTiedRowIds();
    updateValues.clear();
    shareTiedVariables();
  }

  /// What this process's update may guess, or null: post-validation needs one stage a process.
  const UpdateGuess* guessable() const { return processGuess ? &*processGuess : nullptr; }

  /// This process's stages' guesses as one, or none: post-validation off, a stage that receives
  /// in the update with nothing to guess, or a process that would both send what it computes
  /// from received values to another process and wait for such values from one (which could
  /// wait in a circle).
  std::optional<UpdateGuess> mergedGuess() const {
    if (!options.postValidation) return std::nullopt;
    std::set<int> computedSends;
    for (const UpdateGuess& g : cut->guesses) computedSends.insert(g.remoteSends.begin(), g.remoteSends.end());
    UpdateGuess merged;
    auto join = [](auto& into, const auto& more) {
      for (const auto& x : more)
        if (std::find(into.begin(), into.end(), x) == into.end()) into.push_back(x);
    };
    for (int stage : held) {
      if (cut->updatesServers[static_cast<size_t>(stage)]) return std::nullopt;
      const UpdateGuess& g = cut->guesses[static_cast<size_t>(stage)];
      const bool receives = std::any_of(cut->transfers.begin(), cut->transfers.end(), [&](const Transfer& t) {
        return t.to == stage && t.receivedIn == Phase::Update;
      });
      if (!g.possible() && receives) return std::nullopt;
      join(merged.points, g.points);
      join(merged.localInputs, g.localInputs);
      join(merged.localSends, g.localSends);
      join(merged.remoteSends, g.remoteSends);
      join(merged.receives, g.receives);
    }
    auto crosses = [&](int t) {
      return !holds(cut->transfers[static_cast<size_t>(t)].from) || !holds(cut->transfers[static_cast<size_t>(t)].to);
    };
    const bool sendsComputed = std::any_of(merged.remoteSends.begin(), merged.remoteSends.end(), crosses);
    const bool waitsComputed = std::any_of(merged.receives.begin(), merged.receives.end(),
                                           [&](int t) { return computedSends.count(t) && crosses(t); });
    if (!merged.possible() || (sendsComputed && waitsComputed)) return std::nullopt;
    // What one of its stages computes from received values for another it computes itself.
    std::erase_if(merged.receives, [&](int t) { return computedSends.count(t) && !crosses(t); });
    return merged;
  }

  /// Whether to guess this step: the guessed scalars were bit for bit the same in the last two.
  bool guessing() const {
    if (!guessable() || lastPoints.empty() || pointsBefore.empty()) return false;
    for (size_t i = 0; i < lastPoints.size(); ++i)
      if (!sameBits(lastPoints[i], pointsBefore[i])) return false;
    return true;
  }

  static bool sameBits(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
  }

  void notePoints(std::vector<Tensor> points) {
    pointsBefore = std::move(lastPoints);
    lastPoints = std::move(points);
  }

  /// The feeds of an update run beyond the gradients: the first micro-batch's placeholders that
  /// the update's waves read.
  FeedMap updateFeeds(const FeedMap& firstMicrobatch, const std::map<Output, Tensor>& values) const {
    FeedMap feeds;
    for (int stage : held)
      for (const StageRun& wave : cut->update[static_cast<size_t>(stage)])
        for (const Output& p : wave.placeholders)
          if (std::none_of(feeds.begin(), feeds.end(), [&](const auto& f) { return f.first == p; }))
            feeds.emplace_back(p, fed(firstMicrobatch, p));
    for (const auto& [out, value] : values) feeds.emplace_back(out, value);
    return feeds;
  }

  /// After an update in waves, the real values of the scalars a later step may guess.
  void rememberPoints(const FeedMap& firstMicrobatch) {
    const UpdateGuess* guess = guessable();
    if (!guess) return;
    const std::map<Output, Tensor> real = fetchUpdateValues(guess->points, firstMicrobatch, updateValues);
    std::vector<Tensor> points;
    for (const Output& p : guess->points) points.push_back(real.at(p));
    notePoints(std::move(points));
  }

  /// Post-validation: sends what the others wait for from this stage's own values, updates on
  /// last step's scalars, then receives, computes the real scalars and sends what depends on
  /// them; a wrong guess restores the variables and updates again on the real scalars.
  void updateOnGuess(const FeedMap& firstMicrobatch) {
    const UpdateGuess& guess = *guessable();
    const std::vector<Tensor> guessed = lastPoints;
    StageRun local;
    local.sends = guess.localSends;
    for (int t : guess.localSends) local.fetches.push_back(cut->transfers[static_cast<size_t>(t)].value);
    local.fetches.insert(local.fetches.end(), guess.localInputs.begin(), guess.localInputs.end());
    std::map<Output, Tensor> own = fetchUpdateValues(local.fetches, firstMicrobatch, updateValues);
    send(local, 0, own);
    const std::vector<SavedState> before = saveUpdated();
    runUpdates(firstMicrobatch, guess.points, guessed);
    StageRun received;
    received.receives = guess.receives;
    waitFor("wait for the update's values from other stages", [&] { receive(received, 0, updateValues); });
    StageRun remote;
    remote.sends = guess.remoteSends;
    remote.fetches = guess.points;
    for (int t : guess.remoteSends) remote.fetches.push_back(cut->transfers[static_cast<size_t>(t)].value);
    for (const Output& in : guess.localInputs) updateValues[in] = own.at(in);
    std::map<Output, Tensor> real = fetchUpdateValues(remote.fetches, firstMicrobatch, updateValues);
    send(remote, 0, real);
    std::vector<Tensor> points;
    for (const Output& p : guess.points) points.push_back(real.at(p));
    ++guessed_;
    bool right = true;
    for (size_t i = 0; i < points.size(); ++i) right = right && sameBits(points[i], guessed[i]);
    if (!right) {
      ++redone_;
      const TraceScope redo("redo the update", "compute", "pipeline");
      restore(before);
      runUpdates(firstMicrobatch, guess.points, points);
    }
    notePoints(std::move(points));
  }

  /// `wanted` update values: those among `values` as they are, the others computed from them.
  std::map<Output, Tensor> fetchUpdateValues(const std::vector<Output>& wanted, const FeedMap& firstMicrobatch,
                                             const std::map<Output, Tensor>& values) {
    std::map<Output, Tensor> out;
    std::vector<Output> computed;
    for (const Output& w : wanted) {
      if (auto it = values.find(w); it != values.end()) out[w] = it->second;
      else computed.push_back(w);
    }
    if (computed.empty()) return out;
    std::vector<Tensor> got = session->run(computed, updateFeeds(firstMicrobatch, values), {});
    for (size_t i = 0; i < computed.size(); ++i) out[computed[i]] = std::move(got[i]);
    return out;
  }

  /// Every update of this process's stages, once each (the step counter's increment is every
  /// stage's).
  std::vector<Node*> updatesOfProcess() const {
    std::vector<Node*> targets;
    for (int stage : held)
      for (const StageRun& wave : cut->update[static_cast<size_t>(stage)])
        for (Node* target : wave.targets)
          if (std::find(targets.begin(), targets.end(), target) == targets.end()) targets.push_back(target);
    return targets;
  }

  /// What this process's updates overwrite: each variable they write whole, except where an
  /// update is sparse (its variable's gradient is), which writes only the gradient's rows of the
  /// variable and of its slots.
  std::vector<SavedState> saveUpdated() {
    std::map<Node*, const Tensor*> sparseRows;  // variable -> its gradient's row ids this step
    for (const StageGradient& g : cut->gradients)
      if (auto it = updateValues.find(g.link.indices); g.link.sparse && it != updateValues.end())
        sparseRows[g.link.variable] = &it->second;
    std::vector<SavedState> saved;
    for (Node* target : updatesOfProcess()) {
        // The rows of its sparse variable, and that variable's row count: its slots have as many.
        std::optional<std::vector<int64_t>> rows;
        int64_t rowCount = -1;
        for (int m : target->def->mutatedInputs)
          if (auto it = sparseRows.find(target->inputs[static_cast<size_t>(m)].node()); it != sparseRows.end()) {
            rowCount = session->variable(it->first).shape()[0];
            rows = distinct(checkedRowIds(*it->second, rowCount, "row id"));
          }
        for (int m : target->def->mutatedInputs) {
          Node* v = target->inputs[static_cast<size_t>(m)].node();
          if (std::any_of(saved.begin(), saved.end(), [&](const SavedState& s) { return s.variable == v; })) continue;
          const Tensor& value = session->variable(v);
          const bool byRows = rows && value.shape().rank() >= 1 && value.shape()[0] == rowCount;
          saved.push_back(byRows ? SavedState{v, rows, takeRows(value, *rows)}
                                 : SavedState{v, std::nullopt, value.clone()});
        }
    }
    return saved;
  }

  void restore(const std::vector<SavedState>& saved) {
    for (const SavedState& s : saved) {
      Tensor& variable = session->variable(s.variable);
      if (s.rows) putRows(variable, *s.rows, s.value);
      else variable.copyFrom(s.value);
    }
  }

  /// Every update of this process in one run, `points` fed with `values`.
  void runUpdates(const FeedMap& firstMicrobatch, const std::vector<Output>& points,
                  const std::vector<Tensor>& values) {
    std::map<Output, Tensor> feeds = updateValues;
    for (size_t i = 0; i < points.size(); ++i) feeds[points[i]] = values[i];
    const TraceScope working("update", "compute", "pipeline");
    session->run({}, updateFeeds(firstMicrobatch, feeds), updatesOfProcess());
  }

  /// The update's waves, wave by wave over this process's stages (every stage has as many), the
  /// updates every stage runs for itself once, with the last stage's last wave.
  void updateInWaves(const FeedMap& firstMicrobatch) {
    const size_t waves = cut->update[static_cast<size_t>(held.front())].size();
    for (size_t w = 0; w < waves; ++w) {
      for (int stage : held) {
        const StageRun& wave = cut->update[static_cast<size_t>(stage)][w];
        waitFor(fmt::format("wait for update wave {}", w), [&] { receive(wave, 0, updateValues); });
        std::map<Output, Tensor> values;
        {
          const TraceScope working(fmt::format("update wave {}", w), "compute", "pipeline");
          values = compute(stage, wave, firstMicrobatch, updateValues, stage == held.back(), false);
        }
        for (const auto& [out, value] : values) updateValues[out] = value;
        send(wave, 0, updateValues);
      }
    }
  }

  /// Per tied variable this stage owns with sparse updates: the row ids its update read.
  void keepTiedRowIds() {
    tiedRowIds.assign(cut->tied.size(), Tensor());
    for (size_t i = 0; i < cut->tied.size(); ++i) {
      const TiedVariable& tied = cut->tied[i];
      if (!holds(tied.owner) || !tied.rows.valid()) continue;
      auto it = updateValues.find(tied.rows);
      WEFT_CHECK(it != updateValues.end(),
                 "pipeline stage {}: the row ids {} of tied variable '{}''s update are missing", tied.owner,
                 tied.rows.name(), tied.variable->name);
      tiedRowIds[i] = it->second;
    }
  }

  uint64_t tiedTag(TagKind kind, size_t i, int which) const {
    return tagOf(kind, step, kTiedIndex, static_cast<int>(2 * i) + which);
  }

  /// Each tied variable's update, from the process that made it to the processes holding copies:
  /// the rows it changed where its updates are sparse, else all of it. A process's stages share
  /// one copy.
  void shareTiedVariables() {
    for (size_t i = 0; i < cut->tied.size(); ++i) {
      const TiedVariable& tied = cut->tied[i];
      if (holds(tied.owner)) {
        sendTiedUpdate(i);
      } else if (const int copy = localCopy(tied); copy >= 0) {
        waitFor("wait for the update of tied " + tied.variable->name, [&] {
          try {
            receiveTiedUpdate(i);
          } catch (const Error& e) {
            WEFT_THROW("pipeline stage {} waiting for the update of tied variable '{}' from stage {} (step {}): {}",
                       copy, tied.variable->name, tied.owner, step + 1, e.what());
          }
        });
      }
    }
  }

  /// The first of this process's stages that holds a copy of `tied`, or -1.
  int localCopy(const TiedVariable& tied) const {
    for (int c : tied.copies)
      if (holds(c)) return c;
    return -1;
  }

  /// The stages of other processes holding copies of `tied`, one per process.
  std::vector<int> remoteCopies(const TiedVariable& tied) const {
    std::vector<int> copies, processes;
    for (int c : tied.copies) {
      const int p = processOf[static_cast<size_t>(c)];
      if (p == process || std::find(processes.begin(), processes.end(), p) != processes.end()) continue;
      processes.push_back(p);
      copies.push_back(c);
    }
    return copies;
  }

  void sendTiedUpdate(size_t i) {
    const TiedVariable& tied = cut->tied[i];
    const Tensor& variable = session->variable(tied.variable);
    std::vector<Tensor> message{variable};
    if (tied.rows.valid()) {
      const std::vector<int64_t> ids = distinct(rowIds(tiedRowIds[i]));
      message = {Tensor::fromVector(ids, {static_cast<int64_t>(ids.size())}).cast(tied.rows.dtype()),
                 takeRows(variable, ids)};
    }
    for (int to : remoteCopies(tied))
      for (size_t m = 0; m < message.size(); ++m)
        startSendingTensor(to, tiedTag(TagKind::Header, i, static_cast<int>(m)),
                           tiedTag(TagKind::Payload, i, static_cast<int>(m)), message[m]);
  }

  void receiveTiedUpdate(size_t i) {
    const TiedVariable& tied = cut->tied[i];
    Tensor& variable = session->variable(tied.variable);
    auto receive = [&](int which, const Output& value, bool anyRows) {
      return receiveTensor(tied.owner, tiedTag(TagKind::Header, i, which), tiedTag(TagKind::Payload, i, which), value,
                           anyRows);
    };
    if (!tied.rows.valid()) {
      variable.copyFrom(receive(0, tied.variable->output(), false));
      return;
    }
    const Tensor idsTensor = receive(0, tied.rows, true);
    const Tensor rows = receive(1, tied.variable->output(), true);
    const std::vector<int64_t> ids = checkedRowIds(idsTensor, variable.shape()[0], "row id");
    WEFT_CHECK(rows.shape()[0] == static_cast<int64_t>(ids.size()), "stage {} sent {} rows for {} row ids", tied.owner,
               rows.shape()[0], ids.size());
    putRows(variable, ids, rows);
  }

  /// Each fetch's mean, from the process that computed it to every other.
  std::vector<double> shareFetches() {
    std::vector<double> means(fetches.size());
    for (size_t f = 0; f < fetches.size(); ++f) {
      const int owner = cut->fetchStage[f];
      const uint64_t tag = tagOf(TagKind::Fetches, step, f, 0);
      if (holds(owner)) {
        means[f] = fetchSums[f] / options.microbatches;
        const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(&means[f]), sizeof(double));
        for (int p = 0; p < options.stages; ++p)
          if (p != process) transport.startSend(peers[static_cast<size_t>(p)], tag, bytes);
      } else {
        waitFor("wait for the step's loss", [&] {
          transport.receive(tag, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&means[f]), sizeof(double)), deadline(),
                            peerOf(owner));
        });
      }
    }
    return means;
  }
};

PipelineStage::PipelineStage(Graph& graph, int stage, const PipelineOptions& options, Transport& transport,
                             std::vector<int> stagePeers)
    : state_(std::make_unique<State>(graph, stage, options, transport, std::move(stagePeers))) {}

PipelineStage::~PipelineStage() = default;

std::vector<double> PipelineStage::step(const std::vector<Output>& fetches, Node* trainStep,
                                        const std::vector<FeedMap>& microbatches) {
  State& s = *state_;
  s.prepare(fetches, trainStep);
  const auto started = TraceClock::now();
  WEFT_CHECK(static_cast<int>(microbatches.size()) == s.options.microbatches,
             "a pipelined step of {} micro-batches was given {}", s.options.microbatches, microbatches.size());
  s.kept.clear();
  s.local.clear();
  s.fetchSums.assign(s.fetches.size(), 0.0);
  for (GradientSum& sum : s.sums) sum.clear();  // a failed step's, were it retried
  s.runsDone.assign(s.runsOfGradient.size(), 0);
  s.averaging.clear();
  s.drawsBefore = s.session->step();
  try {
    for (const PipelineAction& a : s.actions) s.act(a, microbatches);
    s.drawAs(s.options.session.replica);
    s.update(microbatches.front());
  } catch (...) {
    s.drawAs(s.options.session.replica);  // as before the step, were it retried
    throw;
  }
  s.session->setStep(s.drawsBefore + (s.cut->drawsRandom ? 1 : 0));
  std::vector<double> means = s.shareFetches();
  s.finishSends();
  s.stepSeconds += std::chrono::duration<double>(TraceClock::now() - started).count();
  ++s.step;
  return means;
}

void PipelineStage::gatherVariables(int into) {
  State& s = *state_;
  if (!s.cut) return;  // no step yet: every stage still holds the initial values
  // Each process's own variables go to `into`, in an order every process knows.
  for (int from = 0; from < s.options.stages; ++from) {
    if (from == into || (s.process != from && s.process != into)) continue;
    const std::vector<Node*> held = s.variablesOf(from);
    for (size_t i = 0; i < held.size(); ++i) s.moveVariable(held[i], i, from, into, kGatherIndex);
  }
}

void PipelineStage::scatterVariables(int from) {
  State& s = *state_;
  // Every variable to every stage: what a stage does not hold costs a copy, and no cut is needed.
  const std::vector<Node*> all = s.graph.variables();
  for (int to = 0; to < s.options.stages; ++to) {
    if (to == from || (s.process != from && s.process != to)) continue;
    for (size_t i = 0; i < all.size(); ++i) s.moveVariable(all[i], i, from, to, kScatterIndex);
  }
}

const PipelineCut& PipelineStage::cut() const {
  WEFT_CHECK(state_->cut.has_value(), "pipeline stage {} has not run a step: it has no cut yet", state_->process);
  return *state_->cut;
}

int PipelineStage::stage() const { return state_->process; }
Session& PipelineStage::session() { return *state_->session; }
double PipelineStage::idleFraction() const {
  return state_->stepSeconds > 0 ? state_->waitSeconds / state_->stepSeconds : 0;
}
size_t PipelineStage::peakKeptBytes() const { return state_->peakKept; }
size_t PipelineStage::updatesGuessed() const { return state_->guessed_; }
size_t PipelineStage::updatesRedone() const { return state_->redone_; }

void scaleGradient(Tensor& t, double factor) {
  forFloating(t.dtype(), "the", [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] * factor);
  });
}

std::vector<FeedMap> splitMicrobatches(const FeedMap& feeds, int count) {
  WEFT_CHECK(count >= 1, "cannot cut a batch into {} micro-batches", count);
  std::vector<FeedMap> parts(static_cast<size_t>(count));
  for (const auto& [placeholder, value] : feeds) {
    const Shape& declared = placeholder.shape();
    const bool batched = declared.rank() >= 1 && declared[0] == -1 && value.shape().rank() >= 1;
    if (!batched) {
      for (FeedMap& part : parts) part.emplace_back(placeholder, value);
      continue;
    }
    const int64_t rows = value.shape()[0];
    WEFT_CHECK(rows % count == 0, "the feed of '{}' has {} rows, which do not cut into {} equal micro-batches",
               placeholder.node()->name, rows, count);
    Shape shape = value.shape();
    shape[0] = rows / count;
    const Tensor host = value.to(cpu());
    for (int i = 0; i < count; ++i) {
      Tensor part(value.dtype(), shape);
      if (part.bytes() > 0)
        std::memcpy(part.raw(), static_cast<const char*>(host.raw()) + static_cast<size_t>(i) * part.bytes(),
                    part.bytes());
      parts[static_cast<size_t>(i)].emplace_back(placeholder, part);
    }
  }
  return parts;
}

}  // namespace weft::dist
