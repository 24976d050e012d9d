// Finite-difference gradient checking, the check every differentiable op's test runs.
#pragma once

#include "core/Session.h"

#include <string>
#include <vector>

namespace weft {

struct GradCheckOptions {
  double epsilon = 1e-6;    // central-difference step
  double tolerance = 1e-6;  // |analytic - numeric| <= tolerance * (1 + |numeric|)
  uint64_t seed = 7;        // for the random projection of the output
};

struct GradCheckReport {
  bool ok = true;
  double maxError = 0;  // max of |analytic - numeric| / (1 + |numeric|)
  std::string detail;   // the worst element, for the failure message
};

/// Checks autodiff against central differences: with a fixed random tensor w of y's shape, the
/// gradient of sum(w * y) with respect to each placeholder in `xs` (fed, f64, in `feeds`) is
/// compared element by element with (f(x + e) - f(x - e)) / 2e.
GradCheckReport checkGradients(Graph& graph, Output y, const std::vector<Output>& xs,
                               const FeedMap& feeds, const GradCheckOptions& options = {});

/// Checks a model's gradients: autodiff gradients of the scalar `loss` with respect to the named
/// f64 variables against central differences taken by perturbing each variable's value, at
/// `samples` elements spread over each variable. A variable whose gradient is zero everywhere
/// fails the check, since comparing zeros would prove nothing.
GradCheckReport checkVariableGradients(Graph& graph, Output loss, const std::vector<std::string>& variables,
                                       const FeedMap& feeds, const GradCheckOptions& options = {},
                                       int64_t samples = 5);

}  // namespace weft
