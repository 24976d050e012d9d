// Image folders in the ImageNet / torchvision ImageFolder layout — ROOT/CLASS/IMAGE.jpg — with
// JPEG and PNG decoding and torchvision's ImageNet transforms: for training a random resized crop
// and a horizontal flip, for evaluation a resize of the shorter side and a centre crop. Images
// are decoded when read and never held, so a folder larger than memory costs none.
//
//     ImageFolder train = loadImageFolder("imagenet/train", {.size = 224, .training = true});
//     Batcher batches(train.examples, {.batchSize = 256, .augment = imageFolderAugment({.size = 224})});
//     ImageFolder val = loadImageFolder("imagenet/val", {.size = 224});   // centre crops
//     // train.classes: the class folders' names; label i is train.classes[i]
#pragma once

#include "data/Dataset.h"
#include "data/Images.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace weft::data {

/// ImageNet's training-set statistics, which torchvision's ImageNet models normalise with.
inline constexpr ChannelStats kImageNetStats{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};

/// Limits checked before a decoder allocates: bytes of a file, pixels of a side and of an image.
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 27;
inline constexpr int64_t kMaxImageSide = int64_t{1} << 14;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

/// Whether this weft was built with libjpeg and libpng (CMake option WEFT_IMAGE_FILES).
bool imageFilesSupported();

/// Decodes a JPEG or PNG file (told apart by its first bytes, not its name) into f32 (height,
/// width, 3): 8-bit RGB values 0..255, rows top to bottom. Grey, palette and 16-bit PNGs become
/// RGB (16-bit values scaled to 8 bits) and alpha is dropped, as PIL's convert("RGB") does; so
/// are CMYK JPEGs converted (Adobe's inverted inks as such). Throws naming the file when it is
/// neither format, is truncated or corrupt (a JPEG whose data ends early included), or has a
/// side over kMaxImageSide or more than kMaxImagePixels pixels (with the size).
Tensor decodeImage(const std::string& file);

/// A rectangle of an image, in pixels.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

/// torchvision's RandomResizedCrop box for a height x width image, drawn from `key` alone: up to
/// 10 tries of an area uniform in [0.08, 1] of the image's and an aspect ratio log-uniform in
/// [3/4, 4/3] that fits, placed uniformly; else the centre crop of the largest box with an aspect
/// ratio in that range.
CropBox randomResizedCropBox(int64_t height, int64_t width, uint64_t key);

/// Box `box` of `pixels` (f32 (height, width, 3), as decodeImage gives) resized to size x size
/// (bilinear, widened to average over the source when shrinking, as PIL's resize), mirrored left
/// to right when `flip`, and normalised with `stats`: f32 (3, size, size).
Tensor cropResize(const Tensor& pixels, const CropBox& box, int64_t size, bool flip, const ChannelStats& stats);

/// The evaluation transform: the shorter side resized to round(size * 256 / 224) (the longer in
/// proportion), then the centre size x size, normalised: f32 (3, size, size).
Tensor centreCrop(const Tensor& pixels, int64_t size, const ChannelStats& stats);

struct ImageFolderOptions {
  /// Side of the square images the examples hold.
  int64_t size = 224;
  ChannelStats stats = kImageNetStats;
  /// false: each example is the evaluation transform of its image, {"images": f32 (3, size,
  /// size), "labels": i64 scalar}. true: each example is the decoded image, {"pixels": f32 (H, W,
  /// 3), "labels"}, for imageFolderAugment to crop, flip and normalise as its batch is made.
  bool training = false;
};

/// A folder's examples, and its classes: label i is the images of folder classes[i].
struct ImageFolder {
  Dataset examples;
  std::vector<std::string> classes;
};

/// Reads the layout of `root`: the classes are its subdirectories, sorted by name; the examples
/// are the .jpg, .jpeg and .png files (any case) directly in each, in class order, then by name;
/// other files are ignored. Images are decoded when an example is read (a generated dataset whose
/// identity hashes the file paths relative to `root`, the labels and the options). Throws naming
/// the folder when `root` is missing or not a directory, holds no class folder, or a class folder
/// holds no image; and, before looking, when this weft was built without JPEG/PNG support.
ImageFolder loadImageFolder(const std::string& root, const ImageFolderOptions& options = {});

/// The training transform, for BatchOptions::augment over loadImageFolder's training examples:
/// {"pixels", "labels"} becomes {"images": f32 (3, size, size), "labels"}, a random resized crop
/// (randomResizedCropBox) flipped with probability 1/2, both drawn from the key.
std::function<Example(Example, uint64_t)> imageFolderAugment(const ImageFolderOptions& options);

}  // namespace weft::data
