// escapeBytes: a small UTF-8 decoder that keeps printable characters and escapes the rest.
#include "core/Escape.h"

#include <fmt/format.h>

#include <cstdint>

namespace weft {
namespace {

/// Code points a terminal acts on or that change how the text around them reads.
bool isControl(uint32_t code) {
  return code < 0x20 || code == 0x7F || (code >= 0x80 && code <= 0x9F) || (code >= 0x200E && code <= 0x200F) ||
         (code >= 0x2028 && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069) || code == 0xFEFF;
}

}  // namespace

size_t utf8SequenceAt(std::string_view text, size_t at, uint32_t& code) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + at;
  const size_t n = text.size() - at;
  const unsigned char c = p[0];
  size_t len = 0;
  uint32_t minCode = 0;
  if (c < 0x80) {
    code = c;
    return 1;
  }
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    minCode = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    minCode = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    minCode = 0x10000;
  } else {
    return 0;
  }
  if (len > n) return 0;
  code = c & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((p[k] & 0xC0) != 0x80) return 0;
    code = (code << 6) | (p[k] & 0x3Fu);
  }
  if (code < minCode || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return len;
}

std::string escapeBytes(std::string_view bytes, size_t maxBytes) {
  const size_t shown = bytes.size() > maxBytes ? maxBytes : bytes.size();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(shown + 8);
  size_t i = 0;
  while (i < shown) {
    uint32_t code = 0;
    const size_t len = utf8SequenceAt(bytes.substr(0, shown), i, code);
    if (len == 0) {
      out += fmt::format("\\x{:02x}", p[i]);
      ++i;
      continue;
    }
    if (code == '\\') {
      out += "\\\\";
    } else if (code == '\n') {
      out += "\\n";
    } else if (code == '\r') {
      out += "\\r";
    } else if (code == '\t') {
      out += "\\t";
    } else if (isControl(code)) {
      for (size_t k = 0; k < len; ++k) out += fmt::format("\\x{:02x}", p[i + k]);
    } else {
      out.append(bytes.data() + i, len);
    }
    i += len;
  }
  if (shown < bytes.size()) out += fmt::format("... ({} bytes)", bytes.size());
  return out;
}

}  // namespace weft
