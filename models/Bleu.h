// Corpus BLEU-4 (Papineni et al., 2002) on token id sequences, one reference per sentence.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::models {

/// Corpus BLEU-4 in [0, 100]: the geometric mean of the clipped n-gram precisions for n = 1..4,
/// each summed over the whole corpus before dividing, times the brevity penalty exp(1 - r / c)
/// when the total hypothesis length c is below the total reference length r. It is 0 when any
/// precision is 0 (no smoothing) or the hypotheses are empty. Throws when the two lists differ
/// in length.
double corpusBleu(const std::vector<std::vector<int32_t>>& hypotheses,
                  const std::vector<std::vector<int32_t>>& references);

}  // namespace weft::models
