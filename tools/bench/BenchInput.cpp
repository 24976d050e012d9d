// The input cost of one data-parallel worker of N, for the zoo's LM and ResNet training streams
// on their built-in data: holding the whole dataset and cutting the worker's part from each
// whole batch (how workers read before they read parts), against generating only the worker's
// part of each batch (Batcher::readPart over a generated dataset). One JSON line per
// (model, workers, way): setup seconds, bytes of data held, seconds to order an epoch (paid at
// its first batch), and input milliseconds per step after it.
//
// With --image-folder DIR (an ImageNet-style class folder, such as its train/) or --write-images
// N (N JPEGs of 500 x 375 written into a temporary folder first), it measures instead the ResNet
// training stream of an image folder (batch 32, random 224 crops and flips) made by 1, 2, 4 ...
// input threads (BatchOptions::threads, `weft train resnet --input-threads`), up to the
// machine's: input milliseconds per step and images per second.
//
//     bench_input [--steps 200] [--lm-sentences 400000] [--resnet-images 40000]
//     bench_input --write-images 640 [--steps 20]
#include "data/Dataset.h"
#include "data/ImageFolder.h"
#include "data/Images.h"
#include "data/SyntheticLanguage.h"
#ifdef WEFT_HAVE_IMAGE_FILES
#include "tests/ImageFiles.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

using namespace weft;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The bytes of a held dataset's tensors.
double heldBytes(const data::Dataset& d) {
  double bytes = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    for (const auto& [field, t] : d[i]) bytes += static_cast<double>(t.bytes());
  }
  return bytes;
}

struct Stream {
  std::string model;
  data::Dataset generated;
  data::BatchOptions options;
  std::vector<std::string> shared;  // fields every part keeps whole
};

struct Cost {
  double epochSeconds;   // the first batch, which orders the epoch
  double perStepMs;      // each batch after it
};

/// The cost of `steps` batches from `batcher`, each passed through `cut`.
template <class Cut>
Cost inputCost(data::Batcher& batcher, int64_t steps, Cut cut) {
  const double start = now();
  cut(batcher.next());
  const double ordered = now();
  for (int64_t s = 1; s < steps; ++s) cut(batcher.next());
  return {ordered - start, (now() - ordered) * 1e3 / static_cast<double>(steps - 1)};
}

void report(const std::string& model, int64_t workers, const char* way, double setup, double held, const Cost& cost) {
  std::printf(
      "{\"model\": \"%s\", \"workers\": %lld, \"way\": \"%s\", \"setup_s\": %.3f, \"held_mb\": %.1f, "
      "\"epoch_order_s\": %.3f, \"input_ms_per_step\": %.3f}\n",
      model.c_str(), static_cast<long long>(workers), way, setup, held / 1e6, cost.epochSeconds, cost.perStepMs);
  std::fflush(stdout);
}

void measure(const Stream& stream, int64_t steps) {
  // Before: every worker held the whole dataset and cut its part from each whole batch.
  const double start = now();
  const data::Dataset held = stream.generated.held();
  const double setup = now() - start, bytes = heldBytes(held);
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher whole(held, stream.options);
    const Cost cost = inputCost(whole, steps, [&](const data::Batch& b) {
      return workers > 1 ? data::sliceBatch(b, 0, workers, stream.shared) : b;
    });
    report(stream.model, workers, "whole batch, part cut", setup, bytes, cost);
  }
  // After: a worker generates only the examples of its part.
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher part(stream.generated, stream.options);
    part.readPart(0, workers);
    report(stream.model, workers, "part read", 0, 0, inputCost(part, steps, [](const data::Batch& b) { return b; }));
  }
}

const char* option(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return nullptr;
}

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  const char* value = option(argc, argv, name);
  return value != nullptr ? std::atoll(value) : fallback;
}

#ifdef WEFT_HAVE_IMAGE_FILES
/// `count` JPEGs of 500 x 375 (ImageNet's commonest size), quality 90, in 10 class folders of
/// `root`: smooth gradients with a pattern of their own, so that they compress as photos do.
void writeImages(const std::filesystem::path& root, int64_t count) {
  constexpr int kWidth = 500, kHeight = 375;
  for (int64_t i = 0; i < count; ++i) {
    const std::filesystem::path folder = root / ("class" + std::to_string(i % 10));
    std::filesystem::create_directories(folder);
    std::vector<uint8_t> samples;
    samples.reserve(kWidth * kHeight * 3);
    for (int y = 0; y < kHeight; ++y)
      for (int x = 0; x < kWidth; ++x)
        for (int c = 0; c < 3; ++c)
          samples.push_back(static_cast<uint8_t>((x * (c + 1) + y * (3 - c) + 37 * i + ((x * y) >> 7)) % 256));
    std::ofstream(folder / (std::to_string(i) + ".jpg"), std::ios::binary)
        << testing::jpegBytes(kWidth, kHeight, 3, samples, 90);
  }
}
#endif

/// The ResNet training stream of the image folder `root` made by 1, 2, 4 ... threads.
void measureImageFolder(const std::string& root, int64_t steps) {
  const data::ImageFolder folder = data::loadImageFolder(root, {.size = 224, .training = true});
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned threads = 1; threads <= cores; threads *= 2) {
    data::BatchOptions options;
    options.batchSize = 32;
    options.augment = data::imageFolderAugment({.size = 224});
    options.threads = static_cast<int>(threads);
    data::Batcher batches(folder.examples, options);
    const Cost cost = inputCost(batches, steps, [](const data::Batch& b) { return b; });
    std::printf("{\"stream\": \"image folder\", \"images\": %zu, \"input_threads\": %u, \"input_ms_per_step\": %.1f, "
                "\"images_per_s\": %.0f}\n",
                folder.examples.size(), threads, cost.perStepMs, 32e3 / cost.perStepMs);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = std::max<int64_t>(2, flag(argc, argv, "--steps", 200));
  if (const char* root = option(argc, argv, "--image-folder")) {
    measureImageFolder(root, steps);
    return 0;
  }
  if (const int64_t images = flag(argc, argv, "--write-images", 0); images > 0) {
#ifdef WEFT_HAVE_IMAGE_FILES
    const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                       ("bench_input_images_" + std::to_string(::getpid()));
    writeImages(root, images);
    measureImageFolder(root.string(), steps);
    std::filesystem::remove_all(root);
    return 0;
#else
    std::fprintf(stderr, "bench_input: this build reads no image files (no libjpeg)\n");
    return 2;
#endif
  }
  // The zoo's defaults (models/Lm.h, models/ResNet.h) and their batching.
  Stream lm{"lm", data::lmDataset(std::make_shared<const data::SyntheticLanguage>(data::LanguageSpec{}),
                                  static_cast<uint64_t>(flag(argc, argv, "--lm-sentences", 400000))),
            {}, {"targets_count"}};
  lm.options.batchSize = 64;
  lm.options.padded = {"tokens", "targets"};
  lm.options.counted = {"targets"};
  lm.options.bucketWindow = 32;
  Stream resnet{"resnet", data::syntheticImages({}, flag(argc, argv, "--resnet-images", 40000), 102), {}, {}};
  resnet.options.batchSize = 128;
  resnet.options.keepGenerated = true;
  for (const Stream& s : {lm, resnet}) measure(s, steps);
  return 0;
}
