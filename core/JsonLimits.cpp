#include "core/JsonLimits.h"

namespace weft {

std::optional<size_t> jsonNestingBeyond(std::string_view text, int maxDepth) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included, is part of the string
      } else if (c == '"') {
        inString = false;
      }
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > maxDepth) return i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // a stray closer is the parser's to report, and lends no depth
    }
  }
  return std::nullopt;
}

}  // namespace weft
