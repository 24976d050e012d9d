// Printing bytes that came from outside (a corpus, a graph file, a network peer) in a message:
// control characters, escape sequences and invalid UTF-8 become visible escapes, so an error
// message can neither rewrite a terminal nor hide what the input held.
//
//     WEFT_THROW("{}:{}: '{}' is not an id", path, line, escapeBytes(token));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weft {

/// The longest stretch of an untrusted value that a message shows by default.
inline constexpr size_t kEscapedBytesShown = 80;

/// `bytes` made safe to print: printable ASCII and valid UTF-8 stay as they are, except for the
/// backslash (shown as \\); \n, \r and \t show as such; other C0 and C1 control characters,
/// DEL, the Unicode bidirectional controls and line separators, and bytes that are not valid
/// UTF-8 show as \xHH (one per byte). Past `maxBytes` input bytes the value is cut and
/// "... (N bytes)" gives its full length.
std::string escapeBytes(std::string_view bytes, size_t maxBytes = kEscapedBytesShown);

/// The length of the valid UTF-8 sequence starting at byte `at` of `text`, with its code point in
/// `code`; 0 when the bytes there are not valid UTF-8 (a stray or missing continuation byte, an
/// overlong form, a surrogate, a code point past U+10FFFF).
size_t utf8SequenceAt(std::string_view text, size_t at, uint32_t& code);

}  // namespace weft
