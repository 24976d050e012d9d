// Image folders: the layout scan, torchvision's ImageNet transforms over decoded images, and the
// training augmentation (see the header).
#include "data/ImageFolder.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/Hash.h"
#include "core/Random.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <system_error>

namespace weft::data {
namespace {

namespace fs = std::filesystem;

/// Where the pixels along one axis of a resized image come from: output k is the weighted sum
/// of source pixels first[k] .. first[k] + count[k] - 1, with weights[k * taps + t].
struct AxisFilter {
  int64_t taps = 0;
  std::vector<int64_t> first, count;
  std::vector<float> weights;
};

/// PIL's bilinear resampling along one axis: output k is centred at source coordinate offset +
/// (k + 0.5) * scale; when shrinking, the triangle filter widens by the scale so that every
/// source pixel counts (PIL's antialiasing); the sources are clipped to pixels [lo, hi).
AxisFilter bilinearAxis(double offset, double scale, int64_t lo, int64_t hi, int64_t outputs) {
  const double support = std::max(scale, 1.0);
  AxisFilter f;
  f.taps = static_cast<int64_t>(std::ceil(2 * support)) + 1;
  f.first.resize(static_cast<size_t>(outputs));
  f.count.resize(static_cast<size_t>(outputs));
  f.weights.assign(static_cast<size_t>(outputs * f.taps), 0.0f);
  for (int64_t k = 0; k < outputs; ++k) {
    const double centre = offset + (static_cast<double>(k) + 0.5) * scale;
    const int64_t begin = std::max(lo, static_cast<int64_t>(std::floor(centre - support + 0.5)));
    const int64_t end = std::min({hi, static_cast<int64_t>(std::floor(centre + support + 0.5)), begin + f.taps});
    float* w = f.weights.data() + k * f.taps;
    double total = 0;
    for (int64_t x = begin; x < end; ++x) {
      const double weight = std::max(0.0, 1.0 - std::abs((static_cast<double>(x) + 0.5 - centre) / support));
      w[x - begin] = static_cast<float>(weight);
      total += weight;
    }
    WEFT_CHECK(total > 0, "bilinear resampling: output {} centred at {} has no source pixel in [{}, {})", k, centre, lo,
               hi);
    for (int64_t t = 0; t < end - begin; ++t) w[t] = static_cast<float>(w[t] / total);
    f.first[static_cast<size_t>(k)] = begin;
    f.count[static_cast<size_t>(k)] = end - begin;
  }
  return f;
}

/// pixels (H, W, 3) resampled by `rows` and `columns` (mirrored when `flip`) and normalised:
/// f32 (3, rows, columns). Columns first, over only the source rows that some output row uses.
Tensor resample(const Tensor& pixels, const AxisFilter& rows, const AxisFilter& columns, bool flip,
                const ChannelStats& stats) {
  const int64_t width = pixels.shape()[1];
  const auto outH = static_cast<int64_t>(rows.first.size()), outW = static_cast<int64_t>(columns.first.size());
  const int64_t rowLo = rows.first.front(), rowHi = rows.first.back() + rows.count.back();
  // across: (rowHi - rowLo, outW, 3)
  std::vector<float> across(static_cast<size_t>((rowHi - rowLo) * outW * 3));
  const float* src = pixels.data<float>();
  for (int64_t r = rowLo; r < rowHi; ++r) {
    const float* line = src + r * width * 3;
    float* dst = across.data() + (r - rowLo) * outW * 3;
    for (int64_t k = 0; k < outW; ++k) {
      const float* w = columns.weights.data() + k * columns.taps;
      const float* p = line + columns.first[static_cast<size_t>(k)] * 3;
      float red = 0, green = 0, blue = 0;
      for (int64_t t = 0; t < columns.count[static_cast<size_t>(k)]; ++t) {
        red += w[t] * p[3 * t];
        green += w[t] * p[3 * t + 1];
        blue += w[t] * p[3 * t + 2];
      }
      float* o = dst + (flip ? outW - 1 - k : k) * 3;
      o[0] = red;
      o[1] = green;
      o[2] = blue;
    }
  }
  Tensor out(f32, {3, outH, outW});
  float* planes = out.data<float>();
  for (int64_t y = 0; y < outH; ++y) {
    const float* w = rows.weights.data() + y * rows.taps;
    const int64_t first = rows.first[static_cast<size_t>(y)] - rowLo;
    for (int64_t c = 0; c < 3; ++c) {
      float* o = planes + (c * outH + y) * outW;
      const float scale = 1.0f / (255.0f * stats.std[static_cast<size_t>(c)]);
      const float shift = stats.mean[static_cast<size_t>(c)] / stats.std[static_cast<size_t>(c)];
      for (int64_t x = 0; x < outW; ++x) {
        float v = 0;
        for (int64_t t = 0; t < rows.count[static_cast<size_t>(y)]; ++t)
          v += w[t] * across[((first + t) * outW + x) * 3 + c];
        o[x] = v * scale - shift;
      }
    }
  }
  return out;
}

void checkPixels(const Tensor& pixels, const char* what) {
  WEFT_CHECK(pixels.dtype() == f32 && pixels.rank() == 3 && pixels.shape()[2] == 3 && pixels.numel() > 0,
             "{}: the pixels must be f32 (height, width, 3), not {}{}", what, dtypeName(pixels.dtype()),
             pixels.shape().str());
}

/// Python's round(), which torchvision's sizes go through: halves to even.
int64_t roundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

bool isImageName(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

/// The names of the entries of `dir` that `keep` accepts, sorted; throws naming the folder when
/// it cannot be listed.
std::vector<std::string> entries(const fs::path& dir, const std::function<bool(const fs::directory_entry&)>& keep) {
  std::error_code error;
  fs::directory_iterator it(dir, error);
  std::vector<std::string> names;
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    if (keep(*it)) names.push_back(it->path().filename().string());
  }
  WEFT_CHECK(!error, "image folder '{}' cannot be listed: {}", escapeBytes(dir.string(), 4096), error.message());
  std::sort(names.begin(), names.end());
  return names;
}

/// A folder's classes and, per example, its path relative to the root and its label.
struct Layout {
  std::vector<std::string> classes, files;
  std::vector<int64_t> labels;
};

Layout scan(const fs::path& root) {
  const std::string name = escapeBytes(root.string(), 4096);
  std::error_code error;
  WEFT_CHECK(fs::exists(root, error), "image folder '{}' does not exist", name);
  WEFT_CHECK(fs::is_directory(root, error), "image folder '{}' is not a directory", name);
  Layout layout;
  // An entry that cannot be examined (a dangling link, say) is neither a class nor an image.
  std::error_code ignored;
  layout.classes = entries(root, [&](const fs::directory_entry& e) { return e.is_directory(ignored); });
  WEFT_CHECK(!layout.classes.empty(), "image folder '{}' holds no class folder (the layout is ROOT/CLASS/IMAGE.jpg)",
             name);
  for (size_t label = 0; label < layout.classes.size(); ++label) {
    const std::string& cls = layout.classes[label];
    const std::vector<std::string> images = entries(root / cls, [&](const fs::directory_entry& e) {
      return e.is_regular_file(ignored) && isImageName(e.path().filename().string());
    });
    WEFT_CHECK(!images.empty(), "image folder '{}': class folder '{}' holds no .jpg, .jpeg or .png file", name,
               escapeBytes((root / cls).string(), 4096));
    for (const std::string& image : images) {
      layout.files.push_back((fs::path(cls) / image).string());
      layout.labels.push_back(static_cast<int64_t>(label));
    }
  }
  return layout;
}

/// The folder's examples stand for the paths and labels in order, and the transform's options.
uint64_t identityOf(const Layout& layout, const ImageFolderOptions& options) {
  uint64_t h = 0x494d475f464f4c44;  // "IMG_FOLD"
  for (size_t i = 0; i < layout.files.size(); ++i) {
    const int64_t head[2] = {layout.labels[i], static_cast<int64_t>(layout.files[i].size())};
    h = xxh64(layout.files[i].data(), layout.files[i].size(), xxh64(head, sizeof head, h));
  }
  const int64_t shape[2] = {options.size, options.training ? 1 : 0};
  h = xxh64(shape, sizeof shape, h);
  return xxh64(&options.stats, sizeof options.stats, h);
}

/// The stream of an example's flip, apart from its crop's.
constexpr uint64_t kFlipStream = 0x464c4950;  // "FLIP"

}  // namespace

CropBox randomResizedCropBox(int64_t height, int64_t width, uint64_t key) {
  WEFT_CHECK(height > 0 && width > 0, "randomResizedCropBox: an image of {} x {} pixels", width, height);
  const double area = static_cast<double>(height * width);
  Draws d(key);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * d.uniform(0.08, 1.0);
    const double ratio = std::exp(d.uniform(std::log(3.0 / 4), std::log(4.0 / 3)));
    const int64_t w = roundHalfEven(std::sqrt(target * ratio)), h = roundHalfEven(std::sqrt(target / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) return {d.below(height - h + 1), d.below(width - w + 1), h, w};
  }
  // The whole image, or its centre at the nearest aspect ratio in range.
  int64_t w = width, h = height;
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  if (ratio < 3.0 / 4) h = roundHalfEven(static_cast<double>(w) / (3.0 / 4));
  if (ratio > 4.0 / 3) w = roundHalfEven(static_cast<double>(h) * (4.0 / 3));
  return {(height - h) / 2, (width - w) / 2, h, w};
}

Tensor cropResize(const Tensor& pixels, const CropBox& box, int64_t size, bool flip, const ChannelStats& stats) {
  checkPixels(pixels, "cropResize");
  const int64_t height = pixels.shape()[0], width = pixels.shape()[1];
  WEFT_CHECK(size > 0 && box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0 &&
                 box.top + box.height <= height && box.left + box.width <= width,
             "cropResize: box (top {}, left {}, {} x {}) of a {} x {} image to {} x {}", box.top, box.left, box.width,
             box.height, width, height, size, size);
  const double sy = static_cast<double>(box.height) / static_cast<double>(size);
  const double sx = static_cast<double>(box.width) / static_cast<double>(size);
  return resample(pixels, bilinearAxis(static_cast<double>(box.top), sy, box.top, box.top + box.height, size),
                  bilinearAxis(static_cast<double>(box.left), sx, box.left, box.left + box.width, size), flip, stats);
}

Tensor centreCrop(const Tensor& pixels, int64_t size, const ChannelStats& stats) {
  checkPixels(pixels, "centreCrop");
  WEFT_CHECK(size > 0, "centreCrop: size {} must be positive", size);
  const int64_t height = pixels.shape()[0], width = pixels.shape()[1];
  // torchvision's Resize(s): the shorter side to s, the longer truncated in proportion.
  const int64_t shorter = roundHalfEven(static_cast<double>(size) * 256 / 224);
  const int64_t resizedH = height <= width ? shorter : shorter * height / width;
  const int64_t resizedW = height <= width ? shorter * width / height : shorter;
  // torchvision's CenterCrop: the offset rounded as Python rounds.
  const int64_t top = roundHalfEven(static_cast<double>(resizedH - size) / 2);
  const int64_t left = roundHalfEven(static_cast<double>(resizedW - size) / 2);
  const double sy = static_cast<double>(height) / static_cast<double>(resizedH);
  const double sx = static_cast<double>(width) / static_cast<double>(resizedW);
  return resample(pixels, bilinearAxis(static_cast<double>(top) * sy, sy, 0, height, size),
                  bilinearAxis(static_cast<double>(left) * sx, sx, 0, width, size), false, stats);
}

ImageFolder loadImageFolder(const std::string& root, const ImageFolderOptions& options) {
  WEFT_CHECK(imageFilesSupported(),
             "cannot read image folder '{}': this weft was built without JPEG/PNG support (libjpeg62-turbo-dev, "
             "libpng-dev)",
             escapeBytes(root, 4096));
  WEFT_CHECK(options.size >= 1 && options.size <= kMaxImageSide, "image folder '{}': image size {} must be in 1..{}",
             escapeBytes(root, 4096), options.size, kMaxImageSide);
  auto layout = std::make_shared<const Layout>(scan(root));
  Generator g;
  g.size = layout->files.size();
  g.identity = identityOf(*layout, options);
  g.make = [layout, root = fs::path(root), options](size_t i) {
    const Tensor pixels = decodeImage((root / layout->files[i]).string());
    const Tensor label = Tensor::scalar(i64, static_cast<double>(layout->labels[i]));
    if (options.training) return Example{{"pixels", pixels}, {"labels", label}};
    return Example{{"images", centreCrop(pixels, options.size, options.stats)}, {"labels", label}};
  };
  return {Dataset::generated(std::move(g)), layout->classes};
}

std::function<Example(Example, uint64_t)> imageFolderAugment(const ImageFolderOptions& options) {
  WEFT_CHECK(options.size >= 1 && options.size <= kMaxImageSide, "imageFolderAugment: image size {} must be in 1..{}",
             options.size, kMaxImageSide);
  return [options](Example example, uint64_t key) {
    const auto pixels = example.find("pixels");
    WEFT_CHECK(pixels != example.end(),
               "imageFolderAugment: the example has no 'pixels' field (load the folder with training = true)");
    checkPixels(pixels->second, "imageFolderAugment");
    const Shape& shape = pixels->second.shape();
    const CropBox box = randomResizedCropBox(shape[0], shape[1], key);
    const bool flip = uniformAt(mix64(key ^ kFlipStream), 0) < 0.5;
    return Example{{"images", cropResize(pixels->second, box, options.size, flip, options.stats)},
                   {"labels", example.at("labels")}};
  };
}

}  // namespace weft::data
