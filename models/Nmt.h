// Neural machine translation: a bidirectional LSTM encoder and an LSTM decoder with Luong-style
// global (dot) attention, trained with teacher forcing on the synthetic translation task or on
// tokenised parallel text; greedy and beam-search decoding step by step through a one-step
// decoder graph that shares the training graph's variables; corpus BLEU-4 and perplexity.
#pragma once

#include "models/ZooModel.h"

#include <memory>

namespace weft::models {

struct NmtConfig {
  int64_t sourceVocab = 0;  // ids, specials included
  int64_t targetVocab = 0;
  int64_t embedding = 128;
  int64_t hidden = 256;
  uint64_t seed = 1;
  DType dtype = f32;
  Recompute recompute = Recompute::None;  // each LSTM and the attention a recompute segment of this mode
};

/// The decoder's one-step graph: feed the previous token, the state and the encoder's outputs;
/// fetch the next token's log-probabilities and the new state.
struct NmtStep {
  Output previous;    // placeholder (N) i32
  Output h, c;        // placeholders (N, hidden)
  Output encoded;     // placeholder (N, Ts, hidden)
  Output sourceMask;  // placeholder (N, Ts) f32
  Output logProbs;    // (N, targetVocab)
  Output hNext, cNext;
};

/// The built network. Placeholders are named like the batch fields ("source", "source_mask",
/// "target_in", "target_in_mask", "target_out", "target_out_mask").
struct NmtNet {
  Output source, sourceMask, targetIn, targetInMask, targetOut, targetOutMask;
  Output loss;          // mean cross-entropy over real target tokens
  Output tokenLossSum;  // summed cross-entropy over real target tokens (for perplexity)
  Output tokenCount;    // real target tokens
  // Encoder results (need only source and source_mask), the start of decoding:
  Output encoded;                // (B, Ts, hidden): forward + backward encoder states
  Output initialH, initialC;     // (B, hidden): from the backward encoder's final state
  NmtStep step;
};

/// Builds the network in `g`.
NmtNet buildNmt(Graph& g, const NmtConfig& config);

/// Translations (word ids, without </s>) of source sentences (each ending in </s>), decoded
/// together by always taking the most likely next word, for at most maxLength words each.
std::vector<std::vector<int32_t>> greedyDecode(Session& session, const NmtNet& net,
                                               const std::vector<std::vector<int32_t>>& sources, int64_t maxLength);

/// Beam search with `width` hypotheses per sentence, scored by total log-probability; a sentence
/// stops when its best finished hypothesis beats every live one or maxLength is reached (then the
/// best hypothesis, finished or not, is returned). Width 1 gives exactly greedyDecode's output.
std::vector<std::vector<int32_t>> beamDecode(Session& session, const NmtNet& net,
                                             const std::vector<std::vector<int32_t>>& sources, int64_t width,
                                             int64_t maxLength);

/// The "nmt" zoo model. Built-in data: data::TranslationTask. With --data "SRC,TGT" (two aligned
/// tokenised files) the last test-size pairs are held out, and --streams S reads the rest in S
/// streams (data::translationStreams). Metrics: bleu (greedy, or beam search
/// with --beam > 1) and perplexity on the held-out pairs.
class NmtModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override;
  OptimizerSpec defaultOptimizer() const override;
  int64_t defaultSteps() const override { return 1000; }
  bool updatesSparsely() const override { return true; }  // the embeddings
  void build(Graph& g, const CommonOptions& common) override;
  /// The training loss: the token losses' sum over the real target tokens of the whole step
  /// (the batch's "target_out_count"), so that workers with a part of the batch each divide by
  /// the same count.
  Output loss() const override { return trainLoss_; }
  data::BatchSource& trainData() override { return *train_; }
  std::map<std::string, double> evaluate(Session& session, int64_t maxBatches) override;
  std::string targetMetric() const override { return "bleu"; }
  bool higherIsBetter() const override { return true; }
  std::pair<std::string, double> itemsIn(const data::Batch& batch) const override;
  data::Batch shard(const data::Batch& batch, int64_t index, int64_t count) const override;
  /// Padding changes nothing: the encoder reverses each source within its length, attention and
  /// the loss mask it.
  data::Batch trimmed(data::Batch part) const override;

  const NmtNet& net() const { return net_; }
  const NmtConfig& config() const { return config_; }

 private:
  void loadData(const CommonOptions& common);

  NmtConfig config_;
  int64_t vocab_ = 2000;       // synthetic task: source (and target) words
  int64_t trainSize_ = 100000;
  int64_t testSize_ = 500;
  int64_t beam_ = 1;
  int64_t batchSize_ = 64;
  int64_t evalBatch_ = 100;
  int64_t streams_ = 1;  // --data read as streams of consecutive pairs (BatchOptions::streams)
  NmtNet net_;
  Output trainLoss_;
  data::Dataset trainSet_, testSet_;
  std::unique_ptr<data::Batcher> train_;
};

std::unique_ptr<ZooModel> makeNmtModel();

}  // namespace weft::models
