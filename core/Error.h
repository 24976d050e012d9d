// Errors: one exception type whose message names what failed (op, scope, shapes, values).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace weft {

/// The exception every weft failure raises; `what()` is a complete, user-readable message.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace weft

/// Throws weft::Error with an fmt-formatted message.
#define WEFT_THROW(...) throw ::weft::Error(::fmt::format(__VA_ARGS__))

/// Throws weft::Error with an fmt-formatted message unless `cond` holds.
#define WEFT_CHECK(cond, ...)  \
  do {                         \
    if (!(cond)) {             \
      WEFT_THROW(__VA_ARGS__); \
    }                          \
  } while (0)
