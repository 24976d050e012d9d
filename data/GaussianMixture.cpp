#include "data/GaussianMixture.h"

#include "core/Random.h"

#include <cstring>

namespace weft::data {

ClassificationData gaussianMixture(const GaussianMixtureSpec& spec, int64_t n, uint64_t sampleSeed) {
  WEFT_CHECK(spec.dim > 0 && spec.classes > 1 && spec.clustersPerClass > 0 && n >= 0,
             "gaussianMixture: invalid spec (dim {}, classes {}, clusters {}, n {})", spec.dim, spec.classes,
             spec.clustersPerClass, n);
  const uint64_t centreKey = streamKey(spec.taskSeed, "centres");
  const uint64_t sampleKey = streamKey(sampleSeed, "samples");
  const int64_t clusters = spec.classes * spec.clustersPerClass;
  ClassificationData out{Tensor(f32, {n, spec.dim}), Tensor(i64, {n})};
  float* x = out.features.data<float>();
  int64_t* y = out.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<uint64_t>(i);
    const auto cluster = static_cast<int64_t>(uniformAt(sampleKey, u) * static_cast<double>(clusters));
    y[i] = cluster % spec.classes;
    for (int64_t d = 0; d < spec.dim; ++d) {
      const double centre = normalAt(centreKey, static_cast<uint64_t>(cluster * spec.dim + d));
      const double noise = normalAt(sampleKey, static_cast<uint64_t>(n + i * spec.dim + d));
      x[i * spec.dim + d] = static_cast<float>(centre + spec.noise * noise);
    }
  }
  return out;
}

ClassificationData batchOf(const ClassificationData& data, int64_t begin, int64_t count) {
  const int64_t n = data.labels.numel(), dim = data.features.shape()[1];
  WEFT_CHECK(begin >= 0 && count >= 0 && begin + count <= n, "batch [{}, {}) is outside a dataset of {} rows", begin,
             begin + count, n);
  ClassificationData b{Tensor(f32, {count, dim}), Tensor(i64, {count})};
  std::memcpy(b.features.raw(), data.features.data<float>() + begin * dim,
              static_cast<size_t>(count * dim) * sizeof(float));
  std::memcpy(b.labels.raw(), data.labels.data<int64_t>() + begin, static_cast<size_t>(count) * sizeof(int64_t));
  return b;
}

}  // namespace weft::data
