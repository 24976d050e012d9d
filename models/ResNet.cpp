// ResNet layouts built from conv + batch-norm units, and the "resnet" zoo model.
#include "models/ResNet.h"

#include "core/Escape.h"
#include "data/ImageFolder.h"

#include <algorithm>
#include <filesystem>
#include <optional>

namespace weft::models {
namespace {

/// A bias-free convolution followed by batch normalisation (the bias would be cancelled by it).
struct ConvBn {
  ConvBn(Graph& g, const std::string& name, int64_t in, int64_t out, int64_t kernel, int64_t stride,
         const ResNetConfig& c)
      : conv(g, name, in, out, kernel, {{stride, stride}, {kernel / 2, kernel / 2}, {1, 1}}, false, c.dtype),
        bn(g, name + "_bn", out, c.bnMomentum, 1e-5, c.dtype) {}
  Output operator()(Output x, bool training) const { return bn(conv(x), training); }

  nn::Conv2d conv;
  nn::BatchNorm bn;
};

/// relu(main(x) + shortcut(x)), main being conv-bn units with relu between them; the shortcut is
/// the identity or, where the shape changes, a strided 1x1 projection.
struct Block {
  std::vector<ConvBn> main;
  std::optional<ConvBn> projection;

  Output operator()(Output x, bool training) const {
    Output h = x;
    for (size_t i = 0; i < main.size(); ++i) {
      h = main[i](h, training);
      if (i + 1 < main.size()) h = relu(h);
    }
    return relu(h + (projection ? (*projection)(x, training) : x));
  }
};

struct Network {
  std::vector<ConvBn> stem;
  bool stemPool = false;
  std::vector<Block> blocks;
  std::optional<nn::Linear> fc;

  /// Each stem unit and each block is a recompute segment of mode `recompute`.
  Output operator()(Output x, bool training, Recompute recompute) const {
    Graph& g = x.graph();
    for (const ConvBn& unit : stem) {
      auto segment = g.recompute(recompute);
      x = relu(unit(x, training));
    }
    if (stemPool) x = maxPool2d(x, {3, 3}, {2, 2}, {1, 1});
    for (const Block& block : blocks) {
      auto segment = g.recompute(recompute);
      x = block(x, training);
    }
    return (*fc)(globalAvgPool(x));
  }
};

std::string blockName(size_t stage, int64_t block) {
  return "stage" + std::to_string(stage + 1) + "/block" + std::to_string(block + 1);
}

/// 3x3 stem, then 3 stages of n basic blocks (two 3x3 units) at width, 2 width, 4 width; the
/// first block of stages 2 and 3 halves the resolution.
Network cifarLayout(Graph& g, const ResNetConfig& c) {
  const int64_t n = (c.depth - 2) / 6, width = c.width > 0 ? c.width : 16;
  Network net;
  net.stem.emplace_back(g, "stem", c.channels, width, 3, 1, c);
  int64_t in = width;
  for (size_t stage = 0; stage < 3; ++stage) {
    const int64_t out = width << stage;
    for (int64_t b = 0; b < n; ++b) {
      const std::string name = blockName(stage, b);
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      Block block;
      block.main.emplace_back(g, name + "/conv1", in, out, 3, stride, c);
      block.main.emplace_back(g, name + "/conv2", out, out, 3, 1, c);
      if (stride != 1 || in != out) block.projection.emplace(g, name + "/shortcut", in, out, 1, stride, c);
      net.blocks.push_back(std::move(block));
      in = out;
    }
  }
  net.fc.emplace(g, "fc", in, c.classes, true, c.dtype);
  return net;
}

/// ResNet-50 (v1.5: the stride sits on the 3x3 unit): 7x7/2 stem, 3x3/2 max pool, bottleneck
/// blocks [3, 4, 6, 3] of (1x1 mid, 3x3 mid, 1x1 4 mid), mid = width, 2 width, 4 width, 8 width.
Network imagenetLayout(Graph& g, const ResNetConfig& c) {
  const int64_t width = c.width > 0 ? c.width : 64;
  const std::vector<int64_t> counts{3, 4, 6, 3};
  Network net;
  net.stem.emplace_back(g, "stem", c.channels, width, 7, 2, c);
  net.stemPool = true;
  int64_t in = width;
  for (size_t stage = 0; stage < counts.size(); ++stage) {
    const int64_t mid = width << stage, out = 4 * mid;
    for (int64_t b = 0; b < counts[stage]; ++b) {
      const std::string name = blockName(stage, b);
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      Block block;
      block.main.emplace_back(g, name + "/conv1", in, mid, 1, 1, c);
      block.main.emplace_back(g, name + "/conv2", mid, mid, 3, stride, c);
      block.main.emplace_back(g, name + "/conv3", mid, out, 1, 1, c);
      if (stride != 1 || in != out) block.projection.emplace(g, name + "/shortcut", in, out, 1, stride, c);
      net.blocks.push_back(std::move(block));
      in = out;
    }
  }
  net.fc.emplace(g, "fc", in, c.classes, true, c.dtype);
  return net;
}

}  // namespace

ResNetNet buildResNet(Graph& g, const ResNetConfig& config) {
  // 50 = 6 * 8 + 2 too, but means ResNet-50.
  const bool cifar = config.depth != 50 && config.depth >= 8 && (config.depth - 2) % 6 == 0;
  WEFT_CHECK(cifar || config.depth == 50, "ResNet: depth {} is neither 6n+2 (n >= 1: 8, 14, 20, ..., 56) nor 50",
             config.depth);
  WEFT_CHECK(config.width >= 0 && config.classes > 1 && config.channels > 0,
             "ResNet: invalid width {}, classes {} or channels {}", config.width, config.classes, config.channels);
  g.setSeed(config.seed);
  ResNetNet r;
  r.images = g.placeholder("images", f32, {-1, config.channels, -1, -1});
  r.labels = g.placeholder("labels", i64, {-1});
  const Network net = cifar ? cifarLayout(g, config) : imagenetLayout(g, config);
  const Output x = config.dtype == f32 ? r.images : cast(r.images, config.dtype);
  {
    auto scope = g.scope("train");
    r.loss = nn::meanSparseCrossEntropy(net(x, true, config.recompute), r.labels);
  }
  auto scope = g.scope("eval");
  r.evalLogits = net(x, false, Recompute::None);
  r.evalLoss = nn::meanSparseCrossEntropy(r.evalLogits, r.labels);
  r.evalAccuracy = nn::accuracy(r.evalLogits, r.labels);
  return r;
}

std::vector<ModelOption> ResNetModel::options() {
  return {
      {"depth", "6n+2 (CIFAR layout: 20, 56, ...) or 50 (ImageNet layout)", &config_.depth},
      {"width", "channels of the first stage (0: 16, or 64 for depth 50)", &config_.width},
      {"image-size", "side of the images, in pixels (0: 224 for an image folder, else 32; CIFAR files: 32)",
       &imageSize_},
      {"train-images", "synthetic training images", &trainImages_},
      {"test-images", "synthetic held-out images", &testImages_},
      {"eval-batch", "batch size of evaluation", &evalBatch_},
      {"cifar100-labels", "with CIFAR-100 as --data: fine (100 classes) or coarse (20 superclasses)", &cifar100Labels_},
  };
}

OptimizerSpec ResNetModel::defaultOptimizer() const {
  OptimizerSpec spec;
  spec.name = "momentum";
  spec.lr = 0.05;
  spec.momentum = 0.9;
  spec.weightDecay = 5e-4;
  return spec;
}

void ResNetModel::build(Graph& g, const CommonOptions& common) {
  WEFT_CHECK(common.dtype == "f32" || common.dtype == "f64", "resnet: dtype '{}' is not f32 or f64", common.dtype);
  WEFT_CHECK(evalBatch_ > 0, "resnet: eval-batch {} must be positive", evalBatch_);
  config_.seed = common.seed;
  config_.dtype = common.dtype == "f64" ? f64 : f32;
  config_.recompute = common.recompute;
  if (common.batchSize > 0) batchSize_ = common.batchSize;
  // An ImageNet-style directory holds train/ and val/ class folders.
  const bool folder =
      !common.data.empty() && std::filesystem::is_directory(std::filesystem::path(common.data) / "train");
  const int64_t size = imageSize_ != 0 ? imageSize_ : folder ? 224 : 32;
  WEFT_CHECK(size >= 8, "resnet: image-size {} is below 8 pixels", size);
  data::BatchOptions batching;
  batching.batchSize = batchSize_;
  batching.seed = common.seed;
  batching.keepGenerated = true;  // an image costs more to draw than to keep
  batching.threads = common.inputThreads;
  data::Dataset train = common.data.empty() ? syntheticData(common, size)
                        : folder            ? imageFolderData(common.data, size, batching)
                                            : cifarData(common.data, size);
  WEFT_CHECK(train.size() >= static_cast<size_t>(batchSize_), "resnet: {} training images are fewer than a batch of {}",
             train.size(), batchSize_);
  net_ = buildResNet(g, config_);
  train_ = std::make_unique<data::Batcher>(std::move(train), batching);
}

data::Dataset ResNetModel::syntheticData(const CommonOptions& common, int64_t size) {
  data::SyntheticImagesSpec spec;
  spec.size = size;
  config_.classes = data::kSyntheticClasses;
  // Distinct sample seeds: the held-out images are other draws of the same task.
  test_ = data::syntheticImages(spec, testImages_, common.seed * 2 + 101).held();  // read at every evaluation
  return data::syntheticImages(spec, trainImages_, common.seed * 2 + 100);
}

data::Dataset ResNetModel::cifarData(const std::string& directory, int64_t size) {
  WEFT_CHECK(size == 32, "resnet: CIFAR images are 32 pixels wide, not the {} of --image-size", size);
  WEFT_CHECK(cifar100Labels_ == "fine" || cifar100Labels_ == "coarse",
             "resnet: --cifar100-labels is fine or coarse, not '{}'", cifar100Labels_);
  // CIFAR-100's directory holds train.bin and test.bin; CIFAR-10's data_batch_1..5.bin and test_batch.bin.
  if (std::filesystem::exists(std::filesystem::path(directory) / "train.bin")) {
    const auto labels = cifar100Labels_ == "fine" ? data::Cifar100Labels::Fine : data::Cifar100Labels::Coarse;
    config_.classes = labels == data::Cifar100Labels::Fine ? 100 : 20;
    data::Dataset train = data::loadCifar100Split(directory, true, labels);
    test_ = data::loadCifar100Split(directory, false, labels);
    return train;
  }
  config_.classes = 10;
  data::Dataset train = data::loadCifar10Split(directory, true);
  test_ = data::loadCifar10Split(directory, false);
  return train;
}

data::Dataset ResNetModel::imageFolderData(const std::string& directory, int64_t size, data::BatchOptions& batching) {
  const std::filesystem::path dir(directory);
  data::ImageFolderOptions options{.size = size, .training = true};
  const data::ImageFolder train = data::loadImageFolder((dir / "train").string(), options);
  const data::ImageFolder val = data::loadImageFolder((dir / "val").string(), {.size = size});
  if (val.classes != train.classes) {
    const auto [t, v] =
        std::mismatch(train.classes.begin(), train.classes.end(), val.classes.begin(), val.classes.end());
    WEFT_THROW("resnet: the class folders of '{}' ({} classes) and '{}' ({} classes) differ, first at {} against {}",
               escapeBytes((dir / "train").string(), 4096), train.classes.size(),
               escapeBytes((dir / "val").string(), 4096), val.classes.size(),
               t == train.classes.end() ? "no class" : "'" + escapeBytes(*t) + "'",
               v == val.classes.end() ? "no class" : "'" + escapeBytes(*v) + "'");
  }
  config_.classes = static_cast<int64_t>(train.classes.size());
  // Never held: an ImageNet validation set is decoded at every evaluation, since it does not fit
  // in memory, and a training image's decoded pixels are many times its file.
  test_ = val.examples;
  batching.augment = data::imageFolderAugment(options);
  batching.keepGenerated = false;
  return train.examples;
}

data::BatchSource& ResNetModel::trainData() {
  WEFT_CHECK(train_ != nullptr, "resnet: trainData() before build()");
  return *train_;
}

std::map<std::string, double> ResNetModel::evaluate(Session& session, int64_t maxBatches) {
  const auto total = static_cast<int64_t>(test_.size());
  int64_t seen = 0;
  double hits = 0, lossSum = 0;
  for (int64_t begin = 0; begin < total && (maxBatches <= 0 || begin / evalBatch_ < maxBatches); begin += evalBatch_) {
    const int64_t count = std::min(evalBatch_, total - begin);
    const data::Batch batch =
        data::collate(test_, static_cast<size_t>(begin), static_cast<size_t>(begin + count), {});
    const auto out = session.run({net_.evalAccuracy, net_.evalLoss},
                                 {{net_.images, batch.at("images")}, {net_.labels, batch.at("labels")}});
    hits += out[0].item() * static_cast<double>(count);
    lossSum += out[1].item() * static_cast<double>(count);
    seen += count;
  }
  WEFT_CHECK(seen > 0, "resnet: the held-out split is empty");
  return {{"accuracy", hits / static_cast<double>(seen)}, {"loss", lossSum / static_cast<double>(seen)}};
}

std::pair<std::string, double> ResNetModel::itemsIn(const data::Batch& batch) const {
  return {"images", static_cast<double>(batch.at("labels").shape()[0])};
}

std::unique_ptr<ZooModel> makeResNetModel() { return std::make_unique<ResNetModel>(); }

}  // namespace weft::models
