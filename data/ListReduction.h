// The list-reduction task of the AMPNet paper (Gaunt et al., 2017): a token naming a reduction,
// then a variable-length list of digits; the answer is the reduction of the digits modulo 10.
#pragma once

#include "data/Dataset.h"

#include <string>
#include <vector>

namespace weft::data {

/// The reductions, in token order: token kListDigits + r names reduction r.
enum class Reduction { Sum, Product, Max, Min, First, Last };
constexpr int64_t kListDigits = 10;  // tokens 0..9 are digits
constexpr int64_t kListReductions = 6;
constexpr int64_t kListVocab = kListDigits + kListReductions;
constexpr int64_t kListClasses = 10;

/// "sum", "product", ...
std::string reductionName(Reduction r);

struct ListReductionSpec {
  int64_t minLength = 1;  // digits per list
  int64_t maxLength = 10;
};

/// `count` examples {"tokens": i64 [1 + length] (reduction token, then digits), "labels": i64 []};
/// example i is a function of (spec, seed, i) alone, and the reductions are drawn uniformly.
std::vector<Example> listReduction(const ListReductionSpec& spec, int64_t count, uint64_t seed);

}  // namespace weft::data
