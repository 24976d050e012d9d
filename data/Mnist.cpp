// The MNIST IDX loader (see the header).
#include "data/Mnist.h"

#include "core/Error.h"
#include "core/InputFile.h"

#include <array>
#include <filesystem>
#include <vector>

namespace weft::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803, kLabelsMagic = 0x00000801;

/// The header's next big-endian u32.
uint32_t readU32(InputFile& in) {
  std::array<uint8_t, 4> b{};
  const uint64_t at = in.offset();
  WEFT_CHECK(in.read(b) == b.size(), "MNIST file '{}': the header ends at byte offset {}", in.name(), at);
  return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
}

void checkMagic(InputFile& in, uint32_t expected, const char* what) {
  const uint32_t magic = readU32(in);
  WEFT_CHECK(magic == expected, "MNIST file '{}': magic number 0x{:08x}, expected 0x{:08x} for {}", in.name(), magic,
             expected, what);
}

/// Reads exactly out.size() bytes, naming the offset where the file ends early.
void readExactly(InputFile& in, std::span<uint8_t> out, const char* what, uint32_t index) {
  const uint64_t at = in.offset();
  const size_t got = in.read(out);
  WEFT_CHECK(got == out.size(), "MNIST file '{}': {} {} at byte offset {} ends after {} of {} bytes", in.name(), what,
             index, at, got, out.size());
}

}  // namespace

Dataset loadMnist(const std::string& imagesFile, const std::string& labelsFile) {
  InputFile images(imagesFile, "MNIST image file", kMaxMnistImageFileBytes);
  InputFile labels(labelsFile, "MNIST label file", 8 + kMaxMnistImages);
  checkMagic(images, kImagesMagic, "images");
  checkMagic(labels, kLabelsMagic, "labels");
  const uint32_t count = readU32(images), rows = readU32(images), columns = readU32(images);
  const uint32_t labelCount = readU32(labels);
  WEFT_CHECK(count <= kMaxMnistImages, "MNIST file '{}': {} images, more than {}", images.name(), count,
             kMaxMnistImages);
  WEFT_CHECK(rows >= 1 && rows <= kMaxMnistSide && columns >= 1 && columns <= kMaxMnistSide,
             "MNIST file '{}': images of {} x {} pixels; each side must be in 1..{}", images.name(), rows, columns,
             kMaxMnistSide);
  WEFT_CHECK(labelCount == count, "MNIST files '{}' and '{}' disagree: {} images, {} labels", images.name(),
             labels.name(), count, labelCount);
  const uint64_t pixels = uint64_t{rows} * columns;
  WEFT_CHECK(images.size() == 16 + count * pixels, "MNIST file '{}' holds {} bytes; its header says {} images of {} "
             "pixels, {} bytes", images.name(), images.size(), count, pixels, 16 + count * pixels);
  WEFT_CHECK(labels.size() == 8 + uint64_t{count},
             "MNIST file '{}' holds {} bytes; its header says {} labels, {} bytes", labels.name(), labels.size(), count,
             8 + uint64_t{count});
  std::vector<Example> examples;
  examples.reserve(count);
  std::vector<uint8_t> image(pixels);
  std::array<uint8_t, 1> label{};
  for (uint32_t i = 0; i < count; ++i) {
    readExactly(images, image, "image", i);
    readExactly(labels, label, "label", i);
    WEFT_CHECK(label[0] <= 9, "MNIST file '{}': label {} (byte offset {}) is {}, expected 0..9", labels.name(), i,
               8 + uint64_t{i}, static_cast<int>(label[0]));
    Tensor features(f32, {static_cast<int64_t>(pixels)});
    float* out = features.data<float>();
    for (size_t k = 0; k < image.size(); ++k) out[k] = static_cast<float>(image[k]) / 255.0f;
    examples.push_back({{"features", std::move(features)}, {"labels", Tensor::scalar(i64, label[0])}});
  }
  return Dataset(std::move(examples));
}

Dataset loadMnistSplit(const std::string& directory, bool train) {
  const std::filesystem::path dir(directory);
  const std::string prefix = train ? "train" : "t10k";
  return loadMnist((dir / (prefix + "-images-idx3-ubyte")).string(), (dir / (prefix + "-labels-idx1-ubyte")).string());
}

}  // namespace weft::data
