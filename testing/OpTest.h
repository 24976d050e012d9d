// Helpers for testing ops one by one: seeded random inputs, tolerance by dtype, element-wise
// comparison with a reference computed in double, one-shot evaluation, and the same computation
// on two devices compared. Used by weft's own tests and meant for users who add ops. Pair with
// checkGradients (autodiff/GradCheck.h).
#pragma once

#include "core/Session.h"

#include <functional>
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

/// What a builder puts in a graph for compareDevices: the outputs to compare, their feeds, and
/// targets to run in the same step (a training step, whose effect fetched variables show).
struct Computation {
  std::vector<Output> outputs;
  FeedMap feeds;
  std::vector<Node*> targets;
};

/// Builds the computation twice, on the CPU and under `graph.onDevice(device)` (e.g. "cuda:0"),
/// runs each once and compares every output: dtype, shape, and values within `tol` as compare()
/// judges them. "" when they agree, else the first output that differs and how.
std::string compareDevices(const std::function<Computation(Graph&)>& build, const std::string& device, double tol);

}  // namespace weft::testing
