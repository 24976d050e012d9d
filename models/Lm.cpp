// LmModel: data (generator or text corpus), the LSTM graph with its full and sampled softmax
// losses, the training batch stream with shared candidates, and full-softmax evaluation.
#include "models/Lm.h"

#include "core/Random.h"
#include "data/TextCorpus.h"
#include "nn/Layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace weft::models {
namespace {

// Subtracted from the logit of a candidate that equals the position's target, so the target is
// counted once (accidental-hit removal); exp of it underflows to 0 in f32 and f64.
constexpr double kHitPenalty = 1e9;
// Evaluation batches are padded to a multiple of this many steps.
constexpr int64_t kEvalWidthStep = 16;

/// Per-position losses (N) masked, summed.
Output maskedSum(Output perPosition, Output mask) { return sum(perPosition * mask); }
Output wordCount(Output mask) { return maximum(sum(mask), scalarLike(mask, 1.0)); }

Output fullSoftmaxLossSum(Output hidden, Output outW, Output outB, Output targets, Output mask) {
  const Output logits = matmul(hidden, outW, false, true) + outB;
  return maskedSum(sparseSoftmaxCrossEntropy(logits, targets), mask);
}

/// log P(id) under the sampler: ids are sorted by decreasing frequency, so starting the softmax
/// bias there keeps the many rare words' logits low before training has pushed them down (the
/// sampled softmax touches a rare word only when it is drawn, but the full softmax sums them all).
Tensor logPrior(const LogUniformSampler& sampler, DType dtype) {
  std::vector<double> values(static_cast<size_t>(sampler.range()));
  for (int64_t k = 0; k < sampler.range(); ++k) values[static_cast<size_t>(k)] = std::log(sampler.prob(k));
  return Tensor::fromVector(values, {sampler.range()}).cast(dtype);
}

/// `t` (B, T) widened to (B, width) with zeros: evaluation pads its batches to a few widths so the
/// session compiles (and keeps) few full-softmax plans, whose (B * T, vocab) buffers are large.
Tensor padColumns(const Tensor& t, int64_t width) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out = Tensor::zeros(t.dtype(), {rows, width});
  const size_t elem = dtypeSize(t.dtype());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(r * width) * elem,
                static_cast<const char*>(t.raw()) + static_cast<size_t>(r * cols) * elem,
                static_cast<size_t>(cols) * elem);
  }
  return out;
}

}  // namespace

LogUniformSampler::LogUniformSampler(int64_t range) : range_(range), logRange_(std::log1p(static_cast<double>(range))) {
  WEFT_CHECK(range >= 1, "LogUniformSampler: range {} must be positive", range);
}

double LogUniformSampler::prob(int64_t id) const {
  WEFT_CHECK(id >= 0 && id < range_, "LogUniformSampler: id {} outside [0, {})", id, range_);
  return std::log1p(1.0 / static_cast<double>(id + 1)) / logRange_;
}

std::vector<int32_t> LogUniformSampler::sample(int64_t count, uint64_t key, uint64_t counter) const {
  // floor(exp(u log(range + 1))) - 1 has exactly the log-uniform distribution.
  const uint64_t stream = mix64(key ^ mix64(counter));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const double x = std::floor(std::exp(uniformAt(stream, static_cast<uint64_t>(i)) * logRange_)) - 1.0;
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(std::clamp<double>(x, 0.0, static_cast<double>(range_ - 1)));
  }
  return ids;
}

Output fullSoftmaxLoss(Output hidden, Output outW, Output outB, Output targets, Output mask) {
  return fullSoftmaxLossSum(hidden, outW, outB, targets, mask) / wordCount(mask);
}

/// The sampled-softmax loss summed over the unmasked positions.
Output sampledSoftmaxLossSum(Output hidden, Output outW, Output outB, Output targets, Output mask, Output candidates,
                             Output candidateLogQ, Output targetLogQ) {
  const Output trueLogit = sum(hidden * gather(outW, targets), {1}) + (gather(outB, targets) - targetLogQ);
  // A candidate that is the row's own target (an accidental hit) is pushed out of the softmax.
  const Output sampledLogits = penalizeMatches(
      matmul(hidden, gather(outW, candidates), false, true) + (gather(outB, candidates) - candidateLogQ), targets,
      candidates, kHitPenalty);
  return maskedSum(sampledSoftmaxCrossEntropy(trueLogit, sampledLogits), mask);
}

Output sampledSoftmaxLoss(Output hidden, Output outW, Output outB, Output targets, Output mask,
                          Output candidates, Output candidateLogQ, Output targetLogQ) {
  return sampledSoftmaxLossSum(hidden, outW, outB, targets, mask, candidates, candidateLogQ, targetLogQ) /
         wordCount(mask);
}

// ---- the training stream: the Batcher's batches plus the step's shared candidates -------------

class LmModel::Batches : public data::BatchSource {
 public:
  Batches(const LmModel& model, data::Dataset dataset, data::BatchOptions options)
      : model_(model), batcher_(std::move(dataset), std::move(options)) {}

  data::Batch next() override {
    const auto counter = static_cast<uint64_t>(batcher_.position());
    data::Batch batch = batcher_.next();
    model_.addCandidates(batch, counter);
    return batch;
  }
  int64_t position() const override { return batcher_.position(); }
  void seek(int64_t position) override { batcher_.seek(position); }
  int64_t batchesPerEpoch() const override { return batcher_.batchesPerEpoch(); }
  uint64_t dataHash() const override { return batcher_.dataHash(); }
  bool readPart(int64_t index, int64_t count) override { return batcher_.readPart(index, count); }

 private:
  const LmModel& model_;
  data::Batcher batcher_;
};

std::vector<ModelOption> LmModel::options() {
  LmConfig& c = config_;
  return {
      {"embed", "word embedding size", &c.embed},
      {"hidden", "LSTM hidden size", &c.hidden},
      {"projection", "projection size before the softmax (0: none)", &c.projection},
      {"sampled", "sampled-softmax candidates per step (0: full softmax)", &c.sampled},
      {"tie-embeddings",
       "the softmax's weight is the embedding table (--embed must equal --projection, or --hidden "
       "without a projection); pipelines may put its two readers in different stages",
       &c.tieEmbeddings},
      {"eval-batch", "sentences per evaluation batch", &c.evalBatch},
      {"vocab", "built-in language: words (specials excluded)", &c.vocab},
      {"classes", "built-in language: word classes", &c.classes},
      {"zipf", "built-in language: Zipf exponent of each class's words", &c.zipf},
      {"train-sentences", "built-in language: training sentences", &c.trainSentences},
      {"heldout-sentences", "built-in language: held-out sentences", &c.heldoutSentences},
      {"min-count", "text corpus: minimum count of a vocabulary word", &c.minCount},
      {"max-vocab", "text corpus: most ids in the vocabulary (specials included)", &c.maxVocab},
      {"max-length", "text corpus: longer sentences are truncated (1 to 65535)", &c.maxLength},
      {"vocab-file",
       "text corpus: the vocabulary, one word per line (optionally with its count), most frequent "
       "first, as 1B-Word ships it; the first --max-vocab ids are used (default: built from the "
       "corpus with --min-count)",
       &c.vocabFile},
      {"heldout-data",
       "text corpus: held-out sentences, a file or a directory of files (default: the corpus's "
       "last 5%)",
       &c.heldoutData},
      {"streams",
       "text corpus: read as this many streams of consecutive sentences, each batch taking an equal "
       "share of each; a data-parallel worker reads and holds only its part's streams, so with a "
       "multiple of --workers each holds 1/N of the corpus. The order depends on this count alone",
       &c.streams},
  };
}

OptimizerSpec LmModel::defaultOptimizer() const {
  OptimizerSpec spec;
  spec.name = "adam";
  spec.lr = config_.lr;
  spec.clipNorm = 1.0;
  return spec;
}

void LmModel::addCandidates(data::Batch& batch, uint64_t counter) const {
  if (config_.sampled <= 0) return;
  const auto draws = static_cast<double>(config_.sampled);
  const std::vector<int32_t> ids = sampler_->sample(config_.sampled, streamKey(common_.seed, "lm/candidates"), counter);
  std::vector<float> logQ(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) logQ[i] = static_cast<float>(std::log(draws * sampler_->prob(ids[i])));
  const Tensor& targets = batch.at("targets");
  Tensor targetLogQ(f32, targets.shape());
  const int32_t* t = targets.data<int32_t>();
  float* q = targetLogQ.data<float>();
  for (int64_t i = 0; i < targets.numel(); ++i) q[i] = static_cast<float>(std::log(draws * sampler_->prob(t[i])));
  batch["candidates"] = Tensor::fromVector(ids, {config_.sampled});
  batch["candidates_logq"] = Tensor::fromVector(logQ, {config_.sampled});
  batch["targets_logq"] = targetLogQ;
}

data::Dataset LmModel::loadCorpus(const std::string& path) {
  const std::vector<std::string> files = data::corpusFiles(path);
  std::map<std::string, int64_t> counts;
  auto scan = std::make_shared<const data::CorpusScan>(
      data::scanCorpus(files, config_.maxLength, config_.vocabFile.empty() ? &counts : nullptr));
  const data::Vocab vocab = config_.vocabFile.empty() ? data::Vocab::build(counts, config_.minCount, config_.maxVocab)
                                                      : data::Vocab::loadWordList(config_.vocabFile, config_.maxVocab);
  vocabSize_ = vocab.size();
  const size_t sentences = scan->lengths.size();
  size_t trainCount = sentences;
  if (config_.heldoutData.empty()) {
    WEFT_CHECK(sentences >= 2, "lm: text corpus '{}' has {} non-empty lines; at least 2 are needed", path, sentences);
    trainCount -= std::max<size_t>(1, sentences / 20);
    const data::PackedSentences heldout = data::readSentenceRange(*scan, vocab, trainCount, sentences);
    for (size_t i = 0; i < heldout.size(); ++i) heldout_.emplace_back(heldout[i].begin(), heldout[i].end());
  } else {
    const data::PackedSentences heldout =
        data::readPackedSentences(data::corpusFiles(config_.heldoutData), vocab, config_.maxLength);
    WEFT_CHECK(heldout.size() >= 1, "lm: held-out corpus '{}' has no non-empty lines", config_.heldoutData);
    for (size_t i = 0; i < heldout.size(); ++i) heldout_.emplace_back(heldout[i].begin(), heldout[i].end());
  }
  WEFT_CHECK(static_cast<size_t>(config_.streams) <= trainCount,
             "lm: --streams {} must be 1 to the corpus's {} training sentences", config_.streams, trainCount);
  return data::lmStreams(std::move(scan), vocab, trainCount, config_.streams);
}

void LmModel::build(Graph& g, const CommonOptions& common) {
  common_ = common;
  graph_ = &g;
  WEFT_CHECK(config_.embed > 0 && config_.hidden > 0 && config_.projection >= 0 && config_.sampled >= 0,
             "lm: embed {}, hidden {} must be positive and projection {}, sampled {} non-negative", config_.embed,
             config_.hidden, config_.projection, config_.sampled);
  // Flags are checked before a corpus is read (a large one takes minutes).
  const int64_t batchSize = common.batchSize > 0 ? common.batchSize : config_.batchSize;
  WEFT_CHECK(config_.streams >= 1 && batchSize % config_.streams == 0,
             "lm: --streams {} must divide the batch of {}: each batch takes an equal share of every stream",
             config_.streams, batchSize);
  WEFT_CHECK(config_.streams == 1 || !common.data.empty(),
             "lm: --streams {} reads a text corpus in streams; the built-in language (no --data) has none",
             config_.streams);
  WEFT_CHECK(common.data.empty() || (config_.maxLength >= 1 && config_.maxLength <= 65535),
             "lm: --max-length {} must be 1 to 65535 for a text corpus", config_.maxLength);
  data::Dataset train;
  heldout_.clear();
  heldoutLogProb_.clear();
  if (common.data.empty()) {
    data::LanguageSpec spec;
    spec.vocab = config_.vocab;
    spec.classes = config_.classes;
    spec.zipf = config_.zipf;
    spec.successors = std::min(spec.successors, spec.classes);
    language_ = std::make_shared<const data::SyntheticLanguage>(spec);
    vocabSize_ = spec.vocab + data::kFirstWordId;
    const auto trainCount = static_cast<uint64_t>(config_.trainSentences);
    // Made as batches are read: a worker makes only the sentences of its part of each batch.
    train = data::lmDataset(language_, trainCount);
    for (uint64_t i = 0; i < static_cast<uint64_t>(config_.heldoutSentences); ++i) {
      heldout_.push_back(language_->sentence(trainCount + i));
      heldoutLogProb_.push_back(language_->logProb(heldout_.back()));
    }
  } else {
    train = loadCorpus(common.data);
  }
  sampler_ = std::make_unique<LogUniformSampler>(vocabSize_);

  data::BatchOptions batching;
  batching.batchSize = batchSize;
  batching.seed = common.seed;
  batching.padded = {"tokens", "targets"};
  // The loss is normalised by the words of the whole step, so that data-parallel workers, each
  // with a part of the batch, together compute the gradient of the total batch.
  batching.counted = {"targets"};
  batching.bucketWindow = 32;  // similar lengths per batch: less padding
  batching.streams = config_.streams;
  WEFT_CHECK(static_cast<int64_t>(train.size()) >= batching.batchSize,
             "lm: {} training sentences do not fill one batch of {}", train.size(), batching.batchSize);
  train_ = std::make_unique<Batches>(*this, std::move(train), batching);

  g.setSeed(common.seed);
  const DType dt = parseDType(common.dtype);
  tokens_ = g.placeholder("tokens", i32, {-1, -1});
  targets_ = g.placeholder("targets", i32, {-1, -1});
  g.placeholder("tokens_mask", f32, {-1, -1});  // in every batch; the model needs only targets_mask
  targetsMask_ = g.placeholder("targets_mask", f32, {-1, -1});

  nn::Embedding embedding(g, "embedding", vocabSize_, config_.embed, dt);
  nn::LSTM lstm(g, "lstm", config_.embed, config_.hidden, dt);
  // The Batcher gives (B, T); the fused LSTM runs time-major. The lookup and the LSTM are one
  // recompute segment (its gates and cells are what the LSTM's gradient reads).
  Output states;
  {
    auto segment = g.recompute(common.recompute);
    states = transpose(lstm(transpose(embedding(tokens_), {1, 0, 2})).y, {1, 0, 2});
  }
  Output hidden = reshape(states, {-1, config_.hidden});
  int64_t width = config_.hidden;
  if (config_.projection > 0) {
    hidden = nn::Linear(g, "projection", width, config_.projection, false, dt)(hidden);
    width = config_.projection;
  }
  Output outW;
  if (config_.tieEmbeddings) {
    WEFT_CHECK(config_.embed == width,
               "lm: --tie-embeddings makes the embedding table the softmax's weight, so --embed ({}) must equal the "
               "width before the softmax ({}, {})",
               config_.embed, width, config_.projection > 0 ? "--projection" : "--hidden");
    outW = embedding.table;
    g.tieAcrossStages(outW);
  } else {
    outW = g.variable("softmax/weight", dt, {vocabSize_, width},
                      Initializer::normal(0, 1.0 / std::sqrt(static_cast<double>(width))));
  }
  const Output outB = g.variable("softmax/bias", dt, {vocabSize_}, Initializer::fromTensor(logPrior(*sampler_, dt)));
  const Output targets = reshape(targets_, {-1});
  const Output mask = cast(reshape(targetsMask_, {-1}), dt);
  evalLossSum_ = fullSoftmaxLossSum(hidden, outW, outB, targets, mask);
  const Output words = maximum(cast(g.placeholder("targets_count", f64, {}), dt), g.scalar(1.0, dt));
  if (config_.sampled == 0) {
    loss_ = evalLossSum_ / words;
    return;
  }
  const Output candidates = g.placeholder("candidates", i32, {config_.sampled});
  const Output candidateLogQ = cast(g.placeholder("candidates_logq", f32, {config_.sampled}), dt);
  const Output targetLogQ = cast(reshape(g.placeholder("targets_logq", f32, {-1, -1}), {-1}), dt);
  loss_ = sampledSoftmaxLossSum(hidden, outW, outB, targets, mask, candidates, candidateLogQ, targetLogQ) / words;
}

data::BatchSource& LmModel::trainData() {
  WEFT_CHECK(train_ != nullptr, "lm: trainData() before build()");
  return *train_;
}

std::map<std::string, double> LmModel::evaluate(Session& session, int64_t maxBatches) {
  WEFT_CHECK(graph_ != nullptr, "lm: evaluate() before build()");
  const auto perBatch = static_cast<size_t>(std::max<int64_t>(1, config_.evalBatch));
  data::BatchOptions batching;
  batching.padded = {"tokens", "targets"};
  double lossSum = 0, words = 0, trueLogProb = 0;
  int64_t batches = 0;
  for (size_t begin = 0; begin < heldout_.size() && (maxBatches <= 0 || batches < maxBatches);
       begin += perBatch, ++batches) {
    const size_t end = std::min(heldout_.size(), begin + perBatch);
    std::vector<data::Example> examples;
    for (size_t i = begin; i < end; ++i) {
      examples.push_back(data::lmExample(heldout_[i]));
      words += static_cast<double>(heldout_[i].size() + 1);
      if (language_) trueLogProb += heldoutLogProb_[i];
    }
    std::vector<const data::Example*> pointers;
    for (const auto& e : examples) pointers.push_back(&e);
    const data::Batch batch = data::collate(pointers, batching);
    const int64_t width = (batch.at("tokens").shape()[1] + kEvalWidthStep - 1) / kEvalWidthStep * kEvalWidthStep;
    const FeedMap feeds{{tokens_, padColumns(batch.at("tokens"), width)},
                        {targets_, padColumns(batch.at("targets"), width)},
                        {targetsMask_, padColumns(batch.at("targets_mask"), width)}};
    lossSum += session.run({evalLossSum_}, feeds)[0].item();
  }
  std::map<std::string, double> metrics{{"loss", lossSum / words}, {"perplexity", std::exp(lossSum / words)}};
  if (language_) metrics["true_perplexity"] = std::exp(-trueLogProb / words);
  return metrics;
}

std::pair<std::string, double> LmModel::itemsIn(const data::Batch& batch) const {
  return {"words", batch.at("targets_count").item()};
}

data::Batch LmModel::shard(const data::Batch& batch, int64_t index, int64_t count) const {
  data::Batch part = data::sliceBatch(batch, index, count, {"candidates", "candidates_logq", "targets_count"});
  // Each worker's loss is its part's sum over the step's words per worker: the workers' average
  // gradient is then exactly the total batch's.
  part["targets_count"] = Tensor::scalar(f64, batch.at("targets_count").item() / static_cast<double>(count));
  return part;
}

data::Batch LmModel::trimmed(data::Batch part) const {
  std::vector<std::string> positions{"tokens", "tokens_mask", "targets", "targets_mask"};
  if (part.count("targets_logq")) positions.push_back("targets_logq");
  return data::trimPadding(std::move(part), "targets_mask", positions);
}

std::unique_ptr<ZooModel> makeLmModel() { return std::make_unique<LmModel>(); }

}  // namespace weft::models
