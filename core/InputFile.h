// Reading a file that came from outside the program (a corpus, a graph file, CIFAR batches, a
// vocabulary, a secret, a resource specification): only a regular file is opened — a
// directory, a FIFO (which would block for ever), a device (/dev/zero never ends) or a socket is
// refused with a message naming the path and what it is — its size is capped, lines are
// bounded, and errors name the file and the position.
//
//     InputFile in(path, "text corpus", kMaxTextFileBytes);
//     for (std::string line; in.readLine(line);) {
//       if (bad(line)) in.fail("'{}' is not an id", escapeBytes(token));   // "PATH:LINE: ..."
//     }
#pragma once

#include "core/Error.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft {

/// The longest line readLine accepts unless told otherwise.
inline constexpr size_t kMaxLineBytes = size_t{1} << 20;

/// A regular file opened for reading, with a cap on its size.
class InputFile {
 public:
  /// Opens `path`; `kind` ("text corpus", "graph file") names it in messages. Throws, naming the
  /// path, when it does not exist, cannot be opened, is not a regular file, or holds more than
  /// `maxBytes` bytes.
  InputFile(const std::string& path, std::string kind, uint64_t maxBytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// The next line, without its '\n', in `line`; false at the end of the file. A line over
  /// `maxLineBytes` is an error naming the file and the line.
  bool readLine(std::string& line, size_t maxLineBytes = kMaxLineBytes);
  /// The number of the line readLine returned last (1 for the first).
  int64_t line() const { return line_; }
  /// Up to out.size() bytes; fewer only at the end of the file.
  size_t read(std::span<uint8_t> out);
  /// Everything not read yet.
  std::string readAll();
  /// Bytes consumed so far (the offset of the next byte).
  uint64_t offset() const { return consumed_; }
  /// Continues reading at byte `offset`, which an earlier reading of this file found to start
  /// line `line` + 1 (messages count lines from there). Throws naming the file when the offset
  /// lies past its end.
  void seek(uint64_t offset, int64_t line);
  /// The file's size when it was opened.
  uint64_t size() const { return size_; }
  /// The file's permission bits (st_mode & 07777) when it was opened.
  uint32_t permissions() const { return permissions_; }
  /// The path as messages show it (escaped).
  const std::string& name() const { return name_; }

  /// Throws "PATH:LINE: message" for the line readLine returned last.
  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> format, A&&... args) const {
    WEFT_THROW("{}:{}: {}", name_, line_, fmt::format(format, std::forward<A>(args)...));
  }

 private:
  /// Refills the buffer; false at the end of the file.
  bool fill();

  int fd_ = -1;
  std::string kind_, name_;
  uint64_t maxBytes_ = 0, size_ = 0, consumed_ = 0, received_ = 0;
  uint32_t permissions_ = 0;
  int64_t line_ = 0;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;
};

/// What the file at `path` is when it is not a regular file ("a directory", "a FIFO", ...); ""
/// for a regular file or one that cannot be examined.
std::string nonRegularKind(const std::string& path);

}  // namespace weft
