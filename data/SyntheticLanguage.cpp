// SyntheticLanguage: the grammar's tables, drawn once from the spec's seed, and the sentence
// stream, drawn from counter-based random numbers so sentence i depends only on (seed, i).
#include "data/SyntheticLanguage.h"

#include "core/Error.h"
#include "core/Hash.h"
#include "core/Random.h"
#include "data/TextCorpus.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace weft::data {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Index of the first cumulative value above u (u in [0, 1)); the last entry is 1.
size_t searchCdf(const std::vector<double>& cdf, double u) {
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return std::min(static_cast<size_t>(it - cdf.begin()), cdf.size() - 1);
}

}  // namespace

SyntheticLanguage::SyntheticLanguage(LanguageSpec spec) : spec_(spec) {
  WEFT_CHECK(spec_.classes >= 1 && spec_.vocab >= spec_.classes,
             "SyntheticLanguage: vocab {} must be at least the number of classes {} (>= 1)", spec_.vocab,
             spec_.classes);
  WEFT_CHECK(spec_.vocab + kFirstWordId <= std::numeric_limits<int32_t>::max(),
             "SyntheticLanguage: vocab {} does not fit i32 ids", spec_.vocab);
  WEFT_CHECK(spec_.successors >= 1 && spec_.successors <= spec_.classes,
             "SyntheticLanguage: successors {} must be in [1, classes = {}]", spec_.successors, spec_.classes);
  WEFT_CHECK(spec_.zipf > 0, "SyntheticLanguage: zipf exponent {} must be positive", spec_.zipf);
  WEFT_CHECK(spec_.meanLength > 1 && spec_.maxLength >= 1,
             "SyntheticLanguage: meanLength {} must exceed 1 and maxLength {} be at least 1", spec_.meanLength,
             spec_.maxLength);
  const uint64_t key = streamKey(spec_.seed, "grammar");
  const auto k = static_cast<uint64_t>(spec_.classes);
  start_ = makeTransitions(key, k, 0.0);
  for (uint64_t c = 0; c < k; ++c) {
    // End probabilities vary by class around 1 / meanLength, so length carries some signal.
    const double end = std::min(0.9, (0.5 + uniformAt(key, c)) / spec_.meanLength);
    classes_.push_back(makeTransitions(key, c, end));
  }
  for (int64_t c = 0; c < spec_.classes; ++c) {
    const int64_t words = (spec_.vocab - c + spec_.classes - 1) / spec_.classes;
    std::vector<double> cdf(static_cast<size_t>(words));
    double total = 0;
    for (int64_t r = 0; r < words; ++r) {
      total += std::pow(static_cast<double>(r + 1), -spec_.zipf);
      cdf[static_cast<size_t>(r)] = total;
    }
    for (double& x : cdf) x /= total;
    cdf.back() = 1.0;
    emissionCdf_.push_back(std::move(cdf));
    emissionNorm_.push_back(total);
  }
}

SyntheticLanguage::Transitions SyntheticLanguage::makeTransitions(uint64_t key, uint64_t row, double end) const {
  // A partial Fisher-Yates shuffle picks the successors; exponential weights make the
  // probabilities a Dirichlet(1) draw.
  const uint64_t base = (row + 1) * 1000003ULL;
  std::vector<int64_t> all(static_cast<size_t>(spec_.classes));
  std::iota(all.begin(), all.end(), 0);
  Transitions t;
  t.end = end;
  double total = 0;
  for (int64_t j = 0; j < spec_.successors; ++j) {
    const auto remaining = static_cast<double>(spec_.classes - j);
    const auto pick = static_cast<size_t>(j) + static_cast<size_t>(uniformAt(key, base + 2 * j) * remaining);
    std::swap(all[static_cast<size_t>(j)], all[pick]);
    t.next.push_back(all[static_cast<size_t>(j)]);
    const double w = -std::log(1.0 - uniformAt(key, base + 2 * j + 1)) + 0.05;
    t.prob.push_back(w);
    total += w;
  }
  double running = 0;
  for (double& p : t.prob) {
    p /= total;
    running += p;
    t.cumulative.push_back(running);
  }
  t.cumulative.back() = 1.0;
  return t;
}

int64_t SyntheticLanguage::drawClass(const Transitions& t, double u) const {
  return t.next[searchCdf(t.cumulative, u)];
}

int32_t SyntheticLanguage::drawWord(int64_t cls, double u) const {
  const auto rank = static_cast<int64_t>(searchCdf(emissionCdf_[static_cast<size_t>(cls)], u));
  return static_cast<int32_t>(kFirstWordId + rank * spec_.classes + cls);
}

template <typename OnWord>
void SyntheticLanguage::walk(uint64_t index, OnWord onWord) const {
  const uint64_t key = mix64(streamKey(spec_.seed, "sentences") ^ mix64(index));
  uint64_t draw = 0;
  int64_t cls = drawClass(start_, uniformAt(key, draw++));
  for (int64_t length = 1;; ++length) {
    // The word's draw is skipped unread by sentenceLength: draws are addressed, not consumed.
    onWord(cls, key, draw++);
    if (length >= spec_.maxLength) break;
    const Transitions& t = classes_[static_cast<size_t>(cls)];
    if (uniformAt(key, draw++) < t.end) break;
    cls = drawClass(t, uniformAt(key, draw++));
  }
}

std::vector<int32_t> SyntheticLanguage::sentence(uint64_t index) const {
  std::vector<int32_t> words;
  walk(index, [&](int64_t cls, uint64_t key, uint64_t draw) { words.push_back(drawWord(cls, uniformAt(key, draw))); });
  return words;
}

int64_t SyntheticLanguage::sentenceLength(uint64_t index) const {
  int64_t length = 0;
  walk(index, [&](int64_t, uint64_t, uint64_t) { ++length; });
  return length;
}

int64_t SyntheticLanguage::classOf(int32_t word) const {
  WEFT_CHECK(word >= kFirstWordId && word < kFirstWordId + spec_.vocab,
             "SyntheticLanguage: id {} is not a word of the language (ids {}..{})", word, kFirstWordId,
             kFirstWordId + spec_.vocab - 1);
  return (word - kFirstWordId) % spec_.classes;
}

double SyntheticLanguage::emissionProb(int32_t word) const {
  const int64_t cls = classOf(word);
  const int64_t rank = (word - kFirstWordId) / spec_.classes;
  return std::pow(static_cast<double>(rank + 1), -spec_.zipf) / emissionNorm_[static_cast<size_t>(cls)];
}

double SyntheticLanguage::transitionLogProb(const Transitions& t, int64_t cls) const {
  const auto it = std::find(t.next.begin(), t.next.end(), cls);
  return it == t.next.end() ? kNegInf : std::log(t.prob[static_cast<size_t>(it - t.next.begin())]);
}

double SyntheticLanguage::logProb(const std::vector<int32_t>& sentence) const {
  for (size_t i = 0; i < sentence.size(); ++i) {
    const int32_t w = sentence[i];
    WEFT_CHECK(w >= kFirstWordId && w < kFirstWordId + spec_.vocab,
               "SyntheticLanguage::logProb: id {} at position {} is not a word of the language (ids {}..{})", w, i,
               kFirstWordId, kFirstWordId + spec_.vocab - 1);
  }
  const auto n = static_cast<int64_t>(sentence.size());
  if (n == 0 || n > spec_.maxLength) return kNegInf;
  double lp = 0;
  int64_t prev = -1;
  for (const int32_t w : sentence) {
    const int64_t cls = classOf(w);
    if (prev < 0) {
      lp += transitionLogProb(start_, cls);
    } else {
      const Transitions& t = classes_[static_cast<size_t>(prev)];
      lp += std::log1p(-t.end) + transitionLogProb(t, cls);
    }
    lp += std::log(emissionProb(w));
    prev = cls;
  }
  // At maxLength the sentence ends with certainty.
  if (n < spec_.maxLength) lp += std::log(classes_[static_cast<size_t>(prev)].end);
  return lp;
}

double SyntheticLanguage::truePerplexity(uint64_t begin, uint64_t end) const {
  WEFT_CHECK(begin < end, "SyntheticLanguage::truePerplexity: empty range [{}, {})", begin, end);
  double logProbSum = 0;
  double tokens = 0;
  for (uint64_t i = begin; i < end; ++i) {
    const std::vector<int32_t> s = sentence(i);
    logProbSum += logProb(s);
    tokens += static_cast<double>(s.size() + 1);
  }
  return std::exp(-logProbSum / tokens);
}

Vocab SyntheticLanguage::vocab() const {
  Vocab v;
  for (int64_t i = 0; i < spec_.vocab; ++i) {
    std::string name = "w";
    name += std::to_string(kFirstWordId + i);
    v.add(name);
  }
  return v;
}

Dataset lmDataset(std::shared_ptr<const SyntheticLanguage> language, uint64_t count) {
  const LanguageSpec& spec = language->spec();
  const uint64_t sizes[] = {static_cast<uint64_t>(spec.vocab), static_cast<uint64_t>(spec.classes),
                            static_cast<uint64_t>(spec.successors), static_cast<uint64_t>(spec.maxLength), spec.seed,
                            count};
  const double shape[] = {spec.zipf, spec.meanLength};
  Generator g;
  g.size = count;
  g.make = [language](size_t i) { return lmExample(language->sentence(i)); };
  // tokens (<s> and the words) and targets (the words and </s>) are one longer than the sentence.
  g.length = [language](size_t i, const std::string&) { return language->sentenceLength(i) + 1; };
  g.identity = xxh64(shape, sizeof shape, xxh64(sizes, sizeof sizes, 0x4c414e47));  // "LANG"
  return Dataset::generated(std::move(g));
}

}  // namespace weft::data
