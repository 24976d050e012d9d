// Element types of tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

/// Element type. BF16 and F16 are the 16-bit types of mixed precision (core/Half.h): casts,
/// matrix products and convolutions take them; on the CPU those compute in F32.
enum class DType : uint8_t { F32, F64, I32, I64, BF16, F16 };

inline constexpr DType f32 = DType::F32;
inline constexpr DType f64 = DType::F64;
inline constexpr DType i32 = DType::I32;
inline constexpr DType i64 = DType::I64;
inline constexpr DType bf16 = DType::BF16;
inline constexpr DType f16 = DType::F16;

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
DType parseDType(const std::string& name);
inline bool isFloating(DType t) { return t != DType::I32 && t != DType::I64; }
inline bool isInteger(DType t) { return t == DType::I32 || t == DType::I64; }

/// Maps a C++ element type to its DType.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::I64;
};

}  // namespace weft
