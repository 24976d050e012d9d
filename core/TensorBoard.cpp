// The TFRecord framing and the few Event fields weft writes, encoded by hand: a protocol buffer
// library would be a dependency for three message types. Field numbers are those of
// tensorflow/core/util/event.proto and summary.proto.
#include "core/TensorBoard.h"

#include "core/Error.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace weft {
namespace {

/// Wire types of the protocol buffer encoding.
enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void putKey(std::string& out, int field, WireType type) { putVarint(out, (static_cast<uint64_t>(field) << 3) | type); }

template <class T>
void putLittleEndian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void putBytes(std::string& out, int field, std::string_view bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out.append(bytes);
}

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Event{wall_time = 1, step = 2, then one of file_version = 3 or summary = 5}.
std::string event(int64_t step, int field, std::string_view payload) {
  std::string out;
  putKey(out, 1, kFixed64);
  putLittleEndian(out, wallTime());
  putKey(out, 2, kVarint);
  putVarint(out, static_cast<uint64_t>(step));
  putBytes(out, field, payload);
  return out;
}

/// Summary{value = 1: Value{tag = 1, simple_value = 2}}.
std::string scalarSummary(const std::string& tag, float value) {
  std::string v;
  putBytes(v, 1, tag);
  putKey(v, 2, kFixed32);
  putLittleEndian(v, value);
  std::string summary;
  putBytes(summary, 1, v);
  return summary;
}

/// TFRecord's checksums are masked, since a CRC of data that holds CRCs is weak.
uint32_t maskedCrc(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::array<uint32_t, 256> crcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // the reversed polynomial
    table[i] = c;
  }
  return table;
}

std::string hostName() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "host";
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = crcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  WEFT_CHECK(!error, "cannot create the TensorBoard directory {}: {}", dir, error.message());
  // The count keeps two writers of one process in one second apart.
  static std::atomic<int> writers{0};
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}.{}", dir, static_cast<int64_t>(wallTime()), hostName(),
                      ::getpid(), writers++);
  // "x": a new file, never one another writer (or a link) left under the name.
  file_ = std::fopen(path_.c_str(), "wbx");
  WEFT_CHECK(file_ != nullptr, "cannot create the TensorBoard event file {}: {}", path_, std::strerror(errno));
  writeRecord(event(0, 3, "brain.Event:2"));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  writeRecord(event(step, 5, scalarSummary(tag, static_cast<float>(value))));
}

// A record: the length (8 bytes), its masked CRC, the data, the data's masked CRC.
void TensorBoardWriter::writeRecord(std::string_view data) {
  std::string record;
  putLittleEndian(record, static_cast<uint64_t>(data.size()));
  putLittleEndian(record, maskedCrc(record.data(), 8));
  record.append(data);
  putLittleEndian(record, maskedCrc(data.data(), data.size()));
  WEFT_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0,
             "cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno));
}

}  // namespace weft
