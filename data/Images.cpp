// The synthetic image task and the CIFAR-10 binary loader.
#include "data/Images.h"

#include "core/Error.h"
#include "core/Hash.h"
#include "core/InputFile.h"
#include "core/Random.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace weft::data {
namespace {

constexpr double kPi = 3.141592653589793;

using Colour = std::array<double, 3>;

Colour randomColour(Draws& d) { return {d.uniform(0, 1), d.uniform(0, 1), d.uniform(0, 1)}; }

/// Writes one image (channel planes of size*size, intensities in [0, 1]) into `planes`.
void drawImage(const SyntheticImagesSpec& spec, int64_t label, Draws& d, std::vector<double>& planes) {
  const int64_t size = spec.size, area = size * size;
  const double s = static_cast<double>(size);
  // Background: a random colour with a random linear gradient per channel.
  const Colour base = {d.uniform(0.25, 0.75), d.uniform(0.25, 0.75), d.uniform(0.25, 0.75)};
  Colour gx, gy;
  for (int c = 0; c < 3; ++c) {
    gx[c] = d.uniform(-0.25, 0.25);
    gy[c] = d.uniform(-0.25, 0.25);
  }
  for (int c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        planes[c * area + y * size + x] = base[c] + gx[c] * (x / s - 0.5) + gy[c] * (y / s - 0.5);
      }
    }
  }
  // The object: a disc filled with a grating whose orientation and period are the class.
  const double theta = (static_cast<double>(label % 5) * 36 + d.uniform(-1, 1) * spec.orientationJitter) * kPi / 180;
  const double period = (label < 5 ? 4.0 : 8.0) * d.uniform(0.9, 1.1) * s / 32;
  const double phase = d.uniform(0, 2 * kPi);
  const double radius = d.uniform(0.22, 0.38) * s;
  const double cx = d.uniform(radius * 0.6, s - radius * 0.6), cy = d.uniform(radius * 0.6, s - radius * 0.6);
  const Colour light = randomColour(d);
  Colour dark;
  for (int c = 0; c < 3; ++c) dark[c] = std::clamp(1 - light[c] + d.uniform(-0.15, 0.15), 0.0, 1.0);
  const double kx = 2 * kPi * std::cos(theta) / period, ky = 2 * kPi * std::sin(theta) / period;
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      const double dx = static_cast<double>(x) - cx, dy = static_cast<double>(y) - cy;
      // A one-pixel soft edge, so the disc's outline is not a sharp class-free cue.
      const double inside = std::clamp(radius - std::sqrt(dx * dx + dy * dy), 0.0, 1.0);
      if (inside <= 0) continue;
      const double stripe = 0.5 + 0.5 * std::sin(kx * static_cast<double>(x) + ky * static_cast<double>(y) + phase);
      for (int c = 0; c < 3; ++c) {
        double& p = planes[c * area + y * size + x];
        p = (1 - inside) * p + inside * (stripe * light[c] + (1 - stripe) * dark[c]);
      }
    }
  }
  // Distractors: solid blobs that may cover part of the object.
  for (int64_t k = 0; k < spec.distractors; ++k) {
    const double r = d.uniform(0.06, 0.14) * s;
    const double bx = d.uniform(0, s), by = d.uniform(0, s);
    const Colour colour = randomColour(d);
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        const double dx = static_cast<double>(x) - bx, dy = static_cast<double>(y) - by;
        if (dx * dx + dy * dy > r * r) continue;
        for (int c = 0; c < 3; ++c) planes[c * area + y * size + x] = colour[c];
      }
    }
  }
  for (double& p : planes) p += spec.noise * d.normal();
}

}  // namespace

Dataset syntheticImages(const SyntheticImagesSpec& spec, int64_t n, uint64_t sampleSeed) {
  WEFT_CHECK(spec.size >= 8 && n >= 0 && spec.distractors >= 0 && spec.noise >= 0,
             "syntheticImages: invalid spec (size {}, distractors {}, noise {}, n {})", spec.size, spec.distractors,
             spec.noise, n);
  const uint64_t key = streamKey(sampleSeed, "synthetic-images");
  Generator g;
  g.size = static_cast<size_t>(n);
  g.make = [spec, key](size_t i) {
    const auto label = static_cast<int64_t>(i) % kSyntheticClasses;
    Draws draws(mix64(key ^ mix64(static_cast<uint64_t>(i))));
    std::vector<double> planes(static_cast<size_t>(3 * spec.size * spec.size));
    drawImage(spec, label, draws, planes);
    Tensor image(f32, {3, spec.size, spec.size});
    float* out = image.data<float>();
    // Intensities are about 0.5 +- 0.25; centre and scale them to about unit variance.
    for (size_t k = 0; k < planes.size(); ++k) out[k] = static_cast<float>((planes[k] - 0.5) / 0.25);
    return Example{{"images", std::move(image)}, {"labels", Tensor::scalar(i64, static_cast<double>(label))}};
  };
  const uint64_t sizes[] = {static_cast<uint64_t>(spec.size), static_cast<uint64_t>(spec.distractors), key,
                            static_cast<uint64_t>(n)};
  const double draws[] = {spec.noise, spec.orientationJitter};
  g.identity = xxh64(draws, sizeof draws, xxh64(sizes, sizeof sizes, 0x494d414745));  // "IMAGE"
  return Dataset::generated(std::move(g));
}

namespace {

/// A CIFAR binary format: its name in messages, the label bytes before each image, which of them
/// is the label, and the classes.
struct CifarLayout {
  const char* name;
  size_t labelBytes;
  size_t labelIndex;
  int classes;
};

Dataset loadCifarRecords(const std::vector<std::string>& files, const CifarLayout& layout, const ChannelStats& stats) {
  constexpr size_t kPixels = 3 * 32 * 32;
  const size_t recordBytes = layout.labelBytes + kPixels;
  std::vector<Example> examples;
  std::vector<uint8_t> buffer(recordBytes);
  for (const std::string& file : files) {
    InputFile in(file, std::string(layout.name) + " file", kMaxCifar10Records * recordBytes);
    const std::string& name = in.name();
    const uint64_t size = in.size();
    WEFT_CHECK(size % recordBytes == 0,
               "{} file '{}': truncated record {} at byte offset {} ({} of {} bytes; file size {})", layout.name, name,
               size / recordBytes, size / recordBytes * recordBytes, size % recordBytes, recordBytes, size);
    WEFT_CHECK(size > 0, "{} file '{}' is empty", layout.name, name);
    // Record by record, never more than the size checked at open, however the file changes.
    for (size_t r = 0; r < size / recordBytes; ++r) {
      const size_t got = in.read(buffer);
      WEFT_CHECK(got == recordBytes, "{} file '{}': record {} at byte offset {} ends after {} of {} bytes", layout.name,
                 name, r, r * recordBytes, got, recordBytes);
      const unsigned char* record = buffer.data();
      const int label = record[layout.labelIndex];
      WEFT_CHECK(label < layout.classes, "{} file '{}': record {} (byte offset {}) has label {}, expected 0..{}",
                 layout.name, name, r, r * recordBytes, label, layout.classes - 1);
      Tensor image(f32, {3, 32, 32});
      float* out = image.data<float>();
      for (size_t k = 0; k < kPixels; ++k) {
        const size_t c = k / 1024;
        out[k] = (static_cast<float>(record[layout.labelBytes + k]) / 255.0f - stats.mean[c]) / stats.std[c];
      }
      examples.push_back({{"images", std::move(image)}, {"labels", Tensor::scalar(i64, label)}});
    }
  }
  return Dataset(std::move(examples));
}

}  // namespace

Dataset loadCifar10(const std::vector<std::string>& files, const ChannelStats& stats) {
  return loadCifarRecords(files, {"CIFAR-10", 1, 0, 10}, stats);
}

Dataset loadCifar10Split(const std::string& directory, bool train, const ChannelStats& stats) {
  const std::filesystem::path dir(directory);
  std::vector<std::string> files;
  if (train) {
    for (int k = 1; k <= 5; ++k) files.push_back((dir / ("data_batch_" + std::to_string(k) + ".bin")).string());
  } else {
    files.push_back((dir / "test_batch.bin").string());
  }
  return loadCifar10(files, stats);
}

Dataset loadCifar100(const std::vector<std::string>& files, Cifar100Labels labels, const ChannelStats& stats) {
  const bool fine = labels == Cifar100Labels::Fine;
  return loadCifarRecords(files, {"CIFAR-100", 2, fine ? size_t{1} : size_t{0}, fine ? 100 : 20}, stats);
}

Dataset loadCifar100Split(const std::string& directory, bool train, Cifar100Labels labels, const ChannelStats& stats) {
  return loadCifar100({(std::filesystem::path(directory) / (train ? "train.bin" : "test.bin")).string()}, labels,
                      stats);
}

}  // namespace weft::data
