// A seeded probabilistic language with a large Zipfian vocabulary whose exact perplexity is
// known. Every word belongs to exactly one of K classes; the class sequence follows a sparse
// Markov chain (a start distribution, per-class successors, a per-class end probability), and
// each class emits its words with a Zipf distribution. Because a word determines its class,
// p(w_t | history) = P(c_t | c_{t-1}) P(w_t | c_t) exactly, so an ideal model's perplexity can
// be computed for any stretch of the stream.
#pragma once

#include "data/Dataset.h"
#include "data/Vocab.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace weft::data {

struct LanguageSpec {
  int64_t vocab = 50000;    // words, specials excluded
  int64_t classes = 64;     // K; word i (from 0) belongs to class i % K with in-class rank i / K
  int64_t successors = 4;   // classes reachable from each class (and from the start)
  double zipf = 1.2;        // exponent of each class's emission distribution
  double meanLength = 20;   // the average of the per-class end probabilities is 1 / meanLength
  int64_t maxLength = 80;   // a sentence ends after this many words regardless of the chain
  uint64_t seed = 1;        // fixes the grammar
};

class SyntheticLanguage {
 public:
  explicit SyntheticLanguage(LanguageSpec spec);

  /// Sentence `index` of the language's infinite deterministic stream: word ids (>= 4; no <s>,
  /// </s>).
  std::vector<int32_t> sentence(uint64_t index) const;
  /// sentence(index).size(), without drawing the words.
  int64_t sentenceLength(uint64_t index) const;
  /// Natural-log probability of a sentence followed by </s> under the true generating process
  /// (-inf when impossible); throws naming the position of an id outside the language.
  double logProb(const std::vector<int32_t>& sentence) const;
  /// exp(-(sum of logProb) / (words + one </s> per sentence)) over sentences [begin, end): the
  /// perplexity an ideal model reaches.
  double truePerplexity(uint64_t begin, uint64_t end) const;
  /// A Vocab whose ids match the generator's ids ("w4", "w5", ...).
  Vocab vocab() const;

  /// The probability of `word` given its class (the Zipf emission).
  double emissionProb(int32_t word) const;
  int64_t classOf(int32_t word) const;
  const LanguageSpec& spec() const { return spec_; }

 private:
  struct Transitions {
    std::vector<int64_t> next;   // successor classes
    std::vector<double> cumulative;  // of their probabilities, ending at 1
    std::vector<double> prob;
    double end = 0;              // probability of ending the sentence here
  };

  /// Walks sentence `index`'s class chain, calling onWord(class, key, draw) for each word with
  /// the counter of the word's draw.
  template <typename OnWord>
  void walk(uint64_t index, OnWord onWord) const;
  int64_t drawClass(const Transitions& t, double u) const;
  int32_t drawWord(int64_t cls, double u) const;
  Transitions makeTransitions(uint64_t key, uint64_t row, double end) const;
  double transitionLogProb(const Transitions& t, int64_t cls) const;

  LanguageSpec spec_;
  Transitions start_;
  std::vector<Transitions> classes_;
  std::vector<std::vector<double>> emissionCdf_;  // per class, over in-class ranks
  std::vector<double> emissionNorm_;              // per class, sum of rank^-zipf
};

/// Sentences [0, count) of the language as language-model examples (lmExample), made when read
/// and never held; their lengths come from sentenceLength.
Dataset lmDataset(std::shared_ptr<const SyntheticLanguage> language, uint64_t count);

}  // namespace weft::data
