#include "core/Attrs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace weft {
namespace {

std::string attrStr(const AttrValue& v) {
  struct Printer {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const { return fmt::format("{}", x); }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return "\"" + x + "\""; }
    std::string operator()(const std::vector<int64_t>& x) const { return fmt::format("[{}]", fmt::join(x, ", ")); }
    std::string operator()(const std::vector<double>& x) const { return fmt::format("[{}]", fmt::join(x, ", ")); }
    std::string operator()(DType x) const { return dtypeName(x); }
    std::string operator()(const Shape& x) const { return x.str(); }
    std::string operator()(const Tensor& x) const {
      return fmt::format("<{} {}>", dtypeName(x.dtype()), x.shape().str());
    }
  };
  return std::visit(Printer{}, v);
}

}  // namespace

std::string Attrs::str() const {
  std::string s;
  for (const auto& [name, value] : values_) {
    if (!s.empty()) s += ", ";
    s += name + "=" + attrStr(value);
  }
  return s;
}

}  // namespace weft
