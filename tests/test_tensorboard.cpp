// TensorBoard event files: the CRC-32C of TFRecord framing against published check values, the
// framing of every record, and errors that name the path. TensorBoard's own reader reads the
// trainer's files in tests/test_tensorboard_reader.py.
#include "tests/TestUtil.h"

#include "core/TensorBoard.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace weft;
namespace fs = std::filesystem;

namespace {

std::string fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

template <class T>
T littleEndianAt(const std::string& bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/// The records' data, each record's length and checksums checked.
std::vector<std::string> records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const auto length = littleEndianAt<uint64_t>(bytes, at);
    CHECK(littleEndianAt<uint32_t>(bytes, at + 8) == masked(crc32c(bytes.data() + at, 8)));
    REQUIRE(at + 12 + length + 4 <= bytes.size());
    const std::string data = bytes.substr(at + 12, length);
    CHECK(littleEndianAt<uint32_t>(bytes, at + 12 + length) == masked(crc32c(data.data(), data.size())));
    out.push_back(data);
    at += 12 + length + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c gives the published check values (RFC 3720's, and the standard 123456789)") {
  CHECK(crc32c("123456789", 9) == 0xe3069283u);
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xff);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62a8ab43u);
  std::vector<unsigned char> ascending(32);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<unsigned char>(i);
  CHECK(crc32c(ascending.data(), ascending.size()) == 0x46dd794eu);
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xe3069283u);  // continued where it stopped
}

TEST_CASE("an event file is a version record, then one framed record per scalar, each flushed as written") {
  TempDir dir;
  TensorBoardWriter board((dir.path / "board").string());
  CHECK(fs::path(board.path()).filename().string().rfind("events.out.tfevents.", 0) == 0);
  board.scalar("train/loss", 0.25, 7);
  board.scalar("eval/accuracy", 0.5, 9);
  const std::vector<std::string> data = records(fileBytes(board.path()));  // read while the writer is open
  REQUIRE(data.size() == 3);
  CHECK(contains(data[0], "brain.Event:2"));
  CHECK(contains(data[1], "train/loss"));
  const float quarter = 0.25f;
  CHECK(contains(data[1], std::string(reinterpret_cast<const char*>(&quarter), 4)));
  CHECK(contains(data[2], "eval/accuracy"));
}

TEST_CASE("two writers into one directory write two files") {
  TempDir dir;
  TensorBoardWriter first(dir.path.string()), second(dir.path.string());
  CHECK(first.path() != second.path());
}

TEST_CASE("a directory that cannot be made is named in the error") {
  TempDir dir;
  const fs::path file = dir.path / "plain-file";
  std::ofstream(file) << "x";
  CHECK(contains(errorOf([&] { TensorBoardWriter((file / "board").string()); }),
                 "cannot create the TensorBoard directory " + (file / "board").string()));
}
