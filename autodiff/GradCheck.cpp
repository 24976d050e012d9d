#include "autodiff/GradCheck.h"

#include "autodiff/Gradients.h"
#include "core/Random.h"
#include "ops/Ops.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace weft {
namespace {

/// Compares `analytic` with the central difference of `loss` in the element `x` points at (which
/// is restored afterwards), keeping the worst relative error in the report.
void compareAt(double* x, double analytic, const std::function<double()>& loss, double epsilon, const std::string& what,
               GradCheckReport& report) {
  const double saved = *x;
  *x = saved + epsilon;
  const double up = loss();
  *x = saved - epsilon;
  const double down = loss();
  *x = saved;
  const double numeric = (up - down) / (2 * epsilon);
  const double err = std::abs(analytic - numeric) / (1 + std::abs(numeric));
  if (err > report.maxError) {
    report.maxError = err;
    report.detail = fmt::format("{}: autodiff {} vs finite difference {} (error {:.3g})", what, analytic, numeric, err);
  }
}

}  // namespace

GradCheckReport checkGradients(Graph& graph, Output y, const std::vector<Output>& xs,
                               const FeedMap& feeds, const GradCheckOptions& options) {
  WEFT_CHECK(y.dtype() == f64, "checkGradients needs an f64 output, got {}", y.type().str());
  Session session(graph, {1, false});
  const Tensor y0 = session.run({y}, feeds)[0];

  // L = sum(w * y) with a fixed random w checks a random combination of the Jacobian's rows.
  Tensor w(f64, y0.shape());
  const uint64_t key = streamKey(options.seed, "gradcheck");
  for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] = 2 * uniformAt(key, static_cast<uint64_t>(i)) - 1;
  const Output loss = sum(mul(y, graph.constant(w)));

  std::vector<Grad> grads = gradients(loss, xs);
  std::vector<Output> fetch;
  for (size_t k = 0; k < xs.size(); ++k) fetch.push_back(grads[k].valid() ? toDense(grads[k]) : zerosLike(xs[k]));
  const std::vector<Tensor> analytic = session.run(fetch, feeds);

  FeedMap perturbed = feeds;
  GradCheckReport report;
  for (size_t k = 0; k < xs.size(); ++k) {
    Tensor* x = nullptr;
    for (auto& [out, value] : perturbed) {
      if (out == xs[k]) {
        value = value.clone();
        x = &value;
      }
    }
    WEFT_CHECK(x != nullptr, "checkGradients: {} is not fed", xs[k].name());
    WEFT_CHECK(x->dtype() == f64, "checkGradients: {} must be fed as f64", xs[k].name());
    double* p = x->data<double>();
    for (int64_t i = 0; i < x->numel(); ++i) {
      compareAt(p + i, analytic[k].at(i), [&] { return session.run({loss}, perturbed)[0].item(); }, options.epsilon,
                fmt::format("d/d{}[{}]", xs[k].name(), i), report);
    }
  }
  report.ok = report.maxError <= options.tolerance;
  return report;
}

GradCheckReport checkVariableGradients(Graph& graph, Output loss, const std::vector<std::string>& variables,
                                       const FeedMap& feeds, const GradCheckOptions& options, int64_t samples) {
  std::vector<Output> vars;
  for (const std::string& name : variables) {
    Node* n = graph.find(name);
    WEFT_CHECK(n && n->op == "Variable", "checkVariableGradients: no variable named '{}'", name);
    WEFT_CHECK(n->outputs[0].dtype == f64, "checkVariableGradients: variable '{}' must be f64", name);
    vars.push_back(n->output());
  }
  std::vector<Output> fetch;
  for (const Grad& g : gradients(loss, vars)) fetch.push_back(g.valid() ? toDense(g) : Output());
  GradCheckReport report;
  for (size_t k = 0; k < vars.size(); ++k) {
    if (!fetch[k].valid()) {
      report.ok = false;
      report.detail = fmt::format("the loss does not depend on variable '{}'", variables[k]);
      return report;
    }
  }
  Session session(graph, {1, false});
  const std::vector<Tensor> analytic = session.run(fetch, feeds);
  for (size_t k = 0; k < vars.size(); ++k) {
    double largest = 0;
    for (double v : analytic[k].toDoubles()) largest = std::max(largest, std::abs(v));
    if (largest <= 1e-12) {
      report.ok = false;
      report.detail =
          fmt::format("variable '{}' has an all-zero gradient: the check would prove nothing", variables[k]);
      return report;
    }
    // Elements are perturbed in a host copy, which is written back before each evaluation (the
    // variable may live on a GPU).
    Tensor& variable = session.variable(vars[k].node());
    const Tensor host = variable.to(cpu()).clone();
    double* value = host.data<double>();
    const std::vector<double> gradient = analytic[k].toDoubles();
    const int64_t n = analytic[k].numel();
    auto perturbedLoss = [&] {
      variable.copyFrom(host);
      return session.run({loss}, feeds)[0].item();
    };
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / samples)) {
      compareAt(value + i, gradient[static_cast<size_t>(i)], perturbedLoss, options.epsilon,
                fmt::format("d loss / d {}[{}]", variables[k], i), report);
    }
    variable.copyFrom(host);
  }
  report.ok = report.maxError <= options.tolerance;
  return report;
}

}  // namespace weft
