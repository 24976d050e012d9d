// Typed node attributes.
#pragma once

#include "core/DType.h"
#include "core/Error.h"
#include "core/Shape.h"
#include "core/Tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace weft {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, DType, Shape, Tensor>;

/// Name -> value map of an op's attributes.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : values_(init) {}

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  Attrs& set(const std::string& name, AttrValue v) {
    values_[name] = std::move(v);
    return *this;
  }

  /// The attribute's value; throws if it is missing or of another type.
  template <class T>
  const T& get(const std::string& name) const {
    auto it = values_.find(name);
    WEFT_CHECK(it != values_.end(), "missing attribute '{}'", name);
    const T* v = std::get_if<T>(&it->second);
    WEFT_CHECK(v != nullptr, "attribute '{}' has another type", name);
    return *v;
  }
  template <class T>
  T get(const std::string& name, const T& fallback) const {
    return has(name) ? get<T>(name) : fallback;
  }
  int64_t getInt(const std::string& name) const { return get<int64_t>(name); }
  int64_t getInt(const std::string& name, int64_t fallback) const { return get<int64_t>(name, fallback); }
  double getFloat(const std::string& name) const { return get<double>(name); }
  double getFloat(const std::string& name, double fallback) const { return get<double>(name, fallback); }

  const std::map<std::string, AttrValue>& values() const { return values_; }
  /// "axis=1, keepdims=true" for dumps.
  std::string str() const;

 private:
  std::map<std::string, AttrValue> values_;
};

}  // namespace weft
