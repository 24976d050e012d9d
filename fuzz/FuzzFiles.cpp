// The scratch files fuzz targets hand to readers that take a path.
#include "fuzz/Fuzz.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace weft::fuzz {
namespace {

/// The process's scratch directory, removed when the process ends normally (a finding's exit
/// leaves it for inspection).
struct Scratch {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("weft-fuzz-" + std::to_string(::getpid()));
  Scratch() { std::filesystem::create_directories(path); }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

const std::filesystem::path& scratch() {
  static const Scratch s;
  return s.path;
}

}  // namespace

std::string inputFile(std::span<const uint8_t> bytes, const std::string& name, unsigned mode) {
  const std::string path = (scratch() / name).string();
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  WEFT_CHECK(fd >= 0, "fuzz: cannot create {}: {}", path, std::strerror(errno));
  const bool written = writeAll(fd, bytes);
  ::close(fd);
  WEFT_CHECK(written, "fuzz: cannot write {}", path);
  return path;
}

bool writeAll(int fd, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string littleEndian(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>(value >> (8 * i));
  return out;
}

}  // namespace weft::fuzz
