// InputFile: open-time checks (regular file, size) and buffered reads that enforce the cap even
// on a file that grows while it is read.
#include "core/InputFile.h"

#include "core/Escape.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

namespace weft {
namespace {

constexpr size_t kBufferBytes = size_t{64} << 10;

const char* kindOfMode(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string nonRegularKind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return kindOfMode(st.st_mode);
}

InputFile::InputFile(const std::string& path, std::string kind, uint64_t maxBytes)
    : kind_(std::move(kind)), name_(escapeBytes(path, 4096)), maxBytes_(maxBytes) {
  // Examined before opening, so opening has no side effects on a device; and again after, on
  // what was opened. O_NONBLOCK: opening a FIFO must not wait for a writer.
  const std::string before = nonRegularKind(path);
  WEFT_CHECK(before.empty(), "{} {} is {}; only a regular file is read", kind_, name_, before);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd_ < 0) {
    const int error = errno;
    WEFT_CHECK(error != ENOENT, "{} {} does not exist", kind_, name_);
    WEFT_THROW("cannot open {} {}: {}", kind_, name_, std::strerror(error));
  }
  struct stat st {};
  const bool statted = ::fstat(fd_, &st) == 0;
  const std::string after = statted ? kindOfMode(st.st_mode) : "";
  if (!statted || !after.empty() || static_cast<uint64_t>(st.st_size) > maxBytes_) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    WEFT_CHECK(statted, "cannot examine {} {}: {}", kind_, name_, std::strerror(error));
    WEFT_CHECK(after.empty(), "{} {} is {}; only a regular file is read", kind_, name_, after);
    WEFT_THROW("{} {} has {} bytes, over the limit of {} bytes", kind_, name_, st.st_size, maxBytes_);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  permissions_ = static_cast<uint32_t>(st.st_mode & 07777);
  buffer_.resize(kBufferBytes);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::fill() {
  begin_ = end_ = 0;
  for (;;) {
    const ssize_t n = ::read(fd_, buffer_.data(), buffer_.size());
    if (n < 0 && errno == EINTR) continue;
    WEFT_CHECK(n >= 0, "{}: read error at byte {}: {}", name_, received_, std::strerror(errno));
    received_ += static_cast<uint64_t>(n);
    // The size was checked at open; a file that grows while it is read is held to the same cap.
    WEFT_CHECK(received_ <= maxBytes_, "{} {} grew past the limit of {} bytes while it was read", kind_, name_,
               maxBytes_);
    end_ = static_cast<size_t>(n);
    return n > 0;
  }
}

void InputFile::seek(uint64_t offset, int64_t line) {
  WEFT_CHECK(offset <= size_, "{} {}: cannot read from byte {} of its {} bytes", kind_, name_, offset, size_);
  WEFT_CHECK(::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) == static_cast<off_t>(offset),
             "{} {}: cannot seek to byte {}: {}", kind_, name_, offset, std::strerror(errno));
  begin_ = end_ = 0;
  consumed_ = received_ = offset;
  line_ = line;
}

bool InputFile::readLine(std::string& line, size_t maxLineBytes) {
  line.clear();
  bool any = false;
  for (;;) {
    if (begin_ == end_ && !fill()) {
      if (any) ++line_;
      return any;
    }
    any = true;
    const char* start = buffer_.data() + begin_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
    const size_t take = newline ? static_cast<size_t>(newline - start) : end_ - begin_;
    if (line.size() + take > maxLineBytes) {
      ++line_;
      fail("the line is longer than the limit of {} bytes", maxLineBytes);
    }
    line.append(start, take);
    begin_ += take;
    consumed_ += take;
    if (newline) {
      ++begin_;
      ++consumed_;
      ++line_;
      return true;
    }
  }
}

size_t InputFile::read(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    if (begin_ == end_ && !fill()) break;
    const size_t take = std::min(out.size() - done, end_ - begin_);
    std::memcpy(out.data() + done, buffer_.data() + begin_, take);
    begin_ += take;
    done += take;
  }
  consumed_ += done;
  return done;
}

std::string InputFile::readAll() {
  std::string out;
  out.reserve(static_cast<size_t>(size_ - std::min(size_, consumed_)));
  for (;;) {
    if (begin_ == end_ && !fill()) break;
    out.append(buffer_.data() + begin_, end_ - begin_);
    consumed_ += end_ - begin_;
    begin_ = end_;
  }
  return out;
}

}  // namespace weft
