#include "nn/StateDict.h"

#include "core/Checkpoint.h"

#include <algorithm>
#include <optional>

namespace weft::nn {
namespace {

/// How the file lays out a variable, decided by its role (the last part of its name).
enum class Layout {
  Same,
  Transposed,  ///< a matrix stored (cols, rows): PyTorch's (out, in) weights
  Vector,      ///< a bias stored (n) for a variable (n) or (n, 1, ..., 1)
};

std::string roleOf(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

std::string scopeOf(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? "" : name.substr(0, slash + 1);
}

Layout layoutOf(const std::string& role) {
  if (role == "weight" || role == "wx" || role == "wh") return Layout::Transposed;
  if (role == "bias") return Layout::Vector;
  return Layout::Same;
}

/// The model's state among the variables: parameters and BatchNorm's statistics (see the header).
bool isModelState(const Node* v) {
  const std::string role = roleOf(v->name);
  return v->attrs.get<bool>("trainable") || role == "moving_mean" || role == "moving_var";
}

/// The shape the file should hold for a variable of this shape, or nullopt (a transposed role
/// on something that is not a matrix).
std::optional<Shape> fileShape(Layout layout, const Shape& shape) {
  switch (layout) {
    case Layout::Same:
      return shape;
    case Layout::Transposed:
      if (shape.rank() != 2) return std::nullopt;
      return Shape{shape[1], shape[0]};
    case Layout::Vector: {
      // Conv2d's bias (out, 1, 1) broadcasts over the image; PyTorch keeps it a vector.
      if (shape.rank() < 2) return shape;
      for (int axis = 1; axis < shape.rank(); ++axis) {
        if (shape[axis] != 1) return shape;
      }
      return Shape{shape[0]};
    }
  }
  return shape;
}

const char* layoutName(Layout layout) {
  switch (layout) {
    case Layout::Same:
      return "as it is";
    case Layout::Transposed:
      return "transposed";
    case Layout::Vector:
      return "as a vector";
  }
  return "?";
}

/// (rows, cols) -> (cols, rows), in the tensor's own dtype.
Tensor transposed(const Tensor& t) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out(t.dtype(), {cols, rows});
  dispatchStorage(t.dtype(), [&](auto type) {
    using T = decltype(type);
    const T* src = static_cast<const T*>(t.raw());
    T* dst = static_cast<T*>(out.raw());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
    }
  });
  return out;
}

/// The variable's value from the file's tensor, or the reason it cannot be one.
struct Converted {
  Tensor value;
  std::string problem;
};

Converted convert(const Node* v, const Tensor& file) {
  const TensorType& type = v->outputs[0];
  const Layout layout = layoutOf(roleOf(v->name));
  const std::optional<Shape> wanted = fileShape(layout, type.shape);
  const std::string held = fmt::format("the file holds {}{}", dtypeName(file.dtype()), file.shape().str());
  if (!wanted) {
    return {{},
            fmt::format("{}; the variable is {}, but a '{}' is a matrix loaded transposed", held, type.str(),
                        roleOf(v->name))};
  }
  if (file.shape() != *wanted) {
    return {{},
            fmt::format("{}; the variable is {} and takes {} {}", held, type.str(), wanted->str(), layoutName(layout))};
  }
  if (file.dtype() != type.dtype && !(isFloating(file.dtype()) && isFloating(type.dtype))) {
    return {{}, fmt::format("{}; the variable is {}: integers and floating values do not convert", held, type.str())};
  }
  Tensor value = layout == Layout::Transposed ? transposed(file) : file;
  if (value.dtype() != type.dtype) value = value.cast(type.dtype);
  return {value.reshaped(type.shape), ""};
}

/// PyTorch's count of BatchNorm updates, which weft does not keep.
bool isIgnored(const std::string& key) {
  const std::string suffix = "num_batches_tracked";
  return key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         (key.size() == suffix.size() || key[key.size() - suffix.size() - 1] == '.');
}

std::string withDots(std::string name) {
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

/// One line per missing, unexpected or mis-shaped entry.
std::string problems(const StateDictReport& r) {
  std::string out;
  for (const std::string& v : r.missing) out += fmt::format("\n  missing: variable '{}' (key '{}')", v, r.keys.at(v));
  for (const std::string& k : r.unexpected) out += fmt::format("\n  unexpected: key '{}', which no variable takes", k);
  for (const Mismatch& m : r.misshaped) {
    out += fmt::format("\n  mis-shaped: key '{}' for variable '{}': {}", m.key, m.variable, m.reason);
  }
  return out;
}

}  // namespace

std::string pytorchKey(const Graph& graph, const std::string& name) {
  const std::string scope = scopeOf(name), role = roleOf(name);
  const Node* bx = graph.find(scope + "bx");
  const bool gru = bx != nullptr && bx->op == "Variable";
  static const std::map<std::string, std::string> kLstm{
      {"wx", "weight_ih_l0"}, {"wh", "weight_hh_l0"}, {"bias_ih", "bias_ih_l0"}, {"bias_hh", "bias_hh_l0"}};
  static const std::map<std::string, std::string> kGru{
      {"wx", "weight_ih"}, {"wh", "weight_hh"}, {"bx", "bias_ih"}, {"bh", "bias_hh"}};
  static const std::map<std::string, std::string> kOthers{{"table", "weight"},
                                                          {"filter", "weight"},
                                                          {"gamma", "weight"},
                                                          {"beta", "bias"},
                                                          {"moving_mean", "running_mean"},
                                                          {"moving_var", "running_var"}};
  for (const auto* names : {gru ? &kGru : &kLstm, &kOthers}) {
    auto it = names->find(role);
    if (it != names->end()) return withDots(scope) + it->second;
  }
  return withDots(name);
}

std::string StateDictReport::str() const {
  return fmt::format("state dict {}: {} variables loaded, {} entries ignored", path, loaded.size(), ignored.size()) +
         problems(*this);
}

StateDictReport loadStateDict(Session& session, const std::string& path, const StateDictOptions& options) {
  const Graph& graph = session.graph();
  auto keyFor = options.keyFor ? options.keyFor : [&](const std::string& name) { return pytorchKey(graph, name); };
  TensorFile file = readSafetensors(path);
  StateDictReport report;
  report.path = path;
  std::map<std::string, std::string> takenBy;  // key -> variable
  std::vector<std::pair<Node*, Tensor>> values;
  for (Node* v : graph.variables()) {
    if (!isModelState(v)) continue;
    const std::string key = keyFor(v->name);
    auto [taken, fresh] = takenBy.emplace(key, v->name);
    WEFT_CHECK(fresh, "state dict {}: variables '{}' and '{}' both map to key '{}'", path, taken->second, v->name, key);
    report.keys[v->name] = key;
    auto it = file.tensors.find(key);
    if (it == file.tensors.end()) {
      report.missing.push_back(v->name);
      continue;
    }
    Converted c = convert(v, it->second);
    if (!c.problem.empty()) {
      report.misshaped.push_back({v->name, key, c.problem});
      continue;
    }
    values.emplace_back(v, std::move(c.value));
  }
  for (const auto& [key, t] : file.tensors) {
    if (takenBy.count(key)) continue;
    (isIgnored(key) ? report.ignored : report.unexpected).push_back(key);
  }
  WEFT_CHECK(!options.strict || report.complete(),
             "state dict {} does not match the model, so no variable was changed:{}", path, problems(report));
  for (auto& [v, value] : values) {
    session.variable(v).copyFrom(value);
    report.loaded.push_back(v->name);
  }
  return report;
}

}  // namespace weft::nn
