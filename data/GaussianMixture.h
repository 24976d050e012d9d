// A seeded classification task: each class is a union of Gaussian clusters, so a linear model
// cannot separate it but a small MLP can.
#pragma once

#include "core/Tensor.h"

#include <cstdint>

namespace weft::data {

struct GaussianMixtureSpec {
  int64_t dim = 32;
  int64_t classes = 10;
  int64_t clustersPerClass = 3;
  double noise = 1.2;      // per-dimension standard deviation around a cluster centre
  uint64_t taskSeed = 1;   // fixes the cluster centres: the task
};

struct ClassificationData {
  Tensor features;  // (n, dim) f32
  Tensor labels;    // (n) i64
};

/// n samples of the task; different sampleSeeds give disjoint draws of the same task.
ClassificationData gaussianMixture(const GaussianMixtureSpec& spec, int64_t n, uint64_t sampleSeed);

/// Rows [begin, begin + count) of a dataset, as a batch.
ClassificationData batchOf(const ClassificationData& data, int64_t begin, int64_t count);

}  // namespace weft::data
