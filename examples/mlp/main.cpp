// README's "Writing a model", made whole: a two-layer classifier trained with Adam on points a
// fixed random teacher labels. Exits 1 unless the loss falls below 60% of its first value.
#include "core/Session.h"
#include "nn/Layers.h"
#include "optim/Optimizer.h"

#include <cstdio>
#include <random>
#include <vector>

using namespace weft;

namespace {

constexpr int64_t kFeatures = 784, kClasses = 10, kBatch = 64;

/// A batch of points uniform in [-1, 1) and the class a linear teacher scores highest for each.
struct TeacherData {
  std::mt19937_64 random{42};
  std::vector<float> teacher = draw(kFeatures * kClasses);

  std::vector<float> draw(int64_t n) {
    std::uniform_real_distribution<float> uniform(-1, 1);
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = uniform(random);
    return values;
  }
  std::pair<Tensor, Tensor> batch() {
    const std::vector<float> points = draw(kBatch * kFeatures);
    std::vector<int64_t> labels(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) {
      float best = -1e30f;
      for (int64_t c = 0; c < kClasses; ++c) {
        float score = 0;
        for (int64_t f = 0; f < kFeatures; ++f) score += points[i * kFeatures + f] * teacher[f * kClasses + c];
        if (score > best) best = score, labels[i] = c;
      }
    }
    return {Tensor::fromVector(points, {kBatch, kFeatures}), Tensor::fromVector(labels, {kBatch})};
  }
};

}  // namespace

int main() {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 784});          // -1: the batch size, known at run time
  Output y = g.placeholder("y", i64, {-1});
  nn::Linear fc1(g, "fc1", 784, 512), fc2(g, "fc2", 512, 10);
  Output logits = fc2(relu(fc1(x)));
  Output loss = mean(sparseSoftmaxCrossEntropy(logits, y));
  Node* step = optim::Adam(1e-3).minimize(loss);           // autodiff + update ops, links recorded

  Session s(g, {/*threads=*/2});
  TeacherData data;
  double first = 0, last = 0;
  for (int i = 0; i < 150; ++i) {
    auto [xBatch, yBatch] = data.batch();
    Tensor lossValue = s.run({loss}, {{x, xBatch}, {y, yBatch}}, {step})[0];
    (i == 0 ? first : last) = lossValue.item();
  }
  std::printf("loss %.4f at the first step, %.4f at the last\n", first, last);
  return last < 0.6 * first ? 0 : 1;
}
