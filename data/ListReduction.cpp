// The list-reduction generator.
#include "data/ListReduction.h"

#include "core/Random.h"

#include <algorithm>

namespace weft::data {
namespace {

/// Uniform integer in [0, n) from draw i of a stream.
int64_t below(uint64_t key, uint64_t i, int64_t n) {
  return std::min(n - 1, static_cast<int64_t>(uniformAt(key, i) * static_cast<double>(n)));
}

int64_t reduce(Reduction r, const std::vector<int64_t>& digits) {
  int64_t acc = 0;
  switch (r) {
    case Reduction::Sum:
      for (const int64_t d : digits) acc = (acc + d) % 10;
      return acc;
    case Reduction::Product:
      acc = 1;
      for (const int64_t d : digits) acc = (acc * d) % 10;
      return acc;
    case Reduction::Max:
      return *std::max_element(digits.begin(), digits.end());
    case Reduction::Min:
      return *std::min_element(digits.begin(), digits.end());
    case Reduction::First:
      return digits.front();
    case Reduction::Last:
      return digits.back();
  }
  WEFT_THROW("unknown reduction {}", static_cast<int>(r));
}

}  // namespace

std::string reductionName(Reduction r) {
  static const char* const names[] = {"sum", "product", "max", "min", "first", "last"};
  const auto i = static_cast<int64_t>(r);
  WEFT_CHECK(i >= 0 && i < kListReductions, "unknown reduction {}", i);
  return names[i];
}

std::vector<Example> listReduction(const ListReductionSpec& spec, int64_t count, uint64_t seed) {
  WEFT_CHECK(spec.minLength >= 1 && spec.maxLength >= spec.minLength && count >= 0,
             "listReduction: invalid spec (lengths {}..{}, count {})", spec.minLength, spec.maxLength, count);
  const uint64_t base = streamKey(seed, "list_reduction");
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t key = mix64(base ^ mix64(static_cast<uint64_t>(i)));
    const auto r = static_cast<Reduction>(below(key, 0, kListReductions));
    const int64_t length = spec.minLength + below(key, 1, spec.maxLength - spec.minLength + 1);
    std::vector<int64_t> digits(static_cast<size_t>(length));
    for (int64_t k = 0; k < length; ++k)
      digits[static_cast<size_t>(k)] = below(key, 2 + static_cast<uint64_t>(k), kListDigits);
    std::vector<int64_t> tokens{kListDigits + static_cast<int64_t>(r)};
    tokens.insert(tokens.end(), digits.begin(), digits.end());
    out.push_back({{"tokens", Tensor::fromVector(tokens, {length + 1})},
                   {"labels", Tensor::scalar(i64, static_cast<double>(reduce(r, digits)))}});
  }
  return out;
}

}  // namespace weft::data
