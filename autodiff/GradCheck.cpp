#include "autodiff/GradCheck.h"

#include "autodiff/Gradients.h"
#include "core/Random.h"
#include "ops/Ops.h"

#include <algorithm>
#include <cmath>

namespace weft {

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
      const double saved = p[i];
      p[i] = saved + options.epsilon;
      const double up = session.run({loss}, perturbed)[0].item();
      p[i] = saved - options.epsilon;
      const double down = session.run({loss}, perturbed)[0].item();
      p[i] = saved;
      const double numeric = (up - down) / (2 * options.epsilon);
      const double got = analytic[k].at(i);
      const double err = std::abs(got - numeric) / (1 + std::abs(numeric));
      if (err > report.maxError) {
        report.maxError = err;
        report.detail = fmt::format("d/d{}[{}]: autodiff {} vs finite difference {} (error {:.3g})",
                                    xs[k].name(), i, got, numeric, err);
      }
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
      report.detail = fmt::format("variable '{}' has an all-zero gradient: the check would prove nothing", variables[k]);
      return report;
    }
    double* value = session.variable(vars[k].node()).data<double>();
    const int64_t n = analytic[k].numel();
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / samples)) {
      const double saved = value[i];
      value[i] = saved + options.epsilon;
      const double up = session.run({loss}, feeds)[0].item();
      value[i] = saved - options.epsilon;
      const double down = session.run({loss}, feeds)[0].item();
      value[i] = saved;
      const double numeric = (up - down) / (2 * options.epsilon), got = analytic[k].at(i);
      const double err = std::abs(got - numeric) / (1 + std::abs(numeric));
      if (err > report.maxError) {
        report.maxError = err;
        report.detail = fmt::format("d loss / d {}[{}]: autodiff {} vs finite difference {} (error {:.3g})", variables[k], i,
                                    got, numeric, err);
      }
    }
  }
  report.ok = report.maxError <= options.tolerance;
  return report;
}

}  // namespace weft
