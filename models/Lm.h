// The LSTM language model of the zoo ("lm"): embedding -> LSTM -> optional projection ->
// softmax over the vocabulary (its weight optionally the embedding table), trained with the
// full softmax or a sampled softmax (log-uniform candidates shared across the batch, with the
// logQ correction) and evaluated by full-softmax perplexity. Built-in data come from
// data::SyntheticLanguage, whose true perplexity is reported beside the model's; with
// CommonOptions::data it reads a one-sentence-per-line text corpus.
#pragma once

#include "data/SyntheticLanguage.h"
#include "models/ZooModel.h"

#include <memory>

namespace weft::models {

/// Candidate ids drawn with replacement from P(k) = log((k + 2) / (k + 1)) / log(range + 1) over
/// [0, range), which suits ids sorted by decreasing frequency.
class LogUniformSampler {
 public:
  explicit LogUniformSampler(int64_t range);
  double prob(int64_t id) const;
  /// `count` ids, a function of (key, counter) only.
  std::vector<int32_t> sample(int64_t count, uint64_t key, uint64_t counter) const;
  int64_t range() const { return range_; }

 private:
  int64_t range_;
  double logRange_;
};

/// Mean over real positions (mask 1) of -log softmax(hidden outW^T + outB)[target]: hidden (N, P),
/// outW (V, P), outB (V), targets (N) i32, mask (N).
Output fullSoftmaxLoss(Output hidden, Output outW, Output outB, Output targets, Output mask);
/// The sampled-softmax estimate of it: each position's softmax runs over its target and the shared
/// candidates (S) i32, with logits corrected by -logQ (candidateLogQ (S), targetLogQ (N): log of
/// the expected number of draws) and candidates equal to the target removed.
Output sampledSoftmaxLoss(Output hidden, Output outW, Output outB, Output targets, Output mask,
                          Output candidates, Output candidateLogQ, Output targetLogQ);

struct LmConfig {
  int64_t embed = 128;
  int64_t hidden = 256;
  int64_t projection = 0;       // size of a projection before the softmax; 0: none
  int64_t sampled = 1024;       // sampled-softmax candidates per step; 0: full softmax
  bool tieEmbeddings = false;   // the softmax's weight is the embedding table (embed = projection or hidden)
  int64_t batchSize = 64;
  int64_t evalBatch = 16;
  // Built-in data.
  int64_t vocab = 50000;        // generator words (specials excluded)
  int64_t classes = 64;
  double zipf = 1.2;
  int64_t trainSentences = 400000;
  int64_t heldoutSentences = 2000;
  // Real data (CommonOptions::data).
  int64_t minCount = 1;
  int64_t maxVocab = 100000;
  int64_t maxLength = 100;      // longer sentences are truncated
  std::string vocabFile;        // a word list, most frequent first (1B-Word's); empty: built from the counts
  std::string heldoutData;      // held-out file or directory; empty: the corpus's last 5%
  int64_t streams = 1;          // the corpus read as streams of consecutive sentences (BatchOptions::streams)
  double lr = 2e-3;
};

class LmModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override;
  OptimizerSpec defaultOptimizer() const override;
  int64_t defaultSteps() const override { return 4500; }
  bool updatesSparsely() const override { return true; }  // the embedding
  void build(Graph& g, const CommonOptions& common) override;
  Output loss() const override { return loss_; }
  data::BatchSource& trainData() override;
  std::map<std::string, double> evaluate(Session& session, int64_t maxBatches) override;
  std::string targetMetric() const override { return "perplexity"; }
  bool higherIsBetter() const override { return false; }
  std::pair<std::string, double> itemsIn(const data::Batch& batch) const override;
  /// Every worker keeps the step's sampled candidates whole and normalises by the step's words.
  data::Batch shard(const data::Batch& batch, int64_t index, int64_t count) const override;
  /// Padding changes nothing: the LSTM runs left to right and the loss masks it.
  data::Batch trimmed(data::Batch part) const override;

  LmConfig& config() { return config_; }
  int64_t vocabSize() const { return vocabSize_; }
  /// Sum over real positions of the full-softmax cross-entropy (what evaluation runs).
  Output evalLossSum() const { return evalLossSum_; }
  /// The training batch source's candidate fields added to a batch (a no-op with full softmax).
  void addCandidates(data::Batch& batch, uint64_t counter) const;

 private:
  class Batches;
  /// The training sentences of the corpus at `path` (a file, or a directory of shards); sets the
  /// vocabulary size and the held-out sentences.
  data::Dataset loadCorpus(const std::string& path);

  LmConfig config_;
  CommonOptions common_;
  int64_t vocabSize_ = 0;
  std::shared_ptr<const data::SyntheticLanguage> language_;
  std::vector<std::vector<int32_t>> heldout_;
  std::vector<double> heldoutLogProb_;  // under the generator, per held-out sentence
  std::unique_ptr<LogUniformSampler> sampler_;
  std::unique_ptr<data::BatchSource> train_;
  Output tokens_, targets_, targetsMask_;
  Output loss_, evalLossSum_;
  Graph* graph_ = nullptr;
};

std::unique_ptr<ZooModel> makeLmModel();

}  // namespace weft::models
