// Limits checked on a JSON text before it is parsed. nlohmann::json parses deep nesting without
// recursion, but copying, printing and comparing a value recurse once per level: a checkpoint
// header or resource specification of 100,000 nested '[' parses, then overflows the stack in the
// first message that shows it. Every JSON text that comes from a file, the environment or a peer
// is checked here first, so such a text is refused by name before anything recurses over it.
//
//     if (const auto at = jsonNestingBeyond(text, kMaxJsonDepth))
//       WEFT_THROW("{}: nested deeper than {} levels at byte {}", path, kMaxJsonDepth, *at);
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace weft {

/// The deepest nesting any of weft's JSON documents needs, with room to spare (a checkpoint
/// header nests 3 levels, a resource specification 3).
inline constexpr int kMaxJsonDepth = 64;

/// The offset of the first '[' or '{' that opens level maxDepth + 1 of `text`, or nothing when
/// no array or object nests deeper than maxDepth. Brackets inside strings do not count; the text
/// need not be valid JSON (the parser says what else is wrong with it).
std::optional<size_t> jsonNestingBeyond(std::string_view text, int maxDepth);

}  // namespace weft
