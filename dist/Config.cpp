// Architecture names (see the header).
#include "dist/Config.h"

#include "core/Error.h"

namespace weft::dist {

const char* architectureName(Architecture a) {
  switch (a) {
    case Architecture::Auto: return "auto";
    case Architecture::AllReduce: return "ar";
    case Architecture::ParameterServer: return "ps";
  }
  return "?";
}

Architecture parseArchitecture(const std::string& name) {
  if (name == "auto") return Architecture::Auto;
  if (name == "ar") return Architecture::AllReduce;
  if (name == "ps") return Architecture::ParameterServer;
  WEFT_THROW("unknown architecture '{}' (expected auto, ar or ps)", name);
}

}  // namespace weft::dist
