// Residual networks with batch normalisation: the CIFAR layout (ResNet-20, -56, any depth 6n+2:
// a 3x3 stem, three stages of basic blocks at 1x, 2x, 4x the base width) and ResNet-50 (7x7
// stem, max pool, bottleneck blocks [3, 4, 6, 3] at 64..2048 channels), as a zoo model trained
// on the synthetic image task, on CIFAR-10 or CIFAR-100 binaries, or on an ImageNet-style
// directory of train/ and val/ image folders (data/ImageFolder.h: random resized crops and flips
// for training, centre crops for evaluation).
#pragma once

#include "data/Images.h"
#include "models/ZooModel.h"
#include "nn/Layers.h"

#include <memory>
#include <string>

namespace weft::models {

struct ResNetConfig {
  int64_t depth = 20;   // 6n+2 but 50 (CIFAR layout), or 50 (ImageNet layout)
  int64_t width = 0;    // channels of the first stage; 0: 16 (CIFAR layout) or 64 (ResNet-50)
  int64_t classes = 10;
  int64_t channels = 3; // input channels
  double bnMomentum = 0.9;
  uint64_t seed = 1;
  DType dtype = f32;
  Recompute recompute = Recompute::None;  // each stem unit and block a recompute segment of this mode
};

/// The built network: one set of layers applied twice, batch statistics for training and moving
/// statistics for evaluation.
struct ResNetNet {
  Output images;        // placeholder "images" (batch, channels, H, W) f32
  Output labels;        // placeholder "labels" (batch) i64
  Output loss;          // mean cross-entropy, training mode (batch statistics)
  Output evalLogits;    // (batch, classes), inference mode (moving statistics)
  Output evalLoss;      // mean cross-entropy, inference mode
  Output evalAccuracy;  // top-1, inference mode
};

/// Builds the network in `g`. Throws naming the depth when it is neither 6n+2 nor 50.
ResNetNet buildResNet(Graph& g, const ResNetConfig& config);

/// The "resnet" zoo model: momentum SGD with weight decay; top-1 accuracy on the held-out split.
class ResNetModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override;
  OptimizerSpec defaultOptimizer() const override;
  int64_t defaultSteps() const override { return 400; }
  void build(Graph& g, const CommonOptions& common) override;
  Output loss() const override { return net_.loss; }
  data::BatchSource& trainData() override;
  std::map<std::string, double> evaluate(Session& session, int64_t maxBatches) override;
  std::string targetMetric() const override { return "accuracy"; }
  bool higherIsBetter() const override { return true; }
  std::pair<std::string, double> itemsIn(const data::Batch& batch) const override;

  const ResNetNet& net() const { return net_; }

 private:
  // The training data of each source; each sets test_ and config_.classes.
  data::Dataset syntheticData(const CommonOptions& common, int64_t size);
  data::Dataset cifarData(const std::string& directory, int64_t size);
  /// DIRECTORY/train and DIRECTORY/val, whose class folders must agree; sets the augmentation.
  data::Dataset imageFolderData(const std::string& directory, int64_t size, data::BatchOptions& batching);

  ResNetConfig config_;
  int64_t batchSize_ = 128;
  int64_t imageSize_ = 0;  // 0: the data's (224 for an image folder, else 32)
  int64_t trainImages_ = 40000;  // synthetic task only
  int64_t testImages_ = 2000;
  int64_t evalBatch_ = 250;
  std::string cifar100Labels_ = "fine";
  ResNetNet net_;
  data::Dataset test_;
  std::unique_ptr<data::Batcher> train_;
};

std::unique_ptr<ZooModel> makeResNetModel();

}  // namespace weft::models
