// MNIST's IDX files: images (magic 0x00000803: count, rows, columns, then one byte a pixel, row
// by row) and labels (magic 0x00000801: count, then one byte a label), every integer a
// big-endian u32. Examples are {"features": f32 [rows * columns] (pixel / 255), "labels": i64
// scalar}, the MLP's fields. The files are the ones yann.lecun.com and its mirrors ship,
// uncompressed (gunzip them first).
#pragma once

#include "data/Dataset.h"

#include <cstdint>
#include <string>

namespace weft::data {

/// The most images one file may hold (the training set holds 60,000), the largest side, and the
/// largest image file read.
inline constexpr uint32_t kMaxMnistImages = 1000000;
inline constexpr uint32_t kMaxMnistSide = 1024;
inline constexpr uint64_t kMaxMnistImageFileBytes = uint64_t{1} << 32;

/// Loads an IDX image file and its label file, in file order. Throws naming the file when either
/// is missing or not a regular file, when a magic number or a size is wrong (with the value),
/// when the files disagree on the count, when a file ends early (with the byte offset), or when a
/// label is over 9 (with its index).
Dataset loadMnist(const std::string& imagesFile, const std::string& labelsFile);

/// train-images-idx3-ubyte with train-labels-idx1-ubyte (train) or t10k-images-idx3-ubyte with
/// t10k-labels-idx1-ubyte (held-out) from `directory`.
Dataset loadMnistSplit(const std::string& directory, bool train);

}  // namespace weft::data
