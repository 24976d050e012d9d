// Image classification data: a seeded generator of 32x32 colour images in 10 classes that need
// spatial features to tell apart, and loaders for the CIFAR-10 and CIFAR-100 binary files. All
// give examples {"images": f32 (3, H, W), "labels": i64 scalar}.
#pragma once

#include "data/Dataset.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::data {

/// The synthetic task. Each class is an orientation (5 values, 36 degrees apart) crossed with a
/// stripe period (fine or coarse) of a grating that fills a disc of random position, radius,
/// phase and colours, over a random colour-gradient background with distractor blobs and
/// pixel noise. Colour and position carry no class information, so a linear model on pixels
/// stays near chance while a convnet learns oriented filters.
struct SyntheticImagesSpec {
  int64_t size = 32;            // images are (3, size, size)
  int64_t distractors = 2;      // solid-colour blobs per image
  double noise = 0.1;           // pixel noise (standard deviation, in [0, 1] intensity units)
  double orientationJitter = 5; // degrees, uniform +-
};

/// The number of classes of the synthetic task.
inline constexpr int64_t kSyntheticClasses = 10;

/// n images of the task; example i has label i % 10 (balanced), and its pixels are a function of
/// (spec, sampleSeed, i) only. Different sampleSeeds give different draws of the same task.
/// Pixels are roughly zero-mean, unit-variance. Generated when read and never held
/// (Dataset::held() keeps them).
Dataset syntheticImages(const SyntheticImagesSpec& spec, int64_t n, uint64_t sampleSeed);

/// Per-channel normalisation: x = (pixel / 255 - mean) / std.
struct ChannelStats {
  std::array<float, 3> mean;
  std::array<float, 3> std;
};
/// The CIFAR-10 training set's statistics.
inline constexpr ChannelStats kCifar10Stats{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};

/// A CIFAR-10 record: 1 label byte and 3072 pixel bytes.
inline constexpr size_t kCifar10RecordBytes = 1 + 3 * 32 * 32;
/// The most records one file may hold (the whole data set, 60000 images, in one file; CIFAR-100
/// too).
inline constexpr uint64_t kMaxCifar10Records = 60000;

/// Loads CIFAR-10 binary batches (records of 1 label byte and 3072 pixel bytes: the R, G and B
/// planes, 32x32 each, row-major), in file order. Throws naming the file when it is missing or
/// not a regular file, when it holds more than kMaxCifar10Records records, when its size leaves a
/// truncated record (with that record's byte offset), or when a label is over 9 (with the
/// record's index).
Dataset loadCifar10(const std::vector<std::string>& files, const ChannelStats& stats = kCifar10Stats);

/// data_batch_1..5.bin (train) or test_batch.bin (held-out) from a CIFAR-10 binary directory.
Dataset loadCifar10Split(const std::string& directory, bool train, const ChannelStats& stats = kCifar10Stats);

/// The CIFAR-100 training set's statistics.
inline constexpr ChannelStats kCifar100Stats{{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
/// A CIFAR-100 record: a coarse label byte (0..19), a fine label byte (0..99), 3072 pixel bytes.
inline constexpr size_t kCifar100RecordBytes = 2 + 3 * 32 * 32;
/// Which of a CIFAR-100 record's labels the examples carry.
enum class Cifar100Labels { Fine, Coarse };

/// Loads CIFAR-100 binary files (train.bin, test.bin) like loadCifar10, with the fine (100
/// classes) or coarse (20 superclasses) label; a label out of its range is an error naming the
/// file and the record.
Dataset loadCifar100(const std::vector<std::string>& files, Cifar100Labels labels = Cifar100Labels::Fine,
                     const ChannelStats& stats = kCifar100Stats);

/// train.bin (train) or test.bin (held-out) from a CIFAR-100 binary directory.
Dataset loadCifar100Split(const std::string& directory, bool train, Cifar100Labels labels = Cifar100Labels::Fine,
                          const ChannelStats& stats = kCifar100Stats);

}  // namespace weft::data
