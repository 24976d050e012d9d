#include "testing/OpTest.h"

#include "core/Random.h"

#include <cmath>

namespace weft::testing {

double toleranceFor(DType dtype) {
  switch (dtype) {
    case DType::F32: return 1e-4;
    case DType::F64: return 1e-10;
    case DType::BF16:
    case DType::F16: return 5e-3;
    default: return 0;
  }
}

Tensor randomTensor(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi) {
  Tensor t(dtype, shape);
  const uint64_t key = streamKey(seed, "randomTensor");
  dispatchFloat(dtype, [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] = static_cast<T>(lo + (hi - lo) * uniformAt(key, static_cast<uint64_t>(i)));
  });
  return t;
}

Tensor randomInts(DType dtype, const Shape& shape, int64_t lo, int64_t hi, uint64_t seed) {
  Tensor t(dtype, shape);
  const uint64_t key = streamKey(seed, "randomInts");
  dispatchIndex(dtype, [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      p[i] = static_cast<T>(
          lo + static_cast<int64_t>(uniformAt(key, static_cast<uint64_t>(i)) * static_cast<double>(hi - lo)));
    }
  });
  return t;
}

std::string compare(const Tensor& actual, const std::vector<double>& expected, double tol) {
  if (actual.numel() != static_cast<int64_t>(expected.size())) {
    return fmt::format("shape {} has {} elements, the reference {}", actual.shape().str(), actual.numel(),
                       expected.size());
  }
  double worst = -1;
  std::string detail;
  const std::vector<double> values = actual.toDoubles();  // one copy when the tensor is on a GPU
  for (size_t i = 0; i < expected.size(); ++i) {
    const double got = values[i];
    // Equal infinities and NaN against NaN match; any other NaN error is the worst kind.
    const bool same = got == expected[i] || (std::isnan(got) && std::isnan(expected[i]));
    const double err = same ? 0.0 : std::abs(got - expected[i]) / (1 + std::abs(expected[i]));
    const bool bad = !(err <= tol);
    if (bad && (detail.empty() || std::isnan(err) || err > worst)) {
      worst = err;
      detail = fmt::format("element {} of {}: got {}, reference {} (error {:.3g} > {:.3g})", i,
                           actual.shape().str(), got, expected[i], err, tol);
    }
  }
  return detail;
}

Tensor evaluate(Graph& graph, Output y, const FeedMap& feeds, int threads) {
  Session s(graph, {threads, false});
  return s.run({y}, feeds)[0];
}

std::string compareDevices(const std::function<Computation(Graph&)>& build, const std::string& device, double tol) {
  Graph onCpu, onDevice;
  const Computation reference = build(onCpu);
  Computation tested;
  {
    auto placed = onDevice.onDevice(device);
    tested = build(onDevice);
  }
  if (tested.outputs.size() != reference.outputs.size())
    return fmt::format("the builder made {} outputs on {} but {} on the CPU", tested.outputs.size(), device,
                       reference.outputs.size());
  Session cpuSession(onCpu), deviceSession(onDevice);
  const std::vector<Tensor> want = cpuSession.run(reference.outputs, reference.feeds, reference.targets);
  const std::vector<Tensor> got = deviceSession.run(tested.outputs, tested.feeds, tested.targets);
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string name = reference.outputs[i].name();
    if (got[i].dtype() != want[i].dtype() || got[i].shape() != want[i].shape())
      return fmt::format("output {} ({}): {} gives {}{}, the CPU {}{}", i, name, device, dtypeName(got[i].dtype()),
                         got[i].shape().str(), dtypeName(want[i].dtype()), want[i].shape().str());
    const std::string differs = compare(got[i], want[i].toDoubles(), tol);
    if (!differs.empty()) return fmt::format("output {} ({}) on {}: {}", i, name, device, differs);
  }
  return "";
}

}  // namespace weft::testing
