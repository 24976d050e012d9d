// Synchronous pipelines (dist/pipeline/Pipeline.h, dist/pipeline/PipelineStage.h): the cut of a training graph into
// stages and phases, and training with every stage on its own thread over in-process transports,
// which must give the variables of single-device training on the whole batch.
#include "tests/TestUtil.h"

#include "core/Trace.h"
#include "dist/transport/LoopbackTransport.h"
#include "dist/pipeline/PipelineStage.h"
#include "dist/Placement.h"
#include "dist/Transform.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"
#include "testing/OpTest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>


using namespace weft;
using namespace weft::dist;
using namespace std::chrono_literals;
using weft::testing::randomTensor;

namespace {

/// How the model's output layer uses the embedding table.
enum class Tie {
  None,    ///< an output layer of its own
  Dense,   ///< logits = h table^T (GPT's tied softmax): the table's gradient sums a sparse and a dense part
  Sparse,  ///< logits = h table[candidates]^T (the LM's sampled softmax): both parts sparse
  Frozen,  ///< logits = h stopGradient(table)^T: two stages read the table, its gradient is the first's
};

/// Embedding (a sparse gradient) and `layers` dense layers in float64, the layers spread over
/// `stages` stages in order; the embedding is in stage 0. Tied, the last layer's 5 outputs are
/// scored against rows of the embedding table, in the last stage. Loss-scaled, stage 0 adds
/// sqrt(x^2 w) to the input: finite, but the gradient of w is 0/0 where an input is exactly 0,
/// so that one stage's gradient alone is not finite. With dropout, the first layer's output is
/// dropped at `dropout`, that layer in a recompute segment where `recomputed` (its backward
/// draws the mask again).
struct Model {
  Graph g;
  Output ids, x, y, candidates, loss;
  Node* step = nullptr;

  explicit Model(int stages, double clip = 0, Tie tie = Tie::None, int layers = 4, bool lossScaled = false,
                 double dropoutRate = 0, bool recomputed = false) {
    g.setSeed(11);
    ids = g.placeholder("ids", i64, {-1});
    x = g.placeholder("x", f64, {-1, 5});
    y = g.placeholder("y", i64, {-1});
    Output h, table;
    {
      auto first = g.stage(0);
      table = g.variable("embedding", f64, {30, 5}, Initializer::normal(0, 0.5));
      h = gather(table, ids) + x;
      if (lossScaled) h = h + sqrt(x * x * g.variable("sqrt_weight", f64, {5}, Initializer::constant(1)));
    }
    std::vector<int64_t> widths(static_cast<size_t>(layers) + 1, 8);
    widths.front() = 5;
    widths.back() = tie == Tie::None ? 3 : 5;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      auto staged = g.stage(static_cast<int>(l) * stages / layers);
      nn::Linear layer(g, fmt::format("fc{}", l), widths[l], widths[l + 1], true, f64);
      std::optional<Graph::RecomputeScope> segment;
      if (l == 0 && recomputed) segment.emplace(g, Recompute::Full);
      h = l + 2 < widths.size() ? tanh(layer(h)) : layer(h);
      if (l == 0 && dropoutRate > 0) h = dropout(h, dropoutRate, 7);
    }
    if (tie != Tie::None) {
      auto last = g.stage(stages - 1);
      candidates = g.placeholder("candidates", i64, {6});
      const Output scored = tie == Tie::Dense    ? table
                            : tie == Tie::Sparse ? gather(table, candidates)
                                                 : stopGradient(table);
      h = matmul(h, scored, false, true);
    }
    loss = nn::meanSparseCrossEntropy(h, y);
    optim::MinimizeOptions options;
    options.clipGlobalNorm = clip;
    if (lossScaled) options.lossScaling = optim::LossScaling{.growthInterval = 3};
    step = optim::Adam(0.05).minimize(loss, options);
  }

  int64_t loudStep = -1;  ///< a step whose inputs are 1000 times larger: its gradients clip
  std::set<int64_t> zeroSteps;  ///< steps whose first input is 0: loss-scaled, their stage 0 gradient is not finite

  FeedMap feeds(int64_t step, int64_t rows) const {
    Tensor idValues(i64, {rows}), labels(i64, {rows});
    for (int64_t i = 0; i < rows; ++i) {
      idValues.data<int64_t>()[i] = (i * 7 + step * 3) % 17;  // repeated ids: rows summed
      labels.data<int64_t>()[i] = (i + step) % 3;
    }
    Tensor inputs = randomTensor(f64, {rows, 5}, 300 + static_cast<uint64_t>(step));
    if (step == loudStep) scaleGradient(inputs, 1000);
    if (zeroSteps.count(step)) inputs.data<double>()[0] = 0;
    FeedMap feeds{{ids, idValues}, {x, inputs}, {y, labels}};
    if (candidates.valid()) {
      // Rows the input looks up too (2, 9) and rows it never does (29).
      feeds.emplace_back(candidates, Tensor::fromVector(std::vector<int64_t>{(step + 2) % 3, 2, 29, 9, 20, 2}, {6}));
    }
    return feeds;
  }
};

constexpr int64_t kRows = 8, kSteps = 3;

/// How many steps to train, which one has loud inputs (Model::loudStep), whether the loss is
/// scaled, and which steps' gradients on stage 0 are then not finite (Model::zeroSteps).
struct Steps {
  int64_t count = kSteps;
  int64_t loud = -1;
  bool lossScaled = false;
  std::set<int64_t> zero = {};
  double dropout = 0;
  bool recomputed = false;
};

struct Trained {
  std::map<std::string, Tensor> variables;  // slots and the step counter included
  std::vector<double> losses;
  std::vector<std::string> errors;
  std::vector<size_t> peakKept;  // per stage: PipelineStage::peakKeptBytes
  std::map<int, Tensor> embeddingCopies;  // per stage that holds the embedding table: its own copy
  std::vector<size_t> guessed, redone;    // per stage: PipelineStage::updatesGuessed, updatesRedone
  std::map<int, Tensor> lossScales;       // per process, when the loss is scaled: its own copy of the scale
  std::map<int, uint64_t> randomSteps;    // per process (one device: 0): its session's count of random draws
  std::vector<std::string> tensorsSentInUpdate;  // values other than scalars that a stage's update receives
};

/// kSteps single-device steps on the whole batch.
Trained singleDevice(double clip, Tie tie = Tie::None, int layers = 4, Steps steps = {}) {
  Model m(1, clip, tie, layers, steps.lossScaled, steps.dropout, steps.recomputed);
  m.loudStep = steps.loud;
  m.zeroSteps = steps.zero;
  // A loss-scaled step's overflow is left to the skip; any other would stop the run.
  Session session(m.g, SessionOptions{.checkNumerics = steps.lossScaled});
  Trained out;
  for (int64_t s = 0; s < steps.count; ++s)
    out.losses.push_back(session.run({m.loss}, m.feeds(s, kRows), {m.step})[0].item());
  for (Node* v : m.g.variables()) out.variables[v->name] = session.variable(v).clone();
  out.randomSteps[0] = session.step();
  return out;
}

/// One in-process transport per stage, each connected to every other: peers[r][q] is stage r's
/// peer id of stage q.
struct LoopbackStages {
  std::shared_ptr<LoopbackNetwork> network = std::make_shared<LoopbackNetwork>();
  std::vector<std::unique_ptr<LoopbackTransport>> transports;
  std::vector<std::vector<int>> peers;

  explicit LoopbackStages(int stages)
      : peers(static_cast<size_t>(stages), std::vector<int>(static_cast<size_t>(stages), -1)) {
    for (int s = 0; s < stages; ++s) transports.push_back(std::make_unique<LoopbackTransport>(network));
    for (int r = 0; r < stages; ++r)
      for (int q = 0; q < stages; ++q)
        if (q != r)
          peers[static_cast<size_t>(r)][static_cast<size_t>(q)] = transports[static_cast<size_t>(r)]->connect(
              transports[static_cast<size_t>(q)]->address(), static_cast<EndpointName>(q));
  }
};

/// Stands in for the replicas' averaging of process `process`'s gradients (PipelineOptions::
/// startAveragingOverReplicas).
using Averager = std::function<std::function<void()>(size_t process, StageGradients)>;

/// kSteps pipelined steps, each stage process on a thread; process 0's variables after gathering
/// them. `dies` (a process) fails before its first step, as a killed process would.
Trained pipelined(int stages, int microbatches, const StepSchedule& schedule, double clip, int dies = -1,
                  Tie tie = Tie::None, int layers = 4, Steps steps = {}, const Averager& average = {}) {
  LoopbackStages links(stages);
  auto& network = links.network;
  auto& transports = links.transports;
  auto& peers = links.peers;
  Trained result;
  result.peakKept.resize(static_cast<size_t>(stages));
  result.guessed.resize(static_cast<size_t>(stages));
  result.redone.resize(static_cast<size_t>(stages));
  std::vector<std::unique_ptr<Model>> models;
  for (int s = 0; s < stages; ++s)
    models.push_back(std::make_unique<Model>(schedule.modelStages(stages), clip, tie, layers, steps.lossScaled,
                                             steps.dropout, steps.recomputed));
  const std::vector<int> processOf = processOfStage(schedule.orders(stages, microbatches));
  std::mutex copies;
  result.errors = onThreads(static_cast<size_t>(stages), [&](size_t s) {
    Model& m = *models[s];
    m.loudStep = steps.loud;
    m.zeroSteps = steps.zero;
    PipelineOptions options;
    options.stages = stages;
    options.microbatches = microbatches;
    options.schedule = schedule;
    options.timeout = 60s;
    options.session.checkNumerics = steps.lossScaled;
    if (average) options.startAveragingOverReplicas = [&average, s](StageGradients g) { return average(s, g); };
    PipelineStage stage(m.g, static_cast<int>(s), options, *transports[s], peers[s]);
    try {
      WEFT_CHECK(static_cast<int>(s) != dies, "stage {} dies", s);
      for (int64_t step = 0; step < steps.count; ++step) {
        const double loss = stage.step({m.loss}, m.step, splitMicrobatches(m.feeds(step, kRows), microbatches))[0];
        if (s == 0) result.losses.push_back(loss);
      }
      result.peakKept[s] = stage.peakKeptBytes();
      result.guessed[s] = stage.updatesGuessed();
      result.redone[s] = stage.updatesRedone();
      Node* table = m.g.find("embedding");
      bool holdsTable = false;
      for (size_t c = 0; c < processOf.size(); ++c) {
        const std::vector<Node*>& held = stage.cut().variables[c];
        holdsTable |= processOf[c] == static_cast<int>(s) && std::find(held.begin(), held.end(), table) != held.end();
      }
      {
        const std::lock_guard<std::mutex> lock(copies);
        if (holdsTable) result.embeddingCopies[static_cast<int>(s)] = stage.session().variable(table).clone();
        if (Node* scale = m.g.find("loss_scale"))
          result.lossScales[static_cast<int>(s)] = stage.session().variable(scale).clone();
        result.randomSteps[static_cast<int>(s)] = stage.session().step();
        if (s == 0)
          for (const Transfer& t : stage.cut().transfers)
            if (t.receivedIn == Phase::Update && t.value.shape().numel() != 1)
              result.tensorsSentInUpdate.push_back(t.value.name());
      }
      stage.gatherVariables(0);
    } catch (const std::exception& e) {
      network->fail(transports[s]->endpoint(), e.what());  // the others stop waiting on this stage
      throw;
    }
    if (s != 0) return;
    for (Node* v : m.g.variables()) result.variables[v->name] = stage.session().variable(v).clone();
  });
  return result;
}

/// Checks the pipelined run against single-device training and returns it.
Trained checkEquivalent(int stages, int microbatches, const StepSchedule& schedule, double clip,
                        Tie tie = Tie::None, int layers = 4, Steps steps = {}) {
  CAPTURE(stages);
  CAPTURE(microbatches);
  CAPTURE(schedule.name());
  const Trained expected = singleDevice(clip, tie, layers, steps);
  const Trained run = pipelined(stages, microbatches, schedule, clip, -1, tie, layers, steps);
  for (const std::string& e : run.errors) REQUIRE_MESSAGE(e.empty(), e);
  REQUIRE(run.variables.size() == expected.variables.size());
  for (const auto& [name, value] : expected.variables) {
    CAPTURE(name);
    // float64: the same sums in another order (micro-batch by micro-batch).
    CHECK(relativeDifference(run.variables.at(name), value) < 1e-11);
  }
  REQUIRE(run.losses.size() == expected.losses.size());
  for (size_t i = 0; i < run.losses.size(); ++i)
    CHECK(run.losses[i] == doctest::Approx(expected.losses[i]).epsilon(1e-12));
  return run;
}

}  // namespace

TEST_CASE("a pipelined step equals single-device training on the whole batch, under every schedule") {
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble})
    for (int stages : {2, 3})
      for (int microbatches : {1, 4}) checkEquivalent(stages, microbatches, schedule, 0);
}

TEST_CASE("tied weights: stages that read one table sum its gradient's parts, and their copies stay equal") {
  for (Tie tie : {Tie::Dense, Tie::Sparse, Tie::Frozen}) {
    CAPTURE(static_cast<int>(tie));
    for (PipelineSchedule schedule :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble}) {
      for (int stages : {2, 3}) {
        const Trained run = checkEquivalent(stages, 4, schedule, 0, tie);
        // The first and last stages read the table; a middle stage holds no copy.
        REQUIRE(run.embeddingCopies.size() == 2);
        CHECK(run.embeddingCopies.count(stages - 1) == 1);
        for (const auto& [stage, copy] : run.embeddingCopies) {
          CAPTURE(stage);
          CHECK(relativeDifference(copy, run.variables.at("embedding")) == 0);
        }
      }
    }
    // The global norm counts the tied gradient once, summed.
    checkEquivalent(3, 4, PipelineSchedule::OneFOneB, 0.05, tie);
    // Sparse updates (Adam's of sparse rows) change only the rows looked up: only those go to the
    // copy. A dense gradient's update changes every row: the whole table goes.
    Model m(2, 0, tie);
    const PipelineCut cut = cutPipeline(m.g, 2, {m.loss}, m.step, false);
    REQUIRE(cut.tied.size() == 1);
    CHECK(cut.tied[0].rows.valid() == (tie != Tie::Dense));
    // A gradient that one stage computes whole is that stage's, as any other.
    CHECK((cut.tied[0].gradient < 0) == (tie == Tie::Frozen));
  }
}

// A process has no transport peer of its own (LoopbackStages gives it -1): what one of its
// stages sends another must stay in memory for these to run at all.
TEST_CASE("virtual stages: interleaved and zbv steps, each process running several stages, equal one device") {
  const StepSchedule interleaved(PipelineSchedule::Interleaved, 2), zbv(PipelineSchedule::ZeroBubbleV);
  for (int microbatches : {2, 4}) checkEquivalent(2, microbatches, interleaved, 0, Tie::None, 8);
  checkEquivalent(4, 4, interleaved, 0.05, Tie::None, 8);
  checkEquivalent(2, 4, StepSchedule(PipelineSchedule::Interleaved, 3), 0, Tie::None, 6);
  for (int microbatches : {1, 4}) checkEquivalent(2, microbatches, zbv, 0, Tie::None, 8);
  checkEquivalent(4, 4, zbv, 0.05, Tie::None, 8);
}

TEST_CASE("with replicas, a stage's gradients go to be averaged once its last run has summed them: under zbv, "
          "process 0's last stage's while its first stage's backward is still to run") {
  // Process 0 holds stages 0 and 3; stage 3's backward ends first. One replica stands in: its
  // mean is the gradient itself, so the step still equals one device's.
  const StepSchedule zbv(PipelineSchedule::ZeroBubbleV);
  const std::vector<PipelineAction> order = zbv.orders(2, 4)[0];
  std::vector<std::set<std::string>> endedAtCall;  // process 0's runs ended when each of its calls came
  std::vector<size_t> sparseAtCall;
  std::vector<size_t> waited;
  startTracing();
  const Trained run = pipelined(2, 4, zbv, 0, -1, Tie::None, 4, {.count = 1},
                                [&](size_t process, const StageGradients& g) -> std::function<void()> {
                                  if (process != 0) return [] {};
                                  std::set<std::string> ended;
                                  const auto trace = nlohmann::json::parse(traceEventsJson(0, "stages"));
                                  for (const auto& e : trace["traceEvents"])
                                    if (e.value("cat", "") == "compute") ended.insert(e["name"].get<std::string>());
                                  endedAtCall.push_back(ended);
                                  sparseAtCall.push_back(g.sparse.size());
                                  return [&waited, call = endedAtCall.size() - 1] { waited.push_back(call); };
                                });
  stopTracing();
  for (const std::string& e : run.errors) REQUIRE_MESSAGE(e.empty(), e);
  const auto lastRunOf = [&](int stage) {
    size_t last = 0;
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].stage == stage && order[i].kind != PipelineAction::Kind::Forward) last = i;
    return last;
  };
  const size_t lastOfStage3 = lastRunOf(3), lastOfStage0 = lastRunOf(0);
  REQUIRE(lastOfStage3 < lastOfStage0);
  REQUIRE(endedAtCall.size() == 2);
  CHECK(endedAtCall[0].count(describe(order[lastOfStage3])) == 1);
  for (size_t i = lastOfStage3 + 1; i < order.size(); ++i) CHECK(endedAtCall[0].count(describe(order[i])) == 0);
  CHECK(endedAtCall[1].count(describe(order[lastOfStage0])) == 1);
  CHECK(sparseAtCall == std::vector<size_t>{0, 1});  // the embedding's gradient is stage 0's
  CHECK(waited == std::vector<size_t>{0, 1});        // both waited for, in the order started
  const Trained expected = singleDevice(0, Tie::None, 4, {.count = 1});
  for (const auto& [name, value] : expected.variables) {
    CAPTURE(name);
    CHECK(relativeDifference(run.variables.at(name), value) < 1e-11);
  }
}

TEST_CASE("virtual stages hold tied weights: zbv's first and last stages share process 0 and one copy") {
  for (Tie tie : {Tie::Dense, Tie::Sparse}) {
    CAPTURE(static_cast<int>(tie));
    // zbv: the table's two readers, stages 0 and 3, are both process 0's; interleaved: stage 3 is
    // process 1's, which holds a copy.
    const Trained v = checkEquivalent(2, 4, PipelineSchedule::ZeroBubbleV, 0.05, tie);
    CHECK(v.embeddingCopies.size() == 1);
    CHECK(v.embeddingCopies.count(0) == 1);
    const Trained interleaved = checkEquivalent(2, 4, StepSchedule(PipelineSchedule::Interleaved, 2), 0, tie);
    CHECK(interleaved.embeddingCopies.size() == 2);
  }
}

TEST_CASE("global-norm clipping over all stages' gradients: the norm is computed across stages") {
  for (PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble})
    checkEquivalent(3, 4, schedule, 0.05);
}

TEST_CASE("post-validation: stages update on the last steps' clip scale, and redo the step that clips") {
  // With clip 2 the ordinary steps do not clip (scale 1); step 4's inputs, 1000 times larger, do.
  // Steps 0 and 1 update in waves; steps 2 to 4 on a guess (their last two scales were 1), of
  // which step 4 is redone; steps 5 and 6 in waves again (the last two scales differ).
  for (PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble}) {
    const Trained run = checkEquivalent(3, 4, schedule, 2, Tie::None, 4, {.count = 7, .loud = 4});
    CHECK(run.guessed == std::vector<size_t>{3, 3, 3});
    CHECK(run.redone == std::vector<size_t>{1, 1, 1});
  }
  // A process holding two stages guesses for both: under zbv process 0 holds the first stage and
  // the last, which computes the norm from every stage's share, its own first stage's included.
  for (const StepSchedule& schedule :
       {StepSchedule(PipelineSchedule::ZeroBubbleV), StepSchedule(PipelineSchedule::Interleaved, 2)}) {
    const Trained run = checkEquivalent(2, 4, schedule, 2, Tie::None, 4, {.count = 7, .loud = 4});
    CHECK(run.guessed == std::vector<size_t>{3, 3});
    CHECK(run.redone == std::vector<size_t>{1, 1});
  }
  // A tied table (clip 1.2 for this model's norms): its owner restores the rows it had updated
  // and sends the redone update.
  const Trained tied = checkEquivalent(3, 4, PipelineSchedule::OneFOneB, 1.2, Tie::Sparse, 4, {.count = 7, .loud = 4});
  CHECK(tied.guessed == std::vector<size_t>{3, 3, 3});
  CHECK(tied.redone == std::vector<size_t>{1, 1, 1});
  for (const auto& [stage, copy] : tied.embeddingCopies)
    CHECK(relativeDifference(copy, tied.variables.at("embedding")) == 0);
  // Clipping every step: the scale differs each step, so no stage guesses.
  const Trained clipped = checkEquivalent(3, 4, PipelineSchedule::OneFOneB, 0.05, Tie::None, 4, {.count = 5});
  CHECK(clipped.guessed == std::vector<size_t>{0, 0, 0});
}

TEST_CASE(
    "loss scaling: a step whose gradient is not finite on one stage is skipped by every stage, as one device "
    "skips it") {
  // Steps 2 and 3's gradients of stage 0's sqrt_weight are 0/0: one device skips them, halving
  // the loss scale twice, counts 7 steps of 9, and doubles the scale after 3 good steps (at step
  // 6). Every stage skips them together, each halving its own copy of the scale that the loss's
  // stage multiplies by and every stage's update divides by; a stage that decided alone would
  // move its variables at step 2.
  const Steps steps{.count = 9, .lossScaled = true, .zero = {2, 3}};
  const Trained expected = singleDevice(2, Tie::None, 4, steps);
  CHECK(expected.variables.at("global_step").item() == 7);
  CHECK(expected.variables.at("loss_scale").item() == optim::LossScaling{}.initial / 2);
  // Each process's own copy of the scale, before stage 0 gathers the variables, is the one
  // device's; the stages send each other scalars in the update, never a gradient.
  auto checkRun = [&](const Trained& run, size_t processes) {
    CHECK(run.lossScales.size() == processes);
    for (const auto& [process, scale] : run.lossScales) {
      CAPTURE(process);
      CHECK(relativeDifference(scale, expected.variables.at("loss_scale")) == 0);
    }
    CHECK(run.tensorsSentInUpdate.empty());
  };
  // Post-validation guesses the last two steps' decision where they agree (and their clip scale,
  // 1): finite at step 2, which is redone as a skip; a skip at step 4, redone as an update (the
  // count of good steps then grows the scale at step 6); finite at steps 6 to 8. A redo restores
  // every variable the guessed update wrote, the copies of the scale (which step 2's guess had
  // doubled) and the step counter included.
  for (PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble}) {
    const Trained run = checkEquivalent(3, 4, schedule, 2, Tie::None, 4, steps);
    CHECK(run.guessed == std::vector<size_t>{5, 5, 5});
    CHECK(run.redone == std::vector<size_t>{2, 2, 2});
    checkRun(run, 3);
  }
  // Processes holding two stages each, the first and the last under zbv.
  for (const StepSchedule& schedule :
       {StepSchedule(PipelineSchedule::ZeroBubbleV), StepSchedule(PipelineSchedule::Interleaved, 2)}) {
    const Trained run = checkEquivalent(2, 4, schedule, 2, Tie::None, 4, steps);
    CHECK(run.guessed == std::vector<size_t>{5, 5});
    CHECK(run.redone == std::vector<size_t>{2, 2});
    checkRun(run, 2);
  }
}

TEST_CASE("dropout: each micro-batch drops what one device drops for its rows of the batch") {
  // The masks are drawn by each element's place in the total batch and the step's count of random
  // draws, so a micro-batch's forward (and its recomputed copy in the backward) draws what one
  // device does for its rows; every step draws afresh. Different masks would move the weights by
  // far more than 1e-11. Every process counts the draws as one device does, the stages without
  // dropout too: worker 0's count is the one a checkpoint keeps.
  for (const bool recomputed : {false, true}) {
    CAPTURE(recomputed);
    const Steps steps{.count = 3, .dropout = 0.3, .recomputed = recomputed};
    const uint64_t draws = singleDevice(0, Tie::None, 4, steps).randomSteps.at(0);
    CHECK(draws == 3);
    auto checkDraws = [&](const Trained& run) {
      for (const auto& [process, count] : run.randomSteps) {
        CAPTURE(process);
        CHECK(count == draws);
      }
    };
    for (PipelineSchedule schedule :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble})
      checkDraws(checkEquivalent(3, 4, schedule, 0, Tie::None, 4, steps));
    checkDraws(checkEquivalent(2, 4, PipelineSchedule::ZeroBubbleV, 0, Tie::None, 4, steps));
  }
}

TEST_CASE("a pipelined step run by a schedule file's orders equals single-device training on the whole batch") {
  // Orders no built-in schedule makes: the first stages run their backwards in reverse.
  const Trained reversed = checkEquivalent(
      3, 4,
      StepSchedule::parse("F0 F1 F2 F3 B3 B2 B1 B0\nF0 F1 F2 F3 B3 B2 B1 B0\nF0 B0 F1 B1 F2 B2 F3 B3\n",
                          "reversed backwards"),
      0);
  // They ran as listed: stage 0 held all four micro-batches at once, where 1f1b holds three.
  const Trained oneFOneB = pipelined(3, 4, PipelineSchedule::OneFOneB, 0);
  CHECK(reversed.peakKept[0] > oneFOneB.peakKept[0]);
  // Split backwards: stage 0 holds every weight gradient to the step's end, the last its first.
  checkEquivalent(2, 4,
                  StepSchedule::parse("F0 F1 F2 F3 B0 B1 B2 B3 W3 W2 W1 W0\nF0 B0 W0 F1 B1 F2 B2 F3 B3 W3 W1 W2\n",
                                      "late weights"),
                  0.05);
}

namespace {

/// Token sequences through an embedding (stage 0) and an LSTM (stage `lstmStage`) to a softmax
/// over 7 words (the last stage), the loss summed over real positions (mask 1) and divided by a
/// count fed with the step, as the zoo's LM does: micro-batches of any lengths add up to the
/// whole batch's gradient.
struct SequenceModel {
  Graph g;
  Output tokens, targets, mask, count, loss;
  Node* step = nullptr;

  explicit SequenceModel(int stages, int lstmStage = 0) {
    g.setSeed(5);
    tokens = g.placeholder("tokens", i32, {-1, -1});
    targets = g.placeholder("targets", i32, {-1, -1});
    mask = g.placeholder("mask", f64, {-1, -1});
    count = g.placeholder("count", f64, {});
    Output states;
    {
      auto first = g.stage(0);
      states = nn::Embedding(g, "embedding", 7, 4, f64)(tokens);
    }
    {
      auto recurrent = g.stage(lstmStage);
      states = nn::LSTM(g, "lstm", 4, 6, f64, {.batchFirst = true})(states).y;
    }
    auto last = g.stage(stages - 1);
    nn::Linear out(g, "out", 6, 7, true, f64);
    const Output logits = out(reshape(states, {-1, 6}));
    loss = sum(sparseSoftmaxCrossEntropy(logits, reshape(targets, {-1})) * reshape(mask, {-1})) / count;
    step = optim::Adam(0.05).minimize(loss);
  }

  /// Rows `firstRow`, ... of step `seed`'s batch, of the given lengths, padded to the longest;
  /// `stepCount`: the step's real positions over the parts it is cut into.
  FeedMap feeds(const std::vector<int64_t>& lengths, int64_t firstRow, uint64_t seed, double stepCount) const {
    const auto rows = static_cast<int64_t>(lengths.size());
    const int64_t width = *std::max_element(lengths.begin(), lengths.end());
    Tensor ids = Tensor::zeros(i32, {rows, width}), labels = Tensor::zeros(i32, {rows, width});
    Tensor real = Tensor::zeros(f64, {rows, width});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < lengths[static_cast<size_t>(r)]; ++t) {
        const auto row = static_cast<uint64_t>(firstRow + r), at = static_cast<uint64_t>(t);
        ids.data<int32_t>()[r * width + t] = static_cast<int32_t>((seed * 3 + row * 5 + at * 2) % 7);
        labels.data<int32_t>()[r * width + t] = static_cast<int32_t>((seed + row + at * 3) % 7);
        real.data<double>()[r * width + t] = 1;
      }
    return {{tokens, ids}, {targets, labels}, {mask, real}, {count, Tensor::scalar(f64, stepCount)}};
  }
};


/// Three steps of SequenceModel(2, lstmStage) on micro-batches of sequences of the given lengths
/// (one micro-batch per list), pipelined under `schedule`, checked against one process on the
/// batch they make, padded; returns the cut.
PipelineCut checkSequencesEquivalent(int lstmStage, const StepSchedule& schedule,
                                     const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int64_t> all;
  for (const auto& part : lengths) all.insert(all.end(), part.begin(), part.end());
  double positions = 0;
  for (int64_t n : all) positions += static_cast<double>(n);
  const auto parts = static_cast<double>(lengths.size());

  SequenceModel one(1);
  Session session(one.g);
  std::vector<double> expectedLosses;
  for (uint64_t step = 0; step < 3; ++step)
    expectedLosses.push_back(session.run({one.loss}, one.feeds(all, 0, step, positions), {one.step})[0].item());

  const int stages = 2;
  LoopbackStages links(stages);
  std::vector<std::unique_ptr<SequenceModel>> models;
  for (int s = 0; s < stages; ++s) models.push_back(std::make_unique<SequenceModel>(stages, lstmStage));
  std::vector<double> losses;
  std::map<std::string, Tensor> variables;
  PipelineCut cut;
  const std::vector<std::string> errors = onThreads(stages, [&](size_t s) {
    SequenceModel& m = *models[s];
    PipelineOptions options;
    options.stages = stages;
    options.microbatches = static_cast<int>(lengths.size());
    options.schedule = schedule;
    options.timeout = 60s;
    PipelineStage stage(m.g, static_cast<int>(s), options, *links.transports[s], links.peers[s]);
    try {
      for (uint64_t step = 0; step < 3; ++step) {
        std::vector<FeedMap> microbatches;
        int64_t firstRow = 0;
        for (const auto& part : lengths) {
          microbatches.push_back(m.feeds(part, firstRow, step, positions / parts));
          firstRow += static_cast<int64_t>(part.size());
        }
        const double loss = stage.step({m.loss}, m.step, microbatches)[0];
        if (s == 0) losses.push_back(loss);
      }
      stage.gatherVariables(0);
    } catch (const std::exception& e) {
      links.network->fail(links.transports[s]->endpoint(), e.what());
      throw;
    }
    if (s != 0) return;
    for (Node* v : m.g.variables()) variables[v->name] = stage.session().variable(v).clone();
    cut = stage.cut();
  });
  for (const std::string& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  for (Node* v : one.g.variables()) {
    CAPTURE(v->name);
    CHECK(relativeDifference(variables.at(v->name), session.variable(v)) < 1e-11);
  }
  REQUIRE(losses.size() == expectedLosses.size());
  for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(expectedLosses[i]).epsilon(1e-12));
  return cut;
}

/// The ops of the nodes `cut` puts in `phase` of `stage`.
std::multiset<std::string> opsIn(const PipelineCut& cut, const Graph& g, int stage, Phase phase) {
  std::multiset<std::string> ops;
  for (const auto& n : g.nodes()) {
    const auto id = static_cast<size_t>(n->id);
    if (id < cut.stageOf.size() && cut.stageOf[id] == stage && cut.phaseOf[id] == phase) ops.insert(n->op);
  }
  return ops;
}

}  // namespace

TEST_CASE("micro-batches of different lengths: each flows at its own shape and the step equals the padded batch's") {
  // Three micro-batches of two sequences each, 2, 3 and 5 long; one process runs them as one
  // batch padded to 5.
  checkSequencesEquivalent(0, PipelineSchedule::OneFOneB, {{2, 1}, {3, 3}, {5, 4}});
}

TEST_CASE("zero bubble defers a recurrent layer's weight gradients: its fused gradient is split in two") {
  // The LSTM in stage 1: its input gradient goes to stage 0 at once, its weight gradients wait.
  const PipelineCut cut = checkSequencesEquivalent(1, PipelineSchedule::ZeroBubble, {{4, 4}, {4, 2}, {3, 4}});
  SequenceModel m(2, 1);
  const PipelineCut split = cutPipeline(m.g, 2, {m.loss}, m.step, true);
  const std::multiset<std::string> backward = opsIn(split, m.g, 1, Phase::Backward);
  const std::multiset<std::string> weights = opsIn(split, m.g, 1, Phase::Weights);
  CHECK(backward.count("LSTMInputGrad") == 1);
  CHECK(weights.count("LSTMWeightGrad") == 1);
  CHECK(backward.count("LSTMGrad") + weights.count("LSTMGrad") == 0);  // the fused op runs nowhere
  CHECK(cut.splitWeights);
  // Without zero bubble the fused op stays.
  SequenceModel fused(2, 1);
  const PipelineCut unsplit = cutPipeline(fused.g, 2, {fused.loss}, fused.step, false);
  CHECK(opsIn(unsplit, fused.g, 1, Phase::Backward).count("LSTMGrad") == 1);
}

TEST_CASE("zero bubble splits a GRU cell's fused gradient the same way") {
  Graph g;
  const Output x = g.placeholder("x", f64, {-1, 3}), h0 = g.placeholder("h0", f64, {-1, 5});
  Output h;
  {
    auto first = g.stage(0);
    h = tanh(nn::Linear(g, "in", 3, 4, true, f64)(x));
  }
  {
    auto second = g.stage(1);
    auto weight = [&](const char* name, Shape shape) {
      return g.variable(name, f64, shape, Initializer::normal(0, 0.3));
    };
    h = gruCell(h, h0, weight("wx", {4, 15}), weight("wh", {5, 15}), weight("bx", {15}), weight("bh", {15}));
  }
  const Output loss = mean(square(h));
  Node* step = optim::SGD(0.1).minimize(loss);
  const PipelineCut cut = cutPipeline(g, 2, {loss}, step, true);
  CHECK(opsIn(cut, g, 1, Phase::Backward).count("GRUCellInputGrad") == 1);
  CHECK(opsIn(cut, g, 1, Phase::Weights).count("GRUCellWeightGrad") == 1);
  // The variables' gradients are the weight half's outputs.
  for (const StageGradient& gradient : cut.gradients) {
    CAPTURE(gradient.link.variable->name);
    if (gradient.stage == 1) CHECK(gradient.link.dense.node()->op == "GRUCellWeightGrad");
  }
}

TEST_CASE("a stage that dies stops the others with an error naming it") {
  const Trained run = pipelined(3, 2, PipelineSchedule::OneFOneB, 0, 2);
  CHECK(contains(run.errors[2], "stage 2 dies"));
  // Stage 1 fails sending its forward's output to stage 2, or waiting for stage 2's gradient
  // when its send went out before stage 2 died.
  CHECK(contains(run.errors[1], "pipeline stage 1 "));
  CHECK(contains(run.errors[1], " stage 2 (step 1)"));
  CHECK(contains(run.errors[1], "stage 2 dies"));
  CHECK_FALSE(run.errors[0].empty());
}

namespace {

/// `stages` stages of one tanh layer each on x, the loss in the last.
struct Chain {
  Graph g;
  Output x, loss;
  std::vector<Output> hidden;
  Node* step = nullptr;

  explicit Chain(int stages) {
    x = g.placeholder("x", f64, {-1, 4});
    Output h = x;
    for (int s = 0; s < stages; ++s) {
      auto staged = g.stage(s);
      h = tanh(matmul(h, g.variable(fmt::format("w{}", s), f64, {4, 4}, Initializer::glorotUniform())));
      hidden.push_back(h);
    }
    loss = mean(square(h));
  }
  void train() { step = optim::SGD(0.1).minimize(loss); }
  std::string cutError(int stages) {
    try {
      cutPipeline(g, stages, {loss}, step, false);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE(
    "the cut: one transfer per boundary value and reading stage, its gradient back, each gradient in its op's stage") {
  Chain c(2);
  c.train();
  const PipelineCut cut = cutPipeline(c.g, 2, {c.loss}, c.step, false);
  REQUIRE(cut.transfers.size() == 2);
  CHECK(cut.transfers[0].value == c.hidden[0]);
  CHECK(cut.transfers[0].from == 0);
  CHECK(cut.transfers[0].to == 1);
  CHECK(cut.transfers[0].receivedIn == Phase::Forward);
  CHECK(cut.transfers[1].from == 1);
  CHECK(cut.transfers[1].to == 0);
  CHECK(cut.transfers[1].receivedIn == Phase::Backward);
  for (const GradientLink& link : c.g.gradientLinks()) {
    CAPTURE(link.variable->name);
    CHECK(cut.stageOf[static_cast<size_t>(link.dense.node()->id)] == (link.variable->name == "w0" ? 0 : 1));
  }
  CHECK(cut.variables[0] == std::vector<Node*>{c.g.find("w0"), c.g.find("global_step")});
  CHECK(cut.variables[1] == std::vector<Node*>{c.g.find("w1"), c.g.find("global_step")});
  CHECK(cut.fetchStage == std::vector<int>{1});
}

TEST_CASE("the cut: a value two later stages read is sent to each") {
  Chain c(3);
  {
    auto last = c.g.stage(2);
    c.loss = c.loss + mean(c.hidden[0]);  // stage 0's output read by stages 1 and 2
  }
  c.train();
  const PipelineCut cut = cutPipeline(c.g, 3, {c.loss}, c.step, false);
  int toOne = 0, toTwo = 0;
  for (const Transfer& t : cut.transfers) {
    if (t.value != c.hidden[0]) continue;
    toOne += t.to == 1;
    toTwo += t.to == 2;
  }
  CHECK(toOne == 1);
  CHECK(toTwo == 1);
}

TEST_CASE("the cut: a recomputed batch norm fused with its ReLU goes with its weights' stage, its gradient too") {
  // minimize() fuses the batch norm and ReLU after autodiff has made the backward pass read
  // recomputed copies of both, so the copy's and the gradient's forward op, the unfused batch
  // norm, runs in no stage; an automatic cut (applyStages) cuts between the product and it.
  Graph g;
  const Output x = g.placeholder("x", f64, {-1, 4});
  Output h = matmul(x, g.variable("w", f64, {4, 4}, Initializer::glorotUniform()));
  {
    auto segment = g.recompute(Recompute::Selective);
    const Output gamma = g.variable("gamma", f64, {4}, Initializer::constant(1));
    h = relu(batchNormTrain(h, gamma, g.variable("beta", f64, {4}, Initializer::zeros()), 1e-5).y);
  }
  const Output loss = mean(square(h));
  Node* step = optim::SGD(0.1).minimize(loss);
  REQUIRE(std::any_of(g.nodes().begin(), g.nodes().end(),
                      [](const auto& n) { return n->op == "BatchNormReluTrain"; }));
  applyStages(g, {loss}, step, {0, 1});
  const PipelineCut cut = cutPipeline(g, 2, {loss}, step, false);
  int readers = 0;
  for (const auto& n : g.nodes()) {
    const int stage = cut.stageOf[static_cast<size_t>(n->id)];
    if (stage < 0 || cut.phaseOf[static_cast<size_t>(n->id)] == Phase::Update) continue;
    for (const Output& in : n->inputs) {
      if (in.node()->name != "gamma") continue;
      CAPTURE(n->describe());
      CHECK(stage == 1);
      ++readers;
    }
  }
  CHECK(readers == 3);  // the fused forward op, the recomputed copy, the gradient
}

TEST_CASE("zero bubble: a stage's weight gradients run apart from what the previous stage waits for") {
  Chain c(2);
  c.train();
  const PipelineCut cut = cutPipeline(c.g, 2, {c.loss}, c.step, true);
  for (const GradientLink& link : c.g.gradientLinks()) {
    CAPTURE(link.variable->name);
    CHECK(cut.phaseOf[static_cast<size_t>(link.dense.node()->id)] == Phase::Weights);
  }
  // Stage 1 sends the gradient of its input from its Backward run; stage 0 has nothing to send.
  CHECK(cut.backward[1].sends.size() == 1);
  CHECK(cut.weights[1].sends.empty());
  CHECK(cut.backward[0].fetches.empty());
}

TEST_CASE("the cut: a tied variable's gradient parts are their stages' gradients, their sum the owner's") {
  Chain c(3);
  {
    auto last = c.g.stage(2);
    c.loss = c.loss + mean(c.g.find("w0")->output());  // w0 tied into stage 2
  }
  c.train();
  const PipelineCut cut = cutPipeline(c.g, 3, {c.loss}, c.step, false);
  REQUIRE(cut.tied.size() == 1);
  CHECK(cut.tied[0].variable == c.g.find("w0"));
  CHECK(cut.tied[0].owner == 0);
  CHECK(cut.tied[0].copies == std::vector<int>{2});
  CHECK_FALSE(cut.tied[0].rows.valid());  // a dense update: the copy gets all of w0
  CHECK(cut.variables[0] == std::vector<Node*>{c.g.find("w0"), c.g.find("global_step")});
  CHECK(cut.variables[2] == std::vector<Node*>{c.g.find("w0"), c.g.find("w2"), c.g.find("global_step")});
  const GradientLink* w0 = nullptr;
  for (const GradientLink& link : c.g.gradientLinks())
    if (link.variable->name == "w0") w0 = &link;
  REQUIRE(w0 != nullptr);
  // The sum of w0's parts runs in no run: stage 0's runtime adds them and feeds its update.
  CHECK(cut.phaseOf[static_cast<size_t>(w0->dense.node()->id)] == Phase::Static);
  REQUIRE(cut.tied[0].gradient >= 0);
  const StageGradient& whole = cut.gradients[static_cast<size_t>(cut.tied[0].gradient)];
  CHECK(whole.stage == 0);
  CHECK(whole.link.dense == w0->dense);
  bool fed = false;
  for (const StageRun& wave : cut.update[0])
    fed = fed || std::find(wave.inputs.begin(), wave.inputs.end(), w0->dense) != wave.inputs.end();
  CHECK(fed);
  // Its parts: the matmul's gradient in stage 0, the mean's in stage 2, each fetched by its
  // stage's backward run; they reach stage 0 once per step, summed, not as transfers.
  REQUIRE(cut.tied[0].parts.size() == 2);
  std::set<int> partStages;
  for (int g : cut.tied[0].parts) {
    const StageGradient& part = cut.gradients[static_cast<size_t>(g)];
    partStages.insert(part.stage);
    const std::vector<int>& fetched = cut.backward[static_cast<size_t>(part.stage)].gradients;
    CHECK(std::find(fetched.begin(), fetched.end(), g) != fetched.end());
    for (const Transfer& t : cut.transfers) CHECK(t.value != part.link.dense);
  }
  CHECK(partStages == std::set<int>{0, 2});
}

TEST_CASE("the cut: a served variable's pulls, push and APPLY are its reading stage's; its gradient is left to the "
          "servers to average, and that stage does not guess its update") {
  Model m(2, 1.0);  // clipped: the push answers the embedding's squared norm to the global norm
  Node* table = m.g.find("embedding");
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, {size_t{1} << 20});
  REQUIRE(plan.variables.size() == 1);
  REQUIRE(plan.variables[0].variable == table);
  distributeParameterServers(m.g, plan, 777);
  const PipelineCut cut = cutPipeline(m.g, 2, {m.loss}, m.step, false);
  const auto nodeOf = [&](const std::string& op) {
    for (const auto& n : m.g.nodes())
      if (n->op == op && cut.stageOf[static_cast<size_t>(n->id)] >= 0) return n.get();
    FAIL("no staged ", op);
    return static_cast<Node*>(nullptr);
  };
  Node* pull = nodeOf("PullRows");
  Node* push = nodeOf("PushGradient");
  Node* apply = nodeOf("ApplyRemote");
  CHECK(cut.stageOf[static_cast<size_t>(pull->id)] == 0);
  CHECK(cut.phaseOf[static_cast<size_t>(pull->id)] == Phase::Forward);
  const auto waveOf = [&](const Node* n) {
    const auto& waves = cut.update[0];
    for (size_t w = 0; w < waves.size(); ++w)
      if (std::find(waves[w].targets.begin(), waves[w].targets.end(), n) != waves[w].targets.end()) return int(w);
    return -1;
  };
  for (Node* n : {push, apply}) {
    CHECK(cut.stageOf[static_cast<size_t>(n->id)] == 0);
    CHECK(cut.phaseOf[static_cast<size_t>(n->id)] == Phase::Update);
    CHECK(waveOf(n) >= 0);
  }
  // The push's squared norm goes to stage 1's global norm and the scale comes back: the APPLY
  // runs in a later wave, which orders it after the push without the graph's control edge.
  CHECK(waveOf(push) < waveOf(apply));
  CHECK(std::find(apply->controlInputs.begin(), apply->controlInputs.end(), push) == apply->controlInputs.end());
  for (const StageGradient& g : cut.gradients) {
    CAPTURE(g.link.variable->name);
    CHECK(g.served == (g.link.variable == table));
  }
  CHECK(cut.updatesServers == std::vector<char>{1, 0});
  CHECK_FALSE(cut.guesses[0].possible());
  CHECK(cut.guesses[1].possible());  // stage 1 holds no served variable: it still guesses the clip scale
}

TEST_CASE("the cut refuses a served variable that the author's stages part, naming it and its stages") {
  Model m(2, 0, Tie::Sparse);  // the embedding's rows gathered in stage 0 and scored in stage 1
  const ServerPlan plan = planServers(m.g, Architecture::Auto, 1, {size_t{1} << 20});
  REQUIRE(plan.variables.size() == 1);
  REQUIRE(plan.variables[0].variable == m.g.find("embedding"));
  distributeParameterServers(m.g, plan, 777);
  CHECK_THROWS_WITH(cutPipeline(m.g, 2, {m.loss}, m.step, false),
                    doctest::Contains("variable 'embedding' is held by the parameter servers and read by pipeline "
                                      "stages 0 and 1"));
}

TEST_CASE("what a stage holds leaves out the optimizer state of the variables the servers hold") {
  Model m(2);  // the 30 x 5 f64 embedding in stage 0, trained by Adam (two slots)
  const StagePlanOptions own{.stages = 2, .rows = 8};
  StagePlanOptions served = own;
  served.served = {m.g.find("embedding")};
  const std::vector<StageMemory> kept = stageMemory(m.g, {m.loss}, m.step, own);
  const std::vector<StageMemory> onServers = stageMemory(m.g, {m.loss}, m.step, served);
  CHECK(kept[0].optimizerState - onServers[0].optimizerState == 2 * 30 * 5 * sizeof(double));
  // The stage still holds its copy of the table and sums its gradient.
  CHECK(onServers[0].parameters == kept[0].parameters);
  CHECK(onServers[0].gradients == kept[0].gradients);
  CHECK(onServers[1].total() == kept[1].total());
}

TEST_CASE("the cut refuses a stage number beyond the pipeline, and a stage without forward work") {
  Chain c(3);
  c.train();
  CHECK(contains(c.cutError(2), "is in pipeline stage 2, but the pipeline has 2 stages (0..1)"));
  CHECK(c.cutError(4) == "pipeline stage 3 of 4 has no forward ops: put ops in it with Graph::stage(3) or use fewer "
                         "stages");
}

TEST_CASE("the cut refuses a forward value flowing back to an earlier stage") {
  Chain c(2);
  {
    auto first = c.g.stage(0);
    c.loss = c.loss + mean(c.hidden[1]);  // stage 0 reads stage 1's output
  }
  c.train();
  CHECK(contains(c.cutError(2), "the forward pass may only flow to later stages"));
}

TEST_CASE("a moving average of forward values (batch norm's statistics) runs with each micro-batch's forward") {
  Chain c(2);
  const Output average = c.g.variable("average", f64, {}, Initializer::zeros(), false);
  Node* update = assignMovingAverage(average, mean(c.hidden[1]), 0.9);
  c.g.addToCollection("update_ops", update);
  c.train();
  const PipelineCut cut = cutPipeline(c.g, 2, {c.loss}, c.step, false);
  CHECK(cut.phaseOf[static_cast<size_t>(update->id)] == Phase::Forward);
  CHECK(cut.forward[1].targets == std::vector<Node*>{update});
  CHECK(std::count(cut.variables[1].begin(), cut.variables[1].end(), average.node()) == 1);  // gathered with stage 1
}

TEST_CASE("the cut refuses an update of a trained variable from a per-micro-batch forward value") {
  Chain c(2);
  c.g.addToCollection("update_ops", assign(c.g.find("w1")->output(), c.g.find("w1")->output() * mean(c.hidden[1])));
  c.train();
  CHECK(contains(c.cutError(2), "a value of each micro-batch's forward pass: pipelined training sums only the "
                                "variables' gradients"));
}

TEST_CASE("micro-batches: batch feeds are cut along their first axis, others go whole, uneven cuts are refused") {
  Graph g;
  const Output x = g.placeholder("x", f64, {-1, 2});
  const Output rate = g.placeholder("rate", f64, {});
  const Tensor rows = Tensor::fromVector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const std::vector<FeedMap> parts = splitMicrobatches({{x, rows}, {rate, Tensor::scalar(f64, 0.5)}}, 2);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1][0].second.toDoubles() == std::vector<double>{5, 6, 7, 8});
  CHECK(parts[1][1].second.item() == 0.5);
  CHECK_THROWS_WITH(splitMicrobatches({{x, rows}}, 3),
                    "the feed of 'x' has 4 rows, which do not cut into 3 equal micro-batches");
}

namespace {

/// Six tanh layers of x, no stage scopes; `slow` layers' matmuls cost 3, the others 1.
struct Unstaged {
  Graph g;
  Output loss;
  Node* step = nullptr;
  std::vector<Node*> matmuls;

  /// Trained by SGD, or with `adam` by Adam (two slots per variable).
  explicit Unstaged(bool adam = false) {
    Output h = g.placeholder("x", f64, {-1, 4});
    for (int l = 0; l < 6; ++l) {
      h = matmul(h, g.variable(fmt::format("w{}", l), f64, {4, 4}, Initializer::glorotUniform()));
      matmuls.push_back(h.node());
      h = tanh(h);
    }
    loss = mean(square(h));
    step = adam ? optim::Adam(1e-3).minimize(loss) : optim::SGD(0.1).minimize(loss);
  }
  std::unordered_map<const Node*, double> seconds(const std::vector<double>& layerCosts) const {
    std::unordered_map<const Node*, double> out;
    for (size_t l = 0; l < matmuls.size(); ++l) out[matmuls[l]] = layerCosts[l];
    return out;
  }
  int stageOfLayer(size_t l) const { return matmuls[l]->stage; }
};

}  // namespace

TEST_CASE("planStages balances the measured time of the forward ops and their gradients") {
  Unstaged m;
  const double fast = 1e9;  // transfers cost nothing
  const StagePlan even = planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                                    {.stages = 3, .rows = 8, .linkBytesPerSecond = fast});
  CHECK(even.seconds == std::vector<double>{2, 2, 2});
  // 4 1 | 1 1 1 2 is the one split whose slowest stage takes 5.
  const StagePlan skewed = planStages(m.g, {m.loss}, m.step, m.seconds({4, 1, 1, 1, 1, 2}),
                                      {.stages = 2, .rows = 8, .linkBytesPerSecond = fast});
  CHECK(skewed.seconds == std::vector<double>{5, 5});
  applyStages(m.g, {m.loss}, m.step, even.firstOp);
  for (size_t l = 0; l < 6; ++l) {
    CAPTURE(l);
    CHECK(m.stageOfLayer(l) == static_cast<int>(l / 2));
  }
  // The cut then puts each layer's gradient with it.
  const PipelineCut cut = cutPipeline(m.g, 3, {m.loss}, m.step, false);
  for (const GradientLink& link : m.g.gradientLinks()) {
    CAPTURE(link.variable->name);
    const int layer = link.variable->name[1] - '0';
    CHECK(cut.stageOf[static_cast<size_t>(link.dense.node()->id)] == layer / 2);
  }
}

TEST_CASE("planStages charges no stage for the update of a variable the servers hold") {
  Unstaged m;
  const Node* first = m.g.find("w0");
  const Node* update = nullptr;  // w0's SGD update
  for (const auto& node : m.g.nodes())
    if (!node->def->mutatedInputs.empty() &&
        node->inputs[static_cast<size_t>(node->def->mutatedInputs.front())].node() == first)
      update = node.get();
  REQUIRE(update != nullptr);
  std::unordered_map<const Node*, double> seconds = m.seconds({1, 1, 1, 1, 1, 1});
  seconds[update] = 6;
  const StagePlanOptions own{.stages = 2, .rows = 8, .linkBytesPerSecond = 1e9};
  StagePlanOptions served = own;
  served.served = {first};
  // Updated on its stage, w0's layer costs 7: 7 | 5. Updated on the servers it costs 1: 3 | 3.
  CHECK(planStages(m.g, {m.loss}, m.step, seconds, own).seconds == std::vector<double>{7, 5});
  CHECK(planStages(m.g, {m.loss}, m.step, seconds, served).seconds == std::vector<double>{3, 3});
}

namespace {

/// The compute seconds of zbv's two processes (stages 0 and 3, stages 1 and 2) under the
/// automatic cut of `m`'s six layers with these costs and link speed.
std::pair<double, double> zbvProcessSeconds(Unstaged& m, const std::vector<double>& costs, double linkBytesPerSecond) {
  const StagePlan plan = planStages(m.g, {m.loss}, m.step, m.seconds(costs),
                                    {.stages = 2, .rows = 8, .schedule = PipelineSchedule::ZeroBubbleV,
                                     .linkBytesPerSecond = linkBytesPerSecond});
  REQUIRE(plan.seconds.size() == 4);
  return {plan.seconds[0] + plan.seconds[3], plan.seconds[1] + plan.seconds[2]};
}

}  // namespace

TEST_CASE("planStages with virtual stages balances the processes, each running the sum of its stages") {
  Unstaged m;
  // zbv over 2 processes: process 0 runs stages 0 and 3, process 1 stages 1 and 2. Balancing the
  // stages alone allows 1 1 | 1 | 1 1 | 3 (process 0 busy 5, process 1 3); balanced processes
  // take 4 each: 1 | 1 1 | 1 1 | 3.
  CHECK(zbvProcessSeconds(m, {1, 1, 1, 1, 1, 3}, 1e9) == std::pair{4.0, 4.0});
}

TEST_CASE("planStages with virtual stages charges only the transfers that leave a process") {
  Unstaged m;
  // Each boundary moves 256 bytes each way: 1 s at 512 bytes/s. Under zbv stage 1 hands stage 2
  // its values in memory (both are process 1's), so each process pays two boundaries and the
  // six equal layers split 3 and 3. Charging stage 1 to 2 as well would leave process 1 two.
  CHECK(zbvProcessSeconds(m, {1, 1, 1, 1, 1, 1}, 512) == std::pair{3.0, 3.0});
}

TEST_CASE("planStages with virtual stages holds each process's stages together within the memory limit") {
  Unstaged m;
  const auto seconds = m.seconds({1, 1, 1, 1, 4, 4});
  StagePlanOptions options{.stages = 2, .rows = 64, .microbatches = 4, .schedule = PipelineSchedule::ZeroBubbleV,
                           .linkBytesPerSecond = 1e9};
  const std::vector<int> processOf = processOfStage(options.schedule.orders(2, 4));
  // The fullest process's bytes under a cut (its stages' StageMemory totals summed), and the
  // largest stage's.
  auto fullest = [&](const std::vector<StageMemory>& held) {
    std::vector<double> bytes(2, 0);
    for (size_t s = 0; s < held.size(); ++s) bytes[static_cast<size_t>(processOf[s])] += held[s].total();
    return std::max(bytes[0], bytes[1]);
  };
  auto largest = [](const std::vector<StageMemory>& held) {
    double most = 0;
    for (const StageMemory& h : held) most = std::max(most, h.total());
    return most;
  };
  const StagePlan fastest = planStages(m.g, {m.loss}, m.step, seconds, options);
  REQUIRE(fastest.firstOp.size() == 4);
  const size_t ops = fastest.firstOp[3] + fastest.ops[3];
  // Every cut into 4 stages, reckoned independently through the author's path (applyStages).
  double leanest = std::numeric_limits<double>::infinity(), leanestStage = leanest;
  for (size_t a = 1; a < ops; ++a)
    for (size_t b = a + 1; b < ops; ++b)
      for (size_t c = b + 1; c < ops; ++c) {
        applyStages(m.g, {m.loss}, m.step, {0, a, b, c});
        const std::vector<StageMemory> held = stageMemory(m.g, {m.loss}, m.step, options);
        leanest = std::min(leanest, fullest(held));
        leanestStage = std::min(leanestStage, largest(held));
      }
  // A limit that some cut meets with each stage within half of it, and that the fastest cut
  // exceeds: the plan keeps every process within it.
  options.memoryPerStage = 2 * leanestStage;
  REQUIRE(fullest(fastest.memory) > options.memoryPerStage);
  const StagePlan lean = planStages(m.g, {m.loss}, m.step, seconds, options);
  CHECK(fullest(lean.memory) <= options.memoryPerStage);
  // Below every cut: refused, with what the closest cut found holds.
  options.memoryPerStage = leanest - 1;
  const std::string refusal = errorOf([&] { planStages(m.g, {m.loss}, m.step, seconds, options); });
  CHECK_MESSAGE(contains(refusal, "no cut of the step into 4 pipeline stages on 2 processes was found that keeps every "
                                  "process within"),
                refusal);
}

TEST_CASE("planStages weighs the boundary's transfer against the compute it balances") {
  Unstaged m;
  // Every boundary carries 8 rows x 4 f64 = 256 bytes forward and as much back: at 512 bytes/s
  // a cut costs 1 s on each side of it, so 2 stages must split 6 equal layers 3 + 3.
  const StagePlan plan = planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                                    {.stages = 2, .rows = 8, .linkBytesPerSecond = 512});
  CHECK(plan.boundaryBytes[0] == 256);
  CHECK(plan.ops[0] >= 1);
  CHECK(plan.seconds == std::vector<double>{3, 3});
  CHECK_THROWS_WITH(planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                               {.stages = 40, .rows = 8, .linkBytesPerSecond = 512}),
                    doctest::Contains("too few for 40 pipeline stages"));
}

TEST_CASE("planStages never parts the readers of one variable (a recurrent layer's steps)") {
  Graph g;
  Output h = g.placeholder("x", f64, {-1, 4});
  const Output shared = g.variable("shared", f64, {4, 4}, Initializer::glorotUniform());
  const Output first = g.variable("first", f64, {4, 4}, Initializer::glorotUniform());
  h = tanh(matmul(h, first));
  for (int step = 0; step < 3; ++step) h = tanh(matmul(h, shared));  // the same weights three times
  const Output loss = mean(square(h));
  Node* train = optim::SGD(0.1).minimize(loss);
  std::unordered_map<const Node*, double> seconds;
  for (const auto& n : g.nodes())
    if (n->op == "MatMul" && n->gradientOf == nullptr) seconds[n.get()] = 1;
  // Balanced would be 2 + 2; the shared weights leave 1 + 3 as the only cut.
  const StagePlan plan = planStages(g, {loss}, train, seconds, {.stages = 2, .rows = 8, .linkBytesPerSecond = 1e9});
  CHECK(plan.seconds == std::vector<double>{1, 3});
  // 10 forward ops, but no cut inside the shared block's 4 ops + 3 tanh between its readers.
  CHECK_THROWS_WITH(planStages(g, {loss}, train, seconds, {.stages = 7, .rows = 8, .linkBytesPerSecond = 1e9}),
                    doctest::Contains("can be cut in 5 places without parting a variable's readers"));
}

namespace {

/// Four tanh layers of x, each product costing 1; the last reads the first's weights again,
/// transposed, as a tied softmax does.
struct TableReadTwice {
  Graph g;
  Output table, loss;
  Node* train = nullptr;
  std::unordered_map<const Node*, double> seconds;

  TableReadTwice() {
    Output h = g.placeholder("x", f64, {-1, 4});
    table = g.variable("table", f64, {4, 4}, Initializer::glorotUniform());
    h = tanh(matmul(h, table));
    for (const char* name : {"a", "b"})
      h = tanh(matmul(h, g.variable(name, f64, {4, 4}, Initializer::glorotUniform())));
    h = tanh(matmul(h, table, false, true));
    loss = mean(square(h));
    train = optim::SGD(0.1).minimize(loss);
    for (const auto& n : g.nodes())
      if (n->op == "MatMul" && n->gradientOf == nullptr) seconds[n.get()] = 1;
  }
  StagePlan plan(const StagePlanOptions& options) { return planStages(g, {loss}, train, seconds, options); }
};

}  // namespace

TEST_CASE("planStages parts the readers of a tied variable, holding a copy in each of their stages") {
  TableReadTwice m;
  const StagePlanOptions options{.stages = 2, .rows = 8, .linkBytesPerSecond = 1e9};
  // Untied, the cut can only fall after the last product: all four in stage 0.
  CHECK(m.plan(options).seconds == std::vector<double>{4, 0});
  m.g.tieAcrossStages(m.table);
  const StagePlan plan = m.plan(options);
  CHECK(plan.seconds == std::vector<double>{2, 2});
  // Each stage holds the table's 128 bytes and its gradient's; the second no optimizer state (SGD has none anyway).
  REQUIRE(plan.memory.size() == 2);
  CHECK(plan.memory[0].parameters == 2 * 128);
  CHECK(plan.memory[1].parameters == 2 * 128);
  CHECK(plan.memory[1].gradients == 2 * 128);
}

TEST_CASE("planStages keeps the readers of a tied variable the servers hold in one stage: they keep one copy") {
  TableReadTwice m;
  m.g.tieAcrossStages(m.table);
  const StagePlan plan = m.plan({.stages = 2, .rows = 8, .linkBytesPerSecond = 1e9, .served = {m.table.node()}});
  CHECK(plan.seconds == std::vector<double>{4, 0});
  REQUIRE(plan.memory.size() == 2);
  CHECK(plan.memory[0].parameters == 3 * 128);  // the table once, a and b
  CHECK(plan.memory[1].parameters == 0);
}

// Unstaged's values: every matmul's gradient reads its input (x or the tanh before it), every
// tanh's gradient its output, square's gradient its input, mean's its input, and the backward
// pass starts from the loss (8 bytes); with 8 rows each other value is 8 x 4 float64 = 256 bytes,
// each variable 4 x 4 = 128.
TEST_CASE("planStages reckons what each stage holds: parameters, gradients, optimizer state, kept activations") {
  Unstaged m(true);
  const StagePlan plan = planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                                    {.stages = 3, .rows = 8, .microbatches = 4, .linkBytesPerSecond = 1e9});
  REQUIRE(plan.memory.size() == 3);
  // Stage s: layers 2s and 2s + 1, the tanh of layer 2s - 1 and (last stage) the loss.
  // {x, tanh 0}, {tanh 1, tanh 2}, {tanh 3, tanh 4, tanh 5, square, the loss}
  const std::vector<double> kept{2 * 256, 2 * 256, 4 * 256 + 8};
  const std::vector<int> inFlight{3, 2, 1};  // 1f1b: stage s holds min(S - s, M) micro-batches
  for (size_t s = 0; s < 3; ++s) {
    CAPTURE(s);
    const StageMemory& held = plan.memory[s];
    CHECK(held.parameters == 2 * 128);
    CHECK(held.gradients == 2 * 128);
    CHECK(held.optimizerState == 2 * 2 * 128);
    CHECK(held.activations == kept[s]);
    CHECK(held.inFlight == inFlight[s]);
    CHECK(held.total() == 4 * 256 + inFlight[s] * kept[s]);
  }
  CHECK(contains(plan.describe(), "holds 2.6 kB (parameters 256 B, gradients 256 B, optimizer state 512 B, "
                                  "activations 3 x 512 B)"));
  // --shard optimizer over 2 replicas: each stage's worker holds half of its Adam slots.
  const StagePlan sharded =
      planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                 {.stages = 3, .rows = 8, .microbatches = 4, .linkBytesPerSecond = 1e9, .optimizerShards = 2});
  for (const StageMemory& held : sharded.memory) CHECK(held.optimizerState == 2 * 128);
  // GPipe holds every micro-batch on every stage.
  const StagePlan gpipe =
      planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                 {.stages = 3, .rows = 8, .microbatches = 4, .schedule = PipelineSchedule::GPipe});
  for (const StageMemory& held : gpipe.memory) CHECK(held.inFlight == 4);
}

TEST_CASE("planStages takes each value's bytes from a run of the step where it is given one") {
  Unstaged m(true);
  // A run of 5 rows (Session::valueTypes) sizes the values 5 x 4 float64 = 160 bytes, whatever
  // `rows` says; the loss stays 8 bytes and the variables 128.
  Session session(m.g);
  const FeedMap feeds{{m.g.find("x")->output(), randomTensor(f64, {5, 4}, 1)}};
  const StagePlan plan =
      planStages(m.g, {m.loss}, m.step, m.seconds({1, 1, 1, 1, 1, 1}),
                 {.stages = 3, .valueBytes = valueBytes(session.valueTypes({m.loss}, feeds, {m.step})), .rows = 8});
  REQUIRE(plan.memory.size() == 3);
  CHECK(plan.memory[0].parameters == 2 * 128);
  CHECK(plan.memory[0].activations == 2 * 160);
  CHECK(plan.memory[2].activations == 4 * 160 + 8);
  CHECK(plan.boundaryBytes[0] == 160);
}

TEST_CASE("planStages under a memory limit: the fastest cut that fits, or a refusal saying what the leanest needs") {
  Unstaged m;
  const auto seconds = m.seconds({2, 2, 1, 1, 1, 1});
  StagePlanOptions options{.stages = 2, .rows = 64, .microbatches = 4, .linkBytesPerSecond = 1e9};
  const StagePlan fastest = planStages(m.g, {m.loss}, m.step, seconds, options);
  auto largest = [](const StagePlan& p) {
    double most = 0;
    for (const StageMemory& held : p.memory) most = std::max(most, held.total());
    return most;
  };
  // The fastest cut is 2 layers | 4 layers, and its second stage holds the most (under 1f1b stage
  // 0 keeps two micro-batches' activations, stage 1 one, but stage 1 keeps six values and the
  // loss): a limit just below it moves a layer into stage 0, slower but within the limit.
  CHECK(fastest.seconds == std::vector<double>{4, 4});
  options.memoryPerStage = largest(fastest) - 1;
  const StagePlan lean = planStages(m.g, {m.loss}, m.step, seconds, options);
  CHECK(lean.firstOp[1] > fastest.firstOp[1]);
  CHECK(lean.memory[1].total() < fastest.memory[1].total());
  CHECK(largest(lean) <= options.memoryPerStage);
  CHECK(*std::max_element(lean.seconds.begin(), lean.seconds.end()) >
        *std::max_element(fastest.seconds.begin(), fastest.seconds.end()));
  // Below every cut: refused with what the leanest cut needs, and that much fits.
  options.memoryPerStage = largest(lean) / 2;
  std::string refusal;
  try {
    planStages(m.g, {m.loss}, m.step, seconds, options);
  } catch (const Error& e) {
    refusal = e.what();
  }
  CHECK(contains(refusal, "no cut of the step into 2 pipeline stages keeps every stage within"));
  CHECK(contains(refusal, "activations the schedule (1f1b) holds"));
  const std::string needs = refusal.substr(refusal.find("needs ") + 6);
  const double leanest = std::stod(needs.substr(needs.find('(') + 1));
  CHECK(contains(refusal, fmt::format("{:.0f} bytes more", leanest - options.memoryPerStage)));
  options.memoryPerStage = leanest;
  CHECK(largest(planStages(m.g, {m.loss}, m.step, seconds, options)) == leanest);
  options.memoryPerStage = leanest - 1;
  CHECK_THROWS_AS(planStages(m.g, {m.loss}, m.step, seconds, options), Error);
}
