// The NMT network (bidirectional LSTM encoder, attentional LSTM decoder), its step-by-step
// decoders (greedy, beam search) and the "nmt" zoo model.
#include "models/Nmt.h"

#include "data/Translation.h"
#include "models/Bleu.h"
#include "nn/Layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace weft::models {
namespace {

/// Added to the attention scores of padding positions: far below any real score, yet finite
/// so that softmax's max-subtraction stays exact.
constexpr double kMaskedScore = 1e9;

/// The layers, created once and applied by the training graph and the step graph.
struct NmtLayers {
  NmtLayers(Graph& g, const NmtConfig& c)
      : sourceEmbedding(g, "source_embedding", c.sourceVocab, c.embedding, c.dtype),
        targetEmbedding(g, "target_embedding", c.targetVocab, c.embedding, c.dtype),
        forward(g, "encoder_forward", c.embedding, c.hidden, c.dtype),
        backward(g, "encoder_backward", c.embedding, c.hidden, c.dtype),
        decoder(g, "decoder", c.embedding, c.hidden, c.dtype),
        initH(g, "init_h", c.hidden, c.hidden, true, c.dtype),
        initC(g, "init_c", c.hidden, c.hidden, true, c.dtype),
        attentional(g, "attentional", 2 * c.hidden, c.hidden, false, c.dtype),
        output(g, "output", c.hidden, c.targetVocab, true, c.dtype) {}

  nn::Embedding sourceEmbedding, targetEmbedding;
  nn::LSTM forward, backward, decoder;
  nn::Linear initH, initC, attentional, output;
};

/// Luong global attention with dot scores: queries (B, Tq, H) over keys (B, Ts, H) whose
/// padding (mask 0) gets no weight; returns the attentional states tanh(W [query; context]) as
/// rows (B * Tq, H).
Output attend(const NmtLayers& l, Output queries, Output encoded, Output mask) {
  Output scores = batchMatmul(queries, encoded, false, true) + expandDims((mask - 1.0) * kMaskedScore, 1);
  Output context = batchMatmul(softmax(scores), encoded);
  const int64_t width = queries.shape()[2] + encoded.shape()[2];
  return tanh(l.attentional(reshape(concat({queries, context}, 2), {-1, width})));
}

void buildEncoder(const NmtLayers& l, const NmtConfig& c, NmtNet& net) {
  auto scope = net.source.graph().scope("encoder");
  const Output lengths = cast(sum(net.sourceMask, {1}), i32);
  Graph& g = net.source.graph();
  Output x, forward, backward;  // each direction a recompute segment
  {
    auto segment = g.recompute(c.recompute);
    x = transpose(l.sourceEmbedding(net.source), {1, 0, 2});  // (Ts, B, E)
    forward = l.forward(x).y;
  }
  {
    // The backward LSTM reads each sentence from its last real word; padding stays at the end.
    auto segment = g.recompute(c.recompute);
    backward = reverseSequence(l.backward(reverseSequence(x, lengths, 0, 1)).y, lengths, 0, 1);
  }
  net.encoded = transpose(forward + backward, {1, 0, 2});
  // Position 0 of the backward pass has read the whole sentence and no padding.
  const Output summary = reshape(slice(backward, {0, 0, 0}, {1, -1, -1}), {-1, c.hidden});
  net.initialH = tanh(l.initH(summary));
  net.initialC = l.initC(summary);
}

void buildTrainingDecoder(const NmtLayers& l, const NmtConfig& c, NmtNet& net) {
  auto scope = net.source.graph().scope("decoder_train");
  Graph& g = net.source.graph();
  Output states, attentional;  // the decoder's LSTM and its attention, each a recompute segment
  {
    auto segment = g.recompute(c.recompute);
    const Output y = transpose(l.targetEmbedding(net.targetIn), {1, 0, 2});  // (Tt, B, E)
    states = transpose(l.decoder(y, net.initialH, net.initialC).y, {1, 0, 2});
  }
  {
    auto segment = g.recompute(c.recompute);
    attentional = attend(l, states, net.encoded, cast(net.sourceMask, c.dtype));
  }
  const Output logits = l.output(attentional);
  const Output tokenLoss = sparseSoftmaxCrossEntropy(logits, reshape(net.targetOut, {-1}));
  const Output weights = reshape(cast(net.targetOutMask, c.dtype), {-1});
  net.tokenLossSum = sum(tokenLoss * weights);
  net.tokenCount = sum(weights);
  net.loss = net.tokenLossSum / maximum(net.tokenCount, scalarLike(net.tokenCount, 1.0));
}

NmtStep buildStep(Graph& g, const NmtLayers& l, const NmtConfig& c) {
  NmtStep s;
  s.previous = g.placeholder("nmt_step/previous", i32, {-1});
  s.h = g.placeholder("nmt_step/h", c.dtype, {-1, c.hidden});
  s.c = g.placeholder("nmt_step/c", c.dtype, {-1, c.hidden});
  s.encoded = g.placeholder("nmt_step/encoded", c.dtype, {-1, -1, c.hidden});
  s.sourceMask = g.placeholder("nmt_step/source_mask", f32, {-1, -1});
  auto scope = g.scope("nmt_step");
  const Output x = reshape(l.targetEmbedding(s.previous), {1, -1, c.embedding});
  const LstmOutputs o = l.decoder(x, s.h, s.c);
  const Output att = attend(l, expandDims(o.hLast, 1), s.encoded, cast(s.sourceMask, c.dtype));
  s.logProbs = logSoftmax(l.output(att));
  s.hNext = o.hLast;
  s.cNext = o.cLast;
  return s;
}

// ---- decoding -----------------------------------------------------------------------------

/// Sources padded into (N, Ts) ids and their f32 mask.
std::pair<Tensor, Tensor> padSources(const std::vector<std::vector<int32_t>>& sources) {
  size_t longest = 1;
  for (const auto& s : sources) longest = std::max(longest, s.size());
  const auto n = static_cast<int64_t>(sources.size()), t = static_cast<int64_t>(longest);
  Tensor ids = Tensor::zeros(i32, {n, t}), mask = Tensor::zeros(f32, {n, t});
  for (size_t i = 0; i < sources.size(); ++i) {
    std::copy(sources[i].begin(), sources[i].end(), ids.data<int32_t>() + i * longest);
    std::fill_n(mask.data<float>() + i * longest, sources[i].size(), 1.0f);
  }
  return {ids, mask};
}

/// The decoder's inputs that change from step to step, and those that do not.
struct DecodeState {
  Tensor previous, h, c, encoded, mask;
};

DecodeState startDecoding(Session& session, const NmtNet& net, const std::vector<std::vector<int32_t>>& sources) {
  for (size_t i = 0; i < sources.size(); ++i) {
    WEFT_CHECK(!sources[i].empty(), "nmt decode: source sentence {} is empty (it must end in </s>)", i);
  }
  auto [ids, mask] = padSources(sources);
  const std::vector<Tensor> r =
      session.run({net.encoded, net.initialH, net.initialC}, {{net.source, ids}, {net.sourceMask, mask}});
  Tensor previous = Tensor::full(i32, {static_cast<int64_t>(sources.size())}, data::kBos);
  return {previous, r[1], r[2], r[0], mask};
}

/// Runs one decoder step; returns the log-probabilities as f64 (N, V) and advances h and c.
Tensor decodeStep(Session& session, const NmtStep& step, DecodeState& st) {
  const std::vector<Tensor> r = session.run({step.logProbs, step.hNext, step.cNext},
                                            {{step.previous, st.previous},
                                             {step.h, st.h},
                                             {step.c, st.c},
                                             {step.encoded, st.encoded},
                                             {step.sourceMask, st.mask}});
  st.h = r[1];
  st.c = r[2];
  return r[0].cast(f64);
}

/// Rows `rows` of t (any dtype), in that order.
Tensor gatherRows(const Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<int64_t> dims = t.shape().dims();
  const size_t rowBytes = t.bytes() / static_cast<size_t>(dims[0]);
  dims[0] = static_cast<int64_t>(rows.size());
  Tensor out(t.dtype(), Shape(dims));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<char*>(out.raw()) + i * rowBytes,
                static_cast<const char*>(t.raw()) + static_cast<size_t>(rows[i]) * rowBytes, rowBytes);
  }
  return out;
}

struct Hypothesis {
  std::vector<int32_t> tokens;
  double score = 0;  // total log-probability
  int64_t row = 0;   // its row in the step's batch
};

struct Candidate {
  double score;
  size_t parent;  // index into the live hypotheses
  int32_t token;
};

/// The `k` best tokens of a row of log-probabilities, best first, lower ids first on ties.
std::vector<int32_t> topTokens(const double* row, int64_t vocab, int64_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const auto better = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  const auto count = static_cast<size_t>(std::min(k, vocab));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(), better);
  ids.resize(count);
  return ids;
}

/// One sentence's beam: live hypotheses (at most width) and finished ones.
struct Beam {
  std::vector<Hypothesis> live, finished;
  bool done = false;

  double bestFinished() const {
    double best = -std::numeric_limits<double>::infinity();
    for (const auto& h : finished) best = std::max(best, h.score);
    return best;
  }
  /// Extends every live hypothesis by its `width` best tokens and keeps the best `width`
  /// extensions; those ending in </s> move to `finished`.
  void advance(const double* logProbs, int64_t vocab, int64_t width) {
    std::vector<Candidate> candidates;
    for (size_t p = 0; p < live.size(); ++p) {
      const double* row = logProbs + live[p].row * vocab;
      for (int32_t t : topTokens(row, vocab, width)) candidates.push_back({live[p].score + row[t], p, t});
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
    std::vector<Hypothesis> next;
    for (const Candidate& cand : candidates) {
      if (static_cast<int64_t>(next.size() + finished.size()) >= width) break;
      Hypothesis h{live[cand.parent].tokens, cand.score, live[cand.parent].row};
      if (cand.token == data::kEos) {
        finished.push_back(std::move(h));
      } else {
        h.tokens.push_back(cand.token);
        next.push_back(std::move(h));
      }
    }
    live = std::move(next);
    // Scores only fall as hypotheses grow, so a finished one ahead of every live one is final.
    double bestLive = -std::numeric_limits<double>::infinity();
    for (const auto& h : live) bestLive = std::max(bestLive, h.score);
    done = live.empty() || bestFinished() >= bestLive;
  }
  std::vector<int32_t> best() const {
    const Hypothesis* top = nullptr;
    for (const auto* list : {&finished, &live}) {
      for (const auto& h : *list) {
        if (!top || h.score > top->score) top = &h;
      }
    }
    return top ? top->tokens : std::vector<int32_t>{};
  }
};

// ---- zoo model helpers ----------------------------------------------------------------------

std::vector<int32_t> idsOf(const Tensor& t) { return t.toVector<int32_t>(); }

data::Batch collateRange(const data::Dataset& set, size_t begin, size_t end) {
  data::BatchOptions options;
  options.padded = {"source", "target_in", "target_out"};
  return data::collate(set, begin, end, options);
}

}  // namespace

NmtNet buildNmt(Graph& g, const NmtConfig& c) {
  WEFT_CHECK(c.sourceVocab > data::kFirstWordId && c.targetVocab > data::kFirstWordId,
             "nmt: vocabularies of {} (source) and {} (target) ids leave no words", c.sourceVocab, c.targetVocab);
  g.setSeed(c.seed);
  NmtNet net;
  net.source = g.placeholder("source", i32, {-1, -1});
  net.sourceMask = g.placeholder("source_mask", f32, {-1, -1});
  net.targetIn = g.placeholder("target_in", i32, {-1, -1});
  net.targetInMask = g.placeholder("target_in_mask", f32, {-1, -1});
  net.targetOut = g.placeholder("target_out", i32, {-1, -1});
  net.targetOutMask = g.placeholder("target_out_mask", f32, {-1, -1});
  const NmtLayers layers(g, c);
  buildEncoder(layers, c, net);
  buildTrainingDecoder(layers, c, net);
  net.step = buildStep(g, layers, c);
  return net;
}

std::vector<std::vector<int32_t>> greedyDecode(Session& session, const NmtNet& net,
                                               const std::vector<std::vector<int32_t>>& sources, int64_t maxLength) {
  std::vector<std::vector<int32_t>> out(sources.size());
  if (sources.empty()) return out;
  DecodeState st = startDecoding(session, net, sources);
  std::vector<bool> done(sources.size(), false);
  for (int64_t t = 0; t < maxLength && std::count(done.begin(), done.end(), false) > 0; ++t) {
    const Tensor logProbs = decodeStep(session, net.step, st);
    const int64_t vocab = logProbs.shape()[1];
    for (size_t i = 0; i < sources.size(); ++i) {
      const int32_t token = topTokens(logProbs.data<double>() + static_cast<int64_t>(i) * vocab, vocab, 1)[0];
      st.previous.data<int32_t>()[i] = token;
      if (done[i]) continue;
      if (token == data::kEos) done[i] = true;
      else out[i].push_back(token);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> beamDecode(Session& session, const NmtNet& net,
                                             const std::vector<std::vector<int32_t>>& sources, int64_t width,
                                             int64_t maxLength) {
  WEFT_CHECK(width >= 1, "nmt beam search: width {} must be at least 1", width);
  std::vector<std::vector<int32_t>> out(sources.size());
  if (sources.empty()) return out;
  DecodeState st = startDecoding(session, net, sources);
  // Row i * width + k holds hypothesis k of sentence i; rows without one repeat a live row.
  std::vector<int64_t> rows;
  for (size_t i = 0; i < sources.size(); ++i)
    rows.insert(rows.end(), static_cast<size_t>(width), static_cast<int64_t>(i));
  st = {gatherRows(st.previous, rows), gatherRows(st.h, rows), gatherRows(st.c, rows), gatherRows(st.encoded, rows),
        gatherRows(st.mask, rows)};
  std::vector<Beam> beams(sources.size());
  for (size_t i = 0; i < beams.size(); ++i) beams[i].live.push_back({{}, 0.0, static_cast<int64_t>(i) * width});
  for (int64_t t = 0; t < maxLength; ++t) {
    if (std::all_of(beams.begin(), beams.end(), [](const Beam& b) { return b.done; })) break;
    const Tensor logProbs = decodeStep(session, net.step, st);
    const int64_t vocab = logProbs.shape()[1];
    std::vector<int64_t> parents(rows.size());
    std::iota(parents.begin(), parents.end(), 0);
    for (size_t i = 0; i < beams.size(); ++i) {
      Beam& beam = beams[i];
      if (beam.done) continue;
      beam.advance(logProbs.data<double>(), vocab, width);
      const int64_t base = static_cast<int64_t>(i) * width;
      for (int64_t k = 0; k < width; ++k) {
        const size_t row = static_cast<size_t>(base + k);
        const Hypothesis* h = beam.live.empty() ? nullptr : &beam.live[static_cast<size_t>(k) % beam.live.size()];
        parents[row] = h ? h->row : base;
        st.previous.data<int32_t>()[row] = h ? h->tokens.back() : data::kEos;
      }
      for (size_t k = 0; k < beam.live.size(); ++k) beam.live[k].row = base + static_cast<int64_t>(k);
    }
    st.h = gatherRows(st.h, parents);
    st.c = gatherRows(st.c, parents);
  }
  for (size_t i = 0; i < beams.size(); ++i) out[i] = beams[i].best();
  return out;
}

// ---- the zoo model --------------------------------------------------------------------------

std::vector<ModelOption> NmtModel::options() {
  return {{"embedding", "word embedding size", &config_.embedding},
          {"hidden", "LSTM state size (encoder directions and decoder)", &config_.hidden},
          {"vocab", "words per language: the synthetic task's size, or the cap for --data", &vocab_},
          {"train-size", "synthetic training sentences", &trainSize_},
          {"test-size", "held-out sentences (synthetic, or the last pairs of --data)", &testSize_},
          {"beam", "beam width for the BLEU evaluation (1: greedy)", &beam_},
          {"eval-batch", "sentences decoded together in evaluation", &evalBatch_},
          {"streams",
           "--data: read as this many streams of consecutive pairs, each batch taking an equal share of each; "
           "a data-parallel worker reads and holds only its part's streams, so with a multiple of --workers "
           "each holds 1/N of the pairs. The order depends on this count alone",
           &streams_}};
}

OptimizerSpec NmtModel::defaultOptimizer() const {
  OptimizerSpec spec;
  spec.name = "adam";
  spec.lr = 2e-3;
  spec.clipNorm = 5;
  return spec;
}

void NmtModel::loadData(const CommonOptions& common) {
  if (common.data.empty()) {
    data::TranslationSpec spec;
    spec.language.vocab = vocab_;
    const data::TranslationTask task(spec);
    // Held-out sentences come from far along the stream, whatever the training size.
    const uint64_t testBegin = uint64_t{1} << 40;
    trainSet_ = task.examples(0, static_cast<uint64_t>(trainSize_));
    testSet_ = task.examples(testBegin, testBegin + static_cast<uint64_t>(testSize_));
    config_.sourceVocab = config_.targetVocab = task.vocabSize();
    return;
  }
  const size_t comma = common.data.find(',');
  WEFT_CHECK(comma != std::string::npos, "nmt: --data '{}' must name two aligned files as SOURCE,TARGET", common.data);
  data::ParallelTextOptions options;
  options.maxVocab = vocab_ + data::kFirstWordId;
  std::map<std::string, int64_t> sourceCounts, targetCounts;
  auto scan = std::make_shared<const data::ParallelScan>(data::scanParallelText(
      common.data.substr(0, comma), common.data.substr(comma + 1), options, &sourceCounts, &targetCounts));
  const data::Vocab source = data::Vocab::build(sourceCounts, options.minCount, options.maxVocab);
  const data::Vocab target = data::Vocab::build(targetCounts, options.minCount, options.maxVocab);
  const size_t pairs = scan->sourceLengths.size();
  WEFT_CHECK(pairs > static_cast<size_t>(testSize_), "nmt: {} usable sentence pairs in '{}', but test-size is {}",
             pairs, common.data, testSize_);
  const size_t split = pairs - static_cast<size_t>(testSize_);
  WEFT_CHECK(static_cast<size_t>(streams_) <= split, "nmt: --streams {} must be 1 to the {} training pairs of '{}'",
             streams_, split, common.data);
  // Every worker evaluates on the held-out pairs; each trains on its streams alone.
  const data::PackedPairs heldout = data::readPairRange(*scan, source, target, split, pairs);
  std::vector<data::Example> examples;
  for (size_t i = 0; i < heldout.source.size(); ++i)
    examples.push_back(data::translationExample(heldout.source[i], heldout.target[i]));
  testSet_ = data::Dataset(std::move(examples));
  trainSet_ = data::translationStreams(std::move(scan), source, target, split, streams_);
  config_.sourceVocab = source.size();
  config_.targetVocab = target.size();
}

void NmtModel::build(Graph& g, const CommonOptions& common) {
  WEFT_CHECK(common.dtype == "f32" || common.dtype == "f64", "nmt: dtype '{}' is not f32 or f64", common.dtype);
  WEFT_CHECK(beam_ >= 1, "nmt: beam {} must be at least 1", beam_);
  WEFT_CHECK(evalBatch_ >= 1, "nmt: eval-batch {} must be at least 1", evalBatch_);
  config_.dtype = common.dtype == "f64" ? f64 : f32;
  config_.recompute = common.recompute;
  config_.seed = common.seed;
  if (common.batchSize > 0) batchSize_ = common.batchSize;
  // Flags are checked before the parallel text is read (a large one takes minutes).
  WEFT_CHECK(streams_ >= 1 && batchSize_ % streams_ == 0,
             "nmt: --streams {} must divide the batch of {}: each batch takes an equal share of every stream", streams_,
             batchSize_);
  WEFT_CHECK(streams_ == 1 || !common.data.empty(),
             "nmt: --streams {} reads parallel text (--data) in streams; the built-in task has none", streams_);
  loadData(common);
  net_ = buildNmt(g, config_);
  const Output stepTokens = cast(g.placeholder("target_out_count", f64, {}), config_.dtype);
  trainLoss_ = net_.tokenLossSum / maximum(stepTokens, scalarLike(stepTokens, 1.0));
  data::BatchOptions options;
  options.batchSize = batchSize_;
  options.seed = common.seed;
  options.padded = {"source", "target_in", "target_out"};
  options.counted = {"target_out"};
  options.bucketWindow = 20;  // similar lengths per batch: less padding to compute
  options.streams = streams_;
  train_ = std::make_unique<data::Batcher>(trainSet_, options);
}

std::map<std::string, double> NmtModel::evaluate(Session& session, int64_t maxBatches) {
  size_t count = testSet_.size();
  if (maxBatches > 0) count = std::min(count, static_cast<size_t>(maxBatches * evalBatch_));
  std::vector<std::vector<int32_t>> hypotheses, references;
  double lossSum = 0, tokens = 0;
  for (size_t begin = 0; begin < count; begin += static_cast<size_t>(evalBatch_)) {
    const size_t end = std::min(count, begin + static_cast<size_t>(evalBatch_));
    const std::vector<Tensor> r = session.run({net_.tokenLossSum, net_.tokenCount},
                                              feedsFor(session.graph(), collateRange(testSet_, begin, end)));
    lossSum += r[0].item();
    tokens += r[1].item();
    std::vector<std::vector<int32_t>> sources;
    size_t longest = 0;
    for (size_t i = begin; i < end; ++i) {
      sources.push_back(idsOf(testSet_[i].at("source")));
      longest = std::max(longest, sources.back().size());
      std::vector<int32_t> reference = idsOf(testSet_[i].at("target_out"));
      reference.pop_back();  // </s>
      references.push_back(std::move(reference));
    }
    const auto maxLength = static_cast<int64_t>(2 * longest + 10);
    auto decoded = beam_ > 1 ? beamDecode(session, net_, sources, beam_, maxLength)
                             : greedyDecode(session, net_, sources, maxLength);
    hypotheses.insert(hypotheses.end(), decoded.begin(), decoded.end());
  }
  return {{"bleu", corpusBleu(hypotheses, references)},
          {"perplexity", std::exp(lossSum / std::max(tokens, 1.0))}};
}

std::pair<std::string, double> NmtModel::itemsIn(const data::Batch& batch) const {
  return {"words", batch.at("target_out_count").item()};
}

data::Batch NmtModel::shard(const data::Batch& batch, int64_t index, int64_t count) const {
  data::Batch part = data::sliceBatch(batch, index, count, {"target_out_count"});
  // Each worker divides its part's loss sum by the step's tokens per worker: the workers'
  // average gradient is then exactly the total batch's.
  part["target_out_count"] = Tensor::scalar(f64, batch.at("target_out_count").item() / static_cast<double>(count));
  return part;
}

data::Batch NmtModel::trimmed(data::Batch part) const {
  part = data::trimPadding(std::move(part), "source_mask", {"source", "source_mask"});
  return data::trimPadding(std::move(part), "target_out_mask",
                           {"target_in", "target_in_mask", "target_out", "target_out_mask"});
}

std::unique_ptr<ZooModel> makeNmtModel() { return std::make_unique<NmtModel>(); }

}  // namespace weft::models
