// Image folders: the layout scan, JPEG and PNG decoding (images written here with libjpeg's and
// libpng's encoders), the evaluation and training transforms, the batcher's augment hook, and an
// error naming the file or folder for every malformed input.
#include "tests/TestUtil.h"

#include "data/ImageFolder.h"
#include "data/Images.h"
#include "models/ResNet.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace weft;
namespace fs = std::filesystem;

TEST_CASE("the augment hook gets a key of (seed, epoch, example) and a part augments as the whole batch") {
  std::vector<data::Example> examples;
  for (int i = 0; i < 8; ++i) examples.push_back({{"id", Tensor::scalar(f64, i)}});
  data::BatchOptions options;
  options.batchSize = 4;
  options.seed = 9;
  // The key's low 32 bits, exactly representable, added to the id.
  options.augment = [](data::Example e, uint64_t key) {
    return data::Example{{"id", Tensor::scalar(f64, e.at("id").item())},
                         {"key", Tensor::scalar(f64, static_cast<double>(key & 0xffffffff))}};
  };
  data::Batcher whole(data::Dataset(examples), options), part(data::Dataset(examples), options);
  part.readPart(1, 2);
  for (int64_t position = 0; position < 4; ++position) {
    const data::Batch batch = whole.next(), half = part.next();
    for (int64_t k = 0; k < 4; ++k) {
      const auto id = static_cast<size_t>(batch.at("id").at(k));
      CHECK(batch.at("key").at(k) == static_cast<double>(data::augmentKey(9, position / 2, id) & 0xffffffff));
      if (k >= 2) CHECK(half.at("key").at(k - 2) == batch.at("key").at(k));
    }
  }
  CHECK(data::augmentKey(9, 0, 3) != data::augmentKey(9, 1, 3));
  CHECK(data::augmentKey(9, 0, 3) != data::augmentKey(10, 0, 3));
}

#ifdef WEFT_HAVE_IMAGE_FILES

#include <csetjmp>

#include "tests/ImageFiles.h"
#include <png.h>

namespace {

/// 8-bit samples of an image, row-major, `channels` interleaved.
struct Raw {
  int width, height, channels;
  std::vector<uint8_t> samples;
  uint8_t at(int x, int y, int c) const { return samples[static_cast<size_t>((y * width + x) * channels + c)]; }
};

/// An RGB image whose pixel (x, y), channel c is value(x, y, c).
template <class F>
Raw rgb(int width, int height, F value) {
  Raw r{width, height, 3, {}};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) r.samples.push_back(static_cast<uint8_t>(value(x, y, c)));
  return r;
}

/// A PNG of `rows` (each the bytes libpng takes for the colour type and bit depth) in `path`.
void writePng(const std::string& path, int width, int height, int colorType, int bitDepth,
              const std::vector<std::vector<uint8_t>>& rows, const std::vector<png_color>& palette = {},
              bool interlaced = false) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    FAIL("libpng could not write " << path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), bitDepth, colorType,
               interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  png_write_info(png, info);
  std::vector<png_bytep> pointers;
  for (const auto& row : rows) pointers.push_back(const_cast<png_bytep>(row.data()));
  png_write_image(png, pointers.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

void writePng(const std::string& path, const Raw& image) {
  std::vector<std::vector<uint8_t>> rows;
  const size_t rowBytes = static_cast<size_t>(image.width * image.channels);
  for (int y = 0; y < image.height; ++y)
    rows.emplace_back(image.samples.begin() + static_cast<std::ptrdiff_t>(y * rowBytes),
                      image.samples.begin() + static_cast<std::ptrdiff_t>((y + 1) * rowBytes));
  writePng(path, image.width, image.height, image.channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, 8, rows);
}

/// The JPEG of an image at `quality`.
std::string jpegBytes(const Raw& image, int quality) {
  return testing::jpegBytes(image.width, image.height, image.channels, image.samples, quality);
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// (value / 255 - mean) / std of ImageNet's channel c.
double normalised(double value, int c) {
  return (value / 255 - data::kImageNetStats.mean[static_cast<size_t>(c)]) /
         data::kImageNetStats.std[static_cast<size_t>(c)];
}

/// The decoded pixels expected of an image: (height, width, 3), grey repeated into R, G and B.
std::vector<double> expectedPixels(const Raw& image) {
  std::vector<double> out;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x)
      for (int c = 0; c < 3; ++c) out.push_back(image.at(x, y, image.channels == 1 ? 0 : c));
  return out;
}

/// The largest |actual - expected| (CHECK_CLOSE's tolerance is relative to 1 + |expected|).
double maxAbsDifference(const Tensor& actual, const std::vector<double>& expected) {
  const std::vector<double> got = actual.toDoubles();
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(got[k] - expected[k]));
  return worst;
}

Raw pattern(int width, int height) {
  return rgb(width, height, [](int x, int y, int c) { return (7 * x + 13 * y + 50 * c) % 256; });
}

}  // namespace

TEST_CASE("classes are the sorted class folders, examples their image files by name, and other files ignored") {
  TempDir dir;
  for (const char* cls : {"b", "a", "c"}) fs::create_directories(dir.path / cls);
  const Raw image = pattern(40, 36);
  const Raw red = rgb(40, 36, [](int, int, int c) { return c == 0 ? 255 : 0; });
  const Raw blue = rgb(40, 36, [](int, int, int c) { return c == 2 ? 255 : 0; });
  dir.write("b/x.JPG", jpegBytes(red, 90));
  writePng(dir.file("b/y.png"), blue);
  dir.write("b/notes.txt", "not an image");
  dir.write("b/noext", "not an image");
  writePng(dir.file("a/z.Png"), image);
  dir.write("c/w.jpeg", jpegBytes(image, 90));
  dir.write("c/v.gif", "GIF89a");
  dir.write("README", "a file beside the classes");
  const data::ImageFolder folder = data::loadImageFolder(dir.path.string(), {.size = 16});
  CHECK(folder.classes == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(folder.examples.size() == 4);
  CHECK(folder.examples.isGenerated());
  const std::vector<double> labels{0, 1, 1, 2};
  for (size_t i = 0; i < 4; ++i) {
    const data::Example e = folder.examples.example(i);
    CHECK(e.at("labels").dtype() == i64);
    CHECK(e.at("labels").shape() == Shape{});
    CHECK(e.at("labels").item() == labels[i]);
    CHECK(e.at("images").shape() == Shape{3, 16, 16});
  }
  // b's examples in name order: x.JPG (red) before y.png (blue).
  CHECK(folder.examples.example(1).at("images").at(0) == doctest::Approx(normalised(255, 0)).epsilon(0.02));
  CHECK(folder.examples.example(2).at("images").at(0) == doctest::Approx(normalised(0, 0)));
  const data::ImageFolder again = data::loadImageFolder(dir.path.string(), {.size = 16});
  CHECK(again.examples.hash() == folder.examples.hash());
  CHECK(data::loadImageFolder(dir.path.string(), {.size = 15}).examples.hash() != folder.examples.hash());
}

TEST_CASE("a PNG decodes to exactly its pixels, normalised with ImageNet's statistics") {
  TempDir dir;
  fs::create_directories(dir.path / "only");
  const Raw image = pattern(32, 32);
  writePng(dir.file("only/i.png"), image);
  CHECK_CLOSE(data::decodeImage(dir.file("only/i.png")), expectedPixels(image), 0);
  // Evaluation at 28: the shorter side resized to round(28 * 256 / 224) = 32, which it is; then
  // the centre 28 x 28, 2 pixels in.
  const Tensor images = data::loadImageFolder(dir.path.string(), {.size = 28}).examples.example(0).at("images");
  std::vector<double> expected;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) expected.push_back(normalised(image.at(x + 2, y + 2, c), c));
  CHECK_CLOSE(images, expected, 1e-5);
}

TEST_CASE("grey, grey+alpha, palette, RGBA, 16-bit and interlaced PNGs become 8-bit RGB") {
  TempDir dir;
  const int w = 5, h = 3;
  const Raw colour = pattern(w, h);
  std::vector<std::vector<uint8_t>> rows(h);
  SUBCASE("grey") {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) rows[y].push_back(static_cast<uint8_t>(40 * x + y));
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_GRAY, 8, rows);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")),
                expectedPixels(Raw{w, h, 1, {0, 40, 80, 120, 160, 1, 41, 81, 121, 161, 2, 42, 82, 122, 162}}), 0);
  }
  SUBCASE("grey with alpha: the alpha dropped") {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        rows[y].insert(rows[y].end(), {static_cast<uint8_t>(40 * x + y), static_cast<uint8_t>(x)});
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, rows);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")),
                expectedPixels(Raw{w, h, 1, {0, 40, 80, 120, 160, 1, 41, 81, 121, 161, 2, 42, 82, 122, 162}}), 0);
  }
  SUBCASE("palette") {
    const std::vector<png_color> palette{{10, 20, 30}, {200, 100, 0}, {1, 2, 3}};
    Raw expected{w, h, 3, {}};
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const png_color& p = palette[static_cast<size_t>((x + y) % 3)];
        rows[y].push_back(static_cast<uint8_t>((x + y) % 3));
        expected.samples.insert(expected.samples.end(), {p.red, p.green, p.blue});
      }
    }
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_PALETTE, 8, rows, palette);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")), expectedPixels(expected), 0);
  }
  SUBCASE("RGBA: the alpha dropped") {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        rows[y].insert(rows[y].end(), {colour.at(x, y, 0), colour.at(x, y, 1), colour.at(x, y, 2), 77});
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, rows);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")), expectedPixels(colour), 0);
  }
  SUBCASE("16-bit RGB: value v * 257 is v") {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c)
          rows[y].insert(rows[y].end(), {colour.at(x, y, c), colour.at(x, y, c)});  // big-endian
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_RGB, 16, rows);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")), expectedPixels(colour), 0);
  }
  SUBCASE("interlaced (Adam7)") {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) rows[y].push_back(colour.at(x, y, c));
    writePng(dir.file("p.png"), w, h, PNG_COLOR_TYPE_RGB, 8, rows, {}, true);
    CHECK_CLOSE(data::decodeImage(dir.file("p.png")), expectedPixels(colour), 0);
  }
}

TEST_CASE("a JPEG written at quality 100 decodes close to its pixels, and a grey one becomes RGB") {
  TempDir dir;
  // Smooth gradients, which the DCT keeps almost exactly.
  const Raw colour = rgb(24, 16, [](int x, int y, int c) { return 30 + 5 * x + 4 * y + 20 * c; });
  dir.write("c.jpg", jpegBytes(colour, 100));
  CHECK(maxAbsDifference(data::decodeImage(dir.file("c.jpg")), expectedPixels(colour)) <= 2);
  Raw grey{24, 16, 1, {}};
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 24; ++x) grey.samples.push_back(static_cast<uint8_t>(20 + 6 * x + 3 * y));
  dir.write("g.jpg", jpegBytes(grey, 100));
  const Tensor decoded = data::decodeImage(dir.file("g.jpg"));
  CHECK(maxAbsDifference(decoded, expectedPixels(grey)) <= 2);
  for (int64_t k = 0; k < decoded.numel(); k += 3)
    CHECK((decoded.at(k) == decoded.at(k + 1) && decoded.at(k) == decoded.at(k + 2)));
}

TEST_CASE("evaluation resizes the shorter side to size * 256 / 224 and takes the centre") {
  // 128 x 64: red on the left half, blue on the right, green on the top half. At 28 it is resized
  // to 64 x 32 (each output pixel the source's 4 nearest along each axis, weighted 1, 3, 3, 1 /
  // 8) and cropped 18 in from the left and 2 from the top: crop column c is resized column c +
  // 18, red in the proportion 1 to column 12, 7/8 at 13, 1/8 at 14, 0 after; rows likewise green.
  TempDir dir;
  fs::create_directories(dir.path / "k");
  writePng(dir.file("k/i.png"), rgb(128, 64, [](int x, int y, int c) {
             return c == 0 ? (x < 64) * 255 : c == 1 ? (y < 32) * 255 : (x >= 64) * 255;
           }));
  const auto share = [](int k) { return k <= 12 ? 1.0 : k == 13 ? 7.0 / 8 : k == 14 ? 1.0 / 8 : 0.0; };
  std::vector<double> expected;
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const double value = c == 0 ? share(x) : c == 1 ? share(y) : 1 - share(x);
        expected.push_back(normalised(255 * value, c));
      }
    }
  }
  CHECK_CLOSE(data::loadImageFolder(dir.path.string(), {.size = 28}).examples.example(0).at("images"), expected, 1e-4);
}

TEST_CASE("a random resized crop box is drawn from the key alone, within RandomResizedCrop's ranges") {
  for (uint64_t key = 0; key < 200; ++key) {
    const data::CropBox box = data::randomResizedCropBox(375, 500, key),
                        same = data::randomResizedCropBox(375, 500, key);
    CHECK((box.top == same.top && box.left == same.left && box.height == same.height && box.width == same.width));
    REQUIRE((box.top >= 0 && box.left >= 0 && box.top + box.height <= 375 && box.left + box.width <= 500));
    const double area = static_cast<double>(box.height * box.width) / (375.0 * 500);
    const double ratio = static_cast<double>(box.width) / static_cast<double>(box.height);
    CHECK(area >= 0.079);
    CHECK(ratio >= 0.74);
    CHECK(ratio <= 1.35);
  }
  const data::CropBox a = data::randomResizedCropBox(375, 500, 1), b = data::randomResizedCropBox(375, 500, 2);
  CHECK((a.top != b.top || a.left != b.left || a.height != b.height || a.width != b.width));
  // 10 pixels high, 1000 wide: no try fits (a box of 8% of the area at ratio 4/3 is 24 high), so
  // the centre 13 x 10 (ratio round(10 * 4/3) / 10).
  const data::CropBox thin = data::randomResizedCropBox(10, 1000, 5);
  CHECK(thin.top == 0);
  CHECK(thin.height == 10);
  CHECK(thin.width == 13);
  CHECK(thin.left == (1000 - 13) / 2);
}

TEST_CASE("cropResize takes the box's pixels, and flipped gives their mirror image") {
  Tensor pixels(f32, {8, 8, 3});
  for (int64_t k = 0; k < pixels.numel(); ++k) pixels.data<float>()[k] = static_cast<float>((k * 37) % 256);
  const data::CropBox box{2, 1, 4, 4};  // a 4 x 4 box to 4 x 4: no resampling
  const data::ChannelStats identity{{0, 0, 0}, {1.0f / 255, 1.0f / 255, 1.0f / 255}};  // values as they are
  std::vector<double> straight, mirrored;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < 4; ++y) {
      for (int64_t x = 0; x < 4; ++x) {
        straight.push_back(pixels.at(((box.top + y) * 8 + box.left + x) * 3 + c));
        mirrored.push_back(pixels.at(((box.top + y) * 8 + box.left + 3 - x) * 3 + c));
      }
    }
  }
  CHECK_CLOSE(data::cropResize(pixels, box, 4, false, identity), straight, 1e-4);
  CHECK_CLOSE(data::cropResize(pixels, box, 4, true, identity), mirrored, 1e-4);
  CHECK(contains(errorOf([&] { data::cropResize(pixels, {6, 0, 4, 4}, 4, false, identity); }), "of a 8 x 8 image"));
}

namespace {

/// A training folder of n images of 60 x 40 in two classes.
data::ImageFolder trainingFolder(const TempDir& dir, int n, int64_t size) {
  for (int i = 0; i < n; ++i) {
    const std::string cls = i % 2 ? "odd" : "even";
    fs::create_directories(dir.path / cls);
    writePng(dir.file(cls + "/" + std::to_string(i) + ".png"),
             rgb(60, 40, [i](int x, int y, int c) { return (11 * x + 5 * y * (c + 1) + 31 * i) % 256; }));
  }
  return data::loadImageFolder(dir.path.string(), {.size = size, .training = true});
}

/// Batches of `batch` random crops of `size` pixels, drawn from `seed`.
data::BatchOptions croppedBatches(int64_t batch, uint64_t seed, int64_t size) {
  data::BatchOptions options;
  options.batchSize = batch;
  options.seed = seed;
  options.augment = data::imageFolderAugment({.size = size});
  return options;
}

}  // namespace

TEST_CASE("training crops are a function of (seed, epoch, example): other epochs differ, seek replays them") {
  TempDir dir;
  const data::ImageFolder folder = trainingFolder(dir, 4, 24);
  CHECK(folder.examples.example(0).at("pixels").shape() == Shape{40, 60, 3});
  data::BatchOptions options;
  options.batchSize = 4;
  options.shuffle = false;
  options.seed = 3;
  options.augment = data::imageFolderAugment({.size = 24});
  data::Batcher batches(folder.examples, options);
  const data::Batch first = batches.next(), second = batches.next();
  CHECK(first.at("images").shape() == Shape{4, 3, 24, 24});
  CHECK(first.at("labels").toVector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1});  // even/0, even/2, odd/1, odd/3
  CHECK(first.at("images").toDoubles() != second.at("images").toDoubles());
  // Each example is the hook applied with the key of its (seed, epoch, index).
  const data::Example made = options.augment(folder.examples.example(2), data::augmentKey(3, 1, 2));
  CHECK_CLOSE(made.at("images"), data::sliceBatch(second, 2, 4).at("images").toDoubles(), 0);
  data::Batcher resumed(folder.examples, options), again(folder.examples, options);
  resumed.seek(1);
  CHECK(resumed.next().at("images").toDoubles() == second.at("images").toDoubles());
  CHECK(again.next().at("images").toDoubles() == first.at("images").toDoubles());
}

TEST_CASE("batches made by several input threads are the same bytes as one thread's, each part's and resumed too") {
  TempDir dir;
  const data::ImageFolder folder = trainingFolder(dir, 12, 16);
  const data::BatchOptions options = croppedBatches(6, 7, 16);
  data::BatchOptions threaded = options;
  threaded.threads = 4;
  data::Batcher one(folder.examples, options), four(folder.examples, threaded), part(folder.examples, threaded);
  part.readPart(1, 2);
  for (int step = 0; step < 5; ++step) {  // past an epoch of 2 batches
    CAPTURE(step);
    const data::Batch expected = one.next(), got = four.next(), half = part.next();
    for (const char* field : {"images", "labels"}) {
      CHECK(got.at(field).toDoubles() == expected.at(field).toDoubles());
      CHECK(half.at(field).toDoubles() == data::sliceBatch(expected, 1, 2).at(field).toDoubles());
    }
  }
  // Generated examples kept for later epochs (synthetic images), made on several threads.
  data::BatchOptions kept;
  kept.batchSize = 8;
  kept.keepGenerated = true;
  data::BatchOptions keptThreaded = kept;
  keptThreaded.threads = 3;
  const data::Dataset synthetic = data::syntheticImages({.size = 8}, 16, 1);
  data::Batcher plain(synthetic, kept), threadedKept(synthetic, keptThreaded);
  for (int step = 0; step < 4; ++step)
    CHECK(threadedKept.next().at("images").toDoubles() == plain.next().at("images").toDoubles());
  CHECK(errorOf([&] {
          data::BatchOptions none = options;
          none.threads = 0;
          data::Batcher(folder.examples, none);
        }) == "a batch is made by 1 to 1024 threads, not 0");
}

TEST_CASE("each worker's part of an augmented batch is exactly that part of the whole batch") {
  TempDir dir;
  const data::ImageFolder folder = trainingFolder(dir, 8, 16);
  const data::BatchOptions options = croppedBatches(4, 5, 16);
  data::Batcher whole(folder.examples, options), part0(folder.examples, options), part1(folder.examples, options);
  part0.readPart(0, 2);
  part1.readPart(1, 2);
  for (int step = 0; step < 4; ++step) {
    const data::Batch batch = whole.next(), a = part0.next(), b = part1.next();
    for (const char* field : {"images", "labels"}) {
      std::vector<double> joined = a.at(field).toDoubles();
      const std::vector<double> rest = b.at(field).toDoubles();
      joined.insert(joined.end(), rest.begin(), rest.end());
      CHECK(joined == batch.at(field).toDoubles());
    }
  }
}

TEST_CASE("a CMYK JPEG becomes RGB as PIL converts it, its Adobe-inverted inks read as such") {
  TempDir dir;
  // libjpeg writes CMYK with Adobe's marker, so the stored bytes are the inverted inks.
  Raw cmyk{8, 8, 4, {}};
  for (int i = 0; i < 64; ++i) {
    const std::vector<uint8_t> ink{200, 150, 100, 220};  // stored: 255 - C, 255 - M, 255 - Y, 255 - K
    cmyk.samples.insert(cmyk.samples.end(), ink.begin(), ink.end());
  }
  dir.write("cmyk.jpg", jpegBytes(cmyk, 100));
  const std::vector<double> rgb = data::decodeImage(dir.file("cmyk.jpg")).toDoubles();
  REQUIRE(rgb.size() == 8 * 8 * 3);
  const double expected[3] = {200.0 * 220 / 255, 150.0 * 220 / 255, 100.0 * 220 / 255};
  for (size_t i = 0; i < rgb.size(); ++i) CHECK(std::abs(rgb[i] - expected[i % 3]) <= 3);
}

TEST_CASE("a truncated JPEG, a truncated PNG and garbage are errors naming the file") {
  TempDir dir;
  const Raw image = pattern(64, 48);
  const std::string jpeg = jpegBytes(image, 95);
  dir.write("cut.jpg", jpeg.substr(0, jpeg.size() / 2));
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("cut.jpg")); }),
                 "cut.jpg': not a readable JPEG: Premature end"));
  dir.write("head.jpg", jpeg.substr(0, 40));
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("head.jpg")); }), "head.jpg': not a readable JPEG"));
  writePng(dir.file("whole.png"), image);
  const std::string png = readBytes(dir.file("whole.png"));
  dir.write("cut.png", png.substr(0, png.size() / 2));
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("cut.png")); }), "cut.png': not a readable PNG"));
  dir.write("garbage.jpg", "this is not an image at all");
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("garbage.jpg")); }),
                 "garbage.jpg' is neither a JPEG nor a PNG: it starts with bytes [74 68 69 73 20 69 73 20]"));
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("missing.png")); }), "missing.png does not exist"));
}

TEST_CASE("an image over the size limit is refused with its size before it is decoded") {
  TempDir dir;
  writePng(dir.file("wide.png"), 20000, 1, PNG_COLOR_TYPE_GRAY, 8, {std::vector<uint8_t>(20000, 7)});
  CHECK(contains(errorOf([&] { data::decodeImage(dir.file("wide.png")); }),
                 "wide.png': a PNG image of 20000 x 1 pixels; each side must be in 1..16384"));
}

TEST_CASE("a bad example surfaces when it is read, naming the file") {
  TempDir dir;
  fs::create_directories(dir.path / "k");
  dir.write("k/bad.jpg", "GIF89a, under another name");
  const data::ImageFolder folder = data::loadImageFolder(dir.path.string(), {.size = 8});
  CHECK(contains(errorOf([&] { folder.examples.example(0); }), "k/bad.jpg' is neither a JPEG nor a PNG"));
}

TEST_CASE("a missing root, a root without classes and an empty class folder are errors naming the folder") {
  TempDir dir;
  CHECK(contains(errorOf([&] { data::loadImageFolder(dir.file("nowhere")); }), "nowhere' does not exist"));
  dir.write("file", "x");
  CHECK(contains(errorOf([&] { data::loadImageFolder(dir.file("file")); }), "file' is not a directory"));
  fs::create_directories(dir.path / "root");
  CHECK(contains(errorOf([&] { data::loadImageFolder(dir.file("root")); }), "root' holds no class folder"));
  fs::create_directories(dir.path / "root/full");
  fs::create_directories(dir.path / "root/empty");
  writePng(dir.file("root/full/a.png"), pattern(4, 4));
  dir.write("root/empty/notes.txt", "no images here");
  CHECK(contains(errorOf([&] { data::loadImageFolder(dir.file("root")); }),
                 "class folder '" + dir.file("root/empty") + "' holds no .jpg, .jpeg or .png file"));
}

namespace {

/// An ImageNet-style directory: train/ with 4 images of each class, val/ with 2 of each.
void writeImageNet(const TempDir& dir, const std::vector<std::string>& trainClasses,
                   const std::vector<std::string>& valClasses) {
  for (const auto& [split, classes, count] : {std::tuple{"train", trainClasses, 4}, std::tuple{"val", valClasses, 2}}) {
    for (size_t k = 0; k < classes.size(); ++k) {
      fs::create_directories(dir.path / split / classes[k]);
      for (int i = 0; i < count; ++i)
        dir.write(std::string(split) + "/" + classes[k] + "/" + std::to_string(i) + ".jpg",
                  jpegBytes(rgb(48 + 8 * i, 40,
                                [k](int x, int, int c) { return (x * (c + 1) + 60 * static_cast<int>(k)) % 256; }),
                            90));
    }
  }
}

std::unique_ptr<models::ZooModel> smallResNet() {
  std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
  setOption<int64_t>(*model, "depth", 8);
  setOption<int64_t>(*model, "image-size", 16);
  setOption<int64_t>(*model, "eval-batch", 4);
  return model;
}

}  // namespace

TEST_CASE("the resnet zoo model trains on train/ and evaluates on val/ of an image-folder directory") {
  TempDir dir;
  writeImageNet(dir, {"cat", "dog", "eel"}, {"cat", "dog", "eel"});
  std::unique_ptr<models::ZooModel> model = smallResNet();
  Graph g;
  models::CommonOptions common;
  common.batchSize = 4;
  common.data = dir.path.string();
  model->build(g, common);
  CHECK(g.find("fc/weight")->output().shape()[1] == 3);
  const data::Batch batch = model->trainData().next();
  CHECK(batch.at("images").shape() == Shape{4, 3, 16, 16});
  Node* step = optim::Momentum(0.05, 0.9).minimize(model->loss());
  Session s(g, {2});
  s.run({model->loss()}, models::feedsFor(g, batch), {step});
  const auto metrics = model->evaluate(s, 0);
  CHECK(metrics.at("accuracy") >= 0);
  CHECK(metrics.at("accuracy") <= 1);
  CHECK(std::isfinite(metrics.at("loss")));
}

TEST_CASE("the resnet zoo model's training batches are the same made by 3 input threads as by one") {
  TempDir dir;
  writeImageNet(dir, {"cat", "dog", "eel"}, {"cat", "dog", "eel"});
  const auto batches = [&](int threads) {
    std::unique_ptr<models::ZooModel> model = smallResNet();
    Graph g;
    models::CommonOptions common;
    common.batchSize = 4;
    common.data = dir.path.string();
    common.inputThreads = threads;
    model->build(g, common);
    std::vector<double> images;
    for (int step = 0; step < 3; ++step) {
      const std::vector<double> more = model->trainData().next().at("images").toDoubles();
      images.insert(images.end(), more.begin(), more.end());
    }
    return images;
  };
  CHECK(batches(3) == batches(1));
}

TEST_CASE("the resnet zoo model refuses a val/ whose classes are not train/'s, naming both") {
  TempDir dir;
  writeImageNet(dir, {"cat", "dog"}, {"cat", "emu"});
  Graph g;
  models::CommonOptions common;
  common.data = dir.path.string();
  const std::string error = errorOf([&] { smallResNet()->build(g, common); });
  CHECK(contains(error, "the class folders of '" + (dir.path / "train").string() + "' (2 classes) and '" +
                            (dir.path / "val").string() + "' (2 classes) differ, first at 'dog' against 'emu'"));
}

#else

TEST_CASE("without libjpeg and libpng, loading an image folder says what to install") {
  CHECK_FALSE(data::imageFilesSupported());
  CHECK(contains(errorOf([] { data::loadImageFolder("/any"); }),
                 "this weft was built without JPEG/PNG support (libjpeg62-turbo-dev, libpng-dev)"));
}

#endif
