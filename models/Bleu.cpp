// Corpus BLEU-4: n-gram counts per sentence, clipped by the reference, summed over the corpus.
#include "models/Bleu.h"

#include "core/Error.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace weft::models {
namespace {

constexpr size_t kMaxOrder = 4;

using NgramCounts = std::map<std::vector<int32_t>, int64_t>;

NgramCounts ngrams(const std::vector<int32_t>& tokens, size_t n) {
  NgramCounts counts;
  for (size_t i = 0; i + n <= tokens.size(); ++i)
    ++counts[std::vector<int32_t>(tokens.begin() + i, tokens.begin() + i + n)];
  return counts;
}

/// Hypothesis n-grams that also occur in the reference, each counted at most as often as there.
int64_t clippedMatches(const NgramCounts& hypothesis, const NgramCounts& reference) {
  int64_t matches = 0;
  for (const auto& [gram, count] : hypothesis) {
    const auto it = reference.find(gram);
    if (it != reference.end()) matches += std::min(count, it->second);
  }
  return matches;
}

}  // namespace

double corpusBleu(const std::vector<std::vector<int32_t>>& hypotheses,
                  const std::vector<std::vector<int32_t>>& references) {
  WEFT_CHECK(hypotheses.size() == references.size(), "corpusBleu: {} hypotheses for {} references",
             hypotheses.size(), references.size());
  int64_t matches[kMaxOrder] = {}, totals[kMaxOrder] = {};
  int64_t hypothesisLength = 0, referenceLength = 0;
  for (size_t s = 0; s < hypotheses.size(); ++s) {
    const auto& hyp = hypotheses[s];
    const auto& ref = references[s];
    hypothesisLength += static_cast<int64_t>(hyp.size());
    referenceLength += static_cast<int64_t>(ref.size());
    for (size_t n = 1; n <= kMaxOrder; ++n) {
      matches[n - 1] += clippedMatches(ngrams(hyp, n), ngrams(ref, n));
      totals[n - 1] += static_cast<int64_t>(hyp.size() >= n ? hyp.size() - n + 1 : 0);
    }
  }
  double logPrecisions = 0;
  for (size_t n = 0; n < kMaxOrder; ++n) {
    if (matches[n] == 0) return 0;
    logPrecisions += std::log(static_cast<double>(matches[n]) / static_cast<double>(totals[n]));
  }
  const double c = static_cast<double>(hypothesisLength), r = static_cast<double>(referenceLength);
  const double brevity = c < r ? std::exp(1 - r / c) : 1.0;
  return 100 * brevity * std::exp(logPrecisions / kMaxOrder);
}

}  // namespace weft::models
