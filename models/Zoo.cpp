// The zoo's registry: model names and their factories.
#include "models/Gnn.h"
#include "models/ListReduction.h"
#include "models/Lm.h"
#include "models/Mlp.h"
#include "models/Nmt.h"
#include "models/ResNet.h"
#include "models/ZooModel.h"

#include <fmt/ranges.h>

#include <functional>
#include <utility>

namespace weft::models {
namespace {

const std::vector<std::pair<std::string, std::function<std::unique_ptr<ZooModel>()>>>& factories() {
  static const std::vector<std::pair<std::string, std::function<std::unique_ptr<ZooModel>()>>> all{
      {"lm", makeLmModel},
      {"mlp", makeMlpModel},
      {"nmt", makeNmtModel},
      {"resnet", makeResNetModel},
      {"gnn", makeGnnModel},
      {"list_reduction", makeListReductionModel},
  };
  return all;
}

}  // namespace

FeedMap feedsFor(Graph& g, const data::Batch& batch) {
  FeedMap feeds;
  for (const auto& [name, value] : batch) {
    Node* n = g.find(name);
    WEFT_CHECK(n && n->op == "Placeholder", "the batch field '{}' has no placeholder of that name in the model", name);
    feeds.emplace_back(n->output(), value);
  }
  return feeds;
}

std::vector<std::string> zooModelNames() {
  std::vector<std::string> names;
  for (const auto& [name, make] : factories()) names.push_back(name);
  return names;
}

std::unique_ptr<ZooModel> makeZooModel(const std::string& name) {
  for (const auto& [known, make] : factories()) {
    if (known == name) return make();
  }
  WEFT_THROW("unknown model '{}' (known: {})", name, fmt::join(zooModelNames(), ", "));
}

}  // namespace weft::models
