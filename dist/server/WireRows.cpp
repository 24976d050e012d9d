// Rows narrowed for the wire (see the header).
#include "dist/server/WireRows.h"

#include "core/Error.h"
#include "core/Half.h"

#include <cstring>

namespace weft::dist {

RowWire RowWire::of(const ServedVariable& v, DType wire) {
  WEFT_CHECK(wire == DType::F32 || wire == DType::BF16 || wire == DType::F16,
             "served rows travel as f32, bf16 or f16, not {}", dtypeName(wire));
  RowWire w;
  w.rowBytes = v.rowBytes();
  w.wire = wire;
  w.narrowed = wire == DType::BF16 && v.variable->outputs[0].dtype == DType::F32;
  return w;
}

std::vector<uint8_t> RowWire::narrow(std::vector<uint8_t> rows) const {
  if (!narrowed) return rows;
  std::vector<uint8_t> out;
  appendTravelling(rows, out);
  return out;
}

void RowWire::appendTravelling(std::span<const uint8_t> rows, std::vector<uint8_t>& out) const {
  if (!narrowed) {
    out.insert(out.end(), rows.begin(), rows.end());
    return;
  }
  const size_t count = rows.size() / sizeof(float), at = out.size();
  out.resize(at + count * sizeof(uint16_t));
  for (size_t i = 0; i < count; ++i) {
    float value = 0;
    std::memcpy(&value, rows.data() + i * sizeof(float), sizeof value);
    const uint16_t bits = half_bits::bfloat16FromFloat(value);
    std::memcpy(out.data() + at + i * sizeof bits, &bits, sizeof bits);
  }
}

void RowWire::widen(std::span<const uint8_t> rows, uint8_t* out) const {
  if (!narrowed) {
    if (!rows.empty()) std::memcpy(out, rows.data(), rows.size());
    return;
  }
  const size_t count = rows.size() / sizeof(uint16_t);
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, rows.data() + i * sizeof bits, sizeof bits);
    const float value = half_bits::bfloat16ToFloat(bits);
    std::memcpy(out + i * sizeof value, &value, sizeof value);
  }
}

}  // namespace weft::dist
