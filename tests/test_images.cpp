// The synthetic image generator and the CIFAR-10 binary loader.
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include "data/Images.h"

#include <filesystem>
#include <fstream>
#include <random>

using namespace weft;

namespace {

/// A CIFAR-10 record: label byte, then pixel k of plane c = (c * 1024 + k + seed) % 256.
std::vector<unsigned char> record(unsigned char label, int seed) {
  std::vector<unsigned char> r{label};
  for (int k = 0; k < 3072; ++k) r.push_back(static_cast<unsigned char>((k + seed) % 256));
  return r;
}

void writeFile(const std::string& path, const std::vector<std::vector<unsigned char>>& records, size_t dropLast = 0) {
  std::vector<unsigned char> bytes;
  for (const auto& r : records) bytes.insert(bytes.end(), r.begin(), r.end());
  bytes.erase(bytes.end() - static_cast<std::ptrdiff_t>(dropLast), bytes.end());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("synthetic images are deterministic, shaped (3, 32, 32) with scalar i64 labels, and seeds differ") {
  const data::SyntheticImagesSpec spec;
  const data::Dataset a = data::syntheticImages(spec, 20, 7).held(), b = data::syntheticImages(spec, 20, 7).held(),
                      c = data::syntheticImages(spec, 20, 8).held();
  REQUIRE(a.size() == 20);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].at("images").shape() == Shape{3, 32, 32});
    CHECK(a[i].at("images").dtype() == f32);
    CHECK(a[i].at("labels").shape() == Shape{});
    CHECK(a[i].at("labels").dtype() == i64);
    CHECK(a[i].at("images").toDoubles() == b[i].at("images").toDoubles());
    CHECK(a[i].at("images").toDoubles() != c[i].at("images").toDoubles());
  }
  // An example depends on its index only, not on how many were generated.
  const data::Dataset longer = data::syntheticImages(spec, 30, 7).held();
  CHECK(longer[13].at("images").toDoubles() == a[13].at("images").toDoubles());
}

TEST_CASE("synthetic images are made when read, and held ones are the same images") {
  const data::SyntheticImagesSpec spec;
  const data::Dataset generated = data::syntheticImages(spec, 12, 7);
  CHECK(generated.isGenerated());
  const data::Dataset held = generated.held();
  CHECK_FALSE(held.isGenerated());
  for (size_t i = 0; i < held.size(); ++i) {
    CHECK(held[i].at("images").toDoubles() == generated.example(i).at("images").toDoubles());
    CHECK(held[i].at("labels").item() == generated.example(i).at("labels").item());
  }
  // The hash stands for the generator's parameters: equal for equal ones, different otherwise.
  data::SyntheticImagesSpec noisier = spec;
  noisier.noise = 0.2;
  CHECK(generated.hash() == data::syntheticImages(spec, 12, 7).hash());
  CHECK(generated.hash() != data::syntheticImages(spec, 12, 8).hash());
  CHECK(generated.hash() != data::syntheticImages(noisier, 12, 7).hash());
}

TEST_CASE("synthetic images are class-balanced and roughly normalised") {
  const data::Dataset d = data::syntheticImages({}, 200, 3).held();
  std::vector<int> counts(data::kSyntheticClasses, 0);
  double total = 0, squares = 0;
  int64_t n = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    ++counts[static_cast<size_t>(d[i].at("labels").item())];
    for (double v : d[i].at("images").toDoubles()) {
      total += v;
      squares += v * v;
      ++n;
    }
  }
  for (int c : counts) CHECK(c == 20);
  const double mean = total / static_cast<double>(n), var = squares / static_cast<double>(n) - mean * mean;
  CHECK(std::abs(mean) < 0.3);
  CHECK(var > 0.3);
  CHECK(var < 3);
}

TEST_CASE("the synthetic task is not linearly separable by mean colour") {
  // Colour carries no class information: per-class mean intensities are all close.
  const data::Dataset d = data::syntheticImages({}, 1000, 5).held();
  std::vector<double> sums(data::kSyntheticClasses, 0);
  for (size_t i = 0; i < d.size(); ++i) {
    double s = 0;
    for (double v : d[i].at("images").toDoubles()) s += v;
    sums[static_cast<size_t>(d[i].at("labels").item())] += s / 3072;
  }
  const auto [lo, hi] = std::minmax_element(sums.begin(), sums.end());
  CHECK((*hi - *lo) / 100 < 0.2);
}

TEST_CASE("synthetic images reject an invalid spec") {
  data::SyntheticImagesSpec spec;
  spec.size = 4;
  CHECK(contains(errorOf([&] { data::syntheticImages(spec, 1, 1); }), "size 4"));
}

TEST_CASE("CIFAR-10 batches load labels and normalised R, G, B planes in file order") {
  TempDir dir;
  writeFile(dir.file("a.bin"), {record(3, 0), record(9, 5)});
  writeFile(dir.file("b.bin"), {record(0, 17)});
  const data::ChannelStats stats{{0.5f, 0.25f, 0.0f}, {0.5f, 0.25f, 1.0f}};
  const data::Dataset d = data::loadCifar10({dir.file("a.bin"), dir.file("b.bin")}, stats);
  REQUIRE(d.size() == 3);
  CHECK(d[0].at("labels").item() == 3);
  CHECK(d[1].at("labels").item() == 9);
  CHECK(d[2].at("labels").item() == 0);
  const Tensor& image = d[1].at("images");
  CHECK(image.shape() == Shape{3, 32, 32});
  for (int64_t k : {0, 1000, 1024 + 31, 2048 + 1023}) {
    const int64_t c = k / 1024;
    const double pixel = static_cast<double>((k + 5) % 256) / 255;
    CHECK(image.at(k) == doctest::Approx((pixel - stats.mean[c]) / stats.std[c]).epsilon(1e-5));
  }
}

TEST_CASE("CIFAR-100 records give the fine or the coarse label, and normalised planes after both") {
  TempDir dir;
  // A CIFAR-100 record is a coarse label byte, then a CIFAR-10-like record whose label is the fine one.
  auto record100 = [](unsigned char coarse, unsigned char fine, int seed) {
    std::vector<unsigned char> r = record(fine, seed);
    r.insert(r.begin(), coarse);
    return r;
  };
  writeFile(dir.file("train.bin"), {record100(19, 99, 0), record100(4, 37, 5)});
  const data::ChannelStats stats{{0.5f, 0.25f, 0.0f}, {0.5f, 0.25f, 1.0f}};
  const data::Dataset fine = data::loadCifar100({dir.file("train.bin")}, data::Cifar100Labels::Fine, stats);
  const data::Dataset coarse = data::loadCifar100Split(dir.path.string(), true, data::Cifar100Labels::Coarse);
  REQUIRE(fine.size() == 2);
  CHECK(fine[0].at("labels").item() == 99);
  CHECK(fine[1].at("labels").item() == 37);
  CHECK(coarse[0].at("labels").item() == 19);
  CHECK(coarse[1].at("labels").item() == 4);
  const Tensor& image = fine[1].at("images");
  for (int64_t k : {0, 1024 + 31, 2048 + 1023}) {
    const int64_t c = k / 1024;
    const double pixel = static_cast<double>((k + 5) % 256) / 255;
    CHECK(image.at(k) == doctest::Approx((pixel - stats.mean[c]) / stats.std[c]).epsilon(1e-5));
  }
  writeFile(dir.file("bad-fine.bin"), {record100(1, 100, 0)});
  CHECK(contains(errorOf([&] { data::loadCifar100({dir.file("bad-fine.bin")}); }),
                 "record 0 (byte offset 0) has label 100, expected 0..99"));
  writeFile(dir.file("bad-coarse.bin"), {record100(0, 1, 0), record100(20, 1, 0)});
  CHECK(contains(
      errorOf([&] { data::loadCifar100({dir.file("bad-coarse.bin")}, data::Cifar100Labels::Coarse); }),
      "CIFAR-100 file '" + dir.file("bad-coarse.bin") + "': record 1 (byte offset 3074) has label 20, expected 0..19"));
  writeFile(dir.file("short.bin"), {record100(0, 1, 0)}, 1);
  CHECK(contains(errorOf([&] { data::loadCifar100({dir.file("short.bin")}); }), "truncated record 0"));
  CHECK(contains(errorOf([&] { data::loadCifar100Split(dir.path.string(), false); }), "test.bin"));
}

TEST_CASE("CIFAR-10 splits name data_batch_1..5 and test_batch") {
  TempDir dir;
  for (int k = 1; k <= 5; ++k) writeFile(dir.file("data_batch_" + std::to_string(k) + ".bin"), {record(k, k)});
  writeFile(dir.file("test_batch.bin"), {record(7, 0), record(8, 0)});
  const data::Dataset train = data::loadCifar10Split(dir.path.string(), true);
  REQUIRE(train.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(train[i].at("labels").item() == static_cast<double>(i + 1));
  CHECK(data::loadCifar10Split(dir.path.string(), false).size() == 2);
}

TEST_CASE("a missing CIFAR-10 file is an error naming it") {
  TempDir dir;
  const std::string message = errorOf([&] { data::loadCifar10Split(dir.path.string(), false); });
  CHECK(contains(message, "test_batch.bin"));
  CHECK(contains(message, "does not exist"));
}

TEST_CASE("a truncated CIFAR-10 record is an error naming the file and its byte offset") {
  TempDir dir;
  writeFile(dir.file("cut.bin"), {record(1, 0), record(2, 0), record(3, 0)}, 100);
  const std::string message = errorOf([&] { data::loadCifar10({dir.file("cut.bin")}); });
  CHECK(contains(message, "cut.bin"));
  CHECK(contains(message, "truncated record 2 at byte offset 6146"));
}

TEST_CASE("a CIFAR-10 label over 9 is an error naming the file and the record") {
  TempDir dir;
  writeFile(dir.file("bad.bin"), {record(1, 0), record(12, 0)});
  const std::string message = errorOf([&] { data::loadCifar10({dir.file("bad.bin")}); });
  CHECK(contains(message, "bad.bin"));
  CHECK(contains(message, "record 1"));
  CHECK(contains(message, "label 12"));
}

TEST_CASE("an empty CIFAR-10 file is an error naming it") {
  TempDir dir;
  writeFile(dir.file("empty.bin"), {});
  CHECK(contains(errorOf([&] { data::loadCifar10({dir.file("empty.bin")}); }), "empty.bin"));
}

TEST_CASE("a CIFAR-10 file over the record limit is refused before it is read") {
  TempDir dir;
  // Sparse: the size is what matters. The first label is bad, so reading the file would fail on it.
  const std::string path = dir.file("huge.bin");
  std::ofstream(path, std::ios::binary) << '\xff';
  std::filesystem::resize_file(path, (data::kMaxCifar10Records + 1) * data::kCifar10RecordBytes);
  const std::string message = errorOf([&] { data::loadCifar10({path}); });
  CHECK(contains(message, path + " has 184383073 bytes, over the limit of 184380000 bytes"));
}

TEST_CASE("CIFAR-10 files that are not regular files are refused, naming what they are") {
  TempDir dir;
  CHECK(contains(errorOf([&] { data::loadCifar10({"/dev/zero"}); }), "/dev/zero is a character device"));
  CHECK(contains(errorOf([&] { data::loadCifar10({dir.path.string()}); }), "is a directory"));
  const std::string fifo = makeFifo(dir, "batch.fifo");
  CHECK(contains(fifoError(fifo, [&] { data::loadCifar10({fifo}); }), fifo + " is a FIFO"));
}
