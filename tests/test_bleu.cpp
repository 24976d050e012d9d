// Corpus BLEU-4 against values computed by hand.
#include "models/Bleu.h"
#include "tests/TestUtil.h"

#include <cmath>

using weft::models::corpusBleu;

TEST_CASE("bleu: a corpus identical to its references scores 100") {
  CHECK(corpusBleu({{4, 5, 6, 7, 8}, {9, 10, 11, 12}}, {{4, 5, 6, 7, 8}, {9, 10, 11, 12}}) == doctest::Approx(100));
}

TEST_CASE("bleu: one substituted last word") {
  // hyp 1 2 3 4 5 6, ref 1 2 3 4 5 7: matches 5/6, 4/5, 3/4, 2/3; product 1/3; equal lengths.
  CHECK(corpusBleu({{1, 2, 3, 4, 5, 6}}, {{1, 2, 3, 4, 5, 7}}) == doctest::Approx(100 * std::pow(1.0 / 3, 0.25)));
}

TEST_CASE("bleu: n-gram counts are summed over the corpus before dividing") {
  // Sentence 1 matches 4/4, 3/3, 2/2, 1/1; sentence 2 as above 5/6, 4/5, 3/4, 2/3.
  // Corpus: 9/10 * 7/8 * 5/6 * 3/4 = 945/1920; lengths 10 = 10.
  const double expected = 100 * std::pow(945.0 / 1920, 0.25);
  CHECK(corpusBleu({{1, 2, 3, 4}, {1, 2, 3, 4, 5, 6}}, {{1, 2, 3, 4}, {1, 2, 3, 4, 5, 7}}) ==
        doctest::Approx(expected));
}

TEST_CASE("bleu: matches are clipped by the reference counts, with the brevity penalty") {
  // hyp 5 5 5 5 5, ref 5 5 5 5 6 7: unigrams min(5, 4)/5, bigrams min(4, 3)/4, trigrams
  // min(3, 2)/3, 4-grams min(2, 1)/2: product 1/5. c = 5 < r = 6: BP = exp(1 - 6/5).
  const double expected = 100 * std::exp(-0.2) * std::pow(0.2, 0.25);
  CHECK(corpusBleu({{5, 5, 5, 5, 5}}, {{5, 5, 5, 5, 6, 7}}) == doctest::Approx(expected));
}

TEST_CASE("bleu: a correct but short hypothesis pays the brevity penalty") {
  // All precisions 1; c = 5, r = 7: BP = exp(1 - 7/5).
  CHECK(corpusBleu({{1, 2, 3, 4, 5}}, {{1, 2, 3, 4, 5, 6, 7}}) == doctest::Approx(100 * std::exp(-0.4)));
}

TEST_CASE("bleu: no matching n-gram of some order gives 0") {
  CHECK(corpusBleu({{8, 9, 10, 11}}, {{1, 2, 3, 4}}) == 0);
  CHECK(corpusBleu({{1, 2, 9, 3}}, {{1, 2, 3, 4}}) == 0);  // unigrams match, no 4-gram does
  CHECK(corpusBleu({{}}, {{1, 2, 3, 4}}) == 0);
  CHECK(corpusBleu({}, {}) == 0);
}

TEST_CASE("bleu: hypothesis and reference counts must agree") {
  CHECK(contains(errorOf([] { corpusBleu({{1}}, {{1}, {2}}); }), "1 hypotheses for 2 references"));
}
