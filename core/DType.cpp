#include "core/DType.h"

#include "core/Error.h"

namespace weft {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
  }
  WEFT_THROW("invalid dtype code {}", static_cast<int>(t));
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
  }
  return "invalid";
}

DType parseDType(const std::string& name) {
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16, DType::F16}) {
    if (name == dtypeName(t)) return t;
  }
  WEFT_THROW("unknown dtype '{}' (expected f32, f64, i32, i64, bf16 or f16)", name);
}

}  // namespace weft
