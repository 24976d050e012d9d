// A user's own op, registered from outside weft and tested with weft's testing helpers:
// Softplus(x) = log(1 + exp(x)), its forward against naive loops in double, its gradient
// against central differences, and (where a GPU is present) the same function composed of
// weft's ops on the GPU against the CPU. Exits 1 on a failed check.
#include "autodiff/GradCheck.h"
#include "core/Device.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"
#include "testing/OpTest.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

using namespace weft;

namespace {

template <class T>
void softplusOf(const T* x, T* y, int64_t n) {
  // log1p(exp(x)) overflows for large x, where softplus(x) = x + log1p(exp(-x)) does not.
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] + std::log1p(std::exp(-x[i])) : std::log1p(std::exp(x[i]));
}

void softplusKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (x.dtype() == f64) softplusOf(x.data<double>(), y.data<double>(), x.numel());
  else softplusOf(x.data<float>(), y.data<float>(), x.numel());
}

/// Registers Softplus once: its shape function, CPU kernel and gradient rule together.
void registerSoftplus() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry::global().add(
        OpDef("Softplus")
            .inputs(1)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              c.check(c.dtype(0) == f32 || c.dtype(0) == f64, "x must be f32 or f64, got {}", dtypeName(c.dtype(0)));
              return {{c.dtype(0), c.shape(0)}};
            })
            .cpu(softplusKernel)
            // d/dx softplus(x) = sigmoid(x)
            .grad([](GradContext& c) -> std::vector<Grad> { return {c.dy() * sigmoid(c.x(0))}; }));
  });
}

Output softplus(Output x) {
  registerSoftplus();
  return x.graph().addNode("Softplus", {x})->output(0);
}

int failures = 0;
void expect(const std::string& what, const std::string& problem) {
  std::printf("%s: %s\n", what.c_str(), problem.empty() ? "ok" : problem.c_str());
  if (!problem.empty()) ++failures;
}

}  // namespace

int main() {
  for (DType dtype : {f32, f64}) {
    Graph g;
    Output x = g.placeholder("x", dtype, {4, 5});
    const Tensor xv = testing::randomTensor(dtype, {4, 5}, /*seed=*/1, -30, 30);
    std::vector<double> reference;
    for (double v : xv.toDoubles()) reference.push_back(std::log(1 + std::exp(v)));
    expect(std::string("forward ") + dtypeName(dtype),
           testing::compare(testing::evaluate(g, softplus(x), {{x, xv}}), reference, testing::toleranceFor(dtype)));
  }

  Graph g;
  Output x = g.placeholder("x", f64, {3, 4});
  const GradCheckReport gradient =
      checkGradients(g, softplus(x), {x}, {{x, testing::randomTensor(f64, {3, 4}, 2, -3, 3)}});
  expect("gradient", gradient.ok ? "" : gradient.detail);

  if (cudaDeviceCount() > 0) {
    // Softplus has a CPU kernel only; the same function composed of weft's ops runs on the GPU.
    expect("gpu parity", testing::compareDevices(
                             [](Graph& graph) {
                               Output in = graph.placeholder("x", f32, {8});
                               return testing::Computation{
                                   {log(1.0 + exp(in))}, {{in, testing::randomTensor(f32, {8}, 3)}}, {}};
                             },
                             "cuda:0", testing::toleranceFor(f32)));
  }
  return failures == 0 ? 0 : 1;
}
