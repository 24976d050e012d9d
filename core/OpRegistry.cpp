#include "core/OpRegistry.h"

#include <fmt/ranges.h>

namespace weft {
namespace {

std::vector<TensorType> placeholderType(const InferContext& c) {
  return {{c.attrs().get<DType>("dtype"), c.attrs().get<Shape>("shape")}};
}

std::vector<TensorType> constType(const InferContext& c) {
  const Tensor& v = c.attrs().get<Tensor>("value");
  return {{v.dtype(), v.shape()}};
}

std::vector<TensorType> noOutputs(const InferContext&) { return {}; }

void registerCoreOps(OpRegistry& r) {
  r.add(OpDef("Placeholder").infer(placeholderType).source(SourceKind::Placeholder).noGradient());
  r.add(OpDef("Variable").infer(placeholderType).source(SourceKind::Variable).noGradient());
  r.add(OpDef("Const").infer(constType).source(SourceKind::Constant).noGradient());
  r.add(OpDef("NoOp").infer(noOutputs).cpu([](KernelContext&) {}).cuda([](KernelContext&) {}).noGradient());
}

}  // namespace

void InferContext::failMessage(const std::string& message) const {
  std::vector<std::string> types;
  for (const TensorType& t : inputs) types.push_back(t.str());
  WEFT_THROW("{}: {}; inputs: ({})", node.describe(), message, fmt::join(types, ", "));
}

void KernelContext::failMessage(const std::string& message) const {
  WEFT_THROW("{}: {}", node->describe(), message);
}

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    registerCoreOps(*r);
    return r;
  }();
  return *registry;
}

void OpRegistry::add(OpDef def) {
  std::unique_lock lock(mutex_);
  WEFT_CHECK(!ops_.count(def.name), "op '{}' is registered twice", def.name);
  WEFT_CHECK(static_cast<bool>(def.inferFn), "op '{}' has no shape function", def.name);
  std::string name = def.name;
  ops_[name] = std::make_unique<OpDef>(std::move(def));
}

const OpDef* OpRegistry::find(const std::string& name) const {
  std::shared_lock lock(mutex_);
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

const OpDef& OpRegistry::get(const std::string& name) const {
  const OpDef* d = find(name);
  WEFT_CHECK(d != nullptr, "unknown op '{}'", name);
  return *d;
}

std::vector<std::string> OpRegistry::names() const {
  std::shared_lock lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, def] : ops_) out.push_back(name);
  return out;
}

}  // namespace weft
