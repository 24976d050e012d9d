// Helpers for testing ops one by one: seeded random inputs, tolerance by dtype, element-wise
// comparison with a reference computed in double, and one-shot evaluation. Used by weft's own
// tests and meant for users who add ops. Pair with checkGradients (autodiff/GradCheck.h).
#pragma once

#include "core/Session.h"

#include <string>
#include <vector>

namespace weft::testing {

/// Relative/absolute tolerance for a kernel against a double reference: 1e-4 for f32 (5e-3 for
/// bf16/f16), 1e-10 for f64, exact for integers.
double toleranceFor(DType dtype);

/// Values uniform in [lo, hi), reproducible from `seed`.
Tensor randomTensor(DType dtype, const Shape& shape, uint64_t seed, double lo = -1, double hi = 1);
/// Integers uniform in [lo, hi).
Tensor randomInts(DType dtype, const Shape& shape, int64_t lo, int64_t hi, uint64_t seed);

/// "" when every |actual - expected| <= tol * (1 + |expected|) (equal infinities and NaN against
/// NaN count as equal) and shapes agree in element count; otherwise a description of the worst
/// element, a NaN where a number was expected (or the reverse) being the worst.
std::string compare(const Tensor& actual, const std::vector<double>& expected, double tol);

/// Runs `y` once in a fresh session.
Tensor evaluate(Graph& graph, Output y, const FeedMap& feeds = {}, int threads = 1);

}  // namespace weft::testing
