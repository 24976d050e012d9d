// The MNIST IDX loader: images and labels in file order, pixels scaled to [0, 1], and a clear
// error naming the file (and the offset, index or value) for every malformed input.
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include "data/Mnist.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

using namespace weft;

namespace {

void putU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

/// An IDX image file of `count` images of rows x columns, pixel k of image i = (7 i + k) % 256.
std::string imageFile(uint32_t count, uint32_t rows, uint32_t columns, uint32_t magic = 0x803) {
  std::string out;
  putU32(out, magic);
  putU32(out, count);
  putU32(out, rows);
  putU32(out, columns);
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t k = 0; k < rows * columns; ++k) out.push_back(static_cast<char>((7 * i + k) % 256));
  return out;
}

std::string labelFile(const std::vector<uint8_t>& labels, uint32_t magic = 0x801) {
  std::string out;
  putU32(out, magic);
  putU32(out, static_cast<uint32_t>(labels.size()));
  for (const uint8_t l : labels) out.push_back(static_cast<char>(l));
  return out;
}

std::string loadError(const std::string& images, const std::string& labels) {
  TempDir dir;
  const std::string i = dir.write("images", images), l = dir.write("labels", labels);
  return errorOf([&] { data::loadMnist(i, l); });
}

}  // namespace

TEST_CASE("MNIST images load in file order with their labels, pixels over 255") {
  TempDir dir;
  const std::string images = dir.write("images", imageFile(3, 2, 3)),
                    labels = dir.write("labels", labelFile({4, 0, 9}));
  const data::Dataset d = data::loadMnist(images, labels);
  REQUIRE(d.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const Tensor& f = d[i].at("features");
    CHECK(f.shape() == Shape{6});
    CHECK(f.dtype() == f32);
    for (int64_t k = 0; k < 6; ++k)
      CHECK(f.at(k) == doctest::Approx(static_cast<double>((7 * i + static_cast<size_t>(k)) % 256) / 255));
    CHECK(d[i].at("labels").dtype() == i64);
  }
  CHECK(d[0].at("labels").item() == 4);
  CHECK(d[2].at("labels").item() == 9);
}

TEST_CASE("an MNIST split names the standard files") {
  TempDir dir;
  dir.write("train-images-idx3-ubyte", imageFile(2, 28, 28));
  dir.write("train-labels-idx1-ubyte", labelFile({1, 2}));
  dir.write("t10k-images-idx3-ubyte", imageFile(1, 28, 28));
  dir.write("t10k-labels-idx1-ubyte", labelFile({3}));
  CHECK(data::loadMnistSplit(dir.path.string(), true).size() == 2);
  CHECK(data::loadMnistSplit(dir.path.string(), false)[0].at("labels").item() == 3);
  TempDir empty;
  CHECK(contains(errorOf([&] { data::loadMnistSplit(empty.path.string(), true); }), "train-images-idx3-ubyte"));
}

TEST_CASE("a wrong MNIST magic number names the file and the value") {
  CHECK(contains(loadError(imageFile(1, 2, 2, 0x801), labelFile({1})), "magic number 0x00000801, expected 0x00000803"));
  CHECK(contains(loadError(imageFile(1, 2, 2), labelFile({1}, 0x803)), "magic number 0x00000803, expected 0x00000801"));
}

TEST_CASE("MNIST image and label files that disagree on the count are refused") {
  CHECK(contains(loadError(imageFile(2, 2, 2), labelFile({1})), "disagree: 2 images, 1 labels"));
}

TEST_CASE("an MNIST file whose size does not match its header is refused with both sizes") {
  std::string short_ = imageFile(2, 2, 2);
  short_.pop_back();
  CHECK(
      contains(loadError(short_, labelFile({1, 2})), "holds 23 bytes; its header says 2 images of 4 pixels, 24 bytes"));
  CHECK(contains(loadError(imageFile(2, 2, 2), labelFile({1, 2}) + "x"),
                 "holds 11 bytes; its header says 2 labels, 10 bytes"));
  CHECK(contains(loadError(imageFile(1, 2, 2).substr(0, 10), labelFile({1})), "the header ends at byte offset 8"));
}

TEST_CASE("an MNIST label over 9 names its index and offset") {
  CHECK(
      contains(loadError(imageFile(3, 2, 2), labelFile({1, 2, 10})), "label 2 (byte offset 10) is 10, expected 0..9"));
}

TEST_CASE("MNIST sizes a model would allocate by are bounded") {
  CHECK(contains(loadError(imageFile(0, 0, 5), labelFile({})), "images of 0 x 5 pixels; each side must be in 1..1024"));
  std::string many;
  putU32(many, 0x803);
  putU32(many, 2000000);
  putU32(many, 28);
  putU32(many, 28);
  CHECK(contains(loadError(many, labelFile({})), "2000000 images, more than 1000000"));
}

TEST_CASE("a missing MNIST file or a FIFO is refused, naming it") {
  TempDir dir;
  const std::string labels = dir.write("labels", labelFile({1}));
  CHECK(contains(errorOf([&] { data::loadMnist(dir.file("none"), labels); }), "none"));
  const std::string fifo = makeFifo(dir, "fifo");
  CHECK(contains(fifoError(fifo, [&] { data::loadMnist(fifo, labels); }), "fifo"));
}
